//! Opening a flow: the target and its state table loaded (checked against
//! the definition and evolved) or created, and the state recovered as of the
//! state snapshot the target's latest autocdc snapshot names; and what the
//! target's metadata alone tells (its logs and committed offsets).

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::RecordBatch;
use futures::{StreamExt, TryStreamExt};
use iceberg::arrow::schema_to_arrow_schema;
use iceberg::spec::{Schema, UnboundPartitionSpec};

use super::Engine;
use super::drift::{
    check_drift, ensure_properties, evolve_table, render_spec, repartition_table, set_properties,
};
use super::marker::{
    PROP_FLOW, PROP_GENERATION, PROP_INPUT_OFFSET, PROP_SNAPSHOT_CUTS, PROP_SNAPSHOT_VERSION,
    PROP_STATE_COMPLETE, PROP_STATE_SNAPSHOT, PROP_TRUNCATED_BELOW, cuts_from_json, our_latest,
    our_latest_schema, recorded_folding, seq_from_json,
};
use crate::core::flow::Flow;
use crate::core::history::Folding;
use crate::core::offsets::{self, LogRef, PROP_INPUT_OFFSETS};
use crate::core::resolve::Codec;
use crate::error::{Error, Result, codes};
use crate::fault::{FaultPoint, Faults};
use crate::table::catalog::{Catalog, TableState};
use crate::table::compact;
use crate::table::flow_state::FlowState;
use crate::table::state_table;
use crate::table::write::{self, Partitioner};

impl Engine {
    /// Opens the flow: creates the target and the state table when missing,
    /// then recovers the state as of the target's latest autocdc commit.
    pub async fn open(
        flow: Flow,
        catalog: Arc<dyn Catalog>,
        faults: Arc<Faults>,
    ) -> Result<Engine> {
        Engine::open_for_log(flow, catalog, faults, None).await
    }

    /// Opens the flow for commits from one ingest log: the input offset read
    /// and recorded is that log's entry of `autocdc.input-offsets`.
    pub async fn open_for_log(
        flow: Flow,
        catalog: Arc<dyn Catalog>,
        faults: Arc<Faults>,
        log: Option<LogRef>,
    ) -> Result<Engine> {
        let codec = Codec::new(&flow)?;
        let mut evolved = Vec::new();
        let (mut target, state_tbl) =
            open_tables(&flow, catalog.as_ref(), &faults, &mut evolved).await?;
        let (marker, foreign) = our_latest(&target.metadata);
        let num =
            |m: &HashMap<String, String>, k: &str| m.get(k).and_then(|v| v.parse::<i64>().ok());
        let state_snapshot = marker.as_ref().and_then(|m| num(m, PROP_STATE_SNAPSHOT));
        let generation = marker
            .as_ref()
            .and_then(|m| num(m, PROP_GENERATION))
            .unwrap_or(0);
        let offsets = offsets::parse(marker.as_ref().and_then(|m| m.get(PROP_INPUT_OFFSETS)))?;
        let input_offset = offsets::offset_for(
            &offsets,
            marker.as_ref().and_then(|m| num(m, PROP_INPUT_OFFSET)),
            log.as_ref(),
        );
        if let Some(l) = log
            .as_ref()
            .filter(|l| l.adopt && !offsets.contains_key(&l.id))
        {
            target = adopt_log(catalog.as_ref(), target, &l.id).await?;
        }
        let mut state = FlowState::new(&flow)?;
        let mut state_log_rows = 0;
        if let Some(sid) = state_snapshot {
            let rows = read_state(&flow, catalog.as_ref(), &state_tbl, sid).await?;
            state_log_rows = state.load(&flow, &codec, &rows)?;
        }
        if let Some(json) = marker.as_ref().and_then(|m| m.get(PROP_SNAPSHOT_CUTS)) {
            state.set_cuts(cuts_from_json(&flow, &codec, json)?);
        }
        let partitioner = Partitioner::new(
            target.metadata.default_partition_spec().clone(),
            target.metadata.current_schema(),
        )?
        .map(Arc::new);
        let key_ids: Vec<i32> = target
            .metadata
            .current_schema()
            .identifier_field_ids()
            .collect();
        let partitioned_by_keys = partitioner
            .as_ref()
            .is_some_and(|p| p.source_ids.iter().all(|id| key_ids.contains(id)));
        let floor = match marker.as_ref().and_then(|m| m.get(PROP_TRUNCATED_BELOW)) {
            Some(json) => Some(seq_from_json(&flow, &codec, PROP_TRUNCATED_BELOW, json)?),
            None => None,
        };
        let snapshot_version = marker.as_ref().and_then(|m| num(m, PROP_SNAPSHOT_VERSION));
        let folded_with = match (&marker, state_snapshot) {
            (Some(m), Some(_)) if flow.keeps_history() => recorded_folding(
                &flow,
                m,
                our_latest_schema(&target.metadata),
                target.metadata.current_schema(),
            )?,
            _ => Folding::of(&flow),
        };
        let mut engine = Engine {
            evolved,
            folded_with,
            snapshot_version,
            floor,
            partitioner,
            partitioned_by_keys,
            file_partitions: None,
            gone_files: 0,
            codec,
            catalog,
            faults,
            state_complete: !foreign
                && marker
                    .as_ref()
                    .and_then(|m| m.get(PROP_STATE_COMPLETE))
                    .is_none_or(|v| v != "false"),
            target,
            state_tbl,
            state_snapshot,
            state,
            generation,
            input_offset,
            log,
            offsets,
            state_log_rows,
            poisoned: false,
            lease: None,
            flow,
        };
        if foreign || !engine.state_complete {
            // Another writer has committed to the target: a compaction may
            // have moved rows out of the files the state points into. Rows in
            // files no longer live are removed by key (equality delete).
            engine.load_file_partitions().await?;
            let live = engine.file_partitions.as_ref().expect("loaded");
            engine.gone_files = engine.state.files_mut().mark_gone(|p| live.contains_key(p));
        }
        Ok(engine)
    }

