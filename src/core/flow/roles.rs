//! The roles of columns: the keys and the sequence (declared columns,
//! `sequence_by` expressions as hidden computed columns, the hidden columns
//! of `from_snapshot` and Debezium flows), the columns whose change opens an
//! SCD Type 2 version (`tracked_columns`) and those whose null keeps the
//! current value (`ignored_columns`, `toasted_columns`).

use std::collections::HashSet;

use iceberg::spec::{PrimitiveType, Type};

use super::columns::{
    COMPUTED_PREFIX, Declared, SNAPSHOT_VERSION, cast_type, find_column, iceberg_type,
    source_schema,
};
use super::{Computed, FlowConfig, InputFormat, arrow_type};
use crate::core::debezium;
use crate::core::nested::orderable;
use crate::core::seq_expr::{self, Part, SeqExpr};
use crate::error::{Error, Result, codes};

/// The key and sequence columns (a `from_snapshot` flow's hidden version
/// column is added to `fields` as its sequence).
pub(super) fn keys_and_sequence(
    config: &FlowConfig,
    fields: &mut Vec<Declared>,
) -> Result<(Vec<usize>, Vec<usize>, Vec<Computed>)> {
    let f = config.name.as_str();
    if config.keys.is_empty() {
        return Err(Error::definition(
            f,
            codes::EMPTY_KEYS,
            "`keys` is empty; name the column(s) that identify a row, e.g. keys = [\"id\"]",
        ));
    }
    let key_idx = config
        .keys
        .iter()
        .map(|k| find_column(config, k, "key"))
        .collect::<Result<Vec<_>>>()?;
    let mut seq_names = config.sequence_by.to_vec();
    if config.from_snapshot {
        let misplaced = [
            (
                !seq_names.is_empty(),
                "sequence_by (the snapshot version orders the changes)",
            ),
            (
                config.apply_as_deletes.is_some(),
                "apply_as_deletes (a key missing from a snapshot is deleted)",
            ),
            (config.apply_as_truncates.is_some(), "apply_as_truncates"),
            (
                config.ignore_null_updates
                    || config.ignore_null_updates_column_list.is_some()
                    || config.ignore_null_updates_except_column_list.is_some(),
                "ignore_null_updates (a snapshot holds whole rows)",
            ),
        ];
        if let Some((_, what)) = misplaced.iter().find(|m| m.0) {
            return Err(Error::definition(
                f,
                codes::INVALID_DEFINITION,
                format!("a from_snapshot flow takes no {what}"),
            ));
        }
        // The version, as a hidden sequence column after the declared ones.
        fields.push((
            fields.len(),
            SNAPSHOT_VERSION.to_string(),
            Type::Primitive(PrimitiveType::Long),
            true,
        ));
        seq_names.push(SNAPSHOT_VERSION.to_string());
    }
    if config.format == InputFormat::Debezium {
        debezium_columns(config, fields, &mut seq_names)?;
    }
    if seq_names.is_empty() {
        return Err(Error::definition(
            f,
            codes::INVALID_DEFINITION,
            "`sequence_by` is empty; name the column(s) that order changes, e.g. sequence_by = \"seq\"",
        ));
    }
    let declared = source_schema(fields)?;
    let (mut seq_idx, mut computed) = (Vec::new(), Vec::new());
    for s in &seq_names {
        for part in sequence_parts(config, s)? {
            let sql = match part {
                Part::Column(name) => {
                    seq_idx.push(find_column(config, &name, "sequence_by")?);
                    continue;
                }
                Part::Expr(sql) => sql,
            };
            let expr =
                SeqExpr::compile(&sql, &declared, &|t: &str| arrow_type(&cast_type(t)?).ok())
                    .map_err(|e| Error::from_predicate(f, e))?;
            let ty = match iceberg_type(expr.data_type()) {
                Some(t) if orderable(&Type::Primitive(t.clone())) => t,
                _ => {
                    return Err(Error::definition(
                        f,
                        codes::NON_ORDERABLE_SEQUENCE,
                        format!(
                            "sequence_by `{sql}` yields {}, which has no order; make it a number, a date, a timestamp or a string",
                            expr.data_type()
                        ),
                    ));
                }
            };
            let idx = fields.len();
            let name = format!("{COMPUTED_PREFIX}{}", seq_idx.len());
            fields.push((idx, name, Type::Primitive(ty.clone()), true));
            computed.push(Computed { idx, expr, ty });
            seq_idx.push(idx);
        }
    }
    for &i in &seq_idx {
        if !orderable(&fields[i].2) {
            return Err(Error::definition(
                f,
                codes::NON_ORDERABLE_SEQUENCE,
                format!(
                    "sequence_by column `{}` has type {} which has no order; use a numeric, temporal or string column (or a struct of them)",
                    fields[i].1, fields[i].2
                ),
            ));
        }
    }
    for &i in &key_idx {
        if !fields[i].2.is_primitive() {
            return Err(Error::definition(
                f,
                codes::INVALID_DEFINITION,
                format!(
                    "key column `{}` is {}; keys are primitive columns (Iceberg identifier fields)",
                    fields[i].1, fields[i].2
                ),
            ));
        }
        if matches!(
            fields[i].2,
            Type::Primitive(PrimitiveType::Float | PrimitiveType::Double)
        ) {
            return Err(Error::definition(
                f,
                codes::INVALID_DEFINITION,
                format!(
                    "key column `{}` is a floating-point column; Iceberg identifier fields cannot be float or double",
                    fields[i].1
                ),
            ));
        }
    }
    Ok((key_idx, seq_idx, computed))
}

