//! The pure core: flow definitions and the logic that turns changes and state
//! into rows to write and rows to remove. Nothing here performs I/O, reads a
//! clock or knows a catalog; time comes in as a parameter. `tests/it/architecture.rs`
//! fails when a module here imports tokio, the file system, a clock or an
//! I/O part of `iceberg`.

pub mod convert;
pub mod debezium;
pub mod evolve;
pub mod flow;
pub mod from_snapshot;
pub mod history;
pub mod nested;
pub mod offsets;
pub mod predicate;
pub mod resolve;
pub mod seq_expr;
pub mod state;
pub mod truncate;
