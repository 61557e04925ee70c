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
pub mod input;
pub mod lease;
pub mod metrics;
pub mod nats_conn;
pub mod nats_log;
pub mod process;
pub mod run;
pub mod traffic;
pub mod wal;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use arrow_array::RecordBatch;
use bytes::Bytes;
use serde::Serialize;
use tokio::sync::{Notify, watch};

use crate::config::ServerConfig;
use crate::core::flow::{Flow, FlowConfig};
use crate::core::offsets::LogRef;
use crate::core::resolve::{self, BatchStats};
use crate::error::{Error, Result, codes};
use crate::fault::Faults;
use crate::service::definitions::{Definitions, LocalDefinitions};
use crate::service::wal::{IngestLog, LocalLogs, LogFactory, LogStats};
use crate::table::catalog::Catalog;
use crate::table::engine::Engine;

const MAX_BACKOFF: Duration = Duration::from_secs(30);

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// What a flow reports (`GET /v1/flows/{flow}`).
#[derive(Debug, Clone, Default, Serialize, utoipa::ToSchema)]
pub struct FlowStatus {
    /// Offset recorded in the target's latest snapshot.
    pub committed_offset: i64,
    /// Highest offset applied (batches that changed nothing need no snapshot).
    pub applied_offset: i64,
    pub pending_batches: usize,
    pub pending_rows: u64,
    pub pending_bytes: u64,
    pub last_snapshot_id: Option<i64>,
    pub last_commit_ms: Option<i64>,
    pub commits: u64,
    pub accepted_batches: u64,
    pub rejected_batches: u64,
    /// Batches acknowledged but rejected at commit: with
    /// `on_sequence_tie = "error"`, a tie with a batch committed before it.
    pub rejected_at_commit: u64,
    pub last_rejection: Option<String>,
    pub counters: BatchStats,
    pub state_keys: usize,
    pub state_tombstones: usize,
    pub wal: LogStats,
    /// Age of the oldest record the log retains.
    pub log_oldest_age_ms: Option<i64>,
    /// How long a retry with the same Idempotency-Key is recognised right
    /// now: `idempotency_window`, or less while `max_log_bytes` forces
    /// committed records out early.
    pub idempotency_window_ms: i64,
    /// Set while commits fail; pushes are still accepted up to the cap.
    pub last_error: Option<String>,
    pub degraded: bool,
    pub commit_ms_total: f64,
    /// Median and 99th percentile of the last 256 commits' durations.
    pub recent_commit_ms_p50: Option<f64>,
    pub recent_commit_ms_p99: Option<f64>,
    /// Median and 99th percentile of the last 256 appends to the flow's log
    /// (the wait before a push is acknowledged: an fsync, or a publish
    /// acknowledged by JetStream).
    pub recent_append_ms_p50: Option<f64>,
    pub recent_append_ms_p99: Option<f64>,
    /// Batches in the log not yet in the target (appended minus committed).
    pub log_lag_batches: i64,
    /// `from_snapshot` flows: the highest snapshot version accepted (committed or pending).
    pub snapshot_version: Option<i64>,
    /// Records kept in the flow's dead-letter area (`GET .../dead-letters`).
    pub dead_letters: usize,
    /// The target's current schema id: it moves when a changed definition
    /// evolves the schema.
    pub schema_id: i32,
    /// The target's default partition spec id: it moves when a changed
    /// `partition_by` adds a spec.
    pub partition_spec_id: i32,
    /// Schema changes (of the target or the state table) and partition
    /// spec changes committed for this flow since the process started.
    pub schema_evolutions: u64,
    pub maintenance: MaintenanceStatus,
    /// On a shared log (NATS): the flow's lease, which instance commits it.
    pub lease: Option<lease::LeaseStatus>,
}

