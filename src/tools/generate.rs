//! The synthetic feeds, one module for every tool that needs input:
//! `changes` (random upserts and deletes over a key range, shuffled
//! sequences: `bench`, `bench-serve`, `soak`) and the "ghost kitchen" feed
//! (`gen`, `demo`).
//!
//! Synthetic "ghost kitchen" change feed.
//!
//! A delivery-only restaurant's order lifecycle log:
//! `order_created -> kitchen_started -> order_ready -> driver_picked_up ->
//! driver_ping (15..=25 times) -> delivered`, where ~6% of orders end in
//! `order_cancelled` after a random prefix of their lifecycle instead.
//!
//! Events are globally ordered by time, cut into micro-batch files and then
//! deliberately disordered (late events, exact duplicates, a few null keys,
//! neighbour swaps). Everything is deterministic for a given [`GhostKitchen`].

use std::fmt::Write as _;
use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::builder::{Int32Builder, Int64Builder, StringBuilder};
use arrow_array::{Array, ArrayRef, Int32Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{ArrowError, DataType, Field, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// First second of the generated day (2026-01-01T00:00:00Z).
pub const EPOCH_SECONDS: i64 = 1_767_225_600;
const DAY_SECONDS: i64 = 86_400;
const LOCATIONS: i32 = 40;
const CANCEL_PROBABILITY: f64 = 0.06;
/// Upper bound on `files`, so a silly config cannot request absurd allocations.
pub const MAX_FILES: usize = 1 << 20;

/// Event kinds are indexes into these tables.
const EVENT_TYPES: [&str; 7] = [
    "order_created",
    "kitchen_started",
    "order_ready",
    "driver_picked_up",
    "driver_ping",
    "delivered",
    "order_cancelled",
];
/// Seconds elapsed before an event of each kind (inclusive range).
const GAPS: [(i64, i64); 7] = [
    (0, 0),
    (5, 45),
    (20, 90),
    (5, 60),
    (10, 30),
    (5, 30),
    (3, 60),
];
const PING: u8 = 4;
const DELIVERED: u8 = 5;
const CANCELLED: u8 = 6;

/// Generator configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct GhostKitchen {
    /// Number of orders (~25 events each).
    pub orders: usize,
    /// RNG seed; same config => identical output.
    pub seed: u64,
    /// Number of micro-batch files (clamped to `1..=MAX_FILES`).
    pub files: usize,
    /// Probability that an event is delivered 1..=3 files late (clamped to 0..=1; NaN = 0).
    pub late_fraction: f64,
    /// Probability that an event gets an exact duplicate (clamped to 0..=1; NaN = 0).
    pub duplicate_fraction: f64,
    /// Inject `max(1, round(events / 100_000))` null `order_id`s when there are >= 1000 events.
    pub null_keys: bool,
}

impl Default for GhostKitchen {
    fn default() -> Self {
        Self {
            orders: 1000,
            seed: 42,
            files: 10,
            late_fraction: 0.03,
            duplicate_fraction: 0.02,
            null_keys: true,
        }
    }
}

/// What [`generate`] produced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GenStats {
    pub orders: usize,
    /// Distinct lifecycle events (rows delivered = `events + duplicates`).
    pub events: usize,
    pub cancelled_orders: usize,
    /// Events moved into a later file than events that happened after them.
    pub late_events: usize,
    /// Extra exact copies of rows.
    pub duplicates: usize,
    /// Rows whose `order_id` is null (never duplicated, never a terminal event).
    pub null_key_events: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum GenError {
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    #[error("parquet error: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    #[error("arrow error: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
}

#[derive(Debug, Clone, Copy)]
struct Event {
    order_id: i64,
    ts: i64,
    location: i32,
    sequence: i32,
    kind: u8,
    null_key: bool,
}

/// The Arrow schema of the feed.
pub fn ghost_kitchen_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("order_id", DataType::Int64, true),
        Field::new("event_type", DataType::Utf8, false),
        Field::new("location_id", DataType::Int32, false),
        Field::new("ts_seconds", DataType::Int64, false),
        Field::new("sequence", DataType::Int32, false),
        Field::new("status", DataType::Utf8, false),
        Field::new("op", DataType::Utf8, false),
        Field::new("seq", DataType::Int64, false),
    ]))
}

