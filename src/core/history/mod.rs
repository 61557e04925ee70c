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
use hashbrown::{HashMap, HashTable};

use arrow_array::{Array, ArrayRef, RecordBatch, StructArray, UInt32Array};
use arrow_row::{RowConverter, Rows, SortField};
use arrow_schema::{DataType, SchemaRef};
use arrow_select::take::take;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use crate::core::flow::{END_AT, Flow, START_AT, TiePolicy};
use crate::core::nested;
use crate::core::resolve::{
    BatchStats, Codec, Join, SameSequence, mask, required_null, same_sequence, validate,
};
use crate::core::state::{FileTable, LOOKUP_AHEAD, Loc, hash_key, prefetch};
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
    /// Per value column: the encoded value that keeps the current one (a
    /// null under `ignore_null_updates`; a Debezium flow's placeholder in
    /// its `toasted_columns`), or None: the column's nulls are values.
    keep: Vec<Option<Box<[u8]>>>,
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
            prune: !flow.scd2 && flow.on_tie == TiePolicy::Error,
        })
    }

    fn is_null(&self, col: usize, v: &[u8]) -> bool {
        *self.nulls[col] == *v
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
/// a header (LEB128 of `n << 1 | wide`, one byte below 64 columns), the end
/// offsets of the first `n - 1` values (u16 little-endian, u32 when `wide`;
/// the last ends with the bytes), then the bytes. One allocation per event
/// instead of one per value, and a few header bytes per event: a history
/// flow holds every event of every key, and both bound it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Vals(Box<[u8]>);

impl Vals {
    pub fn new<'a>(vals: impl Iterator<Item = &'a [u8]> + Clone) -> Vals {
        let shape = vals_shape(vals.clone());
        let mut out = Vec::with_capacity(vals_len(shape));
        push_vals(&mut out, vals, shape);
        Vals(out.into_boxed_slice())
    }

    /// A view of the values.
    pub fn as_ref(&self) -> ValsRef<'_> {
        ValsRef(&self.0)
    }

    pub fn len(&self) -> usize {
        self.as_ref().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Value column `c`, encoded.
    pub fn get(&self, c: usize) -> &[u8] {
        self.as_ref().get(c)
    }

    pub fn iter(&self) -> impl Iterator<Item = &[u8]> + Clone + '_ {
        self.as_ref().iter()
    }

    /// Heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.0.len()
    }
}

/// How `vals` lay out: (count, bytes of the values, header, offset width).
fn vals_shape<'a>(vals: impl Iterator<Item = &'a [u8]>) -> (usize, usize, u64, usize) {
    let (n, bytes, last) = vals.fold((0usize, 0usize, 0usize), |(n, b, _), v| {
        (n + 1, b + v.len(), v.len())
    });
    // The last value's end is the end of the bytes: only the others' are kept.
    let wide = bytes - last > u16::MAX as usize;
    (
        n,
        bytes,
        ((n as u64) << 1) | wide as u64,
        if wide { 4 } else { 2 },
    )
}

/// The bytes `push_vals` writes for values of that shape.
fn vals_len((n, bytes, h, w): (usize, usize, u64, usize)) -> usize {
    leb128_len(h) + w * n.saturating_sub(1) + bytes
}

/// Appends `vals` (of shape `shape`, `vals_shape`) in `Vals`' layout.
fn push_vals<'a>(
    out: &mut Vec<u8>,
    vals: impl Iterator<Item = &'a [u8]> + Clone,
    (n, _, h, w): (usize, usize, u64, usize),
) {
    push_leb128(out, h);
    let mut end = 0usize;
    for v in vals.clone().take(n.saturating_sub(1)) {
        end += v.len();
        out.extend_from_slice(&end.to_le_bytes()[..w]);
    }
    for v in vals {
        out.extend_from_slice(v);
    }
}

fn leb128_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

fn push_leb128(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// (value, bytes read) of the LEB128 at the start of `b`.
#[inline]
fn read_leb128(b: &[u8]) -> (u64, usize) {
    if b[0] < 0x80 {
        return (b[0] as u64, 1);
    }
    let (mut v, mut shift) = (0u64, 0);
    for (i, &x) in b.iter().enumerate() {
        v |= ((x & 0x7f) as u64) << shift;
        if x < 0x80 {
            return (v, i + 1);
        }
        shift += 7;
    }
    panic!("a truncated LEB128 in encoded values")
}

/// The encoded value columns of one change, borrowed (`Vals`' layout).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ValsRef<'a>(&'a [u8]);

impl<'a> ValsRef<'a> {
    /// (columns, offset width, header bytes).
    #[inline]
    fn header(&self) -> (usize, usize, usize) {
        if self.0.is_empty() {
            return (0, 2, 0);
        }
        let (h, at) = read_leb128(self.0);
        ((h >> 1) as usize, if h & 1 == 1 { 4 } else { 2 }, at)
    }

    /// The end of value `i` (of the first `n - 1`) at offset width `w`
    /// after a header of `at` bytes.
    #[inline]
    fn end(&self, at: usize, w: usize, i: usize) -> usize {
        let o = at + w * i;
        if w == 2 {
            u16::from_le_bytes([self.0[o], self.0[o + 1]]) as usize
        } else {
            u32::from_le_bytes(self.0[o..o + 4].try_into().expect("4 bytes")) as usize
        }
    }

    pub fn len(&self) -> usize {
        self.header().0
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Value column `c`, encoded.
    #[inline]
    pub fn get(&self, c: usize) -> &'a [u8] {
        let (n, w, at) = self.header();
        assert!(c < n, "value column {c} of {n}");
        let data = at + w * (n - 1);
        let start = if c == 0 { 0 } else { self.end(at, w, c - 1) };
        let end = if c == n - 1 {
            self.0.len() - data
        } else {
            self.end(at, w, c)
        };
        &self.0[data + start..data + end]
    }

    /// The values in order (the header read once).
    #[inline]
    pub fn iter(self) -> impl Iterator<Item = &'a [u8]> + Clone {
        let (n, w, at) = self.header();
        let data = at + w * n.saturating_sub(1);
        (0..n).scan(0usize, move |start, c| {
            let end = if c + 1 == n {
                self.0.len() - data
            } else {
                self.end(at, w, c)
            };
            let v = &self.0[data + *start..data + end];
            *start = end;
            Some(v)
        })
    }

    /// The bytes of the values, without the header.
    pub fn value_bytes(&self) -> usize {
        let (n, w, at) = self.header();
        self.0.len() - at - w * n.saturating_sub(1)
    }

    /// The values, owned.
    pub fn to_owned(self) -> Vals {
        Vals(self.0.into())
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

/// One applied change of a key, in one allocation.
///
/// A history flow holds every event of every key, so an event's size is
/// the state's size: the struct is one pointer and length, and the bytes
/// hold, in order, the flags (u8), the fingerprint (u64), the location
/// (file and position, u32 each; zero unless `LOCATED`), the delete time
/// (i64, only when `DELETED`), the sequence's length (LEB128, one byte
/// below 128), the row-encoded sequence (`Codec::seqs`), then the encoded value
/// columns (`Vals`' layout). Integers are little-endian.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    data: Box<[u8]>,
}

/// `Event::flags`: a delete.
const DELETED: u8 = 1;
/// `Event::flags`: `loc` is known.
const LOCATED: u8 = 2;
/// `Event::flags`: changed since the last state commit (new, or its
/// location, values or fingerprint moved): an appending history writes
/// only these.
const CHANGED: u8 = 4;

/// Where an event's fingerprint, location and delete time sit.
const FP_AT: usize = 1;
const LOC_AT: usize = 9;
const DELETED_AT: usize = 17;

impl Event {
    pub fn new<'a>(
        seq: &[u8],
        vals: impl Iterator<Item = &'a [u8]> + Clone,
        fp: u64,
        deleted_at_ms: Option<i64>,
        loc: Option<Loc>,
    ) -> Event {
        let head = DELETED_AT + if deleted_at_ms.is_some() { 8 } else { 0 };
        let shape = vals_shape(vals.clone());
        let seq_head = leb128_len(seq.len() as u64);
        let mut data = Vec::with_capacity(head + seq_head + seq.len() + vals_len(shape));
        data.push(if deleted_at_ms.is_some() { DELETED } else { 0 });
        data.extend_from_slice(&fp.to_le_bytes());
        data.extend_from_slice(&[0; 8]);
        if let Some(t) = deleted_at_ms {
            data.extend_from_slice(&t.to_le_bytes());
        }
        push_leb128(&mut data, seq.len() as u64);
        data.extend_from_slice(seq);
        push_vals(&mut data, vals, shape);
        let mut e = Event {
            data: data.into_boxed_slice(),
        };
        e.set_loc(loc);
        e
    }

    #[inline]
    fn flags(&self) -> u8 {
        self.data[0]
    }

    fn u64_at(&self, at: usize) -> u64 {
        u64::from_le_bytes(self.data[at..at + 8].try_into().expect("8 bytes"))
    }

    /// (start, length) of the sequence.
    #[inline]
    fn seq_span(&self) -> (usize, usize) {
        let at = DELETED_AT + 8 * (self.flags() & DELETED != 0) as usize;
        let (len, head) = read_leb128(&self.data[at..]);
        (at + head, len as usize)
    }

    /// Fingerprint of the whole change: decides ties, spots duplicates.
    #[inline]
    pub fn fp(&self) -> u64 {
        self.u64_at(FP_AT)
    }

    /// The row-encoded sequence (`Codec::seqs`).
    #[inline]
    pub fn seq(&self) -> &[u8] {
        let (at, len) = self.seq_span();
        &self.data[at..at + len]
    }

    /// The value columns, encoded (`HistCodec`).
    #[inline]
    pub fn vals(&self) -> ValsRef<'_> {
        let (at, len) = self.seq_span();
        ValsRef(&self.data[at + len..])
    }

    /// The same change with other values.
    fn with_vals(&self, vals: ValsRef<'_>) -> Event {
        let mut e = Event::new(
            self.seq(),
            vals.iter(),
            self.fp(),
            self.deleted_at_ms(),
            self.loc(),
        );
        e.data[0] = self.flags();
        e
    }

    #[inline]
    pub fn is_delete(&self) -> bool {
        self.flags() & DELETED != 0
    }

    /// Commit time of a delete; None for an upsert.
    pub fn deleted_at_ms(&self) -> Option<i64> {
        self.is_delete().then(|| self.u64_at(DELETED_AT) as i64)
    }

    /// Where the target row this event anchors sits: the version it opens
    /// (SCD Type 2) or the current row it last updated (SCD Type 1).
    pub fn loc(&self) -> Option<Loc> {
        (self.flags() & LOCATED != 0).then(|| {
            let l = self.u64_at(LOC_AT);
            Loc {
                file: l as u32,
                pos: (l >> 32) as u32,
            }
        })
    }

    pub fn set_loc(&mut self, loc: Option<Loc>) {
        let (l, flag) = match loc {
            Some(l) => ((l.pos as u64) << 32 | l.file as u64, LOCATED),
            None => (0, 0),
        };
        self.data[LOC_AT..LOC_AT + 8].copy_from_slice(&l.to_le_bytes());
        self.data[0] = (self.data[0] & !LOCATED) | flag;
    }

    /// Changed since the last state commit.
    pub fn changed(&self) -> bool {
        self.flags() & CHANGED != 0
    }

    pub fn set_changed(&mut self, changed: bool) {
        if changed {
            self.data[0] |= CHANGED;
        } else {
            self.data[0] &= !CHANGED;
        }
    }

    /// The same change at the same place, whether or not either is marked
    /// changed.
    fn same_as(&self, other: &Event) -> bool {
        self.data[1..] == other.data[1..] && (self.flags() | CHANGED) == (other.flags() | CHANGED)
    }

    /// Heap and inline bytes held.
    pub fn bytes(&self) -> usize {
        std::mem::size_of::<Event>() + self.data.len()
    }
}

