//! Column declaration and types: the names autocdc reserves, the declared
//! columns checked (`declared_columns`), a column found by the name a
//! setting gives (`find_column`, `parse_ident`), the source schema in Arrow,
//! and the mapping between type names, Iceberg and Arrow types.

use std::collections::HashSet;
use std::sync::Arc;

use arrow_schema::{Field, Schema as ArrowSchema, SchemaRef};
use iceberg::arrow::schema_to_arrow_schema;
use iceberg::spec::{NestedField, PrimitiveType, Schema, Type};

use super::{FlowConfig, InputFormat};
use crate::core::debezium;
use crate::core::nested::parse_type;
use crate::error::{Error, Result, codes};

/// Columns autocdc reserves for SCD Type 2 and its own bookkeeping.
const RESERVED: &[&str] = &["__start_at", "__end_at"];
/// The SCD Type 2 interval columns.
pub const START_AT: &str = "__START_AT";
pub const END_AT: &str = "__END_AT";
/// The hidden sequence column of a `from_snapshot` flow: the snapshot version.
pub const SNAPSHOT_VERSION: &str = "__autocdc_snapshot_version";
const RESERVED_PREFIX: &str = "__autocdc";
/// The hidden source column of a `sequence_by` expression is this and the
/// expression's position among the sequence columns.
pub const COMPUTED_PREFIX: &str = "__autocdc_sequence_";

/// A declared column: its source index, name, type and `required`.
pub(super) type Declared = (usize, String, Type, bool);

/// The declared columns: plain names, no duplicates, no reserved names,
/// known types.
pub(super) fn declared_columns(config: &FlowConfig) -> Result<Vec<Declared>> {
    let f = config.name.as_str();
    let mut seen = HashSet::new();
    let mut fields = Vec::new();
    for (i, c) in config.columns.iter().enumerate() {
        if c.name.is_empty() {
            return Err(Error::definition(
                f,
                codes::INVALID_DEFINITION,
                format!("column {} has an empty name", i + 1),
            ));
        }
        let lower = c.name.to_ascii_lowercase();
        if RESERVED.contains(&lower.as_str()) || lower.starts_with(RESERVED_PREFIX) {
            return Err(Error::definition(
                f,
                codes::RESERVED_COLUMN,
                format!(
                    "column `{}` uses a name autocdc reserves (`__START_AT`, `__END_AT`, `__autocdc*`); rename it in the source",
                    c.name
                ),
            ));
        }
        if !seen.insert(lower) {
            return Err(Error::definition(
                f,
                codes::INVALID_DEFINITION,
                format!("column `{}` is declared twice", c.name),
            ));
        }
        let ty = match crate::core::nested::parse(&c.ty) {
            Ok(ty) => ty,
            Err(why) => {
                let shown: String = c.ty.chars().take(80).collect();
                return Err(Error::definition(
                    f,
                    codes::INVALID_DEFINITION,
                    format!(
                        "column `{}` has type `{shown}`, which autocdc cannot read ({why}); use one of boolean, int, long, float, double, decimal(p,s), date, time, timestamp, timestamptz, string, uuid, binary, or struct<name: type, ...>, list<type>, map<key type, value type> of them",
                        c.name
                    ),
                ));
            }
        };
        fields.push((i, c.name.clone(), ty, c.required));
    }
    for c in &config.columns {
        let Some(old) = &c.renamed_from else { continue };
        let taken = config
            .columns
            .iter()
            .find(|o| o.name != c.name && o.name.eq_ignore_ascii_case(old));
        if old.is_empty() || taken.is_some() {
            return Err(Error::definition(
                f,
                codes::INVALID_DEFINITION,
                format!(
                    "column `{}` is renamed_from `{old}`, which {}; renamed_from names the column's previous name in the target",
                    c.name,
                    match taken {
                        Some(o) => format!("is declared too (as `{}`)", o.name),
                        None => "is empty".to_string(),
                    }
                ),
            ));
        }
    }
    Ok(fields)
}

/// The source index of column `name`, named in setting `what`.
pub(super) fn find_column(config: &FlowConfig, name: &str, what: &str) -> Result<usize> {
    let f = config.name.as_str();
    if config.from_snapshot && name == SNAPSHOT_VERSION {
        return Ok(config.columns.len());
    }
    if config.format == InputFormat::Debezium
        && let Some(i) = debezium::hidden_columns().iter().position(|c| c.0 == name)
    {
        return Ok(config.columns.len() + i);
    }
    let name = parse_ident(f, name)?;
    let exact = config.columns.iter().position(|c| c.name == name);
    // Declared names differ in more than case, so this match is unique.
    let folded = || {
        config
            .columns
            .iter()
            .position(|c| c.name.eq_ignore_ascii_case(&name))
            .filter(|_| !config.case_sensitive)
    };
    exact.or_else(folded).ok_or_else(|| {
        Error::definition(
            f,
            codes::COLUMNS_NOT_FOUND,
            format!("{what} column `{name}` is not among the declared columns ({}); declare it under `columns` or fix the name",
                config.columns.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", ")),
        )
    })
}

