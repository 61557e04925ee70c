//! Change history per key, for flows that need more than the winning change:
//! SCD Type 2 (every version of a row, with `__START_AT` / `__END_AT`) and
//! `ignore_null_updates` (a null keeps the column's value).
//!
//! Per key the state keeps the applied changes ("events") in sequence order.
//! The rows a key has in the target are a pure function of its events
//! (`fold`), so a late event is simply put in its place and the key folded
//! again: the output rows that changed are removed (by position, which each
//! row's anchor event records) and the new ones inserted. Whatever the
//! arrival order and batching, the target equals the fold of all events.
//!
//! Every event is kept: SCD Type 2's history can be split anywhere later,
//! and under `ignore_null_updates` a late change may fill a column of any
//! earlier version. SCD Type 1 with ties rejected drops the values of
//! upserts that later ones overwrite entirely, keeping their sequence and
//! fingerprint (see `prune`).
//!
//! Architecture invariant: no I/O, no clock (commit time is a parameter).

// hashbrown's default hasher (foldhash): keys are hashed on every event, and
// SipHash showed in SCD Type 2 profiles.
use hashbrown::HashMap;

use arrow_array::{Array, ArrayRef, RecordBatch, StructArray, UInt32Array};
use arrow_row::{RowConverter, Rows, SortField};
use arrow_schema::{DataType, SchemaRef};
use arrow_select::take::take;
use xxhash_rust::xxh3::Xxh3;

use crate::core::flow::{END_AT, Flow, START_AT, TiePolicy};
use crate::core::nested;
use crate::core::resolve::{
    BatchStats, Codec, SameSequence, mask, required_null, same_sequence, validate,
};
use crate::core::state::{FileTable, Loc};
use crate::error::{Error, Result, codes};

/// Encoders for single values of the flow's value columns (the target
/// columns that are not keys), so a value is a byte string that compares,
/// hashes and decodes back.
#[derive(Debug)]
pub struct HistCodec {
    /// Source indices of the value columns, in target order.
    pub cols: Vec<usize>,
    convs: Vec<RowConverter>,
    /// The source type of each value column (`decode` gives it back).
    types: Vec<DataType>,
    /// The encoding of a null, per value column.
    nulls: Vec<Box<[u8]>>,
    /// Every value column null.
    null_vals: Vals,
    /// Positions in `cols` of the tracked columns (SCD Type 2); empty for SCD Type 1.
    tracked: Vec<usize>,
    scd2: bool,
    /// Per value column: a null in an upsert keeps the current value.
    ignore_nulls: Vec<bool>,
    /// SCD Type 1 with ties rejected: values later upserts overwrite can go.
    prune: bool,
}

impl HistCodec {
    pub fn new(flow: &Flow) -> Result<HistCodec> {
        HistCodec::folding(flow, &Folding::of(flow))
    }

    /// The codec folding as `folding` says instead of as the flow does.
    pub fn folding(flow: &Flow, folding: &Folding) -> Result<HistCodec> {
        let (tracked, ignored) = (&folding.tracked, &folding.ignored);
        let cols = flow.value_cols();
        let mut convs = Vec::new();
        let mut nulls: Vec<Box<[u8]>> = Vec::new();
        let types = cols
            .iter()
            .map(|&c| flow.source_arrow.field(c).data_type().clone())
            .collect();
        for &c in &cols {
            // arrow-row has no maps: a map is encoded as its entries.
            let t = nested::row_type(flow.source_arrow.field(c).data_type());
            let conv = RowConverter::new(vec![SortField::new(t.clone())])?;
            let null = arrow_array::new_null_array(&t, 1);
            let rows = conv.convert_columns(&[null])?;
            nulls.push(rows.row(0).as_ref().into());
            convs.push(conv);
        }
        let tracked = if flow.scd2 {
            tracked
                .iter()
                .map(|t| {
                    cols.iter()
                        .position(|c| c == t)
                        .expect("tracked is a value column")
                })
                .collect()
        } else {
            Vec::new()
        };
        let ignore_nulls = cols.iter().map(|c| ignored.contains(c)).collect();
        let null_vals = Vals::new(nulls.iter().map(|n| &**n));
        Ok(HistCodec {
            cols,
            convs,
            types,
            nulls,
            null_vals,
            tracked,
            scd2: flow.scd2,
            ignore_nulls,
            prune: !flow.scd2 && flow.on_tie == TiePolicy::Error,
        })
    }

