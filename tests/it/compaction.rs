//! Compaction inside the writer: the table stays equal to the oracle, rows
//! move with their state so they are removed by position only (no equality
//! delete is ever written for a row autocdc wrote), files shrink to a few per
//! partition, and a crash anywhere in a compaction, or a race with another
//! writer, loses and resurrects nothing.

use crate::common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use arrow_array::RecordBatch;
use autocdc::core::flow::{CompactionConfig, Flow};
use autocdc::fault::{FaultPoint, Faults};
use autocdc::table::catalog::hadoop::HadoopCatalog;
use autocdc::table::catalog::{Catalog, TableState};
use autocdc::table::compact::{self, CompactionReport};
use autocdc::table::engine::Engine;
use common::scd::*;
use common::*;

fn catalog(dir: &Path, faults: Arc<Faults>) -> Arc<dyn Catalog> {
    Arc::new(HadoopCatalog::new(dir.to_str().unwrap(), None, faults).unwrap())
}

fn compacting(mut cfg: autocdc::core::flow::FlowConfig, min_files: usize) -> Flow {
    cfg.compaction = Some(CompactionConfig {
        min_input_files: Some(min_files),
        min_delete_files: Some(2),
        ..Default::default()
    });
    Flow::new(cfg).unwrap()
}

async fn open(cat: &Arc<dyn Catalog>, flow: &Flow, faults: &Arc<Faults>) -> Engine {
    Engine::open(flow.clone(), cat.clone(), faults.clone())
        .await
        .unwrap()
}

