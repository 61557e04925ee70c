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

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow_array::{ArrayRef, BinaryArray, Int32Array, Int64Array, RecordBatch, StringArray};
use iceberg::spec::{PrimitiveType, Type};
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::core::debezium::{self, Cell, Op, Position};
use crate::core::flow::Flow;
use crate::error::{Error, Result, codes};
use crate::service::input::{self, BodyFormat, Limits};

/// One change event of a body, its parts borrowed from the body.
#[derive(Debug)]
pub struct Change<'a> {
    /// Its place in the body (0-based), for errors.
    pub index: usize,
    /// `schema.table` (`db.table` where the source has no schema).
    pub table: String,
    pub op: Op,
    source: Source<'a>,
    before: Option<Image<'a>>,
    after: Option<Image<'a>>,
    /// The value schema, when the event is wrapped.
    schema: Option<Arc<EventSchema>>,
}

impl<'a> Change<'a> {
    /// The row image a change carries: `before` for a delete, else `after`.
    fn image(&self) -> (&'static str, Option<&Image<'a>>) {
        match self.op {
            Op::Delete => ("before", self.before.as_ref()),
            _ => ("after", self.after.as_ref()),
        }
    }

    /// Where the event sits in its source's order.
    fn position(&self) -> std::result::Result<Position, String> {
        // PostgreSQL's usual form, read without building values.
        if self.source.connector.map(RawValue::get) == Some("\"postgresql\"")
            && let Some((last, Some(lsn))) = self
                .source
                .sequence
                .and_then(|s| debezium::postgres_sequence(s.get()))
        {
            return Ok(debezium::postgres_position(last.unwrap_or(0), lsn, self.op));
        }
        debezium::position_of(&|k| self.source.value(k), self.op)
    }
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

/// A field present in an event (null too: `Some("null")`); absent is `None`.
fn present<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// The parts of an event, or of its wrapper, that a reader needs; the rest
/// is skipped unread.
#[derive(Deserialize, Default)]
struct Parts<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    schema: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    payload: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "image")]
    before: Option<Image<'a>>,
    #[serde(borrow, default, deserialize_with = "image")]
    after: Option<Image<'a>>,
    #[serde(borrow, default)]
    source: Option<Source<'a>>,
    #[serde(borrow, default, deserialize_with = "present")]
    op: Option<&'a RawValue>,
}

impl Parts<'_> {
    /// `{"schema", "payload"}` (`schemas.enable=true`), not an event.
    fn is_wrapper(&self) -> bool {
        self.payload.is_some()
            && self.op.is_none()
            && self.before.is_none()
            && self.after.is_none()
            && self.source.is_none()
    }
}

/// An event's `source` block: the fields its table and its position are
/// read from.
#[derive(Deserialize, Default, Debug)]
struct Source<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    connector: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    schema: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    db: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    table: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    snapshot: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    sequence: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    lsn: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    file: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    pos: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    row: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    commit_lsn: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    change_lsn: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    event_serial_no: Option<&'a RawValue>,
}

impl<'a> Source<'a> {
    fn raw(&self, k: &str) -> Option<&'a RawValue> {
        match k {
            "connector" => self.connector,
            "schema" => self.schema,
            "db" => self.db,
            "table" => self.table,
            "snapshot" => self.snapshot,
            "sequence" => self.sequence,
            "lsn" => self.lsn,
            "file" => self.file,
            "pos" => self.pos,
            "row" => self.row,
            "commit_lsn" => self.commit_lsn,
            "change_lsn" => self.change_lsn,
            "event_serial_no" => self.event_serial_no,
            _ => None,
        }
    }

    /// Field `k` as a JSON value (what `core::debezium::position_of` reads).
    fn value(&self, k: &str) -> Option<Value> {
        serde_json::from_str(self.raw(k)?.get()).ok()
    }

    /// Field `k` when it is a non-empty string.
    fn text(&self, k: &str) -> Option<Cow<'a, str>> {
        string(self.raw(k)?).filter(|s| !s.is_empty())
    }
}

