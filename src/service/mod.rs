//! The service core of `autocdc serve`, without HTTP: the flows of one
//! process, each with its ingest log, its pending batches and a committer
//! task that owns its engine.
//!
//! Path of a batch: `ingest` (validated, appended and fsync'd to the flow's
//! log, acknowledged with its offset) -> pending -> the committer drains the
//! contiguous run of pending offsets into one snapshot on the flow's
//! schedule -> the log is released through the committed offset.
//!
//! Invariants: nothing is acknowledged before it is in the log; the
//! committed offset only covers batches whose every predecessor is
//! committed too (pending is drained in offset order, without gaps); a
//! restart replays the log after the target's `autocdc.input-offset`.

mod committer;
pub mod dead_letter;
pub mod debezium;
pub mod definitions;
pub mod http;
pub mod infer;
mod ingest;
pub mod input;
pub mod lease;
mod lifecycle;
pub mod metrics;
pub mod nats_conn;
pub mod nats_log;
pub mod process;
mod record;
pub mod run;
mod runtime;
mod status;
pub mod traffic;
pub mod wal;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::config::ServerConfig;
use crate::core::flow::Flow;
use crate::error::{Error, Result};
use crate::fault::Faults;
use crate::service::definitions::{Definitions, LocalDefinitions};
use crate::service::wal::{LocalLogs, LogFactory};
use crate::table::catalog::Catalog;

pub use runtime::{Accepted, COMMIT_BUCKETS, Committed, FlowRuntime, MaintainRequest};
pub use status::{FlowStatus, MaintenanceStatus};

const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Flows opened at once when the service starts.
const START_AT_ONCE: usize = 16;

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// All flows of the process.
pub struct Service {
    pub config: ServerConfig,
    catalog: Arc<dyn Catalog>,
    faults: Arc<Faults>,
    data_dir: PathBuf,
    window: Duration,
    flows: RwLock<HashMap<String, Arc<FlowRuntime>>>,
    /// Opens each flow's ingest log (`LocalLogs` unless given).
    logs: Arc<dyn LogFactory>,
    ready: std::sync::atomic::AtomicBool,
    /// Held while columns inferred from a push are added to a flow, so two
    /// pushes with one new field add it once.
    adding_columns: tokio::sync::Mutex<()>,
    /// Client connections (the HTTP layer counts them here).
    pub connections: crate::service::traffic::Connections,
    /// Requests served, per route (the HTTP layer counts them here).
    pub requests: crate::service::traffic::RequestStats,
    /// On a shared log: the flows' leases (set before `start`).
    leases: std::sync::OnceLock<Arc<lease::Leases>>,
    /// Where definitions made over HTTP are kept (`flow.json` files in
    /// `data_dir` unless set before `start`).
    definitions: std::sync::OnceLock<Arc<dyn Definitions>>,
    /// Held while a definition changes (`PUT`, `DELETE`, or one another
    /// instance made); the revision of each flow's definition applied.
    defining: tokio::sync::Mutex<HashMap<String, u64>>,
    /// The definitions' revision `start` loaded.
    loaded_revision: std::sync::atomic::AtomicU64,
    /// What `POST /v1/debezium` skipped, by kind, since the start.
    pub debezium_skipped: std::sync::Mutex<debezium::Skipped>,
}

impl Service {
    /// The service with a `LocalLog` per flow under `data_dir`.
    pub fn new(
        config: ServerConfig,
        catalog: Arc<dyn Catalog>,
        faults: Arc<Faults>,
    ) -> Result<Arc<Service>> {
        let logs = Arc::new(LocalLogs::new(
            Path::new(&config.data_dir).join("flows"),
            faults.clone(),
        ));
        Service::with_logs(config, catalog, faults, logs)
    }

