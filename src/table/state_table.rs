//! The aux sequence-state table `<table>__autocdc_state`: the on-disk form of
//! `state::KeyIndex`, an ordinary Iceberg table any reader can inspect.
//!
//! It is an append-only log of key entries: each commit appends the entries
//! that changed, stamped with a generation; loading keeps, per key, the entry
//! of the highest generation. When the log holds far more rows than keys, the
//! next commit rewrites it whole (an overwrite snapshot).
//!
//! Columns: the key columns (typed, same names), one `__autocdc_seq_<name>`
//! per sequence column (typed), `__autocdc_fingerprint`, `__autocdc_deleted_at_ms`
//! (set for tombstones), `__autocdc_file` / `__autocdc_pos` (the live row's
//! location) and `__autocdc_generation`.
//!
//! A flow that keeps history (SCD Type 2, `ignore_null_updates`) stores one
//! row per kept event instead: the same columns (`__autocdc_deleted_at_ms`
//! set on deletes, `__autocdc_file` / `__autocdc_pos` on events that anchor a
//! target row), `__autocdc_starts` and `__autocdc_val_<name>` per value
//! column. Each commit appends the events that changed; a key made since
//! the last commit (a new key, or one put again after its tombstone was
//! collected) is written whole, its rows marked as starting it. Loading
//! keeps, per key, its rows from the latest generation that starts it, and
//! of those the latest row of each sequence.
//!
//! This module converts between the two forms; it does no I/O.

use std::sync::Arc;

use arrow_array::builder::{BooleanBuilder, Int64Builder, StringBuilder};
use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::SchemaRef;
use iceberg::arrow::schema_to_arrow_schema;
use iceberg::spec::{NestedField, PrimitiveType, Schema, TableMetadata, Type};

use crate::error::{Error, Result, codes};
use std::collections::HashMap;

use crate::core::evolve::{Evolution, Refusal, Rules, evolve, promotes};
use crate::core::flow::Flow;
use crate::core::history::{Event, HistCodec, History};
use crate::core::resolve::Codec;
use crate::core::state::{EntryRef, KeyIndex, Loc, Value, hash_key};

pub const COL_FINGERPRINT: &str = "__autocdc_fingerprint";
pub const COL_DELETED_AT: &str = "__autocdc_deleted_at_ms";
pub const COL_FILE: &str = "__autocdc_file";
pub const COL_POS: &str = "__autocdc_pos";
pub const COL_GENERATION: &str = "__autocdc_generation";
/// History flows: the row's key starts at its generation (rows of earlier
/// generations are not the key's). Null in a log written before the
/// column: SCD Type 2 then appended (not set), SCD Type 1 with
/// `ignore_null_updates` wrote each key whole (set).
pub const COL_STARTS: &str = "__autocdc_starts";

fn seq_col(name: &str) -> String {
    format!("__autocdc_seq_{name}")
}

/// The prefix of a history flow's value columns.
const VAL_PREFIX: &str = "__autocdc_val_";

fn val_col(name: &str) -> String {
    format!("{VAL_PREFIX}{name}")
}

/// The Iceberg schema of the state table of `flow`.
pub fn schema(flow: &Flow) -> Result<Schema> {
    let mut fields = Vec::new();
    let mut id = 0;
    let mut next = || {
        id += 1;
        id
    };
    let src = |i: usize| -> Result<Type> {
        flow.column_type(i).ok_or_else(|| {
            Error::Config(format!(
                "column {} has no type in flow {}",
                flow.column_name(i),
                flow.name
            ))
        })
    };
    let mut ids = Vec::new();
    for &k in &flow.key_idx {
        let fid = next();
        ids.push(fid);
        fields.push(Arc::new(NestedField::required(
            fid,
            flow.column_name(k),
            src(k)?,
        )));
    }
    for &s in &flow.seq_idx {
        fields.push(Arc::new(NestedField::required(
            next(),
            seq_col(flow.column_name(s)),
            src(s)?,
        )));
    }
    let long = || Type::Primitive(PrimitiveType::Long);
    fields.push(Arc::new(NestedField::required(
        next(),
        COL_FINGERPRINT,
        long(),
    )));
    fields.push(Arc::new(NestedField::optional(
        next(),
        COL_DELETED_AT,
        long(),
    )));
    fields.push(Arc::new(NestedField::optional(
        next(),
        COL_FILE,
        Type::Primitive(PrimitiveType::String),
    )));
    fields.push(Arc::new(NestedField::optional(next(), COL_POS, long())));
    fields.push(Arc::new(NestedField::required(
        next(),
        COL_GENERATION,
        long(),
    )));
    if flow.keeps_history() {
        fields.push(Arc::new(NestedField::optional(
            next(),
            COL_STARTS,
            Type::Primitive(PrimitiveType::Boolean),
        )));
        // One row per event: the keys identify no row; the values ride along.
        for c in flow.value_cols() {
            fields.push(Arc::new(NestedField::optional(
                next(),
                val_col(flow.column_name(c)),
                src(c)?,
            )));
        }
        ids.clear();
    }
    Ok(Schema::builder()
        .with_schema_id(0)
        .with_fields(crate::core::nested::number_all(fields))
        .with_identifier_field_ids(ids)
        .build()?)
}

