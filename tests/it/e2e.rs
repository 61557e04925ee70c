//! The battery, properties and crash recovery through the real write path:
//! Parquet data and delete files, our snapshot producer, the Hadoop catalog
//! on local disk, and the state table; read back with iceberg-rust's scan.
//!
//! With `AUTOCDC_E2E_OUT=DIR`, the battery tables and the history tables
//! (SCD Type 2, ignore_null_updates) are left in `DIR/warehouse` and their
//! expected rows in `DIR/expected/*.json`, for the independent readers in
//! `integration/readers.py`.

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

/// A `people` feed for the history flows: a hand-written key (100) that
/// moves, gets a late event splitting an interval, a late delete inside its
/// history, a duplicate and a reinsert; then pseudo-random changes over six
/// keys (nulls, deletes, late events, ties), in eight micro-batches.
fn people_feed() -> Vec<Vec<scd::PEv>> {
    use scd::{del, up};
    let mut batches = vec![
        vec![
            up(100, "Leeds", "a", 1),
            up(100, "York", "a", 5),
            up(100, "Bath", "a", 9),
        ],
        vec![
            up(100, "Hull", "a", 3),
            del(100, 7),
            up(100, "York", "a", 5),
        ],
        vec![
            (100, false, Some("Leeds"), None, 12),
            (100, false, None, Some("b"), 14),
        ],
    ];
    let cities = [Some("Leeds"), Some("York"), Some("Bath"), None];
    let notes = [Some("vip"), Some("new"), None];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    for _ in 0..8 {
        let len = 1 + next(30) as usize;
        let mut b = Vec::with_capacity(len);
        for _ in 0..len {
            let (id, seq) = (next(6) as i64, next(40) as i64);
            b.push(if next(100) < 15 {
                del(id, seq)
            } else {
                (
                    id,
                    false,
                    cities[next(4) as usize],
                    notes[next(3) as usize],
                    seq,
                )
            });
        }
        batches.push(b);
    }
    batches
}

/// Applies `people_feed` to a history flow with a restart before every
/// batch and checks the table against `people_oracle`. With
/// `AUTOCDC_E2E_OUT` the table and its expected rows are left for the
/// independent readers (`integration/readers.py`), like the battery.
fn history_table(shape: scd::Shape, target: &str) -> BTreeSet<Vec<String>> {
    let tmp = tempfile::tempdir().unwrap();
    let out = e2e_out();
    let wh = out
        .as_ref()
        .map(|o| o.join("warehouse"))
        .unwrap_or_else(|| tmp.path().to_path_buf());
    let flow = scd::people(shape, target);
    let feed = people_feed();
    let arrow: Vec<RecordBatch> = feed.iter().map(|b| scd::people_batch(&flow, b)).collect();
    let expected = scd::people_oracle(shape, &flow, &arrow);
    rt().block_on(async {
        let cat = catalog(&wh, Arc::new(Faults::default()));
        cat.drop_table(&flow.target).await.unwrap();
        cat.drop_table(&flow.state_ident()).await.unwrap();
        for (i, b) in arrow.iter().enumerate() {
            let mut engine = open(&wh, &flow).await;
            engine.apply(b, 1_000 + i as i64).await.unwrap();
        }
        let engine = open(&wh, &flow).await;
        assert_eq!(table_rows(&engine).await, expected, "{target}");
        // Only position deletes: PyIceberg reads the table.
        assert_eq!(
            snapshot_property(&engine, "total-equality-deletes").as_deref(),
            Some("0")
        );
        let columns = column_names(&engine);
        if let Some(o) = &out {
            let dir = o.join("expected");
            std::fs::create_dir_all(&dir).unwrap();
            let json = serde_json::json!({
                "name": target,
                "metadata": engine.target().metadata_location,
                "keys": flow.config.keys,
                "columns": columns,
                "rows": expected.iter().collect::<Vec<_>>(),
            });
            let file = format!("{}.json", target.replace('.', "_"));
            std::fs::write(dir.join(file), json.to_string()).unwrap();
        }
    });
    expected
}