/// A JSON string's text, borrowed unless it has escapes.
fn string(raw: &RawValue) -> Option<Cow<'_, str>> {
    match serde_json::from_str::<&str>(raw.get()) {
        Ok(s) => Some(Cow::Borrowed(s)),
        Err(_) => serde_json::from_str::<String>(raw.get())
            .ok()
            .map(Cow::Owned),
    }
}

/// The fields of a row image, in order, values unread.
#[derive(Debug)]
struct Fields<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'de> Fields<'de> {
    fn visit<A: MapAccess<'de>>(mut m: A) -> std::result::Result<Fields<'de>, A::Error> {
        #[derive(Deserialize)]
        struct Key<'a>(#[serde(borrow)] Cow<'a, str>);
        let mut out = Vec::with_capacity(m.size_hint().unwrap_or(8).min(256));
        while let Some(Key(k)) = m.next_key()? {
            let v: &'de RawValue = m.next_value()?;
            out.push((k, v));
        }
        Ok(Fields(out))
    }
}

/// A row image (`before`, `after`): its fields, or what it is instead.
#[derive(Debug)]
enum Image<'a> {
    Row(Fields<'a>),
    /// Not an object: its kind, for errors.
    Not(&'static str),
}

/// An image present in an event (null too: `Image::Not("null")`).
fn image<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Option<Image<'de>>, D::Error> {
    struct Any;
    impl<'de> Visitor<'de> for Any {
        type Value = Image<'de>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a row image")
        }
        fn visit_map<A: MapAccess<'de>>(self, m: A) -> std::result::Result<Image<'de>, A::Error> {
            Fields::visit(m).map(Image::Row)
        }
        fn visit_unit<E>(self) -> std::result::Result<Image<'de>, E> {
            Ok(Image::Not("null"))
        }
        fn visit_bool<E>(self, _: bool) -> std::result::Result<Image<'de>, E> {
            Ok(Image::Not("a boolean"))
        }
        fn visit_i64<E>(self, _: i64) -> std::result::Result<Image<'de>, E> {
            Ok(Image::Not("a number"))
        }
        fn visit_u64<E>(self, _: u64) -> std::result::Result<Image<'de>, E> {
            Ok(Image::Not("a number"))
        }
        fn visit_f64<E>(self, _: f64) -> std::result::Result<Image<'de>, E> {
            Ok(Image::Not("a number"))
        }
        fn visit_str<E>(self, _: &str) -> std::result::Result<Image<'de>, E> {
            Ok(Image::Not("a string"))
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut s: A,
        ) -> std::result::Result<Image<'de>, A::Error> {
            while s.next_element::<serde::de::IgnoredAny>()?.is_some() {}
            Ok(Image::Not("an array"))
        }
    }
    d.deserialize_any(Any).map(Some)
}

/// What an event's value schema says about its rows: each field's Kafka
/// Connect schema by name, and whether it is no change at all.
#[derive(Debug, Default)]
struct EventSchema {
    /// A heartbeat or transaction metadata schema.
    not_a_change: bool,
    before: RowSchema,
    after: RowSchema,
}

/// The fields of a row in a value schema, in the schema's order (the order
/// Debezium writes a row's fields in), each with its Connect schema.
#[derive(Debug, Default)]
struct RowSchema {
    fields: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

impl RowSchema {
    fn get(&self, name: &str) -> Option<&Value> {
        self.index.get(name).map(|&i| &self.fields[i].1)
    }
}

impl EventSchema {
    fn read(raw: &str) -> EventSchema {
        let Ok(schema) = serde_json::from_str::<Value>(raw) else {
            return EventSchema::default();
        };
        let not_a_change = schema
            .get("name")
            .and_then(Value::as_str)
            .is_some_and(|n| n.ends_with("Heartbeat") || n.ends_with("TransactionMetadataValue"));
        let row = |which: &str| -> RowSchema {
            schema
                .get("fields")
                .and_then(Value::as_array)
                .and_then(|fs| {
                    fs.iter()
                        .find(|f| f.get("field").and_then(Value::as_str) == Some(which))
                })
                .and_then(|f| f.get("fields"))
                .and_then(Value::as_array)
                .map(|fs| {
                    let fields: Vec<(String, Value)> = fs
                        .iter()
                        .filter_map(|f| Some((f.get("field")?.as_str()?.to_string(), f.clone())))
                        .collect();
                    let index = fields
                        .iter()
                        .enumerate()
                        .map(|(i, (n, _))| (n.clone(), i))
                        .collect();
                    RowSchema { fields, index }
                })
                .unwrap_or_default()
        };
        EventSchema {
            not_a_change,
            before: row("before"),
            after: row("after"),
        }
    }

