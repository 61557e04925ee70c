//! `autocdc serve` on the NATS JetStream ingest log (`[ingest] type =
//! "nats"`), against the server `integration/backends.sh up nats` started
//! (and, for the outage tests, a server of the test's own).
//!
//! What is shown: an acknowledged batch survives the loss of the machine
//! that took it (a new instance with an empty data directory replays it
//! from JetStream); a retried Idempotency-Key is answered from JetStream's
//! duplicate window, across that restart too; committed messages are purged
//! once their window passed; a full stream refuses with 429 and loses
//! nothing; a NATS outage makes pushes 503 and `/readyz` unready, and the
//! flow goes on when the server is back, ready again without a push; a
//! stream not found is not made again; a stream holding another table's
//! messages is refused until adopted or reset. Several instances on one
//! log: `instances`.

use crate::common;

use std::time::Duration;

use autocdc::config::{Config, IngestConfig, NatsConfig};
use common::http::*;
use common::*;

mod instances;

fn nats_url() -> String {
    backend_env("AUTOCDC_TEST_NATS_URL")
}

/// A stream prefix of this test's own: tests share the server.
fn prefix() -> String {
    format!("T{}", uuid_like())
}

fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "{:x}{:x}{:x}",
        t,
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn nats(url: &str, prefix: &str) -> NatsConfig {
    NatsConfig {
        url: url.to_string(),
        user: None,
        password: None,
        token: None,
        stream_prefix: prefix.to_string(),
        subject_prefix: prefix.to_lowercase(),
        replicas: 1,
        max_age: "0s".into(),
        publish_timeout: "5s".into(),
        lease_ttl: "2s".into(),
        instance: None,
    }
}

/// A service config on the NATS log, with its data dir at `data`.
fn on_nats(
    dir: &std::path::Path,
    data: &str,
    flows: Vec<autocdc::core::flow::FlowConfig>,
    n: NatsConfig,
) -> Config {
    let mut cfg = config(dir, flows);
    cfg.server.data_dir = dir.join(data).to_string_lossy().to_string();
    cfg.ingest = IngestConfig::Nats(Box::new(n));
    cfg
}

/// Pushes `evs` as NDJSON; the answer, which must be 202.
async fn push(
    client: &reqwest::Client,
    url: &str,
    evs: &[Ev],
    key: Option<&str>,
) -> serde_json::Value {
    let (s, a) = post(client, url, "application/x-ndjson", ndjson(evs), key).await;
    assert_eq!(s, 202, "{a}");
    a
}

/// The (epoch, instance) of each of `flow`'s snapshots that records a
/// lease, in commit order, after asserting the table's history shows one
/// holder at a time: epochs never go down, and each epoch is one
/// instance's.
async fn one_holder_at_a_time(dir: &std::path::Path, flow: &str) -> Vec<(u64, String)> {
    use autocdc::table::catalog::Catalog;
    let cat = autocdc::table::catalog::hadoop::HadoopCatalog::new(
        dir.join("wh").to_str().unwrap(),
        None,
        std::sync::Arc::new(autocdc::fault::Faults::default()),
    )
    .unwrap();
    let ident = autocdc::core::flow::parse_table_ident(flow, &format!("crm.{flow}")).unwrap();
    let t = cat.load_table(&ident).await.unwrap().unwrap();
    let mut snaps: Vec<_> = t.metadata.snapshots().collect();
    snaps.sort_by_key(|s| s.sequence_number());
    let mut out: Vec<(u64, String)> = Vec::new();
    for s in snaps {
        let props = &s.summary().additional_properties;
        let (Some(e), Some(who)) = (
            props.get("autocdc.lease-epoch"),
            props.get("autocdc.committer"),
        ) else {
            continue;
        };
        let e: u64 = e.parse().unwrap();
        if let Some((last, by)) = out.last() {
            assert!(
                e >= *last,
                "{flow}: epoch {e} by {who} after {last} by {by}: {out:?}"
            );
            assert!(
                e > *last || who == by,
                "{flow}: epoch {e} by {who} and {by}"
            );
            if e == *last {
                continue;
            }
        }
        out.push((e, who.clone()));
    }
    assert!(!out.is_empty(), "{flow}: no snapshot records its lease");
    out
}

async fn stream_state(url: &str, name: &str) -> async_nats::jetstream::stream::State {
    let client = async_nats::connect(url).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let mut s = js.get_stream(name).await.unwrap();
    s.info().await.unwrap().state.clone()
}