#[test]
fn scd2_people_through_the_hadoop_catalog_with_restarts() {
    let rows = history_table(scd::SCD2, "history.people_scd2");
    // The feed exercises history: closed versions, and keys with several.
    let closed = rows.iter().filter(|r| r[5] != "NULL").count();
    assert!(closed >= 10, "{closed} closed versions");
    assert!(rows.iter().filter(|r| r[0] == "100").count() >= 4);
}

#[test]
fn ignore_null_updates_people_through_the_hadoop_catalog_with_restarts() {
    let shape = scd::Shape {
        scd2: false,
        untracked_note: false,
        ignore_nulls: true,
        ties_error: false,
        city_only_nulls: false,
    };
    let rows = history_table(shape, "history.people_partial");
    // The nulls matter: without ignore_null_updates the table differs.
    let flow = scd::people(shape, "history.people_partial");
    let arrow: Vec<RecordBatch> = people_feed()
        .iter()
        .map(|b| scd::people_batch(&flow, b))
        .collect();
    let plain = scd::Shape {
        ignore_nulls: false,
        ..shape
    };
    assert_ne!(rows, scd::people_oracle(plain, &flow, &arrow));
}

#[test]
fn rows_autocdc_wrote_are_removed_by_position_only() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = rt();
    rt.block_on(async {
        let flow = flow_for("pos.only");
        let mut engine = open(tmp.path(), &flow).await;
        engine
            .apply(
                &batch(&flow, &[u(1, "A", 1), u(2, "B", 1), u(3, "C", 1)]),
                1,
            )
            .await
            .unwrap();
        let r = engine
            .apply(&batch(&flow, &[u(1, "A2", 2), d(2, 2)]), 2)
            .await
            .unwrap();
        assert_eq!(r.stats.removed_by_position, 2);
        assert_eq!(r.stats.removed_by_key, 0);
        let s = engine
            .target()
            .metadata
            .current_snapshot()
            .unwrap()
            .summary()
            .additional_properties
            .clone();
        assert_eq!(
            s.get("added-position-deletes").map(String::as_str),
            Some("2")
        );
        assert_eq!(
            s.get("total-equality-deletes").map(String::as_str),
            Some("0")
        );
        assert_eq!(s.get("total-records").map(String::as_str), Some("4"));
        assert_eq!(s.get("total-data-files").map(String::as_str), Some("2"));
        assert_eq!(
            table_rows(&engine).await,
            rows(&[&["1", "A2", "2"], &["3", "C", "1"]])
        );
        // The metadata of the target says merge-on-read and format v2, and keys are identifier fields.
        let m = &engine.target().metadata;
        assert_eq!(m.format_version(), iceberg::spec::FormatVersion::V2);
        assert_eq!(
            m.properties().get("write.delete.mode").map(String::as_str),
            Some("merge-on-read")
        );
        assert_eq!(
            m.current_schema()
                .identifier_field_ids()
                .collect::<Vec<_>>(),
            vec![1]
        );
        // The layout is Iceberg Java's HadoopCatalog's.
        let meta = tmp.path().join("pos/only/metadata");
        assert_eq!(
            std::fs::read_to_string(meta.join("version-hint.text")).unwrap(),
            "3"
        );
        assert!(meta.join("v3.metadata.json").exists());
    });
}

#[test]
fn a_batch_that_changes_nothing_commits_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let flow = flow_for("noop.t");
        let mut engine = open(tmp.path(), &flow).await;
        let first = engine
            .apply(&batch(&flow, &[u(1, "A", 5)]), 1)
            .await
            .unwrap();
        let again = engine
            .apply(&batch(&flow, &[u(1, "A", 5), u(1, "old", 2)]), 2)
            .await
            .unwrap();
        assert!(first.snapshot_id.is_some());
        assert_eq!(again.snapshot_id, None);
        assert_eq!((again.stats.duplicates, again.stats.stale), (1, 1));
        assert_eq!(
            engine.target().metadata.current_snapshot_id(),
            first.snapshot_id
        );
    });
}

