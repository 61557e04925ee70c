//! `apply_as_truncates` (SCD Type 1) through the real write path on the
//! Hadoop catalog: a truncate at sequence s removes every row below s,
//! later changes apply as usual, and older ones stay out, in any order and
//! batching and across restarts.

use crate::common;

use std::collections::BTreeSet;
use std::sync::Arc;

use autocdc::core::flow::Flow;
use autocdc::fault::Faults;
use autocdc::table::catalog::Catalog;
use autocdc::table::catalog::hadoop::HadoopCatalog;
use common::*;

fn catalog(dir: &std::path::Path) -> Arc<dyn Catalog> {
    Arc::new(HadoopCatalog::new(dir.to_str().unwrap(), None, Arc::new(Faults::default())).unwrap())
}

fn flow(target: &str, ignore_nulls: bool) -> Flow {
    let mut cfg = customers_config();
    cfg.name = target.replace('.', "_");
    cfg.target = target.into();
    cfg.apply_as_truncates = Some("op = 'TRUNCATE'".into());
    cfg.ignore_null_updates = ignore_nulls;
    Flow::new(cfg).unwrap()
}

fn t(seq: i64) -> Ev {
    (0, "T", None, seq)
}

/// The oracle: the SCD Type 1 oracle over the changes, less every row
/// below the highest truncate.
fn truncate_oracle(flow: &Flow, evs: &[Ev]) -> BTreeSet<Vec<String>> {
    let floor = evs.iter().filter(|e| e.1 == "T").map(|e| e.3).max();
    let changes: Vec<Ev> = evs.iter().filter(|e| e.1 != "T").copied().collect();
    oracle(flow, &[batch(flow, &changes)])
        .into_iter()
        .filter(|r| floor.is_none_or(|f| r[2].parse::<i64>().unwrap() >= f))
        .collect()
}

async fn run(
    dir: &std::path::Path,
    flow: &Flow,
    batches: &[Vec<Ev>],
    restart: bool,
) -> BTreeSet<Vec<String>> {
    let mut engine = open_engine(&catalog(dir), flow).await;
    for (i, b) in batches.iter().enumerate() {
        engine
            .apply(&batch(flow, b), 1_000 + i as i64)
            .await
            .unwrap();
        if restart {
            engine = open_engine(&catalog(dir), flow).await;
        }
    }
    table_rows(&engine).await
}

fn check(batches: Vec<Vec<Ev>>, expected: &[&[&str]]) {
    let rt = rt();
    let tmp = tempfile::tempdir().unwrap();
    let expected = rows(expected);
    for (n, (restart, ignore_nulls)) in [(false, false), (true, false), (true, true)]
        .into_iter()
        .enumerate()
    {
        let f = flow(&format!("crm.c{n}"), ignore_nulls);
        let got = rt.block_on(run(tmp.path(), &f, &batches, restart));
        assert_eq!(
            got, expected,
            "restart {restart}, ignore_null_updates {ignore_nulls}"
        );
        let all: Vec<Ev> = batches.iter().flatten().copied().collect();
        assert_eq!(truncate_oracle(&f, &all), expected, "the oracle agrees");
    }
}

#[test]
fn a_truncate_removes_the_rows_below_it_and_later_changes_apply() {
    check(
        vec![
            vec![u(1, "Leeds", 1), u(2, "York", 2), u(3, "Bath", 6)],
            vec![t(5)],
            vec![u(4, "Hull", 7), u(1, "Derby", 8)],
        ],
        &[
            &["1", "Derby", "8"],
            &["3", "Bath", "6"],
            &["4", "Hull", "7"],
        ],
    );
}

#[test]
fn a_change_older_than_a_truncate_stays_out() {
    check(
        vec![
            vec![u(1, "Leeds", 1)],
            vec![t(5)],
            vec![u(2, "York", 3), u(1, "Bath", 4)],
        ],
        &[],
    );
}

#[test]
fn a_row_at_the_truncate_sequence_survives() {
    check(
        vec![vec![u(1, "Leeds", 5), u(2, "York", 4)], vec![t(5)]],
        &[&["1", "Leeds", "5"]],
    );
}

/// Found by the property test: the truncate's delete of key 3 (at the
/// truncate's sequence) tied with a later upsert at that sequence and could
/// win it; a change at the truncate's sequence always survives.
#[test]
fn a_change_at_the_truncate_sequence_arriving_later_survives() {
    check(
        vec![vec![u(3, "Leeds", 0)], vec![t(3)], vec![u(3, "York", 3)]],
        &[&["3", "York", "3"]],
    );
}

