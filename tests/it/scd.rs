//! SCD Type 2 and ignore_null_updates through the real write path (Parquet
//! data and position-delete files, our snapshot producer, the Hadoop catalog
//! on local disk, the state table), read back with iceberg-rust's scan.

use crate::common;

use std::collections::BTreeSet;
use std::sync::Arc;

use autocdc::core::flow::Flow;
use autocdc::fault::Faults;
use autocdc::table::catalog::Catalog;
use autocdc::table::catalog::hadoop::HadoopCatalog;
use autocdc::table::engine::Engine;
use common::scd::*;
use common::*;

fn catalog(dir: &std::path::Path) -> Arc<dyn Catalog> {
    Arc::new(HadoopCatalog::new(dir.to_str().unwrap(), None, Arc::new(Faults::default())).unwrap())
}

/// Applies each batch in turn, reopening the flow (a process restart) after
/// every one when `restart`; returns the table and the last engine.
async fn run(
    dir: &std::path::Path,
    flow: &Flow,
    batches: &[Vec<PEv>],
    restart: bool,
) -> (BTreeSet<Vec<String>>, Engine) {
    let mut engine = open_engine(&catalog(dir), flow).await;
    for (i, b) in batches.iter().enumerate() {
        engine
            .apply(&people_batch(flow, b), 1_000 + i as i64)
            .await
            .unwrap();
        if restart {
            engine = open_engine(&catalog(dir), flow).await;
        }
    }
    (table_rows(&engine).await, engine)
}

/// Runs the case with and without restarts, in arrival order and as one
/// batch; all must give `expected` and the oracle's table.
fn check(shape: Shape, batches: Vec<Vec<PEv>>, expected: &[&[&str]]) {
    let rt = rt();
    let tmp = tempfile::tempdir().unwrap();
    let expected = rows(expected);
    let flat: Vec<PEv> = batches.iter().flatten().copied().collect();
    for (n, (bs, restart)) in [
        (batches.clone(), false),
        (batches.clone(), true),
        (vec![flat], false),
    ]
    .into_iter()
    .enumerate()
    {
        let flow = people(shape, &format!("crm.people{n}"));
        let (got, _) = rt.block_on(run(tmp.path(), &flow, &bs, restart));
        assert_eq!(got, expected, "run {n} (restart: {restart})");
        let arrow: Vec<_> = bs.iter().map(|b| people_batch(&flow, b)).collect();
        assert_eq!(
            people_oracle(shape, &flow, &arrow),
            expected,
            "the oracle agrees"
        );
    }
}

const UNTRACKED: Shape = Shape {
    untracked_note: true,
    ..SCD2
};

#[test]
fn a_customer_who_moves_twice_has_three_rows_two_closed_and_one_current() {
    check(
        SCD2,
        vec![
            vec![up(1, "Leeds", "a", 1)],
            vec![up(1, "York", "a", 5)],
            vec![up(1, "Bath", "a", 9)],
        ],
        &[
            &["1", "Leeds", "a", "1", "1", "5"],
            &["1", "York", "a", "5", "5", "9"],
            &["1", "Bath", "a", "9", "9", "NULL"],
        ],
    );
}

#[test]
fn a_change_to_an_untracked_column_alone_creates_no_version() {
    check(
        UNTRACKED,
        vec![
            vec![up(1, "Leeds", "a", 1)],
            vec![up(1, "Leeds", "b", 5)],
            vec![up(1, "York", "b", 9)],
        ],
        &[
            &["1", "Leeds", "b", "5", "1", "9"],
            &["1", "York", "b", "9", "9", "NULL"],
        ],
    );
}

#[test]
fn consecutive_changes_with_identical_tracked_values_open_no_version() {
    check(
        SCD2,
        vec![
            vec![up(1, "Leeds", "a", 1)],
            vec![up(1, "Leeds", "a", 3)],
            vec![up(1, "Leeds", "a", 2)],
        ],
        &[&["1", "Leeds", "a", "3", "1", "NULL"]],
    );
}

#[test]
fn a_late_event_splits_an_interval() {
    check(
        SCD2,
        vec![
            vec![up(1, "Leeds", "a", 1)],
            vec![up(1, "Bath", "a", 9)],
            vec![up(1, "York", "a", 5)],
        ],
        &[
            &["1", "Leeds", "a", "1", "1", "5"],
            &["1", "York", "a", "5", "5", "9"],
            &["1", "Bath", "a", "9", "9", "NULL"],
        ],
    );
}

