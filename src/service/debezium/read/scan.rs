//! The payload of an event read by hand, for speed: the common shape only
//! (keys without escapes, a `source` object, row images that are objects or
//! null). It reads exactly what serde's reading of `Parts` reads, checking
//! the same JSON grammar on the way, or it declines (`None`) and the
//! caller reads the payload with serde, which answers anything else,
//! errors included. Held to serde's reading by a property test
//! (`tests::scan_reads_what_serde_reads`).
//!
//! It reads bytes, keeping where each part is, and checks the payload's
//! UTF-8 once it has found its end (while it is in the cache): a body's
//! repeated schemas are never checked byte by byte (`Schemas::known_at`
//! compares them with one checked before).
//!
//! Why by hand: serde's derived reading spent ~0.9 µs of a Debezium
//! event's ~3.6 µs on its ~30 keys and values (token by token through the
//! visitor machinery); this reads them in a third of that.

use std::borrow::Cow;

use super::source::{self, Source};
use super::{Fields, Image, Parts, Raw};

/// Containers nested deeper than this are left to serde (whose own limit
/// is 128, counted from the body).
const MAX_DEPTH: usize = 64;

/// Where a part is in the body: [start, end).
type Span = (usize, usize);

/// `Parts`, by where each is in the body.
#[derive(Default)]
struct Found {
    schema: Option<Span>,
    payload: Option<Span>,
    before: Option<Shape>,
    after: Option<Shape>,
    /// `Some(None)`: `"source": null`.
    source: Option<Option<[Option<Span>; 13]>>,
    op: Option<Span>,
    flat_op: Option<Span>,
    flat_deleted: Option<Span>,
}

/// A row image: `null`, or its fields (key, value).
enum Shape {
    Null,
    Row(Vec<(Span, Span)>),
}

struct Scan<'a> {
    b: &'a [u8],
    i: usize,
}

/// The payload object starting at byte `at` of `body` read as `Parts`, and
/// its text (UTF-8 checked; it ends after the closing brace); `None`: read
/// it with serde.
pub(super) fn payload(body: &[u8], at: usize) -> Option<(Parts<'_>, &str)> {
    let mut s = Scan { b: body, i: at };
    let found = s.parts()?;
    let text = simdutf8::basic::from_utf8(&body[at..s.i]).ok()?;
    Some((found.read(text, at)?, text))
}

impl Found {
    /// The parts, their text taken from `text`, which starts at byte `base`.
    fn read(self, text: &str, base: usize) -> Option<Parts<'_>> {
        let get = |s: Span| text.get(s.0 - base..s.1 - base);
        // `None`: a span off a character boundary (never, as spans start and
        // end at ASCII bytes; refused rather than trusted).
        let raw = |s: Option<Span>| match s {
            None => Some(None),
            Some(s) => get(s).map(|t| Some(Raw(t))),
        };
        let image = |i: Option<Shape>| -> Option<Option<Image<'_>>> {
            Some(match i {
                None => None,
                Some(Shape::Null) => Some(Image::Not("null")),
                Some(Shape::Row(fields)) => Some(Image::Row(Fields(
                    fields
                        .into_iter()
                        .map(|(k, v)| Some((Cow::Borrowed(get(k)?), Raw(get(v)?))))
                        .collect::<Option<_>>()?,
                ))),
            })
        };
        let source = match self.source {
            Some(Some(spans)) => {
                let mut fields = [None; 13];
                for (field, span) in fields.iter_mut().zip(spans) {
                    *field = raw(span)?;
                }
                Some(Source::from_fields(fields).origin())
            }
            _ => None,
        };
        Some(Parts {
            schema: raw(self.schema)?,
            payload: raw(self.payload)?,
            before: image(self.before)?,
            after: image(self.after)?,
            source,
            op: raw(self.op)?,
            flat_op: raw(self.flat_op)?,
            flat_deleted: raw(self.flat_deleted)?,
        })
    }
}

/// Sets a field once: a second one is serde's "duplicate field" error.
fn once<T>(slot: &mut Option<T>, v: T) -> Option<()> {
    match slot {
        Some(_) => None,
        None => {
            *slot = Some(v);
            Some(())
        }
    }
}

