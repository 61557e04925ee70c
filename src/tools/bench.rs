//! `autocdc bench`: end-to-end apply throughput on the embedded Hadoop
//! catalog (Parquet in, Parquet data and delete files out, catalog commits
//! included), and the latency of one small batch into tables of growing size.
//! Figures are printed, never asserted.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use arrow_array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
use clap::Args;
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::core::flow::Flow;
use crate::error::{Error, Result};
use crate::fault::Faults;
use crate::service::input;
use crate::service::now_ms;
use crate::table::catalog::Catalog;
use crate::table::engine::Engine;
use crate::tools::generate;
use crate::tools::measure::{dir_bytes, file_floor_ms, local_catalog, peak_rss_bytes};

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Change events in the main run.
    #[arg(long, default_value_t = 1_000_000)]
    pub events: usize,
    /// Distinct keys they touch.
    #[arg(long, default_value_t = 200_000)]
    pub keys: usize,
    /// Micro-batches (and commits) they arrive in.
    #[arg(long, default_value_t = 10)]
    pub batches: usize,
    #[arg(long, default_value_t = 0.1)]
    pub delete_fraction: f64,
    /// Table sizes for the "one small batch into a table of N rows" runs
    /// (one per flow kind of `--flows`), comma-separated; `none` to skip them.
    #[arg(long, default_value = "100000,1000000,10000000")]
    pub table_sizes: String,
    #[arg(long, default_value_t = 10_000)]
    pub small_batch: usize,
    /// Where to put the input and the warehouse (default: a fresh temp dir, removed after).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Flow kinds the main run applies the same input to, comma-separated:
    /// `scd1`, `scd2` (every version; `amount` and `note` tracked),
    /// `partial` (SCD Type 1 with ignore_null_updates). Ratios to the first are printed.
    #[arg(long, default_value = "scd1")]
    pub flows: String,
    /// Also apply the input to each flow kind partitioned by these
    /// comma-separated transforms (e.g. `note,bucket[16](id)`) and print
    /// the partitioned run beside the unpartitioned one.
    #[arg(long)]
    pub partition_by: Option<String>,
    /// How sequences arrive: `all` (shuffled over the whole input, so a
    /// batch holds changes older than earlier batches'), or `batch` (each
    /// micro-batch holds the next run of sequences, shuffled within it: a
    /// log that reorders only within a batch, so a hot key's history grows
    /// in order).
    #[arg(long, value_enum, default_value_t = Shuffle::All)]
    pub shuffle: Shuffle,
}

/// How the bench's sequences arrive (`--shuffle`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shuffle {
    All,
    Batch,
}

/// `all`'s sequences (a permutation of `0..n`) renumbered so each run of
/// `per` rows holds the next `per` sequences, in the same order within it.
fn sequences_by_batch(all: &RecordBatch, per: usize) -> Result<RecordBatch> {
    let col = all.schema().index_of("seq")?;
    let seqs = all
        .column(col)
        .as_any()
        .downcast_ref::<Int64Array>()
        .ok_or_else(|| Error::Config("the bench input's seq is not a long".into()))?;
    let mut out = vec![0i64; seqs.len()];
    for start in (0..seqs.len()).step_by(per) {
        let end = (start + per).min(seqs.len());
        let mut rows: Vec<usize> = (start..end).collect();
        rows.sort_unstable_by_key(|&i| seqs.value(i));
        for (rank, i) in rows.into_iter().enumerate() {
            out[i] = (start + rank) as i64;
        }
    }
    let mut cols = all.columns().to_vec();
    cols[col] = Arc::new(Int64Array::from(out));
    Ok(RecordBatch::try_new(all.schema(), cols)?)
}

fn bench_flow(target: &str) -> Result<Flow> {
    kind_flow(target, "scd1", &[])
}

fn kind_flow(target: &str, kind: &str, partition_by: &[String]) -> Result<Flow> {
    let mut cfg = generate::changes_flow("bench", target)?;
    cfg.partition_by = partition_by.to_vec();
    match kind {
        "scd1" => {}
        "scd2" => cfg.stored_as_scd_type = 2,
        "partial" => cfg.ignore_null_updates = true,
        other => {
            return Err(Error::Config(format!(
                "--flows: `{other}` is not one of scd1, scd2, partial"
            )));
        }
    }
    Flow::new(cfg)
}

