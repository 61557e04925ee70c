//! The committer task of one flow: it owns the flow's engine, drains the
//! contiguous run of pending offsets into one snapshot on the flow's
//! schedule, releases the log through the committed offset, and keeps a
//! failing flow retrying with backoff (visible as `degraded`) instead of dying.

use std::sync::Arc;
use std::time::Duration;

use arrow_array::RecordBatch;

use super::runtime::{COMMIT_BUCKETS, Committed, FlowRuntime, Inner};
use super::{MAX_BACKOFF, now_ms};
use crate::config::MaintenanceSchedule;
use crate::error::{Error, Result, codes};
use crate::fault::Faults;
use crate::table::catalog::Catalog;
use crate::table::engine::{CommitReport, Engine, StateSummary};

/// How often a non-holder asks the holder again for a commit a client
/// waits for.
const ASK_AGAIN: Duration = Duration::from_secs(1);
use crate::table::engine::{MaintainOptions, MaintenanceReport};

/// The committer of one flow. Cadence: while data arrives, commits start
/// `commit_interval` apart (measured start to start), and each takes
/// everything that arrived meanwhile. A commit starts sooner only when more
/// than one commit's worth is waiting (`commit_max_rows` /
/// `commit_max_bytes`; a snapshot flow's next snapshot), or a client asked
/// for it (`/commit`, `?wait=commit`). So the commit rate follows the
/// interval and the input, never the commit count. Failures retry with
/// backoff; on stop it commits what is pending.
pub(super) async fn committer(
    rt: Arc<FlowRuntime>,
    engine: Engine,
    catalog: Arc<dyn Catalog>,
    faults: Arc<Faults>,
    window: Duration,
    schedule: MaintenanceSchedule,
) {
    let mut engine = Some(engine);
    let mut clock = MaintenanceClock::new();
    let mut stop = rt.stop.subscribe();
    let mut backoff = Duration::from_millis(100);
    let interval = rt.flow.commit.interval;
    let mut next_start = tokio::time::Instant::now() + interval;
    // On a shared log: the lease epoch this committer works under (none:
    // another instance commits the flow).
    let mut held = if rt.leased() { None } else { Some(0) };
    // On a shared log, not holding: when this instance last asked the
    // holder to commit for a waiting client.
    let mut last_ask: Option<std::time::Instant> = None;
    loop {
        let stopping = *stop.borrow();
        if !stopping {
            tokio::select! {
                _ = tokio::time::sleep_until(next_start) => {}
                _ = rt.wake.notified() => {}
                _ = stop.changed() => {}
            }
        }
        let stopping = *stop.borrow();
        next_start = tokio::time::Instant::now() + interval;
        if rt.leased() {
            let now = rt.commits_here();
            if now != held {
                // Taken, lost, or taken again after another instance
                // committed: start over from the target and the log.
                tracing::info!(flow = %rt.flow.name, epoch = ?now, "committer_lease_changed");
                engine = None;
                rt.forget_pending();
                held = now;
            }
            if held.is_none() {
                // The holder's state lives there: none here (memory), and
                // nothing pending. A push queues its batch while the lease
                // is held here; a lease taken and lost again while this
                // loop was busy (a `follow` waiting out a NATS election)
                // is a change it never saw, and left that batch pending
                // for good: /commit here then waited for an offset past
                // the stream's end.
                engine = None;
                if rt.lock().status.pending_batches > 0 {
                    tracing::info!(flow = %rt.flow.name, "pending_dropped_not_holding");
                    rt.forget_pending();
                }
                rt.refuse_maintenance();
                // Commits failing while this instance held the flow are
                // not this instance's to report once it does not.
                rt.recovered();
                if stopping {
                    return;
                }
                if let Err(e) = follow(&rt, &catalog).await {
                    tracing::warn!(flow = %rt.flow.name, error = %e, "follow_failed");
                }
                let asked = rt.requested.load(std::sync::atomic::Ordering::SeqCst);
                if asked > rt.committed.borrow().offset {
                    // A client waits for a commit another instance makes:
                    // ask the holder for it (again each second, as a
                    // request is lost while the lease changes hands), and
                    // look for it every 200 ms.
                    next_start = tokio::time::Instant::now() + Duration::from_millis(200);
                    if last_ask.is_none_or(|t: std::time::Instant| t.elapsed() >= ASK_AGAIN)
                        && let Some(l) = &rt.leases
                    {
                        if let Err(e) = l.ask_commit(&rt.flow.name, asked).await {
                            tracing::warn!(flow = %rt.flow.name, error = %e, "ask_commit_failed");
                        }
                        last_ask = Some(std::time::Instant::now());
                    }
                } else {
                    last_ask = None;
                }
                continue;
            }
        }
        let outcome = heavy(commit_once(&rt, &mut engine, &catalog, &faults, window))
            .await
            .unwrap_or_else(|panic| {
                // The engine may be half-way through a commit: reopen it.
                engine = None;
                Err(Error::State {
                    code: codes::COMMITTER_PANIC,
                    message: format!("the commit panicked: {panic}"),
                })
            });
        maintain_if_due(&rt, &mut engine, &catalog, &faults, &schedule, &mut clock).await;
        match outcome {
            Ok(next) => {
                // A round that went through ends the failure, whether or
                // not it had anything to commit: with nothing pending the
                // flow would otherwise stay `degraded` (and /readyz 503)
                // until new data came, which an unready instance may never
                // be sent.
                rt.recovered();
                backoff = Duration::from_millis(100);
                let asked = rt.requested.load(std::sync::atomic::Ordering::SeqCst);
                if stopping && next == Next::Empty {
                    rt.refuse_maintenance();
                    return;
                }
                if next == Next::Full || (next == Next::Some && asked > rt.applied()) {
                    rt.wake.notify_one();
                }
            }
            Err(e) if e.code() == codes::LEASE_LOST => {
                // Another instance took the flow over and committed: give
                // the lease up here and follow (no degraded state: nothing
                // is wrong with the flow).
                tracing::warn!(flow = %rt.flow.name, error = %e, "commit_fenced");
                engine = None;
                if let Some(l) = &rt.leases {
                    l.lost(&rt.flow.name, "fenced");
                }
            }
            Err(e) => {
                {
                    let mut inner = rt.lock();
                    inner.status.last_error = Some(e.to_string());
                    inner.status.degraded = true;
                }
                tracing::error!(
                    flow = %rt.flow.name,
                    retry_in_ms = backoff.as_millis() as u64,
                    error = %e,
                    "commit_failed"
                );
                if stopping && backoff >= MAX_BACKOFF {
                    // Give up on the final commit; the log keeps the batches.
                    rt.refuse_maintenance();
                    return;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                rt.wake.notify_one();
            }
        }
    }
}

/// When this flow's maintenance last ran (and last cleaned orphans).
struct MaintenanceClock {
    last_run: tokio::time::Instant,
    last_orphans: Option<tokio::time::Instant>,
    /// The threshold check reads the tables' refs: at most every `THRESHOLD_CHECK`.
    last_check: tokio::time::Instant,
    /// The last run failed: the threshold does not start another one; the
    /// next is the timer's (so a failing run is retried once per `interval`).
    failed: bool,
    /// When this flow last compacted (its own `compaction.interval`).
    last_compaction: tokio::time::Instant,
}

const THRESHOLD_CHECK: Duration = Duration::from_secs(10);

impl MaintenanceClock {
    fn new() -> Self {
        MaintenanceClock {
            last_run: tokio::time::Instant::now(),
            last_orphans: None,
            last_check: tokio::time::Instant::now(),
            failed: false,
            last_compaction: tokio::time::Instant::now(),
        }
    }
}

/// Between commits: runs the maintenance asked for (`POST .../maintain`),
/// and the scheduled one when `interval` has passed since the last run or
/// the last commit left `expire_threshold` snapshots that can expire. A
/// failure is logged and counted, the engine reopened; commits go on.
async fn maintain_if_due(
    rt: &FlowRuntime,
    engine: &mut Option<Engine>,
    catalog: &Arc<dyn Catalog>,
    faults: &Arc<Faults>,
    schedule: &MaintenanceSchedule,
    clock: &mut MaintenanceClock,
) {
    let asked = std::mem::take(
        &mut *rt
            .maintain_requests
            .lock()
            .unwrap_or_else(|e| e.into_inner()),
    );
    let now = now_ms();
    let timer = schedule
        .interval
        .is_some_and(|i| clock.last_run.elapsed() >= i);
    let mut threshold = false;
    if let Some(e) = engine
        .as_ref()
        .filter(|_| clock.last_check.elapsed() >= THRESHOLD_CHECK)
    {
        clock.last_check = tokio::time::Instant::now();
        threshold = schedule.expire_threshold > 0
            && !clock.failed
            && e.expirable_snapshots(now) >= schedule.expire_threshold;
        // The tables' figures for /metrics, at most THRESHOLD_CHECK old.
        let io = catalog.file_io();
        if let (Ok(t), Ok(st)) = (
            crate::table::maintain::stats(io, e.target()).await,
            crate::table::maintain::stats(io, e.state_table()).await,
        ) {
            let mut inner = rt.lock();
            inner.status.maintenance.target = t;
            inner.status.maintenance.state = st;
        }
    }
    let compact_due = rt.flow.compaction.enabled
        && !clock.failed
        && clock.last_compaction.elapsed() >= rt.flow.compaction.interval;
    let scheduled = rt.flow.maintenance.scheduled && (timer || threshold || compact_due);
    if asked.is_empty() && !scheduled {
        return;
    }
    // Orphan cleanup lists whole table locations: on the timer at most every
    // `orphan_interval`, and whenever an operator asks.
    let orphans_due = timer
        && clock
            .last_orphans
            .is_none_or(|t| t.elapsed() >= schedule.orphan_interval);
    let mut runs: Vec<(bool, bool, Option<super::MaintainRequest>)> = asked
        .into_iter()
        .map(|r| (r.dry_run, true, Some(r)))
        .collect();
    if scheduled && !runs.iter().any(|(dry, _, _)| !dry) {
        runs.push((false, orphans_due, None));
    }
    for (dry_run, orphans, request) in runs {
        let opts = MaintainOptions {
            now_ms: now_ms(),
            dry_run,
            orphans_older_than: schedule.orphans_older_than.filter(|_| orphans),
            // Asked-for runs compact; scheduled ones on the flow's interval.
            compact: request.is_some() || compact_due,
        };
        let result = run_maintenance(rt, engine, catalog, faults, &opts).await;
        if !dry_run {
            clock.last_run = tokio::time::Instant::now();
            if opts.compact {
                clock.last_compaction = clock.last_run;
            }
            clock.failed = result.is_err();
            if opts.orphans_older_than.is_some() && result.is_ok() {
                clock.last_orphans = Some(clock.last_run);
            }
        }
        if let Some(r) = request {
            let _ = r.reply.send(result);
        }
    }
}

async fn run_maintenance(
    rt: &FlowRuntime,
    engine: &mut Option<Engine>,
    catalog: &Arc<dyn Catalog>,
    faults: &Arc<Faults>,
    opts: &MaintainOptions,
) -> Result<MaintenanceReport> {
    let eng = match opened(rt, engine, catalog, faults).await {
        Ok(eng) => eng,
        Err(e) => {
            rt.record_maintenance(&Err(&e), opts.dry_run);
            return Err(e);
        }
    };
    // Compaction decodes and encodes Parquet: like a commit, and a panic in
    // it degrades the run, not the flow.
    let result = heavy(eng.maintain(opts)).await.unwrap_or_else(|panic| {
        Err(Error::State {
            code: codes::COMMITTER_PANIC,
            message: format!("maintenance panicked: {panic}"),
        })
    });
    rt.record_maintenance(&result.as_ref(), opts.dry_run);
    match &result {
        Ok(report) => tracing::info!(
            flow = %rt.flow.name,
            dry_run = opts.dry_run,
            snapshots_expired = report.target.snapshots_expired + report.state.snapshots_expired,
            files_compacted = report.compaction.as_ref().map_or(0, |c| c.data_files_rewritten + c.data_files_dropped + c.delete_files_removed),
            rows_moved = report.compaction.as_ref().map_or(0, |c| c.rows_moved),
            files_deleted = report.files_deleted(),
            bytes_deleted = report.target.bytes_deleted + report.state.bytes_deleted,
            elapsed_ms = report.elapsed_ms as u64,
            "maintenance"
        ),
        Err(e) => {
            tracing::error!(flow = %rt.flow.name, error = %e, "maintenance_failed");
            // It may have stopped half-way: reopen before the next commit.
            *engine = None;
        }
    }
    result
}

/// The flow's engine, opened from the catalog first when there is none
/// (at start, or after a failure left it behind the catalog).
async fn opened<'a>(
    rt: &FlowRuntime,
    engine: &'a mut Option<Engine>,
    catalog: &Arc<dyn Catalog>,
    faults: &Arc<Faults>,
) -> Result<&'a mut Engine> {
    if engine.is_none() {
        *engine = Some(
            Engine::open_for_log(
                rt.flow.clone(),
                catalog.clone(),
                faults.clone(),
                Some(rt.log_ref.clone()),
            )
            .await?,
        );
    }
    Ok(engine.as_mut().expect("opened above"))
}

