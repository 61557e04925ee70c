//! AUTO CDC FROM SNAPSHOT: a full snapshot of the source, compared with the
//! state (keys and row fingerprints), becomes a change feed at the snapshot's
//! version: new keys and changed rows are upserts, keys missing from the
//! snapshot are deletes, unchanged rows are left out (so an unchanged
//! snapshot writes no files).
//!
//! Architecture invariant: pure, like `resolve`.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{ArrayRef, BooleanArray, Int64Array, RecordBatch};
use arrow_row::Rows;

use crate::core::flow::Flow;
use crate::core::resolve::{Codec, validate};
use crate::error::{Error, Result, codes};

/// `snapshot` with its version column set to `version`.
pub fn with_version(flow: &Flow, snapshot: &RecordBatch, version: i64) -> Result<RecordBatch> {
    let seq = *flow
        .seq_idx
        .last()
        .expect("a snapshot flow has its version column");
    let mut cols = snapshot.columns().to_vec();
    cols[seq] = Arc::new(Int64Array::from(vec![version; snapshot.num_rows()]));
    Ok(RecordBatch::try_new(snapshot.schema(), cols)?)
}

/// Rejects a snapshot with a null key or a key twice (at ingest, before it
/// is logged). Returns it with its version column set.
pub fn check(flow: &Flow, snapshot: &RecordBatch, version: i64) -> Result<RecordBatch> {
    let codec = Codec::new(flow)?;
    let snapshot = with_version(flow, snapshot, version)?;
    validate(flow, &snapshot)?;
    unique_keys(flow, &key_rows(flow, &codec, &snapshot)?)?;
    Ok(snapshot)
}

/// The row-encoded keys of `batch`.
fn key_rows(flow: &Flow, codec: &Codec, batch: &RecordBatch) -> Result<Rows> {
    let key_cols: Vec<ArrayRef> = flow
        .key_idx
        .iter()
        .map(|&i| batch.column(i).clone())
        .collect();
    Ok(codec.keys.convert_columns(&key_cols)?)
}

/// Each key with its row; a snapshot with a key twice is refused.
fn unique_keys<'k>(flow: &Flow, keys: &'k Rows) -> Result<HashMap<&'k [u8], usize>> {
    let mut seen = HashMap::with_capacity(keys.num_rows());
    for i in 0..keys.num_rows() {
        if let Some(first) = seen.insert(keys.row(i).data(), i) {
            return Err(duplicate(flow, i, first));
        }
    }
    Ok(seen)
}

fn duplicate(flow: &Flow, row: usize, first: usize) -> Error {
    Error::Batch {
        code: codes::SNAPSHOT_DUPLICATE_KEY,
        flow: flow.name.clone(),
        row,
        column: flow
            .key_idx
            .iter()
            .map(|&c| flow.column_name(c))
            .collect::<Vec<_>>()
            .join(","),
        message: format!(
            "the snapshot has this key twice (first at row {first}); a snapshot holds one row per key"
        ),
    }
}

/// A snapshot turned into changes.
#[derive(Debug)]
pub struct Diffed {
    /// Upserts (rows of the snapshot), then the deletes of missing keys.
    pub batch: RecordBatch,
    /// Row `i` of `batch` came from row `origin[i]` of the snapshot (deletes: none).
    pub origin: Vec<Option<u32>>,
    pub forced_deletes: BooleanArray,
    pub inserted: u64,
    pub updated: u64,
    pub deleted: u64,
    pub unchanged: u64,
}

/// `snapshot` in the flow's source schema (the version column is filled in
/// here); `live` lists (key, fingerprint) of every live key of the state.
pub fn diff<'a>(
    flow: &Flow,
    codec: &Codec,
    snapshot: &RecordBatch,
    version: i64,
    live: impl Iterator<Item = (&'a [u8], u64)>,
) -> Result<Diffed> {
    let snapshot = with_version(flow, snapshot, version)?;
    validate(flow, &snapshot)?;
    let keys = key_rows(flow, codec, &snapshot)?;
    let fps = codec.fingerprints(&snapshot)?;
    let live: HashMap<&[u8], u64> = live.collect();
    let present = unique_keys(flow, &keys)?;
    let (mut inserted, mut updated, mut unchanged) = (0, 0, 0);
    let mut keep = Vec::new();
    for (i, &fp) in fps.iter().enumerate() {
        match live.get(keys.row(i).data()) {
            Some(&old) if old == fp => unchanged += 1,
            Some(_) => {
                updated += 1;
                keep.push(i as u32);
            }
            None => {
                inserted += 1;
                keep.push(i as u32);
            }
        }
    }
    let mut gone: Vec<&[u8]> = live
        .keys()
        .copied()
        .filter(|k| !present.contains_key(k))
        .collect();
    gone.sort_unstable();

    let version_row = codec
        .seqs
        .convert_columns(&[Arc::new(Int64Array::from(vec![version])) as ArrayRef])?;
    let (batch, origin, forced_deletes) = crate::core::truncate::keep_and_delete(
        flow,
        codec,
        &snapshot,
        &keep,
        &gone,
        version_row.row(0).data(),
    )?;
    Ok(Diffed {
        batch,
        origin,
        forced_deletes,
        inserted,
        updated,
        deleted: gone.len() as u64,
        unchanged,
    })
}