/// The honest limit on this machine: the seconds to write `batch` to one
/// Parquet file with the engine's data-file settings (best of 3).
fn parquet_floor(flow: &Flow, batch: &RecordBatch, dir: &Path) -> Result<f64> {
    let props =
        crate::table::write::props(&flow.target_schema, crate::table::write::FileUse::Table);
    let path = dir.join("floor.parquet");
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        let f = std::fs::File::create(&path)?;
        let mut w = parquet::arrow::ArrowWriter::try_new(f, batch.schema(), Some(props.clone()))?;
        w.write(batch)?;
        w.close()?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    std::fs::remove_file(&path)?;
    Ok(best)
}

fn write_parquet(path: &Path, batch: &RecordBatch) -> Result<()> {
    let f = std::fs::File::create(path)?;
    let mut w = parquet::arrow::ArrowWriter::try_new(f, batch.schema(), None)?;
    w.write(batch)?;
    w.close()?;
    Ok(())
}

pub async fn run(args: BenchArgs) -> Result<()> {
    if args.batches == 0 || args.keys == 0 || args.events == 0 {
        return Err(Error::Config(
            "--events, --keys and --batches must be at least 1".into(),
        ));
    }
    let tmp;
    let dir = match &args.dir {
        Some(d) => d.clone(),
        None => {
            tmp = tempfile_dir()?;
            tmp.clone()
        }
    };
    let input_dir = dir.join("input");
    std::fs::create_dir_all(&input_dir)?;
    let warehouse = dir.join("warehouse");
    let flow = bench_flow("bench.events")?;
    let mut rng = StdRng::seed_from_u64(args.seed);

    println!(
        "autocdc bench: {} events over {} keys, {:.0}% deletes, {} micro-batches, sequences shuffled {}, from Parquet",
        args.events,
        args.keys,
        args.delete_fraction * 100.0,
        args.batches,
        match args.shuffle {
            Shuffle::Batch => "within each batch",
            Shuffle::All => "over the whole input",
        }
    );
    let all = generate::changes(
        &flow.source_arrow,
        &mut rng,
        args.events,
        args.keys,
        0,
        0,
        args.delete_fraction,
    )?;
    let per = args.events.div_ceil(args.batches);
    let all = match args.shuffle {
        Shuffle::Batch => sequences_by_batch(&all, per)?,
        Shuffle::All => all,
    };
    let floor = parquet_floor(&flow, &all, &dir)?;
    let mut files = Vec::new();
    for (i, start) in (0..args.events).step_by(per).enumerate() {
        let p = input_dir.join(format!("part-{i:05}.parquet"));
        write_parquet(&p, &all.slice(start, per.min(args.events - start)))?;
        files.push(p);
    }
    drop(all);

    let catalog = local_catalog(&warehouse)?;
    let kinds: Vec<&str> = args.flows.split(',').map(str::trim).collect();
    let mut runs: Vec<(String, Run)> = Vec::new();
    for kind in &kinds {
        let flow = kind_flow(&format!("bench.events_{kind}"), kind, &[])?;
        if kinds.len() > 1 {
            println!("-- flow kind {kind}");
        }
        let run = main_run(&flow, &catalog, &files, &warehouse, args.events, per).await?;
        runs.push((kind.to_string(), run));
    }
    println!(
        "Parquet floor: the {} input rows written to one file with the engine's settings (zstd 1), best of 3: {:.3} s, {:.0} rows/s",
        args.events,
        floor,
        args.events as f64 / floor
    );
    for (kind, run) in &runs {
        println!(
            "{kind}: engine / Parquet floor: {:.1}x the floor's time",
            run.secs / floor
        );
    }
    if let [(first, base), rest @ ..] = runs.as_slice() {
        for (kind, run) in rest {
            println!("{kind} / {first} throughput: {:.2}", base.secs / run.secs);
        }
    }
    if let Some(spec) = &args.partition_by {
        let fs_ms = file_floor_ms(&dir)?;
        println!(
            "file system: {fs_ms:.2} ms to create, write and sync one 16 KiB file in {} (median of 3 x 100)",
            dir.display()
        );
        let by: Vec<String> = spec.split(',').map(|s| s.trim().to_string()).collect();
        for (kind, plain) in &runs {
            let flow = kind_flow(&format!("bench.events_{kind}_partitioned"), kind, &by)?;
            println!("-- flow kind {kind}, partition_by [{spec}]");
            let run = main_run(&flow, &catalog, &files, &warehouse, args.events, per).await?;
            let (files_p, files_u) = (run.files(), plain.files());
            let per_file_ms = if files_p > files_u {
                format!(
                    "{:.2} ms",
                    (run.secs - plain.secs) * 1e3 / (files_p - files_u) as f64
                )
            } else {
                "n/a".to_string()
            };
            println!(
                "{kind} partitioned / unpartitioned: {:.2}x the time; files per commit {:.1} vs {:.1}; cost per extra file {per_file_ms} (the file system's alone: {fs_ms:.2} ms)",
                run.secs / plain.secs,
                files_p as f64 / run.commits as f64,
                files_u as f64 / plain.commits as f64,
            );
        }
    }

    let sizes: Vec<usize> = if args.table_sizes == "none" {
        Vec::new()
    } else {
        args.table_sizes
            .split(',')
            .map(|t| {
                t.trim().parse().map_err(|_| {
                    Error::Config(format!(
                        "--table-sizes: `{t}` is not a number (or say `none`)"
                    ))
                })
            })
            .collect::<Result<_>>()?
    };
    for kind in &kinds {
        for &size in &sizes {
            small_batch_run(&args, &catalog, &mut rng, kind, size).await?;
        }
    }
    if let Some(rss) = peak_rss_bytes() {
        println!("peak RSS: {:.0} MiB", rss as f64 / 1048576.0);
    }
    if args.dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

/// One `args.small_batch`-event batch into a table of `size` rows (loaded
/// first, 1M rows per commit): the latency of a commit as the table grows.
async fn small_batch_run(
    args: &BenchArgs,
    catalog: &Arc<dyn Catalog>,
    rng: &mut StdRng,
    kind: &str,
    size: usize,
) -> Result<()> {
    let target = format!("bench.t{size}_{kind}");
    let flow = kind_flow(&target, kind, &[])?;
    let mut engine =
        Engine::open(flow.clone(), catalog.clone(), Arc::new(Faults::default())).await?;
    // Load `size` distinct keys, 1M rows per commit.
    let chunk = 1_000_000usize;
    let t = Instant::now();
    let mut loaded = 0;
    while loaded < size {
        let n = chunk.min(size - loaded);
        let ids: Vec<i64> = (loaded as i64..(loaded + n) as i64).collect();
        let b = RecordBatch::try_new(
            flow.source_arrow.clone(),
            vec![
                Arc::new(Int64Array::from(ids)) as ArrayRef,
                Arc::new(Int64Array::from(vec![0i64; n])),
                Arc::new(StringArray::from(vec!["UPSERT"; n])),
                Arc::new(Float64Array::from(vec![1.0; n])),
                Arc::new(StringArray::from(vec!["new"; n])),
            ],
        )?;
        engine.apply(&b, now_ms()).await?;
        loaded += n;
    }
    let load_secs = t.elapsed().as_secs_f64();
    let small = generate::changes(
        &flow.source_arrow,
        rng,
        args.small_batch,
        size,
        0,
        1,
        args.delete_fraction,
    )?;
    let t = Instant::now();
    let r = engine.apply(&small, now_ms()).await?;
    let apply_ms = t.elapsed().as_secs_f64() * 1e3;
    // The service reads the summary after every commit (metrics, /readyz).
    let t = Instant::now();
    let summary = engine.summary();
    let summary_ms = t.elapsed().as_secs_f64() * 1e3;
    println!(
        "{kind}: one {}-event batch into a table of {} rows: {:.0} ms (upserts {}, deletes {}; loading the table took {:.1} s)",
        args.small_batch, size, apply_ms, r.stats.upserts, r.stats.deletes, load_secs
    );
    println!(
        "  the state summary the service reads after each commit: {summary_ms:.2} ms ({} keys, {} events)",
        summary.keys, summary.events
    );
    let p = &r.timings;
    println!(
        "  its phases (ms): resolve {:.1}, target files {:.1}, state apply {:.1}, state file {:.1}, commits {:.1}",
        p.resolve_ms, p.target_files_ms, p.state_apply_ms, p.state_file_ms, p.commits_ms
    );
    Ok(())
}

/// What one main run measured.
struct Run {
    secs: f64,
    commits: usize,
    data_files: usize,
    delete_files: usize,
}

impl Run {
    fn files(&self) -> usize {
        self.data_files + self.delete_files
    }
}

/// Applies the input files to `flow`; prints the figures.
async fn main_run(
    flow: &Flow,
    catalog: &Arc<dyn Catalog>,
    files: &[PathBuf],
    warehouse: &Path,
    events: usize,
    per: usize,
) -> Result<Run> {
    let mut engine =
        Engine::open(flow.clone(), catalog.clone(), Arc::new(Faults::default())).await?;
    let (mut latencies, mut state_ms) = (Vec::new(), Vec::new());
    let mut phases = crate::table::engine::Timings::default();
    let mut read_ms = 0.0;
    let (mut data_files, mut delete_files, mut bytes) = (0, 0, 0);
    let started = Instant::now();
    for f in files {
        let t = Instant::now();
        let b = input::read_file(flow, f)?;
        read_ms += t.elapsed().as_secs_f64() * 1e3;
        let r = engine.apply(&b, now_ms()).await?;
        phases.add(&r.timings);
        latencies.push(t.elapsed().as_secs_f64());
        state_ms.push(r.timings.state_apply_ms);
        data_files += r.data_files;
        delete_files += r.delete_files;
        bytes += r.bytes_written;
    }
    let secs = started.elapsed().as_secs_f64();
    // Whether a batch costs more as the state grows: the first tenth of
    // the batches against the last.
    let tenths = (latencies.len() >= 20).then(|| {
        let tenth = latencies.len() / 10;
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let ends = |v: &[f64]| (mean(&v[..tenth]), mean(&v[v.len() - tenth..]));
        let (l, s) = (ends(&latencies), ends(&state_ms));
        (l.0 * 1e3, l.1 * 1e3, s.0, s.1)
    });
    latencies.sort_by(f64::total_cmp);
    let s = engine.summary();
    println!(
        "end to end: {:.2} s, {:.0} events/s",
        secs,
        events as f64 / secs
    );
    println!(
        "time by phase (ms, all batches): read Parquet {:.0}, resolve {:.0}, target files {:.0}, state apply {:.0}, state file {:.0}, commits {:.0}",
        read_ms,
        phases.resolve_ms,
        phases.target_files_ms,
        phases.state_apply_ms,
        phases.state_file_ms,
        phases.commits_ms
    );
    println!(
        "per-batch latency: p50 {:.0} ms, max {:.0} ms ({} events per batch)",
        latencies[latencies.len() / 2] * 1e3,
        latencies[latencies.len() - 1] * 1e3,
        per
    );
    if let Some((l0, l1, s0, s1)) = tenths {
        println!(
            "first / last tenth of the batches, mean: latency {l0:.1} / {l1:.1} ms, state apply {s0:.2} / {s1:.2} ms"
        );
    }
    println!(
        "written: {} data files, {} delete files, {:.1} MiB (warehouse on disk incl. metadata and state: {:.1} MiB)",
        data_files,
        delete_files,
        bytes as f64 / 1048576.0,
        dir_bytes(warehouse) as f64 / 1048576.0
    );
    let value_bytes = engine.state_value_bytes();
    let per_event = |b: usize| b as f64 / s.events.max(1) as f64;
    println!(
        "state: {} keys ({} live, {} tombstones), {} events held, {:.1} bytes/key, {:.1} bytes/event in memory{}",
        s.keys,
        s.live,
        s.tombstones,
        s.events,
        s.bytes_per_key,
        per_event(s.bytes),
        if value_bytes > 0 {
            format!(
                " ({:.1} the encoded values, {:.1} beyond them)",
                per_event(value_bytes),
                per_event(s.bytes - value_bytes)
            )
        } else {
            String::new()
        }
    );
    if let Some(rss) = peak_rss_bytes() {
        println!("peak RSS so far: {:.0} MiB", rss as f64 / 1048576.0);
    }
    Ok(Run {
        secs,
        commits: files.len(),
        data_files,
        delete_files,
    })
}

fn tempfile_dir() -> Result<PathBuf> {
    let d = std::env::temp_dir().join(format!("autocdc-bench-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_by_batch_give_each_batch_the_next_run_in_the_same_order() {
        let flow = bench_flow("bench.t").unwrap();
        let mut rng = StdRng::seed_from_u64(3);
        let all = generate::changes(&flow.source_arrow, &mut rng, 1000, 50, 0, 0, 0.1).unwrap();
        let seqs = |b: &RecordBatch| -> Vec<i64> {
            let c = b.column(b.schema().index_of("seq").unwrap());
            c.as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .values()
                .to_vec()
        };
        let by = sequences_by_batch(&all, 300).unwrap();
        let (before, after) = (seqs(&all), seqs(&by));
        for start in (0..1000).step_by(300) {
            let end = (start + 300).min(1000);
            let mut run = after[start..end].to_vec();
            // Same order within the batch as before.
            let order = |v: &[i64]| {
                let mut o: Vec<usize> = (0..v.len()).collect();
                o.sort_by_key(|&i| v[i]);
                o
            };
            assert_eq!(order(&run), order(&before[start..end]));
            run.sort_unstable();
            assert_eq!(run, (start as i64..end as i64).collect::<Vec<_>>());
        }
        // Every other column is as it was.
        for (i, f) in all.schema().fields().iter().enumerate() {
            if f.name() != "seq" {
                assert_eq!(all.column(i), by.column(i));
            }
        }
    }
}