/// (data files, position-delete files, equality-delete files) of a table now.
async fn files(cat: &Arc<dyn Catalog>, t: &TableState) -> (usize, usize, usize) {
    let t = cat.load_table(&t.ident).await.unwrap().unwrap();
    match compact::inventory(cat.file_io(), &t).await.unwrap() {
        None => (0, 0, 0),
        Some(i) => (i.data.len(), i.pos_deletes.len(), i.eq_deletes.len()),
    }
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

async fn compact(e: &mut Engine) -> CompactionReport {
    e.compact(now(), false).await.unwrap()
}

/// Updates and deletes over `keys` keys, some late: batch `i` of a run.
fn changes(flow: &Flow, i: i64, keys: i64) -> RecordBatch {
    let cities = ["Leeds", "York", "Bath", "Ely"];
    let evs: Vec<Ev> = (0..6)
        .map(|k| {
            let id = (i * 5 + k * 7) % keys;
            // Every third change is late: an older sequence than the batch's.
            let seq = if k % 3 == 2 {
                i * 10 + k - 25
            } else {
                i * 10 + k
            };
            if (i + k) % 7 == 0 {
                d(id, seq)
            } else {
                u(id, cities[((i + k) % 4) as usize], seq)
            }
        })
        .collect();
    batch(flow, &evs)
}

/// Applies batches `range` of `changes` over `keys` keys, kept in `applied`.
async fn apply_changes(
    e: &mut Engine,
    flow: &Flow,
    range: std::ops::Range<i64>,
    keys: i64,
    applied: &mut Vec<RecordBatch>,
) {
    for i in range {
        let b = changes(flow, i, keys);
        e.apply(&b, now()).await.unwrap();
        applied.push(b);
    }
}

#[test]
fn compaction_rewrites_small_files_and_rows_stay_removed_by_position() {
    let tmp = tempfile::tempdir().unwrap();
    let faults = Arc::new(Faults::default());
    let flow = compacting(customers_config(), 2);
    rt().block_on(async {
        let cat = catalog(tmp.path(), faults.clone());
        let mut e = open(&cat, &flow, &faults).await;
        let mut applied = Vec::new();
        apply_changes(&mut e, &flow, 0..24, 20, &mut applied).await;
        let (data, pos, eq) = files(&cat, e.target()).await;
        assert!(
            data >= 20 && pos >= 10,
            "{data} data, {pos} delete files before"
        );
        assert_eq!(eq, 0);
        let before = table_rows(&e).await;
        assert_eq!(before, oracle(&flow, &applied));

        let r = compact(&mut e).await;
        assert!(r.skipped.is_none(), "{r:?}");
        assert_eq!(r.data_files_rewritten + r.data_files_dropped, data, "{r:?}");
        assert_eq!(r.data_files_written, 1, "{r:?}");
        assert_eq!(r.rows_moved as usize, before.len(), "{r:?}");
        assert!(r.rows_dropped + r.data_files_dropped as u64 > 0, "{r:?}");
        assert_eq!(files(&cat, e.target()).await, (1, 0, 0));
        assert_eq!(table_rows(&e).await, before);
        let (state_files, _, _) = files(&cat, e.state_table()).await;
        assert_eq!(state_files, 1, "the state table is rewritten whole too");
        let snap = e.target().metadata.current_snapshot().unwrap();
        assert_eq!(snap.summary().operation, iceberg::spec::Operation::Replace);

        // Later changes of compacted rows remove them by position in the new file.
        for i in 24..32 {
            let b = changes(&flow, i, 20);
            e.apply(&b, now()).await.unwrap();
            applied.push(b);
            let (_, pos, eq) = files(&cat, e.target()).await;
            assert_eq!(eq, 0, "batch {i}: an equality delete was written");
            assert!(pos > 0);
            assert_eq!(table_rows(&e).await, oracle(&flow, &applied));
        }
        // After a restart too, and a second compaction.
        let mut e = open(&catalog(tmp.path(), faults.clone()), &flow, &faults).await;
        assert_eq!(table_rows(&e).await, oracle(&flow, &applied));
        compact(&mut e).await;
        apply_changes(&mut e, &flow, 32..36, 20, &mut applied).await;
        assert_eq!(files(&cat, e.target()).await.2, 0);
        let e = open(&catalog(tmp.path(), faults.clone()), &flow, &faults).await;
        assert_eq!(table_rows(&e).await, oracle(&flow, &applied));
        // Both tables name only files that exist.
        for t in [e.target(), e.state_table()] {
            let ids: Vec<i64> = t.metadata.snapshots().map(|s| s.snapshot_id()).collect();
            let r = autocdc::table::maintain::reachable(cat.file_io(), t, ids)
                .await
                .unwrap();
            for p in r.files.keys() {
                assert!(cat.file_io().exists(p).await.unwrap(), "{p} is gone");
            }
        }
    });
}

#[test]
fn a_dry_run_changes_nothing_and_a_quiet_table_is_left_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let faults = Arc::new(Faults::default());
    let flow = compacting(customers_config(), 5);
    rt().block_on(async {
        let cat = catalog(tmp.path(), faults.clone());
        let mut e = open(&cat, &flow, &faults).await;
        for i in 0..3 {
            e.apply(&changes(&flow, i, 50), now()).await.unwrap();
        }
        let before = files(&cat, e.target()).await;
        let snaps = e.target().metadata.snapshots().count();
        // 3 small files, fewer than min_input_files, no heavy deletes: nothing.
        let r = compact(&mut e).await;
        assert_eq!(r.skipped.as_deref(), Some("nothing to compact"), "{r:?}");
        for i in 3..8 {
            e.apply(&changes(&flow, i, 50), now()).await.unwrap();
        }
        let before8 = files(&cat, e.target()).await;
        assert!(before8.0 > before.0);
        let snaps8 = e.target().metadata.snapshots().count();
        assert!(snaps8 > snaps);
        let dry = e.compact(now(), true).await.unwrap();
        assert!(dry.data_files_rewritten >= 5, "{dry:?}");
        assert_eq!(files(&cat, e.target()).await, before8);
        assert_eq!(e.target().metadata.snapshots().count(), snaps8);
    });
}

