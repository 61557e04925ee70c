//! `autocdc serve` through real HTTP on a loopback port: every content type,
//! every error path, idempotent retries, concurrent clients, backpressure,
//! and recovery from the write-ahead log after a crash.

use crate::common;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use autocdc::config::TokenConfig;
use autocdc::core::flow::FlowConfig;
use autocdc::fault::Faults;
use autocdc::service::run;
use common::http::*;
use common::*;
use serde_json::{Value, json};

#[test]
fn every_content_type_is_accepted_and_committed() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let r = start(config(tmp.path(), vec![flow_cfg("c", "1h")])).await;
        let c = reqwest::Client::new();
        let changes = url(&r, "/v1/flows/c/changes");
        let ev = &CUSTOMERS_EVENTS;
        let (s, v) = post(
            &c,
            &changes,
            "application/x-ndjson",
            ndjson(&ev[0..2]),
            None,
        )
        .await;
        assert_eq!(
            (s, v["accepted"].as_u64(), v["offset"].as_i64()),
            (202, Some(2), Some(1))
        );
        let arr: Vec<Value> = ndjson(&ev[2..4])
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let (s, v) = post(
            &c,
            &changes,
            "application/json",
            Value::Array(arr).to_string(),
            None,
        )
        .await;
        assert_eq!((s, v["offset"].as_i64()), (202, Some(2)));
        let (s, v) = post(
            &c,
            &changes,
            "application/vnd.apache.arrow.stream",
            arrow_body(&ev[4..6]),
            None,
        )
        .await;
        assert_eq!((s, v["offset"].as_i64()), (202, Some(3)));
        let v = commit(&c, &r, "c").await;
        assert!(v["snapshot_id"].as_i64().is_some(), "{v}");
        assert_eq!(table(tmp.path(), "c").await, rows(&[&["1", "Bath", "5"]]));
        // Nothing pending: commit answers null.
        assert_eq!(commit(&c, &r, "c").await["snapshot_id"], Value::Null);
        // ?wait=commit answers once the batch is in a snapshot.
        let (s, v) = post(
            &c,
            &format!("{changes}?wait=commit"),
            "application/x-ndjson",
            ndjson(&[u(3, "Derby", 1)]),
            None,
        )
        .await;
        assert_eq!(s, 200, "{v}");
        assert!(v["snapshot_id"].as_i64().is_some(), "{v}");
        assert_eq!(table(tmp.path(), "c").await.len(), 2);
        r.stop().await.unwrap();
    });
}

#[test]
fn bad_requests_get_a_status_a_code_and_the_offending_row_and_column() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let mut cfg = config(tmp.path(), vec![flow_cfg("c", "1h")]);
        cfg.server.max_body_bytes = 4096;
        let r = start(cfg).await;
        let c = reqwest::Client::new();
        let changes = url(&r, "/v1/flows/c/changes");
        let nd = "application/x-ndjson";
        let ok = r#"{"id":1,"op":"UPSERT","seq":1}"#;
        // (content type, body, status, code, row, column)
        type Case<'a> = (&'a str, String, u16, &'a str, Option<u64>, Option<&'a str>);
        let cases: Vec<Case> = vec![
            (
                nd,
                format!("{ok}\n{{\"id\":2,"),
                400,
                "AUTOCDC_MICROBATCH_VALIDATION.MALFORMED",
                Some(1),
                None,
            ),
            (
                nd,
                format!("{ok}\n{{\"id\":2,\"op\":\"UPSERT\",\"seq\":\"late\"}}"),
                400,
                "AUTOCDC_MICROBATCH_VALIDATION.COLUMN",
                Some(1),
                Some("seq"),
            ),
            (
                nd,
                format!("{ok}\n{ok}\n{{\"id\":2,\"op\":\"UPSERT\",\"seq\":2,\"region\":\"N\"}}"),
                400,
                "AUTOCDC_MICROBATCH_VALIDATION.COLUMN",
                Some(2),
                Some("region"),
            ),
            (
                nd,
                format!("{ok}\n{{\"id\":null,\"op\":\"UPSERT\",\"seq\":2}}"),
                422,
                "AUTOCDC_MICROBATCH_VALIDATION.NULL_KEY",
                Some(1),
                Some("id"),
            ),
            (
                nd,
                format!("{{\"id\":3,\"op\":\"UPSERT\"}}\n{ok}"),
                422,
                "AUTOCDC_MICROBATCH_VALIDATION.NULL_SEQUENCE",
                Some(0),
                Some("seq"),
            ),
            (
                "application/json",
                "{\"id\":1}".into(),
                400,
                "AUTOCDC_MICROBATCH_VALIDATION.MALFORMED",
                None,
                None,
            ),
            (
                "application/json",
                format!("[{ok}, {{\"id\":\"x\",\"op\":\"UPSERT\",\"seq\":1}}]"),
                400,
                "AUTOCDC_MICROBATCH_VALIDATION.COLUMN",
                Some(1),
                Some("id"),
            ),
            (
                "application/vnd.apache.arrow.stream",
                "not arrow".into(),
                400,
                "AUTOCDC_MICROBATCH_VALIDATION.ARROW",
                None,
                None,
            ),
            (
                "text/csv",
                "id,op,seq\n1,UPSERT,1".into(),
                415,
                "AUTOCDC_UNSUPPORTED_MEDIA_TYPE",
                None,
                None,
            ),
        ];
        for (ctype, body, status, code, row, column) in cases {
            let (s, v) = post(&c, &changes, ctype, body.clone(), None).await;
            let e = &v["error"];
            assert_eq!((s, e["code"].as_str()), (status, Some(code)), "{body}: {v}");
            assert_eq!(e["row"].as_u64(), row, "{body}: {v}");
            assert_eq!(e["column"].as_str(), column, "{body}: {v}");
            let msg = e["message"].as_str().unwrap();
            assert!(msg.contains(code) && !msg.contains("``"), "{msg}");
        }
        // Too large a body, and an unknown flow.
        let (s, _) = post(&c, &changes, nd, format!("{ok}\n").repeat(200), None).await;
        assert_eq!(s, 413);
        let (s, v) = post(
            &c,
            &url(&r, "/v1/flows/nope/changes"),
            nd,
            ok.to_string(),
            None,
        )
        .await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (404, Some("AUTOCDC_FLOW_NOT_FOUND"))
        );
        // Nothing of any rejected batch was kept.
        let st = flow_status(&c, &r, "c").await;
        assert_eq!(st["status"]["accepted_batches"], 0, "{st}");
        assert_eq!(st["status"]["rejected_batches"], 9, "{st}");
        assert_eq!(st["status"]["wal"]["next_offset"], 1, "{st}");
        assert_eq!(commit(&c, &r, "c").await["snapshot_id"], Value::Null);
        r.stop().await.unwrap();
    });
}

