//! Flows started, defined (`PUT`), changed, deleted and stopped; `add_columns`;
//! other instances' definitions followed. One lock serializes them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, watch};

use super::Service;
use super::committer;
use super::record::decode_or_set_aside;
use super::runtime::{COMMIT_BUCKETS, Committed, FlowRuntime, Inner, Pending, Recent};
use super::status::FlowStatus;
use crate::core::flow::{Flow, FlowConfig};
use crate::core::offsets::LogRef;
use crate::error::{Result, codes};
use crate::table::engine::Engine;

impl Service {
    /// Applies the definitions other instances write, until `stop`; returns
    /// at once when no other instance can write them (the local store).
    pub async fn follow_definitions(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let from = self
            .loaded_revision
            .load(std::sync::atomic::Ordering::SeqCst);
        let mut changes = match self.definitions().watch(from).await {
            Ok(Some(c)) => c,
            Ok(None) => return,
            Err(e) => {
                tracing::error!(error = %e, "definitions_watch_failed");
                return;
            }
        };
        use futures::StreamExt;
        loop {
            let change = tokio::select! {
                c = changes.next() => c,
                _ = stop.wait_for(|s| *s) => return,
            };
            match change {
                Some(Ok(c)) => self.apply_definition(c).await,
                Some(Err(e)) => tracing::warn!(error = %e, "definitions_watch_failed"),
                None => return,
            }
        }
    }

