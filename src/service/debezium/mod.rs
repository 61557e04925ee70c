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
use crate::service::input::body::{BodyFormat, Limits};
use crate::service::input::json::decode_json_rows;

mod direct;
mod read;

pub use read::{Body, Change, read_body};
use read::{Fields, Image};

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

/// Whether `flow` takes `table`'s changes: its `source_table`, matched
/// regardless of ASCII case (a flow without one takes every table sent to
/// its own endpoint).
pub fn takes(flow: &Flow, table: &str) -> bool {
    // A flattened event that names no table: the flow it was sent to.
    table.is_empty()
        || flow
            .config
            .source_table
            .as_deref()
            .is_none_or(|t| t.eq_ignore_ascii_case(table))
}

/// What writing a flow's rows needs of its declared columns, worked out
/// once per body.
struct Columns<'f> {
    flow: &'f Flow,
    types: Vec<Type>,
    /// Each column's name as a JSON string.
    names: Vec<Vec<u8>>,
    /// The binary columns: their bytes are set after the row decoder.
    binary: Vec<usize>,
}

impl<'f> Columns<'f> {
    fn new(flow: &'f Flow) -> Result<Columns<'f>> {
        let declared = flow.config.columns.len();
        let types: Vec<Type> = (0..declared)
            .map(|i| {
                flow.column_type(i)
                    .unwrap_or(Type::Primitive(PrimitiveType::String))
            })
            .collect();
        let names = (0..declared)
            .map(|i| serde_json::to_vec(flow.column_name(i)))
            .collect::<std::result::Result<_, _>>()?;
        let binary = (0..declared)
            .filter(|&i| types[i] == Type::Primitive(PrimitiveType::Binary))
            .collect();
        Ok(Columns {
            flow,
            types,
            names,
            binary,
        })
    }

    /// Writes the fields of event `c`'s row image as the members of one
    /// flat JSON object onto `line` (its braces are the caller's): a value
    /// that needs no decoding (`core::debezium::passes_through`) as its
    /// text, the others decoded by their schema; a binary column's bytes
    /// into `bytes` (by place in `binary`); a field that names no column
    /// under its own name, for the row decoder to refuse or add.
    fn write(
        &self,
        c: &Change,
        which: &str,
        fields: &[(std::borrow::Cow<str>, read::Raw)],
        line: &mut Vec<u8>,
        bytes: &mut [Option<Vec<u8>>],
    ) -> Result<()> {
        let schema = c.row_schema(which);
        let mut first = true;
        let mut member = |line: &mut Vec<u8>, name: &[u8]| {
            if !std::mem::take(&mut first) {
                line.push(b',');
            }
            line.extend_from_slice(name);
            line.push(b':');
        };
        for (name, v) in fields {
            let Some(col) = self.flow.field_column(name) else {
                member(line, &serde_json::to_vec(name.as_ref())?);
                line.extend_from_slice(v.get().as_bytes());
                continue;
            };
            let field = schema.and_then(|s| s.get(name));
            let ty = &self.types[col];
            let b = self.binary.iter().position(|&b| b == col);
            if b.is_none() && debezium::passes_through(field, ty) {
                member(line, &self.names[col]);
                line.extend_from_slice(v.get().as_bytes());
                continue;
            }
            let bad = |why: String| Error::Batch {
                code: codes::BAD_COLUMN,
                flow: self.flow.name.clone(),
                row: c.index,
                column: name.to_string(),
                message: format!("event {}, field `{name}`: {why}", c.index),
            };
            let value: Value = serde_json::from_str(v.get()).map_err(|e| bad(e.to_string()))?;
            match (b, debezium::decode_value(field, &value, ty).map_err(bad)?) {
                (Some(b), Cell::Bytes(v)) => bytes[b] = Some(v),
                (Some(b), Cell::Json(Value::String(s))) => bytes[b] = Some(s.into_bytes()),
                (Some(_), Cell::Json(Value::Null)) => {}
                (Some(_), Cell::Json(other)) => {
                    return Err(bad(format!(
                        "a binary column takes base64 text, not {}",
                        debezium::kind(&other)
                    )));
                }
                (None, Cell::Json(v)) => {
                    member(line, &self.names[col]);
                    serde_json::to_writer(&mut *line, &v)?;
                }
                (None, Cell::Bytes(_)) => unreachable!("bytes only for binary columns"),
            }
        }
        Ok(())
    }
}

/// The rows of `changes` in `flow`'s source schema, hidden columns filled.
/// The declared columns are built straight from the events' values where
/// they allow it (`direct`); else each event's row becomes one flat JSON
/// line for the row decoder (`Columns::write`). A table's completed
/// snapshot adds a truncate just below its reads.
pub fn rows(flow: &Flow, changes: &[&Change], strict: bool) -> Result<(RecordBatch, Skipped)> {
    let columns = Columns::new(flow)?;
    if let Some(d) = direct::Direct::new(flow, changes.len())
        && let Some(done) = rows_as(&columns, changes, Build::Direct(d), strict)?
    {
        return Ok(done);
    }
    let json = Build::Json {
        lines: Vec::with_capacity(changes.len() * 64),
        ends: Vec::with_capacity(changes.len()),
        bytes: Vec::with_capacity(changes.len()),
    };
    Ok(rows_as(&columns, changes, json, strict)?.expect("the JSON way takes every row"))
}

/// `rows` the general way only (the JSON row decoder), for the tests that
/// hold the direct way to it.
#[doc(hidden)]
pub fn rows_by_json(
    flow: &Flow,
    changes: &[&Change],
    strict: bool,
) -> Result<(RecordBatch, Skipped)> {
    let json = Build::Json {
        lines: Vec::new(),
        ends: Vec::new(),
        bytes: Vec::new(),
    };
    Ok(
        rows_as(&Columns::new(flow)?, changes, json, strict)?
            .expect("the JSON way takes every row"),
    )
}

/// How a body's declared columns are being built.
enum Build<'f> {
    /// Each row image as a flat JSON line (its end in `lines`) for the row
    /// decoder, and its binary columns' bytes.
    Json {
        lines: Vec<u8>,
        ends: Vec<usize>,
        bytes: Vec<Vec<Option<Vec<u8>>>>,
    },
    Direct(direct::Direct<'f>),
}

impl Build<'_> {
    /// A row without an image (a truncate): every declared column null.
    fn empty(&mut self, columns: &Columns) -> std::result::Result<(), direct::Decline> {
        match self {
            Build::Json { lines, ends, bytes } => {
                lines.extend_from_slice(b"{}");
                ends.push(lines.len());
                bytes.push(vec![None; columns.binary.len()]);
                Ok(())
            }
            // Nulls in the key columns: the row decoder's way.
            Build::Direct(_) => Err(direct::Decline),
        }
    }