/// Where another instance commits the flow: the committed offset and
/// snapshot the target records, for clients that wait for a commit, and the
/// log's end as the broker tells it, so this instance's status counts what
/// only the holder acknowledged (its own view of the log moves only with
/// its own appends). The broker is asked last, so an unreachable one
/// leaves only the log's end stale, not the commits waiting clients watch.
async fn follow(rt: &FlowRuntime, catalog: &Arc<dyn Catalog>) -> Result<()> {
    let (offset, snapshot_id) =
        Engine::committed_offset(&rt.flow, catalog.as_ref(), &rt.log_ref).await?;
    {
        let mut inner = rt.lock();
        inner.status.committed_offset = offset;
        inner.status.applied_offset = inner.status.applied_offset.max(offset);
        if snapshot_id.is_some() {
            inner.status.last_snapshot_id = snapshot_id;
        }
    }
    if offset > rt.committed.borrow().offset {
        rt.committed.send_replace(Committed {
            offset,
            snapshot_id,
        });
    }
    rt.log_end().await?;
    Ok(())
}

/// Commits and maintenance runs of all flows at once, at most.
const HEAVY_AT_ONCE: usize = 8;

/// Runs `work` (a commit or a maintenance run: CPU-heavy, resolve and
/// Parquet encoding) on this thread, off the worker's other tasks (request
/// handlers move to another thread), once one of `HEAVY_AT_ONCE` places is
/// free. Each runs on a thread of the runtime's bounded blocking pool and
/// waits there for its own file I/O, which needs threads of that pool too:
/// unbounded, a few hundred flows committing at once took every thread and
/// waited forever for their I/O. A panic inside is caught and returned as
/// its message: the flow degrades and retries, the process and the other
/// flows go on.
async fn heavy<T>(work: impl std::future::Future<Output = T>) -> std::result::Result<T, String> {
    static PLACES: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(HEAVY_AT_ONCE);
    let _place = PLACES
        .acquire()
        .await
        .expect("the semaphore is never closed");
    let handle = tokio::runtime::Handle::current();
    tokio::task::block_in_place(|| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handle.block_on(work)))
    })
    .map_err(|panic| panic_message(&*panic))
}