fn clamp_fraction(p: f64) -> f64 {
    if p.is_nan() { 0.0 } else { p.clamp(0.0, 1.0) }
}

/// Kind of the `i`-th event of a non-cancelled lifecycle with `pings` pings.
fn kind_at(i: usize, pings: usize) -> u8 {
    match i {
        0..4 => i as u8,
        i if i < 4 + pings => PING,
        _ => DELIVERED,
    }
}

/// Appends one order's lifecycle; returns whether it was cancelled.
fn push_order(rng: &mut StdRng, order_id: i64, start: i64, events: &mut Vec<Event>) -> bool {
    let location = rng.random_range(1..=LOCATIONS);
    let pings: usize = rng.random_range(15..=25);
    let full_len = 5 + pings;
    let cancel_at =
        (rng.random::<f64>() < CANCEL_PROBABILITY).then(|| rng.random_range(1..full_len));
    let len = cancel_at.map_or(full_len, |k| k + 1);
    let mut ts = start;
    for i in 0..len {
        let kind = if cancel_at == Some(i) {
            CANCELLED
        } else {
            kind_at(i, pings)
        };
        if i > 0 {
            let (lo, hi) = GAPS[kind as usize];
            ts += rng.random_range(lo..=hi);
        }
        // i < 31, so the cast is lossless.
        events.push(Event {
            order_id,
            ts,
            location,
            sequence: i as i32 + 1,
            kind,
            null_key: false,
        });
    }
    cancel_at.is_some()
}

/// Generates the feed as one RecordBatch per micro-batch file, in delivery order.
/// Deterministic for a given config. Always returns `clamp(files, 1, MAX_FILES)` batches
/// (some may be empty when there are fewer events than files).
pub fn generate(cfg: &GhostKitchen) -> (Vec<RecordBatch>, GenStats) {
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let n_files = cfg.files.clamp(1, MAX_FILES);
    let last_file = n_files - 1;
    let late_p = clamp_fraction(cfg.late_fraction);
    let dup_p = clamp_fraction(cfg.duplicate_fraction);
    let mut stats = GenStats {
        orders: cfg.orders,
        ..GenStats::default()
    };

    // Orders start uniformly over one day; order ids increase with start time.
    let mut starts: Vec<i64> = (0..cfg.orders)
        .map(|_| EPOCH_SECONDS + rng.random_range(0..DAY_SECONDS))
        .collect();
    starts.sort_unstable();
    let mut events: Vec<Event> = Vec::with_capacity(cfg.orders.saturating_mul(26).min(1 << 28));
    for (i, &start) in starts.iter().enumerate() {
        if push_order(&mut rng, i as i64 + 1, start, &mut events) {
            stats.cancelled_orders += 1;
        }
    }
    drop(starts);
    events.sort_unstable_by_key(|e| (e.ts, e.order_id, e.sequence));
    let n = events.len();
    stats.events = n;

    // A few null keys, never on terminal events (so each order still ends properly).
    let null_target = if cfg.null_keys && n >= 1000 {
        ((n as f64 / 100_000.0).round() as usize).max(1)
    } else {
        0
    };
    let mut attempts = null_target.saturating_mul(50);
    while stats.null_key_events < null_target && attempts > 0 {
        attempts -= 1;
        let e = &mut events[rng.random_range(0..n)];
        if !e.null_key && e.kind != DELIVERED && e.kind != CANCELLED {
            e.null_key = true;
            stats.null_key_events += 1;
        }
    }

    // Consecutive, roughly equal chunks of the time-ordered events.
    let chunk_start = |f: usize| ((f as u128 * n as u128) / n_files as u128) as usize;
    let chunk_len: Vec<u64> = (0..n_files)
        .map(|f| (chunk_start(f + 1) - chunk_start(f)) as u64)
        .collect();
    // Per file: (ordering key, event index). Native rows get even keys in time order;
    // injected (late / duplicate) rows get a random odd key, i.e. land at a random position.
    let mut slots: Vec<Vec<(u64, usize)>> = chunk_len
        .iter()
        .map(|&l| Vec::with_capacity(l as usize + (l as usize) / 16))
        .collect();
    let random_key = |rng: &mut StdRng, f: usize| rng.random_range(0..=chunk_len[f]) * 2 + 1;
    let mut file = 0usize;
    for (i, ev) in events.iter().enumerate() {
        while file < last_file && i >= chunk_start(file + 1) {
            file += 1;
        }
        let mut placed = file;
        if file < last_file && rng.random::<f64>() < late_p {
            placed = (file + rng.random_range(1..=3usize)).min(last_file);
            stats.late_events += 1;
            let key = random_key(&mut rng, placed);
            slots[placed].push((key, i));
        } else {
            let key = ((i - chunk_start(file)) as u64) * 2;
            slots[file].push((key, i));
        }
        if !ev.null_key && rng.random::<f64>() < dup_p {
            let dest = (placed + rng.random_range(0..=2usize)).min(last_file);
            stats.duplicates += 1;
            let key = random_key(&mut rng, dest);
            slots[dest].push((key, i));
        }
    }

    let schema = ghost_kitchen_schema();
    let mut batches = Vec::with_capacity(n_files);
    for file_slots in &mut slots {
        file_slots.sort_by_key(|s| s.0); // stable: deterministic on equal keys
        let len = file_slots.len();
        if len >= 2 {
            for _ in 0..len / 100 + 1 {
                let p = rng.random_range(0..len - 1);
                file_slots.swap(p, p + 1);
            }
        }
        let batch = build_batch(&schema, &events, file_slots);
        debug_assert!(batch.is_ok(), "{batch:?}");
        batches.push(batch.unwrap_or_else(|_| RecordBatch::new_empty(schema.clone())));
    }
    (batches, stats)
}

