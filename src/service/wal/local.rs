//! `LocalLog`: a flow's log in a directory of segment files. Opening it
//! recovers what is there (a torn last segment cut, damage elsewhere
//! refused with its fix) and hands its writer to the process's writer pool
//! (`pool`); `LocalLogs` opens one per flow, and `identity` names it for the
//! target's offsets.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use super::pool::{Mailbox, pool};
use super::segment::{Segment, read_segment, segment_firsts, segment_path, sync_dir};
use super::writer::{Cmd, Writer};
use super::{Appended, IngestLog, LogFactory, LogStats, Record};
use crate::error::{Error, Result, codes};
use crate::fault::Faults;

/// Segment files roll at this size (smaller for a small `max_log_bytes`).
const SEGMENT_BYTES: u64 = 64 << 20;
/// Appends waiting for the writer pool, per flow.
const QUEUE: usize = 1024;

/// A `LocalLog` per flow in `<root>/<flow>/wal`.
pub struct LocalLogs {
    root: PathBuf,
    faults: Arc<Faults>,
}

impl LocalLogs {
    pub fn new(root: impl Into<PathBuf>, faults: Arc<Faults>) -> LocalLogs {
        LocalLogs {
            root: root.into(),
            faults,
        }
    }

    /// The folder of `flow`'s log.
    pub fn dir(&self, flow: &str) -> PathBuf {
        self.root.join(flow).join("wal")
    }
}

#[async_trait::async_trait]
impl LogFactory for LocalLogs {
    async fn identity(&self, flow: &str, _recorded: &[String]) -> Result<String> {
        // The local log lives in `data_dir`, which must outlive the process
        // (the durability contract): a missing one is a new machine's.
        identity(&self.dir(flow))
    }

    async fn open(&self, flow: &str, committed: i64, max_bytes: u64) -> Result<Arc<dyn IngestLog>> {
        Ok(Arc::new(LocalLog::open_with_faults(
            &self.dir(flow),
            committed,
            (max_bytes / 8).clamp(16 << 10, SEGMENT_BYTES),
            max_bytes,
            QUEUE,
            self.faults.clone(),
        )?))
    }
}