    fn row(&self, which: &str) -> &RowSchema {
        if which == "before" {
            &self.before
        } else {
            &self.after
        }
    }
}

/// The value schemas of one body, read once each. Debezium repeats an
/// identical schema in every event of a table, so an event that starts
/// with one seen before has its payload found without reading the schema
/// again.
#[derive(Default)]
struct Schemas<'a> {
    seen: Vec<(&'a str, Arc<EventSchema>)>,
}

/// Distinct schemas remembered per body (a body of many tables, or of a
/// table whose schema changed, reads the others each time).
const MAX_SCHEMAS: usize = 16;

impl<'a> Schemas<'a> {
    fn get(&mut self, raw: &'a RawValue) -> Option<Arc<EventSchema>> {
        let raw = raw.get();
        if raw == "null" {
            return None;
        }
        if let Some((_, s)) = self.seen.iter().find(|(r, _)| *r == raw) {
            return Some(s.clone());
        }
        let s = Arc::new(EventSchema::read(raw));
        if self.seen.len() < MAX_SCHEMAS {
            self.seen.push((raw, s.clone()));
        }
        Some(s)
    }

    /// `{"schema":<a schema seen before>,"payload":...`, as the JSON
    /// converter writes it: the schema, and where the payload starts.
    fn known_at(&self, bytes: &[u8]) -> Option<(Arc<EventSchema>, usize)> {
        const SCHEMA: &[u8] = b"{\"schema\":";
        const PAYLOAD: &[u8] = b",\"payload\":";
        let rest = bytes.strip_prefix(SCHEMA)?;
        self.seen.iter().find_map(|(raw, s)| {
            rest.strip_prefix(raw.as_bytes())?.strip_prefix(PAYLOAD)?;
            Some((s.clone(), SCHEMA.len() + raw.len() + PAYLOAD.len()))
        })
    }

    /// A whole element wrapped with a schema seen before: the schema and
    /// the payload's bytes. (A payload followed by anything else does not
    /// parse, and the element is read the long way.)
    fn known(&self, text: &'a str) -> Option<(Arc<EventSchema>, &'a str)> {
        let (s, at) = self.known_at(text.as_bytes())?;
        let payload = text[at..].trim_ascii_end().strip_suffix('}')?;
        Some((s, payload))
    }
}

/// One element of a body, read. (Made and taken apart at once: boxing the
/// change would cost an allocation per event.)
#[allow(clippy::large_enum_variant)]
enum Read<'a> {
    Change(Change<'a>),
    Tombstone,
    NotAChange,
    Message,
}

/// Reads one element: the fast way when it is wrapped with a schema seen
/// before, else the whole element.
fn read_one<'a>(
    flow: &str,
    index: usize,
    text: &'a str,
    schemas: &mut Schemas<'a>,
) -> Result<Read<'a>> {
    let err = |m: String| event_err(flow, index, m);
    let text = text.trim_ascii();
    if let Some((schema, payload)) = schemas.known(text)
        && payload.starts_with('{')
        && let Ok(parts) = serde_json::from_str::<Parts>(payload)
        && !parts.is_wrapper()
    {
        return event(flow, index, parts, Some(schema), payload);
    }
    if text == "null" {
        return Ok(Read::Tombstone);
    }
    let not_an_object = |text: &str| {
        let kind = match serde_json::from_str::<Value>(text) {
            Ok(v) => debezium::kind(&v),
            Err(e) => return err(format!("event {index} is not valid JSON: {e}")),
        };
        err(format!(
            "event {index} is {kind}, not a Debezium event object"
        ))
    };
    if !text.starts_with('{') {
        return Err(not_an_object(text));
    }
    let outer: Parts =
        serde_json::from_str(text).map_err(|e| not_an_event(flow, index, text, e))?;
    if !outer.is_wrapper() {
        return event(flow, index, outer, None, text);
    }
    let schema = outer.schema.and_then(|r| schemas.get(r));
    let payload = outer.payload.map_or("null", RawValue::get);
    if payload == "null" {
        return Ok(Read::Tombstone);
    }
    if !payload.starts_with('{') {
        return Err(not_an_object(payload));
    }
    let parts: Parts =
        serde_json::from_str(payload).map_err(|e| not_an_event(flow, index, payload, e))?;
    event(flow, index, parts, schema, payload)
}

