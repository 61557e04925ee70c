//! The ingest log: every accepted change batch is appended and fsync'd here
//! before it is acknowledged, and stays until the commit containing it is
//! durable in the catalog and its idempotency window has passed.
//!
//! API boundary: the service sees only `IngestLog`. `LocalLog` keeps one
//! directory of segment files per flow; a log on a shared broker (Kafka,
//! NATS JetStream) implements the same trait.
//!
//! Invariants: offsets are dense and increasing and never reused, even
//! after every segment was released (the next offset also follows the
//! committed offset the caller passes at open); an append is acknowledged
//! only after `fdatasync`; a retried idempotency key gets the first
//! append's offset and appends nothing.
//!
//! `segment` is the file format (records framed with a checksum, a segment
//! per run of offsets), `local` the `LocalLog` (open and recovery, the
//! factory, the log's identity), `writer` its writer (group commit,
//! rollback of a failed group, release and eviction) and `pool` the writer
//! threads and open-file bound all the logs of the process share.

use std::sync::Arc;

use bytes::Bytes;

use crate::error::Result;

mod local;
mod pool;
mod segment;
#[cfg(test)]
mod tests;
mod writer;

pub use local::{LocalLog, LocalLogs, identity};
pub use pool::{MAX_OPEN as MAX_OPEN_SEGMENTS, THREADS as WRITER_THREADS, usage as writer_usage};

/// One appended batch.
#[derive(Debug, Clone)]
pub struct Record {
    pub offset: i64,
    pub key: Option<String>,
    pub appended_ms: i64,
    pub payload: Bytes,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    pub offset: i64,
    /// The idempotency key was seen before: nothing was appended.
    pub duplicate: bool,
}

#[derive(Debug, Clone, Copy, Default, serde::Serialize, utoipa::ToSchema)]
pub struct LogStats {
    pub bytes: u64,
    pub segments: usize,
    /// The offset the next append gets.
    pub next_offset: i64,
    pub remembered_keys: usize,
    /// The bound on `bytes` (`max_log_bytes`): committed segments are
    /// released before their idempotency window ends to stay under it, and
    /// appends are refused (429) when uncommitted records alone reach it.
    pub max_bytes: u64,
    /// When the oldest retained record was appended.
    pub oldest_appended_ms: Option<i64>,
    /// Segments released before their idempotency window ended, to keep the
    /// log under `max_bytes`.
    pub early_released_segments: u64,
    /// The newest append time among records released early: an idempotency
    /// key appended at or before it is no longer recognised.
    pub idempotency_floor_ms: Option<i64>,
    /// The last group of appends could not be written or synced (a full or
    /// failing disk): its records were rolled back and refused; the next
    /// append tries again.
    pub failing: bool,
    /// Groups of appends that failed so, since the log was opened.
    pub write_failures: u64,
}

#[async_trait::async_trait]
pub trait IngestLog: Send + Sync + std::fmt::Debug {
    /// Appends one batch durably, or returns the offset an earlier append
    /// with the same idempotency key got.
    async fn append(&self, key: Option<String>, payload: Bytes, now_ms: i64) -> Result<Appended>;

    /// The retained records with offset > `after`, in order.
    async fn replay(&self, after: i64) -> Result<Vec<Record>>;

    /// Everything through `offset` is committed: segments holding only
    /// such records, all appended before `keep_after_ms`, are deleted; so
    /// are younger committed segments, oldest first, while the log is near
    /// its byte bound.
    async fn release(&self, offset: i64, keep_after_ms: i64) -> Result<()>;

    fn stats(&self) -> LogStats;

    /// The last offset stored. On a shared log other processes append too,
    /// so `stats` is only what this process has seen: a shared log asks its
    /// broker (`POST .../commit` waits for everything stored before it).
    async fn last_offset(&self) -> Result<i64> {
        Ok(self.stats().next_offset - 1)
    }

    /// The record at `offset`, when this log can hold records this process
    /// did not append or replay: a shared log where an append that timed
    /// out (and was answered 503) may still have been stored, so its retry
    /// is a duplicate of a record the service never queued.
    async fn read(&self, _offset: i64) -> Result<Option<Record>> {
        Ok(None)
    }

    /// Other processes append to this log too (a shared broker): the
    /// committer picks their records up with `replay` before each commit.
    fn shared(&self) -> bool {
        false
    }
}

/// Opens the ingest log of each flow the service runs: the seam where a log
/// on a shared broker plugs in. `LocalLogs` is the default, `NatsLogs`
/// (`service::nats_log`) the log on NATS JetStream; `tests/it/ingest_log.rs`
/// runs the service on a log in memory.
#[async_trait::async_trait]
pub trait LogFactory: Send + Sync {
    /// The stable identity of `flow`'s log. The target records the log's
    /// committed offset under it, so it must be the same after a restart.
    /// `recorded`: the logs whose offsets the flow's target records. A log
    /// on a broker that is not found while the target records offsets of
    /// such a log is not made again, empty: that would lose what the old
    /// one held (acknowledged, not yet committed).
    /// A log that already holds records the target has no record of (its
    /// identity neither in the target's offsets nor adopted) is refused
    /// (`AUTOCDC_INVALID_STATE.FOREIGN_LOG`): they were written for another
    /// table.
    async fn identity(&self, flow: &str, recorded: &[String]) -> Result<String>;

    /// Whether the target records this log as adopted when it first opens
    /// on it (`autocdc.adopted-logs`), so that records acknowledged before
    /// its first commit are its own after a restart. Logs that outlive a
    /// warehouse (a broker's) do; a local log lives beside its flow.
    fn adopts(&self) -> bool {
        false
    }

    /// Opens `flow`'s log. Records through `committed` are in the target
    /// already; offsets after it must never be reused. `max_bytes` is the
    /// flow's `max_log_bytes`.
    async fn open(&self, flow: &str, committed: i64, max_bytes: u64) -> Result<Arc<dyn IngestLog>>;
}
