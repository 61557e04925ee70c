//! Tables on an S3-compatible store (SeaweedFS, started by
//! `integration/backends.sh up weed`, which `scripts/test` runs): the Hadoop
//! catalog on S3 (its commit point is a conditional PUT), the SQL catalog with
//! its warehouse on S3, and misconfigurations that must stop with a message
//! naming the setting and the store's answer.

use crate::common;

use std::sync::Arc;

use autocdc::config::S3Config;
use autocdc::fault::Faults;
use autocdc::table::catalog::Catalog;
use autocdc::table::catalog::hadoop::HadoopCatalog;
use autocdc::table::catalog::sql::SqlCatalog;
use common::*;

fn hadoop_s3(warehouse: &str, s3: &S3Config) -> Arc<dyn Catalog> {
    Arc::new(HadoopCatalog::new(warehouse, Some(s3), Arc::new(Faults::default())).unwrap())
}

#[test]
fn random_batchings_into_a_hadoop_table_on_s3_match_the_oracle() {
    random_batchings_match_the_oracle(6, || {
        let warehouse = s3_warehouse("prop");
        (customers(), move || hadoop_s3(&warehouse, &s3_config()))
    });
}

#[test]
fn the_hadoop_commit_on_s3_is_a_conditional_put_that_a_stale_writer_loses() {
    rt().block_on(async {
        let warehouse = s3_warehouse("cas");
        let cat = hadoop_s3(&warehouse, &s3_config());
        let flow = customers();
        let mut engine = open_engine(&cat, &flow).await;
        let before = engine.target().clone();
        engine
            .apply(&batch(&flow, &[u(1, "Leeds", 1)]), 1)
            .await
            .unwrap();
        let after = engine.target().clone();
        assert!(after.metadata_location.starts_with(&warehouse));
        assert!(
            after
                .metadata_location
                .ends_with("/metadata/v2.metadata.json")
        );
        // A writer still on `before` tries to create v2 as well and loses.
        let e = cat
            .commit(
                &before,
                vec![iceberg::TableUpdate::SetProperties {
                    updates: [("x".to_string(), "y".to_string())].into(),
                }],
                vec![],
            )
            .await
            .unwrap_err();
        assert_eq!(e.code(), "AUTOCDC_COMMIT_CONFLICT", "{e}");
        let now = cat.load_table(&flow.target).await.unwrap().unwrap();
        assert_eq!(now.metadata_location, after.metadata_location);
        assert!(now.metadata.properties().get("x").is_none());
        // Data and delete files are in the bucket, under the table.
        let data = now.metadata.current_snapshot().unwrap();
        assert!(
            data.manifest_list().starts_with(&warehouse),
            "{}",
            data.manifest_list()
        );
        // Updating the row writes a position delete on S3 and reads back.
        engine
            .apply(&batch(&flow, &[u(1, "York", 2), u(2, "Bath", 1)]), 2)
            .await
            .unwrap();
        let engine = open_engine(&hadoop_s3(&warehouse, &s3_config()), &flow).await;
        assert_eq!(
            table_rows(&engine).await,
            rows(&[&["1", "York", "2"], &["2", "Bath", "1"]])
        );
    });
}

#[test]
fn the_sql_catalog_keeps_its_warehouse_on_s3() {
    rt().block_on(async {
        let warehouse = s3_warehouse("sql");
        let name = unique("s3");
        let catalog = || -> Arc<dyn Catalog> {
            Arc::new(
                SqlCatalog::new(
                    &backend_env("AUTOCDC_TEST_POSTGRES_URL"),
                    &name,
                    &warehouse,
                    Some(&s3_config()),
                    Arc::new(Faults::default()),
                )
                .unwrap(),
            )
        };
        let flow = customers();
        let mut engine = open_engine(&catalog(), &flow).await;
        engine
            .apply(&batch(&flow, &[u(1, "Leeds", 1), u(2, "York", 1)]), 1)
            .await
            .unwrap();
        let mut engine = open_engine(&catalog(), &flow).await;
        engine
            .apply(
                &batch(&flow, &[d(1, 2), u(2, "Bath", 3), u(1, "Leeds", 0)]),
                2,
            )
            .await
            .unwrap();
        assert!(engine.target().metadata_location.starts_with(&warehouse));
        let engine = open_engine(&catalog(), &flow).await;
        assert_eq!(table_rows(&engine).await, rows(&[&["2", "Bath", "3"]]));
    });
}

