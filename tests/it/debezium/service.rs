//! `autocdc serve` taking Debezium events: `POST /v1/debezium` routing
//! every table to its flow and skipping the rest, events refused (not
//! dropped) while the flows recover, hostile events refused with their
//! index and nothing applied, and new source columns.

use super::*;

/// A second flow of orders, routed by its table.
const ORDERS: &str = r#"
name = "orders"
target = "crm.orders"
keys = ["order_id"]
format = "debezium"
source_table = "public.orders"
commit_interval = "1h"
columns = [
  { name = "order_id", type = "long", required = true },
  { name = "placed", type = "date" },
  { name = "at", type = "timestamp" },
]
"#;

fn order_event(op: &str, id: i64, days: i64, micros: i64, lsn: u64) -> Value {
    let row = json!({"order_id": id, "placed": days, "at": micros});
    json!({"schema": {"type": "struct", "fields": [
        {"type": "struct", "field": "after", "fields": [
            {"type": "int64", "field": "order_id"},
            {"type": "int32", "field": "placed", "name": "io.debezium.time.Date"},
            {"type": "int64", "field": "at", "name": "io.debezium.time.MicroTimestamp"}
        ]},
        {"type": "struct", "field": "before", "fields": [
            {"type": "int64", "field": "order_id"}
        ]}
    ]}, "payload": {
        "before": if op == "d" { json!({"order_id": id}) } else { Value::Null },
        "after": if op == "d" { Value::Null } else { row },
        "source": {"connector": "postgresql", "schema": "public", "table": "orders",
                   "sequence": json!([null, lsn.to_string()]).to_string(), "lsn": lsn},
        "op": op
    }})
}

fn serve_config(dir: &std::path::Path) -> autocdc::config::Config {
    let mut customers = customers_cfg();
    customers.commit_interval = Some("1h".into());
    config(dir, vec![customers, toml::from_str(ORDERS).unwrap()])
}

/// Flows' logs that open only when `go` says so: the service stays
/// recovering (listening, not ready) until then.
struct HeldLogs {
    inner: autocdc::service::wal::LocalLogs,
    go: tokio::sync::watch::Receiver<bool>,
}

#[async_trait::async_trait]
impl autocdc::service::wal::LogFactory for HeldLogs {
    async fn identity(&self, flow: &str, recorded: &[String]) -> autocdc::Result<String> {
        self.inner.identity(flow, recorded).await
    }
    async fn open(
        &self,
        flow: &str,
        committed: i64,
        max_bytes: u64,
    ) -> autocdc::Result<std::sync::Arc<dyn autocdc::service::wal::IngestLog>> {
        let _ = self.go.clone().wait_for(|g| *g).await;
        self.inner.open(flow, committed, max_bytes).await
    }
}

/// Regression: while the flows recover, `/v1/debezium` answered 202 and
/// skipped every event as "a table no flow takes" (the flows were not
/// back yet), so the sink dropped them. It answers 503 until they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_sent_while_the_flows_recover_are_refused_not_dropped() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = serve_config(tmp.path());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    cfg.server.listen = format!("127.0.0.1:{port}");
    let faults = std::sync::Arc::new(autocdc::fault::Faults::default());
    let (go, held) = tokio::sync::watch::channel(false);
    let logs = std::sync::Arc::new(HeldLogs {
        inner: autocdc::service::wal::LocalLogs::new(tmp.path().join("data/flows"), faults.clone()),
        go: held,
    });
    let starting = tokio::spawn(autocdc::service::run::start_with_logs(cfg, faults, logs));
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let event = pg_event("customers", "c", 1, Some(&("Ann".into(), 1)), None, 10);
    let body = json!([event]).to_string();
    let mut answered = None;
    for _ in 0..200 {
        match client
            .post(format!("{base}/v1/debezium"))
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
        {
            Ok(r) => {
                let s = r.status().as_u16();
                answered = Some((s, r.json::<Value>().await.unwrap_or_default()));
                break;
            }
            // Not listening yet.
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
        }
    }
    let (s, v) = answered.expect("the service listens while it recovers");
    assert_eq!(s, 503, "{v}");
    assert_eq!(v["error"]["code"], codes::UNAVAILABLE, "{v}");
    go.send(true).unwrap();
    let r = starting.await.unwrap().unwrap();
    let (s, v) = post(
        &client,
        &url(&r, "/v1/debezium"),
        "application/json",
        body,
        None,
    )
    .await;
    assert_eq!(
        (s, v["flows"]["customers"]["accepted"].as_u64()),
        (202, Some(1)),
        "{v}"
    );
    commit(&client, &r, "customers").await;
    r.stop().await.unwrap();
    assert_eq!(
        table(tmp.path(), "customers").await,
        common::rows(&[&["1", "Ann", "0.01"]])
    );
}