#[test]
fn tokens_are_checked_per_flow() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let mut cfg = config(tmp.path(), vec![flow_cfg("a", "1h"), flow_cfg("b", "1h")]);
        cfg.server.tokens = vec![
            TokenConfig {
                token: "admin".into(),
                flows: vec![],
                namespaces: vec![],
            },
            TokenConfig {
                token: "only-a".into(),
                flows: vec!["a".into()],
                namespaces: vec![],
            },
        ];
        let r = start(cfg).await;
        let c = reqwest::Client::new();
        let body = ndjson(&[u(1, "Leeds", 1)]);
        let send = |flow: &str, token: Option<&str>| {
            let mut req = c
                .post(url(&r, &format!("/v1/flows/{flow}/changes")))
                .header("content-type", "application/x-ndjson")
                .body(body.clone());
            if let Some(t) = token {
                req = req.bearer_auth(t);
            }
            async move { req.send().await.unwrap().status().as_u16() }
        };
        assert_eq!(send("a", None).await, 401);
        assert_eq!(send("a", Some("wrong")).await, 401);
        assert_eq!(send("b", Some("only-a")).await, 403);
        assert_eq!(send("a", Some("only-a")).await, 202);
        assert_eq!(send("b", Some("admin")).await, 202);
        // Health needs no token.
        let s = c.get(url(&r, "/healthz")).send().await.unwrap().status();
        assert_eq!(s.as_u16(), 200);
        r.stop().await.unwrap();
    });
}

#[test]
fn over_the_uncommitted_cap_pushes_get_429_with_retry_after() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let mut f = flow_cfg("c", "1h");
        f.max_uncommitted_bytes = Some(100);
        let r = start(config(tmp.path(), vec![f])).await;
        let c = reqwest::Client::new();
        let changes = url(&r, "/v1/flows/c/changes");
        let body = arrow_body(&[u(1, "Leeds", 1), u(2, "York", 1)]);
        let (s, _) = post(
            &c,
            &changes,
            "application/vnd.apache.arrow.stream",
            body.clone(),
            None,
        )
        .await;
        assert_eq!(s, 202);
        let resp = c
            .post(&changes)
            .header("content-type", "application/vnd.apache.arrow.stream")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 429);
        assert!(resp.headers().get("retry-after").is_some());
        // After a commit there is room again.
        commit(&c, &r, "c").await;
        let (s, _) = post(
            &c,
            &changes,
            "application/vnd.apache.arrow.stream",
            body,
            None,
        )
        .await;
        assert_eq!(s, 202);
        r.stop().await.unwrap();
    });
}

#[test]
fn a_retried_idempotency_key_is_acknowledged_again_and_applied_once() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let r = start(config(tmp.path(), vec![flow_cfg("c", "1h")])).await;
        let c = reqwest::Client::new();
        let changes = url(&r, "/v1/flows/c/changes");
        let body = ndjson(&CUSTOMERS_EVENTS);
        let (_, first) = post(
            &c,
            &changes,
            "application/x-ndjson",
            body.clone(),
            Some("req-1"),
        )
        .await;
        let (s, again) = post(
            &c,
            &changes,
            "application/x-ndjson",
            body.clone(),
            Some("req-1"),
        )
        .await;
        assert_eq!((s, &first["offset"]), (202, &again["offset"]));
        assert_eq!(
            (&first["duplicate"], &again["duplicate"]),
            (&Value::Bool(false), &Value::Bool(true))
        );
        commit(&c, &r, "c").await;
        // Also after the commit, within the window.
        let (_, later) = post(&c, &changes, "application/x-ndjson", body, Some("req-1")).await;
        assert_eq!(later["offset"], first["offset"]);
        assert_eq!(later["duplicate"], true);
        assert_eq!(commit(&c, &r, "c").await["snapshot_id"], Value::Null);
        let st = flow_status(&c, &r, "c").await;
        assert_eq!(st["status"]["counters"]["rows_in"], 6, "{st}");
        assert_eq!(st["status"]["accepted_batches"], 1, "{st}");
        assert_eq!(table(tmp.path(), "c").await, expected(&CUSTOMERS_EVENTS));
        r.stop().await.unwrap();
    });
}

/// Many clients push interleaved, out-of-order batches to two flows; each
/// table equals the oracle of everything its flow accepted.
#[test]
fn concurrent_clients_on_two_flows_give_the_oracle() {
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let r = start(config(
            tmp.path(),
            vec![flow_cfg("a", "50ms"), flow_cfg("b", "50ms")],
        ))
        .await;
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let cities = ["Leeds", "York", "Bath", "Hull"];
        let mut all: Vec<(String, Vec<Ev>)> = Vec::new();
        for flow in ["a", "b"] {
            let mut evs: Vec<Ev> = (0..600)
                .map(|_| {
                    let k = rng.random_range(0..40);
                    let s = rng.random_range(0..1000);
                    if rng.random_bool(0.2) {
                        d(k, s)
                    } else {
                        u(k, cities[rng.random_range(0..4)], s)
                    }
                })
                .collect();
            evs.shuffle(&mut rng);
            all.push((flow.to_string(), evs));
        }
        let c = reqwest::Client::new();
        let mut tasks = Vec::new();
        for client in 0..8 {
            for (flow, evs) in &all {
                let chunk: Vec<Ev> = evs.iter().skip(client).step_by(8).copied().collect();
                let c = c.clone();
                let changes = url(&r, &format!("/v1/flows/{flow}/changes"));
                tasks.push(tokio::spawn(async move {
                    for (i, part) in chunk.chunks(9).enumerate() {
                        let (s, v) = if i % 2 == 0 {
                            post(&c, &changes, "application/x-ndjson", ndjson(part), None).await
                        } else {
                            post(
                                &c,
                                &changes,
                                "application/vnd.apache.arrow.stream",
                                arrow_body(part),
                                None,
                            )
                            .await
                        };
                        assert_eq!(s, 202, "{v}");
                    }
                }));
            }
        }
        for t in tasks {
            t.await.unwrap();
        }
        for (flow, evs) in &all {
            commit(&c, &r, flow).await;
            assert_eq!(table(tmp.path(), flow).await, expected(evs), "flow {flow}");
        }
        r.stop().await.unwrap();
    });
}

/// Acknowledged batches survive a crash (the process dies before any
/// commit): the restarted service replays its log and commits them; a
/// client retrying with its key gets the same offset.
#[test]
fn acknowledged_batches_survive_a_crash_before_commit() {
    let tmp = tempfile::tempdir().unwrap();
    let evs = CUSTOMERS_EVENTS;
    let mut offsets = Vec::new();
    {
        let rt = rt();
        rt.block_on(async {
            let r = start(config(tmp.path(), vec![flow_cfg("c", "1h")])).await;
            let c = reqwest::Client::new();
            for (i, e) in evs.iter().enumerate() {
                let (s, v) = post(
                    &c,
                    &url(&r, "/v1/flows/c/changes"),
                    "application/x-ndjson",
                    ndjson(&[*e]),
                    Some(&format!("k{i}")),
                )
                .await;
                assert_eq!(s, 202);
                offsets.push(v["offset"].as_i64().unwrap());
            }
            std::mem::forget(r);
        });
        // Dropping the runtime kills every task: no shutdown, no commit.
    }
    assert!(table_blocking(tmp.path()).is_empty());
    rt().block_on(async {
        let r = start(config(tmp.path(), vec![flow_cfg("c", "1h")])).await;
        let c = reqwest::Client::new();
        let (_, v) = post(
            &c,
            &url(&r, "/v1/flows/c/changes"),
            "application/x-ndjson",
            ndjson(&evs[2..3]),
            Some("k2"),
        )
        .await;
        assert_eq!(v["offset"].as_i64(), Some(offsets[2]));
        commit(&c, &r, "c").await;
        assert_eq!(table(tmp.path(), "c").await, expected(&evs));
        // A graceful stop commits what is pending.
        let (s, _) = post(
            &c,
            &url(&r, "/v1/flows/c/changes"),
            "application/x-ndjson",
            ndjson(&[u(9, "Ripon", 1)]),
            None,
        )
        .await;
        assert_eq!(s, 202);
        r.stop().await.unwrap();
        let mut all = evs.to_vec();
        all.push(u(9, "Ripon", 1));
        assert_eq!(table(tmp.path(), "c").await, expected(&all));
    });
}