/// The history of every key. Keys are row-encoded (`Codec::keys`).
///
/// Keys live in slots (a `Vec`) found through a hash table of slot
/// numbers, so a plan names the slot of each key it read and the dirty
/// list holds slot numbers: applying a batch and writing its state delta
/// hash no key again.
#[derive(Debug, Default, Clone)]
pub struct History {
    /// Slot numbers, hashed by their key (`hash_key`).
    table: HashTable<u32>,
    slots: Vec<Slot>,
    pub files: FileTable,
    /// Slots with a changed event, each once, with a bound below which
    /// none of its events changed: a commit's state delta, and clearing it,
    /// visit what changed, not a hot key's whole history.
    dirty: Vec<Dirty>,
    /// A bit per slot: listed in `dirty` (a bit, not a field of `Slot`:
    /// a history holds a slot per key).
    listed: Vec<u64>,
    /// Where each listed slot is in `dirty`: made when a listed slot
    /// changes again before the list is cleared (several batches in one
    /// commit), dropped with the list.
    dirty_at: Option<HashMap<u32, u32>>,
    /// The slots from this one on were made since the dirty list was last
    /// cleared (a commit): new keys, or keys put again after their
    /// tombstone was collected. Their rows in the state log start them.
    new_from: u32,
    events: usize,
    /// Keys whose latest event is an upsert (`live`), and the bytes of the
    /// keys and events held (`heap_bytes`): kept as they change, because
    /// the service reads both after every commit and a count would visit
    /// every event of the state.
    live: usize,
    held: usize,
    /// At most the delete time of every key whose latest event is a delete
    /// (none: no such key), so `gc_tombstones` costs nothing while none can
    /// have expired; exact after each of its scans.
    oldest_tombstone_ms: Option<i64>,
}

/// A slot with a changed event, none before `first`.
#[derive(Debug, Clone, Copy)]
struct Dirty {
    slot: u32,
    first: u32,
}

#[derive(Debug, Clone)]
struct Slot {
    key: Box<[u8]>,
    /// Exactly as many as held: a history holds a slot per key, and a
    /// vector's spare room was a tenth of the state.
    events: Box<[Event]>,
}

impl History {
    /// An empty history.
    pub fn new() -> History {
        History::default()
    }

    /// The slot of `key`.
    pub fn slot(&self, key: &[u8]) -> Option<u32> {
        self.slot_hashed(hash_key(key), key)
    }

    /// The slot of `key`, whose `hash_key` is `hash`.
    fn slot_hashed(&self, hash: u64, key: &[u8]) -> Option<u32> {
        let slots = &self.slots;
        self.table
            .find(hash, |&i| *slots[i as usize].key == *key)
            .copied()
    }

    pub fn get(&self, key: &[u8]) -> Option<&[Event]> {
        self.slot(key).map(|i| &*self.slots[i as usize].events)
    }

    /// Reading a key's events is a chain of cache misses (its slot, then
    /// its key and list of events, then each event); a walk over keys in
    /// no order of their slots asks for each link some keys ahead, so the
    /// misses of several keys overlap. These start loading one link
    /// without waiting for it (`state::prefetch`); none changes anything.
    ///
    /// Link 1: the slot of any key whose hash looks like `hash`.
    #[inline]
    pub fn prefetch_slot_of(&self, hash: u64) {
        let _ = self.table.find(hash, |&i| {
            prefetch(&self.slots[i as usize]);
            false
        });
    }

    /// Link 2: the key and the event list of the slots link 1 loaded.
    #[inline]
    pub fn prefetch_key_of(&self, hash: u64) {
        let _ = self.table.find(hash, |&i| {
            prefetch_lists(&self.slots[i as usize]);
            false
        });
    }

