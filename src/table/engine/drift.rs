//! An existing target (and its state table) against the flow's definition:
//! what is refused (another flow's table, changed keys, a change `evolve`
//! refuses), and the schema, partition spec and table properties the
//! tables move to, each one metadata commit.

use std::collections::HashMap;
use std::sync::Arc;

use iceberg::spec::{
    PartitionSpec, PartitionSpecBuilder, Schema, TableMetadata, UnboundPartitionField,
    UnboundPartitionSpec,
};

use super::Engine;
use super::marker::{PROP_FLOW, PROP_TRACK_HISTORY, follow, our_latest, our_latest_schema};
use crate::core::evolve::{self, Evolution, Refusal, Rules};
use crate::core::flow::{END_AT, Flow, START_AT};
use crate::error::{Error, Result, codes};
use crate::table::catalog::{Catalog, TableState};
use crate::table::maintain::ancestors;
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
    check_owner(flow, target, state)?;
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

/// One flow writes a target: the flow that made its state table (that
/// table's `autocdc.flow` property, else the flow of the target's latest
/// autocdc snapshot) must be this one. Two flows on one table would each
/// resolve against their own view of the state and undo each other's rows.
/// A target without a state table is adopted (its rows are another writer's).
fn check_owner(flow: &Flow, target: &TableState, state: Option<&TableState>) -> Result<()> {
    let Some(state) = state else {
        return Ok(());
    };
    let owner = match state.metadata.properties().get(PROP_FLOW) {
        Some(o) => Some((
            o.clone(),
            format!("the {PROP_FLOW} property of {}", state.ident),
        )),
        None => ancestors(&target.metadata, target.metadata.current_snapshot_id())
            .take(MAX_OWNER_WALK)
            .find_map(|s| s.summary().additional_properties.get(PROP_FLOW).cloned())
            .map(|o| (o, "its latest autocdc snapshot".to_string())),
    };
    match owner {
        Some((owner, why)) if owner != flow.name => Err(Error::Definition {
            code: codes::TARGET_IN_USE,
            flow: flow.name.clone(),
            message: format!(
                "{} is written by flow `{owner}` ({why}); two flows writing one table undo each other's changes. Name this flow `{owner}`, give it a target of its own, or drop {} and {} to start over",
                flow.target,
                flow.target,
                flow.state_ident()
            ),
        }),
        _ => Ok(()),
    }
}

/// How far back `check_owner` looks for the latest autocdc snapshot (other
/// writers' snapshots can follow it; a long run of them is not autocdc's table).
const MAX_OWNER_WALK: usize = 1000;

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
    let (Some(marker), _) = our_latest(meta, &flow.name) else {
        return Ok(evo);
    };
    let now = meta.current_schema();
    let was = our_latest_schema(meta, &flow.name);
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
