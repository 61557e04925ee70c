//! Hostile input and faults against `autocdc serve` over real HTTP: each
//! case gets its 4xx (or its durable behaviour), the server stays alive and
//! nothing of a refused request is applied.

mod common;

use std::io::{Read, Write};
use std::sync::Arc;

use autocdc::fault::{FaultPoint, Faults};
use autocdc::server;
use common::http::*;
use common::*;
use serde_json::{Value, json};

/// The server answers, and the flow still commits a good batch.
async fn still_serving(c: &reqwest::Client, r: &autocdc::server::Running, dir: &std::path::Path) {
    let health = c.get(url(r, "/healthz")).send().await.unwrap();
    assert_eq!(health.status().as_u16(), 200);
    let good = [u(1, "Leeds", 1), u(2, "York", 2)];
    let (s, body) = post(
        c,
        &url(r, "/v1/flows/c/changes?wait=commit"),
        "application/x-ndjson",
        ndjson(&good),
        None,
    )
    .await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(table(dir, "c").await, expected(&good));
}

/// A string key over `max_key_bytes` is refused at ingest with its row and
/// column (it used to be acknowledged and then panic the committer forever).
#[test]
fn a_key_over_max_key_bytes_is_refused_before_the_acknowledgement() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let mut f = flow_cfg("c", "50ms");
        // A string-keyed flow: the customers flow keyed on `city` too.
        f.keys = vec!["id".into(), "city".into()];
        f.max_key_bytes = Some(100);
        let r = start(config(tmp.path(), vec![f])).await;
        let c = reqwest::Client::new();
        let long = "x".repeat(70 << 10);
        let body = format!(
            "{}\n{}",
            json!({"id": 1, "city": "Leeds", "op": "UPSERT", "seq": 1}),
            json!({"id": 2, "city": long, "op": "UPSERT", "seq": 2})
        );
        let (s, v) = post(
            &c,
            &url(&r, "/v1/flows/c/changes"),
            "application/x-ndjson",
            body,
            None,
        )
        .await;
        assert_eq!(s, 400, "{v}");
        assert_eq!(
            v["error"]["code"], "AUTOCDC_MICROBATCH_VALIDATION.KEY_TOO_LONG",
            "{v}"
        );
        assert_eq!(
            (v["error"]["row"].as_u64(), v["error"]["column"].as_str()),
            (Some(1), Some("city")),
            "{v}"
        );
        let st = flow_status(&c, &r, "c").await;
        assert_eq!(st["status"]["accepted_batches"], 0, "{st}");
        let good = [u(1, "Leeds", 1), u(2, "York", 2)];
        let (s, v) = post(
            &c,
            &url(&r, "/v1/flows/c/changes?wait=commit"),
            "application/x-ndjson",
            ndjson(&good),
            None,
        )
        .await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(table(tmp.path(), "c").await, expected(&good));
        r.stop().await.unwrap();
    });
}

/// An upsert without a required column is refused at ingest (it used to be
/// acknowledged and dropped at commit); a delete may leave it out.
#[test]
fn an_upsert_missing_a_required_column_is_refused_at_ingest() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let mut f = flow_cfg("c", "1h");
        f.columns
            .iter_mut()
            .find(|c| c.name == "city")
            .unwrap()
            .required = true;
        let r = start(config(tmp.path(), vec![f])).await;
        let c = reqwest::Client::new();
        let changes = url(&r, "/v1/flows/c/changes");
        let body = format!(
            "{}\n{}",
            json!({"id": 1, "city": "Leeds", "op": "UPSERT", "seq": 1}),
            json!({"id": 2, "op": "UPSERT", "seq": 2})
        );
        let (s, v) = post(&c, &changes, "application/x-ndjson", body, None).await;
        assert_eq!(s, 400, "{v}");
        assert_eq!(
            v["error"]["code"], "AUTOCDC_MICROBATCH_VALIDATION.COLUMN",
            "{v}"
        );
        assert_eq!(
            (v["error"]["row"].as_u64(), v["error"]["column"].as_str()),
            (Some(1), Some("city")),
            "{v}"
        );
        let delete = json!({"id": 2, "op": "DELETE", "seq": 3}).to_string();
        let (s, v) = post(&c, &changes, "application/x-ndjson", delete, None).await;
        assert_eq!(s, 202, "{v}");
        commit(&c, &r, "c").await;
        let st = flow_status(&c, &r, "c").await;
        assert_eq!(st["status"]["rejected_at_commit"], 0, "{st}");
        r.stop().await.unwrap();
    });
}

/// A panic inside a commit is caught: the flow is degraded with the error
/// in its status and in /readyz, the process and its requests go on, and the
/// next attempt commits.
#[test]
fn a_panic_in_the_committer_degrades_the_flow_and_it_recovers() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let faults = Arc::new(Faults::default());
        faults.arm_panic(FaultPoint::AfterStateFile, 0);
        let r = server::start(config(tmp.path(), vec![flow_cfg("c", "20ms")]), faults)
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