/// The flow's maintenance as `GET /v1/flows/{flow}` and `/metrics` show it.
#[derive(Debug, Clone, Default, Serialize, utoipa::ToSchema)]
pub struct MaintenanceStatus {
    pub runs: u64,
    pub failures: u64,
    /// When the last run ended (ms since the epoch) and how it ended.
    pub last_run_ms: Option<i64>,
    pub last_error: Option<String>,
    pub last_report: Option<crate::table::engine::MaintenanceReport>,
    pub snapshots_expired_total: u64,
    pub files_deleted_total: u64,
    pub bytes_deleted_total: u64,
    /// Compactions that committed, and what they did in all.
    pub compactions: u64,
    /// Data and delete files compaction took out of the target.
    pub compaction_files_rewritten_total: u64,
    pub compaction_bytes_read_total: u64,
    pub compaction_bytes_written_total: u64,
    pub compaction_rows_moved_total: u64,
    pub compaction_seconds_total: f64,
    /// The target's and the state table's figures after the last commit or run.
    pub target: crate::table::maintain::TableStats,
    pub state: crate::table::maintain::TableStats,
}

/// `POST /v1/flows/{flow}/maintain`, waiting for the flow's committer.
pub struct MaintainRequest {
    pub dry_run: bool,
    pub reply: tokio::sync::oneshot::Sender<Result<crate::table::engine::MaintenanceReport>>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Committed {
    pub offset: i64,
    pub snapshot_id: Option<i64>,
}

/// An accepted push.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Accepted {
    pub accepted: usize,
    pub offset: i64,
    /// The idempotency key was seen before; nothing new was appended.
    pub duplicate: bool,
    /// A snapshot whose version is not above this one (already accepted) was
    /// skipped: nothing was logged.
    pub skipped_for_version: Option<i64>,
}

struct Pending {
    batch: RecordBatch,
    bytes: u64,
    /// `from_snapshot` flows: the snapshot's version.
    version: Option<i64>,
}

/// The log record of a snapshot: a marker, the version, then the rows as
/// Arrow IPC. A change batch is the Arrow IPC stream alone.
const SNAPSHOT_MAGIC: &[u8; 8] = b"ACDCSNAP";

fn encode_record(batch: &RecordBatch, version: Option<i64>) -> Result<Bytes> {
    let ipc = input::encode_arrow_ipc(batch)?;
    Ok(match version {
        None => Bytes::from(ipc),
        Some(v) => {
            let mut out = Vec::with_capacity(16 + ipc.len());
            out.extend_from_slice(SNAPSHOT_MAGIC);
            out.extend_from_slice(&v.to_le_bytes());
            out.extend_from_slice(&ipc);
            Bytes::from(out)
        }
    })
}

fn decode_record(flow: &Flow, payload: &[u8]) -> Result<(RecordBatch, Option<i64>)> {
    match payload.strip_prefix(SNAPSHOT_MAGIC.as_slice()) {
        Some(rest) if rest.len() >= 8 => {
            let v = i64::from_le_bytes(rest[..8].try_into().expect("8 bytes"));
            Ok((input::decode_log_payload(flow, &rest[8..])?, Some(v)))
        }
        _ => Ok((input::decode_log_payload(flow, payload)?, None)),
    }
}

/// A logged record as a batch; one that no longer decodes (a definition
/// changed under it, a damaged disk) is set aside in the dead letters and
/// becomes an empty batch, so its offset is applied as nothing and the flow
/// moves on.
fn decode_or_set_aside(
    flow: &Flow,
    dead: &crate::service::dead_letter::DeadLetters,
    r: &crate::service::wal::Record,
) -> Result<(RecordBatch, Option<i64>)> {
    match decode_record(flow, &r.payload) {
        Ok(d) => Ok(d),
        Err(e) => {
            dead.put(
                r.offset,
                &e,
                crate::service::dead_letter::Contents::Raw(&r.payload),
                now_ms(),
            )?;
            tracing::error!(flow = %flow.name, offset = r.offset, error = %e, "dead_letter");
            Ok((RecordBatch::new_empty(flow.source_arrow.clone()), None))
        }
    }
}

struct Inner {
    pending: BTreeMap<i64, Pending>,
    status: FlowStatus,
    /// Set by `forget_pending`: the offsets are reset from the target
    /// before anything is queued again.
    reset: bool,
}

