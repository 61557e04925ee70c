//! Table maintenance: snapshot expiry with file cleanup, manifest merging,
//! metadata.json hygiene and orphan cleanup keep the table equal to the
//! oracle, every referenced file present, and recovery possible.

use crate::common;

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::RecordBatch;
use autocdc::core::flow::Flow;
use autocdc::fault::{FaultPoint, Faults};
use autocdc::table::catalog::hadoop::HadoopCatalog;
use autocdc::table::catalog::{Catalog, TableState};
use autocdc::table::engine::{Engine, MaintainOptions, MaintenanceReport};
use autocdc::table::maintain;
use common::*;
use iceberg::TableUpdate;

/// Commit and maintenance times: the wall clock (a commit without a new
/// snapshot, like an expiry, is stamped with it, and Iceberg wants the
/// snapshot and metadata logs in time order), so `i` is only for reading.
fn clock() -> impl Fn(i64) -> i64 {
    |_i| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
    }
}

fn catalog(dir: &Path, faults: Arc<Faults>) -> Arc<dyn Catalog> {
    Arc::new(HadoopCatalog::new(dir.to_str().unwrap(), None, faults).unwrap())
}

/// The customers flow keeping the last `n` snapshots (and none for their age).
fn flow_keeping(n: u32) -> Flow {
    let mut cfg = customers_config();
    cfg.snapshot_max_age = Some("1ms".into());
    cfg.min_snapshots_to_keep = Some(n);
    Flow::new(cfg).unwrap()
}

async fn open(cat: &Arc<dyn Catalog>, flow: &Flow, faults: &Arc<Faults>) -> Engine {
    Engine::open(flow.clone(), cat.clone(), faults.clone())
        .await
        .unwrap()
}

/// Sets table properties, as a user would with `ALTER TABLE ... SET TBLPROPERTIES`.
async fn set_props(cat: &Arc<dyn Catalog>, t: &TableState, props: &[(&str, &str)]) {
    let updates = props
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect::<HashMap<_, _>>();
    cat.commit(t, vec![TableUpdate::SetProperties { updates }], vec![])
        .await
        .unwrap();
}

/// Both tables merge manifests from 3 on, so short tests merge often.
async fn merge_often(cat: &Arc<dyn Catalog>, flow: &Flow) {
    let faults = Arc::new(Faults::default());
    let e = open(cat, flow, &faults).await;
    for t in [e.target(), e.state_table()] {
        set_props(
            cat,
            t,
            &[(autocdc::table::properties::PROP_MERGE_MIN_COUNT, "3")],
        )
        .await;
    }
}

async fn run(e: &mut Engine, now_ms: i64) -> MaintenanceReport {
    e.maintain(&MaintainOptions {
        now_ms,
        dry_run: false,
        orphans_older_than: None,
        compact: false,
    })
    .await
    .unwrap()
}

/// Every file any snapshot of `t` names exists.
async fn assert_referenced_exist(cat: &Arc<dyn Catalog>, t: &TableState) {
    let ids: Vec<i64> = t.metadata.snapshots().map(|s| s.snapshot_id()).collect();
    let r = maintain::reachable(cat.file_io(), t, ids).await.unwrap();
    let io = cat.file_io();
    for p in r
        .lists
        .iter()
        .chain(r.manifests.keys())
        .chain(r.files.keys())
    {
        assert!(
            io.exists(p).await.unwrap(),
            "{} names {p}, which is gone",
            t.ident
        );
    }
}

fn files_in(dir: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                out.insert(e.path().to_string_lossy().into_owned());
            }
        }
    }
    out
}

/// Files under `dir` that no metadata of `t` reaches (the pending record,
/// the hint and metadata.json versions aside).
async fn unreferenced(cat: &Arc<dyn Catalog>, t: &TableState, dir: &Path) -> Vec<String> {
    let ids: Vec<i64> = t.metadata.snapshots().map(|s| s.snapshot_id()).collect();
    let r = maintain::reachable(cat.file_io(), t, ids).await.unwrap();
    let known: BTreeSet<String> = r
        .lists
        .iter()
        .chain(r.manifests.keys())
        .chain(r.files.keys())
        .map(|p| p.trim_start_matches("file://").to_string())
        .collect();
    files_in(dir)
        .into_iter()
        .filter(|f| !known.contains(f) && !f.ends_with(".metadata.json") && !f.ends_with(".text"))
        .collect()
}