/// The identity of the log in `dir`: a UUID made when the log is created
/// and kept in `dir/log-id`. The target records each log's committed offset
/// under it, so several logs can feed one flow.
pub fn identity(dir: &Path) -> Result<String> {
    let path = dir.join("log-id");
    match std::fs::read_to_string(&path) {
        Ok(id) if !id.trim().is_empty() => return Ok(id.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    std::fs::create_dir_all(dir)?;
    let id = uuid::Uuid::new_v4().to_string();
    let tmp = dir.join("log-id.tmp");
    {
        let mut f = File::create(&tmp)?;
        f.write_all(id.as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, &path)?;
    sync_dir(dir)?;
    Ok(id)
}

/// Segment files in one directory, written by a thread of the writer pool
/// that fsyncs once per group of concurrent appends.
pub struct LocalLog {
    dir: PathBuf,
    /// `None` only while dropped.
    tx: Option<mpsc::Sender<Cmd>>,
    mailbox: Arc<Mailbox>,
    stats: Arc<Mutex<LogStats>>,
}

impl std::fmt::Debug for LocalLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalLog").field("dir", &self.dir).finish()
    }
}

impl Drop for LocalLog {
    fn drop(&mut self) {
        // The writer handles what was sent, then sees the channel closed
        // and lets its file and memory go.
        self.tx = None;
        self.mailbox.schedule();
    }
}

impl LocalLog {
    /// Opens (or creates) the log in `dir`. `committed` is the highest
    /// offset already committed downstream; new offsets follow it. The log
    /// holds at most `max_bytes` (see `LogStats::max_bytes`).
    pub fn open(
        dir: &Path,
        committed: i64,
        segment_bytes: u64,
        max_bytes: u64,
        queue: usize,
    ) -> Result<LocalLog> {
        Self::open_with_faults(
            dir,
            committed,
            segment_bytes,
            max_bytes,
            queue,
            Default::default(),
        )
    }

    /// `open`, with `FaultPoint::LogSync` failures injectable (tests).
    pub fn open_with_faults(
        dir: &Path,
        committed: i64,
        segment_bytes: u64,
        max_bytes: u64,
        queue: usize,
        faults: Arc<crate::fault::Faults>,
    ) -> Result<LocalLog> {
        std::fs::create_dir_all(dir)?;
        let firsts = segment_firsts(dir)?;
        let mut segments = Vec::new();
        let mut keys = HashMap::new();
        let mut next = committed + 1;
        for (i, &first) in firsts.iter().enumerate() {
            let path = segment_path(dir, first);
            let (records, valid) = read_segment(&path)?;
            let len = std::fs::metadata(&path)?.len();
            if valid < len {
                if i + 1 < firsts.len() {
                    return Err(Error::State {
                        code: codes::WAL_CORRUPT,
                        message: format!(
                            "{}: damaged record at byte {valid} in a segment that is not the last one; move the file away to start without it (its batches were {})",
                            path.display(),
                            if records.last().is_some_and(|r| r.offset <= committed) {
                                "committed"
                            } else {
                                "possibly not committed"
                            }
                        ),
                    });
                }
                // A torn tail from a crash mid-append: never acknowledged.
                OpenOptions::new().write(true).open(&path)?.set_len(valid)?;
            }
            if records.is_empty() {
                // An empty segment only tells where offsets stood.
                next = next.max(first);
                std::fs::remove_file(&path)?;
                continue;
            }
            let mut seg = Segment {
                first,
                last: first - 1,
                first_ms: records[0].appended_ms,
                last_ms: 0,
                bytes: valid,
                keys: Vec::new(),
            };
            for r in &records {
                seg.last = r.offset;
                seg.last_ms = r.appended_ms;
                if let Some(k) = &r.key {
                    keys.insert(k.clone(), r.offset);
                    seg.keys.push(k.clone());
                }
            }
            next = next.max(seg.last + 1).max(first);
            segments.push(seg);
        }
        // Appends go to a fresh segment, so an existing file is never
        // appended to. Made now (it records where offsets stand), opened
        // again by the first append.
        segments.push(Segment::empty(next));
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(segment_path(dir, next))?;
        sync_dir(dir)?;
        let stats = Arc::new(Mutex::new(LogStats::default()));
        let w = Writer {
            dir: dir.to_path_buf(),
            segments,
            file: None,
            last_used: Instant::now(),
            next,
            keys,
            segment_bytes,
            max_bytes,
            released_through: committed,
            early_released: 0,
            floor_ms: None,
            rollback_to: None,
            failing: false,
            write_failures: 0,
            name: dir
                .parent()
                .and_then(|p| p.file_name())
                .map(|n| n.to_string_lossy().to_string())
                .unwrap_or_else(|| dir.display().to_string()),
            faults,
            stats: stats.clone(),
        };
        w.publish();
        let (tx, rx) = mpsc::channel(queue.max(1));
        let mailbox = pool().add(w, rx)?;
        Ok(LocalLog {
            dir: dir.to_path_buf(),
            tx: Some(tx),
            mailbox,
            stats,
        })
    }

    async fn call<T>(&self, cmd: impl FnOnce(oneshot::Sender<Result<T>>) -> Cmd) -> Result<T> {
        let (reply, rx) = oneshot::channel();
        let closed = || Error::State {
            code: codes::WAL_CLOSED,
            message: format!("the log in {} is closed", self.dir.display()),
        };
        let tx = self.tx.as_ref().ok_or_else(closed)?;
        tx.send(cmd(reply)).await.map_err(|_| closed())?;
        self.mailbox.schedule();
        rx.await.map_err(|_| closed())?
    }
}

#[async_trait::async_trait]
impl IngestLog for LocalLog {
    async fn append(&self, key: Option<String>, payload: Bytes, now_ms: i64) -> Result<Appended> {
        self.call(|reply| Cmd::Append {
            key,
            payload,
            now_ms,
            reply,
        })
        .await
    }

    async fn replay(&self, after: i64) -> Result<Vec<Record>> {
        let dir = self.dir.clone();
        tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            for first in segment_firsts(&dir)? {
                let (records, _) = read_segment(&segment_path(&dir, first))?;
                out.extend(records.into_iter().filter(|r| r.offset > after));
            }
            Ok(out)
        })
        .await
        .map_err(|e| Error::Io(std::io::Error::other(e)))?
    }

    async fn release(&self, offset: i64, keep_after_ms: i64) -> Result<()> {
        self.call(|reply| Cmd::Release {
            offset,
            keep_after_ms,
            reply,
        })
        .await
    }

    fn stats(&self) -> LogStats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }
}
