//! The semantics of a key's events, in one place: how they fold into the
//! target's rows (`fold`: SCD Type 2's versions, values kept under
//! `ignore_null_updates`), the encoding of the value columns with their
//! keep markers (`HistCodec`), the folding a target records (`Folding`),
//! a row's identity (`row_hash`), what SCD Type 1 may drop (`prune`), and
//! from which event a late change makes a key fold again (`refold_from`).
//! Changing SCD Type 2 semantics is editing this file (and the oracle in
//! `tests/it/history.rs`).

use arrow_array::{ArrayRef, RecordBatch};
use arrow_row::{RowConverter, Rows, SortField};
use arrow_schema::DataType;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use super::event::Event;
use super::vals::{Vals, ValsRef};
use crate::core::flow::{Flow, TiePolicy};
use crate::core::nested;
use crate::error::Result;

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
    /// Per value column: the encoded value that keeps the current one (a
    /// null under `ignore_null_updates`; a Debezium flow's placeholder in
    /// its `toasted_columns`), or None: the column's nulls are values.
    keep: Vec<Option<Box<[u8]>>>,
    /// Per value column: a struct whose nulls are ignored, so a null field
    /// inside it keeps that field's current value (Spark's leaf-level
    /// reconciliation) while the other fields take the new values.
    leaves: Vec<bool>,
    /// SCD Type 1 with ties rejected: values later upserts overwrite can go.
    prune: bool,
    /// SCD Type 2 Debezium flows: where completed snapshots cut the
    /// history, in sequence order (`Cut`).
    cuts: Vec<Cut>,
}

/// Where a completed snapshot of a Debezium source cuts an SCD Type 2
/// history: just below the snapshot's reads (its sequence is the
/// snapshot's position with rank -1, which no event has). A key with
/// events below the cut and no read at the snapshot's position was gone
/// from the source when the snapshot read it (deleted while an earlier,
/// partial snapshot ran, its delete in neither snapshot nor stream): its
/// open version ends at the cut, as if it had been deleted there. A key
/// the snapshot read is not cut. Decided by the key's events alone, so the
/// order in which the cut and the reads arrive does not matter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cut {
    /// The cut's sequence, row-encoded.
    pub seq: std::sync::Arc<[u8]>,
}

/// Row-encoded bytes of the last sequence column of a Debezium flow (the
/// rank, an Int32: a validity byte and four value bytes): two sequences
/// that differ only there are at one source position.
const RANK_BYTES: usize = 5;

