//! Hostile input and faults against `autocdc serve` over real HTTP: each
//! case gets its 4xx (or its durable behaviour), the server stays alive and
//! nothing of a refused request is applied.

use crate::common;

use std::io::{Read, Write};
use std::sync::Arc;

use autocdc::fault::{FaultPoint, Faults};
use autocdc::service::run;
use common::http::*;
use common::*;
use serde_json::{Value, json};

/// The server answers, and the flow still commits a good batch.
async fn still_serving(
    c: &reqwest::Client,
    r: &autocdc::service::run::Running,
    dir: &std::path::Path,
) {
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
/// still starts every flow; a flow that cannot share another's target is
/// refused.
#[test]
fn a_refused_definition_changes_nothing_and_unshareable_targets_are_refused() {
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
        // A flow that cannot share c's table (other keys) may not write it.
        let mut other = serde_json::to_value(flow_cfg("lim", "1h")).unwrap();
        other["target"] = json!("crm.c");
        other["keys"] = json!(["id", "city"]);
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

/// `n` upserts of the customers flow.
fn leeds(n: i64) -> Vec<Ev> {
    (0..n).map(|i| u(i, "Leeds", i)).collect()
}

/// The stream's messages: (metadata range, body length).
fn ipc_messages(stream: &[u8]) -> Vec<(std::ops::Range<usize>, i64)> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos + 8 <= stream.len() {
        let len = i32::from_le_bytes(stream[pos + 4..pos + 8].try_into().unwrap()) as usize;
        if len == 0 {
            break;
        }
        let meta = pos + 8..pos + 8 + len;
        let body = arrow_ipc::root_as_message(&stream[meta.clone()])
            .unwrap()
            .bodyLength();
        pos = meta.end + body as usize;
        out.push((meta, body));
    }
    out
}

/// Replaces every little-endian i64 `from` inside `range` with `to`.
fn patch_i64(stream: &mut [u8], range: std::ops::Range<usize>, from: i64, to: i64) -> usize {
    let (from, to) = (from.to_le_bytes(), to.to_le_bytes());
    let mut n = 0;
    let mut i = range.start;
    while i + 8 <= range.end {
        if stream[i..i + 8] == from {
            stream[i..i + 8].copy_from_slice(&to);
            n += 1;
            i += 8;
        } else {
            i += 1;
        }
    }
    n
}

/// Arrow IPC bodies that lie about their lengths used to abort the process
/// (a 2^40-byte allocation) or make it allocate 2 GiB for a 72-byte body;
/// now each is a 400 before anything is allocated on its say-so.
#[test]
fn arrow_bodies_that_lie_about_lengths_are_refused_and_the_process_lives() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let r = start(config(tmp.path(), vec![flow_cfg("c", "50ms")])).await;
        let c = reqwest::Client::new();
        let good = arrow_body(&leeds(77));
        let msgs = ipc_messages(&good);
        let (batch_meta, batch_body) = msgs.last().unwrap().clone();
        let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
        let mut huge_meta = vec![0xff, 0xff, 0xff, 0xff];
        huge_meta.extend_from_slice(&0x7fff_ffffi32.to_le_bytes());
        huge_meta.extend_from_slice(&[0u8; 64]);
        cases.push(("metadata length 0x7fffffff", huge_meta));
        let mut negative = vec![0xff, 0xff, 0xff, 0xff];
        negative.extend_from_slice(&(-5i32).to_le_bytes());
        negative.extend_from_slice(&[0u8; 64]);
        cases.push(("negative metadata length", negative));
        let mut body_len = good.clone();
        assert!(patch_i64(&mut body_len, batch_meta.clone(), batch_body, 1 << 40) >= 1);
        cases.push(("body length 2^40", body_len));
        let mut rows = good.clone();
        assert!(patch_i64(&mut rows, batch_meta.clone(), 77, 1 << 40) >= 1);
        cases.push(("row count 2^40", rows));
        let mut truncated = good.clone();
        truncated.truncate(good.len() - 40);
        cases.push(("truncated body", truncated));
        for (what, body) in cases {
            let (s, v) = post(
                &c,
                &url(&r, "/v1/flows/c/changes"),
                "application/vnd.apache.arrow.stream",
                body,
                None,
            )
            .await;
            assert_eq!(s, 400, "{what}: {v}");
            let code = v["error"]["code"].as_str().unwrap_or_default().to_string();
            assert!(
                code.starts_with("AUTOCDC_MICROBATCH_VALIDATION."),
                "{what}: {v}"
            );
            let msg = v["error"]["message"].as_str().unwrap_or_default();
            assert!(!msg.contains("panicked"), "{what}: {v}");
        }
        let st = flow_status(&c, &r, "c").await;
        assert_eq!(st["status"]["accepted_batches"], 0, "{st}");
        // The untouched stream is accepted.
        let (s, v) = post(
            &c,
            &url(&r, "/v1/flows/c/changes?wait=commit"),
            "application/vnd.apache.arrow.stream",
            good,
            None,
        )
        .await;
        assert_eq!(s, 200, "{v}");
        r.stop().await.unwrap();
    });
}