async fn open_error(warehouse: &str, s3: &S3Config) -> String {
    let flow = customers();
    match autocdc::table::engine::Engine::open(
        flow,
        hadoop_s3(warehouse, s3),
        Arc::new(Faults::default()),
    )
    .await
    {
        Ok(_) => panic!("{warehouse} opened with a bad configuration"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn s3_misconfigurations_stop_with_the_setting_and_the_stores_answer() {
    rt().block_on(async {
        let good = s3_config();
        let warehouse = s3_warehouse("misconfig");

        let wrong_secret = S3Config {
            secret_access_key: Some("not-the-secret".into()),
            ..good.clone()
        };
        let e = open_error(&warehouse, &wrong_secret).await;
        assert!(e.contains(&warehouse) && e.contains("not usable"), "{e}");
        assert!(
            e.contains("SignatureDoesNotMatch") || e.contains("InvalidAccessKeyId"),
            "{e}"
        );

        let e = open_error("s3://no-such-bucket-autocdc/x", &good).await;
        assert!(e.contains("s3://no-such-bucket-autocdc/x"), "{e}");
        assert!(e.contains("NoSuchBucket"), "{e}");

        let unreachable = S3Config {
            endpoint: Some("http://127.0.0.1:1".into()),
            ..good.clone()
        };
        let e = open_error(&warehouse, &unreachable).await;
        assert!(
            e.contains(&warehouse) && e.contains("http://127.0.0.1:1"),
            "{e}"
        );
        assert!(e.to_lowercase().contains("connect"), "{e}");

        // A local path with [catalog.s3] set is a configuration mistake, not a silent local write.
        let e = HadoopCatalog::new("./wh", Some(&good), Arc::new(Faults::default())).unwrap_err();
        assert!(e.to_string().contains("[catalog.s3]"), "{e}");
    });
}

/// Maintenance on S3: expiry deletes the expired snapshots' manifest lists
/// from the bucket, old metadata.json files go after each commit, and
/// orphan cleanup deletes an unreferenced object older than the window and
/// keeps a younger one; the table still equals the oracle.
#[test]
fn maintenance_on_s3_expires_and_cleans_orphans() {
    use autocdc::table::engine::MaintainOptions;
    rt().block_on(async {
        let warehouse = s3_warehouse("maint");
        let s3 = s3_config();
        let cat = hadoop_s3(&warehouse, &s3);
        let mut cfg = customers_config();
        cfg.snapshot_max_age = Some("1ms".into());
        cfg.min_snapshots_to_keep = Some(2);
        cfg.table_properties = [(
            "write.metadata.previous-versions-max".to_string(),
            "3".to_string(),
        )]
        .into();
        let flow = autocdc::core::flow::Flow::new(cfg).unwrap();
        let mut engine = open_engine(&cat, &flow).await;
        let mut batches = Vec::new();
        for i in 0..8 {
            let b = batch(&flow, &[u(i % 3, "Leeds", i), u(10 + i, "York", i)]);
            engine.apply(&b, i).await.unwrap();
            batches.push(b);
        }
        let storage = cat.storage().unwrap();
        let location = engine.target().location().to_string();
        let listed = storage.list_files(&location).await.unwrap();
        let metadata_files = listed
            .iter()
            .filter(|f| f.location.ends_with(".metadata.json"))
            .count();
        assert!(
            metadata_files <= 4,
            "{metadata_files} metadata.json objects kept"
        );
        let stray = format!("{location}/data/stray.parquet");
        storage
            .put(&stray, bytes::Bytes::from_static(b"x"))
            .await
            .unwrap();
        // S3 listings may give modification times to the second, so the
        // window (2 s) leaves a whole second of margin on either side.
        tokio::time::sleep(std::time::Duration::from_millis(3100)).await;
        let young = format!("{location}/data/young.parquet");
        storage
            .put(&young, bytes::Bytes::from_static(b"y"))
            .await
            .unwrap();
        let report = engine
            .maintain(&MaintainOptions {
                now_ms: autocdc::service::now_ms(),
                dry_run: false,
                orphans_older_than: Some(std::time::Duration::from_secs(2)),
                compact: false,
            })
            .await
            .unwrap();
        assert_eq!(report.target.snapshots_expired, 6, "{report:?}");
        assert!(report.target.manifest_lists_deleted >= 6, "{report:?}");
        assert!(report.target.orphans_deleted >= 1, "{report:?}");
        assert!(!storage.exists(&stray).await.unwrap());
        assert!(storage.exists(&young).await.unwrap());
        let fresh = open_engine(&hadoop_s3(&warehouse, &s3), &flow).await;
        assert_eq!(table_rows(&fresh).await, oracle(&flow, &batches));
    });
}
