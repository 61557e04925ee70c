//! Schema evolution by changing the flow's definition: added, widened,
//! relaxed, renamed and dropped columns become one metadata commit of the
//! target (and of the state table, which evolves with it), rows written
//! before read correctly, and every illegal change is refused before
//! anything changes.

mod common;

use std::sync::Arc;

use autocdc::core::flow::Flow;
use autocdc::error::{Error, codes};
use autocdc::fault::{FaultPoint, Faults};
use autocdc::service::input::{Limits, decode_ndjson};
use autocdc::table::catalog::Catalog;
use autocdc::table::catalog::hadoop::HadoopCatalog;
use autocdc::table::engine::Engine;
use common::*;

fn catalog(dir: &std::path::Path) -> Arc<dyn Catalog> {
    Arc::new(HadoopCatalog::new(dir.to_str().unwrap(), None, Arc::new(Faults::default())).unwrap())
}

/// The orders flow with `columns` (TOML inline tables, one per line) and
/// `extra` lines (SCD Type 2, ignore-nulls...).
fn orders(columns: &[&str], extra: &str) -> Flow {
    let toml = format!(
        r#"
name = "orders"
target = "shop.orders"
keys = ["id"]
sequence_by = "seq"
apply_as_deletes = "op = 'DELETE'"
except_column_list = ["op"]
{extra}
columns = [
  {}
]
"#,
        columns.join(",\n  ")
    );
    Flow::new(toml::from_str(&toml).unwrap()).unwrap()
}

const ID: &str = r#"{ name = "id", type = "long", required = true }"#;
const OP: &str = r#"{ name = "op", type = "string" }"#;
const SEQ: &str = r#"{ name = "seq", type = "long", required = true }"#;
const QTY_INT: &str = r#"{ name = "qty", type = "int" }"#;
const QTY_LONG: &str = r#"{ name = "qty", type = "long" }"#;
const NAME: &str = r#"{ name = "name", type = "string" }"#;

fn v1() -> Flow {
    orders(&[ID, OP, QTY_INT, NAME, SEQ], "")
}

fn rows_of(flow: &Flow, ndjson: &str) -> arrow_array::RecordBatch {
    decode_ndjson(flow, ndjson.as_bytes(), Limits::NONE).unwrap()
}

async fn apply(engine: &mut Engine, flow: &Flow, ndjson: &str, now: i64) {
    engine.apply(&rows_of(flow, ndjson), now).await.unwrap();
}

/// `flow` opened on `cat` with `batches` applied in turn, at times `t0`, `t0 + 1`...
async fn applied(cat: &Arc<dyn Catalog>, flow: &Flow, t0: i64, batches: &[&str]) -> Engine {
    let mut e = open_engine(cat, flow).await;
    for (i, b) in batches.iter().enumerate() {
        apply(&mut e, flow, b, t0 + i as i64).await;
    }
    e
}

const FIRST: &str = r#"{"id":1,"op":"UPSERT","qty":3,"name":"pen","seq":1}
{"id":2,"op":"UPSERT","qty":5,"name":"ink","seq":1}
{"id":3,"op":"UPSERT","qty":7,"name":"cap","seq":1}"#;

/// The field ids of the target's current schema, by name.
fn ids(engine: &Engine) -> Vec<(String, i32)> {
    engine
        .target()
        .metadata
        .current_schema()
        .as_struct()
        .fields()
        .iter()
        .map(|f| (f.name.clone(), f.id))
        .collect()
}

