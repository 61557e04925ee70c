//! Reading a body of Debezium events in one pass, borrowed from the body:
//! the envelope's parts (`Parts`), the source block (`Source`), row images
//! (`Image`, `Fields`), value schemas read once per body (`Schemas`, whose
//! repeated text is skipped by its bytes), and the `Change`s they make.
//! Turning changes into a flow's rows is the parent module.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use serde::Deserialize;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::{Skipped, event_err};
use crate::core::debezium::{self, Op, Position};
use crate::error::{Error, Result, codes};
use crate::service::input::body::{BodyFormat, Limits};

mod scan;

/// One change event of a body, its parts borrowed from the body.
#[derive(Debug)]
pub struct Change<'a> {
    /// Its place in the body (0-based), for errors.
    pub index: usize,
    /// `schema.table` (`db.table` where the source has no schema), shared
    /// by the events of one table in a body.
    pub table: Arc<str>,
    pub op: Op,
    /// Where the event sits in its source's order (or why it has no place).
    position: std::result::Result<Position, String>,
    /// Whether it is the last read of its table's snapshot.
    ends_snapshot: bool,
    before: Option<Image<'a>>,
    after: Option<Image<'a>>,
    /// The value schema, when the event is wrapped.
    schema: Option<Arc<EventSchema>>,
}

impl<'a> Change<'a> {
    /// The change `source` tells of; its table named by `tables`.
    fn new(
        index: usize,
        op: Op,
        source: Origin<'a>,
        images: (Option<Image<'a>>, Option<Image<'a>>),
        schema: Option<Arc<EventSchema>>,
        tables: &mut Tables<'a>,
    ) -> Change<'a> {
        Change {
            index,
            table: tables.name(&source),
            op,
            position: source.pos.map(|pos| debezium::at(pos, op)),
            ends_snapshot: debezium::ends_snapshot(source.snapshot.and_then(string).as_deref(), op),
            before: images.0,
            after: images.1,
            schema,
        }
    }

    /// The row image a change carries: `before` for a delete, else `after`.
    pub(super) fn image(&self) -> (&'static str, Option<&Image<'a>>) {
        match self.op {
            Op::Delete => ("before", self.before.as_ref()),
            _ => ("after", self.after.as_ref()),
        }
    }

    /// The value schema's fields of its `which` row image, when the event
    /// is wrapped.
    pub(super) fn row_schema(&self, which: &str) -> Option<&RowSchema> {
        self.schema.as_ref().map(|s| s.row(which))
    }

    /// Whether it is the last read of its table's snapshot.
    pub(super) fn ends_snapshot(&self) -> bool {
        self.ends_snapshot
    }

    /// Where the event sits in its source's order.
    pub(super) fn position(&self) -> std::result::Result<Position, String> {
        self.position.clone()
    }
}

/// The tables of one body's events, each named once: the text of its
/// `source` namespace and table fields, and the name they make.
#[derive(Default)]
struct Tables<'a> {
    seen: Vec<([&'a str; 3], Arc<str>)>,
}

/// Distinct tables remembered per body (the others are named per event).
const MAX_TABLES: usize = 64;

impl<'a> Tables<'a> {
    /// `schema.table` (`db.table` without a schema); empty when `source`
    /// names no table.
    fn name(&mut self, source: &Origin<'a>) -> Arc<str> {
        let [schema, db, table] = source.names;
        let raw = |r: Option<Raw<'a>>| r.map_or("", Raw::get);
        let key = [raw(schema), raw(db), raw(table)];
        if let Some((_, name)) = self.seen.iter().find(|(k, _)| *k == key) {
            return name.clone();
        }
        let text = |r: Option<Raw<'a>>| r.and_then(string).filter(|s| !s.is_empty());
        let name: Arc<str> = match (text(schema).or(text(db)), text(table)) {
            (Some(ns), Some(t)) => format!("{ns}.{t}").into(),
            _ => "".into(),
        };
        if self.seen.len() < MAX_TABLES {
            self.seen.push((key, name.clone()));
        }
        name
    }
}

/// A JSON value's text as it stands in the body (read as JSON, so valid).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Raw<'a>(&'a str);

impl<'a> Raw<'a> {
    pub(super) fn get(self) -> &'a str {
        self.0
    }
}

impl<'de> Deserialize<'de> for Raw<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        <&RawValue>::deserialize(d).map(|r| Raw(r.get()))
    }
}

/// A field present in an event (null too: `Some("null")`); absent is `None`.
fn present<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Option<Raw<'de>>, D::Error> {
    Raw::deserialize(d).map(Some)
}

