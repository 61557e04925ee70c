//! An event's `source` block (`Source`), what a reader keeps of it
//! (`Origin`: the names of its table, its snapshot marker, its position)
//! and the tables of a body, each named once (`Tables`).

use std::sync::Arc;

use serde::Deserialize;
use serde::de::{Deserializer, Error as _, IgnoredAny, MapAccess, Visitor};
use serde_json::Value;

use super::{Key, Raw, string};
use crate::core::debezium;

/// The `source` fields read, each at its place in `Source`.
pub(super) const FIELDS: [&str; 13] = [
    "connector",
    "schema",
    "db",
    "table",
    "snapshot",
    "sequence",
    "lsn",
    "file",
    "pos",
    "row",
    "commit_lsn",
    "change_lsn",
    "event_serial_no",
];
const CONNECTOR: usize = 0;
const SCHEMA: usize = 1;
const DB: usize = 2;
const TABLE: usize = 3;
const SNAPSHOT: usize = 4;
const SEQUENCE: usize = 5;
const LSN: usize = 6;
const FILE: usize = 7;
const COMMIT_LSN: usize = 10;

/// A `source` field's place in `FIELDS`; `None` for the fields not read.
/// One match on the key's bytes, so a key is compared with the names of
/// its length only (a search of `FIELDS` showed in profiles of reading
/// events).
pub(super) fn field(key: &[u8]) -> Option<usize> {
    Some(match key {
        b"connector" => 0,
        b"schema" => 1,
        b"db" => 2,
        b"table" => 3,
        b"snapshot" => 4,
        b"sequence" => 5,
        b"lsn" => 6,
        b"file" => 7,
        b"pos" => 8,
        b"row" => 9,
        b"commit_lsn" => 10,
        b"change_lsn" => 11,
        b"event_serial_no" => 12,
        _ => return None,
    })
}

/// An event's `source` block: the fields its table and its position are
/// read from (`FIELDS`; null ones too, as `Some("null")`).
#[derive(Default, Debug, Clone, Copy)]
pub(super) struct Source<'a> {
    fields: [Option<Raw<'a>>; 13],
    /// A flattened event's connector, told by its position fields when it
    /// does not name one.
    pub(super) inferred: Option<&'static str>,
}

/// Read as serde derives a struct's reading would (other fields skipped,
/// a field given twice refused), with `field`'s places.
impl<'de> Deserialize<'de> for Source<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Block;
        impl<'de> Visitor<'de> for Block {
            type Value = Source<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a source block")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut m: A,
            ) -> std::result::Result<Source<'de>, A::Error> {
                let mut source = Source::default();
                while let Some(Key(k)) = m.next_key()? {
                    match field(k.as_bytes()) {
                        Some(i) if source.fields[i].is_some() => {
                            return Err(A::Error::duplicate_field(FIELDS[i]));
                        }
                        Some(i) => source.fields[i] = Some(m.next_value()?),
                        None => {
                            m.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(source)
            }
        }
        d.deserialize_map(Block)
    }
}

/// What a reader keeps of a `source` block: the fields that name its
/// table (schema, db, table), its snapshot marker, and the place it gives
/// its events in the source's order (or why it gives none).
#[derive(Debug)]
pub(super) struct Origin<'a> {
    pub(super) names: [Option<Raw<'a>>; 3],
    pub(super) snapshot: Option<Raw<'a>>,
    pub(super) pos: std::result::Result<[i64; 4], String>,
}

/// A `source` block present in an event, kept as its `Origin`.
pub(super) fn origin<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<Origin<'de>>, D::Error> {
    Ok(Option::<Source<'de>>::deserialize(d)?.map(|s| s.origin()))
}

impl<'a> Source<'a> {
    pub(super) fn origin(&self) -> Origin<'a> {
        Origin {
            names: [self.fields[SCHEMA], self.fields[DB], self.fields[TABLE]],
            snapshot: self.fields[SNAPSHOT],
            pos: self.position(),
        }
    }

    /// Where this source's events sit in its order (`core::debezium::at`
    /// adds each event's op).
    fn position(&self) -> std::result::Result<[i64; 4], String> {
        // PostgreSQL's usual form, read without building values.
        if self.is_postgres()
            && let Some((last, Some(lsn))) =
                self.fields[SEQUENCE].and_then(|s| debezium::postgres_sequence(s.get()))
        {
            return Ok(debezium::postgres_pos(last.unwrap_or(0), lsn));
        }
        debezium::source_pos(&|k| self.value(k))
    }

    /// The fields read, at their places in `FIELDS`.
    pub(super) fn from_fields(fields: [Option<Raw<'a>>; 13]) -> Source<'a> {
        Source {
            fields,
            inferred: None,
        }
    }

    /// Field `k`'s place.
    pub(super) fn slot(&mut self, k: &str) -> Option<&mut Option<Raw<'a>>> {
        field(k.as_bytes()).map(|i| &mut self.fields[i])
    }

    pub(super) fn raw(&self, k: &str) -> Option<Raw<'a>> {
        field(k.as_bytes()).and_then(|i| self.fields[i])
    }

    /// Which connector's position fields it has: `Some` of the connector
    /// they tell (PostgreSQL: sequence or lsn; MySQL: file; SQL Server:
    /// commit_lsn); `None` when it has none of them.
    pub(super) fn position_fields(&self) -> Option<&'static str> {
        let has = |i: usize| self.fields[i].is_some();
        if has(SEQUENCE) || has(LSN) {
            Some("postgresql")
        } else if has(FILE) {
            Some("mysql")
        } else if has(COMMIT_LSN) {
            Some("sqlserver")
        } else {
            None
        }
    }

    pub(super) fn has_connector(&self) -> bool {
        self.fields[CONNECTOR].is_some()
    }

    /// Field `k` as a JSON value (what `core::debezium::position_of` reads).
    fn value(&self, k: &str) -> Option<Value> {
        match (k, self.raw(k), self.inferred) {
            ("connector", None, Some(c)) => Some(Value::String(c.into())),
            (_, raw, _) => serde_json::from_str(raw?.get()).ok(),
        }
    }

    fn is_postgres(&self) -> bool {
        let connector = self.fields[CONNECTOR];
        connector.map(Raw::get) == Some("\"postgresql\"")
            || (connector.is_none() && self.inferred == Some("postgresql"))
    }
}

/// The tables of one body's events, each named once: the text of its
/// `source` namespace and table fields, and the name they make.
#[derive(Default)]
pub(super) struct Tables<'a> {
    seen: Vec<([&'a str; 3], Arc<str>)>,
}

/// Distinct tables remembered per body (the others are named per event).
const MAX_TABLES: usize = 64;

impl<'a> Tables<'a> {
    /// `schema.table` (`db.table` without a schema); empty when `source`
    /// names no table.
    pub(super) fn name(&mut self, source: &Origin<'a>) -> Arc<str> {
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

#[cfg(test)]
mod tests {
    use super::{FIELDS, field};

    /// `field` places every name of `FIELDS` where `FIELDS` has it, and no
    /// other name (a prefix, another case, an unread field).
    #[test]
    fn field_places_are_the_names_places() {
        for (i, name) in FIELDS.iter().enumerate() {
            assert_eq!(field(name.as_bytes()), Some(i), "{name}");
        }
        for other in [
            "",
            "ts_ms",
            "version",
            "txId",
            "Connector",
            "lsn ",
            "commit",
            "pos1",
        ] {
            assert_eq!(field(other.as_bytes()), None, "{other}");
        }
    }
}
