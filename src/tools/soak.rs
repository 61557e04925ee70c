//! `autocdc soak`: runs `autocdc serve` in a child process for a while
//! against a steady load and samples what must stay flat in a long-running
//! service: the commit rate (it must follow `commit_interval`, not the commit
//! count), commit latency, memory, file descriptors, threads, the ingest
//! log, the table's metadata and files, the warehouse and a reader's scan
//! time. It prints one row per sample and a verdict per figure, then checks
//! that every pushed change is in the table (an oracle kept by the client).
//!
//! Figures are printed, never asserted: the run fails only when the server
//! dies, answers an error other than 429, or the table differs from the
//! oracle.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::config::{CatalogConfig, Config, ServerConfig};
use crate::core::flow::{Flow, parse_table_ident};
use crate::error::{Error, Result};
use crate::tools::generate;
use crate::tools::serve_child::ServeChild;

mod latency;
use latency::Buckets;

#[derive(clap::Args, Debug, Clone)]
pub struct SoakArgs {
    /// How long to push, e.g. "2m", "60m".
    #[arg(long, default_value = "2m")]
    pub duration: String,
    /// Change events per second, over all flows.
    #[arg(long, default_value_t = 20_000)]
    pub rate: u64,
    /// Distinct keys per flow.
    #[arg(long, default_value_t = 100_000)]
    pub keys: i64,
    /// Events per request.
    #[arg(long, default_value_t = 500)]
    pub batch_rows: usize,
    #[arg(long, default_value_t = 1)]
    pub flows: usize,
    /// The flows' commit_interval.
    #[arg(long, default_value = "1s")]
    pub commit_interval: String,
    /// The flows' `compaction.interval` (the service's default is 10m; a
    /// short soak compacts sooner so its file counts show the bound).
    #[arg(long, default_value = "30s")]
    pub compaction_interval: String,
    /// The flows' max_log_bytes (default: the service's default).
    #[arg(long)]
    pub max_log_bytes: Option<u64>,
    /// The server's idempotency_window.
    #[arg(long, default_value = "15m")]
    pub idempotency_window: String,
    /// Time between samples.
    #[arg(long, default_value = "30s")]
    pub sample_every: String,
    /// Take `[catalog]` and `[ingest]` from this config file (default: a
    /// Hadoop warehouse in the run's temporary folder, the local log).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Keep the run's folder (warehouse, logs, server output) here.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
}

/// The latest change per key the client sent: (seq, deleted).
type Oracle = HashMap<i64, (i64, bool)>;

fn parse_duration(flag: &str, s: &str) -> Result<Duration> {
    humantime::parse_duration(s).map_err(|e| Error::Config(format!("{flag} {s}: {e}")))
}

/// One sample of the running service.
#[derive(Debug, Clone, Default)]
struct Sample {
    t: f64,
    sent: u64,
    commits: u64,
    commit_rate: f64,
    p50: f64,
    p99: f64,
    rss_mib: f64,
    fds: f64,
    threads: f64,
    log_mib: f64,
    pending_kib: f64,
    metadata_kib: f64,
    /// Snapshots the targets' metadata keeps.
    snapshots: f64,
    data_files: f64,
    delete_files: f64,
    warehouse_mib: f64,
    scan_ms: f64,
}

/// How often the soak reads the sizes and counts between rows.
const PEEK: Duration = Duration::from_secs(10);

impl Sample {
    /// Each size and count at least `o`'s: the peak over a row's window.
    fn raise(&mut self, o: &Sample) {
        for (mine, theirs) in [
            (&mut self.rss_mib, o.rss_mib),
            (&mut self.fds, o.fds),
            (&mut self.threads, o.threads),
            (&mut self.log_mib, o.log_mib),
            (&mut self.metadata_kib, o.metadata_kib),
            (&mut self.snapshots, o.snapshots),
            (&mut self.data_files, o.data_files),
            (&mut self.delete_files, o.delete_files),
            (&mut self.warehouse_mib, o.warehouse_mib),
        ] {
            *mine = mine.max(theirs);
        }
    }
}