/// The parts of an event, or of its wrapper, that a reader needs; the rest
/// is skipped unread.
#[derive(Deserialize, Default, Debug)]
struct Parts<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    schema: Option<Raw<'a>>,
    #[serde(borrow, default, deserialize_with = "present")]
    payload: Option<Raw<'a>>,
    #[serde(borrow, default, deserialize_with = "image")]
    before: Option<Image<'a>>,
    #[serde(borrow, default, deserialize_with = "image")]
    after: Option<Image<'a>>,
    #[serde(borrow, default, deserialize_with = "origin")]
    source: Option<Origin<'a>>,
    #[serde(borrow, default, deserialize_with = "present")]
    op: Option<Raw<'a>>,
    /// A flattened event's (ExtractNewRecordState's `add.fields=op`).
    #[serde(rename = "__op", borrow, default, deserialize_with = "present")]
    flat_op: Option<Raw<'a>>,
    /// A flattened delete's (`delete.handling.mode=rewrite`).
    #[serde(rename = "__deleted", borrow, default, deserialize_with = "present")]
    flat_deleted: Option<Raw<'a>>,
}

impl Parts<'_> {
    /// `{"schema", "payload"}` (`schemas.enable=true`), not an event.
    fn is_wrapper(&self) -> bool {
        self.payload.is_some()
            && self.op.is_none()
            && self.flat_op.is_none()
            && self.flat_deleted.is_none()
            && self.before.is_none()
            && self.after.is_none()
            && self.source.is_none()
    }
}

/// An event's `source` block: the fields its table and its position are
/// read from.
#[derive(Deserialize, Default, Debug, Clone, Copy)]
struct Source<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    connector: Option<Raw<'a>>,
    #[serde(borrow, default, deserialize_with = "present")]
    schema: Option<Raw<'a>>,
    #[serde(borrow, default, deserialize_with = "present")]
    db: Option<Raw<'a>>,
    #[serde(borrow, default, deserialize_with = "present")]
    table: Option<Raw<'a>>,
    #[serde(borrow, default, deserialize_with = "present")]
    snapshot: Option<Raw<'a>>,
    #[serde(borrow, default, deserialize_with = "present")]
    sequence: Option<Raw<'a>>,
    #[serde(borrow, default, deserialize_with = "present")]
    lsn: Option<Raw<'a>>,
    #[serde(borrow, default, deserialize_with = "present")]
    file: Option<Raw<'a>>,
    #[serde(borrow, default, deserialize_with = "present")]
    pos: Option<Raw<'a>>,
    #[serde(borrow, default, deserialize_with = "present")]
    row: Option<Raw<'a>>,
    #[serde(borrow, default, deserialize_with = "present")]
    commit_lsn: Option<Raw<'a>>,
    #[serde(borrow, default, deserialize_with = "present")]
    change_lsn: Option<Raw<'a>>,
    #[serde(borrow, default, deserialize_with = "present")]
    event_serial_no: Option<Raw<'a>>,
    /// A flattened event's connector, told by its position fields when it
    /// does not name one.
    #[serde(skip)]
    inferred: Option<&'static str>,
}

/// What a reader keeps of a `source` block: the fields that name its
/// table (schema, db, table), its snapshot marker, and the place it gives
/// its events in the source's order (or why it gives none).
#[derive(Debug)]
struct Origin<'a> {
    names: [Option<Raw<'a>>; 3],
    snapshot: Option<Raw<'a>>,
    pos: std::result::Result<[i64; 4], String>,
}

/// A `source` block present in an event, kept as its `Origin`.
fn origin<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Option<Origin<'de>>, D::Error> {
    Ok(Option::<Source<'de>>::deserialize(d)?.map(|s| s.origin()))
}

