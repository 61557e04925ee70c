//! Panics, a failing log disk, slow clients and records that cannot be
//! applied: the flow and the process go on.

use std::io::{Read, Write};
use std::sync::Arc;

use autocdc::fault::{FaultPoint, Faults};
use autocdc::service::run;
use serde_json::Value;

use crate::common;
use common::http::*;
use common::*;

/// A panic inside a commit is caught: the flow is degraded with the error
/// in its status and in /readyz, the process and its requests go on, and the
/// next attempt commits.
#[test]
fn a_panic_in_the_committer_degrades_the_flow_and_it_recovers() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let faults = Arc::new(Faults::default());
        faults.arm_panic(FaultPoint::AfterStateFile, 0);
        let r = run::start(config(tmp.path(), vec![flow_cfg("c", "20ms")]), faults)
            .await
            .unwrap();
        let c = reqwest::Client::new();
        let (s, _) = post(
            &c,
            &url(&r, "/v1/flows/c/changes"),
            "application/x-ndjson",
            ndjson(&CUSTOMERS_EVENTS),
            None,
        )
        .await;
        assert_eq!(s, 202);
        let mut seen = None;
        for _ in 0..500 {
            let resp = c.get(url(&r, "/readyz")).send().await.unwrap();
            if resp.status().as_u16() == 503 {
                seen = Some(resp.json::<Value>().await.unwrap());
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        let v = seen.expect("readyz never reported the panicking flow");
        assert_eq!(v["status"], "degraded", "{v}");
        assert_eq!(v["flows"][0]["flow"], "c", "{v}");
        let err = v["flows"][0]["last_error"].as_str().unwrap_or_default();
        assert!(
            err.contains("AUTOCDC_COMMITTER_PANIC") && err.contains("injected panic"),
            "{v}"
        );
        let v = commit(&c, &r, "c").await;
        assert!(v["snapshot_id"].as_i64().is_some(), "{v}");
        assert_eq!(table(tmp.path(), "c").await, expected(&CUSTOMERS_EVENTS));
        let ready = c.get(url(&r, "/readyz")).send().await.unwrap();
        assert_eq!(ready.status().as_u16(), 200);
        r.stop().await.unwrap();
    });
}