fn evs_batch(flow: &Flow, i: i64) -> RecordBatch {
    let cities = ["Leeds", "York", "Bath"];
    let evs: Vec<Ev> = (0..4)
        .map(|k| {
            let id = (i * 3 + k) % 7;
            if (i + k) % 5 == 0 {
                d(id, i * 10 + k)
            } else {
                u(id, cities[((i + k) % 3) as usize], i * 10 + k)
            }
        })
        .collect();
    batch(flow, &evs)
}

#[test]
fn random_batches_with_maintenance_and_restarts_match_the_oracle() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let rt = rt();
    let mut runner = TestRunner::new(Config {
        cases: 24,
        ..Config::default()
    });
    let strategy = (
        prop::collection::vec((0i64..5, any::<bool>(), 0usize..3, 0i64..12), 1..24),
        prop::collection::vec(any::<bool>(), 24),
        prop::collection::vec(0u8..4, 24),
    );
    runner
        .run(&strategy, |(changes, cuts, actions)| {
            let cities = ["Leeds", "York", "Bath"];
            let flow = flow_keeping(2);
            let evs: Vec<Ev> = changes
                .iter()
                .map(|&(k, del, c, s)| if del { d(k, s) } else { u(k, cities[c], s) })
                .collect();
            let arrow = cut_batches(&flow, &evs, &cuts);
            let tmp = tempfile::tempdir().unwrap();
            let faults = Arc::new(Faults::default());
            let at = clock();
            rt.block_on(async {
                let cat = catalog(tmp.path(), faults.clone());
                merge_often(&cat, &flow).await;
                let mut e = open(&cat, &flow, &faults).await;
                for (i, b) in arrow.iter().enumerate() {
                    let now = at(i as i64);
                    e.apply(b, now).await.unwrap();
                    match actions[i] {
                        1 => {
                            run(&mut e, now).await;
                        }
                        2 => {
                            run(&mut e, now).await;
                            e = open(&catalog(tmp.path(), faults.clone()), &flow, &faults).await;
                        }
                        3 => e = open(&catalog(tmp.path(), faults.clone()), &flow, &faults).await,
                        _ => {}
                    }
                    assert_eq!(table_rows(&e).await, oracle(&flow, &arrow[..=i]));
                    assert_referenced_exist(&cat, e.target()).await;
                    assert_referenced_exist(&cat, e.state_table()).await;
                }
            });
            Ok(())
        })
        .unwrap();
}

#[test]
fn expiry_bounds_snapshots_metadata_files_and_manifests() {
    let tmp = tempfile::tempdir().unwrap();
    let flow = flow_keeping(7);
    let faults = Arc::new(Faults::default());
    let at = clock();
    rt().block_on(async {
        let cat = catalog(tmp.path(), faults.clone());
        merge_often(&cat, &flow).await;
        let mut e = open(&cat, &flow, &faults).await;
        let mut batches = Vec::new();
        let mut last = MaintenanceReport::default();
        for i in 0..60 {
            let b = evs_batch(&flow, i);
            e.apply(&b, at(i)).await.unwrap();
            batches.push(b);
            if i % 10 == 9 {
                last = run(&mut e, at(i)).await;
                assert!(last.target.snapshots_expired > 0, "{last:?}");
                assert!(last.target.manifest_lists_deleted > 0, "{last:?}");
            }
        }
        assert_eq!(last.target_stats.snapshots, 7, "{last:?}");
        assert!(last.state_stats.snapshots <= 7, "{last:?}");
        assert!(last.target_stats.manifests <= 4, "{last:?}");
        let meta_dir = tmp.path().join("crm/customers/metadata");
        let versions = std::fs::read_dir(&meta_dir)
            .unwrap()
            .filter(|f| {
                f.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".metadata.json")
            })
            .count();
        assert!(
            versions <= autocdc::table::properties::CREATED_PREVIOUS_VERSIONS + 1,
            "{versions} metadata files kept"
        );
        assert_eq!(table_rows(&e).await, oracle(&flow, &batches));
        assert_referenced_exist(&cat, e.target()).await;
        assert_referenced_exist(&cat, e.state_table()).await;
        // Nothing expired is left behind.
        for (t, dir) in [
            (e.target(), tmp.path().join("crm/customers")),
            (
                e.state_table(),
                tmp.path().join("crm/customers__autocdc_state"),
            ),
        ] {
            assert_eq!(unreferenced(&cat, t, &dir).await, Vec::<String>::new());
        }

        // Recovery on a fresh process: only the state snapshots the kept
        // target snapshots name are left, and they are enough.
        let summary = e.summary();
        let mut fresh = open(&catalog(tmp.path(), faults.clone()), &flow, &faults).await;
        assert_eq!(fresh.summary().keys, summary.keys);
        assert_eq!(fresh.summary().state_snapshot_id, summary.state_snapshot_id);
        let b = evs_batch(&flow, 60);
        fresh.apply(&b, at(60)).await.unwrap();
        batches.push(b);
        assert_eq!(table_rows(&fresh).await, oracle(&flow, &batches));
    });
}