fn build_batch(
    schema: &SchemaRef,
    events: &[Event],
    slots: &[(u64, usize)],
) -> Result<RecordBatch, ArrowError> {
    let len = slots.len();
    let mut order_id = Int64Builder::with_capacity(len);
    let mut event_type = StringBuilder::with_capacity(len, len * 12);
    let mut location = Int32Builder::with_capacity(len);
    let mut ts = Int64Builder::with_capacity(len);
    let mut sequence = Int32Builder::with_capacity(len);
    let mut op = StringBuilder::with_capacity(len, len * 6);
    let mut seq = Int64Builder::with_capacity(len);
    for &(_, idx) in slots {
        let Some(e) = events.get(idx) else { continue };
        if e.null_key {
            order_id.append_null();
        } else {
            order_id.append_value(e.order_id);
        }
        event_type.append_value(EVENT_TYPES[e.kind as usize]);
        location.append_value(e.location);
        ts.append_value(e.ts);
        sequence.append_value(e.sequence);
        op.append_value(if e.kind == CANCELLED {
            "DELETE"
        } else {
            "UPSERT"
        });
        seq.append_value(e.ts * 100 + i64::from(e.sequence));
    }
    let event_type: ArrayRef = Arc::new(event_type.finish());
    RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(order_id.finish()),
            event_type.clone(),
            Arc::new(location.finish()),
            Arc::new(ts.finish()),
            Arc::new(sequence.finish()),
            event_type, // status = event_type
            Arc::new(op.finish()),
            Arc::new(seq.finish()),
        ],
    )
}

fn part_path(dir: &Path, index: usize, ext: &str) -> PathBuf {
    dir.join(format!("part-{index:05}.{ext}"))
}

/// Writes the batches as `part-00000.parquet`, `part-00001.parquet`, ... (zstd) into `dir`
/// (created if missing); returns the paths.
pub fn write_parquet(dir: &Path, batches: &[RecordBatch]) -> Result<Vec<PathBuf>, GenError> {
    fs::create_dir_all(dir)?;
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .build();
    let mut paths = Vec::with_capacity(batches.len());
    for (i, batch) in batches.iter().enumerate() {
        let path = part_path(dir, i, "parquet");
        let file = File::create(&path)?;
        let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(props.clone()))?;
        writer.write(batch)?;
        writer.close()?;
        paths.push(path);
    }
    Ok(paths)
}

