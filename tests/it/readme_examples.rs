//! The worked examples of docs/history.md ("History, partial updates and
//! truncates"): each flow of `examples/flows.toml` applied to its files (one
//! batch each, a restart between them, as `autocdc apply` does) gives the
//! rows docs/history.md shows; and the example of docs/schema-changes.md.

use crate::common;

use std::path::Path;

use autocdc::config::{CatalogConfig, Config};
use common::*;

/// `examples/flows.toml` with its warehouse in `tmp`.
fn examples_config(tmp: &tempfile::TempDir) -> Config {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut config = Config::load(&root.join("examples/flows.toml")).unwrap();
    config.catalog = CatalogConfig::Hadoop {
        warehouse: tmp.path().to_str().unwrap().into(),
        s3: None,
    };
    config
}

fn example(flow: &str, files: &[&str], expected: &[&[&str]]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::tempdir().unwrap();
    let config = examples_config(&tmp);
    let flow = config.flow(flow).unwrap();
    let got = rt().block_on(async {
        let faults = std::sync::Arc::new(autocdc::fault::Faults::default());
        let cat = autocdc::table::catalog::open(&config.catalog, faults).unwrap();
        for (i, f) in files.iter().enumerate() {
            let b =
                autocdc::service::input::read_file(&flow, &root.join("examples").join(f)).unwrap();
            open_engine(&cat, &flow)
                .await
                .apply(&b, 1_000 + i as i64)
                .await
                .unwrap();
        }
        table_rows(&open_engine(&cat, &flow).await).await
    });
    assert_eq!(got, rows(expected), "{}", flow.name);
}

#[test]
fn scd2_example() {
    example(
        "customers_history",
        &["history-1.ndjson", "history-2.ndjson"],
        &[
            &["1", "Ada", "Leeds", "1", "1", "3"],
            &["1", "Ada", "York", "3", "3", "5"],
            &["1", "Ada L.", "Bath", "6", "5", "NULL"],
            &["2", "Bob", "York", "2", "2", "7"],
        ],
    );
}

#[test]
fn ignore_null_updates_example() {
    example(
        "customers_partial",
        &["partial-1.ndjson", "partial-2.ndjson"],
        &[
            &["1", "Ada Lovelace", "Bath", "5"],
            &["2", "NULL", "Hull", "4"],
        ],
    );
}

#[test]
fn apply_as_truncates_example() {
    example(
        "customers_truncated",
        &["truncate-1.ndjson", "truncate-2.ndjson"],
        &[&["3", "Cy", "Hull", "6"], &["4", "Dee", "Ely", "7"]],
    );
}

/// docs/history.md "AUTO CDC FROM SNAPSHOT": two versioned snapshots, a
/// repeat of the second (skipped) and an unchanged third (no files).
#[test]
fn from_snapshot_example() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::tempdir().unwrap();
    let config = examples_config(&tmp);
    let flow = config.flow("stock").unwrap();
    let got = rt().block_on(async {
        let faults = std::sync::Arc::new(autocdc::fault::Faults::default());
        let cat = autocdc::table::catalog::open(&config.catalog, faults).unwrap();
        for (v, f, skipped, files) in [
            (1, "stock-1.csv", false, 1),
            (2, "stock-2.csv", false, 1),
            (2, "stock-2.csv", true, 0),
            (3, "stock-2.csv", false, 0),
        ] {
            let b =
                autocdc::service::input::read_file(&flow, &root.join("examples").join(f)).unwrap();
            let mut e = open_engine(&cat, &flow).await;
            let off = e.summary().input_offset + 1;
            let r = e.apply_snapshot_at(&b, v, 1_000 + v, off).await.unwrap();
            assert_eq!(
                (r.skipped_for_version.is_some(), r.data_files),
                (skipped, files),
                "version {v}"
            );
        }
        table_rows(&open_engine(&cat, &flow).await).await
    });
    assert_eq!(
        got,
        rows(&[
            &["apple", "10", "A1", "1", "NULL"],
            &["pear", "4", "A2", "1", "2"],
            &["pear", "9", "A2", "2", "NULL"],
            &["fig", "3", "C4", "2", "NULL"],
            &["plum", "7", "B1", "1", "2"],
        ])
    );
}

/// docs/schema-changes.md: the orders flow applied under
/// `examples/orders-v1.toml`, then under `examples/orders-v2.toml` (widened,
/// renamed, added columns).
#[test]
fn schema_change_example() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::tempdir().unwrap();
    let got = rt().block_on(async {
        let faults = std::sync::Arc::new(autocdc::fault::Faults::default());
        let mut last = None;
        for (config, file) in [
            ("orders-v1.toml", "orders-1.ndjson"),
            ("orders-v2.toml", "orders-2.ndjson"),
        ] {
            let mut config = Config::load(&root.join("examples").join(config)).unwrap();
            config.catalog = CatalogConfig::Hadoop {
                warehouse: tmp.path().to_str().unwrap().into(),
                s3: None,
            };
            let flow = config.flow("orders").unwrap();
            let cat = autocdc::table::catalog::open(&config.catalog, faults.clone()).unwrap();
            let b = autocdc::service::input::read_file(&flow, &root.join("examples").join(file))
                .unwrap();
            let mut engine = open_engine(&cat, &flow).await;
            engine.apply(&b, 1_000).await.unwrap();
            last = Some(engine);
        }
        table_rows(&last.unwrap()).await
    });
    assert_eq!(
        got,
        rows(&[
            &["1", "2", "pen", "NULL", "1"],
            &["2", "3", "ink", "gift", "3"],
            &["3000000000", "5000000000", "box", "NULL", "4"],
        ])
    );
}

#[test]
fn every_flow_of_the_examples_config_is_exercised() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = Config::load(&root.join("examples/flows.toml")).unwrap();
    let names: Vec<String> = config
        .flows()
        .unwrap()
        .into_iter()
        .map(|f| f.name)
        .collect();
    assert_eq!(
        names,
        [
            "customers_history",
            "customers_partial",
            "customers_truncated",
            "stock"
        ]
    );
}
