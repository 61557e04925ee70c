//! What the tools measure with, shared by `bench`, `bench-long`, `loadgen`
//! and `soak`: the file system's floor, peak RSS, a folder's size, byte
//! counts for people, and the local catalog a benchmark opens. A leaf: it
//! imports no tool.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::fault::Faults;
use crate::table::catalog::{Catalog, hadoop::HadoopCatalog};

/// The file system's own cost of a small file here: milliseconds to
/// create, write (16 KiB) and sync one file in `dir`, the median of three
/// rounds of 100. Every data, delete, manifest and metadata file a commit
/// writes pays it, so it is the floor under a small commit and under each
/// extra file of a partitioned target. The files stay until `dir` is
/// removed: deleting them first would make the next creations slower on
/// some file systems (ext4 without a journal checks recently freed inodes).
pub(crate) fn file_floor_ms(dir: &Path) -> Result<f64> {
    use std::io::Write;
    let d = dir.join("file-floor");
    std::fs::create_dir_all(&d)?;
    let buf = vec![7u8; 16 << 10];
    let mut rounds = Vec::with_capacity(3);
    for round in 0..3 {
        let t = Instant::now();
        for i in 0..100 {
            let mut f = std::fs::File::create(d.join(format!("{round}-{i:03}")))?;
            f.write_all(&buf)?;
            f.sync_all()?;
        }
        rounds.push(t.elapsed().as_secs_f64() * 1e3 / 100.0);
    }
    rounds.sort_by(f64::total_cmp);
    Ok(rounds[1])
}

/// Peak resident set size of this process, from /proc (Linux).
pub fn peak_rss_bytes() -> Option<u64> {
    peak_rss_of("self")
}

/// Peak resident set size of process `pid` ("self": this one), from /proc.
pub fn peak_rss_of(pid: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The Hadoop catalog on a local warehouse folder, as benchmarks use it.
pub(crate) fn local_catalog(warehouse: &Path) -> Result<Arc<dyn Catalog>> {
    Ok(Arc::new(HadoopCatalog::new(
        warehouse
            .to_str()
            .ok_or_else(|| Error::Config("non-UTF-8 dir".into()))?,
        None,
        Arc::new(Faults::default()),
    )?))
}

pub(crate) fn dir_bytes(p: &Path) -> u64 {
    let mut total = 0;
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            let Ok(m) = e.metadata() else { continue };
            total += if m.is_dir() {
                dir_bytes(&e.path())
            } else {
                m.len()
            };
        }
    }
    total
}

pub fn human_bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_floor_times_synced_files_and_keeps_them() {
        let dir = tempfile::tempdir().unwrap();
        let ms = file_floor_ms(dir.path()).unwrap();
        assert!(ms > 0.0 && ms.is_finite(), "{ms}");
        let files: Vec<_> = std::fs::read_dir(dir.path().join("file-floor"))
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .collect();
        assert_eq!(files.len(), 300);
        assert!(files.iter().all(|&len| len == 16 << 10));
    }
}