#[test]
fn dry_run_reports_and_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let flow = flow_keeping(7);
    let faults = Arc::new(Faults::default());
    let at = clock();
    rt().block_on(async {
        let cat = catalog(tmp.path(), faults.clone());
        let mut e = open(&cat, &flow, &faults).await;
        for i in 0..12 {
            e.apply(&evs_batch(&flow, i), at(i)).await.unwrap();
        }
        let before = files_in(tmp.path());
        let dry = e
            .maintain(&MaintainOptions {
                now_ms: at(11),
                dry_run: true,
                orphans_older_than: Some(Duration::ZERO),
                compact: false,
            })
            .await
            .unwrap();
        assert_eq!(files_in(tmp.path()), before);
        assert_eq!(dry.target.snapshots_expired, 5, "{dry:?}");
        let wet = run(&mut e, at(11)).await;
        assert_eq!(wet.target.snapshots_expired, dry.target.snapshots_expired);
        assert_eq!(
            wet.target.manifest_lists_deleted,
            dry.target.manifest_lists_deleted
        );
        assert_eq!(wet.state.snapshots_expired, dry.state.snapshots_expired);
    });
}

#[test]
fn a_run_stopped_anywhere_is_finished_by_the_next() {
    for point in [
        FaultPoint::AfterExpireCommit,
        FaultPoint::MidMaintenanceDeletes,
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let flow = flow_keeping(7);
        let faults = Arc::new(Faults::default());
        let at = clock();
        rt().block_on(async {
            let cat = catalog(tmp.path(), faults.clone());
            let mut e = open(&cat, &flow, &faults).await;
            let mut batches = Vec::new();
            for i in 0..20 {
                let b = evs_batch(&flow, i);
                e.apply(&b, at(i)).await.unwrap();
                batches.push(b);
            }
            faults.arm(point, 0);
            let err = e
                .maintain(&MaintainOptions {
                    now_ms: at(19),
                    dry_run: false,
                    orphans_older_than: None,
                    compact: false,
                })
                .await
                .unwrap_err();
            assert!(err.to_string().contains("injected"), "{point:?}: {err}");
            // A restart: nothing lost or duplicated, nothing referenced gone.
            let mut e = open(&catalog(tmp.path(), faults.clone()), &flow, &faults).await;
            assert_eq!(table_rows(&e).await, oracle(&flow, &batches));
            assert_referenced_exist(&cat, e.target()).await;
            let pending = tmp
                .path()
                .join("crm/customers/metadata/autocdc-expire-pending.avro");
            assert!(pending.exists(), "{point:?}: the cleanup record is kept");
            let report = run(&mut e, at(19)).await;
            assert!(
                report.target.resumed_files_deleted > 0,
                "{point:?}: {report:?}"
            );
            assert!(!pending.exists());
            assert_eq!(
                unreferenced(&cat, e.target(), &tmp.path().join("crm/customers")).await,
                Vec::<String>::new(),
                "{point:?}"
            );
            let b = evs_batch(&flow, 20);
            e.apply(&b, at(20)).await.unwrap();
            batches.push(b);
            assert_eq!(table_rows(&e).await, oracle(&flow, &batches));
        });
    }
}

#[test]
fn a_commit_stopped_after_its_manifest_merge_loses_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let flow = flow_keeping(7);
    let faults = Arc::new(Faults::default());
    let at = clock();
    rt().block_on(async {
        let cat = catalog(tmp.path(), faults.clone());
        merge_often(&cat, &flow).await;
        let mut e = open(&cat, &flow, &faults).await;
        let mut batches = Vec::new();
        for i in 0..2 {
            let b = evs_batch(&flow, i);
            e.apply(&b, at(i)).await.unwrap();
            batches.push(b);
        }
        // The third commit merges (3 manifests): it stops before its commit.
        faults.arm(FaultPoint::AfterManifestMerge, 0);
        let b = evs_batch(&flow, 2);
        assert!(e.apply(&b, at(2)).await.is_err());
        let mut e = open(&catalog(tmp.path(), faults.clone()), &flow, &faults).await;
        assert_eq!(table_rows(&e).await, oracle(&flow, &batches));
        e.apply(&b, at(2)).await.unwrap();
        batches.push(b);
        for i in 3..12 {
            let b = evs_batch(&flow, i);
            e.apply(&b, at(i)).await.unwrap();
            batches.push(b);
        }
        assert_eq!(table_rows(&e).await, oracle(&flow, &batches));
        assert_referenced_exist(&cat, e.target()).await;
        let stats = maintain::stats(cat.file_io(), e.target()).await.unwrap();
        assert!(stats.manifests <= 3, "{stats:?}");
    });
}