#[tokio::test]
async fn an_added_column_is_null_in_older_rows_and_keeps_every_other_id() {
    let dir = tempfile::tempdir().unwrap();
    let cat = catalog(dir.path());
    let e = applied(&cat, &v1(), 1, &[FIRST]).await;
    let before = ids(&e);
    drop(e);

    let note = r#"{ name = "note", type = "string" }"#;
    let v2 = orders(&[ID, OP, note, QTY_INT, NAME, SEQ], "");
    let mut e = open_engine(&cat, &v2).await;
    let after = ids(&e);
    // In the definition's place, with the next id; the others keep theirs.
    let last = before.iter().map(|(_, i)| *i).max().unwrap();
    assert_eq!(after[1], ("note".to_string(), last + 1));
    for (n, i) in &before {
        assert!(after.contains(&(n.clone(), *i)), "{n} lost its id {i}");
    }
    assert_eq!(e.target().metadata.schemas_iter().count(), 2);
    apply(
        &mut e,
        &v2,
        r#"{"id":2,"op":"UPSERT","note":"gift","qty":6,"name":"ink","seq":2}"#,
        2,
    )
    .await;
    assert_eq!(
        table_rows(&e).await,
        rows(&[
            &["1", "NULL", "3", "pen", "1"],
            &["2", "gift", "6", "ink", "2"],
            &["3", "NULL", "7", "cap", "1"],
        ])
    );
    // A restart on the same definition changes nothing more.
    let loc = e.target().metadata_location.clone();
    drop(e);
    let e = open_engine(&cat, &v2).await;
    assert_eq!(e.target().metadata_location, loc);
}

#[tokio::test]
async fn keys_sequences_and_values_widen_and_the_state_reloads_widened() {
    let dir = tempfile::tempdir().unwrap();
    let cat = catalog(dir.path());
    let id_int = r#"{ name = "id", type = "int", required = true }"#;
    let seq_int = r#"{ name = "seq", type = "int", required = true }"#;
    let narrow = orders(&[id_int, OP, QTY_INT, NAME, seq_int], "");
    drop(applied(&cat, &narrow, 1, &[FIRST]).await);

    let wide = orders(&[ID, OP, QTY_LONG, NAME, SEQ], "");
    let mut e = open_engine(&cat, &wide).await;
    apply(
        &mut e,
        &wide,
        r#"{"id":3000000000,"op":"UPSERT","qty":9000000000,"name":"box","seq":5000000000}
{"id":2,"op":"DELETE","seq":4000000000}"#,
        2,
    )
    .await;
    drop(e);
    // The widened state reloads: a late change (seq 0) of key 1 loses, a
    // later one of the deleted key 2 wins.
    let mut e = open_engine(&cat, &wide).await;
    apply(
        &mut e,
        &wide,
        r#"{"id":1,"op":"UPSERT","qty":1,"name":"old","seq":0}
{"id":2,"op":"UPSERT","qty":8,"name":"new","seq":4000000001}"#,
        3,
    )
    .await;
    assert_eq!(
        table_rows(&e).await,
        rows(&[
            &["1", "3", "pen", "1"],
            &["2", "8", "new", "4000000001"],
            &["3", "7", "cap", "1"],
            &["3000000000", "9000000000", "box", "5000000000"],
        ])
    );
    let state = cat.load_table(&wide.state_ident()).await.unwrap().unwrap();
    let seq = state
        .metadata
        .current_schema()
        .field_by_name("__autocdc_seq_seq")
        .unwrap()
        .field_type
        .to_string();
    assert_eq!(seq, "long", "the state table widened with the target");
}

