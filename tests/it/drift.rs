//! A flow definition that changes between runs: SCD Type 2's tracked set
//! (re-folded from the state, never two interpretations in one table), its
//! default (Spark's: the sequence columns too), `autocdc refresh --history`
//! (the target rebuilt from the state), and the changes that are refused
//! with the code Spark gives them (keys, the sequence's type).

use crate::common;

use std::sync::Arc;

use autocdc::core::flow::Flow;
use autocdc::error::codes;
use autocdc::fault::Faults;
use autocdc::table::catalog::Catalog;
use autocdc::table::catalog::hadoop::HadoopCatalog;
use autocdc::table::engine::{Engine, PROP_TRACK_HISTORY};
use common::scd::*;
use common::*;

const IGNORE_NULLS_SCD1: Shape = Shape {
    scd2: false,
    untracked_note: false,
    ignore_nulls: true,
    ties_error: false,
    city_only_nulls: false,
};

fn catalog(dir: &std::path::Path) -> Arc<dyn Catalog> {
    Arc::new(HadoopCatalog::new(dir.to_str().unwrap(), None, Arc::new(Faults::default())).unwrap())
}

/// The people flow (SCD Type 2) on `target` with `tracking` in place of
/// its tracked-set line ("" for the default).
fn tracked(target: &str, tracking: &str) -> Flow {
    let toml = people_toml(SCD2, target).replace(
        "track_history_except_column_list = [\"seq\"]\n",
        &format!("{tracking}\n"),
    );
    Flow::new(toml::from_str(&toml).unwrap()).unwrap()
}

async fn apply_all(engine: &mut Engine, flow: &Flow, batches: &[Vec<PEv>], t0: i64) {
    for (i, b) in batches.iter().enumerate() {
        engine
            .apply(&people_batch(flow, b), t0 + i as i64)
            .await
            .unwrap();
    }
}

/// The table `flow` gives from scratch: `first` then `second` applied to a
/// new target, batch by batch.
async fn from_scratch(
    cat: &Arc<dyn Catalog>,
    flow: &Flow,
    first: &[Vec<PEv>],
    second: &[Vec<PEv>],
) -> std::collections::BTreeSet<Vec<String>> {
    let mut fresh = open_engine(cat, flow).await;
    let all: Vec<Vec<PEv>> = first.iter().chain(second).cloned().collect();
    apply_all(&mut fresh, flow, &all, 1).await;
    table_rows(&fresh).await
}

fn snapshots(engine: &Engine) -> usize {
    engine.target().metadata.snapshots().count()
}

/// Changes where the tracked set matters: a repeat at a new sequence, a
/// change to `note` alone, to `city` alone, a delete and a late change that
/// lands inside an interval.
fn first() -> Vec<Vec<PEv>> {
    vec![
        vec![up(1, "Leeds", "a", 1), up(2, "York", "x", 1)],
        vec![up(1, "Leeds", "a", 2), up(1, "Leeds", "b", 4)],
        vec![up(2, "Hull", "x", 3), del(2, 6), up(1, "Bath", "b", 8)],
    ]
}

fn second() -> Vec<Vec<PEv>> {
    vec![
        vec![up(1, "Bath", "c", 9), up(2, "Hull", "y", 7)],
        vec![up(1, "Leeds", "b", 6), up(3, "Kent", "k", 1)],
    ]
}

const TRACKINGS: [&str; 5] = [
    "",
    "track_history_except_column_list = [\"seq\"]",
    "track_history_column_list = [\"city\"]",
    "track_history_column_list = [\"note\", \"seq\"]",
    "track_history_except_column_list = [\"city\", \"note\"]",
];

