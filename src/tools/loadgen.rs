//! `autocdc bench-serve`: a load generator for `autocdc serve`. Starts the
//! service in its own process (this binary's `serve`) on a loopback port,
//! so the client does not take the server's cores, pushes pre-encoded
//! batches of NDJSON and Arrow IPC from several connections, and reports
//! events/s acknowledged and committed, acknowledgement latency
//! percentiles, commit lag and the peak RSS of server and client.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::config::{CatalogConfig, Config, ServerConfig};
use crate::core::flow::Flow;
use crate::error::{Error, Result};
use crate::service::input;
use crate::tools::generate;
use crate::tools::serve_child::ServeChild;

#[derive(clap::Args, Debug, Clone)]
pub struct LoadArgs {
    /// Change events pushed per format.
    #[arg(long, default_value_t = 2_000_000)]
    pub events: usize,
    #[arg(long, default_value_t = 200_000)]
    pub keys: usize,
    /// Events per request.
    #[arg(long, default_value_t = 10_000)]
    pub batch_rows: usize,
    /// Concurrent client connections.
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// ndjson, arrow, debezium (the same changes as Debezium events to
    /// `/v1/debezium`), both (ndjson and arrow), or a comma-separated list.
    #[arg(long, default_value = "both")]
    pub format: String,
    /// The service's commit_interval.
    #[arg(long, default_value = "1s")]
    pub commit_interval: String,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
}

/// The flow `bench-serve` and `soak` push to (name and target are set per run).
/// `a.events` changes of `generate::CHANGES_FLOW` in requests of `a.batch_rows`.
fn batches(flow: &Flow, a: &LoadArgs) -> Result<Vec<RecordBatch>> {
    let mut rng = StdRng::seed_from_u64(a.seed);
    let all = generate::changes(&flow.source_arrow, &mut rng, a.events, a.keys, 0, 0, 0.1)?;
    let per = a.batch_rows.max(1);
    Ok((0..all.num_rows())
        .step_by(per)
        .map(|at| all.slice(at, per.min(all.num_rows() - at)))
        .collect())
}

/// One connection's share of the load: takes the next body until none is
/// left, retrying a 429 after 200 ms; returns each acknowledgement's latency (ms).
async fn push_bodies(
    client: reqwest::Client,
    url: String,
    ctype: &'static str,
    bodies: Arc<Vec<bytes::Bytes>>,
    next: Arc<AtomicUsize>,
    throttled: Arc<AtomicUsize>,
) -> Result<Vec<f64>> {
    let mut lat = Vec::new();
    loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some(body) = bodies.get(i) else { break };
        loop {
            let t = Instant::now();
            let resp = client
                .post(&url)
                .header("content-type", ctype)
                .header("idempotency-key", format!("load-{i}"))
                .body(body.clone())
                .send()
                .await;
            match resp {
                Ok(r) if r.status().as_u16() == 202 => {
                    lat.push(t.elapsed().as_secs_f64() * 1e3);
                    break;
                }
                Ok(r) if r.status().as_u16() == 429 => {
                    throttled.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Ok(r) => {
                    let s = r.status();
                    let text = r.text().await.unwrap_or_default();
                    return Err(Error::Unavailable(format!("{s}: {text}")));
                }
                Err(e) => return Err(Error::Unavailable(e.to_string())),
            }
        }
    }
    Ok(lat)
}

