//! A flow's declared columns built straight from its events' JSON values,
//! for the common case: every declared column an `int`, a `long`, a
//! `double`, a `string` or a `boolean`, and every value one its column
//! takes as it is (a JSON whole number, number, string, boolean, or a null
//! where the column allows one). The general way writes each row image out
//! as a JSON line and reads it again with the row decoder; this skips both.
//! Anything else (`Decline`) goes the general way, which gives the same
//! rows (a property test compares the two) and every error.

use std::borrow::Cow;

use super::read::Raw;
use arrow_array::ArrayRef;
use arrow_array::builder::{
    ArrayBuilder, BooleanBuilder, Float64Builder, Int32Builder, Int64Builder, StringBuilder,
};
use arrow_schema::DataType;

use super::read::RowSchema;
use crate::core::debezium;
use crate::core::flow::Flow;

/// This body's rows take the general way.
#[derive(Debug)]
pub(super) struct Decline;

enum Column {
    Int(Int32Builder),
    Long(Int64Builder),
    Double(Float64Builder),
    Text(StringBuilder),
    Bool(BooleanBuilder),
}

impl Column {
    fn of(t: &DataType, rows: usize) -> Option<Column> {
        Some(match t {
            DataType::Int32 => Column::Int(Int32Builder::with_capacity(rows)),
            DataType::Int64 => Column::Long(Int64Builder::with_capacity(rows)),
            DataType::Float64 => Column::Double(Float64Builder::with_capacity(rows)),
            DataType::Utf8 => Column::Text(StringBuilder::with_capacity(rows, rows * 16)),
            DataType::Boolean => Column::Bool(BooleanBuilder::with_capacity(rows)),
            _ => return None,
        })
    }

    fn null(&mut self) {
        match self {
            Column::Int(b) => b.append_null(),
            Column::Long(b) => b.append_null(),
            Column::Double(b) => b.append_null(),
            Column::Text(b) => b.append_null(),
            Column::Bool(b) => b.append_null(),
        }
    }

    /// Appends a non-null JSON value's text, when it is one the column
    /// takes as it is.
    fn push(&mut self, text: &str) -> Result<(), Decline> {
        match self {
            Column::Int(b) => b.append_value(whole(text)?.try_into().map_err(|_| Decline)?),
            Column::Long(b) => b.append_value(whole(text)?),
            Column::Double(b) => {
                // A JSON number (not a string such as "NaN"), read as the
                // row decoder reads it; one that overflows is its error.
                if !text.starts_with(|c: char| c == '-' || c.is_ascii_digit()) {
                    return Err(Decline);
                }
                let v: f64 = text.parse().map_err(|_| Decline)?;
                if !v.is_finite() {
                    return Err(Decline);
                }
                b.append_value(v)
            }
            Column::Text(b) => {
                let inner = text
                    .strip_prefix('"')
                    .and_then(|t| t.strip_suffix('"'))
                    .ok_or(Decline)?;
                if inner.contains('\\') {
                    let s: Cow<str> = serde_json::from_str(text).map_err(|_| Decline)?;
                    b.append_value(s)
                } else {
                    b.append_value(inner)
                }
            }
            Column::Bool(b) => match text {
                "true" => b.append_value(true),
                "false" => b.append_value(false),
                _ => return Err(Decline),
            },
        }
        Ok(())
    }

    fn finish(&mut self) -> ArrayRef {
        match self {
            Column::Int(b) => std::sync::Arc::new(b.finish()),
            Column::Long(b) => std::sync::Arc::new(b.finish()),
            Column::Double(b) => std::sync::Arc::new(b.finish()),
            Column::Text(b) => std::sync::Arc::new(b.finish()),
            Column::Bool(b) => std::sync::Arc::new(b.finish()),
        }
    }

    fn len(&self) -> usize {
        match self {
            Column::Int(b) => b.len(),
            Column::Long(b) => b.len(),
            Column::Double(b) => b.len(),
            Column::Text(b) => b.len(),
            Column::Bool(b) => b.len(),
        }
    }
}

