//! The state one flow keeps, behind one type: a key index (SCD Type 1, one
//! entry per key) or per-key events (SCD Type 2 and `ignore_null_updates`).
//! Each operation the engine needs (plan a batch, apply a plan, turn the
//! changed entries into the state table's delta, load it back) is a method
//! here, so the engine never asks which kind it holds.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{BooleanArray, RecordBatch, UInt32Array};
use arrow_schema::SchemaRef;
use arrow_select::take::take;

use crate::core::flow::Flow;
use crate::core::history::{self, Cut, Folding, HistCodec, History};
use crate::core::resolve::{self, BatchStats, Codec, Join, Resolution};
use crate::core::state::{EntryRef, FileTable, KeyIndex, Loc, Value, hash_key};
use crate::error::{Error, Result, codes};
use crate::table::state_table;

/// The state log is rewritten whole once it holds this many times more rows
/// than it has entries (and at least `COMPACTION_MIN_ROWS`).
const COMPACTION_RATIO: u64 = 3;
const COMPACTION_MIN_ROWS: u64 = 100_000;

// One per flow: the codec's size beside `KeyIndex` does not matter.
#[allow(clippy::large_enum_variant)]
pub enum FlowState {
    /// SCD Type 1: per key the latest change's sequence, fingerprint and
    /// live row (or tombstone).
    Keys(KeyIndex),
    /// History flows: per key its applied changes in sequence order, with
    /// the value encoders.
    History { codec: HistCodec, events: History },
}

/// One batch resolved by the flow's resolver.
pub enum Plan {
    Keys(Resolution),
    History(history::Plan),
}

/// The target rows a plan writes and removes.
pub struct TargetRows {
    /// New rows, in the target's Arrow schema.
    pub inserts: RecordBatch,
    /// Rows removed by position.
    pub remove_positions: Vec<Loc>,
    /// Rows removed by equality delete (keys, and `__START_AT` for SCD2).
    pub remove_rows: RecordBatch,
}

/// Sizes for `autocdc state` and the service status.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    pub keys: usize,
    pub live: usize,
    /// Events held: one per key for SCD Type 1, every kept event for history flows.
    pub events: usize,
    pub bytes: usize,
}

impl Plan {
    pub fn stats(&self) -> BatchStats {
        match self {
            Plan::Keys(r) => r.stats,
            Plan::History(p) => p.stats,
        }
    }

    pub fn stats_mut(&mut self) -> &mut BatchStats {
        match self {
            Plan::Keys(r) => &mut r.stats,
            Plan::History(p) => &mut p.stats,
        }
    }

    pub fn is_empty(&self) -> bool {
        match self {
            Plan::Keys(r) => r.changes.is_empty(),
            Plan::History(p) => p.changes.is_empty(),
        }
    }
}

impl FlowState {
    /// The empty state of the kind `flow` keeps.
    pub fn new(flow: &Flow) -> Result<FlowState> {
        Ok(if flow.keeps_history() {
            FlowState::History {
                codec: HistCodec::new(flow)?,
                events: History::new(),
            }
        } else {
            FlowState::Keys(KeyIndex::new())
        })
    }

    /// Loads the state table's rows (a snapshot's scan); returns how many
    /// rows the state log holds.
    pub fn load(&mut self, flow: &Flow, codec: &Codec, batches: &[RecordBatch]) -> Result<u64> {
        Ok(match self {
            FlowState::Keys(index) => state_table::load(flow, codec, index, batches)?,
            FlowState::History { codec: hc, events } => {
                state_table::load_history(flow, codec, hc, events, batches)?
            }
        } as u64)
    }

    /// (key, sequence, fingerprint) of the latest change of every live key.
    pub fn live_keys(&self) -> Vec<(&[u8], &[u8], u64)> {
        match self {
            FlowState::History { events, .. } => events
                .iter()
                .filter_map(|(k, e)| {
                    e.last()
                        .filter(|e| !e.is_delete())
                        .map(|e| (k, e.seq(), e.fp()))
                })
                .collect(),
            FlowState::Keys(index) => index
                .iter()
                .filter(|e| matches!(e.value, Value::Live(_)))
                .map(|e| (e.key, e.seq, e.fingerprint))
                .collect(),
        }
    }