impl Cut {
    /// Whether an event's sequence is at the cut's source position (a read
    /// of the snapshot that made the cut).
    fn at_position(&self, seq: &[u8]) -> bool {
        let n = self.seq.len().saturating_sub(RANK_BYTES);
        seq.len() == self.seq.len() && seq[..n] == self.seq[..n]
    }
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
        let keep = cols
            .iter()
            .zip(&convs)
            .zip(&nulls)
            .map(|((&c, conv), null)| -> Result<Option<Box<[u8]>>> {
                if !ignored.contains(&c) {
                    return Ok(None);
                }
                if !flow.debezium {
                    return Ok(Some(null.clone()));
                }
                // Debezium's placeholder, as the column holds it.
                let text: ArrayRef = std::sync::Arc::new(arrow_array::StringArray::from(vec![
                    crate::core::debezium::PLACEHOLDER,
                ]));
                let marker = arrow_cast::cast(&text, flow.source_arrow.field(c).data_type())?;
                let rows = conv.convert_columns(&[nested::row_view(&marker)?])?;
                Ok(Some(rows.row(0).as_ref().into()))
            })
            .collect::<Result<Vec<_>>>()?;
        let leaves = cols
            .iter()
            .map(|c| {
                // A Debezium flow ignores placeholders, not nulls: a null
                // field there is a value.
                ignored.contains(c)
                    && !flow.debezium
                    && matches!(flow.source_arrow.field(*c).data_type(), DataType::Struct(_))
            })
            .collect();
        let null_vals = Vals::new(nulls.iter().map(|n| &**n));
        Ok(HistCodec {
            cols,
            convs,
            types,
            nulls,
            null_vals,
            tracked,
            scd2: flow.scd2,
            keep,
            leaves,
            prune: !flow.scd2 && flow.on_tie == TiePolicy::Error,
            cuts: Vec::new(),
        })
    }

    /// The cuts of completed snapshots this codec folds with (SCD Type 2),
    /// sorted.
    pub fn cuts(&self) -> &[Cut] {
        &self.cuts
    }

    /// Folds with `cuts` from now on.
    pub fn set_cuts(&mut self, mut cuts: Vec<Cut>) {
        cuts.sort_by(|a, b| a.seq.cmp(&b.seq));
        cuts.dedup();
        self.cuts = cuts;
    }

    pub(super) fn is_null(&self, col: usize, v: &[u8]) -> bool {
        *self.nulls[col] == *v
    }

    /// SCD Type 2: every version is a row.
    #[inline]
    pub(super) fn scd2(&self) -> bool {
        self.scd2
    }

    /// Whether `v` in column `col` keeps the column's current value.
    fn keeps(&self, col: usize, v: &[u8]) -> bool {
        self.keep[col].as_deref() == Some(v)
    }

    /// Whether `v` keeps a value and is not a null: Debezium's placeholder,
    /// which is a null where the key has no earlier value.
    fn placeholder(&self, col: usize, v: &[u8]) -> bool {
        self.keeps(col, v) && !self.is_null(col, v)
    }

    /// `v` decoded, when it is a struct with a null field somewhere inside
    /// in a struct column whose nulls are ignored (not a null struct: that
    /// keeps the whole value, as `keeps` says).
    fn with_null_leaf(&self, col: usize, v: &[u8]) -> Option<ArrayRef> {
        if !self.leaves[col] || self.is_null(col, v) {
            return None;
        }
        let a = self.decode(col, std::iter::once(v)).ok()?;
        null_leaf(a.as_any().downcast_ref()).then_some(a)
    }

    /// `new` with each null field inside it (at any depth of structs) taken
    /// from `prev`; None when there is nothing to take (`new` has no null
    /// field, `prev` is null) or a value does not decode: `new` stands.
    fn merge_leaves(&self, col: usize, prev: &[u8], new: &[u8]) -> Option<Box<[u8]>> {
        if self.is_null(col, prev) {
            return None;
        }
        let b = self.with_null_leaf(col, new)?;
        let a = self.decode(col, std::iter::once(prev)).ok()?;
        let merged = merge_struct(a.as_any().downcast_ref()?, b.as_any().downcast_ref()?)?;
        let rows = self.convs[col]
            .convert_columns(&[nested::row_view(&merged).ok()?])
            .ok()?;
        Some(rows.row(0).as_ref().into())
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

/// What closes a version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// An event: the next version's start, or a delete.
    Event(usize),
    /// A completed snapshot's cut (`Cut`).
    Cut(std::sync::Arc<[u8]>),
}

/// One row of the target, as the fold of a key's events produces it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    /// Event that opens the version.
    pub start: usize,
    /// What closes it; open when none.
    pub end: Option<End>,
    /// Event whose `loc` locates the row.
    pub anchor: usize,
    /// Event whose values the row has, unless `merged`.
    from: usize,
    /// Values merged from several upserts (`ignore_null_updates`).
    merged: Option<Vals>,
    /// A Debezium placeholder with no earlier value became a null here.
    pub unfilled: bool,
}

impl Version {
    /// The row's values (`events`: those it was folded from).
    pub fn vals<'a>(&'a self, events: &'a [Event]) -> ValsRef<'a> {
        match &self.merged {
            Some(v) => v.as_ref(),
            None => events[self.from].vals(),
        }
    }

    /// The sequence that closes it (`__END_AT`), when closed.
    pub fn end_seq<'a>(&'a self, events: &'a [Event]) -> Option<&'a [u8]> {
        match &self.end {
            None => None,
            Some(End::Event(e)) => Some(events[*e].seq()),
            Some(End::Cut(seq)) => Some(seq),
        }
    }
}

