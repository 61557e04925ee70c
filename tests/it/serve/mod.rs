//! `autocdc serve` through real HTTP on a loopback port: every content type,
//! every error path, idempotent retries, concurrent clients, backpressure,
//! and recovery from the write-ahead log after a crash.
//! `requests`: content types, refusals, tokens, retries, metrics;
//! `definitions`: flows defined over HTTP; `commits`: backpressure, crash
//! recovery, cadence, the log's bounds, maintenance; `snapshots`:
//! `from_snapshot` and SCD Type 2 flows; `many_flows`: more flows than
//! blocking threads or open files.

mod commits;
mod definitions;
mod many_flows;
mod requests;
mod snapshots;