/// Writes one JSON value; the column type has been checked by the caller.
fn write_json_value(w: &mut impl Write, col: &dyn Array, row: usize) -> io::Result<()> {
    let any = col.as_any();
    if col.is_null(row) {
        w.write_all(b"null")
    } else if let Some(a) = any.downcast_ref::<Int64Array>() {
        write!(w, "{}", a.value(row))
    } else if let Some(a) = any.downcast_ref::<Int32Array>() {
        write!(w, "{}", a.value(row))
    } else if let Some(a) = any.downcast_ref::<StringArray>() {
        serde_json::to_writer(w, a.value(row)).map_err(io::Error::from)
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "unsupported column type",
        ))
    }
}

/// Same as [`write_parquet`], as newline-delimited JSON `part-00000.ndjson`, ...
/// (one JSON object per row; nulls written as `null`). Supports Int64, Int32 and Utf8 columns.
pub fn write_ndjson(dir: &Path, batches: &[RecordBatch]) -> Result<Vec<PathBuf>, GenError> {
    fs::create_dir_all(dir)?;
    let mut paths = Vec::with_capacity(batches.len());
    for (i, batch) in batches.iter().enumerate() {
        let schema = batch.schema();
        let mut keys = Vec::with_capacity(batch.num_columns());
        for field in schema.fields() {
            if !matches!(
                field.data_type(),
                DataType::Int64 | DataType::Int32 | DataType::Utf8
            ) {
                let msg = format!(
                    "write_ndjson: column {} is {}",
                    field.name(),
                    field.data_type()
                );
                return Err(ArrowError::NotYetImplemented(msg).into());
            }
            // `"name":` with the name JSON-escaped.
            keys.push(serde_json::to_string(field.name()).map_err(io::Error::from)? + ":");
        }
        let path = part_path(dir, i, "ndjson");
        let mut w = BufWriter::with_capacity(1 << 16, File::create(&path)?);
        for row in 0..batch.num_rows() {
            w.write_all(b"{")?;
            for (c, (key, col)) in keys.iter().zip(batch.columns()).enumerate() {
                if c > 0 {
                    w.write_all(b",")?;
                }
                w.write_all(key.as_bytes())?;
                write_json_value(&mut w, col.as_ref(), row)?;
            }
            w.write_all(b"}\n")?;
        }
        w.flush()?;
        paths.push(path);
    }
    Ok(paths)
}

/// TOML basic string literal (quoted and escaped).
fn toml_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
            out.push(c);
        } else if c.is_control() {
            let _ = write!(out, "\\u{:04X}", c as u32);
        } else {
            out.push(c);
        }
    }
    out.push('"');
    out
}

/// The flow definition matching this feed, as TOML text for a `[[flow]]` entry.
pub fn ghost_kitchen_flow_toml(name: &str, target: &str) -> String {
    format!(
        r#"[[flow]]
name = {}
target = {}
keys = ["order_id"]
sequence_by = ["seq"]
apply_as_deletes = "op = 'DELETE'"
except_column_list = ["op"]
columns = [
  {{ name = "order_id", type = "long", required = true }},
  {{ name = "event_type", type = "string", required = true }},
  {{ name = "location_id", type = "int", required = true }},
  {{ name = "ts_seconds", type = "long", required = true }},
  {{ name = "sequence", type = "int", required = true }},
  {{ name = "status", type = "string", required = true }},
  {{ name = "op", type = "string", required = true }},
  {{ name = "seq", type = "long", required = true }},
]
"#,
        toml_string(name),
        toml_string(target)
    )
}

/// The flow the `changes` feed fits: `id` keys it, `seq` orders it,
/// `op = 'DELETE'` deletes; `amount` and `note` are values.
pub const CHANGES_FLOW: &str = r#"
name = "changes"
target = "bench.events"
keys = ["id"]
sequence_by = "seq"
apply_as_deletes = "op = 'DELETE'"
columns = [
  { name = "id", type = "long", required = true },
  { name = "seq", type = "long", required = true },
  { name = "op", type = "string", required = true },
  { name = "amount", type = "double" },
  { name = "note", type = "string" },
]
"#;

