//! The battery, properties and crash recovery through the real write path:
//! Parquet data and delete files, our snapshot producer, the Hadoop catalog
//! on local disk, and the state table; read back with iceberg-rust's scan.
//!
//! With `AUTOCDC_E2E_OUT=DIR`, the battery tables and the history tables
//! (SCD Type 2, ignore_null_updates) are left in `DIR/warehouse` and their
//! expected rows in `DIR/expected/*.json`, for the independent readers in
//! `integration/readers.py`.
//!
//! The rooms: this file holds the shared set-up, the battery, the crash
//! points and random batchings; `history` the SCD Type 2 and
//! `ignore_null_updates` people tables; `writes` how rows are replaced and
//! what a batch that changes nothing commits; `partitions` partition specs
//! and adopted tables written by another engine; `state` the state log's
//! compaction and split commits; `nested` nested columns and column names
//! iceberg-rust reserves.

mod history;
mod nested;
mod partitions;
mod state;
mod writes;

use crate::common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use arrow_array::RecordBatch;
use autocdc::core::flow::Flow;
use autocdc::fault::{FaultPoint, Faults};
use autocdc::table::catalog::Catalog;
use autocdc::table::catalog::hadoop::HadoopCatalog;
use autocdc::table::engine::Engine;
use common::scd;
use common::*;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn catalog(dir: &std::path::Path, faults: Arc<Faults>) -> Arc<dyn Catalog> {
    Arc::new(HadoopCatalog::new(dir.to_str().unwrap(), None, faults).unwrap())
}

/// A fresh engine on `dir` with no faults armed: a process (re)start.
async fn open(dir: &std::path::Path, flow: &Flow) -> Engine {
    let faults = Arc::new(Faults::default());
    Engine::open(flow.clone(), catalog(dir, faults.clone()), faults)
        .await
        .unwrap()
}

fn flow_for(target: &str) -> Flow {
    partitioned_flow_for(target, &[])
}

fn partitioned_flow_for(target: &str, partition_by: &[&str]) -> Flow {
    let mut cfg = customers_config();
    cfg.name = target.replace('.', "_");
    cfg.target = target.to_string();
    cfg.partition_by = partition_by.iter().map(|s| s.to_string()).collect();
    Flow::new(cfg).unwrap()
}

async fn table_rows(engine: &Engine) -> BTreeSet<Vec<String>> {
    let batches = engine.scan_target().await.unwrap();
    let mut out = BTreeSet::new();
    for b in &batches {
        for r in render_all(b) {
            assert!(out.insert(r.clone()), "row {r:?} read twice");
        }
    }
    out
}

fn e2e_out() -> Option<PathBuf> {
    std::env::var_os("AUTOCDC_E2E_OUT").map(PathBuf::from)
}

#[test]
fn battery_through_the_hadoop_catalog_with_restarts() {
    let tmp = tempfile::tempdir().unwrap();
    let out = e2e_out();
    let wh = out
        .as_ref()
        .map(|o| o.join("warehouse"))
        .unwrap_or_else(|| tmp.path().to_path_buf());
    let rt = rt();
    rt.block_on(async {
        for (n, case) in cases::all().into_iter().enumerate() {
            let target = format!("battery.case{n:02}");
            let flow = flow_for(&target);
            let cat = catalog(&wh, Arc::new(Faults::default()));
            cat.drop_table(&flow.target).await.unwrap();
            cat.drop_table(&flow.state_ident()).await.unwrap();
            for (i, evs) in case.batches.iter().enumerate() {
                // A fresh engine (and catalog) for every batch: a restart each time.
                let mut engine = open(&wh, &flow).await;
                engine
                    .apply(&batch(&flow, evs), 1_000 + i as i64)
                    .await
                    .unwrap();
            }
            let engine = open(&wh, &flow).await;
            assert_eq!(
                table_rows(&engine).await,
                case.expected,
                "case `{}`",
                case.name
            );
            if let Some(o) = &out {
                let dir = o.join("expected");
                std::fs::create_dir_all(&dir).unwrap();
                let json = serde_json::json!({
                    "name": case.name,
                    "metadata": engine.target().metadata_location,
                    "columns": ["id", "city", "seq"],
                    "rows": case.expected.iter().collect::<Vec<_>>(),
                });
                std::fs::write(dir.join(format!("case{n:02}.json")), json.to_string()).unwrap();
            }
        }
    });
}

