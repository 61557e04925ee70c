//! The pure core: one micro-batch plus the key state in, the rows to write,
//! the rows to remove and the state changes out.
//!
//! Architecture invariant: no I/O, no clock (the commit time is a parameter),
//! no mutation of the state until `apply` (so a rejected batch changes nothing).
//!
//! Semantics, per key: the change with the highest sequence wins whatever the
//! arrival order and batching; equal sequences are an exact duplicate when the
//! whole change is equal (same fingerprint), otherwise a tie (`same_sequence`:
//! an upsert over a delete in SCD Type 1, the delete in SCD Type 2, else the
//! larger fingerprint; or the batch is rejected with `on_sequence_tie = "error"`).
//! A delete leaves a tombstone so that an older upsert arriving later is stale.

use std::cmp::Ordering;

use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_row::{RowConverter, Rows, SortField};
use hashbrown::HashTable;
use serde::Serialize;
use xxhash_rust::xxh3::xxh3_64;

use crate::core::flow::{Flow, TiePolicy};
use crate::core::state::{EntryRef, KeyIndex, LOOKUP_AHEAD, Loc, Value, eq_bytes, hash_key};
use crate::error::{Error, Result, codes};

/// Row encoders for one flow: keys, sequences and whole changes.
#[derive(Debug)]
pub struct Codec {
    pub keys: RowConverter,
    pub seqs: RowConverter,
    /// The fingerprint's columns but the sequence's when they end it
    /// (`seq_tail`); `None`: there are none but those.
    head: Option<RowConverter>,
    head_cols: Vec<usize>,
    seq_idx: Vec<usize>,
    /// The fingerprint's columns end with the sequence's, in its order (a
    /// Debezium flow's six position columns): their bytes in the
    /// fingerprint are the sequence's row, which `resolve` has encoded
    /// already, so they are not encoded twice. A row's encoding is its
    /// columns' encodings one after the other, so the fingerprint is the
    /// same number either way (the state keeps it across versions).
    seq_tail: bool,
}

impl Codec {
    pub fn new(flow: &Flow) -> Result<Codec> {
        let field = |i: &usize| {
            SortField::new(crate::core::nested::row_type(
                flow.source_arrow.field(*i).data_type(),
            ))
        };
        // The columns the fingerprint covers: all of them, except the
        // snapshot version of a `from_snapshot` flow (so an unchanged row
        // keeps its fingerprint from one snapshot to the next).
        let mut head_cols: Vec<usize> = (0..flow.source_arrow.fields().len())
            .filter(|i| !(flow.from_snapshot && flow.seq_idx.contains(i)))
            .collect();
        // `encode` reads the sequence's columns as they are; the
        // fingerprint reads their `row_view`, the same for all but maps.
        let plain = flow.seq_idx.iter().all(|&i| {
            let t = flow.source_arrow.field(i).data_type();
            crate::core::nested::row_type(t) == *t
        });
        let seq_tail = plain && !flow.seq_idx.is_empty() && head_cols.ends_with(&flow.seq_idx);
        if seq_tail {
            head_cols.truncate(head_cols.len() - flow.seq_idx.len());
        }
        Ok(Codec {
            keys: RowConverter::new(flow.key_idx.iter().map(field).collect())?,
            seqs: RowConverter::new(flow.seq_idx.iter().map(field).collect())?,
            head: match head_cols.is_empty() {
                true => None,
                false => Some(RowConverter::new(head_cols.iter().map(field).collect())?),
            },
            head_cols,
            seq_idx: flow.seq_idx.clone(),
            seq_tail,
        })
    }

    /// Fingerprint of each whole change: decides ties the same way everywhere.
    pub fn fingerprints(&self, batch: &RecordBatch) -> Result<Vec<u64>> {
        let head = self.fingerprint_heads(batch)?;
        let seqs = match self.seq_tail {
            true => Some(self.seq_rows(batch)?),
            false => None,
        };
        Ok(self.fingerprints_of(head.as_ref(), seqs.as_ref(), batch.num_rows()))
    }