#[test]
fn another_writers_tag_and_snapshots_survive_expiry_and_orphan_cleanup() {
    let tmp = tempfile::tempdir().unwrap();
    let flow = flow_keeping(1);
    let faults = Arc::new(Faults::default());
    let at = clock();
    rt().block_on(async {
        let cat = catalog(tmp.path(), faults.clone());
        let mut e = open(&cat, &flow, &faults).await;
        let mut batches = Vec::new();
        for i in 0..3 {
            let b = evs_batch(&flow, i);
            e.apply(&b, at(i)).await.unwrap();
            batches.push(b);
        }
        // Another writer tags the first snapshot.
        let t = cat.load_table(&flow.target).await.unwrap().unwrap();
        let first = t
            .metadata
            .snapshots()
            .map(|s| s.snapshot_id())
            .min_by_key(|id| t.metadata.snapshot_by_id(*id).unwrap().sequence_number());
        cat.commit(
            &t,
            vec![TableUpdate::SetSnapshotRef {
                ref_name: "audit".into(),
                reference: iceberg::spec::SnapshotReference::new(
                    first.unwrap(),
                    iceberg::spec::SnapshotRetention::Tag {
                        max_ref_age_ms: None,
                    },
                ),
            }],
            vec![],
        )
        .await
        .unwrap();
        // This engine's view is stale: its expiry loses the race cleanly.
        let report = run(&mut e, at(30)).await;
        assert_eq!(report.target.snapshots_expired, 0, "{report:?}");
        assert!(!report.target.notes.is_empty(), "{report:?}");
        let mut e = open(&catalog(tmp.path(), faults.clone()), &flow, &faults).await;
        for i in 3..12 {
            let b = evs_batch(&flow, i);
            e.apply(&b, at(i)).await.unwrap();
            batches.push(b);
        }
        // A stray file of a crashed writer, four days old, and a fresh one.
        let data = tmp.path().join("crm/customers/data");
        let old = data.join("stray-old.parquet");
        let new = data.join("stray-new.parquet");
        for f in [&old, &new] {
            std::fs::write(f, b"not parquet").unwrap();
        }
        let four_days = std::time::SystemTime::now() - Duration::from_secs(4 * 86400);
        std::fs::File::options()
            .write(true)
            .open(&old)
            .unwrap()
            .set_modified(four_days)
            .unwrap();
        let report = e
            .maintain(&MaintainOptions {
                now_ms: at(11),
                dry_run: false,
                orphans_older_than: Some(Duration::from_secs(3 * 86400)),
                compact: false,
            })
            .await
            .unwrap();
        assert!(report.target.snapshots_expired > 0, "{report:?}");
        assert!(!old.exists(), "{report:?}");
        assert!(new.exists(), "a file younger than the window stays");
        let t = cat.load_table(&flow.target).await.unwrap().unwrap();
        assert!(t.metadata.snapshot_by_id(first.unwrap()).is_some());
        assert_referenced_exist(&cat, &t).await;
        // The tagged snapshot still reads as it was.
        let tagged = t
            .table(cat.file_io())
            .unwrap()
            .scan()
            .snapshot_id(first.unwrap())
            .select_all()
            .build()
            .unwrap()
            .to_arrow()
            .await
            .unwrap();
        use futures::TryStreamExt;
        let got: Vec<RecordBatch> = tagged.try_collect().await.unwrap();
        let rows: BTreeSet<Vec<String>> = got.iter().flat_map(render_all).collect();
        assert_eq!(rows, oracle(&flow, &batches[..1]));
        assert_eq!(table_rows(&e).await, oracle(&flow, &batches));
    });
}

