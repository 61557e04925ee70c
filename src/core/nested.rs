//! Nested columns: `struct<name: type, ...>`, `list<type>` (or
//! `array<type>`) and `map<key type, value type>`, as Spark writes them.
//!
//! - `parse` reads a column's type as a definition writes it (depth and
//!   length bounded: definitions are untrusted); `parse_type` a primitive
//!   type's name.
//! - `number` gives the fields inside nested types their Iceberg field ids.
//! - `convert` reads pushed nested values strictly, leaf by leaf, with the
//!   rules of `convert` for each leaf; an error names its row.
//! - `textual` is the type JSON is decoded in (leaves as text, as for plain
//!   columns).
//! - `row_view` / `from_row_view`: arrow-row encodes no maps, so a map is
//!   encoded as the list of its entries (fingerprints, SCD Type 2 values).

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, ListArray, MapArray, StructArray, make_array};
use arrow_data::ArrayData;
use arrow_schema::{ArrowError, DataType, Field, Fields};
use iceberg::spec::{
    ListType, MapType, NestedField, NestedFieldRef, PrimitiveType, StructType, Type,
};

use crate::core::convert::{self, Refused, is_textual_target};

/// The deepest nesting of a column type.
pub const MAX_DEPTH: usize = 16;
/// The longest type text.
pub const MAX_TYPE_BYTES: usize = 4096;

/// A column type as a definition writes it: a primitive type name, or a
/// nested type of them. Field ids inside are 0 until `number`.
pub fn parse(text: &str) -> Result<Type, String> {
    if text.len() > MAX_TYPE_BYTES {
        return Err(format!("the type is over {MAX_TYPE_BYTES} bytes"));
    }
    let mut p = Parser { s: text, at: 0 };
    let t = p.ty(0)?;
    p.ws();
    if p.at < text.len() {
        return Err(format!("unexpected `{}` at {}", &text[p.at..], p.at));
    }
    Ok(t)
}

struct Parser<'a> {
    s: &'a str,
    at: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.s[self.at..].starts_with(|c: char| c.is_ascii_whitespace()) {
            self.at += 1;
        }
    }

    fn eat(&mut self, c: char) -> bool {
        self.ws();
        if self.s[self.at..].starts_with(c) {
            self.at += c.len_utf8();
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: char) -> Result<(), String> {
        if self.eat(c) {
            return Ok(());
        }
        let found: String = self.s[self.at..].chars().take(12).collect();
        Err(if found.is_empty() {
            format!("expected `{c}` at the end")
        } else {
            format!("expected `{c}` at {}, found `{found}`", self.at)
        })
    }

    /// A run of letters, digits and `_`.
    fn word(&mut self) -> &str {
        self.ws();
        let start = self.at;
        while self.s[self.at..].starts_with(|c: char| c.is_alphanumeric() || c == '_') {
            self.at += self.s[self.at..].chars().next().map_or(1, char::len_utf8);
        }
        &self.s[start..self.at]
    }

    /// A struct field's name: a word, or backtick-quoted (a doubled
    /// backtick inside is one).
    fn name(&mut self) -> Result<String, String> {
        self.ws();
        if self.eat('`') {
            let mut out = String::new();
            loop {
                let rest = &self.s[self.at..];
                let Some(i) = rest.find('`') else {
                    return Err("a backtick-quoted field name is not closed".into());
                };
                out.push_str(&rest[..i]);
                self.at += i + 1;
                if self.s[self.at..].starts_with('`') {
                    out.push('`');
                    self.at += 1;
                } else {
                    break;
                }
            }
            return Ok(out);
        }
        let w = self.word().to_string();
        if w.is_empty() {
            return Err(format!("expected a field name at {}", self.at));
        }
        Ok(w)
    }

    fn ty(&mut self, depth: usize) -> Result<Type, String> {
        if depth > MAX_DEPTH {
            return Err(format!("types nest at most {MAX_DEPTH} deep"));
        }
        let start = self.at;
        let word = self.word().to_ascii_lowercase();
        match word.as_str() {
            "struct" => {
                self.expect('<')?;
                let mut fields: Vec<NestedFieldRef> = Vec::new();
                if !self.eat('>') {
                    loop {
                        let name = self.name()?;
                        if fields.iter().any(|f| f.name.eq_ignore_ascii_case(&name)) {
                            return Err(format!("struct field `{name}` is declared twice"));
                        }
                        // Spark writes `name: type`; the colon may be left out.
                        self.eat(':');
                        let t = self.ty(depth + 1)?;
                        fields.push(Arc::new(NestedField::optional(0, &name, t)));
                        if !self.eat(',') {
                            break;
                        }
                    }
                    self.expect('>')?;
                }
                if fields.is_empty() {
                    return Err("a struct needs at least one field".into());
                }
                Ok(Type::Struct(StructType::new(fields)))
            }
            "list" | "array" => {
                self.expect('<')?;
                let t = self.ty(depth + 1)?;
                self.expect('>')?;
                Ok(Type::List(ListType {
                    element_field: Arc::new(NestedField::list_element(0, t, false)),
                }))
            }
            "map" => {
                self.expect('<')?;
                let k = self.ty(depth + 1)?;
                if !k.is_primitive() {
                    return Err(format!("a map's key must be a primitive type, not {k}"));
                }
                self.expect(',')?;
                let v = self.ty(depth + 1)?;
                self.expect('>')?;
                Ok(Type::Map(MapType {
                    key_field: Arc::new(NestedField::map_key_element(0, k)),
                    value_field: Arc::new(NestedField::map_value_element(0, v, false)),
                }))
            }
            "decimal" if self.eat('(') => {
                let inner_start = self.at;
                let Some(close) = self.s[self.at..].find(')') else {
                    return Err("`decimal(` is not closed".into());
                };
                self.at += close + 1;
                let inner = &self.s[inner_start..self.at - 1];
                primitive(&format!("decimal({inner})"))
            }
            "" => Err(format!("expected a type at {start}")),
            w => primitive(w),
        }
    }
}