    /// The events of `slot` (from `slot`).
    pub fn at(&self, slot: u32) -> &[Event] {
        &self.slots[slot as usize].events
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Events kept, over all keys.
    pub fn events(&self) -> usize {
        self.events
    }

    /// Keys whose latest event is an upsert.
    pub fn live(&self) -> usize {
        self.live
    }

    /// Replaces the events of `key` from index `from` on with `events`
    /// (sorted by sequence, after those before `from`) and marks it dirty;
    /// each event that differs from the one it replaces (or is new) is
    /// marked changed. `hint`: the key's slot when it was read (`slot`),
    /// checked before it is used.
    ///
    /// A key is dirty (listed once in `dirty`) while it has a changed event.
    pub fn put(&mut self, hint: Option<u32>, key: Box<[u8]>, from: usize, events: Vec<Event>) {
        debug_assert!(events.windows(2).all(|w| w[0].seq() < w[1].seq()));
        match self.hinted(hint, &key).or_else(|| self.slot(&key)) {
            Some(i) => {
                let put = replace(&mut self.slots[i as usize], from, events);
                self.count_put(i, put);
            }
            None => self.put_new(key, from, events),
        }
    }

    /// `hint` when it is the slot of `key`.
    fn hinted(&self, hint: Option<u32>, key: &[u8]) -> Option<u32> {
        hint.filter(|&i| self.slots.get(i as usize).is_some_and(|s| *s.key == *key))
    }

    /// `put` for a key with no slot: a new slot with every event changed.
    fn put_new(&mut self, key: Box<[u8]>, from: usize, mut events: Vec<Event>) {
        debug_assert_eq!(from, 0, "a new key has no events before");
        events.iter_mut().for_each(|e| e.set_changed(true));
        let first = (!events.is_empty()).then_some(0);
        let i = u32::try_from(self.slots.len()).expect("fewer than 2^32 keys");
        let put = Put {
            events: events.len() as isize,
            held: (key.len() + events.iter().map(Event::bytes).sum::<usize>()) as isize,
            live: is_live(&events) as isize,
            tombstone_ms: events.last().and_then(Event::deleted_at_ms),
            first,
            kept: 0,
        };
        self.slots.push(Slot {
            key,
            events: events.into_boxed_slice(),
        });
        index_slot(&mut self.table, &self.slots, i);
        self.count_put(i, put);
    }

    /// Takes in what `replace` (or `put_new`) did to slot `i`: the counts,
    /// the oldest tombstone, the dirty list.
    fn count_put(&mut self, i: u32, put: Put) {
        self.events = self.events.wrapping_add_signed(put.events);
        self.held = self.held.wrapping_add_signed(put.held);
        self.live = self.live.wrapping_add_signed(put.live);
        if let Some(t) = put.tombstone_ms {
            self.oldest_tombstone_ms = Some(self.oldest_tombstone_ms.map_or(t, |o| o.min(t)));
        }
        self.mark_dirty(i, put.first, put.kept);
    }

    /// Lists `slot` as dirty once an event of it changed, `first` the
    /// first that did (None: none did); its events before `kept` are as
    /// they were (so a listed slot's bound stays within its events).
    fn mark_dirty(&mut self, slot: u32, first: Option<usize>, kept: usize) {
        let (word, bit) = (slot as usize / 64, 1u64 << (slot % 64));
        let listed = self.listed.get(word).is_some_and(|w| w & bit != 0);
        let first = match first {
            Some(f) => f,
            None if listed => kept,
            None => return,
        };
        let first = u32::try_from(first).expect("fewer than 2^32 events per key");
        if !listed {
            if self.listed.len() <= word {
                self.listed.resize(word + 1, 0);
            }
            self.listed[word] |= bit;
            if let Some(at) = &mut self.dirty_at {
                at.insert(slot, self.dirty.len() as u32);
            }
            self.dirty.push(Dirty { slot, first });
            return;
        }
        let dirty = &self.dirty;
        let at = self.dirty_at.get_or_insert_with(|| {
            dirty
                .iter()
                .enumerate()
                .map(|(j, d)| (d.slot, j as u32))
                .collect()
        });
        let d = &mut self.dirty[at[&slot] as usize];
        d.first = d.first.min(first);
    }

    /// Moves target rows: every event whose `loc` `to` maps elsewhere takes
    /// the new location, and its key is marked dirty (a compaction rewrote
    /// the row's file). Returns how many moved.
    pub fn relocate(&mut self, mut to: impl FnMut(Loc) -> Option<Loc>) -> usize {
        let mut moved = 0;
        for i in 0..self.slots.len() {
            let mut first = None;
            for (j, e) in self.slots[i].events.iter_mut().enumerate() {
                if let Some(new) = e.loc().and_then(&mut to).filter(|n| Some(*n) != e.loc()) {
                    e.set_loc(Some(new));
                    e.set_changed(true);
                    first = first.or(Some(j));
                    moved += 1;
                }
            }
            let kept = self.slots[i].events.len();
            self.mark_dirty(i as u32, first, kept);
        }
        moved
    }

    /// Forgets the data files no event points into, renumbering the others
    /// (see `KeyIndex::shrink_files`). Returns how many went.
    pub fn shrink_files(&mut self) -> usize {
        let mut used = vec![false; self.files.len()];
        for e in self.slots.iter().flat_map(|s| &s.events) {
            if let Some(l) = e.loc() {
                used[l.file as usize] = true;
            }
        }
        let unused = used.iter().filter(|u| !**u).count();
        if unused == 0 {
            return 0;
        }
        let map = self.files.retain(&used);
        for e in self.slots.iter_mut().flat_map(|s| s.events.iter_mut()) {
            if let Some(mut l) = e.loc() {
                l.file = map[l.file as usize];
                e.set_loc(Some(l));
            }
        }
        unused
    }

    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[Event])> + '_ {
        self.slots.iter().map(|s| (&*s.key, &*s.events))
    }

    /// (slot, key, events) of every key.
    pub fn iter_slots(&self) -> impl Iterator<Item = (u32, &[u8], &[Event])> + '_ {
        self.slots
            .iter()
            .enumerate()
            .map(|(i, s)| (i as u32, &*s.key, &*s.events))
    }

    /// The keys with a changed event, each once, with what the next state
    /// commit writes of each (unless whole): `(key, events, starts)`.
    /// - `starts`: every event of the key, each written, marked as where
    ///   the key's events start (rows of earlier commits are not the
    ///   key's): a key whose slot was made since the last commit (new, or
    ///   put again after its tombstone was collected).
    /// - otherwise its events from its first changed event on, of which
    ///   the changed are written: the key's other events are in the log.
    pub fn dirty(&self) -> impl Iterator<Item = (&[u8], &[Event], bool)> + '_ {
        self.dirty_part(0, usize::MAX)
    }

    /// Those of `dirty` from the `skip`th key on, at most `take` keys: the
    /// skipped ones are not read.
    pub fn dirty_part(
        &self,
        skip: usize,
        take: usize,
    ) -> impl Iterator<Item = (&[u8], &[Event], bool)> + '_ {
        let list = self.dirty.get(skip..).unwrap_or_default();
        list.iter().take(take).map(|d| {
            let s = &self.slots[d.slot as usize];
            let starts = d.slot >= self.new_from;
            let from = if starts { 0 } else { d.first as usize };
            (&*s.key, &s.events[from..], starts)
        })
    }

    /// The keys the next state commit writes rows of (unless whole).
    pub fn dirty_keys(&self) -> usize {
        self.dirty.len()
    }

    /// The rows the next state commit writes (unless whole).
    pub fn dirty_len(&self) -> usize {
        self.dirty()
            .map(|(_, e, starts)| {
                if starts {
                    e.len()
                } else {
                    e.iter().filter(|e| e.changed()).count()
                }
            })
            .sum()
    }

    pub fn clear_dirty(&mut self) {
        self.new_from = u32::try_from(self.slots.len()).expect("fewer than 2^32 keys");
        for d in std::mem::take(&mut self.dirty) {
            self.listed[d.slot as usize / 64] &= !(1u64 << (d.slot % 64));
            let s = &mut self.slots[d.slot as usize];
            s.events[d.first as usize..]
                .iter_mut()
                .for_each(|e| e.set_changed(false));
        }
        self.dirty_at = None;
    }

    /// SCD Type 1: forgets keys whose latest change is a delete committed
    /// before `cutoff_ms` (like a collected tombstone: a late older change
    /// for the key is applied again). Returns how many. Costs nothing while
    /// no tombstone can have expired (every commit calls it); otherwise one
    /// pass, and a second to drop the expired.
    pub fn gc_tombstones(&mut self, cutoff_ms: i64) -> usize {
        if self.oldest_tombstone_ms.is_none_or(|o| o >= cutoff_ms) {
            return 0;
        }
        let tombstone = |s: &Slot| s.events.last().and_then(Event::deleted_at_ms);
        let gone = |s: &Slot| tombstone(s).is_some_and(|t| t < cutoff_ms);
        self.oldest_tombstone_ms = self
            .slots
            .iter()
            .filter_map(tombstone)
            .filter(|&t| t >= cutoff_ms)
            .min();
        if !self.slots.iter().any(gone) {
            return 0;
        }
        let before = self.slots.len();
        let (mut dropped, mut bytes) = (0, 0);
        // Slots keep their order: those made since the last commit stay last.
        let (mut at, mut old_kept, new_from) = (0, 0, self.new_from);
        self.slots.retain(|s| {
            let g = gone(s);
            if g {
                dropped += s.events.len();
                bytes += s.key.len() + s.events.iter().map(Event::bytes).sum::<usize>();
            } else if at < new_from {
                old_kept += 1;
            }
            at += 1;
            !g
        });
        self.new_from = old_kept;
        // A dropped key's latest event is a delete: it was not live.
        self.events -= dropped;
        self.held -= bytes;
        // Slots moved: number them again (a key put again before the next
        // commit is listed anew).
        self.table.clear();
        for i in 0..self.slots.len() as u32 {
            index_slot(&mut self.table, &self.slots, i);
        }
        // A slot is listed while it has a changed event.
        self.dirty.clear();
        self.dirty_at = None;
        self.listed.iter_mut().for_each(|w| *w = 0);
        for i in 0..self.slots.len() as u32 {
            let events = &self.slots[i as usize].events;
            let (first, kept) = (events.iter().position(Event::changed), events.len());
            self.mark_dirty(i, first, kept);
        }
        before - self.slots.len()
    }

    /// An estimate of the memory the history holds: what it allocated,
    /// spare capacity included (not the allocator's rounding).
    pub fn heap_bytes(&self) -> usize {
        self.table.capacity() * (std::mem::size_of::<u32>() + 1)
            + self.slots.capacity() * std::mem::size_of::<Slot>()
            + self.dirty.capacity() * std::mem::size_of::<Dirty>()
            + self.dirty_at.as_ref().map_or(0, |m| m.capacity() * 9)
            + self.listed.capacity() * std::mem::size_of::<u64>()
            + self.held
    }

    /// Checks the kept counts against a count over every slot, and the
    /// dirty list against the changed events (tests).
    pub fn check_counts(&self) {
        let slots = &self.slots;
        assert!(self.new_from as usize <= slots.len());
        assert_eq!(
            self.events,
            slots.iter().map(|s| s.events.len()).sum::<usize>()
        );
        assert_eq!(
            self.live,
            slots.iter().filter(|s| is_live(&s.events)).count()
        );
        let held: usize = slots
            .iter()
            .map(|s| s.key.len() + s.events.iter().map(Event::bytes).sum::<usize>())
            .sum();
        assert_eq!(self.held, held);
        // Every slot with a changed event is listed once, none of its
        // events before its bound changed.
        let mut listed = vec![false; slots.len()];
        for (j, d) in self.dirty.iter().enumerate() {
            let (i, first) = (d.slot as usize, d.first as usize);
            assert!(!listed[i], "slot {i} listed twice");
            listed[i] = true;
            assert!(self.listed[i / 64] & (1 << (i % 64)) != 0);
            if let Some(at) = &self.dirty_at {
                assert_eq!(at.get(&d.slot), Some(&(j as u32)));
            }
            assert!(first <= slots[i].events.len());
            assert!(!slots[i].events[..first].iter().any(Event::changed));
        }
        for (i, s) in slots.iter().enumerate() {
            assert!(
                listed[i] || !s.events.iter().any(Event::changed),
                "slot {i} has a changed event and is not listed"
            );
        }
    }

    /// The bytes of the encoded values among `heap_bytes` (what remains is
    /// the state's own overhead: keys, sequences, fingerprints, locations,
    /// headers, the index).
    pub fn value_bytes(&self) -> usize {
        self.slots
            .iter()
            .flat_map(|s| &s.events)
            .map(|e| e.vals().value_bytes())
            .sum()
    }
}