#[test]
fn changed_keys_are_rejected_as_key_schema_drift() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let flow = flow_for("drift.t");
        let cat = catalog(tmp.path(), Arc::new(Faults::default()));
        open(tmp.path(), &flow).await;
        let mut cfg = flow.config.clone();
        cfg.keys = vec!["city".into()];
        let e = Engine::open(
            Flow::new(cfg).unwrap(),
            cat.clone(),
            Arc::new(Faults::default()),
        )
        .await
        .err()
        .unwrap();
        assert_eq!(e.code(), autocdc::error::codes::KEY_SCHEMA_DRIFT);
        assert!(e.to_string().contains("refresh --full"), "{e}");
    });
}

/// (content, spec id) of every live file of the target's current snapshot.
async fn live_specs(dir: &std::path::Path, engine: &Engine) -> BTreeSet<(&'static str, i32)> {
    use iceberg::spec::DataContentType;
    let cat = catalog(dir, Arc::new(Faults::default()));
    let t = engine.target().table(cat.file_io()).unwrap();
    let mut out = BTreeSet::new();
    let Some(snap) = t.metadata().current_snapshot() else {
        return out;
    };
    let list = t.manifest_list_reader(snap).load().await.unwrap();
    for m in list.entries() {
        let manifest = m.load_manifest(cat.file_io()).await.unwrap();
        for e in manifest.entries().iter().filter(|e| e.is_alive()) {
            let kind = match e.data_file().content_type() {
                DataContentType::Data => "data",
                DataContentType::PositionDeletes => "pos",
                DataContentType::EqualityDeletes => "eq",
            };
            out.insert((kind, m.partition_spec_id));
        }
    }
    out
}