fn table_blocking(dir: &Path) -> BTreeSet<Vec<String>> {
    rt().block_on(table(dir, "c"))
}

#[test]
fn flows_are_created_over_http_and_survive_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let r = start(config(tmp.path(), vec![])).await;
        let c = reqwest::Client::new();
        let def = serde_json::to_value(flow_cfg("h", "1h")).unwrap();
        let resp = c
            .put(url(&r, "/v1/flows/h"))
            .json(&def)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 201);
        let mut bad = def.clone();
        bad["keys"] = json!([]);
        let resp = c
            .put(url(&r, "/v1/flows/h"))
            .json(&bad)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 400);
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["code"], "AUTOCDC_EMPTY_KEYS");
        let (s, _) = post(
            &c,
            &url(&r, "/v1/flows/h/changes"),
            "application/x-ndjson",
            ndjson(&[u(1, "Leeds", 1)]),
            None,
        )
        .await;
        assert_eq!(s, 202);
        r.stop().await.unwrap();

        let r = start(config(tmp.path(), vec![])).await;
        let list: Value = get_json(&c, &r, "/v1/flows").await;
        assert_eq!(list["flows"][0]["name"], "h", "{list}");
        assert_eq!(list["flows"][0]["status"]["committed_offset"], 1, "{list}");
        let resp = c.delete(url(&r, "/v1/flows/h")).send().await.unwrap();
        assert_eq!(resp.status().as_u16(), 204);
        let resp = c.get(url(&r, "/v1/flows/h")).send().await.unwrap();
        assert_eq!(resp.status().as_u16(), 404);
        let metrics = get_text(&c, &r, "/metrics").await;
        assert!(metrics.contains("autocdc_ready 1"), "{metrics}");
        r.stop().await.unwrap();
        // The table stays.
        assert_eq!(table(tmp.path(), "h").await, rows(&[&["1", "Leeds", "1"]]));
    });
}

async fn put_def(c: &reqwest::Client, r: &run::Running, flow: &str, def: &Value) -> (u16, Value) {
    let resp = c
        .put(url(r, &format!("/v1/flows/{flow}")))
        .json(def)
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

/// `PUT /v1/flows/{flow}` with a changed definition evolves the running
/// flow's table (a column added, a partition field added); an illegal
/// change is refused with nothing changed and the flow still taking pushes.
#[test]
fn a_definition_put_over_http_evolves_the_table() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let r = start(config(tmp.path(), vec![])).await;
        let c = reqwest::Client::new();
        let def = serde_json::to_value(flow_cfg("h", "1h")).unwrap();
        assert_eq!(put_def(&c, &r, "h", &def).await.0, 201);
        let changes = url(&r, "/v1/flows/h/changes");
        let push = |body: String| post(&c, &changes, "application/x-ndjson", body, None);
        assert_eq!(
            push(ndjson(&[u(1, "Leeds", 1), u(2, "York", 1)])).await.0,
            202
        );
        commit(&c, &r, "h").await;

        // city: string -> long is no promotion: 409, the flow unchanged.
        let mut bad = def.clone();
        bad["columns"][1]["type"] = json!("long");
        let (s, v) = put_def(&c, &r, "h", &bad).await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (409, Some("AUTOCDC_INVALID_STATE.SCHEMA_DRIFT")),
            "{v}"
        );
        assert!(
            v["error"]["message"].as_str().unwrap().contains("city"),
            "{v}"
        );
        let status = |v: &Value| {
            (
                v["status"]["schema_id"].as_i64(),
                v["status"]["partition_spec_id"].as_i64(),
            )
        };
        let got: Value = get_json(&c, &r, "/v1/flows/h").await;
        assert_eq!(status(&got), (Some(0), Some(0)), "{got}");

        // A new column and a partition field: one commit each, the flow goes on.
        let mut evolved = def.clone();
        evolved["columns"]
            .as_array_mut()
            .unwrap()
            .insert(2, json!({ "name": "tier", "type": "int" }));
        evolved["partition_by"] = json!(["bucket[4](id)"]);
        let (s, v) = put_def(&c, &r, "h", &evolved).await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(status(&v), (Some(1), Some(1)), "{v}");
        assert_eq!(v["status"]["schema_evolutions"].as_u64(), Some(2), "{v}");
        let tiered = r#"{"id":1,"op":"UPSERT","city":"Hull","tier":3,"seq":2}"#;
        let (s, v) = push(format!("{tiered}\n{}", ndjson(&[u(3, "Bath", 1)]))).await;
        assert_eq!(s, 202, "{v}");
        commit(&c, &r, "h").await;
        let want = rows(&[
            &["1", "Hull", "3", "2"],
            &["2", "York", "NULL", "1"],
            &["3", "Bath", "NULL", "1"],
        ]);
        assert_eq!(table(tmp.path(), "h").await, want);
        let metrics = get_text(&c, &r, "/metrics").await;
        assert!(
            metrics.contains("autocdc_partition_spec_id{flow=\"h\"} 1"),
            "{metrics}"
        );
        r.stop().await.unwrap();

        // The persisted definition reopens as it is: nothing more evolves.
        let r = start(config(tmp.path(), vec![])).await;
        let got: Value = get_json(&c, &r, "/v1/flows/h").await;
        assert_eq!(status(&got), (Some(1), Some(1)), "{got}");
        assert_eq!(
            got["status"]["schema_evolutions"].as_u64(),
            Some(0),
            "{got}"
        );
        r.stop().await.unwrap();
        assert_eq!(table(tmp.path(), "h").await, want);
    });
}

