//! `apply_as_truncates` (SCD Type 1): a truncate at sequence `s` removes
//! every row whose sequence is below `s`; changes below the highest truncate
//! seen (the "floor") are stale from then on, changes at or above it apply
//! as usual.
//!
//! It is done before resolution, as a rewrite of the batch: truncate rows
//! and rows below the floor leave it, and every live key whose sequence is
//! below a raised floor (and that the batch does not bring to or above it)
//! gets a delete at the floor. The resolvers then handle those deletes like
//! any other (position deletes, tombstones), so the order of arrival and the
//! batching do not matter here either.
//!
//! Architecture invariant: pure, like `resolve`.

use std::sync::Arc;

use arrow_array::{Array, ArrayRef, BooleanArray, RecordBatch, UInt32Array};
use arrow_row::Rows;
use arrow_select::concat::concat;
use arrow_select::take::take;

use crate::core::flow::Flow;
use crate::core::resolve::{Codec, mask};
use crate::error::Result;

/// A batch rewritten for truncates.
#[derive(Debug)]
pub struct Truncated {
    /// The rows that take part in resolution, then the synthetic deletes.
    pub batch: RecordBatch,
    /// Row `i` of `batch` came from row `origin[i]` of the input (synthetic deletes: none).
    pub origin: Vec<Option<u32>>,
    /// True for the synthetic deletes.
    pub forced_deletes: BooleanArray,
    /// The floor after this batch (row-encoded sequence), when it has one.
    pub floor: Option<Box<[u8]>>,
    pub raised: bool,
    /// Truncate rows in the input.
    pub truncates: u64,
    /// Input rows below the floor.
    pub below_floor: u64,
    /// Synthetic deletes (live rows the truncate removes).
    pub removed: u64,
}

/// Rewrites `batch` for the truncates in it and the current `floor`;
/// `None` when there is nothing to rewrite (no floor, no truncate in the
/// batch: the usual batch of a source never truncated). `live` lists
/// (key, sequence) of every live key of the state, row-encoded; it is
/// called only when the batch raises the floor.
pub fn rewrite<'a, L: IntoIterator<Item = (&'a [u8], &'a [u8])>>(
    flow: &Flow,
    codec: &Codec,
    batch: &RecordBatch,
    floor: Option<&[u8]>,
    live: impl FnOnce() -> L,
) -> Result<Option<Truncated>> {
    let n = batch.num_rows();
    let is_trunc = mask(flow, flow.truncates.as_ref(), batch)?;
    let trunc = |i: usize| {
        is_trunc
            .as_ref()
            .is_some_and(|m| m.is_valid(i) && m.value(i))
    };
    if floor.is_none() && !(0..n).any(trunc) {
        return Ok(None);
    }
    let seqs: Rows = codec.seqs.convert_columns(
        &flow
            .seq_idx
            .iter()
            .map(|&i| batch.column(i).clone())
            .collect::<Vec<_>>(),
    )?;
    let mut new_floor: Option<Box<[u8]>> = floor.map(Into::into);
    let mut truncates = 0;
    for i in (0..n).filter(|&i| trunc(i)) {
        truncates += 1;
        let s = seqs.row(i).data();
        if new_floor.as_deref().is_none_or(|f| s > f) {
            new_floor = Some(s.into());
        }
    }
    let raised = new_floor.as_deref() != floor;
    let below = |s: &[u8]| new_floor.as_deref().is_some_and(|f| s < f);
    let mut keep = Vec::new();
    let mut below_floor = 0;
    for i in 0..n {
        if trunc(i) {
            continue;
        }
        if below(seqs.row(i).data()) {
            below_floor += 1;
            continue;
        }
        keep.push(i as u32);
    }
    // Live keys below a raised floor that the batch does not lift above it.
    let mut synth: Vec<&[u8]> = Vec::new();
    if raised {
        let key_cols: Vec<ArrayRef> = flow
            .key_idx
            .iter()
            .map(|&i| batch.column(i).clone())
            .collect();
        let keys = codec.keys.convert_columns(&key_cols)?;
        let lifted: std::collections::HashSet<&[u8]> =
            keep.iter().map(|&i| keys.row(i as usize).data()).collect();
        synth = live()
            .into_iter()
            .filter(|(k, s)| below(s) && !lifted.contains(k))
            .map(|(k, _)| k)
            .collect();
        synth.sort_unstable();
    }
    let f = new_floor.as_deref().unwrap_or_default();
    let (batch, origin, forced_deletes) = keep_and_delete(flow, codec, batch, &keep, &synth, f)?;
    Ok(Some(Truncated {
        batch,
        origin,
        forced_deletes,
        floor: new_floor,
        raised,
        truncates,
        below_floor,
        removed: synth.len() as u64,
    }))
}

/// The rows `keep` of `batch`, then a delete for each of `keys` at the
/// row-encoded sequence `seq` (other columns null); with, per row, the input
/// row it came from and whether it is such a delete.
pub(crate) fn keep_and_delete(
    flow: &Flow,
    codec: &Codec,
    batch: &RecordBatch,
    keep: &[u32],
    keys: &[&[u8]],
    seq: &[u8],
) -> Result<(RecordBatch, Vec<Option<u32>>, BooleanArray)> {
    let every =
        keep.len() == batch.num_rows() && keep.iter().enumerate().all(|(i, &k)| k as usize == i);
    let idx = UInt32Array::from(if every { Vec::new() } else { keep.to_vec() });
    let mut cols: Vec<ArrayRef> = batch
        .columns()
        .iter()
        .map(|c| match every {
            // Every row kept, in order: the columns as they are.
            true => Ok(c.clone()),
            false => take(c.as_ref(), &idx, None),
        })
        .collect::<std::result::Result<_, _>>()?;
    if !keys.is_empty() {
        let kp = codec.keys.parser();
        let key_arrays = codec.keys.convert_rows(keys.iter().map(|k| kp.parse(k)))?;
        let sp = codec.seqs.parser();
        let seq_arrays = codec
            .seqs
            .convert_rows(std::iter::repeat_n(sp.parse(seq), keys.len()))?;
        for (c, col) in cols.iter_mut().enumerate() {
            let extra: ArrayRef = if let Some(k) = flow.key_idx.iter().position(|&i| i == c) {
                key_arrays[k].clone()
            } else if let Some(s) = flow.seq_idx.iter().position(|&i| i == c) {
                seq_arrays[s].clone()
            } else {
                arrow_array::new_null_array(col.data_type(), keys.len())
            };
            *col = concat(&[col.as_ref(), extra.as_ref()])?;
        }
    }
    let mut origin: Vec<Option<u32>> = keep.iter().map(|&i| Some(i)).collect();
    origin.extend(std::iter::repeat_n(None, keys.len()));
    let forced: BooleanArray = origin.iter().map(|o| Some(o.is_none())).collect();
    Ok((
        RecordBatch::try_new(Arc::clone(&batch.schema()), cols)?,
        origin,
        forced,
    ))
}