/// The existing state table of `flow` against its definition: the key
/// columns and the sequence columns (names, types and, for sequences,
/// order) must be those the state was written with, or it would not load
/// as written. A mismatch names the column and the way out.
pub fn check(flow: &Flow, have: &Schema) -> Result<()> {
    let want = schema(flow)?;
    let split = |s: &Schema| {
        let (mut keys, mut seqs) = (Vec::new(), Vec::new());
        for f in s.as_struct().fields() {
            let t = (*f.field_type).clone();
            if let Some(n) = f.name.strip_prefix("__autocdc_seq_") {
                seqs.push((n.to_string(), t));
            } else if !f.name.starts_with("__autocdc_") {
                keys.push((f.name.clone(), t));
            }
        }
        (keys, seqs)
    };
    let ((hk, hs), (wk, ws)) = (split(have), split(&want));
    let names = |v: &[(String, Type)]| {
        let mut n: Vec<&str> = v.iter().map(|(n, _)| n.as_str()).collect();
        n.sort_unstable();
        n.join(", ")
    };
    let refresh = format!(
        "change the flow back, or rebuild the target and its state with `autocdc refresh --full {}`",
        flow.name
    );
    let drift = |code, message: String| {
        Err(Error::State {
            code,
            message: format!(
                "flow `{}`: {message} in the state of the existing target {}; {refresh}",
                flow.name, flow.target
            ),
        })
    };
    // One row per key, or every change per key: the state of one cannot be
    // read as the other (values it never kept would read as nulls).
    let history = |s: &Schema| {
        s.as_struct()
            .fields()
            .iter()
            .any(|f| f.name.starts_with(VAL_PREFIX))
    };
    let (had, keeps) = (history(have), history(&want));
    if had != keeps {
        let kind = |h: bool| {
            if h {
                "every change per key (ignore_null_updates or SCD Type 2)"
            } else {
                "one entry per key"
            }
        };
        return drift(
            codes::SCHEMA_DRIFT,
            format!(
                "ignore_null_updates changed: the flow keeps {} but the state holds {}",
                kind(keeps),
                kind(had)
            ),
        );
    }
    if names(&hk) != names(&wk) {
        return drift(
            codes::KEY_SCHEMA_DRIFT,
            format!(
                "the keys are [{}] but they were [{}]",
                names(&wk),
                names(&hk)
            ),
        );
    }
    // Keys and sequences may widen (the state evolves with the target).
    for (n, t) in &wk {
        if let Some((_, ht)) = hk
            .iter()
            .find(|(h, _)| h == n)
            .filter(|(_, ht)| !promotes(ht, t))
        {
            return drift(
                codes::KEY_SCHEMA_DRIFT,
                format!("key column `{n}` is {t} in the flow but {ht}, which does not widen to it"),
            );
        }
    }
    let list = |v: &[(String, Type)]| {
        v.iter()
            .map(|(n, t)| format!("{n} {t}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if hs.len() != ws.len()
        || hs
            .iter()
            .zip(&ws)
            .any(|(h, w)| h.0 != w.0 || !promotes(&h.1, &w.1))
    {
        let detail = match hs.iter().zip(&ws).find(|(h, w)| h.0 == w.0 && h.1 != w.1) {
            Some(((n, ht), (_, wt))) => {
                format!(
                    "sequence column `{n}` is {wt} in the flow but {ht}, which does not widen to it"
                )
            }
            None => format!("sequence_by is [{}] but it was [{}]", list(&ws), list(&hs)),
        };
        return drift(codes::SEQUENCING_TYPE_DRIFT, detail);
    }
    Ok(())
}

/// The schema the state table moves to with the definition (after `check`):
/// widened keys and sequences, and for history flows the value columns
/// added, widened, renamed (`renamed_from`) or dropped as in the target.
pub fn evolution(
    flow: &Flow,
    have: &TableMetadata,
) -> std::result::Result<Option<Evolution>, Refusal> {
    let want = schema(flow).map_err(|e| Refusal {
        column: String::new(),
        rule: e.to_string(),
    })?;
    let mut fixed: Vec<String> = flow
        .key_idx
        .iter()
        .map(|&k| flow.column_name(k).to_string())
        .collect();
    fixed.extend(flow.seq_idx.iter().map(|&s| seq_col(flow.column_name(s))));
    let rules = Rules {
        renames: flow
            .renames()
            .into_iter()
            .map(|(n, o)| (val_col(&n), val_col(&o)))
            .collect(),
        fixed,
        partition_sources: Vec::new(),
        keep_unselected: false,
        drop: Vec::new(),
    };
    evolve(have.current_schema(), &want, have.last_column_id(), &rules)
}

pub fn arrow_schema(flow: &Flow) -> Result<SchemaRef> {
    Ok(Arc::new(schema_to_arrow_schema(&schema(flow)?)?))
}

/// Encodes `entries` as one batch of the state table, stamped `generation`.
pub fn to_batch<'a>(
    flow: &Flow,
    codec: &Codec,
    state: &KeyIndex,
    entries: impl Iterator<Item = EntryRef<'a>>,
    generation: i64,
) -> Result<RecordBatch> {
    let mut rows = EntryRows::new(codec);
    for e in entries {
        let (deleted_at, loc) = match e.value {
            Value::Tombstone { deleted_at_ms } => (Some(deleted_at_ms), None),
            Value::Live(loc) => (None, loc),
        };
        let loc = loc.map(|l| (state.files.path(l.file), l.pos));
        rows.push(e.key, e.seq, e.fingerprint, deleted_at, loc);
    }
    cast_to_schema(rows.finish(generation)?, &arrow_schema(flow)?)
}

/// The columns every state-table row has, gathered row by row.
struct EntryRows<'a> {
    codec: &'a Codec,
    keys: Vec<&'a [u8]>,
    seqs: Vec<&'a [u8]>,
    fp: Int64Builder,
    deleted: Int64Builder,
    file: StringBuilder,
    pos: Int64Builder,
    n: usize,
}

impl<'a> EntryRows<'a> {
    fn new(codec: &'a Codec) -> Self {
        EntryRows {
            codec,
            keys: Vec::new(),
            seqs: Vec::new(),
            fp: Int64Builder::new(),
            deleted: Int64Builder::new(),
            file: StringBuilder::new(),
            pos: Int64Builder::new(),
            n: 0,
        }
    }

    fn push(
        &mut self,
        key: &'a [u8],
        seq: &'a [u8],
        fp: u64,
        deleted_at_ms: Option<i64>,
        loc: Option<(&str, u32)>,
    ) {
        self.keys.push(key);
        self.seqs.push(seq);
        self.fp.append_value(fp as i64);
        self.deleted.append_option(deleted_at_ms);
        self.file.append_option(loc.map(|l| l.0));
        self.pos.append_option(loc.map(|l| l.1 as i64));
        self.n += 1;
    }

    /// Keys, sequences, fingerprint, deleted-at, file, position, generation.
    fn finish(mut self, generation: i64) -> Result<Vec<ArrayRef>> {
        let (kp, sp) = (self.codec.keys.parser(), self.codec.seqs.parser());
        let mut cols: Vec<ArrayRef> = self
            .codec
            .keys
            .convert_rows(self.keys.iter().map(|k| kp.parse(k)))?;
        cols.extend(
            self.codec
                .seqs
                .convert_rows(self.seqs.iter().map(|s| sp.parse(s)))?,
        );
        cols.push(Arc::new(self.fp.finish()));
        cols.push(Arc::new(self.deleted.finish()));
        cols.push(Arc::new(self.file.finish()));
        cols.push(Arc::new(self.pos.finish()));
        cols.push(Arc::new(arrow_array::Int64Array::from(vec![
            generation;
            self.n
        ])));
        Ok(cols)
    }
}

/// Loads state-table batches into `state`: per key the entry of the highest
/// generation wins. Returns the number of rows read.
pub fn load(
    flow: &Flow,
    codec: &Codec,
    state: &mut KeyIndex,
    batches: &[RecordBatch],
) -> Result<usize> {
    // Order all rows by generation so that later entries overwrite earlier ones.
    let mut order: Vec<(i64, usize, usize)> = Vec::new();
    for (b, batch) in batches.iter().enumerate() {
        let g = column(batch, COL_GENERATION)?
            .as_primitive::<Int64Type>()
            .clone();
        for r in 0..batch.num_rows() {
            order.push((g.value(r), b, r));
        }
    }
    order.sort_unstable();
    let mut encoded = Vec::with_capacity(batches.len());
    for batch in batches {
        let keys = codec.keys.convert_columns(&key_columns(flow, batch)?)?;
        let seqs = codec.seqs.convert_columns(&seq_columns(flow, batch)?)?;
        let fp = column(batch, COL_FINGERPRINT)?
            .as_primitive::<Int64Type>()
            .clone();
        let del = column(batch, COL_DELETED_AT)?
            .as_primitive::<Int64Type>()
            .clone();
        let file = column(batch, COL_FILE)?.as_string::<i32>().clone();
        let pos = column(batch, COL_POS)?.as_primitive::<Int64Type>().clone();
        encoded.push((keys, seqs, fp, del, file, pos));
    }
    for &(_, b, r) in &order {
        let (keys, seqs, fp, del, file, pos) = &encoded[b];
        let value = if del.is_valid(r) {
            Value::Tombstone {
                deleted_at_ms: del.value(r),
            }
        } else if file.is_valid(r) && pos.is_valid(r) {
            let id = state.files.intern(file.value(r));
            let p = u32::try_from(pos.value(r)).map_err(|_| Error::State {
                code: codes::POSITION,
                message: format!("state row position {} out of range", pos.value(r)),
            })?;
            Value::Live(Some(Loc { file: id, pos: p }))
        } else {
            Value::Live(None)
        };
        let k = keys.row(r);
        state.put(
            hash_key(k.as_ref()),
            k.as_ref(),
            seqs.row(r).as_ref(),
            fp.value(r) as u64,
            value,
        );
    }
    state.clear_dirty();
    Ok(order.len())
}

/// The key columns of a state batch, by name (the definition may list the
/// keys in another order than the table has them), as the source types.
fn key_columns(flow: &Flow, batch: &RecordBatch) -> Result<Vec<ArrayRef>> {
    flow.key_idx
        .iter()
        .map(|&i| {
            let c = column(batch, flow.column_name(i))?;
            Ok(arrow_cast::cast(c, flow.source_arrow.field(i).data_type())?)
        })
        .collect()
}

/// The sequence columns of a state batch, by name, as the source types.
fn seq_columns(flow: &Flow, batch: &RecordBatch) -> Result<Vec<ArrayRef>> {
    flow.seq_idx
        .iter()
        .map(|&i| {
            let c = column(batch, &seq_col(flow.column_name(i)))?;
            Ok(arrow_cast::cast(c, flow.source_arrow.field(i).data_type())?)
        })
        .collect()
}

/// `batch` (built in the definition's column order) in the order of the
/// state table's schema `to`, column by column by name.
pub fn conform(batch: &RecordBatch, to: SchemaRef) -> Result<RecordBatch> {
    // Nested columns: the table numbers the fields inside them its own way.
    let cols = to
        .fields()
        .iter()
        .map(|f| {
            Ok(crate::core::nested::conform(
                column(batch, f.name())?,
                f.data_type(),
            )?)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(to, cols)?)
}

fn column<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a ArrayRef> {
    batch.column_by_name(name).ok_or_else(|| Error::State {
        code: codes::STATE_SCHEMA,
        message: format!(
            "the state table has no column `{name}`; it was not written by this version of autocdc"
        ),
    })
}

/// Encodes the events of `keys` as one batch of the state table, stamped
/// `generation`: per `(key, events, starts)` (`History::dirty`), every
/// event, each marked as starting the key, when `starts`; else the changed
/// among them.
pub fn history_to_batch<'a>(
    flow: &Flow,
    codec: &Codec,
    hc: &HistCodec,
    hist: &History,
    keys: impl Iterator<Item = (&'a [u8], &'a [Event], bool)>,
    generation: i64,
) -> Result<RecordBatch> {
    let mut rows = EntryRows::new(codec);
    let mut starting = BooleanBuilder::new();
    let mut vals: Vec<Vec<&[u8]>> = vec![Vec::new(); hc.cols.len()];
    for (key, events, starts) in keys {
        for e in events.iter().filter(|e| starts || e.changed()) {
            let loc = e.loc().map(|l| (hist.files.path(l.file), l.pos));
            rows.push(key, e.seq(), e.fp(), e.deleted_at_ms(), loc);
            starting.append_value(starts);
            for (j, v) in e.vals().iter().enumerate() {
                vals[j].push(v);
            }
        }
    }
    let mut cols = rows.finish(generation)?;
    cols.push(Arc::new(starting.finish()));
    for (j, v) in vals.into_iter().enumerate() {
        cols.push(hc.decode(j, v.into_iter())?);
    }
    cast_to_schema(cols, &arrow_schema(flow)?)
}

/// The row converters give back the source types; the schema may differ (e.g. field metadata).
fn cast_to_schema(cols: Vec<ArrayRef>, schema: &SchemaRef) -> Result<RecordBatch> {
    let cols = cols
        .into_iter()
        .zip(schema.fields())
        .map(|(c, f)| {
            if c.data_type() == f.data_type() {
                Ok(c)
            } else {
                arrow_cast::cast(&c, f.data_type())
            }
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(RecordBatch::try_new(schema.clone(), cols)?)
}

/// Loads state-table batches of a history flow: per key, its rows from
/// the latest generation that starts it (`COL_STARTS`), and of those the
/// latest generation's row of each sequence. (A key's events only grow,
/// or are replaced at the same sequence, but for a key forgotten when its
/// tombstone was collected: put again, it starts anew.) Returns the
/// number of rows read.
pub fn load_history(
    flow: &Flow,
    codec: &Codec,
    hc: &HistCodec,
    hist: &mut History,
    batches: &[RecordBatch],
) -> Result<usize> {
    // Per key: the generation it starts at, and (generation, event) of its
    // rows from there on.
    type Rows = (i64, Vec<(i64, Event)>);
    let mut keys: HashMap<Box<[u8]>, Rows> = HashMap::new();
    // A row written before the column: SCD Type 2 appended, the others
    // wrote each touched key whole.
    let unmarked_starts = !flow.scd2;
    let mut total = 0;
    for batch in batches {
        let k = codec.keys.convert_columns(&key_columns(flow, batch)?)?;
        let s = codec.seqs.convert_columns(&seq_columns(flow, batch)?)?;
        let g = column(batch, COL_GENERATION)?.as_primitive::<Int64Type>();
        let fp = column(batch, COL_FINGERPRINT)?.as_primitive::<Int64Type>();
        let del = column(batch, COL_DELETED_AT)?.as_primitive::<Int64Type>();
        let file = column(batch, COL_FILE)?.as_string::<i32>();
        let pos = column(batch, COL_POS)?.as_primitive::<Int64Type>();
        let starts = batch
            .column_by_name(COL_STARTS)
            .map(|c| {
                c.as_boolean_opt().ok_or_else(|| Error::State {
                    code: codes::STATE_SCHEMA,
                    message: format!(
                        "state column `{COL_STARTS}` is {}, not boolean",
                        c.data_type()
                    ),
                })
            })
            .transpose()?;
        let vals = hc
            .cols
            .iter()
            .map(|&c| {
                let a = column(batch, &val_col(flow.column_name(c)))?;
                let a = arrow_cast::cast(a, flow.source_arrow.field(c).data_type())?;
                Ok(a)
            })
            .collect::<Result<Vec<_>>>()?;
        let vals = hc.encode_columns(&vals)?;
        for r in 0..batch.num_rows() {
            total += 1;
            let loc = if file.is_valid(r) && pos.is_valid(r) {
                let p = u32::try_from(pos.value(r)).map_err(|_| Error::State {
                    code: codes::POSITION,
                    message: format!("state row position {} out of range", pos.value(r)),
                })?;
                Some(Loc {
                    file: hist.files.intern(file.value(r)),
                    pos: p,
                })
            } else {
                None
            };
            let event = Event::new(
                s.row(r).data(),
                vals.iter().map(|v| v.row(r).data()),
                fp.value(r) as u64,
                del.is_valid(r).then(|| del.value(r)),
                loc,
            );
            let gen_ = g.value(r);
            let starts = match starts {
                Some(a) if a.is_valid(r) => a.value(r),
                _ => unmarked_starts,
            };
            let (from, rows) = keys
                .entry(k.row(r).data().into())
                .or_insert_with(|| (i64::MIN, Vec::new()));
            if starts && gen_ > *from {
                *from = gen_;
                rows.retain(|(g, _)| *g >= gen_);
            }
            if gen_ >= *from {
                rows.push((gen_, event));
            }
        }
    }
    for (key, (_, mut events)) in keys {
        // By sequence, the highest generation first; then one per sequence.
        events.sort_by(|(ga, a), (gb, b)| a.seq().cmp(b.seq()).then(gb.cmp(ga)));
        events.dedup_by(|(_, later), (_, first)| later.seq() == first.seq());
        hist.put(None, key, 0, events.into_iter().map(|(_, e)| e).collect());
    }
    hist.clear_dirty();
    Ok(total)
}
