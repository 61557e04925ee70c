//! Flows defined over HTTP: created, evolved, with and without
//! `add_columns`, and kept across a restart.

use crate::common;

use std::collections::BTreeSet;
use std::sync::Arc;

use autocdc::service::run;
use common::http::*;
use common::*;
use serde_json::{Value, json};

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