    fn is_null(&self, col: usize, v: &[u8]) -> bool {
        *self.nulls[col] == *v
    }

    /// The value columns of `batch`, encoded.
    pub fn encode(&self, batch: &RecordBatch) -> Result<Vec<Rows>> {
        self.cols
            .iter()
            .zip(&self.convs)
            .map(|(&c, conv)| Ok(conv.convert_columns(&[nested::row_view(batch.column(c))?])?))
            .collect()
    }

    /// Value columns (in `cols` order, source types), encoded.
    pub fn encode_columns(&self, arrays: &[ArrayRef]) -> Result<Vec<Rows>> {
        arrays
            .iter()
            .zip(&self.convs)
            .map(|(a, conv)| Ok(conv.convert_columns(&[nested::row_view(a)?])?))
            .collect()
    }

    /// Decodes one value column.
    pub fn decode<'a>(&self, col: usize, vals: impl Iterator<Item = &'a [u8]>) -> Result<ArrayRef> {
        let parser = self.convs[col].parser();
        let mut out = self.convs[col].convert_rows(vals.map(|v| parser.parse(v)))?;
        Ok(nested::from_row_view(out.remove(0), &self.types[col])?)
    }

    /// Every value column null.
    pub fn null_vals(&self) -> Vals {
        self.null_vals.clone()
    }
}

/// The encoded value columns of one change (`HistCodec`) in one allocation:
/// the count, each value's end offset (u32 little-endian), then the bytes.
/// One allocation per event instead of one per value: a history flow holds
/// every event of every key, and allocator work bounded its throughput.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Vals(Box<[u8]>);

impl Vals {
    pub fn new<'a>(vals: impl Iterator<Item = &'a [u8]> + Clone) -> Vals {
        let (n, bytes) = vals
            .clone()
            .fold((0usize, 0usize), |(n, b), v| (n + 1, b + v.len()));
        let mut out = Vec::with_capacity(4 + 4 * n + bytes);
        out.extend_from_slice(&(n as u32).to_le_bytes());
        let mut end = 0u32;
        for v in vals.clone() {
            end += v.len() as u32;
            out.extend_from_slice(&end.to_le_bytes());
        }
        for v in vals {
            out.extend_from_slice(v);
        }
        Vals(out.into_boxed_slice())
    }

    fn u32_at(&self, at: usize) -> usize {
        u32::from_le_bytes(self.0[at..at + 4].try_into().expect("4 bytes")) as usize
    }

    pub fn len(&self) -> usize {
        if self.0.is_empty() { 0 } else { self.u32_at(0) }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Value column `c`, encoded.
    pub fn get(&self, c: usize) -> &[u8] {
        let n = self.len();
        let data = 4 + 4 * n;
        let start = if c == 0 { 0 } else { self.u32_at(4 * c) };
        let end = self.u32_at(4 + 4 * c);
        &self.0[data + start..data + end]
    }

    pub fn iter(&self) -> impl Iterator<Item = &[u8]> + Clone + '_ {
        (0..self.len()).map(|c| self.get(c))
    }

    /// Heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.0.len()
    }
}

/// How a key's events fold into its rows: the SCD Type 2 tracked columns
/// and the columns a null in an upsert leaves unchanged (source indices of
/// value columns, sorted). A target records the folding of its rows, so a
/// definition that folds otherwise re-folds them (`refold`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Folding {
    pub tracked: Vec<usize>,
    pub ignored: Vec<usize>,
}

impl Folding {
    /// The flow's folding (its sets are sorted, as recorded ones are, so
    /// a set listed in another order is the same folding).
    pub fn of(flow: &Flow) -> Folding {
        Folding {
            tracked: if flow.scd2 {
                flow.tracked.clone()
            } else {
                Vec::new()
            },
            ignored: flow.ignore_null_cols.clone(),
        }
    }
}

/// One applied change of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Row-encoded sequence (`Codec::seqs`).
    pub seq: Box<[u8]>,
    /// Fingerprint of the whole change: decides ties, spots duplicates.
    pub fp: u64,
    /// Commit time of a delete; None for an upsert.
    pub deleted_at_ms: Option<i64>,
    /// The value columns, encoded (`HistCodec`).
    pub vals: Vals,
    /// Where the target row this event anchors sits: the version it opens
    /// (SCD Type 2) or the current row it last updated (SCD Type 1).
    pub loc: Option<Loc>,
    /// Changed since the last state commit (new, or its location, values
    /// or fingerprint moved): an appending history writes only these.
    pub changed: bool,
}

