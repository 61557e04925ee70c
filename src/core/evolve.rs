//! Schema evolution: the schema a table moves to when its flow's definition
//! changes, under Iceberg's rules. Columns are tracked by field id, so no
//! file is rewritten: an added column is null in older files, a widened one
//! is promoted when read, a renamed one keeps its id and its values.
//!
//! Pure: the engine commits what `evolve` returns (`AddSchema` +
//! `SetCurrentSchema`), for the target and for the state table.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use iceberg::spec::{ListType, MapType, NestedField, PrimitiveType, Schema, StructType, Type};

use crate::core::nested::{number, same_shape};

/// One change of a column, as logged and reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Added {
        name: String,
        ty: String,
    },
    Widened {
        name: String,
        from: String,
        to: String,
    },
    Relaxed {
        name: String,
    },
    Renamed {
        from: String,
        to: String,
    },
    Dropped {
        name: String,
    },
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::Added { name, ty } => write!(f, "added `{name}` {ty}"),
            Change::Widened { name, from, to } => write!(f, "widened `{name}` from {from} to {to}"),
            Change::Relaxed { name } => write!(f, "made `{name}` optional"),
            Change::Renamed { from, to } => write!(f, "renamed `{from}` to `{to}`"),
            Change::Dropped { name } => write!(f, "dropped `{name}`"),
        }
    }
}

/// The schema to move to, and what changed.
#[derive(Debug, Clone)]
pub struct Evolution {
    pub schema: Schema,
    pub changes: Vec<Change>,
}

impl Evolution {
    pub fn describe(&self) -> String {
        self.changes
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    }

    pub fn dropped(&self) -> impl Iterator<Item = &str> {
        self.changes.iter().filter_map(|c| match c {
            Change::Dropped { name } => Some(name.as_str()),
            _ => None,
        })
    }
}

/// A change `evolve` refuses: the column and the rule it breaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub column: String,
    pub rule: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "column `{}`: {}", self.column, self.rule)
    }
}

/// What the definition says beyond its columns.
#[derive(Debug, Default, Clone)]
pub struct Rules {
    /// `(new, old)`: the definition's `renamed_from`.
    pub renames: Vec<(String, String)>,
    /// Columns that may only widen (keys, sequence columns): never renamed
    /// nor dropped.
    pub fixed: Vec<String>,
    /// Field ids a partition spec of the table reads: never dropped.
    pub partition_sources: Vec<i32>,
    /// A column of the table that `want` lacks stays (made optional: new
    /// rows leave it null) unless `drop` names it: the target's columns
    /// only grow, as in Spark's AUTO CDC. Otherwise it is dropped.
    pub keep_unselected: bool,
    /// With `keep_unselected`: the columns to drop all the same.
    pub drop: Vec<String>,
}

/// Whether Iceberg reads a `from` value as `to` (its type promotions).
pub fn promotes(from: &Type, to: &Type) -> bool {
    use PrimitiveType as P;
    match (from, to) {
        (a, b) if same_shape(a, b) => true,
        (Type::Primitive(a), Type::Primitive(b)) => match (a, b) {
            (P::Int, P::Long) | (P::Float, P::Double) => true,
            (
                P::Decimal {
                    precision: p,
                    scale: s,
                },
                P::Decimal {
                    precision: p2,
                    scale: s2,
                },
            ) => s == s2 && p2 >= p,
            _ => false,
        },
        _ => false,
    }
}

const PROMOTIONS: &str = "Iceberg promotes only int to long, float to double and decimal(p, s) to decimal(p', s) with p' > p";

/// A field optional in the table cannot become required; the other way is
/// a change (`Relaxed`).
fn nullability(
    name: &str,
    have_required: bool,
    want_required: bool,
    changes: &mut Vec<Change>,
) -> Result<(), Refusal> {
    if want_required && !have_required {
        return Err(Refusal {
            column: name.to_string(),
            rule: "it is optional in the table and cannot become required: rows written before may hold nulls".into(),
        });
    }
    if have_required && !want_required {
        changes.push(Change::Relaxed {
            name: name.to_string(),
        });
    }
    Ok(())
}

