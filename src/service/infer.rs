//! Columns for pushed fields a flow's definition lacks, for flows with
//! `schema_evolution = "add_columns"`: each becomes an optional column,
//! typed from its Arrow field, or from its JSON values by fixed rules:
//!
//! | JSON values (nulls aside) | column type |
//! |---|---|
//! | `true` / `false` | `boolean` |
//! | integers within the long range | `long` |
//! | any other number, or integers and other numbers | `double` |
//! | strings | `string` |
//! | only `null` | not added yet (nothing to infer; the values are null) |
//!
//! Anything else (an object, an array, strings in some rows and numbers in
//! others) is refused with the field and the row.

use arrow_schema::{DataType, Schema as ArrowSchema};
use serde_json::Value;

use crate::core::flow::{ColumnDef, Flow};
use crate::error::{Error, Result, codes};

/// At most this many columns are added by one request.
pub const MAX_NEW_COLUMNS: usize = 64;
/// Inference grows a flow to at most this many columns.
pub const MAX_COLUMNS: usize = 1000;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Null,
    Bool,
    Long,
    Double,
    String,
}

impl Kind {
    fn of(v: &Value) -> std::result::Result<Kind, &'static str> {
        Ok(match v {
            Value::Null => Kind::Null,
            Value::Bool(_) => Kind::Bool,
            Value::Number(n) if n.is_i64() => Kind::Long,
            Value::Number(_) => Kind::Double,
            Value::String(_) => Kind::String,
            Value::Array(_) => return Err("an array (nested types are not supported)"),
            Value::Object(_) => return Err("an object (nested types are not supported)"),
        })
    }

    /// The kind of a field whose values are of kinds `self` and `other`.
    fn join(self, other: Kind) -> Option<Kind> {
        match (self, other) {
            (Kind::Null, k) | (k, Kind::Null) => Some(k),
            (a, b) if a == b => Some(a),
            (Kind::Long, Kind::Double) | (Kind::Double, Kind::Long) => Some(Kind::Double),
            _ => None,
        }
    }

    fn column_type(self) -> Option<&'static str> {
        match self {
            Kind::Null => None,
            Kind::Bool => Some("boolean"),
            Kind::Long => Some("long"),
            Kind::Double => Some("double"),
            Kind::String => Some("string"),
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Kind::Null => "null",
            Kind::Bool => "a boolean",
            Kind::Long | Kind::Double => "a number",
            Kind::String => "a string",
        }
    }
}

fn refused(flow: &Flow, row: Option<usize>, column: &str, message: String) -> Error {
    match row {
        Some(row) => Error::Batch {
            code: codes::BAD_COLUMN,
            flow: flow.name.clone(),
            row,
            column: column.to_string(),
            message,
        },
        None => Error::Input {
            code: codes::BAD_COLUMN,
            flow: flow.name.clone(),
            message: format!("field `{column}`: {message}"),
        },
    }
}

fn new_column(name: &str, ty: &str) -> ColumnDef {
    ColumnDef {
        name: name.to_string(),
        ty: ty.to_string(),
        required: false,
        renamed_from: None,
    }
}

/// The fields of JSON `rows` that name no column of `flow`, as columns in
/// the order they first appear (a row's new fields by name). A field null in every row is left out: it
/// has no type yet. Rows that are not JSON objects are skipped (decoding
/// them reports the error).
pub fn json_columns(flow: &Flow, rows: &[&[u8]]) -> Result<Vec<ColumnDef>> {
    let mut found: Vec<(String, Kind, usize)> = Vec::new();
    for (r, row) in rows.iter().enumerate() {
        let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(row) else {
            continue;
        };
        for (name, v) in &map {
            if flow.field_column(name).is_some() {
                continue;
            }
            let kind = Kind::of(v).map_err(|why| {
                refused(
                    flow,
                    Some(r),
                    name,
                    format!("cannot add a column for {why}"),
                )
            })?;
            match found.iter_mut().find(|f| f.0 == *name) {
                Some(f) => {
                    f.1 = f.1.join(kind).ok_or_else(|| {
                        refused(
                            flow,
                            Some(r),
                            name,
                            format!(
                                "is {} here but {} in row {}; cannot infer one column type",
                                kind.describe(),
                                f.1.describe(),
                                f.2
                            ),
                        )
                    })?;
                }
                None => {
                    if found.len() == MAX_NEW_COLUMNS {
                        return Err(too_many(flow, name));
                    }
                    found.push((name.clone(), kind, r));
                }
            }
        }
    }
    Ok(found
        .into_iter()
        .filter_map(|(name, kind, _)| kind.column_type().map(|ty| new_column(&name, ty)))
        .collect())
}

fn too_many(flow: &Flow, name: &str) -> Error {
    Error::Input {
        code: codes::TOO_MANY_COLUMNS,
        flow: flow.name.clone(),
        message: format!(
            "field `{name}`: one request may add at most {MAX_NEW_COLUMNS} columns, and a flow grow to {MAX_COLUMNS}; declare the columns in the definition instead"
        ),
    }
}

/// The fields of an Arrow schema that name no column of `flow`, as columns
/// of the Iceberg type of their Arrow type.
pub fn arrow_columns(flow: &Flow, schema: &ArrowSchema) -> Result<Vec<ColumnDef>> {
    let mut out = Vec::new();
    for f in schema.fields() {
        if flow.field_column(f.name()).is_some() {
            continue;
        }
        if out.len() == MAX_NEW_COLUMNS {
            return Err(too_many(flow, f.name()));
        }
        let ty = arrow_type(f.data_type()).ok_or_else(|| {
            refused(
                flow,
                None,
                f.name(),
                format!(
                    "cannot add a column of Arrow type {}; declare it in the definition",
                    f.data_type()
                ),
            )
        })?;
        out.push(new_column(f.name(), &ty));
    }
    Ok(out)
}