impl<'a> Source<'a> {
    fn origin(&self) -> Origin<'a> {
        Origin {
            names: [self.schema, self.db, self.table],
            snapshot: self.snapshot,
            pos: self.position(),
        }
    }

    /// Where this source's events sit in its order (`core::debezium::at`
    /// adds each event's op).
    fn position(&self) -> std::result::Result<[i64; 4], String> {
        // PostgreSQL's usual form, read without building values.
        if self.is_postgres()
            && let Some((last, Some(lsn))) = self
                .sequence
                .and_then(|s| debezium::postgres_sequence(s.get()))
        {
            return Ok(debezium::postgres_pos(last.unwrap_or(0), lsn));
        }
        debezium::source_pos(&|k| self.value(k))
    }

    /// The fields read, in this struct's order (`scan::source_field`
    /// gives each name's place).
    fn from_fields(f: [Option<Raw<'a>>; 13]) -> Source<'a> {
        let [
            connector,
            schema,
            db,
            table,
            snapshot,
            sequence,
            lsn,
            file,
            pos,
            row,
            commit_lsn,
            change_lsn,
            event_serial_no,
        ] = f;
        Source {
            connector,
            schema,
            db,
            table,
            snapshot,
            sequence,
            lsn,
            file,
            pos,
            row,
            commit_lsn,
            change_lsn,
            event_serial_no,
            inferred: None,
        }
    }

    /// Field `k`'s place.
    fn slot(&mut self, k: &str) -> Option<&mut Option<Raw<'a>>> {
        Some(match k {
            "connector" => &mut self.connector,
            "schema" => &mut self.schema,
            "db" => &mut self.db,
            "table" => &mut self.table,
            "snapshot" => &mut self.snapshot,
            "sequence" => &mut self.sequence,
            "lsn" => &mut self.lsn,
            "file" => &mut self.file,
            "pos" => &mut self.pos,
            "row" => &mut self.row,
            "commit_lsn" => &mut self.commit_lsn,
            "change_lsn" => &mut self.change_lsn,
            "event_serial_no" => &mut self.event_serial_no,
            _ => return None,
        })
    }

    fn raw(&self, k: &str) -> Option<Raw<'a>> {
        let mut copy = *self;
        copy.slot(k).and_then(|v| *v)
    }

    /// Field `k` as a JSON value (what `core::debezium::position_of` reads).
    fn value(&self, k: &str) -> Option<Value> {
        match (k, self.raw(k), self.inferred) {
            ("connector", None, Some(c)) => Some(Value::String(c.into())),
            (_, raw, _) => serde_json::from_str(raw?.get()).ok(),
        }
    }

    fn is_postgres(&self) -> bool {
        self.connector.map(Raw::get) == Some("\"postgresql\"")
            || (self.connector.is_none() && self.inferred == Some("postgresql"))
    }
}

/// A JSON string's text, borrowed unless it has escapes.
fn string(raw: Raw<'_>) -> Option<Cow<'_, str>> {
    // `raw` is JSON already: a string without escapes is what its quotes hold.
    if let Some(inner) = raw
        .get()
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        && !inner.contains('\\')
    {
        return Some(Cow::Borrowed(inner));
    }
    match serde_json::from_str::<&str>(raw.get()) {
        Ok(s) => Some(Cow::Borrowed(s)),
        Err(_) => serde_json::from_str::<String>(raw.get())
            .ok()
            .map(Cow::Owned),
    }
}

/// The fields of a row image, in order, values unread.
#[derive(Debug)]
pub(super) struct Fields<'a>(pub(super) Vec<(Cow<'a, str>, Raw<'a>)>);

impl<'de> Deserialize<'de> for Fields<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Map;
        impl<'de> Visitor<'de> for Map {
            type Value = Fields<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                m: A,
            ) -> std::result::Result<Fields<'de>, A::Error> {
                Fields::visit(m)
            }
        }
        d.deserialize_map(Map)
    }
}

impl<'de> Fields<'de> {
    fn visit<A: MapAccess<'de>>(mut m: A) -> std::result::Result<Fields<'de>, A::Error> {
        #[derive(Deserialize)]
        struct Key<'a>(#[serde(borrow)] Cow<'a, str>);
        let mut out = Vec::with_capacity(m.size_hint().unwrap_or(8).min(256));
        while let Some(Key(k)) = m.next_key()? {
            let v: Raw<'de> = m.next_value()?;
            out.push((k, v));
        }
        Ok(Fields(out))
    }
}

/// A row image (`before`, `after`): its fields, or what it is instead.
#[derive(Debug)]
pub(super) enum Image<'a> {
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
pub(super) struct RowSchema {
    fields: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

impl RowSchema {
    fn of(fields: Option<&Vec<Value>>) -> RowSchema {
        let fields: Vec<(String, Value)> = fields
            .into_iter()
            .flatten()
            .filter_map(|f| Some((f.get("field")?.as_str()?.to_string(), f.clone())))
            .collect();
        let index = fields
            .iter()
            .enumerate()
            .map(|(i, (n, _))| (n.clone(), i))
            .collect();
        RowSchema { fields, index }
    }

    /// Each field's name and Connect schema, in the schema's order.
    pub(super) fn fields(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.fields.iter().map(|(n, v)| (n.as_str(), v))
    }