/// Why an object is not read as an event: not JSON, a `source` that is no
/// object, or the reader's own words.
fn not_an_event(flow: &str, index: usize, text: &str, e: serde_json::Error) -> Error {
    let message = match serde_json::from_str::<Value>(text) {
        Err(e) => format!("event {index} is not valid JSON: {e}"),
        Ok(v)
            if v.get("source")
                .is_some_and(|s| !s.is_object() && !s.is_null()) =>
        {
            format!("event {index} has no `source` block")
        }
        Ok(_) => format!("event {index} is not a Debezium event: {e}"),
    };
    event_err(flow, index, message)
}

/// An event object's parts as a change (or what it is instead).
fn event<'a>(
    flow: &str,
    index: usize,
    parts: Parts<'a>,
    schema: Option<Arc<EventSchema>>,
    text: &'a str,
) -> Result<Read<'a>> {
    let err = |m: String| event_err(flow, index, m);
    let Some(op) = parts.op else {
        // No `op`: a heartbeat, transaction metadata, or no event at all.
        let obj: Map<String, Value> = serde_json::from_str(text)
            .map_err(|e| err(format!("event {index} is not valid JSON: {e}")))?;
        let status = obj
            .get("status")
            .and_then(Value::as_str)
            .is_some_and(|s| s == "BEGIN" || s == "END");
        if schema.as_ref().is_some_and(|s| s.not_a_change)
            || status
            || (obj.len() == 1 && obj.contains_key("ts_ms"))
        {
            return Ok(Read::NotAChange);
        }
        let hint = if obj.contains_key("__op") || obj.contains_key("__deleted") {
            " (events flattened by ExtractNewRecordState are not taken yet: remove the SMT)"
        } else {
            ""
        };
        return Err(err(format!(
            "event {index} has no `op`: it is not a Debezium change event{hint}"
        )));
    };
    let op = match string(op).as_deref() {
        Some("m") => return Ok(Read::Message),
        Some(s) => Op::parse(s),
        None => None,
    }
    .ok_or_else(|| {
        err(format!(
            "event {index} has op {}; Debezium's are c, u, d, r, t and m",
            op.get()
        ))
    })?;
    let Some(source) = parts.source else {
        return Err(err(format!("event {index} has no `source` block")));
    };
    let table = match (
        source.text("schema").or(source.text("db")),
        source.text("table"),
    ) {
        (Some(ns), Some(t)) => format!("{ns}.{t}"),
        _ => {
            return Err(err(format!(
                "event {index}'s source names no table (source.schema or source.db, and source.table)"
            )));
        }
    };
    Ok(Read::Change(Change {
        index,
        table,
        op,
        source,
        before: parts.before,
        after: parts.after,
        schema,
    }))
}