/// Spark's AUTO CDC tracks every non-key column of the target by default,
/// the sequence too: a repeat at a later sequence is a new version.
#[test]
fn the_default_tracked_set_is_sparks_and_includes_the_sequence() {
    let rt = rt();
    let tmp = tempfile::tempdir().unwrap();
    let flow = tracked("crm.spark_default", "");
    rt.block_on(async {
        let mut engine = open_engine(&catalog(tmp.path()), &flow).await;
        apply_all(
            &mut engine,
            &flow,
            &[vec![up(1, "Leeds", "a", 1)], vec![up(1, "Leeds", "a", 2)]],
            1,
        )
        .await;
        assert_eq!(
            table_rows(&engine).await,
            rows(&[
                &["1", "Leeds", "a", "1", "1", "2"],
                &["1", "Leeds", "a", "2", "2", "NULL"],
            ])
        );
    });
}

/// Spark refuses a changed tracked set (AutoCdcConfigDriftSuite,
/// TRACK_HISTORY_DRIFT). autocdc keeps every event per key, so it re-folds
/// the history under the new set in one commit before the next batch: for
/// every pair of sets, the table equals the one the new set gives from the
/// start, across a restart, and no input offset moves.
#[test]
fn a_changed_tracked_set_refolds_the_history_as_if_it_had_always_been() {
    let rt = rt();
    let tmp = tempfile::tempdir().unwrap();
    let cat = catalog(tmp.path());
    rt.block_on(async {
        for (i, was) in TRACKINGS.iter().enumerate() {
            for (j, now) in TRACKINGS.iter().enumerate() {
                if i == j {
                    continue;
                }
                let target = format!("crm.drift_{i}_{j}");
                let (a, b) = (tracked(&target, was), tracked(&target, now));
                let mut engine = open_engine(&cat, &a).await;
                apply_all(&mut engine, &a, &first(), 1).await;
                let offset = engine.summary().input_offset;

                let mut engine = open_engine(&cat, &b).await;
                apply_all(&mut engine, &b, &second(), 10).await;
                let got = table_rows(&engine).await;
                // One batch re-folded and committed the history first.
                assert_eq!(
                    engine.summary().input_offset,
                    offset + second().len() as i64
                );

                let fresh_flow = tracked(&format!("crm.fresh_{i}_{j}"), now);
                let want = from_scratch(&cat, &fresh_flow, &first(), &second()).await;
                assert_eq!(got, want, "tracked `{was}` then `{now}`");

                // The new set is recorded: a restart re-folds nothing.
                let reopened = open_engine(&cat, &b).await;
                assert_eq!(table_rows(&reopened).await, want);
                let props = &reopened
                    .target()
                    .metadata
                    .current_snapshot()
                    .unwrap()
                    .summary()
                    .additional_properties;
                assert!(props.contains_key(PROP_TRACK_HISTORY), "{props:?}");
            }
        }
    });
}

/// The re-fold is one commit of its own, before the batch; a set that
/// resolves to the same columns (another order, or an except list naming
/// the complement) is no change and commits nothing.
#[test]
fn the_refold_is_one_commit_and_an_equivalent_set_is_no_change() {
    let rt = rt();
    let tmp = tempfile::tempdir().unwrap();
    let cat = catalog(tmp.path());
    rt.block_on(async {
        let a = tracked(
            "crm.same",
            "track_history_column_list = [\"city\", \"note\"]",
        );
        let mut engine = open_engine(&cat, &a).await;
        apply_all(&mut engine, &a, &first(), 1).await;
        let before = snapshots(&engine);
        let rows_before = table_rows(&engine).await;
        for same in [
            "track_history_column_list = [\"note\", \"city\"]",
            "track_history_except_column_list = [\"seq\"]",
        ] {
            let b = tracked("crm.same", same);
            let mut engine = open_engine(&cat, &b).await;
            engine
                .apply(&people_batch(&b, &[up(1, "Bath", "b", 8)]), 50)
                .await
                .unwrap();
            assert_eq!(
                snapshots(&engine),
                before,
                "{same}: a duplicate commits nothing"
            );
            assert_eq!(table_rows(&engine).await, rows_before);
        }
        // A real change: the re-fold commits, then the (duplicate) batch nothing.
        let c = tracked("crm.same", "track_history_column_list = [\"city\"]");
        let mut engine = open_engine(&cat, &c).await;
        engine
            .apply(&people_batch(&c, &[up(1, "Bath", "b", 8)]), 60)
            .await
            .unwrap();
        assert_eq!(snapshots(&engine), before + 1);
        assert_ne!(table_rows(&engine).await, rows_before);
    });
}

