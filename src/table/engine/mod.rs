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

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch};
use futures::{StreamExt, TryStreamExt};
use iceberg::arrow::schema_to_arrow_schema;
use iceberg::io::FileIO;
use iceberg::spec::{
    DataFile, ManifestContentType, PartitionSpec, PartitionSpecBuilder, Schema, Struct,
    TableMetadata, UnboundPartitionField, UnboundPartitionSpec,
};
use serde::Serialize;

use crate::core::evolve::{self, Evolution, Refusal, Rules};
use crate::core::flow::{END_AT, Flow, START_AT};
use crate::core::from_snapshot;
use crate::core::history::Folding;
use crate::core::offsets::{self, LogRef, Offsets, PROP_INPUT_OFFSETS};
use crate::core::resolve::{self, BatchStats, Codec};
use crate::core::state::Loc;
use crate::core::truncate;
use crate::error::{Error, Result, codes};
use crate::fault::{FaultPoint, Faults};
use crate::table::catalog::{Catalog, TableState};
use crate::table::compact::{self, CompactionReport};
use crate::table::flow_state::{FlowState, Plan};
use crate::table::maintain::{self, Retention, TableReport, TableStats};
use crate::table::read;
use crate::table::row_delta::{self, Rewrite, RowDelta};
use crate::table::state_table;
use crate::table::write::{self, FileNamer, Partitioner};

pub const PROP_FLOW: &str = "autocdc.flow";
pub const PROP_STATE_SNAPSHOT: &str = "autocdc.state-snapshot-id";
pub const PROP_INPUT_OFFSET: &str = "autocdc.input-offset";
pub const PROP_GENERATION: &str = "autocdc.generation";
/// "false" once the target held rows autocdc did not write (their positions are unknown).
pub const PROP_STATE_COMPLETE: &str = "autocdc.state-complete";
/// `apply_as_truncates`: the highest truncate's sequence, as a JSON object.
pub const PROP_TRUNCATED_BELOW: &str = "autocdc.truncated-below";
/// `from_snapshot` flows: the version of the last snapshot applied.
pub const PROP_SNAPSHOT_VERSION: &str = "autocdc.snapshot-version";
/// SCD Type 2: the tracked columns the target's rows were folded with, a
/// JSON list of names. Absent on targets of earlier versions, which
/// tracked every value column but the sequence columns (or the list given).
pub const PROP_TRACK_HISTORY: &str = "autocdc.track-history";
/// History flows: the columns whose nulls kept their value when the rows
/// were folded, a JSON list of names. Absent on targets of earlier
/// versions: every value column with `ignore_null_updates`, else none.
pub const PROP_IGNORE_NULLS: &str = "autocdc.ignore-null-columns";
/// On a shared log: the instance that made the snapshot and the epoch of
/// the lease it held. A commit under an older epoch than the target's is
/// refused (`AUTOCDC_LEASE_LOST`): the epoch is a fencing token.
pub const PROP_COMMITTER: &str = "autocdc.committer";
pub const PROP_LEASE_EPOCH: &str = "autocdc.lease-epoch";

/// The snapshot a commit makes of the target.
enum Mode {
    /// Rows added and removed (`append` or `overwrite`).
    Delta,
    /// A compaction: files rewritten, nothing changed (`replace`).
    Compaction(Rewrite),
    /// The target's rows replaced whole (`overwrite` of everything).
    Rebuild,
}

/// What one apply takes in: changes, or (`from_snapshot` flows) a whole
/// snapshot of the source with its version.
#[derive(Debug, Clone, Copy)]
pub enum Input<'a> {
    Changes(&'a RecordBatch),
    Snapshot { rows: &'a RecordBatch, version: i64 },
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

/// How often a batch is rebuilt after a lost race or an unknown outcome
/// before the error goes to the caller.
const MAX_COMMIT_ATTEMPTS: u32 = 8;

/// Why one attempt at a batch failed.
enum Failure {
    /// The target commit lost a race or its outcome is unknown: reload, look
    /// for our snapshot, rebuild if it is not there.
    AtCommit {
        error: Error,
        snapshot_id: i64,
    },
    Other(Error),
}

impl<E: Into<Error>> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure::Other(e.into())
    }
}

impl Failure {
    fn into_error(self) -> Error {
        match self {
            Failure::AtCommit { error, .. } | Failure::Other(error) => error,
        }
    }
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

fn ms_since(t: &mut std::time::Instant) -> f64 {
    let now = std::time::Instant::now();
    let ms = (now - *t).as_secs_f64() * 1e3;
    *t = now;
    ms
}

/// The truncate floor as a JSON object of the sequence columns, so it reads
/// back whatever the row format's version.
fn floor_to_json(flow: &Flow, codec: &Codec, floor: &[u8]) -> Result<String> {
    let cols = codec
        .seqs
        .convert_rows(std::iter::once(codec.seqs.parser().parse(floor)))?;
    let fields: Vec<arrow_schema::Field> = flow
        .seq_idx
        .iter()
        .map(|&i| flow.source_arrow.field(i).clone())
        .collect();
    let batch = RecordBatch::try_new(Arc::new(arrow_schema::Schema::new(fields)), cols)?;
    let mut w = arrow_json::LineDelimitedWriter::new(Vec::new());
    w.write(&batch)?;
    w.finish()?;
    Ok(String::from_utf8_lossy(&w.into_inner()).trim().to_string())
}

fn floor_from_json(flow: &Flow, codec: &Codec, json: &str) -> Result<Box<[u8]>> {
    let fields: Vec<arrow_schema::Field> = flow
        .seq_idx
        .iter()
        .map(|&i| flow.source_arrow.field(i).clone())
        .collect();
    let bad = |m: String| Error::State {
        code: codes::TRUNCATE_FLOOR,
        message: format!("flow `{}`: {PROP_TRUNCATED_BELOW} = {json}: {m}", flow.name),
    };
    let batch = arrow_json::ReaderBuilder::new(Arc::new(arrow_schema::Schema::new(fields)))
        .build(std::io::Cursor::new(json.as_bytes()))
        .map_err(|e| bad(e.to_string()))?
        .next()
        .ok_or_else(|| bad("empty".into()))?
        .map_err(|e| bad(e.to_string()))?;
    if batch.num_rows() != 1 || batch.columns().iter().any(|c| c.null_count() > 0) {
        return Err(bad("not one complete sequence".into()));
    }
    let rows = codec.seqs.convert_columns(batch.columns())?;
    Ok(rows.row(0).data().into())
}

impl<'a> Input<'a> {
    /// The rows: the changes, or the whole snapshot.
    fn rows_batch(&self) -> &'a RecordBatch {
        match *self {
            Input::Changes(b) => b,
            Input::Snapshot { rows, .. } => rows,
        }
    }

    fn rows(&self) -> usize {
        match self {
            Input::Changes(b) => b.num_rows(),
            Input::Snapshot { rows, .. } => rows.num_rows(),
        }
    }
}

/// A batch resolved, before anything is written.
struct Planned {
    plan: Plan,
    /// The batch the plan's rows refer to, when a truncate or a snapshot
    /// diff rewrote the input.
    rewritten: Option<RecordBatch>,
    /// Truncate flows: the floor after this batch.
    floor: Option<Option<Box<[u8]>>>,
    floor_raised: bool,
    snapshot_version: Option<i64>,
}

impl Planned {
    /// A plan made from the state alone (no input batch).
    fn of(plan: Plan) -> Planned {
        Planned {
            plan,
            rewritten: None,
            floor: None,
            floor_raised: false,
            snapshot_version: None,
        }
    }
}

/// The target files of one commit, not yet committed: the delete files are
/// written, the data files may still be being encoded on other workers.
struct TargetFiles {
    data: DataWrite,
    /// Each with the partition spec of the files it applies to.
    deletes: Vec<(i32, DataFile)>,
    /// Where each inserted row went.
    locs: Vec<Loc>,
    rows: u64,
    /// (spec id, partition) of each new data file.
    partitions: Vec<(String, (i32, Struct))>,
}

/// The data files of a commit, encoded on other runtime workers while the
/// commit goes on (`finish` waits for them); dropped early (the commit
/// failed), it stops.
struct DataWrite(tokio::task::JoinHandle<Result<Vec<DataFile>>>);

impl DataWrite {
    async fn finish(mut self) -> Result<Vec<DataFile>> {
        match (&mut self.0).await {
            Ok(written) => written,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => {
                Err(std::io::Error::other(format!("the data files' writer stopped: {e}")).into())
            }
        }
    }
}

