//! `autocdc apply`: change files into a flow's target, each file (or
//! `--batch-rows` rows) one micro-batch and one commit, read a file ahead on
//! a blocking thread (`InputFiles`); or, with `--snapshot-version`, the files
//! together one snapshot.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use arrow_array::RecordBatch;

use super::now_ms;
use super::setup::{open_catalog, progress, stats_line};
use crate::config::CatalogConfig;
use crate::core::flow::Flow;
use crate::core::resolve::BatchStats;
use crate::error::{Error, Result};
use crate::fault::Faults;
use crate::service::input;
use crate::table::engine::Engine;

/// `apply --snapshot-version V`: the files together are one snapshot.
pub(super) async fn apply_snapshot(
    catalog: &CatalogConfig,
    flow: Flow,
    files: &[PathBuf],
    version: i64,
) -> Result<()> {
    let catalog = open_catalog(catalog)?;
    let mut engine = Engine::open(flow.clone(), catalog, Arc::new(Faults::default())).await?;
    let mut parts = Vec::new();
    for f in files {
        parts.push(input::read_file(&flow, f)?);
    }
    let rows = arrow_select::concat::concat_batches(&flow.source_arrow, &parts)?;
    let offset = engine.summary().input_offset + 1;
    let r = engine
        .apply_snapshot_at(&rows, version, now_ms(), offset)
        .await?;
    if let Some(have) = r.skipped_for_version {
        println!(
            "snapshot version {version} skipped: {} already has version {have} (versions must increase)",
            flow.target
        );
        return Ok(());
    }
    let s = &r.stats;
    println!(
        "snapshot version {version}: rows={} inserted+updated={} deleted={} unchanged={} files={} delete_files={} snapshot={}",
        s.rows_in,
        s.upserts,
        s.deletes,
        s.unchanged,
        r.data_files,
        r.delete_files,
        r.snapshot_id
            .map(|s| s.to_string())
            .unwrap_or_else(|| "none".into()),
    );
    Ok(())
}

/// A batch of `InputFiles` and its name, or the file that could not be read.
type Next = std::result::Result<(String, RecordBatch), (String, Error)>;

/// The input of `autocdc apply`, batch by batch: each file is read on a
/// blocking thread while the batch before it is applied, one file ahead.
/// So memory holds at most two files' rows (and, with `--batch-rows`, a
/// batch's remainder), never the whole input, and reading overlaps the
/// commits.
struct InputFiles {
    flow: Arc<Flow>,
    files: std::collections::VecDeque<PathBuf>,
    /// The next file, being read.
    ahead: Option<(PathBuf, tokio::task::JoinHandle<Result<RecordBatch>>)>,
    /// `--batch-rows`: the batches re-cut to this many rows.
    batch_rows: Option<usize>,
    /// Rows read but not yet in a batch (`--batch-rows`), and the input
    /// row the first of them is.
    carry: Option<RecordBatch>,
    carry_at: usize,
    /// Files whose rows were taken so far.
    read: u64,
}

impl InputFiles {
    fn new(flow: &Flow, files: &[PathBuf], batch_rows: Option<usize>) -> InputFiles {
        let mut input = InputFiles {
            flow: Arc::new(flow.clone()),
            files: files.iter().cloned().collect(),
            ahead: None,
            batch_rows,
            carry: None,
            carry_at: 0,
            read: 0,
        };
        input.read_ahead();
        input
    }

    fn read_ahead(&mut self) {
        self.ahead = self.files.pop_front().map(|path| {
            let (flow, p) = (self.flow.clone(), path.clone());
            let task = tokio::task::spawn_blocking(move || input::read_file(&flow, &p));
            (path, task)
        });
    }

    /// The next file's name and rows (reading the one after it meanwhile).
    async fn next_file(&mut self) -> Option<Next> {
        let (path, task) = self.ahead.take()?;
        self.read_ahead();
        self.read += 1;
        let name = path.display().to_string();
        Some(match task.await {
            Ok(Ok(b)) => Ok((name, b)),
            Ok(Err(e)) => Err((name, e)),
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => {
                let e = Error::Config(format!("reading {name} stopped: {e}"));
                Err((name, e))
            }
        })
    }