/// `autocdc refresh --history`: the target's rows replaced by the fold of
/// the state's events in one overwrite; the table reads the same, later
/// batches remove its rows by position, and a restart finds it all.
#[test]
fn refresh_history_rewrites_the_target_from_the_state() {
    let rt = rt();
    let tmp = tempfile::tempdir().unwrap();
    let cat = catalog(tmp.path());
    for shape in [SCD2, IGNORE_NULLS_SCD1] {
        let target = format!("crm.rebuilt_{}", shape.scd2);
        let flow = people(shape, &target);
        rt.block_on(async {
            let mut engine = open_engine(&cat, &flow).await;
            apply_all(&mut engine, &flow, &first(), 1).await;
            let before = table_rows(&engine).await;
            let offset = engine.summary().input_offset;
            let r = engine.rebuild(20).await.unwrap();
            assert_eq!(r.rows_written as usize, before.len());
            assert_eq!(r.delete_files, 0);
            let snap = engine.target().metadata.current_snapshot().unwrap().clone();
            assert_eq!(
                snap.summary().operation,
                iceberg::spec::Operation::Overwrite
            );
            let props = &snap.summary().additional_properties;
            assert_eq!(
                props.get("total-delete-files").map(String::as_str),
                Some("0")
            );
            assert_eq!(
                props.get("total-data-files").map(String::as_str),
                Some(r.data_files.to_string().as_str())
            );
            assert_eq!(table_rows(&engine).await, before);
            assert_eq!(engine.summary().input_offset, offset);

            apply_all(&mut engine, &flow, &second(), 30).await;
            let got = table_rows(&engine).await;
            let fresh_flow = people(shape, &format!("{target}_fresh"));
            let want = from_scratch(&cat, &fresh_flow, &first(), &second()).await;
            assert_eq!(got, want, "{shape:?}");
            assert_eq!(
                snapshot_property(&engine, "total-equality-deletes").as_deref(),
                Some("0"),
                "rows written by the rebuild are removed by position"
            );
            assert_eq!(table_rows(&open_engine(&cat, &flow).await).await, got);
        });
    }
    // An SCD Type 1 flow's state holds no values to rebuild from.
    rt.block_on(async {
        let flow = customers();
        let mut engine = open_engine(&cat, &flow).await;
        engine
            .apply(&batch(&flow, &[u(1, "Leeds", 1)]), 1)
            .await
            .unwrap();
        let e = engine.rebuild(2).await.unwrap_err();
        assert_eq!(e.code(), codes::UNSUPPORTED);
        assert!(e.to_string().contains("refresh --full"), "{e}");
    });
}

/// Changed keys are KEY_SCHEMA_DRIFT for SCD Type 2 as for SCD Type 1
/// (Spark's AutoCdcScd2KeyDriftSuite); a sequence of another type is
/// SEQUENCING_TYPE_DRIFT naming the column (AutoCdcConfigDriftSuite), for
/// `open` and for the definition check `PUT /v1/flows` runs. Nothing changes.
#[test]
fn changed_keys_and_sequence_types_are_refused_with_sparks_codes() {
    let rt = rt();
    let tmp = tempfile::tempdir().unwrap();
    let cat = catalog(tmp.path());
    let people_with = |target: &str, scd2: bool, from: &str, to: &str| {
        let shape = if scd2 { SCD2 } else { IGNORE_NULLS_SCD1 };
        let toml = people_toml(shape, target).replace(from, to);
        Flow::new(toml::from_str(&toml).unwrap()).unwrap()
    };
    rt.block_on(async {
        for scd2 in [true, false] {
            let target = format!("crm.refused_{scd2}");
            let flow = people_with(&target, scd2, "", "");
            let mut engine = open_engine(&cat, &flow).await;
            apply_all(&mut engine, &flow, &first(), 1).await;
            let want = table_rows(&engine).await;
            let snaps = snapshots(&engine);
            for (from, to, code, names) in [
                (
                    "keys = [\"id\"]",
                    "keys = [\"id\", \"city\"]",
                    codes::KEY_SCHEMA_DRIFT,
                    "city",
                ),
                (
                    "{ name = \"seq\", type = \"long\", required = true }",
                    "{ name = \"seq\", type = \"int\", required = true }",
                    codes::SEQUENCING_TYPE_DRIFT,
                    "`seq` is int in the flow but long",
                ),
            ] {
                let changed = people_with(&target, scd2, from, to);
                let e = Engine::open(changed.clone(), cat.clone(), Arc::new(Faults::default()))
                    .await
                    .err()
                    .unwrap_or_else(|| panic!("scd2 {scd2}: `{to}` was accepted"));
                assert_eq!(e.code(), code, "scd2 {scd2}: {e}");
                assert!(e.to_string().contains(names), "{e}");
                assert!(e.to_string().contains("refresh --full"), "{e}");
                let e = Engine::check_target(&changed, cat.as_ref())
                    .await
                    .unwrap_err();
                assert_eq!(e.code(), code);
            }
            let engine = open_engine(&cat, &flow).await;
            assert_eq!(snapshots(&engine), snaps);
            assert_eq!(table_rows(&engine).await, want);
        }
    });
}

