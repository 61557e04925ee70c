//! Schema evolution by changing the flow's definition: added, widened,
//! relaxed, renamed and dropped columns become one metadata commit of the
//! target (and of the state table, which evolves with it), rows written
//! before read correctly, and every illegal change is refused before
//! anything changes.

use crate::common;

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
async fn a_rename_keeps_the_columns_id_and_values_narrowing_keeps_the_column_and_a_drop_leaves_old_files_alone()
 {
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

    // Narrowed (Spark's "narrowing the column selection between runs
    // preserves the dropped column on existing rows and leaves it NULL on
    // new rows"): `title` stays where it was, with its id; rows written
    // before keep their values; new rows and updates leave it null.
    let narrowed = orders(&[ID, OP, QTY_INT, SEQ], "");
    let mut e = open_engine(&cat, &narrowed).await;
    assert_eq!(
        column_names(&e),
        ["id", "qty", "title", "seq"],
        "the column stays, in its place"
    );
    assert!(ids(&e).contains(&("title".to_string(), name_id)));
    apply(
        &mut e,
        &narrowed,
        "{\"id\":2,\"op\":\"UPSERT\",\"qty\":6,\"seq\":2}\n{\"id\":4,\"op\":\"UPSERT\",\"qty\":1,\"seq\":2}",
        3,
    )
    .await;
    assert_eq!(
        table_rows(&e).await,
        rows(&[
            &["1", "4", "pencil", "2"],
            &["2", "6", "NULL", "2"],
            &["3", "7", "cap", "1"],
            &["4", "1", "NULL", "2"],
        ])
    );
    drop(e);

    // Dropped when named: old files keep it, the table no longer has it.
    let dropped = orders(&[ID, OP, QTY_INT, SEQ], r#"drop_columns = ["title"]"#);
    let mut e = open_engine(&cat, &dropped).await;
    assert!(!ids(&e).iter().any(|(n, _)| n == "title"));
    apply(&mut e, &dropped, r#"{"id":3,"op":"DELETE","seq":2}"#, 4).await;
    assert_eq!(
        table_rows(&e).await,
        rows(&[&["1", "4", "2"], &["2", "6", "2"], &["4", "1", "2"]])
    );
    // A key or sequence column, or one the flow selects, is never dropped.
    for (extra, rule) in [
        (r#"drop_columns = ["id"]"#, "a key or sequence column"),
        (r#"drop_columns = ["seq"]"#, "a key or sequence column"),
        (r#"drop_columns = ["qty"]"#, "the flow selects it"),
    ] {
        let toml = format!(
            "name = \"orders\"\ntarget = \"shop.orders\"\nkeys = [\"id\"]\nsequence_by = \"seq\"\n{extra}\ncolumns = [{ID}, {QTY_INT}, {SEQ}]\n"
        );
        let err = Flow::new(toml::from_str(&toml).unwrap()).unwrap_err();
        assert_eq!(err.code(), codes::INVALID_DEFINITION, "{err}");
        assert!(err.to_string().contains(rule), "{err}");
    }
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

/// Random batches interleaved with random legal definition changes (add,
/// widen, drop, rename, repartition) and restarts, against an oracle that
/// applies the same changes: per key the change with the highest sequence,
/// its values for the columns that existed when it was pushed (a column
/// added later is null, a widened one keeps its values, a renamed one its
/// values under the new name, a dropped one is gone).
mod random_evolution {
    use std::collections::{BTreeMap, BTreeSet};

    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Change {
        Add,
        Widen(usize),
        Drop(usize),
        Rename(usize),
        Repartition(usize),
        Restart,
    }

    /// (key, delete, sequence draw, values: one draw per column, None = null)
    type Event = (i64, bool, u16, Vec<Option<i8>>);

    fn change() -> impl Strategy<Value = Change> {
        prop_oneof![
            Just(Change::Add),
            (0..4usize).prop_map(Change::Widen),
            (0..4usize).prop_map(Change::Drop),
            (0..4usize).prop_map(Change::Rename),
            (0..PARTITIONS.len()).prop_map(Change::Repartition),
            Just(Change::Restart),
        ]
    }

    fn event() -> impl Strategy<Value = Event> {
        (
            0..6i64,
            prop::bool::weighted(0.2),
            any::<u16>(),
            prop::collection::vec(prop::option::weighted(0.8, -5i8..5), 8),
        )
    }

    fn steps() -> impl Strategy<Value = Vec<(Option<Change>, Vec<Event>)>> {
        prop::collection::vec(
            (
                prop::option::weighted(0.7, change()),
                prop::collection::vec(event(), 1..6),
            ),
            1..8,
        )
    }

    const PARTITIONS: [&[&str]; 4] = [&[], &["bucket[2](id)"], &["seq"], &["bucket[3](id)"]];

    #[derive(Debug, Clone)]
    struct Col {
        ident: usize,
        name: String,
        long: bool,
    }

    #[derive(Debug, Default)]
    struct Model {
        cols: Vec<Col>,
        next: usize,
        partition: usize,
        /// (old, new) of a rename the next definition carries.
        renamed: Option<(String, String)>,
        /// The columns dropped (`drop_columns`: leaving one out keeps it).
        dropped: Vec<String>,
    }

    impl Model {
        fn add(&mut self) {
            self.cols.push(Col {
                ident: self.next,
                name: format!("c{}", self.next),
                long: false,
            });
            self.next += 1;
        }

        /// Applies a change; false when it changes nothing (or is a restart).
        fn apply(&mut self, c: &Change) -> bool {
            let n = self.cols.len();
            match *c {
                Change::Add if n < 6 => self.add(),
                Change::Widen(i) if n > 0 && !self.cols[i % n].long => self.cols[i % n].long = true,
                Change::Drop(i) if n > 1 => {
                    let c = self.cols.remove(i % n);
                    self.dropped.push(c.name);
                }
                Change::Rename(i) if n > 0 => {
                    let c = &mut self.cols[i % n];
                    let new = format!("r{}", self.next);
                    self.next += 1;
                    self.renamed = Some((std::mem::replace(&mut c.name, new.clone()), new));
                }
                Change::Repartition(p) if p != self.partition => self.partition = p,
                _ => return false,
            }
            true
        }

        fn flow(&self) -> Flow {
            let mut cols = vec![ID.to_string(), OP.to_string()];
            for c in &self.cols {
                let ty = if c.long { "long" } else { "int" };
                let from = match &self.renamed {
                    Some((old, new)) if *new == c.name => format!(r#", renamed_from = "{old}""#),
                    _ => String::new(),
                };
                cols.push(format!(r#"{{ name = "{}", type = "{ty}"{from} }}"#, c.name));
            }
            cols.push(SEQ.to_string());
            let by: Vec<String> = PARTITIONS[self.partition]
                .iter()
                .map(|p| format!("\"{p}\""))
                .collect();
            let cols: Vec<&str> = cols.iter().map(String::as_str).collect();
            let dropped: Vec<String> = self.dropped.iter().map(|d| format!("\"{d}\"")).collect();
            orders(
                &cols,
                &format!(
                    "partition_by = [{}]\ndrop_columns = [{}]",
                    by.join(", "),
                    dropped.join(", ")
                ),
            )
        }
    }

    /// One pushed change: (key, delete, sequence, value per column ident).
    struct Sent {
        key: i64,
        delete: bool,
        seq: i64,
        values: BTreeMap<usize, i64>,
    }

    fn oracle(model: &Model, sent: &[Sent]) -> BTreeSet<Vec<String>> {
        let mut latest: BTreeMap<i64, &Sent> = BTreeMap::new();
        for s in sent {
            if latest.get(&s.key).is_none_or(|l| l.seq < s.seq) {
                latest.insert(s.key, s);
            }
        }
        latest
            .values()
            .filter(|s| !s.delete)
            .map(|s| {
                let mut row = vec![s.key.to_string()];
                row.extend(model.cols.iter().map(|c| {
                    s.values
                        .get(&c.ident)
                        .map_or("NULL".to_string(), i64::to_string)
                }));
                row.push(s.seq.to_string());
                row
            })
            .collect()
    }

    /// Where a case leaves its table after every step for the independent
    /// readers (`integration/readers.py`): the warehouse, and the directory
    /// of expected-rows files; `name` prefixes both.
    struct Export<'a> {
        out: &'a std::path::Path,
        name: String,
    }

    async fn run(
        steps: Vec<(Option<Change>, Vec<Event>)>,
        export: Option<Export<'_>>,
    ) -> std::result::Result<(), TestCaseError> {
        let tmp = tempfile::tempdir().unwrap();
        let dir = match &export {
            Some(e) => e.out.join(&e.name),
            None => tmp.path().to_path_buf(),
        };
        let cat = catalog(&dir);
        let mut model = Model::default();
        model.add();
        let mut flow = model.flow();
        let mut engine = open_engine(&cat, &flow).await;
        let mut sent: Vec<Sent> = Vec::new();
        for (step, (change, events)) in steps.into_iter().enumerate() {
            if let Some(c) = &change
                && (model.apply(c) || matches!(c, Change::Restart))
            {
                drop(engine);
                flow = model.flow();
                engine = open_engine(&cat, &flow).await;
                model.renamed = None;
            }
            let mut lines = Vec::new();
            for (i, (key, delete, draw, values)) in events.into_iter().enumerate() {
                // Unique sequences, in an order unrelated to arrival.
                let seq = draw as i64 * 1000 + (step * 10 + i) as i64;
                let mut obj = serde_json::json!({
                    "id": key,
                    "op": if delete { "DELETE" } else { "UPSERT" },
                    "seq": seq,
                });
                let mut kept = BTreeMap::new();
                for (c, v) in model.cols.iter().zip(values) {
                    obj[&c.name] = serde_json::json!(v);
                    if let (Some(v), false) = (v, delete) {
                        kept.insert(c.ident, v as i64);
                    }
                }
                lines.push(obj.to_string());
                sent.push(Sent {
                    key,
                    delete,
                    seq,
                    values: kept,
                });
            }
            // One change per step is sure to commit, so the latest snapshot
            // is in the current schema (iceberg-rust scans a snapshot in its own).
            let (key, seq) = (100 + step as i64, 1_000_000_000 + step as i64);
            lines.push(serde_json::json!({ "id": key, "op": "UPSERT", "seq": seq }).to_string());
            sent.push(Sent {
                key,
                delete: false,
                seq,
                values: BTreeMap::new(),
            });
            engine
                .apply(&rows_of(&flow, &lines.join("\n")), step as i64)
                .await
                .unwrap();
            let want = oracle(&model, &sent);
            let got = table_rows(&engine).await;
            prop_assert_eq!(
                &got,
                &want,
                "after step {} ({:?}) of {:?}",
                step,
                change,
                model
            );
            if let Some(e) = &export {
                export_step(e, step, &engine, &want);
            }
        }
        let meta = &engine.target().metadata;
        prop_assert_eq!(
            meta.default_partition_spec().fields().len(),
            PARTITIONS[model.partition].len()
        );
        Ok(())
    }

    /// The table after `step`, as the readers expect it: a copy of its
    /// metadata file (later commits may remove the original: 20 are kept),
    /// the current columns and the oracle's rows. Only position deletes were
    /// written, so PyIceberg reads it too.
    fn export_step(e: &Export<'_>, step: usize, engine: &Engine, want: &BTreeSet<Vec<String>>) {
        let target = engine.target();
        assert_eq!(
            snapshot_property(engine, "total-equality-deletes").as_deref(),
            Some("0")
        );
        let steps = e.out.join(&e.name).join("steps");
        let dir = e.out.join("expected");
        std::fs::create_dir_all(&steps).unwrap();
        std::fs::create_dir_all(&dir).unwrap();
        let name = format!("{}_step{step}", e.name);
        let metadata = steps.join(format!("{step}.metadata.json"));
        let from = target.metadata_location.trim_start_matches("file://");
        std::fs::copy(from, &metadata).unwrap();
        let columns = column_names(engine);
        let json = serde_json::json!({
            "name": name,
            "metadata": metadata,
            "keys": ["id"],
            "columns": columns,
            "rows": want.iter().collect::<Vec<_>>(),
        });
        std::fs::write(dir.join(format!("{name}.json")), json.to_string()).unwrap();
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn random_changes_and_restarts_match_the_oracle(steps in steps()) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(run(steps, None))?;
        }
    }

    /// Sixteen fixed draws of the property test. With `AUTOCDC_E2E_OUT=DIR`
    /// each leaves its table after every step under DIR for DuckDB and
    /// PyIceberg (`integration/readers.sh`); without it they run like the
    /// random cases.
    #[test]
    fn fixed_cases_for_the_readers() {
        use proptest::strategy::ValueTree;
        use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
        let out = std::env::var_os("AUTOCDC_E2E_OUT").map(std::path::PathBuf::from);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut drawn = BTreeSet::new();
        for case in 0..16u8 {
            let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[case + 1; 32]);
            let mut runner = TestRunner::new_with_rng(Config::default(), rng);
            let steps = steps().new_tree(&mut runner).unwrap().current();
            for c in steps.iter().filter_map(|(c, _)| c.as_ref()) {
                drawn.insert(format!("{c:?}").split('(').next().unwrap().to_string());
            }
            let export = out.as_deref().map(|out| Export {
                out,
                name: format!("evolution_{case}"),
            });
            rt.block_on(run(steps, export)).unwrap();
        }
        // The draws cover every kind of change.
        assert_eq!(drawn.len(), 6, "{drawn:?}");
    }
}