/// Reads a body's events in one pass: its changes, and what it skipped,
/// under `limits.max_rows` events. `flow` names the flow (or the endpoint)
/// in errors. The body is one event, a JSON array of them, or NDJSON.
pub fn read_body<'a>(
    flow: &str,
    format: BodyFormat,
    body: &'a [u8],
    limits: Limits,
) -> Result<(Vec<Change<'a>>, Skipped)> {
    let too_many = || Error::Input {
        code: codes::BATCH_TOO_LARGE,
        flow: flow.to_string(),
        message: format!(
            "the body has more than {} events (server.max_rows_per_request); send fewer per request (the sink's batch.max-size)",
            limits.max_rows
        ),
    };
    let malformed = |why: String| Error::Input {
        code: codes::MALFORMED_BODY,
        flow: flow.to_string(),
        message: format!("the body is not a JSON array of events: {why}"),
    };
    // Checked once, so that every value is read as text unchecked.
    let text: &'a str = std::str::from_utf8(body).map_err(|e| Error::Input {
        code: codes::MALFORMED_BODY,
        flow: flow.to_string(),
        message: format!("the body is not UTF-8 JSON: {e}"),
    })?;
    let mut out = (Vec::new(), Skipped::default());
    let mut schemas = Schemas::default();
    let keep = |out: &mut (Vec<Change<'a>>, Skipped), read: Read<'a>| match read {
        Read::Change(c) => out.0.push(c),
        Read::Tombstone => out.1.tombstones += 1,
        Read::NotAChange => out.1.not_changes += 1,
        Read::Message => out.1.messages += 1,
    };
    let skip_ws = |mut i: usize| {
        while body.get(i).is_some_and(u8::is_ascii_whitespace) {
            i += 1;
        }
        i
    };
    match format {
        BodyFormat::Ndjson => {
            let mut index = 0;
            let mut start = 0;
            for end in memchr::memchr_iter(b'\n', body).chain([body.len()]) {
                let line = text[start..end].trim_ascii();
                start = end + 1;
                if line.is_empty() {
                    continue;
                }
                if index == limits.max_rows {
                    return Err(too_many());
                }
                keep(&mut out, read_one(flow, index, line, &mut schemas)?);
                index += 1;
            }
        }
        BodyFormat::JsonArray if body.get(skip_ws(0)) != Some(&b'[') => {
            keep(
                &mut out,
                read_one(flow, 0, text.trim_ascii(), &mut schemas)?,
            );
        }
        BodyFormat::JsonArray => {
            let mut i = skip_ws(skip_ws(0) + 1);
            let mut index = 0;
            if body.get(i) == Some(&b']') {
                i += 1;
            } else {
                loop {
                    if index == limits.max_rows {
                        return Err(too_many());
                    }
                    let end = match known_event(flow, index, text, i, &schemas) {
                        Some(read) => {
                            let (read, end) = read?;
                            keep(&mut out, read);
                            end
                        }
                        None => {
                            // The long way: the element as it is.
                            let mut one = serde_json::Deserializer::from_str(&text[i..])
                                .into_iter::<&RawValue>();
                            match one.next() {
                                Some(Ok(raw)) => {
                                    let element = raw.get();
                                    keep(&mut out, read_one(flow, index, element, &mut schemas)?);
                                    i + one.byte_offset()
                                }
                                Some(Err(e)) if e.is_eof() => {
                                    return Err(malformed("the array is not closed".into()));
                                }
                                Some(Err(e)) => {
                                    return Err(event_err(
                                        flow,
                                        index,
                                        format!("event {index} is not valid JSON: {e}"),
                                    ));
                                }
                                None => return Err(malformed("the array is not closed".into())),
                            }
                        }
                    };
                    index += 1;
                    i = skip_ws(end);
                    match body.get(i) {
                        Some(b',') => i = skip_ws(i + 1),
                        Some(b']') => {
                            i += 1;
                            break;
                        }
                        None => return Err(malformed("the array is not closed".into())),
                        Some(_) => {
                            return Err(malformed(format!(
                                "expected `,` or `]` after event {} at byte {i}",
                                index - 1
                            )));
                        }
                    }
                }
            }
            if skip_ws(i) != body.len() {
                return Err(malformed(format!(
                    "unexpected bytes after the array at byte {i}"
                )));
            }
        }
        BodyFormat::ArrowStream => {
            return Err(Error::Input {
                code: codes::DEBEZIUM_EVENT,
                flow: flow.to_string(),
                message: "Debezium events are JSON: send application/json or application/x-ndjson"
                    .into(),
            });
        }
    }
    Ok(out)
}