    /// Creates or replaces a flow definition and persists it in `data_dir`.
    /// Transactional: a definition that is refused (invalid, another flow's
    /// target, drift from the existing target) changes nothing on disk or in
    /// memory, and the running flow keeps running.
    pub async fn put_flow(self: &Arc<Self>, cfg: FlowConfig) -> Result<Arc<FlowRuntime>> {
        let flow = self.with_target_columns(Flow::new(cfg.clone())?).await?;
        // Flows sharing a target must agree on what its state means.
        if let Some(other) = self
            .flows()
            .into_iter()
            .find(|rt| rt.flow.name != flow.name && rt.flow.target == flow.target)
        {
            crate::core::flow::check_shared(&other.flow, &flow)?;
        }
        // The existing target refuses a drifted definition here, before the
        // running flow is touched (without reading the state a second time).
        Engine::check_target(&flow, self.catalog.as_ref()).await?;
        let mut defining = self.defining.lock().await;
        let old = self.flow(&flow.name).ok();
        if let Some(old) = &old {
            self.stop_flow(old).await;
        }
        let stored = match self.start_flow_defined(flow.clone(), cfg.clone()).await {
            Ok(rt) => self.definitions().put(&cfg).await.map(|rev| (rt, rev)),
            Err(e) => Err(e),
        };
        match stored {
            Ok((rt, revision)) => {
                defining.insert(flow.name.clone(), revision);
                Ok(rt)
            }
            Err(e) => {
                // Put the previous flow back (or none).
                if let Ok(new) = self.flow(&flow.name) {
                    self.stop_flow(&new).await;
                    self.flows
                        .write()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&flow.name);
                }
                if let Some(old) = old {
                    self.start_flow_defined(old.flow.clone(), old.defined.clone())
                        .await?;
                }
                Err(e)
            }
        }
    }

    /// Stops a flow (committing what is pending) and forgets its definition;
    /// the table and the log stay.
    pub async fn delete_flow(&self, name: &str) -> Result<()> {
        let mut defining = self.defining.lock().await;
        let rt = self.flow(name)?;
        let revision = self.definitions().remove(name).await?;
        defining.insert(name.to_string(), revision);
        self.forget_flow(&rt).await;
        Ok(())
    }

    /// Adds `columns` (inferred from a push to an `add_columns` flow) to the
    /// flow's definition: a definition change like `PUT /v1/flows/{flow}`
    /// (the target evolves before the push is logged). Columns another push
    /// added meanwhile are not added twice. The flow's runtime from now on.
    pub async fn add_columns(
        self: &Arc<Self>,
        rt: &FlowRuntime,
        columns: Vec<crate::core::flow::ColumnDef>,
    ) -> Result<Arc<FlowRuntime>> {
        let _one = self.adding_columns.lock().await;
        let current = self.flow(&rt.flow.name)?;
        let columns: Vec<_> = columns
            .into_iter()
            .filter(|c| current.flow.field_column(&c.name).is_none())
            .collect();
        if columns.is_empty() {
            return Ok(current);
        }
        let cfg = crate::service::infer::with_columns(&current.flow, &columns)?;
        let names: Vec<String> = columns
            .iter()
            .map(|c| format!("{} {}", c.name, c.ty))
            .collect();
        tracing::info!(flow = %rt.flow.name, columns = %names.join(", "), "columns added from input");
        self.put_flow(cfg).await
    }

    /// An `add_columns` flow with the columns its target has that the
    /// definition lacks (added from input earlier, maybe by another
    /// process): a restart, or a definition sent without them, keeps them
    /// rather than dropping them.
    pub(super) async fn with_target_columns(&self, flow: Flow) -> Result<Flow> {
        if flow.config.schema_evolution != crate::core::flow::SchemaEvolution::AddColumns {
            return Ok(flow);
        }
        let Some(t) = self.catalog.load_table(&flow.target).await? else {
            return Ok(flow);
        };
        let renamed: Vec<&str> = flow
            .config
            .columns
            .iter()
            .filter_map(|c| c.renamed_from.as_deref())
            .collect();
        let kept: Vec<crate::core::flow::ColumnDef> = t
            .metadata
            .current_schema()
            .as_struct()
            .fields()
            .iter()
            .filter(|f| {
                f.name != crate::core::flow::START_AT
                    && f.name != crate::core::flow::END_AT
                    && flow.field_column(&f.name).is_none()
                    && !renamed.contains(&f.name.as_str())
            })
            .filter_map(|f| {
                let ty = f.field_type.as_primitive_type()?.to_string();
                crate::core::flow::parse_type(&ty)?;
                Some(crate::core::flow::ColumnDef {
                    name: f.name.clone(),
                    ty,
                    required: false,
                    renamed_from: None,
                })
            })
            .collect();
        if kept.is_empty() {
            return Ok(flow);
        }
        let mut cfg = flow.config.clone();
        cfg.columns.extend(kept);
        Flow::new(cfg)
    }

    pub(super) async fn start_flow(self: &Arc<Self>, flow: Flow) -> Result<Arc<FlowRuntime>> {
        let defined = flow.config.clone();
        self.start_flow_defined(flow, defined).await
    }

    /// Starts `flow`, whose definition as stored is `defined`.
    pub(super) async fn start_flow_defined(
        self: &Arc<Self>,
        flow: Flow,
        defined: FlowConfig,
    ) -> Result<Arc<FlowRuntime>> {
        let flow = self.with_target_columns(flow).await?;
        let recorded = Engine::recorded_logs(&flow, self.catalog.as_ref()).await?;
        let id = match self.logs.identity(&flow.name, &recorded).await {
            // Another instance may have adopted the log, and taken pushes,
            // since the target was read: read it again before refusing.
            Err(e) if e.code() == codes::FOREIGN_LOG => {
                let recorded = Engine::recorded_logs(&flow, self.catalog.as_ref()).await?;
                self.logs.identity(&flow.name, &recorded).await?
            }
            r => r?,
        };
        let log_ref = LogRef {
            id,
            retention_ms: self.config.log_offsets_retention()?.as_millis() as i64,
            adopt: self.logs.adopts(),
        };
        let engine = Engine::open_for_log(
            flow.clone(),
            self.catalog.clone(),
            self.faults.clone(),
            Some(log_ref.clone()),
        )
        .await?;
        let summary = engine.summary();
        let committed = summary.input_offset;
        let log = self
            .logs
            .open(&flow.name, committed, flow.commit.max_log_bytes)
            .await?;
        // On a shared log the lease holder reads the stream when it takes
        // the flow (`catch_up`); an instance that does not hold it keeps
        // nothing pending.
        let shared = self.leases.get().is_some();
        let records = if shared {
            Vec::new()
        } else {
            log.replay(committed).await?
        };
        let mut pending = BTreeMap::new();
        let mut bytes_total = 0;
        let mut rows_total = 0;
        let mut snapshot_version = engine.snapshot_version();
        let dead = crate::service::dead_letter::DeadLetters::open(
            &self.flow_dir(&flow.name).join("dead-letters"),
            self.config.max_dead_letters,
        )?;
        for r in &records {
            let (batch, version) = decode_or_set_aside(&flow, &dead, r)?;
            rows_total += batch.num_rows() as u64;
            bytes_total += r.payload.len() as u64;
            snapshot_version = snapshot_version.max(version);
            pending.insert(
                r.offset,
                Pending {
                    batch,
                    bytes: r.payload.len() as u64,
                    version,
                },
            );
        }
        // Offsets released without a snapshot (batches that changed nothing)
        // are behind the first retained one.
        let applied = match records.first() {
            Some(r) => r.offset - 1,
            None if shared => committed,
            None => committed.max(log.stats().next_offset - 1),
        };
        let status = FlowStatus {
            committed_offset: committed,
            applied_offset: applied,
            pending_batches: pending.len(),
            pending_rows: rows_total,
            pending_bytes: bytes_total,
            state_keys: summary.keys,
            state_tombstones: summary.tombstones,
            snapshot_version,
            schema_id: engine.target().metadata.current_schema_id(),
            partition_spec_id: engine.target().metadata.default_partition_spec_id(),
            schema_evolutions: self
                .flow(&flow.name)
                .map(|rt| rt.status().schema_evolutions)
                .unwrap_or(0)
                + engine.evolved().len() as u64,
            ..Default::default()
        };
        let (committed_tx, _) = watch::channel(Committed {
            offset: applied,
            snapshot_id: engine.target().metadata.current_snapshot_id(),
        });
        let rt = Arc::new(FlowRuntime {
            flow: flow.clone(),
            defined,
            log,
            log_ref,
            inner: Mutex::new(Inner {
                pending,
                status,
                reset: false,
            }),
            wake: Notify::new(),
            committed: committed_tx,
            stop: watch::channel(false).0,
            commit_hist: Mutex::new([0; COMMIT_BUCKETS.len() + 1]),
            window: self.window,
            recent_commits: Recent::default(),
            recent_appends: Recent::default(),
            requested: applied.into(),
            task: Mutex::new(None),
            dead,
            maintain_requests: Mutex::new(Vec::new()),
            leases: self.leases.get().cloned(),
        });
        let task = tokio::spawn(committer::committer(
            rt.clone(),
            engine,
            self.catalog.clone(),
            self.faults.clone(),
            self.window,
            self.config.maintenance.schedule()?,
        ));
        *rt.task.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
        self.flows
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(flow.name.clone(), rt.clone());
        Ok(rt)
    }
}
