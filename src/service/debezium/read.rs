//! Reading a body of Debezium events in one pass, borrowed from the body:
//! the envelope's parts (`Parts`) and the `Change`s they make, element by
//! element (`read_body`). Its rooms: the source block and the tables it
//! names (`source`), row images (`images`), value schemas read once per
//! body (`schemas`, whose repeated text is skipped by its bytes), and the
//! hand-written reading of the common payload (`scan`). Turning changes
//! into a flow's rows is the parent module.

use std::borrow::Cow;
use std::sync::Arc;

use serde::Deserialize;
use serde::de::Deserializer;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::{Skipped, event_err};
use crate::core::debezium::{self, Op, Position};
use crate::error::{Error, Result, codes};
use crate::service::input::body::{BodyFormat, Limits};

mod chunks;
mod images;
mod scan;
mod schemas;
mod source;

pub use chunks::Body;
use chunks::Cursor;
use images::image;
pub(super) use images::{Fields, Image};
pub(super) use schemas::RowSchema;
use schemas::{EventSchema, Schemas};
use source::{Origin, Source, Tables, origin};

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

/// An object's key as serde reads it: borrowed from the body, unescaped
/// (owned) when it has escapes.
#[derive(Deserialize)]
struct Key<'a>(#[serde(borrow)] Cow<'a, str>);

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
    source.inferred = match source.position_fields() {
        Some(connector) => Some(connector),
        None if source.has_connector() => None,
        None => {
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
    body: Body<'a>,
    limits: Limits,
) -> Result<(Vec<Change<'a>>, Skipped)> {
    // A body that is not UTF-8 says so, whichever event met it first.
    read_events(flow, format, body, limits).map_err(|e| {
        match utf8(flow, Cursor::new(body).whole()) {
            Err(not) => not,
            Ok(_) => e,
        }
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

fn malformed(flow: &str, why: String) -> Error {
    Error::Input {
        code: codes::MALFORMED_BODY,
        flow: flow.to_string(),
        message: format!("the body is not a JSON array of events: {why}"),
    }
}

fn read_events<'a>(
    flow: &str,
    format: BodyFormat,
    body: Body<'a>,
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
    let mut out = (Vec::new(), Skipped::default());
    let mut schemas = Schemas::default();
    let mut tables = Tables::default();
    let keep = |out: &mut (Vec<Change<'a>>, Skipped), read: Read<'a>| match read {
        Read::Change(c) => out.0.push(c),
        Read::Tombstone => out.1.tombstones += 1,
        Read::NotAChange => out.1.not_changes += 1,
        Read::Message => out.1.messages += 1,
    };
    let mut c = Cursor::new(body);
    match format {
        BodyFormat::Ndjson => {
            let mut index = 0;
            while let Some(line) = c.line() {
                // Lines end at a `\n`, never inside a character: each
                // line's UTF-8 is the body's.
                let line = utf8(flow, line)?.trim_ascii();
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
        BodyFormat::JsonArray => {
            c.skip_ws();
            if c.peek() != Some(b'[') {
                let text = utf8(flow, c.whole())?.trim_ascii();
                keep(
                    &mut out,
                    read_one(flow, 0, text, &mut schemas, &mut tables)?,
                );
                return Ok(out);
            }
            // A JSON array's UTF-8 is checked event by event (`scan`, and
            // serde's reading of a slice).
            c.advance(1);
            c.skip_ws();
            let mut index = 0;
            if c.peek() == Some(b']') {
                c.advance(1);
            } else {
                loop {
                    if index == limits.max_rows {
                        return Err(too_many());
                    }
                    let read =
                        c.element(|bytes| element(flow, index, bytes, &mut schemas, &mut tables))?;
                    keep(&mut out, read);
                    index += 1;
                    c.skip_ws();
                    match c.peek() {
                        Some(b',') => {
                            c.advance(1);
                            c.skip_ws();
                        }
                        Some(b']') => {
                            c.advance(1);
                            break;
                        }
                        None => return Err(malformed(flow, "the array is not closed".into())),
                        Some(_) => {
                            return Err(malformed(
                                flow,
                                format!(
                                    "expected `,` or `]` after event {} at byte {}",
                                    index - 1,
                                    c.at()
                                ),
                            ));
                        }
                    }
                }
            }
            let after = c.at();
            c.skip_ws();
            if !c.at_end() {
                return Err(malformed(
                    flow,
                    format!("unexpected bytes after the array at byte {after}"),
                ));
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

/// The element of a JSON array that `bytes` start with, and its length:
/// the fast way when it is wrapped with a schema seen before, else the
/// element as it is.
fn element<'a>(
    flow: &str,
    index: usize,
    bytes: &'a [u8],
    schemas: &mut Schemas<'a>,
    tables: &mut Tables<'a>,
) -> Result<(Read<'a>, usize)> {
    if let Some(read) = known_event(flow, index, bytes, schemas, tables) {
        return read;
    }
    let mut one = serde_json::Deserializer::from_slice(bytes).into_iter::<&RawValue>();
    match one.next() {
        Some(Ok(raw)) => {
            let read = read_one(flow, index, raw.get(), schemas, tables)?;
            Ok((read, one.byte_offset()))
        }
        Some(Err(e)) if !e.is_eof() => Err(event_err(
            flow,
            index,
            format!("event {index} is not valid JSON: {e}"),
        )),
        Some(Err(_)) | None => Err(malformed(flow, "the array is not closed".into())),
    }
}

/// The element `bytes` start with when it is wrapped with a schema seen
/// before: the event, read without reading its schema again, and the
/// element's length. `None`: read it the long way.
fn known_event<'a>(
    flow: &str,
    index: usize,
    bytes: &'a [u8],
    schemas: &Schemas<'a>,
    tables: &mut Tables<'a>,
) -> Option<Result<(Read<'a>, usize)>> {
    let (schema, from) = schemas.known_at(bytes)?;
    if bytes.get(from) != Some(&b'{') {
        return None;
    }
    let (parts, text) = scan::payload(bytes, from).or_else(|| {
        let mut one = serde_json::Deserializer::from_slice(&bytes[from..]).into_iter::<Parts>();
        let parts = one.next()?.ok()?;
        let text = std::str::from_utf8(&bytes[from..from + one.byte_offset()]).ok()?;
        Some((parts, text))
    })?;
    if parts.is_wrapper() {
        return None;
    }
    let mut close = from + text.len();
    while bytes.get(close).is_some_and(u8::is_ascii_whitespace) {
        close += 1;
    }
    if bytes.get(close) != Some(&b'}') {
        return None;
    }
    Some(event(flow, index, parts, Some(schema), text, tables).map(|r| (r, close + 1)))
}

#[cfg(test)]
mod tests;