    /// The interned data files the state's row locations point into.
    pub fn files(&self) -> &FileTable {
        match self {
            FlowState::Keys(index) => &index.files,
            FlowState::History { events, .. } => &events.files,
        }
    }

    pub fn files_mut(&mut self) -> &mut FileTable {
        match self {
            FlowState::Keys(index) => &mut index.files,
            FlowState::History { events, .. } => &mut events.files,
        }
    }

    /// Moves the state's row locations (a compaction rewrote their files);
    /// returns how many rows moved. The moved entries are dirty.
    pub fn relocate(&mut self, to: impl FnMut(Loc) -> Option<Loc>) -> usize {
        match self {
            FlowState::Keys(index) => index.relocate(to),
            FlowState::History { events, .. } => events.relocate(to),
        }
    }

    /// Forgets data files no row location points into; returns how many.
    pub fn shrink_files(&mut self) -> usize {
        match self {
            FlowState::Keys(index) => index.shrink_files(),
            FlowState::History { events, .. } => events.shrink_files(),
        }
    }

    pub fn sizes(&self) -> Sizes {
        match self {
            FlowState::Keys(index) => Sizes {
                keys: index.len(),
                live: index.live(),
                events: index.len(),
                bytes: index.heap_bytes(),
            },
            FlowState::History { events, .. } => Sizes {
                keys: events.len(),
                live: events.live(),
                events: events.events(),
                bytes: events.heap_bytes(),
            },
        }
    }

    /// Of `sizes().bytes`, the encoded values history events keep (0 for
    /// SCD Type 1, which keeps none). A walk over every event: for reports,
    /// not for every commit.
    pub fn value_bytes(&self) -> usize {
        match self {
            FlowState::Keys(_) => 0,
            FlowState::History { events, .. } => events.value_bytes(),
        }
    }

    /// Resolves `batch` against the state (nothing changes yet).
    pub fn plan(
        &self,
        flow: &Flow,
        codec: &Codec,
        batch: &RecordBatch,
        state_complete: bool,
        now_ms: i64,
        forced_deletes: Option<&BooleanArray>,
    ) -> Result<Plan> {
        Ok(match self {
            FlowState::Keys(index) => Plan::Keys(resolve::resolve_as(
                flow,
                codec,
                batch,
                index,
                state_complete,
                forced_deletes,
                resolve::Split {
                    join: &Threads,
                    halves: two_threads(batch, SPLIT_ROWS),
                },
            )?),
            FlowState::History { codec: hc, events } => Plan::History(resolve_history(
                flow,
                codec,
                hc,
                batch,
                events,
                state_complete,
                now_ms,
                forced_deletes,
            )?),
        })
    }

    /// A history flow whose target rows were folded as `was` says: the plan
    /// that re-folds every key as the flow folds.
    pub fn refold(&self, flow: &Flow, was: &Folding, state_complete: bool) -> Result<Plan> {
        match self {
            FlowState::History { codec: hc, events } => {
                let mut before = HistCodec::folding(flow, was)?;
                before.set_cuts(hc.cuts().to_vec());
                Ok(Plan::History(history::refold(
                    &before,
                    hc,
                    events,
                    state_complete,
                )))
            }
            FlowState::Keys(_) => Err(no_history(flow, "re-folded")),
        }
    }

    /// The cuts of completed snapshots the history folds with (SCD Type 2
    /// Debezium flows; none otherwise).
    pub fn cuts(&self) -> &[Cut] {
        match self {
            FlowState::History { codec, .. } => codec.cuts(),
            FlowState::Keys(_) => &[],
        }
    }

    /// Folds with `cuts` from now on (as the target's rows were folded).
    pub fn set_cuts(&mut self, cuts: Vec<Cut>) {
        if let FlowState::History { codec, .. } = self {
            codec.set_cuts(cuts);
        }
    }