    /// This flow's engine opened afresh from the catalog.
    pub(super) async fn reopen(&self) -> Result<Engine> {
        let mut fresh = Engine::open_for_log(
            self.flow.clone(),
            self.catalog.clone(),
            self.faults.clone(),
            self.log.clone(),
        )
        .await?;
        fresh.lease = self.lease.clone();
        Ok(fresh)
    }

    /// The ingest logs whose offsets the flow's target records (none without
    /// a target).
    pub async fn recorded_logs(flow: &Flow, catalog: &dyn Catalog) -> Result<Vec<String>> {
        let Some(t) = catalog.load_table(&flow.target).await? else {
            return Ok(Vec::new());
        };
        let (marker, _) = our_latest(&t.metadata);
        let offsets = offsets::parse(marker.as_ref().and_then(|m| m.get(PROP_INPUT_OFFSETS)))?;
        let mut logs: Vec<String> = offsets.into_keys().collect();
        logs.extend(offsets::adopted(
            t.metadata.properties().get(offsets::PROP_ADOPTED_LOGS),
        ));
        Ok(logs)
    }

    /// The offset of `log` the target records, and its current snapshot,
    /// read from the target's metadata alone (no state): what an instance
    /// that does not commit a flow reports as committed.
    pub async fn committed_offset(
        flow: &Flow,
        catalog: &dyn Catalog,
        log: &LogRef,
    ) -> Result<(i64, Option<i64>)> {
        let Some(t) = catalog.load_table(&flow.target).await? else {
            return Ok((0, None));
        };
        let (marker, _) = our_latest(&t.metadata);
        let offsets = offsets::parse(marker.as_ref().and_then(|m| m.get(PROP_INPUT_OFFSETS)))?;
        let single = marker
            .as_ref()
            .and_then(|m| m.get(PROP_INPUT_OFFSET))
            .and_then(|v| v.parse::<i64>().ok());
        Ok((
            offsets::offset_for(&offsets, single, Some(log)),
            t.metadata.current_snapshot_id(),
        ))
    }
}