impl Drop for DataWrite {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The state table's file for one batch, written and not yet committed.
struct StateFile {
    /// None, one or (a large delta) two files.
    files: Vec<DataFile>,
    rows: u64,
    generation: i64,
    /// The file holds every entry (it replaces the state log).
    whole: bool,
}

/// The state table's commit for one batch.
struct StateCommit {
    table: TableState,
    snapshot_id: i64,
    generation: i64,
    /// The state log was rewritten whole.
    compacted: bool,
    /// Rows in the state log after this commit.
    log_rows: u64,
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

/// What to do in one maintenance run (`Engine::maintain`).
#[derive(Debug, Clone)]
pub struct MaintainOptions {
    pub now_ms: i64,
    /// Report what would be done; change nothing.
    pub dry_run: bool,
    /// Also delete unreferenced files older than this (None: skip).
    pub orphans_older_than: Option<std::time::Duration>,
    /// Compact first, when the flow's compaction is enabled.
    pub compact: bool,
}

/// One maintenance run of a flow: what was done to each table and the
/// tables' figures after it.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct MaintenanceReport {
    pub flow: String,
    pub dry_run: bool,
    pub target: TableReport,
    pub state: TableReport,
    pub target_stats: TableStats,
    pub state_stats: TableStats,
    /// The compaction this run made (None: not asked or disabled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction: Option<CompactionReport>,
    pub elapsed_ms: f64,
}

impl MaintenanceReport {
    /// Files deleted from both tables (expired, resumed and orphans).
    pub fn files_deleted(&self) -> usize {
        [&self.target, &self.state]
            .iter()
            .map(|t| {
                t.manifest_lists_deleted
                    + t.manifests_deleted
                    + t.data_files_deleted
                    + t.delete_files_deleted
                    + t.orphans_deleted
                    + t.resumed_files_deleted
            })
            .sum()
    }
}

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

fn target_properties(flow: &Flow) -> HashMap<String, String> {
    let mut props = maintain::created_table_properties();
    props.extend([
        ("write.delete.mode".to_string(), "merge-on-read".to_string()),
        ("write.update.mode".to_string(), "merge-on-read".to_string()),
        ("write.merge.mode".to_string(), "merge-on-read".to_string()),
        ("write.format.default".to_string(), "parquet".to_string()),
        (PROP_FLOW.to_string(), flow.name.clone()),
    ]);
    props.extend(flow.config.table_properties.clone());
    props
}

/// Sets the flow's `table_properties` a table lacks or has otherwise (one
/// commit, only when something differs).
async fn ensure_properties(
    flow: &Flow,
    catalog: &dyn Catalog,
    t: TableState,
) -> Result<TableState> {
    let updates: HashMap<String, String> = flow
        .config
        .table_properties
        .iter()
        .filter(|(k, v)| t.metadata.properties().get(*k) != Some(*v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if updates.is_empty() {
        return Ok(t);
    }
    catalog
        .commit(
            &t,
            vec![iceberg::TableUpdate::SetProperties { updates }],
            vec![iceberg::TableRequirement::UuidMatch {
                uuid: t.metadata.uuid(),
            }],
        )
        .await
}

/// How a history flow's target rows were folded, as its latest snapshot
/// of this flow records it. The recorded names are those of that
/// snapshot's schema (`was`), followed by field id into the current one
/// (`now`): a renamed column stays in its set, a dropped one leaves it. A
/// column added since is null in every event folded then, so both choices
/// folded alike: it takes the definition's, and adding it re-folds nothing.
fn recorded_folding(
    flow: &Flow,
    marker: &HashMap<String, String>,
    was: Option<&Schema>,
    now: &Schema,
) -> Result<Folding> {
    let tracked = match marker.get(PROP_TRACK_HISTORY) {
        _ if !flow.scd2 => Vec::new(),
        Some(json) => column_set(flow, PROP_TRACK_HISTORY, json, was, now)?,
        // Written before the property: the sequence columns were never tracked.
        None => flow
            .tracked
            .iter()
            .copied()
            .filter(|c| !flow.seq_idx.contains(c))
            .collect(),
    };
    let ignored = match marker.get(PROP_IGNORE_NULLS) {
        Some(json) => column_set(flow, PROP_IGNORE_NULLS, json, was, now)?,
        // Written before the property: no column lists existed.
        None if flow.config.ignore_null_updates => flow.value_cols(),
        None => Vec::new(),
    };
    let added = |c: usize| {
        was.zip(now.field_by_name(flow.column_name(c)))
            .is_some_and(|(was, f)| was.field_by_id(f.id).is_none())
    };
    let want = Folding::of(flow);
    let with_added = |mut set: Vec<usize>, wanted: &[usize]| {
        set.retain(|&c| !added(c));
        set.extend(wanted.iter().copied().filter(|&c| added(c)));
        set.sort_unstable();
        set.dedup();
        set
    };
    Ok(Folding {
        tracked: with_added(tracked, &want.tracked),
        ignored: with_added(ignored, &want.ignored),
    })
}

/// A column named in schema `was` (a snapshot's), by its name in `now` (the
/// current schema): None when it was dropped since.
fn follow(name: &str, was: Option<&Schema>, now: &Schema) -> Option<String> {
    match was.and_then(|w| w.field_by_name(name)) {
        Some(f) => now.field_by_id(f.id).map(|g| g.name.clone()),
        None => Some(name.to_string()),
    }
}

/// A snapshot property's JSON list of value column names, as source indices (sorted).
fn column_set(
    flow: &Flow,
    prop: &str,
    json: &str,
    was: Option<&Schema>,
    now: &Schema,
) -> Result<Vec<usize>> {
    let bad = |message: String| Error::State {
        code: codes::SCHEMA_DRIFT,
        message: format!("flow `{}`: {prop} {message}", flow.name),
    };
    let names: Vec<String> =
        serde_json::from_str(json).map_err(|e| bad(format!("is unreadable: {e}")))?;
    let value_cols = flow.value_cols();
    let mut out = names
        .iter()
        .filter_map(|n| follow(n, was, now))
        .map(|n| {
            value_cols
                .iter()
                .copied()
                .find(|&c| flow.column_name(c) == n)
                .ok_or_else(|| {
                    bad(format!(
                        "names `{n}`, which is not a value column of the flow"
                    ))
                })
        })
        .collect::<Result<Vec<_>>>()?;
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// The schema of the latest snapshot of the target this flow wrote.
fn our_latest_schema<'m>(meta: &'m TableMetadata, flow: &str) -> Option<&'m Schema> {
    let s = meta.snapshot_by_id(our_latest_id(meta, flow)?)?;
    meta.schema_by_id(s.schema_id()?).map(|s| s.as_ref())
}

/// The id of the latest snapshot of the target this flow wrote.
fn our_latest_id(meta: &TableMetadata, flow: &str) -> Option<i64> {
    current_chain(meta)
        .find(|s| written_by(s, flow))
        .map(|s| s.snapshot_id())
}

/// The latest snapshot of the target written by this flow, walking back from
/// the current one; and whether any snapshot after it came from elsewhere.
fn our_latest(meta: &TableMetadata, flow: &str) -> (Option<HashMap<String, String>>, bool) {
    let mut foreign = false;
    for s in current_chain(meta) {
        if written_by(s, flow) {
            return (Some(s.summary().additional_properties.clone()), foreign);
        }
        foreign = true;
    }
    (None, foreign)
}

fn written_by(s: &iceberg::spec::Snapshot, flow: &str) -> bool {
    s.summary()
        .additional_properties
        .get(PROP_FLOW)
        .map(String::as_str)
        == Some(flow)
}

/// The current snapshot and its ancestors, newest first.
fn current_chain(meta: &TableMetadata) -> impl Iterator<Item = &iceberg::spec::SnapshotRef> + '_ {
    parent_chain(meta, meta.current_snapshot().map(|s| s.snapshot_id()))
}

fn render_spec(spec: &PartitionSpec, schema: &Schema) -> String {
    let fields: Vec<String> = spec
        .fields()
        .iter()
        .map(|f| {
            let col = schema
                .field_by_id(f.source_id)
                .map(|c| c.name.clone())
                .unwrap_or_else(|| format!("#{}", f.source_id));
            format!("{}({col})", f.transform)
        })
        .collect();
    format!("[{}]", fields.join(", "))
}

/// The partition spec the target moves to with the definition, when its
/// default spec partitions otherwise: the definition's transforms over the
/// columns of `schema` (the target's, once evolved), by name. A field keeps
/// the id an older spec gave its source and transform (Iceberg's rule); a
/// new one takes the next after `last-partition-id`.
fn repartition(
    flow: &Flow,
    meta: &TableMetadata,
    schema: &Schema,
) -> Result<Option<UnboundPartitionSpec>> {
    let have = render_spec(meta.default_partition_spec(), schema);
    let want = render_spec(&flow.partition_spec, &flow.target_schema);
    if have == want {
        return Ok(None);
    }
    let refused = |why: String| Error::State {
        code: codes::PARTITION_DRIFT,
        message: format!(
            "flow `{}`: partition_by {want} cannot partition {} (now {have}): {why}",
            flow.name, flow.target
        ),
    };
    let known: HashMap<(i32, String), i32> = meta
        .partition_specs_iter()
        .flat_map(|s| s.fields())
        .map(|f| ((f.source_id, f.transform.to_string()), f.field_id))
        .collect();
    let mut next = meta.last_partition_id();
    let mut fields = Vec::new();
    for f in flow.partition_spec.fields() {
        let name = flow
            .target_schema
            .field_by_id(f.source_id)
            .map_or("", |c| c.name.as_str());
        let col = schema
            .field_by_name(name)
            .ok_or_else(|| refused(format!("the target has no column `{name}`")))?;
        let field_id = *known
            .get(&(col.id, f.transform.to_string()))
            .unwrap_or_else(|| {
                next += 1;
                &next
            });
        fields.push(UnboundPartitionField {
            source_id: col.id,
            field_id: Some(field_id),
            name: f.name.clone(),
            transform: f.transform,
        });
    }
    let spec = UnboundPartitionSpec::builder()
        .add_partition_fields(fields)
        .map_err(|e| refused(e.message().to_string()))?
        .build();
    // Bound now, so a spec the table cannot take fails before anything changes.
    PartitionSpecBuilder::new_from_unbound(spec.clone(), Arc::new(schema.clone()))
        .and_then(|b| b.build())
        .map_err(|e| refused(e.message().to_string()))?;
    Ok(Some(spec))
}

/// One flow writes a target: the flow that made its state table (that
/// table's `autocdc.flow` property, else the flow of the target's latest
/// autocdc snapshot) must be this one. Two flows on one table would each
/// resolve against their own view of the state and undo each other's rows.
/// A target without a state table is adopted (its rows are another writer's).
fn check_owner(flow: &Flow, target: &TableState, state: Option<&TableState>) -> Result<()> {
    let Some(state) = state else {
        return Ok(());
    };
    let owner = match state.metadata.properties().get(PROP_FLOW) {
        Some(o) => Some((
            o.clone(),
            format!("the {PROP_FLOW} property of {}", state.ident),
        )),
        None => current_chain(&target.metadata)
            .take(MAX_OWNER_WALK)
            .find_map(|s| s.summary().additional_properties.get(PROP_FLOW).cloned())
            .map(|o| (o, "its latest autocdc snapshot".to_string())),
    };
    match owner {
        Some((owner, why)) if owner != flow.name => Err(Error::Definition {
            code: codes::TARGET_IN_USE,
            flow: flow.name.clone(),
            message: format!(
                "{} is written by flow `{owner}` ({why}); two flows writing one table undo each other's changes. Name this flow `{owner}`, give it a target of its own, or drop {} and {} to start over",
                flow.target,
                flow.target,
                flow.state_ident()
            ),
        }),
        _ => Ok(()),
    }
}

/// How far back `check_owner` looks for the latest autocdc snapshot (other
/// writers' snapshots can follow it; a long run of them is not autocdc's table).
const MAX_OWNER_WALK: usize = 1000;

/// The snapshots from `from` back through their parents, newest first.
/// Bounded by the table's snapshot count: a chain has no cycle, but a
/// hand-edited table might.
fn parent_chain(
    meta: &TableMetadata,
    from: Option<i64>,
) -> impl Iterator<Item = &iceberg::spec::SnapshotRef> + '_ {
    let mut next = from;
    std::iter::from_fn(move || {
        let s = meta.snapshot_by_id(next?)?;
        next = s.parent_snapshot_id();
        Some(s)
    })
    .take(meta.snapshots().len())
}