/// The text of a caught panic.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// What is left for the committer after a commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    /// Nothing contiguous is pending.
    Empty,
    /// Less than a commit's worth: it waits for the next tick.
    Some,
    /// A commit's worth or more (or another snapshot): commit at once.
    Full,
}

impl FlowRuntime {
    /// The commits go through again (or are no longer made here): the flow
    /// is not `degraded` any more.
    fn recovered(&self) {
        let mut inner = self.lock();
        if inner.status.degraded {
            inner.status.degraded = false;
            inner.status.last_error = None;
            drop(inner);
            tracing::info!(flow = %self.flow.name, "commit_recovered");
        }
    }

    /// The committer is gone: the runs asked for will not happen.
    fn refuse_maintenance(&self) {
        // Dropping the senders answers each waiting request.
        self.maintain_requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    fn record_maintenance(
        &self,
        result: &std::result::Result<&MaintenanceReport, &Error>,
        dry_run: bool,
    ) {
        let mut inner = self.lock();
        let m = &mut inner.status.maintenance;
        match result {
            Ok(r) => {
                m.target = r.target_stats.clone();
                m.state = r.state_stats.clone();
                if dry_run {
                    return;
                }
                m.runs += 1;
                m.last_error = None;
                m.snapshots_expired_total +=
                    (r.target.snapshots_expired + r.state.snapshots_expired) as u64;
                m.files_deleted_total += r.files_deleted() as u64;
                m.bytes_deleted_total += r.target.bytes_deleted + r.state.bytes_deleted;
                if let Some(c) = r.compaction.as_ref().filter(|c| c.skipped.is_none()) {
                    m.compactions += 1;
                    m.compaction_files_rewritten_total +=
                        (c.data_files_rewritten + c.data_files_dropped + c.delete_files_removed)
                            as u64;
                    m.compaction_bytes_read_total += c.bytes_read;
                    m.compaction_bytes_written_total += c.bytes_written;
                    m.compaction_rows_moved_total += c.rows_moved;
                    m.compaction_seconds_total += c.elapsed_ms / 1e3;
                }
                m.last_report = Some((*r).clone());
            }
            Err(e) => {
                m.failures += 1;
                m.last_error = Some(e.to_string());
            }
        }
        m.last_run_ms = Some(now_ms());
    }

    fn applied(&self) -> i64 {
        self.lock().status.applied_offset
    }

    fn next_after_commit(&self, inner: &Inner) -> Next {
        let s = &inner.status;
        if !inner.pending.contains_key(&(s.applied_offset + 1)) {
            Next::Empty
        } else if self.flow.from_snapshot
            || s.pending_rows >= self.flow.commit.max_rows
            || s.pending_bytes >= self.flow.commit.max_bytes
        {
            Next::Full
        } else {
            Next::Some
        }
    }

    /// The contiguous run of pending batches after the applied offset, as
    /// much as one commit takes (`commit_max_rows` / `commit_max_bytes`; a
    /// snapshot alone): (batches with their snapshot versions, last offset, bytes).
    fn next_run(&self) -> (Vec<(RecordBatch, Option<i64>)>, i64, u64) {
        let inner = self.lock();
        let mut next = inner.status.applied_offset + 1;
        let (mut rows, mut bytes) = (0u64, 0u64);
        let mut batches = Vec::new();
        while let Some(p) = inner.pending.get(&next) {
            if !batches.is_empty()
                && (self.flow.from_snapshot
                    || rows + p.batch.num_rows() as u64 > self.flow.commit.max_rows
                    || bytes + p.bytes > self.flow.commit.max_bytes)
            {
                // A snapshot is applied on its own.
                break;
            }
            rows += p.batch.num_rows() as u64;
            bytes += p.bytes;
            batches.push((p.batch.clone(), p.version));
            next += 1;
        }
        (batches, next - 1, bytes)
    }

    /// The batches `offsets` are committed (or set aside): out of pending,
    /// into the counters and status. Returns what the committer does next.
    #[allow(clippy::too_many_arguments)]
    fn record(
        &self,
        offsets: std::ops::RangeInclusive<i64>,
        bytes: u64,
        report: &CommitReport,
        mut rejected: Vec<String>,
        summary: &StateSummary,
        ms: f64,
        now: i64,
    ) -> Next {
        let (first, last) = (*offsets.start(), *offsets.end());
        let mut inner = self.lock();
        let mut rows = 0;
        for off in first..=last {
            if let Some(p) = inner.pending.remove(&off) {
                rows += p.batch.num_rows() as u64;
            }
        }
        let s = &mut inner.status;
        s.pending_batches -= (last - first + 1) as usize;
        s.pending_rows -= rows;
        s.pending_bytes -= bytes;
        s.applied_offset = last;
        s.counters.add(&report.stats);
        s.rejected_at_commit += rejected.len() as u64;
        if let Some(r) = rejected.pop() {
            s.last_rejection = Some(r);
        }
        s.state_keys = summary.keys;
        s.state_tombstones = summary.tombstones;
        s.last_error = None;
        s.degraded = false;
        if let Some(id) = report.snapshot_id {
            s.committed_offset = last;
            s.last_snapshot_id = Some(id);
            s.last_commit_ms = Some(now);
            s.commits += 1;
            s.commit_ms_total += ms;
        }
        self.next_after_commit(&inner)
    }
}

/// Commits the contiguous run of pending batches after the applied offset
/// (bounded by the commit policy). Returns what is left pending.
async fn commit_once(
    rt: &FlowRuntime,
    engine: &mut Option<Engine>,
    catalog: &Arc<dyn Catalog>,
    faults: &Arc<Faults>,
    window: Duration,
) -> Result<Next> {
    let eng = opened(rt, engine, catalog, faults).await?;
    if let Some(l) = &rt.leases {
        match l.holds(&rt.flow.name) {
            Some(epoch) => eng.set_lease(l.me(), epoch),
            // Lost since the loop looked: the next round follows.
            None => return Ok(Next::Empty),
        }
    }
    rt.reset_offsets(eng.summary().input_offset);
    rt.catch_up().await?;
    let (batches, last, bytes) = rt.next_run();
    if batches.is_empty() {
        return Ok(Next::Empty);
    }
    let n = batches.len();
    let first = last + 1 - n as i64;
    let started = std::time::Instant::now();
    let now = now_ms();
    let mut rejected = Vec::new();
    let applied = match batches.as_slice() {
        [(snapshot, Some(version))] => eng.apply_snapshot_at(snapshot, *version, now, last).await,
        _ => {
            let batch = arrow_select::concat::concat_batches(
                &rt.flow.source_arrow,
                batches.iter().map(|(b, _)| b),
            )?;
            eng.apply_at(&batch, now, last).await
        }
    };
    let report = match applied {
        Ok(r) => {
            if let Some(have) = r.skipped_for_version {
                rejected.push(format!(
                    "offset {last}: snapshot version {} skipped: the target has version {have}",
                    r.snapshot_version.unwrap_or_default()
                ));
            }
            r
        }
        Err(e @ Error::Batch { .. }) if rt.flow.from_snapshot => {
            // A snapshot the ingest checks let through: set it aside.
            dead_letter(rt, last, &e, &batches[0].0)?;
            rejected.push(format!("offset {last}: {e}"));
            CommitReport::default()
        }
        Err(Error::Batch { .. }) => {
            // A batch that meets another (a sequence tie under
            // on_sequence_tie = "error"): apply one by one, drop the rejected.
            match apply_one_by_one(rt, eng, &batches, first, now, &mut rejected).await {
                Ok(total) => total,
                Err(e) => {
                    *engine = None;
                    return Err(e);
                }
            }
        }
        Err(e) => {
            // The engine may be ahead of the catalog: reopen it next time.
            *engine = None;
            return Err(e);
        }
    };
    let ms = started.elapsed().as_secs_f64() * 1e3;
    let summary = eng.summary();
    let next = rt.record(first..=last, bytes, &report, rejected, &summary, ms, now);
    if report.snapshot_id.is_some() {
        rt.record_commit_ms(ms);
        let mut h = rt.commit_hist.lock().unwrap_or_else(|e| e.into_inner());
        let b = COMMIT_BUCKETS
            .iter()
            .position(|&ub| ms <= ub)
            .unwrap_or(COMMIT_BUCKETS.len());
        h[b] += 1;
    }
    let snapshot_id = report.snapshot_id.or(rt.committed.borrow().snapshot_id);
    rt.committed.send_replace(Committed {
        offset: last,
        snapshot_id,
    });
    rt.log
        .release(last, now.saturating_sub(window.as_millis() as i64))
        .await?;
    Ok(next)
}

/// Applies `batches` (offsets from `first`) one commit each; a batch the
/// engine refuses goes to the dead letters and into `rejected`.
async fn apply_one_by_one(
    rt: &FlowRuntime,
    eng: &mut Engine,
    batches: &[(RecordBatch, Option<i64>)],
    first: i64,
    now: i64,
    rejected: &mut Vec<String>,
) -> Result<CommitReport> {
    let mut total = CommitReport::default();
    for (i, (b, _)) in batches.iter().enumerate() {
        match eng.apply_at(b, now, first + i as i64).await {
            Ok(r) => {
                total.stats.add(&r.stats);
                total.snapshot_id = r.snapshot_id.or(total.snapshot_id);
            }
            Err(e @ Error::Batch { .. }) => {
                // Kept before a later batch's commit moves the
                // recorded offset past it.
                dead_letter(rt, first + i as i64, &e, b)?;
                rejected.push(format!("offset {}: {e}", first + i as i64))
            }
            Err(e) => return Err(e),
        }
    }
    Ok(total)
}

/// Sets an acknowledged batch that cannot be applied aside, durably.
fn dead_letter(rt: &FlowRuntime, offset: i64, e: &Error, batch: &RecordBatch) -> Result<()> {
    rt.dead.put(
        offset,
        e,
        crate::service::dead_letter::Contents::Rows(batch),
        now_ms(),
    )?;
    tracing::warn!(flow = %rt.flow.name, offset, error = %e, "dead_letter");
    Ok(())
}