/// Whether a key with these events has a row: its latest event is an upsert.
fn is_live(events: &[Event]) -> bool {
    events.last().is_some_and(|e| !e.is_delete())
}

/// Lists slot `i` in `table` under its key's hash.
fn index_slot(table: &mut HashTable<u32>, slots: &[Slot], i: u32) {
    table.insert_unique(hash_key(&slots[i as usize].key), i, |&j| {
        hash_key(&slots[j as usize].key)
    });
}

/// What `replace` did to a slot, for the history's counts (`count_put`):
/// the change in events, bytes held and live keys; the key's delete time
/// if its latest event is a delete; the first changed event (None: none)
/// and how many events before it are as they were.
#[derive(Debug, Clone, Copy)]
struct Put {
    events: isize,
    held: isize,
    live: isize,
    tombstone_ms: Option<i64>,
    first: Option<usize>,
    kept: usize,
}

/// Replaces the events of slot `s` from index `from` on with `events`
/// (sorted by sequence, after those before `from`); each event that
/// differs from the one it replaces (or is new) is marked changed. Touches
/// only `s`: slots are replaced on two threads (`apply`).
fn replace(s: &mut Slot, from: usize, mut events: Vec<Event>) -> Put {
    debug_assert!(from <= s.events.len(), "a plan applies to its history");
    let from = from.min(s.events.len());
    let live_was = is_live(&s.events) as isize;
    let held_was = s.events[from..].iter().map(Event::bytes).sum::<usize>() as isize;
    let held_now = events.iter().map(Event::bytes).sum::<usize>() as isize;
    mark_changed(&s.events[from..], &mut events);
    // The events before `from` are as they were: one of them changed only
    // in a slot already dirty.
    let first = events.iter().position(Event::changed).map(|j| from + j);
    let count = events.len() as isize - (s.events.len() - from) as isize;
    let mut kept = std::mem::take(&mut s.events).into_vec();
    kept.truncate(from);
    kept.reserve_exact(events.len());
    kept.extend(events);
    s.events = kept.into_boxed_slice();
    debug_assert!(s.events.windows(2).all(|w| w[0].seq() < w[1].seq()));
    Put {
        events: count,
        held: held_now - held_was,
        live: is_live(&s.events) as isize - live_was,
        tombstone_ms: s.events.last().and_then(Event::deleted_at_ms),
        first,
        kept: from,
    }
}