/// A JSON whole number's value (digits, an optional minus: no fraction or
/// exponent, which the row decoder reads its own way).
fn whole(text: &str) -> Result<i64, Decline> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Decline);
    }
    text.parse().map_err(|_| Decline)
}

/// The declared columns of a body's rows, being built.
pub(super) struct Direct<'f> {
    flow: &'f Flow,
    columns: Vec<Column>,
    nullable: Vec<bool>,
    /// Each field position's last name and column: Debezium writes a
    /// table's fields in one order, so the name is compared, not looked up.
    names: Vec<(String, usize)>,
    /// The row schemas whose fields all pass through as they are (by
    /// address: a body has a `before` and an `after` per table and schema
    /// version).
    checked: Vec<*const RowSchema>,
    filled: Vec<bool>,
}

impl<'f> Direct<'f> {
    /// None: a declared column of another type, or a computed sequence.
    pub(super) fn new(flow: &'f Flow, rows: usize) -> Option<Direct<'f>> {
        if !flow.computed.is_empty() {
            return None;
        }
        let declared = flow.config.columns.len();
        let fields = &flow.source_arrow.fields()[..declared];
        let columns = fields
            .iter()
            .map(|f| Column::of(f.data_type(), rows))
            .collect::<Option<Vec<_>>>()?;
        Some(Direct {
            flow,
            columns,
            nullable: fields.iter().map(|f| f.is_nullable()).collect(),
            names: Vec::new(),
            checked: Vec::new(),
            filled: vec![false; declared],
        })
    }

    fn column_of(&mut self, at: usize, name: &str) -> Result<usize, Decline> {
        // Byte by byte: field names are short, and the `memcmp` call per
        // field was ~5% of reading an event (profiled).
        if let Some((n, col)) = self.names.get(at)
            && n.len() == name.len()
            && n.bytes().zip(name.bytes()).all(|(a, b)| a == b)
        {
            return Ok(*col);
        }
        let col = self
            .flow
            .field_column(name)
            .filter(|&c| c < self.columns.len())
            .ok_or(Decline)?;
        if at < self.names.len() {
            self.names[at] = (name.to_string(), col);
        } else if at == self.names.len() {
            self.names.push((name.to_string(), col));
        }
        Ok(col)
    }

    /// Whether every field of `schema` is copied as it is by the general
    /// way too (`core::debezium::passes_through`).
    fn check(&mut self, schema: Option<&RowSchema>) -> Result<(), Decline> {
        let Some(schema) = schema else {
            return Ok(()); // bare events: every type here passes through
        };
        if self.checked.contains(&(schema as *const _)) {
            return Ok(());
        }
        // By the fields' own names, as the general way looks them up (a
        // field naming no column declines when a row has it).
        for (name, field) in schema.fields() {
            let Some(col) = self
                .flow
                .field_column(name)
                .filter(|&c| c < self.columns.len())
            else {
                continue;
            };
            let ty = self.flow.column_type(col).ok_or(Decline)?;
            if !debezium::passes_through(Some(field), &ty) {
                return Err(Decline);
            }
        }
        if self.checked.len() < 8 {
            self.checked.push(schema as *const _);
        }
        Ok(())
    }

    /// One event's row image.
    pub(super) fn row(
        &mut self,
        fields: &[(Cow<str>, Raw)],
        schema: Option<&RowSchema>,
    ) -> Result<(), Decline> {
        self.check(schema)?;
        self.filled.fill(false);
        for (at, (name, v)) in fields.iter().enumerate() {
            let col = self.column_of(at, name)?;
            if std::mem::replace(&mut self.filled[col], true) {
                return Err(Decline); // two fields for one column
            }
            match v.get() {
                "null" if self.nullable[col] => self.columns[col].null(),
                "null" => return Err(Decline),
                text => self.columns[col].push(text)?,
            }
        }
        for col in 0..self.columns.len() {
            if !self.filled[col] {
                if !self.nullable[col] {
                    return Err(Decline);
                }
                self.columns[col].null();
            }
        }
        debug_assert!(
            self.columns
                .iter()
                .all(|c| c.len() == self.columns[0].len())
        );
        Ok(())
    }

    /// The declared columns.
    pub(super) fn finish(mut self) -> Vec<ArrayRef> {
        self.columns.iter_mut().map(Column::finish).collect()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use crate::core::flow::{Flow, FlowConfig};
    use crate::service::debezium::{read_body, rows, rows_by_json};
    use crate::service::input::{BodyFormat, Limits};

    const FLOW: &str = r#"
name = "t"
target = "db.t"
keys = ["id"]
format = "debezium"
source_table = "public.t"
columns = [
  { name = "id", type = "long", required = true },
  { name = "n", type = "int" },
  { name = "x", type = "double" },
  { name = "s", type = "string", required = true },
  { name = "b", type = "boolean" },
]
"#;

    /// A JSON value's text, of every kind a column may meet: the ones the
    /// direct way takes and the ones it leaves to the row decoder.
    fn value() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("null".to_string()),
            any::<i32>().prop_map(|v| v.to_string()),
            any::<i64>().prop_map(|v| v.to_string()),
            Just("9223372036854775808".to_string()),
            Just("-0".to_string()),
            Just("1.0".to_string()),
            Just("1e3".to_string()),
            Just("1e400".to_string()),
            any::<f64>()
                .prop_filter("finite", |v| v.is_finite())
                .prop_map(|v| serde_json::to_string(&v).unwrap()),
            "[a-z\\\\\"é\u{1F600}\n]{0,6}".prop_map(|s| serde_json::to_string(&s).unwrap()),
            Just("\"12\"".to_string()),
            Just("\"NaN\"".to_string()),
            Just("true".to_string()),
            Just("false".to_string()),
            Just("[1]".to_string()),
        ]
    }