    /// The service with each flow's ingest log opened by `logs`.
    pub fn with_logs(
        config: ServerConfig,
        catalog: Arc<dyn Catalog>,
        faults: Arc<Faults>,
        logs: Arc<dyn LogFactory>,
    ) -> Result<Arc<Service>> {
        let data_dir = PathBuf::from(&config.data_dir);
        std::fs::create_dir_all(data_dir.join("flows")).map_err(|e| {
            Error::Config(format!(
                "server.data_dir = {}: cannot create it: {e}",
                data_dir.display()
            ))
        })?;
        config.request_timeout()?;
        config.header_read_timeout()?;
        config.shutdown_grace()?;
        Ok(Arc::new(Service {
            window: config.idempotency_window()?,
            config,
            catalog,
            faults,
            data_dir,
            flows: RwLock::new(HashMap::new()),
            logs,
            ready: false.into(),
            adding_columns: Default::default(),
            connections: Default::default(),
            requests: Default::default(),
            leases: Default::default(),
            definitions: Default::default(),
            defining: Default::default(),
            loaded_revision: Default::default(),
            debezium_skipped: Default::default(),
        }))
    }

    /// Runs the flows under leases (a shared log): only the holder of a
    /// flow's lease commits it. Set before `start`.
    pub fn set_leases(&self, leases: Arc<lease::Leases>) {
        let _ = self.leases.set(leases);
    }

    pub fn leases(&self) -> Option<&Arc<lease::Leases>> {
        self.leases.get()
    }

    /// Keeps definitions made over HTTP in `definitions` (shared by the
    /// instances of a NATS log). Set before `start`.
    pub fn set_definitions(&self, definitions: Arc<dyn Definitions>) {
        let _ = self.definitions.set(definitions);
    }

    fn definitions(&self) -> &Arc<dyn Definitions> {
        self.definitions
            .get_or_init(|| Arc::new(LocalDefinitions::new(self.data_dir.join("flows"))))
    }

    fn flow_dir(&self, name: &str) -> PathBuf {
        self.data_dir.join("flows").join(name)
    }