/// A Debezium flow's hidden columns (`core::debezium`), after the declared
/// ones; its sequence is their position. What the events give is refused
/// when declared.
fn debezium_columns(
    config: &FlowConfig,
    fields: &mut Vec<Declared>,
    seq_names: &mut Vec<String>,
) -> Result<()> {
    let misplaced = [
        (
            !seq_names.is_empty(),
            "sequence_by (the source position of each event orders them)",
        ),
        (
            config.apply_as_deletes.is_some(),
            "apply_as_deletes (events with op = 'd' delete)",
        ),
        (
            config.apply_as_truncates.is_some(),
            "apply_as_truncates (events with op = 't' truncate)",
        ),
        (config.from_snapshot, "from_snapshot"),
    ];
    if let Some((_, what)) = misplaced.iter().find(|m| m.0) {
        return Err(Error::definition(
            &config.name,
            codes::INVALID_DEFINITION,
            format!("a format = \"debezium\" flow takes no {what}: remove it from the definition"),
        ));
    }
    for (name, ty) in debezium::hidden_columns() {
        fields.push((fields.len(), name.to_string(), ty, true));
    }
    seq_names.extend(debezium::POSITION.iter().map(|s| s.to_string()));
    Ok(())
}

/// A `sequence_by` entry as columns and expressions: a name (plain,
/// backtick-quoted or dotted, which `find_column` refuses) is one column;
/// anything else is an expression, `struct(...)` one part per field.
fn sequence_parts(config: &FlowConfig, s: &str) -> Result<Vec<Part>> {
    let dotted_name = |s: &str| {
        s.split('.').all(|p| {
            p.chars().next().is_some_and(|c| !c.is_ascii_digit())
                && p.chars().all(|c| c.is_alphanumeric() || c == '_')
        })
    };
    let declared = config
        .columns
        .iter()
        .any(|c| c.name.eq_ignore_ascii_case(s));
    if s.is_empty() || s.starts_with('`') || declared || dotted_name(s) {
        return Ok(vec![Part::Column(s.to_string())]);
    }
    seq_expr::parts(s).map_err(|e| Error::from_predicate(&config.name, e))
}

/// The columns whose change opens a new SCD Type 2 version. As in Spark's
/// AUTO CDC, by default every target column but the keys, the sequence
/// columns included when the target keeps them; a list or an except list
/// names target columns that are not keys.
pub(super) fn tracked_columns(
    config: &FlowConfig,
    target_cols: &[usize],
    key_idx: &[usize],
) -> Result<Vec<usize>> {
    let value_cols = without(target_cols, key_idx);
    Ok(value_selection(
        config,
        &value_cols,
        [
            (
                "track_history_column_list",
                &config.track_history_column_list,
            ),
            (
                "track_history_except_column_list",
                &config.track_history_except_column_list,
            ),
        ],
    )?
    .unwrap_or(value_cols))
}