/// The type a column of type `have` in the table moves to for `want` (the
/// definition's, ids ignored): `have`'s field ids kept, a widened
/// primitive, and inside a struct fields added (numbered above `next`),
/// dropped, widened or relaxed, at any depth (list elements and map values
/// too; a map's key type is fixed). `name` is the column's path
/// (`address.zip`) for changes and refusals.
fn merge(
    name: &str,
    have: &Type,
    want: &Type,
    next: &mut i32,
    changes: &mut Vec<Change>,
) -> Result<Type, Refusal> {
    let refuse = |rule: String| Refusal {
        column: name.to_string(),
        rule,
    };
    match (have, want) {
        _ if same_shape(have, want) => Ok(have.clone()),
        (Type::Primitive(_), Type::Primitive(_)) => {
            if !promotes(have, want) {
                let what = if promotes(want, have) {
                    "narrowing it would lose values"
                } else {
                    "that is not a type promotion"
                };
                return Err(refuse(format!(
                    "it is {have} in the table and {want} in the definition: {what} ({PROMOTIONS})"
                )));
            }
            changes.push(Change::Widened {
                name: name.to_string(),
                from: have.to_string(),
                to: want.to_string(),
            });
            Ok(want.clone())
        }
        (Type::Struct(h), Type::Struct(w)) => {
            let mut fields = Vec::new();
            let mut used = HashSet::new();
            for wf in w.fields() {
                let path = format!("{name}.{}", wf.name);
                let mut nf = (**wf).clone();
                match h.fields().iter().find(|hf| hf.name == wf.name) {
                    Some(hf) => {
                        used.insert(hf.id);
                        nf.field_type =
                            Box::new(merge(&path, &hf.field_type, &wf.field_type, next, changes)?);
                        nullability(&path, hf.required, wf.required, changes)?;
                        nf.id = hf.id;
                        nf.doc = hf.doc.clone();
                    }
                    None => {
                        if wf.required {
                            return Err(refuse(format!(
                                "new field `{}` must be optional: rows written before it have no value",
                                wf.name
                            )));
                        }
                        *next += 1;
                        nf.id = *next;
                        nf.field_type = Box::new(number(&wf.field_type, next));
                        changes.push(Change::Added {
                            name: path,
                            ty: wf.field_type.to_string(),
                        });
                    }
                }
                fields.push(Arc::new(nf));
            }
            for hf in h.fields().iter().filter(|hf| !used.contains(&hf.id)) {
                changes.push(Change::Dropped {
                    name: format!("{name}.{}", hf.name),
                });
            }
            Ok(Type::Struct(StructType::new(fields)))
        }
        (Type::List(h), Type::List(w)) => {
            let (he, we) = (&h.element_field, &w.element_field);
            let mut e = (**he).clone();
            let path = format!("{name}.element");
            e.field_type = Box::new(merge(&path, &he.field_type, &we.field_type, next, changes)?);
            nullability(&path, he.required, we.required, changes)?;
            e.required = we.required;
            Ok(Type::List(ListType {
                element_field: Arc::new(e),
            }))
        }
        (Type::Map(h), Type::Map(w)) => {
            if !same_shape(&h.key_field.field_type, &w.key_field.field_type) {
                return Err(refuse(format!(
                    "its map keys are {} in the table and {} in the definition: a map's key type cannot change",
                    h.key_field.field_type, w.key_field.field_type
                )));
            }
            let (hv, wv) = (&h.value_field, &w.value_field);
            let mut v = (**hv).clone();
            let path = format!("{name}.value");
            v.field_type = Box::new(merge(&path, &hv.field_type, &wv.field_type, next, changes)?);
            nullability(&path, hv.required, wv.required, changes)?;
            v.required = wv.required;
            Ok(Type::Map(MapType {
                key_field: h.key_field.clone(),
                value_field: Arc::new(v),
            }))
        }
        _ => Err(refuse(format!(
            "it is {have} in the table and {want} in the definition: that is not a type promotion ({PROMOTIONS})"
        ))),
    }
}

