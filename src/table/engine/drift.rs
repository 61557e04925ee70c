//! An existing target (and its state table) against the flow's definition:
//! what is refused (a flow that cannot share another's table, changed keys,
//! a change `evolve` refuses), and the schema, partition spec and table properties the
//! tables move to, each one metadata commit.

use std::collections::HashMap;
use std::sync::Arc;

use iceberg::spec::{
    PartitionSpec, PartitionSpecBuilder, Schema, TableMetadata, UnboundPartitionField,
    UnboundPartitionSpec,
};

use super::Engine;
use super::marker::{
    PROP_FLOW, PROP_SNAPSHOT_CUTS, PROP_SNAPSHOT_VERSION, PROP_TRACK_HISTORY, follow, our_latest,
    our_latest_schema, recorded_folding,
};
use crate::core::evolve::{self, Evolution, Refusal, Rules};
use crate::core::flow::{END_AT, Flow, START_AT};
use crate::core::history::Folding;
use crate::error::{Error, Result, codes};
use crate::table::catalog::{Catalog, TableState};
use crate::table::state_table;

/// The schema changes a definition makes to an existing target and its state table.
#[derive(Default)]
pub(super) struct Evolutions {
    pub(super) target: Option<Evolution>,
    pub(super) state: Option<Evolution>,
    /// The target's new default partition spec.
    pub(super) spec: Option<UnboundPartitionSpec>,
}

/// An existing target (and its state table, when there is one) against
/// the definition: the state's keys and sequence first (Spark's order), then
/// the target's keys, columns and partitioning.
pub(super) fn check_drift(
    flow: &Flow,
    target: &TableState,
    state: Option<&TableState>,
) -> Result<Evolutions> {
    check_shared(flow, target, state)?;
    let mut evolutions = Evolutions::default();
    if let Some(s) = state {
        state_table::check(flow, s.metadata.current_schema())?;
        evolutions.state = state_table::evolution(flow, &s.metadata)
            .map_err(|r| refused(flow, &flow.state_ident().to_string(), r))?;
    }
    check_keys(flow, &target.metadata)?;
    evolutions.target = target_evolution(flow, &target.metadata)?;
    let schema = evolutions
        .target
        .as_ref()
        .map_or(target.metadata.current_schema().as_ref(), |e| &e.schema);
    evolutions.spec = repartition(flow, &target.metadata, schema)?;
    Ok(evolutions)
}