impl Event {
    pub fn is_delete(&self) -> bool {
        self.deleted_at_ms.is_some()
    }
}

/// The history of every key. Keys are row-encoded (`Codec::keys`).
#[derive(Debug, Default, Clone)]
pub struct History {
    keys: HashMap<Box<[u8]>, Vec<Event>>,
    pub files: FileTable,
    dirty: Vec<Box<[u8]>>,
    events: usize,
    /// The state log only appends: each commit writes the events that
    /// changed, and a key's events are the latest row of each sequence.
    /// SCD Type 2 appends (it never forgets an event); SCD Type 1 with
    /// `ignore_null_updates` forgets a deleted key after `tombstone_gc`,
    /// so each commit writes a touched key's events whole, and a key's
    /// events are those of its latest generation.
    appends: bool,
}

impl History {
    /// An empty history; `appends`: see the field.
    pub fn new(appends: bool) -> History {
        History {
            appends,
            ..History::default()
        }
    }

    /// Whether the state log only appends changed events (SCD Type 2).
    pub fn appends(&self) -> bool {
        self.appends
    }

    pub fn get(&self, key: &[u8]) -> Option<&[Event]> {
        self.keys.get(key).map(Vec::as_slice)
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Events kept, over all keys.
    pub fn events(&self) -> usize {
        self.events
    }

    /// Keys whose latest event is an upsert.
    pub fn live(&self) -> usize {
        self.keys
            .values()
            .filter(|e| e.last().is_some_and(|e| !e.is_delete()))
            .count()
    }

    /// Replaces the events of `key` (sorted by sequence) and marks it dirty;
    /// each event that differs from the one it replaces (or is new) is
    /// marked changed.
    ///
    /// A key is dirty (listed once in `dirty`) while it has a changed event.
    pub fn put(&mut self, key: Box<[u8]>, mut events: Vec<Event>) {
        debug_assert!(events.windows(2).all(|w| w[0].seq < w[1].seq));
        self.events += events.len();
        let newly_dirty = match self.keys.get_mut(&*key) {
            Some(old) => {
                let was_dirty = old.iter().any(|e| e.changed);
                mark_changed(old, &mut events);
                self.events -= old.len();
                *old = events;
                !was_dirty && old.iter().any(|e| e.changed)
            }
            None => {
                events.iter_mut().for_each(|e| e.changed = true);
                self.keys.insert(key.clone(), events);
                true
            }
        };
        if newly_dirty {
            self.dirty.push(key);
        }
    }

    /// Moves target rows: every event whose `loc` `to` maps elsewhere takes
    /// the new location, and its key is marked dirty (a compaction rewrote
    /// the row's file). Returns how many moved.
    pub fn relocate(&mut self, mut to: impl FnMut(Loc) -> Option<Loc>) -> usize {
        let mut moved = 0;
        for (key, events) in self.keys.iter_mut() {
            let was_dirty = events.iter().any(|e| e.changed);
            let mut changed = false;
            for e in events.iter_mut() {
                if let Some(new) = e.loc.and_then(&mut to).filter(|n| Some(*n) != e.loc) {
                    e.loc = Some(new);
                    e.changed = true;
                    changed = true;
                    moved += 1;
                }
            }
            if changed && !was_dirty {
                self.dirty.push(key.clone());
            }
        }
        moved
    }

    /// Forgets the data files no event points into, renumbering the others
    /// (see `KeyIndex::shrink_files`). Returns how many went.
    pub fn shrink_files(&mut self) -> usize {
        let mut used = vec![false; self.files.len()];
        for e in self.keys.values().flatten() {
            if let Some(l) = e.loc {
                used[l.file as usize] = true;
            }
        }
        let unused = used.iter().filter(|u| !**u).count();
        if unused == 0 {
            return 0;
        }
        let map = self.files.retain(&used);
        for e in self.keys.values_mut().flatten() {
            if let Some(l) = &mut e.loc {
                l.file = map[l.file as usize];
            }
        }
        unused
    }

    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[Event])> + '_ {
        self.keys.iter().map(|(k, e)| (&**k, e.as_slice()))
    }

    /// The keys with a changed event, each once.
    pub fn dirty(&self) -> impl Iterator<Item = (&[u8], &[Event])> + '_ {
        self.dirty
            .iter()
            .filter_map(|k| self.keys.get(k).map(|e| (&**k, e.as_slice())))
    }

    /// The rows the next state commit writes (unless whole).
    pub fn dirty_len(&self) -> usize {
        self.dirty()
            .map(|(_, e)| {
                if self.appends {
                    e.iter().filter(|e| e.changed).count()
                } else {
                    e.len()
                }
            })
            .sum()
    }

    pub fn clear_dirty(&mut self) {
        for k in std::mem::take(&mut self.dirty) {
            if let Some(events) = self.keys.get_mut(&k) {
                events.iter_mut().for_each(|e| e.changed = false);
            }
        }
    }

    /// SCD Type 1: forgets keys whose latest change is a delete committed
    /// before `cutoff_ms` (like a collected tombstone: a late older change
    /// for the key is applied again). Returns how many.
    pub fn gc_tombstones(&mut self, cutoff_ms: i64) -> usize {
        let before = self.keys.len();
        let mut dropped = 0;
        let mut dirty_dropped = false;
        self.keys.retain(|_, e| {
            let gone = e
                .last()
                .and_then(|e| e.deleted_at_ms)
                .is_some_and(|t| t < cutoff_ms);
            if gone {
                dropped += e.len();
                dirty_dropped |= e.iter().any(|e| e.changed);
            }
            !gone
        });
        self.events -= dropped;
        if dirty_dropped {
            // A key put again before the next commit is listed anew.
            let keys = &self.keys;
            self.dirty.retain(|k| keys.contains_key(k));
        }
        before - self.keys.len()
    }

    /// An estimate of the memory the history holds.
    pub fn heap_bytes(&self) -> usize {
        self.keys
            .iter()
            .map(|(k, events)| {
                k.len()
                    + 64
                    + events
                        .iter()
                        .map(|e| std::mem::size_of::<Event>() + e.seq.len() + e.vals.heap_bytes())
                        .sum::<usize>()
            })
            .sum()
    }
}

