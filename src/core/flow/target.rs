//! The target: which source columns it keeps (`column_list` /
//! `except_column_list`), its Iceberg schema (identifier fields, the SCD
//! Type 2 interval columns) and its partition spec (`partition_by`).

use std::collections::HashSet;
use std::sync::Arc;

use iceberg::spec::{NestedField, PartitionSpec, Schema, StructType, Transform, Type};

use super::FlowConfig;
use super::columns::{Declared, END_AT, START_AT, find_column, parse_ident};
use crate::error::{Error, Result, codes};

/// The source columns the target keeps (`column_list` /
/// `except_column_list`); every key among them.
pub(super) fn selected_columns(
    config: &FlowConfig,
    fields: &[Declared],
    key_idx: &[usize],
) -> Result<Vec<usize>> {
    let f = config.name.as_str();
    let target_cols: Vec<usize> = match (&config.column_list, &config.except_column_list) {
        (Some(_), Some(_)) => {
            return Err(Error::definition(
                f,
                codes::INVALID_SELECTION,
                "column_list and except_column_list are mutually exclusive; keep one",
            ));
        }
        (Some(list), None) => {
            let mut v = Vec::new();
            for c in list {
                let i = find_column(config, c, "column_list")?;
                if !v.contains(&i) {
                    v.push(i);
                }
            }
            v.sort_unstable();
            v
        }
        (None, Some(except)) => {
            let ex = except
                .iter()
                .map(|c| find_column(config, c, "except_column_list"))
                .collect::<Result<HashSet<_>>>()?;
            (0..config.columns.len())
                .filter(|i| !ex.contains(i))
                .collect()
        }
        (None, None) => (0..config.columns.len()).collect(),
    };
    for &k in key_idx {
        if !target_cols.contains(&k) {
            return Err(Error::definition(
                f,
                codes::INVALID_SELECTION,
                format!(
                    "key column `{}` is left out of the target by the column selection; keys must be in the target",
                    fields[k].1
                ),
            ));
        }
    }
    Ok(target_cols)
}

/// The target's Iceberg schema: the selected columns (field ids 1..n, keys
/// required and, but for SCD Type 2, identifier fields), then for SCD Type 2
/// `__START_AT` / `__END_AT` of the sequence's type.
pub(super) fn target_schema(
    fields: &[Declared],
    target_cols: &[usize],
    key_idx: &[usize],
    seq_idx: &[usize],
    scd2: bool,
) -> Result<Schema> {
    let mut target_fields = Vec::new();
    for (pos, &i) in target_cols.iter().enumerate() {
        let (_, name, ty, required) = &fields[i];
        let id = pos as i32 + 1;
        let is_key = key_idx.contains(&i);
        let nf = if *required || is_key {
            NestedField::required(id, name, ty.clone())
        } else {
            NestedField::optional(id, name, ty.clone())
        };
        target_fields.push(Arc::new(nf));
    }
    // Identifier ids in key order.
    let identifier: Vec<i32> = key_idx
        .iter()
        .map(|k| {
            target_cols
                .iter()
                .position(|c| c == k)
                .map(|p| p as i32 + 1)
                .unwrap_or(0)
        })
        .collect();
    // SCD Type 2: every version of a key is a row, so the keys identify
    // no row; each version carries the sequence interval it covers.
    let identifier = if scd2 { Vec::new() } else { identifier };
    if scd2 {
        let base = target_cols.len() as i32;
        let mut next = base + 2;
        let mut seq_type = || -> Type {
            if seq_idx.len() == 1 {
                return fields[seq_idx[0]].2.clone();
            }
            let subs = seq_idx
                .iter()
                .map(|&i| {
                    next += 1;
                    Arc::new(NestedField::optional(
                        next,
                        &fields[i].1,
                        fields[i].2.clone(),
                    ))
                })
                .collect::<Vec<_>>();
            Type::Struct(StructType::new(subs))
        };
        let (start, end) = (seq_type(), seq_type());
        target_fields.push(Arc::new(NestedField::optional(base + 1, START_AT, start)));
        target_fields.push(Arc::new(NestedField::optional(base + 2, END_AT, end)));
    }
    Ok(Schema::builder()
        .with_schema_id(0)
        .with_fields(crate::core::nested::number_all(target_fields))
        .with_identifier_field_ids(identifier)
        .build()?)
}

