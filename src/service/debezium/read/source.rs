//! An event's `source` block (`Source`), what a reader keeps of it
//! (`Origin`: the names of its table, its snapshot marker, its position)
//! and the tables of a body, each named once (`Tables`).

use std::sync::Arc;

use serde::Deserialize;
use serde::de::Deserializer;
use serde_json::Value;

use super::{Raw, present, string};
use crate::core::debezium;

/// An event's `source` block: the fields its table and its position are
/// read from.
#[derive(Deserialize, Default, Debug, Clone, Copy)]
pub(super) struct Source<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    pub(super) connector: Option<Raw<'a>>,
    #[serde(borrow, default, deserialize_with = "present")]
    pub(super) schema: Option<Raw<'a>>,
    #[serde(borrow, default, deserialize_with = "present")]
    pub(super) db: Option<Raw<'a>>,
    #[serde(borrow, default, deserialize_with = "present")]
    pub(super) table: Option<Raw<'a>>,
    #[serde(borrow, default, deserialize_with = "present")]
    pub(super) snapshot: Option<Raw<'a>>,
    #[serde(borrow, default, deserialize_with = "present")]
    pub(super) sequence: Option<Raw<'a>>,
    #[serde(borrow, default, deserialize_with = "present")]
    pub(super) lsn: Option<Raw<'a>>,
    #[serde(borrow, default, deserialize_with = "present")]
    pub(super) file: Option<Raw<'a>>,
    #[serde(borrow, default, deserialize_with = "present")]
    pub(super) pos: Option<Raw<'a>>,
    #[serde(borrow, default, deserialize_with = "present")]
    pub(super) row: Option<Raw<'a>>,
    #[serde(borrow, default, deserialize_with = "present")]
    pub(super) commit_lsn: Option<Raw<'a>>,
    #[serde(borrow, default, deserialize_with = "present")]
    pub(super) change_lsn: Option<Raw<'a>>,
    #[serde(borrow, default, deserialize_with = "present")]
    pub(super) event_serial_no: Option<Raw<'a>>,
    /// A flattened event's connector, told by its position fields when it
    /// does not name one.
    #[serde(skip)]
    pub(super) inferred: Option<&'static str>,
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
            names: [self.schema, self.db, self.table],
            snapshot: self.snapshot,
            pos: self.position(),
        }
    }

    /// Where this source's events sit in its order (`core::debezium::at`
    /// adds each event's op).
    pub(super) fn position(&self) -> std::result::Result<[i64; 4], String> {
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
    pub(super) fn from_fields(f: [Option<Raw<'a>>; 13]) -> Source<'a> {
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
    pub(super) fn slot(&mut self, k: &str) -> Option<&mut Option<Raw<'a>>> {
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

    pub(super) fn raw(&self, k: &str) -> Option<Raw<'a>> {
        let mut copy = *self;
        copy.slot(k).and_then(|v| *v)
    }

    /// Field `k` as a JSON value (what `core::debezium::position_of` reads).
    pub(super) fn value(&self, k: &str) -> Option<Value> {
        match (k, self.raw(k), self.inferred) {
            ("connector", None, Some(c)) => Some(Value::String(c.into())),
            (_, raw, _) => serde_json::from_str(raw?.get()).ok(),
        }
    }

    pub(super) fn is_postgres(&self) -> bool {
        self.connector.map(Raw::get) == Some("\"postgresql\"")
            || (self.connector.is_none() && self.inferred == Some("postgresql"))
    }
}

/// The tables of one body's events, each named once: the text of its
/// `source` namespace and table fields, and the name they make.
#[derive(Default)]
pub(super) struct Tables<'a> {
    pub(super) seen: Vec<([&'a str; 3], Arc<str>)>,
}

/// Distinct tables remembered per body (the others are named per event).
pub(super) const MAX_TABLES: usize = 64;

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
