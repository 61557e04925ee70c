//! `autocdc bench-long`: thousands of small commits into one flow on the
//! Hadoop catalog, with maintenance on and then off, in one run. Every
//! `--every` commits it prints the figures that grow with commits when
//! nothing bounds them: commit latency, metadata.json bytes, snapshots,
//! manifests, data and delete files, bytes on disk, and the time of a full
//! scan of the target. Figures are printed, never asserted.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use iceberg::TableUpdate;
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::core::flow::Flow;
use crate::error::{Error, Result};
use crate::fault::Faults;
use crate::service::now_ms;
use crate::table::catalog::Catalog;
use crate::table::engine::{Engine, MaintainOptions};
use crate::table::maintain;
use crate::tools::generate;
use crate::tools::measure::{dir_bytes, human_bytes, local_catalog};

#[derive(Args, Debug, Clone)]
pub struct BenchLongArgs {
    /// Commits per run.
    #[arg(long, default_value_t = 10_000)]
    pub commits: usize,
    /// Change events per commit.
    #[arg(long, default_value_t = 500)]
    pub events: usize,
    /// Distinct keys the events touch.
    #[arg(long, default_value_t = 40_000)]
    pub keys: usize,
    #[arg(long, default_value_t = 0.1)]
    pub delete_fraction: f64,
    /// Print the figures every this many commits.
    #[arg(long, default_value_t = 1_000)]
    pub every: usize,
    /// With maintenance on, run it every this many commits (the service
    /// runs it when 20 snapshots can expire, or every 10 minutes).
    #[arg(long, default_value_t = 20)]
    pub maintain_every: usize,
    /// In the `on` run, compact every this many commits (60: the service's
    /// default `compaction.interval` of 10 minutes at 10 s commits).
    #[arg(long, default_value_t = 60)]
    pub compact_every: usize,
    /// Also time a full scan through DuckDB with this Python (with the
    /// `duckdb` and its iceberg extension packages, see integration/suite.sh).
    #[arg(long)]
    pub duckdb: Option<std::path::PathBuf>,
    /// Snapshots each table keeps with maintenance on: 180 is 30 minutes of
    /// 10 s commits, what `autocdc serve` keeps by default.
    #[arg(long, default_value_t = 180)]
    pub keep_snapshots: u32,
    /// Runs, in order: `on` (autocdc's defaults: table health and
    /// compaction), `health` (expiry and manifest merging, no compaction),
    /// `off` (no expiry, no manifest merging, old metadata kept: how tables
    /// aged before), `defaults` (as `on`, with the retention a created table
    /// gets instead of `--keep-snapshots`: at a high commit rate, the count
    /// limit).
    #[arg(long, default_value = "on,off")]
    pub modes: String,
    /// Commits of the `off` run: its old metadata files alone grow with the
    /// square of the commit count (about 3.6 GB at 2,000, 90 GB at 10,000).
    #[arg(long, default_value_t = 2_000)]
    pub off_commits: usize,
    /// A full scan taking longer than this is reported as such and given up.
    #[arg(long, default_value = "300s")]
    pub scan_timeout: String,
    /// Where to put the warehouses (default: a fresh temp dir, removed after).
    #[arg(long)]
    pub dir: Option<std::path::PathBuf>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// One checkpoint's figures.
#[derive(Debug, Clone, Default)]
struct Row {
    commits: usize,
    p50_ms: f64,
    p99_ms: f64,
    metadata_bytes: u64,
    snapshots: usize,
    manifests: usize,
    data_files: u64,
    delete_files: u64,
    disk_bytes: u64,
    live_bytes: u64,
    scan_ms: Option<f64>,
    /// The same rows as one Parquet file, read whole.
    one_file_ms: Option<f64>,
    /// DuckDB: the table, and the one file.
    duck: Option<(f64, f64)>,
    rows: usize,
    /// Share of the run's wall time spent compacting so far.
    compaction_share: f64,
}

pub async fn run(args: BenchLongArgs) -> Result<()> {
    if args.commits == 0 || args.events == 0 || args.keys == 0 || args.every == 0 {
        return Err(Error::Config(
            "--commits, --events, --keys and --every must be at least 1".into(),
        ));
    }
    let scan_timeout = crate::core::flow::parse_duration("--scan-timeout", &args.scan_timeout)
        .map_err(Error::Config)?;
    let modes: Vec<String> = args
        .modes
        .split(',')
        .map(|m| m.trim().to_string())
        .collect();
    if let Some(m) = modes
        .iter()
        .find(|m| !["on", "health", "off", "defaults"].contains(&m.as_str()))
    {
        return Err(Error::Config(format!(
            "--modes: `{m}` is not one of on, health, off, defaults"
        )));
    }
    let tmp;
    let dir = match &args.dir {
        Some(d) => d.clone(),
        None => {
            tmp = std::env::temp_dir().join(format!("autocdc-bench-long-{}", uuid::Uuid::new_v4()));
            tmp.clone()
        }
    };
    println!(
        "autocdc bench-long: {} commits of {} events over {} keys ({:.0}% deletes), Hadoop catalog in {}",
        args.commits,
        args.events,
        args.keys,
        args.delete_fraction * 100.0,
        dir.display()
    );
    std::fs::create_dir_all(&dir)?;
    println!(
        "file system: {:.2} ms to create, write and sync one 16 KiB file there (median of 3 x 100); every commit writes several (data, deletes, manifests, metadata, state)",
        crate::tools::measure::file_floor_ms(&dir)?
    );
    let mut results: Vec<(String, Vec<Row>)> = Vec::new();
    for mode in &modes {
        let warehouse = dir.join(format!("warehouse-{mode}"));
        std::fs::create_dir_all(&warehouse)?;
        println!(
            "-- maintenance {mode}{}",
            match mode.as_str() {
                "off" => ": no expiry, no manifest merging, old metadata.json kept".to_string(),
                "defaults" => format!(
                    ": autocdc's defaults (snapshots younger than 30 min, at most {} per table), every {} commits, compaction every {} commits",
                    crate::table::properties::DEFAULT_MAX_COUNT,
                    args.maintain_every,
                    args.compact_every
                ),
                m => format!(
                    ": every {} commits, {} snapshots kept, manifests merged from 100{}",
                    args.maintain_every,
                    args.keep_snapshots,
                    if m == "on" {
                        format!(", compaction every {} commits", args.compact_every)
                    } else {
                        ", no compaction".into()
                    }
                ),
            }
        );
        let commits = if mode == "off" {
            args.off_commits.min(args.commits)
        } else {
            args.commits
        };
        let rows = run_mode(&args, mode, commits, &warehouse, scan_timeout).await?;
        results.push((mode.clone(), rows));
    }
    if let [(a, on), (b, off)] = results.as_slice()
        && let Some(y) = off.last()
        && let Some(x) = on.iter().find(|r| r.commits == y.commits)
    {
        println!("-- at commit {}: {a} / {b}", x.commits);
        let ratio = |p: f64, q: f64| {
            if q > 0.0 {
                format!("{:.2}", p / q)
            } else {
                "-".into()
            }
        };
        println!("   commit p50 {}", ratio(x.p50_ms, y.p50_ms));
        println!(
            "   metadata.json {}",
            ratio(x.metadata_bytes as f64, y.metadata_bytes as f64)
        );
        println!(
            "   snapshots {}",
            ratio(x.snapshots as f64, y.snapshots as f64)
        );
        println!(
            "   manifests {}",
            ratio(x.manifests as f64, y.manifests as f64)
        );
        println!(
            "   bytes on disk {}",
            ratio(x.disk_bytes as f64, y.disk_bytes as f64)
        );
        if let (Some(p), Some(q)) = (x.scan_ms, y.scan_ms) {
            println!("   scan {}", ratio(p, q));
        }
    }
    for (mode, rows) in &results {
        if let (Some(first), Some(last)) = (rows.first(), rows.last()) {
            println!(
                "-- {mode}: commit {} / commit {}: p50 {:.2}x, scan {}",
                last.commits,
                first.commits,
                last.p50_ms / first.p50_ms.max(1e-9),
                match (last.scan_ms, first.scan_ms) {
                    (Some(p), Some(q)) => format!("{:.2}x", p / q.max(1e-9)),
                    _ => "-".into(),
                }
            );
        }
    }
    if args.dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

/// `defaults`: the retention autocdc gives a table it creates (the age
/// and count limits), not `--keep-snapshots`.
fn flow(args: &BenchLongArgs, on: bool, compact: bool, defaults: bool) -> Result<Flow> {
    let mut cfg = generate::changes_flow("long", "bench.long")?;
    cfg.compaction = Some(crate::core::flow::CompactionConfig {
        enabled: Some(compact),
        ..Default::default()
    });
    if on && !defaults {
        cfg.snapshot_max_age = Some("1ms".into());
        cfg.min_snapshots_to_keep = Some(args.keep_snapshots.max(1));
    }
    cfg.maintenance = Some(on);
    Flow::new(cfg)
}

async fn run_mode(
    args: &BenchLongArgs,
    mode: &str,
    commits: usize,
    warehouse: &Path,
    scan_timeout: Duration,
) -> Result<Vec<Row>> {
    let catalog = local_catalog(warehouse)?;
    let on = mode != "off";
    let compact = mode == "on" || mode == "defaults";
    let flow = flow(args, on, compact, mode == "defaults")?;
    let run_started = Instant::now();
    let mut compaction_ms = 0.0;
    let mut engine =
        Engine::open(flow.clone(), catalog.clone(), Arc::new(Faults::default())).await?;
    if !on {
        // How tables were kept before: nothing merged, nothing deleted.
        let props = HashMap::from([
            (
                crate::table::properties::PROP_MERGE_ENABLED.to_string(),
                "false".to_string(),
            ),
            (
                crate::table::properties::PROP_DELETE_AFTER_COMMIT.to_string(),
                "false".to_string(),
            ),
            (
                crate::table::properties::PROP_PREVIOUS_MAX.to_string(),
                "100".to_string(),
            ),
        ]);
        for t in [engine.target().clone(), engine.state_table().clone()] {
            catalog
                .commit(
                    &t,
                    vec![TableUpdate::SetProperties {
                        updates: props.clone(),
                    }],
                    vec![],
                )
                .await?;
        }
        engine = Engine::open(flow.clone(), catalog.clone(), Arc::new(Faults::default())).await?;
    }
    let mut rng = StdRng::seed_from_u64(args.seed);
    let mut window: Vec<f64> = Vec::with_capacity(args.every);
    let mut rows = Vec::new();
    println!(
        "   {:>7} {:>7} {:>7} {:>9} {:>5} {:>5} {:>6} {:>7} {:>9} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>7} {:>6}",
        "commits",
        "p50 ms",
        "p99 ms",
        "meta.json",
        "snaps",
        "manif",
        "data",
        "deletes",
        "avg file",
        "on disk",
        "live",
        "scan ms",
        "1file ms",
        "duck ms",
        "duck 1f",
        "rows",
        "compact"
    );
    for i in 0..commits {
        let batch = generate::changes(
            &flow.source_arrow,
            &mut rng,
            args.events,
            args.keys,
            0,
            (i * args.events) as i64,
            args.delete_fraction,
        )?;
        let t = Instant::now();
        engine.apply(&batch, now_ms()).await?;
        window.push(t.elapsed().as_secs_f64() * 1e3);
        let compact_now = compact && (i + 1) % args.compact_every.max(1) == 0;
        if on && ((i + 1) % args.maintain_every == 0 || compact_now) {
            let report = engine
                .maintain(&MaintainOptions {
                    now_ms: now_ms(),
                    dry_run: false,
                    orphans_older_than: None,
                    compact: compact_now,
                })
                .await?;
            compaction_ms += report.compaction.map_or(0.0, |c| c.elapsed_ms);
        }
        if (i + 1) % args.every == 0 || i + 1 == commits {
            let mut row = checkpoint(
                &engine,
                &catalog,
                warehouse,
                i + 1,
                &mut window,
                scan_timeout,
                args.duckdb.as_deref(),
            )
            .await?;
            row.compaction_share = compaction_ms / (run_started.elapsed().as_secs_f64() * 1e3);
            let ms = |m: Option<f64>| m.map_or_else(|| "-".to_string(), |m| format!("{m:.0}"));
            let files = (row.data_files + row.delete_files).max(1);
            println!(
                "   {:>7} {:>7.1} {:>7.1} {:>9} {:>5} {:>5} {:>6} {:>7} {:>9} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>7} {:>5.1}%",
                row.commits,
                row.p50_ms,
                row.p99_ms,
                human_bytes(row.metadata_bytes),
                row.snapshots,
                row.manifests,
                row.data_files,
                row.delete_files,
                human_bytes(row.live_bytes / files),
                human_bytes(row.disk_bytes),
                human_bytes(row.live_bytes),
                row.scan_ms
                    .map(|m| format!("{m:.0}"))
                    .unwrap_or_else(|| "timeout".into()),
                ms(row.one_file_ms),
                ms(row.duck.map(|d| d.0)),
                ms(row.duck.map(|d| d.1)),
                row.rows,
                row.compaction_share * 100.0
            );
            rows.push(row);
        }
    }
    Ok(rows)
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

async fn checkpoint(
    engine: &Engine,
    catalog: &Arc<dyn Catalog>,
    warehouse: &Path,
    commits: usize,
    window: &mut Vec<f64>,
    scan_timeout: Duration,
    duckdb: Option<&Path>,
) -> Result<Row> {
    window.sort_by(|a, b| a.total_cmp(b));
    let stats = maintain::stats(catalog.file_io(), engine.target()).await?;
    let metadata_bytes = engine
        .target()
        .metadata_location
        .strip_prefix("file://")
        .and_then(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .unwrap_or(stats.metadata_bytes);
    let started = Instant::now();
    let scanned = tokio::time::timeout(scan_timeout, engine.scan_target()).await;
    let (scan_ms, rows, batches) = match scanned {
        Ok(batches) => {
            let batches = batches?;
            let rows = batches.iter().map(|b| b.num_rows()).sum();
            (Some(started.elapsed().as_secs_f64() * 1e3), rows, batches)
        }
        Err(_) => (None, 0, Vec::new()),
    };
    // The floor: the same rows as one Parquet file, read whole.
    let single = warehouse.join("one-file.parquet");
    let one_file_ms = match batches.first() {
        Some(b) => {
            let mut w = parquet::arrow::ArrowWriter::try_new(
                std::fs::File::create(&single)?,
                b.schema(),
                None,
            )?;
            for b in &batches {
                w.write(b)?;
            }
            w.close()?;
            let started = Instant::now();
            let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
                std::fs::File::open(&single)?,
            )?
            .build()?;
            let n: usize = reader
                .map(|b| b.map(|b| b.num_rows()))
                .sum::<std::result::Result<usize, _>>()?;
            debug_assert_eq!(n, rows);
            Some(started.elapsed().as_secs_f64() * 1e3)
        }
        None => None,
    };
    let duck = match (duckdb, one_file_ms) {
        (Some(py), Some(_)) => duck_scan(py, &engine.target().metadata_location, &single),
        _ => None,
    };
    let _ = std::fs::remove_file(&single);
    let row = Row {
        commits,
        p50_ms: quantile(window, 0.5),
        p99_ms: quantile(window, 0.99),
        metadata_bytes,
        snapshots: stats.snapshots,
        manifests: stats.manifests,
        data_files: stats.data_files,
        delete_files: stats.delete_files,
        disk_bytes: dir_bytes(warehouse),
        live_bytes: stats.table_bytes,
        scan_ms,
        one_file_ms,
        duck,
        rows,
        compaction_share: 0.0,
    };
    window.clear();
    Ok(row)
}

/// (table ms, one-file ms) through DuckDB (`integration/duck_scan.py`);
/// None, with a note, when it cannot run.
fn duck_scan(python: &Path, metadata: &str, single: &Path) -> Option<(f64, f64)> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("integration/duck_scan.py");
    let out = std::process::Command::new(python)
        .arg(&script)
        .arg(metadata.strip_prefix("file://").unwrap_or(metadata))
        .arg(single)
        .output();
    match out {
        Ok(o) if o.status.success() => {
            let text = String::from_utf8_lossy(&o.stdout);
            let mut it = text.split_whitespace().map(|v| v.parse::<f64>().ok());
            Some((it.next()??, it.next()??))
        }
        Ok(o) => {
            eprintln!(
                "duckdb scan failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            );
            None
        }
        Err(e) => {
            eprintln!("duckdb scan: cannot run {}: {e}", python.display());
            None
        }
    }
}