/// The flow's declared columns as (name, type), from `GET /v1/flows/{flow}`.
async fn declared(c: &reqwest::Client, r: &run::Running, flow: &str) -> Vec<(String, String)> {
    let v = get_json(c, r, &format!("/v1/flows/{flow}")).await;
    v["definition"]["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_string(),
                c["type"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn named(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

/// `schema_evolution = "add_columns"`: pushed fields the definition lacks
/// add optional columns (typed from the JSON values or the Arrow field)
/// before the push is logged; a field that cannot be typed is refused with
/// nothing added; a restart on the file's definition keeps the columns.
#[test]
fn add_columns_flows_take_new_fields_from_json_and_arrow() {
    use arrow_array::{Int32Array, Int64Array, RecordBatch, StringArray};
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = flow_cfg("a", "1h");
    cfg.schema_evolution = autocdc::core::flow::SchemaEvolution::AddColumns;
    rt().block_on(async {
        let r = start(config(tmp.path(), vec![cfg.clone()])).await;
        let c = reqwest::Client::new();
        let changes = url(&r, "/v1/flows/a/changes");
        let base = [
            ("id", "long"),
            ("city", "string"),
            ("op", "string"),
            ("seq", "long"),
        ];
        assert_eq!(declared(&c, &r, "a").await, named(&base));
        let (s, v) = post(
            &c,
            &changes,
            "application/x-ndjson",
            ndjson(&[u(1, "Leeds", 1)]),
            None,
        )
        .await;
        assert_eq!(s, 202, "{v}");
        commit(&c, &r, "a").await;

        // JSON: a long, a boolean (null in one row), a field null everywhere.
        let body = [
            r#"{"id":2,"op":"UPSERT","city":"York","seq":1,"tier":3,"vip":null,"later":null}"#,
            r#"{"id":3,"op":"UPSERT","city":"Bath","seq":1,"tier":4,"vip":true}"#,
        ]
        .join("\n");
        let (s, v) = post(&c, &changes, "application/x-ndjson", body, None).await;
        assert_eq!(s, 202, "{v}");
        let mut want = base.to_vec();
        want.extend([("tier", "long"), ("vip", "boolean")]);
        assert_eq!(declared(&c, &r, "a").await, named(&want));

        // A field that is a string in one row and a number in another: 400
        // naming it and the row, nothing added, nothing logged.
        let bad = [
            r#"{"id":4,"op":"UPSERT","city":"Hull","seq":1,"note":"x"}"#,
            r#"{"id":5,"op":"UPSERT","city":"Ely","seq":1,"note":5}"#,
        ]
        .join("\n");
        let (s, v) = post(&c, &changes, "application/x-ndjson", bad, None).await;
        assert_eq!(s, 400, "{v}");
        let e = &v["error"];
        assert_eq!(
            (e["code"].as_str(), e["row"].as_u64(), e["column"].as_str()),
            (
                Some("AUTOCDC_MICROBATCH_VALIDATION.COLUMN"),
                Some(1),
                Some("note")
            ),
            "{v}"
        );
        assert_eq!(declared(&c, &r, "a").await, named(&want));

        // A new field in a push refused for another reason adds nothing.
        let null_key = r#"{"id":null,"op":"UPSERT","city":"Hull","seq":1,"extra":1}"#;
        let (s, v) = post(&c, &changes, "application/x-ndjson", null_key, None).await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (422, Some("AUTOCDC_MICROBATCH_VALIDATION.NULL_KEY")),
            "{v}"
        );
        assert_eq!(declared(&c, &r, "a").await, named(&want));

        // Arrow: an int32 column.
        let schema = Arc::new(arrow_schema::Schema::new(vec![
            arrow_schema::Field::new("id", arrow_schema::DataType::Int64, false),
            arrow_schema::Field::new("op", arrow_schema::DataType::Utf8, false),
            arrow_schema::Field::new("seq", arrow_schema::DataType::Int64, false),
            arrow_schema::Field::new("score", arrow_schema::DataType::Int32, true),
        ]));
        let b = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(vec![1])),
                Arc::new(StringArray::from(vec!["UPSERT"])),
                Arc::new(Int64Array::from(vec![2])),
                Arc::new(Int32Array::from(vec![Some(9)])),
            ],
        )
        .unwrap();
        let ipc = autocdc::service::input::encode_arrow_ipc(&b).unwrap();
        let resp = c
            .post(&changes)
            .header("content-type", "application/vnd.apache.arrow.stream")
            .body(ipc)
            .send()
            .await
            .unwrap();
        assert_eq!(
            resp.status().as_u16(),
            202,
            "{}",
            resp.text().await.unwrap()
        );
        want.push(("score", "int"));
        assert_eq!(declared(&c, &r, "a").await, named(&want));
        commit(&c, &r, "a").await;
        // Target columns: id, city, seq, tier, vip, score (op is excluded).
        let rows_now = rows(&[
            &["1", "NULL", "2", "NULL", "NULL", "9"],
            &["2", "York", "1", "3", "NULL", "NULL"],
            &["3", "Bath", "1", "4", "true", "NULL"],
        ]);
        assert_eq!(table(tmp.path(), "a").await, rows_now);
        r.stop().await.unwrap();

        // Restarted on the config file's definition, which lacks them: the
        // columns are kept, nothing evolves, and a new field still adds one.
        let r = start(config(tmp.path(), vec![cfg.clone()])).await;
        let changes = url(&r, "/v1/flows/a/changes");
        assert_eq!(declared(&c, &r, "a").await, named(&want));
        let got: Value = get_json(&c, &r, "/v1/flows/a").await;
        assert_eq!(
            got["status"]["schema_evolutions"].as_u64(),
            Some(0),
            "{got}"
        );
        let body = r#"{"id":6,"op":"UPSERT","city":"Ely","seq":1,"tier":1,"later":"z"}"#;
        let (s, v) = post(&c, &changes, "application/x-ndjson", body, None).await;
        assert_eq!(s, 202, "{v}");
        commit(&c, &r, "a").await;
        let mut more: BTreeSet<Vec<String>> = rows_now
            .iter()
            .map(|r| r.iter().cloned().chain(["NULL".to_string()]).collect())
            .collect();
        more.insert(
            ["6", "Ely", "1", "1", "NULL", "NULL", "z"]
                .map(String::from)
                .to_vec(),
        );
        assert_eq!(table(tmp.path(), "a").await, more);
        r.stop().await.unwrap();
    });
}

/// Without `add_columns`, a field the definition lacks stays a 400 and the
/// definition is unchanged.
#[test]
fn without_add_columns_an_unknown_field_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let r = start(config(tmp.path(), vec![flow_cfg("n", "1h")])).await;
        let c = reqwest::Client::new();
        let body = r#"{"id":1,"op":"UPSERT","city":"York","seq":1,"tier":3}"#;
        let (s, v) = post(
            &c,
            &url(&r, "/v1/flows/n/changes"),
            "application/x-ndjson",
            body,
            None,
        )
        .await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (400, Some("AUTOCDC_MICROBATCH_VALIDATION.COLUMN")),
            "{v}"
        );
        assert_eq!(declared(&c, &r, "n").await.len(), 4);
        r.stop().await.unwrap();
    });
}

/// The OpenAPI document is generated from the handlers: every route the
/// server answers is in it, and every documented operation is routed.
#[test]
fn the_openapi_document_matches_the_routes() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let r = start(config(tmp.path(), vec![flow_cfg("c", "1h")])).await;
        let c = reqwest::Client::new();
        let doc: Value = get_json(&c, &r, "/openapi.json").await;
        let mut documented = BTreeSet::new();
        for (path, ops) in doc["paths"].as_object().unwrap() {
            for method in ops.as_object().unwrap().keys() {
                documented.insert((method.to_uppercase(), path.clone()));
            }
        }
        let served: BTreeSet<(String, String)> = [
            ("GET", "/healthz"),
            ("GET", "/readyz"),
            ("GET", "/metrics"),
            ("GET", "/openapi.json"),
            ("GET", "/v1/flows"),
            ("GET", "/v1/flows/{flow}"),
            ("PUT", "/v1/flows/{flow}"),
            ("DELETE", "/v1/flows/{flow}"),
            ("POST", "/v1/flows/{flow}/changes"),
            ("POST", "/v1/debezium"),
            ("POST", "/v1/flows/{flow}/snapshots"),
            ("POST", "/v1/flows/{flow}/commit"),
            ("GET", "/v1/flows/{flow}/dead-letters"),
            ("POST", "/v1/flows/{flow}/maintain"),
        ]
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
        assert_eq!(documented, served);
        // Every documented operation is routed (a made-up flow: 404 with our
        // error body, never the router's bare 404 / 405).
        for (method, path) in &documented {
            let p = path.replace("{flow}", "no_such_flow");
            let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
            let resp = c
                .request(m, url(&r, &p))
                .header("content-type", "application/json")
                .body("{}")
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            assert_ne!(status, 405, "{method} {path}");
            if status == 404 {
                let v: Value = resp.json().await.unwrap();
                assert_eq!(
                    v["error"]["code"], "AUTOCDC_FLOW_NOT_FOUND",
                    "{method} {path}"
                );
            }
        }
        for schema in [
            "ErrorResponse",
            "ChangesResponse",
            "FlowConfig",
            "FlowStatus",
        ] {
            assert!(
                doc["components"]["schemas"][schema].is_object(),
                "{schema} missing"
            );
        }
        let errors = &doc["paths"]["/v1/flows/{flow}/changes"]["post"]["responses"];
        for status in ["202", "400", "413", "415", "422", "429"] {
            assert!(errors[status].is_object(), "changes: {status} undocumented");
        }
        r.stop().await.unwrap();
    });
}