/// The target rows of one key: events in sequence order → versions.
///
/// An upsert whose tracked values equal the current version's updates it in
/// place (SCD Type 1 tracks nothing, so every upsert does); otherwise it
/// closes the current version at its sequence and opens a new one. A delete
/// closes the current version. With `ignore_null_updates` a null takes the
/// current version's value (after a delete there is none to keep).
/// SCD Type 1 keeps only the open version. A snapshot's cut (`Cut`) closes
/// the open version of a key it did not read, as a delete would.
///
/// A version borrows its values from its event; only values merged under
/// `ignore_null_updates` are copied.
pub fn fold(hc: &HistCodec, events: &[Event]) -> Vec<Version> {
    let ignoring = hc.keep.iter().any(Option::is_some);
    let any_leaves = hc.leaves.contains(&true);
    let mut out = Vec::new();
    let mut cur: Option<Version> = None;
    let mut cuts = hc.cuts.iter().peekable();
    for (i, e) in events.iter().enumerate() {
        // The cuts below this event: each closes the open version unless
        // this event is a read at its position (no event is at a cut).
        while let Some(c) = cuts.next_if(|c| *c.seq < *e.seq()) {
            if !c.at_position(e.seq())
                && let Some(mut v) = cur.take()
            {
                v.end = Some(End::Cut(c.seq.clone()));
                out.push(v);
            }
        }
        if e.is_delete() {
            if let Some(mut v) = cur.take() {
                v.end = Some(End::Event(i));
                out.push(v);
            }
            continue;
        }
        let ev = e.vals();
        let mut unfilled = false;
        let merged: Option<Vals> = match &cur {
            Some(v) if ignoring => {
                let prev = v.vals(events);
                // Struct values reconciled leaf by leaf (none without
                // such columns: no allocation per event then).
                let leaves: Vec<Option<Box<[u8]>>> = if any_leaves {
                    (0..ev.len())
                        .map(|c| hc.merge_leaves(c, prev.get(c), ev.get(c)))
                        .collect()
                } else {
                    Vec::new()
                };
                let leaf = |c: usize| leaves.get(c).and_then(Option::as_deref);
                let merging = (0..ev.len()).any(|c| hc.keeps(c, ev.get(c)) || leaf(c).is_some());
                merging.then(|| {
                    Vals::new(ev.iter().enumerate().map(|(c, b)| {
                        if hc.keeps(c, b) {
                            prev.get(c)
                        } else {
                            leaf(c).unwrap_or(b)
                        }
                    }))
                })
            }
            // A placeholder with no earlier value is a null.
            None if ignoring && (0..ev.len()).any(|c| hc.placeholder(c, ev.get(c))) => {
                unfilled = true;
                Some(Vals::new(ev.iter().enumerate().map(|(c, b)| {
                    if hc.placeholder(c, b) {
                        &*hc.nulls[c]
                    } else {
                        b
                    }
                })))
            }
            _ => None,
        };
        let same = cur.as_ref().is_some_and(|v| {
            let now = merged.as_ref().map_or(ev, Vals::as_ref);
            let was = v.vals(events);
            hc.tracked.iter().all(|&t| was.get(t) == now.get(t))
        });
        match &mut cur {
            Some(v) if same => {
                v.from = i;
                v.merged = merged;
                v.unfilled = unfilled;
                if !hc.scd2 {
                    v.anchor = i;
                }
            }
            _ => {
                if let Some(mut v) = cur.take() {
                    v.end = Some(End::Event(i));
                    out.push(v);
                }
                cur = Some(Version {
                    start: i,
                    end: None,
                    anchor: i,
                    from: i,
                    merged,
                    unfilled,
                });
            }
        }
    }
    // A cut above every event closes what is open.
    if let Some(c) = cuts.next()
        && let Some(mut v) = cur.take()
    {
        v.end = Some(End::Cut(c.seq.clone()));
        out.push(v);
    }
    out.extend(cur);
    if !hc.scd2 {
        out.retain(|v| v.end.is_none());
    }
    out
}

/// Identity of a target row: its values and (SCD Type 2) its interval,
/// hashed in one pass each (a value's bytes are prefixed by their ends, so
/// equal hashes mean equal rows but for a 64-bit collision).
pub(super) fn row_hash(hc: &HistCodec, events: &[Event], v: &Version) -> u64 {
    let vals = xxh3_64(v.vals(events).0);
    if !hc.scd2 {
        return vals;
    }
    let start = xxh3_64_with_seed(events[v.start].seq(), vals);
    match v.end_seq(events) {
        Some(end) => xxh3_64_with_seed(end, start ^ 0x9e37_79b9_7f4a_7c15),
        None => start.rotate_left(17),
    }
}

