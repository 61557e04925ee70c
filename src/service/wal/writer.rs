//! The log's writer: a pool thread (`pool`) hands it a group of up to 4096
//! commands; it writes the group's appends, syncs once and only then
//! acknowledges; a failed group is cut back out of the file (`rollback`)
//! and the log stays usable. Release deletes committed segments, and
//! `evict` keeps the log under its bound.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::oneshot;

use super::segment::{OpenFile, Segment, encode, segment_path, sync_dir};
use super::{Appended, LogStats, Record};
use crate::error::{Error, Result, codes};

pub(super) enum Cmd {
    Append {
        key: Option<String>,
        payload: Bytes,
        now_ms: i64,
        reply: oneshot::Sender<Result<Appended>>,
    },
    Release {
        offset: i64,
        keep_after_ms: i64,
        reply: oneshot::Sender<Result<()>>,
    },
}

pub(super) struct Writer {
    pub(super) dir: PathBuf,
    pub(super) segments: Vec<Segment>,
    /// The active (last) segment, while open: opened by the first write
    /// after it was closed, closed when idle (`pool`).
    pub(super) file: Option<OpenFile>,
    /// When the last group was handled.
    pub(super) last_used: Instant,
    pub(super) next: i64,
    pub(super) keys: HashMap<String, i64>,
    pub(super) segment_bytes: u64,
    pub(super) max_bytes: u64,
    /// Everything through this offset is committed downstream.
    pub(super) released_through: i64,
    pub(super) early_released: u64,
    pub(super) floor_ms: Option<i64>,
    /// Where to roll back to before the next append: set when a failed
    /// group's rollback itself failed.
    pub(super) rollback_to: Option<Mark>,
    pub(super) failing: bool,
    pub(super) write_failures: u64,
    /// For log lines: the flow's name.
    pub(super) name: String,
    pub(super) faults: Arc<crate::fault::Faults>,
    pub(super) stats: Arc<Mutex<LogStats>>,
}

/// The log's state at the start of a group of appends (everything before it
/// is durable): a failed group rolls back to it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Mark {
    next: i64,
    segment: i64,
    bytes: u64,
    last: i64,
    first_ms: i64,
    last_ms: i64,
    keys: usize,
}

impl Writer {
    /// Whether the active segment is open now.
    pub(super) fn holds_file(&self) -> bool {
        self.file.is_some()
    }

    /// Closes the active segment if nothing is buffered for it (after a
    /// group, everything written is synced).
    pub(super) fn close_file(&mut self) {
        if self.file.as_ref().is_some_and(|f| f.w.buffer().is_empty()) {
            self.file = None;
        }
    }

    /// The active segment, opened if it is closed.
    fn active(&mut self) -> Result<&mut OpenFile> {
        if self.file.is_none() {
            let first = self.segments.last().expect("an active segment").first;
            self.file = Some(OpenFile::open(&segment_path(&self.dir, first))?);
        }
        Ok(self.file.as_mut().expect("opened above"))
    }