    /// The next batch and its name: a file's rows, or with `--batch-rows`
    /// the next `n` rows of the input (the last batch may hold fewer).
    /// Err: the file that could not be read, and why.
    async fn next(&mut self) -> Option<Next> {
        let Some(n) = self.batch_rows else {
            return self.next_file().await;
        };
        loop {
            let held = self.carry.as_ref().map_or(0, RecordBatch::num_rows);
            if held >= n || (held > 0 && self.ahead.is_none()) {
                let carry = self.carry.take()?;
                let take = n.min(held);
                let name = format!("rows {}..", self.carry_at);
                self.carry = (held > take).then(|| carry.slice(take, held - take));
                self.carry_at += take;
                return Some(Ok((name, carry.slice(0, take))));
            }
            let (name, b) = match self.next_file().await? {
                Ok(file) => file,
                Err(unread) => return Some(Err(unread)),
            };
            self.carry = Some(match self.carry.take() {
                Some(c) => {
                    match arrow_select::concat::concat_batches(&self.flow.source_arrow, [&c, &b]) {
                        Ok(joined) => joined,
                        Err(e) => return Some(Err((name, e.into()))),
                    }
                }
                None => b,
            });
        }
    }
}

pub(super) async fn apply_files(
    catalog: &CatalogConfig,
    flow: Flow,
    files: &[PathBuf],
    batch_rows: Option<usize>,
) -> Result<()> {
    if batch_rows == Some(0) {
        return Err(Error::Config("--batch-rows must be at least 1".into()));
    }
    let catalog = open_catalog(catalog)?;
    let mut engine = Engine::open(flow.clone(), catalog, Arc::new(Faults::default())).await?;
    let mut input = InputFiles::new(&flow, files, batch_rows);
    // Without `--batch-rows` a file is a batch, so the count is known.
    let of = match batch_rows {
        None => format!("/{}", files.len()),
        Some(_) => String::new(),
    };
    let pb = progress(files.len() as u64, "files");
    let mut total = BatchStats::default();
    let started = Instant::now();
    let mut applied = 0;
    while let Some(next) = input.next().await {
        let i = applied;
        let t = Instant::now();
        let (name, b) = match next {
            Ok(batch) => batch,
            Err((file, e)) => {
                pb.finish_and_clear();
                eprintln!(
                    "{file} could not be read; earlier batches committed: {i} (re-running the same files is safe: applied changes resolve as duplicates)"
                );
                return Err(e);
            }
        };
        let r = match engine.apply(&b, now_ms()).await {
            Ok(r) => r,
            Err(e) => {
                pb.finish_and_clear();
                eprintln!(
                    "batch {}{of} {name} was not applied; earlier batches committed: {i} (re-running the same files is safe: applied changes resolve as duplicates)",
                    i + 1,
                );
                return Err(e);
            }
        };
        applied += 1;
        total.add(&r.stats);
        pb.suspend(|| {
            println!(
                "batch {}{of} {name}: {} files={} delete_files={} snapshot={} ({:.0} ms)",
                i + 1,
                stats_line(&r.stats),
                r.data_files,
                r.delete_files,
                r.snapshot_id
                    .map(|s| s.to_string())
                    .unwrap_or_else(|| "none (no change)".into()),
                t.elapsed().as_secs_f64() * 1e3
            )
        });
        pb.set_position(input.read);
    }
    pb.finish_and_clear();
    expire_over_count(&mut engine).await?;
    let s = engine.summary();
    println!(
        "applied {applied} batches in {:.2} s: {}; table {} has {} live keys, {} tombstones",
        started.elapsed().as_secs_f64(),
        stats_line(&total),
        flow.target,
        s.live,
        s.tombstones
    );
    Ok(())
}