/// A figure's name and how to read it from a sample.
type Figure = (&'static str, fn(&Sample) -> f64);

/// The figures judged at the end.
const FIGURES: [Figure; 13] = [
    ("commits/s", |s| s.commit_rate),
    ("commit p50 ms", |s| s.p50),
    ("commit p99 ms", |s| s.p99),
    ("RSS MiB", |s| s.rss_mib),
    ("open fds", |s| s.fds),
    ("threads", |s| s.threads),
    ("log MiB", |s| s.log_mib),
    ("metadata.json KiB", |s| s.metadata_kib),
    ("snapshots", |s| s.snapshots),
    ("data files", |s| s.data_files),
    ("delete files", |s| s.delete_files),
    ("warehouse MiB", |s| s.warehouse_mib),
    ("scan ms", |s| s.scan_ms),
];

pub async fn run(a: SoakArgs) -> Result<()> {
    let duration = parse_duration("--duration", &a.duration)?;
    let every = parse_duration("--sample-every", &a.sample_every)?;
    let interval = parse_duration("--commit-interval", &a.commit_interval)?;
    if a.flows == 0 || a.batch_rows == 0 || a.rate == 0 || a.keys <= 0 {
        return Err(Error::Config(
            "--flows, --batch-rows, --rate and --keys must be at least 1".into(),
        ));
    }
    let tmp;
    let dir = match &a.dir {
        Some(d) => d.clone(),
        None => {
            tmp = std::env::temp_dir().join(format!("autocdc-soak-{}", uuid::Uuid::new_v4()));
            tmp.clone()
        }
    };
    std::fs::create_dir_all(&dir)?;
    let setup = Setup::write(&a, &dir)?;
    let base = format!("http://127.0.0.1:{}", setup.port);
    let client = reqwest::Client::new();
    let mut child =
        ServeChild::start(&setup.config_path, &dir.join("serve.log"), &client, &base).await?;
    println!(
        "soak: {} for {:?}: {} events/s over {} flow(s), {} keys each, {} per request, commit_interval {}, samples every {:?}; folder {}",
        std::env::current_exe()?.display(),
        duration,
        a.rate,
        a.flows,
        a.keys,
        a.batch_rows,
        a.commit_interval,
        every,
        dir.display()
    );
    let mut load = Load::start(&a, &client, &base, &setup.names);
    let catalog =
        crate::table::catalog::open(&setup.catalog, Arc::new(crate::fault::Faults::default()))?;
    let watch = Watch {
        client: &client,
        base: &base,
        names: &setup.names,
        catalog: &catalog,
        local_warehouse: setup.local_warehouse.as_deref(),
    };
    let (samples, mut failure) = watch.samples(&mut child, &load, duration, every).await?;
    if let Some(f) = load.stop(a.rate).await? {
        failure.get_or_insert(f);
    }
    let window = parse_duration("--idempotency-window", &a.idempotency_window)?;
    verdicts(
        &samples,
        duration,
        a.flows as f64 / interval.as_secs_f64(),
        window,
    );
    // Everything pushed must be in the tables.
    if failure.is_none() {
        failure = watch.check_oracles(&load.oracles).await?;
    }
    println!("server stopped: {}", child.stop()?);
    if a.dir.is_none() && failure.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    match failure {
        None => Ok(()),
        Some(f) => Err(Error::Unavailable(format!(
            "soak failed: {f} (server output in {})",
            dir.join("serve.log").display()
        ))),
    }
}

/// The soak's server: its configuration written, the flows' names, the
/// catalog (and its folder, when local).
struct Setup {
    config_path: PathBuf,
    port: u16,
    names: Vec<String>,
    catalog: CatalogConfig,
    local_warehouse: Option<PathBuf>,
}

impl Setup {
    fn write(a: &SoakArgs, dir: &Path) -> Result<Setup> {
        let (catalog, ingest) = match &a.config {
            Some(path) => {
                let c = Config::load(path)?;
                (c.catalog, c.ingest)
            }
            None => (
                CatalogConfig::Hadoop {
                    warehouse: dir.join("warehouse").to_string_lossy().to_string(),
                    s3: None,
                },
                Default::default(),
            ),
        };
        let local_warehouse = match &catalog {
            CatalogConfig::Hadoop {
                warehouse,
                s3: None,
            } => Some(PathBuf::from(warehouse)),
            _ => None,
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let names: Vec<String> = (0..a.flows).map(|i| format!("soak_{i}")).collect();
        let mut flows = Vec::new();
        for name in &names {
            let mut cfg = generate::changes_flow(name, &format!("soak.{name}"))?;
            cfg.commit_interval = Some(a.commit_interval.clone());
            cfg.max_log_bytes = a.max_log_bytes;
            cfg.compaction = Some(crate::core::flow::CompactionConfig {
                interval: Some(a.compaction_interval.clone()),
                ..Default::default()
            });
            flows.push(cfg);
        }
        let config = Config {
            server: ServerConfig {
                listen: format!("127.0.0.1:{port}"),
                data_dir: dir.join("data").to_string_lossy().to_string(),
                idempotency_window: a.idempotency_window.clone(),
                ..ServerConfig::default()
            },
            catalog: catalog.clone(),
            flows,
            maintenance: Default::default(),
            ingest,
        };
        let config_path = dir.join("soak.toml");
        std::fs::write(
            &config_path,
            toml::to_string(&config).map_err(|e| Error::Config(e.to_string()))?,
        )?;
        Ok(Setup {
            config_path,
            port,
            names,
            catalog,
            local_warehouse,
        })
    }
}

/// The load: one task per flow, one request every batch_rows / rate_per_flow.
struct Load {
    stop: Arc<std::sync::atomic::AtomicBool>,
    sent: Arc<std::sync::atomic::AtomicU64>,
    throttled: Arc<std::sync::atomic::AtomicU64>,
    oracles: Vec<Arc<Mutex<Oracle>>>,
    tasks: Vec<tokio::task::JoinHandle<Result<()>>>,
    started: Instant,
}

impl Load {
    fn start(a: &SoakArgs, client: &reqwest::Client, base: &str, names: &[String]) -> Load {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sent = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let throttled = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let oracles: Vec<Arc<Mutex<Oracle>>> = names.iter().map(|_| Arc::default()).collect();
        let per_flow = (a.rate as f64 / a.flows as f64).max(1.0);
        let period = Duration::from_secs_f64(a.batch_rows as f64 / per_flow);
        let mut tasks = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let url = format!("{base}/v1/flows/{name}/changes");
            let (client, stop, sent, throttled, oracle) = (
                client.clone(),
                stop.clone(),
                sent.clone(),
                throttled.clone(),
                oracles[i].clone(),
            );
            let (keys, rows, seed) = (a.keys, a.batch_rows, a.seed + i as u64);
            tasks.push(tokio::spawn(async move {
                push_steadily(
                    client, url, period, keys, rows, seed, stop, sent, throttled, oracle,
                )
                .await
            }));
        }
        Load {
            stop,
            sent,
            throttled,
            oracles,
            tasks,
            started: Instant::now(),
        }
    }

    /// Whether a pusher stopped (on an error).
    fn faltered(&self) -> bool {
        self.tasks.iter().any(|t| t.is_finished())
    }

    /// Stops the pushers and says what they sent; a pusher's error.
    async fn stop(&mut self, rate: u64) -> Result<Option<String>> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let mut failure = None;
        for t in self.tasks.drain(..) {
            if let Err(e) = t.await.map_err(|e| Error::Unavailable(e.to_string()))? {
                failure.get_or_insert(e.to_string());
            }
        }
        let elapsed = self.started.elapsed().as_secs_f64();
        let total = self.sent.load(std::sync::atomic::Ordering::Relaxed);
        println!(
            "pushed {total} events in {elapsed:.0} s ({:.0} events/s; target {rate}), {} answers 429",
            total as f64 / elapsed,
            self.throttled.load(std::sync::atomic::Ordering::Relaxed)
        );
        Ok(failure)
    }
}