    pub(super) fn handle(&mut self, group: Vec<Cmd>) {
        self.last_used = Instant::now();
        let mut acks = Vec::new();
        // A rollback that failed last time is retried before anything else.
        let mut broken: Option<String> = None;
        if let Some(mark) = self.rollback_to {
            match self.rollback(mark) {
                Ok(()) => self.rollback_to = None,
                Err(e) => broken = Some(e.to_string()),
            }
        }
        // Records from this offset on are not durable until the sync below.
        let first_new = self.next;
        let mark = self.mark();
        for cmd in group {
            match cmd {
                Cmd::Append {
                    key,
                    payload,
                    now_ms,
                    reply,
                } => {
                    if let Some(&offset) = key.as_ref().and_then(|k| self.keys.get(k)) {
                        acks.push((
                            reply,
                            Ok(Appended {
                                offset,
                                duplicate: true,
                            }),
                        ));
                        continue;
                    }
                    let res = match &broken {
                        Some(e) => Err(Error::Io(std::io::Error::other(e.clone()))),
                        None => self.write(key, payload, now_ms),
                    };
                    if let Err(e) = &res
                        && !matches!(e, Error::Overloaded { .. })
                    {
                        // The file may hold part of this record: nothing
                        // more goes after it in this group.
                        broken.get_or_insert_with(|| e.to_string());
                    }
                    acks.push((reply, res));
                }
                Cmd::Release {
                    offset,
                    keep_after_ms,
                    reply,
                } => {
                    // Not while a rollback is owed: releasing may roll to
                    // a new segment from a state that is not the file's.
                    let res = match (&broken, self.rollback_to) {
                        (Some(e), Some(_)) => Err(Error::Io(std::io::Error::other(e.clone()))),
                        _ => self.release(offset, keep_after_ms),
                    };
                    let _ = reply.send(res);
                }
            }
        }
        // One fsync for the whole group, then the acknowledgements.
        let synced = match broken {
            Some(e) => Err(Error::Io(std::io::Error::other(e))),
            None if acks.iter().any(|(_, r)| matches!(r, Ok(a) if !a.duplicate)) => self.sync(),
            None => Ok(()),
        };
        if let Err(e) = &synced {
            // Nothing of this group is acknowledged, so none of it may stay:
            // the file is cut back to the group's start (a record left there
            // would be replayed later, and the offsets would not be dense).
            // A key counts only once its record is durable: a retry must
            // not be told `duplicate` for a record that may be lost.
            self.keys.retain(|_, &mut o| o < first_new);
            self.write_failures += 1;
            if !self.failing {
                tracing::error!(flow = %self.name, error = %e, "log_write_failed");
            }
            self.failing = true;
            // With an earlier rollback still owed, this group wrote nothing
            // (every append was refused) and the owed mark stays the target.
            if self.rollback_to.is_none()
                && let Err(re) = self.rollback(mark)
            {
                tracing::error!(flow = %self.name, error = %re, "log_rollback_failed");
                self.rollback_to = Some(mark);
            }
        } else if self.failing && acks.iter().any(|(_, r)| matches!(r, Ok(a) if !a.duplicate)) {
            self.failing = false;
            tracing::info!(flow = %self.name, "log_recovered");
        }
        // Stats first: whoever is acknowledged must see their record in them.
        self.publish();
        for (reply, res) in acks {
            let res = match (&synced, res) {
                (Err(e), Ok(a)) if a.offset >= first_new => Err(Error::State {
                    code: codes::WAL_WRITE_FAILED,
                    message: format!(
                        "the flow's log could not be written ({e}); nothing was kept, retry"
                    ),
                }),
                (Err(e), Err(Error::Io(_))) => Err(Error::State {
                    code: codes::WAL_WRITE_FAILED,
                    message: format!(
                        "the flow's log could not be written ({e}); nothing was kept, retry"
                    ),
                }),
                (_, r) => r,
            };
            let _ = reply.send(res);
        }
    }

    fn sync(&mut self) -> Result<()> {
        if self.faults.hit(crate::fault::FaultPoint::LogSync).is_err() {
            return Err(Error::Io(std::io::Error::other(
                "injected fault: the log's sync failed",
            )));
        }
        if let Some(f) = self.file.as_mut() {
            f.w.flush()?;
            f.w.get_ref().sync_data()?;
        }
        Ok(())
    }

    fn mark(&self) -> Mark {
        let s = self.segments.last().expect("an active segment");
        Mark {
            next: self.next,
            segment: s.first,
            bytes: s.bytes,
            last: s.last,
            first_ms: s.first_ms,
            last_ms: s.last_ms,
            keys: s.keys.len(),
        }
    }

    /// Cuts the log back to `mark`: the failed group's unflushed bytes are
    /// dropped (never written), segments it began are deleted, the marked
    /// segment's file is truncated to its length then, and appends go on
    /// from there. If this fails midway, appends stay refused until a later
    /// call succeeds.
    fn rollback(&mut self, mark: Mark) -> Result<()> {
        if let Some(stale) = self.file.take() {
            stale.discard();
        }
        while self.segments.last().is_some_and(|s| s.first > mark.segment) {
            let s = self.segments.pop().expect("a segment");
            match std::fs::remove_file(s.path(&self.dir)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                _ => {}
            }
        }
        let path = match self.segments.last_mut().filter(|s| s.first == mark.segment) {
            Some(seg) => {
                let path = seg.path(&self.dir);
                let f = std::fs::OpenOptions::new().write(true).open(&path)?;
                f.set_len(mark.bytes)?;
                f.sync_all()?;
                seg.bytes = mark.bytes;
                seg.last = mark.last;
                seg.first_ms = mark.first_ms;
                seg.last_ms = mark.last_ms;
                seg.keys.truncate(mark.keys);
                path
            }
            None => {
                // The marked segment was released meanwhile (all of it
                // committed): a fresh one starts where the group began.
                self.segments.push(Segment::empty(mark.next));
                segment_path(&self.dir, mark.next)
            }
        };
        self.file = Some(OpenFile::open(&path)?);
        sync_dir(&self.dir)?;
        self.next = mark.next;
        self.keys.retain(|_, &mut o| o < mark.next);
        Ok(())
    }

