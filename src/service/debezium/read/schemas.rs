//! Value schemas (`schemas.enable=true`): what an event's schema says of
//! its rows (`EventSchema`, `RowSchema`), each read once per body
//! (`Schemas`, which knows a repeated schema by its bytes).

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

use super::Raw;

/// What an event's value schema says about its rows: each field's Kafka
/// Connect schema by name, and whether it is no change at all.
#[derive(Debug, Default)]
pub(super) struct EventSchema {
    /// A heartbeat or transaction metadata schema.
    pub(super) not_a_change: bool,
    before: RowSchema,
    after: RowSchema,
}

/// The fields of a row in a value schema, in the schema's order (the order
/// Debezium writes a row's fields in), each with its Connect schema.
#[derive(Debug, Default)]
pub(in crate::service::debezium) struct RowSchema {
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
    pub(in crate::service::debezium) fn fields(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.fields.iter().map(|(n, v)| (n.as_str(), v))
    }

    pub(in crate::service::debezium) fn get(&self, name: &str) -> Option<&Value> {
        self.index.get(name).map(|&i| &self.fields[i].1)
    }
}

impl EventSchema {
    pub(super) fn read(raw: &str) -> EventSchema {
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

    pub(super) fn row(&self, which: &str) -> &RowSchema {
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
pub(super) struct Schemas<'a> {
    seen: Vec<(&'a str, Arc<EventSchema>)>,
}

/// Distinct schemas remembered per body (a body of many tables, or of a
/// table whose schema changed, reads the others each time).
const MAX_SCHEMAS: usize = 16;

impl<'a> Schemas<'a> {
    pub(in crate::service::debezium) fn get(&mut self, raw: Raw<'a>) -> Option<Arc<EventSchema>> {
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
    pub(super) fn known_at(&self, bytes: &[u8]) -> Option<(Arc<EventSchema>, usize)> {
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
    pub(super) fn known(&self, text: &'a str) -> Option<(Arc<EventSchema>, &'a str)> {
        let (s, at) = self.known_at(text.as_bytes())?;
        let payload = text[at..].trim_ascii_end().strip_suffix('}')?;
        Some((s, payload))
    }
}