/// Parses an Iceberg primitive type name as written in a flow definition.
pub fn parse_type(s: &str) -> Option<PrimitiveType> {
    let t = s.trim().to_ascii_lowercase();
    Some(match t.as_str() {
        "boolean" | "bool" => PrimitiveType::Boolean,
        "int" | "integer" => PrimitiveType::Int,
        "long" | "bigint" => PrimitiveType::Long,
        "float" => PrimitiveType::Float,
        "double" => PrimitiveType::Double,
        "date" => PrimitiveType::Date,
        "time" => PrimitiveType::Time,
        "timestamp" => PrimitiveType::Timestamp,
        "timestamptz" => PrimitiveType::Timestamptz,
        "string" => PrimitiveType::String,
        "uuid" => PrimitiveType::Uuid,
        "binary" => PrimitiveType::Binary,
        _ => {
            let inner = t.strip_prefix("decimal(")?.strip_suffix(')')?;
            let (p, s) = inner.split_once(',')?;
            let precision: u32 = p.trim().parse().ok()?;
            let scale: u32 = s.trim().parse().ok()?;
            if precision == 0 || precision > 38 || scale > precision {
                return None;
            }
            PrimitiveType::Decimal { precision, scale }
        }
    })
}

fn primitive(name: &str) -> Result<Type, String> {
    parse_type(name)
        .map(Type::Primitive)
        .ok_or_else(|| format!("unknown type `{name}`"))
}

/// `t` with every field inside it numbered from `*next + 1` on.
pub fn number(t: &Type, next: &mut i32) -> Type {
    let mut id = || {
        *next += 1;
        *next
    };
    match t {
        Type::Primitive(_) => t.clone(),
        Type::Struct(s) => {
            // Iceberg's order: a struct's own fields first, then theirs.
            let ids: Vec<i32> = s.fields().iter().map(|_| id()).collect();
            let fields = s
                .fields()
                .iter()
                .zip(ids)
                .map(|(f, fid)| {
                    let mut nf = (**f).clone();
                    nf.id = fid;
                    nf.field_type = Box::new(number(&f.field_type, next));
                    Arc::new(nf)
                })
                .collect();
            Type::Struct(StructType::new(fields))
        }
        Type::List(l) => {
            let fid = id();
            let mut e = (*l.element_field).clone();
            e.id = fid;
            e.field_type = Box::new(number(&l.element_field.field_type, next));
            Type::List(ListType {
                element_field: Arc::new(e),
            })
        }
        Type::Map(m) => {
            let (kid, vid) = (id(), id());
            let mut k = (*m.key_field).clone();
            k.id = kid;
            let mut v = (*m.value_field).clone();
            v.id = vid;
            v.field_type = Box::new(number(&m.value_field.field_type, next));
            Type::Map(MapType {
                key_field: Arc::new(k),
                value_field: Arc::new(v),
            })
        }
    }
}

