//! The I/O shell around the resolver for one flow: opens (or creates) the
//! target and its state table, recovers the state, and turns each resolved
//! micro-batch into one committed snapshot.
//!
//! Commit protocol (exactly-once): write the target's data and delete files;
//! write the state delta; commit the state table (snapshot S); commit the
//! target with `autocdc.state-snapshot-id = S` in its summary. On open, the
//! state is loaded as of the S named by the target's latest autocdc snapshot,
//! so a state commit left behind by a crash before the target commit is
//! ignored. Re-applying input is harmless: already-applied changes resolve
//! as duplicates or stale.
//!
//! This file holds the `Engine`, its reports and accessors; the work is in
//! `open` (open and recovery), `drift` (the definition against an existing
//! table), `apply` (the entry points and their retry), `commit` (the commit
//! phases), `deletes` (delete placement), `marker` (what each snapshot
//! records), `refold` (history re-fold and rebuild) and `maintenance`.

mod apply;
mod commit;
mod deletes;
mod drift;
mod maintenance;
mod marker;
mod open;
mod refold;

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::RecordBatch;
use iceberg::spec::Struct;
use serde::Serialize;

pub use apply::Input;
pub use maintenance::{MaintainOptions, MaintenanceReport};
pub use marker::{
    PROP_COMMITTER, PROP_FLOW, PROP_GENERATION, PROP_IGNORE_NULLS, PROP_INPUT_OFFSET,
    PROP_LEASE_EPOCH, PROP_SNAPSHOT_VERSION, PROP_STATE_COMPLETE, PROP_STATE_SNAPSHOT,
    PROP_TRACK_HISTORY, PROP_TRUNCATED_BELOW,
};

use crate::core::flow::Flow;
use crate::core::history::Folding;
use crate::core::offsets::{LogRef, Offsets};
use crate::core::resolve::{BatchStats, Codec};
use crate::error::{Error, Result, codes};
use crate::fault::Faults;
use crate::table::catalog::{Catalog, TableState};
use crate::table::flow_state::FlowState;
use crate::table::read;
use crate::table::write::Partitioner;

/// One flow's shell: its target and state table as last loaded or
/// committed, the state recovered from them, and what the next commit
/// records.
pub struct Engine {
    pub flow: Flow,
    codec: Codec,
    catalog: Arc<dyn Catalog>,
    faults: Arc<Faults>,
    target: TableState,
    state_tbl: TableState,
    state_snapshot: Option<i64>,
    /// The key index (SCD Type 1) or the per-key events (history flows).
    state: FlowState,
    /// `apply_as_truncates`: changes below this sequence (row-encoded) are stale.
    floor: Option<Box<[u8]>>,
    /// `from_snapshot`: the version of the last snapshot applied.
    snapshot_version: Option<i64>,
    /// Every live row of the target is in the state (so no equality deletes are needed).
    state_complete: bool,
    generation: i64,
    /// The committed offset of `log` (or, without one, the single
    /// `autocdc.input-offset`).
    input_offset: i64,
    /// The ingest log this engine commits for (`serve`); None for `apply`.
    log: Option<LogRef>,
    /// Every log's committed offset, as the latest snapshot of this flow
    /// records them.
    offsets: Offsets,
    state_log_rows: u64,
    /// Set while a commit is under way; an engine whose commit failed must be reopened.
    poisoned: bool,
    /// On a shared log: this instance and the epoch of its lease.
    lease: Option<(String, u64)>,
    /// Groups new rows by partition; None for an unpartitioned target.
    partitioner: Option<Arc<Partitioner>>,
    /// Every partition source column is a key column, so a key alone tells
    /// the partition of its row.
    partitioned_by_keys: bool,
    /// (spec id, partition) of each live data file of the target; loaded
    /// from the manifests when a partitioned target first needs it.
    file_partitions: Option<HashMap<String, (i32, Struct)>>,
    /// Data files the state points into that another writer removed.
    gone_files: usize,
    /// History flows: how the target's rows are folded; when it is not
    /// how the flow folds, the next apply re-folds first.
    folded_with: Folding,
    /// The schema changes this open committed ("table: changes").
    evolved: Vec<String>,
}