    /// The sequences of `batch`, encoded.
    fn seq_rows(&self, batch: &RecordBatch) -> Result<Rows> {
        let cols: Vec<ArrayRef> = self
            .seq_idx
            .iter()
            .map(|&i| batch.column(i).clone())
            .collect();
        Ok(self.seqs.convert_columns(&cols)?)
    }

    /// The fingerprint's columns encoded, but for the sequence's when they
    /// end it (`None`: no others).
    fn fingerprint_heads(&self, batch: &RecordBatch) -> Result<Option<Rows>> {
        let Some(head) = &self.head else {
            return Ok(None);
        };
        let cols: Vec<ArrayRef> = self
            .head_cols
            .iter()
            .map(|&i| crate::core::nested::row_view(batch.column(i)))
            .collect::<std::result::Result<_, _>>()?;
        Ok(Some(head.convert_columns(&cols)?))
    }

    /// The fingerprints of `n` rows: their heads, then (`seq_tail`) their
    /// encoded sequences, hashed as one row.
    fn fingerprints_of(&self, head: Option<&Rows>, seqs: Option<&Rows>, n: usize) -> Vec<u64> {
        match (head, seqs.filter(|_| self.seq_tail)) {
            (Some(h), None) => h.iter().map(|r| xxh3_64(r.as_ref())).collect(),
            (None, None) => vec![xxh3_64(&[]); n],
            (h, Some(s)) => {
                let mut row = Vec::new();
                (0..n)
                    .map(|i| {
                        row.clear();
                        if let Some(h) = h {
                            row.extend_from_slice(h.row(i).as_ref());
                        }
                        row.extend_from_slice(s.row(i).as_ref());
                        xxh3_64(&row)
                    })
                    .collect()
            }
        }
    }
}

/// What happened to the rows of one batch. Every input row is counted once,
/// as an applied upsert or delete, or as stale, a duplicate or a tie loser:
/// `rows_in = upserts + deletes + stale + duplicates + tie_losers + truncates`.
/// `ties` counts tie events (two different changes with one sequence met),
/// including those the incoming change won.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct BatchStats {
    pub rows_in: u64,
    pub upserts: u64,
    pub deletes: u64,
    pub stale: u64,
    pub duplicates: u64,
    pub ties: u64,
    pub tie_losers: u64,
    pub removed_by_position: u64,
    pub removed_by_key: u64,
    /// Truncates (`apply_as_truncates`) in the batch.
    pub truncates: u64,
    /// Live rows the truncates removed.
    pub truncated: u64,
    /// Snapshots (`from_snapshot`): rows equal to the target's, left alone.
    /// For a snapshot `rows_in = upserts + unchanged`, and `deletes` counts
    /// the keys it no longer has.
    pub unchanged: u64,
    /// Rows written with a Debezium placeholder (`toasted_columns`) that
    /// had no earlier value to keep: written as null.
    pub placeholders_unfilled: u64,
}