    /// One event's fields: (name, value text), some absent, some twice or
    /// in another case.
    fn image() -> impl Strategy<Value = Vec<(String, String)>> {
        let name = prop_oneof![
            4 => Just("n"), 4 => Just("x"), 4 => Just("s"), 4 => Just("b"),
            1 => Just("N"), 1 => Just("extra")
        ];
        proptest::collection::vec((name.prop_map(str::to_string), value()), 0..6)
    }

    /// An image the direct way takes: each column present at most once,
    /// with a value of its own kind (`s`, required, always).
    fn plain_image() -> impl Strategy<Value = Vec<(String, String)>> {
        (
            proptest::option::of(any::<i32>()),
            proptest::option::of(any::<f64>().prop_filter("finite", |v| v.is_finite())),
            "[a-z\\\\\"é]{0,5}",
            proptest::option::of(any::<bool>()),
        )
            .prop_map(|(n, x, s, b)| {
                let text = |v: Option<String>| v.unwrap_or_else(|| "null".into());
                vec![
                    ("n".into(), text(n.map(|v| v.to_string()))),
                    ("s".into(), serde_json::to_string(&s).unwrap()),
                    (
                        "x".into(),
                        text(x.map(|v| serde_json::to_string(&v).unwrap())),
                    ),
                    ("b".into(), text(b.map(|v| v.to_string()))),
                ]
            })
    }