/// A changed `partition_by` adds a spec: new files take it, a row replaced
/// or deleted in an older file is deleted in that file's spec, compaction
/// moves every file into the default spec, and going back reuses a spec.
#[test]
fn a_changed_partitioning_adds_a_spec_and_deletes_follow_each_files_spec() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    rt().block_on(async {
        let t = "respec.t";
        let flow = |by: &[&str]| partitioned_flow_for(t, by);
        let cities = ["a", "b", "c"];
        let first: Vec<Ev> = (1..=8).map(|k| u(k, cities[k as usize % 3], 1)).collect();
        let mut all = vec![batch(&flow(&[]), &first)];
        let mut engine = open(dir, &flow(&[])).await;
        engine.apply(&all[0], 1).await.unwrap();
        drop(engine);

        // Partitioned by city: one metadata commit, spec 1, reopened as is.
        let engine = open(dir, &flow(&["city"])).await;
        let meta = engine.target().metadata.clone();
        assert_eq!(meta.default_partition_spec_id(), 1);
        assert_eq!(meta.partition_specs_iter().len(), 2);
        assert!(
            engine
                .evolved()
                .iter()
                .any(|e| e.contains("partition spec 1")),
            "{:?}",
            engine.evolved()
        );
        let loc = engine.target().metadata_location.clone();
        drop(engine);
        let mut engine = open(dir, &flow(&["city"])).await;
        assert_eq!(engine.target().metadata_location, loc);
        let b = batch(&flow(&["city"]), &[u(1, "b", 2), d(2, 2), u(9, "a", 2)]);
        engine.apply(&b, 2).await.unwrap();
        all.push(b);
        assert_eq!(table_rows(&engine).await, oracle(&flow(&[]), &all));
        // Keys 1 and 2 were in a file of spec 0: deleted in spec 0.
        assert_eq!(
            live_specs(dir, &engine).await,
            BTreeSet::from([("data", 0), ("data", 1), ("pos", 0)])
        );

        // Then by a bucket of the key: rows in files of both older specs go.
        let by_key = flow(&["bucket[4](id)"]);
        let mut engine = open(dir, &by_key).await;
        assert_eq!(engine.target().metadata.default_partition_spec_id(), 2);
        let b = batch(
            &by_key,
            &[u(1, "c", 3), u(3, "a", 3), d(9, 3), u(10, "b", 3)],
        );
        engine.apply(&b, 3).await.unwrap();
        all.push(b);
        assert_eq!(table_rows(&engine).await, oracle(&flow(&[]), &all));
        assert_eq!(
            live_specs(dir, &engine).await,
            BTreeSet::from([
                ("data", 0),
                ("data", 1),
                ("data", 2),
                ("pos", 0),
                ("pos", 1)
            ])
        );

        // Compaction rewrites every file of an older spec into spec 2, and
        // their deletes go with them.
        let r = engine.compact(4, false).await.unwrap();
        // Spec 0's file is rewritten; spec 1's two, every row deleted, are dropped.
        assert_eq!(
            (r.data_files_rewritten, r.data_files_dropped),
            (1, 2),
            "{r:?}"
        );
        assert_eq!(
            live_specs(dir, &engine).await,
            BTreeSet::from([("data", 2)])
        );
        assert_eq!(table_rows(&engine).await, oracle(&flow(&[]), &all));
        // The state followed the rows: later changes replace the right ones.
        let b = batch(&by_key, &[u(4, "z", 4), d(5, 4), u(1, "y", 4)]);
        engine.apply(&b, 5).await.unwrap();
        all.push(b);
        assert_eq!(table_rows(&engine).await, oracle(&flow(&[]), &all));
        drop(engine);

        // Back to unpartitioned: spec 0 again, no fourth spec.
        let mut engine = open(dir, &flow(&[])).await;
        let meta = engine.target().metadata.clone();
        assert_eq!(meta.default_partition_spec_id(), 0);
        assert_eq!(meta.partition_specs_iter().len(), 3);
        let b = batch(&flow(&[]), &[u(6, "q", 5), u(11, "r", 5), u(7, "stale", 0)]);
        engine.apply(&b, 6).await.unwrap();
        all.push(b);
        assert_eq!(table_rows(&engine).await, oracle(&flow(&[]), &all));
        assert!(live_specs(dir, &engine).await.contains(&("pos", 2)));
        // A restart recovers the same table and state.
        let mut engine = open(dir, &flow(&[])).await;
        let b = batch(&flow(&[]), &[d(8, 6)]);
        engine.apply(&b, 7).await.unwrap();
        all.push(b);
        assert_eq!(table_rows(&engine).await, oracle(&flow(&[]), &all));
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

/// A target that already held rows autocdc did not write: their positions are
/// unknown, so replacing one takes an equality delete on the key, and the
/// state stays marked incomplete across restarts.
#[test]
fn rows_written_by_another_engine_are_replaced_by_equality_delete() {
    adopted_table(&[], &[]);
}

/// Partitioned on a non-key column: the old row's partition is unknown, so
/// the equality delete is written into every partition that has data.
#[test]
fn adopted_table_partitioned_by_a_non_key_column() {
    adopted_table(&["city"], &["city"]);
}

/// Partitioned on the key: the equality delete goes to the key's partition.
#[test]
fn adopted_table_partitioned_by_the_key() {
    adopted_table(&["bucket[4](id)"], &["bucket[4](id)"]);
}

/// Written by city, then repartitioned by a bucket of the key: the old row
/// is in a file of the older spec, so the equality delete goes into every
/// partition of that spec that has data (and none into the new one, which
/// has no data yet).
#[test]
fn adopted_table_repartitioned_by_the_key() {
    adopted_table(&["city"], &["bucket[4](id)"]);
}

/// Written unpartitioned, then partitioned by city: the equality delete is
/// in the unpartitioned spec of the old file.
#[test]
fn adopted_unpartitioned_table_repartitioned() {
    adopted_table(&[], &["city"]);
}

/// A table another engine wrote with `created` partitioning, adopted by a
/// flow partitioned by `opened`.
fn adopted_table(created: &[&str], opened: &[&str]) {
    use autocdc::table::row_delta::{self, RowDelta};
    use autocdc::table::write::{self, FileNamer, Partitioner};
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let flow = partitioned_flow_for("adopt.t", created);
        let cat = catalog(tmp.path(), Arc::new(Faults::default()));
        // Another engine creates the table and appends two rows.
        let t = cat
            .create_table(
                &flow.target,
                flow.target_schema.clone(),
                flow.partition_spec.clone().into_unbound(),
                Default::default(),
            )
            .await
            .unwrap();
        let arrow =
            Arc::new(iceberg::arrow::schema_to_arrow_schema(t.metadata.current_schema()).unwrap());
        let foreign = RecordBatch::try_new(
            arrow,
            vec![
                Arc::new(arrow_array::Int64Array::from(vec![1, 2])),
                Arc::new(arrow_array::StringArray::from(vec![
                    Some("Old1"),
                    Some("Old2"),
                ])),
                Arc::new(arrow_array::Int64Array::from(vec![1, 1])),
            ],
        )
        .unwrap();
        let mut namer = FileNamer::new(t.location());
        let partitioner = Partitioner::new(
            t.metadata.default_partition_spec().clone(),
            t.metadata.current_schema(),
        )
        .unwrap();
        let files = write::data_files(
            cat.file_io(),
            &mut namer,
            t.metadata.current_schema().clone(),
            0,
            partitioner.as_ref(),
            &foreign,
            1 << 20,
        )
        .await
        .unwrap()
        .files;
        // Partitioned by city, the two rows are in two partitions.
        let by_city = created == ["city"];
        assert_eq!(files.len(), if by_city { 2 } else { 1 });
        let p = row_delta::produce(
            cat.file_io(),
            &t,
            RowDelta {
                data: files,
                deletes: vec![],
                base_snapshot: None,
                replace: false,
                properties: Default::default(),
                now_ms: 1,
                rewrite: None,
            },
        )
        .await
        .unwrap();
        cat.commit(&t, p.updates, p.requirements).await.unwrap();

        let flow = partitioned_flow_for("adopt.t", opened);
        let mut engine = open(tmp.path(), &flow).await;
        let respecced = created != opened;
        assert_eq!(
            engine.target().metadata.default_partition_spec_id(),
            respecced as i32
        );
        assert!(!engine.summary().complete);
        let r = engine
            .apply(&batch(&flow, &[u(1, "New1", 2)]), 2)
            .await
            .unwrap();
        assert_eq!(
            (r.stats.removed_by_key, r.stats.removed_by_position),
            (1, 0)
        );
        // One equality-delete file, or one per partition holding data.
        assert_eq!(r.delete_files, if by_city { 2 } else { 1 });
        assert_eq!(
            table_rows(&engine).await,
            rows(&[&["1", "New1", "2"], &["2", "Old2", "1"]])
        );
        // After a restart the state is still known to be incomplete.
        let mut engine = open(tmp.path(), &flow).await;
        assert!(!engine.summary().complete);
        // Key 1 is ours now: replaced by position. Key 2 still needs its key.
        let r = engine
            .apply(&batch(&flow, &[u(1, "Newer1", 3), d(2, 3)]), 3)
            .await
            .unwrap();
        assert_eq!(
            (r.stats.removed_by_key, r.stats.removed_by_position),
            (1, 1)
        );
        assert_eq!(table_rows(&engine).await, rows(&[&["1", "Newer1", "3"]]));
    });
}