/// Marks each of `new` changed that is not in `old` as it is there (both
/// sorted by sequence); a change not yet committed stays marked.
fn mark_changed(old: &[Event], new: &mut [Event]) {
    let mut o = old.iter().peekable();
    for e in new.iter_mut() {
        while o.next_if(|x| x.seq() < e.seq()).is_some() {}
        if !o.peek().is_some_and(|x| x.same_as(e)) {
            e.set_changed(true);
        }
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
    /// Event whose values the row has, unless `merged`.
    from: usize,
    /// Values merged from several upserts (`ignore_null_updates`).
    merged: Option<Vals>,
}

impl Version {
    /// The row's values (`events`: those it was folded from).
    pub fn vals<'a>(&'a self, events: &'a [Event]) -> ValsRef<'a> {
        match &self.merged {
            Some(v) => v.as_ref(),
            None => events[self.from].vals(),
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
/// SCD Type 1 keeps only the open version.
///
/// A version borrows its values from its event; only values merged under
/// `ignore_null_updates` are copied.
pub fn fold(hc: &HistCodec, events: &[Event]) -> Vec<Version> {
    let ignoring = hc.keep.iter().any(Option::is_some);
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
        let ev = e.vals();
        let merged: Option<Vals> = match &cur {
            Some(v) if ignoring && (0..ev.len()).any(|c| hc.keeps(c, ev.get(c))) => {
                let prev = v.vals(events);
                Some(Vals::new(
                    ev.iter().enumerate().map(
                        |(c, b)| {
                            if hc.keeps(c, b) { prev.get(c) } else { b }
                        },
                    ),
                ))
            }
            // A placeholder with no earlier value is a null.
            None if ignoring && (0..ev.len()).any(|c| hc.placeholder(c, ev.get(c))) => {
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
                    from: i,
                    merged,
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

/// Identity of a target row: its values and (SCD Type 2) its interval,
/// hashed in one pass each (a value's bytes are prefixed by their ends, so
/// equal hashes mean equal rows but for a 64-bit collision).
fn row_hash(hc: &HistCodec, events: &[Event], v: &Version) -> u64 {
    let vals = xxh3_64(v.vals(events).0);
    if !hc.scd2 {
        return vals;
    }
    let start = xxh3_64_with_seed(events[v.start].seq(), vals);
    match v.end {
        Some(e) => xxh3_64_with_seed(events[e].seq(), start ^ 0x9e37_79b9_7f4a_7c15),
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
            .filter(|&c| !hc.is_null(c, e.vals().get(c)) && !hc.keeps(c, e.vals().get(c)))
            .collect();
        if later_upsert && !nonnull.is_empty() && nonnull.iter().all(|&c| covered[c]) {
            *e = e.with_vals(hc.null_vals.as_ref());
        }
        for c in nonnull {
            covered[c] = true;
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
    /// The key's slot in the history planned against (`History::slot`).
    pub slot: Option<u32>,
    pub key: Box<[u8]>,
    /// `events` replace the key's events from this index on.
    pub from: usize,
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
        vals: v.vals(events).to_owned(),
        start: Some(events[v.start].seq().into()),
        end: v.end.map(|e| events[e].seq().into()),
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
    let changes = Changes {
        flow,
        hc,
        seqs: &seqs,
        vals: &vals,
        fps: &fps,
        deleted: |i: usize| {
            is_delete.as_ref().is_some_and(|d| d.value(i))
                || forced_deletes.is_some_and(|d| d.value(i))
        },
        now_ms,
    };

    let mut plan = Plan {
        stats: BatchStats {
            rows_in: n as u64,
            ..Default::default()
        },
        ..Default::default()
    };
    // Per key, reused: its rows in sequence order, and their places.
    let (mut by_seq, mut ats): (Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new());
    let groups = rows_by_key(&keys);
    // Every key's slot first, in a loop of lookups only, so the cache
    // misses of one key's lookup overlap the next's.
    let ahead = |n: usize| groups.keys.get(n).map(|g| g.hash);
    let slots: Vec<Option<u32>> = (groups.keys.iter().enumerate())
        .map(|(n, g)| {
            if let Some(h) = ahead(n + 2 * LOOKUP_AHEAD) {
                hist.prefetch_slot_of(h);
            }
            if let Some(h) = ahead(n + LOOKUP_AHEAD) {
                hist.prefetch_key_of(h);
            }
            hist.slot_hashed(g.hash, g.key)
        })
        .collect();
    for (n, (g, &slot)) in groups.keys.iter().zip(&slots).enumerate() {
        prefetch_ahead(&hist.slots, |m| slots.get(m).copied().flatten(), n);
        let (key, rows) = (g.key, &groups.rows[g.rows.clone()]);
        let whole: &[Event] = slot.map_or(&[], |i| hist.at(i));
        // Where each row goes among the key's events: found in sequence
        // order, each search starting where the last ended.
        by_seq.clear();
        by_seq.extend(0..rows.len());
        if rows.len() > 1 {
            by_seq.sort_by(|&a, &b| seqs.row(rows[a]).cmp(&seqs.row(rows[b])));
        }
        ats.clear();
        ats.resize(rows.len(), 0);
        let mut lo = 0;
        for &r in &by_seq {
            lo = seek(whole, lo, seqs.row(rows[r]).data());
            ats[r] = lo;
        }
        // Only the events from where the fold may change are copied,
        // changed and folded again (`refold_from`).
        let first = by_seq.first().map_or(0, |&r| ats[r]);
        let from = refold_from(hc, whole, first);
        let old = &whole[from..];
        ats.iter_mut().for_each(|at| *at -= from);
        let mut events = place_rows(&changes, old, rows, &ats, &mut plan.stats)?;
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
            slot,
            key: key.into(),
            from,
            events,
            pending,
        });
    }

    check_required(flow, hc, &keys, &plan.inserts)?;
    plan.remove_positions.sort_unstable();
    Ok(plan)
}

/// A batch's changes, row-encoded, as `place_rows` reads them.
struct Changes<'a, D> {
    flow: &'a Flow,
    hc: &'a HistCodec,
    seqs: &'a Rows,
    vals: &'a [Rows],
    fps: &'a [u64],
    /// Whether row `i` is a delete.
    deleted: D,
    /// The commit time a delete records.
    now_ms: i64,
}

impl<'a, D: Fn(usize) -> bool> Changes<'a, D> {
    fn seq(&self, i: usize) -> &'a [u8] {
        self.seqs.row(i).data()
    }

    /// Row `i` as an event (no location yet).
    fn event(&self, i: usize) -> Event {
        Event::new(
            self.seq(i),
            self.vals.iter().map(|r| r.row(i).data()),
            self.fps[i],
            (self.deleted)(i).then_some(self.now_ms),
            None,
        )
    }

    /// Whether row `i` takes the place of `other`, the event at its
    /// sequence (`same_sequence`); counts duplicates and ties.
    fn takes_place(&self, i: usize, other: &Event, stats: &mut BatchStats) -> Result<bool> {
        Ok(
            match same_sequence(
                self.flow,
                i,
                (self.fps[i], (self.deleted)(i)),
                other.fp(),
                other.is_delete(),
            )? {
                SameSequence::ReplacesSentinel => true,
                SameSequence::Duplicate => {
                    stats.duplicates += 1;
                    false
                }
                SameSequence::Tie { wins } => {
                    stats.ties += 1;
                    if !wins {
                        stats.tie_losers += 1;
                    }
                    wins
                }
            },
        )
    }

    /// Counts row `i`, which took a place: stale (behind a delete), a
    /// delete or an upsert.
    fn count(&self, i: usize, stale: bool, stats: &mut BatchStats) {
        if stale {
            stats.stale += 1;
        } else if (self.deleted)(i) {
            stats.deletes += 1;
        } else {
            stats.upserts += 1;
        }
    }
}

/// `place_rows` for a key's only row in the batch (most keys' case), with
/// no map.
fn place_one(
    changes: &Changes<'_, impl Fn(usize) -> bool>,
    old: &[Event],
    i: usize,
    at: usize,
    stats: &mut BatchStats,
) -> Result<Vec<Event>> {
    let seq = changes.seq(i);
    let here = old.get(at).filter(|e| e.seq() == seq);
    let mut stale = false;
    if let Some(e) = here {
        if !changes.takes_place(i, e, stats)? {
            return Ok(old.to_vec());
        }
    } else {
        stale = !changes.hc.scd2 && old[at..].iter().any(Event::is_delete);
    }
    changes.count(i, stale, stats);
    let mut events = Vec::with_capacity(old.len() + 1);
    events.extend_from_slice(&old[..at]);
    events.push(changes.event(i));
    events.extend_from_slice(&old[at + here.is_some() as usize..]);
    Ok(events)
}

/// The first of `events[lo..]` whose sequence is not below `seq`, every
/// event before `lo` being below it: a gallop from `lo`, so a run of
/// ascending searches over a long history (a hot key's) costs the log of
/// each distance, not of the whole.
fn seek(events: &[Event], mut lo: usize, seq: &[u8]) -> usize {
    let mut step = 1;
    loop {
        let probe = lo + step - 1;
        if probe >= events.len() || events[probe].seq() >= seq {
            let hi = probe.min(events.len());
            return lo + events[lo..hi].partition_point(|e| e.seq() < seq);
        }
        lo = probe + 1;
        step *= 2;
    }
}

/// A key's batch `rows` placed among its events `old` (those from the
/// refold point on; `ats[r]`: where `rows[r]`'s sequence falls among them):
/// the events after, in sequence order. Rows are taken
/// in batch order; a row meeting an event at its sequence (old, or an
/// earlier row's) is a duplicate, a tie or replaces a sentinel
/// (`same_sequence`). SCD Type 1: a row older than a delete changes
/// nothing now and counts stale (it is kept in case a tie displaces that
/// delete). Counts into `stats`.
///
/// The rows go into a map by sequence and are merged with `old` in one
/// pass, so a long history (a hot key's, rows arriving out of order)
/// costs O(events + rows log rows), where inserting each row into the
/// events cost O(events) per row.
fn place_rows<'a>(
    changes: &Changes<'a, impl Fn(usize) -> bool>,
    old: &'a [Event],
    rows: &[usize],
    ats: &[usize],
    stats: &mut BatchStats,
) -> Result<Vec<Event>> {
    use std::collections::{BTreeMap, BTreeSet};
    use std::ops::Bound::{Excluded, Unbounded};
    if let (&[i], &[at]) = (rows, ats) {
        return place_one(changes, old, i, at, stats);
    }
    let mut new: BTreeMap<&[u8], Event> = BTreeMap::new();
    // SCD Type 1: the sequences of the batch's deletes placed so far, and
    // (made when first needed) the first delete of `old[j..]` per `j`.
    let mut new_deletes: BTreeSet<&[u8]> = BTreeSet::new();
    let mut next_delete: Option<Vec<usize>> = None;
    for (&i, &at) in rows.iter().zip(ats) {
        let seq = changes.seq(i);
        debug_assert_eq!(at, old.partition_point(|e| e.seq() < seq));
        let here = new
            .get(seq)
            .or_else(|| old.get(at).filter(|e| e.seq() == seq));
        let mut stale = false;
        if let Some(e) = here {
            if !changes.takes_place(i, e, stats)? {
                continue;
            }
        } else if !changes.hc.scd2 {
            let next = next_delete.get_or_insert_with(|| {
                let mut next = vec![old.len(); old.len() + 1];
                for j in (0..old.len()).rev() {
                    next[j] = if old[j].is_delete() { j } else { next[j + 1] };
                }
                next
            });
            // A delete after `seq`: the batch's, or an old one no row replaced.
            let mut j = at;
            let old_delete = loop {
                let d = next[j];
                match old.get(d).map(|e| new.get(e.seq())) {
                    None => break false,
                    Some(None) => break true,
                    Some(Some(e)) if e.is_delete() => break true,
                    Some(Some(_)) => j = d + 1,
                }
            };
            stale = old_delete
                || new_deletes
                    .range::<[u8], _>((Excluded(seq), Unbounded))
                    .next()
                    .is_some();
        }
        if (changes.deleted)(i) {
            new_deletes.insert(seq);
        } else {
            new_deletes.remove(seq);
        }
        changes.count(i, stale, stats);
        new.insert(seq, changes.event(i));
    }
    // One pass: the old events between the rows, a row in place of the
    // old event at its sequence.
    let mut events = Vec::with_capacity(old.len() + new.len());
    let mut j = 0;
    for (seq, e) in new {
        let k = seek(old, j, seq);
        events.extend_from_slice(&old[j..k]);
        j = k + old.get(k).is_some_and(|o| o.seq() == seq) as usize;
        events.push(e);
    }
    events.extend_from_slice(&old[j..]);
    Ok(events)
}

/// Where a key's events are folded again from when a batch's changes fall
/// at `first` of `old` or later: the versions that closed before it are
/// the same whatever follows, and folding `old[from..]` from nothing gives
/// the rest of the key's versions, so a late change to a long history (a
/// hot key) costs the events after `from`, not all of them.
///
/// - SCD Type 2 that ignores no nulls: the first event of the version open
///   just before `first` (or `first` when none is). A version's tracked
///   values are those of each of its events, so its start is found walking
///   back.
/// - Otherwise (a value merged under `ignore_null_updates` may come from
///   any earlier event of the key's life, and SCD Type 1's pruning reads
///   back to the last delete): the last delete before `first`, where the
///   fold and the pruning start afresh (0 when there is none). No change of
///   the batch can tie it: each one's sequence is above `old[first - 1]`'s.
fn refold_from(hc: &HistCodec, old: &[Event], first: usize) -> usize {
    if first == 0 {
        return 0;
    }
    let first = first.min(old.len());
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

/// The batch's rows grouped by key.
struct KeyGroups<'a> {
    /// In order of first appearance.
    keys: Vec<KeyGroup<'a>>,
    /// The rows, key after key, each key's in batch order.
    rows: Vec<usize>,
}

struct KeyGroup<'a> {
    key: &'a [u8],
    /// `hash_key(key)`.
    hash: u64,
    /// Where its rows are in `KeyGroups::rows`.
    rows: std::ops::Range<usize>,
}

/// The batch's rows grouped by key: a hash table of keys and one counting
/// pass, so a batch of distinct keys allocates no vector per key.
fn rows_by_key(keys: &Rows) -> KeyGroups<'_> {
    let n = keys.num_rows();
    let mut table: HashTable<u32> = HashTable::with_capacity(n);
    let mut groups: Vec<KeyGroup<'_>> = Vec::new();
    let mut group_of: Vec<u32> = Vec::with_capacity(n);
    for i in 0..n {
        let key: &[u8] = keys.row(i).data();
        let hash = hash_key(key);
        let found = table
            .find(hash, |&g| groups[g as usize].key == key)
            .copied();
        let g = found.unwrap_or_else(|| {
            let g = groups.len() as u32;
            table.insert_unique(hash, g, |&g| groups[g as usize].hash);
            groups.push(KeyGroup {
                key,
                hash,
                rows: 0..0,
            });
            g
        });
        // Counted in `end` for now.
        groups[g as usize].rows.end += 1;
        group_of.push(g);
    }
    let mut at = 0;
    for g in &mut groups {
        let count = g.rows.end;
        g.rows = at..at;
        at += count;
    }
    let mut rows = vec![0; n];
    for (i, &g) in group_of.iter().enumerate() {
        let r = &mut groups[g as usize].rows;
        rows[r.end] = i;
        r.end += 1;
    }
    KeyGroups { keys: groups, rows }
}

/// Re-folds every key's events under `hc` where they were folded under
/// `was` (the SCD Type 2 tracked set changed): the rows that differ are
/// removed and written again, as for a batch; the events themselves stay,
/// only where their rows are changes.
pub fn refold(was: &HistCodec, hc: &HistCodec, hist: &History, state_complete: bool) -> Plan {
    let mut plan = Plan::default();
    for (slot, key, old) in hist.iter_slots() {
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
                slot: Some(slot),
                key: key.into(),
                from: 0,
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
    for (slot, key, old) in hist.iter_slots() {
        let mut events = old.to_vec();
        let mut pending = Vec::new();
        for v in fold(hc, &events) {
            pending.push((v.anchor, plan.inserts.len() as u32));
            plan.inserts.push(to_out(key, &events, &v));
        }
        for e in &mut events {
            e.set_loc(None);
        }
        plan.changes.push(KeyChange {
            slot: Some(slot),
            key: key.into(),
            from: 0,
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
    // The old rows of each identity not yet matched, in order: a scan
    // finds the first for a few rows; a key with a long history (SCD Type
    // 2 of a hot key) gets a map, so matching stays linear in its rows.
    let mut unmatched: Option<HashMap<u64, std::collections::VecDeque<usize>>> = (olds.len() > 16)
        .then(|| {
            let mut m: HashMap<u64, std::collections::VecDeque<usize>> = HashMap::new();
            for (i, o) in olds.iter().enumerate() {
                m.entry(o.0).or_default().push_back(i);
            }
            m
        });
    let mut kept: Vec<(usize, Loc)> = Vec::new();
    let mut pending = Vec::new();
    for v in &after {
        let h = row_hash(hc, events, v);
        let first = match &unmatched {
            Some(m) => m.get(&h).and_then(|q| q.front().copied()),
            None => olds.iter().position(|o| !o.2 && o.0 == h),
        };
        // A row without a known position is written again, the old removed by key.
        if let Some(i) = first
            && let Some(loc) = old[olds[i].1.anchor].loc()
        {
            olds[i].2 = true;
            if let Some(q) = unmatched.as_mut().and_then(|m| m.get_mut(&h)) {
                q.pop_front();
            }
            kept.push((v.anchor, loc));
            continue;
        }
        pending.push((v.anchor, plan.inserts.len() as u32));
        plan.inserts.push(to_out(key, events, v));
    }
    for (_, v, matched) in &olds {
        if *matched {
            continue;
        }
        match old[v.anchor].loc() {
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
        e.set_loc(None);
    }
    for (at, loc) in kept {
        events[at].set_loc(Some(loc));
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

/// Plans of at least this many keys are applied on two threads.
const APPLY_SPLIT_KEYS: usize = 16_384;

/// Moves the history forward once the inserts are written: `locs[ordinal]`
/// is where insert `ordinal` landed.
///
/// A plan of many keys is applied by `join`'s two threads, each replacing
/// the events of the keys in one half of the slots (the slots are split
/// where half the plan's keys fall below); freeing the plan's target rows
/// goes with the first. The counts and the dirty list are then taken in, in
/// the plan's order, with the keys new to the history, so the history is
/// the one applying the plan key by key gives.
pub fn apply(hist: &mut History, plan: Plan, locs: &[Loc], join: &impl Join) {
    debug_assert_eq!(locs.len(), plan.inserts.len());
    let Plan {
        inserts,
        remove_rows,
        mut changes,
        ..
    } = plan;
    for c in &mut changes {
        for &(at, ordinal) in &c.pending {
            c.events[at].set_loc(Some(locs[ordinal as usize]));
        }
    }
    let n = hist.slots.len();
    let hinted = |c: &KeyChange| c.slot.filter(|&i| (i as usize) < n);
    let mut known: Vec<u32> = changes.iter().filter_map(hinted).collect();
    if known.len() < APPLY_SPLIT_KEYS {
        drop((inserts, remove_rows));
        let hints: Vec<Option<u32>> = changes.iter().map(|c| c.slot).collect();
        for (j, c) in changes.into_iter().enumerate() {
            prefetch_ahead(&hist.slots, |m| hints.get(m).copied().flatten(), j);
            hist.put(c.slot, c.key, c.from, c.events);
        }
        return;
    }
    let half = known.len() / 2;
    let mid = *known.select_nth_unstable(half).1;
    drop(known);
    // Each key in plan order: its place in its half, or (not a slot's) put after.
    let mut sides: [Vec<(usize, KeyChange)>; 2] = [Vec::new(), Vec::new()];
    let mut rest = Vec::new();
    let total = changes.len();
    for (j, c) in changes.into_iter().enumerate() {
        match hinted(&c) {
            Some(i) => sides[(i >= mid) as usize].push((j, c)),
            None => rest.push((j, c)),
        }
    }
    let [low, high] = sides;
    let (lo, hi) = hist.slots.split_at_mut(mid as usize);
    // A key whose hint is not its slot comes back, put after.
    let side = |slots: &mut [Slot], base: u32, keys: Vec<(usize, KeyChange)>| {
        let mut done = Vec::with_capacity(keys.len());
        let mut back = Vec::new();
        let hints: Vec<u32> = keys
            .iter()
            .map(|(_, c)| c.slot.expect("hinted") - base)
            .collect();
        for (n, (j, c)) in keys.into_iter().enumerate() {
            prefetch_ahead(slots, |m| hints.get(m).copied(), n);
            let i = c.slot.expect("a hinted key") - base;
            let s = &mut slots[i as usize];
            if *s.key == *c.key {
                done.push((j, base + i, replace(s, c.from, c.events)));
            } else {
                back.push((j, c));
            }
        }
        (done, back)
    };
    let ((done_lo, back_lo), (done_hi, back_hi)) = join.join(
        || {
            drop((inserts, remove_rows));
            side(lo, 0, low)
        },
        || side(hi, mid, high),
    );
    // Taken in in plan order: each key's step at its place in the plan.
    let mut steps: Vec<Option<Step>> = std::iter::repeat_with(|| None).take(total).collect();
    for (j, i, put) in done_lo.into_iter().chain(done_hi) {
        steps[j] = Some(Step::Replaced(i, put));
    }
    for (j, c) in rest.into_iter().chain(back_lo).chain(back_hi) {
        steps[j] = Some(Step::Put(c));
    }
    for step in steps.into_iter().flatten() {
        match step {
            Step::Replaced(i, put) => hist.count_put(i, put),
            Step::Put(c) => hist.put(c.slot, c.key, c.from, c.events),
        }
    }
}

/// How many keys ahead the walks that read each key's events whole
/// (`resolve`, `apply`) ask for them: each key is a few microseconds of
/// work, so a few keys hide a miss.
const KEY_AHEAD: usize = 4;

/// At most this many of a key's last events are prefetched: a hot key's
/// long history is not read whole by a batch.
const EVENTS_AHEAD: usize = 8;

/// A walk over keys (`slot(m)`: the slot of its `m`th key, if it has one)
/// is at its `n`th: ask for the links (`History::prefetch_slot_of`) of the
/// keys after it, each link a few keys before it is needed.
fn prefetch_ahead(slots: &[Slot], slot: impl Fn(usize) -> Option<u32>, n: usize) {
    let at = |m: usize| slot(m).and_then(|i| slots.get(i as usize));
    if let Some(s) = at(n + 3 * KEY_AHEAD) {
        prefetch(s);
    }
    if let Some(s) = at(n + 2 * KEY_AHEAD) {
        prefetch_lists(s);
    }
    if let Some(s) = at(n + KEY_AHEAD) {
        // A batch reads and changes a key's latest events, mostly.
        let tail = &s.events[s.events.len().saturating_sub(EVENTS_AHEAD)..];
        tail.iter().for_each(|e| prefetch(&*e.data));
    }
}

/// Link 2 (`History::prefetch_key_of`) of a loaded slot: its key and its
/// event list.
fn prefetch_lists(s: &Slot) {
    prefetch(&*s.key);
    prefetch(&*s.events);
}

/// What `apply` takes in for one key of a plan split in two: slot `i`,
/// replaced on a thread, or a key to put (new to the history, or whose
/// hint was not its slot).
enum Step {
    Replaced(u32, Put),
    Put(KeyChange),
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
    use super::{Event, History, Vals};
    use crate::core::state::Loc;

    fn ev(seq: u8, val: &[u8], deleted_at_ms: Option<i64>, loc: Option<Loc>) -> Event {
        Event::new(
            &[seq],
            [val, b"x"].into_iter(),
            seq as u64,
            deleted_at_ms,
            loc,
        )
    }

    #[test]
    fn tombstones_expire_by_their_delete_time_whatever_was_written_since() {
        let mut h = History::new();
        let del = |seq, t| ev(seq, b"", Some(t), None);
        h.put(
            None,
            vec![1].into(),
            0,
            vec![ev(1, b"a", None, None), del(2, 100)],
        );
        h.put(None, vec![2].into(), 0, vec![del(1, 200)]);
        assert_eq!(h.live(), 0, "both keys end in a delete");
        h.check_counts();
        assert_eq!(h.gc_tombstones(100), 0, "none older than the cutoff");
        assert_eq!(h.gc_tombstones(150), 1);
        h.check_counts();
        assert!(h.get(&[1]).is_none() && h.get(&[2]).is_some());
        assert_eq!(h.gc_tombstones(150), 0);
        // Key 2 is upserted after its delete: no longer a tombstone.
        h.put(
            h.slot(&[2]),
            vec![2].into(),
            1,
            vec![ev(3, b"b", None, None)],
        );
        assert_eq!(h.gc_tombstones(300), 0);
        assert_eq!((h.len(), h.live()), (1, 1));
        h.check_counts();
        // Deleted again, at a time before the bound the last scan left, and
        // a new key deleted: both expire.
        h.put(None, vec![3].into(), 0, vec![del(1, 250)]);
        h.put(h.slot(&[2]), vec![2].into(), 2, vec![del(4, 50)]);
        assert_eq!(h.gc_tombstones(240), 1);
        assert_eq!(h.gc_tombstones(260), 1);
        assert!(h.is_empty());
        assert_eq!((h.events(), h.live()), (0, 0));
        h.check_counts();
    }

    #[test]
    fn an_event_gives_back_what_it_was_made_of() {
        let loc = Loc { file: 3, pos: 9 };
        let mut e = Event::new(
            b"\x01seq",
            [b"a".as_slice(), b""].into_iter(),
            7,
            None,
            Some(loc),
        );
        assert_eq!(e.seq(), b"\x01seq");
        assert_eq!(
            e.vals().iter().collect::<Vec<_>>(),
            vec![b"a".as_slice(), b""]
        );
        assert_eq!(
            (e.fp(), e.deleted_at_ms(), e.loc(), e.is_delete()),
            (7, None, Some(loc), false)
        );
        assert!(!e.changed());
        e.set_changed(true);
        e.set_loc(None);
        assert!(e.changed() && e.loc().is_none());
        let d = Event::new(b"", std::iter::empty(), 1, Some(0), None);
        assert_eq!(
            (d.seq(), d.vals().len(), d.deleted_at_ms()),
            (&b""[..], 0, Some(0))
        );
        assert!(d.is_delete());
        // One allocation behind one pointer and length.
        assert_eq!(std::mem::size_of::<Event>(), 16);
    }

    #[test]
    fn events_and_values_of_any_size_round_trip() {
        // Sequences around the one-byte length (127, 128), values around the 2-byte
        // offsets, counts around the one-byte header, negative times.
        let long = vec![7u8; 70_000];
        for seq_len in [0usize, 1, 127, 128, 255, 256, 300] {
            for (ncols, big) in [
                (0usize, false),
                (1, false),
                (1, true),
                (3, true),
                (63, false),
                (64, false),
                (200, true),
            ] {
                let seq: Vec<u8> = (0..seq_len).map(|i| i as u8).collect();
                let vals: Vec<&[u8]> = (0..ncols)
                    .map(|c| {
                        if big && c == ncols / 2 {
                            &long[..]
                        } else {
                            &long[..c % 5]
                        }
                    })
                    .collect();
                let loc = Loc {
                    file: u32::MAX,
                    pos: 0x8000_0001,
                };
                for del in [None, Some(-5i64), Some(i64::MAX)] {
                    let mut e =
                        Event::new(&seq, vals.iter().copied(), u64::MAX - 1, del, Some(loc));
                    assert_eq!(e.seq(), &seq[..]);
                    assert_eq!(e.vals().iter().collect::<Vec<_>>(), vals);
                    assert_eq!(
                        (e.fp(), e.deleted_at_ms(), e.loc()),
                        (u64::MAX - 1, del, Some(loc))
                    );
                    e.set_loc(None);
                    e.set_changed(true);
                    assert_eq!((e.loc(), e.changed(), e.deleted_at_ms()), (None, true, del));
                    assert_eq!(
                        e.seq(),
                        &seq[..],
                        "flags and location leave the sequence be"
                    );
                    let v = Vals::new(vals.iter().copied());
                    assert_eq!(
                        (v.len(), v.iter().collect::<Vec<_>>()),
                        (ncols, vals.clone())
                    );
                    assert_eq!(v.as_ref(), e.vals());
                }
            }
        }
        // Short values take a one-byte header and 2-byte offsets.
        assert_eq!(
            Vals::new([&b"ab"[..], b"c", b"de"].into_iter()).heap_bytes(),
            1 + 2 * 2 + 5
        );
        assert_eq!(Vals::default().len(), 0);
    }

    #[test]
    fn put_marks_only_what_differs_and_gc_keeps_every_other_key_findable() {
        let mut h = History::new();
        let loc = |pos| Some(Loc { file: 0, pos });
        for k in 0u8..6 {
            let deleted = (k % 2 == 0).then_some(10);
            h.put(
                None,
                vec![k].into(),
                0,
                vec![ev(1, b"a", None, loc(k as u32)), ev(2, b"b", deleted, None)],
            );
        }
        assert_eq!((h.len(), h.events(), h.dirty().count()), (6, 12, 6));
        h.clear_dirty();
        assert_eq!(h.dirty_len(), 0);
        // Same events again: nothing changed. A moved location: that event only.
        let slot = h.slot(&[1]);
        h.put(
            slot,
            vec![1].into(),
            0,
            vec![ev(1, b"a", None, loc(1)), ev(2, b"b", None, None)],
        );
        assert_eq!(h.dirty().count(), 0);
        h.put(
            slot,
            vec![1].into(),
            0,
            vec![ev(1, b"a", None, loc(5)), ev(2, b"b", None, None)],
        );
        let changed: Vec<bool> = h.get(&[1]).unwrap().iter().map(Event::changed).collect();
        assert_eq!(changed, [true, false]);
        // From an index on: the events before stay as they are.
        h.put(
            slot,
            vec![1].into(),
            1,
            vec![ev(2, b"b", None, None), ev(3, b"c", None, None)],
        );
        let seqs: Vec<&[u8]> = h.get(&[1]).unwrap().iter().map(Event::seq).collect();
        assert_eq!(seqs, [&[1u8][..], &[2], &[3]]);
        let changed: Vec<bool> = h.get(&[1]).unwrap().iter().map(Event::changed).collect();
        assert_eq!(changed, [true, false, true]);
        assert_eq!(h.events(), 13);
        // A stale hint is not trusted.
        h.put(Some(0), vec![3].into(), 0, vec![ev(1, b"z", None, None)]);
        assert_eq!(h.get(&[3]).unwrap()[0].vals().get(0), b"z");
        assert_eq!(h.get(&[0]).unwrap().len(), 2);
        // Keys 0, 2, 4 end in deletes at 10: collected; the others keep
        // their events, slots and dirt.
        h.check_counts();
        assert_eq!(h.gc_tombstones(11), 3);
        assert_eq!((h.len(), h.events()), (3, 6));
        h.check_counts();
        for k in [0u8, 2, 4] {
            assert!(h.get(&[k]).is_none() && h.slot(&[k]).is_none());
        }
        for k in [1u8, 3, 5] {
            let s = h.slot(&[k]).expect("kept");
            assert_eq!(h.at(s), h.get(&[k]).unwrap());
        }
        let mut dirty: Vec<&[u8]> = h.dirty().map(|(k, _, _)| k).collect();
        dirty.sort();
        assert_eq!(dirty, [&[1u8][..], &[3u8][..]]);
        h.put(None, vec![2].into(), 0, vec![ev(4, b"c", None, None)]);
        assert_eq!((h.len(), h.dirty().count()), (4, 3));
    }

    #[test]
    fn a_large_plan_applied_by_halves_of_the_slots_is_the_plan_applied_key_by_key() {
        use super::{APPLY_SPLIT_KEYS, KeyChange, Plan, apply};
        // The core starts no thread: the split path runs the same with
        // `Sequential` (the engine's e2e tests run it on two threads).
        use crate::core::resolve::Sequential;
        let key = |k: u32| -> Box<[u8]> { k.to_be_bytes().into() };
        let loc = |pos| Some(Loc { file: 0, pos });
        let n = 3 * APPLY_SPLIT_KEYS as u32;
        let mut h = History::new();
        for k in 0..n {
            let deleted = (k % 7 == 0).then_some(5);
            h.put(
                None,
                key(k),
                0,
                vec![ev(1, b"a", None, loc(k)), ev(2, b"b", deleted, None)],
            );
        }
        // Slots of keys put since a commit are written whole: commit first,
        // then dirty a few slots so the plan meets listed ones too.
        h.clear_dirty();
        for k in (0..n).step_by(101) {
            let slot = h.slot(&key(k));
            h.put(slot, key(k), 1, vec![ev(2, b"c", None, None)]);
        }
        // Every other key from event 1 on: the same event (nothing changes),
        // one more, a new value, or a delete; a pending location; new keys;
        // hints that name another key's slot.
        let plan = |h: &History| -> Plan {
            let mut changes = Vec::new();
            let mut ordinal = 0;
            for k in (0..n + 500).step_by(2) {
                let mut pending = Vec::new();
                let events = match k % 5 {
                    _ if k >= n => vec![ev(1, b"new", None, None)],
                    0 => vec![ev(2, b"b", (k % 7 == 0).then_some(5), None)],
                    1 => vec![ev(2, b"b", None, None), ev(3, b"c", None, None)],
                    2 => {
                        pending.push((0, ordinal));
                        ordinal += 1;
                        vec![ev(2, b"z", None, None)]
                    }
                    3 => vec![ev(2, b"", Some(9), None)],
                    _ => vec![ev(2, b"b", None, None), ev(4, b"", Some(9), None)],
                };
                let slot = match h.slot(&key(k)) {
                    Some(s) if k % 11 == 0 => Some((s + 1) % n),
                    s => s,
                };
                let from = if k >= n { 0 } else { 1 };
                changes.push(KeyChange {
                    slot,
                    key: key(k),
                    from,
                    events,
                    pending,
                });
            }
            // A target row per pending location (their contents are not read).
            let inserts = (0..ordinal)
                .map(|o| super::OutRow {
                    key: key(o),
                    vals: Vals::new([&b"r"[..]].into_iter()),
                    start: None,
                    end: None,
                })
                .collect();
            Plan {
                changes,
                inserts,
                ..Default::default()
            }
        };
        let p = plan(&h);
        let locs: Vec<Loc> = (0..p.changes.iter().map(|c| c.pending.len()).sum::<usize>() as u32)
            .map(|pos| Loc { file: 1, pos })
            .collect();
        let mut by_key = h.clone();
        for mut c in plan(&h).changes {
            for &(at, o) in &c.pending {
                c.events[at].set_loc(Some(locs[o as usize]));
            }
            by_key.put(c.slot, c.key, c.from, c.events);
        }
        let mut split = h.clone();
        apply(&mut split, p, &locs, &Sequential);
        split.check_counts();
        by_key.check_counts();
        assert!(split.iter().eq(by_key.iter()), "the same keys and events");
        assert!(split.dirty().eq(by_key.dirty()), "the same dirty list");
        assert_eq!(
            (
                split.len(),
                split.events(),
                split.live(),
                split.heap_bytes()
            ),
            (
                by_key.len(),
                by_key.events(),
                by_key.live(),
                by_key.heap_bytes()
            )
        );
        assert_eq!(split.gc_tombstones(10), by_key.gc_tombstones(10));
        assert!(split.iter().eq(by_key.iter()), "the same tombstones expire");
        assert_ne!(split.len(), h.len(), "the plan changed the history");
    }

    #[test]
    fn vals_give_back_each_value_whatever_its_length() {
        let parts: [&[u8]; 4] = [b"", b"ab", &[0, 1, 2, 255], b""];
        let v = Vals::new(parts.iter().copied());
        assert_eq!(v.len(), 4);
        for (c, p) in parts.iter().enumerate() {
            assert_eq!(v.get(c), *p, "value {c}");
        }
        assert_eq!(v.iter().collect::<Vec<_>>(), parts.to_vec());
        assert_eq!(
            v.heap_bytes(),
            1 + 2 * 3 + 6,
            "a header byte, three 2-byte ends"
        );
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

    /// `place_rows` against the placement it replaced: each row inserted
    /// into a copy of the events, one by one.
    mod placing {
        use std::sync::Arc;

        use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
        use proptest::prelude::*;

        use super::super::{Changes, Event, HistCodec, place_rows};
        use crate::core::flow::Flow;
        use crate::core::resolve::{BatchStats, Codec, SameSequence, same_sequence};
        use crate::error::Result;

        fn flow(scd2: bool, ties_error: bool) -> Flow {
            let toml = format!(
                r#"
name = "p"
target = "db.p"
keys = ["id"]
sequence_by = "seq"
apply_as_deletes = "op = 'DELETE'"
except_column_list = ["op"]
stored_as_scd_type = {}
ignore_null_updates = {}
on_sequence_tie = "{}"
columns = [
  {{ name = "id", type = "long", required = true }},
  {{ name = "city", type = "string" }},
  {{ name = "op", type = "string", required = true }},
  {{ name = "seq", type = "long", required = true }},
]
"#,
                if scd2 { 2 } else { 1 },
                !scd2,
                if ties_error { "error" } else { "deterministic" },
            );
            Flow::new(toml::from_str(&toml).unwrap()).unwrap()
        }

        /// (sequence, delete, city) changes of one key.
        type Change = (i64, bool, u8);

        fn batch(flow: &Flow, changes: &[Change]) -> RecordBatch {
            const CITIES: [Option<&str>; 3] = [Some("a"), Some("b"), None];
            let cols: Vec<ArrayRef> = vec![
                Arc::new(Int64Array::from_iter_values(changes.iter().map(|_| 1))),
                Arc::new(StringArray::from_iter(
                    changes.iter().map(|c| CITIES[c.2 as usize]),
                )),
                Arc::new(StringArray::from_iter_values(
                    changes
                        .iter()
                        .map(|c| if c.1 { "DELETE" } else { "UPSERT" }),
                )),
                Arc::new(Int64Array::from_iter_values(changes.iter().map(|c| c.0))),
            ];
            RecordBatch::try_new(flow.source_arrow.clone(), cols).unwrap()
        }

        /// The placement before `place_rows`.
        fn by_insertion(
            c: &Changes<'_, impl Fn(usize) -> bool>,
            old: &[Event],
            rows: &[usize],
            stats: &mut BatchStats,
        ) -> Result<Vec<Event>> {
            let Changes {
                flow,
                hc,
                seqs,
                vals,
                fps,
                deleted,
                now_ms,
            } = c;
            let mut events = old.to_vec();
            for &i in rows {
                let seq: &[u8] = seqs.row(i).data();
                let fp = fps[i];
                let at = events.partition_point(|e| e.seq() < seq);
                let event = Event::new(
                    seq,
                    vals.iter().map(|r| r.row(i).data()),
                    fp,
                    deleted(i).then_some(*now_ms),
                    None,
                );
                if let Some(e) = events.get(at).filter(|e| e.seq() == seq) {
                    match same_sequence(flow, i, (fp, deleted(i)), e.fp(), e.is_delete())? {
                        SameSequence::ReplacesSentinel => {}
                        SameSequence::Duplicate => {
                            stats.duplicates += 1;
                            continue;
                        }
                        SameSequence::Tie { wins } => {
                            stats.ties += 1;
                            if !wins {
                                stats.tie_losers += 1;
                                continue;
                            }
                        }
                    }
                    events[at] = event;
                } else {
                    let behind_delete = !hc.scd2 && events[at..].iter().any(Event::is_delete);
                    events.insert(at, event);
                    if behind_delete {
                        stats.stale += 1;
                        continue;
                    }
                }
                if deleted(i) {
                    stats.deletes += 1;
                } else {
                    stats.upserts += 1;
                }
            }
            Ok(events)
        }

        proptest! {
            #[test]
            fn seeking_from_any_point_below_is_the_partition_point(
                seqs in proptest::collection::btree_set(any::<u8>(), 0..80),
                seq: u8,
                back: usize,
            ) {
                let events: Vec<Event> = seqs
                    .iter()
                    .map(|&s| Event::new(&[s], std::iter::empty(), 0, None, None))
                    .collect();
                let want = events.partition_point(|e| e.seq() < [seq].as_slice());
                let lo = want.saturating_sub(back % (want + 1));
                prop_assert_eq!(super::super::seek(&events, lo, &[seq]), want);
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(1024))]
            #[test]
            fn placing_rows_by_merge_is_inserting_them_one_by_one(
                scd2: bool,
                ties_error: bool,
                old in proptest::collection::vec((0i64..16, any::<bool>(), 0u8..3), 0..12),
                new in proptest::collection::vec((0i64..16, any::<bool>(), 0u8..3), 1..32),
            ) {
                let flow = flow(scd2, ties_error);
                let codec = Codec::new(&flow).unwrap();
                let hc = HistCodec::new(&flow).unwrap();
                // The old events: one per sequence, in order.
                let mut olds: Vec<Change> = old;
                olds.sort_by_key(|c| c.0);
                olds.dedup_by_key(|c| c.0);
                let ob = batch(&flow, &olds);
                let oseqs = codec.seqs.convert_columns(&[ob.column(3).clone()]).unwrap();
                let ovals = hc.encode(&ob).unwrap();
                let ofps = codec.fingerprints(&ob).unwrap();
                let old: Vec<Event> = (0..olds.len())
                    .map(|i| {
                        Event::new(
                            oseqs.row(i).data(),
                            ovals.iter().map(|r| r.row(i).data()),
                            ofps[i],
                            olds[i].1.then_some(5),
                            None,
                        )
                    })
                    .collect();
                let nb = batch(&flow, &new);
                let seqs = codec.seqs.convert_columns(&[nb.column(3).clone()]).unwrap();
                let vals = hc.encode(&nb).unwrap();
                let fps = codec.fingerprints(&nb).unwrap();
                let changes = Changes {
                    flow: &flow,
                    hc: &hc,
                    seqs: &seqs,
                    vals: &vals,
                    fps: &fps,
                    deleted: |i: usize| new[i].1,
                    now_ms: 9,
                };
                let rows: Vec<usize> = (0..new.len()).collect();
                let ats: Vec<usize> = rows
                    .iter()
                    .map(|&i| old.partition_point(|e| e.seq() < seqs.row(i).data()))
                    .collect();
                let (mut a, mut b) = (BatchStats::default(), BatchStats::default());
                let merged = place_rows(&changes, &old, &rows, &ats, &mut a);
                let inserted = by_insertion(&changes, &old, &rows, &mut b);
                match (merged, inserted) {
                    (Ok(m), Ok(i)) => {
                        prop_assert_eq!(m, i);
                        prop_assert_eq!(a, b);
                    }
                    (m, i) => prop_assert_eq!(m.is_err(), i.is_err()),
                }
                // A key's only row (`place_one`).
                let (mut a, mut b) = (BatchStats::default(), BatchStats::default());
                let one = place_rows(&changes, &old, &[0], &ats[..1], &mut a);
                let inserted = by_insertion(&changes, &old, &[0], &mut b);
                match (one, inserted) {
                    (Ok(m), Ok(i)) => {
                        prop_assert_eq!(m, i);
                        prop_assert_eq!(a, b);
                    }
                    (m, i) => prop_assert_eq!(m.is_err(), i.is_err()),
                }
            }
        }
    }
}
