//! Debezium change events in: a body of events (one JSON object, a JSON
//! array of them as Debezium Server's HTTP sink sends with
//! `batch.enabled=true`, or NDJSON), each wrapped (`{"schema", "payload"}`,
//! the JSON converter's `schemas.enable=true`) or bare, read into a flow's
//! source rows with the hidden columns of `core::debezium` filled.
//!
//! Elements that are no change (tombstones, heartbeats, transaction
//! metadata, `m` messages) and changes of tables no flow takes are skipped
//! and counted, never refused: a refusal makes the sink retry, then stop.
//! A malformed event, a value that does not fit its column or a delete
//! without its key is refused with the event's index, and nothing of the
//! body is applied.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::{ArrayRef, BinaryArray, Int32Array, Int64Array, RecordBatch, StringArray};
use iceberg::spec::{PrimitiveType, Type};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::core::debezium::{self, Cell, Op, Position};
use crate::core::flow::Flow;
use crate::error::{Error, Result, codes};
use crate::service::input::{self, BodyFormat, Limits};

/// One change event of a body.
#[derive(Debug)]
pub struct Change {
    /// Its place in the body (0-based), for errors.
    pub index: usize,
    /// `schema.table` (`db.table` where the source has no schema).
    pub table: String,
    pub op: Op,
    payload: Value,
    /// The value schema, when the event is wrapped.
    schema: Option<Value>,
}

/// What a body held that is no change of a flow, by kind.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Skipped {
    /// Null values (the tombstone after a delete).
    pub tombstones: u64,
    /// Heartbeats and transaction metadata.
    pub not_changes: u64,
    /// Logical-decoding messages (`op = "m"`).
    pub messages: u64,
    /// Changes of tables no flow takes.
    pub other_tables: u64,
    /// Truncates of an SCD Type 2 flow's table (which keeps its history).
    pub truncates: u64,
}

impl Skipped {
    pub fn add(&mut self, o: &Skipped) {
        self.tombstones += o.tombstones;
        self.not_changes += o.not_changes;
        self.messages += o.messages;
        self.other_tables += o.other_tables;
        self.truncates += o.truncates;
    }
}

fn event_err(flow: &str, index: usize, message: String) -> Error {
    Error::Batch {
        code: codes::DEBEZIUM_EVENT,
        flow: flow.to_string(),
        row: index,
        column: String::new(),
        message,
    }
}

/// The elements of a body, under `limits.max_rows`.
pub fn elements<'a>(
    flow: &str,
    format: BodyFormat,
    body: &'a [u8],
    limits: Limits,
) -> Result<Vec<&'a [u8]>> {
    let too_many = || Error::Input {
        code: codes::BATCH_TOO_LARGE,
        flow: flow.to_string(),
        message: format!(
            "the body has more than {} events (server.max_rows_per_request); send fewer per request (the sink's batch.max-size)",
            limits.max_rows
        ),
    };
    match format {
        BodyFormat::Ndjson => {
            let rows: Vec<&[u8]> = body
                .split(|&b| b == b'\n')
                .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
                .map(<[u8]>::trim_ascii)
                .take(limits.max_rows.saturating_add(1))
                .collect();
            if rows.len() > limits.max_rows {
                return Err(too_many());
            }
            Ok(rows)
        }
        BodyFormat::JsonArray if !body.trim_ascii_start().starts_with(b"[") => {
            Ok(vec![body.trim_ascii()])
        }
        BodyFormat::JsonArray => {
            input::array_elements(body, limits.max_rows).map_err(|e| match e {
                None => too_many(),
                Some(why) => Error::Input {
                    code: codes::MALFORMED_BODY,
                    flow: flow.to_string(),
                    message: format!("the body is not a JSON array of events: {why}"),
                },
            })
        }
        BodyFormat::ArrowStream => Err(Error::Input {
            code: codes::DEBEZIUM_EVENT,
            flow: flow.to_string(),
            message: "Debezium events are JSON: send application/json or application/x-ndjson"
                .into(),
        }),
    }
}