impl BatchStats {
    pub fn add(&mut self, o: &BatchStats) {
        self.rows_in += o.rows_in;
        self.upserts += o.upserts;
        self.deletes += o.deletes;
        self.stale += o.stale;
        self.duplicates += o.duplicates;
        self.ties += o.ties;
        self.tie_losers += o.tie_losers;
        self.removed_by_position += o.removed_by_position;
        self.removed_by_key += o.removed_by_key;
        self.truncates += o.truncates;
        self.truncated += o.truncated;
        self.unchanged += o.unchanged;
        self.placeholders_unfilled += o.placeholders_unfilled;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// The row goes into the target; `ordinal` indexes `Resolution::inserts`.
    Upsert {
        ordinal: u32,
    },
    Delete,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Change {
    pub row: u32,
    pub kind: ChangeKind,
    /// The key's slot in the state when it was resolved (a lookup hint).
    pub slot: Option<u32>,
}

/// The outcome of resolving one batch against the state.
#[derive(Debug)]
pub struct Resolution {
    pub keys: Rows,
    pub seqs: Rows,
    pub hashes: Vec<u64>,
    pub fingerprints: Vec<u64>,
    /// Batch rows to write into the target, in this order (their positions follow it).
    pub inserts: Vec<u32>,
    /// Live rows to remove, by data file and position.
    pub remove_positions: Vec<Loc>,
    /// Batch rows whose key must be removed by equality delete (position unknown).
    pub remove_keys: Vec<u32>,
    /// One per key whose state changes.
    pub changes: Vec<Change>,
    pub stats: BatchStats,
}

fn first_null(a: &ArrayRef) -> Option<usize> {
    if a.null_count() == 0 {
        return None;
    }
    (0..a.len()).find(|&i| a.is_null(i))
}

/// Rejects the batch when a key or sequence is null, naming the row and column.
/// A truncate (`apply_as_truncates`) needs no key.
pub fn validate(flow: &Flow, batch: &RecordBatch) -> Result<()> {
    // Truncates and snapshot cuts need no key.
    let truncates = mask(flow, flow.truncates.as_ref().or(flow.cuts.as_ref()), batch)?;
    // Sequences first, as Spark's AUTO CDC: a row null in both is NULL_SEQUENCE.
    for (idxs, code, what) in [
        (&flow.seq_idx, codes::NULL_SEQUENCE, "sequence"),
        (&flow.key_idx, codes::NULL_KEY, "key"),
    ] {
        for &i in idxs.iter() {
            let null = match &truncates {
                Some(t) if what == "key" => {
                    let a = batch.column(i);
                    (0..a.len()).find(|&r| a.is_null(r) && !(t.is_valid(r) && t.value(r)))
                }
                _ => first_null(batch.column(i)),
            };
            if let Some(row) = null {
                return Err(Error::Batch {
                    code,
                    flow: flow.name.clone(),
                    row,
                    column: flow.column_label(i).to_string(),
                    message: format!(
                        "{what} column is null; every change needs a non-null {what} (filter or fix such rows at the source)"
                    ),
                });
            }
        }
    }
    for (idxs, what) in [(&flow.key_idx, "key"), (&flow.seq_idx, "sequence")] {
        check_lengths(flow, batch, idxs, what)?;
    }
    check_required(flow, batch, truncates.as_ref())
}

/// Every upsert fills the target's required columns (deletes and truncates
/// need only keys and sequences). In a column whose nulls are ignored
/// (`ignore_null_updates`) a null keeps the value, so only the folded row
/// can be checked, at commit.
fn check_required(
    flow: &Flow,
    batch: &RecordBatch,
    truncates: Option<&arrow_array::BooleanArray>,
) -> Result<()> {
    let cols: Vec<usize> = flow
        .target_cols
        .iter()
        .copied()
        .filter(|&c| {
            flow.required(c)
                && !flow.ignore_null_cols.contains(&c)
                && batch.column(c).null_count() > 0
        })
        .collect();
    if cols.is_empty() {
        return Ok(());
    }
    let deletes = mask(flow, flow.deletes.as_ref(), batch)?;
    let skip = |m: Option<&arrow_array::BooleanArray>, r: usize| {
        m.is_some_and(|m| m.is_valid(r) && m.value(r))
    };
    for c in cols {
        let a = batch.column(c);
        if let Some(row) = (0..a.len())
            .find(|&r| a.is_null(r) && !skip(deletes.as_ref(), r) && !skip(truncates, r))
        {
            return Err(required_null(flow, row, c));
        }
    }
    Ok(())
}

/// The string and binary values of a change's key (or sequence) columns
/// together hold at most `max_key_bytes`: the key index could not hold a
/// longer one, so it is refused here, before the acknowledgement.
fn check_lengths(flow: &Flow, batch: &RecordBatch, idxs: &[usize], what: &str) -> Result<()> {
    use arrow_array::cast::AsArray;
    use arrow_schema::DataType;
    let variable = |i: &usize| {
        matches!(
            batch.column(*i).data_type(),
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Binary | DataType::LargeBinary
        )
    };
    if !idxs.iter().any(variable) {
        return Ok(());
    }
    let rows = batch.num_rows();
    let mut total = vec![0usize; rows];
    // Per row, the column with the longest value: the one the error names.
    let mut longest = vec![(0usize, usize::MAX); rows];
    for &i in idxs {
        let a = batch.column(i);
        let lens: Vec<usize> = match a.data_type() {
            DataType::Utf8 => a
                .as_string::<i32>()
                .iter()
                .map(|v| v.map_or(0, str::len))
                .collect(),
            DataType::LargeUtf8 => a
                .as_string::<i64>()
                .iter()
                .map(|v| v.map_or(0, str::len))
                .collect(),
            DataType::Binary => a
                .as_binary::<i32>()
                .iter()
                .map(|v| v.map_or(0, <[u8]>::len))
                .collect(),
            DataType::LargeBinary => a
                .as_binary::<i64>()
                .iter()
                .map(|v| v.map_or(0, <[u8]>::len))
                .collect(),
            _ => continue,
        };
        for (r, n) in lens.into_iter().enumerate() {
            total[r] += n;
            if longest[r].1 == usize::MAX || n > longest[r].0 {
                longest[r] = (n, i);
            }
        }
    }
    match total.iter().position(|&n| n > flow.max_key_bytes) {
        None => Ok(()),
        Some(row) => Err(Error::Batch {
            code: codes::KEY_TOO_LONG,
            flow: flow.name.clone(),
            row,
            column: flow.column_name(longest[row].1).to_string(),
            message: format!(
                "the {what} values of this change are {} bytes, over max_key_bytes = {}",
                total[row], flow.max_key_bytes
            ),
        }),
    }
}

/// An upsert whose required column `c` is null.
pub(crate) fn required_null(flow: &Flow, row: usize, c: usize) -> Error {
    Error::Batch {
        code: codes::BAD_COLUMN,
        flow: flow.name.clone(),
        row,
        column: flow.column_name(c).to_string(),
        message: "required column is null in an upsert; send a value or declare the column without `required`".into(),
    }
}

/// The fingerprint of the deletes autocdc makes (a truncate's, a key missing
/// from a snapshot): a change at the same sequence always wins over them.
pub const TRUNCATED_FP: u64 = 0;

pub(crate) fn sentinel_fingerprints(fps: &mut [u64], forced: Option<&arrow_array::BooleanArray>) {
    if let Some(f) = forced {
        for (i, fp) in fps.iter_mut().enumerate() {
            if f.value(i) {
                *fp = TRUNCATED_FP;
            }
        }
    }
}

/// What a change does to another change of its key at the same sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SameSequence {
    /// The other is a delete autocdc made (a truncate's, a key missing from
    /// a snapshot): any change at its sequence replaces it.
    ReplacesSentinel,
    /// The same change again.
    Duplicate,
    /// Two different changes, under `on_sequence_tie = "deterministic"`:
    /// between an upsert and a delete, the upsert in SCD Type 1 and the
    /// delete in SCD Type 2 (as in Spark's AUTO CDC), else the higher
    /// fingerprint wins.
    Tie { wins: bool },
}

/// The one rule for two changes of a key at one sequence (`row`: the new
/// change's row, for the error under `on_sequence_tie = "error"`; `fp` and
/// `is_delete`: the new change's fingerprint and kind).
pub(crate) fn same_sequence(
    flow: &Flow,
    row: usize,
    (fp, is_delete): (u64, bool),
    other_fp: u64,
    other_is_delete: bool,
) -> Result<SameSequence> {
    if other_fp == TRUNCATED_FP && other_is_delete {
        Ok(SameSequence::ReplacesSentinel)
    } else if fp == other_fp {
        Ok(SameSequence::Duplicate)
    } else if flow.on_tie == TiePolicy::Error {
        Err(tie_error(flow, row))
    } else {
        // A delete and an upsert at one sequence: as Spark's AUTO CDC, the
        // upsert in SCD Type 1 (`collapseMicrobatchRowsPerKey`: the row is
        // present afterwards), the delete in SCD Type 2 (the version is
        // closed). Two of a kind: the higher fingerprint. Either way a total
        // order, so every arrival order and batching gives one result.
        let wins = if is_delete == other_is_delete {
            fp > other_fp
        } else {
            is_delete == flow.scd2
        };
        Ok(SameSequence::Tie { wins })
    }
}

/// The error for two different changes of one key with one sequence under
/// `on_sequence_tie = "error"`.
pub(crate) fn tie_error(flow: &Flow, row: usize) -> Error {
    Error::Batch {
        code: codes::SEQUENCE_TIE,
        flow: flow.name.clone(),
        row,
        column: flow.seq_idx.iter().map(|&i| flow.column_name(i)).collect::<Vec<_>>().join(","),
        message: "two different changes of one key have the same sequence; with on_sequence_tie = \"error\" such batches are rejected (make the sequence unique, or use on_sequence_tie = \"deterministic\")".into(),
    }
}

/// Evaluates `apply_as_deletes` / `apply_as_truncates` over a batch.
pub(crate) fn mask(
    flow: &Flow,
    predicate: Option<&crate::core::predicate::Predicate>,
    batch: &RecordBatch,
) -> Result<Option<arrow_array::BooleanArray>> {
    predicate
        .map(|p| {
            p.evaluate(batch).map_err(|e| Error::Input {
                code: e.code(),
                flow: flow.name.clone(),
                message: e.to_string(),
            })
        })
        .transpose()
}

/// The hash bit that splits a batch's keys in two halves: above the bits a
/// table of under 2^56 buckets indexes by, below the 7 it keeps as tags.
const HALF_BIT: u32 = 56;

/// Which half (0 or 1) of a batch split in two a key of hash `hash` goes to.
pub(crate) fn half_of(hash: u64) -> usize {
    ((hash >> HALF_BIT) & 1) as usize
}

/// Runs two independent pieces of work and returns both results. The core
/// starts no threads: the caller decides whether the two run side by side.
pub trait Join {
    fn join<A: Send, B: Send>(
        &self,
        a: impl FnOnce() -> A + Send,
        b: impl FnOnce() -> B + Send,
    ) -> (A, B);
}

/// One piece of work after the other.
pub struct Sequential;

impl Join for Sequential {
    fn join<A: Send, B: Send>(
        &self,
        a: impl FnOnce() -> A + Send,
        b: impl FnOnce() -> B + Send,
    ) -> (A, B) {
        (a(), b())
    }
}

/// Resolves `batch` (columns in `flow.source_arrow` order) against `state`.
///
/// `state_complete` says every row in the target was written by autocdc and
/// is in the state; when false, keys new to the state may still have rows in
/// the target, so they get an equality delete.
pub fn resolve(
    flow: &Flow,
    codec: &Codec,
    batch: &RecordBatch,
    state: &KeyIndex,
    state_complete: bool,
    forced_deletes: Option<&arrow_array::BooleanArray>,
) -> Result<Resolution> {
    let split = Split {
        join: &Sequential,
        halves: false,
    };
    resolve_as(
        flow,
        codec,
        batch,
        state,
        state_complete,
        forced_deletes,
        split,
    )
}

/// How `resolve_as` runs: its independent pieces of work through `join`,
/// and the batch's keys in two hash halves when `halves`.
pub struct Split<'a, J: Join> {
    pub join: &'a J,
    pub halves: bool,
}