/// What the soak reads while it runs, and at the end.
struct Watch<'a> {
    client: &'a reqwest::Client,
    base: &'a str,
    names: &'a [String],
    catalog: &'a Arc<dyn crate::table::catalog::Catalog>,
    local_warehouse: Option<&'a Path>,
}

impl Watch<'_> {
    /// A sample every `every` for `duration`, each printed as a row; stops
    /// early (with why) when the server exits or a pusher stops.
    async fn samples(
        &self,
        child: &mut ServeChild,
        load: &Load,
        duration: Duration,
        every: Duration,
    ) -> Result<(Vec<Sample>, Option<String>)> {
        print_header();
        let pid = child.id();
        let started = Instant::now();
        let mut samples: Vec<Sample> = Vec::new();
        let (mut last_commits, mut last_t) = (0u64, 0.0);
        // Commit latency per row: the commits of its window in the
        // service's histogram (`latency`).
        let mut hist = self.commit_buckets().await?;
        // Between rows, a light sample every PEEK: a row's sizes and counts
        // are their peak over its window, not one instant of a sawtooth
        // (files pile up between compactions, memory between collections).
        let mut peak = Sample::default();
        let mut window_end = every;
        while started.elapsed() < duration {
            let end = window_end.min(duration);
            let wait = PEEK.min(end.saturating_sub(started.elapsed()));
            tokio::time::sleep(wait).await;
            if let Ok(Some(status)) = child.try_wait() {
                return Ok((samples, Some(format!("the server exited: {status}"))));
            }
            if load.faltered() {
                // A pusher stopped on an error: it is reported by `Load::stop`.
                break;
            }
            let read = |scan| {
                sample(
                    self.client,
                    self.base,
                    self.names,
                    pid,
                    self.catalog,
                    self.local_warehouse,
                    scan,
                )
            };
            if started.elapsed() < end {
                peak.raise(&read(false).await?);
                continue;
            }
            window_end += every;
            // A scan that once took over SCAN_LIMIT is not tried again.
            let scan = samples.last().is_none_or(|p| !p.scan_ms.is_nan());
            let mut s = read(scan).await?;
            if scan && s.scan_ms.is_nan() {
                println!(
                    "(the scan took over {SCAN_LIMIT:?}: later samples skip it; the tables keep growing without the table-health maintenance)"
                );
            }
            s.raise(&std::mem::take(&mut peak));
            s.t = started.elapsed().as_secs_f64();
            s.sent = load.sent.load(std::sync::atomic::Ordering::Relaxed);
            s.commit_rate = (s.commits - last_commits) as f64 / (s.t - last_t).max(1e-3);
            let now = self.commit_buckets().await?;
            let window = now.since(&hist);
            (s.p50, s.p99) = (window.quantile_ms(0.5), window.quantile_ms(0.99));
            hist = now;
            (last_commits, last_t) = (s.commits, s.t);
            print_sample(&s);
            samples.push(s);
        }
        Ok((samples, None))
    }

    /// The service's commit-duration histogram, summed over flows.
    async fn commit_buckets(&self) -> Result<Buckets> {
        let text = self
            .client
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .map_err(|e| Error::Unavailable(format!("/metrics: {e}")))?
            .text()
            .await
            .map_err(|e| Error::Unavailable(format!("/metrics: {e}")))?;
        Ok(Buckets::parse(&text))
    }

    /// Commits each flow and compares its table with its oracle; the first
    /// difference.
    async fn check_oracles(&self, oracles: &[Arc<Mutex<Oracle>>]) -> Result<Option<String>> {
        for (name, oracle) in self.names.iter().zip(oracles) {
            let r = self
                .client
                .post(format!("{}/v1/flows/{name}/commit", self.base))
                .timeout(Duration::from_secs(300))
                .send()
                .await
                .map_err(|e| Error::Unavailable(e.to_string()))?;
            if !r.status().is_success() {
                return Ok(Some(format!("{name}: /commit answered {}", r.status())));
            }
            let oracle = oracle.lock().unwrap_or_else(|e| e.into_inner()).clone();
            match tokio::time::timeout(SCAN_LIMIT * 10, check_table(self.catalog, name, &oracle))
                .await
            {
                Ok(Ok(n)) => println!("{name}: the table equals the oracle ({n} live keys)"),
                Ok(Err(e)) => {
                    return Ok(Some(e.to_string()));
                }
                Err(_) => println!(
                    "{name}: not checked against the oracle: the scan did not finish within {:?}",
                    SCAN_LIMIT * 10
                ),
            }
        }
        Ok(None)
    }
}