/// `PUT` with an `apply_as_deletes` of 35,000 `OR` terms overflowed the
/// stack and aborted the process; the expression's size and operator count
/// are now checked before it is parsed.
#[test]
fn a_huge_expression_is_refused_before_it_is_parsed() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let r = start(config(tmp.path(), vec![flow_cfg("c", "50ms")])).await;
        let c = reqwest::Client::new();
        for sql in [
            vec!["op = 'DELETE'"; 35_000].join(" OR "),
            vec!["id=1"; 6_000].join(" OR "),
        ] {
            let terms = sql.len();
            let mut def = serde_json::to_value(flow_cfg("x", "1h")).unwrap();
            def["apply_as_deletes"] = Value::String(sql);
            let resp = c
                .put(url(&r, "/v1/flows/x"))
                .json(&def)
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            let v: Value = resp.json().await.unwrap();
            assert_eq!(
                (status, v["error"]["code"].as_str()),
                (400, Some("AUTOCDC_INVALID_EXPRESSION.TOO_LARGE")),
                "{terms} bytes: {v}"
            );
            assert!(v["error"]["message"].as_str().unwrap().len() < 1000, "{v}");
        }
        let resp = c.get(url(&r, "/v1/flows/x")).send().await.unwrap();
        assert_eq!(resp.status().as_u16(), 404);
        still_serving(&c, &r, tmp.path()).await;
        r.stop().await.unwrap();
    });
}