/// Flows sharing a target (Spark allows several AUTO CDC flows into one
/// table) share its state: each resolves against the state the last
/// commit of any of them left, and a commit that lost the race to
/// another's reloads it and resolves again. So another flow's target is
/// this flow's too when what the state means is the same for both: the
/// keys and the sequence (the state's own columns), the kind of state,
/// and, for history flows, the columns whose values every event keeps and
/// how they fold. The columns may differ (SCD Type 1): the target has the
/// union, and a flow's rows leave the columns it does not select null.
/// What two definitions would each set on the table in turn (partitioning,
/// table properties) must agree too. `from_snapshot` and SCD Type 2
/// Debezium flows (their snapshots close the versions of keys they did
/// not read) write a target alone.
fn check_shared(flow: &Flow, target: &TableState, state: Option<&TableState>) -> Result<()> {
    let Some(state) = state else {
        return Ok(());
    };
    let (marker, _) = our_latest(&target.metadata);
    let other = marker
        .as_ref()
        .and_then(|m| m.get(PROP_FLOW))
        .or_else(|| state.metadata.properties().get(PROP_FLOW));
    let Some(other) = other.filter(|o| **o != flow.name) else {
        return Ok(());
    };
    let refuse = |why: String| -> Result<()> {
        Err(Error::Definition {
            code: codes::TARGET_IN_USE,
            flow: flow.name.clone(),
            message: format!(
                "{} is also written by flow `{other}`, and flows sharing a target share its state: {why}. Make the two definitions agree, give this flow a target of its own, or drop {} and {} to start over",
                flow.target,
                flow.target,
                flow.state_ident()
            ),
        })
    };
    let recorded = |p: &str| marker.as_ref().is_some_and(|m| m.contains_key(p));
    // This flow's kind, or the other's as its snapshots record it.
    let alone = crate::core::flow::writes_alone(flow)
        .or(recorded(PROP_SNAPSHOT_VERSION).then_some(crate::core::flow::FROM_SNAPSHOT_ALONE))
        .or(recorded(PROP_SNAPSHOT_CUTS).then_some(crate::core::flow::CUTS_ALONE));
    if let Some(why) = alone {
        return refuse(format!("{why} writes its target alone"));
    }
    // The keys and the sequence keep Spark's codes (a second pipeline
    // with other keys is KEY_SCHEMA_DRIFT there too), said of both flows.
    state_table::check(flow, state.metadata.current_schema())
        .and_then(|()| check_keys(flow, &target.metadata))
        .map_err(|e| Error::State {
            code: e.code(),
            message: format!(
                "{} is also written by flow `{other}`, and flows sharing a target share its state, so they must have the same keys and sequence: {e}",
                flow.target
            ),
        })?;
    if flow.keeps_history() {
        if !matches!(state_table::evolution(flow, &state.metadata), Ok(None)) {
            return refuse("history flows (SCD Type 2, ignore_null_updates) must select the same columns, of the same types (the state keeps every change's values)".into());
        }
        if let Some(m) = &marker {
            let now = target.metadata.current_schema();
            let folded = recorded_folding(flow, m, our_latest_schema(&target.metadata), now)?;
            if folded != Folding::of(flow) {
                return refuse("history flows must track the same columns (track_history_column_list) and keep the same columns on nulls (ignore_null_updates_column_list)".into());
            }
        }
    }
    if repartition(flow, &target.metadata, target.metadata.current_schema())?.is_some() {
        return refuse(format!(
            "they must declare the same partition_by (the target is partitioned by {})",
            render_spec(
                target.metadata.default_partition_spec(),
                target.metadata.current_schema()
            )
        ));
    }
    let props = target.metadata.properties();
    if let Some((k, v)) = flow
        .config
        .table_properties
        .iter()
        .find(|(k, v)| props.get(*k) != Some(*v))
    {
        return refuse(format!(
            "they must set the same table_properties (`{k}` is {} on the target, `{v}` in this definition)",
            props
                .get(k)
                .map_or("unset".to_string(), |c| format!("`{c}`"))
        ));
    }
    Ok(())
}

/// The target's keys (its identifier fields) against the definition's.
fn check_keys(flow: &Flow, meta: &TableMetadata) -> Result<()> {
    let table = meta.current_schema();
    let mut keys: Vec<String> = table
        .identifier_field_ids()
        .filter_map(|id| table.field_by_id(id).map(|f| f.name.clone()))
        .collect();
    keys.sort();
    // SCD Type 2 targets declare no identifier fields (a key has many versions).
    let mut want: Vec<String> = flow
        .target_schema
        .identifier_field_ids()
        .filter_map(|id| flow.target_schema.field_by_id(id).map(|f| f.name.clone()))
        .collect();
    want.sort();
    if keys != want {
        return Err(Error::State {
            code: codes::KEY_SCHEMA_DRIFT,
            message: format!(
                "flow `{}`: the keys are [{}] but the existing target {} is keyed on [{}]; to rebuild the target and its state with the new keys run `autocdc refresh --full {}`",
                flow.name,
                want.join(", "),
                flow.target,
                keys.join(", "),
                flow.name
            ),
        });
    }
    Ok(())
}

/// A change `evolve` refuses, as the definition error it is.
fn refused(flow: &Flow, table: &str, r: Refusal) -> Error {
    Error::State {
        code: codes::SCHEMA_DRIFT,
        message: format!(
            "flow `{}`: {r} (in {table}); change the flow back, or rebuild the target and its state with `autocdc refresh --full {}`",
            flow.name, flow.name
        ),
    }
}