fn print_header() {
    let header = format!(
        "{:>6} {:>10} {:>7} {:>9} {:>7} {:>7} {:>7} {:>5} {:>5} {:>7} {:>8} {:>8} {:>6} {:>6} {:>6} {:>9} {:>7}",
        "t s",
        "sent",
        "commits",
        "commits/s",
        "p50 ms",
        "p99 ms",
        "RSS MiB",
        "fds",
        "thr",
        "log MiB",
        "pend KiB",
        "meta KiB",
        "snaps",
        "data",
        "dels",
        "wh MiB",
        "scan ms"
    );
    println!("{header}");
    println!(
        "(p50/p99: the commits of the row's window, from the service's commit histogram; RSS, fds, threads, log, metadata, snapshots, files and warehouse: each row's peak over its window, read every {PEEK:?})"
    );
}

fn print_sample(s: &Sample) {
    println!(
        "{:>6.0} {:>10} {:>7} {:>9.2} {:>7.1} {:>7.1} {:>7.1} {:>5.0} {:>5.0} {:>7.1} {:>8.1} {:>8.1} {:>6.0} {:>6.0} {:>6.0} {:>9.1} {:>7.0}",
        s.t,
        s.sent,
        s.commits,
        s.commit_rate,
        s.p50,
        s.p99,
        s.rss_mib,
        s.fds,
        s.threads,
        s.log_mib,
        s.pending_kib,
        s.metadata_kib,
        s.snapshots,
        s.data_files,
        s.delete_files,
        s.warehouse_mib,
        s.scan_ms
    );
}

