//! Spark's `Scd2ForeachBatchHandlerSuite`: SCD Type 2 micro-batches.

use super::*;

// ---------------------------------------------------------------------------
// Scd2ForeachBatchHandlerSuite
// ---------------------------------------------------------------------------

/// Spark: Scd2ForeachBatchHandlerSuite, "a record with a null sequencing value fails the
/// microbatch without applying any changes" and "a record with a null key fails the microbatch
/// without applying any changes".
#[test]
fn scd2_a_null_sequence_or_key_refuses_the_batch() {
    let seed = r#"{"id": 1, "value": "old", "seq": 10, "is_delete": false}"#;
    rejects(
        SCD2_HANDLER,
        &[seed],
        r#"{"id": 1, "value": "bad", "seq": null, "is_delete": false}"#,
        codes::NULL_SEQUENCE,
        &[&["1", "old", "10", "NULL"]],
    );
    rejects(
        SCD2_HANDLER,
        &[seed],
        r#"{"id": null, "value": "bad", "seq": 10, "is_delete": false}"#,
        codes::NULL_KEY,
        &[&["1", "old", "10", "NULL"]],
    );
}

/// Spark: Scd2ForeachBatchHandlerSuite, "an empty microbatch with both tables empty leaves both
/// empty (initial processing)" and "an empty microbatch with both tables non-empty leaves both
/// unchanged".
#[test]
fn scd2_an_empty_batch_changes_nothing() {
    steps(
        SCD2_HANDLER,
        &[
            ("", rows(&[])),
            (
                r#"{"id": 1, "value": "a", "seq": 10, "is_delete": false}"#,
                rows(&[&["1", "a", "10", "NULL"]]),
            ),
            ("", rows(&[&["1", "a", "10", "NULL"]])),
        ],
    );
}

