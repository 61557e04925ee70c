//! One flow at run time (`FlowRuntime`): its pending batches, offsets,
//! counters and recent commit times, shared by the ingest path, the
//! committer (`committer.rs`, beside it) and the status.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow_array::RecordBatch;
use serde::Serialize;
use tokio::sync::{Notify, watch};

use super::lease;
use super::now_ms;
use super::record::decode_or_set_aside;
use super::status::FlowStatus;
use crate::core::flow::{Flow, FlowConfig};
use crate::core::offsets::LogRef;
use crate::error::{Error, Result};
use crate::service::wal::IngestLog;

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

pub(super) struct Pending {
    pub(super) batch: RecordBatch,
    pub(super) bytes: u64,
    /// `from_snapshot` flows: the snapshot's version.
    pub(super) version: Option<i64>,
}

pub(super) struct Inner {
    pub(super) pending: BTreeMap<i64, Pending>,
    pub(super) status: FlowStatus,
    /// Set by `forget_pending`: the offsets are reset from the target
    /// before anything is queued again.
    pub(super) reset: bool,
}

/// One running flow.
pub struct FlowRuntime {
    pub flow: Flow,
    /// The definition as stored (`flow` may have columns the target added).
    pub(super) defined: FlowConfig,
    pub(super) log: Arc<dyn IngestLog>,
    /// The log's identity: the target records its committed offset under it.
    pub(super) log_ref: LogRef,
    pub(super) inner: Mutex<Inner>,
    pub(super) wake: Notify,
    pub(super) committed: watch::Sender<Committed>,
    pub(super) stop: watch::Sender<bool>,
    /// Commit latencies, for the metrics histogram (bucket upper bounds in ms).
    pub commit_hist: Mutex<[u64; COMMIT_BUCKETS.len() + 1]>,
    /// `server.idempotency_window`.
    pub(super) window: Duration,
    /// The last `RECENT` commit durations, for the status quantiles.
    pub(super) recent_commits: Recent,
    /// The last `RECENT` append durations.
    pub(super) recent_appends: Recent,
    /// The highest offset a client asked to have committed now (`/commit`,
    /// `?wait=commit`).
    pub(super) requested: std::sync::atomic::AtomicI64,
    pub(super) task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Acknowledged records that can never be applied.
    pub dead: crate::service::dead_letter::DeadLetters,
    /// On a shared log: who commits this flow. Only the lease's holder
    /// queues batches and commits; the others log and acknowledge.
    pub(super) leases: Option<Arc<lease::Leases>>,
    /// Maintenance runs asked for and not yet started (at most `MAX_MAINTAIN_REQUESTS`).
    pub(super) maintain_requests: Mutex<Vec<MaintainRequest>>,
}

pub(super) const MAX_MAINTAIN_REQUESTS: usize = 16;

/// The upper bounds (ms) of the commit histogram's buckets: Prometheus'
/// defaults, then 30 s. Commits of a busy flow take 10-100 ms, so the
/// buckets there are close enough for a window's percentiles.
pub const COMMIT_BUCKETS: [f64; 12] = [
    5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 30000.0,
];
pub(super) const RECENT: usize = 256;

impl FlowRuntime {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
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
    pub(super) fn queue(
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

    pub(super) fn record_commit_ms(&self, ms: f64) {
        self.recent_commits.push(ms);
    }
}

/// The last `RECENT` durations (ms), for the status quantiles.
#[derive(Default)]
pub(super) struct Recent(Mutex<std::collections::VecDeque<f64>>);

impl Recent {
    pub(super) fn push(&self, ms: f64) {
        let mut r = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if r.len() == RECENT {
            r.pop_front();
        }
        r.push_back(ms);
    }

    /// (p50, p99), none before the first.
    pub(super) fn quantiles(&self) -> (Option<f64>, Option<f64>) {
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