/// With `on_sequence_tie = "error"`, two batches that are each valid can
/// tie with each other. Both were acknowledged; at commit the later one is
/// rejected and reported, and the flow goes on.
#[test]
fn a_tie_found_at_commit_rejects_only_the_later_batch() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let mut f = flow_cfg("c", "1h");
        f.on_sequence_tie = autocdc::core::flow::TiePolicy::Error;
        let r = start(config(tmp.path(), vec![f])).await;
        let c = reqwest::Client::new();
        let changes = url(&r, "/v1/flows/c/changes");
        for evs in [
            vec![u(1, "Leeds", 5), u(2, "York", 1)],
            vec![u(1, "Denver", 5)],
            vec![u(3, "Bath", 1)],
        ] {
            let (s, _) = post(&c, &changes, "application/x-ndjson", ndjson(&evs), None).await;
            assert_eq!(s, 202);
        }
        commit(&c, &r, "c").await;
        assert_eq!(
            table(tmp.path(), "c").await,
            rows(&[
                &["1", "Leeds", "5"],
                &["2", "York", "1"],
                &["3", "Bath", "1"]
            ])
        );
        let st = flow_status(&c, &r, "c").await;
        assert_eq!(st["status"]["rejected_at_commit"], 1, "{st}");
        let why = st["status"]["last_rejection"].as_str().unwrap();
        assert!(
            why.contains("offset 2") && why.contains("SEQUENCE_TIE"),
            "{why}"
        );
        assert_eq!(st["status"]["degraded"], false);
        r.stop().await.unwrap();
    });
}

/// Commits that fail are retried with backoff; meanwhile pushes are still
/// accepted and /readyz says degraded; then everything is committed.
#[test]
fn failing_commits_are_retried_and_readyz_says_degraded() {
    use autocdc::fault::FaultPoint;
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let faults = Arc::new(Faults::default());
        for nth in 0..3 {
            faults.arm(FaultPoint::AfterStateCommit, nth);
        }
        let r = run::start(config(tmp.path(), vec![flow_cfg("c", "20ms")]), faults)
            .await
            .unwrap();
        let c = reqwest::Client::new();
        let changes = url(&r, "/v1/flows/c/changes");
        let (s, _) = post(
            &c,
            &changes,
            "application/x-ndjson",
            ndjson(&CUSTOMERS_EVENTS[..3]),
            None,
        )
        .await;
        assert_eq!(s, 202);
        let mut degraded = false;
        for _ in 0..300 {
            let resp = c.get(url(&r, "/readyz")).send().await.unwrap();
            if resp.status().as_u16() == 503 {
                let v: Value = resp.json().await.unwrap();
                assert_eq!(v["status"], "degraded");
                degraded = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert!(degraded, "readyz never reported the failing commits");
        // Ingestion goes on while commits fail.
        let (s, _) = post(
            &c,
            &changes,
            "application/x-ndjson",
            ndjson(&CUSTOMERS_EVENTS[3..]),
            None,
        )
        .await;
        assert_eq!(s, 202);
        let v = commit(&c, &r, "c").await;
        assert!(
            v["snapshot_id"].as_i64().is_some() || v["offset"] == 2,
            "{v}"
        );
        let mut ready = false;
        for _ in 0..300 {
            if c.get(url(&r, "/readyz"))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
                == 200
            {
                ready = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(ready);
        assert_eq!(table(tmp.path(), "c").await, expected(&CUSTOMERS_EVENTS));
        r.stop().await.unwrap();
    });
}

/// `autocdc push` reads a file into the flow's schema (asked of the
/// server), cuts it into requests and retries with content-derived keys:
/// pushing the same file again changes nothing.
#[test]
fn push_sends_files_once() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let r = start(config(tmp.path(), vec![flow_cfg("c", "1h")])).await;
        let file = tmp.path().join("changes.ndjson");
        std::fs::write(&file, ndjson(&CUSTOMERS_EVENTS)).unwrap();
        let args = autocdc::tools::push::PushArgs {
            url: format!("http://{}", r.addr),
            flow: "c".into(),
            files: vec![file],
            token: None,
            batch_rows: Some(2),
            wait_commit: true,
            max_attempts: 3,
        };
        assert_eq!(autocdc::tools::push::push(&args).await.unwrap(), (3, 6));
        assert_eq!(table(tmp.path(), "c").await, expected(&CUSTOMERS_EVENTS));
        autocdc::tools::push::push(&args).await.unwrap();
        let c = reqwest::Client::new();
        let st = flow_status(&c, &r, "c").await;
        assert_eq!(st["status"]["accepted_batches"], 3, "{st}");
        // A flow that does not exist is a clear error, not a retry loop.
        let mut bad = args;
        bad.flow = "nope".into();
        let e = autocdc::tools::push::push(&bad).await.unwrap_err();
        assert!(e.to_string().contains("404"), "{e}");
        r.stop().await.unwrap();
    });
}

const NDJSON_T: &str = "application/x-ndjson";

fn snapshot_flow(name: &str, scd: u8) -> FlowConfig {
    toml::from_str(&format!(
        r#"
name = "{name}"
target = "crm.{name}"
keys = ["sku"]
from_snapshot = true
stored_as_scd_type = {scd}
commit_interval = "1h"
columns = [
  {{ name = "sku", type = "string", required = true }},
  {{ name = "qty", type = "long" }},
]
"#
    ))
    .unwrap()
}