/// The target and the state table, each created when missing (the target
/// checked against the definition when it exists).
async fn open_tables(
    flow: &Flow,
    catalog: &dyn Catalog,
    faults: &Faults,
    evolved: &mut Vec<String>,
) -> Result<(TableState, TableState)> {
    let state_ident = flow.state_ident();
    // The target first: a commit writes the state table, then the target
    // naming the new state snapshot, so a state table read after the
    // target has every snapshot the target names, even while another
    // instance commits the flow. Read the other way round, a commit
    // between the two reads gave a target naming a state snapshot the
    // state read did not have (STATE_SNAPSHOT_MISSING).
    let target = catalog.load_table(&flow.target).await?;
    let mut state_tbl = catalog.load_table(&state_ident).await?;
    let target = match target {
        Some(mut t) => {
            // Both checked before either changes; the state first, so a
            // crash between the two commits is finished by the next open.
            let evolutions = check_drift(flow, &t, state_tbl.as_ref())?;
            if let Some(e) = evolutions.state
                && let Some(s) = state_tbl.take()
            {
                evolved.push(format!("{}: {}", s.ident, e.describe()));
                state_tbl = Some(evolve_table(flow, catalog, s, e).await?);
            }
            faults.hit(FaultPoint::AfterStateSchema)?;
            if let Some(e) = evolutions.target {
                evolved.push(format!("{}: {}", t.ident, e.describe()));
                t = evolve_table(flow, catalog, t, e).await?;
            }
            if let Some(spec) = evolutions.spec {
                t = repartition_table(flow, catalog, t, spec).await?;
                let m = &t.metadata;
                evolved.push(format!(
                    "{}: partition spec {} {}",
                    t.ident,
                    m.default_partition_spec_id(),
                    render_spec(m.default_partition_spec(), m.current_schema())
                ));
            }
            ensure_properties(flow, catalog, t).await?
        }
        None => {
            if state_tbl.take().is_some() {
                // The target was dropped without its state, which describes
                // rows that are gone (and may be of another definition).
                tracing::warn!(
                    flow = %flow.name,
                    state = %state_ident,
                    "the target is gone but its state table is not: dropping the state"
                );
                catalog.drop_table(&state_ident).await?;
            }
            create_or_load(
                catalog,
                &flow.target,
                flow.target_schema.clone(),
                flow.partition_spec.clone().into_unbound(),
                target_properties(flow),
            )
            .await?
        }
    };
    let state_tbl = match state_tbl {
        Some(t) => ensure_properties(flow, catalog, t).await?,
        None => {
            let mut props = crate::table::properties::created_table_properties();
            props.extend(flow.config.table_properties.clone());
            props.insert(PROP_FLOW.to_string(), flow.name.clone());
            create_or_load(
                catalog,
                &state_ident,
                state_table::schema(flow)?,
                UnboundPartitionSpec::builder().build(),
                props,
            )
            .await?
        }
    };
    Ok((target, state_tbl))
}

fn target_properties(flow: &Flow) -> HashMap<String, String> {
    let mut props = crate::table::properties::created_table_properties();
    props.extend([
        ("write.delete.mode".to_string(), "merge-on-read".to_string()),
        ("write.update.mode".to_string(), "merge-on-read".to_string()),
        ("write.merge.mode".to_string(), "merge-on-read".to_string()),
        ("write.format.default".to_string(), "parquet".to_string()),
        (PROP_FLOW.to_string(), flow.name.clone()),
    ]);
    props.extend(flow.config.table_properties.clone());
    props
}

