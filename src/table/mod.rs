//! The Iceberg shell around the core: the engine that opens a flow and runs
//! its commit phases, the Parquet files it writes, the row-delta snapshots it
//! produces, the aux state table, storage, the catalogs, and the maintenance
//! that keeps the tables bounded.

pub mod catalog;
pub mod compact;
pub mod engine;
pub mod flow_state;
pub mod local_files;
pub mod maintain;
pub mod properties;
pub mod read;
pub mod row_delta;
pub mod state_table;
pub mod storage;
pub mod write;