/// `resolve`, in pieces: the fingerprints are computed beside the keys and
/// sequences, then (`halves`) the keys of each hash half are resolved apart
/// (keys are independent) and the two are merged in row order. The
/// resolution is the single pass's; when a half is rejected the batch is
/// resolved again whole, so the error is the one a single pass names.
pub fn resolve_as<J: Join>(
    flow: &Flow,
    codec: &Codec,
    batch: &RecordBatch,
    state: &KeyIndex,
    state_complete: bool,
    forced_deletes: Option<&arrow_array::BooleanArray>,
    split: Split<'_, J>,
) -> Result<Resolution> {
    validate(flow, batch)?;
    let n = batch.num_rows();
    let (encoded, heads) = split.join.join(
        || encode(flow, codec, batch),
        || codec.fingerprint_heads(batch),
    );
    let Encoded {
        keys,
        seqs,
        hashes,
        is_delete,
    } = encoded?;
    let mut fingerprints = codec.fingerprints_of(heads?.as_ref(), Some(&seqs), n);
    sentinel_fingerprints(&mut fingerprints, forced_deletes);
    let deleted = |i: usize| {
        is_delete.as_ref().is_some_and(|d| d.value(i)) || forced_deletes.is_some_and(|d| d.value(i))
    };
    let rows = BatchRows {
        flow,
        keys: &keys,
        seqs: &seqs,
        hashes: &hashes,
        fingerprints: &fingerprints,
        deleted: &deleted,
        state,
    };

    let mut stats = BatchStats {
        rows_in: n as u64,
        ..Default::default()
    };
    // 1. The winner of each key within the batch, and what it does against the state.
    let applied = if split.halves {
        let (mine, theirs) = split
            .join
            .join(|| rows.decide(Some(0)), || rows.decide(Some(1)));
        match (mine, theirs) {
            (Ok((a, sa)), Ok((b, sb))) => {
                stats.add(&sa);
                stats.add(&sb);
                merge_by_row(a, b)
            }
            _ => {
                let (a, sa) = rows.decide(None)?;
                stats.add(&sa);
                a
            }
        }
    } else {
        let (a, sa) = rows.decide(None)?;
        stats.add(&sa);
        a
    };

    // 2. The rows to write and remove, in row order.
    let mut inserts = Vec::new();
    let mut remove_positions = Vec::new();
    let mut remove_keys = Vec::new();
    let mut changes = Vec::with_capacity(applied.len());
    for Applied {
        row: r,
        replaces,
        slot,
    } in applied
    {
        let i = r as usize;
        match replaces {
            Some(Value::Live(Some(loc))) if state.files.is_live(loc.file) => {
                remove_positions.push(loc);
                stats.removed_by_position += 1;
            }
            // Unknown position, or its file was rewritten by another writer.
            Some(Value::Live(_)) => {
                remove_keys.push(r);
                stats.removed_by_key += 1;
            }
            Some(Value::Tombstone { .. }) => {}
            // A key new to the state may still have a row autocdc did not write.
            None if !state_complete => {
                remove_keys.push(r);
                stats.removed_by_key += 1;
            }
            None => {}
        }
        if deleted(i) {
            stats.deletes += 1;
            changes.push(Change {
                row: r,
                kind: ChangeKind::Delete,
                slot,
            });
        } else {
            stats.upserts += 1;
            changes.push(Change {
                row: r,
                kind: ChangeKind::Upsert {
                    ordinal: inserts.len() as u32,
                },
                slot,
            });
            inserts.push(r);
        }
    }

    // Every inserted row is an upsert, whose required columns `validate` checked.
    remove_positions.sort_unstable();
    Ok(Resolution {
        keys,
        seqs,
        hashes,
        fingerprints,
        inserts,
        remove_positions,
        remove_keys,
        changes,
        stats,
    })
}