/// Random changes with compactions (with random thresholds) at random
/// points, restarts, and crashes injected at every step of a compaction's
/// commit: after each step the table equals the oracle, and no equality
/// delete is ever written.
#[test]
fn random_batches_with_compactions_crashes_and_restarts_match_the_oracle() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    const POINTS: [FaultPoint; 6] = [
        FaultPoint::AfterCompactionFiles,
        FaultPoint::AfterStateFile,
        FaultPoint::AfterStateMetadata,
        FaultPoint::AfterStateCommit,
        FaultPoint::AfterTargetMetadata,
        FaultPoint::AfterTargetCommit,
    ];
    let rt = rt();
    let mut runner = TestRunner::new(Config {
        cases: 20,
        ..Config::default()
    });
    let strategy = (
        prop::collection::vec((0i64..6, any::<bool>(), 0usize..3, 0i64..14), 1..30),
        prop::collection::vec(any::<bool>(), 30),
        prop::collection::vec(0u8..6, 30),
        1usize..4,
        0usize..6,
    );
    runner
        .run(&strategy, |(evs, cuts, actions, min_files, point)| {
            let cities = ["Leeds", "York", "Bath"];
            let mut cfg = customers_config();
            cfg.compaction = Some(CompactionConfig {
                min_input_files: Some(min_files),
                min_delete_files: Some(min_files + 1),
                delete_ratio: Some(0.2 * min_files as f64),
                ..Default::default()
            });
            let flow = Flow::new(cfg).unwrap();
            let evs: Vec<Ev> = evs
                .iter()
                .map(|&(k, del, c, s)| if del { d(k, s) } else { u(k, cities[c], s) })
                .collect();
            let arrow = cut_batches(&flow, &evs, &cuts);
            let tmp = tempfile::tempdir().unwrap();
            let faults = Arc::new(Faults::default());
            rt.block_on(async {
                let cat = catalog(tmp.path(), faults.clone());
                let mut e = open(&cat, &flow, &faults).await;
                for (i, b) in arrow.iter().enumerate() {
                    e.apply(b, now()).await.unwrap();
                    match actions[i] {
                        1 => {
                            compact(&mut e).await;
                        }
                        2 => {
                            compact(&mut e).await;
                            e = open(&catalog(tmp.path(), faults.clone()), &flow, &faults).await;
                        }
                        3 => {
                            faults.arm(POINTS[point], 0);
                            let crashed = e.compact(now(), false).await.is_err();
                            // Disarm a fault the run did not reach (nothing to do).
                            let _ = faults.hit(POINTS[point]);
                            let _ = crashed;
                            e = open(&catalog(tmp.path(), faults.clone()), &flow, &faults).await;
                        }
                        4 => e = open(&catalog(tmp.path(), faults.clone()), &flow, &faults).await,
                        _ => {}
                    }
                    assert_eq!(
                        table_rows(&e).await,
                        oracle(&flow, &arrow[..=i]),
                        "after batch {i}"
                    );
                    assert_eq!(
                        files(&cat, e.target()).await.2,
                        0,
                        "equality deletes after batch {i}"
                    );
                }
            });
            Ok(())
        })
        .unwrap();
}

