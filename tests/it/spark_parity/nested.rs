//! Nested columns (struct, list, map), and Spark's nested schema-evolution scenarios.

use super::*;

// ---------------------------------------------------------------------------
// Nested columns: struct, list and map (Spark's StructType, ArrayType and
// MapType columns), from nested JSON objects and arrays
// ---------------------------------------------------------------------------

/// `(id, address struct, tags list, scores map, seq, op)`, SCD Type `scd`,
/// with `extra` lines.
fn nested_flow(scd: u8, extra: &str) -> String {
    format!(
        "keys = [\"id\"]\nsequence_by = \"seq\"\napply_as_deletes = \"op = 'D'\"\nexcept_column_list = [\"op\"]\nstored_as_scd_type = {scd}\n{extra}\n{}",
        r#"columns = [
  { name = "id", type = "int" },
  { name = "address", type = "struct<city: string, zip: int>" },
  { name = "tags", type = "list<string>" },
  { name = "scores", type = "map<string, long>" },
  { name = "seq", type = "long" },
  { name = "op", type = "string" },
]"#
    )
}

/// The latest change per key wins with nested values as with flat ones, in
/// every order and batching, across restarts.
#[test]
fn nested_values_are_upserted_and_deleted_whole() {
    scenario(
        &nested_flow(1, ""),
        &[
            r#"
            {"id": 1, "address": {"city": "Leeds", "zip": 1}, "tags": ["a", "b"], "scores": {"x": 1}, "seq": 1}
            {"id": 2, "address": {"city": "York"}, "tags": [], "scores": {}, "seq": 1}
            "#,
            r#"
            {"id": 1, "address": {"city": "Bath", "zip": 2}, "tags": ["c", null], "scores": {"x": 2, "y": 3}, "seq": 3}
            {"id": 1, "address": {"city": "late", "zip": 0}, "seq": 2}
            {"id": 2, "op": "D", "seq": 2}
            {"id": 3, "address": null, "tags": null, "scores": null, "seq": 1}
            "#,
        ],
        &[
            &[
                "1",
                "{city: Bath, zip: 2}",
                "[c, NULL]",
                "{x: 2, y: 3}",
                "3",
            ],
            &["3", "NULL", "NULL", "NULL", "1"],
        ],
    );
}

/// SCD Type 2 opens a version when a nested value changes (a struct field,
/// a list element, a map entry) and not when it is sent again unchanged
/// (the sequence left out of the tracked set).
#[test]
fn nested_changes_open_scd2_versions() {
    scenario(
        &nested_flow(2, "track_history_except_column_list = [\"seq\"]"),
        &[
            r#"
            {"id": 1, "address": {"city": "Leeds", "zip": 1}, "tags": ["a"], "scores": {"x": 1}, "seq": 1}
            {"id": 1, "address": {"city": "Leeds", "zip": 1}, "tags": ["a"], "scores": {"x": 1}, "seq": 2}
            "#,
            r#"
            {"id": 1, "address": {"city": "Leeds", "zip": 9}, "tags": ["a"], "scores": {"x": 1}, "seq": 3}
            {"id": 1, "address": {"city": "Leeds", "zip": 9}, "tags": ["a", "b"], "scores": {"x": 1}, "seq": 4}
            {"id": 1, "address": {"city": "Leeds", "zip": 9}, "tags": ["a", "b"], "scores": {"x": 5}, "seq": 5}
            "#,
        ],
        &[
            &["1", "{city: Leeds, zip: 1}", "[a]", "{x: 1}", "2", "1", "3"],
            &["1", "{city: Leeds, zip: 9}", "[a]", "{x: 1}", "3", "3", "4"],
            &[
                "1",
                "{city: Leeds, zip: 9}",
                "[a, b]",
                "{x: 1}",
                "4",
                "4",
                "5",
            ],
            &[
                "1",
                "{city: Leeds, zip: 9}",
                "[a, b]",
                "{x: 5}",
                "5",
                "5",
                "NULL",
            ],
        ],
    );
}