/// Enough commits that the state log is rewritten whole (an overwrite
/// snapshot of the state table); a restart then reloads exactly that state.
#[test]
fn the_state_log_is_compacted_and_reloads_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let flow = flow_for("compact.t");
        let n = 40_000i64;
        let cities = ["c0", "c1", "c2", "c3", "c4"];
        let mut all = Vec::new();
        let mut engine = open(tmp.path(), &flow).await;
        let mut compacted = false;
        for (i, city) in cities.iter().enumerate() {
            let evs: Vec<Ev> = (0..n)
                .map(|k| {
                    if i == 4 && k % 7 == 0 {
                        d(k, 5)
                    } else {
                        u(k, city, i as i64 + 1)
                    }
                })
                .collect();
            let b = batch(&flow, &evs);
            compacted |= engine.apply(&b, i as i64).await.unwrap().state_compacted;
            all.push(b);
        }
        assert!(compacted, "the state log was never compacted");
        let mut engine = open(tmp.path(), &flow).await;
        assert_eq!(engine.summary().keys, n as usize);
        // Every key's sequence survived: old changes are all stale, tombstones included.
        let stale = batch(&flow, &(0..n).map(|k| u(k, "old", 0)).collect::<Vec<_>>());
        let r = engine.apply(&stale, 10).await.unwrap();
        assert_eq!(r.stats.stale, n as u64);
        // And the positions: newer changes replace the right rows.
        let newer = batch(&flow, &[u(1, "new", 9), d(2, 9), u(7, "back", 9)]);
        engine.apply(&newer, 11).await.unwrap();
        all.push(stale);
        all.push(newer);
        assert_eq!(table_rows(&engine).await, oracle(&flow, &all));
    });
}