#[test]
fn snapshots_over_http_are_diffed_skipped_when_old_and_survive_a_restart() {
    let rt = rt();
    let tmp = tempfile::tempdir().unwrap();
    rt.block_on(async {
        let client = reqwest::Client::new();
        let flows = || vec![snapshot_flow("s", 2), flow_cfg("c", "1h")];
        let r = start(config(tmp.path(), flows())).await;
        let snaps = |v: i64| {
            url(
                &r,
                &format!("/v1/flows/s/snapshots?version={v}&wait=commit"),
            )
        };
        let (st, body) = post(
            &client,
            &snaps(1),
            NDJSON_T,
            "{\"sku\":\"a\",\"qty\":1}\n{\"sku\":\"b\",\"qty\":2}",
            Some("v1"),
        )
        .await;
        assert_eq!(st, 200, "{body}");
        assert_eq!(
            (body["accepted"].as_u64(), body["skipped"].as_bool()),
            (Some(2), Some(false))
        );
        // Version 2: a changes, b goes; as a JSON array.
        let (st, body) = post(
            &client,
            &snaps(2),
            "application/json",
            "[{\"sku\":\"a\",\"qty\":5}]",
            None,
        )
        .await;
        assert_eq!(st, 200, "{body}");
        // An older version is skipped and reported; so is a retry of version 2.
        for (v, key) in [(1, None), (2, Some("v2-retry"))] {
            let (st, body) = post(
                &client,
                &snaps(v),
                NDJSON_T,
                "{\"sku\":\"z\",\"qty\":9}",
                key,
            )
            .await;
            assert_eq!(
                (
                    st,
                    body["skipped"].as_bool(),
                    body["current_version"].as_i64()
                ),
                (200, Some(true), Some(2)),
                "{body}"
            );
        }
        // Errors: no version, a key twice, changes to a snapshot flow and snapshots to a change flow.
        let (st, body) = post(
            &client,
            &url(&r, "/v1/flows/s/snapshots"),
            NDJSON_T,
            "{\"sku\":\"a\"}",
            None,
        )
        .await;
        assert_eq!(
            (st, body["error"]["code"].as_str()),
            (400, Some("AUTOCDC_SNAPSHOT_VERSION_REQUIRED")),
            "{body}"
        );
        let (st, body) = post(
            &client,
            &snaps(3),
            NDJSON_T,
            "{\"sku\":\"a\",\"qty\":1}\n{\"sku\":\"a\",\"qty\":2}",
            None,
        )
        .await;
        assert_eq!(
            (
                st,
                body["error"]["code"].as_str(),
                body["error"]["row"].as_u64()
            ),
            (422, Some("AUTOCDC_SNAPSHOT_DUPLICATE_KEY"), Some(1)),
            "{body}"
        );
        let (st, body) = post(
            &client,
            &url(&r, "/v1/flows/s/changes"),
            NDJSON_T,
            "{\"sku\":\"a\",\"qty\":1}",
            None,
        )
        .await;
        assert_eq!(
            (st, body["error"]["code"].as_str()),
            (400, Some("AUTOCDC_SNAPSHOT_FLOW_MISMATCH")),
            "{body}"
        );
        let (st, body) = post(
            &client,
            &url(&r, "/v1/flows/c/snapshots?version=1"),
            NDJSON_T,
            ndjson(&[u(1, "Leeds", 1)]),
            None,
        )
        .await;
        assert_eq!(
            (st, body["error"]["code"].as_str()),
            (400, Some("AUTOCDC_SNAPSHOT_FLOW_MISMATCH")),
            "{body}"
        );
        // Version 3 is logged but not committed before the restart.
        let (st, body) = post(
            &client,
            &url(&r, "/v1/flows/s/snapshots?version=3"),
            NDJSON_T,
            "{\"sku\":\"a\",\"qty\":5}\n{\"sku\":\"c\",\"qty\":7}",
            None,
        )
        .await;
        assert_eq!(st, 202, "{body}");
        r.stop().await.unwrap();
        let r = start(config(tmp.path(), flows())).await;
        assert_eq!(
            flow_status(&client, &r, "s").await["status"]["snapshot_version"].as_i64(),
            Some(3)
        );
        commit(&client, &r, "s").await;
        assert_eq!(
            table(tmp.path(), "s").await,
            rows(&[
                &["a", "1", "1", "2"],
                &["a", "5", "2", "NULL"],
                &["b", "2", "1", "2"],
                &["c", "7", "3", "NULL"],
            ])
        );
        r.stop().await.unwrap();
    });
}

#[test]
fn an_scd2_flow_over_http_keeps_history() {
    let rt = rt();
    let tmp = tempfile::tempdir().unwrap();
    rt.block_on(async {
        let client = reqwest::Client::new();
        let mut f = flow_cfg("h", "1h");
        f.stored_as_scd_type = 2;
        let r = start(config(tmp.path(), vec![f])).await;
        let evs = [
            u(1, "Leeds", 1),
            u(1, "Bath", 9),
            u(1, "York", 5),
            d(2, 3),
            u(2, "Hull", 2),
        ];
        for (i, e) in evs.iter().enumerate() {
            let (st, _) = post(
                &client,
                &url(&r, "/v1/flows/h/changes"),
                NDJSON_T,
                ndjson(&[*e]),
                Some(&format!("k{i}")),
            )
            .await;
            assert_eq!(st, 202);
        }
        commit(&client, &r, "h").await;
        assert_eq!(
            table(tmp.path(), "h").await,
            rows(&[
                &["1", "Leeds", "1", "1", "5"],
                &["1", "York", "5", "5", "9"],
                &["1", "Bath", "9", "9", "NULL"],
                &["2", "Hull", "2", "2", "3"],
            ])
        );
        r.stop().await.unwrap();
    });
}

// ---- Commit cadence and the log's byte bound ----

/// Distinct events: key `i % keys`, sequence `i`, a city from a few.
fn events(from: i64, n: i64, keys: i64) -> Vec<Ev> {
    const CITIES: [&str; 4] = ["Leeds", "York", "Bath", "Hull"];
    (from..from + n)
        .map(|i| u(i % keys, CITIES[(i % 4) as usize], i))
        .collect()
}

/// Under a steady load, commits start `commit_interval` apart: the
/// committer does not commit again at once just because something arrived
/// during the last commit.
#[test]
fn under_steady_load_commits_follow_the_interval() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let r = start(config(tmp.path(), vec![flow_cfg("c", "400ms")])).await;
        let c = reqwest::Client::new();
        let changes = url(&r, "/v1/flows/c/changes");
        let started = std::time::Instant::now();
        let mut all = Vec::new();
        let mut i = 0;
        while started.elapsed() < std::time::Duration::from_secs(4) {
            let evs = events(i * 5, 5, 50);
            let (s, _) = post(&c, &changes, "application/x-ndjson", ndjson(&evs), None).await;
            assert_eq!(s, 202);
            all.extend(evs);
            i += 1;
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let elapsed = started.elapsed().as_secs_f64();
        let st = flow_status(&c, &r, "c").await;
        let commits = st["status"]["commits"].as_u64().unwrap();
        // At most one commit per interval (plus the first tick's slack); the
        // pushes alone (hundreds) would have driven many more before.
        let most = (elapsed / 0.4).ceil() as u64 + 1;
        assert!(
            (2..=most).contains(&commits),
            "{commits} commits in {elapsed:.1} s at a 400 ms interval over {i} pushes"
        );
        assert!(
            st["status"]["recent_commit_ms_p50"].as_f64().is_some(),
            "{st}"
        );
        commit(&c, &r, "c").await;
        assert_eq!(table(tmp.path(), "c").await, expected(&all));
        r.stop().await.unwrap();
    });
}

