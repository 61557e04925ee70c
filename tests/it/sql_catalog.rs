//! The SQL catalog on a real PostgreSQL (started by `integration/backends.sh
//! up pg`, which `scripts/test` runs): random batchings with restarts give
//! the oracle, the row in `iceberg_tables` follows each commit, and a commit
//! from a stale base loses the compare-and-swap.

use crate::common;

use std::sync::Arc;

use autocdc::fault::Faults;
use autocdc::table::catalog::Catalog;
use autocdc::table::catalog::sql::SqlCatalog;
use autocdc::table::engine::Engine;
use common::*;

fn postgres_url() -> String {
    backend_env("AUTOCDC_TEST_POSTGRES_URL")
}

fn catalog(name: &str, dir: &std::path::Path) -> Arc<dyn Catalog> {
    Arc::new(
        SqlCatalog::new(
            &postgres_url(),
            name,
            dir.to_str().unwrap(),
            None,
            Arc::new(Faults::default()),
        )
        .unwrap(),
    )
}

#[test]
fn random_batchings_through_the_sql_catalog_match_the_oracle() {
    // Each case its own catalog name; each restart a new connection pool.
    random_batchings_match_the_oracle(8, || {
        let tmp = tempfile::tempdir().unwrap();
        let name = unique("prop");
        (customers(), move || catalog(&name, tmp.path()))
    });
}

#[test]
fn the_catalog_row_follows_commits_and_a_stale_base_loses() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let name = unique("cas");
        let cat = catalog(&name, tmp.path());
        let flow = customers();
        let mut engine = open_engine(&cat, &flow).await;
        let before = engine.target().clone();
        engine
            .apply(&batch(&flow, &[u(1, "Leeds", 1)]), 1)
            .await
            .unwrap();
        let after = engine.target().clone();
        assert_ne!(before.metadata_location, after.metadata_location);
        assert!(after.metadata_location.ends_with(".metadata.json"));
        // The row Java's JdbcCatalog reads.
        let pool = sqlx::PgPool::connect(&postgres_url()).await.unwrap();
        let (loc, prev): (String, Option<String>) = sqlx::query_as(
            "SELECT metadata_location, previous_metadata_location FROM iceberg_tables
             WHERE catalog_name = $1 AND table_namespace = 'crm' AND table_name = 'customers'",
        )
        .bind(&name)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(loc, after.metadata_location);
        assert_eq!(prev.as_deref(), Some(before.metadata_location.as_str()));
        // A writer still on `before` loses the compare-and-swap; nothing changes.
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
        // Reopened on a new pool, the engine continues from the committed state.
        let mut engine = open_engine(&catalog(&name, tmp.path()), &flow).await;
        engine
            .apply(&batch(&flow, &[u(1, "York", 2), u(2, "Bath", 1)]), 2)
            .await
            .unwrap();
        assert_eq!(
            table_rows(&engine).await,
            rows(&[&["1", "York", "2"], &["2", "Bath", "1"]])
        );
    });
}

#[test]
fn an_unreachable_database_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let cat: Arc<dyn Catalog> = Arc::new(
            SqlCatalog::new(
                "postgres://app:secret@127.0.0.1:1/none",
                "x",
                tmp.path().to_str().unwrap(),
                None,
                Arc::new(Faults::default()),
            )
            .unwrap(),
        );
        let e = Engine::open(customers(), cat, Arc::new(Faults::default()))
            .await
            .err()
            .unwrap();
        let msg = e.to_string();
        assert!(msg.contains("catalog.uri") && msg.contains("***"), "{msg}");
        assert!(!msg.contains("secret"), "{msg}");
    });
}