    fn write(&mut self, key: Option<String>, payload: Bytes, now_ms: i64) -> Result<Appended> {
        if self
            .segments
            .last()
            .is_some_and(|s| s.bytes >= self.segment_bytes)
        {
            self.roll()?;
        }
        let offset = self.next;
        let rec = Record {
            offset,
            key: key.clone(),
            appended_ms: now_ms,
            payload,
        };
        let frame = encode(&rec);
        let need = frame.len() as u64;
        if self.bytes() + need > self.max_bytes {
            self.evict(self.max_bytes.saturating_sub(need))?;
            if self.bytes() + need > self.max_bytes {
                let uncommitted: u64 = self
                    .segments
                    .iter()
                    .filter(|s| s.last > self.released_through)
                    .map(|s| s.bytes)
                    .sum();
                return Err(Error::Overloaded {
                    message: format!(
                        "the flow's log holds {} bytes, {uncommitted} of them not yet committed (max_log_bytes = {}); retry after a commit",
                        self.bytes(),
                        self.max_bytes
                    ),
                    retry_after_secs: 1,
                });
            }
        }
        self.active()?.w.write_all(&frame)?;
        self.next += 1;
        let seg = self.segments.last_mut().expect("an active segment");
        if seg.bytes == 0 {
            seg.first_ms = now_ms;
        }
        seg.last = offset;
        seg.last_ms = now_ms;
        seg.bytes += frame.len() as u64;
        if let Some(k) = key {
            self.keys.insert(k.clone(), offset);
            seg.keys.push(k);
        }
        Ok(Appended {
            offset,
            duplicate: false,
        })
    }

    fn roll(&mut self) -> Result<()> {
        self.sync()?;
        self.file = None;
        self.file = Some(OpenFile::open(&segment_path(&self.dir, self.next))?);
        sync_dir(&self.dir)?;
        self.segments.push(Segment::empty(self.next));
        Ok(())
    }

    fn release(&mut self, offset: i64, keep_after_ms: i64) -> Result<()> {
        self.released_through = self.released_through.max(offset);
        // A fully committed active segment is closed so it can go later.
        if self
            .segments
            .last()
            .is_some_and(|s| s.bytes > 0 && s.last <= offset)
        {
            self.roll()?;
        }
        let n = self.segments.len();
        let mut keep = Vec::with_capacity(n);
        let mut failed = None;
        for (i, s) in std::mem::take(&mut self.segments).into_iter().enumerate() {
            if i + 1 < n && s.last <= offset && s.last_ms < keep_after_ms {
                // A segment that cannot be deleted stays (and is retried
                // at the next release); the rest are not forgotten.
                if let Err(e) = self.remove(&s) {
                    failed.get_or_insert(e);
                    keep.push(s);
                }
            } else {
                keep.push(s);
            }
        }
        self.segments = keep;
        if let Some(e) = failed {
            return Err(e);
        }
        // Keep two segments of headroom under the bound, so that appends
        // seldom have to release segments themselves.
        self.evict(
            self.max_bytes
                .saturating_sub(2 * self.segment_bytes)
                .max(self.max_bytes / 2),
        )
    }

    fn bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.bytes).sum()
    }

    /// Releases committed segments, oldest first, before their idempotency
    /// window ends, until the log holds at most `target` bytes (or no
    /// committed segment is left).
    fn evict(&mut self, target: u64) -> Result<()> {
        if self.bytes() <= target {
            return Ok(());
        }
        if self
            .segments
            .last()
            .is_some_and(|s| s.bytes > 0 && s.last <= self.released_through)
        {
            self.roll()?;
        }
        let mut total = self.bytes();
        while total > target
            && self.segments.len() > 1
            && self.segments[0].last <= self.released_through
        {
            let s = self.segments.remove(0);
            if let Err(e) = self.remove(&s) {
                self.segments.insert(0, s);
                return Err(e);
            }
            total -= s.bytes;
            if s.bytes > 0 {
                self.early_released += 1;
                self.floor_ms = self.floor_ms.max(Some(s.last_ms));
            }
        }
        Ok(())
    }

    /// Deletes a released segment's file and forgets its idempotency keys.
    fn remove(&mut self, s: &Segment) -> Result<()> {
        match std::fs::remove_file(s.path(&self.dir)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
        for k in &s.keys {
            if self.keys.get(k).is_some_and(|&o| o <= s.last) {
                self.keys.remove(k);
            }
        }
        Ok(())
    }

    pub(super) fn publish(&self) {
        let mut s = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        *s = LogStats {
            bytes: self.bytes(),
            segments: self.segments.len(),
            next_offset: self.next,
            remembered_keys: self.keys.len(),
            max_bytes: self.max_bytes,
            oldest_appended_ms: self
                .segments
                .iter()
                .find(|s| s.bytes > 0)
                .map(|s| s.first_ms),
            early_released_segments: self.early_released,
            idempotency_floor_ms: self.floor_ms,
            failing: self.failing,
            write_failures: self.write_failures,
        };
    }
}