/// A crash at each step of the commit protocol, then a restart that applies
/// the same input again: the table equals the oracle, nothing lost or doubled.
#[test]
fn crash_at_every_commit_step_then_reapply_gives_the_oracle() {
    let flow = flow_for("crash.t");
    let inputs: Vec<Vec<Ev>> = vec![
        vec![u(1, "Leeds", 1), u(2, "York", 2), u(3, "Hull", 1)],
        vec![u(1, "Bath", 5), d(2, 6), u(4, "Derby", 1)],
        vec![u(1, "Hull", 3), u(2, "Derby", 4), d(3, 9), u(5, "Ely", 2)],
        vec![u(3, "Back", 10), u(4, "Derby", 1), d(5, 1)],
    ];
    let arrow: Vec<RecordBatch> = inputs.iter().map(|b| batch(&flow, b)).collect();
    let expected = oracle(&flow, &arrow);
    let rt = rt();
    for point in FaultPoint::ALL {
        for crash_batch in 0..arrow.len() {
            let tmp = tempfile::tempdir().unwrap();
            rt.block_on(async {
                let faults = Arc::new(Faults::default());
                let cat = catalog(tmp.path(), faults.clone());
                let mut engine = Engine::open(flow.clone(), cat.clone(), faults.clone())
                    .await
                    .unwrap();
                let mut crashed = false;
                for (i, b) in arrow.iter().enumerate() {
                    if i == crash_batch {
                        faults.arm(point, 0);
                    }
                    match engine.apply(b, 100 + i as i64).await {
                        Ok(_) => {}
                        Err(autocdc::Error::InjectedFault(p)) => {
                            assert_eq!(p, point);
                            crashed = true;
                            break;
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
                assert!(crashed, "{point:?} at batch {crash_batch} never fired");
                drop(engine);
                // Restart on the same warehouse and re-send everything.
                let mut engine = open(tmp.path(), &flow).await;
                for (i, b) in arrow.iter().enumerate() {
                    engine.apply(b, 200 + i as i64).await.unwrap();
                }
                assert_eq!(
                    table_rows(&engine).await,
                    expected,
                    "crash at {point:?} in batch {crash_batch}"
                );
                let live = engine.summary().live;
                assert_eq!(live, expected.len());
            });
        }
    }
}

/// The property test again, through the real catalog (fewer cases: it writes files).
#[test]
fn random_batchings_through_the_catalog_match_the_oracle() {
    random_batchings(&[]);
}

/// Partitioned by the city (a non-key column, so updates move rows between
/// partitions) and a bucket of the key: position deletes go to the old row's
/// partition, found after a restart from the manifests.
#[test]
fn random_batchings_into_a_partitioned_table_match_the_oracle() {
    random_batchings(&["city", "bucket[2](id)"]);
}

fn random_batchings(partition_by: &[&str]) {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let rt = rt();
    let mut runner = TestRunner::new(Config {
        cases: 24,
        ..Config::default()
    });
    let strategy = (
        prop::collection::vec((0i64..4, any::<bool>(), 0usize..3, 0i64..5), 1..25),
        prop::collection::vec(any::<bool>(), 25),
        prop::collection::vec(any::<bool>(), 25),
    );
    runner
        .run(&strategy, |(changes, cuts, restarts)| {
            let cities = ["Leeds", "York", "Bath"];
            let flow = partitioned_flow_for("prop.t", partition_by);
            let evs: Vec<Ev> = changes
                .iter()
                .map(|&(k, del, c, s)| if del { d(k, s) } else { u(k, cities[c], s) })
                .collect();
            let mut batches: Vec<Vec<Ev>> = vec![Vec::new()];
            for (i, e) in evs.iter().enumerate() {
                batches.last_mut().unwrap().push(*e);
                if cuts[i] && i + 1 < evs.len() {
                    batches.push(Vec::new());
                }
            }
            let arrow: Vec<RecordBatch> = batches.iter().map(|b| batch(&flow, b)).collect();
            let tmp = tempfile::tempdir().unwrap();
            let got = rt.block_on(async {
                let mut engine = open(tmp.path(), &flow).await;
                for (i, b) in arrow.iter().enumerate() {
                    engine.apply(b, i as i64).await.unwrap();
                    if restarts[i] {
                        engine = open(tmp.path(), &flow).await;
                    }
                }
                table_rows(&engine).await
            });
            prop_assert_eq!(got, oracle(&flow, &arrow));
            Ok(())
        })
        .unwrap();
}