#[test]
fn delete_then_reinsert() {
    check(
        SCD2,
        vec![
            vec![up(1, "Leeds", "a", 1)],
            vec![del(1, 4)],
            vec![up(1, "Leeds", "a", 7)],
        ],
        &[
            &["1", "Leeds", "a", "1", "1", "4"],
            &["1", "Leeds", "a", "7", "7", "NULL"],
        ],
    );
}

#[test]
fn a_late_delete_inside_history() {
    check(
        SCD2,
        vec![
            vec![up(1, "Leeds", "a", 1)],
            vec![up(1, "Bath", "a", 9)],
            vec![del(1, 5)],
        ],
        &[
            &["1", "Leeds", "a", "1", "1", "5"],
            &["1", "Bath", "a", "9", "9", "NULL"],
        ],
    );
}

#[test]
fn a_duplicate_changes_nothing() {
    check(
        SCD2,
        vec![
            vec![up(1, "Leeds", "a", 1)],
            vec![up(1, "York", "a", 5)],
            vec![up(1, "Leeds", "a", 1)],
        ],
        &[
            &["1", "Leeds", "a", "1", "1", "5"],
            &["1", "York", "a", "5", "5", "NULL"],
        ],
    );
}

const IGNORE_NULLS_SCD1: Shape = Shape {
    scd2: false,
    untracked_note: false,
    ignore_nulls: true,
    ties_error: false,
    city_only_nulls: false,
};

#[test]
fn ignore_null_updates_keeps_the_columns_a_partial_update_leaves_out() {
    // The note arrives only with the first change; later ones omit it.
    check(
        IGNORE_NULLS_SCD1,
        vec![
            vec![up(1, "Leeds", "vip", 1)],
            vec![(1, false, Some("York"), None, 5)],
            vec![(1, false, None, Some("gold"), 3)],
        ],
        &[&["1", "York", "gold", "5"]],
    );
}

#[test]
fn ignore_null_updates_after_a_delete_keeps_nothing() {
    check(
        IGNORE_NULLS_SCD1,
        vec![
            vec![up(1, "Leeds", "vip", 1)],
            vec![del(1, 2)],
            vec![(1, false, Some("York"), None, 3)],
        ],
        &[&["1", "York", "NULL", "3"]],
    );
}

#[test]
fn ignore_null_updates_with_scd2_fills_versions_from_the_one_before() {
    check(
        Shape {
            ignore_nulls: true,
            ..SCD2
        },
        vec![
            vec![up(1, "Leeds", "vip", 1)],
            vec![(1, false, Some("York"), None, 5)],
        ],
        &[
            &["1", "Leeds", "vip", "1", "1", "5"],
            &["1", "York", "vip", "5", "5", "NULL"],
        ],
    );
}

#[test]
fn closing_a_version_is_a_position_delete_and_an_insert() {
    let rt = rt();
    let tmp = tempfile::tempdir().unwrap();
    let flow = people(SCD2, "crm.people");
    rt.block_on(async {
        let cat = catalog(tmp.path());
        let mut engine = open_engine(&cat, &flow).await;
        engine
            .apply(
                &people_batch(&flow, &[up(1, "Leeds", "a", 1), up(2, "Hull", "a", 1)]),
                1,
            )
            .await
            .unwrap();
        let r = engine
            .apply(&people_batch(&flow, &[up(1, "York", "a", 5)]), 2)
            .await
            .unwrap();
        // The open Leeds row is removed by position; the closed one and York are written.
        assert_eq!(r.stats.removed_by_position, 1);
        assert_eq!(r.stats.removed_by_key, 0);
        assert_eq!(r.rows_written, 2);
        assert_eq!(r.delete_files, 1);
        // A duplicate writes nothing and commits nothing.
        let r = engine
            .apply(&people_batch(&flow, &[up(1, "York", "a", 5)]), 3)
            .await
            .unwrap();
        assert_eq!(r.snapshot_id, None);
        assert_eq!(r.stats.duplicates, 1);
        assert_eq!(
            snapshot_property(&engine, "total-position-deletes").as_deref(),
            Some("1")
        );
        assert_eq!(
            snapshot_property(&engine, "total-equality-deletes").as_deref(),
            Some("0")
        );
    });
}