/// The columns of a definition may be listed in another order between runs
/// (so may a composite key's columns, see tests/it/spark_parity/): the state
/// table is read and written by column name, so a history flow's stored
/// values stay with their columns.
#[test]
fn reordered_columns_keep_their_values_in_the_state() {
    let rt = rt();
    let tmp = tempfile::tempdir().unwrap();
    let cat = catalog(tmp.path());
    let a = people(SCD2, "crm.reordered");
    let city = "  { name = \"city\", type = \"string\" },\n";
    let note = "  { name = \"note\", type = \"string\" },\n";
    let toml = people_toml(SCD2, "crm.reordered")
        .replace(&format!("{city}{note}"), &format!("{note}{city}"));
    let b = Flow::new(toml::from_str(&toml).unwrap()).unwrap();
    let names = |f: &Flow| -> Vec<String> {
        f.value_cols()
            .iter()
            .map(|&c| f.column_name(c).to_string())
            .collect()
    };
    assert_ne!(names(&a), names(&b));
    rt.block_on(async {
        let mut engine = open_engine(&cat, &a).await;
        apply_all(&mut engine, &a, &first(), 1).await;
        let mut engine = open_engine(&cat, &b).await;
        // Batches of `b` carry its column order.
        let reordered: Vec<_> = second()
            .iter()
            .map(|evs| {
                let batch = people_batch(&a, evs);
                let cols = b
                    .source_arrow
                    .fields()
                    .iter()
                    .map(|f| batch.column_by_name(f.name()).unwrap().clone())
                    .collect();
                arrow_array::RecordBatch::try_new(b.source_arrow.clone(), cols).unwrap()
            })
            .collect();
        for (i, batch) in reordered.iter().enumerate() {
            engine.apply(batch, 10 + i as i64).await.unwrap();
        }
        let fresh_flow = people(SCD2, "crm.reordered_fresh");
        // Rows render in the target's (first) column order either way.
        let want = from_scratch(&cat, &fresh_flow, &first(), &second()).await;
        assert_eq!(table_rows(&engine).await, want);
        assert_eq!(table_rows(&open_engine(&cat, &b).await).await, want);
        assert_eq!(table_rows(&open_engine(&cat, &a).await).await, want);
    });
}