/// The definition's type name for an Arrow type, where one fits it without loss.
fn arrow_type(t: &DataType) -> Option<String> {
    use arrow_schema::TimeUnit;
    Some(
        match t {
            DataType::Boolean => "boolean",
            DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::UInt8
            | DataType::UInt16 => "int",
            DataType::Int64 | DataType::UInt32 => "long",
            DataType::Float16 | DataType::Float32 => "float",
            DataType::Float64 => "double",
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "string",
            DataType::Binary | DataType::LargeBinary | DataType::BinaryView => "binary",
            DataType::Date32 | DataType::Date64 => "date",
            DataType::Time32(_) | DataType::Time64(_) => "time",
            DataType::Timestamp(TimeUnit::Nanosecond, _) => return None,
            DataType::Timestamp(_, None) => "timestamp",
            DataType::Timestamp(_, Some(_)) => "timestamptz",
            DataType::Decimal128(p, s) if *s >= 0 && *p <= 38 => {
                return Some(format!("decimal({p},{s})"));
            }
            DataType::Dictionary(_, v) => return arrow_type(v),
            _ => return None,
        }
        .to_string(),
    )
}

/// The flow's definition with `columns` added at the end, checked against
/// `MAX_COLUMNS`.
pub fn with_columns(flow: &Flow, columns: &[ColumnDef]) -> Result<crate::core::flow::FlowConfig> {
    let mut cfg = flow.config.clone();
    if cfg.columns.len() + columns.len() > MAX_COLUMNS {
        return Err(too_many(flow, &columns[0].name));
    }
    cfg.columns.extend(columns.iter().cloned());
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow() -> Flow {
        let toml = r#"
name = "f"
target = "ns.t"
keys = ["id"]
sequence_by = "seq"
schema_evolution = "add_columns"
columns = [
  { name = "id", type = "long", required = true },
  { name = "seq", type = "long", required = true },
]
"#;
        Flow::new(toml::from_str(toml).unwrap()).unwrap()
    }

    fn cols(rows: &[&str]) -> Result<Vec<(String, String)>> {
        let rows: Vec<&[u8]> = rows.iter().map(|r| r.as_bytes()).collect();
        Ok(json_columns(&flow(), &rows)?
            .into_iter()
            .map(|c| (c.name, c.ty))
            .collect())
    }

    #[test]
    fn json_values_give_the_documented_types() {
        let got = cols(&[
            r#"{"id":1,"seq":1,"b":true,"n":1,"x":1,"s":"a","z":null}"#,
            r#"{"id":2,"seq":1,"n":2,"x":2.5,"s":null,"z":null,"SEQ":3}"#,
        ])
        .unwrap();
        let want = [
            ("b", "boolean"),
            ("n", "long"),
            ("s", "string"),
            ("x", "double"),
        ];
        assert_eq!(
            got,
            want.map(|(a, b)| (a.to_string(), b.to_string())).to_vec(),
            "z is null everywhere and SEQ names seq (case-insensitive)"
        );
    }

    #[test]
    fn conflicting_and_nested_values_are_refused_with_their_row() {
        let e = cols(&[r#"{"id":1,"seq":1,"v":"a"}"#, r#"{"id":2,"seq":1,"v":5}"#]).unwrap_err();
        assert_eq!(e.code(), codes::BAD_COLUMN);
        assert!(e.to_string().contains("row 1"), "{e}");
        let e = cols(&[r#"{"id":1,"seq":1,"o":{"a":1}}"#]).unwrap_err();
        assert!(e.to_string().contains("nested"), "{e}");
    }

    #[test]
    fn one_request_adds_a_bounded_number_of_columns() {
        let many: String = (0..=MAX_NEW_COLUMNS)
            .map(|i| format!(r#","c{i}":1"#))
            .collect();
        let row = format!(r#"{{"id":1,"seq":1{many}}}"#);
        let e = cols(&[&row]).unwrap_err();
        assert_eq!(e.code(), codes::TOO_MANY_COLUMNS);
    }

    #[test]
    fn arrow_types_map_without_loss_or_are_refused() {
        use arrow_schema::{Field, TimeUnit};
        let schema = ArrowSchema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("i", DataType::Int16, true),
            Field::new("u", DataType::UInt32, true),
            Field::new("d", DataType::Decimal128(12, 2), true),
            Field::new(
                "t",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                true,
            ),
        ]);
        let got: Vec<(String, String)> = arrow_columns(&flow(), &schema)
            .unwrap()
            .into_iter()
            .map(|c| (c.name, c.ty))
            .collect();
        let want = [
            ("i", "int"),
            ("u", "long"),
            ("d", "decimal(12,2)"),
            ("t", "timestamptz"),
        ];
        assert_eq!(
            got,
            want.map(|(a, b)| (a.to_string(), b.to_string())).to_vec()
        );
        let bad = ArrowSchema::new(vec![Field::new("u", DataType::UInt64, true)]);
        let e = arrow_columns(&flow(), &bad).unwrap_err();
        assert!(e.to_string().contains("UInt64"), "{e}");
    }
}
