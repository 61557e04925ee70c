//! The SCD Type 1 edge-case battery on the pure resolver (through `Sim`, a
//! model table). Events are in arrival order; each inner vec is a micro-batch.
//! Every case also runs with a state restart between micro-batches.

use crate::common;

use autocdc::core::flow::{Flow, TiePolicy};
use autocdc::error::codes;
use common::*;

fn run(flow: &Flow, case: &Case, restart: bool) -> Sim {
    let mut sim = Sim::new(flow.clone());
    for evs in &case.batches {
        sim.apply(&batch(flow, evs)).unwrap();
        if restart {
            sim.restart();
        }
    }
    sim
}

fn check(case: Case) {
    let flow = customers();
    for restart in [false, true] {
        let sim = run(&flow, &case, restart);
        assert_eq!(
            sim.table(),
            case.expected,
            "case `{}` (restarts: {restart})",
            case.name
        );
        let all: Vec<_> = case.batches.iter().map(|b| batch(&flow, b)).collect();
        assert_eq!(
            oracle(&flow, &all),
            case.expected,
            "oracle disagrees on `{}`",
            case.name
        );
        // Every input row is counted exactly once.
        let s = sim.stats;
        assert_eq!(
            s.rows_in,
            s.upserts + s.deletes + s.stale + s.duplicates + s.tie_losers,
            "{s:?}"
        );
    }
}

#[test]
fn upsert_to_a_new_key() {
    check(cases::upsert_new_key());
}

#[test]
fn delete_of_a_key_that_never_existed() {
    check(cases::delete_never_existed());
}

#[test]
fn several_updates_in_one_batch() {
    check(cases::several_updates_one_batch());
}

#[test]
fn stale_delete() {
    check(cases::stale_delete());
}

#[test]
fn stale_insert_after_a_delete() {
    check(cases::stale_insert_after_delete());
}

#[test]
fn delete_before_an_older_insert() {
    check(cases::delete_before_older_insert());
}

#[test]
fn resurrection() {
    check(cases::resurrection());
}

#[test]
fn volume_out_of_order() {
    let case = cases::volume_out_of_order();
    assert_eq!(case.expected.len(), 400);
    check(case);
}

#[test]
fn exact_duplicate_in_one_batch_and_across_batches() {
    let flow = customers();
    let case = cases::exact_duplicate();
    let sim = run(&flow, &case, false);
    assert_eq!(sim.table(), case.expected);
    assert_eq!(sim.stats.duplicates, 2);
    assert_eq!(sim.stats.ties, 0, "exact duplicates are never ties");
    check(case);
}

#[test]
fn customers_scenario() {
    check(cases::customers_scenario());
}

#[test]
fn kitchen_locations_scenario() {
    check(cases::kitchen_locations());
}

/// UPSERT@5 Boston and UPSERT@5 Denver: the same one wins whatever the order
/// and batching, and the tie is counted.
#[test]
fn tie_is_decided_the_same_way_in_every_order_and_batching() {
    let flow = customers();
    let (b, dn) = (u(1, "Boston", 5), u(1, "Denver", 5));
    let arrangements: Vec<Vec<Vec<Ev>>> = vec![
        vec![vec![b, dn]],
        vec![vec![dn, b]],
        vec![vec![b], vec![dn]],
        vec![vec![dn], vec![b]],
    ];
    let mut tables = Vec::new();
    for a in &arrangements {
        for restart in [false, true] {
            let case = Case {
                name: "tie",
                batches: a.clone(),
                expected: Default::default(),
            };
            let sim = run(&flow, &case, restart);
            assert_eq!(sim.stats.ties, 1, "{a:?}");
            assert_eq!(sim.table().len(), 1);
            tables.push(sim.table());
        }
    }
    assert!(tables.windows(2).all(|w| w[0] == w[1]), "{tables:?}");
}

#[test]
fn tie_with_on_sequence_tie_error_rejects_the_batch() {
    let mut cfg = customers_config();
    cfg.on_sequence_tie = TiePolicy::Error;
    let flow = Flow::new(cfg).unwrap();
    // Within one batch.
    let mut sim = Sim::new(flow.clone());
    let e = sim
        .apply(&batch(&flow, &[u(1, "Boston", 5), u(1, "Denver", 5)]))
        .unwrap_err();
    assert_eq!(e.code(), codes::SEQUENCE_TIE);
    assert!(sim.table().is_empty());
    // Across batches: the second batch is rejected whole, its other row too.
    let mut sim = Sim::new(flow.clone());
    sim.apply(&batch(&flow, &[u(1, "Boston", 5)])).unwrap();
    let e = sim
        .apply(&batch(&flow, &[u(2, "York", 1), u(1, "Denver", 5)]))
        .unwrap_err();
    assert_eq!(e.code(), codes::SEQUENCE_TIE);
    assert_eq!(sim.table(), rows(&[&["1", "Boston", "5"]]));
    // Exact duplicates are not ties, even in error mode.
    sim.apply(&batch(&flow, &[u(1, "Boston", 5)])).unwrap();
}