    /// Logical types a wrapped event's schema may give column `n`.
    fn n_schema() -> impl Strategy<Value = Option<&'static str>> {
        prop_oneof![
            3 => Just(None),
            1 => Just(Some(r#"{"type": "int32", "optional": true, "field": "n"}"#)),
            1 => Just(Some(r#"{"type": "int32", "optional": true, "name": "io.debezium.time.Date", "field": "n"}"#)),
        ]
    }

    /// An event: its key, whether it is a delete, its image's fields.
    type Event = (i64, bool, Vec<(String, String)>);

    fn body(events: &[Event], n: Option<&str>) -> String {
        let schema = n.map(|n| {
            let row = format!(
                r#"{{"type": "struct", "optional": true, "fields": [{{"type": "int64", "optional": false, "field": "id"}}, {n}]}}"#
            );
            format!(
                r#"{{"type": "struct", "fields": [{}, {}]}}"#,
                row.replace("\"fields\"", "\"field\": \"before\", \"fields\""),
                row.replace("\"fields\"", "\"field\": \"after\", \"fields\"")
            )
        });
        let mut out = Vec::new();
        for (i, (id, delete, fields)) in events.iter().enumerate() {
            let mut row = format!(r#"{{"id": {id}"#);
            for (name, v) in fields {
                row.push_str(&format!(r#", "{name}": {v}"#));
            }
            row.push('}');
            let (before, after, op) = if *delete {
                (row.as_str(), "null", "d")
            } else {
                ("null", row.as_str(), "u")
            };
            let lsn = 100 + i;
            let payload = format!(
                r#"{{"before": {before}, "after": {after}, "source": {{"connector": "postgresql", "db": "d", "schema": "public", "table": "t", "sequence": "[\"{lsn}\",\"{lsn}\"]", "lsn": {lsn}, "txId": {lsn}}}, "op": "{op}"}}"#
            );
            out.push(match &schema {
                Some(s) => format!(r#"{{"schema": {s}, "payload": {payload}}}"#),
                None => payload,
            });
        }
        format!("[{}]", out.join(","))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// The direct way gives the rows the row decoder gives, or leaves
        /// the body to it: every body reads the same both ways, errors
        /// included.
        #[test]
        fn the_direct_way_reads_as_the_row_decoder(
            events in proptest::collection::vec(
                (0i64..5, proptest::bool::weighted(0.2), prop_oneof![image(), plain_image()]),
                1..8,
            ),
            n in n_schema(),
        ) {
            let cfg: FlowConfig = toml::from_str(FLOW).unwrap();
            let flow = Flow::new(cfg).unwrap();
            let text = body(&events, n);
            let limits = Limits { max_rows: 1000, max_value_bytes: 1 << 20 };
            let (changes, _) = read_body("t", BodyFormat::JsonArray, crate::service::debezium::Body::Whole(text.as_bytes()), limits).unwrap();
            let refs: Vec<_> = changes.iter().collect();
            match (rows(&flow, &refs, true), rows_by_json(&flow, &refs, true)) {
                (Ok(a), Ok(b)) => prop_assert_eq!(a, b, "{}", text),
                (Err(a), Err(b)) => prop_assert_eq!(a.to_string(), b.to_string()),
                (a, b) => prop_assert!(false, "{text}: direct {:?}, by JSON {:?}", a.map(|x| x.0.num_rows()), b.map(|x| x.0.num_rows())),
            }
        }
    }

    /// The bench's shape (every value taken as it is) goes the direct way.
    #[test]
    fn plain_values_take_the_direct_way() {
        let cfg: FlowConfig = toml::from_str(FLOW).unwrap();
        let flow = Flow::new(cfg).unwrap();
        let events = vec![
            (
                1,
                false,
                vec![
                    ("n".into(), "7".into()),
                    ("s".into(), "\"a\\\"b\"".into()),
                    ("x".into(), "1.5".into()),
                ],
            ),
            (
                2,
                false,
                vec![("s".into(), "\"c\"".into()), ("b".into(), "true".into())],
            ),
        ];
        let text = body(&events, None);
        let limits = Limits {
            max_rows: 1000,
            max_value_bytes: 1 << 20,
        };
        let (changes, _) = read_body(
            "t",
            BodyFormat::JsonArray,
            crate::service::debezium::Body::Whole(text.as_bytes()),
            limits,
        )
        .unwrap();
        let mut d = super::Direct::new(&flow, 2).expect("every column's type is direct");
        for c in &changes {
            let (which, image) = c.image();
            let Some(super::super::Image::Row(super::super::Fields(f))) = image else {
                panic!()
            };
            assert!(d.row(f, c.row_schema(which)).is_ok(), "{text}");
        }
        let cols = d.finish();
        let refs: Vec<_> = changes.iter().collect();
        let (b, _) = rows_by_json(&flow, &refs, true).unwrap();
        for (i, c) in cols.iter().enumerate() {
            assert_eq!(c.as_ref(), b.column(i).as_ref(), "column {i}");
        }
    }
}
