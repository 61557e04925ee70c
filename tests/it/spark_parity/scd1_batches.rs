//! Spark's `Scd1ForeachBatchHandlerSuite`: SCD Type 1 micro-batches.

use super::*;

// ---------------------------------------------------------------------------
// Scd1ForeachBatchHandlerSuite
// ---------------------------------------------------------------------------

/// Spark: Scd1ForeachBatchHandlerSuite, "Scd1ForeachBatchHandler invalidates rows with null
/// sequencing before merging to aux/target tables." and "Scd1ForeachBatchHandler surfaces the
/// null-sequence error before the null-key error" (a row null in both is NULL_SEQUENCE).
#[test]
fn scd1_a_null_sequence_refuses_the_batch_before_a_null_key() {
    rejects(
        SCD1_HANDLER,
        &[r#"{"id": 1, "value": "old", "seq": 10, "is_delete": false}"#],
        r#"{"id": 1, "value": "invalid", "seq": null, "is_delete": false}"#,
        codes::NULL_SEQUENCE,
        &[&["1", "old"]],
    );
    rejects(
        SCD1_HANDLER,
        &[],
        r#"{"id": null, "value": "bad", "seq": null, "is_delete": false}"#,
        codes::NULL_SEQUENCE,
        &[],
    );
}

/// Spark: Scd1ForeachBatchHandlerSuite, "Scd1ForeachBatchHandler invalidates rows with a null key
/// column before merging to aux/target" and "Scd1ForeachBatchHandler invalidates rows when any
/// column of a composite key is null".
#[test]
fn scd1_a_null_key_refuses_the_whole_batch() {
    rejects(
        SCD1_HANDLER,
        &[r#"{"id": 1, "value": "old", "seq": 10, "is_delete": false}"#],
        r#"
        {"id": null, "value": "no-id-1", "seq": 5, "is_delete": false}
        {"id": 2, "value": "ok", "seq": 6, "is_delete": false}
        {"id": null, "value": "no-id-2", "seq": 7, "is_delete": true}
        "#,
        codes::NULL_KEY,
        &[&["1", "old"]],
    );
    let composite = r#"
keys = ["country", "city"]
sequence_by = "seq"
apply_as_deletes = "is_delete"
columns = [
  { name = "country", type = "string" },
  { name = "city", type = "string" },
  { name = "seq", type = "long" },
  { name = "is_delete", type = "boolean" },
]
"#;
    rejects(
        composite,
        &[],
        r#"
        {"country": null, "city": "Boston", "seq": 1, "is_delete": false}
        {"country": "US", "city": null, "seq": 2, "is_delete": false}
        {"country": null, "city": null, "seq": 3, "is_delete": false}
        "#,
        codes::NULL_KEY,
        &[],
    );
}

/// Spark: Scd1ForeachBatchHandlerSuite, "Scd1ForeachBatchHandler validates that the microbatch's
/// sequencing column is orderable". Spark checks a map-typed sequence per micro-batch; autocdc's
/// column types are declared, so the unorderable primitive (boolean) is refused when the flow is
/// defined, with AUTOCDC_NON_ORDERABLE_SEQUENCE.
#[test]
fn scd1_an_unorderable_sequence_is_refused() {
    let body = r#"
keys = ["id"]
sequence_by = "seq"
columns = [
  { name = "id", type = "int" },
  { name = "value", type = "string" },
  { name = "seq", type = "boolean" },
]
"#;
    match Flow::new(config("spark_parity", "spark.target", body)) {
        Ok(_) => panic!("a boolean sequence was accepted"),
        Err(e) => assert_eq!(e.code(), codes::NON_ORDERABLE_SEQUENCE, "{e}"),
    }
}

/// Spark: Scd1ForeachBatchHandlerSuite, "Scd1ForeachBatchHandler drops stale microbatch rows using
/// auxiliary tombstones and writes fresh upserts" (keys 1, 2), "... persists a newer delete as a
/// tombstone and removes the target row" (key 3), "... deduplicates the raw microbatch before
/// merging into the target" (key 4) and "... resolves a within-batch delete and higher-sequenced
/// upsert as an upsert insert" (key 5). Spark's seeded tables are the first batch.
#[test]
fn scd1_tombstones_and_in_batch_deduplication() {
    scenario(
        SCD1_HANDLER,
        &[
            r#"
            {"id": 1, "seq": 10, "is_delete": true}
            {"id": 3, "value": "old", "seq": 10, "is_delete": false}
            {"id": 4, "value": "old", "seq": 10, "is_delete": false}
            "#,
            r#"
            {"id": 1, "value": "stale", "seq": 5, "is_delete": false}
            {"id": 2, "value": "fresh", "seq": 20, "is_delete": false}
            {"id": 3, "value": "unused", "seq": 20, "is_delete": true}
            {"id": 4, "value": "ignored-older", "seq": 15, "is_delete": false}
            {"id": 4, "value": "newer", "seq": 20, "is_delete": false}
            {"id": 5, "value": "alice", "seq": 2, "is_delete": true}
            {"id": 5, "value": "bob", "seq": 3, "is_delete": false}
            "#,
        ],
        &[&["2", "fresh"], &["4", "newer"], &["5", "bob"]],
    );
}

/// Spark: Scd1ForeachBatchHandlerSuite, "Scd1ForeachBatchHandler upserts an existing target row
/// when a higher-sequenced event arrives" (key 1), "... leaves unrelated target rows untouched when
/// only one key is updated" (key 2), "... ignores a late-arriving upsert with a sequence below the
/// target's last upsert" (key 3) and "... ignores a late-arriving lower-seq delete but still
/// records the aux tombstone" (key 4).
#[test]
fn scd1_newer_changes_win_and_late_ones_are_ignored() {
    scenario(
        SCD1_HANDLER,
        &[
            r#"
            {"id": 1, "value": "alice", "seq": 1, "is_delete": false}
            {"id": 2, "value": "bob", "seq": 1, "is_delete": false}
            {"id": 3, "value": "alice", "seq": 5, "is_delete": false}
            {"id": 4, "value": "alice", "seq": 5, "is_delete": false}
            "#,
            r#"
            {"id": 1, "value": "alice-updated", "seq": 2, "is_delete": false}
            {"id": 3, "value": "bob", "seq": 2, "is_delete": false}
            {"id": 4, "value": "alice", "seq": 2, "is_delete": true}
            "#,
        ],
        &[
            &["1", "alice-updated"],
            &["2", "bob"],
            &["3", "alice"],
            &["4", "alice"],
        ],
    );
}

/// Spark: Scd1ForeachBatchHandlerSuite, "Scd1ForeachBatchHandler reconciles out-of-order events
/// when ExcludeColumns hides the sequencing column" (six batches; Spark checks after the 4th and
/// the 6th, every intermediate table is checked here).
#[test]
fn scd1_out_of_order_events_with_the_sequence_left_out_of_the_target() {
    steps(
        SCD1_EXCLUDE,
        &[
            (
                r#"
                {"id": 1, "value": "alice", "seq": 1, "is_delete": false}
                {"id": 1, "value": "bob", "seq": 3, "is_delete": false}
                "#,
                rows(&[&["1", "bob"]]),
            ),
            (
                r#"{"id": 1, "value": "carol", "seq": 2, "is_delete": false}"#,
                rows(&[&["1", "bob"]]),
            ),
            (
                r#"{"id": 1, "value": "dave", "seq": 4, "is_delete": false}"#,
                rows(&[&["1", "dave"]]),
            ),
            (
                r#"{"id": 1, "value": null, "seq": 2, "is_delete": true}"#,
                rows(&[&["1", "dave"]]),
            ),
            (
                r#"{"id": 1, "value": null, "seq": 5, "is_delete": true}"#,
                rows(&[]),
            ),
            (
                r#"{"id": 1, "value": "ghost", "seq": 4, "is_delete": false}"#,
                rows(&[]),
            ),
        ],
    );
}

/// Spark: Scd1ForeachBatchHandlerSuite, "Scd1ForeachBatchHandler records an aux tombstone for a
/// delete on a nonexistent key without affecting the target". Spark checks the auxiliary table;
/// here the tombstone is observed through the strictly older upsert it must keep out.
#[test]
fn scd1_a_delete_of_a_key_never_seen_leaves_a_tombstone() {
    steps(
        SCD1_HANDLER,
        &[
            (
                r#"{"id": 99, "value": null, "seq": 1, "is_delete": true}"#,
                rows(&[]),
            ),
            (
                r#"{"id": 99, "value": "late", "seq": 0, "is_delete": false}"#,
                rows(&[]),
            ),
        ],
    );
}

/// Spark: Scd1ForeachBatchHandlerSuite, "Scd1ForeachBatchHandler treats a composite key as a single
/// identifier and isolates rows by full key".
#[test]
fn scd1_a_composite_key_isolates_rows_by_the_full_key() {
    let composite = r#"
keys = ["country", "city"]
sequence_by = "seq"
apply_as_deletes = "is_delete"
except_column_list = ["seq", "is_delete"]
columns = [
  { name = "country", type = "string" },
  { name = "city", type = "string" },
  { name = "population", type = "long" },
  { name = "seq", type = "long" },
  { name = "is_delete", type = "boolean" },
]
"#;
    scenario(
        composite,
        &[r#"
        {"country": "US", "city": "New York", "population": 8000000, "seq": 1, "is_delete": false}
        {"country": "US", "city": "Los Angeles", "population": 4000000, "seq": 1, "is_delete": false}
        {"country": "UK", "city": "London", "population": 9000000, "seq": 1, "is_delete": false}
        "#],
        &[
            &["UK", "London", "9000000"],
            &["US", "Los Angeles", "4000000"],
            &["US", "New York", "8000000"],
        ],
    );
}