/// Debezium Server's HTTP sink: one URL for every table, a JSON array per
/// batch, `webhook-id` stable across retries; what no flow takes is
/// skipped and counted, never refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_endpoint_routes_every_table_and_skips_the_rest() {
    let tmp = tempfile::tempdir().unwrap();
    let r = start(serve_config(tmp.path())).await;
    let client = reqwest::Client::new();
    let body = json!([
        pg_event("customers", "c", 1, Some(&("Ann".into(), 1250)), None, 10),
        order_event("c", 7, 19_000, 1_700_000_000_123_456, 11),
        Value::Null,
        {"schema": {"name": "io.debezium.connector.common.Heartbeat"}, "payload": {"ts_ms": 5}},
        {"status": "BEGIN", "id": "571:53195832", "event_count": null},
        pg_event("invoices", "c", 3, Some(&("x".into(), 1)), None, 12),
        {"op": "m", "source": {"connector": "postgresql"}, "message": {"prefix": "p"}},
        pg_event("customers", "u", 1, Some(&("Ann B".into(), -5)), Some(12), 14),
        pg_event("customers", "c", 2, Some(&("Bo".into(), 0)), Some(12), 15),
        order_event("c", 8, 19_001, 0, 16),
        order_event("d", 7, 0, 0, 17),
    ]);
    let send = |key: &'static str| {
        client
            .post(url(&r, "/v1/debezium"))
            .header("content-type", "application/json")
            .header("webhook-id", key)
            .body(body.to_string())
            .send()
    };
    let resp = send("msg_1").await.unwrap();
    assert_eq!(resp.status().as_u16(), 202);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["flows"]["customers"]["accepted"], 3, "{v}");
    assert_eq!(v["flows"]["orders"]["accepted"], 3, "{v}");
    assert_eq!(v["skipped"]["tombstones"], 1, "{v}");
    assert_eq!(v["skipped"]["not_changes"], 2, "{v}");
    assert_eq!(v["skipped"]["messages"], 1, "{v}");
    assert_eq!(v["skipped"]["other_tables"], 1, "{v}");
    // The sink's retry of the same request: applied once.
    let again: Value = send("msg_1").await.unwrap().json().await.unwrap();
    assert_eq!(again["flows"]["customers"]["duplicate"], true, "{again}");
    assert_eq!(
        again["flows"]["customers"]["offset"],
        v["flows"]["customers"]["offset"]
    );
    for f in ["customers", "orders"] {
        commit(&client, &r, f).await;
    }
    let metrics = get_text(&client, &r, "/metrics").await;
    assert!(
        metrics.contains("autocdc_debezium_skipped_total{reason=\"other_table\"} 2"),
        "{metrics}"
    );
    r.stop().await.unwrap();
    let rows = |v: &[&[&str]]| common::rows(v);
    assert_eq!(
        table(tmp.path(), "customers").await,
        rows(&[&["1", "Ann B", "-0.05"], &["2", "Bo", "0.00"]])
    );
    assert_eq!(
        table(tmp.path(), "orders").await,
        rows(&[&["8", "2022-01-09", "1970-01-01T00:00:00"]])
    );
}

