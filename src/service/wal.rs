//! The ingest log: every accepted change batch is appended and fsync'd here
//! before it is acknowledged, and stays until the commit containing it is
//! durable in the catalog and its idempotency window has passed.
//!
//! API boundary: the service sees only `IngestLog`. `LocalLog` keeps one
//! directory of segment files per flow; a log on a shared broker (Kafka,
//! NATS JetStream) implements the same trait.
//!
//! Invariants: offsets are dense and increasing and never reused, even
//! after every segment was released (the next offset also follows the
//! committed offset the caller passes at open); an append is acknowledged
//! only after `fdatasync`; a retried idempotency key gets the first
//! append's offset and appends nothing.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use crate::error::{Error, Result, codes};
use crate::fault::Faults;

/// One appended batch.
#[derive(Debug, Clone)]
pub struct Record {
    pub offset: i64,
    pub key: Option<String>,
    pub appended_ms: i64,
    pub payload: Bytes,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    pub offset: i64,
    /// The idempotency key was seen before: nothing was appended.
    pub duplicate: bool,
}

#[derive(Debug, Clone, Copy, Default, serde::Serialize, utoipa::ToSchema)]
pub struct LogStats {
    pub bytes: u64,
    pub segments: usize,
    /// The offset the next append gets.
    pub next_offset: i64,
    pub remembered_keys: usize,
    /// The bound on `bytes` (`max_log_bytes`): committed segments are
    /// released before their idempotency window ends to stay under it, and
    /// appends are refused (429) when uncommitted records alone reach it.
    pub max_bytes: u64,
    /// When the oldest retained record was appended.
    pub oldest_appended_ms: Option<i64>,
    /// Segments released before their idempotency window ended, to keep the
    /// log under `max_bytes`.
    pub early_released_segments: u64,
    /// The newest append time among records released early: an idempotency
    /// key appended at or before it is no longer recognised.
    pub idempotency_floor_ms: Option<i64>,
    /// The last group of appends could not be written or synced (a full or
    /// failing disk): its records were rolled back and refused; the next
    /// append tries again.
    pub failing: bool,
    /// Groups of appends that failed so, since the log was opened.
    pub write_failures: u64,
}

#[async_trait::async_trait]
pub trait IngestLog: Send + Sync + std::fmt::Debug {
    /// Appends one batch durably, or returns the offset an earlier append
    /// with the same idempotency key got.
    async fn append(&self, key: Option<String>, payload: Bytes, now_ms: i64) -> Result<Appended>;

    /// The retained records with offset > `after`, in order.
    async fn replay(&self, after: i64) -> Result<Vec<Record>>;

    /// Everything through `offset` is committed: segments holding only
    /// such records, all appended before `keep_after_ms`, are deleted; so
    /// are younger committed segments, oldest first, while the log is near
    /// its byte bound.
    async fn release(&self, offset: i64, keep_after_ms: i64) -> Result<()>;

    fn stats(&self) -> LogStats;

    /// The last offset stored. On a shared log other processes append too,
    /// so `stats` is only what this process has seen: a shared log asks its
    /// broker (`POST .../commit` waits for everything stored before it).
    async fn last_offset(&self) -> Result<i64> {
        Ok(self.stats().next_offset - 1)
    }

    /// The record at `offset`, when this log can hold records this process
    /// did not append or replay: a shared log where an append that timed
    /// out (and was answered 503) may still have been stored, so its retry
    /// is a duplicate of a record the service never queued.
    async fn read(&self, _offset: i64) -> Result<Option<Record>> {
        Ok(None)
    }

    /// Other processes append to this log too (a shared broker): the
    /// committer picks their records up with `replay` before each commit.
    fn shared(&self) -> bool {
        false
    }
}

/// Opens the ingest log of each flow the service runs: the seam where a log
/// on a shared broker plugs in. `LocalLogs` is the default, `NatsLogs`
/// (`service::nats_log`) the log on NATS JetStream; `tests/it/ingest_log.rs`
/// runs the service on a log in memory.
#[async_trait::async_trait]
pub trait LogFactory: Send + Sync {
    /// The stable identity of `flow`'s log. The target records the log's
    /// committed offset under it, so it must be the same after a restart.
    /// `recorded`: the logs whose offsets the flow's target records. A log
    /// on a broker that is not found while the target records offsets of
    /// such a log is not made again, empty: that would lose what the old
    /// one held (acknowledged, not yet committed).
    async fn identity(&self, flow: &str, recorded: &[String]) -> Result<String>;