    pub(super) fn get(&self, name: &str) -> Option<&Value> {
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
        let fields = schema.get("fields").and_then(Value::as_array);
        let nested = |which: &str| {
            fields?
                .iter()
                .find(|f| f.get("field").and_then(Value::as_str) == Some(which))?
                .get("fields")?
                .as_array()
        };
        let (before, after) = match (nested("before"), nested("after")) {
            // A flattened event's schema (ExtractNewRecordState): the row's
            // fields at the top level, beside its `__` metadata.
            (None, None) => (RowSchema::of(fields), RowSchema::of(fields)),
            (b, a) => (RowSchema::of(b), RowSchema::of(a)),
        };
        EventSchema {
            not_a_change,
            before,
            after,
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
    fn get(&mut self, raw: Raw<'a>) -> Option<Arc<EventSchema>> {
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
    tables: &mut Tables<'a>,
) -> Result<Read<'a>> {
    let err = |m: String| event_err(flow, index, m);
    let text = text.trim_ascii();
    if let Some((schema, payload)) = schemas.known(text)
        && payload.starts_with('{')
        && let Some(parts) = scan::payload(payload.as_bytes(), 0)
            .filter(|(_, read)| read.len() == payload.len())
            .map(|(p, _)| p)
            .or_else(|| serde_json::from_str::<Parts>(payload).ok())
        && !parts.is_wrapper()
    {
        return event(flow, index, parts, Some(schema), payload, tables);
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
        return event(flow, index, outer, None, text, tables);
    }
    let schema = outer.schema.and_then(|r| schemas.get(r));
    let payload = outer.payload.map_or("null", Raw::get);
    if payload == "null" {
        return Ok(Read::Tombstone);
    }
    if !payload.starts_with('{') {
        return Err(not_an_object(payload));
    }
    let parts: Parts =
        serde_json::from_str(payload).map_err(|e| not_an_event(flow, index, payload, e))?;
    event(flow, index, parts, schema, payload, tables)
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
    tables: &mut Tables<'a>,
) -> Result<Read<'a>> {
    let err = |m: String| event_err(flow, index, m);
    if parts.flat_op.is_some() || parts.flat_deleted.is_some() {
        return flattened(flow, index, schema, text, tables).map(Read::Change);
    }
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
        return Err(err(format!(
            "event {index} has no `op`: it is not a Debezium change event"
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
    let change = Change::new(
        index,
        op,
        source,
        (parts.before, parts.after),
        schema,
        tables,
    );
    if change.table.is_empty() {
        return Err(err(format!(
            "event {index}'s source names no table (source.schema or source.db, and source.table)"
        )));
    }
    Ok(Read::Change(change))
}

/// An event flattened by Debezium's ExtractNewRecordState SMT: the row
/// (`after`, or `before` for a rewritten delete) with the metadata its
/// `add.fields` named as `__` fields beside it. The operation (`__op`) and
/// the source position (`__sequence` or `__lsn` for PostgreSQL, `__file`,
/// `__pos`, `__row` for MySQL, `__commit_lsn`, `__change_lsn`,
/// `__event_serial_no` for SQL Server; `__source_x` as well as `__x`) are
/// needed; `__table` with `__schema` (or `__db`) names its table. Every
/// `__` field is metadata, never a column.
fn flattened<'a>(
    flow: &str,
    index: usize,
    schema: Option<Arc<EventSchema>>,
    text: &'a str,
    tables: &mut Tables<'a>,
) -> Result<Change<'a>> {
    let err = |m: String| event_err(flow, index, m);
    let Fields(all) = serde_json::from_str(text)
        .map_err(|e| err(format!("event {index} is not valid JSON: {e}")))?;
    let mut source = Source::default();
    let mut row = Vec::with_capacity(all.len());
    let (mut op, mut deleted) = (None, false);
    for (name, v) in all {
        let Some(meta) = name.strip_prefix("__") else {
            row.push((name, v));
            continue;
        };
        let slot = match meta.strip_prefix("source_").unwrap_or(meta) {
            "op" => &mut op,
            "deleted" => {
                deleted = v.get() == "true" || string(v).as_deref() == Some("true");
                continue;
            }
            name => match source.slot(name) {
                Some(slot) => slot,
                None => continue,
            },
        };
        *slot = Some(v);
    }
    const NEEDS: &str = "the SMT's add.fields";
    let op = match op.and_then(string).as_deref().map(Op::parse) {
        _ if deleted => Op::Delete,
        Some(Some(op)) => op,
        Some(None) => {
            return Err(err(format!(
                "event {index} has an `__op` Debezium does not send"
            )));
        }
        None => {
            return Err(err(format!(
                "event {index} is flattened (ExtractNewRecordState) without `__op`: add op to {NEEDS}, so that snapshot reads, changes and deletes are told apart"
            )));
        }
    };
    source.inferred = match (
        &source.sequence,
        &source.lsn,
        &source.file,
        &source.commit_lsn,
    ) {
        (Some(_), ..) | (_, Some(_), ..) => Some("postgresql"),
        (_, _, Some(_), _) => Some("mysql"),
        (.., Some(_)) => Some("sqlserver"),
        _ if source.connector.is_some() => None,
        _ => {
            return Err(err(format!(
                "event {index} is flattened (ExtractNewRecordState) without its source position: add sequence (PostgreSQL), file,pos,row (MySQL) or commit_lsn,change_lsn,event_serial_no (SQL Server) to {NEEDS}"
            )));
        }
    };
    // Without `__table` it is taken by the flow it is sent to (not routed).
    let image = Some(Image::Row(Fields(row)));
    let images = if op == Op::Delete {
        (image, None)
    } else {
        (None, image)
    };
    Ok(Change::new(
        index,
        op,
        source.origin(),
        images,
        schema,
        tables,
    ))
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
    // A body that is not UTF-8 says so, whichever event met it first.
    read_events(flow, format, body, limits).map_err(|e| match utf8(flow, body) {
        Err(not) => not,
        Ok(_) => e,
    })
}

/// `body` as text, or why it is not UTF-8 (std names the first bad byte).
fn utf8<'a>(flow: &str, body: &'a [u8]) -> Result<&'a str> {
    simdutf8::basic::from_utf8(body)
        .or_else(|_| std::str::from_utf8(body))
        .map_err(|e| Error::Input {
            code: codes::MALFORMED_BODY,
            flow: flow.to_string(),
            message: format!("the body is not UTF-8 JSON: {e}"),
        })
}

fn read_events<'a>(
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
    // A JSON array's UTF-8 is checked event by event (`scan`, and serde's
    // reading of a slice), the others' at once.
    let whole = || utf8(flow, body);
    let mut out = (Vec::new(), Skipped::default());
    let mut schemas = Schemas::default();
    let mut tables = Tables::default();
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
            let text = whole()?;
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
                keep(
                    &mut out,
                    read_one(flow, index, line, &mut schemas, &mut tables)?,
                );
                index += 1;
            }
        }
        BodyFormat::JsonArray if body.get(skip_ws(0)) != Some(&b'[') => {
            keep(
                &mut out,
                read_one(flow, 0, whole()?.trim_ascii(), &mut schemas, &mut tables)?,
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
                    let end = match known_event(flow, index, body, i, &schemas, &mut tables) {
                        Some(read) => {
                            let (read, end) = read?;
                            keep(&mut out, read);
                            end
                        }
                        None => {
                            // The long way: the element as it is.
                            let mut one = serde_json::Deserializer::from_slice(&body[i..])
                                .into_iter::<&RawValue>();
                            match one.next() {
                                Some(Ok(raw)) => {
                                    let element = raw.get();
                                    keep(
                                        &mut out,
                                        read_one(flow, index, element, &mut schemas, &mut tables)?,
                                    );
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
    body: &'a [u8],
    at: usize,
    schemas: &Schemas<'a>,
    tables: &mut Tables<'a>,
) -> Option<Result<(Read<'a>, usize)>> {
    let (schema, offset) = schemas.known_at(&body[at..])?;
    let from = at + offset;
    if body.get(from) != Some(&b'{') {
        return None;
    }
    let (parts, text) = scan::payload(body, from).or_else(|| {
        let mut one = serde_json::Deserializer::from_slice(&body[from..]).into_iter::<Parts>();
        let parts = one.next()?.ok()?;
        let text = std::str::from_utf8(&body[from..from + one.byte_offset()]).ok()?;
        Some((parts, text))
    })?;
    if parts.is_wrapper() {
        return None;
    }
    let mut close = from + text.len();
    while body.get(close).is_some_and(u8::is_ascii_whitespace) {
        close += 1;
    }
    if body.get(close) != Some(&b'}') {
        return None;
    }
    Some(event(flow, index, parts, Some(schema), text, tables).map(|r| (r, close + 1)))
}

#[cfg(test)]
mod tests;