/// Marks each of `new` changed that is not in `old` as it is there (both
/// sorted by sequence); a change not yet committed stays marked.
fn mark_changed(old: &[Event], new: &mut [Event]) {
    let mut o = old.iter().peekable();
    for e in new.iter_mut() {
        while o.next_if(|x| x.seq < e.seq).is_some() {}
        let same = o.peek().is_some_and(|x| {
            x.seq == e.seq
                && x.fp == e.fp
                && x.deleted_at_ms == e.deleted_at_ms
                && x.loc == e.loc
                && x.vals == e.vals
        });
        e.changed |= !same;
    }
}

/// One row of the target, as the fold of a key's events produces it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    /// Event that opens the version.
    pub start: usize,
    /// Event that closes it (the next version's start, or a delete).
    pub end: Option<usize>,
    /// Event whose `loc` locates the row.
    pub anchor: usize,
    pub vals: Vals,
}

/// The target rows of one key: events in sequence order → versions.
///
/// An upsert whose tracked values equal the current version's updates it in
/// place (SCD Type 1 tracks nothing, so every upsert does); otherwise it
/// closes the current version at its sequence and opens a new one. A delete
/// closes the current version. With `ignore_null_updates` a null takes the
/// current version's value (after a delete there is none to keep).
/// SCD Type 1 keeps only the open version.
pub fn fold(hc: &HistCodec, events: &[Event]) -> Vec<Version> {
    let mut out = Vec::new();
    let mut cur: Option<Version> = None;
    for (i, e) in events.iter().enumerate() {
        if e.is_delete() {
            if let Some(mut v) = cur.take() {
                v.end = Some(i);
                out.push(v);
            }
            continue;
        }
        let vals: Vals = match &cur {
            Some(v) if hc.ignore_nulls.contains(&true) => {
                Vals::new(e.vals.iter().enumerate().map(|(c, b)| {
                    if hc.ignore_nulls[c] && hc.is_null(c, b) {
                        v.vals.get(c)
                    } else {
                        b
                    }
                }))
            }
            _ => e.vals.clone(),
        };
        match &mut cur {
            Some(v) if hc.tracked.iter().all(|&t| v.vals.get(t) == vals.get(t)) => {
                v.vals = vals;
                if !hc.scd2 {
                    v.anchor = i;
                }
            }
            _ => {
                if let Some(mut v) = cur.take() {
                    v.end = Some(i);
                    out.push(v);
                }
                cur = Some(Version {
                    start: i,
                    end: None,
                    anchor: i,
                    vals,
                });
            }
        }
    }
    out.extend(cur);
    if !hc.scd2 {
        out.retain(|v| v.end.is_none());
    }
    out
}