/// Records `log` in the target's `autocdc.adopted-logs` (one commit, only
/// when it is not there): from now on what the log holds is this target's,
/// so records acknowledged before the first commit are replayed into it
/// after a restart, and a log it never adopted that holds records is
/// refused (`LogFactory::identity`). Instances opening the flow at once
/// each try; a conflict reloads and looks again.
async fn adopt_log(catalog: &dyn Catalog, mut t: TableState, log: &str) -> Result<TableState> {
    const ATTEMPTS: usize = 8;
    for _ in 0..ATTEMPTS {
        let Some(json) =
            offsets::adopt(t.metadata.properties().get(offsets::PROP_ADOPTED_LOGS), log)
        else {
            return Ok(t);
        };
        let updates = HashMap::from([(offsets::PROP_ADOPTED_LOGS.to_string(), json)]);
        match set_properties(catalog, &t, updates).await {
            Ok(done) => {
                tracing::info!(table = %done.ident, log, "log adopted");
                return Ok(done);
            }
            Err(Error::CommitConflict(_)) => {
                t = catalog.load_table(&t.ident).await?.ok_or_else(|| {
                    Error::CommitConflict(format!("table {} went while adopting {log}", t.ident))
                })?;
            }
            Err(e) => return Err(e),
        }
    }
    Err(Error::CommitConflict(format!(
        "table {}: adopting log {log} conflicted {ATTEMPTS} times",
        t.ident
    )))
}

/// Creates a table, or loads it when another writer created it first: two
/// instances starting one flow on a new catalog (a shared log) race here,
/// and the table the winner made is the one both use.
async fn create_or_load(
    catalog: &dyn Catalog,
    ident: &iceberg::TableIdent,
    schema: Schema,
    spec: UnboundPartitionSpec,
    properties: HashMap<String, String>,
) -> Result<TableState> {
    match catalog.create_table(ident, schema, spec, properties).await {
        Err(Error::CommitConflict(e)) => match catalog.load_table(ident).await? {
            Some(t) => Ok(t),
            None => Err(Error::CommitConflict(e)),
        },
        r => r,
    }
}

/// State files read at once when a flow opens.
const STATE_FILES_IN_FLIGHT: usize = 8;

/// The state table's rows as of snapshot `sid` (the one the target names).
async fn read_state(
    flow: &Flow,
    catalog: &dyn Catalog,
    state_tbl: &TableState,
    sid: i64,
) -> Result<Vec<RecordBatch>> {
    let Some(snap) = state_tbl.metadata.snapshot_by_id(sid) else {
        return Err(Error::State {
            code: codes::STATE_SNAPSHOT_MISSING,
            message: format!(
                "flow `{}`: the target names state snapshot {sid}, which {} does not have; the state table was removed or expired. Run `autocdc refresh --full {}`",
                flow.name,
                flow.state_ident(),
                flow.name
            ),
        });
    };
    // The state table is only appended to and replaced whole: its rows are
    // its data files' rows. They are read here rather than with
    // iceberg-rust's scan, which takes key columns named like its metadata
    // columns (`pos`, `file_path`) for those.
    let file_io = catalog.file_io();
    let inv = compact::inventory_of(file_io, state_tbl, snap).await?;
    if !inv.pos_deletes.is_empty() || !inv.eq_deletes.is_empty() {
        return Err(Error::State {
            code: codes::STATE_SCHEMA,
            message: format!(
                "flow `{}`: state snapshot {sid} of {} has delete files, which autocdc never writes there; another writer changed it. Run `autocdc refresh --full {}`",
                flow.name,
                flow.state_ident(),
                flow.name
            ),
        });
    }
    let batches: Vec<RecordBatch> = futures::stream::iter(inv.data)
        .map(|e| {
            let io = file_io.clone();
            async move { compact::read_parquet(&io, e.file.file_path()).await }
        })
        .buffered(STATE_FILES_IN_FLIGHT)
        .try_collect::<Vec<_>>()
        .await?
        .into_iter()
        .flatten()
        .collect();
    // Each file in its own schema: into the current one by field id (a
    // column evolved since is renamed, widened, or null when added).
    let now = state_tbl.metadata.current_schema();
    let arrow = Arc::new(schema_to_arrow_schema(now)?);
    batches
        .iter()
        .map(|b| {
            write::to_schema(b, now, &arrow).map_err(|what| Error::State {
                code: codes::STATE_SCHEMA,
                message: format!("flow `{}`: the state table's {what}", flow.name),
            })
        })
        .collect()
}