/// Every row's encoded key and sequence, key hash and delete flag.
struct Encoded {
    keys: Rows,
    seqs: Rows,
    hashes: Vec<u64>,
    is_delete: Option<arrow_array::BooleanArray>,
}

fn encode(flow: &Flow, codec: &Codec, batch: &RecordBatch) -> Result<Encoded> {
    let cols =
        |idx: &[usize]| -> Vec<ArrayRef> { idx.iter().map(|&i| batch.column(i).clone()).collect() };
    let keys = codec.keys.convert_columns(&cols(&flow.key_idx))?;
    let seqs = codec.seq_rows(batch)?;
    let hashes = keys.iter().map(|k| hash_key(k.as_ref())).collect();
    let is_delete = mask(flow, flow.deletes.as_ref(), batch)?;
    Ok(Encoded {
        keys,
        seqs,
        hashes,
        is_delete,
    })
}

/// A batch winner that applies against the state.
struct Applied {
    row: u32,
    /// The key's value in the state (None: the key is new).
    replaces: Option<Value>,
    /// The key's slot in the state (a lookup hint for `apply`).
    slot: Option<u32>,
}

/// Two row-ordered lists of winners of disjoint keys, as one.
fn merge_by_row(a: Vec<Applied>, b: Vec<Applied>) -> Vec<Applied> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut a, mut b) = (a.into_iter().peekable(), b.into_iter().peekable());
    loop {
        let next = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) if x.row < y.row => a.next(),
            (Some(_), Some(_)) => b.next(),
            (Some(_), None) => a.next(),
            (None, Some(_)) => b.next(),
            (None, None) => break,
        };
        out.extend(next);
    }
    out
}