/// Reads the elements of a body: its changes, and what it skipped.
/// `flow` names the flow (or the endpoint) in errors.
pub fn parse(flow: &str, elements: &[&[u8]]) -> Result<(Vec<Change>, Skipped)> {
    let mut changes = Vec::with_capacity(elements.len());
    let mut skipped = Skipped::default();
    for (index, bytes) in elements.iter().enumerate() {
        let value: Value = serde_json::from_slice(bytes)
            .map_err(|e| event_err(flow, index, format!("event {index} is not valid JSON: {e}")))?;
        let (payload, schema) = match value {
            Value::Object(mut o) if o.contains_key("payload") && o.len() <= 2 => {
                let schema = o.remove("schema").filter(|s| !s.is_null());
                (o.remove("payload").unwrap_or(Value::Null), schema)
            }
            v => (v, None),
        };
        let Value::Object(obj) = &payload else {
            if payload.is_null() {
                skipped.tombstones += 1;
                continue;
            }
            return Err(event_err(
                flow,
                index,
                format!(
                    "event {index} is {}, not a Debezium event object",
                    debezium::kind(&payload)
                ),
            ));
        };
        let Some(op) = obj.get("op") else {
            if not_a_change(obj, schema.as_ref()) {
                skipped.not_changes += 1;
                continue;
            }
            let hint = if obj.contains_key("__op") || obj.contains_key("__deleted") {
                " (events flattened by ExtractNewRecordState are not taken yet: remove the SMT)"
            } else {
                ""
            };
            return Err(event_err(
                flow,
                index,
                format!("event {index} has no `op`: it is not a Debezium change event{hint}"),
            ));
        };
        let op = match op.as_str() {
            Some("m") => {
                skipped.messages += 1;
                continue;
            }
            Some(s) => Op::parse(s),
            None => None,
        }
        .ok_or_else(|| {
            event_err(
                flow,
                index,
                format!("event {index} has op {op}; Debezium's are c, u, d, r, t and m"),
            )
        })?;
        let source = obj.get("source").filter(|s| s.is_object()).ok_or_else(|| {
            event_err(flow, index, format!("event {index} has no `source` block"))
        })?;
        let name = |k: &str| {
            source
                .get(k)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
        };
        let table = match (name("schema").or(name("db")), name("table")) {
            (Some(ns), Some(t)) => format!("{ns}.{t}"),
            _ => {
                return Err(event_err(
                    flow,
                    index,
                    format!(
                        "event {index}'s source names no table (source.schema or source.db, and source.table)"
                    ),
                ));
            }
        };
        changes.push(Change {
            index,
            table,
            op,
            payload,
            schema,
        });
    }
    Ok((changes, skipped))
}

/// A heartbeat (`{ts_ms}`, schema `...Heartbeat`) or transaction metadata
/// (`status` BEGIN / END).
fn not_a_change(obj: &Map<String, Value>, schema: Option<&Value>) -> bool {
    let named = schema
        .and_then(|s| s.get("name"))
        .and_then(Value::as_str)
        .is_some_and(|n| n.ends_with("Heartbeat") || n.ends_with("TransactionMetadataValue"));
    let status = obj
        .get("status")
        .and_then(Value::as_str)
        .is_some_and(|s| s == "BEGIN" || s == "END");
    named || status || (obj.len() == 1 && obj.contains_key("ts_ms"))
}

/// Whether `flow` takes `table`'s changes: its `source_table`, matched
/// regardless of ASCII case (a flow without one takes every table sent to
/// its own endpoint).
pub fn takes(flow: &Flow, table: &str) -> bool {
    flow.config
        .source_table
        .as_deref()
        .is_none_or(|t| t.eq_ignore_ascii_case(table))
}

