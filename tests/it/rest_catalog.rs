//! The Iceberg REST catalog on a real server (SeaweedFS's, started by
//! `integration/backends.sh up weed`, which `scripts/test` runs), with OAuth2
//! client credentials and the table files on its S3 store: random batchings
//! with restarts give the oracle, a commit from a stale base gets the
//! server's 409, and misconfigurations name the setting and the answer.

use crate::common;

use std::sync::Arc;

use autocdc::config::RestConfig;
use autocdc::table::catalog::Catalog;
use autocdc::table::catalog::rest::RestCatalog;
use common::*;

fn rest(cfg: &RestConfig) -> Arc<dyn Catalog> {
    Arc::new(RestCatalog::new(cfg).unwrap())
}

#[test]
fn random_batchings_through_the_rest_catalog_match_the_oracle() {
    // Each case a table of its own; each restart a new client and a new token.
    random_batchings_match_the_oracle(4, || (flow_in(&unique("prop")), || rest(&rest_config())));
}

#[test]
fn a_commit_from_a_stale_base_gets_the_servers_conflict() {
    rt().block_on(async {
        let cat = rest(&rest_config());
        let flow = flow_in(&unique("cas"));
        let mut engine = open_engine(&cat, &flow).await;
        let before = engine.target().clone();
        engine
            .apply(&batch(&flow, &[u(1, "Leeds", 1)]), 1)
            .await
            .unwrap();
        let after = engine.target().clone();
        // The catalog's own view names the metadata file we committed.
        let loaded = cat.load_table(&flow.target).await.unwrap().unwrap();
        assert_eq!(loaded.metadata_location, after.metadata_location);
        assert_eq!(
            loaded.metadata.current_snapshot_id(),
            after.metadata.current_snapshot_id()
        );
        assert!(loaded.metadata_location.starts_with("s3://"));
        // A second snapshot built on `before` must be refused by the server.
        let stale = autocdc::table::row_delta::produce(
            cat.file_io(),
            &before,
            autocdc::table::row_delta::RowDelta {
                data: Vec::new(),
                deletes: Vec::new(),
                base_snapshot: before.metadata.current_snapshot_id(),
                replace: false,
                properties: Default::default(),
                now_ms: 1,
                rewrite: None,
            },
        )
        .await
        .unwrap();
        let e = cat
            .commit(&before, stale.updates, stale.requirements)
            .await
            .unwrap_err();
        assert_eq!(e.code(), "AUTOCDC_COMMIT_CONFLICT", "{e}");
        let now = cat.load_table(&flow.target).await.unwrap().unwrap();
        assert_eq!(now.metadata_location, after.metadata_location);
        // The table goes on from the committed state on a new client.
        let mut engine = open_engine(&rest(&rest_config()), &flow).await;
        engine
            .apply(
                &batch(&flow, &[u(1, "York", 2), d(1, 3), u(2, "Bath", 1)]),
                2,
            )
            .await
            .unwrap();
        assert_eq!(table_rows(&engine).await, rows(&[&["2", "Bath", "1"]]));
        assert!(cat.drop_table(&flow.target).await.unwrap());
        assert!(cat.load_table(&flow.target).await.unwrap().is_none());
    });
}

async fn open_error(cfg: &RestConfig) -> String {
    let flow = flow_in(&unique("bad"));
    match autocdc::table::engine::Engine::open(
        flow,
        rest(cfg),
        Arc::new(autocdc::fault::Faults::default()),
    )
    .await
    {
        Ok(_) => panic!("opened with a bad configuration: {cfg:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn rest_misconfigurations_name_the_setting_and_the_servers_answer() {
    rt().block_on(async {
        let good = rest_config();
        let e = open_error(&RestConfig {
            credential: Some("admin:wrong".into()),
            ..good.clone()
        })
        .await;
        assert!(e.contains("catalog.credential"), "{e}");
        assert!(!e.contains("admin:wrong"), "the secret leaked: {e}");

        let e = open_error(&RestConfig {
            warehouse: Some("no-such-warehouse".into()),
            ..good.clone()
        })
        .await;
        assert!(e.contains("catalog.warehouse `no-such-warehouse`"), "{e}");

        let e = open_error(&RestConfig {
            uri: "http://127.0.0.1:1".into(),
            ..good.clone()
        })
        .await;
        assert!(e.contains("http://127.0.0.1:1"), "{e}");

        let e = RestCatalog::new(&RestConfig {
            credential: Some("no-colon".into()),
            ..good.clone()
        })
        .unwrap_err();
        assert!(e.to_string().contains("client_id:client_secret"), "{e}");
        // Secrets never show in Debug output.
        let shown = format!("{good:?}");
        assert!(!shown.contains("adminsecret"), "{shown}");
    });
}