/// With ignore_null_updates a missing nested column keeps its value, and a
/// null field inside a struct keeps that field's value.
#[test]
fn a_null_nested_column_keeps_its_value_with_ignore_null_updates() {
    steps(
        &nested_flow(1, "ignore_null_updates = true"),
        &[
            (
                r#"{"id": 1, "address": {"city": "Leeds", "zip": 1}, "tags": ["a"], "scores": {"x": 1}, "seq": 1}"#,
                rows(&[&["1", "{city: Leeds, zip: 1}", "[a]", "{x: 1}", "1"]]),
            ),
            (
                r#"{"id": 1, "tags": ["b"], "seq": 2}"#,
                rows(&[&["1", "{city: Leeds, zip: 1}", "[b]", "{x: 1}", "2"]]),
            ),
            (
                r#"{"id": 1, "address": {"city": "York"}, "seq": 3}"#,
                rows(&[&["1", "{city: York, zip: 1}", "[b]", "{x: 1}", "3"]]),
            ),
        ],
    );
}

/// Spark: Scd1LeafLevelReconciliationSuite, "reconstructs nested structs
/// from selected leaves": with ignore_null_updates a null field inside a
/// struct keeps that field's previous value and the other fields take the
/// new ones, at any depth, in every order and batching.
#[test]
fn scd1_ignore_null_updates_reconstructs_nested_structs_from_selected_leaves() {
    scenario(
        &nested_flow(1, "ignore_null_updates = true"),
        &[
            r#"
            {"id": 1, "address": {"city": "San Francisco", "zip": 94107}, "seq": 1}
            {"id": 2, "address": {"city": "Leeds", "zip": 1}, "seq": 1}
            {"id": 3, "address": {"city": "Bath", "zip": 5}, "seq": 1}
            "#,
            r#"
            {"id": 1, "address": {"city": null, "zip": 10001}, "seq": 2}
            {"id": 2, "address": {"zip": 2}, "seq": 2}
            {"id": 2, "address": {"city": "York"}, "seq": 3}
            {"id": 3, "address": null, "seq": 2}
            {"id": 4, "address": {"city": null, "zip": 7}, "seq": 1}
            "#,
        ],
        &[
            &[
                "1",
                "{city: San Francisco, zip: 10001}",
                "NULL",
                "NULL",
                "2",
            ],
            &["2", "{city: York, zip: 2}", "NULL", "NULL", "3"],
            &["3", "{city: Bath, zip: 5}", "NULL", "NULL", "2"],
            &["4", "{city: NULL, zip: 7}", "NULL", "NULL", "1"],
        ],
    );
    // With ties refused, older values a later upsert overwrites are dropped
    // from the state: a struct with a null field must not count as one.
    scenario(
        &nested_flow(1, "ignore_null_updates = true\non_sequence_tie = \"error\""),
        &[
            r#"{"id": 1, "address": {"city": "San Francisco", "zip": 94107}, "seq": 1}"#,
            r#"{"id": 1, "address": {"city": null, "zip": 10001}, "seq": 2}"#,
            r#"{"id": 1, "address": {"city": null, "zip": 10002}, "seq": 3}"#,
        ],
        &[&[
            "1",
            "{city: San Francisco, zip: 10002}",
            "NULL",
            "NULL",
            "3",
        ]],
    );
    // The column-subset form: only `address` ignores nulls; `tags` takes them.
    scenario(
        &nested_flow(1, "ignore_null_updates_column_list = [\"address\"]"),
        &[r#"
            {"id": 1, "address": {"city": "San Francisco", "zip": 94107}, "tags": ["a"], "seq": 1}
            {"id": 1, "address": {"city": null, "zip": 10001}, "tags": null, "seq": 2}
            "#],
        &[&[
            "1",
            "{city: San Francisco, zip: 10001}",
            "NULL",
            "NULL",
            "2",
        ]],
    );
}

/// Deeper structs: a null leaf two levels down keeps its value; SCD Type 2
/// opens a version with the reconciled value.
#[test]
fn scd2_ignore_null_updates_reconciles_leaves_of_nested_structs() {
    scenario(
        r#"
keys = ["id"]
sequence_by = "seq"
stored_as_scd_type = 2
ignore_null_updates = true
track_history_except_column_list = ["seq"]
columns = [
  { name = "id", type = "int" },
  { name = "p", type = "struct<name: string, home: struct<city: string, zip: int>>" },
  { name = "seq", type = "long" },
]
"#,
        &[r#"
        {"id": 1, "p": {"name": "Al", "home": {"city": "Leeds", "zip": 1}}, "seq": 1}
        {"id": 1, "p": {"name": null, "home": {"city": null, "zip": 2}}, "seq": 2}
        "#],
        &[
            &[
                "1",
                "{name: Al, home: {city: Leeds, zip: 1}}",
                "1",
                "1",
                "2",
            ],
            &[
                "1",
                "{name: Al, home: {city: Leeds, zip: 2}}",
                "2",
                "2",
                "NULL",
            ],
        ],
    );
}

/// A struct of orderable fields is a sequence compared field by field, and
/// SCD Type 2's `__START_AT` / `__END_AT` are of its type.
#[test]
fn a_struct_column_sequences_changes() {
    let toml = r#"
keys = ["id"]
sequence_by = "at"
stored_as_scd_type = 2
columns = [
  { name = "id", type = "int" },
  { name = "v", type = "string" },
  { name = "at", type = "struct<ts: long, n: int>" },
]
"#;
    scenario(
        toml,
        &[
            r#"
            {"id": 1, "v": "a", "at": {"ts": 1, "n": 5}}
            {"id": 1, "v": "c", "at": {"ts": 2, "n": 0}}
            "#,
            r#"{"id": 1, "v": "b", "at": {"ts": 1, "n": 7}}"#,
        ],
        &[
            &["1", "a", "{ts: 1, n: 5}", "{ts: 1, n: 5}", "{ts: 1, n: 7}"],
            &["1", "b", "{ts: 1, n: 7}", "{ts: 1, n: 7}", "{ts: 2, n: 0}"],
            &["1", "c", "{ts: 2, n: 0}", "{ts: 2, n: 0}", "NULL"],
        ],
    );
    rejects(
        toml,
        &[],
        r#"{"id": 1, "v": "a", "at": null}"#,
        codes::NULL_SEQUENCE,
        &[],
    );
}

/// Nested values are read as strictly as flat ones: a value that does not
/// fit its leaf's type is refused with the row that holds it; a field the
/// struct lacks is refused. Keys must be primitive; a map's key too.
#[test]
fn nested_values_are_read_strictly() {
    let f = flow(&nested_flow(1, ""));
    for (body, row, why) in [
        (
            "{\"id\": 1, \"seq\": 1, \"tags\": [\"a\"]}\n{\"id\": 2, \"seq\": 1, \"address\": {\"zip\": 1.5}}",
            1,
            "zip",
        ),
        (
            "{\"id\": 1, \"seq\": 1}\n{\"id\": 2, \"seq\": 1}\n{\"id\": 3, \"seq\": 1, \"scores\": {\"x\": 1, \"y\": 2.5}}",
            2,
            "2.5",
        ),
        (
            "{\"id\": 1, \"seq\": 1, \"address\": {\"town\": \"x\"}}",
            0,
            "town",
        ),
    ] {
        let e = decode_ndjson(&f, body.as_bytes(), Limits::NONE).unwrap_err();
        match &e {
            autocdc::error::Error::Batch { row: r, .. } => assert_eq!(*r, row, "{e}"),
            other => panic!("{other}"),
        }
        assert!(e.to_string().contains(why), "{e}");
    }
    for (columns, code) in [
        (
            r#"{ name = "id", type = "struct<a: int>" }, { name = "seq", type = "long" }"#,
            codes::INVALID_DEFINITION,
        ),
        (
            r#"{ name = "id", type = "int" }, { name = "m", type = "map<list<int>, int>" }, { name = "seq", type = "long" }"#,
            codes::INVALID_DEFINITION,
        ),
        (
            r#"{ name = "id", type = "int" }, { name = "seq", type = "list<long>" }"#,
            codes::NON_ORDERABLE_SEQUENCE,
        ),
    ] {
        let toml = format!("keys = [\"id\"]\nsequence_by = \"seq\"\ncolumns = [{columns}]");
        match Flow::new(config("spark_parity", "spark.target", &toml)) {
            Ok(_) => panic!("accepted: {columns}"),
            Err(e) => assert_eq!(e.code(), code, "{columns}: {e}"),
        }
    }
}

/// Nested columns evolve between runs (Spark's schema-evolution suites
/// with nested structs): a struct gains a field (null in rows written
/// before) and loses one, a nested column is added (null in older rows) or
/// dropped, for SCD Type 1 and for SCD Type 2, whose state keeps the nested
/// values (read back after the change). A map's key type cannot change.
#[test]
fn nested_columns_evolve_between_runs() {
    for scd in [1u8, 2] {
        let v1 = nested_flow(scd, "");
        let v2 = v1
            .replace(
                "struct<city: string, zip: int>",
                "struct<city: string, country: string, zip: long>",
            )
            .replace(
                r#"{ name = "tags", type = "list<string>" },"#,
                r#"{ name = "tags", type = "list<string>" },
  { name = "notes", type = "list<struct<at: date, text: string>>" },"#,
            );
        // SCD Type 2: every row is a current version, [1, NULL).
        let tail: &[&str] = if scd == 1 { &[] } else { &["1", "NULL"] };
        let with_tail =
            |cells: &[&'static str]| -> Vec<&str> { cells.iter().chain(tail).copied().collect() };
        let w1 = [with_tail(&[
            "1",
            "{city: Leeds, zip: 1}",
            "NULL",
            "NULL",
            "1",
        ])];
        let w2 = [
            with_tail(&[
                "1",
                "{city: Leeds, country: NULL, zip: 1}",
                "NULL",
                "NULL",
                "NULL",
                "1",
            ]),
            with_tail(&[
                "2",
                "{city: Lyon, country: FR, zip: 69}",
                "NULL",
                "[{at: 2026-12-01, text: hi}]",
                "NULL",
                "1",
            ]),
        ];
        let w1: Vec<&[&str]> = w1.iter().map(Vec::as_slice).collect();
        let w2: Vec<&[&str]> = w2.iter().map(Vec::as_slice).collect();
        reconfigured(
            &v1,
            &[r#"{"id": 1, "address": {"city": "Leeds", "zip": 1}, "seq": 1}"#],
            &w1,
            &v2,
            &[
                r#"{"id": 2, "address": {"city": "Lyon", "country": "FR", "zip": 69}, "notes": [{"at": "2026-12-01", "text": "hi"}], "seq": 1}"#,
            ],
            &w2,
        );
    }
    let v1 = nested_flow(1, "");
    refused_on_change(
        &v1,
        &[r#"{"id": 1, "scores": {"x": 1}, "seq": 1}"#],
        &v1.replace("map<string, long>", "map<int, long>"),
        r#"{"id": 2, "seq": 1}"#,
        codes::SCHEMA_DRIFT,
    );
}

// Spark's nested schema-evolution scenarios (AutoCdcScd1SchemaEvolutionSuite,
// AutoCdcScd2SchemaEvolutionSuite, AutoCdcScd2ColumnEvolutionSuite). A
// field added to a struct is a definition change, as for a top-level
// column. A field the source stops sending stays declared and is null in
// new rows: Spark does that for SCD Type 2 and fails SCD Type 1 with
// INCOMPATIBLE_DATA_FOR_TABLE.CANNOT_FIND_DATA; autocdc does it for both.

/// `(key_col, version, column of type ty)` sequenced by `version`.
fn nested_evolution_flow(key: &str, scd: u8, column: &str, ty: &str) -> String {
    format!(
        "keys = [\"{key}\"]\nsequence_by = \"version\"\nstored_as_scd_type = {scd}\ncolumns = [\n  {{ name = \"{key}\", type = \"int\" }},\n  {{ name = \"version\", type = \"long\" }},\n  {{ name = \"{column}\", type = \"{ty}\" }},\n]"
    )
}

/// Spark: AutoCdcScd1SchemaEvolutionSuite, "a new field added inside an array<struct> element
/// between runs is added to the target".
#[test]
fn scd1_a_field_added_inside_an_array_of_structs_between_runs() {
    reconfigured(
        &nested_evolution_flow("key", 1, "vals", "array<struct<a: int, b: struct<c: int>>>"),
        &[r#"{"key": 1, "version": 1, "vals": [{"a": 1, "b": {"c": 1}}]}"#],
        &[&["1", "1", "[{a: 1, b: {c: 1}}]"]],
        &nested_evolution_flow(
            "key",
            1,
            "vals",
            "array<struct<a: int, b: struct<c: int, d: int>>>",
        ),
        &[r#"
        {"key": 1, "version": 2, "vals": [{"a": 1, "b": {"c": 1, "d": 2}}]}
        {"key": 3, "version": 1, "vals": [{"a": 3, "b": {"c": 3, "d": 3}}]}
        "#],
        &[
            &["1", "2", "[{a: 1, b: {c: 1, d: 2}}]"],
            &["3", "1", "[{a: 3, b: {c: 3, d: 3}}]"],
        ],
    );
}

/// Spark: AutoCdcScd2SchemaEvolutionSuite, "a new field added inside an array<struct> element
/// between runs is added to the target": the closed version-1 record reads null for `d`.
#[test]
fn scd2_a_field_added_inside_an_array_of_structs_between_runs() {
    reconfigured(
        &nested_evolution_flow("key", 2, "vals", "array<struct<a: int, b: struct<c: int>>>"),
        &[r#"{"key": 1, "version": 1, "vals": [{"a": 1, "b": {"c": 1}}]}"#],
        &[&["1", "1", "[{a: 1, b: {c: 1}}]", "1", "NULL"]],
        &nested_evolution_flow(
            "key",
            2,
            "vals",
            "array<struct<a: int, b: struct<c: int, d: int>>>",
        ),
        &[r#"
        {"key": 1, "version": 2, "vals": [{"a": 1, "b": {"c": 1, "d": 2}}]}
        {"key": 3, "version": 1, "vals": [{"a": 3, "b": {"c": 3, "d": 3}}]}
        "#],
        &[
            &["1", "1", "[{a: 1, b: {c: 1, d: NULL}}]", "1", "2"],
            &["1", "2", "[{a: 1, b: {c: 1, d: 2}}]", "2", "NULL"],
            &["3", "1", "[{a: 3, b: {c: 3, d: 3}}]", "1", "NULL"],
        ],
    );
}

/// Spark: AutoCdcScd2ColumnEvolutionSuite, "a nested struct field dropped between runs is
/// preserved on existing records and null on new ones" and "a field dropped inside an
/// array<struct> element between runs is preserved on existing records and null on new ones".
#[test]
fn scd2_a_nested_field_the_source_stops_sending_is_kept_on_old_records() {
    let ty = "struct<a: int, b: struct<c: int, d: int>>";
    scenario(
        &nested_evolution_flow("id", 2, "value", ty),
        &[
            r#"{"id": 1, "version": 1, "value": {"a": 1, "b": {"c": 10, "d": 100}}}"#,
            r#"{"id": 1, "version": 2, "value": {"a": 2, "b": {"d": 200}}}"#,
        ],
        &[
            &["1", "1", "{a: 1, b: {c: 10, d: 100}}", "1", "2"],
            &["1", "2", "{a: 2, b: {c: NULL, d: 200}}", "2", "NULL"],
        ],
    );
    scenario(
        &nested_evolution_flow("id", 2, "vals", &format!("array<{ty}>")),
        &[
            r#"{"id": 1, "version": 1, "vals": [{"a": 1, "b": {"c": 10, "d": 100}}]}"#,
            r#"{"id": 1, "version": 2, "vals": [{"a": 2, "b": {"c": 200}}]}"#,
        ],
        &[
            &["1", "1", "[{a: 1, b: {c: 10, d: 100}}]", "1", "2"],
            &["1", "2", "[{a: 2, b: {c: 200, d: NULL}}]", "2", "NULL"],
        ],
    );
}

/// Spark: AutoCdcScd1SchemaEvolutionSuite, "dropping a nested struct field between runs fails
/// with INCOMPATIBLE_DATA_FOR_TABLE" and "dropping a field inside an array<struct> element
/// between runs fails with INCOMPATIBLE_DATA_FOR_TABLE". autocdc keeps the declared field,
/// null in the rows that lack it, as Spark's SCD Type 2 does.
#[test]
fn scd1_a_nested_field_the_source_stops_sending_is_null_in_new_rows() {
    let ty = "struct<a: int, b: struct<c: int, d: int>>";
    scenario(
        &nested_evolution_flow("key", 1, "value", ty),
        &[
            r#"
            {"key": 1, "version": 1, "value": {"a": 1, "b": {"c": 1, "d": 1}}}
            {"key": 2, "version": 1, "value": {"a": 2, "b": {"c": 2, "d": 2}}}
            "#,
            r#"
            {"key": 1, "version": 2, "value": {"a": 10, "b": {"d": 10}}}
            {"key": 3, "version": 1, "value": {"a": 3, "b": {"d": 3}}}
            "#,
        ],
        &[
            &["1", "2", "{a: 10, b: {c: NULL, d: 10}}"],
            &["2", "1", "{a: 2, b: {c: 2, d: 2}}"],
            &["3", "1", "{a: 3, b: {c: NULL, d: 3}}"],
        ],
    );
    scenario(
        &nested_evolution_flow("key", 1, "vals", &format!("array<{ty}>")),
        &[
            r#"
            {"key": 1, "version": 1, "vals": [{"a": 1, "b": {"c": 1, "d": 1}}]}
            {"key": 2, "version": 1, "vals": [{"a": 2, "b": {"c": 2, "d": 2}}]}
            "#,
            r#"
            {"key": 1, "version": 2, "vals": [{"a": 10, "b": {"c": 10}}]}
            {"key": 3, "version": 1, "vals": [{"a": 3, "b": {"c": 3}}]}
            "#,
        ],
        &[
            &["1", "2", "[{a: 10, b: {c: 10, d: NULL}}]"],
            &["2", "1", "[{a: 2, b: {c: 2, d: 2}}]"],
            &["3", "1", "[{a: 3, b: {c: 3, d: NULL}}]"],
        ],
    );
}

/// Spark: Scd1RowLevelReconciliationSuite, "deduplicateMicrobatch supports an arbitrary sequencing
/// expression": `greatest(seq, alt_seq)` orders changes, a null argument skipped (Spark's rule),
/// in every order and batching.
#[test]
fn scd1_a_greatest_sequence_expression_orders_changes() {
    scenario(
        r#"
keys = ["id"]
sequence_by = "greatest(seq, alt_seq)"
columns = [
  { name = "id", type = "int" },
  { name = "seq", type = "long" },
  { name = "alt_seq", type = "long" },
  { name = "value", type = "string" },
]
"#,
        &[
            r#"{"id": 1, "seq": 1, "alt_seq": 5, "value": "five"}"#,
            r#"{"id": 1, "seq": 4, "alt_seq": 2, "value": "four"}"#,
            r#"{"id": 2, "seq": 3, "alt_seq": null, "value": "three"}"#,
            r#"{"id": 2, "seq": null, "alt_seq": 2, "value": "two"}"#,
        ],
        &[&["1", "1", "5", "five"], &["2", "3", "NULL", "three"]],
    );
    // least(...) too: the earlier of the two orders.
    scenario(
        r#"
keys = ["id"]
sequence_by = "least(seq, alt_seq)"
columns = [
  { name = "id", type = "int" },
  { name = "seq", type = "long" },
  { name = "alt_seq", type = "long" },
  { name = "value", type = "string" },
]
"#,
        &[
            r#"{"id": 1, "seq": 1, "alt_seq": 5, "value": "one"}"#,
            r#"{"id": 1, "seq": 4, "alt_seq": 2, "value": "two"}"#,
        ],
        &[&["1", "4", "2", "two"]],
    );
}