/// The element of a JSON array at `at` when it is wrapped with a schema
/// seen before: the event, read without reading its schema again, and
/// where the element ends. `None`: read it the long way.
fn known_event<'a>(
    flow: &str,
    index: usize,
    text: &'a str,
    at: usize,
    schemas: &Schemas<'a>,
) -> Option<Result<(Read<'a>, usize)>> {
    let body = text.as_bytes();
    let (schema, offset) = schemas.known_at(&body[at..])?;
    let from = at + offset;
    if body.get(from) != Some(&b'{') {
        return None;
    }
    let mut one = serde_json::Deserializer::from_str(&text[from..]).into_iter::<Parts>();
    let parts = one.next()?.ok().filter(|p| !p.is_wrapper())?;
    let to = from + one.byte_offset();
    let mut close = to;
    while body.get(close).is_some_and(u8::is_ascii_whitespace) {
        close += 1;
    }
    if body.get(close) != Some(&b'}') {
        return None;
    }
    Some(event(flow, index, parts, Some(schema), &text[from..to]).map(|r| (r, close + 1)))
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

/// The rows of `changes` in `flow`'s source schema, hidden columns filled.
/// Each event's row becomes one flat JSON line for the row decoder: a field
/// whose value needs no decoding (`core::debezium::passes_through`) is
/// copied as its text, the others decoded by their schema. Unknown fields
/// stay in the line, so the row decoder refuses them (or an `add_columns`
/// flow adds them), as for any push.
pub fn rows(flow: &Flow, changes: &[&Change], strict: bool) -> Result<(RecordBatch, Skipped)> {
    let mut skipped = Skipped::default();
    let declared = flow.config.columns.len();
    let types: Vec<Type> = (0..declared)
        .map(|i| {
            flow.column_type(i)
                .unwrap_or(Type::Primitive(PrimitiveType::String))
        })
        .collect();
    let names: Vec<Vec<u8>> = (0..declared)
        .map(|i| serde_json::to_vec(flow.column_name(i)))
        .collect::<std::result::Result<_, _>>()?;
    let binary: Vec<usize> = (0..declared)
        .filter(|&i| types[i] == Type::Primitive(PrimitiveType::Binary))
        .collect();
    // Per row: its event's index in the body, its op, its position, and
    // the end of its line in `lines`.
    let mut kept: Vec<(usize, Op)> = Vec::with_capacity(changes.len());
    let mut positions: Vec<Position> = Vec::with_capacity(changes.len());
    let mut lines: Vec<u8> = Vec::with_capacity(changes.len() * 64);
    let mut ends: Vec<usize> = Vec::with_capacity(changes.len());
    let mut bytes: Vec<Vec<Option<Vec<u8>>>> =
        vec![Vec::with_capacity(changes.len()); binary.len()];
    // Whether a field's value is copied as its text into column `c`.
    let passes = |c: usize, field: Option<&Value>| {
        !binary.contains(&c) && debezium::passes_through(field, &types[c])
    };
    for c in changes {
        let err = |m: String| event_err(&flow.name, c.index, m);
        if c.op == Op::Truncate && flow.truncates.is_none() {
            skipped.truncates += 1;
            continue;
        }
        let position = c
            .position()
            .map_err(|m| err(format!("event {}: {m}", c.index)))?;
        if flow.truncates.is_some()
            && debezium::ends_snapshot(c.source.text("snapshot").as_deref(), c.op)
        {
            // The table's snapshot is complete: a truncate just below its
            // reads removes what an earlier, partial snapshot left.
            lines.extend_from_slice(b"{}");
            ends.push(lines.len());
            positions.push(position.snapshot_end());
            kept.push((c.index, Op::Truncate));
            for b in &mut bytes {
                b.push(None);
            }
        }
        let (which, image) = c.image();
        let mut row_bytes: Vec<Option<Vec<u8>>> = vec![None; binary.len()];
        lines.push(b'{');
        match (c.op, image) {
            (Op::Truncate, _) => {}
            (_, Some(Image::Row(Fields(fields)))) => {
                let schema = c.schema.as_ref().map(|s| s.row(which));
                let mut first = true;
                for (name, v) in fields {
                    let comma = |lines: &mut Vec<u8>, first: &mut bool| {
                        if !std::mem::take(first) {
                            lines.push(b',');
                        }
                    };
                    let col = flow.field_column(name);
                    let field = schema.and_then(|s| s.get(name));
                    let pass = col.is_some_and(|c| passes(c, field));
                    let Some(col) = col else {
                        comma(&mut lines, &mut first);
                        serde_json::to_writer(&mut lines, name.as_ref())?;
                        lines.push(b':');
                        lines.extend_from_slice(v.get().as_bytes());
                        continue;
                    };
                    let ty = &types[col];
                    let b = binary.iter().position(|&b| b == col);
                    if pass {
                        comma(&mut lines, &mut first);
                        lines.extend_from_slice(&names[col]);
                        lines.push(b':');
                        lines.extend_from_slice(v.get().as_bytes());
                        continue;
                    }
                    let bad = |why: String| Error::Batch {
                        code: codes::BAD_COLUMN,
                        flow: flow.name.clone(),
                        row: c.index,
                        column: name.to_string(),
                        message: format!("event {}, field `{name}`: {why}", c.index),
                    };
                    let value: Value =
                        serde_json::from_str(v.get()).map_err(|e| bad(e.to_string()))?;
                    let cell = debezium::decode_value(field, &value, ty).map_err(bad)?;
                    match (b, cell) {
                        (Some(b), Cell::Bytes(v)) => row_bytes[b] = Some(v),
                        (Some(b), Cell::Json(Value::String(s))) => {
                            row_bytes[b] = Some(s.into_bytes())
                        }
                        (Some(_), Cell::Json(Value::Null)) => {}
                        (Some(_), Cell::Json(other)) => {
                            return Err(bad(format!(
                                "a binary column takes base64 text, not {}",
                                debezium::kind(&other)
                            )));
                        }
                        (None, Cell::Json(v)) => {
                            comma(&mut lines, &mut first);
                            lines.extend_from_slice(&names[col]);
                            lines.push(b':');
                            serde_json::to_writer(&mut lines, &v)?;
                        }
                        (None, Cell::Bytes(_)) => unreachable!("bytes only for binary columns"),
                    }
                }
            }
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
        }
        lines.push(b'}');
        ends.push(lines.len());
        for (b, v) in row_bytes.into_iter().enumerate() {
            bytes[b].push(v);
        }
        positions.push(position);
        kept.push((c.index, c.op));
    }
    let mut refs: Vec<&[u8]> = Vec::with_capacity(ends.len());
    let mut from = 0;
    for &end in &ends {
        refs.push(&lines[from..end]);
        from = end;
    }
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
    let hidden = declared;
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
    let (changes, mut skipped) = read_body(&flow.name, format, body, limits)?;
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
    body: &[u8],
    limits: Limits,
) -> Result<(Vec<Routed>, Skipped)> {
    let (changes, mut skipped) = read_body("(debezium)", format, body, limits)?;
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
    let (changes, _) = read_body(&flow.name, format, body, limits)?;
    let mut typed: Vec<arrow_schema::Field> = Vec::new();
    let mut untyped: Vec<Vec<u8>> = Vec::new();
    for c in changes.iter().filter(|c| takes(flow, &c.table)) {
        let (which, image) = c.image();
        let Some(Image::Row(Fields(row))) = image else {
            continue;
        };
        let fields = c.schema.as_ref().map(|s| s.row(which));
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
