//! What `GET /v1/flows/{flow}` reports of a flow: its offsets, commits,
//! state, log and maintenance (`FlowStatus`, `MaintenanceStatus`).

use serde::Serialize;

use super::lease;
use crate::core::resolve::BatchStats;
use crate::service::wal::LogStats;

/// What a flow reports (`GET /v1/flows/{flow}`).
#[derive(Debug, Clone, Default, Serialize, utoipa::ToSchema)]
pub struct FlowStatus {
    /// Offset recorded in the target's latest snapshot.
    pub committed_offset: i64,
    /// Highest offset applied (batches that changed nothing need no snapshot).
    pub applied_offset: i64,
    pub pending_batches: usize,
    pub pending_rows: u64,
    pub pending_bytes: u64,
    pub last_snapshot_id: Option<i64>,
    pub last_commit_ms: Option<i64>,
    pub commits: u64,
    pub accepted_batches: u64,
    pub rejected_batches: u64,
    /// Batches acknowledged but rejected at commit: with
    /// `on_sequence_tie = "error"`, a tie with a batch committed before it.
    pub rejected_at_commit: u64,
    pub last_rejection: Option<String>,
    pub counters: BatchStats,
    pub state_keys: usize,
    pub state_tombstones: usize,
    pub wal: LogStats,
    /// Age of the oldest record the log retains.
    pub log_oldest_age_ms: Option<i64>,
    /// How long a retry with the same Idempotency-Key is recognised right
    /// now: `idempotency_window`, or less while `max_log_bytes` forces
    /// committed records out early.
    pub idempotency_window_ms: i64,
    /// Set while commits fail; pushes are still accepted up to the cap.
    pub last_error: Option<String>,
    pub degraded: bool,
    pub commit_ms_total: f64,
    /// Median and 99th percentile of the last 256 commits' durations.
    pub recent_commit_ms_p50: Option<f64>,
    pub recent_commit_ms_p99: Option<f64>,
    /// Median and 99th percentile of the last 256 appends to the flow's log
    /// (the wait before a push is acknowledged: an fsync, or a publish
    /// acknowledged by JetStream).
    pub recent_append_ms_p50: Option<f64>,
    pub recent_append_ms_p99: Option<f64>,
    /// Batches in the log not yet in the target (appended minus committed).
    pub log_lag_batches: i64,
    /// `from_snapshot` flows: the highest snapshot version accepted (committed or pending).
    pub snapshot_version: Option<i64>,
    /// Records kept in the flow's dead-letter area (`GET .../dead-letters`).
    pub dead_letters: usize,
    /// The target's current schema id: it moves when a changed definition
    /// evolves the schema.
    pub schema_id: i32,
    /// The target's default partition spec id: it moves when a changed
    /// `partition_by` adds a spec.
    pub partition_spec_id: i32,
    /// Schema changes (of the target or the state table) and partition
    /// spec changes committed for this flow since the process started.
    pub schema_evolutions: u64,
    pub maintenance: MaintenanceStatus,
    /// On a shared log (NATS): the flow's lease, which instance commits it.
    pub lease: Option<lease::LeaseStatus>,
}

/// The flow's maintenance as `GET /v1/flows/{flow}` and `/metrics` show it.
#[derive(Debug, Clone, Default, Serialize, utoipa::ToSchema)]
pub struct MaintenanceStatus {
    pub runs: u64,
    pub failures: u64,
    /// When the last run ended (ms since the epoch) and how it ended.
    pub last_run_ms: Option<i64>,
    pub last_error: Option<String>,
    pub last_report: Option<crate::table::engine::MaintenanceReport>,
    pub snapshots_expired_total: u64,
    pub files_deleted_total: u64,
    pub bytes_deleted_total: u64,
    /// Compactions that committed, and what they did in all.
    pub compactions: u64,
    /// Data and delete files compaction took out of the target.
    pub compaction_files_rewritten_total: u64,
    pub compaction_bytes_read_total: u64,
    pub compaction_bytes_written_total: u64,
    pub compaction_rows_moved_total: u64,
    pub compaction_seconds_total: f64,
    /// The target's and the state table's figures after the last commit or run.
    pub target: crate::table::maintain::TableStats,
    pub state: crate::table::maintain::TableStats,
}