/// The schema of the `after` (or `before`) row in an event's value schema.
fn row_schema<'a>(schema: Option<&'a Value>, which: &str) -> Option<&'a Vec<Value>> {
    schema?
        .get("fields")?
        .as_array()?
        .iter()
        .find(|f| f.get("field").and_then(Value::as_str) == Some(which))?
        .get("fields")?
        .as_array()
}

/// The rows of `changes` in `flow`'s source schema, hidden columns filled.
/// Unknown fields stay in the row, so the row decoder refuses them (or an
/// `add_columns` flow adds them), as for any push.
pub fn rows(flow: &Flow, changes: &[&Change], strict: bool) -> Result<(RecordBatch, Skipped)> {
    let mut skipped = Skipped::default();
    // Per row: its event's index in the body, and its op.
    let mut kept: Vec<(usize, Op)> = Vec::with_capacity(changes.len());
    let mut objects: Vec<Vec<u8>> = Vec::with_capacity(changes.len());
    let mut positions: Vec<Position> = Vec::with_capacity(changes.len());
    let binary: Vec<usize> = (0..flow.config.columns.len())
        .filter(|&i| flow.column_type(i) == Some(Type::Primitive(PrimitiveType::Binary)))
        .collect();
    let mut bytes: Vec<Vec<Option<Vec<u8>>>> =
        vec![Vec::with_capacity(changes.len()); binary.len()];
    for c in changes {
        let err = |m: String| event_err(&flow.name, c.index, m);
        if c.op == Op::Truncate && flow.truncates.is_none() {
            skipped.truncates += 1;
            continue;
        }
        let source = c.payload.get("source").unwrap_or(&Value::Null);
        let position =
            debezium::position(source, c.op).map_err(|m| err(format!("event {}: {m}", c.index)))?;
        if flow.truncates.is_some() && debezium::ends_snapshot(source, c.op) {
            // The table's snapshot is complete: a truncate just below its
            // reads removes what an earlier, partial snapshot left.
            objects.push(b"{}".to_vec());
            positions.push(position.snapshot_end());
            kept.push((c.index, Op::Truncate));
            for b in &mut bytes {
                b.push(None);
            }
        }
        let which = if c.op == Op::Delete {
            "before"
        } else {
            "after"
        };
        let row = match (c.op, c.payload.get(which)) {
            (Op::Truncate, _) => Map::new(),
            (_, Some(Value::Object(o))) => o.clone(),
            (Op::Delete, _) => {
                return Err(Error::Batch {
                    code: codes::DEBEZIUM_NO_KEY,
                    flow: flow.name.clone(),
                    row: c.index,
                    column: String::new(),
                    message: format!(
                        "event {} deletes a row of {} without its key (`before` is empty): set REPLICA IDENTITY DEFAULT or FULL on the source table",
                        c.index, c.table
                    ),
                });
            }
            (_, v) => {
                return Err(err(format!(
                    "event {} (op {}) has no `after` row (it is {})",
                    c.index,
                    c.op.code(),
                    v.map_or("missing", debezium::kind)
                )));
            }
        };
        let fields = row_schema(c.schema.as_ref(), which);
        let mut flat = Map::with_capacity(row.len());
        let mut row_bytes: Vec<Option<Vec<u8>>> = vec![None; binary.len()];
        for (name, v) in row {
            let Some(col) = flow.field_column(&name) else {
                flat.insert(name, v);
                continue;
            };
            let field = fields.and_then(|fs| {
                fs.iter()
                    .find(|f| f.get("field").and_then(Value::as_str) == Some(name.as_str()))
            });
            let ty = flow
                .column_type(col)
                .unwrap_or(Type::Primitive(PrimitiveType::String));
            let cell = debezium::decode_value(field, &v, &ty).map_err(|why| Error::Batch {
                code: codes::BAD_COLUMN,
                flow: flow.name.clone(),
                row: c.index,
                column: name.clone(),
                message: format!("event {}, field `{name}`: {why}", c.index),
            })?;
            match (binary.iter().position(|&b| b == col), cell) {
                (Some(b), Cell::Bytes(v)) => row_bytes[b] = Some(v),
                (Some(b), Cell::Json(Value::String(s))) => row_bytes[b] = Some(s.into_bytes()),
                (Some(_), Cell::Json(Value::Null)) => {}
                (Some(_), Cell::Json(other)) => {
                    return Err(Error::Batch {
                        code: codes::BAD_COLUMN,
                        flow: flow.name.clone(),
                        row: c.index,
                        column: name.clone(),
                        message: format!(
                            "event {}, field `{name}`: a binary column takes base64 text, not {}",
                            c.index,
                            debezium::kind(&other)
                        ),
                    });
                }
                (None, Cell::Json(v)) => {
                    flat.insert(name, v);
                }
                (None, Cell::Bytes(_)) => unreachable!("bytes only for binary columns"),
            }
        }
        for (b, v) in row_bytes.into_iter().enumerate() {
            bytes[b].push(v);
        }
        objects.push(serde_json::to_vec(&Value::Object(flat))?);
        positions.push(position);
        kept.push((c.index, c.op));
    }
    let refs: Vec<&[u8]> = objects.iter().map(Vec::as_slice).collect();
    let batch = input::decode_json_rows(flow, &refs, strict).map_err(|e| match e {
        // The decoder counts this flow's rows; the event's index is the body's.
        Error::Batch {
            code,
            flow,
            row,
            column,
            message,
        } => Error::Batch {
            code,
            flow,
            row: kept.get(row).map_or(row, |k| k.0),
            column,
            message,
        },
        e => e,
    })?;
    let mut cols: Vec<ArrayRef> = batch.columns().to_vec();
    for (b, &col) in binary.iter().enumerate() {
        cols[col] = Arc::new(BinaryArray::from_iter(
            bytes[b].iter().map(|v| v.as_deref()),
        ));
    }
    let hidden = flow.config.columns.len();
    cols[hidden] = Arc::new(StringArray::from_iter_values(
        kept.iter().map(|k| k.1.code()),
    ));
    cols[hidden + 1] = Arc::new(Int32Array::from_iter_values(
        positions.iter().map(|p| p.phase),
    ));
    for k in 0..4 {
        cols[hidden + 2 + k] = Arc::new(Int64Array::from_iter_values(
            positions.iter().map(|p| p.pos[k]),
        ));
    }
    cols[hidden + 6] = Arc::new(Int32Array::from_iter_values(
        positions.iter().map(|p| p.rank),
    ));
    Ok((
        RecordBatch::try_new(flow.source_arrow.clone(), cols)?,
        skipped,
    ))
}

