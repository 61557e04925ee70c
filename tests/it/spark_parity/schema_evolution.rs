//! Spark's schema-evolution suites (`AutoCdcScd{1,2}SchemaEvolutionSuite`, `AutoCdcScd2ColumnEvolutionSuite`).

use super::*;

// ---------------------------------------------------------------------------
// AutoCdcScd1SchemaEvolutionSuite, AutoCdcScd2SchemaEvolutionSuite,
// AutoCdcScd2ColumnEvolutionSuite
//
// Spark evolves the target from the source DataFrame's schema; in autocdc
// the definition names the columns (and with schema_evolution =
// "add_columns", pushed fields add them), so a Spark run whose source gains
// a column is a run on a definition with that column. A column the source
// stops sending stays declared and is null in new rows, as in Spark. Where
// autocdc differs on purpose: it widens int -> long (an Iceberg promotion;
// Spark refuses with CANNOT_MERGE_INCOMPATIBLE_DATA_TYPE), adding a column
// to SCD2's default tracked set opens no version (Spark refuses it as
// TRACK_HISTORY_DRIFT), and a column left out of the definition (or of
// column_list) is dropped from the current schema (Spark keeps it, null in
// new rows). The nested-field scenarios are at the end of this file.
// ---------------------------------------------------------------------------

/// Pipeline updates on one fresh warehouse, each run on its own definition
/// (the flow reopened between them, as a Spark update re-resolves its
/// source): the target's rows after the last.
fn updates(runs: &[(&Flow, &str)]) -> Rows {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let cat = catalog(tmp.path());
        let mut last = None;
        for (i, (flow, batch)) in runs.iter().enumerate() {
            let mut e = open_engine(&cat, flow).await;
            apply(&mut e, flow, batch, 1_000 + i as i64).await;
            last = Some(e);
        }
        table_rows(&last.unwrap()).await
    })
}

/// The error opening `then` on a warehouse where `first` applied `batch`.
fn refused_update(first: &Flow, batch: &str, then: &Flow) -> autocdc::error::Error {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let cat = catalog(tmp.path());
        let mut e = open_engine(&cat, first).await;
        apply(&mut e, first, batch, 1_000).await;
        drop(e);
        Engine::open(then.clone(), cat.clone(), Arc::new(Faults::default()))
            .await
            .err()
            .expect("the update was accepted")
    })
}