/// Pushes one request per `period` (late requests are not made up for, so
/// an overloaded server shows as a lower sent rate). Sequences are a
/// counter, shuffled within each request; 10% of changes are deletes.
#[allow(clippy::too_many_arguments)]
async fn push_steadily(
    client: reqwest::Client,
    url: String,
    period: Duration,
    keys: i64,
    rows: usize,
    seed: u64,
    stop: Arc<std::sync::atomic::AtomicBool>,
    sent: Arc<std::sync::atomic::AtomicU64>,
    throttled: Arc<std::sync::atomic::AtomicU64>,
    oracle: Arc<Mutex<Oracle>>,
) -> Result<()> {
    let schema = Flow::new(generate::changes_flow("soak", "soak.soak")?)?.source_arrow;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut seq = 0i64;
    let mut n = 0u64;
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        tick.tick().await;
        let batch = generate::changes(&schema, &mut rng, rows, keys as usize, 0, seq, 0.1)?;
        seq += rows as i64;
        let body = generate::to_ndjson(&batch)?;
        let ids = batch.column(0).as_primitive::<Int64Type>();
        let seqs = batch.column(1).as_primitive::<Int64Type>();
        let ops = batch.column(2).as_string::<i32>();
        let changes: Vec<(i64, i64, bool)> = (0..rows)
            .map(|i| (ids.value(i), seqs.value(i), ops.value(i) == "DELETE"))
            .collect();
        let key = format!("soak-{seed}-{n}");
        n += 1;
        loop {
            let r = client
                .post(&url)
                .header("content-type", "application/x-ndjson")
                .header("idempotency-key", &key)
                .body(body.clone())
                .timeout(Duration::from_secs(60))
                .send()
                .await
                .map_err(|e| Error::Unavailable(format!("push: {e}")))?;
            match r.status().as_u16() {
                202 => break,
                429 => {
                    throttled.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let secs = r
                        .headers()
                        .get("retry-after")
                        .and_then(|v| v.to_str().ok()?.parse().ok())
                        .unwrap_or(1u64);
                    tokio::time::sleep(Duration::from_secs(secs)).await;
                }
                _ => {
                    let status = r.status();
                    let text = r.text().await.unwrap_or_default();
                    return Err(Error::Unavailable(format!(
                        "push answered {status}: {text}"
                    )));
                }
            }
        }
        let mut o = oracle.lock().unwrap_or_else(|e| e.into_inner());
        for (id, s, delete) in changes {
            let e = o.entry(id).or_insert((i64::MIN, true));
            if s > e.0 {
                *e = (s, delete);
            }
        }
        sent.fetch_add(rows as u64, std::sync::atomic::Ordering::Relaxed);
    }
    Ok(())
}