    /// Starts the flows of the config file and those created over HTTP
    /// earlier (kept by `definitions`), recovering each from its log.
    pub async fn start(self: &Arc<Self>, configured: Vec<Flow>) -> Result<()> {
        let loaded = self.definitions().load().await?;
        let mut flows: HashMap<String, Flow> = HashMap::new();
        {
            let mut defining = self.defining.lock().await;
            for (cfg, revision) in loaded.flows {
                let flow = Flow::new(cfg)?;
                defining.insert(flow.name.clone(), revision);
                flows.insert(flow.name.clone(), flow);
            }
        }
        for f in configured {
            flows.insert(f.name.clone(), f);
        }
        // Flows start several at a time (a restart with thousands of flows
        // waits on the catalog's and the disk's latency, not on the CPU);
        // flows that share a target start one after another, in name order.
        let mut by_target: HashMap<iceberg::TableIdent, Vec<Flow>> = HashMap::new();
        for (_, flow) in flows {
            by_target.entry(flow.target.clone()).or_default().push(flow);
        }
        use futures::StreamExt;
        let mut starts = futures::stream::iter(by_target.into_values().map(|mut group| {
            group.sort_by(|a, b| a.name.cmp(&b.name));
            async move {
                for flow in group {
                    self.start_flow(flow).await?;
                }
                Ok::<_, Error>(())
            }
        }))
        .buffer_unordered(START_AT_ONCE);
        while let Some(started) = starts.next().await {
            started?;
        }
        self.loaded_revision
            .store(loaded.revision, std::sync::atomic::Ordering::SeqCst);
        self.ready.store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    /// Applies a definition written or removed by any instance (this one's
    /// own changes come back too, and are skipped by their revision).
    async fn apply_definition(self: &Arc<Self>, change: definitions::Change) {
        use definitions::Change;
        let mut defining = self.defining.lock().await;
        let (name, revision) = match &change {
            Change::Put { flow, revision, .. } | Change::Removed { flow, revision } => {
                (flow.clone(), *revision)
            }
        };
        if defining.get(&name).is_some_and(|r| *r >= revision) {
            return;
        }
        defining.insert(name.clone(), revision);
        let running = self.flow(&name).ok();
        match change {
            Change::Put { config: None, .. } => {
                tracing::error!(flow = %name, revision, "flow_definition_unreadable");
            }
            Change::Put {
                config: Some(cfg), ..
            } => {
                let cfg = *cfg;
                if running.as_ref().is_some_and(|rt| rt.defined == cfg) {
                    return;
                }
                let flow = match Flow::new(cfg) {
                    Ok(f) => f,
                    Err(e) => {
                        tracing::error!(flow = %name, revision, error = %e, "flow_definition_not_applied");
                        return;
                    }
                };
                if let Some(old) = &running {
                    self.stop_flow(old).await;
                }
                match self.start_flow(flow).await {
                    Ok(_) => tracing::info!(flow = %name, revision, "flow_definition_applied"),
                    Err(e) => {
                        tracing::error!(flow = %name, revision, error = %e, "flow_definition_not_applied");
                        if let Some(old) = running
                            && let Err(e) = self
                                .start_flow_defined(old.flow.clone(), old.defined.clone())
                                .await
                        {
                            tracing::error!(flow = %name, error = %e, "flow_restart_failed");
                        }
                    }
                }
            }
            Change::Removed { .. } => {
                if let Some(rt) = running {
                    self.forget_flow(&rt).await;
                    tracing::info!(flow = %name, revision, "flow_definition_removed");
                }
            }
        }
    }

    /// What one request may hold (`server.max_rows_per_request`,
    /// `server.max_body_bytes`), checked before a body is decoded.
    pub fn limits(&self) -> input::Limits {
        input::Limits {
            max_rows: self.config.max_rows_per_request.max(1),
            max_value_bytes: self.config.max_body_bytes,
        }
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn flow(&self, name: &str) -> Result<Arc<FlowRuntime>> {
        self.flows
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
            .ok_or_else(|| {
                if !self.is_ready() {
                    Error::Unavailable(format!(
                        "the service is recovering its flows; retry `{name}` shortly"
                    ))
                } else {
                    Error::FlowNotFound(format!(
                        "flow `{name}` does not exist; create it with PUT /v1/flows/{name}"
                    ))
                }
            })
    }

    pub fn flows(&self) -> Vec<Arc<FlowRuntime>> {
        let mut v: Vec<_> = self
            .flows
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        v.sort_by(|a, b| a.flow.name.cmp(&b.flow.name));
        v
    }

    /// Stops `rt` and drops it (and its lease, once committed).
    async fn forget_flow(&self, rt: &Arc<FlowRuntime>) {
        self.stop_flow(rt).await;
        {
            let mut flows = self.flows.write().unwrap_or_else(|e| e.into_inner());
            if flows.get(&rt.flow.name).is_some_and(|f| Arc::ptr_eq(f, rt)) {
                flows.remove(&rt.flow.name);
            }
        }
        if let Some(l) = self.leases.get() {
            l.release(&rt.flow.name).await;
        }
    }

    async fn stop_flow(&self, rt: &Arc<FlowRuntime>) {
        // `send_replace`, not `send`: a committer just spawned may not have
        // subscribed yet, and `send` to a channel without receivers drops
        // the value (the committer then slept its whole interval and this
        // wait hung).
        rt.stop.send_replace(true);
        rt.wake.notify_one();
        let task = rt.task.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = task {
            let _ = t.await;
        }
    }

    /// Stops every flow after a last commit of what is pending.
    pub async fn shutdown(&self) {
        self.ready.store(false, std::sync::atomic::Ordering::SeqCst);
        for rt in self.flows() {
            self.stop_flow(&rt).await;
        }
        // Committed: another instance may take the flows at once.
        if let Some(l) = self.leases.get() {
            l.release_all().await;
        }
    }
}