/// One running flow.
pub struct FlowRuntime {
    pub flow: Flow,
    /// The definition as stored (`flow` may have columns the target added).
    defined: FlowConfig,
    log: Arc<dyn IngestLog>,
    /// The log's identity: the target records its committed offset under it.
    log_ref: LogRef,
    inner: Mutex<Inner>,
    wake: Notify,
    committed: watch::Sender<Committed>,
    stop: watch::Sender<bool>,
    /// Commit latencies, for the metrics histogram (bucket upper bounds in ms).
    pub commit_hist: Mutex<[u64; COMMIT_BUCKETS.len() + 1]>,
    /// `server.idempotency_window`.
    window: Duration,
    /// The last `RECENT` commit durations, for the status quantiles.
    recent_commits: Recent,
    /// The last `RECENT` append durations.
    recent_appends: Recent,
    /// The highest offset a client asked to have committed now (`/commit`,
    /// `?wait=commit`).
    requested: std::sync::atomic::AtomicI64,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Acknowledged records that can never be applied.
    pub dead: crate::service::dead_letter::DeadLetters,
    /// On a shared log: who commits this flow. Only the lease's holder
    /// queues batches and commits; the others log and acknowledge.
    leases: Option<Arc<lease::Leases>>,
    /// Maintenance runs asked for and not yet started (at most `MAX_MAINTAIN_REQUESTS`).
    maintain_requests: Mutex<Vec<MaintainRequest>>,
}

const MAX_MAINTAIN_REQUESTS: usize = 16;

pub const COMMIT_BUCKETS: [f64; 8] = [10.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 5000.0, 30000.0];
const RECENT: usize = 256;

impl FlowRuntime {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn status(&self) -> FlowStatus {
        let mut s = self.lock().status.clone();
        s.wal = self.log.stats();
        s.dead_letters = self.dead.count();
        let now = now_ms();
        s.log_oldest_age_ms = s.wal.oldest_appended_ms.map(|t| (now - t).max(0));
        let window = self.window.as_millis() as i64;
        s.idempotency_window_ms = match s.wal.idempotency_floor_ms {
            Some(floor) => (now - floor).clamp(0, window),
            None => window,
        };
        (s.recent_commit_ms_p50, s.recent_commit_ms_p99) = self.recent_commits.quantiles();
        (s.recent_append_ms_p50, s.recent_append_ms_p99) = self.recent_appends.quantiles();
        s.log_lag_batches = (s.wal.next_offset - 1 - s.committed_offset).max(0);
        s.lease = self.leases.as_ref().map(|l| l.status(&self.flow.name));
        s
    }

    /// Queues the records other processes appended to a shared log (none
    /// for the local one): everything after the contiguous run this
    /// process holds.
    pub(crate) async fn catch_up(&self) -> Result<()> {
        if !self.log.shared() {
            return Ok(());
        }
        let after = {
            let inner = self.lock();
            let mut next = inner.status.applied_offset + 1;
            while inner.pending.contains_key(&next) {
                next += 1;
            }
            next - 1
        };
        let records = self.log.replay(after).await?;
        if let Some(first) = records.first()
            && first.offset > after + 1
        {
            // The log starts past the run: what it released is in the
            // target (batches that changed nothing leave no snapshot).
            let mut inner = self.lock();
            inner.status.applied_offset = inner.status.applied_offset.max(first.offset - 1);
            let applied = inner.status.applied_offset;
            let stale: Vec<i64> = inner.pending.range(..=applied).map(|(o, _)| *o).collect();
            for o in stale {
                if let Some(p) = inner.pending.remove(&o) {
                    inner.status.pending_batches -= 1;
                    inner.status.pending_rows -= p.batch.num_rows() as u64;
                    inner.status.pending_bytes -= p.bytes;
                }
            }
        }
        for r in records {
            let (batch, version) = decode_or_set_aside(&self.flow, &self.dead, &r)?;
            self.queue(r.offset, batch, r.payload.len() as u64, version, false);
        }
        Ok(())
    }

    /// The flow runs under a lease (a shared log).
    pub(crate) fn leased(&self) -> bool {
        self.leases.is_some()
    }

    /// Wakes the committer (a lease changed hands).
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Whether this process commits the flow: always on a log of its own,
    /// on a shared one while it holds the flow's lease (its epoch then).
    pub(crate) fn commits_here(&self) -> Option<u64> {
        match &self.leases {
            None => Some(0),
            Some(l) => l.holds(&self.flow.name),
        }
    }

    /// Drops what is pending (it stays in the log) and marks the applied
    /// offset for a reset from the target at the next commit: the lease
    /// was lost, or taken after another instance committed.
    pub(crate) fn forget_pending(&self) {
        let mut inner = self.lock();
        inner.pending.clear();
        let s = &mut inner.status;
        s.pending_batches = 0;
        s.pending_rows = 0;
        s.pending_bytes = 0;
        inner.reset = true;
    }