/// The target's keys (its identifier fields) against the definition's.
fn check_keys(flow: &Flow, meta: &TableMetadata) -> Result<()> {
    let table = meta.current_schema();
    let mut keys: Vec<String> = table
        .identifier_field_ids()
        .filter_map(|id| table.field_by_id(id).map(|f| f.name.clone()))
        .collect();
    keys.sort();
    // SCD Type 2 targets declare no identifier fields (a key has many versions).
    let mut want: Vec<String> = flow
        .target_schema
        .identifier_field_ids()
        .filter_map(|id| flow.target_schema.field_by_id(id).map(|f| f.name.clone()))
        .collect();
    want.sort();
    if keys != want {
        return Err(Error::State {
            code: codes::KEY_SCHEMA_DRIFT,
            message: format!(
                "flow `{}`: the keys are [{}] but the existing target {} is keyed on [{}]; to rebuild the target and its state with the new keys run `autocdc refresh --full {}`",
                flow.name,
                want.join(", "),
                flow.target,
                keys.join(", "),
                flow.name
            ),
        });
    }
    Ok(())
}

/// A change `evolve` refuses, as the definition error it is.
fn refused(flow: &Flow, table: &str, r: Refusal) -> Error {
    Error::State {
        code: codes::SCHEMA_DRIFT,
        message: format!(
            "flow `{}`: {r} (in {table}); change the flow back, or rebuild the target and its state with `autocdc refresh --full {}`",
            flow.name, flow.name
        ),
    }
}

/// The schema the target moves to with the definition, if it differs: see
/// `evolve`. SCD Type 2 refuses to drop a tracked column: the versions it
/// split would have to merge, and the state would no longer hold its values
/// to re-fold them.
fn target_evolution(flow: &Flow, meta: &TableMetadata) -> Result<Option<Evolution>> {
    let mut fixed: Vec<String> = flow
        .key_idx
        .iter()
        .chain(&flow.seq_idx)
        .map(|&c| flow.column_name(c).to_string())
        .collect();
    if flow.scd2 {
        fixed.extend([START_AT.to_string(), END_AT.to_string()]);
    }
    let rules = Rules {
        renames: flow.renames(),
        fixed,
        partition_sources: meta
            .partition_specs_iter()
            .flat_map(|s| s.fields().iter().map(|f| f.source_id))
            .collect(),
    };
    let target = flow.target.to_string();
    let evo = evolve::evolve(
        meta.current_schema(),
        &flow.target_schema,
        meta.last_column_id(),
        &rules,
    )
    .map_err(|r| refused(flow, &target, r))?;
    let (Some(e), true) = (&evo, flow.scd2) else {
        return Ok(evo);
    };
    let (Some(marker), _) = our_latest(meta, &flow.name) else {
        return Ok(evo);
    };
    let now = meta.current_schema();
    let was = our_latest_schema(meta, &flow.name);
    // Without the property (earlier versions) every value column was tracked.
    let tracked: Option<Vec<String>> = marker.get(PROP_TRACK_HISTORY).map(|json| {
        serde_json::from_str::<Vec<String>>(json)
            .unwrap_or_default()
            .iter()
            .filter_map(|n| follow(n, was, now))
            .collect()
    });
    if let Some(d) = e
        .dropped()
        .find(|d| tracked.as_ref().is_none_or(|t| t.iter().any(|n| n == d)))
    {
        return Err(refused(
            flow,
            &target,
            Refusal {
                column: d.to_string(),
                rule: "SCD Type 2 history tracks it, so dropping it would merge the versions it split; untrack it first (track_history_except_column_list, which re-folds the history from the state), then drop it".into(),
            },
        ));
    }
    Ok(evo)
}

/// The schema changes a definition makes to an existing target and its state table.
#[derive(Default)]
struct Evolutions {
    target: Option<Evolution>,
    state: Option<Evolution>,
    /// The target's new default partition spec.
    spec: Option<UnboundPartitionSpec>,
}

/// An existing target (and its state table, when there is one) against
/// the definition: the state's keys and sequence first (Spark's order), then
/// the target's keys, columns and partitioning.
fn check_drift(flow: &Flow, target: &TableState, state: Option<&TableState>) -> Result<Evolutions> {
    check_owner(flow, target, state)?;
    let mut evolutions = Evolutions::default();
    if let Some(s) = state {
        state_table::check(flow, s.metadata.current_schema())?;
        evolutions.state = state_table::evolution(flow, &s.metadata)
            .map_err(|r| refused(flow, &flow.state_ident().to_string(), r))?;
    }
    check_keys(flow, &target.metadata)?;
    evolutions.target = target_evolution(flow, &target.metadata)?;
    let schema = evolutions
        .target
        .as_ref()
        .map_or(target.metadata.current_schema().as_ref(), |e| &e.schema);
    evolutions.spec = repartition(flow, &target.metadata, schema)?;
    Ok(evolutions)
}

/// Moves `table` to the evolved schema: one metadata commit, which fails
/// (nothing changed) when the table's schema moved meanwhile.
async fn evolve_table(
    flow: &Flow,
    catalog: &dyn Catalog,
    table: TableState,
    e: Evolution,
) -> Result<TableState> {
    let requirements = vec![
        iceberg::TableRequirement::UuidMatch {
            uuid: table.metadata.uuid(),
        },
        iceberg::TableRequirement::CurrentSchemaIdMatch {
            current_schema_id: table.metadata.current_schema_id(),
        },
        iceberg::TableRequirement::LastAssignedFieldIdMatch {
            last_assigned_field_id: table.metadata.last_column_id(),
        },
    ];
    let updates = vec![
        iceberg::TableUpdate::AddSchema {
            schema: e.schema.clone(),
        },
        iceberg::TableUpdate::SetCurrentSchema { schema_id: -1 },
    ];
    let t = catalog.commit(&table, updates, requirements).await?;
    tracing::info!(
        flow = %flow.name,
        table = %t.ident,
        schema_id = t.metadata.current_schema_id(),
        changes = %e.describe(),
        "schema evolved"
    );
    Ok(t)
}

/// Makes `spec` the target's default partition spec: one metadata commit
/// (`AddSpec` + `SetDefaultSpec`; an existing equal spec is reused), which
/// fails, nothing changed, when the table's specs moved meanwhile. Files
/// keep the spec they were written with; new ones take this one.
async fn repartition_table(
    flow: &Flow,
    catalog: &dyn Catalog,
    table: TableState,
    spec: UnboundPartitionSpec,
) -> Result<TableState> {
    let requirements = vec![
        iceberg::TableRequirement::UuidMatch {
            uuid: table.metadata.uuid(),
        },
        iceberg::TableRequirement::DefaultSpecIdMatch {
            default_spec_id: table.metadata.default_partition_spec_id(),
        },
        iceberg::TableRequirement::LastAssignedPartitionIdMatch {
            last_assigned_partition_id: table.metadata.last_partition_id(),
        },
    ];
    let updates = vec![
        iceberg::TableUpdate::AddSpec { spec },
        iceberg::TableUpdate::SetDefaultSpec { spec_id: -1 },
    ];
    let t = catalog.commit(&table, updates, requirements).await?;
    tracing::info!(
        flow = %flow.name,
        table = %t.ident,
        spec_id = t.metadata.default_partition_spec_id(),
        spec = %render_spec(t.metadata.default_partition_spec(), t.metadata.current_schema()),
        "partition spec evolved"
    );
    Ok(t)
}

/// The target and the state table, each created when missing (the target
/// checked against the definition when it exists).
async fn open_tables(
    flow: &Flow,
    catalog: &dyn Catalog,
    faults: &Faults,
    evolved: &mut Vec<String>,
) -> Result<(TableState, TableState)> {
    let state_ident = flow.state_ident();
    let mut state_tbl = catalog.load_table(&state_ident).await?;
    let target = match catalog.load_table(&flow.target).await? {
        Some(mut t) => {
            // Both checked before either changes; the state first, so a
            // crash between the two commits is finished by the next open.
            let evolutions = check_drift(flow, &t, state_tbl.as_ref())?;
            if let Some(e) = evolutions.state
                && let Some(s) = state_tbl.take()
            {
                evolved.push(format!("{}: {}", s.ident, e.describe()));
                state_tbl = Some(evolve_table(flow, catalog, s, e).await?);
            }
            faults.hit(FaultPoint::AfterStateSchema)?;
            if let Some(e) = evolutions.target {
                evolved.push(format!("{}: {}", t.ident, e.describe()));
                t = evolve_table(flow, catalog, t, e).await?;
            }
            if let Some(spec) = evolutions.spec {
                t = repartition_table(flow, catalog, t, spec).await?;
                let m = &t.metadata;
                evolved.push(format!(
                    "{}: partition spec {} {}",
                    t.ident,
                    m.default_partition_spec_id(),
                    render_spec(m.default_partition_spec(), m.current_schema())
                ));
            }
            ensure_properties(flow, catalog, t).await?
        }
        None => {
            if state_tbl.take().is_some() {
                // The target was dropped without its state, which describes
                // rows that are gone (and may be of another definition).
                tracing::warn!(
                    flow = %flow.name,
                    state = %state_ident,
                    "the target is gone but its state table is not: dropping the state"
                );
                catalog.drop_table(&state_ident).await?;
            }
            create_or_load(
                catalog,
                &flow.target,
                flow.target_schema.clone(),
                flow.partition_spec.clone().into_unbound(),
                target_properties(flow),
            )
            .await?
        }
    };
    let state_tbl = match state_tbl {
        Some(t) => ensure_properties(flow, catalog, t).await?,
        None => {
            let mut props = maintain::created_table_properties();
            props.extend(flow.config.table_properties.clone());
            props.insert(PROP_FLOW.to_string(), flow.name.clone());
            create_or_load(
                catalog,
                &state_ident,
                state_table::schema(flow)?,
                UnboundPartitionSpec::builder().build(),
                props,
            )
            .await?
        }
    };
    Ok((target, state_tbl))
}

/// Creates a table, or loads it when another writer created it first: two
/// instances starting one flow on a new catalog (a shared log) race here,
/// and the table the winner made is the one both use.
async fn create_or_load(
    catalog: &dyn Catalog,
    ident: &iceberg::TableIdent,
    schema: Schema,
    spec: UnboundPartitionSpec,
    properties: HashMap<String, String>,
) -> Result<TableState> {
    match catalog.create_table(ident, schema, spec, properties).await {
        Err(Error::CommitConflict(e)) => match catalog.load_table(ident).await? {
            Some(t) => Ok(t),
            None => Err(Error::CommitConflict(e)),
        },
        r => r,
    }
}

