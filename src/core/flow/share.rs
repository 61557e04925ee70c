//! Several flows into one target (Spark allows several AUTO CDC flows into
//! one table, e.g. one per source shard): what two definitions must agree
//! on to share it. They share the target's state, so whatever gives the
//! state its meaning must be the same: the keys and the sequence (the
//! state's own columns, compared by name and type), the SCD type and
//! whether every change is kept, the tie rule, and, for flows that keep
//! every change (SCD Type 2, `ignore_null_updates`), the columns whose
//! values each change keeps and how they fold. What each definition would
//! set on the table in turn must agree too (partitioning, table
//! properties). The selected columns may differ under SCD Type 1: the
//! target has their union, and a flow's rows leave the columns it does not
//! select null (as when a flow narrows its own selection).
//!
//! The engine checks the same against a target another flow wrote
//! (`table::engine`'s `check_shared`), for flows defined apart.

use iceberg::spec::Type;

use super::Flow;
use crate::error::{Error, Result, codes};

/// A `from_snapshot` flow, which writes its target alone.
pub const FROM_SNAPSHOT_ALONE: &str =
    "a from_snapshot flow (each snapshot is compared with the whole target)";
/// An SCD Type 2 Debezium flow, which writes its target alone.
pub const CUTS_ALONE: &str = "an SCD Type 2 Debezium flow (a snapshot of its source closes the versions of every key it did not read)";

/// What `f` is, when it is a kind of flow that writes its target alone.
pub fn writes_alone(f: &Flow) -> Option<&'static str> {
    if f.from_snapshot {
        Some(FROM_SNAPSHOT_ALONE)
    } else if f.cuts.is_some() {
        Some(CUTS_ALONE)
    } else {
        None
    }
}

/// `second` may write the target `first` writes: both name it.
pub fn check_shared(first: &Flow, second: &Flow) -> Result<()> {
    let differ = |what: &str, a: String, b: String| -> Result<()> {
        Err(Error::definition(
            &second.name,
            codes::TARGET_IN_USE,
            format!(
                "{} is also the target of flow `{}`, and flows sharing a target share its state, so they must agree on {what}: `{}` has {a}, `{}` has {b}. Make the two definitions agree, or give each flow its own target",
                second.target, first.name, first.name, second.name
            ),
        ))
    };
    if let Some(why) = writes_alone(first).or(writes_alone(second)) {
        return Err(Error::definition(
            &second.name,
            codes::TARGET_IN_USE,
            format!(
                "{} is also the target of flow `{}`; {why} writes its target alone: give each flow its own target",
                second.target, first.name
            ),
        ));
    }
    let mut keys = [first, second].map(|f| columns(f, &f.key_idx));
    keys.iter_mut().for_each(|k| k.sort());
    let [a, b] = keys;
    if a != b {
        return differ("the keys", a.join(", "), b.join(", "));
    }
    let [a, b] = [first, second].map(|f| columns(f, &f.seq_idx));
    if a != b {
        return differ("the sequence", a.join(", "), b.join(", "));
    }
    let kind = |f: &Flow| {
        match (f.scd2, f.ignore_null_updates) {
            (true, _) => "SCD Type 2",
            (false, true) => "SCD Type 1 with ignore_null_updates",
            (false, false) => "SCD Type 1",
        }
        .to_string()
    };
    if kind(first) != kind(second) {
        return differ("the kind of table", kind(first), kind(second));
    }
    if first.config.on_sequence_tie != second.config.on_sequence_tie {
        let tie = |f: &Flow| format!("on_sequence_tie = {:?}", f.config.on_sequence_tie);
        return differ("the tie rule", tie(first), tie(second));
    }
    if first.keeps_history() {
        let [a, b] = [first, second].map(|f| columns(f, &f.value_cols()));
        if a != b {
            return differ(
                "the value columns (the state keeps every change's values)",
                a.join(", "),
                b.join(", "),
            );
        }
        let sets = |f: &Flow| {
            let names = |c: &[usize]| c.iter().map(|&i| f.column_name(i)).collect::<Vec<_>>();
            let fold = crate::core::history::Folding::of(f);
            format!(
                "tracked [{}], nulls kept in [{}]",
                names(&fold.tracked).join(", "),
                names(&fold.ignored).join(", ")
            )
        };
        if sets(first) != sets(second) {
            return differ("how changes fold", sets(first), sets(second));
        }
    }
    if first.config.partition_by != second.config.partition_by {
        let p = |f: &Flow| format!("partition_by = {:?}", f.config.partition_by);
        return differ("the partitioning", p(first), p(second));
    }
    if first.config.table_properties != second.config.table_properties {
        let p = |f: &Flow| format!("table_properties = {:?}", f.config.table_properties);
        return differ("the table properties", p(first), p(second));
    }
    Ok(())
}

/// "name type" of each column.
fn columns(f: &Flow, idx: &[usize]) -> Vec<String> {
    idx.iter()
        .map(|&i| {
            let ty = f.column_type(i).map_or("?".to_string(), |t| match t {
                Type::Primitive(p) => p.to_string(),
                other => format!("{other:?}"),
            });
            format!("{} {ty}", f.column_name(i))
        })
        .collect()
}