/// A commit of more keys than `STATE_SPLIT_ENTRIES` (32,768) builds its
/// state rows on two threads and writes them as two files of one state
/// snapshot; a restart reads both, for SCD Type 1 and both history kinds.
#[test]
fn a_large_commit_writes_its_state_as_two_files_that_reload_exactly() {
    let partial = scd::Shape {
        scd2: false,
        untracked_note: false,
        ignore_nulls: true,
        ties_error: false,
        city_only_nulls: false,
    };
    let plain = scd::Shape {
        scd2: false,
        ignore_nulls: false,
        ..partial
    };
    let two_cores = std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2;
    for (shape, target) in [
        (scd::SCD2, "split.people_scd2"),
        (partial, "split.people_partial"),
        (plain, "split.people_scd1"),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let flow = scd::people(shape, target);
        let n = 40_000i64;
        let first: Vec<scd::PEv> = (0..n).map(|k| scd::up(k, "a", "n1", 10)).collect();
        let second: Vec<scd::PEv> = (0..n)
            .map(|k| match k % 5 {
                0 => scd::del(k, 20),
                1 => (k, false, Some("b"), None, 20),
                _ => scd::up(k, "b", "n2", 20 + k % 3),
            })
            .collect();
        let third = vec![
            scd::up(1, "c", "n3", 30),
            scd::del(2, 30),
            scd::up(5, "back", "n4", 30),
            scd::up(6, "late", "n0", 15),
        ];
        let arrow: Vec<RecordBatch> = [&first, &second, &first, &third]
            .iter()
            .map(|b| scd::people_batch(&flow, b))
            .collect();
        rt().block_on(async {
            let mut engine = open(tmp.path(), &flow).await;
            for (i, b) in arrow[..2].iter().enumerate() {
                engine.apply(b, i as i64).await.unwrap();
                let state = engine.state_table().metadata.current_snapshot().unwrap();
                let added = state
                    .summary()
                    .additional_properties
                    .get("added-data-files");
                let want = if two_cores { "2" } else { "1" };
                assert_eq!(added.map(String::as_str), Some(want), "{target} commit {i}");
            }
            // A restart reads both files of each commit: the old changes
            // are known, the positions of the rows right.
            let mut engine = open(tmp.path(), &flow).await;
            assert_eq!(engine.summary().keys, n as usize, "{target}");
            engine.apply(&arrow[2], 2).await.unwrap();
            engine.apply(&arrow[3], 3).await.unwrap();
            let engine = open(tmp.path(), &flow).await;
            let expected = scd::people_oracle(shape, &flow, &arrow);
            assert_eq!(table_rows(&engine).await, expected, "{target}");
        });
        // Only autocdc reads the state table, whole: its files carry no
        // column statistics; the target's data files do, for readers.
        let (mut state, mut data) = (0, 0);
        for path in parquet_files(tmp.path()) {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let file = std::fs::File::open(&path).unwrap();
            let reader = parquet::file::reader::SerializedFileReader::new(file).unwrap();
            let meta = parquet::file::reader::FileReader::metadata(&reader);
            let chunks = || meta.row_groups().iter().flat_map(|g| g.columns());
            if name.contains("-state-") {
                state += 1;
                assert!(chunks().all(|c| c.statistics().is_none()), "{name}");
            } else if name.contains("-data-") {
                data += 1;
                assert!(chunks().all(|c| c.statistics().is_some()), "{name}");
            }
        }
        assert!(
            state >= 4 && data >= 3,
            "{target}: {state} state, {data} data files"
        );
    }
}

