//! Spark's single- and multi-pipeline suites (`AutoCdcScd{1,2}SinglePipelineSuite`, `AutoCdcScd{1,2}MultiPipelineSuite`).

use super::*;

// ---------------------------------------------------------------------------
// AutoCdcScd1SinglePipelineSuite, AutoCdcScd2SinglePipelineSuite
// ---------------------------------------------------------------------------

/// Spark: AutoCdcScd1SinglePipelineSuite, "an upsert event lands a new row in an empty target
/// table" (key 2) and "consecutive upsert, delete, and re-upsert events for the same key in one
/// run converge to the latest event" (key 1).
#[test]
fn scd1_pipeline_upsert_delete_reupsert_converges_to_the_latest() {
    scenario(
        SCD1_PIPELINE_DELETES,
        &[r#"
        {"id": 1, "name": "alice", "version": 1, "is_delete": false}
        {"id": 1, "name": "alice", "version": 2, "is_delete": true}
        {"id": 1, "name": "alice2", "version": 3, "is_delete": false}
        {"id": 2, "name": "alice", "version": 1}
        "#],
        &[&["1", "alice2", "3"], &["2", "alice", "1"]],
    );
}

/// Spark: AutoCdcScd2SinglePipelineSuite, "SCD2: an upsert lands an open current record in an empty
/// target table" (key 1), "SCD2: an update to a key closes the prior record and opens a new one"
/// (key 2) and "SCD2: a delete closes the current record with no open record remaining" (key 3).
/// The sequence column `version` stays in the target.
#[test]
fn scd2_pipeline_upsert_update_and_delete() {
    scenario(
        SCD2_PIPELINE_DELETES,
        &[r#"
        {"id": 1, "name": "alice", "version": 10, "is_delete": false}
        {"id": 2, "name": "alice", "version": 10, "is_delete": false}
        {"id": 2, "name": "alicia", "version": 20, "is_delete": false}
        {"id": 3, "name": "alice", "version": 10, "is_delete": false}
        {"id": 3, "name": null, "version": 20, "is_delete": true}
        "#],
        &[
            &["1", "alice", "10", "10", "NULL"],
            &["2", "alice", "10", "10", "20"],
            &["2", "alicia", "20", "20", "NULL"],
            &["3", "alice", "10", "10", "20"],
        ],
    );
}

// ---------------------------------------------------------------------------
// AutoCdcScd1MultiPipelineSuite, AutoCdcScd2MultiPipelineSuite
// ---------------------------------------------------------------------------

/// Spark: AutoCdcScd1MultiPipelineSuite and AutoCdcScd2MultiPipelineSuite, "two AutoCDC pipelines
/// targeting separate tables maintain independent target and auxiliary tables";
/// AutoCdcScd1SinglePipelineSuite, "two AutoCDC flows targeting separate tables in one pipeline
/// produce independent results"; AutoCdcScd2SinglePipelineSuite, "SCD2: the auxiliary table is
/// materialized for the target" (each target gets its own state table).
#[test]
fn flows_on_separate_targets_are_independent() {
    for (body, want_a, want_b) in [
        (
            SCD1_PIPELINE,
            rows(&[&["1", "alice", "100"]]),
            rows(&[&["9", "bob", "1"]]),
        ),
        (
            SCD2_PIPELINE,
            rows(&[&["1", "alice", "100", "100", "NULL"]]),
            rows(&[&["9", "bob", "1", "1", "NULL"]]),
        ),
    ] {
        let fa = flow_as("flow_a", "spark.t_a", body);
        let fb = flow_as("flow_b", "spark.t_b", body);
        let tmp = tempfile::tempdir().unwrap();
        rt().block_on(async {
            let cat = catalog(tmp.path());
            let mut a = open_engine(&cat, &fa).await;
            apply(
                &mut a,
                &fa,
                r#"{"id": 1, "name": "alice", "version": 100}"#,
                1,
            )
            .await;
            // A lower sequence on the other target: nothing of flow_a's leaks into it.
            let mut b = open_engine(&cat, &fb).await;
            apply(&mut b, &fb, r#"{"id": 9, "name": "bob", "version": 1}"#, 2).await;
            assert_eq!(table_rows(&open_engine(&cat, &fa).await).await, want_a);
            assert_eq!(table_rows(&open_engine(&cat, &fb).await).await, want_b);
            for f in [&fa, &fb] {
                assert!(
                    cat.load_table(&f.state_ident()).await.unwrap().is_some(),
                    "{} has its state table",
                    f.target
                );
            }
        });
    }
}

/// Spark: AutoCdcScd1MultiPipelineSuite, "a downstream pipeline can read an AutoCDC target written
/// by a different pipeline without observing the CDC metadata column", and the SCD2 suite's
/// "... without observing the framework columns": autocdc's target has the user's columns only
/// (SCD Type 2 adds just `__START_AT` and `__END_AT`).
#[test]
fn the_target_has_no_metadata_columns() {
    let cases: [(&str, &[&str], Rows); 2] = [
        (
            SCD1_PIPELINE,
            &["id", "name", "version"],
            rows(&[&["1", "alice", "1"], &["2", "bob", "1"]]),
        ),
        (
            SCD2_PIPELINE,
            &["id", "name", "version", "__START_AT", "__END_AT"],
            rows(&[
                &["1", "alice", "1", "1", "NULL"],
                &["2", "bob", "1", "1", "NULL"],
            ]),
        ),
    ];
    for (body, columns, want) in cases {
        let f = flow(body);
        let tmp = tempfile::tempdir().unwrap();
        rt().block_on(async {
            let mut engine = open_engine(&catalog(tmp.path()), &f).await;
            apply(
                &mut engine,
                &f,
                r#"
                {"id": 1, "name": "alice", "version": 1}
                {"id": 2, "name": "bob", "version": 1}
                "#,
                1,
            )
            .await;
            assert_eq!(column_names(&engine), columns);
            assert_eq!(table_rows(&engine).await, want);
        });
    }
}

/// Spark: AutoCdcScd1MultiPipelineSuite and AutoCdcScd2MultiPipelineSuite, "two AutoCDC pipelines
/// targeting the same table with identical key and data schemas merge into a shared target table".
/// autocdc's state belongs to the flow, so the second "pipeline" is a later run of the same flow
/// definition (a restart in between) feeding other changes.
#[test]
fn a_second_run_with_other_changes_merges_into_the_target() {
    let run1 = r#"
    {"id": 1, "name": "alice", "version": 1}
    {"id": 2, "name": "bob", "version": 1}
    "#;
    let run2 = r#"
    {"id": 2, "name": "bob-v2", "version": 2}
    {"id": 3, "name": "carol", "version": 1}
    "#;
    steps(
        SCD1_PIPELINE,
        &[
            (run1, rows(&[&["1", "alice", "1"], &["2", "bob", "1"]])),
            (
                run2,
                rows(&[
                    &["1", "alice", "1"],
                    &["2", "bob-v2", "2"],
                    &["3", "carol", "1"],
                ]),
            ),
        ],
    );
    steps(
        SCD2_PIPELINE,
        &[
            (
                run1,
                rows(&[
                    &["1", "alice", "1", "1", "NULL"],
                    &["2", "bob", "1", "1", "NULL"],
                ]),
            ),
            (
                run2,
                rows(&[
                    &["1", "alice", "1", "1", "NULL"],
                    &["2", "bob", "1", "1", "2"],
                    &["2", "bob-v2", "2", "2", "NULL"],
                    &["3", "carol", "1", "1", "NULL"],
                ]),
            ),
        ],
    );
}

/// Applies each `(flow, batch)` in turn to one warehouse, each flow's
/// engine kept open across the others' commits (two pipelines running
/// side by side); returns the target's rows as each flow, opened again,
/// then reads them.
async fn side_by_side(dir: &Path, runs: &[(&Flow, &str)]) -> Vec<Rows> {
    let cat = catalog(dir);
    let mut engines: Vec<(String, Engine)> = Vec::new();
    for (i, (f, batch)) in runs.iter().enumerate() {
        if !engines.iter().any(|(n, _)| *n == f.name) {
            engines.push((f.name.clone(), open_engine(&cat, f).await));
        }
        let (_, engine) = engines.iter_mut().find(|(n, _)| *n == f.name).unwrap();
        apply(engine, f, batch, 1_000 + i as i64).await;
    }
    let mut out = Vec::new();
    for (name, _) in &engines {
        let f = runs.iter().find(|(f, _)| f.name == *name).unwrap().0;
        out.push(table_rows(&open_engine(&cat, f).await).await);
    }
    out
}

/// Spark: AutoCdcScd1MultiPipelineSuite and AutoCdcScd2MultiPipelineSuite, "two AutoCDC pipelines
/// targeting the same table with identical key and data schemas merge into a shared target table":
/// two flows on one target share its state, so a later change of either wins by sequence
/// (`bob` at 2 from flow_b over flow_a's `bob` at 1; flow_a's late `carol` at 0 loses to flow_b's
/// at 1), whichever flow brought it.
#[test]
fn two_flows_into_one_table_with_identical_schemas_merge_into_the_shared_target() {
    let run_a = r#"
    {"id": 1, "name": "alice", "version": 1}
    {"id": 2, "name": "bob", "version": 1}
    "#;
    let run_b = r#"
    {"id": 2, "name": "bob-v2", "version": 2}
    {"id": 3, "name": "carol", "version": 1}
    "#;
    let late_a = r#"{"id": 3, "name": "carol-old", "version": 0}"#;
    for (body, want) in [
        (
            SCD1_PIPELINE,
            rows(&[
                &["1", "alice", "1"],
                &["2", "bob-v2", "2"],
                &["3", "carol", "1"],
            ]),
        ),
        (
            SCD2_PIPELINE,
            rows(&[
                &["1", "alice", "1", "1", "NULL"],
                &["2", "bob", "1", "1", "2"],
                &["2", "bob-v2", "2", "2", "NULL"],
                &["3", "carol-old", "0", "0", "1"],
                &["3", "carol", "1", "1", "NULL"],
            ]),
        ),
    ] {
        let (fa, fb) = (
            flow_as("flow_a", "spark.target", body),
            flow_as("flow_b", "spark.target", body),
        );
        let tmp = tempfile::tempdir().unwrap();
        let got = rt().block_on(side_by_side(
            tmp.path(),
            &[(&fa, run_a), (&fb, run_b), (&fa, late_a)],
        ));
        assert_eq!(got, vec![want.clone(), want], "{body}");
    }
}

/// Spark: AutoCdcScd1MultiPipelineSuite, "two pipelines into one table with different data
/// columns evolve the shared schema": the target has the union of the flows' columns; a flow's
/// rows leave the columns it does not select null, and its update replaces the whole row.
#[test]
fn two_flows_into_one_table_with_different_data_columns_evolve_the_shared_schema() {
    let with = |extra: &str| {
        format!(
            "keys = [\"id\"]\nsequence_by = \"version\"\ncolumns = [\n  {{ name = \"id\", type = \"int\" }},\n  {{ name = \"{extra}\", type = \"string\" }},\n  {{ name = \"version\", type = \"long\" }},\n]\n"
        )
    };
    let (fa, fb) = (
        flow_as("flow_a", "spark.target", &with("name")),
        flow_as("flow_b", "spark.target", &with("city")),
    );
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let got = side_by_side(
            tmp.path(),
            &[
                (
                    &fa,
                    r#"{"id": 1, "name": "alice", "version": 1}
                         {"id": 2, "name": "bob", "version": 1}"#,
                ),
                (
                    &fb,
                    r#"{"id": 2, "city": "Paris", "version": 2}
                         {"id": 3, "city": "Oslo", "version": 1}"#,
                ),
            ],
        )
        .await;
        // flow_b's `city` goes where flow_b declares it: after `id`'s
        // neighbour `name`, before `version`.
        let want = rows(&[
            &["1", "alice", "NULL", "1"],
            &["2", "NULL", "Paris", "2"],
            &["3", "NULL", "Oslo", "1"],
        ]);
        assert_eq!(got, vec![want.clone(), want]);
        let engine = open_engine(&catalog(tmp.path()), &fa).await;
        assert_eq!(column_names(&engine), ["id", "name", "city", "version"]);
    });
}

/// Spark: AutoCdcScd1MultiPipelineSuite and AutoCdcScd2MultiPipelineSuite, "a second pipeline
/// targeting an existing AutoCDC table with different keys fails with KEY_SCHEMA_DRIFT", with the
/// second pipeline a flow of another name: refused with Spark's code, naming the first flow.
#[test]
fn a_second_flow_with_different_keys_is_key_schema_drift() {
    for scd in [1, 2] {
        let fa = flow_as("flow_a", "spark.target", &keyed_on(r#"["id"]"#, scd));
        let fb = flow_as("flow_b", "spark.target", &keyed_on(r#"["name"]"#, scd));
        let tmp = tempfile::tempdir().unwrap();
        rt().block_on(async {
            let cat = catalog(tmp.path());
            let mut a = open_engine(&cat, &fa).await;
            apply(
                &mut a,
                &fa,
                r#"{"id": 1, "name": "alice", "version": 1}"#,
                1,
            )
            .await;
            let e = Engine::open(fb.clone(), cat.clone(), Arc::new(Faults::default()))
                .await
                .err()
                .expect("flow_b was opened");
            assert_eq!(e.code(), codes::KEY_SCHEMA_DRIFT, "{e}");
            assert!(e.to_string().contains("flow `flow_a`"), "{e}");
        });
    }
}

/// `(id, name, version)`, all required, keyed on `keys` (a TOML array), SCD Type `scd`.
fn keyed_on(keys: &str, scd: u8) -> String {
    format!(
        "keys = {}\nsequence_by = \"version\"\nstored_as_scd_type = {}\n{}",
        keys,
        scd,
        r#"columns = [
  { name = "id", type = "int", required = true },
  { name = "name", type = "string", required = true },
  { name = "version", type = "long", required = true },
]"#
    )
}

/// Spark: AutoCdcScd1MultiPipelineSuite, "a second pipeline targeting an existing AutoCDC table
/// with different keys fails with KEY_SCHEMA_DRIFT".
#[test]
fn scd1_changed_keys_are_key_schema_drift() {
    refused_on_change(
        &keyed_on(r#"["id"]"#, 1),
        &[r#"{"id": 1, "name": "alice", "version": 1}"#],
        &keyed_on(r#"["name"]"#, 1),
        r#"{"id": 2, "name": "alice", "version": 1}"#,
        codes::KEY_SCHEMA_DRIFT,
    );
}

/// Spark: AutoCdcScd2MultiPipelineSuite, "a second pipeline targeting an existing AutoCDC table
/// with different keys fails with KEY_SCHEMA_DRIFT".
#[test]
fn scd2_changed_keys_are_key_schema_drift() {
    refused_on_change(
        &keyed_on(r#"["id"]"#, 2),
        &[r#"{"id": 1, "name": "alice", "version": 1}"#],
        &keyed_on(r#"["name"]"#, 2),
        r#"{"id": 2, "name": "alice", "version": 1}"#,
        codes::KEY_SCHEMA_DRIFT,
    );
}

/// Spark: AutoCdcScd2KeyDriftSuite, "a pipeline execution that adds a key column to an existing
/// AutoCDC flow triggers KEY_SCHEMA_DRIFT", "... that drops a key column ..." and "... that swaps
/// a key in an existing AutoCDC flow for a different name (same arity) ...".
#[test]
fn scd2_adding_dropping_or_swapping_a_key_is_key_schema_drift() {
    let def = |keys: &str| {
        format!(
            "keys = {}\nsequence_by = \"version\"\nstored_as_scd_type = 2\n{}",
            keys,
            r#"columns = [
  { name = "id", type = "int", required = true },
  { name = "region", type = "string", required = true },
  { name = "country", type = "string", required = true },
  { name = "version", type = "long", required = true },
]"#
        )
    };
    let run1 = r#"{"id": 1, "region": "us", "country": "USA", "version": 1}"#;
    let run2 = r#"{"id": 1, "region": "us", "country": "USA", "version": 2}"#;
    for (v1, v2) in [
        (r#"["id"]"#, r#"["region", "id"]"#),
        (r#"["region", "id"]"#, r#"["id"]"#),
        (r#"["id", "region"]"#, r#"["id", "country"]"#),
    ] {
        refused_on_change(&def(v1), &[run1], &def(v2), run2, codes::KEY_SCHEMA_DRIFT);
    }
}

/// Spark: AutoCdcScd2KeyDriftSuite, "a pipeline whose recorded aux key dataType differs from the
/// flow's source dataType triggers KEY_SCHEMA_DRIFT" (Spark seeds a BIGINT key; here the first
/// run declares `id` a `long`, the second an `int`).
#[test]
fn scd2_a_key_of_another_type_is_key_schema_drift() {
    let id_long = SCD2_ID_VERSION.replace(
        r#"{ name = "id", type = "int" }"#,
        r#"{ name = "id", type = "long" }"#,
    );
    assert_ne!(id_long, SCD2_ID_VERSION);
    refused_on_change(
        &id_long,
        &[r#"{"id": 1, "version": 1}"#],
        SCD2_ID_VERSION,
        r#"{"id": 1, "version": 2}"#,
        codes::KEY_SCHEMA_DRIFT,
    );
}

/// `(a, b, version)` keyed on `keys` (a TOML array), SCD Type `scd`.
fn keyed_ab(keys: &str, scd: u8) -> String {
    format!(
        "keys = {}\nsequence_by = \"version\"\nstored_as_scd_type = {}\n{}",
        keys,
        scd,
        r#"columns = [
  { name = "a", type = "int", required = true },
  { name = "b", type = "string", required = true },
  { name = "version", type = "long", required = true },
]"#
    )
}

/// Spark: AutoCdcScd1KeyDriftSuite and AutoCdcScd2KeyDriftSuite, "a composite key reorder ([a,b]
/// -> [b,a]) does NOT trigger drift validation": the same key set declared in another order opens,
/// and the existing keys are still recognised (key (1, x) is updated, not duplicated).
#[test]
fn a_reordered_composite_key_is_no_drift() {
    for (scd, want) in [
        (1, rows(&[&["1", "x", "2"], &["2", "y", "1"]])),
        (
            2,
            rows(&[
                &["1", "x", "1", "1", "2"],
                &["1", "x", "2", "2", "NULL"],
                &["2", "y", "1", "1", "NULL"],
            ]),
        ),
    ] {
        let (v1, v2) = (
            flow(&keyed_ab(r#"["a", "b"]"#, scd)),
            flow(&keyed_ab(r#"["b", "a"]"#, scd)),
        );
        let tmp = tempfile::tempdir().unwrap();
        rt().block_on(async {
            let cat = catalog(tmp.path());
            let mut engine = open_engine(&cat, &v1).await;
            apply(&mut engine, &v1, r#"{"a": 1, "b": "x", "version": 1}"#, 1).await;
            drop(engine);
            let mut engine = open_engine(&cat, &v2).await;
            apply(
                &mut engine,
                &v2,
                r#"
                {"a": 2, "b": "y", "version": 1}
                {"a": 1, "b": "x", "version": 2}
                "#,
                2,
            )
            .await;
            assert_eq!(table_rows(&engine).await, want, "SCD Type {scd}");
            let engine = open_engine(&cat, &v2).await;
            assert_eq!(table_rows(&engine).await, want, "SCD Type {scd}, reopened");
        });
    }
}