/// A batch's encoded rows and the state they are resolved against.
struct BatchRows<'a> {
    flow: &'a Flow,
    keys: &'a Rows,
    seqs: &'a Rows,
    hashes: &'a [u64],
    fingerprints: &'a [u64],
    /// Whether each row is a delete (of the flow's `apply_as_deletes` or forced).
    deleted: &'a (dyn Fn(usize) -> bool + Sync),
    state: &'a KeyIndex,
}

impl BatchRows<'_> {
    /// The winners of the keys of hash half `half` (every key when None)
    /// that apply against the state, in row order; the other rows are
    /// counted stale, duplicate or tie losers in the stats returned.
    fn decide(&self, half: Option<usize>) -> Result<(Vec<Applied>, BatchStats)> {
        let mut stats = BatchStats::default();
        let rows = self.winners(half, &mut stats)?;
        let mut out = Vec::with_capacity(rows.len());
        for (n, &r) in rows.iter().enumerate() {
            if let Some(&ahead) = rows.get(n + LOOKUP_AHEAD) {
                self.state.prefetch(self.hashes[ahead as usize]);
            }
            let i = r as usize;
            let current = self
                .state
                .get_hashed(self.hashes[i], self.keys.row(i).as_ref());
            let seq = self.seqs.row(i);
            let fp = self.fingerprints[i];
            if let Against::Apply { replaces } = against_state(
                self.flow,
                i,
                seq.as_ref(),
                (fp, (self.deleted)(i)),
                current,
                &mut stats,
            )? {
                out.push(Applied {
                    row: r,
                    replaces,
                    slot: current.map(|e| e.slot),
                });
            }
        }
        Ok((out, stats))
    }

    /// The row of each key's winning change within the batch (ascending),
    /// over the keys of hash half `half` (all when None).
    fn winners(&self, half: Option<usize>, stats: &mut BatchStats) -> Result<Vec<u32>> {
        let (keys, seqs, hashes, fingerprints) =
            (self.keys, self.seqs, self.hashes, self.fingerprints);
        let n = hashes.len();
        let mut winners: HashTable<u32> =
            HashTable::with_capacity(if half.is_some() { n / 2 + n / 16 } else { n });
        for i in 0..n {
            let h = hashes[i];
            if half.is_some_and(|half| half_of(h) != half) {
                continue;
            }
            let (k, s, fp) = (keys.row(i), seqs.row(i), fingerprints[i]);
            match winners.find_mut(h, |&w| eq_bytes(keys.row(w as usize).as_ref(), k.as_ref())) {
                None => {
                    winners.insert_unique(h, i as u32, |&w| hashes[w as usize]);
                }
                Some(w) => {
                    let b = *w as usize;
                    let bs = seqs.row(b);
                    match s.as_ref().cmp(bs.as_ref()) {
                        Ordering::Less => stats.stale += 1,
                        Ordering::Greater => {
                            stats.stale += 1;
                            *w = i as u32;
                        }
                        // A forced delete of the batch (a truncate's, a key
                        // missing from a snapshot) is replaced as in the state.
                        Ordering::Equal => {
                            let (del, other_del) = ((self.deleted)(i), (self.deleted)(b));
                            match same_sequence(
                                self.flow,
                                i,
                                (fp, del),
                                fingerprints[b],
                                other_del,
                            )? {
                                SameSequence::Duplicate => stats.duplicates += 1,
                                SameSequence::Tie { wins } => {
                                    stats.ties += 1;
                                    stats.tie_losers += 1;
                                    if wins {
                                        *w = i as u32;
                                    }
                                }
                                SameSequence::ReplacesSentinel => *w = i as u32,
                            }
                        }
                    }
                }
            }
        }
        let mut rows: Vec<u32> = winners.into_iter().collect();
        rows.sort_unstable();
        Ok(rows)
    }
}