/// The state table's rows as of snapshot `sid` (the one the target names).
/// State files read at once when a flow opens.
const STATE_FILES_IN_FLIGHT: usize = 8;

async fn read_state(
    flow: &Flow,
    catalog: &dyn Catalog,
    state_tbl: &TableState,
    sid: i64,
) -> Result<Vec<RecordBatch>> {
    let Some(snap) = state_tbl.metadata.snapshot_by_id(sid) else {
        return Err(Error::State {
            code: codes::STATE_SNAPSHOT_MISSING,
            message: format!(
                "flow `{}`: the target names state snapshot {sid}, which {} does not have; the state table was removed or expired. Run `autocdc refresh --full {}`",
                flow.name,
                flow.state_ident(),
                flow.name
            ),
        });
    };
    // The state table is only appended to and replaced whole: its rows are
    // its data files' rows. They are read here rather than with
    // iceberg-rust's scan, which takes key columns named like its metadata
    // columns (`pos`, `file_path`) for those.
    let file_io = catalog.file_io();
    let inv = compact::inventory_of(file_io, state_tbl, snap).await?;
    if !inv.pos_deletes.is_empty() || !inv.eq_deletes.is_empty() {
        return Err(Error::State {
            code: codes::STATE_SCHEMA,
            message: format!(
                "flow `{}`: state snapshot {sid} of {} has delete files, which autocdc never writes there; another writer changed it. Run `autocdc refresh --full {}`",
                flow.name,
                flow.state_ident(),
                flow.name
            ),
        });
    }
    let batches: Vec<RecordBatch> = futures::stream::iter(inv.data)
        .map(|e| {
            let io = file_io.clone();
            async move { compact::read_parquet(&io, e.file.file_path()).await }
        })
        .buffered(STATE_FILES_IN_FLIGHT)
        .try_collect::<Vec<_>>()
        .await?
        .into_iter()
        .flatten()
        .collect();
    // Each file in its own schema: into the current one by field id (a
    // column evolved since is renamed, widened, or null when added).
    let now = state_tbl.metadata.current_schema();
    let arrow = Arc::new(schema_to_arrow_schema(now)?);
    batches
        .iter()
        .map(|b| {
            write::to_schema(b, now, &arrow).map_err(|what| Error::State {
                code: codes::STATE_SCHEMA,
                message: format!("flow `{}`: the state table's {what}", flow.name),
            })
        })
        .collect()
}

impl Engine {
    /// Opens the flow: creates the target and the state table when missing,
    /// then recovers the state as of the target's latest autocdc commit.
    pub async fn open(
        flow: Flow,
        catalog: Arc<dyn Catalog>,
        faults: Arc<Faults>,
    ) -> Result<Engine> {
        Engine::open_for_log(flow, catalog, faults, None).await
    }

    /// Whether the existing target (if any) accepts this definition: the
    /// drift checks of `open`, without creating tables or reading the state.
    pub async fn check_target(flow: &Flow, catalog: &dyn Catalog) -> Result<()> {
        match catalog.load_table(&flow.target).await? {
            Some(t) => {
                let state = catalog.load_table(&flow.state_ident()).await?;
                check_drift(flow, &t, state.as_ref()).map(|_| ())
            }
            None => Ok(()),
        }
    }

    /// The ingest logs whose offsets the flow's target records (none without
    /// a target).
    pub async fn recorded_logs(flow: &Flow, catalog: &dyn Catalog) -> Result<Vec<String>> {
        let Some(t) = catalog.load_table(&flow.target).await? else {
            return Ok(Vec::new());
        };
        let (marker, _) = our_latest(&t.metadata, &flow.name);
        let offsets = offsets::parse(marker.as_ref().and_then(|m| m.get(PROP_INPUT_OFFSETS)))?;
        Ok(offsets.into_keys().collect())
    }

    /// Opens the flow for commits from one ingest log: the input offset read
    /// and recorded is that log's entry of `autocdc.input-offsets`.
    /// The offset of `log` the target records, and its current snapshot,
    /// read from the target's metadata alone (no state): what an instance
    /// that does not commit a flow reports as committed.
    pub async fn committed_offset(
        flow: &Flow,
        catalog: &dyn Catalog,
        log: &LogRef,
    ) -> Result<(i64, Option<i64>)> {
        let Some(t) = catalog.load_table(&flow.target).await? else {
            return Ok((0, None));
        };
        let (marker, _) = our_latest(&t.metadata, &flow.name);
        let offsets = offsets::parse(marker.as_ref().and_then(|m| m.get(PROP_INPUT_OFFSETS)))?;
        let single = marker
            .as_ref()
            .and_then(|m| m.get(PROP_INPUT_OFFSET))
            .and_then(|v| v.parse::<i64>().ok());
        Ok((
            offsets::offset_for(&offsets, single, Some(log)),
            t.metadata.current_snapshot_id(),
        ))
    }

    pub async fn open_for_log(
        flow: Flow,
        catalog: Arc<dyn Catalog>,
        faults: Arc<Faults>,
        log: Option<LogRef>,
    ) -> Result<Engine> {
        let codec = Codec::new(&flow)?;
        let mut evolved = Vec::new();
        let (target, state_tbl) =
            open_tables(&flow, catalog.as_ref(), &faults, &mut evolved).await?;
        let (marker, foreign) = our_latest(&target.metadata, &flow.name);
        let num =
            |m: &HashMap<String, String>, k: &str| m.get(k).and_then(|v| v.parse::<i64>().ok());
        let state_snapshot = marker.as_ref().and_then(|m| num(m, PROP_STATE_SNAPSHOT));
        let generation = marker
            .as_ref()
            .and_then(|m| num(m, PROP_GENERATION))
            .unwrap_or(0);
        let offsets = offsets::parse(marker.as_ref().and_then(|m| m.get(PROP_INPUT_OFFSETS)))?;
        let input_offset = offsets::offset_for(
            &offsets,
            marker.as_ref().and_then(|m| num(m, PROP_INPUT_OFFSET)),
            log.as_ref(),
        );
        let mut state = FlowState::new(&flow)?;
        let mut state_log_rows = 0;
        if let Some(sid) = state_snapshot {
            let rows = read_state(&flow, catalog.as_ref(), &state_tbl, sid).await?;
            state_log_rows = state.load(&flow, &codec, &rows)?;
        }
        let partitioner = Partitioner::new(
            target.metadata.default_partition_spec().clone(),
            target.metadata.current_schema(),
        )?
        .map(Arc::new);
        let key_ids: Vec<i32> = target
            .metadata
            .current_schema()
            .identifier_field_ids()
            .collect();
        let partitioned_by_keys = partitioner
            .as_ref()
            .is_some_and(|p| p.source_ids.iter().all(|id| key_ids.contains(id)));
        let floor = match marker.as_ref().and_then(|m| m.get(PROP_TRUNCATED_BELOW)) {
            Some(json) => Some(floor_from_json(&flow, &codec, json)?),
            None => None,
        };
        let snapshot_version = marker.as_ref().and_then(|m| num(m, PROP_SNAPSHOT_VERSION));
        let folded_with = match (&marker, state_snapshot) {
            (Some(m), Some(_)) if flow.keeps_history() => recorded_folding(
                &flow,
                m,
                our_latest_schema(&target.metadata, &flow.name),
                target.metadata.current_schema(),
            )?,
            _ => Folding::of(&flow),
        };
        let mut engine = Engine {
            evolved,
            folded_with,
            snapshot_version,
            floor,
            partitioner,
            partitioned_by_keys,
            file_partitions: None,
            gone_files: 0,
            codec,
            catalog,
            faults,
            state_complete: !foreign
                && marker
                    .as_ref()
                    .and_then(|m| m.get(PROP_STATE_COMPLETE))
                    .is_none_or(|v| v != "false"),
            target,
            state_tbl,
            state_snapshot,
            state,
            generation,
            input_offset,
            log,
            offsets,
            state_log_rows,
            poisoned: false,
            lease: None,
            flow,
        };
        if foreign || !engine.state_complete {
            // Another writer has committed to the target: a compaction may
            // have moved rows out of the files the state points into. Rows in
            // files no longer live are removed by key (equality delete).
            engine.load_file_partitions().await?;
            let live = engine.file_partitions.as_ref().expect("loaded");
            engine.gone_files = engine.state.files_mut().mark_gone(|p| live.contains_key(p));
        }
        Ok(engine)
    }

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

    /// The maintenance phase: finish any cleanup a stopped run left, expire
    /// the target's snapshots (never this flow's latest), then the state
    /// table's (never one a kept target snapshot names, so recovery always
    /// finds its state), then, when asked, delete orphan files of both.
    /// Runs between commits, never during one. After an error, reopen.
    pub async fn maintain(&mut self, opts: &MaintainOptions) -> Result<MaintenanceReport> {
        let started = std::time::Instant::now();
        let catalog = self.catalog.clone();
        let io = catalog.file_io().clone();
        let mut report = MaintenanceReport {
            flow: self.flow.name.clone(),
            dry_run: opts.dry_run,
            ..Default::default()
        };
        report.target.table = self.flow.target.to_string();
        report.state.table = self.flow.state_ident().to_string();
        if !opts.dry_run {
            maintain::resume(&io, &self.target, &mut report.target).await?;
            maintain::resume(&io, &self.state_tbl, &mut report.state).await?;
        }
        if opts.compact && self.flow.compaction.enabled {
            report.compaction = Some(self.compact(opts.now_ms, opts.dry_run).await?);
        }
        let policy = self.flow.maintenance;
        let meta = self.target.metadata.clone();
        let protect = our_latest_id(&meta, &self.flow.name).into_iter().collect();
        let ids = maintain::expirable(&meta, opts.now_ms, Retention::of(&meta, &policy), &protect);
        if let Some(t) = maintain::expire(
            catalog.as_ref(),
            &self.target,
            &ids,
            opts.dry_run,
            &self.faults,
            &mut report.target,
        )
        .await?
        {
            self.target = t;
        }
        // The state snapshots that kept target snapshots name.
        let mut named: std::collections::HashSet<i64> = meta
            .snapshots()
            .filter(|s| !ids.contains(&s.snapshot_id()))
            .filter_map(|s| {
                s.summary()
                    .additional_properties
                    .get(PROP_STATE_SNAPSHOT)?
                    .parse()
                    .ok()
            })
            .collect();
        named.extend(self.state_snapshot);
        let smeta = self.state_tbl.metadata.clone();
        let sids = maintain::expirable(&smeta, opts.now_ms, Retention::of(&smeta, &policy), &named);
        if let Some(t) = maintain::expire(
            catalog.as_ref(),
            &self.state_tbl,
            &sids,
            opts.dry_run,
            &self.faults,
            &mut report.state,
        )
        .await?
        {
            self.state_tbl = t;
        }
        if let Some(older) = opts.orphans_older_than {
            let (now, dry) = (opts.now_ms, opts.dry_run);
            maintain::delete_orphans(
                catalog.as_ref(),
                &self.target,
                now,
                older,
                dry,
                &mut report.target,
            )
            .await?;
            maintain::delete_orphans(
                catalog.as_ref(),
                &self.state_tbl,
                now,
                older,
                dry,
                &mut report.state,
            )
            .await?;
        }
        report.target_stats = maintain::stats(&io, &self.target).await?;
        report.state_stats = maintain::stats(&io, &self.state_tbl).await?;
        report.elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
        Ok(report)
    }