/// The schema the target moves to with the definition, if it differs: see
/// `evolve`. SCD Type 2 refuses to drop a tracked column: the versions it
/// split would have to merge, and the state would no longer hold its values
/// to re-fold them.
fn target_evolution(flow: &Flow, meta: &TableMetadata) -> Result<Option<Evolution>> {
    let mut fixed: Vec<String> = flow
        .key_idx
        .iter()
        .chain(&flow.seq_idx)
        .map(|&c| flow.column_name(c).to_string())
        .collect();
    if flow.scd2 {
        fixed.extend([START_AT.to_string(), END_AT.to_string()]);
    }
    let rules = Rules {
        renames: flow.renames(),
        // A flow that keeps history (SCD Type 2, ignore_null_updates)
        // rewrites rows from its state, which holds only the selected
        // columns: a column it no longer selects is dropped, as before.
        keep_unselected: !flow.keeps_history(),
        drop: flow.config.drop_columns.clone(),
        fixed,
        partition_sources: meta
            .partition_specs_iter()
            .flat_map(|s| s.fields().iter().map(|f| f.source_id))
            .collect(),
    };
    let target = flow.target.to_string();
    let evo = evolve::evolve(
        meta.current_schema(),
        &flow.target_schema,
        meta.last_column_id(),
        &rules,
    )
    .map_err(|r| refused(flow, &target, r))?;
    let (Some(e), true) = (&evo, flow.scd2) else {
        return Ok(evo);
    };
    let (Some(marker), _) = our_latest(meta) else {
        return Ok(evo);
    };
    let now = meta.current_schema();
    let was = our_latest_schema(meta);
    // Without the property (earlier versions) every value column was tracked.
    let tracked: Option<Vec<String>> = marker.get(PROP_TRACK_HISTORY).map(|json| {
        serde_json::from_str::<Vec<String>>(json)
            .unwrap_or_default()
            .iter()
            .filter_map(|n| follow(n, was, now))
            .collect()
    });
    if let Some(d) = e
        .dropped()
        .find(|d| tracked.as_ref().is_none_or(|t| t.iter().any(|n| n == d)))
    {
        return Err(refused(
            flow,
            &target,
            Refusal {
                column: d.to_string(),
                rule: "SCD Type 2 history tracks it, so dropping it would merge the versions it split; untrack it first (track_history_except_column_list, which re-folds the history from the state), then drop it".into(),
            },
        ));
    }
    Ok(evo)
}

/// The partition spec the target moves to with the definition, when its
/// default spec partitions otherwise: the definition's transforms over the
/// columns of `schema` (the target's, once evolved), by name. A field keeps
/// the id an older spec gave its source and transform (Iceberg's rule); a
/// new one takes the next after `last-partition-id`.
fn repartition(
    flow: &Flow,
    meta: &TableMetadata,
    schema: &Schema,
) -> Result<Option<UnboundPartitionSpec>> {
    let have = render_spec(meta.default_partition_spec(), schema);
    let want = render_spec(&flow.partition_spec, &flow.target_schema);
    if have == want {
        return Ok(None);
    }
    let refused = |why: String| Error::State {
        code: codes::PARTITION_DRIFT,
        message: format!(
            "flow `{}`: partition_by {want} cannot partition {} (now {have}): {why}",
            flow.name, flow.target
        ),
    };
    let known: HashMap<(i32, String), i32> = meta
        .partition_specs_iter()
        .flat_map(|s| s.fields())
        .map(|f| ((f.source_id, f.transform.to_string()), f.field_id))
        .collect();
    let mut next = meta.last_partition_id();
    let mut fields = Vec::new();
    for f in flow.partition_spec.fields() {
        let name = flow
            .target_schema
            .field_by_id(f.source_id)
            .map_or("", |c| c.name.as_str());
        let col = schema
            .field_by_name(name)
            .ok_or_else(|| refused(format!("the target has no column `{name}`")))?;
        let field_id = *known
            .get(&(col.id, f.transform.to_string()))
            .unwrap_or_else(|| {
                next += 1;
                &next
            });
        fields.push(UnboundPartitionField {
            source_id: col.id,
            field_id: Some(field_id),
            name: f.name.clone(),
            transform: f.transform,
        });
    }
    let spec = UnboundPartitionSpec::builder()
        .add_partition_fields(fields)
        .map_err(|e| refused(e.message().to_string()))?
        .build();
    // Bound now, so a spec the table cannot take fails before anything changes.
    PartitionSpecBuilder::new_from_unbound(spec.clone(), Arc::new(schema.clone()))
        .and_then(|b| b.build())
        .map_err(|e| refused(e.message().to_string()))?;
    Ok(Some(spec))
}

pub(super) fn render_spec(spec: &PartitionSpec, schema: &Schema) -> String {
    let fields: Vec<String> = spec
        .fields()
        .iter()
        .map(|f| {
            let col = schema
                .field_by_id(f.source_id)
                .map(|c| c.name.clone())
                .unwrap_or_else(|| format!("#{}", f.source_id));
            format!("{}({col})", f.transform)
        })
        .collect();
    format!("[{}]", fields.join(", "))
}

