//! autocdc: applies change-data-capture streams to Apache Iceberg tables.
//! See ARCHITECTURE.md for the map of modules and their invariants.

pub mod convert;
pub mod dead_letter;
pub mod error;
pub mod fault;
pub mod flow;
pub mod from_snapshot;
pub mod ghost_kitchen;
pub mod history;
pub mod offsets;
pub mod predicate;
pub mod resolve;
pub mod state;
pub mod state_table;
pub mod truncate;

pub use error::{Error, Result};
pub mod bench;
pub mod catalog;
pub mod cli;
pub mod engine;
pub mod input;
pub mod loadgen;
pub mod push;
pub mod server;
pub mod service;
pub mod snapshot;
pub mod soak;
pub mod storage;
pub mod wal;
pub mod write;