/// Numbers the fields inside `fields`' nested types after the highest id
/// among `fields` themselves, so that every id of the schema is unique.
pub fn number_all(fields: Vec<NestedFieldRef>) -> Vec<NestedFieldRef> {
    let mut next = fields.iter().map(|f| f.id).max().unwrap_or(0);
    fields
        .into_iter()
        .map(|f| {
            if f.field_type.is_primitive() {
                return f;
            }
            let mut nf = (*f).clone();
            nf.field_type = Box::new(number(&f.field_type, &mut next));
            Arc::new(nf)
        })
        .collect()
}

/// Whether two types are the same but for field ids.
pub fn same_shape(a: &Type, b: &Type) -> bool {
    match (a, b) {
        (Type::Primitive(x), Type::Primitive(y)) => x == y,
        (Type::Struct(x), Type::Struct(y)) => {
            x.fields().len() == y.fields().len()
                && x.fields().iter().zip(y.fields()).all(|(f, g)| {
                    f.name == g.name
                        && f.required == g.required
                        && same_shape(&f.field_type, &g.field_type)
                })
        }
        (Type::List(x), Type::List(y)) => {
            x.element_field.required == y.element_field.required
                && same_shape(&x.element_field.field_type, &y.element_field.field_type)
        }
        (Type::Map(x), Type::Map(y)) => {
            same_shape(&x.key_field.field_type, &y.key_field.field_type)
                && x.value_field.required == y.value_field.required
                && same_shape(&x.value_field.field_type, &y.value_field.field_type)
        }
        _ => false,
    }
}

/// Whether a sequence may be of type `t`: an orderable primitive, or a
/// struct of them (compared field by field).
pub fn orderable(t: &Type) -> bool {
    let prim = |p: &PrimitiveType| {
        !matches!(
            p,
            PrimitiveType::Boolean
                | PrimitiveType::Binary
                | PrimitiveType::Uuid
                | PrimitiveType::Fixed(_)
        )
    };
    match t {
        Type::Primitive(p) => prim(p),
        Type::Struct(s) => s
            .fields()
            .iter()
            .all(|f| matches!(&*f.field_type, Type::Primitive(p) if prim(p))),
        _ => false,
    }
}

/// The type JSON values of a column of type `to` are decoded in: numbers,
/// dates and timestamps as their text (the number's own digits), which
/// `convert` then reads exactly, at every depth.
pub fn textual(to: &DataType) -> DataType {
    match to {
        t if is_textual_target(t) => DataType::Utf8,
        DataType::Struct(fs) => DataType::Struct(fs.iter().map(|f| textual_field(f)).collect()),
        DataType::List(f) => DataType::List(Arc::new(textual_field(f))),
        DataType::Map(f, sorted) => DataType::Map(Arc::new(textual_field(f)), *sorted),
        t => t.clone(),
    }
}

fn textual_field(f: &Field) -> Field {
    f.clone().with_data_type(textual(f.data_type()))
}

/// Whether `t` holds a nested type.
pub fn is_nested(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Struct(_) | DataType::List(_) | DataType::LargeList(_) | DataType::Map(..)
    )
}