    /// After `forget_pending`: the applied and committed offsets are the
    /// target's.
    pub(crate) fn reset_offsets(&self, committed: i64) {
        let mut inner = self.lock();
        if std::mem::take(&mut inner.reset) {
            inner.status.applied_offset = committed;
            inner.status.committed_offset = committed;
        }
    }

    /// Puts a logged batch in the pending run, unless it is applied or
    /// queued already, or another instance commits the flow; `accepted`
    /// counts it as accepted here.
    fn queue(
        &self,
        offset: i64,
        batch: RecordBatch,
        bytes: u64,
        version: Option<i64>,
        accepted: bool,
    ) {
        let here = self.commits_here().is_some();
        let mut inner = self.lock();
        if accepted {
            inner.status.accepted_batches += 1;
        }
        if !here
            || inner.reset
            || offset <= inner.status.applied_offset
            || inner.pending.contains_key(&offset)
        {
            return;
        }
        inner.status.pending_batches += 1;
        inner.status.pending_rows += batch.num_rows() as u64;
        inner.status.pending_bytes += bytes;
        inner.pending.insert(
            offset,
            Pending {
                batch,
                bytes,
                version,
            },
        );
    }

    /// Counts a request rejected before it reached the log (bad body).
    pub fn count_rejected(&self) {
        self.lock().status.rejected_batches += 1;
    }

    pub fn subscribe(&self) -> watch::Receiver<Committed> {
        self.committed.subscribe()
    }

    /// Asks the flow's committer for a maintenance run between its commits
    /// and waits for the report (up to `timeout`).
    pub async fn maintain(
        &self,
        dry_run: bool,
        timeout: Duration,
    ) -> Result<Option<crate::table::engine::MaintenanceReport>> {
        // On a shared log only the lease holder maintains the flow.
        if let Some(l) = &self.leases
            && l.holds(&self.flow.name).is_none()
        {
            let lease = l.status(&self.flow.name);
            let holder = match (&lease.holder, lease.epoch) {
                (Some(h), Some(e)) => format!("instance `{h}` (lease epoch {e})"),
                _ => "no instance yet (its lease is being taken)".into(),
            };
            return Err(Error::Unavailable(format!(
                "flow `{}` is committed and maintained by {holder}, not by this instance (`{}`): send POST /v1/flows/{}/maintain there, or retry",
                self.flow.name,
                l.me(),
                self.flow.name
            )));
        }
        let (reply, rx) = tokio::sync::oneshot::channel();
        {
            let mut q = self
                .maintain_requests
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if q.len() >= MAX_MAINTAIN_REQUESTS {
                return Err(Error::Unavailable(format!(
                    "flow `{}`: {MAX_MAINTAIN_REQUESTS} maintenance runs are already waiting; retry later",
                    self.flow.name
                )));
            }
            q.push(MaintainRequest { dry_run, reply });
        }
        self.wake.notify_one();
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(result)) => result.map(Some),
            Ok(Err(_)) => Err(Error::Unavailable(format!(
                "flow `{}` stopped, or another instance took it over, before its maintenance ran; retry",
                self.flow.name
            ))),
            Err(_) => Ok(None),
        }
    }

    /// The last offset in the flow's log, counting what other instances
    /// appended to a shared one (asked of its broker).
    pub async fn log_end(&self) -> Result<i64> {
        self.log.last_offset().await
    }

    /// Asks the committer to commit everything appended so far now, rather
    /// than at its next `commit_interval` tick.
    pub fn commit_soon(&self) {
        self.commit_through(self.log.stats().next_offset - 1);
    }

    /// Asks the committer to commit through `offset` now: it commits at once,
    /// and again right after while `offset` is not yet applied (a commit
    /// takes at most `commit_max_rows` / `commit_max_bytes`).
    pub fn commit_through(&self, offset: i64) {
        self.requested
            .fetch_max(offset, std::sync::atomic::Ordering::SeqCst);
        self.wake.notify_one();
    }

    fn record_commit_ms(&self, ms: f64) {
        self.recent_commits.push(ms);
    }
}