/// What a batch's winning change does against the key's state entry.
enum Against {
    /// Stale, a duplicate or a lost tie: nothing to do.
    Skip,
    /// Applies; `replaces` is the entry's value (None: the key is new).
    Apply { replaces: Option<Value> },
}

/// A batch's winner (row `row`, sequence `seq`, fingerprint and kind `fp`) against
/// the key's current entry; counts stale, duplicates and ties in `stats`.
fn against_state(
    flow: &Flow,
    row: usize,
    seq: &[u8],
    fp: (u64, bool),
    current: Option<EntryRef<'_>>,
    stats: &mut BatchStats,
) -> Result<Against> {
    let Some(e) = current else {
        return Ok(Against::Apply { replaces: None });
    };
    match seq.cmp(e.seq) {
        Ordering::Less => {
            stats.stale += 1;
            return Ok(Against::Skip);
        }
        Ordering::Equal => {
            let tombstone = matches!(e.value, Value::Tombstone { .. });
            match same_sequence(flow, row, fp, e.fingerprint, tombstone)? {
                SameSequence::ReplacesSentinel => {}
                SameSequence::Duplicate => {
                    stats.duplicates += 1;
                    return Ok(Against::Skip);
                }
                SameSequence::Tie { wins } => {
                    stats.ties += 1;
                    if !wins {
                        stats.tie_losers += 1;
                        return Ok(Against::Skip);
                    }
                }
            }
        }
        Ordering::Greater => {}
    }
    Ok(Against::Apply {
        replaces: Some(e.value),
    })
}

/// Applies a resolution to the state once its rows are written: `locs[ordinal]`
/// is where insert `ordinal` landed. `now_ms` stamps new tombstones.
pub fn apply(state: &mut KeyIndex, res: &Resolution, locs: &[Loc], now_ms: i64) {
    debug_assert_eq!(locs.len(), res.inserts.len());
    for (n, c) in res.changes.iter().enumerate() {
        if let Some(ahead) = res.changes.get(n + LOOKUP_AHEAD) {
            match ahead.slot {
                Some(slot) => state.prefetch_slot(slot),
                None => state.prefetch(res.hashes[ahead.row as usize]),
            }
        }
        let i = c.row as usize;
        let value = match c.kind {
            ChangeKind::Upsert { ordinal } => Value::Live(Some(locs[ordinal as usize])),
            ChangeKind::Delete => Value::Tombstone {
                deleted_at_ms: now_ms,
            },
        };
        let (k, s) = (res.keys.row(i), res.seqs.row(i));
        state.put_hinted(
            c.slot,
            res.hashes[i],
            k.as_ref(),
            s.as_ref(),
            res.fingerprints[i],
            value,
        );
    }
}

#[cfg(test)]
mod tests;