/// A panic inside a maintenance run (here in compaction, asked for over
/// HTTP) is caught: the request gets a 500 with the code, the run counts as
/// failed, and the flow's committer lives on and commits.
#[test]
fn a_panic_in_maintenance_fails_the_run_not_the_flow() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = flow_cfg("c", "20ms");
    cfg.compaction = Some(autocdc::core::flow::CompactionConfig {
        min_input_files: Some(2),
        interval: Some("1h".into()),
        ..Default::default()
    });
    rt().block_on(async {
        let faults = Arc::new(Faults::default());
        let r = run::start(config(tmp.path(), vec![cfg]), faults.clone())
            .await
            .unwrap();
        let c = reqwest::Client::new();
        for evs in CUSTOMERS_EVENTS.chunks(2) {
            let (s, _) = post(
                &c,
                &url(&r, "/v1/flows/c/changes?wait=commit"),
                "application/x-ndjson",
                ndjson(evs),
                None,
            )
            .await;
            assert_eq!(s, 200);
        }
        faults.arm_panic(FaultPoint::AfterCompactionFiles, 0);
        let resp = c
            .post(url(&r, "/v1/flows/c/maintain"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 500);
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["code"], "AUTOCDC_COMMITTER_PANIC", "{v}");
        let st = flow_status(&c, &r, "c").await;
        assert_eq!(st["status"]["maintenance"]["failures"], 1, "{st}");
        // The flow goes on: a new change commits, and a second run compacts.
        let (s, _) = post(
            &c,
            &url(&r, "/v1/flows/c/changes?wait=commit"),
            "application/x-ndjson",
            ndjson(&[u(77, "Ely", 100)]),
            None,
        )
        .await;
        assert_eq!(s, 200);
        let resp = c
            .post(url(&r, "/v1/flows/c/maintain"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        let v: Value = resp.json().await.unwrap();
        assert!(
            v["compaction"]["data_files_written"].as_u64().unwrap() >= 1,
            "{v}"
        );
        r.stop().await.unwrap();
        let mut all = CUSTOMERS_EVENTS.to_vec();
        all.push(u(77, "Ely", 100));
        assert_eq!(table(tmp.path(), "c").await, expected(&all));
    });
}

/// A request head that never ends is cut after `header_read_timeout`, a
/// connection past `max_connections` is closed at once and counted, and a
/// half-sent head cannot hold up shutdown or the commit of what is pending.
#[test]
fn slow_and_idle_clients_cannot_hold_the_server() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let mut cfg = config(tmp.path(), vec![flow_cfg("c", "1h")]);
        cfg.server.header_read_timeout = "3s".into();
        cfg.server.max_connections = 3;
        cfg.server.shutdown_grace = "1s".into();
        let r = start(cfg).await;
        let half_head = |addr: std::net::SocketAddr| {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.write_all(b"POST /v1/flows/c/changes HTTP/1.1\r\nHost: x\r\n")
                .unwrap();
            s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
                .unwrap();
            s
        };
        // Cut after the header timeout: the read ends (EOF or a 408), it
        // does not time out.
        let addr = r.addr;
        let cut = tokio::task::spawn_blocking(move || {
            let mut s = half_head(addr);
            let mut buf = Vec::new();
            s.read_to_end(&mut buf)
        })
        .await
        .unwrap();
        assert!(cut.is_ok(), "{cut:?}");
        // Three idle connections fill the cap; a fourth is closed at once.
        let idle: Vec<std::net::TcpStream> = (0..3).map(|_| half_head(addr)).collect();
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let fresh = || {
            reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .build()
                .unwrap()
        };
        let refused = fresh().get(url(&r, "/healthz")).send().await;
        assert!(refused.is_err(), "{refused:?}");
        drop(idle);
        let mut healthy = false;
        for _ in 0..50 {
            if let Ok(resp) = fresh().get(url(&r, "/healthz")).send().await {
                healthy = resp.status().as_u16() == 200;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        assert!(healthy);
        let metrics = fresh()
            .get(url(&r, "/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            !metrics.contains("autocdc_http_connections_refused_total 0\n"),
            "{metrics}"
        );
        // Shutdown with a half-sent head open still commits what is pending.
        let pending = [u(1, "Leeds", 1)];
        let (s, v) = post(
            &fresh(),
            &url(&r, "/v1/flows/c/changes"),
            "application/x-ndjson",
            ndjson(&pending),
            None,
        )
        .await;
        assert_eq!(s, 202, "{v}");
        let _held = half_head(addr);
        tokio::time::timeout(std::time::Duration::from_secs(60), r.stop())
            .await
            .expect("stop is not held up by a half-sent head")
            .unwrap();
        assert_eq!(table(tmp.path(), "c").await, expected(&pending));
    });
}

/// A push whose log write fails (a full disk) gets 503 and leaves nothing
/// behind; /readyz and /metrics show the failing log meanwhile; the retry
/// with the same Idempotency-Key is appended (not answered `duplicate`) and
/// committed, with no restart: the log recovers by itself.
#[test]
fn a_failed_log_write_is_visible_refused_and_recovers_by_itself() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let faults = Arc::new(Faults::default());
        let r = run::start(
            config(tmp.path(), vec![flow_cfg("c", "1h")]),
            faults.clone(),
        )
        .await
        .unwrap();
        let c = reqwest::Client::new();
        let changes = url(&r, "/v1/flows/c/changes");
        let first = [u(1, "Leeds", 1)];
        let (s, _) = post(
            &c,
            &changes,
            "application/x-ndjson",
            ndjson(&first),
            Some("k0"),
        )
        .await;
        assert_eq!(s, 202);
        faults.arm(FaultPoint::LogSync, 0);
        let second = [u(2, "York", 2)];
        let (s, v) = post(
            &c,
            &changes,
            "application/x-ndjson",
            ndjson(&second),
            Some("k1"),
        )
        .await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (503, Some("AUTOCDC_WAL.WRITE_FAILED")),
            "{v}"
        );
        let ready = c.get(url(&r, "/readyz")).send().await.unwrap();
        assert_eq!(ready.status().as_u16(), 503);
        let v: Value = ready.json().await.unwrap();
        assert_eq!(v["flows"][0]["flow"], "c", "{v}");
        let metrics = c
            .get(url(&r, "/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            metrics.contains("autocdc_wal_write_failures_total{flow=\"c\"} 1"),
            "{metrics}"
        );
        let (s, v) = post(
            &c,
            &changes,
            "application/x-ndjson",
            ndjson(&second),
            Some("k1"),
        )
        .await;
        assert_eq!((s, v["duplicate"].as_bool()), (202, Some(false)), "{v}");
        assert_eq!(v["offset"], 2, "{v}");
        let ready = c.get(url(&r, "/readyz")).send().await.unwrap();
        assert_eq!(ready.status().as_u16(), 200);
        commit(&c, &r, "c").await;
        let both = [first[0], second[0]];
        assert_eq!(table(tmp.path(), "c").await, expected(&both));
        r.stop().await.unwrap();
    });
}