/// Parses one `partition_by` entry: `col` (identity), Iceberg's notation
/// (`identity(col)`, `bucket[16](col)`, `truncate[4](col)`, `year(col)`,
/// `month(col)`, `day(col)`, `hour(col)`) or Spark's (`bucket(16, col)`,
/// `truncate(4, col)`, `years(col)`, `months(col)`, `days(col)`, `hours(col)`).
pub fn parse_partition_field(s: &str) -> Option<(String, Transform)> {
    let s = s.trim();
    let Some(open) = s.find('(') else {
        return Some((s.to_string(), Transform::Identity));
    };
    let inner = s[open + 1..].strip_suffix(')')?;
    let name = s[..open].trim().to_ascii_lowercase();
    let args: Vec<&str> = inner.split(',').map(str::trim).collect();
    let (transform, col) = match (name.as_str(), args.as_slice()) {
        ("bucket", [n, col]) => (Transform::Bucket(n.parse().ok()?), *col),
        ("truncate", [w, col]) => (Transform::Truncate(w.parse().ok()?), *col),
        ("years", [col]) => (Transform::Year, *col),
        ("months", [col]) => (Transform::Month, *col),
        ("days", [col]) => (Transform::Day, *col),
        ("hours", [col]) => (Transform::Hour, *col),
        (t, [col]) => match t.parse::<Transform>().ok()? {
            t @ (Transform::Identity
            | Transform::Bucket(_)
            | Transform::Truncate(_)
            | Transform::Year
            | Transform::Month
            | Transform::Day
            | Transform::Hour) => (t, *col),
            _ => return None,
        },
        _ => return None,
    };
    if col.is_empty() || col.contains(['(', ')', ' ']) {
        return None;
    }
    if matches!(transform, Transform::Bucket(0) | Transform::Truncate(0)) {
        return None;
    }
    Some((col.to_string(), transform))
}

/// The partition field's name, as Iceberg Java names them.
fn partition_field_name(col: &str, t: &Transform) -> String {
    match t {
        Transform::Identity => col.to_string(),
        Transform::Bucket(_) => format!("{col}_bucket"),
        Transform::Truncate(_) => format!("{col}_trunc"),
        Transform::Year => format!("{col}_year"),
        Transform::Month => format!("{col}_month"),
        Transform::Day => format!("{col}_day"),
        Transform::Hour => format!("{col}_hour"),
        _ => format!("{col}_{t}"),
    }
}

pub(super) fn partition_spec(
    flow: &str,
    entries: &[String],
    schema: &Schema,
    case_sensitive: bool,
) -> Result<PartitionSpec> {
    let mut b = PartitionSpec::builder(schema.clone()).with_spec_id(0);
    for e in entries {
        let Some((col, t)) = parse_partition_field(e) else {
            return Err(Error::definition(
                flow,
                codes::INVALID_DEFINITION,
                format!(
                    "partition_by entry `{e}` is not a partition transform; write `col`, `bucket[16](col)`, `truncate[4](col)`, `year(col)`, `month(col)`, `day(col)` or `hour(col)`"
                ),
            ));
        };
        let col = parse_ident(flow, &col)?;
        let found = schema
            .as_struct()
            .fields()
            .iter()
            .find(|f| f.name == col)
            .or_else(|| {
                (!case_sensitive)
                    .then(|| {
                        schema
                            .as_struct()
                            .fields()
                            .iter()
                            .find(|f| f.name.eq_ignore_ascii_case(&col))
                    })
                    .flatten()
            });
        let Some(field) = found else {
            return Err(Error::definition(
                flow,
                codes::COLUMNS_NOT_FOUND,
                format!(
                    "partition_by column `{col}` is not a column of the target ({}); partition on a target column",
                    schema
                        .as_struct()
                        .fields()
                        .iter()
                        .map(|f| f.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        };
        let ty = field.field_type.to_string();
        let col = field.name.clone();
        b = b
            .add_partition_field(&col, partition_field_name(&col, &t), t)
            .map_err(|err| {
                Error::definition(
                    flow,
                    codes::INVALID_DEFINITION,
                    format!(
                        "partition_by entry `{e}` does not apply to column `{col}` of type {ty}: {}",
                        err.message()
                    ),
                )
            })?;
    }
    Ok(b.build()?)
}

/// `drop_columns` names columns the flow does not select: a key or
/// sequence column, or one the flow still writes, is refused.
pub(super) fn check_drops(config: &FlowConfig, target: &Schema, fixed: &[&str]) -> Result<()> {
    for name in &config.drop_columns {
        let why = if fixed.iter().any(|f| f.eq_ignore_ascii_case(name)) {
            "a key or sequence column cannot be dropped"
        } else if target.field_by_name(name).is_some() {
            "the flow selects it; leave it out of the flow's columns (column_list / except_column_list) to drop it"
        } else {
            continue;
        };
        return Err(Error::definition(
            &config.name,
            codes::INVALID_DEFINITION,
            format!("drop_columns names `{name}`: {why}"),
        ));
    }
    Ok(())
}