#[test]
fn scd2_history_compacted_mid_way_keeps_every_version_and_late_events_split_by_position() {
    let tmp = tempfile::tempdir().unwrap();
    let faults = Arc::new(Faults::default());
    let flow = compacting(toml::from_str(&people_toml(SCD2, "crm.people")).unwrap(), 2);
    rt().block_on(async {
        let cat = catalog(tmp.path(), faults.clone());
        let mut e = open(&cat, &flow, &faults).await;
        let cities = ["Leeds", "York", "Bath"];
        let mut applied = Vec::new();
        for i in 0..12i64 {
            let evs: Vec<PEv> = (0..4)
                .map(|k| {
                    let id = (i + k) % 5;
                    if (i + k) % 6 == 5 {
                        del(id, i * 10 + k)
                    } else {
                        up(id, cities[((i * k) % 3) as usize], "n", i * 10 + k)
                    }
                })
                .collect();
            let b = people_batch(&flow, &evs);
            e.apply(&b, now()).await.unwrap();
            applied.push(b);
        }
        let before = table_rows(&e).await;
        assert_eq!(before, people_oracle(SCD2, &flow, &applied));
        let r = compact(&mut e).await;
        assert!(r.data_files_rewritten > 1, "{r:?}");
        assert_eq!(files(&cat, e.target()).await, (1, 0, 0));
        assert_eq!(table_rows(&e).await, before);
        // Late events land inside closed intervals: they split them, by position.
        for (i, evs) in [
            vec![up(1, "Ely", "late", 35), up(2, "Ely", "late", 12)],
            vec![del(3, 47), up(4, "Ely", "n", 200)],
            vec![up(0, "Ely", "late", 1)],
        ]
        .into_iter()
        .enumerate()
        {
            let b = people_batch(&flow, &evs);
            e.apply(&b, now()).await.unwrap();
            applied.push(b);
            assert_eq!(
                table_rows(&e).await,
                people_oracle(SCD2, &flow, &applied),
                "late batch {i}"
            );
            assert_eq!(files(&cat, e.target()).await.2, 0);
        }
        let mut e = open(&catalog(tmp.path(), faults.clone()), &flow, &faults).await;
        compact(&mut e).await;
        let e = open(&catalog(tmp.path(), faults.clone()), &flow, &faults).await;
        assert_eq!(table_rows(&e).await, people_oracle(SCD2, &flow, &applied));
    });
}

#[test]
fn partitioned_targets_compact_per_partition() {
    let tmp = tempfile::tempdir().unwrap();
    let faults = Arc::new(Faults::default());
    let mut cfg = customers_config();
    cfg.partition_by = vec!["bucket[3](id)".into()];
    let flow = compacting(cfg, 2);
    rt().block_on(async {
        let cat = catalog(tmp.path(), faults.clone());
        let mut e = open(&cat, &flow, &faults).await;
        let mut applied = Vec::new();
        apply_changes(&mut e, &flow, 0..16, 30, &mut applied).await;
        compact(&mut e).await;
        let t = cat.load_table(&e.target().ident).await.unwrap().unwrap();
        let inv = compact::inventory(cat.file_io(), &t)
            .await
            .unwrap()
            .unwrap();
        let mut per_partition: HashMap<String, usize> = HashMap::new();
        for f in &inv.data {
            *per_partition
                .entry(format!("{:?}", f.file.partition()))
                .or_default() += 1;
        }
        assert!(per_partition.len() >= 2, "{per_partition:?}");
        assert!(per_partition.values().all(|&n| n == 1), "{per_partition:?}");
        assert_eq!((inv.pos_deletes.len(), inv.eq_deletes.len()), (0, 0));
        assert_eq!(table_rows(&e).await, oracle(&flow, &applied));
        apply_changes(&mut e, &flow, 16..22, 30, &mut applied).await;
        assert_eq!(files(&cat, e.target()).await.2, 0);
        let e = open(&catalog(tmp.path(), faults.clone()), &flow, &faults).await;
        assert_eq!(table_rows(&e).await, oracle(&flow, &applied));
    });
}

