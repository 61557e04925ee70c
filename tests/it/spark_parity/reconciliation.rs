//! Spark's reconciliation suites: row level, leaf level (`ignore_null_updates`), and SCD Type 2 with ignored nulls.

use super::*;

// ---------------------------------------------------------------------------
// Scd1RowLevelReconciliationSuite
// ---------------------------------------------------------------------------

/// Spark: Scd1RowLevelReconciliationSuite, "deduplicateMicrobatch keeps only the row with the
/// largest sequence value per key" (key 1), "deduplicateMicrobatch processes multiple keys
/// independently" (keys 2, 3), "deduplicateMicrobatch is no-op if there's a single event for a
/// key" (key 3) and "deduplicateMicrobatch carries non-key, non-sequence columns from the winning
/// row" (key 4).
#[test]
fn scd1_the_largest_sequence_per_key_wins_whole() {
    let body = r#"
keys = ["id"]
sequence_by = "seq"
columns = [
  { name = "id", type = "int" },
  { name = "seq", type = "long" },
  { name = "value", type = "string" },
  { name = "amount", type = "int" },
]
"#;
    scenario(
        body,
        &[r#"
        {"id": 1, "seq": 10, "value": "first"}
        {"id": 1, "seq": 30, "value": "winner"}
        {"id": 1, "seq": 20, "value": "middle"}
        {"id": 2, "seq": 50, "value": "b1-winner"}
        {"id": 3, "seq": 1, "value": "c1-only"}
        {"id": 2, "seq": 40, "value": "b2-loser"}
        {"id": 4, "seq": 10, "value": "old-name", "amount": 100}
        {"id": 4, "seq": 20, "value": "winning-name", "amount": 200}
        "#],
        &[
            &["1", "30", "winner", "NULL"],
            &["2", "50", "b1-winner", "NULL"],
            &["3", "1", "c1-only", "NULL"],
            &["4", "20", "winning-name", "200"],
        ],
    );
}

/// Spark: Scd1RowLevelReconciliationSuite, "deduplicateMicrobatch supports composite
/// (multi-column) keys" and "deduplicateMicrobatch preserves the input column names, types, and
/// ordering".
#[test]
fn scd1_composite_keys_and_column_order() {
    let composite = r#"
keys = ["region", "customer_id"]
sequence_by = "seq"
columns = [
  { name = "region", type = "string" },
  { name = "customer_id", type = "int" },
  { name = "seq", type = "long" },
  { name = "value", type = "string" },
]
"#;
    scenario(
        composite,
        &[r#"
        {"region": "US", "customer_id": 1, "seq": 10, "value": "us1-old"}
        {"region": "US", "customer_id": 1, "seq": 20, "value": "us1-new"}
        {"region": "EU", "customer_id": 1, "seq": 5, "value": "eu1-only"}
        {"region": "US", "customer_id": 2, "seq": 99, "value": "us2-only"}
        "#],
        &[
            &["US", "1", "20", "us1-new"],
            &["EU", "1", "5", "eu1-only"],
            &["US", "2", "99", "us2-only"],
        ],
    );
    let mixed = r#"
keys = ["id"]
sequence_by = "seq"
columns = [
  { name = "a", type = "string" },
  { name = "id", type = "int" },
  { name = "z", type = "double" },
  { name = "seq", type = "long" },
  { name = "flag", type = "boolean" },
]
"#;
    scenario(
        mixed,
        &[r#"
        {"a": "a1", "id": 1, "z": 1.5, "seq": 10, "flag": true}
        {"a": "a2", "id": 1, "z": 2.5, "seq": 20, "flag": false}
        "#],
        &[&["a2", "1", "2.5", "20", "false"]],
    );
}

/// Spark: Scd1RowLevelReconciliationSuite, "deduplicateMicrobatch handles equal sequencing values
/// for the same key": Spark guarantees only that one of the tied rows survives; autocdc's
/// documented rule (docs/flows.md, Semantics) adds that it is the same one in every order and
/// batching.
#[test]
fn scd1_tied_changes_resolve_the_same_way_in_every_order() {
    one_of(
        r#"
keys = ["id"]
sequence_by = "seq"
columns = [
  { name = "id", type = "int" },
  { name = "seq", type = "long" },
  { name = "value", type = "string" },
]
"#,
        &[
            r#"{"id": 1, "seq": 10, "value": "first-tied-row"}"#,
            r#"{"id": 1, "seq": 10, "value": "second-tied-row"}"#,
        ],
        &[
            rows(&[&["1", "10", "first-tied-row"]]),
            rows(&[&["1", "10", "second-tied-row"]]),
        ],
    );
}

/// Spark: Scd1RowLevelReconciliationSuite, "extendMicrobatchRowsWithCdcMetadata treats null
/// deleteCondition results as upserts" and "extendMicrobatchRowsWithCdcMetadata treats every row
/// as an upsert when deleteCondition is None".
#[test]
fn scd1_a_null_delete_condition_or_none_at_all_means_upsert() {
    scenario(
        r#"
keys = ["id"]
sequence_by = "seq"
apply_as_deletes = "is_delete"
columns = [
  { name = "id", type = "int" },
  { name = "seq", type = "long" },
  { name = "is_delete", type = "boolean" },
]
"#,
        &[r#"{"id": 1, "seq": 10, "is_delete": null}"#],
        &[&["1", "10", "NULL"]],
    );
    scenario(
        r#"
keys = ["id"]
sequence_by = "seq"
columns = [
  { name = "id", type = "int" },
  { name = "seq", type = "long" },
  { name = "value", type = "string" },
]
"#,
        &[r#"
        {"id": 1, "seq": 10, "value": "a"}
        {"id": 2, "seq": 20, "value": "b"}
        "#],
        &[&["1", "10", "a"], &["2", "20", "b"]],
    );
}

/// Spark: Scd1RowLevelReconciliationSuite, "projectTargetColumnsOntoMicrobatch retains the CDC
/// metadata column even when IncludeColumns does not contain it", "... respects exclude column"
/// and "... preserves the microbatch schema order" (the target follows the declared column
/// order, not the order of `column_list`).
#[test]
fn scd1_column_selection() {
    let def = |selection: &str| {
        format!(
            "keys = [\"id\"]\nsequence_by = \"seq\"\n{}\n{}",
            selection,
            r#"columns = [
  { name = "id", type = "int" },
  { name = "name", type = "string" },
  { name = "age", type = "int" },
  { name = "seq", type = "long" },
]"#
        )
    };
    let change = r#"{"id": 1, "name": "alice", "age": 30, "seq": 10}"#;
    scenario(
        &def(r#"column_list = ["id", "age"]"#),
        &[change],
        &[&["1", "30"]],
    );
    scenario(
        &def(r#"except_column_list = ["age", "seq"]"#),
        &[change],
        &[&["1", "alice"]],
    );
    scenario(
        &def(r#"column_list = ["age", "id"]"#),
        &[change],
        &[&["1", "30"]],
    );
}

/// Spark: Scd1RowLevelReconciliationSuite, "applyTombstonesToMicrobatch drops late-arriving deletes
/// and upserts when a matching tombstone exists for the same key" (key 1), "... keeps microbatch
/// rows whose effective sequence exceeds the tombstone's delete sequence" (key 2), "... leaves
/// microbatch rows untouched when the tombstone targets a different key" (key 3, tombstone on 30),
/// "... is unaffected by stale tombstones in auxiliary table" (key 5), "... is a no-op when the
/// auxiliary table is empty" (key 6) and "... with composite keys requires every key column to
/// match". Spark's auxiliary tombstones are the first batch's deletes.
#[test]
fn scd1_tombstones_keep_only_older_changes_of_their_own_key_out() {
    scenario(
        SCD1_EXCLUDE,
        &[
            r#"
            {"id": 1, "seq": 10, "is_delete": true}
            {"id": 2, "seq": 10, "is_delete": true}
            {"id": 30, "seq": 1000, "is_delete": true}
            {"id": 5, "seq": 5, "is_delete": true}
            {"id": 5, "seq": 10, "is_delete": true}
            "#,
            r#"
            {"id": 1, "value": "stale-upsert", "seq": 5, "is_delete": false}
            {"id": 1, "value": "stale-delete", "seq": 7, "is_delete": true}
            {"id": 2, "value": "fresher-upsert", "seq": 15, "is_delete": false}
            {"id": 3, "value": "stays", "seq": 5, "is_delete": false}
            {"id": 5, "value": "stale-upsert", "seq": 8, "is_delete": false}
            {"id": 6, "value": "kept-upsert", "seq": 5, "is_delete": false}
            {"id": 7, "value": "kept-delete", "seq": 7, "is_delete": true}
            "#,
        ],
        &[
            &["2", "fresher-upsert"],
            &["3", "stays"],
            &["6", "kept-upsert"],
        ],
    );
    let composite = r#"
keys = ["region", "customer_id"]
sequence_by = "seq"
apply_as_deletes = "is_delete"
except_column_list = ["seq", "is_delete"]
columns = [
  { name = "region", type = "string" },
  { name = "customer_id", type = "int" },
  { name = "seq", type = "long" },
  { name = "is_delete", type = "boolean" },
]
"#;
    scenario(
        composite,
        &[
            r#"{"region": "US", "customer_id": 99, "seq": 1000, "is_delete": true}"#,
            r#"
            {"region": "US", "customer_id": 1, "seq": 5, "is_delete": false}
            {"region": "US", "customer_id": 2, "seq": 5, "is_delete": false}
            "#,
        ],
        &[&["US", "1"], &["US", "2"]],
    );
}

// ---------------------------------------------------------------------------
// Scd1LeafLevelReconciliationSuite (ignore_null_updates on every column)
// ---------------------------------------------------------------------------

/// Spark: Scd1LeafLevelReconciliationSuite, "collapseMicrobatchRowsPerKey selects each leaf's latest
/// authoring event" (ignore-null on every column: a null leaves the column as it was).
#[test]
fn scd1_partial_updates_take_each_columns_latest_value() {
    scenario(
        r#"
keys = ["id"]
sequence_by = "seq"
ignore_null_updates = true
columns = [
  { name = "id", type = "int" },
  { name = "left", type = "string" },
  { name = "right", type = "string" },
  { name = "seq", type = "long" },
]
"#,
        &[r#"
        {"id": 1, "left": null, "right": "right-3", "seq": 3}
        {"id": 1, "left": "left-1", "right": "right-1", "seq": 1}
        {"id": 1, "left": "left-2", "right": null, "seq": 2}
        "#],
        &[&["1", "left-2", "right-3", "3"]],
    );
}

/// Spark: Scd1LeafLevelReconciliationSuite, "collapseMicrobatchRowsPerKey isolates keys and treats
/// deletes as null-valued events" (keys 1-3) and "collapseMicrobatchRowsPerKey collapses keys whose
/// latest event is a delete into row-wide deletes" (keys 4, 5).
#[test]
fn scd1_partial_updates_after_deletes() {
    scenario(
        r#"
keys = ["id"]
sequence_by = "seq"
apply_as_deletes = "is_delete"
except_column_list = ["is_delete"]
ignore_null_updates = true
columns = [
  { name = "id", type = "int" },
  { name = "value", type = "string" },
  { name = "seq", type = "long" },
  { name = "is_delete", type = "boolean" },
]
"#,
        &[r#"
        {"id": 1, "value": "before", "seq": 1, "is_delete": false}
        {"id": 2, "value": "other", "seq": 1, "is_delete": false}
        {"id": 1, "value": null, "seq": 2, "is_delete": true}
        {"id": 2, "value": null, "seq": 2, "is_delete": false}
        {"id": 1, "value": null, "seq": 3, "is_delete": false}
        {"id": 1, "value": "after", "seq": 4, "is_delete": false}
        {"id": 1, "value": null, "seq": 5, "is_delete": false}
        {"id": 3, "value": "before", "seq": 1, "is_delete": false}
        {"id": 3, "value": null, "seq": 2, "is_delete": true}
        {"id": 3, "value": null, "seq": 3, "is_delete": false}
        {"id": 4, "value": "first", "seq": 1, "is_delete": false}
        {"id": 4, "value": null, "seq": 3, "is_delete": true}
        {"id": 4, "value": "second", "seq": 2, "is_delete": false}
        {"id": 5, "value": null, "seq": 2, "is_delete": true}
        "#],
        &[
            &["1", "after", "5"],
            &["2", "other", "2"],
            &["3", "NULL", "3"],
        ],
    );
}

/// Spark: Scd1LeafLevelReconciliationSuite, "collapseMicrobatchRowsPerKey reconciles every column
/// whole when ignore-null is disabled" (flat columns in place of Spark's struct).
#[test]
fn scd1_without_ignore_null_updates_nulls_overwrite() {
    scenario(
        r#"
keys = ["id"]
sequence_by = "seq"
columns = [
  { name = "id", type = "int" },
  { name = "city", type = "string" },
  { name = "nickname", type = "string" },
  { name = "seq", type = "long" },
]
"#,
        &[r#"
        {"id": 1, "city": "SF", "nickname": "Al", "seq": 1}
        {"id": 1, "city": null, "nickname": null, "seq": 2}
        "#],
        &[&["1", "NULL", "NULL", "2"]],
    );
}

/// Spark: Scd1LeafLevelReconciliationSuite, "collapseMicrobatchRowsPerKey orders composite
/// sequencing values" (`sequence_by` a list, compared like `STRUCT(timestamp, tieBreaker)`).
#[test]
fn scd1_a_composite_sequence_orders_by_its_columns_in_turn() {
    scenario(
        r#"
keys = ["id"]
sequence_by = ["ts", "tie_breaker"]
ignore_null_updates = true
columns = [
  { name = "id", type = "int" },
  { name = "value", type = "string" },
  { name = "ts", type = "long" },
  { name = "tie_breaker", type = "int" },
]
"#,
        &[
            r#"{"id": 1, "value": "first", "ts": 10, "tie_breaker": 1}"#,
            r#"{"id": 1, "value": "second", "ts": 10, "tie_breaker": 2}"#,
        ],
        &[&["1", "second", "10", "2"]],
    );
}

// ---------------------------------------------------------------------------
// Scd2CoalesceIgnoredNullsSuite (SCD Type 2 with ignore_null_updates)
// ---------------------------------------------------------------------------

const SCD2_IGNORE_NULLS: &str = r#"
keys = ["id"]
sequence_by = "seq"
apply_as_deletes = "is_delete"
except_column_list = ["seq", "is_delete"]
stored_as_scd_type = 2
ignore_null_updates = true
columns = [
  { name = "id", type = "int" },
  { name = "value", type = "string" },
  { name = "seq", type = "long" },
  { name = "is_delete", type = "boolean" },
]
"#;

/// Spark: Scd2CoalesceIgnoredNullsSuite, "rows without version maps establish authorship using the
/// current selection" and "coalescing is idempotent and a previously coalesced first row supplies
/// carry-in" (key 1), "an authored value restarts inheritance after a reset" (key 2), "each
/// post-decomposition boundary resets inheritance" (key 3: a delete, then a partial update),
/// "incoming authored values replace carry-in without unauthored rows interrupting it" (key 4) and
/// "inheritance follows chronological order independently for each key" (keys 5, 6, interleaved
/// out of order). A null fills from the change before; filled values that leave the tracked
/// column unchanged extend the current version.
#[test]
fn scd2_partial_updates_fill_from_the_change_before() {
    scenario(
        SCD2_IGNORE_NULLS,
        &[
            r#"
            {"id": 1, "value": "source", "seq": 10, "is_delete": false}
            {"id": 2, "value": "old", "seq": 10, "is_delete": false}
            {"id": 2, "value": null, "seq": 20, "is_delete": true}
            {"id": 3, "value": "before-gap", "seq": 10, "is_delete": false}
            {"id": 3, "value": null, "seq": 20, "is_delete": true}
            {"id": 4, "value": "old", "seq": 10, "is_delete": false}
            {"id": 4, "value": "new", "seq": 20, "is_delete": false}
            {"id": 5, "value": null, "seq": 20, "is_delete": false}
            {"id": 6, "value": "key-2", "seq": 5, "is_delete": false}
            "#,
            r#"
            {"id": 1, "value": null, "seq": 20, "is_delete": false}
            {"id": 1, "value": null, "seq": 30, "is_delete": false}
            {"id": 2, "value": "new", "seq": 30, "is_delete": false}
            {"id": 2, "value": null, "seq": 40, "is_delete": false}
            {"id": 3, "value": null, "seq": 30, "is_delete": false}
            {"id": 4, "value": null, "seq": 30, "is_delete": false}
            {"id": 4, "value": null, "seq": 40, "is_delete": false}
            {"id": 5, "value": "key-1", "seq": 10, "is_delete": false}
            {"id": 6, "value": null, "seq": 15, "is_delete": false}
            "#,
        ],
        &[
            &["1", "source", "10", "NULL"],
            &["2", "old", "10", "20"],
            &["2", "new", "30", "NULL"],
            &["3", "before-gap", "10", "20"],
            &["3", "NULL", "30", "NULL"],
            &["4", "old", "10", "20"],
            &["4", "new", "20", "NULL"],
            &["5", "key-1", "10", "NULL"],
            &["6", "key-2", "5", "NULL"],
        ],
    );
}

/// Spark: Scd2CoalesceIgnoredNullsSuite, "each selected leaf maintains an independent inheritance
/// chain".
#[test]
fn scd2_partial_updates_fill_each_column_on_its_own() {
    scenario(
        r#"
keys = ["id"]
sequence_by = "seq"
except_column_list = ["seq"]
stored_as_scd_type = 2
ignore_null_updates = true
columns = [
  { name = "id", type = "int" },
  { name = "left", type = "string" },
  { name = "right", type = "string" },
  { name = "seq", type = "long" },
]
"#,
        &[r#"
        {"id": 1, "left": "left-1", "right": "right-1", "seq": 10}
        {"id": 1, "left": null, "right": "right-2", "seq": 20}
        {"id": 1, "left": "left-3", "right": null, "seq": 30}
        "#],
        &[
            &["1", "left-1", "right-1", "10", "20"],
            &["1", "left-1", "right-2", "20", "30"],
            &["1", "left-3", "right-2", "30", "NULL"],
        ],
    );
}

/// Spark: Scd2CoalesceIgnoredNullsSuite, "schema-evolved leaves gain entries only when they inherit
/// non-null values", its second pass: a late change arriving before a partial update that had
/// inherited a value replaces what it inherits.
#[test]
fn scd2_a_late_change_refills_the_partial_updates_after_it() {
    steps(
        SCD2_IGNORE_NULLS,
        &[
            (
                r#"
                {"id": 1, "value": "source", "seq": 10, "is_delete": false}
                {"id": 1, "value": null, "seq": 20, "is_delete": false}
                "#,
                rows(&[&["1", "source", "10", "NULL"]]),
            ),
            (
                r#"{"id": 1, "value": "new-source", "seq": 15, "is_delete": false}"#,
                rows(&[
                    &["1", "source", "10", "15"],
                    &["1", "new-source", "15", "NULL"],
                ]),
            ),
        ],
    );
}