/// A body pushed to one Debezium flow (`POST /v1/flows/{flow}/changes`,
/// `autocdc apply`): its events of the flow's `source_table` (all, without
/// one), the others skipped.
pub fn decode(
    flow: &Flow,
    format: BodyFormat,
    body: &[u8],
    limits: Limits,
    strict: bool,
) -> Result<(RecordBatch, Skipped)> {
    let elements = elements(&flow.name, format, body, limits)?;
    let (changes, mut skipped) = parse(&flow.name, &elements)?;
    let mine: Vec<&Change> = changes.iter().filter(|c| takes(flow, &c.table)).collect();
    skipped.other_tables += (changes.len() - mine.len()) as u64;
    let (batch, more) = rows(flow, &mine, strict)?;
    skipped.add(&more);
    Ok((batch, skipped))
}

/// Changes grouped by table, in body order within each.
pub fn by_table(changes: &[Change]) -> BTreeMap<&str, Vec<&Change>> {
    let mut out: BTreeMap<&str, Vec<&Change>> = BTreeMap::new();
    for c in changes {
        out.entry(c.table.as_str()).or_default().push(c);
    }
    out
}

/// `schema_evolution = "add_columns"`: the fields of the flow's events that
/// name no column, typed by the event's schema (so a column added at the
/// source arrives with its type, even while its values are null), else by
/// their JSON values (`infer`'s rules).
pub fn new_columns(
    flow: &Flow,
    format: BodyFormat,
    body: &[u8],
    limits: Limits,
) -> Result<Vec<crate::core::flow::ColumnDef>> {
    let elements = elements(&flow.name, format, body, limits)?;
    let (changes, _) = parse(&flow.name, &elements)?;
    let mut typed: Vec<arrow_schema::Field> = Vec::new();
    let mut untyped: Vec<Vec<u8>> = Vec::new();
    for c in changes.iter().filter(|c| takes(flow, &c.table)) {
        let which = if c.op == Op::Delete {
            "before"
        } else {
            "after"
        };
        let Some(Value::Object(row)) = c.payload.get(which) else {
            continue;
        };
        let fields = row_schema(c.schema.as_ref(), which);
        let mut rest = Map::new();
        for (name, v) in row {
            if flow.field_column(name).is_some() || typed.iter().any(|f| f.name() == name) {
                continue;
            }
            let field = fields.and_then(|fs| {
                fs.iter()
                    .find(|f| f.get("field").and_then(Value::as_str) == Some(name.as_str()))
            });
            match field.and_then(connect_type) {
                Some(t) => typed.push(arrow_schema::Field::new(name, t, true)),
                None => {
                    rest.insert(name.clone(), v.clone());
                }
            }
        }
        if !rest.is_empty() {
            untyped.push(serde_json::to_vec(&Value::Object(rest))?);
        }
    }
    let mut out = crate::service::infer::arrow_columns(flow, &arrow_schema::Schema::new(typed))?;
    let refs: Vec<&[u8]> = untyped.iter().map(Vec::as_slice).collect();
    for c in crate::service::infer::json_columns(flow, &refs)? {
        if !out.iter().any(|o| o.name == c.name) {
            out.push(c);
        }
    }
    Ok(out)
}

