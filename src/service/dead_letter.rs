//! A flow's dead-letter area: records that were acknowledged but can never
//! be applied (a sequence tie under `on_sequence_tie = "error"`, a snapshot
//! the engine refuses, a log record that no longer decodes). Each is kept in
//! `data_dir/flows/<flow>/dead-letters` with its offset, its error and the
//! record itself, and the flow moves past it: one bad record never stops a
//! flow. At most `max` are kept (oldest go first), so the area is bounded.
//!
//! Files: `<offset>.json` (a `DeadLetter`) and `<offset>.arrows` (the rows
//! as an Arrow IPC stream; `pyarrow.ipc.open_stream` reads it) or
//! `<offset>.bin` (a log record that does not decode, as it was logged).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::error::Result;

/// One dead letter, as listed by `GET /v1/flows/{flow}/dead-letters`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DeadLetter {
    /// The record's offset in the flow's log.
    pub offset: i64,
    /// The error's stable code.
    pub code: String,
    pub error: String,
    /// Rows in the record (0 when it does not decode).
    pub rows: usize,
    /// When it was set aside.
    pub dead_at_ms: i64,
    /// The record's file, next to this entry in the dead-letter directory.
    pub record: String,
}

/// What a record is kept as.
pub enum Contents<'a> {
    /// Rows, written as an Arrow IPC stream.
    Rows(&'a arrow_array::RecordBatch),
    /// A log record's bytes as logged.
    Raw(&'a [u8]),
}

#[derive(Debug)]
pub struct DeadLetters {
    dir: PathBuf,
    max: usize,
    /// Offsets kept, ascending.
    offsets: Mutex<Vec<i64>>,
}

impl DeadLetters {
    /// Opens (or creates) the area in `dir`, keeping at most `max` letters.
    pub fn open(dir: &Path, max: usize) -> Result<DeadLetters> {
        std::fs::create_dir_all(dir)?;
        let mut offsets: Vec<i64> = std::fs::read_dir(dir)?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().to_string();
                name.strip_suffix(".json")?.parse().ok()
            })
            .collect();
        offsets.sort_unstable();
        Ok(DeadLetters {
            dir: dir.to_path_buf(),
            max: max.max(1),
            offsets: Mutex::new(offsets),
        })
    }

    pub fn count(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<i64>> {
        self.offsets.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps the record at `offset` with its error, durably (the caller
    /// moves past the record only after this returns). Putting the same
    /// offset again (a replay after a crash) replaces it.
    pub fn put(
        &self,
        offset: i64,
        error: &crate::Error,
        contents: Contents<'_>,
        now_ms: i64,
    ) -> Result<()> {
        let (record, bytes, rows) = match contents {
            Contents::Rows(b) => (
                format!("{offset:020}.arrows"),
                crate::service::input::encode_arrow_ipc(b)?,
                b.num_rows(),
            ),
            Contents::Raw(b) => (format!("{offset:020}.bin"), b.to_vec(), 0),
        };
        let letter = DeadLetter {
            offset,
            code: error.code().to_string(),
            error: error.to_string(),
            rows,
            dead_at_ms: now_ms,
            record: record.clone(),
        };
        write_durably(&self.dir.join(&record), &bytes)?;
        write_durably(&self.json(offset), &serde_json::to_vec_pretty(&letter)?)?;
        std::fs::File::open(&self.dir)?.sync_all()?;
        let mut offsets = self.lock();
        if let Err(at) = offsets.binary_search(&offset) {
            offsets.insert(at, offset);
        }
        while offsets.len() > self.max {
            let oldest = offsets.remove(0);
            self.remove(oldest);
        }
        Ok(())
    }

    fn json(&self, offset: i64) -> PathBuf {
        self.dir.join(format!("{offset:020}.json"))
    }

    fn remove(&self, offset: i64) {
        for ext in ["json", "arrows", "bin"] {
            let _ = std::fs::remove_file(self.dir.join(format!("{offset:020}.{ext}")));
        }
    }

    /// The newest `limit` letters, newest first, and how many are kept.
    pub fn list(&self, limit: usize) -> Result<(usize, Vec<DeadLetter>)> {
        let offsets: Vec<i64> = self.lock().clone();
        let mut out = Vec::new();
        for &o in offsets.iter().rev().take(limit) {
            match std::fs::read(self.json(o)) {
                Ok(b) => out.push(serde_json::from_slice(&b)?),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok((offsets.len(), out))
    }
}

/// Writes `path` whole or not at all: a temporary file, fsync'd, renamed.
fn write_durably(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn letters_are_kept_durably_newest_first_and_bounded() {
        let tmp = tempfile::tempdir().unwrap();
        let d = DeadLetters::open(tmp.path(), 3).unwrap();
        let e = crate::Error::Unavailable("x".into());
        for o in [5, 1, 9, 7] {
            d.put(o, &e, Contents::Raw(b"abc"), 10).unwrap();
        }
        d.put(9, &e, Contents::Raw(b"again"), 11).unwrap();
        let (n, list) = d.list(10).unwrap();
        assert_eq!(n, 3);
        assert_eq!(
            list.iter().map(|l| l.offset).collect::<Vec<_>>(),
            vec![9, 7, 5]
        );
        assert_eq!(list[0].dead_at_ms, 11);
        assert_eq!(
            std::fs::read(tmp.path().join(&list[0].record)).unwrap(),
            b"again"
        );
        assert!(!tmp.path().join(format!("{:020}.json", 1)).exists());
        // Reopened: the same letters.
        let d = DeadLetters::open(tmp.path(), 3).unwrap();
        assert_eq!(d.count(), 3);
    }
}