    /// The compaction phase (`table::compact`): rewrite the target's small
    /// and delete-heavy data files with their deletes applied, drop or merge
    /// the delete files that go with them, move the state's row locations
    /// with the rows and commit like a batch: the state table (whole, when
    /// its own files are many), then the target as one `replace` snapshot
    /// naming it. A commit another writer beat is abandoned (the engine is
    /// reopened) and left for the next run. Runs between commits only.
    pub async fn compact(&mut self, now_ms: i64, dry_run: bool) -> Result<CompactionReport> {
        let started = std::time::Instant::now();
        let mut report = CompactionReport::default();
        let policy = self.flow.compaction;
        let io = self.catalog.file_io().clone();
        let meta = self.target.metadata.clone();
        let target = compact::target_file_size(&meta, &policy);
        let Some(inv) = compact::inventory(&io, &self.target).await? else {
            report.skipped = Some("the target has no snapshot yet".into());
            return Ok(report);
        };
        let pd = compact::read_position_deletes(&io, &inv).await?;
        let sel = compact::select(&inv, &pd, &policy, target, meta.default_partition_spec_id());
        let state_figure = |name: &str| {
            self.state_tbl
                .metadata
                .current_snapshot()
                .and_then(|s| {
                    s.summary()
                        .additional_properties
                        .get(name)?
                        .parse::<u64>()
                        .ok()
                })
                .unwrap_or(0)
        };
        let state_files = state_figure("total-data-files") as usize;
        // The state table is rewritten into one file once it has many, when
        // that fits the run's budget (a larger state is rewritten by the
        // commits' own rule, once its log is 3 times its entries).
        let state_whole = state_files >= policy.min_input_files.max(2)
            && state_figure("total-files-size") <= policy.max_bytes_per_run;
        report.data_files_rewritten = sel.rewrite.len();
        report.data_files_dropped = sel.drop_data.len();
        report.delete_files_removed = sel.drop_pos.len()
            + sel.drop_eq.len()
            + sel.merge_pos.iter().map(Vec::len).sum::<usize>();
        report.equality_delete_files_removed = sel.drop_eq.len();
        report.bytes_read = sel.bytes;
        if state_whole {
            report.state_files_rewritten = state_files;
        }
        if sel.is_empty() && !state_whole {
            report.skipped = Some("nothing to compact".into());
            report.elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
            return Ok(report);
        }
        if dry_run {
            report.elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
            return Ok(report);
        }
        self.usable()?;
        self.poisoned = true;
        let schema = meta.current_schema().clone();
        let spec_id = meta.default_partition_spec_id();
        let mut namer = FileNamer::new(meta.location());
        let done = compact::rewrite(
            &io,
            &inv,
            &pd,
            &sel,
            schema,
            spec_id,
            self.partitioner.as_deref(),
            &mut namer,
            target,
        )
        .await?;
        self.faults.hit(FaultPoint::AfterCompactionFiles)?;
        report.data_files_written = done.data.len();
        report.delete_files_written = done.deletes.len();
        report.bytes_read = done.bytes_read + pd.bytes_read;
        report.bytes_written = done
            .data
            .iter()
            .chain(done.deletes.iter().map(|(_, f)| f))
            .map(|f| f.file_size_in_bytes())
            .sum();
        report.rows_moved = done.rows_moved;
        report.rows_dropped = done.rows_dropped;

        // The state follows the rows.
        let new_ids: Vec<u32> = done
            .data
            .iter()
            .map(|f| self.state.files_mut().intern(f.file_path()))
            .collect();
        let mut moves: HashMap<u32, compact::Moves> = HashMap::new();
        for (path, to) in done.moves {
            let id = self.state.files_mut().intern(&path);
            moves.insert(id, to);
        }
        self.state.relocate(|loc| {
            let (f, pos) = (*moves.get(&loc.file)?.get(loc.pos as usize)?)?;
            Some(Loc {
                file: new_ids[f as usize],
                pos,
            })
        });
        // A position in a removed file no longer locates anything.
        self.state
            .files_mut()
            .mark_gone(|p| !done.removed.contains(p));
        let generation = self.generation + 1;
        let whole = state_whole || self.state.needs_compaction(self.state_log_rows);
        let delta = self
            .state
            .delta(&self.flow, &self.codec, generation, whole)?;
        let rewrite = Rewrite {
            removed: done.removed,
            data_sequence: inv.snapshot_seq,
        };
        let committed = self
            .commit_compaction(
                done.data,
                done.deletes,
                rewrite,
                delta,
                generation,
                whole,
                now_ms,
            )
            .await;
        match committed {
            Ok(()) => {}
            Err(Failure::AtCommit { error, .. }) => {
                // Another writer committed first: nothing of ours is in the
                // target. Reload everything and leave the work for the next run.
                *self = self.reopen().await?;
                report.skipped = Some(format!(
                    "abandoned, another writer committed first: {error}"
                ));
            }
            Err(Failure::Other(e)) => return Err(e),
        }
        report.elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
        Ok(report)
    }