#[test]
fn a_late_truncate_removes_what_arrived_before_it() {
    check(
        vec![
            vec![u(1, "Leeds", 1), u(2, "York", 9)],
            vec![t(5)],
            vec![t(3)],
        ],
        &[&["2", "York", "9"]],
    );
}

#[test]
fn a_truncate_needs_no_key_and_counts_what_it_removed() {
    let rt = rt();
    let tmp = tempfile::tempdir().unwrap();
    let f = flow("crm.c", false);
    rt.block_on(async {
        let mut engine = open_engine(&catalog(tmp.path()), &f).await;
        engine
            .apply(&batch(&f, &[u(1, "Leeds", 1), u(2, "York", 2)]), 1)
            .await
            .unwrap();
        // A truncate row with a null key.
        let b = batch(&f, &[t(5)]);
        let mut cols = b.columns().to_vec();
        cols[0] = Arc::new(arrow_array::Int64Array::from(vec![None::<i64>]));
        let b = arrow_array::RecordBatch::try_new(b.schema(), cols).unwrap();
        let r = engine.apply(&b, 2).await.unwrap();
        assert_eq!(
            (r.stats.truncates, r.stats.truncated, r.stats.deletes),
            (1, 2, 0)
        );
        assert_eq!(r.stats.removed_by_position, 2);
        assert!(table_rows(&engine).await.is_empty());
        // A null key on an upsert is still rejected, naming the input row.
        let mut cols = batch(&f, &[t(6), u(1, "Bath", 7)]).columns().to_vec();
        cols[0] = Arc::new(arrow_array::Int64Array::from(vec![Some(1), None]));
        let b = arrow_array::RecordBatch::try_new(b.schema(), cols).unwrap();
        match engine.apply(&b, 3).await.unwrap_err() {
            autocdc::Error::Batch { code, row, .. } => {
                assert_eq!((code, row), ("AUTOCDC_MICROBATCH_VALIDATION.NULL_KEY", 1));
            }
            e => panic!("{e}"),
        }
        // The floor survives a restart even when the truncate removed nothing else.
        let mut engine = open_engine(&catalog(tmp.path()), &f).await;
        let r = engine.apply(&batch(&f, &[t(10)]), 4).await.unwrap();
        assert!(r.snapshot_id.is_some(), "a raised floor is committed");
        let mut engine = open_engine(&catalog(tmp.path()), &f).await;
        let r = engine
            .apply(&batch(&f, &[u(9, "Hull", 9)]), 5)
            .await
            .unwrap();
        assert_eq!(r.stats.stale, 1);
        assert!(table_rows(&engine).await.is_empty());
    });
}

#[test]
fn random_orders_and_batchings_with_truncates_match_the_oracle() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let rt = rt();
    let tmp = tempfile::tempdir().unwrap();
    let mut runner = TestRunner::new(Config {
        cases: 48,
        ..Config::default()
    });
    let strategy = (
        prop::collection::vec((0i64..4, 0u8..10, 0usize..3, 0i64..8), 1..20),
        prop::collection::vec(any::<bool>(), 20),
        prop::collection::vec(any::<bool>(), 20),
        any::<bool>(),
    );
    let cities = ["Leeds", "York", "Bath"];
    runner
        .run(&strategy, |(changes, cuts, restarts, ignore_nulls)| {
            let f = flow(&format!("crm.{}", unique("t")), ignore_nulls);
            let evs: Vec<Ev> = changes
                .iter()
                .map(|&(k, op, c, s)| match op {
                    0 => t(s),
                    1 | 2 => d(k, s),
                    _ => u(k, cities[c], s),
                })
                .collect();
            let mut batches: Vec<Vec<Ev>> = vec![Vec::new()];
            for (i, e) in evs.iter().enumerate() {
                batches.last_mut().unwrap().push(*e);
                if cuts[i] && i + 1 < evs.len() {
                    batches.push(Vec::new());
                }
            }
            let got = rt.block_on(async {
                let mut engine = open_engine(&catalog(tmp.path()), &f).await;
                for (i, b) in batches.iter().enumerate() {
                    engine.apply(&batch(&f, b), i as i64).await.unwrap();
                    if restarts[i] {
                        engine = open_engine(&catalog(tmp.path()), &f).await;
                    }
                }
                table_rows(&engine).await
            });
            prop_assert_eq!(got, truncate_oracle(&f, &evs));
            Ok(())
        })
        .unwrap();
}