/// More than one commit's worth waiting is committed at once, commit after
/// commit; less than that waits for the interval (or `/commit`).
#[test]
fn a_commits_worth_pending_is_committed_at_once_and_the_rest_waits() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let mut f = flow_cfg("c", "1h");
        f.commit_max_rows = Some(4);
        let r = start(config(tmp.path(), vec![f])).await;
        let c = reqwest::Client::new();
        let changes = url(&r, "/v1/flows/c/changes");
        let mut all = Vec::new();
        for i in 0..5 {
            let evs = events(i * 2, 2, 100);
            let (s, _) = post(&c, &changes, "application/x-ndjson", ndjson(&evs), None).await;
            assert_eq!(s, 202);
            all.extend(evs);
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let st = loop {
            let st = flow_status(&c, &r, "c").await;
            if st["status"]["applied_offset"] == 4 || std::time::Instant::now() > deadline {
                break st;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        };
        assert_eq!(st["status"]["applied_offset"], 4, "{st}");
        assert_eq!(st["status"]["commits"], 2, "{st}");
        // The fifth batch (2 rows, under commit_max_rows) waits for the hour.
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let st = flow_status(&c, &r, "c").await;
        assert_eq!(st["status"]["pending_batches"], 1, "{st}");
        assert_eq!(commit(&c, &r, "c").await["offset"], 5);
        assert_eq!(table(tmp.path(), "c").await, expected(&all));
        r.stop().await.unwrap();
    });
}

/// `max_log_bytes`: committed records leave the log before their
/// idempotency window ends to keep it under the bound; the shortened window
/// is reported; a retry of a forgotten key is applied again, harmlessly.
#[test]
fn the_log_stays_under_max_log_bytes_and_reports_the_shorter_window() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let mut f = flow_cfg("c", "1h");
        f.max_log_bytes = Some(64 << 10);
        let r = start(config(tmp.path(), vec![f])).await;
        let c = reqwest::Client::new();
        let changes = url(&r, "/v1/flows/c/changes?wait=commit");
        let mut all = Vec::new();
        let mut first = None;
        for i in 0..60 {
            let evs = events(i * 40, 40, 500);
            let (s, body) = post(
                &c,
                &changes,
                "application/x-ndjson",
                ndjson(&evs),
                Some(&format!("k{i}")),
            )
            .await;
            assert_eq!(s, 200, "{body}");
            first.get_or_insert(body);
            all.extend(evs);
            let st = flow_status(&c, &r, "c").await;
            let bytes = st["status"]["wal"]["bytes"].as_u64().unwrap();
            assert!(bytes <= 64 << 10, "log at {bytes} bytes: {st}");
        }
        let st = flow_status(&c, &r, "c").await;
        assert_eq!(st["status"]["wal"]["max_bytes"], 64 << 10, "{st}");
        assert!(
            st["status"]["wal"]["early_released_segments"]
                .as_u64()
                .unwrap()
                > 0,
            "{st}"
        );
        let window = st["status"]["idempotency_window_ms"].as_i64().unwrap();
        assert!(window < 15 * 60 * 1000, "window {window}: {st}");
        // The first key was forgotten early: its retry is appended again and
        // its changes resolve as duplicates.
        let (s, again) = post(
            &c,
            &changes,
            "application/x-ndjson",
            ndjson(&events(0, 40, 500)),
            Some("k0"),
        )
        .await;
        assert_eq!(s, 200, "{again}");
        assert_eq!(again["duplicate"], false, "{again}");
        assert_ne!(again["offset"], first.unwrap()["offset"]);
        assert_eq!(table(tmp.path(), "c").await, expected(&all));
        let metrics = get_text(&c, &r, "/metrics").await;
        for m in [
            "autocdc_wal_max_bytes{flow=\"c\"} 65536",
            "autocdc_wal_early_released_segments_total{flow=\"c\"}",
            "autocdc_idempotency_window_seconds{flow=\"c\"}",
            "autocdc_wal_oldest_record_age_seconds{flow=\"c\"}",
        ] {
            assert!(metrics.contains(m), "{m} missing from\n{metrics}");
        }
        r.stop().await.unwrap();
    });
}

/// When uncommitted records alone fill `max_log_bytes`, pushes get 429 with
/// Retry-After and nothing acknowledged is dropped; a batch over half the
/// bound is refused as too large.
#[test]
fn a_log_full_of_uncommitted_records_answers_429_and_keeps_them() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let mut f = flow_cfg("c", "1h");
        f.max_log_bytes = Some(64 << 10);
        let r = start(config(tmp.path(), vec![f])).await;
        let c = reqwest::Client::new();
        let changes = url(&r, "/v1/flows/c/changes");
        let mut acked = Vec::new();
        let mut refused = None;
        for i in 0..200 {
            let evs = events(i * 40, 40, 500);
            let resp = c
                .post(&changes)
                .header("content-type", "application/x-ndjson")
                .body(ndjson(&evs))
                .send()
                .await
                .unwrap();
            match resp.status().as_u16() {
                202 => acked.extend(evs),
                429 => {
                    assert!(resp.headers().get("retry-after").is_some());
                    refused = Some(resp.text().await.unwrap());
                    break;
                }
                s => panic!("{s}: {}", resp.text().await.unwrap()),
            }
        }
        let refused = refused.expect("the log filled up");
        assert!(refused.contains("max_log_bytes"), "{refused}");
        let st = flow_status(&c, &r, "c").await;
        assert!(
            st["status"]["wal"]["bytes"].as_u64().unwrap() <= 64 << 10,
            "{st}"
        );
        commit(&c, &r, "c").await;
        assert_eq!(table(tmp.path(), "c").await, expected(&acked));
        // After the commit there is room again.
        let (s, _) = post(
            &c,
            &changes,
            "application/x-ndjson",
            ndjson(&events(90_000, 40, 500)),
            None,
        )
        .await;
        assert_eq!(s, 202);
        // One batch over half the bound can never fit: 400, not 429.
        let (s, body) = post(
            &c,
            &changes,
            "application/x-ndjson",
            ndjson(&events(100_000, 2000, 5000)),
            None,
        )
        .await;
        assert_eq!(
            (s, body["error"]["code"].as_str()),
            (400, Some("AUTOCDC_MICROBATCH_VALIDATION.TOO_LARGE")),
            "{body}"
        );
        r.stop().await.unwrap();
    });
}