/// A bad element refuses the whole body with its index, nothing of it is
/// applied, and the service goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_events_are_refused_with_their_index_and_nothing_applies() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = serve_config(tmp.path());
    cfg.server.max_rows_per_request = 50;
    let r = start(cfg).await;
    let client = reqwest::Client::new();
    let good = pg_event("customers", "c", 1, Some(&("Ann".into(), 1)), None, 10);
    let mut no_key = pg_event("customers", "d", 2, None, None, 11);
    no_key["payload"]["before"] = Value::Null;
    let mut too_wide = pg_event("customers", "c", 3, Some(&("x".into(), 1)), None, 12);
    too_wide["payload"]["after"]["balance"] = json!(b64_cents(i64::MAX / 2));
    let mut no_source = good.clone();
    no_source["payload"]
        .as_object_mut()
        .unwrap()
        .remove("source");
    let mut mongo = good.clone();
    mongo["payload"]["source"]["connector"] = json!("mongodb");
    let cases: Vec<(Value, u16, &str, &str)> = vec![
        (
            json!({"hello": "world"}),
            400,
            codes::DEBEZIUM_EVENT,
            "no `op`",
        ),
        (
            json!({"__op": "c", "id": 1}),
            400,
            codes::DEBEZIUM_EVENT,
            "ExtractNewRecordState",
        ),
        (
            json!({"op": "x", "source": {}}),
            400,
            codes::DEBEZIUM_EVENT,
            "op",
        ),
        (no_source, 400, codes::DEBEZIUM_EVENT, "source"),
        (mongo, 400, codes::DEBEZIUM_EVENT, "mongodb"),
        (no_key, 422, codes::DEBEZIUM_NO_KEY, "REPLICA IDENTITY"),
        (too_wide, 400, codes::BAD_COLUMN, "balance"),
        (json!(17), 400, codes::DEBEZIUM_EVENT, "a number"),
    ];
    for (bad, status, code, says) in cases {
        let body = json!([good.clone(), bad]).to_string();
        let (s, v) = post(
            &client,
            &url(&r, "/v1/debezium"),
            "application/json",
            body,
            None,
        )
        .await;
        assert_eq!(s, status, "{v}");
        assert_eq!(v["error"]["code"], code, "{v}");
        let text = v.to_string();
        assert!(text.contains(says), "{says}: {v}");
        assert_eq!(v["error"]["row"], 1, "the event's index: {v}");
    }
    // Over max_rows_per_request.
    let many = Value::Array(vec![good.clone(); 51]).to_string();
    let (s, v) = post(
        &client,
        &url(&r, "/v1/debezium"),
        "application/json",
        many,
        None,
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (400, Some(codes::BATCH_TOO_LARGE)),
        "{v}"
    );
    let (s, v) = post(
        &client,
        &url(&r, "/v1/debezium"),
        "application/json",
        "[{\"op\":",
        None,
    )
    .await;
    assert_eq!(s, 400, "{v}");
    // Nothing was logged, and the service still takes good events.
    let status = flow_status(&client, &r, "customers").await;
    assert_eq!(status["status"]["accepted_batches"], 0, "{status}");
    let (s, v) = post(
        &client,
        &url(&r, "/v1/debezium"),
        "application/x-ndjson",
        good.to_string(),
        None,
    )
    .await;
    assert_eq!(s, 202, "{v}");
    // The flow's own endpoint takes its events too.
    let (s, v) = post(
        &client,
        &url(&r, "/v1/flows/customers/changes"),
        "application/json",
        pg_event(
            "customers",
            "u",
            1,
            Some(&("Ann 2".into(), 1)),
            Some(10),
            20,
        )
        .to_string(),
        None,
    )
    .await;
    assert_eq!((s, v["accepted"].as_u64()), (202, Some(1)), "{v}");
    commit(&client, &r, "customers").await;
    r.stop().await.unwrap();
    assert_eq!(
        table(tmp.path(), "customers").await,
        common::rows(&[&["1", "Ann 2", "0.01"]])
    );
}

/// `schema_evolution = "add_columns"` (plain rows): a new field that is
/// null in every row of a push is accepted (not added yet), as
/// docs/schema-changes.md says; after `ALTER TABLE ... ADD COLUMN` every
/// event carries it so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_field_null_in_every_row_is_accepted_by_add_columns() {
    let tmp = tempfile::tempdir().unwrap();
    let mut f = flow_cfg("people", "1h");
    f.schema_evolution = autocdc::core::flow::SchemaEvolution::AddColumns;
    let r = start(config(tmp.path(), vec![f])).await;
    let client = reqwest::Client::new();
    let body = "{\"id\": 1, \"op\": \"UPSERT\", \"city\": \"Leeds\", \"seq\": 1, \"tier\": null}";
    let (s, v) = post(
        &client,
        &url(&r, "/v1/flows/people/changes"),
        "application/x-ndjson",
        body,
        None,
    )
    .await;
    assert_eq!(s, 202, "{v}");
    let status = flow_status(&client, &r, "people").await;
    assert_eq!(
        status["definition"]["columns"].as_array().unwrap().len(),
        4,
        "{status}"
    );
    r.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debezium_flow_adds_a_new_source_column_with_its_schema_type() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = customers_cfg();
    c.commit_interval = Some("1h".into());
    c.schema_evolution = autocdc::core::flow::SchemaEvolution::AddColumns;
    let r = start(config(tmp.path(), vec![c])).await;
    let client = reqwest::Client::new();
    let mut e = pg_event("customers", "c", 1, Some(&("Ann".into(), 1)), None, 10);
    e["payload"]["after"]["tier"] = Value::Null;
    e["schema"]["fields"][1]["fields"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "int64", "optional": true, "field": "tier"}));
    let (s, v) = post(
        &client,
        &url(&r, "/v1/debezium"),
        "application/json",
        e.to_string(),
        None,
    )
    .await;
    assert_eq!(s, 202, "{v}");
    let status = flow_status(&client, &r, "customers").await;
    let cols = status["definition"]["columns"].as_array().unwrap();
    assert_eq!(cols.last().unwrap()["name"], "tier", "{status}");
    assert_eq!(cols.last().unwrap()["type"], "long", "{status}");
    commit(&client, &r, "customers").await;
    r.stop().await.unwrap();
    assert_eq!(
        table(tmp.path(), "customers").await,
        common::rows(&[&["1", "Ann", "0.01", "NULL"]])
    );
}