/// The flow a format's load goes to.
fn load_flow(format: &str) -> Result<crate::core::flow::FlowConfig> {
    let (name, target) = (format!("load_{format}"), format!("bench.load_{format}"));
    if format != "debezium" {
        return generate::changes_flow(&name, &target);
    }
    let mut cfg: crate::core::flow::FlowConfig =
        toml::from_str(generate::DEBEZIUM_FLOW).map_err(|e| Error::Config(e.to_string()))?;
    (cfg.name, cfg.target) = (name, target);
    Ok(cfg)
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

pub async fn run(a: LoadArgs) -> Result<()> {
    let tmp = std::env::temp_dir().join(format!("autocdc-load-{}", uuid::Uuid::new_v4()));
    let mut flows = Vec::new();
    let mut formats: Vec<&str> = Vec::new();
    for f in a.format.split(',').map(str::trim) {
        match f {
            "both" => formats.extend(["ndjson", "arrow"]),
            "ndjson" | "arrow" | "debezium" => formats.push(f),
            other => {
                return Err(Error::Config(format!(
                    "--format {other}: use ndjson, arrow, debezium or both (or a list: ndjson,debezium)"
                )));
            }
        }
    }
    for f in &formats {
        let mut cfg = load_flow(f)?;
        cfg.commit_interval = Some(a.commit_interval.clone());
        cfg.max_uncommitted_bytes = Some(8 << 30);
        flows.push(cfg);
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let config = Config {
        server: ServerConfig {
            listen: format!("127.0.0.1:{port}"),
            data_dir: tmp.join("data").to_string_lossy().to_string(),
            max_body_bytes: 256 << 20,
            ..ServerConfig::default()
        },
        catalog: CatalogConfig::Hadoop {
            warehouse: tmp.join("wh").to_string_lossy().to_string(),
            s3: None,
        },
        flows,
        maintenance: Default::default(),
        ingest: Default::default(),
    };
    std::fs::create_dir_all(&tmp)?;
    let config_path = tmp.join("bench-serve.toml");
    std::fs::write(
        &config_path,
        toml::to_string(&config).map_err(|e| Error::Config(e.to_string()))?,
    )?;
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(a.connections)
        .build()
        .map_err(|e| Error::Unavailable(e.to_string()))?;
    let server = ServeChild::start(&config_path, &tmp.join("serve.log"), &client, &base).await?;
    println!(
        "bench-serve: {} events over {} keys per format, {} per request, {} connections, commit_interval {}, server: `autocdc serve` in its own process on {base}",
        a.events, a.keys, a.batch_rows, a.connections, a.commit_interval
    );
    println!(
        "{:<8} {:>14} {:>14} {:>10} {:>10} {:>12} {:>9} {:>13} {:>13} {:>13}",
        "format",
        "acked ev/s",
        "committed ev/s",
        "p50 ms",
        "p99 ms",
        "commit lag",
        "429s",
        "server µs/ev",
        "client µs/ev",
        "decode µs/ev"
    );
    let server_pid = server.id().to_string();
    for f in &formats {
        run_format(&a, &client, &base, &server_pid, f).await?;
    }
    let server_rss = crate::tools::measure::peak_rss_of(&server_pid);
    let client_rss = crate::tools::measure::peak_rss_bytes();
    if let (Some(s), Some(c)) = (server_rss, client_rss) {
        println!("peak RSS: server {} MiB, client {} MiB", s >> 20, c >> 20);
    }
    drop(server);
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(())
}

/// Pushes `a.events` changes as format `f` to the server at `base`, has
/// them committed, and prints the format's line of figures.
async fn run_format(
    a: &LoadArgs,
    client: &reqwest::Client,
    base: &str,
    server_pid: &str,
    f: &str,
) -> Result<()> {
    let name = format!("load_{f}");
    // Every format pushes the same changes (the rows flow's batches).
    let rows_flow = Flow::new(generate::changes_flow(&name, &format!("bench.{name}"))?)?;
    // Sent from shared buffers, not copied per request (as a sink sends
    // from its own buffer).
    let bodies: Vec<bytes::Bytes> = batches(&rows_flow, a)?
        .iter()
        .map(|b| {
            match f {
                "ndjson" => generate::to_ndjson(b),
                "debezium" => generate::to_debezium(b),
                _ => input::encode_arrow_ipc(b),
            }
            .map(bytes::Bytes::from)
        })
        .collect::<Result<_>>()?;
    let decode = decode_cost(f, &bodies)?;
    let bodies = Arc::new(bodies);
    let (ctype, url) = match f {
        "ndjson" => (
            crate::service::http::NDJSON,
            format!("{base}/v1/flows/{name}/changes"),
        ),
        "debezium" => ("application/json", format!("{base}/v1/debezium")),
        _ => (
            crate::service::http::ARROW_STREAM,
            format!("{base}/v1/flows/{name}/changes"),
        ),
    };
    let next = Arc::new(AtomicUsize::new(0));
    let throttled = Arc::new(AtomicUsize::new(0));
    let me = std::process::id().to_string();
    let cpu_before = cpu_seconds_of(server_pid);
    let client_before = cpu_seconds_of(&me);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..a.connections.max(1) {
        let (client, url, bodies, next, throttled) = (
            client.clone(),
            url.clone(),
            bodies.clone(),
            next.clone(),
            throttled.clone(),
        );
        tasks.push(tokio::spawn(push_bodies(
            client, url, ctype, bodies, next, throttled,
        )));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.map_err(|e| Error::Unavailable(e.to_string()))??);
    }
    let acked = start.elapsed();
    // Commits now and answers once every acknowledged batch is committed.
    let r = client
        .post(format!("{base}/v1/flows/{name}/commit"))
        .send()
        .await
        .map_err(|e| Error::Unavailable(e.to_string()))?;
    if !r.status().is_success() {
        let s = r.status();
        let text = r.text().await.unwrap_or_default();
        return Err(Error::Unavailable(format!("commit: {s}: {text}")));
    }
    let committed = start.elapsed();
    lat.sort_by(|x, y| x.total_cmp(y));
    let ev = a.events as f64;
    // The server's CPU time per event, from receiving to committing:
    // what the format costs whatever else runs on the machine.
    let per_event = |before: Option<f64>, pid: &str| match (before, cpu_seconds_of(pid)) {
        (Some(b), Some(e)) => format!("{:.2}", (e - b) / ev * 1e6),
        _ => "-".into(),
    };
    let cpu = per_event(cpu_before, server_pid);
    // The client's own (sending, on the same cores): what the figures
    // above include that a remote producer would not cost this machine.
    let client_cpu = per_event(client_before, &me);
    println!(
        "{:<8} {:>14.0} {:>14.0} {:>10.1} {:>10.1} {:>10.0}ms {:>9} {:>13} {:>13} {:>13.2}",
        f,
        ev / acked.as_secs_f64(),
        ev / committed.as_secs_f64(),
        pct(&lat, 0.5),
        pct(&lat, 0.99),
        (committed - acked).as_secs_f64() * 1e3,
        throttled.load(Ordering::Relaxed),
        cpu,
        client_cpu,
        decode
    );
    Ok(())
}

/// The CPU time per event of reading `bodies` as the server reads format
/// `f` (to the flow's rows, checked; not logged), in this process, one
/// body after another: the format's own cost, apart from the network, the
/// log and the commit, and steadier than the server's figure (the least of
/// three readings).
fn decode_cost(f: &str, bodies: &[bytes::Bytes]) -> Result<f64> {
    let flow = Flow::new(load_flow(f)?)?;
    let limits = input::Limits {
        max_rows: usize::MAX,
        max_value_bytes: usize::MAX,
    };
    let me = std::process::id().to_string();
    let mut least = f64::NAN;
    for _ in 0..3 {
        let before = cpu_seconds_of(&me);
        let mut rows = 0;
        for body in bodies {
            let batch = match f {
                "ndjson" => input::decode_ndjson(&flow, body, limits)?,
                "debezium" => {
                    let flows = std::slice::from_ref(&flow);
                    let (mut routed, _) = crate::service::debezium::route(
                        flows,
                        input::BodyFormat::JsonArray,
                        crate::service::debezium::Body::Whole(body),
                        limits,
                    )?;
                    match routed.pop() {
                        Some((_, batch)) => batch?,
                        None => RecordBatch::new_empty(flow.source_arrow.clone()),
                    }
                }
                _ => input::decode_arrow_ipc(&flow, body, limits)?,
            };
            crate::core::resolve::validate(&flow, &batch)?;
            rows += batch.num_rows();
        }
        if let (Some(b), Some(e)) = (before, cpu_seconds_of(&me))
            && rows > 0
        {
            least = least.min((e - b) / rows as f64 * 1e6);
        }
    }
    Ok(least)
}

/// User and system CPU seconds process `pid` has used (Linux; else none).
fn cpu_seconds_of(pid: &str) -> Option<f64> {
    crate::service::process::of(pid).map(|p| p.cpu_seconds)
}