/// `POST /v1/flows/{flow}/maintain`: a dry run reports and changes nothing,
/// a run expires and says so; the flow's status and `/metrics` show the
/// run and the tables' figures; the table is unchanged.
#[test]
fn the_maintain_endpoint_runs_between_commits_and_reports() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = flow_cfg("c", "1h");
    cfg.snapshot_max_age = Some("1ms".into());
    cfg.min_snapshots_to_keep = Some(1);
    // Expiry alone here (compaction has its own test below).
    cfg.compaction = Some(autocdc::core::flow::CompactionConfig {
        enabled: Some(false),
        ..Default::default()
    });
    rt().block_on(async {
        let r = start(config(tmp.path(), vec![cfg])).await;
        let c = reqwest::Client::new();
        let mut all = Vec::new();
        for i in 0..3 {
            let evs = [u(i, "Leeds", 10 + i), u(100, "York", 10 + i)];
            all.extend(evs);
            let (st, _) = post(
                &c,
                &url(&r, "/v1/flows/c/changes?wait=commit"),
                "application/x-ndjson",
                ndjson(&evs),
                None,
            )
            .await;
            assert_eq!(st, 200);
        }
        let maintain = |dry: bool| {
            let c = c.clone();
            let u = url(&r, &format!("/v1/flows/c/maintain?dry_run={dry}"));
            async move {
                let resp = c.post(u).send().await.unwrap();
                (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
            }
        };
        let (st, dry) = maintain(true).await;
        assert_eq!(st, 200, "{dry}");
        assert_eq!(dry["dry_run"], true);
        assert_eq!(dry["target"]["snapshots_expired"], 2, "{dry}");
        assert_eq!(dry["target_stats"]["snapshots"], 3, "{dry}");
        let (st, wet) = maintain(false).await;
        assert_eq!(st, 200, "{wet}");
        assert_eq!(wet["target"]["snapshots_expired"], 2, "{wet}");
        assert_eq!(wet["target_stats"]["snapshots"], 1, "{wet}");
        assert!(
            wet["target"]["manifest_lists_deleted"].as_u64().unwrap() >= 2,
            "{wet}"
        );
        let status = flow_status(&c, &r, "c").await;
        let m = &status["status"]["maintenance"];
        assert_eq!(m["runs"], 1, "{status}");
        assert_eq!(m["snapshots_expired_total"], 4, "{status}");
        assert!(m["bytes_deleted_total"].as_u64().unwrap() > 0, "{status}");
        let metrics = get_text(&c, &r, "/metrics").await;
        for line in [
            "autocdc_maintenance_runs_total{flow=\"c\"} 1",
            "autocdc_maintenance_last_ok{flow=\"c\"} 1",
            "autocdc_table_snapshots{flow=\"c\",table=\"target\"} 1",
        ] {
            assert!(metrics.contains(line), "no `{line}` in\n{metrics}");
        }
        let resp = c
            .post(url(&r, "/v1/flows/nope/maintain"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 404);
        r.stop().await.unwrap();
        assert_eq!(table(tmp.path(), "c").await, expected(&all));
    });
}

/// Compaction in the service: on the flow's `compaction.interval` between
/// commits (with nobody asking), and when asked through `/maintain`; the
/// status and `/metrics` count it and the table stays right.
#[test]
fn serve_compacts_on_the_flows_interval_and_when_asked() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = flow_cfg("k", "100ms");
    cfg.compaction = Some(autocdc::core::flow::CompactionConfig {
        min_input_files: Some(2),
        interval: Some("1s".into()),
        ..Default::default()
    });
    rt().block_on(async {
        let r = start(config(tmp.path(), vec![cfg])).await;
        let c = reqwest::Client::new();
        let mut all = Vec::new();
        for i in 0..4 {
            let evs = [u(i, "Leeds", 10 + i), u(100, "York", 10 + i)];
            all.extend(evs);
            let (st, _) = post(
                &c,
                &url(&r, "/v1/flows/k/changes?wait=commit"),
                "application/x-ndjson",
                ndjson(&evs),
                None,
            )
            .await;
            assert_eq!(st, 200);
        }
        // The scheduled run: within a few intervals.
        let mut compactions = 0;
        for _ in 0..100 {
            let status = flow_status(&c, &r, "k").await;
            compactions = status["status"]["maintenance"]["compactions"]
                .as_u64()
                .unwrap();
            if compactions > 0 {
                let m = &status["status"]["maintenance"];
                assert!(
                    m["compaction_files_rewritten_total"].as_u64().unwrap() >= 4,
                    "{status}"
                );
                assert!(
                    m["compaction_rows_moved_total"].as_u64().unwrap() >= 5,
                    "{status}"
                );
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        assert_eq!(compactions, 1, "no scheduled compaction");
        // Asked for: more commits, then the endpoint compacts them now.
        for i in 4..7 {
            let evs = [u(i, "Bath", 10 + i), u(100, "Ely", 10 + i)];
            all.extend(evs);
            let (st, _) = post(
                &c,
                &url(&r, "/v1/flows/k/changes?wait=commit"),
                "application/x-ndjson",
                ndjson(&evs),
                None,
            )
            .await;
            assert_eq!(st, 200);
        }
        let resp = c
            .post(url(&r, "/v1/flows/k/maintain"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        let report: Value = resp.json().await.unwrap();
        let comp = &report["compaction"];
        assert!(
            comp["data_files_rewritten"].as_u64().unwrap() >= 2,
            "{report}"
        );
        assert_eq!(comp["data_files_written"], 1, "{report}");
        assert_eq!(report["target_stats"]["data_files"], 1, "{report}");
        assert_eq!(report["target_stats"]["delete_files"], 0, "{report}");
        let metrics = get_text(&c, &r, "/metrics").await;
        assert!(
            metrics.contains("autocdc_compactions_total{flow=\"k\"} 2"),
            "{metrics}"
        );
        r.stop().await.unwrap();
        assert_eq!(table(tmp.path(), "k").await, expected(&all));
    });
}

/// Issue 49: `/metrics` follows Prometheus's conventions: every family has
/// `# HELP` and `# TYPE` and every sample a family; durations are seconds
/// (no `_ms` family); requests are counted per route template, method and
/// status, with a duration histogram per route; and the `process_*`
/// family is there.
#[test]
fn metrics_follow_prometheus_conventions() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let r = start(config(tmp.path(), vec![flow_cfg("h", "1h")])).await;
        let c = reqwest::Client::new();
        let changes = url(&r, "/v1/flows/h/changes");
        for (i, body) in [
            ndjson(&[u(1, "Leeds", 1)]),
            ndjson(&[u(2, "York", 2)]),
            "not json".to_string(),
        ]
        .into_iter()
        .enumerate()
        {
            let want = if i < 2 { 202 } else { 400 };
            let (s, v) = post(&c, &changes, "application/x-ndjson", body, None).await;
            assert_eq!(s, want, "{v}");
        }
        let (s, v) = post(
            &c,
            &format!("{changes}?wait=commit"),
            "application/x-ndjson",
            ndjson(&[u(3, "Bath", 3)]),
            None,
        )
        .await;
        assert_eq!(s, 200, "{v}");
        let metrics = get_text(&c, &r, "/metrics").await;
        let mut typed = std::collections::HashSet::new();
        let mut help = None;
        for line in metrics.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                help = rest.split(' ').next();
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let name = rest.split(' ').next().unwrap();
                assert_eq!(help, Some(name), "# TYPE {name} without its # HELP");
                assert!(!name.ends_with("_ms"), "{name}: durations are seconds");
                typed.insert(name);
            } else {
                let name = line.split(['{', ' ']).next().unwrap();
                let family = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s).filter(|f| typed.contains(f)))
                    .unwrap_or(name);
                assert!(typed.contains(family), "sample {line} has no # TYPE");
            }
        }
        for want in [
            "autocdc_http_requests_total{route=\"/v1/flows/{flow}/changes\",method=\"POST\",status=\"202\"} 2",
            "autocdc_http_requests_total{route=\"/v1/flows/{flow}/changes\",method=\"POST\",status=\"400\"} 1",
            "autocdc_http_requests_total{route=\"/v1/flows/{flow}/changes\",method=\"POST\",status=\"200\"} 1",
            "autocdc_http_request_duration_seconds_count{route=\"/v1/flows/{flow}/changes\"} 4",
            "autocdc_commit_duration_seconds_bucket{flow=\"h\",le=\"+Inf\"} 1",
            "# TYPE process_cpu_seconds_total counter",
        ] {
            assert!(metrics.contains(want), "no `{want}` in\n{metrics}");
        }
        let rss: f64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
            .expect("process_resident_memory_bytes")
            .parse()
            .unwrap();
        assert!(rss > 1e6, "{rss}");
        r.stop().await.unwrap();
    });
}