/// Spark: Scd2ForeachBatchHandlerSuite, each key one test, all in one batch as in Spark:
/// "inserting a new key creates an open current record" (1), "two updates to a key in one batch
/// produce a closed record followed by the open record" (2), "an insert and a later delete in the
/// same batch leave a single closed record" (3), "an insert, update, delete, and re-insert for one
/// key in a batch build the full history" (4), "repeating a key's value keeps one current record
/// effective from its first occurrence" (5), "deleting a key that has no current record leaves
/// the dimension table empty" (6) and "multiple new keys in one batch each build their own history
/// independently" (7, 8).
#[test]
fn scd2_histories_built_within_one_batch() {
    scenario(
        SCD2_HANDLER,
        &[r#"
        {"id": 1, "value": "a", "seq": 10, "is_delete": false}
        {"id": 2, "value": "a", "seq": 10, "is_delete": false}
        {"id": 2, "value": "b", "seq": 20, "is_delete": false}
        {"id": 3, "value": "a", "seq": 10, "is_delete": false}
        {"id": 3, "value": null, "seq": 20, "is_delete": true}
        {"id": 4, "value": "a", "seq": 10, "is_delete": false}
        {"id": 4, "value": "b", "seq": 20, "is_delete": false}
        {"id": 4, "value": null, "seq": 30, "is_delete": true}
        {"id": 4, "value": "c", "seq": 40, "is_delete": false}
        {"id": 5, "value": "a", "seq": 10, "is_delete": false}
        {"id": 5, "value": "a", "seq": 20, "is_delete": false}
        {"id": 6, "value": null, "seq": 5, "is_delete": true}
        {"id": 7, "value": "a", "seq": 10, "is_delete": false}
        {"id": 8, "value": "p", "seq": 10, "is_delete": false}
        {"id": 7, "value": "b", "seq": 20, "is_delete": false}
        {"id": 8, "value": "p", "seq": 20, "is_delete": false}
        "#],
        &[
            &["1", "a", "10", "NULL"],
            &["2", "a", "10", "20"],
            &["2", "b", "20", "NULL"],
            &["3", "a", "10", "20"],
            &["4", "a", "10", "20"],
            &["4", "b", "20", "30"],
            &["4", "c", "40", "NULL"],
            &["5", "a", "10", "NULL"],
            &["7", "a", "10", "20"],
            &["7", "b", "20", "NULL"],
            &["8", "p", "10", "NULL"],
        ],
    );
}

/// Spark: Scd2ForeachBatchHandlerSuite, "updating an existing key closes its current record and
/// opens a new one" (key 1), "deleting an existing key closes its current record with no open
/// record remaining" (key 2), "an update preserves already-closed historical records" (key 3) and
/// "updates, deletes, and inserts for different keys in one batch reconcile independently"
/// (keys 4, 5, 6). Spark's seeded target is the first batch.
#[test]
fn scd2_changes_to_existing_records() {
    scenario(
        SCD2_HANDLER,
        &[
            r#"
            {"id": 1, "value": "a", "seq": 10, "is_delete": false}
            {"id": 2, "value": "a", "seq": 10, "is_delete": false}
            {"id": 3, "value": "a", "seq": 5, "is_delete": false}
            {"id": 3, "value": "b", "seq": 10, "is_delete": false}
            {"id": 4, "value": "a", "seq": 10, "is_delete": false}
            {"id": 5, "value": "p", "seq": 10, "is_delete": false}
            "#,
            r#"
            {"id": 1, "value": "b", "seq": 20, "is_delete": false}
            {"id": 2, "value": null, "seq": 20, "is_delete": true}
            {"id": 3, "value": "c", "seq": 20, "is_delete": false}
            {"id": 4, "value": "b", "seq": 20, "is_delete": false}
            {"id": 5, "value": null, "seq": 20, "is_delete": true}
            {"id": 6, "value": "z", "seq": 20, "is_delete": false}
            "#,
        ],
        &[
            &["1", "a", "10", "20"],
            &["1", "b", "20", "NULL"],
            &["2", "a", "10", "20"],
            &["3", "a", "5", "10"],
            &["3", "b", "10", "20"],
            &["3", "c", "20", "NULL"],
            &["4", "a", "10", "20"],
            &["4", "b", "20", "NULL"],
            &["5", "p", "10", "20"],
            &["6", "z", "20", "NULL"],
        ],
    );
}

/// Spark: Scd2ForeachBatchHandlerSuite, "a late event older than all existing history is inserted
/// as the earliest record" (key 1), "a late update landing inside an existing record splits it
/// around the new value" (key 2), "a late delete landing inside an existing record shortens it to
/// end at the deletion" (key 3) and "two late events in one batch each bisect a distinct closed
/// target row" (key 4).
#[test]
fn scd2_late_events_split_the_history() {
    scenario(
        SCD2_HANDLER,
        &[
            r#"
            {"id": 1, "value": "a", "seq": 10, "is_delete": false}
            {"id": 2, "value": "a", "seq": 10, "is_delete": false}
            {"id": 2, "value": "c", "seq": 20, "is_delete": false}
            {"id": 3, "value": "a", "seq": 10, "is_delete": false}
            {"id": 3, "value": "b", "seq": 30, "is_delete": false}
            {"id": 4, "value": "a", "seq": 1, "is_delete": false}
            {"id": 4, "value": "b", "seq": 5, "is_delete": false}
            {"id": 4, "value": "c", "seq": 10, "is_delete": false}
            {"id": 4, "value": "d", "seq": 20, "is_delete": false}
            "#,
            r#"
            {"id": 1, "value": "b", "seq": 5, "is_delete": false}
            {"id": 2, "value": "b", "seq": 15, "is_delete": false}
            {"id": 3, "value": null, "seq": 20, "is_delete": true}
            {"id": 4, "value": "x", "seq": 7, "is_delete": false}
            {"id": 4, "value": "y", "seq": 15, "is_delete": false}
            "#,
        ],
        &[
            &["1", "b", "5", "10"],
            &["1", "a", "10", "NULL"],
            &["2", "a", "10", "15"],
            &["2", "b", "15", "20"],
            &["2", "c", "20", "NULL"],
            &["3", "a", "10", "20"],
            &["3", "b", "30", "NULL"],
            &["4", "a", "1", "5"],
            &["4", "b", "5", "7"],
            &["4", "x", "7", "10"],
            &["4", "c", "10", "15"],
            &["4", "y", "15", "20"],
            &["4", "d", "20", "NULL"],
        ],
    );
}

/// Spark: Scd2ForeachBatchHandlerSuite, "a late delete bisecting a trailing closed record promotes
/// the surviving tail to a tombstone" and "a late delete bisecting a trailing closed record is
/// replay-stable" (the third batch replays the second).
#[test]
fn scd2_a_late_delete_shortens_the_last_closed_record() {
    let late_delete = r#"{"id": 1, "value": null, "seq": 15, "is_delete": true}"#;
    steps(
        SCD2_HANDLER,
        &[
            (
                r#"
                {"id": 1, "value": "a", "seq": 10, "is_delete": false}
                {"id": 1, "value": null, "seq": 20, "is_delete": true}
                "#,
                rows(&[&["1", "a", "10", "20"]]),
            ),
            (late_delete, rows(&[&["1", "a", "10", "15"]])),
            (late_delete, rows(&[&["1", "a", "10", "15"]])),
        ],
    );
}

/// Spark: Scd2ForeachBatchHandlerSuite, "a late event predating a recorded deletion becomes a
/// record ending at the deletion" (key 1), "re-inserting a key after it was deleted opens a new
/// current record" (key 2), "an empty microbatch garbage-collects a stale aux row from a prior
/// batch" (batch 3) and "a logically-deleted tombstone is physically garbage-collected by a later
/// unrelated batch" (batch 4). The auxiliary-table bookkeeping Spark checks has no autocdc
/// counterpart; the target must stay as it was.
#[test]
fn scd2_deletes_bound_late_and_later_records() {
    let after = rows(&[&["1", "x", "10", "20"], &["2", "x", "30", "NULL"]]);
    steps(
        SCD2_HANDLER,
        &[
            (
                r#"
                {"id": 1, "value": null, "seq": 20, "is_delete": true}
                {"id": 2, "value": null, "seq": 20, "is_delete": true}
                "#,
                rows(&[]),
            ),
            (
                r#"
                {"id": 1, "value": "x", "seq": 10, "is_delete": false}
                {"id": 2, "value": "x", "seq": 30, "is_delete": false}
                "#,
                after.clone(),
            ),
            ("", after),
            (
                r#"{"id": 3, "value": "y", "seq": 30, "is_delete": false}"#,
                rows(&[
                    &["1", "x", "10", "20"],
                    &["2", "x", "30", "NULL"],
                    &["3", "y", "30", "NULL"],
                ]),
            ),
        ],
    );
}

/// Spark: Scd2ForeachBatchHandlerSuite, "a value repeated across batches stays one record until a
/// later change closes it".
#[test]
fn scd2_a_value_repeated_across_batches_stays_one_record() {
    steps(
        SCD2_HANDLER,
        &[
            (
                r#"{"id": 1, "value": "a", "seq": 10, "is_delete": false}"#,
                rows(&[&["1", "a", "10", "NULL"]]),
            ),
            (
                r#"{"id": 1, "value": "a", "seq": 20, "is_delete": false}"#,
                rows(&[&["1", "a", "10", "NULL"]]),
            ),
            (
                r#"{"id": 1, "value": "b", "seq": 30, "is_delete": false}"#,
                rows(&[&["1", "a", "10", "30"], &["1", "b", "30", "NULL"]]),
            ),
        ],
    );
}

/// Spark: Scd2ForeachBatchHandlerSuite, "a late event arriving within an unchanged period splits
/// the surrounding history".
#[test]
fn scd2_a_late_event_splits_an_unchanged_period() {
    steps(
        SCD2_HANDLER,
        &[
            (
                r#"
                {"id": 1, "value": "Alice", "seq": 5, "is_delete": false}
                {"id": 1, "value": "Alice", "seq": 10, "is_delete": false}
                {"id": 1, "value": "Alice", "seq": 15, "is_delete": false}
                "#,
                rows(&[&["1", "Alice", "5", "NULL"]]),
            ),
            (
                r#"{"id": 1, "value": "Charlie", "seq": 20, "is_delete": false}"#,
                rows(&[&["1", "Alice", "5", "20"], &["1", "Charlie", "20", "NULL"]]),
            ),
            (
                r#"{"id": 1, "value": "Bob", "seq": 12, "is_delete": false}"#,
                rows(&[
                    &["1", "Alice", "5", "12"],
                    &["1", "Bob", "12", "15"],
                    &["1", "Alice", "15", "20"],
                    &["1", "Charlie", "20", "NULL"],
                ]),
            ),
        ],
    );
}

/// Spark: Scd2ForeachBatchHandlerSuite, "reprocessing an update microbatch leaves both tables
/// unchanged" (key 1), "reprocessing a delete microbatch leaves both tables unchanged" (key 2),
/// "reprocessing a microbatch of repeated values leaves both tables unchanged" (key 3) and
/// "reprocessing a delete of an unknown key leaves both tables unchanged" (key 4): the third batch
/// replays the second.
#[test]
fn scd2_replaying_a_batch_changes_nothing() {
    let replayed = r#"
    {"id": 1, "value": "b", "seq": 20, "is_delete": false}
    {"id": 2, "value": null, "seq": 20, "is_delete": true}
    {"id": 3, "value": "a", "seq": 10, "is_delete": false}
    {"id": 3, "value": "a", "seq": 20, "is_delete": false}
    {"id": 3, "value": "a", "seq": 30, "is_delete": false}
    {"id": 4, "value": null, "seq": 5, "is_delete": true}
    "#;
    let after = rows(&[
        &["1", "a", "10", "20"],
        &["1", "b", "20", "NULL"],
        &["2", "a", "10", "20"],
        &["3", "a", "10", "NULL"],
    ]);
    steps(
        SCD2_HANDLER,
        &[
            (
                r#"
                {"id": 1, "value": "a", "seq": 10, "is_delete": false}
                {"id": 2, "value": "a", "seq": 10, "is_delete": false}
                "#,
                rows(&[&["1", "a", "10", "NULL"], &["2", "a", "10", "NULL"]]),
            ),
            (replayed, after.clone()),
            (replayed, after),
        ],
    );
}

/// Spark: Scd2ForeachBatchHandlerSuite, "duplicate events at the same key and sequence in one
/// microbatch collapse to one record" and "redelivering the same event in a later microbatch
/// leaves both tables unchanged".
#[test]
fn scd2_duplicates_collapse_to_one_record() {
    let a = r#"{"id": 1, "value": "a", "seq": 10, "is_delete": false}"#;
    let both = [a, a].join("\n");
    steps(
        SCD2_HANDLER,
        &[
            (both.as_str(), rows(&[&["1", "a", "10", "NULL"]])),
            (a, rows(&[&["1", "a", "10", "NULL"]])),
        ],
    );
}

/// Spark: Scd2ForeachBatchHandlerSuite, "the auxiliary merge's own writes do not duplicate the rows
/// the target merge reads" (key 1) and "a demoted row's two copies reconcile even when they
/// disagree on where the run starts" (key 2): same-value events landing inside a run extend it.
#[test]
fn scd2_repeated_values_inside_a_run_extend_it() {
    scenario(
        SCD2_HANDLER,
        &[
            r#"
            {"id": 1, "value": "a", "seq": 5, "is_delete": false}
            {"id": 1, "value": "a", "seq": 10, "is_delete": false}
            {"id": 1, "value": "b", "seq": 20, "is_delete": false}
            {"id": 2, "value": "a", "seq": 10, "is_delete": false}
            {"id": 2, "value": "b", "seq": 20, "is_delete": false}
            "#,
            r#"
            {"id": 1, "value": "a", "seq": 15, "is_delete": false}
            {"id": 2, "value": "a", "seq": 5, "is_delete": false}
            {"id": 2, "value": "a", "seq": 15, "is_delete": false}
            "#,
        ],
        &[
            &["1", "a", "5", "20"],
            &["1", "b", "20", "NULL"],
            &["2", "a", "5", "20"],
            &["2", "b", "20", "NULL"],
        ],
    );
}

/// Spark: Scd2ForeachBatchHandlerSuite, "events sharing key and sequence but differing in value
/// still collapse to one record" and "a later microbatch event sharing key and sequence but
/// differing in value is absorbed" (Spark: one open record holding either value), and "an upsert
/// and a delete at the same sequence resolve in favor of the delete", in every order and
/// batching (docs/flows.md, Semantics).
#[test]
fn scd2_changes_tied_on_the_sequence_resolve_the_same_way_in_every_order() {
    one_of(
        SCD2_HANDLER,
        &[
            r#"{"id": 1, "value": "a", "seq": 10, "is_delete": false}"#,
            r#"{"id": 1, "value": "b", "seq": 10, "is_delete": false}"#,
        ],
        &[
            rows(&[&["1", "a", "10", "NULL"]]),
            rows(&[&["1", "b", "10", "NULL"]]),
        ],
    );
    one_of(
        SCD2_HANDLER,
        &[
            r#"{"id": 1, "value": "a", "seq": 10, "is_delete": false}"#,
            r#"{"id": 1, "value": null, "seq": 10, "is_delete": true}"#,
        ],
        &[rows(&[])],
    );
    // Over an earlier version, the delete at the tie closes it there.
    one_of(
        SCD2_HANDLER,
        &[
            r#"{"id": 1, "value": "x", "seq": 5, "is_delete": false}"#,
            r#"{"id": 1, "value": "a", "seq": 10, "is_delete": false}"#,
            r#"{"id": 1, "value": null, "seq": 10, "is_delete": true}"#,
        ],
        &[rows(&[&["1", "x", "5", "10"]])],
    );
}

/// Spark: Scd1LeafLevelReconciliationSuite, "collapseMicrobatchRowsPerKey collapses keys into
/// upserts on delete and upsert sequencing ties": the row is present afterwards, in every order
/// and batching, within one batch and across commits, and over an earlier row or tombstone.
#[test]
fn scd1_a_delete_and_an_upsert_tied_on_the_sequence_collapse_to_the_upsert() {
    let toml = r#"
keys = ["id"]
sequence_by = "seq"
apply_as_deletes = "is_delete"
columns = [
  { name = "id", type = "int" },
  { name = "seq", type = "long" },
  { name = "value", type = "string" },
  { name = "is_delete", type = "boolean" },
]
"#;
    let upsert = r#"{"id": 1, "seq": 10, "value": "kept", "is_delete": false}"#;
    let delete = r#"{"id": 1, "seq": 10, "value": null, "is_delete": true}"#;
    let want = rows(&[&["1", "10", "kept", "false"]]);
    one_of(toml, &[upsert, delete], std::slice::from_ref(&want));
    one_of(
        toml,
        &[
            r#"{"id": 1, "seq": 5, "value": "old", "is_delete": false}"#,
            delete,
            upsert,
        ],
        std::slice::from_ref(&want),
    );
    // Two deletes tied: one of them, the key gone; a later upsert at the tie still wins.
    one_of(
        toml,
        &[
            delete,
            r#"{"id": 1, "seq": 10, "value": "other", "is_delete": true}"#,
            upsert,
        ],
        std::slice::from_ref(&want),
    );
}

/// Spark: Scd2ForeachBatchHandlerSuite, "a closed run of untracked-only changes is one record
/// holding the last event's values" and "changing only an untracked column updates the current
/// record without adding history".
#[test]
fn scd2_changes_to_untracked_columns_update_the_record_in_place() {
    steps(
        SCD2_TRACK_NAME,
        &[
            (
                r#"{"id": 1, "name": "alice", "score": 39, "seq": 39, "is_delete": false}"#,
                rows(&[&["1", "alice", "39", "39", "NULL"]]),
            ),
            (
                r#"{"id": 1, "name": "alice", "score": 41, "seq": 41, "is_delete": false}"#,
                rows(&[&["1", "alice", "41", "39", "NULL"]]),
            ),
            (
                r#"{"id": 1, "name": "bob", "score": 42, "seq": 42, "is_delete": false}"#,
                rows(&[
                    &["1", "alice", "41", "39", "42"],
                    &["1", "bob", "42", "42", "NULL"],
                ]),
            ),
            (
                r#"{"id": 1, "name": "carol", "score": 43, "seq": 43, "is_delete": false}"#,
                rows(&[
                    &["1", "alice", "41", "39", "42"],
                    &["1", "bob", "42", "42", "43"],
                    &["1", "carol", "43", "43", "NULL"],
                ]),
            ),
        ],
    );
    steps(
        SCD2_TRACK_NAME,
        &[
            (
                r#"
                {"id": 1, "name": "alice", "score": 100, "seq": 10, "is_delete": false}
                {"id": 1, "name": "alice", "score": 200, "seq": 20, "is_delete": false}
                "#,
                rows(&[&["1", "alice", "200", "10", "NULL"]]),
            ),
            (
                r#"{"id": 1, "name": "alice", "score": 300, "seq": 30, "is_delete": false}"#,
                rows(&[&["1", "alice", "300", "10", "NULL"]]),
            ),
        ],
    );
}

/// Spark: Scd2ForeachBatchHandlerSuite, "changing a tracked column opens a new historical record".
#[test]
fn scd2_a_change_to_a_tracked_column_opens_a_record() {
    steps(
        SCD2_TRACK_NAME,
        &[
            (
                r#"
                {"id": 1, "name": "alice", "score": 100, "seq": 10, "is_delete": false}
                {"id": 1, "name": "bob", "score": 100, "seq": 20, "is_delete": false}
                "#,
                rows(&[
                    &["1", "alice", "100", "10", "20"],
                    &["1", "bob", "100", "20", "NULL"],
                ]),
            ),
            (
                r#"{"id": 1, "name": "carol", "score": 100, "seq": 30, "is_delete": false}"#,
                rows(&[
                    &["1", "alice", "100", "10", "20"],
                    &["1", "bob", "100", "20", "30"],
                    &["1", "carol", "100", "30", "NULL"],
                ]),
            ),
        ],
    );
}

/// Spark: Scd2ForeachBatchHandlerSuite, "an event after a deletion leaves the run the deletion
/// closed exactly as it was".
#[test]
fn scd2_an_event_after_a_deletion_leaves_the_closed_run_alone() {
    steps(
        SCD2_HANDLER,
        &[
            (
                r#"
                {"id": 1, "value": "a", "seq": 10, "is_delete": false}
                {"id": 1, "value": "a", "seq": 11, "is_delete": false}
                "#,
                rows(&[&["1", "a", "10", "NULL"]]),
            ),
            (
                r#"{"id": 1, "value": null, "seq": 12, "is_delete": true}"#,
                rows(&[&["1", "a", "10", "12"]]),
            ),
            (
                r#"{"id": 1, "value": "b", "seq": 20, "is_delete": false}"#,
                rows(&[&["1", "a", "10", "12"], &["1", "b", "20", "NULL"]]),
            ),
        ],
    );
}

/// Spark: Scd2ForeachBatchHandlerSuite, "a composite key distinguishes rows that share a single key
/// component".
#[test]
fn scd2_a_composite_key_distinguishes_rows_sharing_a_component() {
    let composite = r#"
keys = ["country", "city"]
sequence_by = "seq"
apply_as_deletes = "is_delete"
except_column_list = ["seq", "is_delete"]
stored_as_scd_type = 2
columns = [
  { name = "country", type = "string" },
  { name = "city", type = "string" },
  { name = "population", type = "string" },
  { name = "seq", type = "long" },
  { name = "is_delete", type = "boolean" },
]
"#;
    scenario(
        composite,
        &[r#"
        {"country": "US", "city": "Springfield", "population": "100", "seq": 10, "is_delete": false}
        {"country": "CA", "city": "Springfield", "population": "200", "seq": 10, "is_delete": false}
        {"country": "US", "city": "Springfield", "population": "150", "seq": 20, "is_delete": false}
        "#],
        &[
            &["US", "Springfield", "100", "10", "20"],
            &["US", "Springfield", "150", "20", "NULL"],
            &["CA", "Springfield", "200", "10", "NULL"],
        ],
    );
}
