//! Requests over HTTP: every content type, every refusal with its status,
//! code, row and column, tokens, idempotent retries, concurrent clients,
//! `push`, the OpenAPI document and the metrics.

use crate::common;

use std::collections::BTreeSet;

use autocdc::config::TokenConfig;
use common::http::*;
use common::*;
use serde_json::Value;

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