/// Every Parquet file under `dir`.
fn parquet_files(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        if path.is_dir() {
            out.extend(parquet_files(&path));
        } else if path.extension().is_some_and(|x| x == "parquet") {
            out.push(path);
        }
    }
    out
}

/// A nested-column flow definition: `scd` type, `address` of `address`
/// type and `extra` columns before `seq`.
fn nested_definition(target: &str, scd: u8, address: &str, extra: &str) -> Flow {
    let toml = format!(
        r#"
name = "{name}"
target = "{target}"
keys = ["id"]
sequence_by = "seq"
apply_as_deletes = "op = 'D'"
except_column_list = ["op"]
stored_as_scd_type = {scd}
columns = [
  {{ name = "id", type = "int" }},
  {{ name = "address", type = "{address}" }},
  {{ name = "tags", type = "list<string>" }},
  {{ name = "scores", type = "map<string, long>" }},
  {extra}
  {{ name = "seq", type = "long" }},
  {{ name = "op", type = "string" }},
]
"#,
        name = target.replace('.', "_")
    );
    Flow::new(toml::from_str(&toml).unwrap()).unwrap()
}

/// Nested columns (struct, list, map), SCD Type 1 and 2, applied with a
/// restart before every batch, and a table whose nested columns evolve (a
/// struct gains a field and widens one, a nested column is added). With
/// `AUTOCDC_E2E_OUT` the tables are left for the independent readers, their
/// rows as JSON values (`"json": true`): DuckDB and PyIceberg show nested
/// values in their own forms, which `readers.py` brings to one.
#[test]
fn nested_columns_through_the_hadoop_catalog_with_restarts() {
    let batches = [
        r#"
        {"id": 1, "address": {"city": "Leeds", "zip": 1}, "tags": ["a", "b"], "scores": {"x": 1}, "seq": 1}
        {"id": 2, "address": {"city": "York"}, "tags": [], "scores": {}, "seq": 1}
        {"id": 4, "address": {"city": "Hull", "zip": 4}, "tags": ["h"], "scores": {"h": 4}, "seq": 1}
        "#,
        r#"
        {"id": 1, "address": {"city": "Bath", "zip": 2}, "tags": ["c", null], "scores": {"x": 2, "y": 3}, "seq": 3}
        {"id": 1, "address": {"city": "late", "zip": 0}, "seq": 2}
        {"id": 2, "op": "D", "seq": 2}
        {"id": 3, "address": null, "tags": null, "scores": null, "seq": 1}
        "#,
        r#"
        {"id": 4, "address": {"city": "Hull", "zip": 5}, "tags": ["h"], "scores": {"h": 4}, "seq": 2}
        {"id": 1, "address": {"city": "Bath", "zip": 2}, "tags": ["c", null], "scores": {"x": 2, "y": 3}, "seq": 4}
        "#,
    ];
    let v1 = "struct<city: string, zip: int>";
    let v2 = "struct<city: string, country: string, zip: long>";
    let notes = r#"{ name = "notes", type = "list<struct<at: date, text: string>>" },"#;
    let evolved = [
        (
            nested_definition("nested.evolved", 2, v1, ""),
            &batches[..2],
        ),
        (
            nested_definition("nested.evolved", 2, v2, notes),
            &[r#"
            {"id": 4, "address": {"city": "Hull", "country": "UK", "zip": 5}, "notes": [{"at": "2026-12-01", "text": "moved"}], "seq": 2}
            {"id": 5, "address": {"city": "Lyon", "country": "FR", "zip": 69}, "notes": [], "seq": 1}
            "#][..],
        ),
    ];
    let out = e2e_out();
    // SCD Type 2 tracks `seq` too (Spark's default): 8 versions.
    let cases = [
        (
            vec![(
                nested_definition("nested.people_scd1", 1, v1, ""),
                &batches[..],
            )],
            3usize,
        ),
        (
            vec![(
                nested_definition("nested.people_scd2", 2, v1, ""),
                &batches[..],
            )],
            8,
        ),
        (evolved.to_vec(), 8),
    ];
    for (runs, rows) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let wh = out
            .as_ref()
            .map(|o| o.join("warehouse"))
            .unwrap_or_else(|| tmp.path().to_path_buf());
        let flow = runs[0].0.clone();
        rt().block_on(async {
            let cat = catalog(&wh, Arc::new(Faults::default()));
            cat.drop_table(&flow.target).await.unwrap();
            cat.drop_table(&flow.state_ident()).await.unwrap();
            let mut i = 0;
            for (flow, batches) in &runs {
                for b in batches.iter() {
                    let batch = autocdc::service::input::decode_ndjson(
                        flow,
                        b.as_bytes(),
                        autocdc::service::input::Limits::NONE,
                    )
                    .unwrap();
                    let mut engine = open(&wh, flow).await;
                    engine.apply(&batch, 1_000 + i).await.unwrap();
                    i += 1;
                }
            }
            let last = &runs.last().unwrap().0;
            let engine = open(&wh, last).await;
            let got = table_rows(&engine).await;
            let target = &last.config.target;
            assert_eq!(got.len(), rows, "{target}: {got:?}");
            let bath = got.iter().any(|r| {
                r[1].starts_with("{city: Bath") && r.contains(&"{x: 2, y: 3}".to_string())
            });
            assert!(bath, "{target}: {got:?}");
            assert_eq!(
                snapshot_property(&engine, "total-equality-deletes").as_deref(),
                Some("0")
            );
            let Some(o) = &out else { return };
            let columns = column_names(&engine);
            let mut json_rows = Vec::new();
            for b in engine.scan_target().await.unwrap() {
                let mut w = arrow_json::ArrayWriter::new(Vec::new());
                w.write(&b).unwrap();
                w.finish().unwrap();
                let objects: Vec<serde_json::Value> =
                    serde_json::from_slice(&w.into_inner()).unwrap();
                for obj in objects {
                    let row: Vec<serde_json::Value> = columns
                        .iter()
                        .map(|c| obj.get(c).cloned().unwrap_or(serde_json::Value::Null))
                        .collect();
                    json_rows.push(row);
                }
            }
            let dir = o.join("expected");
            std::fs::create_dir_all(&dir).unwrap();
            let case = serde_json::json!({
                "name": target,
                "metadata": engine.target().metadata_location,
                "keys": last.config.keys,
                "columns": columns,
                "json": true,
                "rows": json_rows,
            });
            let file = format!("{}.json", target.replace('.', "_"));
            std::fs::write(dir.join(file), case.to_string()).unwrap();
        });
    }
}