/// Numbers are converted exactly or refused with their row and column:
/// `1.9` into a long key used to become 1, merging two rows into one.
#[test]
fn numbers_are_never_rounded_in_any_body_format() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let r = start(config(tmp.path(), vec![flow_cfg("c", "1h")])).await;
        let c = reqwest::Client::new();
        let changes = url(&r, "/v1/flows/c/changes");
        let cases: [(&str, &str, &str); 5] = [
            (
                r#"{"id": 20.7, "op": "UPSERT", "seq": 1}"#,
                "id",
                "fraction",
            ),
            (
                r#"{"id": 1, "op": "UPSERT", "seq": 1.9}"#,
                "seq",
                "fraction",
            ),
            (
                r#"{"id": -9223372036854775809, "op": "UPSERT", "seq": 1}"#,
                "id",
                "out of range",
            ),
            (
                r#"{"id": 1e400, "op": "UPSERT", "seq": 1}"#,
                "id",
                "out of range",
            ),
            (
                r#"{"id": "x1", "op": "UPSERT", "seq": 1}"#,
                "id",
                "cannot be read",
            ),
        ];
        for (row, column, why) in cases {
            let good = r#"{"id": 5, "op": "UPSERT", "seq": 5}"#;
            for (ctype, body) in [
                ("application/x-ndjson", format!("{good}\n{row}")),
                ("application/json", format!("[{good}, {row}]")),
            ] {
                let (s, v) = post(&c, &changes, ctype, body, None).await;
                assert_eq!(s, 400, "{ctype} {row}: {v}");
                assert_eq!(
                    (
                        v["error"]["code"].as_str(),
                        v["error"]["row"].as_u64(),
                        v["error"]["column"].as_str()
                    ),
                    (
                        Some("AUTOCDC_MICROBATCH_VALIDATION.COLUMN"),
                        Some(1),
                        Some(column)
                    ),
                    "{ctype} {row}: {v}"
                );
                assert!(
                    v["error"]["message"].as_str().unwrap().contains(why),
                    "{ctype} {row}: {v}"
                );
            }
        }
        // Arrow doubles into a long: 1.0 is 1, 1.9 is refused.
        let seq = |v: f64| {
            let b = arrow_array::RecordBatch::try_from_iter([
                (
                    "id",
                    Arc::new(arrow_array::Int64Array::from(vec![9])) as arrow_array::ArrayRef,
                ),
                (
                    "op",
                    Arc::new(arrow_array::StringArray::from(vec!["UPSERT"])) as _,
                ),
                (
                    "seq",
                    Arc::new(arrow_array::Float64Array::from(vec![v])) as _,
                ),
            ])
            .unwrap();
            let mut w = arrow_ipc::writer::StreamWriter::try_new(Vec::new(), &b.schema()).unwrap();
            w.write(&b).unwrap();
            w.finish().unwrap();
            w.into_inner().unwrap()
        };
        let (s, v) = post(
            &c,
            &changes,
            "application/vnd.apache.arrow.stream",
            seq(1.9),
            None,
        )
        .await;
        assert_eq!(
            (s, v["error"]["column"].as_str()),
            (400, Some("seq")),
            "{v}"
        );
        let st = flow_status(&c, &r, "c").await;
        assert_eq!(st["status"]["accepted_batches"], 0, "{st}");
        let (s, v) = post(
            &c,
            &changes,
            "application/vnd.apache.arrow.stream",
            seq(1.0),
            None,
        )
        .await;
        assert_eq!(s, 202, "{v}");
        // Integral forms of a long are whole numbers, read exactly.
        let exact = r#"{"id": 1.0, "op": "UPSERT", "city": "Leeds", "seq": 2e0}
{"id": 9007199254740993, "op": "UPSERT", "city": "York", "seq": 3}"#;
        let (s, v) = post(&c, &changes, "application/x-ndjson", exact, None).await;
        assert_eq!(s, 202, "{v}");
        commit(&c, &r, "c").await;
        let rows = table(tmp.path(), "c").await;
        assert!(
            rows.iter()
                .any(|row| row.contains(&"9007199254740993".to_string())),
            "{rows:?}"
        );
        r.stop().await.unwrap();
    });
}

/// More rows than `max_rows_per_request` are refused in every format.
#[test]
fn a_body_over_max_rows_per_request_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let mut cfg = config(tmp.path(), vec![flow_cfg("c", "1h")]);
        cfg.server.max_rows_per_request = 10;
        let r = start(cfg).await;
        let c = reqwest::Client::new();
        let changes = url(&r, "/v1/flows/c/changes");
        let evs = leeds(11);
        let lines = ndjson(&evs);
        let array = format!("[{}]", lines.replace('\n', ","));
        for (ctype, body) in [
            ("application/x-ndjson", lines.clone().into_bytes()),
            ("application/json", array.into_bytes()),
            ("application/vnd.apache.arrow.stream", arrow_body(&evs)),
        ] {
            let (s, v) = post(&c, &changes, ctype, body, None).await;
            assert_eq!(
                (s, v["error"]["code"].as_str()),
                (400, Some("AUTOCDC_MICROBATCH_VALIDATION.TOO_LARGE")),
                "{ctype}: {v}"
            );
        }
        let (s, v) = post(
            &c,
            &changes,
            "application/x-ndjson",
            ndjson(&evs[..10]),
            None,
        )
        .await;
        assert_eq!(s, 202, "{v}");
        r.stop().await.unwrap();
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