/// Reads `src` as `to` (a nested type, or a leaf under `convert::column`'s
/// rules). A struct's fields are matched by name (regardless of ASCII case
/// when no field matches exactly); a field `to` lacks is refused, one `src`
/// lacks is null. A refusal inside a list or map names the row holding it.
pub fn convert(src: &ArrayRef, to: &DataType) -> Result<ArrayRef, Refused> {
    let wrong = |what: &str| Refused {
        row: 0,
        message: format!(
            "expected {what}, got {}",
            convert::type_name(src.data_type())
        ),
    };
    let built = |e: ArrowError| Refused {
        row: 0,
        message: e.to_string(),
    };
    match to {
        DataType::Struct(fields) => {
            let s = src
                .as_struct_opt()
                .ok_or_else(|| wrong("an object (struct)"))?;
            let names = s.fields();
            for (j, f) in names.iter().enumerate() {
                let known = fields
                    .iter()
                    .any(|t| t.name().eq_ignore_ascii_case(f.name()));
                if !known {
                    let row = (0..s.len()).find(|&r| s.is_valid(r) && s.column(j).is_valid(r));
                    return Err(Refused {
                        row: row.unwrap_or(0),
                        message: format!("`{}` is not a field of the struct", f.name()),
                    });
                }
            }
            let cols = fields
                .iter()
                .map(|f| {
                    let at = names.iter().position(|n| n.name() == f.name()).or_else(|| {
                        names
                            .iter()
                            .position(|n| n.name().eq_ignore_ascii_case(f.name()))
                    });
                    match at {
                        None => Ok(arrow_array::new_null_array(f.data_type(), s.len())),
                        Some(j) => convert(s.column(j), f.data_type()).map_err(|r| Refused {
                            row: r.row,
                            message: format!("field `{}`: {}", f.name(), r.message),
                        }),
                    }
                })
                .collect::<Result<Vec<_>, _>>()?;
            let out =
                StructArray::try_new(fields.clone(), cols, s.nulls().cloned()).map_err(built)?;
            Ok(Arc::new(out))
        }
        DataType::List(field) => {
            let list = match src.data_type() {
                DataType::List(_) => src.as_list::<i32>().clone(),
                DataType::LargeList(f) => arrow_cast::cast(src, &DataType::List(f.clone()))
                    .map_err(built)?
                    .as_list::<i32>()
                    .clone(),
                _ => return Err(wrong("an array (list)")),
            };
            let offsets = list.offsets().clone();
            let values =
                convert(list.values(), field.data_type()).map_err(|r| in_row(&offsets, r))?;
            let out = ListArray::try_new(field.clone(), offsets, values, list.nulls().cloned())
                .map_err(built)?;
            Ok(Arc::new(out))
        }
        DataType::Map(entries, sorted) => {
            let m = src.as_map_opt().ok_or_else(|| wrong("an object (map)"))?;
            let DataType::Struct(kv) = entries.data_type() else {
                return Err(wrong("a map"));
            };
            let offsets = m.offsets().clone();
            let keys = convert(m.keys(), kv[0].data_type()).map_err(|r| in_row(&offsets, r))?;
            let values = convert(m.values(), kv[1].data_type()).map_err(|r| in_row(&offsets, r))?;
            let entries_array =
                StructArray::try_new(kv.clone(), vec![keys, values], None).map_err(built)?;
            let out = MapArray::try_new(
                entries.clone(),
                offsets,
                entries_array,
                m.nulls().cloned(),
                *sorted,
            )
            .map_err(built)?;
            Ok(Arc::new(out))
        }
        _ if is_nested(src.data_type()) => Err(Refused {
            row: 0,
            message: format!(
                "{} is nested; the column is {}",
                convert::type_name(src.data_type()),
                convert::type_name(to)
            ),
        }),
        _ => convert::column(src, to),
    }
}

/// A refusal at child value `r.row` of a list or map, at the row holding it.
fn in_row(offsets: &arrow_buffer::OffsetBuffer<i32>, r: Refused) -> Refused {
    let i = r.row as i32;
    let row = offsets.partition_point(|&o| o <= i).saturating_sub(1);
    Refused {
        row,
        message: r.message,
    }
}