#[tokio::test]
async fn a_rename_keeps_the_columns_id_and_values_and_a_drop_leaves_old_files_alone() {
    let dir = tempfile::tempdir().unwrap();
    let cat = catalog(dir.path());
    let e = applied(&cat, &v1(), 1, &[FIRST]).await;
    let name_id = ids(&e).iter().find(|(n, _)| n == "name").unwrap().1;
    drop(e);

    let title = r#"{ name = "title", type = "string", renamed_from = "name" }"#;
    let renamed = orders(&[ID, OP, QTY_INT, title, SEQ], "");
    let mut e = open_engine(&cat, &renamed).await;
    assert!(ids(&e).contains(&("title".to_string(), name_id)));
    apply(
        &mut e,
        &renamed,
        r#"{"id":1,"op":"UPSERT","qty":4,"title":"pencil","seq":2}"#,
        2,
    )
    .await;
    assert_eq!(
        table_rows(&e).await,
        rows(&[
            &["1", "4", "pencil", "2"],
            &["2", "5", "ink", "1"],
            &["3", "7", "cap", "1"],
        ])
    );
    drop(e);

    let dropped = orders(&[ID, OP, QTY_INT, SEQ], "");
    let mut e = open_engine(&cat, &dropped).await;
    assert!(!ids(&e).iter().any(|(n, _)| n == "title"));
    apply(&mut e, &dropped, r#"{"id":3,"op":"DELETE","seq":2}"#, 3).await;
    assert_eq!(
        table_rows(&e).await,
        rows(&[&["1", "4", "2"], &["2", "5", "1"]])
    );
}

/// Each illegal change: refused on open and by the definition check with
/// SCHEMA_DRIFT naming the column, nothing committed, and the old
/// definition still applies.
#[tokio::test]
async fn every_illegal_change_is_refused_before_anything_changes() {
    let dir = tempfile::tempdir().unwrap();
    let cat = catalog(dir.path());
    drop(applied(&cat, &v1(), 1, &[FIRST]).await);
    let target_loc = || async {
        cat.load_table(&v1().target)
            .await
            .unwrap()
            .unwrap()
            .metadata_location
    };
    let state_loc = || async {
        cat.load_table(&v1().state_ident())
            .await
            .unwrap()
            .unwrap()
            .metadata_location
    };
    let (t0, s0) = (target_loc().await, state_loc().await);
    let qty_string = r#"{ name = "qty", type = "string" }"#;
    let qty_required = r#"{ name = "qty", type = "int", required = true }"#;
    let new_required = r#"{ name = "sku", type = "string", required = true }"#;
    let renamed_nothing = r#"{ name = "title", type = "string", renamed_from = "label" }"#;
    let seq_int = r#"{ name = "seq", type = "int", required = true }"#;
    let cases: Vec<(Flow, &str, &str)> = vec![
        (
            orders(&[ID, OP, qty_string, NAME, SEQ], ""),
            "qty",
            "not a type promotion",
        ),
        (
            orders(&[ID, OP, qty_required, NAME, SEQ], ""),
            "qty",
            "cannot become required",
        ),
        (
            orders(&[ID, OP, QTY_INT, NAME, new_required, SEQ], ""),
            "sku",
            "must be optional",
        ),
        (
            orders(&[ID, OP, QTY_INT, renamed_nothing, SEQ], ""),
            "title",
            "renamed_from `label`",
        ),
        (orders(&[ID, OP, QTY_INT, NAME, seq_int], ""), "seq", "int"),
    ];
    for (flow, column, rule) in cases {
        for err in [
            Engine::check_target(&flow, cat.as_ref()).await.unwrap_err(),
            Engine::open(flow.clone(), cat.clone(), Arc::new(Faults::default()))
                .await
                .err()
                .unwrap(),
        ] {
            let msg = err.to_string();
            assert!(
                [codes::SCHEMA_DRIFT, codes::SEQUENCING_TYPE_DRIFT].contains(&err.code()),
                "{msg}"
            );
            assert!(msg.contains(&format!("`{column}`")), "{msg}");
            assert!(msg.contains(rule), "{msg}");
        }
        assert_eq!(target_loc().await, t0, "nothing committed to the target");
        assert_eq!(state_loc().await, s0, "nothing committed to the state");
    }
    let mut e = open_engine(&cat, &v1()).await;
    apply(&mut e, &v1(), r#"{"id":1,"op":"DELETE","seq":3}"#, 2).await;
    assert_eq!(table_rows(&e).await.len(), 2);
}

fn scd2(columns: &[&str], extra: &str) -> Flow {
    orders(columns, &format!("stored_as_scd_type = 2\n{extra}"))
}

/// SCD Type 2: a new tracked column, null in every earlier version, opens
/// no version by itself; a value in it does. Values kept in the state
/// survive a rename and a widening across restarts.
#[tokio::test]
async fn scd2_history_stays_intact_across_an_add_a_rename_and_a_widening() {
    let dir = tempfile::tempdir().unwrap();
    let cat = catalog(dir.path());
    let h1 = scd2(&[ID, OP, QTY_INT, NAME, SEQ], "");
    let e = applied(
        &cat,
        &h1,
        1,
        &[
            FIRST,
            r#"{"id":1,"op":"UPSERT","qty":4,"name":"pen","seq":3}"#,
        ],
    )
    .await;
    let before = table_rows(&e).await;
    let snapshots = e.target().metadata.snapshots().count();
    drop(e);

    let note = r#"{ name = "note", type = "string" }"#;
    let title = r#"{ name = "title", type = "string", renamed_from = "name" }"#;
    let h2 = scd2(&[ID, OP, QTY_LONG, title, note, SEQ], "");
    let mut e = open_engine(&cat, &h2).await;
    // No re-fold: the history is as it was (the new column null).
    assert_eq!(e.target().metadata.snapshots().count(), snapshots);
    // Key 1 gets a note (a new version), then, after a restart, a late
    // change that lands between versions re-folds key 1 from the state.
    apply(
        &mut e,
        &h2,
        r#"{"id":1,"op":"UPSERT","qty":4,"title":"pen","note":"gift","seq":5}"#,
        3,
    )
    .await;
    drop(e);
    let mut e = open_engine(&cat, &h2).await;
    apply(
        &mut e,
        &h2,
        r#"{"id":1,"op":"UPSERT","qty":4,"title":"pen","seq":2}"#,
        4,
    )
    .await;
    let got = table_rows(&e).await;
    // id, qty, title, note, seq, __START_AT, __END_AT
    assert_eq!(
        got,
        rows(&[
            &["1", "3", "pen", "NULL", "1", "1", "2"],
            &["1", "4", "pen", "NULL", "2", "2", "3"],
            &["1", "4", "pen", "NULL", "3", "3", "5"],
            &["1", "4", "pen", "gift", "5", "5", "NULL"],
            &["2", "5", "ink", "NULL", "1", "1", "NULL"],
            &["3", "7", "cap", "NULL", "1", "1", "NULL"],
        ]),
        "before the change: {before:?}"
    );
}

#[tokio::test]
async fn a_tracked_column_is_dropped_only_once_it_is_untracked() {
    let dir = tempfile::tempdir().unwrap();
    let cat = catalog(dir.path());
    let h1 = scd2(&[ID, OP, QTY_INT, NAME, SEQ], "");
    drop(
        applied(
            &cat,
            &h1,
            1,
            &[
                FIRST,
                r#"{"id":1,"op":"UPSERT","qty":3,"name":"pencil","seq":2}"#,
            ],
        )
        .await,
    );
    let dropped = scd2(&[ID, OP, QTY_INT, SEQ], "");
    let err = Engine::open(dropped.clone(), cat.clone(), Arc::new(Faults::default()))
        .await
        .err()
        .unwrap();
    assert_eq!(err.code(), codes::SCHEMA_DRIFT);
    assert!(err.to_string().contains("`name`"), "{err}");
    assert!(
        err.to_string().contains("track_history_except_column_list"),
        "{err}"
    );

    // Untracked first (a re-fold), the drop is accepted.
    let untracked = scd2(
        &[ID, OP, QTY_INT, NAME, SEQ],
        r#"track_history_except_column_list = ["name"]"#,
    );
    let re_folded = r#"{"id":2,"op":"UPSERT","qty":6,"name":"ink","seq":2}"#;
    drop(applied(&cat, &untracked, 3, &[re_folded]).await);
    let e = applied(
        &cat,
        &dropped,
        4,
        &[r#"{"id":1,"op":"UPSERT","qty":4,"seq":3}"#],
    )
    .await;
    assert_eq!(
        table_rows(&e).await,
        rows(&[
            &["1", "3", "1", "1", "2"],
            &["1", "3", "2", "2", "3"],
            &["1", "4", "3", "3", "NULL"],
            &["2", "5", "1", "1", "2"],
            &["2", "6", "2", "2", "NULL"],
            &["3", "7", "1", "1", "NULL"],
        ])
    );
}

/// A crash between the state table's schema commit and the target's: the
/// next open finishes the evolution and the table is as without the crash.
#[tokio::test]
async fn a_crash_between_the_two_schema_commits_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let cat = catalog(dir.path());
    let h1 = scd2(&[ID, OP, QTY_INT, NAME, SEQ], "");
    drop(applied(&cat, &h1, 1, &[FIRST]).await);
    let title = r#"{ name = "title", type = "string", renamed_from = "name" }"#;
    let h2 = scd2(&[ID, OP, QTY_LONG, title, SEQ], "");
    let faults = Arc::new(Faults::default());
    faults.arm(FaultPoint::AfterStateSchema, 0);
    let err = Engine::open(h2.clone(), cat.clone(), faults)
        .await
        .err()
        .unwrap();
    assert!(matches!(err, Error::InjectedFault(_)), "{err}");
    let state = cat.load_table(&h2.state_ident()).await.unwrap().unwrap();
    assert!(
        state
            .metadata
            .current_schema()
            .field_by_name("__autocdc_val_title")
            .is_some()
    );
    let target = cat.load_table(&h2.target).await.unwrap().unwrap();
    assert!(
        target
            .metadata
            .current_schema()
            .field_by_name("name")
            .is_some()
    );

    let mut e = open_engine(&cat, &h2).await;
    apply(
        &mut e,
        &h2,
        r#"{"id":1,"op":"UPSERT","qty":4,"title":"pen","seq":2}"#,
        2,
    )
    .await;
    assert_eq!(
        table_rows(&e).await,
        rows(&[
            &["1", "3", "pen", "1", "1", "2"],
            &["1", "4", "pen", "2", "2", "NULL"],
            &["2", "5", "ink", "1", "1", "NULL"],
            &["3", "7", "cap", "1", "1", "NULL"],
        ])
    );
}

/// Turning ignore_null_updates on or off changes what the state holds (one
/// entry per key, or every change): refused, nothing changed.
#[tokio::test]
async fn switching_ignore_null_updates_is_refused_before_anything_changes() {
    let dir = tempfile::tempdir().unwrap();
    let cat = catalog(dir.path());
    for (first, second) in [
        ("", "ignore_null_updates = true"),
        ("ignore_null_updates = true", ""),
    ] {
        let a = orders(&[ID, OP, QTY_INT, NAME, SEQ], first).clone();
        let a = Flow::new({
            let mut c = a.config.clone();
            c.target = format!("shop.switch_{}", first.is_empty());
            c
        })
        .unwrap();
        let b = Flow::new({
            let mut c = orders(&[ID, OP, QTY_INT, NAME, SEQ], second).config.clone();
            c.target = a.config.target.clone();
            c
        })
        .unwrap();
        let e = applied(&cat, &a, 1, &[FIRST]).await;
        let loc = e.target().metadata_location.clone();
        drop(e);
        let err = Engine::open(b.clone(), cat.clone(), Arc::new(Faults::default()))
            .await
            .err()
            .unwrap();
        assert_eq!(err.code(), codes::SCHEMA_DRIFT, "{err}");
        assert!(err.to_string().contains("ignore_null_updates"), "{err}");
        let t = cat.load_table(&b.target).await.unwrap().unwrap();
        assert_eq!(t.metadata_location, loc);
    }
}