/// A token limited to flow `lim` and namespace `sandbox` cannot point `lim`
/// at another namespace's table, nor, whatever its namespaces, at a table
/// a flow it may not use writes (the escalation: deleting that table's
/// rows through a flow sharing it).
#[test]
fn a_token_cannot_point_its_flow_at_another_table() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let mut cfg = config(tmp.path(), vec![flow_cfg("orders", "1h")]);
        cfg.server.tokens = vec![
            autocdc::config::TokenConfig {
                token: "admin".into(),
                flows: vec![],
                namespaces: vec![],
            },
            autocdc::config::TokenConfig {
                token: "lim".into(),
                flows: vec!["lim".into()],
                namespaces: vec!["sandbox".into()],
            },
            autocdc::config::TokenConfig {
                token: "shards".into(),
                flows: vec!["lim".into()],
                namespaces: vec![],
            },
        ];
        let r = start(cfg).await;
        let c = reqwest::Client::new();
        let put = |token: &'static str, target: &'static str| {
            let c = c.clone();
            let u = url(&r, "/v1/flows/lim");
            async move {
                let mut def = serde_json::to_value(flow_cfg("lim", "1h")).unwrap();
                def["target"] = json!(target);
                let resp = c.put(u).bearer_auth(token).json(&def).send().await.unwrap();
                let status = resp.status().as_u16();
                (status, resp.json::<Value>().await.unwrap_or(Value::Null))
            }
        };
        // `orders` writes crm.orders.
        let (s, v) = put("lim", "crm.orders").await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (403, Some("AUTOCDC_FORBIDDEN")),
            "{v}"
        );
        // Limited to its flows, in any namespace: it may not join the
        // target of a flow it may not use (it would write that flow's rows).
        let (s, v) = put("shards", "crm.orders").await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (403, Some("AUTOCDC_FORBIDDEN")),
            "{v}"
        );
        assert!(v.to_string().contains("flow `orders`"), "{v}");
        assert!(!tmp.path().join("data/flows/lim/flow.json").exists());
        // A token for every flow may add a flow that shares it.
        let (s, v) = put("admin", "crm.orders").await;
        assert_eq!(s, 201, "{v}");
        // `lim` may move its own flow to its namespace.
        let (s, v) = put("lim", "sandbox.orders").await;
        assert_eq!(s, 200, "{v}");
        r.stop().await.unwrap();
    });
}

/// Decimals, timestamps, ints and doubles over HTTP: a lossy decimal, an
/// out-of-range timestamp, a fraction into an int and an overflowing double
/// are each a 400 naming the row and column (they used to become 1.00,
/// 9999-12-31, 1 and infinity).
#[test]
fn typed_columns_refuse_what_they_cannot_hold_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let r = start(config(tmp.path(), vec![])).await;
        let c = reqwest::Client::new();
        let def = json!({
            "target": "shop.typed",
            "keys": ["id"],
            "sequence_by": "seq",
            "columns": [
                {"name": "id", "type": "long", "required": true},
                {"name": "seq", "type": "long", "required": true},
                {"name": "amount", "type": "decimal(10,2)"},
                {"name": "at", "type": "timestamp"},
                {"name": "qty", "type": "int"},
                {"name": "ratio", "type": "double"},
            ],
        });
        let resp = c
            .put(url(&r, "/v1/flows/typed"))
            .json(&def)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 201, "{:?}", resp.text().await);
        let changes = url(&r, "/v1/flows/typed/changes");
        let good = r#"{"id": 1, "seq": 1, "amount": "12.50", "at": "2026-11-30T12:00:00", "qty": 3, "ratio": 0.5}"#;
        for (bad, column) in [
            (r#"{"id": 2, "seq": 1, "amount": 1.005}"#, "amount"),
            (r#"{"id": 2, "seq": 1, "amount": 123456789}"#, "amount"),
            (r#"{"id": 2, "seq": 1, "at": 1e30}"#, "at"),
            (r#"{"id": 2, "seq": 1, "at": "10000-01-01T00:00:00"}"#, "at"),
            (r#"{"id": 2, "seq": 1, "qty": 1.5}"#, "qty"),
            (r#"{"id": 2, "seq": 1, "qty": 3000000000}"#, "qty"),
            (r#"{"id": 2, "seq": 1, "ratio": 1e400}"#, "ratio"),
        ] {
            let (s, v) = post(
                &c,
                &changes,
                "application/x-ndjson",
                format!("{good}\n{bad}"),
                None,
            )
            .await;
            assert_eq!(
                (s, v["error"]["row"].as_u64(), v["error"]["column"].as_str()),
                (400, Some(1), Some(column)),
                "{bad}: {v}"
            );
        }
        let (s, v) = post(
            &c,
            &url(&r, "/v1/flows/typed/changes?wait=commit"),
            "application/x-ndjson",
            good.to_string(),
            None,
        )
        .await;
        assert_eq!(s, 200, "{v}");
        r.stop().await.unwrap();
    });
}