/// Identity of a target row: its values and (SCD Type 2) its interval.
fn row_hash(hc: &HistCodec, events: &[Event], v: &Version) -> u64 {
    let mut h = Xxh3::new();
    for b in v.vals.iter() {
        h.update(&(b.len() as u32).to_le_bytes());
        h.update(b);
    }
    if hc.scd2 {
        let seq = |i: usize| &events[i].seq;
        h.update(&(seq(v.start).len() as u32).to_le_bytes());
        h.update(seq(v.start));
        match v.end {
            Some(e) => {
                h.update(&[1]);
                h.update(seq(e));
            }
            None => h.update(&[0]),
        }
    }
    h.digest()
}

/// SCD Type 1 with `on_sequence_tie = "error"`: drops the values that can
/// no longer matter. An upsert every non-null value of which a later upsert
/// of the same life (no delete between) overwrites keeps only its sequence
/// and fingerprint (its values become null), so a duplicate arriving later
/// is still recognised. With deterministic ties nothing is dropped: a later
/// change could win a tie against the overwriting upsert (or a delete) and
/// bring the older values back into play.
fn prune(hc: &HistCodec, events: &mut [Event]) {
    if !hc.prune {
        return;
    }
    let ncols = hc.cols.len();
    let mut covered = vec![false; ncols];
    let mut later_upsert = false;
    for e in events.iter_mut().rev() {
        if e.is_delete() {
            covered.iter_mut().for_each(|c| *c = false);
            later_upsert = false;
            continue;
        }
        let nonnull: Vec<usize> = (0..ncols)
            .filter(|&c| !hc.is_null(c, e.vals.get(c)))
            .collect();
        if later_upsert && !nonnull.is_empty() && nonnull.iter().all(|&c| covered[c]) {
            e.vals = hc.null_vals();
        }
        for c in nonnull {
            covered[c] = true;
        }
        // A column whose nulls are not ignored is decided by the latest upsert.
        for (c, ignored) in hc.ignore_nulls.iter().enumerate() {
            if !ignored {
                covered[c] = true;
            }
        }
        later_upsert = true;
    }
}

/// A target row to write or to remove by key.
#[derive(Debug, Clone)]
pub struct OutRow {
    pub key: Box<[u8]>,
    pub vals: Vals,
    pub start: Option<Box<[u8]>>,
    pub end: Option<Box<[u8]>>,
}

/// The new events of one key, with the insert ordinal each new anchor waits for.
#[derive(Debug)]
pub struct KeyChange {
    pub key: Box<[u8]>,
    pub events: Vec<Event>,
    /// (event index, insert ordinal): the event's `loc` is where that insert lands.
    pub pending: Vec<(usize, u32)>,
}

/// What one batch does to a history flow.
#[derive(Debug, Default)]
pub struct Plan {
    pub inserts: Vec<OutRow>,
    pub remove_positions: Vec<Loc>,
    /// Rows whose position is unknown: removed by equality delete on the keys
    /// (and `__START_AT` for SCD Type 2).
    pub remove_rows: Vec<OutRow>,
    pub changes: Vec<KeyChange>,
    pub stats: BatchStats,
}

fn to_out(key: &[u8], events: &[Event], v: &Version) -> OutRow {
    OutRow {
        key: key.into(),
        vals: v.vals.clone(),
        start: Some(events[v.start].seq.clone()),
        end: v.end.map(|e| events[e].seq.clone()),
    }
}