#[test]
fn snapshots_expire_by_age_and_count_as_in_iceberg_java() {
    let tmp = tempfile::tempdir().unwrap();
    let flow = flow_keeping(1);
    let faults = Arc::new(Faults::default());
    rt().block_on(async {
        let cat = catalog(tmp.path(), faults.clone());
        let mut e = open(&cat, &flow, &faults).await;
        for i in 0..6 {
            e.apply(&evs_batch(&flow, i), 1_000_000 + i * 10_000)
                .await
                .unwrap();
        }
        let meta = e.target().metadata.clone();
        let mut snaps: Vec<_> = meta.snapshots().cloned().collect();
        snaps.sort_by_key(|s| s.sequence_number());
        let ts: Vec<i64> = snaps.iter().map(|s| s.timestamp_ms()).collect();
        let ids: Vec<i64> = snaps.iter().map(|s| s.snapshot_id()).collect();
        let none = Default::default();
        let keep = |age: i64, min: usize| autocdc::table::properties::Retention {
            max_age_ms: age,
            min_keep: min,
            max_count: usize::MAX,
        };
        // Younger than the age limit stays; older goes.
        let got = maintain::expirable(&meta, ts[5], keep(ts[5] - ts[3], 1), &none);
        let mut want = ids[..3].to_vec();
        want.sort();
        assert_eq!(got, want);
        // The minimum count wins over age.
        let got = maintain::expirable(&meta, ts[5] + 1_000_000, keep(1, 4), &none);
        let mut want = ids[..2].to_vec();
        want.sort();
        assert_eq!(got, want);
        // The head and what the caller protects never expire.
        let protect = [ids[0]].into_iter().collect();
        let got = maintain::expirable(&meta, ts[5] + 1_000_000, keep(1, 1), &protect);
        let mut want = ids[1..5].to_vec();
        want.sort();
        assert_eq!(got, want);
        // The count limit (autocdc's): however young, a branch keeps at most
        // max_count, and never fewer than the minimum count.
        let count = |max: usize, min: usize| autocdc::table::properties::Retention {
            max_age_ms: i64::MAX / 2,
            min_keep: min,
            max_count: max,
        };
        let got = maintain::expirable(&meta, ts[5], count(2, 1), &none);
        let mut want = ids[..4].to_vec();
        want.sort();
        assert_eq!(got, want);
        let got = maintain::expirable(&meta, ts[5], count(2, 3), &none);
        let mut want = ids[..3].to_vec();
        want.sort();
        assert_eq!(got, want);
        assert!(maintain::expirable(&meta, ts[5], count(6, 1), &none).is_empty());
    });
}

/// Issue 49: at a high commit rate the snapshot count, not only the age,
/// bounds metadata.json by default: a young table over the flow's
/// `snapshot_max_count` is cut back to it by maintenance, and the scheduled
/// maintenance's trigger (`expirable_snapshots`) sees it; the table still
/// reads as the oracle says.
#[test]
fn young_snapshots_over_the_count_limit_expire() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = customers_config();
    cfg.snapshot_max_count = Some(4);
    let flow = Flow::new(cfg).unwrap();
    let faults = Arc::new(Faults::default());
    rt().block_on(async {
        let cat = catalog(tmp.path(), faults.clone());
        let mut e = open(&cat, &flow, &faults).await;
        let mut batches = Vec::new();
        for i in 0..12 {
            let b = evs_batch(&flow, i);
            e.apply(&b, 1_000_000 + i * 10).await.unwrap();
            batches.push(b);
        }
        let now = 1_000_000 + 200;
        assert!(e.target().metadata.snapshots().len() >= 12);
        assert!(
            e.expirable_snapshots(now) >= 8,
            "the trigger sees the surplus"
        );
        // Without the flow's limit, the default (500) keeps all twelve.
        let meta = &e.target().metadata;
        let default = autocdc::table::properties::Retention::of(meta, &Default::default());
        assert_eq!(
            default.max_count,
            autocdc::table::properties::DEFAULT_MAX_COUNT
        );
        assert!(maintain::expirable(meta, now, default, &Default::default()).is_empty());
        run(&mut e, now).await;
        let t = cat.load_table(&flow.target).await.unwrap().unwrap();
        assert!(
            t.metadata.snapshots().len() <= 4,
            "{} snapshots kept",
            t.metadata.snapshots().len()
        );
        assert_referenced_exist(&cat, &t).await;
        assert_eq!(table_rows(&e).await, oracle(&flow, &batches));
    });
}