impl<'a> Scan<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\n' | b'\r' | b'\t')) {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek() == Some(c)).then(|| self.i += 1)
    }

    /// `{`, then each member's key (without escapes) to `member`, which
    /// reads its value; then `}`.
    fn object(&mut self, mut member: impl FnMut(&mut Self, Span) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        self.ws();
        if self.eat(b'}').is_some() {
            return Some(());
        }
        loop {
            let key = self.key()?;
            self.ws();
            self.eat(b':')?;
            self.ws();
            member(self, key)?;
            self.ws();
            match self.peek()? {
                b',' => {
                    self.i += 1;
                    self.ws();
                }
                b'}' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// A key's text; `None` when it has an escape (serde unescapes it).
    fn key(&mut self) -> Option<Span> {
        self.eat(b'"')?;
        let start = self.i;
        loop {
            match *self.b.get(self.i)? {
                b'"' => break,
                b'\\' => return None,
                c if c < 0x20 => return None,
                _ => self.i += 1,
            }
        }
        self.i += 1;
        Some((start, self.i - 1))
    }

    fn text(&self, s: Span) -> &'a [u8] {
        &self.b[s.0..s.1]
    }

    /// A value, checked as JSON; `depth` containers around it.
    fn raw(&mut self, depth: usize) -> Option<Span> {
        let start = self.i;
        self.skip(depth)?;
        Some((start, self.i))
    }
    fn skip(&mut self, depth: usize) -> Option<()> {
        match self.peek()? {
            b'"' => self.string(),
            b'{' if depth < MAX_DEPTH => self.object(|s, _| s.skip(depth + 1)),
            b'[' if depth < MAX_DEPTH => self.array(depth + 1),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    fn array(&mut self, depth: usize) -> Option<()> {
        self.eat(b'[')?;
        self.ws();
        if self.eat(b']').is_some() {
            return Some(());
        }
        loop {
            self.skip(depth)?;
            self.ws();
            match self.peek()? {
                b',' => {
                    self.i += 1;
                    self.ws();
                }
                b']' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        self.b[self.i..]
            .starts_with(word)
            .then(|| self.i += word.len())
    }

    /// A string, its escapes checked (`\u` is left to serde).
    fn string(&mut self) -> Option<()> {
        self.eat(b'"')?;
        loop {
            let c = *self.b.get(self.i)?;
            self.i += 1;
            match c {
                b'"' => return Some(()),
                b'\\' => {
                    let e = *self.b.get(self.i)?;
                    self.i += 1;
                    if !matches!(e, b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') {
                        return None;
                    }
                }
                c if c < 0x20 => return None,
                _ => {}
            }
        }
    }

    /// A number as JSON spells it: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
    fn number(&mut self) -> Option<()> {
        self.eat(b'-');
        match self.peek()? {
            b'0' => {
                self.i += 1;
                if self.peek().is_some_and(|c| c.is_ascii_digit()) {
                    return None;
                }
            }
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.eat(b'.').is_some() {
            self.some_digits()?;
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.i += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.i += 1;
            }
            self.some_digits()?;
        }
        Some(())
    }

    fn digits(&mut self) {
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.i += 1;
        }
    }

    fn some_digits(&mut self) -> Option<()> {
        let from = self.i;
        self.digits();
        (self.i > from).then_some(())
    }

    fn parts(&mut self) -> Option<Found> {
        let mut p = Found::default();
        self.object(|s, key| match s.text(key) {
            b"schema" => once(&mut p.schema, s.raw(1)?),
            b"payload" => once(&mut p.payload, s.raw(1)?),
            b"before" => once(&mut p.before, s.image()?),
            b"after" => once(&mut p.after, s.image()?),
            b"source" => once(&mut p.source, s.source()?),
            b"op" => once(&mut p.op, s.raw(1)?),
            b"__op" => once(&mut p.flat_op, s.raw(1)?),
            b"__deleted" => once(&mut p.flat_deleted, s.raw(1)?),
            _ => s.skip(1),
        })?;
        Some(p)
    }

    /// A row image: an object's fields, or `null`; anything else is
    /// serde's to name.
    fn image(&mut self) -> Option<Shape> {
        if self.peek()? == b'n' {
            self.literal(b"null")?;
            return Some(Shape::Null);
        }
        let mut fields = Vec::with_capacity(8);
        self.object(|s, key| {
            fields.push((key, s.raw(2)?));
            Some(())
        })?;
        Some(Shape::Row(fields))
    }

    /// A `source` object (`None` for `null`).
    fn source(&mut self) -> Option<Option<[Option<Span>; 13]>> {
        if self.peek()? == b'n' {
            self.literal(b"null")?;
            return Some(None);
        }
        let mut fields = [None; 13];
        self.object(|s, key| match source::field(s.text(key)) {
            Some(f) => once(&mut fields[f], s.raw(2)?),
            None => s.skip(2),
        })?;
        Some(Some(fields))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::Parts;
    use super::payload;

    /// Keys a payload, a `source` or a row image may have: the ones read,
    /// others, and ones spelt with escapes.
    fn key() -> impl Strategy<Value = String> {
        prop_oneof![
            8 => prop::sample::select(vec![
                "schema", "payload", "before", "after", "source", "op", "__op", "__deleted",
                "connector", "db", "table", "sequence", "lsn", "file", "pos", "row",
                "commit_lsn", "change_lsn", "event_serial_no", "snapshot", "ts_ms", "id", "note",
            ])
            .prop_map(|k| serde_json::to_string(k).unwrap()),
            1 => Just("\"o\\u0070\"".to_string()),
            1 => Just("\"a\\\"b\"".to_string()),
            1 => "[a-z_é]{0,4}".prop_map(|k| serde_json::to_string(&k).unwrap()),
        ]
    }

    /// A JSON text built from the pieces payloads are made of, some of
    /// them not quite JSON.
    fn value() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            3 => Just("null".to_string()),
            2 => Just("true".to_string()),
            1 => Just("fals".to_string()),
            3 => any::<i64>().prop_map(|v| v.to_string()),
            3 => any::<f64>().prop_map(|v| serde_json::to_string(&v).unwrap()),
            2 => prop::sample::select(vec![
                "-0", "01", "1.", "-", "1e", "1E+2", "0.5e-3", "2.", ".5"
            ])
            .prop_map(str::to_string),
            4 => "[a-z\\\\\"é\n\t]{0,6}".prop_map(|s| serde_json::to_string(&s).unwrap()),
            1 => prop::sample::select(vec![
                "\"a\\x\"",
                "\"\\u00e9\"",
                "\"\u{1}\"",
                "\"[\\\"1\\\",\\\"2\\\"]\""
            ])
            .prop_map(str::to_string),
        ];
        leaf.prop_recursive(4, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec((key(), inner.clone()), 0..4).prop_map(|m| {
                    let m: Vec<String> = m.into_iter().map(|(k, v)| format!("{k}:{v}")).collect();
                    format!("{{{}}}", m.join(","))
                }),
                prop::collection::vec(inner, 0..4).prop_map(|v| format!("[{}]", v.join(","))),
            ]
        })
    }

    /// A payload object: its members, with whitespace, then a few bytes
    /// changed at random.
    fn payload_text() -> impl Strategy<Value = String> {
        let ws = prop::sample::select(vec!["", "", "", " ", "\n", "\t ", "\r\n"]);
        (
            prop::collection::vec((key(), value(), ws.clone(), ws), 0..8),
            prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..2),
            "[ ,}\\]]{0,2}",
        )
            .prop_map(|(members, edits, tail)| {
                let m: Vec<String> = members
                    .into_iter()
                    .map(|(k, v, a, b)| format!("{a}{k}{b}:{a}{v}{b}"))
                    .collect();
                let mut text = format!("{{{}}}{tail}", m.join(",")).into_bytes();
                for (at, byte) in edits {
                    let i = at.index(text.len());
                    if !text[i].is_ascii() {
                        continue;
                    }
                    text[i] = match byte % 6 {
                        0 => b',',
                        1 => b'}',
                        2 => b'"',
                        3 => b':',
                        4 => b' ',
                        _ => b'0',
                    };
                }
                String::from_utf8(text).expect("ASCII edits keep UTF-8")
            })
    }

    fn serde_reads(text: &str) -> Option<(Parts<'_>, usize)> {
        let mut one = serde_json::Deserializer::from_str(text).into_iter::<Parts>();
        let parts = one.next()?.ok()?;
        Some((parts, one.byte_offset()))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        /// Whatever the scan reads, serde reads the same (parts and end);
        /// where serde refuses, the scan declines.
        #[test]
        fn scan_reads_what_serde_reads(text in payload_text()) {
            if let Some((parts, read)) = payload(text.as_bytes(), 0) {
                let end = read.len();
                let serde = serde_reads(&text);
                prop_assert!(serde.is_some(), "the scan read what serde refuses: {text}");
                let (want, want_end) = serde.unwrap();
                prop_assert_eq!(end, want_end, "{}", text);
                prop_assert_eq!(format!("{parts:?}"), format!("{want:?}"), "{}", text);
            }
        }
    }

    /// The scan takes the payloads Debezium sends (it is worth having only
    /// if it does): every payload of the bench's and the tests' shapes.
    #[test]
    fn scan_takes_debezium_payloads() {
        let payloads = [
            r#"{"before":null,"after":{"id":1,"amount":2.5,"note":"a"},"source":{"version":"3.6.3.Final","connector":"postgresql","name":"bench","ts_ms":0,"snapshot":"false","db":"bench","sequence":"[\"7\",\"9\"]","schema":"public","table":"events","txId":7,"lsn":9},"op":"u","ts_ms":0}"#,
            r#"{"before":{"id":1,"amount":null,"note":null},"after":null,"source":{"connector":"mysql","db":"inv","table":"t","file":"binlog.000003","pos":154,"row":0,"snapshot":"last"},"op":"d","ts_ms":1,"transaction":{"id":"x","total_order":1,"data_collection_order":1}}"#,
            "{ \"op\" : \"c\" ,\n \"after\" : { \"id\" : -0.5e+3, \"tags\" : [1, [2, {}], \"x\"] }, \"source\": null }",
            r#"{"id":3,"__op":"u","__lsn":12,"__table":"t","__deleted":"false"}"#,
        ];
        for p in payloads {
            let (parts, read) = payload(p.as_bytes(), 0).unwrap_or_else(|| panic!("declined {p}"));
            let end = read.len();
            let (want, want_end) = serde_reads(p).expect("serde reads it");
            assert_eq!(end, want_end);
            assert_eq!(format!("{parts:?}"), format!("{want:?}"));
        }
    }
}