#[test]
fn acknowledged_batches_survive_the_loss_of_the_machine_that_took_them() {
    let tmp = tempfile::tempdir().unwrap();
    let p = prefix();
    let n = nats(&nats_url(), &p);
    let first = [u(1, "Oslo", 1), u(2, "Rome", 1), d(1, 2)];
    let second = [u(2, "Lima", 3), u(3, "Kyiv", 1)];
    let client = reqwest::Client::new();

    // Instance A takes two batches and never commits (1h interval), then
    // its process dies: its runtime is dropped, nothing is flushed.
    let a_rt = rt();
    let (k1, k2) = a_rt.block_on(async {
        let r = start(on_nats(
            tmp.path(),
            "a",
            vec![flow_cfg("m", "1h")],
            n.clone(),
        ))
        .await;
        let changes = url(&r, "/v1/flows/m/changes");
        let k1 = push(&client, &changes, &first, Some("k1")).await;
        // No key: the content hash is the message id.
        let k2 = push(&client, &changes, &second, None).await;
        assert_eq!(
            k2["offset"].as_i64(),
            Some(k1["offset"].as_i64().unwrap() + 1)
        );
        let again = push(&client, &changes, &first, Some("k1")).await;
        assert_eq!(again["duplicate"], true, "{again}");
        assert_eq!(again["offset"], k1["offset"]);
        let status = flow_status(&client, &r, "m").await;
        // Lag and publish latency, in the status and in /metrics.
        assert_eq!(status["status"]["log_lag_batches"], 2, "{status}");
        assert!(
            status["status"]["recent_append_ms_p99"].as_f64().unwrap() > 0.0,
            "{status}"
        );
        let metrics = get_text(&client, &r, "/metrics").await;
        assert!(
            metrics.contains("autocdc_log_lag_batches{flow=\"m\"} 2\n"),
            "{metrics}"
        );
        assert!(
            metrics.contains("autocdc_log_append_duration_recent_p99_seconds{flow=\"m\"}"),
            "{metrics}"
        );
        std::mem::forget(r);
        (k1, k2)
    });
    a_rt.shutdown_background();
    assert_eq!(table(tmp.path(), "m").await_blocking(), expected(&[]));

    // Instance B: another data dir (a fresh machine), same catalog, same
    // NATS. It replays both batches; a retry of k1 is still a duplicate.
    rt().block_on(async {
        let r = start(on_nats(
            tmp.path(),
            "b",
            vec![flow_cfg("m", "1h")],
            n.clone(),
        ))
        .await;
        let changes = url(&r, "/v1/flows/m/changes");
        let again = push(&client, &changes, &first, Some("k1")).await;
        assert_eq!(again["duplicate"], true, "{again}");
        assert_eq!(again["offset"], k1["offset"]);
        commit(&client, &r, "m").await;
        let all: Vec<_> = first.iter().chain(&second).copied().collect();
        assert_eq!(table(tmp.path(), "m").await, expected(&all));
        let status = flow_status(&client, &r, "m").await;
        assert_eq!(
            status["status"]["committed_offset"], k2["offset"],
            "{status}"
        );
        r.stop().await.unwrap();

        // A third start replays nothing: both are committed.
        let r = start(on_nats(
            tmp.path(),
            "c",
            vec![flow_cfg("m", "1h")],
            n.clone(),
        ))
        .await;
        let status = flow_status(&client, &r, "m").await;
        assert_eq!(status["status"]["pending_batches"], 0, "{status}");
        let b = push(
            &client,
            &url(&r, "/v1/flows/m/changes"),
            &[u(4, "Bern", 1)],
            Some("k3"),
        )
        .await;
        assert_eq!(
            b["offset"].as_i64(),
            Some(k2["offset"].as_i64().unwrap() + 1)
        );
        commit(&client, &r, "m").await;
        let all: Vec<_> = first
            .iter()
            .chain(&second)
            .chain(&[u(4, "Bern", 1)])
            .copied()
            .collect();
        assert_eq!(table(tmp.path(), "m").await, expected(&all));
        r.stop().await.unwrap();
    });
}

trait AwaitBlocking: std::future::Future + Sized {
    fn await_blocking(self) -> Self::Output {
        rt().block_on(self)
    }
}
impl<F: std::future::Future> AwaitBlocking for F {}

