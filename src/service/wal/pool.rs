//! The writer threads every local log of the process shares, and the bound
//! on the segment files they hold open: a flow costs neither a thread nor a
//! file descriptor, so the count of flows is bounded by memory alone.
//!
//! Each log is a `Mailbox`: its commands in a bounded channel and its
//! `Writer`. A send schedules the mailbox on the pool's run queue (once: a
//! flag says it is queued or running); a worker takes it, drains up to
//! `GROUP` commands into one group (one fsync), and puts it back at the end
//! of the queue while more are waiting, so a hot log cannot starve the
//! others. One worker at a time runs a given log, so a log's groups keep
//! their order.
//!
//! Files: a log opens its active segment when it writes and closes it when
//! it has been idle for `IDLE_CLOSE`; past `MAX_OPEN` open segments the
//! least recently used idle ones are closed first. A file is closed only
//! with nothing buffered (every group ends synced), so closing loses nothing.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::segment::open_segments;
use super::writer::{Cmd, Writer};
use crate::error::Result;

/// Writer threads of the process (each blocks in `fdatasync` in turn).
pub const THREADS: usize = 8;
/// Segment files held open at once by all the logs of the process.
pub const MAX_OPEN: usize = 256;
/// A log's file is closed once the log has written nothing for this long.
const IDLE_CLOSE: Duration = Duration::from_secs(10);
/// Commands drained into one group (one fsync).
const GROUP: usize = 4096;

/// The pool of the process, started with the first log.
pub(super) fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| Pool {
        queue: Mutex::new(VecDeque::new()),
        ready: Condvar::new(),
        logs: Mutex::new(Vec::new()),
        threads: AtomicUsize::new(0),
    })
}

pub(super) struct Pool {
    /// Logs with commands waiting, in the order they became ready.
    queue: Mutex<VecDeque<Arc<Mailbox>>>,
    ready: Condvar,
    /// Every log opened (dead ones pruned by the idle sweep).
    logs: Mutex<Vec<Weak<Mailbox>>>,
    /// Worker threads started (at most `THREADS`).
    threads: AtomicUsize,
}

/// How many segment files the logs hold open, and the writer threads
/// started: for `/metrics` and the many-flows benchmark.
pub fn usage() -> (usize, usize) {
    let p = pool();
    (open_segments(), p.threads.load(Ordering::Relaxed))
}

/// One log's commands and writer.
pub(super) struct Mailbox {
    /// Queued on the pool or being run by a worker.
    scheduled: AtomicBool,
    /// `None` once the log was dropped and its last commands handled.
    inner: Mutex<Option<Inner>>,
}

struct Inner {
    writer: Writer,
    rx: mpsc::Receiver<Cmd>,
}

impl Pool {
    /// Registers a log's writer; its commands arrive on `rx`.
    pub(super) fn add(
        &'static self,
        writer: Writer,
        rx: mpsc::Receiver<Cmd>,
    ) -> Result<Arc<Mailbox>> {
        self.start_threads()?;
        let mb = Arc::new(Mailbox {
            scheduled: AtomicBool::new(false),
            inner: Mutex::new(Some(Inner { writer, rx })),
        });
        let mut logs = lock(&self.logs);
        logs.push(Arc::downgrade(&mb));
        Ok(mb)
    }

    fn start_threads(&'static self) -> Result<()> {
        while self.threads.load(Ordering::SeqCst) < THREADS {
            let n = self.threads.fetch_add(1, Ordering::SeqCst);
            if n >= THREADS {
                self.threads.fetch_sub(1, Ordering::SeqCst);
                break;
            }
            if let Err(e) = std::thread::Builder::new()
                .name(format!("wal-{n}"))
                .spawn(move || self.work())
            {
                self.threads.fetch_sub(1, Ordering::SeqCst);
                return Err(e.into());
            }
        }
        Ok(())
    }

    /// Queues `mb` unless it is queued or running already.
    pub(super) fn schedule(&self, mb: &Arc<Mailbox>) {
        if !mb.scheduled.swap(true, Ordering::SeqCst) {
            lock(&self.queue).push_back(mb.clone());
            self.ready.notify_one();
        }
    }

    fn work(&'static self) {
        let mut last_sweep = Instant::now();
        loop {
            let next = {
                let mut q = lock(&self.queue);
                loop {
                    if let Some(mb) = q.pop_front() {
                        break Some(mb);
                    }
                    let (g, timeout) = self
                        .ready
                        .wait_timeout(q, IDLE_CLOSE / 2)
                        .unwrap_or_else(|e| e.into_inner());
                    q = g;
                    if timeout.timed_out() {
                        break None;
                    }
                }
            };
            if let Some(mb) = next {
                self.run(&mb);
            }
            if last_sweep.elapsed() >= IDLE_CLOSE / 2 {
                last_sweep = Instant::now();
                self.close_files(|idle| idle >= IDLE_CLOSE, usize::MAX);
            }
        }
    }

    /// Runs one group of `mb`'s commands, then requeues it if more wait.
    fn run(&self, mb: &Arc<Mailbox>) {
        let mut more = false;
        {
            let mut guard = lock(&mb.inner);
            if let Some(inner) = guard.as_mut() {
                let mut group = Vec::new();
                let mut closed = false;
                while group.len() < GROUP {
                    match inner.rx.try_recv() {
                        Ok(c) => group.push(c),
                        Err(mpsc::error::TryRecvError::Empty) => break,
                        Err(mpsc::error::TryRecvError::Disconnected) => {
                            closed = true;
                            break;
                        }
                    }
                }
                if !group.is_empty() {
                    inner.writer.handle(group);
                }
                if closed {
                    // The log was dropped and everything it sent is handled.
                    *guard = None;
                } else {
                    more = !inner.rx.is_empty() || inner.rx.is_closed();
                }
            }
        }
        mb.scheduled.store(false, Ordering::SeqCst);
        // A send that found the flag still set left its command for us.
        let waiting = more
            || lock(&mb.inner)
                .as_ref()
                .is_some_and(|i| !i.rx.is_empty() || i.rx.is_closed());
        if waiting {
            self.schedule(mb);
        }
        if open_segments() > MAX_OPEN {
            self.close_files(|_| true, MAX_OPEN * 3 / 4);
        }
    }

    /// Closes the files of logs that no worker is running and that pass
    /// `idle` (given how long they have been idle), least recently used
    /// first, until at most `keep` are open. Never waits for a log.
    fn close_files(&self, idle: impl Fn(Duration) -> bool, keep: usize) {
        let logs: Vec<Arc<Mailbox>> = {
            let mut logs = lock(&self.logs);
            logs.retain(|w| w.strong_count() > 0);
            logs.iter().filter_map(Weak::upgrade).collect()
        };
        let mut candidates: Vec<(Instant, &Arc<Mailbox>)> = logs
            .iter()
            .filter(|mb| !mb.scheduled.load(Ordering::SeqCst))
            .filter_map(|mb| {
                let g = mb.inner.try_lock().ok()?;
                let w = &g.as_ref()?.writer;
                w.holds_file().then_some((w.last_used, mb))
            })
            .filter(|(at, _)| idle(at.elapsed()))
            .collect();
        candidates.sort_by_key(|(at, _)| *at);
        for (_, mb) in candidates {
            if open_segments() <= keep {
                break;
            }
            if let Ok(mut g) = mb.inner.try_lock()
                && let Some(inner) = g.as_mut()
            {
                inner.writer.close_file();
            }
        }
    }
}

impl Mailbox {
    pub(super) fn schedule(self: &Arc<Self>) {
        pool().schedule(self);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
