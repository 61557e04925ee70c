//! `from_snapshot` and SCD Type 2 flows over HTTP.

use crate::common;

use autocdc::core::flow::FlowConfig;
use common::http::*;
use common::*;

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