/// Resolves `batch` against the history: every change goes to its place in
/// its key's events, and each touched key is folded again.
#[allow(clippy::too_many_arguments)] // the resolver's inputs, each used once
pub fn resolve(
    flow: &Flow,
    codec: &Codec,
    hc: &HistCodec,
    batch: &RecordBatch,
    hist: &History,
    state_complete: bool,
    now_ms: i64,
    forced_deletes: Option<&arrow_array::BooleanArray>,
) -> Result<Plan> {
    validate(flow, batch)?;
    let n = batch.num_rows();
    let cols =
        |idx: &[usize]| -> Vec<ArrayRef> { idx.iter().map(|&i| batch.column(i).clone()).collect() };
    let keys = codec.keys.convert_columns(&cols(&flow.key_idx))?;
    let seqs = codec.seqs.convert_columns(&cols(&flow.seq_idx))?;
    let mut fps = codec.fingerprints(batch)?;
    crate::core::resolve::sentinel_fingerprints(&mut fps, forced_deletes);
    let vals = hc.encode(batch)?;
    let is_delete = mask(flow, flow.deletes.as_ref(), batch)?;
    let deleted = |i: usize| {
        is_delete.as_ref().is_some_and(|d| d.value(i)) || forced_deletes.is_some_and(|d| d.value(i))
    };

    let mut plan = Plan {
        stats: BatchStats {
            rows_in: n as u64,
            ..Default::default()
        },
        ..Default::default()
    };
    for (key, rows) in rows_by_key(&keys) {
        let old: &[Event] = hist.get(key).unwrap_or(&[]);
        let mut events = old.to_vec();
        for &i in &rows {
            let seq: &[u8] = seqs.row(i).data();
            let fp = fps[i];
            let at = events.partition_point(|e| &*e.seq < seq);
            let event = Event {
                seq: seq.into(),
                fp,
                deleted_at_ms: deleted(i).then_some(now_ms),
                vals: Vals::new(vals.iter().map(|r| r.row(i).data())),
                loc: None,
                changed: false,
            };
            if let Some(e) = events.get(at).filter(|e| &*e.seq == seq) {
                match same_sequence(flow, i, fp, e.fp, e.is_delete())? {
                    SameSequence::ReplacesSentinel => {}
                    SameSequence::Duplicate => {
                        plan.stats.duplicates += 1;
                        continue;
                    }
                    SameSequence::Tie { wins } => {
                        plan.stats.ties += 1;
                        if !wins {
                            plan.stats.tie_losers += 1;
                            continue;
                        }
                    }
                }
                events[at] = event;
            } else {
                let behind_delete = !hc.scd2 && events[at..].iter().any(Event::is_delete);
                events.insert(at, event);
                if behind_delete {
                    // SCD Type 1: older than a delete, it changes nothing now
                    // (it is kept in case a tie displaces that delete).
                    plan.stats.stale += 1;
                    continue;
                }
            }
            if deleted(i) {
                plan.stats.deletes += 1;
            } else {
                plan.stats.upserts += 1;
            }
        }
        prune(hc, &mut events);
        if events == old {
            continue;
        }

        let pending = rewrite_rows(
            hc,
            hc,
            hist,
            key,
            old,
            &mut events,
            &mut plan,
            state_complete,
        );
        plan.changes.push(KeyChange {
            key: key.into(),
            events,
            pending,
        });
    }

    check_required(flow, hc, &keys, &plan.inserts)?;
    plan.remove_positions.sort_unstable();
    Ok(plan)
}

/// The batch's rows grouped by key, keys in order of first appearance.
fn rows_by_key(keys: &Rows) -> Vec<(&[u8], Vec<usize>)> {
    let mut groups: HashMap<&[u8], usize> = HashMap::new();
    let mut order: Vec<(&[u8], Vec<usize>)> = Vec::new();
    for i in 0..keys.num_rows() {
        let k = keys.row(i);
        let k: &[u8] = k.data();
        match groups.get(k) {
            Some(&g) => order[g].1.push(i),
            None => {
                groups.insert(k, order.len());
                order.push((k, vec![i]));
            }
        }
    }
    order
}

/// Re-folds every key's events under `hc` where they were folded under
/// `was` (the SCD Type 2 tracked set changed): the rows that differ are
/// removed and written again, as for a batch; the events themselves stay,
/// only where their rows are changes.
pub fn refold(was: &HistCodec, hc: &HistCodec, hist: &History, state_complete: bool) -> Plan {
    let mut plan = Plan::default();
    for (key, old) in hist.iter() {
        let mut events = old.to_vec();
        let before = (
            plan.inserts.len(),
            plan.remove_positions.len(),
            plan.remove_rows.len(),
        );
        let pending = rewrite_rows(
            was,
            hc,
            hist,
            key,
            old,
            &mut events,
            &mut plan,
            state_complete,
        );
        let after = (
            plan.inserts.len(),
            plan.remove_positions.len(),
            plan.remove_rows.len(),
        );
        if after != before {
            plan.changes.push(KeyChange {
                key: key.into(),
                events,
                pending,
            });
        }
    }
    plan.remove_positions.sort_unstable();
    plan
}

