//! What a batch does to a history flow (`Plan`: the target rows to insert
//! and to remove, each changed key's new events) and a plan's rows as a
//! batch of the target (`rows_batch`).

use arrow_array::{Array, ArrayRef, RecordBatch, StructArray, UInt32Array};
use arrow_schema::{DataType, SchemaRef};
use arrow_select::take::take;

use super::event::Event;
use super::fold::{HistCodec, Version};
use super::vals::Vals;
use crate::core::flow::{END_AT, Flow, START_AT};
use crate::core::resolve::{BatchStats, Codec};
use crate::core::state::Loc;
use crate::error::{Error, Result, codes};

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

/// Version `v` of a key with these events, as a target row.
pub(super) fn to_out(key: &[u8], events: &[Event], v: &Version) -> OutRow {
    OutRow {
        key: key.into(),
        vals: v.vals(events).to_owned(),
        start: Some(events[v.start].seq().into()),
        end: v.end_seq(events).map(Into::into),
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