    /// A compaction's commits: the state table (its moved locations, or
    /// all of it when `whole`), then the target's `replace` snapshot naming
    /// it; then the engine takes both.
    #[allow(clippy::too_many_arguments)]
    async fn commit_compaction(
        &mut self,
        data: Vec<DataFile>,
        deletes: Vec<(i32, DataFile)>,
        rewrite: Rewrite,
        delta: Vec<RecordBatch>,
        generation: i64,
        whole: bool,
        now_ms: i64,
    ) -> std::result::Result<(), Failure> {
        let mut file_ms = 0.0;
        let state = self
            .commit_state(delta, generation, whole, now_ms, &mut file_ms)
            .await?;
        let spec_id = self.target.metadata.default_partition_spec_id();
        let partitions: Vec<(String, (i32, Struct))> = data
            .iter()
            .map(|f| (f.file_path().to_string(), (spec_id, f.partition().clone())))
            .collect();
        let (offsets, input_offset) = (self.offsets.clone(), self.input_offset);
        let floor = self.floor.clone();
        let removed = rewrite.removed.clone();
        let (target, _) = self
            .commit_target(
                data,
                deletes,
                &state,
                &offsets,
                floor.as_deref(),
                None,
                input_offset,
                now_ms,
                Mode::Compaction(rewrite),
            )
            .await?;
        self.publish(target, state, offsets, partitions, None, None, input_offset);
        if let Some(map) = &mut self.file_partitions {
            map.retain(|p, _| !removed.contains(p));
        }
        // Forget the rewritten files' ids: the file table stays as large
        // as the set of files rows are in.
        self.state.shrink_files();
        Ok(())
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

    /// A history flow whose tracked set (SCD Type 2) or null-ignoring
    /// columns changed since the target's rows were folded: one commit
    /// re-folds every key's events in the state as the flow folds. Only the
    /// rows that differ are removed and written; no input is read and the
    /// offsets stay.
    async fn refold(&mut self, now_ms: i64) -> Result<CommitReport> {
        self.usable()?;
        let clock = std::time::Instant::now();
        let plan = self
            .state
            .refold(&self.flow, &self.folded_with, self.state_complete)?;
        let now = Folding::of(&self.flow);
        let names = |cols: &[usize]| {
            cols.iter()
                .map(|&c| self.flow.column_name(c))
                .collect::<Vec<_>>()
                .join(", ")
        };
        tracing::info!(
            flow = %self.flow.name,
            tracked_was = %names(&self.folded_with.tracked),
            tracked = %names(&now.tracked),
            ignore_nulls_was = %names(&self.folded_with.ignored),
            ignore_nulls = %names(&now.ignored),
            "the tracked or null-ignoring columns changed: re-folding the history"
        );
        self.folded_with = now;
        self.commit_from_state(plan, now_ms, Mode::Delta, clock)
            .await
    }

    /// Commits a plan made from the state alone (a re-fold, a rebuild): no
    /// input batch, and the input offsets stay where they are.
    async fn commit_from_state(
        &mut self,
        plan: Plan,
        now_ms: i64,
        mode: Mode,
        clock: std::time::Instant,
    ) -> Result<CommitReport> {
        let empty = RecordBatch::new_empty(self.flow.source_arrow.clone());
        let (input_offset, offsets) = (self.input_offset, self.offsets.clone());
        self.commit_planned(
            Planned::of(plan),
            &empty,
            now_ms,
            input_offset,
            offsets,
            mode,
            clock,
        )
        .await
        .map_err(Failure::into_error)
    }

    /// `autocdc refresh --history`: the target's rows replaced whole by the
    /// fold of every key's events in the state, in one overwrite commit (a
    /// history flow's state holds every value it applied). Rows another
    /// writer added go; the offsets stay.
    pub async fn rebuild(&mut self, now_ms: i64) -> Result<CommitReport> {
        self.usable()?;
        let clock = std::time::Instant::now();
        let plan = self.state.rebuild(&self.flow)?;
        self.folded_with = Folding::of(&self.flow);
        self.state_complete = true;
        let report = self
            .commit_from_state(plan, now_ms, Mode::Rebuild, clock)
            .await?;
        // Every row is in a new file: forget the old ones.
        self.file_partitions = None;
        self.gone_files = 0;
        self.state.shrink_files();
        Ok(report)
    }

    /// This flow's engine opened afresh from the catalog.
    async fn reopen(&self) -> Result<Engine> {
        let mut fresh = Engine::open_for_log(
            self.flow.clone(),
            self.catalog.clone(),
            self.faults.clone(),
            self.log.clone(),
        )
        .await?;
        fresh.lease = self.lease.clone();
        Ok(fresh)
    }

    /// Commits from now on under `instance`'s lease at `epoch` (a shared
    /// log): recorded in each snapshot's summary, and refused once the
    /// target has a snapshot of a newer epoch.
    pub fn set_lease(&mut self, instance: &str, epoch: u64) {
        self.lease = Some((instance.to_string(), epoch));
    }

    /// `AUTOCDC_LEASE_LOST` when the target has a snapshot of a newer lease
    /// epoch than this engine's: another instance took the flow over.
    fn fenced(&self) -> Result<()> {
        if let Some((_, ours)) = &self.lease
            && let Some((theirs, who)) = Engine::lease_of(&self.target.metadata)
            && theirs > *ours
        {
            return Err(Error::State {
                code: codes::LEASE_LOST,
                message: format!(
                    "flow `{}`: instance `{who}` committed under lease epoch {theirs}; this instance's epoch {ours} is over, so it does not commit",
                    self.flow.name
                ),
            });
        }
        Ok(())
    }

    /// The lease epoch of the target's latest snapshot that records one
    /// (maintenance snapshots do not), and who held it.
    pub fn lease_of(metadata: &TableMetadata) -> Option<(u64, String)> {
        current_chain(metadata).find_map(|s| {
            let props = &s.summary().additional_properties;
            let e = props.get(PROP_LEASE_EPOCH)?.parse().ok()?;
            Some((e, props.get(PROP_COMMITTER).cloned().unwrap_or_default()))
        })
    }

    /// How many snapshots of the target and the state table would expire
    /// at `now_ms` (in memory; the service's "thresholds crossed" check).
    pub fn expirable_snapshots(&self, now_ms: i64) -> usize {
        let policy = self.flow.maintenance;
        let count = |t: &TableState, protect: Option<i64>| {
            let meta = &t.metadata;
            if meta.snapshots().len() <= 1 {
                return 0;
            }
            maintain::expirable(
                meta,
                now_ms,
                Retention::of(meta, &policy),
                &protect.into_iter().collect(),
            )
            .len()
        };
        count(
            &self.target,
            our_latest_id(&self.target.metadata, &self.flow.name),
        ) + count(&self.state_tbl, self.state_snapshot)
    }

    /// Of `summary().bytes`, the encoded values a history flow keeps
    /// (`bench`'s split; it walks every event, so the service's per-commit
    /// summary leaves it out).
    pub fn state_value_bytes(&self) -> usize {
        self.state.value_bytes()
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

    /// Resolves, writes and commits one micro-batch (columns in the flow's
    /// source order). A rejected batch changes nothing. After any other
    /// error the engine must be reopened (its memory may be ahead of the catalog).
    pub async fn apply(&mut self, batch: &RecordBatch, now_ms: i64) -> Result<CommitReport> {
        let offset = self.input_offset + 1;
        self.apply_at(batch, now_ms, offset).await
    }

    /// Like `apply`, recording `input_offset` (the ingest log offset of the
    /// last change in `batch`) as the committed offset.
    ///
    /// A commit that loses a race with another writer, or whose outcome is
    /// unknown (timeout, 5xx, lost connection), is resolved by reloading the
    /// target: if our snapshot is there (or the target already records this
    /// input offset) the batch is done; otherwise it is resolved again
    /// against the reloaded state and committed on the new base. Never twice.
    pub async fn apply_at(
        &mut self,
        batch: &RecordBatch,
        now_ms: i64,
        input_offset: i64,
    ) -> Result<CommitReport> {
        self.apply_input(Input::Changes(batch), now_ms, input_offset)
            .await
    }

    /// `from_snapshot` flows: applies the difference between `rows` (a whole
    /// snapshot of the source) and the target as changes at `version`. A
    /// version not above the last one applied is skipped (and reported).
    pub async fn apply_snapshot_at(
        &mut self,
        rows: &RecordBatch,
        version: i64,
        now_ms: i64,
        input_offset: i64,
    ) -> Result<CommitReport> {
        if !self.flow.from_snapshot {
            return Err(Error::Input {
                code: codes::NOT_A_SNAPSHOT_FLOW,
                flow: self.flow.name.clone(),
                message: "this flow takes changes, not snapshots; declare it with from_snapshot = true to send snapshots".into(),
            });
        }
        self.apply_input(Input::Snapshot { rows, version }, now_ms, input_offset)
            .await
    }

    /// The version of the last snapshot applied (`from_snapshot` flows).
    pub fn snapshot_version(&self) -> Option<i64> {
        self.snapshot_version
    }

    async fn apply_input(
        &mut self,
        input: Input<'_>,
        now_ms: i64,
        input_offset: i64,
    ) -> Result<CommitReport> {
        if let (Input::Changes(_), true) = (input, self.flow.from_snapshot) {
            return Err(Error::Input {
                code: codes::NOT_A_SNAPSHOT_FLOW,
                flow: self.flow.name.clone(),
                message: "this flow is from_snapshot: send whole snapshots with a version (POST /v1/flows/{flow}/snapshots?version=V, or autocdc apply --snapshot-version V)".into(),
            });
        }
        if self.flow.keeps_history() && self.folded_with != Folding::of(&self.flow) {
            self.refold(now_ms).await?;
        }
        let mut attempted: Vec<i64> = Vec::new();
        let mut delay = std::time::Duration::from_millis(50);
        loop {
            let (error, snapshot_id) = match self.try_apply_at(input, now_ms, input_offset).await {
                Ok(mut report) => {
                    report.commit_retries = attempted.len() as u32;
                    return Ok(report);
                }
                Err(Failure::Other(e)) => return Err(e),
                Err(Failure::AtCommit { error, snapshot_id }) => (error, snapshot_id),
            };
            attempted.push(snapshot_id);
            let retryable = matches!(error, Error::CommitConflict(_) | Error::Unavailable(_));
            let fresh = self.reopen().await?;
            let landed = attempted
                .iter()
                .find(|id| fresh.target.metadata.snapshot_by_id(**id).is_some())
                .copied();
            let already = fresh.input_offset >= input_offset && input_offset > self.input_offset;
            *self = fresh;
            let done = landed.or(if already {
                self.target.metadata.current_snapshot_id()
            } else {
                None
            });
            if let Some(id) = done {
                return Ok(CommitReport {
                    snapshot_id: Some(id),
                    input_offset: self.input_offset,
                    commit_retries: attempted.len() as u32,
                    ..Default::default()
                });
            }
            // Deposed meanwhile: the new holder replays what this batch had.
            self.fenced()?;
            if !retryable || attempted.len() as u32 >= MAX_COMMIT_ATTEMPTS {
                return Err(error);
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(std::time::Duration::from_secs(5));
        }
    }

    /// One attempt at a batch, in the phases of the commit protocol:
    /// plan → write target files → persist state → commit target → publish.
    /// Maintenance work (compaction, expiry) goes in as phases of its own.
    async fn try_apply_at(
        &mut self,
        input: Input<'_>,
        now_ms: i64,
        input_offset: i64,
    ) -> std::result::Result<CommitReport, Failure> {
        self.usable()?;
        self.fenced()?;
        let clock = std::time::Instant::now();
        if let Some(report) = self.skip_old_snapshot(input) {
            return Ok(report);
        }
        let mut planned = self.plan(input, now_ms)?;
        let rewritten = planned.rewritten.take();
        let batch = rewritten.as_ref().unwrap_or(input.rows_batch());
        let offsets = match &self.log {
            Some(log) => offsets::record(&self.offsets, log, input_offset, now_ms),
            None => self.offsets.clone(),
        };
        self.commit_planned(
            planned,
            batch,
            now_ms,
            input_offset,
            offsets,
            Mode::Delta,
            clock,
        )
        .await
    }

    /// Phases 2 to 5 of a planned commit: write target files, persist
    /// state, commit the target (`mode`), publish. `batch`: the rows the
    /// plan refers to.
    #[allow(clippy::too_many_arguments)] // the commit's inputs, each used once
    async fn commit_planned(
        &mut self,
        planned: Planned,
        batch: &RecordBatch,
        now_ms: i64,
        input_offset: i64,
        offsets: Offsets,
        mode: Mode,
        mut clock: std::time::Instant,
    ) -> std::result::Result<CommitReport, Failure> {
        let mut report = CommitReport {
            stats: planned.plan.stats(),
            input_offset: self.input_offset,
            snapshot_version: planned.snapshot_version,
            ..Default::default()
        };
        report.timings.resolve_ms = ms_since(&mut clock);
        // A raised truncate floor or a new snapshot version is committed
        // even when no row changes (no files are written then).
        if planned.plan.is_empty()
            && !planned.floor_raised
            && planned.snapshot_version.is_none()
            && !matches!(mode, Mode::Rebuild)
        {
            return Ok(report);
        }
        self.poisoned = true;
        let files = self.write_target_files(batch, &planned.plan).await?;
        report.timings.target_files_ms = ms_since(&mut clock);
        // The data files are encoded on another core meanwhile.
        let state_file = self
            .write_state(planned.plan, &files.locs, now_ms, &mut report, &mut clock)
            .await?;
        let started = std::time::Instant::now();
        let data = files.data.finish().await?;
        report.timings.target_files_ms += started.elapsed().as_secs_f64() * 1e3;
        self.faults.hit(FaultPoint::AfterTargetFiles)?;
        report.data_files = data.len();
        report.delete_files = files.deletes.len();
        report.rows_written = files.rows;
        report.bytes_written = data
            .iter()
            .chain(files.deletes.iter().map(|(_, f)| f))
            .map(|f| f.file_size_in_bytes())
            .sum();
        clock = std::time::Instant::now();
        let state = self.commit_state_file(state_file, now_ms).await?;
        let (target, snapshot_id) = self
            .commit_target(
                data,
                files.deletes,
                &state,
                &offsets,
                planned.floor.as_ref().and_then(|f| f.as_deref()),
                planned.snapshot_version,
                input_offset,
                now_ms,
                mode,
            )
            .await?;
        report.timings.commits_ms = ms_since(&mut clock);
        report.snapshot_id = Some(snapshot_id);
        report.input_offset = input_offset;
        report.state_compacted = state.compacted;
        self.publish(
            target,
            state,
            offsets,
            files.partitions,
            planned.floor,
            planned.snapshot_version,
            input_offset,
        );
        Ok(report)
    }

    /// A snapshot whose version is not above the last one applied is
    /// skipped; its report says so.
    fn skip_old_snapshot(&self, input: Input<'_>) -> Option<CommitReport> {
        let (Input::Snapshot { rows, version }, Some(have)) = (input, self.snapshot_version) else {
            return None;
        };
        (version <= have).then(|| CommitReport {
            stats: BatchStats {
                rows_in: rows.num_rows() as u64,
                stale: rows.num_rows() as u64,
                ..Default::default()
            },
            input_offset: self.input_offset,
            snapshot_version: Some(version),
            skipped_for_version: Some(have),
            ..Default::default()
        })
    }

    /// Phase 1, plan: a snapshot becomes its changes, truncates rewrite the
    /// batch, and the flow's resolver turns it into a `Plan`. Nothing changes.
    fn plan(&self, input: Input<'_>, now_ms: i64) -> Result<Planned> {
        let batch = input.rows_batch();
        let snapshot_version = match input {
            Input::Snapshot { version, .. } => Some(version),
            Input::Changes(_) => None,
        };
        let diffed = match snapshot_version {
            Some(version) => Some(from_snapshot::diff(
                &self.flow,
                &self.codec,
                batch,
                version,
                self.state.live_keys().into_iter().map(|(k, _, fp)| (k, fp)),
            )?),
            None => None,
        };
        let truncated = match &self.flow.truncates {
            Some(_) => {
                resolve::validate(&self.flow, batch)?;
                Some(truncate::rewrite(
                    &self.flow,
                    &self.codec,
                    batch,
                    self.floor.as_deref(),
                    self.state
                        .live_keys()
                        .into_iter()
                        .map(|(k, seq, _)| (k, seq)),
                )?)
            }
            None => None,
        };
        let (resolved, forced, origin) = match (&truncated, &diffed) {
            (Some(t), _) => (&t.batch, Some(&t.forced_deletes), Some(&t.origin)),
            (_, Some(d)) => (&d.batch, Some(&d.forced_deletes), Some(&d.origin)),
            _ => (batch, None, None),
        };
        let mut plan = self
            .state
            .plan(
                &self.flow,
                &self.codec,
                resolved,
                self.state_complete,
                now_ms,
                forced,
            )
            // Errors name the row of the input, not of the rewritten batch.
            .map_err(|e| match (e, origin) {
                (
                    Error::Batch {
                        code,
                        flow,
                        row,
                        column,
                        message,
                    },
                    Some(origin),
                ) => Error::Batch {
                    code,
                    flow,
                    row: origin.get(row).copied().flatten().unwrap_or(0) as usize,
                    column,
                    message,
                },
                (e, _) => e,
            })?;
        if let Some(d) = &diffed {
            let stats = plan.stats_mut();
            stats.rows_in = input.rows() as u64;
            stats.unchanged = d.unchanged;
        }
        if let Some(t) = &truncated {
            let stats = plan.stats_mut();
            stats.rows_in = input.rows() as u64;
            stats.stale += t.below_floor;
            stats.truncates = t.truncates;
            stats.deletes -= t.removed;
            stats.truncated = t.removed;
        }
        let floor_raised = truncated.as_ref().is_some_and(|t| t.raised);
        let (rewritten, floor) = match (truncated, diffed) {
            (Some(t), _) => (Some(t.batch), Some(t.floor)),
            (None, Some(d)) => (Some(d.batch), None),
            (None, None) => (None, None),
        };
        Ok(Planned {
            plan,
            rewritten,
            floor,
            floor_raised,
            snapshot_version,
        })
    }

    /// Phase 2, target files: the new rows are laid out in data files
    /// (every row's file and position is known from here on) whose encoding
    /// starts on other workers; then the delete files of the rows they
    /// replace are written here.
    async fn write_target_files(
        &mut self,
        batch: &RecordBatch,
        plan: &Plan,
    ) -> Result<TargetFiles> {
        let file_io = self.catalog.file_io().clone();
        let meta = self.target.metadata.clone();
        let schema = meta.current_schema().clone();
        let spec_id = meta.default_partition_spec_id();
        let mut namer = FileNamer::new(meta.location());
        let target_arrow = Arc::new(schema_to_arrow_schema(&schema)?);
        let rows = self
            .state
            .target_rows(&self.flow, &self.codec, &target_arrow, batch, plan)?;
        let layout = write::layout(
            &mut namer,
            self.partitioner.as_deref(),
            &rows.inserts,
            self.flow.target_file_size_bytes,
        )?;
        let ids: Vec<u32> = layout
            .files
            .iter()
            .map(|f| self.state.files_mut().intern(&f.path))
            .collect();
        let locs: Vec<Loc> = layout
            .locs
            .iter()
            .map(|&(f, pos)| Loc {
                file: ids[f as usize],
                pos,
            })
            .collect();
        debug_assert_eq!(
            locs.len(),
            rows.inserts.num_rows(),
            "every inserted row has a position"
        );
        let partitions = layout
            .files
            .iter()
            .map(|f| (f.path.clone(), (spec_id, f.partition().clone())))
            .collect();
        let data = {
            let file_io = file_io.clone();
            DataWrite(tokio::spawn(async move {
                write::write_layout(
                    &file_io,
                    schema,
                    spec_id,
                    layout.files,
                    write::FileUse::Table,
                )
                .await
            }))
        };
        let deletes = self
            .delete_files(
                &file_io,
                &mut namer,
                &rows.remove_positions,
                &rows.remove_rows,
            )
            .await?;
        Ok(TargetFiles {
            data,
            deletes,
            locs,
            rows: rows.inserts.num_rows() as u64,
            partitions,
        })
    }

    /// Phase 3, state: apply the plan to the in-memory state and write its
    /// delta (or, when the log has grown too long, all of it) as the state
    /// table's file; `commit_state_file` commits it once the target's data
    /// files are written. The target commit names that snapshot.
    async fn write_state(
        &mut self,
        plan: Plan,
        locs: &[Loc],
        now_ms: i64,
        report: &mut CommitReport,
        clock: &mut std::time::Instant,
    ) -> Result<StateFile> {
        let cutoff = now_ms.saturating_sub(self.flow.tombstone_gc.as_millis() as i64);
        let generation = self.generation + 1;
        report.tombstones_collected = self.state.apply(&self.flow, plan, locs, now_ms, cutoff);
        let compacted = self.state.needs_compaction(self.state_log_rows);
        let delta = self
            .state
            .delta(&self.flow, &self.codec, generation, compacted)?;
        report.timings.state_apply_ms = ms_since(clock);
        let file = self.state_file(delta, generation, compacted).await?;
        report.timings.state_file_ms = ms_since(clock);
        Ok(file)
    }

    /// Writes the state table's rows for a commit (the changed entries, or
    /// all of them when `whole`) and commits them.
    async fn commit_state(
        &mut self,
        delta: Vec<RecordBatch>,
        generation: i64,
        whole: bool,
        now_ms: i64,
        file_ms: &mut f64,
    ) -> std::result::Result<StateCommit, Failure> {
        let started = std::time::Instant::now();
        let file = self.state_file(delta, generation, whole).await?;
        *file_ms = started.elapsed().as_secs_f64() * 1e3;
        self.commit_state_file(file, now_ms).await
    }

    /// Writes the state table's file for a commit.
    async fn state_file(
        &mut self,
        delta: Vec<RecordBatch>,
        generation: i64,
        whole: bool,
    ) -> Result<StateFile> {
        let smeta = self.state_tbl.metadata.clone();
        let schema = Arc::new(schema_to_arrow_schema(smeta.current_schema())?);
        let parts = delta
            .iter()
            .map(|part| state_table::conform(part, schema.clone()))
            .collect::<Result<Vec<_>>>()?;
        let rows = parts.iter().map(|p| p.num_rows() as u64).sum();
        let mut snamer = FileNamer::new(smeta.location());
        let files = write::state_files(
            self.catalog.file_io(),
            &mut snamer,
            smeta.current_schema().clone(),
            smeta.default_partition_spec_id(),
            parts,
        )
        .await?;
        Ok(StateFile {
            files,
            rows,
            generation,
            whole,
        })
    }

    /// Commits the state table's file of a commit.
    async fn commit_state_file(
        &mut self,
        state: StateFile,
        now_ms: i64,
    ) -> std::result::Result<StateCommit, Failure> {
        self.faults.hit(FaultPoint::AfterStateFile)?;
        let StateFile {
            files,
            rows: delta_rows,
            generation,
            whole: compacted,
        } = state;
        let produced = row_delta::produce(
            self.catalog.file_io(),
            &self.state_tbl,
            RowDelta {
                data: files,
                deletes: Vec::new(),
                base_snapshot: self.state_snapshot,
                replace: compacted,
                properties: HashMap::from([
                    (PROP_FLOW.to_string(), self.flow.name.clone()),
                    (PROP_GENERATION.to_string(), generation.to_string()),
                ]),
                now_ms,
                rewrite: None,
            },
        )
        .await?;
        if produced.merged > 0 {
            self.faults.hit(FaultPoint::AfterManifestMerge)?;
        }
        let snapshot_id = produced.snapshot_id;
        // Another writer of this flow (a second instance) may have committed
        // the state table first: reload and rebuild, as for the target.
        let table = self
            .catalog
            .commit(&self.state_tbl, produced.updates, produced.requirements)
            .await
            .map_err(|error| match error {
                Error::CommitConflict(_) | Error::Unavailable(_) => {
                    Failure::AtCommit { error, snapshot_id }
                }
                error => Failure::Other(error),
            })?;
        self.faults.hit(FaultPoint::AfterStateCommit)?;
        Ok(StateCommit {
            table,
            snapshot_id,
            generation,
            compacted,
            log_rows: if compacted {
                delta_rows
            } else {
                self.state_log_rows + delta_rows
            },
        })
    }

    /// Phase 4, commit target: one row-delta snapshot naming the state
    /// snapshot it goes with and the offset of each ingest log.
    #[allow(clippy::too_many_arguments)]
    async fn commit_target(
        &self,
        data: Vec<DataFile>,
        deletes: Vec<(i32, DataFile)>,
        state: &StateCommit,
        offsets: &Offsets,
        floor: Option<&[u8]>,
        snapshot_version: Option<i64>,
        input_offset: i64,
        now_ms: i64,
        mode: Mode,
    ) -> std::result::Result<(TableState, i64), Failure> {
        let mut properties = HashMap::from([
            (PROP_FLOW.to_string(), self.flow.name.clone()),
            (
                PROP_STATE_SNAPSHOT.to_string(),
                state.snapshot_id.to_string(),
            ),
            (PROP_INPUT_OFFSET.to_string(), input_offset.to_string()),
            (PROP_GENERATION.to_string(), state.generation.to_string()),
            (
                PROP_STATE_COMPLETE.to_string(),
                self.state_complete.to_string(),
            ),
        ]);
        if !offsets.is_empty() {
            properties.insert(PROP_INPUT_OFFSETS.to_string(), offsets::to_json(offsets)?);
        }
        if let Some((me, epoch)) = &self.lease {
            properties.insert(PROP_COMMITTER.to_string(), me.clone());
            properties.insert(PROP_LEASE_EPOCH.to_string(), epoch.to_string());
        }
        if let Some(f) = floor {
            properties.insert(
                PROP_TRUNCATED_BELOW.to_string(),
                floor_to_json(&self.flow, &self.codec, f)?,
            );
        }
        if let Some(v) = snapshot_version.or(self.snapshot_version) {
            properties.insert(PROP_SNAPSHOT_VERSION.to_string(), v.to_string());
        }
        let names = |cols: &[usize]| -> Vec<&str> {
            cols.iter().map(|&c| self.flow.column_name(c)).collect()
        };
        if self.flow.scd2 {
            let tracked = names(&self.folded_with.tracked);
            properties.insert(
                PROP_TRACK_HISTORY.to_string(),
                serde_json::to_string(&tracked)?,
            );
        }
        if self.flow.keeps_history() {
            let ignored = names(&self.folded_with.ignored);
            properties.insert(
                PROP_IGNORE_NULLS.to_string(),
                serde_json::to_string(&ignored)?,
            );
        }
        let (replace, rewrite) = match mode {
            Mode::Delta => (false, None),
            Mode::Compaction(r) => (false, Some(r)),
            Mode::Rebuild => (true, None),
        };
        let produced = row_delta::produce(
            self.catalog.file_io(),
            &self.target,
            RowDelta {
                data,
                deletes,
                base_snapshot: self.target.metadata.current_snapshot_id(),
                replace,
                properties,
                now_ms,
                rewrite,
            },
        )
        .await?;
        if produced.merged > 0 {
            self.faults.hit(FaultPoint::AfterManifestMerge)?;
        }
        let snapshot_id = produced.snapshot_id;
        let target = self
            .catalog
            .commit(&self.target, produced.updates, produced.requirements)
            .await
            .map_err(|error| match error {
                Error::InjectedFault(_) => Failure::Other(error),
                error => Failure::AtCommit { error, snapshot_id },
            })?;
        self.faults.hit(FaultPoint::AfterTargetCommit)?;
        Ok((target, snapshot_id))
    }

    /// Phase 5, publish: both commits landed; the engine takes on the new
    /// tables, generation, offsets, floor and version.
    #[allow(clippy::too_many_arguments)]
    fn publish(
        &mut self,
        target: TableState,
        state: StateCommit,
        offsets: Offsets,
        partitions: Vec<(String, (i32, Struct))>,
        floor: Option<Option<Box<[u8]>>>,
        snapshot_version: Option<i64>,
        input_offset: i64,
    ) {
        self.offsets = offsets;
        self.state_log_rows = state.log_rows;
        self.state.clear_dirty();
        self.state_tbl = state.table;
        self.target = target;
        self.state_snapshot = Some(state.snapshot_id);
        self.generation = state.generation;
        self.input_offset = input_offset;
        if let Some(floor) = floor {
            self.floor = floor;
        }
        if snapshot_version.is_some() {
            self.snapshot_version = snapshot_version;
        }
        self.poisoned = false;
        if let Some(map) = &mut self.file_partitions {
            map.extend(partitions);
        }
    }

    /// Delete files for the rows a resolution removes: position deletes for
    /// rows whose file and position the state knows, equality deletes on
    /// the keys for the others. Each delete file has the partition spec and
    /// partition of the data files it applies to: after `partition_by`
    /// changed, a row in a file of an older spec is deleted in that spec.
    async fn delete_files(
        &mut self,
        file_io: &FileIO,
        namer: &mut FileNamer,
        remove_positions: &[Loc],
        remove_rows: &RecordBatch,
    ) -> Result<Vec<(i32, DataFile)>> {
        let meta = self.target.metadata.clone();
        let spec_id = meta.default_partition_spec_id();
        // Files of more than one spec may be live: the files decide.
        let respecced = meta.partition_specs_iter().len() > 1;
        let partitioned = self.partitioner.is_some() || respecced;
        if partitioned
            && (!remove_positions.is_empty()
                || (remove_rows.num_rows() > 0 && (respecced || !self.partitioned_by_keys)))
        {
            self.load_file_partitions().await?;
        }
        let schema = meta.current_schema();
        let eq_names = if remove_rows.num_rows() == 0 {
            Vec::new()
        } else {
            self.equality_columns(schema)?
        };
        let key_names: Vec<&str> = eq_names.iter().map(String::as_str).collect();
        let key_cols: Vec<ArrayRef> = key_names
            .iter()
            .map(|n| {
                remove_rows
                    .column_by_name(n)
                    .cloned()
                    .expect("removed rows are in the target schema")
            })
            .collect();
        let all_rows: Vec<u32> = (0..remove_rows.num_rows() as u32).collect();
        let mut out = Vec::new();
        if !partitioned {
            let pos: Vec<(&str, u32)> = remove_positions
                .iter()
                .map(|l| (self.state.files().path(l.file), l.pos))
                .collect();
            let none = Struct::empty();
            let pos = write::position_delete_file(file_io, namer, spec_id, &none, "", pos).await?;
            let eq = write::equality_delete_file(
                file_io, namer, schema, spec_id, &none, "", &key_names, &key_cols, &all_rows,
            )
            .await?;
            return Ok(pos.into_iter().chain(eq).map(|f| (spec_id, f)).collect());
        }
        let empty = HashMap::new();
        let parts = self.file_partitions.as_ref().unwrap_or(&empty);
        // Where a delete file of (spec, partition) goes: the partition's
        // directory in the default spec, else beside a data file it applies to.
        let dir = |spec: i32, part: &Struct, beside: &str| match &self.partitioner {
            Some(p) if spec == spec_id => p.path(part),
            _ => write::partition_dir(meta.location(), beside),
        };

        // Position deletes, grouped by the (spec, partition) of the file they point into.
        // (directory, (data file, position) per deleted row)
        type Deleted<'a> = (String, Vec<(&'a str, u32)>);
        let mut by_part: HashMap<(i32, &Struct), Deleted> = HashMap::new();
        for l in remove_positions {
            let path = self.state.files().path(l.file);
            let Some((spec, part)) = parts.get(path) else {
                return Err(Error::State {
                    code: codes::UNKNOWN_FILE,
                    message: format!(
                        "flow `{}`: the state places a row in {path}, which is not a live data file of {}; the table was rewritten by another writer. Run `autocdc refresh --full {}`",
                        self.flow.name, self.flow.target, self.flow.name
                    ),
                });
            };
            by_part
                .entry((*spec, part))
                .or_insert_with(|| (dir(*spec, part, path), Vec::new()))
                .1
                .push((path, l.pos));
        }
        for ((spec, part), (dir, pos)) in by_part {
            if let Some(f) =
                write::position_delete_file(file_io, namer, spec, part, &dir, pos).await?
            {
                out.push((spec, f));
            }
        }

        // Equality deletes: in the default spec, in the key's own partition
        // when keys alone decide it; everywhere else, in every partition
        // that has data files.
        if remove_rows.num_rows() == 0 {
            return Ok(out);
        }
        let mut groups: Vec<(i32, Struct, String, Vec<u32>)> = Vec::new();
        let with_files: std::collections::HashSet<(i32, &Struct)> =
            parts.values().map(|(spec, part)| (*spec, part)).collect();
        let by_keys = match &self.partitioner {
            Some(p) if self.partitioned_by_keys => {
                for (part, rows) in p.group(remove_rows)? {
                    // With the files loaded, only partitions that have some.
                    if self.file_partitions.is_none() || with_files.contains(&(spec_id, &part)) {
                        let dir = p.path(&part);
                        groups.push((spec_id, part, dir, rows));
                    }
                }
                true
            }
            _ => false,
        };
        let mut seen = std::collections::HashSet::new();
        for (path, (spec, part)) in parts {
            if !(by_keys && *spec == spec_id) && seen.insert((*spec, part)) {
                groups.push((
                    *spec,
                    part.clone(),
                    dir(*spec, part, path),
                    all_rows.clone(),
                ));
            }
        }
        for (spec, part, dir, rows) in groups {
            if let Some(f) = write::equality_delete_file(
                file_io, namer, schema, spec, &part, &dir, &key_names, &key_cols, &rows,
            )
            .await?
            {
                out.push((spec, f));
            }
        }
        Ok(out)
    }

    /// The columns an equality delete matches on: the keys, and for SCD Type 2
    /// `__START_AT` (one version of a key).
    fn equality_columns(&self, schema: &Schema) -> Result<Vec<String>> {
        let mut names: Vec<String> = self
            .flow
            .key_idx
            .iter()
            .map(|&i| self.flow.column_name(i).to_string())
            .collect();
        if self.flow.scd2 {
            match schema.field_by_name(START_AT) {
                Some(f) if f.field_type.is_primitive() => names.push(START_AT.to_string()),
                _ => {
                    return Err(Error::State {
                        code: codes::UNSUPPORTED,
                        message: format!(
                            "flow `{}`: a version whose data file another writer rewrote must be removed by equality delete on the keys and {START_AT}, which needs a single sequence_by column; run `autocdc refresh --full {}`",
                            self.flow.name, self.flow.name
                        ),
                    });
                }
            }
        }
        Ok(names)
    }

    /// Reads (spec id, partition) of every live data file from the target's manifests.
    async fn load_file_partitions(&mut self) -> Result<()> {
        if self.file_partitions.is_some() {
            return Ok(());
        }
        let mut map = HashMap::new();
        if let Some(snap) = self.target.metadata.current_snapshot() {
            let file_io = self.catalog.file_io();
            let t = self.target.table(file_io)?;
            let list = t.manifest_list_reader(snap).load().await?;
            for m in list.entries() {
                if m.content != ManifestContentType::Data {
                    continue;
                }
                let manifest = m.load_manifest(file_io).await?;
                for e in manifest.entries() {
                    if e.is_alive() {
                        let f = e.data_file();
                        map.insert(
                            f.file_path().to_string(),
                            (m.partition_spec_id, f.partition().clone()),
                        );
                    }
                }
            }
        }
        self.file_partitions = Some(map);
        Ok(())
    }

    /// All rows of the target's current snapshot, through a real Iceberg scan.
    pub async fn scan_target(&self) -> Result<Vec<RecordBatch>> {
        read::scan(self.catalog.as_ref(), &self.target).await
    }
}