/// After `apply`: a table over its snapshot count limit (`snapshot_max_count`,
/// default 500) is maintained as the service's schedule would (expiry and
/// the cleanup of what expired; no orphan listing), so a cron of `apply`s
/// keeps metadata.json bounded too.
async fn expire_over_count(engine: &mut Engine) -> Result<()> {
    use crate::table::properties::Retention;
    let policy = engine.flow.maintenance;
    let over = |t: &crate::table::catalog::TableState| {
        t.metadata.snapshots().len() > Retention::of(&t.metadata, &policy).max_count
    };
    if !policy.scheduled || !(over(engine.target()) || over(engine.state_table())) {
        return Ok(());
    }
    let r = engine
        .maintain(&crate::table::engine::MaintainOptions {
            now_ms: now_ms(),
            dry_run: false,
            orphans_older_than: None,
            compact: false,
        })
        .await?;
    println!(
        "over the snapshot count limit: expired {} snapshots (maintenance as `autocdc maintain` without orphans)",
        r.target.snapshots_expired + r.state.snapshots_expired
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use arrow_array::Int64Array;

    use super::*;
    use crate::tools::generate as gk;

    fn flow() -> Flow {
        Flow::new(gk::changes_flow("t", "t.events").unwrap()).unwrap()
    }

    /// Writes NDJSON files of `rows` change rows each, ids counting on
    /// across the files; returns their paths.
    fn files(dir: &Path, rows: &[usize]) -> Vec<PathBuf> {
        let mut id = 0;
        rows.iter()
            .enumerate()
            .map(|(f, &n)| {
                let path = dir.join(format!("part-{f}.ndjson"));
                let body: String = (0..n)
                    .map(|_| {
                        id += 1;
                        format!("{{\"id\": {id}, \"seq\": {id}, \"op\": \"UPSERT\"}}\n")
                    })
                    .collect();
                std::fs::write(&path, body).unwrap();
                path
            })
            .collect()
    }

    fn ids(b: &RecordBatch) -> Vec<i64> {
        let c = b.column_by_name("id").unwrap();
        c.as_any()
            .downcast_ref::<Int64Array>()
            .unwrap()
            .values()
            .to_vec()
    }

    /// Every batch of `input`, or the file that could not be read.
    async fn drain(mut input: InputFiles) -> (Vec<(String, Vec<i64>)>, Option<(String, Error)>) {
        let mut out = Vec::new();
        while let Some(next) = input.next().await {
            match next {
                Ok((name, b)) => out.push((name, ids(&b))),
                Err(unread) => return (out, Some(unread)),
            }
        }
        (out, None)
    }

    #[tokio::test]
    async fn each_file_is_a_batch_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let paths = files(dir.path(), &[3, 1, 2]);
        let (got, unread) = drain(InputFiles::new(&flow(), &paths, None)).await;
        assert!(unread.is_none());
        let want: Vec<(String, Vec<i64>)> = vec![
            (paths[0].display().to_string(), vec![1, 2, 3]),
            (paths[1].display().to_string(), vec![4]),
            (paths[2].display().to_string(), vec![5, 6]),
        ];
        assert_eq!(got, want);
    }

    #[tokio::test]
    async fn batch_rows_cut_the_input_across_files() {
        let dir = tempfile::tempdir().unwrap();
        let paths = files(dir.path(), &[3, 1, 5, 0, 2]);
        let (got, unread) = drain(InputFiles::new(&flow(), &paths, Some(4))).await;
        assert!(unread.is_none());
        let want: Vec<(String, Vec<i64>)> = vec![
            ("rows 0..".into(), vec![1, 2, 3, 4]),
            ("rows 4..".into(), vec![5, 6, 7, 8]),
            ("rows 8..".into(), vec![9, 10, 11]),
        ];
        assert_eq!(got, want);
        // One row per batch, and more rows per batch than the input has.
        let (got, _) = drain(InputFiles::new(&flow(), &paths, Some(1))).await;
        assert_eq!(got.len(), 11);
        assert!(
            got.iter()
                .enumerate()
                .all(|(i, (_, ids))| ids == &[i as i64 + 1])
        );
        let (got, _) = drain(InputFiles::new(&flow(), &paths, Some(100))).await;
        assert_eq!(got, vec![("rows 0..".to_string(), (1..=11).collect())]);
    }

    #[tokio::test]
    async fn a_file_that_cannot_be_read_comes_after_the_batches_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut paths = files(dir.path(), &[2, 2]);
        let bad = dir.path().join("bad.ndjson");
        std::fs::write(&bad, "{\"id\": 1\n").unwrap();
        paths.insert(1, bad.clone());
        for batch_rows in [None, Some(1)] {
            let (got, unread) = drain(InputFiles::new(&flow(), &paths, batch_rows)).await;
            let ids: Vec<i64> = got.iter().flat_map(|(_, ids)| ids.clone()).collect();
            assert_eq!(ids, vec![1, 2], "{batch_rows:?}");
            let (file, e) = unread.expect("the bad file is an error");
            assert_eq!(file, bad.display().to_string());
            assert!(e.to_string().contains("MALFORMED"), "{e}");
        }
        let missing = vec![dir.path().join("missing.ndjson")];
        let (got, unread) = drain(InputFiles::new(&flow(), &missing, None)).await;
        assert!(got.is_empty());
        assert!(unread.unwrap().1.to_string().contains("cannot open"));
    }
}