/// `CHANGES_FLOW` named `name`, writing `target`.
pub fn changes_flow(name: &str, target: &str) -> crate::Result<crate::core::flow::FlowConfig> {
    let mut cfg: crate::core::flow::FlowConfig =
        toml::from_str(CHANGES_FLOW).map_err(|e| crate::Error::Config(e.to_string()))?;
    cfg.name = name.to_string();
    cfg.target = target.to_string();
    Ok(cfg)
}

/// `n` change events of `CHANGES_FLOW` (in `schema`, its source schema)
/// over ids `key_base..key_base + keys`, with the unique sequences
/// `seq_base..seq_base + n` shuffled; about `delete_fraction` are deletes.
pub fn changes(
    schema: &SchemaRef,
    rng: &mut StdRng,
    n: usize,
    keys: usize,
    key_base: i64,
    seq_base: i64,
    delete_fraction: f64,
) -> crate::Result<RecordBatch> {
    use rand::seq::SliceRandom;
    let mut seqs: Vec<i64> = (0..n as i64).map(|s| s + seq_base).collect();
    seqs.shuffle(rng);
    let ids: Vec<i64> = (0..n)
        .map(|_| key_base + rng.random_range(0..keys.max(1) as i64))
        .collect();
    let ops: Vec<&str> = (0..n)
        .map(|_| {
            if rng.random::<f64>() < delete_fraction {
                "DELETE"
            } else {
                "UPSERT"
            }
        })
        .collect();
    let amount: Vec<f64> = (0..n).map(|_| rng.random_range(0.0..1000.0)).collect();
    let notes = ["new", "paid", "shipped", "returned"];
    let note: Vec<&str> = (0..n)
        .map(|_| notes[rng.random_range(0..notes.len())])
        .collect();
    let cols: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(ids)),
        Arc::new(Int64Array::from(seqs)),
        Arc::new(StringArray::from(ops)),
        Arc::new(arrow_array::Float64Array::from(amount)),
        Arc::new(StringArray::from(note)),
    ];
    Ok(RecordBatch::try_new(schema.clone(), cols)?)
}

/// `CHANGES_FLOW`'s columns as a Debezium flow: its sequence and deletes
/// come from the events (`to_debezium`).
pub const DEBEZIUM_FLOW: &str = r#"
name = "changes"
target = "bench.events"
keys = ["id"]
format = "debezium"
source_table = "public.events"
columns = [
  { name = "id", type = "long", required = true },
  { name = "amount", type = "double" },
  { name = "note", type = "string" },
]
"#;

