//! The command line as clap reads it: `Cli`, its subcommands and their
//! flags (the doc comments are the `--help` text).

use std::path::PathBuf;

use clap::{Parser, Subcommand};

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
    /// A flow's NATS stream that holds messages its target has no record of
    /// (a `stream_prefix` used with another warehouse, or a target dropped
    /// and made again; `serve` refuses to open the flow): `adopt` them into
    /// the target (they are applied when the flow opens), or `reset` the
    /// stream (they are dropped). With neither, shows what the stream holds.
    Log {
        #[arg(long, default_value = "autocdc.toml")]
        config: PathBuf,
        #[arg(long)]
        flow: String,
        #[arg(value_enum)]
        action: Option<LogAction>,
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

/// What `autocdc log` does with a stream its flow's target does not know.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogAction {
    /// Take the stream's messages as the target's: they are applied when
    /// the flow opens (the target is created if missing).
    Adopt,
    /// Drop every message of the stream.
    Reset,
}
