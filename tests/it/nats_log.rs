//! `autocdc serve` on the NATS JetStream ingest log (`[ingest] type =
//! "nats"`), against the server `integration/backends.sh up nats` started
//! (and, for the outage test, a server of the test's own).
//!
//! What is shown: an acknowledged batch survives the loss of the machine
//! that took it (a new instance with an empty data directory replays it
//! from JetStream); a retried Idempotency-Key is answered from JetStream's
//! duplicate window, across that restart too; committed messages are purged
//! once their window passed; a full stream refuses with 429 and loses
//! nothing; a NATS outage makes pushes 503 and `/readyz` unready, and the
//! flow goes on when the server is back.

use crate::common;

use std::time::Duration;

use autocdc::config::{Config, IngestConfig, NatsConfig};
use common::http::*;
use common::*;

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

#[test]
fn a_nats_outage_makes_pushes_503_and_readyz_unready_then_the_flow_goes_on() {
    let Ok(bin) = std::env::var("AUTOCDC_TEST_NATS_SERVER") else {
        panic!(
            "AUTOCDC_TEST_NATS_SERVER is not set: run `eval \"$(bash integration/backends.sh up)\"` first"
        );
    };
    let tmp = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let store = tmp.path().join("nats");
    let spawn = || {
        let child = std::process::Command::new(&bin)
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(&store)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        child
    };
    let mut server = spawn();
    let url_ = format!("nats://127.0.0.1:{port}");
    rt().block_on(async {
        let mut n = nats(&url_, "OUT");
        n.publish_timeout = "1s".into();
        let cfg = on_nats(tmp.path(), "data", vec![flow_cfg("m", "1h")], n);
        let client = reqwest::Client::new();
        let r = start(cfg).await;
        let changes = url(&r, "/v1/flows/m/changes");
        push(&client, &changes, &[u(1, "Oslo", 1)], Some("k1")).await;

        server.kill().unwrap();
        server.wait().unwrap();
        let mut ready = 0;
        for _ in 0..50 {
            ready = client
                .get(url(&r, "/readyz"))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16();
            if ready == 503 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
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

        server = spawn();
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
        let mut ready = 0;
        for _ in 0..50 {
            ready = client
                .get(url(&r, "/readyz"))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16();
            if ready == 200 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(ready, 200);
        commit(&client, &r, "m").await;
        assert_eq!(
            table(tmp.path(), "m").await,
            expected(&[u(1, "Oslo", 1), u(2, "Rome", 1)])
        );
        r.stop().await.unwrap();
    });
    let _ = server.kill();
    let _ = server.wait();
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

#[test]
fn two_instances_on_one_flow_both_take_pushes_one_commits_and_the_table_has_each_once() {
    rt().block_on(async {
        let tmp = tempfile::tempdir().unwrap();
        let p = prefix();
        let n = nats(&nats_url(), &p);
        let client = reqwest::Client::new();
        let a = start(on_nats(
            tmp.path(),
            "a",
            vec![flow_cfg("m", "1s")],
            n.clone(),
        ))
        .await;
        let b = start(on_nats(
            tmp.path(),
            "b",
            vec![flow_cfg("m", "1s")],
            n.clone(),
        ))
        .await;
        let mut all = Vec::new();
        let mut offsets = std::collections::BTreeSet::new();
        for i in 0..20i64 {
            let evs = vec![
                u(i % 7, ["Oslo", "Rome", "Lima"][(i % 3) as usize], i),
                d((i + 3) % 7, i),
            ];
            let (r, other) = if i % 2 == 0 { (&a, &b) } else { (&b, &a) };
            let ack = push(
                &client,
                &url(r, "/v1/flows/m/changes"),
                &evs,
                Some(&format!("k{i}")),
            )
            .await;
            assert!(offsets.insert(ack["offset"].as_i64().unwrap()), "{ack}");
            // A retry on the other instance is the same batch.
            let again = push(
                &client,
                &url(other, "/v1/flows/m/changes"),
                &evs,
                Some(&format!("k{i}")),
            )
            .await;
            assert_eq!(
                (again["duplicate"].clone(), again["offset"].clone()),
                (serde_json::json!(true), ack["offset"].clone())
            );
            all.extend(evs);
        }
        assert_eq!(offsets, (1..=20).collect());
        // Both see the commits through 20 (one commits, the other reads
        // the target), and exactly one holds the lease.
        for r in [&a, &b] {
            let mut status = serde_json::Value::Null;
            for _ in 0..150 {
                status = flow_status(&client, r, "m").await;
                if status["status"]["committed_offset"] == 20 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert_eq!(status["status"]["committed_offset"], 20, "{status}");
        }
        let mut held = Vec::new();
        for r in [&a, &b] {
            held.push(flow_status(&client, r, "m").await["status"]["lease"]["held_here"] == true);
        }
        assert_eq!(held.iter().filter(|h| **h).count(), 1, "{held:?}");
        assert_eq!(table(tmp.path(), "m").await, expected(&all));
        // `?wait=commit` on either instance answers once the holder committed.
        let evs = vec![u(50, "Bern", 100)];
        let (s, ack) = post(
            &client,
            &(url(&b, "/v1/flows/m/changes") + "?wait=commit"),
            "application/x-ndjson",
            ndjson(&evs),
            None,
        )
        .await;
        assert_eq!(s, 200, "{ack}");
        all.extend(evs);
        assert_eq!(table(tmp.path(), "m").await, expected(&all));
        // The instance without the lease never reads the log, yet its
        // status counts what the holder alone acknowledged (it asks the
        // broker for the log's end as it follows the holder's commits).
        let (holder, other) = if held[0] { (&a, &b) } else { (&b, &a) };
        let evs = vec![u(51, "Oslo", 101)];
        let ack = push(
            &client,
            &url(holder, "/v1/flows/m/changes"),
            &evs,
            Some("k-holder"),
        )
        .await;
        all.extend(evs);
        let end = ack["offset"].as_i64().unwrap();
        let mut status = serde_json::Value::Null;
        for _ in 0..150 {
            status = flow_status(&client, other, "m").await;
            if status["status"]["wal"]["next_offset"] == end + 1
                && status["status"]["committed_offset"] == end
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(status["status"]["wal"]["next_offset"], end + 1, "{status}");
        assert_eq!(status["status"]["committed_offset"], end, "{status}");
        assert_eq!(status["status"]["log_lag_batches"], 0, "{status}");
        assert_eq!(table(tmp.path(), "m").await, expected(&all));
        a.stop().await.unwrap();
        b.stop().await.unwrap();
    });
}

/// Flows spread over three instances; the holder of some is killed (its
/// runtime dropped: no last commit, no lease given back) while pushes go
/// on; the others take its flows over within the lease TTL and every
/// acknowledged batch is in its table once.
#[test]
fn a_killed_holders_flows_are_taken_over_and_nothing_acknowledged_is_lost() {
    let tmp = tempfile::tempdir().unwrap();
    let p = prefix();
    let n = nats(&nats_url(), &p);
    let names: Vec<String> = (0..6).map(|i| format!("f{i}")).collect();
    let flows = || {
        names
            .iter()
            .map(|f| flow_cfg(f, "500ms"))
            .collect::<Vec<_>>()
    };
    let mut runtimes: Vec<Option<tokio::runtime::Runtime>> = (0..3).map(|_| Some(rt())).collect();
    let mut addrs = Vec::new();
    for (i, r) in runtimes.iter().enumerate() {
        let mut n = n.clone();
        n.instance = Some(format!("k{i}"));
        let running =
            r.as_ref()
                .unwrap()
                .block_on(start(on_nats(tmp.path(), &format!("d{i}"), flows(), n)));
        addrs.push(format!("http://{}", running.addr));
        // Killed below, or left to end with the test's runtimes.
        std::mem::forget(running);
    }
    let client_rt = rt();
    let client = &reqwest::Client::new();
    let (addrs, names) = (&addrs, &names);
    let mut all: std::collections::BTreeMap<String, Vec<Ev>> = Default::default();
    let mut batches = |round: i64, alive: &[usize]| {
        let mut out = Vec::new();
        for (k, f) in names.iter().enumerate() {
            let seq = round * 10 + k as i64;
            let evs = vec![u(round % 5, "Oslo", seq), d((round + 2) % 5, seq)];
            all.entry(f.clone()).or_default().extend(evs.clone());
            out.push((f.clone(), evs, alive[(round as usize + k) % alive.len()]));
        }
        out
    };
    let push_all = |batches: Vec<(String, Vec<Ev>, usize)>| async move {
        for (f, evs, i) in batches {
            let key = format!("{f}-{}", evs[0].3);
            push(
                client,
                &format!("{}/v1/flows/{f}/changes", addrs[i]),
                &evs,
                Some(&key),
            )
            .await;
        }
    };
    let holders = |alive: Vec<usize>| async move {
        let mut out: std::collections::BTreeMap<String, Vec<usize>> = Default::default();
        for f in names {
            for &i in &alive {
                let v: serde_json::Value = client
                    .get(format!("{}/v1/flows/{f}", addrs[i]))
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                if v["status"]["lease"]["held_here"] == true {
                    out.entry(f.clone()).or_default().push(i);
                }
            }
        }
        out
    };
    let holders = &holders;
    // The instance the lease module assigns `f` to among `alive` (the
    // instances are named `k<i>`).
    let first = |f: &str, alive: &[usize]| {
        let live: std::collections::HashSet<String> =
            alive.iter().map(|i| format!("k{i}")).collect();
        let owners = autocdc::service::lease::Leases::assign(names, &live);
        owners[f][1..].parse::<usize>().unwrap()
    };
    // One holder per flow, the one it is assigned to (an instance that
    // started alone took every flow at first, and gives most back).
    let settled = |alive: Vec<usize>| async move {
        let mut h = Default::default();
        for _ in 0..150 {
            h = holders(alive.clone()).await;
            if h.len() == names.len()
                && h.iter()
                    .all(|(f, v)| v.len() == 1 && v[0] == first(f, &alive))
            {
                return h;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("no single holder per flow: {h:?}");
    };

    let victim = client_rt.block_on(async {
        let h = settled(vec![0, 1, 2]).await;
        // Bounded loads: no instance holds more than its share.
        let mut load: std::collections::BTreeMap<usize, usize> = Default::default();
        for v in h.values() {
            *load.entry(v[0]).or_default() += 1;
        }
        let share = names.len().div_ceil(3);
        assert!(
            load.len() >= 2 && load.values().all(|&n| n <= share),
            "{h:?}"
        );
        for round in 0..5 {
            push_all(batches(round, &[0, 1, 2])).await;
        }
        h["f0"][0]
    });
    runtimes[victim].take().unwrap().shutdown_background();
    let alive: Vec<usize> = (0..3).filter(|i| *i != victim).collect();
    client_rt.block_on(async {
        for round in 5..10 {
            push_all(batches(round, &alive)).await;
        }
    });
    let all = &all;
    client_rt.block_on(async {
        let h = settled(alive.clone()).await;
        assert!(!h.values().any(|v| v[0] == victim));
        for f in names {
            let holder = &addrs[h[f][0]];
            let mut status = serde_json::Value::Null;
            for _ in 0..150 {
                status = client
                    .get(format!("{holder}/v1/flows/{f}"))
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                if status["status"]["committed_offset"] == 10 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert_eq!(status["status"]["committed_offset"], 10, "{f}: {status}");
            assert_eq!(table(tmp.path(), f).await, expected(&all[f]), "{f}");
            one_holder_at_a_time(tmp.path(), f).await;
        }
    });
}

/// `autocdc serve` processes: the holder of a flow is paused (SIGSTOP)
/// while pushes go on, another instance takes the flow over, then the
/// paused one resumes (SIGCONT), possibly in the middle of a commit. Its
/// late commit loses on the catalog or repeats what the target already
/// records: every acknowledged batch is in the table, once.
#[test]
fn a_paused_holder_that_resumes_after_a_takeover_loses_and_doubles_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let p = prefix();
    let mut procs = Vec::new();
    let mut bases = Vec::new();
    for i in 0..2 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut cfg = on_nats(
            tmp.path(),
            &format!("d{i}"),
            vec![flow_cfg("m", "300ms")],
            nats(&nats_url(), &p),
        );
        cfg.server.listen = format!("127.0.0.1:{port}");
        let path = tmp.path().join(format!("i{i}.toml"));
        std::fs::write(&path, toml::to_string(&cfg).unwrap()).unwrap();
        let log = std::fs::File::create(tmp.path().join(format!("i{i}.log"))).unwrap();
        procs.push(
            std::process::Command::new(env!("CARGO_BIN_EXE_autocdc"))
                .args(["serve", "--config"])
                .arg(&path)
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap(),
        );
        bases.push(format!("http://127.0.0.1:{port}"));
    }
    let signal = |pid: u32, sig: &str| {
        // The shell's own `kill`: no procps needed.
        let ok = std::process::Command::new("sh")
            .args(["-c", &format!("kill {sig} {pid}")])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} {pid}");
    };
    rt().block_on(async {
        let client = reqwest::Client::new();
        let status = |i: usize| {
            let client = client.clone();
            let base = bases[i].clone();
            async move {
                let r = client.get(format!("{base}/v1/flows/m")).send().await;
                match r {
                    Ok(r) if r.status() == 200 => r.json::<serde_json::Value>().await.ok(),
                    _ => None,
                }
            }
        };
        // Instance `i`'s committed offset once it reaches `want` (10 s at most).
        let committed_to = |i: usize, want: i64| {
            let status = &status;
            async move {
                let mut committed = 0;
                for _ in 0..200 {
                    committed = status(i)
                        .await
                        .map_or(0, |s| s["status"]["committed_offset"].as_i64().unwrap_or(0));
                    if committed >= want {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                committed
            }
        };
        let holder = || async {
            for _ in 0..200 {
                for i in 0..2 {
                    if let Some(s) = status(i).await
                        && s["status"]["lease"]["held_here"] == true
                    {
                        return i;
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            panic!("nobody holds the lease");
        };
        let mut all = Vec::new();
        let mut n = 0i64;
        let mut push_rounds = |to: usize, rounds: i64| {
            let mut batches = Vec::new();
            for _ in 0..rounds {
                let evs = vec![u(n % 11, "Oslo", n), d((n + 5) % 11, n)];
                all.extend(evs.clone());
                batches.push((n, evs));
                n += 1;
            }
            let client = client.clone();
            let base = bases[to].clone();
            async move {
                let mut last = 0;
                for (k, evs) in batches {
                    let a = push(
                        &client,
                        &format!("{base}/v1/flows/m/changes"),
                        &evs,
                        Some(&format!("k{k}")),
                    )
                    .await;
                    last = a["offset"].as_i64().unwrap();
                }
                last
            }
        };
        for base in &bases {
            let mut ready = false;
            for _ in 0..300 {
                if let Ok(r) = client.get(format!("{base}/readyz")).send().await
                    && r.status() == 200
                {
                    ready = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let logs: Vec<String> = (0..2)
                .map(|i| {
                    std::fs::read_to_string(tmp.path().join(format!("i{i}.log")))
                        .unwrap_or_default()
                })
                .collect();
            assert!(ready, "{base} did not start: {logs:?}");
        }
        let h = holder().await;
        let other = 1 - h;
        let first = push_rounds(h, 10).await;
        push_rounds(other, 10).await;
        // The holder has committed under its lease before it is paused, so
        // the table's history shows both holders (on a slow machine its
        // first commit could otherwise come after the pause).
        let held_commit = committed_to(h, first).await;
        assert!(
            held_commit >= first,
            "the holder committed {held_commit} of {first} before the pause"
        );
        signal(procs[h].id(), "-STOP");
        let last = push_rounds(other, 10).await;
        // The other instance takes the flow over and commits everything.
        let committed = committed_to(other, last).await;
        assert!(
            committed >= last,
            "committed {committed} of {last} while the holder was paused"
        );
        signal(procs[h].id(), "-CONT");
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let last = push_rounds(h, 5).await;
        let mut done = false;
        for _ in 0..300 {
            let c0 = status(0)
                .await
                .map_or(0, |s| s["status"]["committed_offset"].as_i64().unwrap_or(0));
            let c1 = status(1)
                .await
                .map_or(0, |s| s["status"]["committed_offset"].as_i64().unwrap_or(0));
            if c0.max(c1) >= last {
                done = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            done,
            "the batches pushed after the pause were not committed"
        );
        let (got, want) = (table(tmp.path(), "m").await, expected(&all));
        assert!(got == want, "table {got:?}, want {want:?}");
        // The paused holder's late commit, if any, was fenced: one holder
        // at a time in the table's history, and both held the flow.
        let holders = one_holder_at_a_time(tmp.path(), "m").await;
        assert!(holders.len() >= 2, "{holders:?}");
        // One holder at the end.
        let held = [status(0).await, status(1).await]
            .iter()
            .filter(|s| {
                s.as_ref()
                    .is_some_and(|s| s["status"]["lease"]["held_here"] == true)
            })
            .count();
        assert_eq!(held, 1);
    });
    for p in &mut procs {
        let _ = std::process::Command::new("sh")
            .args(["-c", &format!("kill -TERM {}", p.id())])
            .status();
        let _ = p.wait();
    }
}

/// `GET path` on `r` until its status is `want` (10 s at most); the last
/// status and body.
async fn await_status(
    client: &reqwest::Client,
    r: &autocdc::service::run::Running,
    path: &str,
    want: u16,
) -> (u16, serde_json::Value) {
    let mut last = (0, serde_json::Value::Null);
    for _ in 0..100 {
        let resp = client.get(url(r, path)).send().await.unwrap();
        let s = resp.status().as_u16();
        last = (s, resp.json().await.unwrap_or(serde_json::Value::Null));
        if s == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    last
}

/// Flow definitions made over HTTP live in the `<prefix>_FLOWS` bucket:
/// one instance's `PUT` is seen by the others (and by an instance started
/// later with an empty data directory), a change made on another instance
/// replaces the running flow everywhere, and a `DELETE` stops it
/// everywhere.
#[test]
fn a_flow_defined_on_one_instance_is_run_changed_and_deleted_on_every_instance() {
    rt().block_on(async {
        let tmp = tempfile::tempdir().unwrap();
        let p = prefix();
        let n = nats(&nats_url(), &p);
        let client = reqwest::Client::new();
        let a = start(on_nats(tmp.path(), "a", vec![], n.clone())).await;
        let b = start(on_nats(tmp.path(), "b", vec![], n.clone())).await;
        let def = flow_cfg("m", "1s");
        let resp = client
            .put(url(&a, "/v1/flows/m"))
            .json(&def)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 201);
        let (s, view) = await_status(&client, &b, "/v1/flows/m", 200).await;
        assert_eq!(s, 200, "B never saw the flow A defined: {view}");
        assert_eq!(view["definition"]["commit_interval"], "1s", "{view}");

        // Pushed on B, committed by whichever holds the lease.
        let evs = vec![u(1, "Oslo", 1), u(2, "Rome", 1), d(1, 2)];
        push(&client, &url(&b, "/v1/flows/m/changes"), &evs, Some("k1")).await;
        let (s, ack) = post(
            &client,
            &(url(&a, "/v1/flows/m/changes") + "?wait=commit"),
            "application/x-ndjson",
            ndjson(&[u(3, "Lima", 1)]),
            None,
        )
        .await;
        assert_eq!(s, 200, "{ack}");
        let mut all = evs.clone();
        all.push(u(3, "Lima", 1));
        assert_eq!(table(tmp.path(), "m").await, expected(&all));

        // Changed on B: A runs the new definition.
        let mut changed = def.clone();
        changed.commit_interval = Some("2s".into());
        let resp = client
            .put(url(&b, "/v1/flows/m"))
            .json(&changed)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        let mut seen = serde_json::Value::Null;
        for _ in 0..100 {
            seen = flow_status(&client, &a, "m").await;
            if seen["definition"]["commit_interval"] == "2s" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(seen["definition"]["commit_interval"], "2s", "{seen}");

        // An instance started later, with nothing on its disk, runs it
        // from the start, and its table is the same.
        let c = start(on_nats(tmp.path(), "c", vec![], n.clone())).await;
        let view = flow_status(&client, &c, "m").await;
        assert_eq!(view["definition"]["commit_interval"], "2s", "{view}");
        let (s, ack) = post(
            &client,
            &(url(&c, "/v1/flows/m/changes") + "?wait=commit"),
            "application/x-ndjson",
            ndjson(&[u(4, "Bern", 1)]),
            None,
        )
        .await;
        assert_eq!(s, 200, "{ack}");
        all.push(u(4, "Bern", 1));
        assert_eq!(table(tmp.path(), "m").await, expected(&all));

        // Deleted on A: gone everywhere; pushes get 404.
        let resp = client.delete(url(&a, "/v1/flows/m")).send().await.unwrap();
        assert_eq!(resp.status().as_u16(), 204);
        for r in [&b, &c] {
            let (s, body) = await_status(&client, r, "/v1/flows/m", 404).await;
            assert_eq!(s, 404, "{body}");
        }
        let (s, body) = post(
            &client,
            &url(&b, "/v1/flows/m/changes"),
            "application/x-ndjson",
            ndjson(&[u(5, "Kyiv", 1)]),
            None,
        )
        .await;
        assert_eq!(s, 404, "{body}");
        // The table stays.
        assert_eq!(table(tmp.path(), "m").await, expected(&all));
        for r in [a, b, c] {
            r.stop().await.unwrap();
        }
    });
}

/// An instance that starts while the stream holds batches not yet
/// committed, and does not hold the flow's lease, keeps none of them
/// pending (the holder reads them from the stream), and `POST .../commit`
/// on it answers once the holder committed them. (It once replayed them
/// into a pending run it never committed, and `/commit` waited for an
/// offset past the stream's end.)
#[test]
fn an_instance_started_beside_the_holder_keeps_nothing_pending_and_answers_commit() {
    rt().block_on(async {
        let tmp = tempfile::tempdir().unwrap();
        let p = prefix();
        // Names that rank A first for `m` (one flow: the top rendezvous rank), so B
        // never takes the flow over.
        let rank = |i: &str| xxhash_rust::xxh3::xxh3_64(format!("m\n{i}").as_bytes());
        let (first, second) = if rank("ia") > rank("ib") {
            ("ia", "ib")
        } else {
            ("ib", "ia")
        };
        let mut na = nats(&nats_url(), &p);
        na.instance = Some(first.into());
        let mut nb = na.clone();
        nb.instance = Some(second.into());
        let client = reqwest::Client::new();
        let a = start(on_nats(tmp.path(), "a", vec![flow_cfg("m", "1h")], na)).await;
        let mut all = Vec::new();
        for i in 0..3 {
            let evs = vec![u(i, "Oslo", i)];
            push(&client, &url(&a, "/v1/flows/m/changes"), &evs, None).await;
            all.extend(evs);
        }
        let b = start(on_nats(tmp.path(), "b", vec![flow_cfg("m", "1h")], nb)).await;
        // Wait for A to hold the lease.
        let mut holder = None;
        for _ in 0..100 {
            for (i, r) in [&a, &b].into_iter().enumerate() {
                if flow_status(&client, r, "m").await["status"]["lease"]["held_here"] == true {
                    holder = Some(i);
                }
            }
            if holder.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(
            holder,
            Some(0),
            "A ranks first and holds the flow: A {} B {}",
            flow_status(&client, &a, "m").await["status"]["lease"],
            flow_status(&client, &b, "m").await["status"]["lease"]
        );
        let (holder, other) = (&a, &b);
        // Both name the same holder and epoch (the epoch the record holds).
        let mine = flow_status(&client, holder, "m").await["status"]["lease"].clone();
        let mut seen = serde_json::Value::Null;
        for _ in 0..100 {
            seen = flow_status(&client, other, "m").await["status"]["lease"].clone();
            if seen["epoch"] == mine["epoch"] {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(
            (&seen["holder"], &seen["epoch"]),
            (&mine["holder"], &mine["epoch"]),
            "{seen} vs {mine}"
        );
        // Maintenance is the holder's: the other names it.
        let resp = client
            .post(url(other, "/v1/flows/m/maintain"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 503);
        let body: serde_json::Value = resp.json().await.unwrap();
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(&format!("instance `{first}`")) && message.contains(second),
            "{body}"
        );
        let st = flow_status(&client, other, "m").await;
        assert_eq!(st["status"]["pending_batches"], 0, "{st}");
        assert_eq!(st["status"]["committed_offset"], 0, "{st}");
        // `/commit` on the other instance asks the holder to commit now (the
        // flow's commit_interval is an hour): it answers once that commit
        // is made. (It once waited for the holder's next tick, and timed out.)
        let started = std::time::Instant::now();
        let c = commit(&client, other, "m").await;
        assert_eq!(c["offset"], 3, "{c}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        let c = commit(&client, holder, "m").await;
        assert_eq!(c["offset"], 3, "{c}");
        assert_eq!(table(tmp.path(), "m").await, expected(&all));
        a.stop().await.unwrap();
        b.stop().await.unwrap();
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