/// The Arrow type of a Kafka Connect field schema, by its logical name,
/// then its type.
fn connect_type(field: &Value) -> Option<arrow_schema::DataType> {
    use arrow_schema::{DataType as D, TimeUnit};
    let name = field.get("name").and_then(Value::as_str);
    let ty = field.get("type").and_then(Value::as_str)?;
    Some(match name {
        Some("org.apache.kafka.connect.data.Decimal") => {
            let param = |k: &str| {
                field
                    .get("parameters")?
                    .get(k)?
                    .as_str()?
                    .parse::<u8>()
                    .ok()
            };
            let scale = param("scale").filter(|&s| s <= 38)?;
            let precision = param("connect.decimal.precision")
                .unwrap_or(38)
                .clamp(scale.max(1), 38);
            D::Decimal128(precision, scale as i8)
        }
        Some("io.debezium.time.Date" | "org.apache.kafka.connect.data.Date") => D::Date32,
        Some(
            "io.debezium.time.Time"
            | "io.debezium.time.MicroTime"
            | "io.debezium.time.NanoTime"
            | "org.apache.kafka.connect.data.Time",
        ) => D::Time64(TimeUnit::Microsecond),
        Some(
            "io.debezium.time.Timestamp"
            | "io.debezium.time.MicroTimestamp"
            | "io.debezium.time.NanoTimestamp"
            | "org.apache.kafka.connect.data.Timestamp",
        ) => D::Timestamp(TimeUnit::Microsecond, None),
        Some("io.debezium.time.ZonedTimestamp") => {
            D::Timestamp(TimeUnit::Microsecond, Some("+00:00".into()))
        }
        // VariableScaleDecimal has no fixed scale; other logical types keep their base type.
        Some("io.debezium.data.VariableScaleDecimal") => return None,
        _ => match ty {
            "int8" | "int16" | "int32" => D::Int32,
            "int64" => D::Int64,
            "float32" => D::Float32,
            "float64" => D::Float64,
            "boolean" => D::Boolean,
            "string" => D::Utf8,
            "bytes" => D::Binary,
            _ => return None,
        },
    })
}