/// What one `apply` did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CommitReport {
    pub stats: BatchStats,
    /// The target snapshot committed, or None when the batch changed nothing.
    pub snapshot_id: Option<i64>,
    pub data_files: usize,
    pub delete_files: usize,
    pub rows_written: u64,
    pub bytes_written: u64,
    pub input_offset: i64,
    pub tombstones_collected: usize,
    pub state_compacted: bool,
    /// Commits that lost a race (or whose outcome was unknown and had not
    /// landed) and were rebuilt on a reloaded table.
    pub commit_retries: u32,
    /// `from_snapshot` flows: the version this apply was for ...
    pub snapshot_version: Option<i64>,
    /// ... and, when it was skipped, the newer version the target already has.
    pub skipped_for_version: Option<i64>,
    /// Wall time of each phase, in milliseconds.
    pub timings: Timings,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Timings {
    pub resolve_ms: f64,
    pub target_files_ms: f64,
    pub state_apply_ms: f64,
    pub state_file_ms: f64,
    pub commits_ms: f64,
}

impl Timings {
    pub fn add(&mut self, o: &Timings) {
        self.resolve_ms += o.resolve_ms;
        self.target_files_ms += o.target_files_ms;
        self.state_apply_ms += o.state_apply_ms;
        self.state_file_ms += o.state_file_ms;
        self.commits_ms += o.commits_ms;
    }
}

/// The key state as a user sees it (`autocdc state`).
#[derive(Debug, Clone, Serialize)]
pub struct StateSummary {
    pub keys: usize,
    pub live: usize,
    pub tombstones: usize,
    /// Events held (history flows keep every event; SCD Type 1 one per key).
    pub events: usize,
    pub bytes: usize,
    pub bytes_per_key: f64,
    pub state_snapshot_id: Option<i64>,
    pub generation: i64,
    pub input_offset: i64,
    pub complete: bool,
}

impl Engine {
    /// The schema changes this open committed, one "table: changes" each.
    pub fn evolved(&self) -> &[String] {
        &self.evolved
    }

    pub fn target(&self) -> &TableState {
        &self.target
    }

    /// The aux state table as this engine last committed or loaded it.
    pub fn state_table(&self) -> &TableState {
        &self.state_tbl
    }

    /// The version of the last snapshot applied (`from_snapshot` flows).
    pub fn snapshot_version(&self) -> Option<i64> {
        self.snapshot_version
    }

    pub fn summary(&self) -> StateSummary {
        let sizes = self.state.sizes();
        StateSummary {
            keys: sizes.keys,
            live: sizes.live,
            tombstones: sizes.keys - sizes.live,
            events: sizes.events,
            bytes: sizes.bytes,
            bytes_per_key: if sizes.keys == 0 {
                0.0
            } else {
                sizes.bytes as f64 / sizes.keys as f64
            },
            state_snapshot_id: self.state_snapshot,
            generation: self.generation,
            input_offset: self.input_offset,
            complete: self.state_complete,
        }
    }

    /// Of `summary().bytes`, the encoded values a history flow keeps
    /// (`bench`'s split; it walks every event, so the service's per-commit
    /// summary leaves it out).
    pub fn state_value_bytes(&self) -> usize {
        self.state.value_bytes()
    }

    /// An engine whose commit failed midway must be reopened before it commits again.
    fn usable(&self) -> Result<()> {
        if self.poisoned {
            return Err(Error::State {
                code: codes::REOPEN,
                message: format!(
                    "flow `{}`: a previous commit failed; reopen the flow",
                    self.flow.name
                ),
            });
        }
        Ok(())
    }

    /// All rows of the target's current snapshot, through a real Iceberg scan.
    pub async fn scan_target(&self) -> Result<Vec<RecordBatch>> {
        read::scan(self.catalog.as_ref(), &self.target).await
    }
}