#[test]
fn committed_messages_are_purged_once_their_window_passed() {
    rt().block_on(async {
        let tmp = tempfile::tempdir().unwrap();
        let p = prefix();
        let url_ = nats_url();
        let mut cfg = on_nats(
            tmp.path(),
            "data",
            vec![flow_cfg("m", "1h")],
            nats(&url_, &p),
        );
        cfg.server.idempotency_window = "1s".into();
        let client = reqwest::Client::new();
        let r = start(cfg).await;
        let changes = url(&r, "/v1/flows/m/changes");
        for i in 0..5 {
            push(
                &client,
                &changes,
                &[u(i, "Oslo", 1)],
                Some(&format!("k{i}")),
            )
            .await;
        }
        commit(&client, &r, "m").await;
        let stream = format!("{p}_m");
        // Inside the window the committed messages stay (retries of them
        // are still recognised).
        assert_eq!(stream_state(&url_, &stream).await.messages, 5);
        tokio::time::sleep(Duration::from_millis(1200)).await;
        push(&client, &changes, &[u(9, "Rome", 1)], Some("k9")).await;
        commit(&client, &r, "m").await;
        let mut st = stream_state(&url_, &stream).await;
        for _ in 0..50 {
            if st.messages <= 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            st = stream_state(&url_, &stream).await;
        }
        // The first five are gone; the sixth is in its window.
        assert_eq!((st.messages, st.first_sequence), (1, 6), "{st:?}");
        let status = flow_status(&client, &r, "m").await;
        assert_eq!(status["status"]["wal"]["next_offset"], 7, "{status}");
        r.stop().await.unwrap();

        // After a restart offsets go on from the stream, not from 1.
        let cfg = on_nats(
            tmp.path(),
            "data2",
            vec![flow_cfg("m", "1h")],
            nats(&url_, &p),
        );
        let r = start(cfg).await;
        let a = push(
            &client,
            &url(&r, "/v1/flows/m/changes"),
            &[u(10, "Lima", 1)],
            None,
        )
        .await;
        assert_eq!(a["offset"], 7, "{a}");
        commit(&client, &r, "m").await;
        assert_eq!(table(tmp.path(), "m").await.len(), 7);
        r.stop().await.unwrap();
    });
}

#[test]
fn a_full_stream_refuses_with_429_and_loses_nothing() {
    rt().block_on(async {
        let tmp = tempfile::tempdir().unwrap();
        let p = prefix();
        let mut flow = flow_cfg("m", "1h");
        flow.max_log_bytes = Some(64 << 10);
        let cfg = on_nats(tmp.path(), "data", vec![flow], nats(&nats_url(), &p));
        let client = reqwest::Client::new();
        let r = start(cfg).await;
        let changes = url(&r, "/v1/flows/m/changes");
        let mut accepted = Vec::new();
        let mut refused = None;
        for i in 0..200i64 {
            let evs: Vec<Ev> = (0..40).map(|j| u(i * 40 + j, "Oslo", 1)).collect();
            let (s, a) = post(
                &client,
                &changes,
                "application/x-ndjson",
                ndjson(&evs),
                Some(&format!("k{i}")),
            )
            .await;
            match s {
                202 => accepted.extend(evs),
                429 => {
                    refused = Some(a);
                    break;
                }
                _ => panic!("{s} {a}"),
            }
        }
        let refused = refused.expect("64 KiB of batches were never refused");
        assert_eq!(refused["error"]["code"], "AUTOCDC_OVERLOADED", "{refused}");
        assert!(
            refused["error"]["message"]
                .as_str()
                .unwrap()
                .contains("full"),
            "{refused}"
        );
        assert!(!accepted.is_empty());
        // Everything acknowledged is committed; the stream takes more after.
        commit(&client, &r, "m").await;
        let (got, want) = (table(tmp.path(), "m").await, expected(&accepted));
        assert!(got == want, "{} rows, want {}", got.len(), want.len());
        r.stop().await.unwrap();
    });
}

/// A nats-server of the test's own, which it kills and starts again:
/// on `port`, keeping its streams in `store` across restarts; killed when
/// dropped (a failed test leaves no server behind).
struct OwnNats {
    bin: String,
    port: u16,
    store: std::path::PathBuf,
    /// Started with `-js`.
    jetstream: bool,
    child: Option<std::process::Child>,
}