/// A `Content-Length` over `max_body_bytes` gets 413 at once, before any of
/// the body is sent (it used to wait for the body until the request timeout).
#[test]
fn a_declared_body_over_the_limit_gets_413_before_it_is_sent() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let r = start(config(tmp.path(), vec![flow_cfg("c", "1h")])).await;
        let addr = r.addr;
        let answer = tokio::task::spawn_blocking(move || {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
            write!(
                s,
                "POST /v1/flows/c/changes HTTP/1.1\r\nhost: x\r\ncontent-type: application/x-ndjson\r\ncontent-length: 1000000000\r\n\r\n{{}}"
            )
            .unwrap();
            let mut buf = [0u8; 4096];
            let n = s.read(&mut buf).unwrap();
            String::from_utf8_lossy(&buf[..n]).to_string()
        })
        .await
        .unwrap();
        assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
        assert!(answer.contains("AUTOCDC_BODY_TOO_LARGE"), "{answer}");
        still_serving(&reqwest::Client::new(), &r, tmp.path()).await;
        r.stop().await.unwrap();
    });
}

/// An empty `Idempotency-Key` is a 400 (it used to count as a key, so a
/// second, different batch was answered `duplicate` and never applied).
#[test]
fn an_empty_idempotency_key_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let r = start(config(tmp.path(), vec![flow_cfg("c", "1h")])).await;
        let c = reqwest::Client::new();
        for key in ["", "  "] {
            let (s, v) = post(
                &c,
                &url(&r, "/v1/flows/c/changes"),
                "application/x-ndjson",
                ndjson(&CUSTOMERS_EVENTS),
                Some(key),
            )
            .await;
            assert_eq!(
                (s, v["error"]["code"].as_str()),
                (400, Some("AUTOCDC_BAD_IDEMPOTENCY_KEY")),
                "{v}"
            );
        }
        let st = flow_status(&c, &r, "c").await;
        assert_eq!(st["status"]["accepted_batches"], 0, "{st}");
        still_serving(&c, &r, tmp.path()).await;
        r.stop().await.unwrap();
    });
}

/// A 10,000-character flow name is a 400 naming the rule (it used to be a
/// 500 from the file system).
#[test]
fn a_very_long_flow_name_is_a_400() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let r = start(config(tmp.path(), vec![flow_cfg("c", "1h")])).await;
        let c = reqwest::Client::new();
        let name = "a".repeat(10_000);
        let mut def = serde_json::to_value(customers_config()).unwrap();
        def["name"] = Value::String(name.clone());
        def["target"] = Value::String("crm.long".into());
        let resp = c
            .put(url(&r, &format!("/v1/flows/{name}")))
            .json(&def)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let v: Value = resp.json().await.unwrap();
        assert_eq!(
            (status, v["error"]["code"].as_str()),
            (400, Some("AUTOCDC_INVALID_DEFINITION")),
            "{v}"
        );
        assert!(
            v["error"]["message"].as_str().unwrap().contains("1 to 128"),
            "{v}"
        );
        still_serving(&c, &r, tmp.path()).await;
        r.stop().await.unwrap();
    });
}

/// A refused `PUT` changes nothing: a drifted definition (new keys on an
/// existing target) gets 409 while the running flow goes on, and a restart
/// still starts every flow; another flow's target is not to be taken.
#[test]
fn a_refused_definition_changes_nothing_and_targets_are_not_shared() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let r = start(config(tmp.path(), vec![])).await;
        let c = reqwest::Client::new();
        let put = |name: &str, def: Value| {
            let c = c.clone();
            let u = url(&r, &format!("/v1/flows/{name}"));
            async move {
                let resp = c.put(u).json(&def).send().await.unwrap();
                let status = resp.status().as_u16();
                (status, resp.json::<Value>().await.unwrap())
            }
        };
        let mut def = serde_json::to_value(flow_cfg("c", "1h")).unwrap();
        let (s, v) = put("c", def.clone()).await;
        assert_eq!(s, 201, "{v}");
        let first = [u(1, "Leeds", 1)];
        let (s, _) = post(
            &c,
            &url(&r, "/v1/flows/c/changes?wait=commit"),
            "application/x-ndjson",
            ndjson(&first),
            None,
        )
        .await;
        assert_eq!(s, 200);
        let stored = std::fs::read(tmp.path().join("data/flows/c/flow.json")).unwrap();
        def["keys"] = json!(["id", "city"]);
        let (s, v) = put("c", def).await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (409, Some("AUTOCDC_INVALID_STATE.KEY_SCHEMA_DRIFT")),
            "{v}"
        );
        assert_eq!(
            std::fs::read(tmp.path().join("data/flows/c/flow.json")).unwrap(),
            stored
        );
        // The flow still takes and commits changes.
        let second = [u(2, "York", 2)];
        let (s, v) = post(
            &c,
            &url(&r, "/v1/flows/c/changes?wait=commit"),
            "application/x-ndjson",
            ndjson(&second),
            None,
        )
        .await;
        assert_eq!(s, 200, "{v}");
        // Another flow may not write c's table.
        let mut other = serde_json::to_value(flow_cfg("lim", "1h")).unwrap();
        other["target"] = json!("crm.c");
        let (s, v) = put("lim", other).await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (400, Some("AUTOCDC_TARGET_IN_USE")),
            "{v}"
        );
        assert!(!tmp.path().join("data/flows/lim/flow.json").exists());
        r.stop().await.unwrap();
        // A restart starts the flow as it was.
        let r = start(config(tmp.path(), vec![])).await;
        let st = flow_status(&c, &r, "c").await;
        assert_eq!(st["definition"]["keys"], json!(["id"]), "{st}");
        let all: Vec<Ev> = first.iter().chain(&second).copied().collect();
        assert_eq!(table(tmp.path(), "c").await, expected(&all));
        r.stop().await.unwrap();
    });
}