/// A batch acknowledged but refused at commit (a tie with a committed
/// change under `on_sequence_tie = "error"`) goes to the flow's dead-letter
/// area with its offset, error and rows; the flow goes on. A log record that
/// no longer decodes at a restart goes there too, instead of keeping the
/// flow down.
#[test]
fn unappliable_records_go_to_the_dead_letter_area_and_the_flow_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let mut f = flow_cfg("c", "1h");
        f.on_sequence_tie = autocdc::core::flow::TiePolicy::Error;
        let r = start(config(tmp.path(), vec![f.clone()])).await;
        let c = reqwest::Client::new();
        let changes = url(&r, "/v1/flows/c/changes");
        let first = [u(1, "Leeds", 5)];
        let (s, _) = post(&c, &changes, "application/x-ndjson", ndjson(&first), None).await;
        assert_eq!(s, 202);
        commit(&c, &r, "c").await;
        let (s, v) = post(
            &c,
            &changes,
            "application/x-ndjson",
            ndjson(&[u(1, "York", 5)]),
            None,
        )
        .await;
        assert_eq!(s, 202, "{v}");
        commit(&c, &r, "c").await;
        let resp = c
            .get(url(&r, "/v1/flows/c/dead-letters"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["count"], 1, "{v}");
        let letter = &v["dead_letters"][0];
        assert_eq!(letter["offset"], 2, "{v}");
        assert_eq!(
            letter["code"], "AUTOCDC_MICROBATCH_VALIDATION.SEQUENCE_TIE",
            "{v}"
        );
        assert_eq!(letter["rows"], 1, "{v}");
        let dir = tmp.path().join("data/flows/c/dead-letters");
        let rows = std::fs::read(dir.join(letter["record"].as_str().unwrap())).unwrap();
        let kept: Vec<_> = arrow_ipc::reader::StreamReader::try_new(&rows[..], None)
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(kept.iter().map(|b| b.num_rows()).sum::<usize>(), 1);
        let metrics = c
            .get(url(&r, "/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            metrics.contains("autocdc_dead_letters{flow=\"c\"} 1"),
            "{metrics}"
        );
        // The flow goes on.
        let later = [u(2, "Bath", 6)];
        let (s, v) = post(
            &c,
            &url(&r, "/v1/flows/c/changes?wait=commit"),
            "application/x-ndjson",
            ndjson(&later),
            None,
        )
        .await;
        assert_eq!(s, 200, "{v}");
        r.stop().await.unwrap();
        // A record that does not decode, found at a restart.
        let wal = tmp.path().join("data/flows/c/wal");
        let log = autocdc::service::wal::LocalLog::open(&wal, 0, 1 << 20, u64::MAX, 8).unwrap();
        use autocdc::service::wal::IngestLog;
        let bad = log
            .append(None, bytes::Bytes::from_static(b"not an arrow stream"), 1)
            .await
            .unwrap();
        drop(log);
        let r = start(config(tmp.path(), vec![f])).await;
        let more = [u(3, "Hull", 7)];
        let (s, v) = post(
            &c,
            &url(&r, "/v1/flows/c/changes?wait=commit"),
            "application/x-ndjson",
            ndjson(&more),
            None,
        )
        .await;
        assert_eq!(s, 200, "{v}");
        let v: Value = c
            .get(url(&r, "/v1/flows/c/dead-letters"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(v["count"], 2, "{v}");
        assert_eq!(v["dead_letters"][0]["offset"], bad.offset, "{v}");
        assert_eq!(v["dead_letters"][0]["rows"], 0, "{v}");
        let rows = table(tmp.path(), "c").await;
        assert_eq!(rows, expected(&[first[0], later[0], more[0]]));
        r.stop().await.unwrap();
    });
}