/// SCD Type 1 with `on_sequence_tie = "error"`: drops the values that can
/// no longer matter. An upsert every non-null value of which a later upsert
/// of the same life (no delete between) overwrites keeps only its sequence
/// and fingerprint (its values become null), so a duplicate arriving later
/// is still recognised. With deterministic ties nothing is dropped: a later
/// change could win a tie against the overwriting upsert (or a delete) and
/// bring the older values back into play.
pub(super) fn prune(hc: &HistCodec, events: &mut [Event]) {
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
            .filter(|&c| !hc.is_null(c, e.vals().get(c)) && !hc.keeps(c, e.vals().get(c)))
            .collect();
        if later_upsert && !nonnull.is_empty() && nonnull.iter().all(|&c| covered[c]) {
            *e = e.with_vals(hc.null_vals.as_ref());
        }
        for c in nonnull {
            // A struct with a null field leaves that field to earlier values.
            if hc.with_null_leaf(c, e.vals().get(c)).is_none() {
                covered[c] = true;
            }
        }
        // A column whose nulls are not ignored is decided by the latest upsert.
        for (c, keep) in hc.keep.iter().enumerate() {
            if keep.is_none() {
                covered[c] = true;
            }
        }
        later_upsert = true;
    }
}

/// Where a key's events are folded again from when a batch's changes fall
/// at `first` of `old` or later: the versions that closed before it are
/// the same whatever follows, and folding `old[from..]` from nothing gives
/// the rest of the key's versions, so a late change to a long history (a
/// hot key) costs the events after `from`, not all of them.
///
/// - With snapshot cuts: 0 (whether a cut closes a version depends on
///   the key's events after it).
/// - SCD Type 2 that ignores no nulls: the first event of the version open
///   just before `first` (or `first` when none is). A version's tracked
///   values are those of each of its events, so its start is found walking
///   back.
/// - Otherwise (a value merged under `ignore_null_updates` may come from
///   any earlier event of the key's life, and SCD Type 1's pruning reads
///   back to the last delete): the last delete before `first`, where the
///   fold and the pruning start afresh (0 when there is none). No change of
///   the batch can tie it: each one's sequence is above `old[first - 1]`'s.
pub(super) fn refold_from(hc: &HistCodec, old: &[Event], first: usize) -> usize {
    if first == 0 {
        return 0;
    }
    let first = first.min(old.len());
    // Whether a cut closes a version depends on the events after it.
    if !hc.cuts.is_empty() {
        return 0;
    }
    if !hc.scd2 || hc.prune || hc.keep.iter().any(Option::is_some) {
        return old[..first].iter().rposition(Event::is_delete).unwrap_or(0);
    }
    if old[first - 1].is_delete() {
        return first;
    }
    let same_tracked = |a: &Event, b: &Event| {
        let (a, b) = (a.vals(), b.vals());
        hc.tracked.iter().all(|&t| a.get(t) == b.get(t))
    };
    let mut j = first - 1;
    while j > 0 && !old[j - 1].is_delete() && same_tracked(&old[j - 1], &old[j]) {
        j -= 1;
    }
    j
}

/// Whether a one-row struct has a null field inside it (at any depth of
/// structs; a null struct field counts, its own fields are not looked at).
fn null_leaf(s: Option<&arrow_array::StructArray>) -> bool {
    use arrow_array::Array;
    let Some(s) = s else { return false };
    s.columns()
        .iter()
        .any(|c| c.is_null(0) || null_leaf(c.as_any().downcast_ref::<arrow_array::StructArray>()))
}

/// Struct `new` (one row) with each null field taken from `prev` (one row,
/// not null), recursing into fields that are structs in both.
fn merge_struct(
    prev: &arrow_array::StructArray,
    new: &arrow_array::StructArray,
) -> Option<ArrayRef> {
    use arrow_array::{Array, StructArray};
    if prev.is_null(0) || new.is_null(0) {
        return None;
    }
    let columns = prev
        .columns()
        .iter()
        .zip(new.columns())
        .map(|(p, n)| {
            if n.is_null(0) {
                return Some(p.clone());
            }
            match (
                p.as_any().downcast_ref::<StructArray>(),
                n.as_any().downcast_ref::<StructArray>(),
            ) {
                (Some(ps), Some(ns)) if !ps.is_null(0) => merge_struct(ps, ns),
                _ => Some(n.clone()),
            }
        })
        .collect::<Option<Vec<ArrayRef>>>()?;
    let merged = StructArray::try_new(new.fields().clone(), columns, new.nulls().cloned()).ok()?;
    Some(std::sync::Arc::new(merged))
}