/// Every key's rows written anew from its events (the target rebuilt from
/// the state, `autocdc refresh --history`): each version is an insert;
/// what the target held before goes with the overwrite that commits it.
pub fn rebuild(hc: &HistCodec, hist: &History) -> Plan {
    let mut plan = Plan::default();
    for (key, old) in hist.iter() {
        let mut events = old.to_vec();
        let mut pending = Vec::new();
        for v in fold(hc, &events) {
            pending.push((v.anchor, plan.inserts.len() as u32));
            plan.inserts.push(to_out(key, &events, &v));
        }
        for e in &mut events {
            e.loc = None;
        }
        plan.changes.push(KeyChange {
            key: key.into(),
            events,
            pending,
        });
    }
    plan
}

/// A key's target rows before (`old`, folded under `was`) and after
/// (`events`, folded under `hc`) the batch: rows in both stay where they
/// are; the others are removed (by position when known) and inserted.
/// `events` keep the positions of the rows that stay; returns (event,
/// insert ordinal) of each row to write.
#[allow(clippy::too_many_arguments)] // one key's rewrite, each input used once
fn rewrite_rows(
    was: &HistCodec,
    hc: &HistCodec,
    hist: &History,
    key: &[u8],
    old: &[Event],
    events: &mut [Event],
    plan: &mut Plan,
    state_complete: bool,
) -> Vec<(usize, u32)> {
    let before = fold(was, old);
    let after = fold(hc, events);
    let mut olds: Vec<(u64, &Version, bool)> = before
        .iter()
        .map(|v| (row_hash(hc, old, v), v, false))
        .collect();
    let mut kept: Vec<(usize, Loc)> = Vec::new();
    let mut pending = Vec::new();
    for v in &after {
        let h = row_hash(hc, events, v);
        if let Some(o) = olds.iter_mut().find(|o| !o.2 && o.0 == h) {
            o.2 = true;
            if let Some(loc) = old[o.1.anchor].loc {
                kept.push((v.anchor, loc));
                continue;
            }
            // A row without a known position: write it again, remove the old by key.
            o.2 = false;
        }
        pending.push((v.anchor, plan.inserts.len() as u32));
        plan.inserts.push(to_out(key, events, v));
    }
    for (_, v, matched) in &olds {
        if *matched {
            continue;
        }
        match old[v.anchor].loc {
            Some(loc) if hist.files.is_live(loc.file) => {
                plan.remove_positions.push(loc);
                plan.stats.removed_by_position += 1;
            }
            _ => {
                plan.remove_rows.push(to_out(key, old, v));
                plan.stats.removed_by_key += 1;
            }
        }
    }
    if old.is_empty() && !state_complete && !hc.scd2 {
        // The key may have a row autocdc did not write.
        plan.remove_rows.push(OutRow {
            key: key.into(),
            vals: hc.null_vals(),
            start: None,
            end: None,
        });
        plan.stats.removed_by_key += 1;
    }
    for e in events.iter_mut() {
        e.loc = None;
    }
    for (at, loc) in kept {
        events[at].loc = Some(loc);
    }
    pending
}

/// Every row to write fills the target's required columns.
fn check_required(flow: &Flow, hc: &HistCodec, keys: &Rows, inserts: &[OutRow]) -> Result<()> {
    for (j, &c) in hc.cols.iter().enumerate() {
        if !flow.required(c) {
            continue;
        }
        if let Some(r) = inserts.iter().find(|r| hc.is_null(j, r.vals.get(j))) {
            let row = (0..keys.num_rows())
                .find(|&i| keys.row(i).data() == &*r.key)
                .unwrap_or(0);
            return Err(required_null(flow, row, c));
        }
    }
    Ok(())
}