/// keys = [id], sequence_by = version, with `columns` between id and version.
fn evolving(extra: &str, columns: &[&str]) -> Flow {
    let mut all = vec![r#"{ name = "id", type = "int", required = true }"#];
    all.extend(columns);
    all.push(r#"{ name = "version", type = "long", required = true }"#);
    flow(&format!(
        "keys = [\"id\"]\nsequence_by = \"version\"\n{extra}\ncolumns = [\n  {}\n]",
        all.join(",\n  ")
    ))
}

const NAME: &str = r#"{ name = "name", type = "string" }"#;
const EMAIL: &str = r#"{ name = "email", type = "string" }"#;

/// Spark: AutoCdcScd1SchemaEvolutionSuite, "a new top-level nullable column
/// appearing in the source DF between runs is added to the target".
#[test]
fn scd1_a_column_the_source_adds_is_null_in_older_rows() {
    let narrow = flow(
        r#"keys = ["id"]
sequence_by = "version"
columns = [
  { name = "id", type = "int", required = true },
  { name = "name", type = "string" },
  { name = "version", type = "long", required = true },
]"#,
    );
    // Spark appends the new column at the end; so does this definition.
    let wide = flow(
        r#"keys = ["id"]
sequence_by = "version"
columns = [
  { name = "id", type = "int", required = true },
  { name = "name", type = "string" },
  { name = "version", type = "long", required = true },
  { name = "email", type = "string" },
]"#,
    );
    let got = updates(&[
        (&narrow, r#"{"id":1,"name":"alice","version":1}"#),
        (
            &wide,
            r#"{"id":2,"name":"bob","email":"b@x.com","version":2}"#,
        ),
    ]);
    assert_eq!(
        got,
        rows(&[&["1", "alice", "1", "NULL"], &["2", "bob", "2", "b@x.com"]])
    );
}

/// Spark: AutoCdcScd1SchemaEvolutionSuite, "a top-level column dropped from
/// the source DF between runs is preserved on existing rows and left NULL on
/// new rows".
#[test]
fn scd1_a_column_the_source_stops_sending_keeps_older_values() {
    let f = evolving("", &[NAME, EMAIL]);
    let got = updates(&[
        (
            &f,
            r#"{"id":1,"name":"alice","email":"a@x.com","version":1}"#,
        ),
        (&f, r#"{"id":2,"name":"bob","version":2}"#),
    ]);
    assert_eq!(
        got,
        rows(&[&["1", "alice", "a@x.com", "1"], &["2", "bob", "NULL", "2"]])
    );
}

/// Spark: AutoCdcScd1SchemaEvolutionSuite, "a source DF column whose name
/// differs from the target only by case is folded onto the existing column
/// under case-insensitive resolution".
#[test]
fn scd1_a_source_column_differing_only_in_case_folds_onto_the_column() {
    let f = flow(
        r#"keys = ["key"]
sequence_by = "version"
columns = [
  { name = "key", type = "int", required = true },
  { name = "version", type = "long", required = true },
  { name = "value", type = "string" },
]"#,
    );
    let tmp = tempfile::tempdir().unwrap();
    let (got, names) = rt().block_on(async {
        let cat = catalog(tmp.path());
        let mut e = open_engine(&cat, &f).await;
        apply(
            &mut e,
            &f,
            r#"{"key":1,"version":1,"Value":"alice"}"#,
            1_000,
        )
        .await;
        (table_rows(&e).await, column_names(&e))
    });
    assert_eq!(names, ["key", "version", "value"]);
    assert_eq!(got, rows(&[&["1", "1", "alice"]]));
}

/// Spark: AutoCdcScd1SchemaEvolutionSuite / AutoCdcScd2SchemaEvolutionSuite,
/// "widening a non-key column's type between runs fails with
/// CANNOT_MERGE_INCOMPATIBLE_DATA_TYPE". autocdc widens instead (int -> long
/// is an Iceberg promotion): older values read promoted.
#[test]
fn widening_a_column_between_runs_is_a_promotion_not_an_error() {
    for extra in ["", "stored_as_scd_type = 2"] {
        let int = evolving(extra, &[r#"{ name = "value", type = "int" }"#]);
        let long = evolving(extra, &[r#"{ name = "value", type = "long" }"#]);
        let got = updates(&[
            (&int, r#"{"id":1,"value":1,"version":1}"#),
            (&long, r#"{"id":2,"value":3000000000,"version":2}"#),
        ]);
        let want: Rows = if extra.is_empty() {
            rows(&[&["1", "1", "1"], &["2", "3000000000", "2"]])
        } else {
            rows(&[
                &["1", "1", "1", "1", "NULL"],
                &["2", "3000000000", "2", "2", "NULL"],
            ])
        };
        assert_eq!(got, want, "{extra}");
    }
}

/// Spark: "narrowing a non-key column's type between runs fails" and
/// "changing a non-key column type from TIMESTAMP to STRING between runs
/// fails", both SCD types: refused as SCHEMA_DRIFT naming the column, before
/// anything changes.
#[test]
fn narrowing_or_retyping_a_column_between_runs_is_refused() {
    for extra in ["", "stored_as_scd_type = 2"] {
        for (from, to, row) in [
            ("long", "int", r#"{"id":1,"value":1,"version":1}"#),
            ("timestamp", "string", r#"{"id":1,"version":1}"#),
        ] {
            let col = |t: &str| format!(r#"{{ name = "value", type = "{t}" }}"#);
            let first = evolving(extra, &[&col(from)]);
            let then = evolving(extra, &[&col(to)]);
            let e = refused_update(&first, row, &then);
            assert_eq!(e.code(), codes::SCHEMA_DRIFT, "{extra} {from}->{to}: {e}");
            assert!(e.to_string().contains("value"), "{e}");
        }
    }
}

/// Spark: AutoCdcScd2SchemaEvolutionSuite, "a new top-level nullable column
/// appearing in the source DF between runs is added to the target"
/// (track_history_column_list = [name]), and "adding a source column under
/// default tracking is rejected as track-history drift". autocdc accepts the
/// second too: the added column is null in every earlier version, so the
/// history needs no re-fold and key 1 keeps its one open version.
#[test]
fn scd2_a_column_the_source_adds_is_null_in_older_versions() {
    for extra in [
        "stored_as_scd_type = 2\ntrack_history_column_list = [\"name\"]",
        "stored_as_scd_type = 2",
    ] {
        let narrow = evolving(extra, &[NAME]);
        let wide = evolving(extra, &[NAME, EMAIL]);
        let got = updates(&[
            (&narrow, r#"{"id":1,"name":"alice","version":1}"#),
            (
                &wide,
                r#"{"id":2,"name":"bob","email":"b@x.com","version":2}"#,
            ),
        ]);
        let want = rows(&[
            &["1", "alice", "NULL", "1", "1", "NULL"],
            &["2", "bob", "b@x.com", "2", "2", "NULL"],
        ]);
        assert_eq!(got, want, "{extra}");
    }
}

/// Spark: AutoCdcScd2ColumnEvolutionSuite, "a source column dropped between
/// runs is preserved on existing records and null on new ones", and "a late
/// narrower event weaves into history without rewriting existing records".
#[test]
fn scd2_a_column_the_source_stops_sending_keeps_older_versions() {
    let f = evolving(
        "stored_as_scd_type = 2\ntrack_history_column_list = [\"name\"]",
        &[NAME, EMAIL],
    );
    let got = updates(&[
        (&f, r#"{"id":1,"name":"alice","email":"a@x","version":1}"#),
        (
            &f,
            r#"{"id":1,"name":"alice2","version":2}
               {"id":2,"name":"bob","version":1}"#,
        ),
    ]);
    assert_eq!(
        got,
        rows(&[
            &["1", "alice", "a@x", "1", "1", "2"],
            &["1", "alice2", "NULL", "2", "2", "NULL"],
            &["2", "bob", "NULL", "1", "1", "NULL"],
        ])
    );
    let got = updates(&[
        (
            &f,
            r#"{"id":1,"name":"alice","email":"a@x","version":10}
               {"id":1,"name":"alicia","email":"b@x","version":30}"#,
        ),
        (&f, r#"{"id":1,"name":"annie","version":20}"#),
    ]);
    assert_eq!(
        got,
        rows(&[
            &["1", "alice", "a@x", "10", "10", "20"],
            &["1", "annie", "NULL", "20", "20", "30"],
            &["1", "alicia", "b@x", "30", "30", "NULL"],
        ])
    );
}

/// Spark: AutoCdcScd2ColumnEvolutionSuite, "narrowing the COLUMNS selection
/// to drop a non-tracked column preserves it on existing records and leaves
/// it null on new ones". In autocdc a column left out of the selection is
/// dropped from the target's current schema (older files keep it): the
/// history is otherwise Spark's.
#[test]
fn scd2_narrowing_column_list_drops_an_untracked_column() {
    let extra = "stored_as_scd_type = 2\ntrack_history_column_list = [\"name\"]";
    let all = evolving(extra, &[NAME, EMAIL]);
    let narrowed = evolving(
        &format!("{extra}\ncolumn_list = [\"id\", \"name\", \"version\"]"),
        &[NAME, EMAIL],
    );
    let got = updates(&[
        (&all, r#"{"id":1,"name":"alice","email":"a@x","version":1}"#),
        (
            &narrowed,
            r#"{"id":1,"name":"alice2","email":"ignored","version":2}
               {"id":2,"name":"bob","email":"ignored","version":1}"#,
        ),
    ]);
    assert_eq!(
        got,
        rows(&[
            &["1", "alice", "1", "1", "2"],
            &["1", "alice2", "2", "2", "NULL"],
            &["2", "bob", "1", "1", "NULL"],
        ])
    );
}

/// Spark: AutoCdcScd1SchemaEvolutionSuite, "narrowing the column selection
/// between runs preserves the dropped column on existing rows and leaves it
/// NULL on new rows". The target's columns only grow; `drop_columns` drops
/// one explicitly.
#[test]
fn scd1_narrowing_the_column_selection_preserves_the_column_on_existing_rows_and_leaves_it_null_on_new_rows()
 {
    let all = evolving("", &[NAME, EMAIL]);
    let select = "column_list = [\"id\", \"name\", \"version\"]";
    let narrowed = evolving(select, &[NAME, EMAIL]);
    let first = r#"{"id":1,"name":"alice","email":"a@x","version":1}
                   {"id":3,"name":"carol","email":"c@x","version":1}"#;
    let got = updates(&[
        (&all, first),
        (
            &narrowed,
            r#"{"id":1,"name":"alice2","email":"ignored","version":2}
               {"id":2,"name":"bob","email":"ignored","version":1}"#,
        ),
    ]);
    assert_eq!(
        got,
        rows(&[
            &["1", "alice2", "NULL", "2"],
            &["2", "bob", "NULL", "1"],
            &["3", "carol", "c@x", "1"],
        ])
    );
    let dropped = evolving(
        &format!("{select}\ndrop_columns = [\"email\"]"),
        &[NAME, EMAIL],
    );
    let got = updates(&[
        (&all, first),
        (&dropped, r#"{"id":2,"name":"bob","version":1}"#),
    ]);
    assert_eq!(
        got,
        rows(&[
            &["1", "alice", "1"],
            &["2", "bob", "1"],
            &["3", "carol", "1"]
        ])
    );
}

/// Spark: AutoCdcScd1SchemaEvolutionSuite / AutoCdcScd2SchemaEvolutionSuite,
/// "broadening the column selection between runs adds the newly-included
/// column to the target" (SCD2 with track_history_column_list = [name]).
#[test]
fn broadening_column_list_adds_the_column_null_in_older_rows() {
    for extra in [
        "",
        "stored_as_scd_type = 2\ntrack_history_column_list = [\"name\"]",
    ] {
        let selected = evolving(
            &format!("{extra}\ncolumn_list = [\"id\", \"name\", \"version\"]"),
            &[NAME, EMAIL],
        );
        let all = evolving(extra, &[NAME, EMAIL]);
        let got = updates(&[
            (
                &selected,
                r#"{"id":1,"name":"alice","email":"ignored","version":1}"#,
            ),
            (
                &all,
                r#"{"id":2,"name":"bob","email":"b@x.com","version":2}"#,
            ),
        ]);
        let want: Rows = if extra.is_empty() {
            rows(&[&["1", "alice", "NULL", "1"], &["2", "bob", "b@x.com", "2"]])
        } else {
            rows(&[
                &["1", "alice", "NULL", "1", "1", "NULL"],
                &["2", "bob", "b@x.com", "2", "2", "NULL"],
            ])
        };
        assert_eq!(got, want, "{extra}");
    }
}