    /// Event `c`'s row image `which`, its `fields`.
    fn image(
        &mut self,
        columns: &Columns,
        c: &Change,
        which: &str,
        fields: &[(std::borrow::Cow<str>, read::Raw)],
    ) -> Result<std::result::Result<(), direct::Decline>> {
        match self {
            Build::Json { lines, ends, bytes } => {
                let mut row_bytes = vec![None; columns.binary.len()];
                lines.push(b'{');
                columns.write(c, which, fields, lines, &mut row_bytes)?;
                lines.push(b'}');
                ends.push(lines.len());
                bytes.push(row_bytes);
                Ok(Ok(()))
            }
            Build::Direct(d) => Ok(d.row(fields, c.row_schema(which))),
        }
    }

    /// The source columns: the declared ones built, the hidden ones not yet.
    fn finish(
        self,
        columns: &Columns,
        kept: &[(usize, Op)],
        strict: bool,
    ) -> Result<Vec<ArrayRef>> {
        let (lines, ends, bytes) = match self {
            Build::Direct(d) => {
                let mut cols = d.finish();
                for f in &columns.flow.source_arrow.fields()[cols.len()..] {
                    cols.push(arrow_array::new_null_array(f.data_type(), kept.len()));
                }
                return Ok(cols);
            }
            Build::Json { lines, ends, bytes } => (lines, ends, bytes),
        };
        let mut refs: Vec<&[u8]> = Vec::with_capacity(ends.len());
        let mut from = 0;
        for &end in &ends {
            refs.push(&lines[from..end]);
            from = end;
        }
        let batch = decode_json_rows(columns.flow, &refs, strict).map_err(|e| match e {
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
        for (b, &col) in columns.binary.iter().enumerate() {
            cols[col] = Arc::new(BinaryArray::from_iter(
                bytes.iter().map(|row| row[b].as_deref()),
            ));
        }
        Ok(cols)
    }
}

/// `rows` the way `build` builds the declared columns; None when it
/// declines this body (`direct`).
fn rows_as(
    columns: &Columns,
    changes: &[&Change],
    mut build: Build,
    strict: bool,
) -> Result<Option<(RecordBatch, Skipped)>> {
    let flow = columns.flow;
    let mut skipped = Skipped::default();
    // Per row: its event's index in the body and its op, and its position.
    let mut kept: Vec<(usize, Op)> = Vec::with_capacity(changes.len());
    let mut positions: Vec<Position> = Vec::with_capacity(changes.len());
    for c in changes {
        let err = |m: String| event_err(&flow.name, c.index, m);
        if c.op == Op::Truncate && flow.truncates.is_none() {
            skipped.truncates += 1;
            continue;
        }
        let position = c
            .position()
            .map_err(|m| err(format!("event {}: {m}", c.index)))?;
        if (flow.truncates.is_some() || flow.cuts.is_some()) && c.ends_snapshot() {
            // The table's snapshot is complete: a truncate just below its
            // reads removes what an earlier, partial snapshot left (SCD
            // Type 2: a cut there closes those rows' open versions).
            if build.empty(columns).is_err() {
                return Ok(None);
            }
            positions.push(position.snapshot_end());
            kept.push((c.index, Op::Truncate));
        }
        let (which, image) = c.image();
        let built = match (c.op, image) {
            (Op::Truncate, _) => build.empty(columns),
            (_, Some(Image::Row(Fields(fields)))) => build.image(columns, c, which, fields)?,
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
                    match v {
                        Some(Image::Not(kind)) => kind,
                        _ => "missing",
                    }
                )));
            }
        };
        if built.is_err() {
            return Ok(None);
        }
        positions.push(position);
        kept.push((c.index, c.op));
    }
    let cols = build.finish(columns, &kept, strict)?;
    let batch = with_hidden(columns, cols, &kept, &positions)?;
    Ok(Some((batch, skipped)))
}