/// How long one sample's scan may take (and the final check's, x10).
const SCAN_LIMIT: Duration = Duration::from_secs(60);

async fn sample(
    client: &reqwest::Client,
    base: &str,
    names: &[String],
    pid: u32,
    catalog: &Arc<dyn crate::table::catalog::Catalog>,
    warehouse: Option<&Path>,
    scan: bool,
) -> Result<Sample> {
    let mut s = Sample::default();
    for name in names {
        let st: serde_json::Value = client
            .get(format!("{base}/v1/flows/{name}"))
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .map_err(|e| Error::Unavailable(e.to_string()))?
            .json()
            .await
            .map_err(|e| Error::Unavailable(e.to_string()))?;
        let st = st.get("status").unwrap_or(&st);
        let num = |path: &[&str]| {
            path.iter()
                .try_fold(st, |v, k| v.get(k))
                .and_then(|v| v.as_f64())
                .unwrap_or(0.0)
        };
        s.commits += num(&["commits"]) as u64;
        s.log_mib += num(&["wal", "bytes"]) / (1 << 20) as f64;
        s.pending_kib += num(&["pending_bytes"]) / 1024.0;
        let ident = parse_table_ident("soak", &format!("soak.{name}"))?;
        if let Some(t) = catalog.load_table(&ident).await? {
            if let Ok(input) = catalog.file_io().new_input(&t.metadata_location)
                && let Ok(m) = input.metadata().await
            {
                s.metadata_kib += m.size as f64 / 1024.0;
            }
            s.snapshots += t.metadata.snapshots().count() as f64;
            if let Some(snap) = t.metadata.current_snapshot() {
                let prop = |k: &str| {
                    snap.summary()
                        .additional_properties
                        .get(k)
                        .and_then(|v| v.parse::<f64>().ok())
                        .unwrap_or(0.0)
                };
                s.data_files += prop("total-data-files");
                s.delete_files += prop("total-delete-files");
            }
            let t0 = Instant::now();
            let limited =
                tokio::time::timeout(SCAN_LIMIT, crate::table::read::scan(catalog.as_ref(), &t));
            match scan {
                false => s.scan_ms = f64::NAN,
                true => match limited.await {
                    Err(_) => s.scan_ms = f64::NAN,
                    Ok(r) => {
                        r?;
                        s.scan_ms += t0.elapsed().as_secs_f64() * 1e3;
                    }
                },
            }
        }
    }
    let proc = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        proc.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    s.rss_mib = field("VmRSS:") / 1024.0;
    s.threads = field("Threads:");
    s.fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count() as f64)
        .unwrap_or(0.0);
    s.warehouse_mib = warehouse
        .map(|w| crate::tools::measure::dir_bytes(w) as f64 / (1 << 20) as f64)
        .unwrap_or(f64::NAN);
    Ok(s)
}