    /// Opens `flow`'s log. Records through `committed` are in the target
    /// already; offsets after it must never be reused. `max_bytes` is the
    /// flow's `max_log_bytes`.
    async fn open(&self, flow: &str, committed: i64, max_bytes: u64) -> Result<Arc<dyn IngestLog>>;
}

/// Segment files roll at this size (smaller for a small `max_log_bytes`).
const SEGMENT_BYTES: u64 = 64 << 20;
/// Appends waiting for the writer thread, per flow.
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

const MAGIC: u32 = 0xACDC_0001;
const HEADER: usize = 12;
/// Largest record accepted (bodies are limited far below this by the server).
const MAX_RECORD: usize = 1 << 30;

#[derive(Debug, Clone)]
struct Segment {
    first: i64,
    last: i64,
    first_ms: i64,
    last_ms: i64,
    bytes: u64,
    keys: Vec<String>,
}

impl Segment {
    fn empty(first: i64) -> Segment {
        Segment {
            first,
            last: first - 1,
            first_ms: 0,
            last_ms: 0,
            bytes: 0,
            keys: Vec::new(),
        }
    }

    fn path(&self, dir: &Path) -> PathBuf {
        segment_path(dir, self.first)
    }
}

/// The first offsets of the segment files in `dir`, ascending.
fn segment_firsts(dir: &Path) -> Result<Vec<i64>> {
    let mut firsts: Vec<i64> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            name.strip_suffix(".wal")?.parse::<i64>().ok()
        })
        .collect();
    firsts.sort_unstable();
    Ok(firsts)
}

fn segment_path(dir: &Path, first: i64) -> PathBuf {
    dir.join(format!("{first:020}.wal"))
}

