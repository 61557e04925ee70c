//! The integration tests, one binary (one link of the crate instead of one
//! per file): a module per subject, helpers in `common`.

mod common;

mod architecture;
mod battery;
mod compaction;
mod concurrency;
mod configs;
mod debezium;
mod drift;
mod e2e;
mod errors;
mod evolution;
mod from_snapshot;
mod fuzz;
mod history;
mod hostile;
mod ingest_log;
mod maintenance;
mod nats_log;
mod offsets;
mod properties;
mod readme_examples;
mod rest_catalog;
mod s3;
mod scd;
mod serve;
mod shared_target;
mod spark_parity;
mod sql_catalog;
mod truncate;