/// Flat, or growing with its slope: each figure's samples whose window
/// starts at minute 5 or later (a sample's figures are its window's: peaks
/// and the commits' percentiles since the sample before; from the first
/// third of the run when it is shorter than 15 minutes). The log keeps
/// committed batches for the idempotency window (`log_fills`), so it grows
/// until then by design: it is judged from the window's end.
fn verdicts(samples: &[Sample], duration: Duration, expected_rate: f64, log_fills: Duration) {
    let from = if duration >= Duration::from_secs(900) {
        300.0
    } else {
        duration.as_secs_f64() / 3.0
    };
    // Where each sample's window starts: the sample before it.
    let starts: Vec<f64> = std::iter::once(0.0)
        .chain(samples.iter().map(|s| s.t))
        .collect();
    let after = |at: f64| -> Vec<&Sample> {
        (samples.iter().zip(&starts))
            .filter(|&(_, &start)| start >= at)
            .map(|(s, _)| s)
            .collect()
    };
    if after(from).len() < 2 {
        println!("verdicts: too few samples after {from:.0} s to judge");
        return;
    }
    let log_from = from.max(log_fills.as_secs_f64());
    println!(
        "verdicts (samples of windows from {from:.0} s on, the log's from {log_from:.0} s; within 1.2x = the largest sample at most 1.2x the smallest, growing = the last over 1.5x the first, commit rate within 20% of {expected_rate:.2}/s):"
    );
    for (name, f) in FIGURES {
        let start = if name == "log MiB" { log_from } else { from };
        let window = after(start);
        if window.len() < 2 {
            println!(
                "  {name:<18} filling: it keeps committed batches for the idempotency window ({log_from:.0} s), judged after it"
            );
            continue;
        }
        let ys: Vec<f64> = window.iter().map(|s| f(s)).collect();
        let xs: Vec<f64> = window.iter().map(|s| s.t / 60.0).collect();
        if ys.iter().any(|y| y.is_nan()) {
            println!("  {name:<18} not measured in every sample");
            continue;
        }
        let slope = slope(&xs, &ys);
        let (first, last) = (ys[0], ys[ys.len() - 1]);
        let (lo, hi) = ys
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &y| {
                (lo.min(y), hi.max(y))
            });
        let spread = format!("{lo:.1}..{hi:.1}, x{:.2}", hi / lo.max(1e-9));
        let verdict = if name == "commits/s" {
            let mean = ys.iter().sum::<f64>() / ys.len() as f64;
            if (mean - expected_rate).abs() <= 0.2 * expected_rate {
                format!("holds: mean {mean:.2}/s ({spread})")
            } else {
                format!("off: mean {mean:.2}/s ({spread})")
            }
        } else if hi <= lo.max(1e-9) * 1.2 || hi - lo <= 1.0 {
            format!("within 1.2x ({spread})")
        } else if last <= first.max(1e-9) * 1.5 || last - first <= 1.0 {
            format!("bounded, not within 1.2x ({spread}; {first:.1} -> {last:.1})")
        } else {
            format!(
                "growing ({first:.1} -> {last:.1}, x{:.2}, {slope:+.2}/min)",
                last / first.max(1e-9)
            )
        };
        println!("  {name:<18} {verdict}");
    }
}

fn slope(xs: &[f64], ys: &[f64]) -> f64 {
    let n = xs.len() as f64;
    let (mx, my) = (xs.iter().sum::<f64>() / n, ys.iter().sum::<f64>() / n);
    let cov: f64 = xs.iter().zip(ys).map(|(x, y)| (x - mx) * (y - my)).sum();
    let var: f64 = xs.iter().map(|x| (x - mx) * (x - mx)).sum();
    if var == 0.0 { 0.0 } else { cov / var }
}

/// The table's live (id, seq) pairs equal the oracle's.
async fn check_table(
    catalog: &Arc<dyn crate::table::catalog::Catalog>,
    name: &str,
    oracle: &Oracle,
) -> Result<usize> {
    let ident = parse_table_ident("soak", &format!("soak.{name}"))?;
    let t = catalog
        .load_table(&ident)
        .await?
        .ok_or_else(|| Error::Unavailable(format!("soak.{name} does not exist")))?;
    let mut rows: HashMap<i64, i64> = HashMap::new();
    for b in crate::table::read::scan(catalog.as_ref(), &t).await? {
        let id = b
            .column_by_name("id")
            .ok_or_else(|| Error::Unavailable("no id column".into()))?
            .as_primitive::<Int64Type>();
        let seq = b
            .column_by_name("seq")
            .ok_or_else(|| Error::Unavailable("no seq column".into()))?
            .as_primitive::<Int64Type>();
        for i in 0..b.num_rows() {
            if rows.insert(id.value(i), seq.value(i)).is_some() {
                return Err(Error::Unavailable(format!(
                    "soak.{name}: key {} appears twice",
                    id.value(i)
                )));
            }
        }
    }
    let live: HashMap<i64, i64> = oracle
        .iter()
        .filter(|(_, (_, deleted))| !deleted)
        .map(|(&id, &(seq, _))| (id, seq))
        .collect();
    if rows != live {
        let missing = live.iter().filter(|(k, v)| rows.get(k) != Some(v)).count();
        let extra = rows.iter().filter(|(k, v)| live.get(k) != Some(v)).count();
        return Err(Error::Unavailable(format!(
            "soak.{name} differs from the oracle: {missing} keys missing or wrong, {extra} extra or wrong (of {} live)",
            live.len()
        )));
    }
    Ok(rows.len())
}