/// `a`, read from a file written in an older schema, as type `to`: struct
/// fields matched by their Parquet field id (else name), a field the file
/// lacks null, leaves cast (a widened type), at every depth.
pub fn conform(a: &ArrayRef, to: &DataType) -> Result<ArrayRef, ArrowError> {
    let id = |f: &Field| {
        f.metadata()
            .get("PARQUET:field_id")
            .and_then(|v| v.parse::<i32>().ok())
    };
    match (a.data_type(), to) {
        (from, to) if from == to => Ok(a.clone()),
        (DataType::Struct(have), DataType::Struct(fields)) => {
            let s = a.as_struct();
            let cols = fields
                .iter()
                .map(|f| {
                    let at = id(f)
                        .and_then(|i| have.iter().position(|g| id(g) == Some(i)))
                        .or_else(|| have.iter().position(|g| g.name() == f.name()));
                    match at {
                        Some(j) => conform(s.column(j), f.data_type()),
                        None => Ok(arrow_array::new_null_array(f.data_type(), s.len())),
                    }
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Arc::new(StructArray::try_new(
                fields.clone(),
                cols,
                s.nulls().cloned(),
            )?))
        }
        (DataType::List(_), DataType::List(f)) => {
            let l = a.as_list::<i32>();
            let values = conform(l.values(), f.data_type())?;
            Ok(Arc::new(ListArray::try_new(
                f.clone(),
                l.offsets().clone(),
                values,
                l.nulls().cloned(),
            )?))
        }
        (DataType::Map(..), DataType::Map(f, sorted)) => {
            let m = a.as_map();
            let entries: ArrayRef = Arc::new(m.entries().clone());
            let entries = conform(&entries, f.data_type())?;
            Ok(Arc::new(MapArray::try_new(
                f.clone(),
                m.offsets().clone(),
                entries.as_struct().clone(),
                m.nulls().cloned(),
                *sorted,
            )?))
        }
        _ => arrow_cast::cast(a, to),
    }
}

/// `t` as arrow-row encodes it: every map as the list of its entries.
pub fn row_type(t: &DataType) -> DataType {
    match t {
        DataType::Map(f, _) => DataType::List(Arc::new(row_field(f))),
        DataType::Struct(fs) => {
            DataType::Struct(fs.iter().map(|f| row_field(f)).collect::<Fields>())
        }
        DataType::List(f) => DataType::List(Arc::new(row_field(f))),
        DataType::LargeList(f) => DataType::LargeList(Arc::new(row_field(f))),
        t => t.clone(),
    }
}

fn row_field(f: &Field) -> Field {
    f.clone().with_data_type(row_type(f.data_type()))
}

/// Whether `t` holds a map (and so needs `row_view`).
pub fn has_map(t: &DataType) -> bool {
    match t {
        DataType::Map(..) => true,
        DataType::Struct(fs) => fs.iter().any(|f| has_map(f.data_type())),
        DataType::List(f) | DataType::LargeList(f) => has_map(f.data_type()),
        _ => false,
    }
}

/// `a` in `row_type` (its buffers as they are).
pub fn row_view(a: &ArrayRef) -> Result<ArrayRef, ArrowError> {
    if !has_map(a.data_type()) {
        return Ok(a.clone());
    }
    Ok(make_array(relabel(a.to_data(), &row_type(a.data_type()))?))
}

/// An array `row_view` made (or decoded in `row_type`), back as type `t`.
pub fn from_row_view(a: ArrayRef, t: &DataType) -> Result<ArrayRef, ArrowError> {
    if !has_map(t) {
        return Ok(a);
    }
    Ok(make_array(relabel(a.to_data(), t)?))
}

/// `data` with the type `to`, which has the same layout (a map and the
/// list of its entries have).
fn relabel(data: ArrayData, to: &DataType) -> Result<ArrayData, ArrowError> {
    let child_types: Vec<&DataType> = match to {
        DataType::Struct(fs) => fs.iter().map(|f| f.data_type()).collect(),
        DataType::List(f) | DataType::LargeList(f) | DataType::Map(f, _) => vec![f.data_type()],
        _ => return Ok(data),
    };
    let children = data
        .child_data()
        .iter()
        .zip(child_types)
        .map(|(c, t)| relabel(c.clone(), t))
        .collect::<Result<Vec<_>, _>>()?;
    data.into_builder()
        .data_type(to.clone())
        .child_data(children)
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_parse() {
        assert_eq!(
            parse_type("decimal(10, 2)"),
            Some(PrimitiveType::Decimal {
                precision: 10,
                scale: 2
            })
        );
        assert_eq!(parse_type("timestamptz"), Some(PrimitiveType::Timestamptz));
        assert_eq!(parse_type("decimal(2,5)"), None);
        assert_eq!(parse_type("varchar"), None);
    }

    #[test]
    fn types_parse_as_spark_writes_them() {
        let t = parse("struct<a: int, `b.c`: list<map<string, decimal(10, 2)>>>").unwrap();
        assert_eq!(
            t.to_string(),
            parse("STRUCT<a int, `b.c` ARRAY<MAP<string,decimal(10,2)>>>")
                .unwrap()
                .to_string()
        );
        let mut next = 4;
        let Type::Struct(s) = number(&t, &mut next) else {
            panic!()
        };
        assert_eq!(s.fields()[0].id, 5);
        assert_eq!(s.fields()[1].id, 6);
        assert_eq!(next, 9, "the list element, the map key and value: 7, 8, 9");
        for bad in [
            "struct<>",
            "struct<a int",
            "list<int",
            "map<list<int>, int>",
            "struct<a int, A long>",
            "varchar",
            "list<int> x",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        let deep = format!("{}int{}", "list<".repeat(40), ">".repeat(40));
        assert!(parse(&deep).unwrap_err().contains("nest"), "{deep}");
    }
}