/// The value columns whose null in an upsert keeps the current value:
/// every one with `ignore_null_updates = true`, or those a list names (or
/// an except list leaves), Spark's column-subset form.
pub(super) fn ignored_columns(
    config: &FlowConfig,
    target_cols: &[usize],
    key_idx: &[usize],
) -> Result<Vec<usize>> {
    let value_cols = without(target_cols, key_idx);
    if config.format == InputFormat::Debezium {
        return toasted_columns(config, &value_cols);
    }
    if config.toasted_columns.is_some() {
        return Err(Error::definition(
            &config.name,
            codes::INVALID_DEFINITION,
            "toasted_columns is for format = \"debezium\" flows (Debezium's placeholder for an unchanged TOASTed value)",
        ));
    }
    let selected = value_selection(
        config,
        &value_cols,
        [
            (
                "ignore_null_updates_column_list",
                &config.ignore_null_updates_column_list,
            ),
            (
                "ignore_null_updates_except_column_list",
                &config.ignore_null_updates_except_column_list,
            ),
        ],
    )?;
    Ok(match selected {
        Some(cols) => cols,
        None if config.ignore_null_updates => value_cols,
        None => Vec::new(),
    })
}

/// A Debezium flow's columns whose placeholder keeps the earlier value
/// (`toasted_columns`: string or binary value columns). Its nulls are
/// values: the `ignore_null_updates` settings are refused.
fn toasted_columns(config: &FlowConfig, value_cols: &[usize]) -> Result<Vec<usize>> {
    let f = config.name.as_str();
    if config.ignore_null_updates
        || config.ignore_null_updates_column_list.is_some()
        || config.ignore_null_updates_except_column_list.is_some()
    {
        return Err(Error::definition(
            f,
            codes::INVALID_DEFINITION,
            "a format = \"debezium\" flow takes no ignore_null_updates: a null in an event is the column's value; name the columns whose untouched TOASTed values arrive as a placeholder in toasted_columns",
        ));
    }
    let Some(names) = &config.toasted_columns else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for name in names {
        let c = find_column(config, name, "toasted_columns")?;
        if !value_cols.contains(&c) {
            return Err(Error::definition(
                f,
                codes::INVALID_SELECTION,
                format!("toasted_columns names `{name}`, which is a key or not in the target"),
            ));
        }
        let ty = config.columns[c].ty.trim().to_ascii_lowercase();
        if ty != "string" && ty != "binary" {
            return Err(Error::definition(
                f,
                codes::INVALID_DEFINITION,
                format!(
                    "toasted_columns names `{name}` of type {ty}; Debezium's placeholder fills string and binary columns"
                ),
            ));
        }
        if !out.contains(&c) {
            out.push(c);
        }
    }
    Ok(out)
}

fn without(cols: &[usize], drop: &[usize]) -> Vec<usize> {
    cols.iter().copied().filter(|c| !drop.contains(c)).collect()
}

/// The value columns (target order) a setting's list names, or its except
/// list leaves; None when neither is set. A list names target columns that
/// are not keys; an except list may name any declared column.
fn value_selection(
    config: &FlowConfig,
    value_cols: &[usize],
    [(list_name, list), (except_name, except)]: [(&str, &Option<Vec<String>>); 2],
) -> Result<Option<Vec<usize>>> {
    let f = config.name.as_str();
    Ok(match (list, except) {
        (Some(_), Some(_)) => {
            return Err(Error::definition(
                f,
                codes::INVALID_SELECTION,
                format!("{list_name} and {except_name} are mutually exclusive; keep one"),
            ));
        }
        (Some(names), None) => {
            let mut set = HashSet::new();
            for c in names {
                let i = find_column(config, c, list_name)?;
                if !value_cols.contains(&i) {
                    return Err(Error::definition(
                        f,
                        codes::INVALID_SELECTION,
                        format!(
                            "{list_name} names `{c}`, which is a key or not a target column; list target columns that are not keys"
                        ),
                    ));
                }
                set.insert(i);
            }
            Some(
                value_cols
                    .iter()
                    .copied()
                    .filter(|c| set.contains(c))
                    .collect(),
            )
        }
        (None, Some(names)) => {
            let set: HashSet<usize> = names
                .iter()
                .map(|c| find_column(config, c, except_name))
                .collect::<Result<_>>()?;
            Some(
                value_cols
                    .iter()
                    .copied()
                    .filter(|c| !set.contains(c))
                    .collect(),
            )
        }
        (None, None) => None,
    })
}
