//! autocdc: applies change-data-capture streams to Apache Iceberg tables.
//! See ARCHITECTURE.md for the map of modules and their invariants.
//!
//! - `core`: the pure logic (flow definitions, predicates, resolution, state); no I/O, no clock.
//! - `table`: the Iceberg shell (engine and its commit phases, files, catalogs, storage).
//! - `service`: `autocdc serve` (HTTP, input decoding, ingest logs, committers).
//! - `tools`: the command line and its helpers (push, bench, loadgen, gen, soak).

pub mod config;
pub mod core;
pub mod error;
pub mod fault;
pub mod service;
pub mod table;
pub mod tools;

pub use error::{Error, Result};