/// A batch of `CHANGES_FLOW` (`changes`) as a JSON array of the Debezium
/// events PostgreSQL's connector would send for it (schemas on, as the
/// JSON converter's default): `seq` becomes the transaction's position,
/// `DELETE` a `d` with the key in `before`, anything else a `u`.
pub fn to_debezium(batch: &RecordBatch) -> crate::Result<Vec<u8>> {
    use arrow_array::Array;
    use serde_json::{Value, json};
    let col = |i: usize| batch.column(i).as_any();
    let (Some(id), Some(seq), Some(op), Some(amount), Some(note)) = (
        col(0).downcast_ref::<Int64Array>(),
        col(1).downcast_ref::<Int64Array>(),
        col(2).downcast_ref::<StringArray>(),
        col(3).downcast_ref::<arrow_array::Float64Array>(),
        col(4).downcast_ref::<StringArray>(),
    ) else {
        return Err(crate::Error::Config("not a batch of CHANGES_FLOW".into()));
    };
    let row = |name: &str| {
        json!({"type": "struct", "optional": true, "field": name, "name": "bench.public.events.Value", "fields": [
            {"type": "int64", "optional": false, "field": "id"},
            {"type": "double", "optional": true, "field": "amount"},
            {"type": "string", "optional": true, "field": "note"}
        ]})
    };
    let schema = json!({"type": "struct", "optional": false, "name": "bench.public.events.Envelope", "version": 2, "fields": [
        row("before"), row("after"),
        {"type": "struct", "optional": false, "field": "source", "name": "io.debezium.connector.postgresql.Source", "fields": [
            {"type": "string", "optional": false, "field": "version"},
            {"type": "string", "optional": false, "field": "connector"},
            {"type": "string", "optional": false, "field": "name"},
            {"type": "int64", "optional": false, "field": "ts_ms"},
            {"type": "string", "optional": true, "field": "snapshot"},
            {"type": "string", "optional": false, "field": "db"},
            {"type": "string", "optional": true, "field": "sequence"},
            {"type": "string", "optional": false, "field": "schema"},
            {"type": "string", "optional": false, "field": "table"},
            {"type": "int64", "optional": true, "field": "txId"},
            {"type": "int64", "optional": true, "field": "lsn"}
        ]},
        {"type": "string", "optional": false, "field": "op"},
        {"type": "int64", "optional": true, "field": "ts_ms"}
    ]});
    // As Debezium's JSON converter writes them: the schema first, then the
    // payload (the reader skips a schema it has seen by its bytes).
    let schema = schema.to_string();
    let mut out = b"[".to_vec();
    for i in 0..batch.num_rows() {
        let s = seq.value(i);
        let image = json!({"id": id.value(i), "amount": amount.value(i), "note": note.value(i)});
        let delete = op.value(i) == "DELETE";
        let payload = json!({
            "before": if delete { json!({"id": id.value(i), "amount": null, "note": null}) } else { Value::Null },
            "after": if delete { Value::Null } else { image },
            "source": {"version": "3.6.3.Final", "connector": "postgresql", "name": "bench", "ts_ms": 0,
                       "snapshot": "false", "db": "bench", "sequence": format!("[\"{s}\",\"{s}\"]"),
                       "schema": "public", "table": "events", "txId": s, "lsn": s},
            "op": if delete { "d" } else { "u" },
            "ts_ms": 0
        });
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"schema\":");
        out.extend_from_slice(schema.as_bytes());
        out.extend_from_slice(b",\"payload\":");
        serde_json::to_writer(&mut out, &payload)?;
        out.push(b'}');
    }
    out.push(b']');
    Ok(out)
}

