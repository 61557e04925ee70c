//! The log's files: a segment per run of offsets (`<first offset>.wal`),
//! each record framed with a magic number, its length and a CRC32;
//! reading a segment stops at its valid prefix (a torn tail is the
//! remains of a crash mid-append).

use std::fs::File;
use std::io::{BufWriter, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;

use super::Record;
use crate::error::Result;

const MAGIC: u32 = 0xACDC_0001;
const HEADER: usize = 12;
/// The write buffer of an open segment (a larger record bypasses it).
const BUFFER: usize = 256 << 10;
/// Segments open for appending in the process.
static OPEN: AtomicUsize = AtomicUsize::new(0);

/// How many segments the process holds open for appending now.
pub(super) fn open_segments() -> usize {
    OPEN.load(Ordering::Relaxed)
}

/// Largest record accepted (bodies are limited far below this by the server).
const MAX_RECORD: usize = 1 << 30;

#[derive(Debug, Clone)]
pub(super) struct Segment {
    pub(super) first: i64,
    pub(super) last: i64,
    pub(super) first_ms: i64,
    pub(super) last_ms: i64,
    pub(super) bytes: u64,
    pub(super) keys: Vec<String>,
}

impl Segment {
    pub(super) fn empty(first: i64) -> Segment {
        Segment {
            first,
            last: first - 1,
            first_ms: 0,
            last_ms: 0,
            bytes: 0,
            keys: Vec::new(),
        }
    }

    pub(super) fn path(&self, dir: &Path) -> PathBuf {
        segment_path(dir, self.first)
    }
}

/// The first offsets of the segment files in `dir`, ascending.
pub(super) fn segment_firsts(dir: &Path) -> Result<Vec<i64>> {
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

pub(super) fn segment_path(dir: &Path, first: i64) -> PathBuf {
    dir.join(format!("{first:020}.wal"))
}

pub(super) fn encode(rec: &Record) -> Vec<u8> {
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
pub(super) fn read_segment(path: &Path) -> Result<(Vec<Record>, u64)> {
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

pub(super) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)?.sync_all()?;
    Ok(())
}

/// An open segment file, counted (`open_segments`) while it lives; the
/// writer pool keeps the count under its bound.
pub(super) struct OpenFile {
    pub(super) w: BufWriter<File>,
    _slot: Slot,
}

struct Slot;

impl Drop for Slot {
    fn drop(&mut self) {
        OPEN.fetch_sub(1, Ordering::Relaxed);
    }
}

impl OpenFile {
    /// Opens (creating it if needed) a segment for appending.
    pub(super) fn open(path: &Path) -> Result<OpenFile> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        OPEN.fetch_add(1, Ordering::Relaxed);
        Ok(OpenFile {
            w: BufWriter::with_capacity(BUFFER, file),
            _slot: Slot,
        })
    }

    /// Closes the file without writing what is buffered (a failed group's
    /// bytes, which must never reach the file).
    pub(super) fn discard(self) {
        let OpenFile { w, _slot } = self;
        drop(w.into_parts());
    }
}