/// Moves `table` to the evolved schema: one metadata commit, which fails
/// (nothing changed) when the table's schema moved meanwhile.
pub(super) async fn evolve_table(
    flow: &Flow,
    catalog: &dyn Catalog,
    table: TableState,
    e: Evolution,
) -> Result<TableState> {
    let requirements = vec![
        iceberg::TableRequirement::UuidMatch {
            uuid: table.metadata.uuid(),
        },
        iceberg::TableRequirement::CurrentSchemaIdMatch {
            current_schema_id: table.metadata.current_schema_id(),
        },
        iceberg::TableRequirement::LastAssignedFieldIdMatch {
            last_assigned_field_id: table.metadata.last_column_id(),
        },
    ];
    let updates = vec![
        iceberg::TableUpdate::AddSchema {
            schema: e.schema.clone(),
        },
        iceberg::TableUpdate::SetCurrentSchema { schema_id: -1 },
    ];
    let t = catalog.commit(&table, updates, requirements).await?;
    tracing::info!(
        flow = %flow.name,
        table = %t.ident,
        schema_id = t.metadata.current_schema_id(),
        changes = %e.describe(),
        "schema evolved"
    );
    Ok(t)
}

/// Makes `spec` the target's default partition spec: one metadata commit
/// (`AddSpec` + `SetDefaultSpec`; an existing equal spec is reused), which
/// fails, nothing changed, when the table's specs moved meanwhile. Files
/// keep the spec they were written with; new ones take this one.
pub(super) async fn repartition_table(
    flow: &Flow,
    catalog: &dyn Catalog,
    table: TableState,
    spec: UnboundPartitionSpec,
) -> Result<TableState> {
    let requirements = vec![
        iceberg::TableRequirement::UuidMatch {
            uuid: table.metadata.uuid(),
        },
        iceberg::TableRequirement::DefaultSpecIdMatch {
            default_spec_id: table.metadata.default_partition_spec_id(),
        },
        iceberg::TableRequirement::LastAssignedPartitionIdMatch {
            last_assigned_partition_id: table.metadata.last_partition_id(),
        },
    ];
    let updates = vec![
        iceberg::TableUpdate::AddSpec { spec },
        iceberg::TableUpdate::SetDefaultSpec { spec_id: -1 },
    ];
    let t = catalog.commit(&table, updates, requirements).await?;
    tracing::info!(
        flow = %flow.name,
        table = %t.ident,
        spec_id = t.metadata.default_partition_spec_id(),
        spec = %render_spec(t.metadata.default_partition_spec(), t.metadata.current_schema()),
        "partition spec evolved"
    );
    Ok(t)
}

/// Sets the flow's `table_properties` a table lacks or has otherwise (one
/// commit, only when something differs).
pub(super) async fn ensure_properties(
    flow: &Flow,
    catalog: &dyn Catalog,
    t: TableState,
) -> Result<TableState> {
    let updates: HashMap<String, String> = flow
        .config
        .table_properties
        .iter()
        .filter(|(k, v)| t.metadata.properties().get(*k) != Some(*v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if updates.is_empty() {
        return Ok(t);
    }
    set_properties(catalog, &t, updates).await
}

/// One commit setting `updates` on the table (whatever its snapshots).
pub(super) async fn set_properties(
    catalog: &dyn Catalog,
    t: &TableState,
    updates: HashMap<String, String>,
) -> Result<TableState> {
    catalog
        .commit(
            t,
            vec![iceberg::TableUpdate::SetProperties { updates }],
            vec![iceberg::TableRequirement::UuidMatch {
                uuid: t.metadata.uuid(),
            }],
        )
        .await
}

impl Engine {
    /// Whether the existing target (if any) accepts this definition: the
    /// drift checks of `open`, without creating tables or reading the state.
    pub async fn check_target(flow: &Flow, catalog: &dyn Catalog) -> Result<()> {
        match catalog.load_table(&flow.target).await? {
            Some(t) => {
                let state = catalog.load_table(&flow.state_ident()).await?;
                check_drift(flow, &t, state.as_ref()).map(|_| ())
            }
            None => Ok(()),
        }
    }
}