#[test]
fn a_multi_column_sequence_gives_struct_intervals() {
    let rt = rt();
    let tmp = tempfile::tempdir().unwrap();
    let toml = people_toml(SCD2, "crm.people")
        .replace("track_history_except_column_list = [\"seq\"]\n", "")
        .replace("sequence_by = \"seq\"", "sequence_by = [\"seq\", \"note\"]")
        .replace(
            "stored_as_scd_type = 2",
            "stored_as_scd_type = 2\ntrack_history_column_list = [\"city\"]",
        );
    let flow = Flow::new(toml::from_str(&toml).unwrap()).unwrap();
    rt.block_on(async {
        let (got, engine) = run(
            tmp.path(),
            &flow,
            &[vec![up(1, "Leeds", "a", 1)], vec![up(1, "York", "b", 1)]],
            true,
        )
        .await;
        let start = engine
            .target()
            .metadata
            .current_schema()
            .field_by_name("__START_AT")
            .unwrap()
            .clone();
        assert!(
            matches!(start.field_type.as_ref(), iceberg::spec::Type::Struct(_)),
            "{start:?}"
        );
        assert_eq!(
            got,
            rows(&[
                &[
                    "1",
                    "Leeds",
                    "a",
                    "1",
                    "{seq: 1, note: a}",
                    "{seq: 1, note: b}"
                ],
                &["1", "York", "b", "1", "{seq: 1, note: b}", "NULL"],
            ])
        );
    });
}

#[test]
fn scd2_random_batchings_with_restarts_match_the_oracle() {
    random_history_batchings(SCD2, 24);
}

#[test]
fn ignore_null_updates_random_batchings_with_restarts_match_the_oracle() {
    random_history_batchings(IGNORE_NULLS_SCD1, 24);
}

fn random_history_batchings(shape: Shape, cases: u32) {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let rt = rt();
    let tmp = tempfile::tempdir().unwrap();
    let mut runner = TestRunner::new(Config {
        cases,
        ..Config::default()
    });
    let strategy = (
        prop::collection::vec(
            (
                0i64..3,
                prop::bool::weighted(0.2),
                0usize..4,
                0usize..3,
                0i64..6,
            ),
            1..16,
        ),
        prop::collection::vec(any::<bool>(), 16),
        prop::collection::vec(any::<bool>(), 16),
    );
    let cities = [Some("Leeds"), Some("York"), Some("Bath"), None];
    let notes = [Some("vip"), Some("new"), None];
    runner
        .run(&strategy, |(changes, cuts, restarts)| {
            let flow = people(shape, &format!("crm.{}", unique("p")));
            let evs: Vec<PEv> = changes
                .iter()
                .map(|&(k, d, c, n, s)| {
                    if d {
                        del(k, s)
                    } else {
                        (k, false, cities[c], notes[n], s)
                    }
                })
                .collect();
            let mut batches: Vec<Vec<PEv>> = vec![Vec::new()];
            for (i, e) in evs.iter().enumerate() {
                batches.last_mut().unwrap().push(*e);
                if cuts[i] && i + 1 < evs.len() {
                    batches.push(Vec::new());
                }
            }
            let got = rt.block_on(async {
                let mut engine = open_engine(&catalog(tmp.path()), &flow).await;
                for (i, b) in batches.iter().enumerate() {
                    engine
                        .apply(&people_batch(&flow, b), i as i64)
                        .await
                        .unwrap();
                    if restarts[i] {
                        engine = open_engine(&catalog(tmp.path()), &flow).await;
                    }
                }
                table_rows(&engine).await
            });
            let arrow: Vec<_> = batches.iter().map(|b| people_batch(&flow, b)).collect();
            prop_assert_eq!(got, people_oracle(shape, &flow, &arrow));
            Ok(())
        })
        .unwrap();
}

/// A partial-update flow on a target another writer filled: a key it has not
/// seen yet may have a row there, removed by an equality delete on the key.
#[test]
fn ignore_null_updates_replaces_rows_it_did_not_write() {
    let rt = rt();
    let tmp = tempfile::tempdir().unwrap();
    let partial = people(IGNORE_NULLS_SCD1, "crm.shared");
    rt.block_on(async {
        let cat = catalog(tmp.path());
        // The target made, then filled by another tool (a snapshot without
        // autocdc's marker), its state table gone.
        drop(open_engine(&cat, &partial).await);
        assert!(cat.drop_table(&partial.state_ident()).await.unwrap());
        let rows_of = |evs: &[PEv]| target_rows_of(&partial, &people_batch(&partial, evs));
        foreign_commit(
            cat.as_ref(),
            &partial.target,
            &rows_of(&[up(1, "Leeds", "vip", 1), up(2, "York", "new", 1)]),
            false,
        )
        .await;
        let mut e = open_engine(&cat, &partial).await;
        let r = e
            .apply(
                &people_batch(&partial, &[(1, false, Some("Bath"), None, 2)]),
                2,
            )
            .await
            .unwrap();
        assert_eq!(r.stats.removed_by_key, 1);
        assert_eq!(
            table_rows(&e).await,
            rows(&[&["1", "Bath", "NULL", "2"], &["2", "York", "new", "1"]])
        );
    });
}