    /// New cuts of completed snapshots: the history folds with them from
    /// now on, and the plan folds every key again (the open versions of
    /// keys a snapshot did not read close at its cut).
    pub fn add_cuts(&mut self, flow: &Flow, new: Vec<Cut>, state_complete: bool) -> Result<Plan> {
        match self {
            FlowState::History { codec: hc, events } => {
                let mut was = HistCodec::new(flow)?;
                was.set_cuts(hc.cuts().to_vec());
                let mut all = hc.cuts().to_vec();
                all.extend(new);
                hc.set_cuts(all);
                Ok(Plan::History(history::refold(
                    &was,
                    hc,
                    events,
                    state_complete,
                )))
            }
            FlowState::Keys(_) => Err(no_history(flow, "cut by a snapshot")),
        }
    }

    /// The plan that writes every key's rows anew from its events.
    pub fn rebuild(&self, flow: &Flow) -> Result<Plan> {
        match self {
            FlowState::History { codec: hc, events } => {
                Ok(Plan::History(history::rebuild(hc, events)))
            }
            FlowState::Keys(_) => Err(no_history(flow, "rebuilt from its state")),
        }
    }

    /// The target rows `plan` writes and removes (`batch`: the batch it was
    /// planned from; `target`: the target's Arrow schema).
    pub fn target_rows(
        &self,
        flow: &Flow,
        codec: &Codec,
        target: &SchemaRef,
        batch: &RecordBatch,
        plan: &Plan,
    ) -> Result<TargetRows> {
        Ok(match (self, plan) {
            (FlowState::Keys(_), Plan::Keys(res)) => TargetRows {
                inserts: project(flow, target, batch, &res.inserts)?,
                remove_positions: res.remove_positions.clone(),
                remove_rows: project(flow, target, batch, &res.remove_keys)?,
            },
            (FlowState::History { codec: hc, .. }, Plan::History(p)) => TargetRows {
                inserts: history::rows_batch(flow, codec, hc, target, &p.inserts)?,
                remove_positions: p.remove_positions.clone(),
                // Only the keys (and __START_AT) of these rows are known:
                // the other columns may be null, required or not.
                remove_rows: history::rows_batch(
                    flow,
                    codec,
                    hc,
                    &nullable(target),
                    &p.remove_rows,
                )?,
            },
            _ => unreachable!("a plan comes from the state it is applied to"),
        })
    }

    /// Moves the state forward by `plan` (`locs`: where each inserted row
    /// was written), drops tombstones older than `cutoff_ms`; returns how
    /// many it dropped.
    pub fn apply(
        &mut self,
        flow: &Flow,
        plan: Plan,
        locs: &[Loc],
        now_ms: i64,
        cutoff_ms: i64,
    ) -> usize {
        match (self, plan) {
            (FlowState::Keys(index), Plan::Keys(res)) => {
                resolve::apply(index, &res, locs, now_ms);
                index.gc_tombstones(cutoff_ms)
            }
            (FlowState::History { events, .. }, Plan::History(p)) => {
                if cores() >= 2 {
                    history::apply(events, p, locs, &Threads);
                } else {
                    history::apply(events, p, locs, &resolve::Sequential);
                }
                // SCD Type 2 keeps a deleted key's history.
                if flow.scd2 {
                    0
                } else {
                    events.gc_tombstones(cutoff_ms)
                }
            }
            _ => unreachable!("a plan comes from the state it is applied to"),
        }
    }

    /// Whether the next state commit should rewrite the state log whole:
    /// it would hold more than `COMPACTION_RATIO` rows per entry.
    pub fn needs_compaction(&self, log_rows: u64) -> bool {
        let (dirty, entries) = match self {
            FlowState::Keys(index) => (index.dirty_len(), index.len()),
            FlowState::History { events, .. } => (events.dirty_len(), events.events()),
        };
        log_rows + dirty as u64 > (COMPACTION_RATIO * entries as u64).max(COMPACTION_MIN_ROWS)
    }