#[test]
fn null_key_rejects_the_whole_batch_naming_row_and_column() {
    let flow = customers();
    let mut sim = Sim::new(flow.clone());
    let mut b = batch(&flow, &[u(1, "A", 1), u(2, "B", 1), u(3, "C", 1)]);
    let ids = arrow_array::Int64Array::from(vec![Some(1), Some(2), None]);
    let mut cols = b.columns().to_vec();
    cols[0] = std::sync::Arc::new(ids);
    b = arrow_array::RecordBatch::try_new(flow.source_arrow.clone(), cols).unwrap();
    let e = sim.apply(&b).unwrap_err();
    assert_eq!(e.code(), codes::NULL_KEY);
    match &e {
        autocdc::Error::Batch { row, column, .. } => {
            assert_eq!(*row, 2);
            assert_eq!(column, "id");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        sim.table().is_empty(),
        "nothing of a rejected batch is applied"
    );
    assert!(sim.state.is_empty());
}

/// Spark's AUTO CDC checks the sequence before the key: a row null in both
/// is NULL_SEQUENCE, even when an earlier row has only a null key.
#[test]
fn a_null_sequence_is_reported_before_a_null_key() {
    let flow = customers();
    let mut sim = Sim::new(flow.clone());
    let b = batch(&flow, &[u(1, "A", 1), u(2, "B", 1), u(3, "C", 1)]);
    let mut cols = b.columns().to_vec();
    cols[0] = std::sync::Arc::new(arrow_array::Int64Array::from(vec![None, Some(2), None]));
    cols[3] = std::sync::Arc::new(arrow_array::Int64Array::from(vec![Some(1), Some(1), None]));
    let b = arrow_array::RecordBatch::try_new(flow.source_arrow.clone(), cols).unwrap();
    match sim.apply(&b).unwrap_err() {
        autocdc::Error::Batch {
            code, row, column, ..
        } => assert_eq!(
            (code, row, column.as_str()),
            (codes::NULL_SEQUENCE, 2, "seq")
        ),
        other => panic!("{other:?}"),
    }
    assert!(sim.table().is_empty());
}

#[test]
fn null_sequence_rejects_the_whole_batch() {
    let flow = customers();
    let mut sim = Sim::new(flow.clone());
    let b = batch(&flow, &[u(1, "A", 1), u(2, "B", 1)]);
    let mut cols = b.columns().to_vec();
    cols[3] = std::sync::Arc::new(arrow_array::Int64Array::from(vec![None, Some(1)]));
    let b = arrow_array::RecordBatch::try_new(flow.source_arrow.clone(), cols).unwrap();
    let e = sim.apply(&b).unwrap_err();
    assert_eq!(e.code(), codes::NULL_SEQUENCE);
    assert!(
        e.to_string().contains("row 0") && e.to_string().contains("`seq`"),
        "{e}"
    );
    assert!(sim.table().is_empty());
}

#[test]
fn tombstones_are_collected_after_the_threshold_and_then_a_late_upsert_resurrects() {
    let flow = customers();
    let mut sim = Sim::new(flow.clone());
    sim.apply(&batch(&flow, &[u(1, "A", 1)])).unwrap();
    sim.apply(&batch(&flow, &[d(1, 5)])).unwrap();
    let deleted_at = sim.now_ms - 1;
    // Before the threshold the tombstone holds.
    assert_eq!(sim.state.gc_tombstones(deleted_at), 0);
    sim.apply(&batch(&flow, &[u(1, "late", 2)])).unwrap();
    assert!(sim.table().is_empty());
    // After it, the key is forgotten: the documented consequence.
    assert_eq!(sim.state.gc_tombstones(deleted_at + 1), 1);
    sim.apply(&batch(&flow, &[u(1, "late", 2)])).unwrap();
    assert_eq!(sim.table(), rows(&[&["1", "late", "2"]]));
}

#[test]
fn multi_column_sequence_compares_in_order() {
    let cfg: autocdc::core::flow::FlowConfig = toml::from_str(
        r#"
        name = "m"
        target = "a.m"
        keys = ["id"]
        sequence_by = ["ts", "tiebreak"]
        columns = [
          { name = "id", type = "string", required = true },
          { name = "v", type = "int" },
          { name = "ts", type = "long" },
          { name = "tiebreak", type = "int" },
        ]
        "#,
    )
    .unwrap();
    let flow = Flow::new(cfg).unwrap();
    let mk = |rows: &[(&str, i32, i64, i32)]| {
        arrow_array::RecordBatch::try_new(
            flow.source_arrow.clone(),
            vec![
                std::sync::Arc::new(arrow_array::StringArray::from(
                    rows.iter().map(|r| r.0).collect::<Vec<_>>(),
                )),
                std::sync::Arc::new(arrow_array::Int32Array::from(
                    rows.iter().map(|r| r.1).collect::<Vec<_>>(),
                )),
                std::sync::Arc::new(arrow_array::Int64Array::from(
                    rows.iter().map(|r| r.2).collect::<Vec<_>>(),
                )),
                std::sync::Arc::new(arrow_array::Int32Array::from(
                    rows.iter().map(|r| r.3).collect::<Vec<_>>(),
                )),
            ],
        )
        .unwrap()
    };
    let mut sim = Sim::new(flow.clone());
    sim.apply(&mk(&[("k", 1, 10, 9), ("k", 2, 11, 0)])).unwrap();
    sim.apply(&mk(&[("k", 3, 11, -1), ("j", 7, -5, 2)]))
        .unwrap();
    sim.restart();
    sim.apply(&mk(&[("j", 8, -5, 1)])).unwrap();
    assert_eq!(
        sim.table(),
        rows(&[&["k", "2", "11", "0"], &["j", "7", "-5", "2"]])
    );
}
