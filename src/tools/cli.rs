//! The `autocdc` command line: apply, gen, demo, show, state, refresh, bench.
//! Library errors become messages and exit codes here and nowhere else.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use arrow_array::RecordBatch;
use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_cast::display::{ArrayFormatter, FormatOptions};
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

use crate::config::{CatalogConfig, Config};
use crate::core::flow::{Flow, parse_table_ident};
use crate::core::resolve::BatchStats;
use crate::error::{Error, Result, codes};
use crate::fault::Faults;
use crate::service::input;
use crate::table::catalog::{self, Catalog};
use crate::table::engine::Engine;
use crate::table::read;
use crate::tools::generate::{self as gk, GhostKitchen};

#[derive(Parser, Debug)]
#[command(
    name = "autocdc",
    version,
    about = "Applies change-data-capture streams to Apache Iceberg tables"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Apply change files to a flow's target: each file is one micro-batch and one commit.
    Apply {
        #[arg(long, default_value = "autocdc.toml")]
        config: PathBuf,
        #[arg(long)]
        flow: String,
        /// Re-cut the input into micro-batches of this many rows.
        #[arg(long, conflicts_with = "snapshot_version")]
        batch_rows: Option<usize>,
        /// `from_snapshot` flows: the files are one whole snapshot of the
        /// source with this version; its difference to the target is applied.
        #[arg(long)]
        snapshot_version: Option<i64>,
        /// NDJSON (.ndjson/.jsonl/.json), CSV with header (.csv) or Parquet (.parquet) files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Generate a synthetic change feed.
    Gen {
        #[command(subcommand)]
        feed: GenFeed,
    },
    /// No setup: generate a day of ghost-kitchen orders, apply it to ./warehouse and check the result.
    Demo {
        #[arg(long, default_value = "./warehouse")]
        warehouse: String,
        #[arg(long, default_value_t = 40_000)]
        orders: usize,
        #[arg(long, default_value_t = 24)]
        batches: usize,
        #[arg(long, default_value_t = 7)]
        seed: u64,
    },
    /// Print rows of a table, read through a real Iceberg scan.
    Show {
        #[arg(long, default_value = "autocdc.toml")]
        config: PathBuf,
        /// Read from this Hadoop-catalog warehouse instead of the config's catalog.
        #[arg(long)]
        warehouse: Option<String>,
        /// `namespace.table`
        table: String,
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Print the key state of the flow writing TABLE: keys, tombstones, memory.
    State {
        #[arg(long, default_value = "autocdc.toml")]
        config: PathBuf,
        /// The target `namespace.table` (or the flow name).
        table: String,
    },
    /// Rebuild a flow's target: `--full` drops the target and its state so
    /// that the next apply rebuilds both from its input; `--history`
    /// rewrites the target from the state (SCD Type 2 or
    /// ignore_null_updates flows), with no input.
    Refresh {
        #[arg(long, default_value = "autocdc.toml")]
        config: PathBuf,
        /// Drop the target and its state (deletes the target table's data).
        #[arg(long, conflicts_with = "history")]
        full: bool,
        /// Replace the target's rows by those the state's events fold into, in one commit.
        #[arg(long)]
        history: bool,
        flow: String,
    },
    /// Maintain flows' tables now: compact small files and their deletes,
    /// expire snapshots, delete the files only expired snapshots referenced,
    /// delete orphan files (see docs/maintenance.md).
    Maintain {
        #[arg(long, default_value = "autocdc.toml")]
        config: PathBuf,
        /// Only this flow (default: every flow of the configuration).
        #[arg(long)]
        flow: Option<String>,
        /// Print what would be done; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Delete unreferenced files older than this ("off": none); default
        /// `[maintenance] orphan_older_than` (3d). At least "1h".
        #[arg(long)]
        orphans_older_than: Option<String>,
        /// Skip compaction in this run (it runs when the flow's
        /// `compaction.enabled`, the default).
        #[arg(long)]
        no_compact: bool,
        /// Print the reports as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Measure end-to-end apply throughput (see docs/dev/benchmarks.md).
    Bench(crate::tools::bench::BenchArgs),
    /// Thousands of small commits with maintenance on, then off: metadata,
    /// snapshots, manifests, files, disk and scan time every 1,000 commits
    /// (see docs/maintenance.md).
    BenchLong(crate::tools::bench_long::BenchLongArgs),
    /// Load-test `autocdc serve` (started in its own process) over HTTP with NDJSON and Arrow IPC.
    BenchServe(crate::tools::loadgen::LoadArgs),
    /// Run `autocdc serve` in a child process under a steady load for a while;
    /// sample commit rate, latency, memory, fds, log, metadata, files and scan
    /// time, and judge each figure flat or growing (see docs/dev/benchmarks.md, "Soak").
    Soak(crate::tools::soak::SoakArgs),
    /// Run the HTTP service: producers push change batches, autocdc commits them on a schedule.
    Serve {
        /// Without one (and with no ./autocdc.toml) it serves on 127.0.0.1:8080 into ./warehouse.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Overrides `server.listen`.
        #[arg(long)]
        listen: Option<String>,
    },
    /// Push change files to a running `autocdc serve` (retries, idempotency keys).
    Push {
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        url: String,
        #[arg(long)]
        flow: String,
        /// Bearer token, when the server requires one (default: $AUTOCDC_TOKEN).
        #[arg(long)]
        token: Option<String>,
        /// Cut each file into requests of this many rows.
        #[arg(long)]
        batch_rows: Option<usize>,
        /// Wait until each batch is committed (answers with the snapshot id).
        #[arg(long)]
        wait_commit: bool,
        #[arg(long, default_value_t = 8)]
        max_attempts: u32,
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
pub enum GenFeed {
    /// A delivery-only restaurant's order lifecycle log (about 25 events per order).
    GhostKitchen {
        #[arg(long, default_value_t = 1000)]
        orders: usize,
        #[arg(long, default_value_t = 42)]
        seed: u64,
        #[arg(long, default_value_t = 10)]
        files: usize,
        #[arg(long)]
        out: PathBuf,
        /// parquet or ndjson
        #[arg(long, default_value = "parquet")]
        format: String,
        /// Leave out the few events with a null order_id (they make `apply` reject their batch).
        #[arg(long)]
        no_null_keys: bool,
    },
}

pub use crate::service::now_ms;

fn load_config(path: &Path) -> Result<Config> {
    if path.exists() {
        Config::load(path)
    } else if path == Path::new("autocdc.toml") {
        Err(Error::Config(
            "no autocdc.toml here; pass --config FILE (examples under catalogs/), or run `autocdc demo`".into(),
        ))
    } else {
        Err(Error::Config(format!(
            "config file {} does not exist",
            path.display()
        )))
    }
}

fn open_catalog(config: &CatalogConfig) -> Result<Arc<dyn Catalog>> {
    catalog::open(config, Arc::new(Faults::default()))
}

pub async fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Apply {
            config,
            flow,
            batch_rows,
            snapshot_version,
            files,
        } => {
            let config = load_config(&config)?;
            let flow = config.flow(&flow)?;
            match snapshot_version {
                Some(v) => apply_snapshot(&config.catalog, flow, &files, v).await,
                None => apply_files(&config.catalog, flow, &files, batch_rows).await,
            }
        }
        Command::Gen {
            feed:
                GenFeed::GhostKitchen {
                    orders,
                    seed,
                    files,
                    out,
                    format,
                    no_null_keys,
                },
        } => gen_ghost_kitchen(orders, seed, files, &out, &format, no_null_keys),
        Command::Demo {
            warehouse,
            orders,
            batches,
            seed,
        } => demo(&warehouse, orders, batches, seed).await,
        Command::Show {
            config,
            warehouse,
            table,
            limit,
        } => show(&config, warehouse, &table, limit).await,
        Command::State { config, table } => state(&config, &table).await,
        Command::Refresh {
            config,
            full,
            history,
            flow,
        } => refresh(&config, full, history, &flow).await,
        Command::Maintain {
            config,
            flow,
            dry_run,
            orphans_older_than,
            no_compact,
            json,
        } => {
            maintain(
                &config,
                flow.as_deref(),
                dry_run,
                orphans_older_than,
                !no_compact,
                json,
            )
            .await
        }
        Command::Bench(args) => crate::tools::bench::run(args).await,
        Command::BenchServe(args) => crate::tools::loadgen::run(args).await,
        Command::BenchLong(args) => crate::tools::bench_long::run(args).await,
        Command::Soak(args) => crate::tools::soak::run(args).await,
        Command::Serve { config, listen } => {
            let mut cfg = match config {
                Some(p) => load_config(&p)?,
                None if Path::new("autocdc.toml").exists() => {
                    load_config(Path::new("autocdc.toml"))?
                }
                None => Config::default(),
            };
            if let Some(l) = listen {
                cfg.server.listen = l;
            }
            crate::service::http::serve(cfg, Arc::new(Faults::default())).await
        }
        Command::Push {
            url,
            flow,
            token,
            batch_rows,
            wait_commit,
            max_attempts,
            files,
        } => {
            let args = crate::tools::push::PushArgs {
                url,
                flow,
                files,
                token: token.or_else(|| std::env::var("AUTOCDC_TOKEN").ok()),
                batch_rows,
                wait_commit,
                max_attempts,
            };
            let (batches, rows) = crate::tools::push::push(&args).await?;
            println!(
                "pushed {rows} rows in {batches} batches to flow `{}`",
                args.flow
            );
            Ok(())
        }
    }
}

/// `autocdc gen ghost-kitchen`: the synthetic feed as files, with its flow definition.
fn gen_ghost_kitchen(
    orders: usize,
    seed: u64,
    files: usize,
    out: &Path,
    format: &str,
    no_null_keys: bool,
) -> Result<()> {
    let cfg = GhostKitchen {
        orders,
        seed,
        files,
        null_keys: !no_null_keys,
        ..Default::default()
    };
    let (batches, stats) = gk::generate(&cfg);
    let paths = match format {
        "parquet" => gk::write_parquet(out, &batches),
        "ndjson" => gk::write_ndjson(out, &batches),
        other => {
            return Err(Error::Config(format!(
                "--format {other}: use parquet or ndjson"
            )));
        }
    }
    .map_err(|e| Error::Config(format!("writing {}: {e}", out.display())))?;
    let flow_file = out.join("flow.toml");
    std::fs::write(
        &flow_file,
        gk::ghost_kitchen_flow_toml("ghost_kitchen", "kitchen.orders"),
    )?;
    println!(
        "wrote {} files ({}) to {}",
        paths.len(),
        describe(&stats),
        out.display()
    );
    println!("flow definition: {}", flow_file.display());
    Ok(())
}

/// `autocdc show`: a table's rows through a real Iceberg scan.
async fn show(config: &Path, warehouse: Option<String>, table: &str, limit: usize) -> Result<()> {
    let catalog = match warehouse {
        Some(warehouse) => open_catalog(&CatalogConfig::Hadoop {
            warehouse,
            s3: None,
        })?,
        None => open_catalog(&load_config(config)?.catalog)?,
    };
    let ident = parse_table_ident("show", table)?;
    let Some(t) = catalog.load_table(&ident).await? else {
        return Err(Error::Config(format!(
            "table {table} does not exist in the catalog"
        )));
    };
    let batches = read::scan(catalog.as_ref(), &t).await?;
    let total: usize = batches.iter().map(|b| b.num_rows()).sum();
    print_rows(&batches, limit)?;
    println!(
        "({total} rows; snapshot {:?}; schema {}; partition spec {})",
        t.metadata.current_snapshot_id(),
        t.metadata.current_schema_id(),
        t.metadata.default_partition_spec_id()
    );
    Ok(())
}

/// `autocdc state`: the key state of the flow that writes `table`.
async fn state(config: &Path, table: &str) -> Result<()> {
    let config = load_config(config)?;
    let flow = config
        .flows()?
        .into_iter()
        .find(|f| f.name == table || f.config.target == table)
        .ok_or_else(|| Error::Config(format!("no flow writes `{table}` in the configuration")))?;
    let catalog = open_catalog(&config.catalog)?;
    if catalog.load_table(&flow.target).await?.is_none() {
        return Err(Error::Config(format!(
            "table {} does not exist yet; apply changes first",
            flow.target
        )));
    }
    let engine = Engine::open(flow, catalog, Arc::new(Faults::default())).await?;
    println!("{}", serde_json::to_string_pretty(&engine.summary())?);
    Ok(())
}

/// `autocdc maintain`: one maintenance run per flow, its report printed.
async fn maintain(
    config: &Path,
    only: Option<&str>,
    dry_run: bool,
    orphans: Option<String>,
    compact: bool,
    json: bool,
) -> Result<()> {
    let config = load_config(config)?;
    let flows = match only {
        Some(name) => vec![config.flow(name)?],
        None => config.flows()?,
    };
    let orphans_older_than = match orphans {
        Some(text) => crate::config::parse_orphan_window("--orphans-older-than", &text)?,
        None => config.maintenance.schedule()?.orphans_older_than,
    };
    let catalog = open_catalog(&config.catalog)?;
    for flow in flows {
        if catalog.load_table(&flow.target).await?.is_none() {
            println!(
                "{}: table {} does not exist yet; nothing to maintain",
                flow.name, flow.target
            );
            continue;
        }
        let mut engine = Engine::open(flow, catalog.clone(), Arc::new(Faults::default())).await?;
        let report = engine
            .maintain(&crate::table::engine::MaintainOptions {
                now_ms: now_ms(),
                dry_run,
                orphans_older_than,
                compact,
            })
            .await?;
        if json {
            println!("{}", serde_json::to_string(&report)?);
        } else {
            print_maintenance(&report);
        }
    }
    Ok(())
}

fn print_maintenance(r: &crate::table::engine::MaintenanceReport) {
    let verb = if r.dry_run { "would delete" } else { "deleted" };
    println!(
        "{}{} ({:.0} ms)",
        r.flow,
        if r.dry_run {
            " (dry run: nothing changed)"
        } else {
            ""
        },
        r.elapsed_ms
    );
    if let Some(c) = &r.compaction {
        match &c.skipped {
            Some(why) => println!("  compaction: {why}"),
            None => println!(
                "  compaction: {} data files rewritten into {}, {} fully deleted dropped, {} delete files removed ({} equality), {} written; {} rows moved, {} deleted rows gone; read {}, wrote {}{} ({:.0} ms)",
                c.data_files_rewritten,
                c.data_files_written,
                c.data_files_dropped,
                c.delete_files_removed,
                c.equality_delete_files_removed,
                c.delete_files_written,
                c.rows_moved,
                c.rows_dropped,
                human_bytes(c.bytes_read),
                human_bytes(c.bytes_written),
                if c.state_files_rewritten > 0 {
                    format!("; state table: {} files into 1", c.state_files_rewritten)
                } else {
                    String::new()
                },
                c.elapsed_ms
            ),
        }
    }
    for (t, s) in [(&r.target, &r.target_stats), (&r.state, &r.state_stats)] {
        println!(
            "  {}: {} snapshots expired, {} kept; {verb} {} manifest lists, {} manifests, {} data files, {} delete files, {} orphans, {} ({} bytes){}",
            t.table,
            t.snapshots_expired,
            t.snapshots_kept,
            t.manifest_lists_deleted,
            t.manifests_deleted,
            t.data_files_deleted,
            t.delete_files_deleted,
            t.orphans_deleted,
            human_bytes(t.bytes_deleted),
            t.bytes_deleted,
            if t.resumed_files_deleted > 0 {
                format!(
                    "; finished an earlier run's cleanup ({} files)",
                    t.resumed_files_deleted
                )
            } else {
                String::new()
            }
        );
        println!(
            "    now: {} snapshots, {} manifests, {} data files, {} delete files, metadata.json {}, table {}",
            s.snapshots,
            s.manifests,
            s.data_files,
            s.delete_files,
            human_bytes(s.metadata_bytes),
            human_bytes(s.table_bytes)
        );
        for n in &t.notes {
            println!("    note: {n}");
        }
    }
}

pub fn human_bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}

/// `autocdc refresh --full`: drops the target and its state;
/// `autocdc refresh --history`: rewrites the target from the state.
async fn refresh(config: &Path, full: bool, history: bool, flow: &str) -> Result<()> {
    if !full && !history {
        return Err(Error::Config(
            "say which refresh: `--full` drops the target and its state (the next apply rebuilds both from its input); `--history` rewrites the target from the state of an SCD Type 2 or ignore_null_updates flow".into(),
        ));
    }
    let config = load_config(config)?;
    let flow = config.flow(flow)?;
    let catalog = open_catalog(&config.catalog)?;
    if history {
        let mut engine = Engine::open(flow.clone(), catalog, Arc::new(Faults::default())).await?;
        let r = engine.rebuild(now_ms()).await?;
        println!(
            "rewrote {} from its state: {} rows in {} data files (snapshot {})",
            flow.target,
            r.rows_written,
            r.data_files,
            r.snapshot_id.map_or("none".into(), |s| s.to_string())
        );
        return Ok(());
    }
    let t = catalog.drop_table(&flow.target).await?;
    let s = catalog.drop_table(&flow.state_ident()).await?;
    println!(
        "dropped {} ({}) and {} ({}); the next apply rebuilds both from the input it is given",
        flow.target,
        if t { "existed" } else { "absent" },
        flow.state_ident(),
        if s { "existed" } else { "absent" }
    );
    Ok(())
}

fn progress(len: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template(&format!(
            "{{spinner}} [{{elapsed_precise}}] {{bar:30}} {{pos}}/{{len}} {what} {{msg}}"
        ))
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb
}

fn stats_line(s: &BatchStats) -> String {
    let mut line = format!(
        "rows={} upserts={} deletes={} stale={} duplicates={} ties={}",
        s.rows_in, s.upserts, s.deletes, s.stale, s.duplicates, s.ties
    );
    if s.truncates > 0 {
        line += &format!(" truncates={} truncated={}", s.truncates, s.truncated);
    }
    if s.unchanged > 0 {
        line += &format!(" unchanged={}", s.unchanged);
    }
    if s.placeholders_unfilled > 0 {
        line += &format!(" placeholders_unfilled={}", s.placeholders_unfilled);
    }
    line
}

/// `apply --snapshot-version V`: the files together are one snapshot.
async fn apply_snapshot(
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

async fn apply_files(
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
    use crate::table::maintain::Retention;
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

fn print_rows(batches: &[RecordBatch], limit: usize) -> Result<()> {
    let Some(first) = batches.first() else {
        println!("(empty)");
        return Ok(());
    };
    let names: Vec<&str> = first
        .schema_ref()
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .collect();
    println!("{}", names.join("\t"));
    let opts = FormatOptions::default().with_null("NULL");
    let mut shown = 0;
    for b in batches {
        let fmts = b
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &opts))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        for r in 0..b.num_rows() {
            if shown == limit {
                return Ok(());
            }
            println!(
                "{}",
                fmts.iter()
                    .map(|f| f.value(r).to_string())
                    .collect::<Vec<_>>()
                    .join("\t")
            );
            shown += 1;
        }
    }
    Ok(())
}

/// (order_id, seq) of every row of the demo table.
fn order_seqs(rows: &[RecordBatch]) -> Result<HashSet<(i64, i64)>> {
    let mut table: HashSet<(i64, i64)> = HashSet::new();
    for b in rows {
        let ids = b
            .column_by_name("order_id")
            .map(|c| c.as_primitive::<Int64Type>().clone());
        let seqs = b
            .column_by_name("seq")
            .map(|c| c.as_primitive::<Int64Type>().clone());
        let (Some(ids), Some(seqs)) = (ids, seqs) else {
            return Err(Error::Config("the demo table lacks order_id or seq".into()));
        };
        for r in 0..b.num_rows() {
            table.insert((ids.value(r), seqs.value(r)));
        }
    }
    Ok(table)
}

/// The demo's oracle: per order the latest event by seq, cancelled orders
/// dropped, as (order_id, seq).
fn naive_recomputation(flow: &Flow, applied: &[RecordBatch]) -> Result<HashSet<(i64, i64)>> {
    let mut latest: HashMap<i64, (i64, bool)> = HashMap::new();
    for b in applied {
        let ids = b.column(flow.key_idx[0]).as_primitive::<Int64Type>();
        let seqs = b
            .column_by_name("seq")
            .map(|c| c.as_primitive::<Int64Type>().clone());
        let ops = b.column_by_name("op").map(|c| c.as_string::<i32>().clone());
        let (Some(seqs), Some(ops)) = (seqs, ops) else {
            return Err(Error::Config("the demo feed lacks seq or op".into()));
        };
        for r in 0..b.num_rows() {
            let e = latest.entry(ids.value(r)).or_insert((i64::MIN, false));
            if seqs.value(r) > e.0 {
                *e = (seqs.value(r), ops.value(r) == "DELETE");
            }
        }
    }
    Ok(latest
        .into_iter()
        .filter(|(_, (_, del))| !del)
        .map(|(k, (s, _))| (k, s))
        .collect())
}

/// `autocdc demo`: a day of ghost-kitchen orders through the whole path.
async fn demo(warehouse: &str, orders: usize, batches: usize, seed: u64) -> Result<()> {
    let config = Config::from_toml(&format!(
        "[catalog]\ntype = \"hadoop\"\nwarehouse = \"{}\"\n\n{}",
        warehouse.replace('\\', "\\\\").replace('"', "\\\""),
        gk::ghost_kitchen_flow_toml("ghost_kitchen", "demo.orders")
    ))?;
    let flow = config.flow("ghost_kitchen")?;
    let catalog = open_catalog(&config.catalog)?;
    if catalog.drop_table(&flow.target).await? | catalog.drop_table(&flow.state_ident()).await? {
        println!("removed the previous demo's {} and its state", flow.target);
    }
    let t = Instant::now();
    let (feed, stats) = gk::generate(&GhostKitchen {
        orders,
        seed,
        files: batches,
        ..Default::default()
    });
    println!(
        "generated {} in {:.2} s",
        describe(&stats),
        t.elapsed().as_secs_f64()
    );
    let mut engine =
        Engine::open(flow.clone(), catalog.clone(), Arc::new(Faults::default())).await?;
    let key = flow.key_idx[0];
    let pb = progress(feed.len() as u64, "batches");
    let mut total = BatchStats::default();
    let mut null_keys = 0usize;
    let mut applied: Vec<RecordBatch> = Vec::new();
    let started = Instant::now();
    for raw in &feed {
        let b = input::conform(&flow, raw)?;
        let keep = arrow_arith::boolean::is_not_null(b.column(key))?;
        null_keys += keep.len() - keep.true_count();
        let b = arrow_select::filter::filter_record_batch(&b, &keep)?;
        let r = engine.apply(&b, now_ms()).await?;
        total.add(&r.stats);
        applied.push(b);
        pb.inc(1);
        if applied.len() == feed.len() / 2 {
            let midday = status_counts(&engine.scan_target().await?)?;
            pb.suspend(|| {
                println!(
                    "live orders by status after {} of {} micro-batches:",
                    applied.len(),
                    feed.len()
                );
                for (s, n) in &midday {
                    println!("  {s:<18} {n}");
                }
            });
        }
    }
    pb.finish_and_clear();
    let secs = started.elapsed().as_secs_f64();
    println!(
        "applied {} micro-batches in {:.2} s ({:.0} events/s): {}; {} null-key events filtered before apply",
        feed.len(),
        secs,
        total.rows_in as f64 / secs.max(1e-9),
        stats_line(&total),
        null_keys
    );

    let rows = engine.scan_target().await?;
    let by_status = status_counts(&rows)?;
    let table = order_seqs(&rows)?;
    println!("live orders by status at the end of the day:");
    for (s, n) in &by_status {
        println!("  {s:<18} {n}");
    }
    let s = engine.summary();
    println!(
        "cancelled orders removed: {} deletes applied, {} tombstones kept in the state ({} keys, {:.1} bytes/key)",
        total.deletes, s.tombstones, s.keys, s.bytes_per_key
    );

    let naive = naive_recomputation(&flow, &applied)?;
    let matches = naive == table;
    println!(
        "naive recomputation (latest per order, cancelled dropped): {} rows; Iceberg table: {} rows; match as sets: {}",
        naive.len(),
        table.len(),
        if matches { "yes" } else { "NO" }
    );
    println!(
        "table: {}/demo/orders (read it with `autocdc show --warehouse {} demo.orders`, DuckDB or PyIceberg)",
        warehouse.trim_end_matches('/'),
        warehouse
    );
    if !matches {
        return Err(Error::State {
            code: codes::DEMO_MISMATCH,
            message: "the table differs from the naive recomputation".into(),
        });
    }
    Ok(())
}

fn status_counts(rows: &[RecordBatch]) -> Result<BTreeMap<String, usize>> {
    let mut out = BTreeMap::new();
    for b in rows {
        let status = b
            .column_by_name("status")
            .ok_or_else(|| Error::Config("the demo table lacks a status column".into()))?
            .as_string::<i32>();
        for r in 0..b.num_rows() {
            *out.entry(status.value(r).to_string()).or_default() += 1;
        }
    }
    Ok(out)
}

fn describe(s: &gk::GenStats) -> String {
    format!(
        "{} events for {} orders: {} cancelled, {} late, {} duplicates, {} with a null order_id",
        s.events, s.orders, s.cancelled_orders, s.late_events, s.duplicates, s.null_key_events
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::Int64Array;

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
