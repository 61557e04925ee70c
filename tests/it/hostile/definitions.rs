//! Flow definitions and tokens that are refused and change nothing.

use serde_json::{Value, json};

use super::still_serving;
use crate::common;
use common::http::*;
use common::*;

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