/// The source schema in Arrow, every column nullable so that nulls reach
/// validation (and get a precise error) instead of failing inside Arrow.
pub(super) fn source_schema(fields: &[Declared]) -> Result<SchemaRef> {
    let all_nullable: Vec<Field> = fields
        .iter()
        .map(|(i, name, ty, _)| {
            let id = *i as i32 + 1;
            let nf = NestedField::optional(id, name, ty.clone());
            let fields = crate::core::nested::number_all(vec![Arc::new(nf)]);
            let schema = Schema::builder().with_fields(fields).build()?;
            let arrow = schema_to_arrow_schema(&schema)?;
            Ok(arrow.field(0).clone())
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Arc::new(ArrowSchema::new(all_nullable)))
}

/// A column name as written in a key, sequence, list or partition entry:
/// plain (`city`), or quoted with backticks (`` `a.b` ``, a doubled backtick
/// for one) when it holds a dot. An unquoted dotted name is a multi-part
/// identifier, which names no top-level column.
pub fn parse_ident(flow: &str, text: &str) -> Result<String> {
    let bad = |message: String| Err(Error::definition(flow, codes::INVALID_DEFINITION, message));
    if let Some(inner) = text.strip_prefix('`') {
        let Some(inner) = inner.strip_suffix('`') else {
            return bad(format!("`{text}` opens a backtick quote it does not close"));
        };
        let name = inner.replace("``", "`");
        if name.is_empty() || inner.replace("``", "").contains('`') {
            return bad(format!(
                "{text} is not a quoted column name; write `a.b` in backticks, a backtick inside as two"
            ));
        }
        return Ok(name);
    }
    if text.contains('.') {
        return Err(Error::definition(
            flow,
            codes::MULTIPART_IDENTIFIER,
            format!(
                "`{text}` is a multi-part identifier; use the plain column name (`{}`), or quote a name that holds a dot with backticks",
                text.rsplit('.').next().unwrap_or(text)
            ),
        ));
    }
    if text.is_empty() {
        return bad("a column name is empty".into());
    }
    Ok(text.to_string())
}

/// The column type a `CAST(x AS name)` names: a column type, or one of the
/// SQL spellings of one (`bigint`, `varchar`, `double precision`, ...).
pub(super) fn cast_type(name: &str) -> Option<PrimitiveType> {
    let t = name.trim().to_ascii_lowercase();
    let t = match t.as_str() {
        "varchar" | "text" | "char" | "character varying" => "string",
        "timestamp with time zone" | "timestamp_ltz" => "timestamptz",
        "timestamp without time zone" | "timestamp_ntz" => "timestamp",
        "double precision" | "float8" | "float64" => "double",
        "real" | "float4" | "float32" => "float",
        "smallint" | "tinyint" | "int4" | "int32" => "int",
        "int8" | "int64" => "long",
        t => t,
    };
    parse_type(t)
}

/// The Arrow type autocdc reads and writes an Iceberg primitive type as.
pub fn arrow_type(ty: &PrimitiveType) -> Result<arrow_schema::DataType> {
    let nf = NestedField::optional(1, "c", Type::Primitive(ty.clone()));
    let schema = Schema::builder().with_fields(vec![Arc::new(nf)]).build()?;
    Ok(schema_to_arrow_schema(&schema)?
        .field(0)
        .data_type()
        .clone())
}

/// The Iceberg type of a computed Arrow type, if it has one.
pub(super) fn iceberg_type(t: &arrow_schema::DataType) -> Option<PrimitiveType> {
    use arrow_schema::{DataType as D, TimeUnit};
    Some(match t {
        D::Boolean => PrimitiveType::Boolean,
        D::Int8 | D::Int16 | D::Int32 => PrimitiveType::Int,
        D::Int64 => PrimitiveType::Long,
        D::Float16 | D::Float32 => PrimitiveType::Float,
        D::Float64 => PrimitiveType::Double,
        D::Decimal128(p, s) if *s >= 0 && *p <= 38 => PrimitiveType::Decimal {
            precision: u32::from(*p),
            scale: *s as u32,
        },
        D::Date32 => PrimitiveType::Date,
        D::Time64(TimeUnit::Microsecond) => PrimitiveType::Time,
        D::Timestamp(TimeUnit::Microsecond, None) => PrimitiveType::Timestamp,
        D::Timestamp(TimeUnit::Microsecond, Some(_)) => PrimitiveType::Timestamptz,
        D::Utf8 | D::LargeUtf8 | D::Utf8View => PrimitiveType::String,
        D::Binary | D::LargeBinary | D::BinaryView => PrimitiveType::Binary,
        _ => return None,
    })
}