/// The source columns with the hidden op and position columns set.
fn with_hidden(
    columns: &Columns,
    mut cols: Vec<ArrayRef>,
    kept: &[(usize, Op)],
    positions: &[Position],
) -> Result<RecordBatch> {
    let hidden = columns.types.len();
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
    Ok(RecordBatch::try_new(
        columns.flow.source_arrow.clone(),
        cols,
    )?)
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
    let (changes, mut skipped) = read_body(&flow.name, format, Body::Whole(body), limits)?;
    let mine: Vec<&Change> = changes.iter().filter(|c| takes(flow, &c.table)).collect();
    skipped.other_tables += (changes.len() - mine.len()) as u64;
    let (batch, more) = rows(flow, &mine, strict)?;
    skipped.add(&more);
    Ok((batch, skipped))
}

/// The rows a body has for one flow: the flow's place in `route`'s list,
/// and its rows (or why they cannot be read).
pub type Routed = (usize, Result<RecordBatch>);

/// A body for `POST /v1/debezium`, read once: for each of `flows` that
/// takes events of it (by `source_table`), those events' rows, read as
/// `decode` reads them; and what no flow took.
pub fn route(
    flows: &[Flow],
    format: BodyFormat,
    body: Body<'_>,
    limits: Limits,
) -> Result<(Vec<Routed>, Skipped)> {
    let (changes, mut skipped) = read_body("(debezium)", format, body, limits)?;
    if let Some(c) = changes.iter().find(|c| c.table.is_empty()) {
        return Err(event_err(
            "(debezium)",
            c.index,
            format!(
                "event {} names no table: a flattened event sent here needs __table and __schema (__db for MySQL), so add table,schema to the SMT's add.fields; or send it to its flow's own endpoint",
                c.index
            ),
        ));
    }
    let source = |f: &Flow| f.config.source_table.clone();
    for (table, cs) in by_table(&changes) {
        if !flows
            .iter()
            .any(|f| source(f).is_some_and(|t| t.eq_ignore_ascii_case(table)))
        {
            skipped.other_tables += cs.len() as u64;
        }
    }
    let mut out = Vec::new();
    for (i, flow) in flows.iter().enumerate() {
        let Some(t) = source(flow) else { continue };
        let mine: Vec<&Change> = changes
            .iter()
            .filter(|c| c.table.eq_ignore_ascii_case(&t))
            .collect();
        if mine.is_empty() {
            continue;
        }
        let batch = rows(flow, &mine, true).map(|(b, more)| {
            skipped.add(&more);
            b
        });
        out.push((i, batch));
    }
    Ok((out, skipped))
}

/// Changes grouped by table, in body order within each.
pub fn by_table<'a>(changes: &'a [Change<'a>]) -> BTreeMap<&'a str, Vec<&'a Change<'a>>> {
    let mut out: BTreeMap<&str, Vec<&Change>> = BTreeMap::new();
    for c in changes {
        out.entry(&*c.table).or_default().push(c);
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
    let (changes, _) = read_body(&flow.name, format, Body::Whole(body), limits)?;
    let mut typed: Vec<arrow_schema::Field> = Vec::new();
    let mut untyped: Vec<Vec<u8>> = Vec::new();
    for c in changes.iter().filter(|c| takes(flow, &c.table)) {
        let (which, image) = c.image();
        let Some(Image::Row(Fields(row))) = image else {
            continue;
        };
        let fields = c.row_schema(which);
        let mut rest = Map::new();
        for (name, v) in row {
            if flow.field_column(name).is_some() || typed.iter().any(|f| f.name() == name) {
                continue;
            }
            let field = fields.and_then(|fs| fs.get(name));
            match field.and_then(connect_type) {
                Some(t) => typed.push(arrow_schema::Field::new(name.as_ref(), t, true)),
                None => {
                    rest.insert(name.to_string(), serde_json::from_str(v.get())?);
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