/// The schema `have` (a table's current one) moves to so that it holds the
/// columns of `want` (the definition's, in its order; its field ids are
/// ignored): `None` when nothing but the order differs. New columns take
/// ids above `last_column_id`.
pub fn evolve(
    have: &Schema,
    want: &Schema,
    last_column_id: i32,
    rules: &Rules,
) -> Result<Option<Evolution>, Refusal> {
    let refuse = |column: &str, rule: String| Refusal {
        column: column.to_string(),
        rule,
    };
    let fixed = |n: &str| rules.fixed.iter().any(|f| f == n);
    let mut next = last_column_id.max(have.highest_field_id());
    let mut used = HashSet::new();
    let mut fields = Vec::new();
    let mut changes = Vec::new();
    for f in want.as_struct().fields() {
        let renamed_from = rules
            .renames
            .iter()
            .find(|(n, _)| *n == f.name)
            .map(|(_, o)| o.as_str());
        let found = match renamed_from {
            Some(old) if old != f.name => {
                match (have.field_by_name(old), have.field_by_name(&f.name)) {
                    (Some(_), Some(_)) => {
                        return Err(refuse(
                            &f.name,
                            format!(
                                "it is renamed_from `{old}`, but the table has both `{old}` and `{}`",
                                f.name
                            ),
                        ));
                    }
                    (Some(h), None) => {
                        if fixed(&f.name) || fixed(old) {
                            return Err(refuse(
                                &f.name,
                                "a key or sequence column cannot be renamed".into(),
                            ));
                        }
                        changes.push(Change::Renamed {
                            from: old.to_string(),
                            to: f.name.clone(),
                        });
                        Some(h)
                    }
                    // Renamed by an earlier run.
                    (None, Some(h)) => Some(h),
                    (None, None) => {
                        return Err(refuse(
                            &f.name,
                            format!("it is renamed_from `{old}`, which the table has no column of"),
                        ));
                    }
                }
            }
            _ => have.field_by_name(&f.name),
        };
        let mut nf: NestedField = (**f).clone();
        match found {
            Some(h) => {
                if !used.insert(h.id) {
                    return Err(refuse(
                        &f.name,
                        format!("the table's column `{}` is claimed twice", h.name),
                    ));
                }
                nf.field_type = Box::new(merge(
                    &f.name,
                    &h.field_type,
                    &f.field_type,
                    &mut next,
                    &mut changes,
                )?);
                nullability(&f.name, h.required, f.required, &mut changes)?;
                nf.id = h.id;
                nf.doc = h.doc.clone();
            }
            None => {
                if f.required {
                    return Err(refuse(
                        &f.name,
                        "a new column must be optional: rows written before it have no value"
                            .into(),
                    ));
                }
                next += 1;
                nf.id = next;
                nf.field_type = Box::new(number(&f.field_type, &mut next));
                changes.push(Change::Added {
                    name: f.name.clone(),
                    ty: f.field_type.to_string(),
                });
            }
        }
        fields.push(Arc::new(nf));
    }
    for h in have.as_struct().fields() {
        if used.contains(&h.id) {
            continue;
        }
        if rules.keep_unselected && !rules.drop.iter().any(|d| d.eq_ignore_ascii_case(&h.name)) {
            let mut kept: NestedField = (**h).clone();
            if kept.required {
                kept.required = false;
                changes.push(Change::Relaxed {
                    name: h.name.clone(),
                });
            }
            // Where it was: after the table's column before it.
            let at = have
                .as_struct()
                .fields()
                .iter()
                .take_while(|o| o.id != h.id)
                .filter_map(|o| fields.iter().position(|f| f.id == o.id))
                .last()
                .map_or(0, |p| p + 1);
            fields.insert(at, Arc::new(kept));
            continue;
        }
        if fixed(&h.name) {
            return Err(refuse(
                &h.name,
                "a key or sequence column cannot be dropped".into(),
            ));
        }
        if rules.partition_sources.contains(&h.id) {
            return Err(refuse(
                &h.name,
                "the table is partitioned by it, so it cannot be dropped".into(),
            ));
        }
        changes.push(Change::Dropped {
            name: h.name.clone(),
        });
    }
    if changes.is_empty() {
        return Ok(None);
    }
    let ids = want
        .identifier_field_ids()
        .filter_map(|id| want.field_by_id(id))
        .filter_map(|w| fields.iter().find(|f| f.name == w.name).map(|f| f.id))
        .collect::<Vec<_>>();
    let schema = Schema::builder()
        .with_schema_id(have.schema_id() + 1)
        .with_fields(fields)
        .with_identifier_field_ids(ids)
        .build()
        .map_err(|e| refuse("", format!("the evolved schema is invalid: {e}")))?;
    Ok(Some(Evolution { schema, changes }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(id: i32, fields: &[(i32, &str, PrimitiveType, bool)]) -> Schema {
        Schema::builder()
            .with_schema_id(id)
            .with_fields(fields.iter().map(|(i, n, t, req)| {
                Arc::new(if *req {
                    NestedField::required(*i, *n, Type::Primitive(t.clone()))
                } else {
                    NestedField::optional(*i, *n, Type::Primitive(t.clone()))
                })
            }))
            .build()
            .unwrap()
    }

    use PrimitiveType as P;

    fn base() -> Schema {
        schema(
            0,
            &[
                (1, "id", P::Long, true),
                (2, "n", P::Int, false),
                (3, "name", P::String, false),
            ],
        )
    }

    fn rules() -> Rules {
        Rules {
            fixed: vec!["id".into()],
            ..Rules::default()
        }
    }

    fn ids(s: &Schema) -> Vec<(i32, String)> {
        s.as_struct()
            .fields()
            .iter()
            .map(|f| (f.id, f.name.clone()))
            .collect()
    }

    #[test]
    fn the_same_columns_in_another_order_need_no_schema() {
        let want = schema(
            0,
            &[
                (1, "name", P::String, false),
                (2, "id", P::Long, true),
                (3, "n", P::Int, false),
            ],
        );
        assert!(evolve(&base(), &want, 3, &rules()).unwrap().is_none());
    }

    #[test]
    fn an_added_column_takes_the_next_id_in_the_definitions_place() {
        let want = schema(
            0,
            &[
                (1, "id", P::Long, true),
                (2, "note", P::String, false),
                (3, "n", P::Int, false),
                (4, "name", P::String, false),
            ],
        );
        // A dropped column once held id 7: ids are never reused.
        let e = evolve(&base(), &want, 7, &rules()).unwrap().unwrap();
        assert_eq!(
            ids(&e.schema),
            vec![
                (1, "id".into()),
                (8, "note".into()),
                (2, "n".into()),
                (3, "name".into())
            ]
        );
        assert_eq!(e.schema.schema_id(), 1);
        assert_eq!(e.describe(), "added `note` string");
    }

    #[test]
    fn widening_relaxing_renaming_and_dropping_keep_the_ids() {
        let want = schema(
            0,
            &[
                (1, "id", P::Long, true),
                (2, "n", P::Long, false),
                (3, "title", P::String, false),
            ],
        );
        let mut r = rules();
        r.renames.push(("title".into(), "name".into()));
        let e = evolve(&base(), &want, 3, &r).unwrap().unwrap();
        assert_eq!(
            ids(&e.schema),
            vec![(1, "id".into()), (2, "n".into()), (3, "title".into())]
        );
        assert_eq!(
            e.describe(),
            "widened `n` from int to long, renamed `name` to `title`"
        );
        // Once renamed, the same definition changes nothing.
        assert!(evolve(&e.schema, &want, 3, &r).unwrap().is_none());

        let dropped = schema(0, &[(1, "id", P::Long, true), (2, "n", P::Int, false)]);
        let e = evolve(&base(), &dropped, 3, &r).unwrap().unwrap();
        assert_eq!(e.dropped().collect::<Vec<_>>(), ["name"]);

        let strict = schema(0, &[(1, "id", P::Long, true), (2, "n", P::Int, true)]);
        let relaxed = evolve(&strict, &dropped, 3, &r).unwrap().unwrap();
        assert_eq!(relaxed.describe(), "made `n` optional");
    }

    #[test]
    fn a_column_left_out_stays_in_its_place_optional_unless_dropped() {
        let have = schema(
            0,
            &[
                (1, "id", P::Long, true),
                (2, "n", P::Int, true),
                (3, "name", P::String, false),
            ],
        );
        let want = schema(
            0,
            &[(1, "id", P::Long, true), (3, "name", P::String, false)],
        );
        let keep = Rules {
            keep_unselected: true,
            ..rules()
        };
        let e = evolve(&have, &want, 3, &keep).unwrap().unwrap();
        let got: Vec<_> = e
            .schema
            .as_struct()
            .fields()
            .iter()
            .map(|f| (f.id, f.name.clone(), f.required))
            .collect();
        assert_eq!(
            got,
            [
                (1, "id".into(), true),
                (2, "n".into(), false),
                (3, "name".into(), false)
            ]
        );
        assert_eq!(e.changes, [Change::Relaxed { name: "n".into() }]);
        // Already optional: nothing to commit.
        let want = schema(0, &[(1, "id", P::Long, true), (2, "n", P::Int, false)]);
        assert!(evolve(&base(), &want, 3, &keep).unwrap().is_none());
        // Named in `drop`: dropped, as without `keep_unselected`.
        let drop = Rules {
            drop: vec!["NAME".into()],
            ..keep
        };
        let e = evolve(&base(), &want, 3, &drop).unwrap().unwrap();
        assert_eq!(
            e.changes,
            [Change::Dropped {
                name: "name".into()
            }]
        );
        assert!(e.schema.field_by_name("name").is_none());
    }

    #[test]
    fn every_illegal_change_names_its_column_and_rule() {
        type Case<'a> = (
            Vec<(i32, &'a str, P, bool)>,
            Vec<(String, String)>,
            &'a str,
            &'a str,
        );
        let cases: Vec<Case> = vec![
            (
                vec![
                    (1, "id", P::Int, true),
                    (2, "n", P::Int, false),
                    (3, "name", P::String, false),
                ],
                vec![],
                "id",
                "narrowing",
            ),
            (
                vec![
                    (1, "id", P::Long, true),
                    (2, "n", P::String, false),
                    (3, "name", P::String, false),
                ],
                vec![],
                "n",
                "not a type promotion",
            ),
            (
                vec![
                    (1, "id", P::Long, true),
                    (2, "n", P::Int, true),
                    (3, "name", P::String, false),
                ],
                vec![],
                "n",
                "cannot become required",
            ),
            (
                vec![
                    (1, "id", P::Long, true),
                    (2, "n", P::Int, false),
                    (3, "name", P::String, false),
                    (4, "x", P::Int, true),
                ],
                vec![],
                "x",
                "must be optional",
            ),
            (
                vec![
                    (1, "key", P::Long, true),
                    (2, "n", P::Int, false),
                    (3, "name", P::String, false),
                ],
                vec![("key".into(), "id".into())],
                "key",
                "cannot be renamed",
            ),
            (
                vec![
                    (1, "id", P::Long, true),
                    (2, "n", P::Int, false),
                    (3, "title", P::String, false),
                ],
                vec![("title".into(), "nope".into())],
                "title",
                "no column",
            ),
            (
                vec![(2, "n", P::Int, false), (3, "name", P::String, false)],
                vec![],
                "id",
                "cannot be dropped",
            ),
        ];
        for (fields, renames, column, rule) in cases {
            let want = schema(0, &fields);
            let mut r = rules();
            r.renames = renames;
            let refusal = evolve(&base(), &want, 3, &r).unwrap_err();
            assert_eq!(refusal.column, column, "{refusal}");
            assert!(refusal.rule.contains(rule), "{refusal}");
        }
        let mut r = rules();
        r.partition_sources.push(3);
        let want = schema(0, &[(1, "id", P::Long, true), (2, "n", P::Int, false)]);
        let refusal = evolve(&base(), &want, 3, &r).unwrap_err();
        assert!(refusal.rule.contains("partitioned by it"), "{refusal}");
    }

    #[test]
    fn decimals_widen_in_precision_only() {
        let d = |p, s| {
            Type::Primitive(P::Decimal {
                precision: p,
                scale: s,
            })
        };
        assert!(promotes(&d(9, 2), &d(18, 2)));
        assert!(!promotes(&d(18, 2), &d(9, 2)));
        assert!(!promotes(&d(9, 2), &d(18, 3)));
        assert!(promotes(
            &Type::Primitive(P::Float),
            &Type::Primitive(P::Double)
        ));
        assert!(!promotes(
            &Type::Primitive(P::Long),
            &Type::Primitive(P::Int)
        ));
    }
}