/// Moves the history forward once the inserts are written: `locs[ordinal]`
/// is where insert `ordinal` landed.
pub fn apply(hist: &mut History, plan: Plan, locs: &[Loc]) {
    debug_assert_eq!(locs.len(), plan.inserts.len());
    for mut c in plan.changes {
        for &(at, ordinal) in &c.pending {
            c.events[at].loc = Some(locs[ordinal as usize]);
        }
        hist.put(c.key, c.events);
    }
}

/// `rows` as a batch of the target (`schema`: the target's Arrow schema).
pub fn rows_batch(
    flow: &Flow,
    codec: &Codec,
    hc: &HistCodec,
    schema: &SchemaRef,
    rows: &[OutRow],
) -> Result<RecordBatch> {
    let kp = codec.keys.parser();
    let key_cols = codec
        .keys
        .convert_rows(rows.iter().map(|r| kp.parse(&r.key)))?;
    let seq_cols = |pick: &dyn Fn(&OutRow) -> Option<&[u8]>| -> Result<Vec<ArrayRef>> {
        let sp = codec.seqs.parser();
        let present: Vec<&[u8]> = rows.iter().filter_map(pick).collect();
        let dense = codec
            .seqs
            .convert_rows(present.iter().map(|s| sp.parse(s)))?;
        let mut next = 0u32;
        let idx: UInt32Array = rows
            .iter()
            .map(|r| {
                pick(r).map(|_| {
                    next += 1;
                    next - 1
                })
            })
            .collect();
        dense
            .iter()
            .map(|a| Ok(take(a.as_ref(), &idx, None)?))
            .collect()
    };
    let mut out = Vec::with_capacity(schema.fields().len());
    for f in schema.fields() {
        let name = f.name().as_str();
        let a: ArrayRef = if name == START_AT || name == END_AT {
            let cols = if name == START_AT {
                seq_cols(&|r: &OutRow| r.start.as_deref())?
            } else {
                seq_cols(&|r: &OutRow| r.end.as_deref())?
            };
            // Several sequence columns make a struct of them; one (a
            // struct column too) is the type itself.
            match f.data_type() {
                DataType::Struct(fields) if cols.len() > 1 => {
                    let nulls = cols[0].logical_nulls();
                    let children = cols
                        .iter()
                        .zip(fields.iter())
                        .map(|(c, sf)| Ok(arrow_cast::cast(c, sf.data_type())?))
                        .collect::<Result<Vec<_>>>()?;
                    std::sync::Arc::new(StructArray::try_new(fields.clone(), children, nulls)?)
                }
                t => arrow_cast::cast(&cols[0], t)?,
            }
        } else if let Some(k) = flow
            .key_idx
            .iter()
            .position(|&c| flow.column_name(c) == name)
        {
            arrow_cast::cast(&key_cols[k], f.data_type())?
        } else if let Some(j) = hc.cols.iter().position(|&c| flow.column_name(c) == name) {
            let a = hc.decode(j, rows.iter().map(|r| r.vals.get(j)))?;
            arrow_cast::cast(&a, f.data_type())?
        } else {
            return Err(Error::State {
                code: codes::SCHEMA_DRIFT,
                message: format!(
                    "target column `{name}` is not produced by flow `{}`",
                    flow.name
                ),
            });
        };
        out.push(a);
    }
    Ok(RecordBatch::try_new(schema.clone(), out)?)
}

#[cfg(test)]
mod tests {
    use super::Vals;

    #[test]
    fn vals_give_back_each_value_whatever_its_length() {
        let parts: [&[u8]; 4] = [b"", b"ab", &[0, 1, 2, 255], b""];
        let v = Vals::new(parts.iter().copied());
        assert_eq!(v.len(), 4);
        for (c, p) in parts.iter().enumerate() {
            assert_eq!(v.get(c), *p, "value {c}");
        }
        assert_eq!(v.iter().collect::<Vec<_>>(), parts.to_vec());
        assert_eq!(v.heap_bytes(), 4 + 4 * 4 + 6);
        // Equal values, equal bytes: folds compare and hash them whole.
        assert_eq!(v, Vals::new(parts.iter().copied()));
        assert_ne!(
            v,
            Vals::new([b"".as_slice(), b"a", b"b", b"\0\x01\x02\xff"].into_iter())
        );
        let none = Vals::new(std::iter::empty());
        assert_eq!((none.len(), none.iter().count()), (0, 0));
        assert!(Vals::default().is_empty());
    }
}