/// Writes `body` to `path` with `Transfer-Encoding: chunked`, in chunks
/// of the sizes `sizes` cycles through (flushed one by one, so the server
/// reads them apart); the status line and the answer's body.
async fn post_in_chunks(
    r: &autocdc::service::run::Running,
    path: &str,
    body: &[u8],
    sizes: &[usize],
) -> (String, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(r.addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let (mut at, mut n) = (0, 0);
    while at < body.len() {
        let end = (at + sizes[n % sizes.len()]).min(body.len());
        let mut chunk = format!("{:x}\r\n", end - at).into_bytes();
        chunk.extend_from_slice(&body[at..end]);
        chunk.extend_from_slice(b"\r\n");
        if s.write_all(&chunk).await.is_err() {
            break; // refused before the end: the answer says why
        }
        s.flush().await.unwrap();
        tokio::task::yield_now().await;
        (at, n) = (end, n + 1);
    }
    let _ = s.write_all(b"0\r\n\r\n").await;
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer).to_string();
    let status = answer.lines().next().unwrap_or_default().to_string();
    let json = answer
        .find("\r\n\r\n")
        .and_then(|i| serde_json::from_str(&answer[i + 4..]).ok())
        .unwrap_or(Value::Null);
    (status, json)
}

/// The body is read in the chunks it arrives in (never copied into one
/// buffer): events cut anywhere by chunks of every size, big and small,
/// read as they would whole; a chunked body over `max_body_bytes` is 413
/// with its code, however it is cut, here and on a flow's `changes` (where
/// axum's own refusal was plain text, without a code).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_in_chunks_of_any_size_reads_whole_and_over_the_limit_is_413() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = serve_config(tmp.path());
    cfg.server.max_body_bytes = 512 * 1024;
    let r = start(cfg).await;
    let client = reqwest::Client::new();
    let mut events: Vec<Value> = (1..=300)
        .map(|id| order_event("c", id, 19_000 + id, 0, 100 + id as u64))
        .collect();
    events.push(order_event("d", 7, 0, 0, 1_000));
    let body = Value::Array(events).to_string();
    assert!(body.len() > 100_000 && body.len() < 512 * 1024);
    let (status, v) = post_in_chunks(
        &r,
        "/v1/debezium",
        body.as_bytes(),
        &[1, 20_000, 3, 777, 17_000, 5],
    )
    .await;
    assert!(status.contains(" 202 "), "{status} {v}");
    assert_eq!(v["flows"]["orders"]["accepted"], 301, "{v}");
    commit(&client, &r, "orders").await;
    // Over the limit: refused as it arrives, with the code.
    let big = format!("[{}]", [body.as_str(); 8].join(","));
    for path in ["/v1/debezium", "/v1/flows/orders/changes"] {
        let (status, v) = post_in_chunks(&r, path, big.as_bytes(), &[9_000, 40_000]).await;
        assert!(status.contains(" 413 "), "{path}: {status} {v}");
        assert_eq!(v["error"]["code"], "AUTOCDC_BODY_TOO_LARGE", "{path}: {v}");
    }
    r.stop().await.unwrap();
    let t = table(tmp.path(), "orders").await;
    assert_eq!(t.len(), 299);
    assert!(!t.iter().any(|row| row[0] == "7"));
}