/// Another writer appends between this engine's last look and its
/// compaction commit: the compaction is abandoned (nothing of it lands), the
/// next run compacts on the new base, and no row is lost or comes back.
#[test]
fn a_compaction_that_loses_a_race_with_another_writer_is_abandoned_cleanly() {
    let tmp = tempfile::tempdir().unwrap();
    let faults = Arc::new(Faults::default());
    let flow = compacting(customers_config(), 2);
    rt().block_on(async {
        let cat = catalog(tmp.path(), faults.clone());
        let mut e = open(&cat, &flow, &faults).await;
        let mut applied = Vec::new();
        apply_changes(&mut e, &flow, 0..10, 20, &mut applied).await;
        let ours = table_rows(&e).await;
        // The other writer: one row with a key autocdc never saw.
        let foreign = batch(&flow, &[u(900, "Oslo", 1)]);
        foreign_commit(
            cat.as_ref(),
            &flow.target,
            &target_rows_of(&flow, &foreign),
            false,
        )
        .await;

        let snaps = cat
            .load_table(&flow.target)
            .await
            .unwrap()
            .unwrap()
            .metadata
            .snapshots()
            .count();
        let r = compact(&mut e).await;
        assert!(
            r.skipped
                .as_deref()
                .is_some_and(|s| s.starts_with("abandoned")),
            "{r:?}"
        );
        let t = cat.load_table(&flow.target).await.unwrap().unwrap();
        assert_eq!(
            t.metadata.snapshots().count(),
            snaps,
            "nothing of the compaction landed"
        );
        let mut expected = ours.clone();
        expected.extend(table_rows(&e).await.into_iter().filter(|r| r[0] == "900"));
        assert_eq!(expected.len(), ours.len() + 1);
        assert_eq!(table_rows(&e).await, expected);
        // The next run compacts on the new base: the foreign row is kept.
        let r = compact(&mut e).await;
        assert!(r.skipped.is_none(), "{r:?}");
        assert_eq!(table_rows(&e).await, expected);
        assert_eq!(files(&cat, e.target()).await, (1, 0, 0));
        // And changes after it still apply.
        let b = changes(&flow, 10, 20);
        e.apply(&b, now()).await.unwrap();
        applied.push(b);
        let mut want = oracle(&flow, &applied);
        want.extend(expected.into_iter().filter(|r| r[0] == "900"));
        assert_eq!(table_rows(&e).await, want);

        // The other writer's row has no position in the state: replacing it
        // takes an equality delete, which the next compaction converts away
        // (the file it applies to is rewritten without the row).
        let b = batch(&flow, &[u(900, "Bergen", 2)]);
        e.apply(&b, now()).await.unwrap();
        applied.push(b);
        assert_eq!(files(&cat, e.target()).await.2, 1, "one equality delete");
        let want = oracle(&flow, &applied);
        assert!(want.iter().any(|r| r[0] == "900" && r[1] == "Bergen"));
        assert_eq!(table_rows(&e).await, want);
        let r = compact(&mut e).await;
        assert_eq!(r.equality_delete_files_removed, 1, "{r:?}");
        assert_eq!(files(&cat, e.target()).await.2, 0);
        assert_eq!(table_rows(&e).await, want);
        let e = open(&catalog(tmp.path(), faults.clone()), &flow, &faults).await;
        assert_eq!(table_rows(&e).await, want);
    });
}

/// With no file small or delete-heavy enough to rewrite, a partition's
/// position-delete files are merged into one (entries for dropped files
/// left out): the table reads the same, later deletes still apply, and the
/// merged file keeps applying after a restart.
#[test]
fn position_delete_files_alone_are_merged() {
    let tmp = tempfile::tempdir().unwrap();
    let faults = Arc::new(Faults::default());
    let mut cfg = customers_config();
    cfg.compaction = Some(CompactionConfig {
        min_file_size_ratio: Some(0.0),
        delete_ratio: Some(1.0),
        min_delete_files: Some(2),
        ..Default::default()
    });
    let flow = Flow::new(cfg).unwrap();
    rt().block_on(async {
        let cat = catalog(tmp.path(), faults.clone());
        let mut e = open(&cat, &flow, &faults).await;
        let mut applied = Vec::new();
        apply_changes(&mut e, &flow, 0..30, 12, &mut applied).await;
        let (data, pos, _) = files(&cat, e.target()).await;
        assert!(pos >= 10, "{pos} delete files");
        let r = compact(&mut e).await;
        assert_eq!(r.data_files_rewritten, 0, "{r:?}");
        assert_eq!(r.delete_files_written, 1, "{r:?}");
        let (data_after, pos_after, eq) = files(&cat, e.target()).await;
        assert_eq!((pos_after, eq), (1, 0));
        assert_eq!(data_after, data - r.data_files_dropped);
        assert_eq!(table_rows(&e).await, oracle(&flow, &applied));
        apply_changes(&mut e, &flow, 30..36, 12, &mut applied).await;
        let e = open(&catalog(tmp.path(), faults.clone()), &flow, &faults).await;
        assert_eq!(table_rows(&e).await, oracle(&flow, &applied));
    });
}