    /// The rows of the state table for this commit: the changed entries, or
    /// every entry when `whole`, in one part or, when there are many, in
    /// two built on two threads (each becomes its own file, written at
    /// once). A key's rows are all in one part.
    pub fn delta(
        &self,
        flow: &Flow,
        codec: &Codec,
        generation: i64,
        whole: bool,
    ) -> Result<Vec<RecordBatch>> {
        match self {
            FlowState::Keys(index) => {
                let n = if whole {
                    index.len()
                } else {
                    index.dirty_len()
                };
                halves(n, |skip, take| {
                    let entries: Box<dyn Iterator<Item = EntryRef<'_>>> = if whole {
                        Box::new(index.iter().skip(skip).take(take))
                    } else {
                        Box::new(index.dirty_part(skip, take))
                    };
                    state_table::to_batch(flow, codec, index, entries, generation)
                })
            }
            FlowState::History { codec: hc, events } => {
                let n = if whole {
                    events.len()
                } else {
                    events.dirty_keys()
                };
                halves(n, |skip, take| {
                    let keys: Box<dyn Iterator<Item = (&[u8], &[history::Event], bool)>> = if whole
                    {
                        let all = events.iter().skip(skip).take(take);
                        Box::new(all.map(|(k, e)| (k, e, true)))
                    } else {
                        Box::new(events.dirty_part(skip, take))
                    };
                    state_table::history_to_batch(flow, codec, hc, events, keys, generation)
                })
            }
        }
    }

    /// The changed entries are in a committed state snapshot.
    pub fn clear_dirty(&mut self) {
        match self {
            FlowState::Keys(index) => index.clear_dirty(),
            FlowState::History { events, .. } => events.clear_dirty(),
        }
    }
}

/// Batches of at least this many rows are resolved on two threads (when
/// the machine has two cores): below it a thread costs more than it saves.
const SPLIT_ROWS: usize = 8192;

/// The same for history batches: a 10k-event batch into a 1M-row SCD Type
/// 2 history took 82-109 ms on two threads and 59-73 ms on one (`bench
/// --flows scd2 --events 100000 --keys 20000 --table-sizes 1000000`,
/// `--small-batch` 10000 and 8000, interleaved); 100k-event batches gain.
const HISTORY_SPLIT_ROWS: usize = 32_768;

/// A state delta of at least this many entries (keys) is built in two
/// halves on two threads and written as two files at once. Below it a
/// thread and a file cost more than they save; a small commit (hundreds of
/// events) writes one file, as before.
const STATE_SPLIT_ENTRIES: usize = 32_768;

/// The machine's cores.
fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Whether `batch` is resolved on two threads.
fn two_threads(batch: &RecordBatch, split_rows: usize) -> bool {
    cores() >= 2 && batch.num_rows() >= split_rows
}

/// The state rows of `n` entries: `part(skip, take)` builds those of the
/// entries from `skip` on, at most `take` of them. One part below
/// `STATE_SPLIT_ENTRIES` (or on one core), else two halves on two
/// threads. The last part takes every entry left, so none is lost if `n`
/// is short.
fn halves(
    n: usize,
    part: impl Fn(usize, usize) -> Result<RecordBatch> + Sync,
) -> Result<Vec<RecordBatch>> {
    if n < STATE_SPLIT_ENTRIES || cores() < 2 {
        return Ok(vec![part(0, usize::MAX)?]);
    }
    let half = n / 2;
    let (first, second) = Threads.join(|| part(0, half), || part(half, usize::MAX));
    Ok(vec![first?, second?])
}

/// The resolver's two pieces of work on two threads (scoped: a panic in
/// either goes on in the caller).
struct Threads;