/// A target dropped without its state table: the stale state (rows that
/// no longer exist, perhaps of another definition) is dropped too, so a
/// change older than one applied before is applied to the new target.
#[test]
fn a_target_dropped_without_its_state_starts_afresh() {
    let rt = rt();
    let tmp = tempfile::tempdir().unwrap();
    let cat = catalog(tmp.path());
    let flow = people(SCD2, "crm.dropped");
    rt.block_on(async {
        let mut engine = open_engine(&cat, &flow).await;
        apply_all(&mut engine, &flow, &first(), 1).await;
        assert!(cat.drop_table(&flow.target).await.unwrap());
        assert!(cat.load_table(&flow.state_ident()).await.unwrap().is_some());
        let mut engine = open_engine(&cat, &flow).await;
        apply_all(&mut engine, &flow, &[vec![up(1, "Kent", "k", 1)]], 20).await;
        let want = rows(&[&["1", "Kent", "k", "1", "1", "NULL"]]);
        assert_eq!(table_rows(&engine).await, want);
        assert_eq!(table_rows(&open_engine(&cat, &flow).await).await, want);
        // Another key set opens as well: nothing of the old state is left.
        let toml = people_toml(SCD2, "crm.dropped")
            .replace("keys = [\"id\"]", "keys = [\"id\", \"city\"]");
        let rekeyed = Flow::new(toml::from_str(&toml).unwrap()).unwrap();
        assert!(cat.drop_table(&flow.target).await.unwrap());
        let mut engine = open_engine(&cat, &rekeyed).await;
        apply_all(&mut engine, &rekeyed, &[vec![up(1, "Kent", "k", 1)]], 30).await;
        assert_eq!(table_rows(&engine).await, want);
    });
}

/// Spark's column-subset form of ignore_null_updates: only the listed
/// columns keep their value on a null, the others take it. Changing the
/// set between runs re-folds the rows, as a changed tracked set does.
#[test]
fn null_ignoring_columns_are_a_list_and_a_changed_list_refolds() {
    let rt = rt();
    let tmp = tempfile::tempdir().unwrap();
    let cat = catalog(tmp.path());
    let with = |target: &str, shape: Shape, line: &str| {
        let toml = people_toml(shape, target).replace("ignore_null_updates = true", line);
        Flow::new(toml::from_str(&toml).unwrap()).unwrap()
    };
    let evs =
        |batches: &[&[PEv]]| -> Vec<Vec<PEv>> { batches.iter().map(|b| b.to_vec()).collect() };
    let first = evs(&[
        &[up(1, "Leeds", "a", 1), up(2, "York", "x", 1)],
        &[(1, false, None, None, 2), (2, false, Some("Hull"), None, 2)],
    ]);
    let second = evs(&[&[(1, false, None, Some("b"), 3)]]);
    let lists = [
        "ignore_null_updates = true",
        "ignore_null_updates_column_list = [\"city\"]",
        "ignore_null_updates_except_column_list = [\"city\"]",
    ];
    rt.block_on(async {
        for shape in [
            IGNORE_NULLS_SCD1,
            Shape {
                ignore_nulls: true,
                ..SCD2
            },
        ] {
            // Only `city` keeps its value: key 1's note is taken as null.
            let flow = with(&format!("crm.city_only_{}", shape.scd2), shape, lists[1]);
            let mut engine = open_engine(&cat, &flow).await;
            apply_all(&mut engine, &flow, &first, 1).await;
            let got = table_rows(&engine).await;
            let mut key1: Vec<String> = ["1", "Leeds", "NULL", "2"].map(String::from).to_vec();
            if shape.scd2 {
                key1.extend(["2".to_string(), "NULL".to_string()]);
            }
            assert!(got.contains(&key1), "{got:?}");
            for (i, was) in lists.iter().enumerate() {
                for (j, now) in lists.iter().enumerate() {
                    if i == j {
                        continue;
                    }
                    let target = format!("crm.nulls_{}_{i}_{j}", shape.scd2);
                    let (a, b) = (with(&target, shape, was), with(&target, shape, now));
                    let mut engine = open_engine(&cat, &a).await;
                    apply_all(&mut engine, &a, &first, 1).await;
                    let mut engine = open_engine(&cat, &b).await;
                    apply_all(&mut engine, &b, &second, 10).await;
                    let fresh_flow = with(&format!("{target}_fresh"), shape, now);
                    let want = from_scratch(&cat, &fresh_flow, &first, &second).await;
                    assert_eq!(table_rows(&engine).await, want, "`{was}` then `{now}`");
                    assert_eq!(table_rows(&open_engine(&cat, &b).await).await, want);
                }
            }
        }
    });
}