/// `batch` as NDJSON.
pub fn to_ndjson(batch: &RecordBatch) -> crate::Result<Vec<u8>> {
    let mut w = arrow_json::LineDelimitedWriter::new(Vec::new());
    w.write(batch)?;
    w.finish()?;
    Ok(w.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};

    /// (order_id, event_type, location_id, ts_seconds, sequence, status, op, seq)
    type Row = (Option<i64>, String, i32, i64, i32, String, String, i64);

    fn i64s(b: &RecordBatch, i: usize) -> &Int64Array {
        b.column(i).as_any().downcast_ref().unwrap()
    }
    fn i32s(b: &RecordBatch, i: usize) -> &Int32Array {
        b.column(i).as_any().downcast_ref().unwrap()
    }
    fn strs(b: &RecordBatch, i: usize) -> &StringArray {
        b.column(i).as_any().downcast_ref().unwrap()
    }

    /// (file index, row) for every delivered row, in delivery order.
    fn rows(batches: &[RecordBatch]) -> Vec<(usize, Row)> {
        let mut out = Vec::new();
        for (f, b) in batches.iter().enumerate() {
            let (oid, et, loc) = (i64s(b, 0), strs(b, 1), i32s(b, 2));
            let (ts, sq, st, op, seq) =
                (i64s(b, 3), i32s(b, 4), strs(b, 5), strs(b, 6), i64s(b, 7));
            for r in 0..b.num_rows() {
                let id = (!oid.is_null(r)).then(|| oid.value(r));
                let (e, s, o) = (et.value(r).into(), st.value(r).into(), op.value(r).into());
                let (l, t, q) = (loc.value(r), ts.value(r), sq.value(r));
                out.push((f, (id, e, l, t, q, s, o, seq.value(r))));
            }
        }
        out
    }

    fn cfg(orders: usize, seed: u64) -> GhostKitchen {
        GhostKitchen {
            orders,
            seed,
            ..GhostKitchen::default()
        }
    }

    /// Generates with the default config modified by `tweak`.
    fn run(tweak: impl FnOnce(&mut GhostKitchen)) -> (Vec<RecordBatch>, GenStats) {
        let mut c = GhostKitchen::default();
        tweak(&mut c);
        generate(&c)
    }

    #[test]
    fn deterministic_per_seed() {
        let (a, sa) = generate(&GhostKitchen::default());
        let (b, sb) = generate(&GhostKitchen::default());
        assert_eq!((&a, &sa), (&b, &sb));
        assert_ne!(a, generate(&cfg(1000, 43)).0);
        assert_eq!(a.len(), 10);
        assert!(a.iter().all(|x| x.schema() == ghost_kitchen_schema()));
    }

    #[test]
    fn event_counts_and_cancel_fraction() {
        let (batches, stats) = generate(&cfg(2000, 7));
        let avg = stats.events as f64 / stats.orders as f64;
        assert!((15.0..=35.0).contains(&avg), "avg {avg}");
        let sizes: Vec<usize> = batches.iter().map(|b| b.num_rows()).collect();
        assert_eq!(sizes.iter().sum::<usize>(), stats.events + stats.duplicates);
        let (min, max) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
        assert!(*max < min * 2, "files should be roughly equal: {sizes:?}");

        let (batches, stats) = generate(&cfg(5000, 11));
        let frac = stats.cancelled_orders as f64 / stats.orders as f64;
        assert!((0.03..=0.09).contains(&frac), "cancelled {frac}");
        let cancelled: HashSet<i64> = rows(&batches)
            .into_iter()
            .filter_map(|(_, r)| r.0.filter(|_| r.1 == "order_cancelled"))
            .collect();
        assert_eq!(cancelled.len(), stats.cancelled_orders);
    }

    #[test]
    fn feed_invariants() {
        let (batches, stats) = generate(&GhostKitchen::default());
        let all = rows(&batches);
        assert!(stats.late_events > 0 && stats.duplicates > 0 && stats.null_key_events > 0);
        // Projection columns.
        for (_, r) in &all {
            assert_eq!(r.6 == "DELETE", r.1 == "order_cancelled", "{r:?}");
            assert!(r.6 == "DELETE" || r.6 == "UPSERT");
            assert_eq!(r.5, r.1, "status = event_type");
            assert_eq!(r.7, r.3 * 100 + i64::from(r.4));
            assert!((1..=LOCATIONS).contains(&r.2) && (1..100).contains(&r.4));
            assert!(r.3 >= EPOCH_SECONDS && r.3 < EPOCH_SECONDS + 2 * DAY_SECONDS);
        }
        // Null keys.
        let nulls = all.iter().filter(|(_, r)| r.0.is_none()).count();
        assert_eq!(nulls, stats.null_key_events);
        // Duplicates are exact copies: (order_id, sequence) identifies an event.
        let mut by_key: HashMap<(Option<i64>, i32), &Row> = HashMap::new();
        let mut copies = 0;
        for (_, r) in &all {
            if let Some(prev) = by_key.insert((r.0, r.4), r) {
                assert!(r.0.is_none() || prev == r, "{prev:?} vs {r:?}");
                copies += usize::from(prev == r);
            }
        }
        assert_eq!(copies, stats.duplicates);
        // Every order's last event by seq is terminal; lateness exists.
        let mut per_order: HashMap<i64, Vec<(i64, usize, &str)>> = HashMap::new();
        for (f, r) in &all {
            if let Some(oid) = r.0 {
                per_order.entry(oid).or_default().push((r.7, *f, &r.1));
            }
        }
        assert_eq!(per_order.len(), stats.orders);
        for (oid, evs) in &per_order {
            let last = evs.iter().max_by_key(|e| e.0).unwrap().2;
            assert!(
                matches!(last, "delivered" | "order_cancelled"),
                "{oid}: {last}"
            );
        }
        // An event delivered in a later file than a newer event of the same order.
        let late = |evs: &Vec<(i64, usize, &str)>| {
            evs.iter()
                .any(|a| evs.iter().any(|b| b.0 > a.0 && b.1 < a.1))
        };
        assert!(per_order.values().any(late));
        // Rows within a file are not sorted by time.
        let unsorted = |w: &[(usize, Row)]| w[0].0 == w[1].0 && w[0].1.3 > w[1].1.3;
        assert!(all.windows(2).any(unsorted));
    }

    #[test]
    fn null_keys_toggle() {
        let (batches, stats) = run(|c| c.null_keys = false);
        assert_eq!(stats.null_key_events, 0);
        assert!(batches.iter().all(|b| b.column(0).null_count() == 0));
        assert_eq!(generate(&cfg(10, 1)).1.null_key_events, 0);
    }

    #[test]
    fn parquet_and_ndjson_round_trip() {
        use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
        let (batches, stats) = generate(&cfg(300, 21));
        let dir = tempfile::tempdir().unwrap();
        let paths = write_parquet(&dir.path().join("pq").join("nested"), &batches).unwrap();
        assert_eq!(paths.len(), batches.len());
        assert!(paths[0].ends_with("part-00000.parquet"));
        for (path, batch) in paths.iter().zip(&batches) {
            let builder = ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap());
            let reader = builder.unwrap().build().unwrap();
            let back: Vec<RecordBatch> = reader.map(|b| b.unwrap()).collect();
            assert_eq!(
                back.iter().map(|b| b.num_rows()).sum::<usize>(),
                batch.num_rows()
            );
            assert_eq!(back[0].schema().fields(), batch.schema().fields());
        }
        let paths = write_ndjson(&dir.path().join("nd"), &batches).unwrap();
        assert!(paths[1].ends_with("part-00001.ndjson"));
        let (mut lines, mut null_ids) = (0, 0);
        for (path, batch) in paths.iter().zip(&batches) {
            let text = fs::read_to_string(path).unwrap();
            assert_eq!(text.lines().count(), batch.num_rows());
            for line in text.lines() {
                let v: serde_json::Value = serde_json::from_str(line).unwrap();
                assert_eq!(v.as_object().unwrap().len(), 8);
                null_ids += usize::from(v["order_id"].is_null());
                let int = |k: &str| v[k].as_i64().unwrap();
                assert_eq!(int("seq"), int("ts_seconds") * 100 + int("sequence"));
            }
            lines += text.lines().count();
        }
        assert_eq!(lines, stats.events + stats.duplicates);
        assert_eq!(null_ids, stats.null_key_events);
    }

    #[test]
    fn flow_toml_shape() {
        let expected = r#"[[flow]]
name = "gk"
target = "db.orders"
keys = ["order_id"]
sequence_by = ["seq"]
apply_as_deletes = "op = 'DELETE'"
except_column_list = ["op"]
columns = [
  { name = "order_id", type = "long", required = true },
  { name = "event_type", type = "string", required = true },
  { name = "location_id", type = "int", required = true },
  { name = "ts_seconds", type = "long", required = true },
  { name = "sequence", type = "int", required = true },
  { name = "status", type = "string", required = true },
  { name = "op", type = "string", required = true },
  { name = "seq", type = "long", required = true },
]
"#;
        assert_eq!(ghost_kitchen_flow_toml("gk", "db.orders"), expected);
        let weird = ghost_kitchen_flow_toml("a\"b\\c\n", "t\u{1}");
        assert!(weird.contains(r#"name = "a\"b\\c\u000A""#));
        assert!(weird.contains(r#"target = "t\u0001""#));
    }

    #[test]
    fn degenerate_configs_do_not_panic() {
        let (b, s) = run(|c| (c.orders, c.files) = (0, 0));
        assert_eq!((b.len(), s.events), (1, 0));
        let (b, s) = run(|c| {
            (c.orders, c.files) = (3, 500);
            (c.late_fraction, c.duplicate_fraction) = (f64::NAN, 7.0);
        });
        assert_eq!((b.len(), s.duplicates, s.late_events), (500, s.events, 0));
        let (b, s) = run(|c| (c.orders, c.files, c.late_fraction) = (50, 1, 1.0));
        assert_eq!((b.len(), s.late_events), (1, 0));
        let (b, s) = run(|c| (c.orders, c.late_fraction) = (50, -1.0));
        assert_eq!(s.late_events, 0);
        let dir = tempfile::tempdir().unwrap();
        assert!(write_ndjson(dir.path(), &b[..0]).unwrap().is_empty());
    }

    /// Timing probe: `cargo test timing_one_million -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn timing_one_million() {
        let t = std::time::Instant::now();
        let (batches, stats) = generate(&cfg(40_000, 1));
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        println!("generated {rows} rows in {:?}: {stats:?}", t.elapsed());
    }
}