#[test]
fn table_properties_of_the_flow_are_set_on_both_tables_and_kept_in_step() {
    let tmp = tempfile::tempdir().unwrap();
    let faults = Arc::new(Faults::default());
    let at = clock();
    let mut cfg = customers_config();
    cfg.table_properties = [(
        autocdc::table::properties::PROP_MERGE_MIN_COUNT.to_string(),
        "3".to_string(),
    )]
    .into();
    let flow = Flow::new(cfg.clone()).unwrap();
    rt().block_on(async {
        let cat = catalog(tmp.path(), faults.clone());
        let mut e = open(&cat, &flow, &faults).await;
        for t in [e.target(), e.state_table()] {
            let props = t.metadata.properties();
            assert_eq!(
                props
                    .get(autocdc::table::properties::PROP_MERGE_MIN_COUNT)
                    .map(String::as_str),
                Some("3")
            );
            assert_eq!(
                props
                    .get(autocdc::table::properties::PROP_DELETE_AFTER_COMMIT)
                    .map(String::as_str),
                Some("true")
            );
        }
        let mut batches = Vec::new();
        for i in 0..10 {
            let b = evs_batch(&flow, i);
            e.apply(&b, at(i)).await.unwrap();
            batches.push(b);
        }
        let stats = maintain::stats(cat.file_io(), e.target()).await.unwrap();
        assert!(stats.manifests <= 3, "{stats:?}");
        // A changed definition changes the tables when the flow opens.
        cfg.table_properties = [(
            autocdc::table::properties::PROP_MERGE_MIN_COUNT.to_string(),
            "50".to_string(),
        )]
        .into();
        let flow = Flow::new(cfg.clone()).unwrap();
        let e = open(&cat, &flow, &faults).await;
        for t in [e.target(), e.state_table()] {
            let props = t.metadata.properties();
            assert_eq!(
                props
                    .get(autocdc::table::properties::PROP_MERGE_MIN_COUNT)
                    .map(String::as_str),
                Some("50")
            );
        }
        assert_eq!(table_rows(&e).await, oracle(&flow, &batches));
        // autocdc's own properties cannot be overridden.
        cfg.table_properties =
            [("write.delete.mode".to_string(), "copy-on-write".to_string())].into();
        let err = Flow::new(cfg).unwrap_err();
        assert_eq!(err.code(), "AUTOCDC_INVALID_DEFINITION", "{err}");
    });
}

/// Issue 49: `autocdc apply` run again and again (a cron) keeps a table
/// under its snapshot count limit: past it, the run ends with the expiry
/// the service's schedule would make; the rows stay the oracle's.
#[test]
fn apply_cuts_a_table_back_to_its_snapshot_count_limit() {
    let tmp = tempfile::tempdir().unwrap();
    let (wh, cfg, input) = (
        tmp.path().join("wh"),
        tmp.path().join("autocdc.toml"),
        tmp.path().join("changes.ndjson"),
    );
    std::fs::create_dir_all(&wh).unwrap();
    std::fs::write(
        &cfg,
        format!(
            "[catalog]\ntype = \"hadoop\"\nwarehouse = {:?}\n\n[[flow]]\n{}\nsnapshot_max_count = 3\n",
            wh.to_str().unwrap(),
            CUSTOMERS.trim()
        ),
    )
    .unwrap();
    let lines: Vec<String> = (1..=8)
        .map(|i| {
            format!(
                r#"{{"id": {}, "city": "c{i}", "op": "UPSERT", "seq": {i}}}"#,
                i % 5
            )
        })
        .collect();
    std::fs::write(&input, lines.join("\n")).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_autocdc"))
        .args([
            "apply",
            "--config",
            cfg.to_str().unwrap(),
            "--flow",
            "customers",
        ])
        .args(["--batch-rows", "1", input.to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("over the snapshot count limit"), "{stdout}");
    let faults = Arc::new(Faults::default());
    rt().block_on(async {
        let cat = catalog(&wh, faults.clone());
        let mut cfg = customers_config();
        cfg.snapshot_max_count = Some(3);
        let flow = Flow::new(cfg).unwrap();
        let e = open(&cat, &flow, &faults).await;
        let n = e.target().metadata.snapshots().len();
        assert!((1..=3).contains(&n), "{n} snapshots kept");
        assert!(e.state_table().metadata.snapshots().len() <= 3);
        let got = table_rows(&e).await;
        assert_eq!(got.len(), 5, "{got:?}");
        assert!(got.iter().any(|r| r.contains(&"c8".to_string())), "{got:?}");
    });
}