impl Join for Threads {
    fn join<A: Send, B: Send>(
        &self,
        a: impl FnOnce() -> A + Send,
        b: impl FnOnce() -> B + Send,
    ) -> (A, B) {
        std::thread::scope(|s| {
            let other = s.spawn(b);
            let mine = a();
            match other.join() {
                Ok(theirs) => (mine, theirs),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }
}

/// Resolves a batch of a history flow. A large batch is split by key hash
/// in two halves resolved on two threads (the keys are independent), and
/// the two plans are joined. A rejected half is resolved again whole, so
/// the error is the one a single pass names.
#[allow(clippy::too_many_arguments)] // the resolver's inputs, each passed on
fn resolve_history(
    flow: &Flow,
    codec: &Codec,
    hc: &HistCodec,
    batch: &RecordBatch,
    hist: &History,
    state_complete: bool,
    now_ms: i64,
    forced: Option<&BooleanArray>,
) -> Result<history::Plan> {
    let whole = || history::resolve(flow, codec, hc, batch, hist, state_complete, now_ms, forced);
    if !two_threads(batch, HISTORY_SPLIT_ROWS) || resolve::validate(flow, batch).is_err() {
        return whole();
    }
    let key_cols: Vec<_> = flow
        .key_idx
        .iter()
        .map(|&i| batch.column(i).clone())
        .collect();
    let keys = codec.keys.convert_columns(&key_cols)?;
    let mut halves: [Vec<u32>; 2] = [Vec::new(), Vec::new()];
    for (i, k) in keys.iter().enumerate() {
        halves[resolve::half_of(hash_key(k.as_ref()))].push(i as u32);
    }
    let part = |rows: &[u32]| -> Result<(RecordBatch, Option<BooleanArray>)> {
        let idx = UInt32Array::from(rows.to_vec());
        let b = arrow_select::take::take_record_batch(batch, &idx)?;
        let f = forced
            .map(|f| Ok::<_, Error>(take(f, &idx, None)?.as_boolean().clone()))
            .transpose()?;
        Ok((b, f))
    };
    let (b0, f0) = part(&halves[0])?;
    let (b1, f1) = part(&halves[1])?;
    let half = |b: &RecordBatch, f: Option<&BooleanArray>| {
        history::resolve(flow, codec, hc, b, hist, state_complete, now_ms, f)
    };
    let (p0, p1) = Threads.join(|| half(&b0, f0.as_ref()), || half(&b1, f1.as_ref()));
    match (p0, p1) {
        (Ok(a), Ok(b)) => Ok(join_plans(a, b)),
        _ => whole(),
    }
}

/// One plan of two halves of a batch with no key in common.
fn join_plans(mut a: history::Plan, b: history::Plan) -> history::Plan {
    let offset = a.inserts.len() as u32;
    a.inserts.extend(b.inserts);
    a.remove_positions.extend(b.remove_positions);
    a.remove_positions.sort_unstable();
    a.remove_rows.extend(b.remove_rows);
    a.changes.extend(b.changes.into_iter().map(|mut c| {
        c.pending.iter_mut().for_each(|p| p.1 += offset);
        c
    }));
    a.stats.add(&b.stats);
    a
}

/// An SCD Type 1 flow's state keeps sequences, not values.
fn no_history(flow: &Flow, what: &str) -> Error {
    Error::Definition {
        code: codes::UNSUPPORTED,
        flow: flow.name.clone(),
        message: format!(
            "the target cannot be {what}: an SCD Type 1 flow without ignore_null_updates keeps no values in its state; rebuild it from the source with `autocdc refresh --full {}`",
            flow.name
        ),
    }
}

/// `schema` with every top-level field nullable.
fn nullable(schema: &SchemaRef) -> SchemaRef {
    Arc::new(arrow_schema::Schema::new_with_metadata(
        schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect::<Vec<_>>(),
        schema.metadata().clone(),
    ))
}

/// The rows `rows` of `batch` (source columns), in the target's Arrow schema.
fn project(
    flow: &Flow,
    target: &SchemaRef,
    batch: &RecordBatch,
    rows: &[u32],
) -> Result<RecordBatch> {
    let idx = UInt32Array::from(rows.to_vec());
    let cols = target
        .fields()
        .iter()
        .map(|f| {
            let src = flow
                .target_cols
                .iter()
                .copied()
                .find(|&c| flow.column_name(c) == f.name());
            let Some(src) = src else {
                // A column the flow no longer selects: null in its rows.
                if f.is_nullable() {
                    return Ok(arrow_array::new_null_array(f.data_type(), rows.len()));
                }
                return Err(Error::State {
                    code: codes::SCHEMA_DRIFT,
                    message: format!(
                        "target column `{}` is not produced by flow `{}`",
                        f.name(),
                        flow.name
                    ),
                });
            };
            let a = take(batch.column(src).as_ref(), &idx, None)?;
            Ok(arrow_cast::cast(&a, f.data_type())?)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(target.clone(), cols)?)
}