/// A key column named `pos` (or a column `file_path`): iceberg-rust's scan
/// takes those names for its metadata columns, so a flow keyed by `pos`
/// could not read its state back at a restart, nor `autocdc show` its
/// target. The state is now read from its files, and such a target with
/// autocdc's own reader.
#[test]
fn columns_named_like_iceberg_rust_metadata_columns_survive_restarts() {
    let toml = r#"
name = "meta_names"
target = "meta.names"
keys = ["pos"]
sequence_by = "seq"
columns = [
  { name = "pos", type = "long" },
  { name = "file_path", type = "string" },
  { name = "seq", type = "long" },
]
"#;
    let flow = Flow::new(toml::from_str(toml).unwrap()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let batch = |body: &str| {
        autocdc::service::input::decode_ndjson(
            &flow,
            body.as_bytes(),
            autocdc::service::input::Limits::NONE,
        )
        .unwrap()
    };
    rt().block_on(async {
        let mut e = open(tmp.path(), &flow).await;
        e.apply(&batch(r#"{"pos": 1, "file_path": "a", "seq": 5}"#), 1)
            .await
            .unwrap();
        drop(e);
        let mut e = open(tmp.path(), &flow).await;
        let r = e
            .apply(
                &batch(
                    "{\"pos\": 1, \"file_path\": \"old\", \"seq\": 4}\n{\"pos\": 2, \"seq\": 1}",
                ),
                2,
            )
            .await
            .unwrap();
        assert_eq!((r.stats.stale, r.stats.upserts), (1, 1), "{:?}", r.stats);
        assert_eq!(
            table_rows(&e).await,
            rows(&[&["1", "a", "5"], &["2", "NULL", "1"]])
        );
    });
}