impl OwnNats {
    /// Started, with JetStream.
    fn new(dir: &std::path::Path) -> OwnNats {
        OwnNats::started(dir, true)
    }

    /// Started, without JetStream: core NATS only.
    fn without_jetstream(dir: &std::path::Path) -> OwnNats {
        OwnNats::started(dir, false)
    }

    fn started(dir: &std::path::Path, jetstream: bool) -> OwnNats {
        let Ok(bin) = std::env::var("AUTOCDC_TEST_NATS_SERVER") else {
            panic!(
                "AUTOCDC_TEST_NATS_SERVER is not set: run `eval \"$(bash integration/backends.sh up)\"` first"
            );
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut own = OwnNats {
            bin,
            port,
            store: dir.join("nats"),
            jetstream,
            child: None,
        };
        own.start();
        own
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Starts the server; returns once it takes connections.
    fn start(&mut self) {
        let port = self.port.to_string();
        let mut server = std::process::Command::new(&self.bin);
        if self.jetstream {
            server.arg("-js");
        }
        server
            .args(["-a", "127.0.0.1", "-p", &port, "-sd"])
            .arg(&self.store)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        self.child = Some(server.spawn().unwrap());
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILLs the server.
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for OwnNats {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `/readyz`'s status and body once it is `want`, or after `tries` polls
/// 100 ms apart.
async fn readyz_until(
    client: &reqwest::Client,
    r: &autocdc::service::run::Running,
    want: u16,
    tries: usize,
) -> (u16, String) {
    let mut last = (0, String::new());
    for _ in 0..tries {
        let resp = client.get(url(r, "/readyz")).send().await.unwrap();
        last = (resp.status().as_u16(), resp.text().await.unwrap());
        if last.0 == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    last
}

#[test]
fn a_nats_outage_makes_pushes_503_and_readyz_unready_then_the_flow_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let mut own = OwnNats::new(tmp.path());
    rt().block_on(async {
        let mut n = nats(&own.url(), "OUT");
        n.publish_timeout = "1s".into();
        let cfg = on_nats(tmp.path(), "data", vec![flow_cfg("m", "1h")], n);
        let client = reqwest::Client::new();
        let r = start(cfg).await;
        let changes = url(&r, "/v1/flows/m/changes");
        push(&client, &changes, &[u(1, "Oslo", 1)], Some("k1")).await;

        own.kill();
        let (ready, _) = readyz_until(&client, &r, 503, 50).await;
        assert_eq!(ready, 503, "/readyz stayed ready without NATS");
        let (s, e) = post(
            &client,
            &changes,
            "application/x-ndjson",
            ndjson(&[u(2, "Rome", 1)]),
            Some("k2"),
        )
        .await;
        assert_eq!(s, 503, "{e}");
        assert_eq!(e["error"]["code"], "AUTOCDC_WAL.WRITE_FAILED", "{e}");

        own.start();
        let mut last = (0, serde_json::Value::Null);
        for _ in 0..100 {
            last = post(
                &client,
                &changes,
                "application/x-ndjson",
                ndjson(&[u(2, "Rome", 1)]),
                Some("k2"),
            )
            .await;
            if last.0 == 202 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(last.0, 202, "{}", last.1);
        let (ready, body) = readyz_until(&client, &r, 200, 50).await;
        assert_eq!(ready, 200, "{body}");
        commit(&client, &r, "m").await;
        assert_eq!(
            table(tmp.path(), "m").await,
            expected(&[u(1, "Oslo", 1), u(2, "Rome", 1)])
        );
        r.stop().await.unwrap();
    });
}

/// After a NATS outage /readyz is ready again by itself, with no push since
/// (an instance a load balancer took out for being unready is sent none).
/// Two outages: in the first only the holder's commit rounds fail, and the
/// flow stayed `degraded` with the outage's error while it had nothing to
/// commit; in the second a push fails too, and the log stayed `failing`
/// until a publish went through (the push, buffered by the client, is
/// stored once the server is back, so the flow has something to commit).
/// integration/cluster.sh's instances restarted while a NATS node died
/// then never became ready.
#[test]
fn after_a_nats_outage_readyz_is_ready_again_without_a_push() {
    let tmp = tempfile::tempdir().unwrap();
    let mut own = OwnNats::new(tmp.path());
    rt().block_on(async {
        let mut n = nats(&own.url(), "REC");
        n.publish_timeout = "1s".into();
        // The lease outlives the outages: this instance stays the holder,
        // and its commit rounds fail meanwhile.
        n.lease_ttl = "60s".into();
        let cfg = on_nats(tmp.path(), "data", vec![flow_cfg("m", "200ms")], n);
        let client = reqwest::Client::new();
        let r = start(cfg).await;
        let changes = url(&r, "/v1/flows/m/changes");
        push(&client, &changes, &[u(1, "Oslo", 1)], Some("k1")).await;
        commit(&client, &r, "m").await;

        for push_meanwhile in [false, true] {
            own.kill();
            if push_meanwhile {
                let (s, e) = post(
                    &client,
                    &changes,
                    "application/x-ndjson",
                    ndjson(&[u(2, "Rome", 1)]),
                    Some("k2"),
                )
                .await;
                assert_eq!(s, 503, "{e}");
            }
            let mut degraded = false;
            for _ in 0..100 {
                if flow_status(&client, &r, "m").await["status"]["degraded"] == true {
                    degraded = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert!(
                degraded,
                "the holder's commit rounds did not fail without NATS"
            );

            own.start();
            let (ready, body) = readyz_until(&client, &r, 200, 200).await;
            assert_eq!(
                ready, 200,
                "/readyz 20 s after NATS came back (a push failed meanwhile: {push_meanwhile}), no push since: {body}"
            );
            let st = &flow_status(&client, &r, "m").await["status"];
            assert_eq!(st["degraded"], false, "{st}");
            assert!(st["last_error"].is_null(), "{st}");
            assert_eq!(st["wal"]["failing"], false, "{st}");
        }

        // The retry lands at offset 2 (the push the client buffered was
        // stored when the server came back, or this one is); the flow goes on.
        let a = push(&client, &changes, &[u(2, "Rome", 1)], Some("k2")).await;
        assert_eq!(a["offset"], 2, "{a}");
        push(&client, &changes, &[u(3, "Pisa", 1)], Some("k3")).await;
        commit(&client, &r, "m").await;
        assert_eq!(
            table(tmp.path(), "m").await,
            expected(&[u(1, "Oslo", 1), u(2, "Rome", 1), u(3, "Pisa", 1)])
        );
        r.stop().await.unwrap();
    });
}

/// JetStream that does not answer for a while (a cluster electing its meta
/// leader after a server was lost) is waited for at start, as the streams
/// are; a server without JetStream is a config error at once. An instance
/// of integration/cluster.sh started while a NATS node died exited with
/// "JetStream does not answer (timed out)" after one publish_timeout. Here
/// the test answers JetStream's account info on a server without
/// JetStream (with a real server's answer), once 2 s have passed.
#[test]
fn a_jetstream_electing_its_leader_is_waited_for_at_start() {
    use futures::StreamExt;
    let tmp = tempfile::tempdir().unwrap();
    let own = OwnNats::without_jetstream(tmp.path());
    rt().block_on(async {
        let real = async_nats::connect(nats_url()).await.unwrap();
        let info = real
            .request("$JS.API.INFO", "".into())
            .await
            .unwrap()
            .payload;
        let fake = async_nats::connect(own.url()).await.unwrap();
        let mut requests = fake.subscribe("$JS.API.INFO").await.unwrap();
        fake.flush().await.unwrap();
        let started = std::time::Instant::now();
        let answering = tokio::spawn(async move {
            while let Some(m) = requests.next().await {
                if let Some(reply) = m.reply
                    && started.elapsed() >= Duration::from_secs(2)
                {
                    fake.publish(reply, info.clone()).await.unwrap();
                }
            }
        });
        let mut n = nats(&own.url(), "WAIT");
        n.publish_timeout = "500ms".into();
        let window = Duration::from_secs(60);
        if let Err(e) = autocdc::service::nats_log::NatsLogs::connect(&n, window).await {
            panic!("gave up on JetStream after {:?}: {e}", started.elapsed());
        }
        assert!(started.elapsed() >= Duration::from_secs(2));
        answering.abort();
        let _ = answering.await;

        // Nothing answers: no responders, no JetStream.
        let started = std::time::Instant::now();
        let e = autocdc::service::nats_log::NatsLogs::connect(&n, window)
            .await
            .err()
            .expect("connected without JetStream");
        assert_eq!(e.code(), "AUTOCDC_CONFIG", "{e}");
        assert!(e.to_string().contains("-js"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(5), "{e}");
    });
}

#[test]
fn an_unreachable_nats_is_a_config_error_at_start() {
    rt().block_on(async {
        let tmp = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let cfg = on_nats(
            tmp.path(),
            "data",
            vec![flow_cfg("m", "1h")],
            nats(&format!("nats://127.0.0.1:{port}"), "X"),
        );
        let e = autocdc::service::run::start(cfg, Default::default())
            .await
            .err()
            .expect("started without NATS");
        assert_eq!(e.code(), "AUTOCDC_CONFIG", "{e}");
        assert!(e.to_string().contains("ingest.url"), "{e}");
        let mut bad = nats(&nats_url(), "bad.prefix");
        bad.stream_prefix = "bad.prefix".into();
        let cfg = on_nats(tmp.path(), "data", vec![flow_cfg("m", "1h")], bad);
        let e = autocdc::service::run::start(cfg, Default::default())
            .await
            .err()
            .expect("a dotted prefix was taken");
        assert!(e.to_string().contains("ingest.stream_prefix"), "{e}");
    });
}

/// Regression (CI's cluster run: `AUTOCDC_WAL.CORRUPT ... lacks sequence
/// 87 (next is 1)`): a cluster re-electing its meta leader can answer "not
/// found" for a stream that exists, and the stream was then made again,
/// empty, under the flow's name, losing what it held. A stream is made
/// only for a flow whose target records no offsets of a NATS log; else the
/// flow waits for it and, when it never comes, does not start.
#[test]
fn a_missing_stream_is_not_made_again_for_a_target_with_nats_offsets() {
    rt().block_on(async {
        let tmp = tempfile::tempdir().unwrap();
        let p = prefix();
        let n = nats(&nats_url(), &p);
        let client = reqwest::Client::new();
        let r = start(on_nats(
            tmp.path(),
            "a",
            vec![flow_cfg("m", "1h")],
            n.clone(),
        ))
        .await;
        push(
            &client,
            &url(&r, "/v1/flows/m/changes"),
            &[u(1, "Oslo", 1)],
            None,
        )
        .await;
        commit(&client, &r, "m").await;
        r.stop().await.unwrap();

        // The stream goes, as a re-electing cluster would answer.
        let js = async_nats::jetstream::new(async_nats::connect(nats_url()).await.unwrap());
        let name = format!("{p}_m");
        js.delete_stream(&name).await.unwrap();
        let e = autocdc::service::run::start(
            on_nats(tmp.path(), "b", vec![flow_cfg("m", "1h")], n.clone()),
            Default::default(),
        )
        .await
        .err()
        .expect("started on a stream made again");
        assert_eq!(e.code(), "AUTOCDC_UNAVAILABLE", "{e}");
        assert!(e.to_string().contains("is not made again"), "{e}");
        assert!(
            js.get_stream(&name).await.is_err(),
            "the stream was made again"
        );
        assert_eq!(table(tmp.path(), "m").await, expected(&[u(1, "Oslo", 1)]));

        // A flow whose target records no NATS offsets gets its stream.
        let r = start(on_nats(tmp.path(), "c", vec![flow_cfg("fresh", "1h")], n)).await;
        push(
            &client,
            &url(&r, "/v1/flows/fresh/changes"),
            &[u(2, "Rome", 1)],
            None,
        )
        .await;
        r.stop().await.unwrap();
        assert!(js.get_stream(&format!("{p}_fresh")).await.is_ok());
    });
}

/// A `stream_prefix` used before with another warehouse: the flow's
/// stream holds messages written for another table. They used to be
/// replayed into the new warehouse's table. Now the flow does not open
/// (`AUTOCDC_INVALID_STATE.FOREIGN_LOG`) until `autocdc log` adopts them
/// (applied to the new table) or resets the stream (dropped).
#[test]
fn a_stream_holding_another_tables_messages_is_refused_until_adopted_or_reset() {
    use autocdc::tools::cli::{LogAction, log};
    rt().block_on(async {
        let (old, adopting, resetting) = (
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
        );
        let p = prefix();
        let n = nats(&nats_url(), &p);
        let client = reqwest::Client::new();
        let cfg =
            |dir: &std::path::Path| on_nats(dir, "data", vec![flow_cfg("m", "1h")], n.clone());
        let r = start(cfg(old.path())).await;
        let changes = url(&r, "/v1/flows/m/changes");
        push(&client, &changes, &[u(1, "Oslo", 1)], None).await;
        commit(&client, &r, "m").await;
        push(&client, &changes, &[u(2, "Rome", 1)], None).await;
        r.stop().await.unwrap();
        let name = format!("{p}_m");
        let held = stream_state(&nats_url(), &name).await.messages;
        assert_eq!(held, 2, "both batches are kept for the idempotency window");

        for dir in [adopting.path(), resetting.path()] {
            let e = autocdc::service::run::start(cfg(dir), Default::default())
                .await
                .err()
                .expect("opened on another table's stream");
            assert_eq!(e.code(), "AUTOCDC_INVALID_STATE.FOREIGN_LOG", "{e}");
            let m = e.to_string();
            assert!(m.contains(&name) && m.contains("2 messages"), "{m}");
            assert!(m.contains("autocdc log adopt --flow m"), "{m}");
            assert!(m.contains("autocdc log reset --flow m"), "{m}");
            assert_eq!(table(dir, "m").await, expected(&[]));
            let shown = log(&cfg(dir), "m", None).await.unwrap().join("\n");
            assert!(shown.contains("has no record of this stream"), "{shown}");
        }
        assert_eq!(stream_state(&nats_url(), &name).await.messages, held);

        // Adopted: the new table takes what the stream holds.
        let said = log(&cfg(adopting.path()), "m", Some(LogAction::Adopt))
            .await
            .unwrap()
            .join("\n");
        assert!(said.contains("adopted"), "{said}");
        let r = start(cfg(adopting.path())).await;
        commit(&client, &r, "m").await;
        r.stop().await.unwrap();
        assert_eq!(
            table(adopting.path(), "m").await,
            expected(&[u(1, "Oslo", 1), u(2, "Rome", 1)])
        );
        let shown = log(&cfg(adopting.path()), "m", None)
            .await
            .unwrap()
            .join("\n");
        assert!(shown.contains("knows this stream"), "{shown}");

        // Reset: the messages are dropped; the table has only what comes
        // after.
        let said = log(&cfg(resetting.path()), "m", Some(LogAction::Reset))
            .await
            .unwrap()
            .join("\n");
        assert!(said.contains("dropped 2 messages"), "{said}");
        let r = start(cfg(resetting.path())).await;
        push(
            &client,
            &url(&r, "/v1/flows/m/changes"),
            &[u(3, "Kyiv", 1)],
            None,
        )
        .await;
        commit(&client, &r, "m").await;
        r.stop().await.unwrap();
        assert_eq!(
            table(resetting.path(), "m").await,
            expected(&[u(3, "Kyiv", 1)])
        );
    });
}

/// A batch that the NATS server would refuse (over its `max_payload`, 1 MiB
/// on the test server) is answered 413 with both sizes, before anything is
/// published; the flow goes on with the next batch at offset 1.
#[test]
fn a_batch_over_the_servers_max_payload_is_413_and_nothing_is_logged() {
    rt().block_on(async {
        let tmp = tempfile::tempdir().unwrap();
        let p = prefix();
        let client = reqwest::Client::new();
        let a = start(on_nats(
            tmp.path(),
            "a",
            vec![flow_cfg("m", "1h")],
            nats(&nats_url(), &p),
        ))
        .await;
        let big = serde_json::json!({
            "id": 1, "op": "UPSERT", "city": "x".repeat(1_200_000), "seq": 1
        })
        .to_string();
        let (s, body) = post(
            &client,
            &url(&a, "/v1/flows/m/changes"),
            "application/x-ndjson",
            big,
            Some("big"),
        )
        .await;
        assert_eq!(s, 413, "{body}");
        assert_eq!(body["error"]["code"], "AUTOCDC_BODY_TOO_LARGE", "{body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("max_payload") && message.contains("1048576"),
            "{message}"
        );
        let ack = push(
            &client,
            &url(&a, "/v1/flows/m/changes"),
            &[u(2, "Rome", 1)],
            None,
        )
        .await;
        assert_eq!(ack["offset"], 1, "{ack}");
        let state = stream_state(&nats_url(), &format!("{p}_m")).await;
        assert_eq!(state.messages, 1);
        assert_eq!(commit(&client, &a, "m").await["offset"], 1);
        assert_eq!(table(tmp.path(), "m").await, expected(&[u(2, "Rome", 1)]));
        a.stop().await.unwrap();
    });
}