/// The last `RECENT` durations (ms), for the status quantiles.
#[derive(Default)]
struct Recent(Mutex<std::collections::VecDeque<f64>>);

impl Recent {
    fn push(&self, ms: f64) {
        let mut r = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if r.len() == RECENT {
            r.pop_front();
        }
        r.push_back(ms);
    }

    /// (p50, p99), none before the first.
    fn quantiles(&self) -> (Option<f64>, Option<f64>) {
        let mut v: Vec<f64> = self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .copied()
            .collect();
        v.sort_by(f64::total_cmp);
        let q = |p: f64| {
            v.get(((v.len().max(1) - 1) as f64 * p).round() as usize)
                .copied()
        };
        (q(0.5), q(0.99))
    }
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
        for (_, flow) in flows {
            self.start_flow(flow).await?;
        }
        self.loaded_revision
            .store(loaded.revision, std::sync::atomic::Ordering::SeqCst);
        self.ready.store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

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

    /// Creates or replaces a flow definition and persists it in `data_dir`.
    /// Transactional: a definition that is refused (invalid, another flow's
    /// target, drift from the existing target) changes nothing on disk or in
    /// memory, and the running flow keeps running.
    pub async fn put_flow(self: &Arc<Self>, cfg: FlowConfig) -> Result<Arc<FlowRuntime>> {
        let flow = self.with_target_columns(Flow::new(cfg.clone())?).await?;
        if let Some(other) = self
            .flows()
            .into_iter()
            .find(|rt| rt.flow.name != flow.name && rt.flow.target == flow.target)
        {
            return Err(Error::Definition {
                code: codes::TARGET_IN_USE,
                flow: flow.name.clone(),
                message: format!(
                    "{} is the target of flow `{}`; two flows writing one table would undo each other's changes",
                    cfg.target, other.flow.name
                ),
            });
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
    async fn with_target_columns(&self, flow: Flow) -> Result<Flow> {
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

    async fn start_flow(self: &Arc<Self>, flow: Flow) -> Result<Arc<FlowRuntime>> {
        let defined = flow.config.clone();
        self.start_flow_defined(flow, defined).await
    }

    /// Starts `flow`, whose definition as stored is `defined`.
    async fn start_flow_defined(
        self: &Arc<Self>,
        flow: Flow,
        defined: FlowConfig,
    ) -> Result<Arc<FlowRuntime>> {
        let flow = self.with_target_columns(flow).await?;
        let recorded = Engine::recorded_logs(&flow, self.catalog.as_ref()).await?;
        let log_ref = LogRef {
            id: self.logs.identity(&flow.name, &recorded).await?,
            retention_ms: self.config.log_offsets_retention()?.as_millis() as i64,
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

    /// Validates a decoded batch, makes it durable and queues it for commit.
    pub async fn ingest(
        &self,
        rt: &FlowRuntime,
        batch: RecordBatch,
        key: Option<String>,
    ) -> Result<Accepted> {
        if rt.flow.from_snapshot {
            rt.lock().status.rejected_batches += 1;
            return Err(Error::Input {
                code: codes::NOT_A_SNAPSHOT_FLOW,
                flow: rt.flow.name.clone(),
                message: "this flow is from_snapshot: send whole snapshots to POST /v1/flows/{flow}/snapshots?version=V".into(),
            });
        }
        self.append(rt, batch, key, None).await
    }

    /// `from_snapshot` flows: validates a whole snapshot, makes it durable and
    /// queues it. A version not above the highest accepted one is skipped.
    pub async fn ingest_snapshot(
        &self,
        rt: &FlowRuntime,
        batch: RecordBatch,
        version: i64,
        key: Option<String>,
    ) -> Result<Accepted> {
        if !rt.flow.from_snapshot {
            rt.lock().status.rejected_batches += 1;
            return Err(Error::Input {
                code: codes::NOT_A_SNAPSHOT_FLOW,
                flow: rt.flow.name.clone(),
                message: "this flow takes changes (POST /v1/flows/{flow}/changes); declare it with from_snapshot = true to send snapshots".into(),
            });
        }
        let batch = match crate::core::from_snapshot::check(&rt.flow, &batch, version) {
            Ok(b) => b,
            Err(e) => {
                rt.lock().status.rejected_batches += 1;
                return Err(e);
            }
        };
        // Reserve the version, so that two pushes of one version log it once.
        let before = {
            let mut inner = rt.lock();
            let have = inner.status.snapshot_version;
            if let Some(have) = have.filter(|&h| version <= h) {
                return Ok(Accepted {
                    accepted: 0,
                    offset: inner.status.applied_offset,
                    duplicate: false,
                    skipped_for_version: Some(have),
                });
            }
            inner.status.snapshot_version = Some(version);
            have
        };
        let res = self.append(rt, batch, key, Some(version)).await;
        if res.is_err() {
            let mut inner = rt.lock();
            if inner.status.snapshot_version == Some(version) {
                inner.status.snapshot_version = before;
            }
        }
        res
    }

    async fn append(
        &self,
        rt: &FlowRuntime,
        batch: RecordBatch,
        key: Option<String>,
        version: Option<i64>,
    ) -> Result<Accepted> {
        if let Err(e) = resolve::validate(&rt.flow, &batch) {
            rt.lock().status.rejected_batches += 1;
            return Err(e);
        }
        if *rt.stop.borrow() {
            return Err(Error::Unavailable(format!(
                "flow `{}` is stopping",
                rt.flow.name
            )));
        }
        let payload = encode_record(&batch, version)?;
        let bytes = payload.len() as u64;
        if bytes > rt.flow.commit.max_log_bytes / 2 {
            rt.lock().status.rejected_batches += 1;
            return Err(Error::Input {
                code: codes::BATCH_TOO_LARGE,
                flow: rt.flow.name.clone(),
                message: format!(
                    "this batch is {bytes} bytes in the log, over half of max_log_bytes = {}; send it in smaller requests",
                    rt.flow.commit.max_log_bytes
                ),
            });
        }
        {
            let inner = rt.lock();
            let cap = rt.flow.commit.max_uncommitted_bytes;
            if inner.status.pending_bytes > 0 && inner.status.pending_bytes + bytes > cap {
                let secs = rt.flow.commit.interval.as_secs().clamp(1, 60);
                return Err(Error::Overloaded {
                    message: format!(
                        "flow `{}` has {} uncommitted bytes (max_uncommitted_bytes = {cap}); retry after a commit",
                        rt.flow.name, inner.status.pending_bytes
                    ),
                    retry_after_secs: secs,
                });
            }
        }
        let rows = batch.num_rows();
        let started = std::time::Instant::now();
        let appended = match rt.log.append(key, payload, now_ms()).await {
            Err(Error::Overloaded { message, .. }) => {
                return Err(Error::Overloaded {
                    message: format!("flow `{}`: {message}", rt.flow.name),
                    retry_after_secs: rt.flow.commit.interval.as_secs().clamp(1, 60),
                });
            }
            r => r?,
        };
        rt.recent_appends
            .push(started.elapsed().as_secs_f64() * 1e3);
        // A duplicate this process never queued: a shared log stored an
        // append that was answered 503 (no acknowledgement in time). The
        // stored record is queued, not this request's body, which may
        // differ under a reused key.
        // (Only where it would be queued: another instance's holder reads
        // it from the log itself.)
        let stored = if appended.duplicate && rt.commits_here().is_some() && {
            let inner = rt.lock();
            appended.offset > inner.status.applied_offset
                && !inner.pending.contains_key(&appended.offset)
        } {
            match rt.log.read(appended.offset).await? {
                Some(r) => Some(decode_record(&rt.flow, &r.payload).map(|d| (d, r.payload.len()))?),
                None => None,
            }
        } else {
            None
        };
        if let Some(((batch, version), bytes)) = stored {
            rt.queue(appended.offset, batch, bytes as u64, version, true);
        }
        if !appended.duplicate {
            // A retry of a batch that is already committed and released is not re-queued.
            rt.queue(appended.offset, batch, bytes, version, true);
        }
        let wake = {
            let inner = rt.lock();
            inner.status.pending_rows >= rt.flow.commit.max_rows
                || inner.status.pending_bytes >= rt.flow.commit.max_bytes
        };
        if wake {
            rt.wake.notify_one();
        }
        Ok(Accepted {
            accepted: rows,
            offset: appended.offset,
            duplicate: appended.duplicate,
            skipped_for_version: None,
        })
    }
}