fn encode(rec: &Record) -> Vec<u8> {
    let key = rec.key.as_deref().unwrap_or("").as_bytes();
    let mut body = Vec::with_capacity(18 + key.len() + rec.payload.len());
    body.extend_from_slice(&rec.offset.to_le_bytes());
    body.extend_from_slice(&rec.appended_ms.to_le_bytes());
    body.extend_from_slice(&(key.len() as u16).to_le_bytes());
    body.extend_from_slice(key);
    body.extend_from_slice(&rec.payload);
    let mut out = Vec::with_capacity(HEADER + body.len());
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// Reads a segment's records; returns them and the length of its valid
/// prefix (a torn tail after that is the remains of a crash mid-append).
fn read_segment(path: &Path) -> Result<(Vec<Record>, u64)> {
    let mut data = Vec::new();
    File::open(path)?.read_to_end(&mut data)?;
    let mut out = Vec::new();
    let mut at = 0usize;
    while data.len() - at >= HEADER {
        let word = |i: usize| u32::from_le_bytes(data[at + i..at + i + 4].try_into().unwrap());
        let (magic, len, crc) = (word(0), word(4) as usize, word(8));
        if magic != MAGIC || len > MAX_RECORD || data.len() - at - HEADER < len || len < 18 {
            break;
        }
        let body = &data[at + HEADER..at + HEADER + len];
        if crc32fast::hash(body) != crc {
            break;
        }
        let offset = i64::from_le_bytes(body[0..8].try_into().unwrap());
        let appended_ms = i64::from_le_bytes(body[8..16].try_into().unwrap());
        let klen = u16::from_le_bytes(body[16..18].try_into().unwrap()) as usize;
        if 18 + klen > len {
            break;
        }
        let key = std::str::from_utf8(&body[18..18 + klen])
            .ok()
            .filter(|k| !k.is_empty())
            .map(str::to_string);
        out.push(Record {
            offset,
            key,
            appended_ms,
            payload: Bytes::copy_from_slice(&body[18 + klen..]),
        });
        at += HEADER + len;
    }
    Ok((out, at as u64))
}

enum Cmd {
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

/// Segment files in one directory, written by one thread that fsyncs once
/// per group of concurrent appends.
#[derive(Debug)]
pub struct LocalLog {
    dir: PathBuf,
    tx: mpsc::Sender<Cmd>,
    stats: Arc<Mutex<LogStats>>,
}

struct Writer {
    dir: PathBuf,
    segments: Vec<Segment>,
    file: BufWriter<File>,
    next: i64,
    keys: HashMap<String, i64>,
    segment_bytes: u64,
    max_bytes: u64,
    /// Everything through this offset is committed downstream.
    released_through: i64,
    early_released: u64,
    floor_ms: Option<i64>,
    /// Where to roll back to before the next append: set when a failed
    /// group's rollback itself failed.
    rollback_to: Option<Mark>,
    failing: bool,
    write_failures: u64,
    /// For log lines: the flow's name.
    name: String,
    faults: Arc<crate::fault::Faults>,
    stats: Arc<Mutex<LogStats>>,
}

/// The log's state at the start of a group of appends (everything before it
/// is durable): a failed group rolls back to it.
#[derive(Debug, Clone, Copy)]
struct Mark {
    next: i64,
    segment: i64,
    bytes: u64,
    last: i64,
    first_ms: i64,
    last_ms: i64,
    keys: usize,
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
        // Appends go to a fresh segment, so an existing file is never appended to.
        segments.push(Segment::empty(next));
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(segment_path(dir, next))?;
        sync_dir(dir)?;
        let stats = Arc::new(Mutex::new(LogStats::default()));
        let w = Writer {
            dir: dir.to_path_buf(),
            segments,
            file: BufWriter::with_capacity(1 << 20, file),
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
        std::thread::Builder::new()
            .name(format!("wal-{}", dir.display()))
            .spawn(move || w.run(rx))?;
        Ok(LocalLog {
            dir: dir.to_path_buf(),
            tx,
            stats,
        })
    }

    async fn call<T>(&self, cmd: impl FnOnce(oneshot::Sender<Result<T>>) -> Cmd) -> Result<T> {
        let (reply, rx) = oneshot::channel();
        let closed = || Error::State {
            code: codes::WAL_CLOSED,
            message: format!("the log in {} is closed", self.dir.display()),
        };
        self.tx.send(cmd(reply)).await.map_err(|_| closed())?;
        rx.await.map_err(|_| closed())?
    }
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)?.sync_all()?;
    Ok(())
}

impl Writer {
    fn run(mut self, mut rx: mpsc::Receiver<Cmd>) {
        while let Some(first) = rx.blocking_recv() {
            let mut group = vec![first];
            while group.len() < 4096 {
                match rx.try_recv() {
                    Ok(c) => group.push(c),
                    Err(_) => break,
                }
            }
            self.handle(group);
        }
        let _ = self.file.flush();
    }

    fn handle(&mut self, group: Vec<Cmd>) {
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
        self.file.flush()?;
        self.file.get_ref().sync_data()?;
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
        let null = OpenOptions::new().write(true).open("/dev/null")?;
        let stale = std::mem::replace(&mut self.file, BufWriter::with_capacity(0, null));
        drop(stale.into_parts());
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
                let f = OpenOptions::new().write(true).open(&path)?;
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
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        sync_dir(&self.dir)?;
        self.file = BufWriter::with_capacity(1 << 20, file);
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
        self.file.write_all(&frame)?;
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
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(segment_path(&self.dir, self.next))?;
        sync_dir(&self.dir)?;
        self.file = BufWriter::with_capacity(1 << 20, file);
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

    fn publish(&self) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn appends_replay_in_order_after_reopen() {
        let tmp = tempfile::tempdir().unwrap();
        rt().block_on(async {
            let log = LocalLog::open(tmp.path(), 0, 1 << 20, u64::MAX, 8).unwrap();
            for (i, s) in ["a", "b", "c"].iter().enumerate() {
                let a = log.append(None, b(s), 10).await.unwrap();
                assert_eq!(a.offset, i as i64 + 1);
            }
            drop(log);
            let log = LocalLog::open(tmp.path(), 0, 1 << 20, u64::MAX, 8).unwrap();
            let got: Vec<(i64, Bytes)> = log
                .replay(1)
                .await
                .unwrap()
                .into_iter()
                .map(|r| (r.offset, r.payload))
                .collect();
            assert_eq!(got, vec![(2, b("b")), (3, b("c"))]);
            assert_eq!(log.append(None, b("d"), 11).await.unwrap().offset, 4);
        });
    }

    /// A failed sync (a full disk) refuses the group, leaves nothing of it
    /// in the file, keeps the offsets dense and forgets its keys; the next
    /// append succeeds by itself, without a restart. Also when the failed
    /// group had rolled into new segments.
    #[test]
    fn a_failed_sync_rolls_back_and_the_log_recovers_by_itself() {
        for segment_bytes in [1 << 20, 1] {
            let tmp = tempfile::tempdir().unwrap();
            rt().block_on(async {
                let faults = Arc::new(crate::fault::Faults::default());
                let log = LocalLog::open_with_faults(
                    tmp.path(),
                    0,
                    segment_bytes,
                    u64::MAX,
                    8,
                    faults.clone(),
                )
                .unwrap();
                log.append(Some("a".into()), b("a"), 1).await.unwrap();
                faults.arm(crate::fault::FaultPoint::LogSync, 0);
                let e = log.append(Some("b".into()), b("b"), 2).await.unwrap_err();
                assert_eq!(e.code(), codes::WAL_WRITE_FAILED, "{e}");
                let st = log.stats();
                assert!(st.failing && st.write_failures == 1, "{st:?}");
                assert_eq!(st.next_offset, 2);
                // The retry is appended (not a duplicate), at the next offset.
                let again = log.append(Some("b".into()), b("b2"), 3).await.unwrap();
                assert_eq!(
                    again,
                    Appended {
                        offset: 2,
                        duplicate: false
                    }
                );
                assert!(!log.stats().failing);
                drop(log);
                let log = LocalLog::open(tmp.path(), 0, segment_bytes, u64::MAX, 8).unwrap();
                let got: Vec<(i64, Bytes)> = log
                    .replay(0)
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|r| (r.offset, r.payload))
                    .collect();
                assert_eq!(got, vec![(1, b("a")), (2, b("b2"))], "{segment_bytes}");
            });
        }
    }

    /// A segment that cannot be deleted at release is kept and reported;
    /// the log goes on (the segments after it used to be forgotten, and the
    /// next append panicked the writer: the flow's log was dead).
    #[test]
    fn a_segment_that_cannot_be_deleted_does_not_break_the_log() {
        let tmp = tempfile::tempdir().unwrap();
        rt().block_on(async {
            let log = LocalLog::open(tmp.path(), 0, 1, u64::MAX, 8).unwrap();
            for s in ["a", "b", "c"] {
                log.append(None, b(s), 1).await.unwrap();
            }
            // Offset 1's segment becomes a directory that unlink refuses.
            let seg = segment_path(tmp.path(), 1);
            std::fs::remove_file(&seg).unwrap();
            std::fs::create_dir(&seg).unwrap();
            std::fs::write(seg.join("x"), b"x").unwrap();
            assert!(log.release(3, 100).await.is_err());
            let d = log.append(None, b("d"), 2).await.unwrap();
            assert_eq!(d.offset, 4);
            std::fs::remove_dir_all(&seg).unwrap();
            log.release(4, 100).await.unwrap();
            assert_eq!(log.append(None, b("e"), 3).await.unwrap().offset, 5);
            let left: Vec<i64> = log
                .replay(0)
                .await
                .unwrap()
                .iter()
                .map(|r| r.offset)
                .collect();
            assert_eq!(left, vec![5]);
        });
    }

    #[test]
    fn a_retried_key_gets_the_first_offset_and_appends_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        rt().block_on(async {
            let log = LocalLog::open(tmp.path(), 0, 1 << 20, u64::MAX, 8).unwrap();
            let a = log.append(Some("k1".into()), b("x"), 1).await.unwrap();
            let again = log.append(Some("k1".into()), b("x"), 2).await.unwrap();
            assert_eq!(
                again,
                Appended {
                    offset: a.offset,
                    duplicate: true
                }
            );
            drop(log);
            // Still remembered after a restart.
            let log = LocalLog::open(tmp.path(), 0, 1 << 20, u64::MAX, 8).unwrap();
            let again = log.append(Some("k1".into()), b("x"), 3).await.unwrap();
            assert!(again.duplicate);
            assert_eq!(log.replay(0).await.unwrap().len(), 1);
        });
    }

    #[test]
    fn a_torn_tail_is_cut_and_offsets_continue() {
        let tmp = tempfile::tempdir().unwrap();
        rt().block_on(async {
            let log = LocalLog::open(tmp.path(), 0, 1 << 20, u64::MAX, 8).unwrap();
            log.append(None, b("one"), 1).await.unwrap();
            log.append(None, b("two"), 1).await.unwrap();
            drop(log);
            // A crash in the middle of the second record's write.
            let seg = segment_path(tmp.path(), 1);
            let len = std::fs::metadata(&seg).unwrap().len();
            OpenOptions::new()
                .write(true)
                .open(&seg)
                .unwrap()
                .set_len(len - 2)
                .unwrap();
            let log = LocalLog::open(tmp.path(), 0, 1 << 20, u64::MAX, 8).unwrap();
            let got = log.replay(0).await.unwrap();
            assert_eq!(got.len(), 1);
            assert_eq!(got[0].payload, b("one"));
            // Offset 2 was never acknowledged, so it is handed out again.
            assert_eq!(log.append(None, b("two"), 2).await.unwrap().offset, 2);
        });
    }

    #[test]
    fn release_deletes_committed_segments_after_the_window_and_offsets_never_go_back() {
        let tmp = tempfile::tempdir().unwrap();
        rt().block_on(async {
            // Tiny segments: every record rolls a new one.
            let log = LocalLog::open(tmp.path(), 0, 1, u64::MAX, 8).unwrap();
            for i in 0..4 {
                log.append(Some(format!("k{i}")), b("p"), 100 + i)
                    .await
                    .unwrap();
            }
            // Committed through 2, but appended inside the window: kept.
            log.release(2, 100).await.unwrap();
            assert_eq!(log.replay(0).await.unwrap().len(), 4);
            // After the window, records 1 and 2 go, with their keys.
            log.release(2, 1000).await.unwrap();
            let left: Vec<i64> = log
                .replay(0)
                .await
                .unwrap()
                .iter()
                .map(|r| r.offset)
                .collect();
            assert_eq!(left, vec![3, 4]);
            assert!(
                !log.append(Some("k0".into()), b("p"), 5)
                    .await
                    .unwrap()
                    .duplicate
            );
            assert!(
                log.append(Some("k3".into()), b("p"), 5)
                    .await
                    .unwrap()
                    .duplicate
            );
            // Everything committed and released: a reopen continues after it.
            log.release(5, 10_000).await.unwrap();
            drop(log);
            let log = LocalLog::open(tmp.path(), 5, 1, u64::MAX, 8).unwrap();
            assert!(log.replay(0).await.unwrap().is_empty());
            assert_eq!(log.append(None, b("p"), 6).await.unwrap().offset, 6);
        });
    }

    #[test]
    fn concurrent_appends_get_distinct_offsets() {
        let tmp = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let log = Arc::new(LocalLog::open(tmp.path(), 0, 1 << 20, u64::MAX, 64).unwrap());
            let mut tasks = Vec::new();
            for i in 0..200 {
                let log = log.clone();
                tasks.push(tokio::spawn(async move {
                    log.append(Some(format!("k{}", i % 150)), b("p"), 1)
                        .await
                        .unwrap()
                }));
            }
            let mut offsets = Vec::new();
            for t in tasks {
                let a = t.await.unwrap();
                if !a.duplicate {
                    offsets.push(a.offset);
                }
            }
            offsets.sort_unstable();
            assert_eq!(offsets, (1..=150).collect::<Vec<_>>());
            assert_eq!(log.stats().next_offset, 151);
        });
    }
}
