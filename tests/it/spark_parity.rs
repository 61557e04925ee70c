//! Scenarios ported from Apache Spark's own AUTO CDC test suites
//! (`sql/pipelines/src/test/scala/org/apache/spark/sql/pipelines/{autocdc,graph}/`)
//! and from the Databricks AUTO CDC documentation example (the "users"
//! change feed), run through autocdc's real write path: NDJSON micro-batches
//! decoded as `autocdc apply` and the service decode them, applied by the
//! engine to a Hadoop catalog on local disk, the target read back with
//! iceberg-rust's scan.
//!
//! How Spark's tests translate:
//! - A Spark source/target row becomes an NDJSON change; Spark's `Row(...)`
//!   expectations become rendered target rows (columns in the flow's
//!   declaration order, then `__START_AT`, `__END_AT` for SCD Type 2; nulls
//!   as `NULL`). autocdc's target has no `_cdc_metadata` column.
//! - A Spark target or auxiliary table seeded with CDC metadata (a row
//!   "upserted at 10", a tombstone "deleted at 10") becomes a first
//!   micro-batch with that change: that is what the metadata records.
//! - Spark checks its auxiliary table; autocdc's state table is internal, so
//!   what the auxiliary table protects (a tombstone keeping a late upsert
//!   out, ...) is checked through a later batch instead.
//! - Spark's semantics say the result does not depend on how the changes
//!   are batched or ordered, so most scenarios also run with a restart after
//!   every batch, with every batch as one, and one change per batch in
//!   reverse order: all must give the same table.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use arrow_array::RecordBatch;
use autocdc::core::flow::{Flow, FlowConfig};
use autocdc::error::codes;
use autocdc::fault::Faults;
use autocdc::service::input::{Limits, decode_ndjson};
use autocdc::table::catalog::Catalog;
use autocdc::table::catalog::hadoop::HadoopCatalog;
use autocdc::table::engine::Engine;
use common::{column_names, open_engine, rows, rt, table_rows};

type Rows = BTreeSet<Vec<String>>;

// ---------------------------------------------------------------------------
// The harness
// ---------------------------------------------------------------------------

fn catalog(dir: &Path) -> Arc<dyn Catalog> {
    Arc::new(HadoopCatalog::new(dir.to_str().unwrap(), None, Arc::new(Faults::default())).unwrap())
}

/// A flow definition: `body` is the TOML of a `[[flow]]` without its name
/// and target.
fn config(name: &str, target: &str, body: &str) -> FlowConfig {
    let text = format!("name = \"{name}\"\ntarget = \"{target}\"\n{body}");
    toml::from_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn flow_as(name: &str, target: &str, body: &str) -> Flow {
    Flow::new(config(name, target, body)).unwrap_or_else(|e| panic!("{e}"))
}

/// The flow every single-flow scenario uses (each run has its own warehouse).
fn flow(body: &str) -> Flow {
    flow_as("spark_parity", "spark.target", body)
}

fn decode(flow: &Flow, ndjson: &str) -> RecordBatch {
    decode_ndjson(flow, ndjson.as_bytes(), Limits::NONE)
        .unwrap_or_else(|e| panic!("{e}\nbatch:\n{ndjson}"))
}

async fn apply(engine: &mut Engine, flow: &Flow, ndjson: &str, now_ms: i64) {
    if let Err(e) = engine.apply(&decode(flow, ndjson), now_ms).await {
        panic!("{e}\nbatch:\n{ndjson}");
    }
}

/// Applies each NDJSON micro-batch in turn (one commit each) to a fresh
/// warehouse in `dir`, reopening the flow after every batch when `restart`
/// (a process restart); returns the target's rows.
async fn run(dir: &Path, flow: &Flow, batches: &[&str], restart: bool) -> Rows {
    let mut engine = open_engine(&catalog(dir), flow).await;
    for (i, b) in batches.iter().enumerate() {
        apply(&mut engine, flow, b, 1_000 + i as i64).await;
        if restart {
            engine = open_engine(&catalog(dir), flow).await;
        }
    }
    table_rows(&engine).await
}

/// The changes of `batches`, one per non-blank line.
fn changes_of<'a>(batches: &[&'a str]) -> Vec<&'a str> {
    batches
        .iter()
        .copied()
        .flat_map(str::lines)
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect()
}

/// Applies `batches` batch by batch, then again restarting after each batch,
/// then all as one batch, then one change per batch in reverse order: every
/// run must leave exactly `expected` in the target.
fn scenario(toml: &str, batches: &[&str], expected: &[&[&str]]) {
    let flow = flow(toml);
    let want = rows(expected);
    let all = batches.join("\n");
    let mut reversed = changes_of(batches);
    reversed.reverse();
    let mut runs: Vec<(&str, Vec<&str>, bool)> = vec![
        ("batch by batch", batches.to_vec(), false),
        (
            "batch by batch, restarting after each",
            batches.to_vec(),
            true,
        ),
    ];
    if batches.len() > 1 {
        runs.push(("all batches as one", vec![all.as_str()], false));
    }
    if reversed.len() > 1 {
        runs.push(("one change per batch, in reverse order", reversed, false));
    }
    let rt = rt();
    for (what, bs, restart) in runs {
        let tmp = tempfile::tempdir().unwrap();
        let got = rt.block_on(run(tmp.path(), &flow, &bs, restart));
        assert_eq!(got, want, "{what}");
    }
}

/// Like `scenario`, checking the table after every batch (without and
/// with a restart after each); all batches as one must give the last table.
fn steps(toml: &str, steps: &[(&str, Rows)]) {
    let flow = flow(toml);
    let rt = rt();
    for restart in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        rt.block_on(async {
            let mut engine = open_engine(&catalog(tmp.path()), &flow).await;
            for (i, (batch, want)) in steps.iter().enumerate() {
                apply(&mut engine, &flow, batch, 1_000 + i as i64).await;
                if restart {
                    engine = open_engine(&catalog(tmp.path()), &flow).await;
                }
                assert_eq!(
                    &table_rows(&engine).await,
                    want,
                    "after batch {} (restarting after each: {restart})",
                    i + 1
                );
            }
        });
    }
    let all: Vec<&str> = steps.iter().map(|s| s.0).collect();
    let all = all.join("\n");
    let tmp = tempfile::tempdir().unwrap();
    let got = rt.block_on(run(tmp.path(), &flow, &[all.as_str()], false));
    assert_eq!(
        &got,
        &steps.last().expect("at least one step").1,
        "all batches as one"
    );
}

/// Applies `seed`, then `bad`, which must be refused with `code`; the table
/// must then be `after` (nothing of the refused batch applied), also after a
/// restart.
fn rejects(toml: &str, seed: &[&str], bad: &str, code: &str, after: &[&[&str]]) {
    let flow = flow(toml);
    let want = rows(after);
    let rt = rt();
    let tmp = tempfile::tempdir().unwrap();
    rt.block_on(async {
        let mut engine = open_engine(&catalog(tmp.path()), &flow).await;
        for (i, b) in seed.iter().enumerate() {
            apply(&mut engine, &flow, b, 1_000 + i as i64).await;
        }
        let e = match engine.apply(&decode(&flow, bad), 2_000).await {
            Ok(_) => panic!("the batch was accepted:\n{bad}"),
            Err(e) => e,
        };
        assert_eq!(e.code(), code, "{e}");
        assert_eq!(
            table_rows(&engine).await,
            want,
            "nothing of the refused batch is applied"
        );
        let engine = open_engine(&catalog(tmp.path()), &flow).await;
        assert_eq!(table_rows(&engine).await, want, "after a restart");
    });
}

/// Changes with equal sequences for one key (a tie): Spark leaves the winner
/// undefined; autocdc's documented rule is that the same change wins in
/// every order and batching. Applies the changes as one batch, reversed,
/// one per batch (with restarts), and one per batch reversed: all runs
/// must give the same table, one of `candidates`.
fn one_of(toml: &str, changes: &[&str], candidates: &[Rows]) {
    let flow = flow(toml);
    let fwd: Vec<&str> = changes.to_vec();
    let rev: Vec<&str> = changes.iter().rev().copied().collect();
    let (fwd_all, rev_all) = (fwd.join("\n"), rev.join("\n"));
    let runs: Vec<(&str, Vec<&str>, bool)> = vec![
        ("one batch", vec![fwd_all.as_str()], false),
        ("one batch, reversed", vec![rev_all.as_str()], false),
        ("one change per batch, restarting after each", fwd, true),
        ("one change per batch, reversed", rev, false),
    ];
    let rt = rt();
    let mut results: Vec<(&str, Rows)> = Vec::new();
    for (what, bs, restart) in runs {
        let tmp = tempfile::tempdir().unwrap();
        let got = rt.block_on(run(tmp.path(), &flow, &bs, restart));
        assert!(
            candidates.contains(&got),
            "{what}: {got:?} is none of {candidates:?}"
        );
        results.push((what, got));
    }
    for (what, got) in &results[1..] {
        assert_eq!(
            got, &results[0].1,
            "{what} differs from {}: the same change must win in every order",
            results[0].0
        );
    }
}

/// Runs `v1` on `v1_batches`, then opens the same target with the changed
/// definition `v2`: it must be refused with `code` (when the flow opens, or
/// at its first batch). The first definition still opens afterwards, its
/// table unchanged.
fn refused_on_change(v1: &str, v1_batches: &[&str], v2: &str, v2_batch: &str, code: &str) {
    let (f1, f2) = (flow(v1), flow(v2));
    let rt = rt();
    let tmp = tempfile::tempdir().unwrap();
    rt.block_on(async {
        let cat = catalog(tmp.path());
        let mut engine = open_engine(&cat, &f1).await;
        for (i, b) in v1_batches.iter().enumerate() {
            apply(&mut engine, &f1, b, 1_000 + i as i64).await;
        }
        let before = table_rows(&engine).await;
        drop(engine);
        let err = match Engine::open(f2.clone(), cat.clone(), Arc::new(Faults::default())).await {
            Err(e) => e,
            Ok(mut changed) => match changed.apply(&decode(&f2, v2_batch), 2_000).await {
                Err(e) => e,
                Ok(_) => panic!("the changed definition was accepted"),
            },
        };
        assert_eq!(err.code(), code, "{err}");
        let engine = open_engine(&cat, &f1).await;
        assert_eq!(
            table_rows(&engine).await,
            before,
            "the first definition still opens, its table unchanged"
        );
    });
}

/// Runs `v1` on `v1_batches` (table `v1_table`), then reopens the target
/// with `v2` and applies `v2_batches`: the table must be `v2_table`, also
/// after reopening, and `v2_table` must be what `v2` makes of all the
/// batches from scratch.
fn reconfigured(
    v1: &str,
    v1_batches: &[&str],
    v1_table: &[&[&str]],
    v2: &str,
    v2_batches: &[&str],
    v2_table: &[&[&str]],
) {
    let (f1, f2) = (flow(v1), flow(v2));
    let (want1, want2) = (rows(v1_table), rows(v2_table));
    let rt = rt();
    let tmp = tempfile::tempdir().unwrap();
    rt.block_on(async {
        let cat = catalog(tmp.path());
        let mut engine = open_engine(&cat, &f1).await;
        for (i, b) in v1_batches.iter().enumerate() {
            apply(&mut engine, &f1, b, 1_000 + i as i64).await;
        }
        assert_eq!(
            table_rows(&engine).await,
            want1,
            "under the first definition"
        );
        drop(engine);
        let mut engine = open_engine(&cat, &f2).await;
        for (i, b) in v2_batches.iter().enumerate() {
            apply(&mut engine, &f2, b, 2_000 + i as i64).await;
        }
        assert_eq!(table_rows(&engine).await, want2, "after the change");
        let engine = open_engine(&cat, &f2).await;
        assert_eq!(
            table_rows(&engine).await,
            want2,
            "after the change, reopened"
        );
    });
    let all: Vec<&str> = v1_batches.iter().chain(v2_batches).copied().collect();
    let tmp = tempfile::tempdir().unwrap();
    assert_eq!(
        rt.block_on(run(tmp.path(), &f2, &all, false)),
        want2,
        "the second definition from scratch"
    );
}

/// `autocdc refresh --full`: drops the target and its state table.
async fn full_refresh(cat: &Arc<dyn Catalog>, flow: &Flow) {
    cat.drop_table(&flow.target).await.unwrap();
    cat.drop_table(&flow.state_ident()).await.unwrap();
}

/// Spark's full-refresh scenario: `run1`, a full refresh, `run2`.
fn refreshed(toml: &str, run1: &str, after1: &[&[&str]], run2: &str, after2: &[&[&str]]) {
    let f = flow(toml);
    let rt = rt();
    let tmp = tempfile::tempdir().unwrap();
    rt.block_on(async {
        let cat = catalog(tmp.path());
        let mut engine = open_engine(&cat, &f).await;
        apply(&mut engine, &f, run1, 1_000).await;
        assert_eq!(table_rows(&engine).await, rows(after1), "run 1");
        drop(engine);
        full_refresh(&cat, &f).await;
        let mut engine = open_engine(&cat, &f).await;
        assert!(table_rows(&engine).await.is_empty(), "refreshed");
        apply(&mut engine, &f, run2, 2_000).await;
        assert_eq!(table_rows(&engine).await, rows(after2), "run 2");
        let engine = open_engine(&cat, &f).await;
        assert_eq!(table_rows(&engine).await, rows(after2), "run 2, reopened");
    });
}

// ---------------------------------------------------------------------------
// Flow definitions
// ---------------------------------------------------------------------------

/// Scd1ForeachBatchHandlerSuite's processor: key `id`, sequence `seq`,
/// `is_delete` marks deletes, the target keeps `id` and `value`.
const SCD1_HANDLER: &str = r#"
keys = ["id"]
sequence_by = "seq"
apply_as_deletes = "is_delete"
column_list = ["id", "value"]
columns = [
  { name = "id", type = "int" },
  { name = "value", type = "string" },
  { name = "seq", type = "long" },
  { name = "is_delete", type = "boolean" },
]
"#;

/// The same with `ExcludeColumns(seq, is_delete)`.
const SCD1_EXCLUDE: &str = r#"
keys = ["id"]
sequence_by = "seq"
apply_as_deletes = "is_delete"
except_column_list = ["seq", "is_delete"]
columns = [
  { name = "id", type = "int" },
  { name = "value", type = "string" },
  { name = "seq", type = "long" },
  { name = "is_delete", type = "boolean" },
]
"#;

/// Scd2ForeachBatchHandlerSuite's processor: SCD Type 2 over `value`; the
/// target is `id, value, __START_AT, __END_AT`.
const SCD2_HANDLER: &str = r#"
keys = ["id"]
sequence_by = "seq"
apply_as_deletes = "is_delete"
except_column_list = ["seq", "is_delete"]
stored_as_scd_type = 2
columns = [
  { name = "id", type = "int" },
  { name = "value", type = "string" },
  { name = "seq", type = "long" },
  { name = "is_delete", type = "boolean" },
]
"#;

/// Scd2ForeachBatchHandlerSuite's `trackedProcessor`: only `name` is tracked.
const SCD2_TRACK_NAME: &str = r#"
keys = ["id"]
sequence_by = "seq"
apply_as_deletes = "is_delete"
except_column_list = ["seq", "is_delete"]
stored_as_scd_type = 2
track_history_column_list = ["name"]
columns = [
  { name = "id", type = "int" },
  { name = "name", type = "string" },
  { name = "score", type = "int" },
  { name = "seq", type = "long" },
  { name = "is_delete", type = "boolean" },
]
"#;

/// The graph suites' `(id, name, version)` source sequenced by `version`,
/// which stays in the target.
const SCD1_PIPELINE: &str = r#"
keys = ["id"]
sequence_by = "version"
columns = [
  { name = "id", type = "int" },
  { name = "name", type = "string" },
  { name = "version", type = "long" },
]
"#;

const SCD2_PIPELINE: &str = r#"
keys = ["id"]
sequence_by = "version"
stored_as_scd_type = 2
columns = [
  { name = "id", type = "int" },
  { name = "name", type = "string" },
  { name = "version", type = "long" },
]
"#;

/// The same with an `is_delete` control column left out of the target.
const SCD1_PIPELINE_DELETES: &str = r#"
keys = ["id"]
sequence_by = "version"
apply_as_deletes = "is_delete"
except_column_list = ["is_delete"]
columns = [
  { name = "id", type = "int" },
  { name = "name", type = "string" },
  { name = "version", type = "long" },
  { name = "is_delete", type = "boolean" },
]
"#;

const SCD2_PIPELINE_DELETES: &str = r#"
keys = ["id"]
sequence_by = "version"
apply_as_deletes = "is_delete"
except_column_list = ["is_delete"]
stored_as_scd_type = 2
columns = [
  { name = "id", type = "int" },
  { name = "name", type = "string" },
  { name = "version", type = "long" },
  { name = "is_delete", type = "boolean" },
]
"#;

/// `(id, version)` only: the target has no column but the key and the sequence.
const SCD1_ID_VERSION: &str = r#"
keys = ["id"]
sequence_by = "version"
columns = [
  { name = "id", type = "int" },
  { name = "version", type = "long" },
]
"#;

const SCD2_ID_VERSION: &str = r#"
keys = ["id"]
sequence_by = "version"
stored_as_scd_type = 2
columns = [
  { name = "id", type = "int" },
  { name = "version", type = "long" },
]
"#;

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

// ---------------------------------------------------------------------------
// Durability suites (auxiliary table and target table)
// ---------------------------------------------------------------------------

/// Spark: AutoCdcScd1AuxiliaryTableDurabilitySuite, "a higher-sequence event in a later pipeline
/// run correctly upserts the row" (keys 1, 3) and "an event with a sequence lower than what was
/// applied in a prior pipeline run is suppressed" (key 2); AutoCdcScd1TargetTableDurabilitySuite,
/// "pre-loaded rows: an event with a lower sequence is suppressed and a higher one wins" (keys 4,
/// 5) and "pre-loaded target rows merge correctly on the first AutoCDC run, and the auxiliary
/// table is created lazily" (key 6). Spark's pre-loaded rows carry CDC metadata; here they are
/// the first run's changes.
#[test]
fn scd1_sequences_persist_across_runs() {
    steps(
        SCD1_PIPELINE_DELETES,
        &[
            (
                r#"
                {"id": 1, "name": "alice", "version": 1, "is_delete": false}
                {"id": 2, "name": "alice", "version": 10, "is_delete": true}
                {"id": 4, "name": "alice", "version": 5, "is_delete": false}
                {"id": 5, "name": "bob", "version": 5, "is_delete": false}
                {"id": 6, "name": "alice", "version": 1, "is_delete": false}
                "#,
                rows(&[
                    &["1", "alice", "1"],
                    &["4", "alice", "5"],
                    &["5", "bob", "5"],
                    &["6", "alice", "1"],
                ]),
            ),
            (
                r#"
                {"id": 1, "name": "alice2", "version": 2, "is_delete": false}
                {"id": 3, "name": "bob", "version": 1, "is_delete": false}
                {"id": 2, "name": "stale", "version": 5, "is_delete": false}
                {"id": 4, "name": "stale", "version": 2, "is_delete": false}
                {"id": 5, "name": "bob2", "version": 10, "is_delete": false}
                {"id": 6, "name": "bob", "version": 2, "is_delete": false}
                "#,
                rows(&[
                    &["1", "alice2", "2"],
                    &["3", "bob", "1"],
                    &["4", "alice", "5"],
                    &["5", "bob2", "10"],
                    &["6", "bob", "2"],
                ]),
            ),
        ],
    );
}

/// Spark: AutoCdcScd2AuxiliaryTableDurabilitySuite, "a higher-sequence event in a later pipeline
/// run correctly closes and opens records" (keys 1, 2) and "an event with a sequence lower than
/// what was applied in a prior pipeline run is woven in as a closed prior record" (key 3);
/// AutoCdcScd2TargetTableDurabilitySuite, "pre-loaded current record: a higher-sequence upsert
/// closes it and opens a new record" (key 4), "pre-loaded current record: a lower-sequence upsert
/// is woven in as a closed prior record" (key 3 again) and "pre-loaded target rows merge correctly
/// on the first AutoCDC run, and the auxiliary table is created lazily" (key 5).
#[test]
fn scd2_history_persists_across_runs() {
    steps(
        SCD2_PIPELINE,
        &[
            (
                r#"
                {"id": 1, "name": "alice", "version": 1}
                {"id": 3, "name": "alice", "version": 10}
                {"id": 4, "name": "alice", "version": 5}
                {"id": 5, "name": "alice", "version": 1}
                "#,
                rows(&[
                    &["1", "alice", "1", "1", "NULL"],
                    &["3", "alice", "10", "10", "NULL"],
                    &["4", "alice", "5", "5", "NULL"],
                    &["5", "alice", "1", "1", "NULL"],
                ]),
            ),
            (
                r#"
                {"id": 1, "name": "alice2", "version": 2}
                {"id": 2, "name": "bob", "version": 1}
                {"id": 3, "name": "early", "version": 5}
                {"id": 4, "name": "alicia", "version": 10}
                {"id": 5, "name": "bob", "version": 2}
                "#,
                rows(&[
                    &["1", "alice", "1", "1", "2"],
                    &["1", "alice2", "2", "2", "NULL"],
                    &["2", "bob", "1", "1", "NULL"],
                    &["3", "early", "5", "5", "10"],
                    &["3", "alice", "10", "10", "NULL"],
                    &["4", "alice", "5", "5", "10"],
                    &["4", "alicia", "10", "10", "NULL"],
                    &["5", "alice", "1", "1", "2"],
                    &["5", "bob", "2", "2", "NULL"],
                ]),
            ),
        ],
    );
}

/// Spark: AutoCdcScd2AuxiliaryTableDurabilitySuite, "if the SCD2 AutoCDC auxiliary table is dropped
/// between runs, it is transparently recreated", its expected table: a target of only the key and
/// the sequence gets a new version per sequence, because Spark's default tracked set (every
/// non-key target column) includes the sequence column when it is kept in the target.
#[test]
fn scd2_the_kept_sequence_column_is_tracked_by_default() {
    scenario(
        SCD2_ID_VERSION,
        &[r#"{"id": 1, "version": 1}"#, r#"{"id": 1, "version": 2}"#],
        &[&["1", "1", "1", "2"], &["1", "2", "2", "NULL"]],
    );
}

/// Spark: AutoCdcScd1AuxiliaryTableDurabilitySuite, "the auxiliary table places the AutoCDC key
/// column first, ahead of any non-key source columns" and "the auxiliary table preserves the
/// user's declared key order, independent of the source DataFrame and target table column
/// orders". autocdc's state table is internal: what is checked is that keys declared out of the
/// column order (and a key that is not the first column) identify rows across runs, and that the
/// target keeps the declared column order.
#[test]
fn scd1_keys_out_of_column_order() {
    let key_second = r#"
keys = ["id"]
sequence_by = "version"
columns = [
  { name = "name", type = "string" },
  { name = "id", type = "int" },
  { name = "version", type = "long" },
]
"#;
    steps(
        key_second,
        &[
            (
                r#"{"name": "alice", "id": 1, "version": 1}"#,
                rows(&[&["alice", "1", "1"]]),
            ),
            (
                r#"{"name": "alicia", "id": 1, "version": 2}"#,
                rows(&[&["alicia", "1", "2"]]),
            ),
        ],
    );
    steps(
        REGION_ID_SCD1,
        &[
            (
                r#"{"value": "v", "id": 1, "region": "us", "version": 1}"#,
                rows(&[&["v", "1", "us", "1"]]),
            ),
            (
                r#"
                {"value": "v2", "id": 1, "region": "us", "version": 2}
                {"value": "w", "id": 1, "region": "eu", "version": 1}
                "#,
                rows(&[&["v2", "1", "us", "2"], &["w", "1", "eu", "1"]]),
            ),
        ],
    );
}

const REGION_ID_SCD1: &str = r#"
keys = ["region", "id"]
sequence_by = "version"
columns = [
  { name = "value", type = "string" },
  { name = "id", type = "int" },
  { name = "region", type = "string" },
  { name = "version", type = "long" },
]
"#;

const REGION_ID_SCD2: &str = r#"
keys = ["region", "id"]
sequence_by = "version"
stored_as_scd_type = 2
columns = [
  { name = "value", type = "string" },
  { name = "id", type = "int" },
  { name = "region", type = "string" },
  { name = "version", type = "long" },
]
"#;

/// Spark: AutoCdcScd2AuxiliaryTableDurabilitySuite, "the SCD2 auxiliary table schema is the full
/// target row schema plus the deleted-by-batch-id marker, and records the key columns property"
/// and "the auxiliary table preserves the user's declared key order in the key-columns property,
/// independent of the source DataFrame and target table column orders" (as the SCD Type 1 test
/// above: checked through the rows across runs).
#[test]
fn scd2_keys_out_of_column_order() {
    steps(
        REGION_ID_SCD2,
        &[
            (
                r#"{"value": "v", "id": 1, "region": "us", "version": 1}"#,
                rows(&[&["v", "1", "us", "1", "1", "NULL"]]),
            ),
            (
                r#"
                {"value": "v2", "id": 1, "region": "us", "version": 2}
                {"value": "w", "id": 1, "region": "eu", "version": 1}
                "#,
                rows(&[
                    &["v", "1", "us", "1", "1", "2"],
                    &["v2", "1", "us", "2", "2", "NULL"],
                    &["w", "1", "eu", "1", "1", "NULL"],
                ]),
            ),
        ],
    );
}

/// Spark: AutoCdcScd1AuxiliaryTableDurabilitySuite and AutoCdcScd2AuxiliaryTableDurabilitySuite,
/// "a dry run resolves and validates the graph without provisioning the auxiliary table":
/// `Engine::check_target` (the drift checks of opening a flow) creates neither the target nor the
/// state table.
#[test]
fn checking_a_flow_creates_no_table() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let cat = catalog(tmp.path());
        for f in [
            flow_as("dry_1", "spark.dry_1", SCD1_ID_VERSION),
            flow_as("dry_2", "spark.dry_2", SCD2_ID_VERSION),
        ] {
            Engine::check_target(&f, cat.as_ref()).await.unwrap();
            assert!(cat.load_table(&f.target).await.unwrap().is_none());
            assert!(cat.load_table(&f.state_ident()).await.unwrap().is_none());
        }
    });
}

/// Spark: AutoCdcScd1AuxiliaryTableDurabilitySuite and AutoCdcScd2AuxiliaryTableDurabilitySuite,
/// "if the (SCD2) AutoCDC auxiliary table is dropped between runs, it is transparently recreated".
/// autocdc differs on purpose: the target names the state snapshot it was committed with, and a
/// missing one is refused (AUTOCDC_INVALID_STATE.STATE_SNAPSHOT_MISSING, docs/errors.md's error
/// table) rather than silently rebuilt; `refresh --full` (dropping both tables) then starts over.
#[test]
fn a_dropped_state_table_is_refused_until_a_full_refresh() {
    for (body, after) in [
        (SCD1_ID_VERSION, rows(&[&["1", "2"]])),
        (SCD2_ID_VERSION, rows(&[&["1", "2", "2", "NULL"]])),
    ] {
        let f = flow(body);
        let tmp = tempfile::tempdir().unwrap();
        rt().block_on(async {
            let cat = catalog(tmp.path());
            let mut engine = open_engine(&cat, &f).await;
            apply(&mut engine, &f, r#"{"id": 1, "version": 1}"#, 1).await;
            drop(engine);
            assert!(cat.drop_table(&f.state_ident()).await.unwrap());
            match Engine::open(f.clone(), cat.clone(), Arc::new(Faults::default())).await {
                Ok(_) => panic!("opened without its state"),
                Err(e) => assert_eq!(e.code(), codes::STATE_SNAPSHOT_MISSING, "{e}"),
            }
            full_refresh(&cat, &f).await;
            let mut engine = open_engine(&cat, &f).await;
            apply(&mut engine, &f, r#"{"id": 1, "version": 2}"#, 2).await;
            assert_eq!(table_rows(&engine).await, after);
        });
    }
}

// ---------------------------------------------------------------------------
// Full refresh suites
// ---------------------------------------------------------------------------

/// Spark: AutoCdcScd1FullRefreshSuite, "full refresh wipes target rows and the auxiliary table for
/// the refreshed flow" and "after a full refresh, an event with a sequence below the previous
/// run's watermark now lands".
#[test]
fn scd1_full_refresh_starts_over() {
    refreshed(
        SCD1_PIPELINE,
        r#"{"id": 1, "name": "alice", "version": 5}"#,
        &[&["1", "alice", "5"]],
        r#"{"id": 2, "name": "bob", "version": 1}"#,
        &[&["2", "bob", "1"]],
    );
    refreshed(
        SCD1_PIPELINE_DELETES,
        r#"{"id": 1, "name": "alice", "version": 10, "is_delete": true}"#,
        &[],
        r#"{"id": 1, "name": "fresh", "version": 5, "is_delete": false}"#,
        &[&["1", "fresh", "5"]],
    );
}

/// Spark: AutoCdcScd2FullRefreshSuite, "full refresh wipes target rows and the auxiliary table for
/// the refreshed flow" and "after a full refresh, an event with a sequence below the previous
/// run's watermark now lands".
#[test]
fn scd2_full_refresh_starts_over() {
    refreshed(
        SCD2_PIPELINE,
        r#"{"id": 1, "name": "alice", "version": 5}"#,
        &[&["1", "alice", "5", "5", "NULL"]],
        r#"{"id": 2, "name": "bob", "version": 1}"#,
        &[&["2", "bob", "1", "1", "NULL"]],
    );
    refreshed(
        SCD2_PIPELINE_DELETES,
        r#"{"id": 1, "name": "alice", "version": 10, "is_delete": true}"#,
        &[],
        r#"{"id": 1, "name": "fresh", "version": 5, "is_delete": false}"#,
        &[&["1", "fresh", "5", "5", "NULL"]],
    );
}

/// Two flows on `spark.t_a` and `spark.t_b`: `run1` to both, a full refresh of
/// `t_a` only, `run2_a` / `run2_b`; returns both tables.
fn selective_refresh(body: &str, run1: (&str, &str), run2: (&str, &str)) -> (Rows, Rows) {
    let fa = flow_as("flow_a", "spark.t_a", body);
    let fb = flow_as("flow_b", "spark.t_b", body);
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let cat = catalog(tmp.path());
        let mut a = open_engine(&cat, &fa).await;
        let mut b = open_engine(&cat, &fb).await;
        apply(&mut a, &fa, run1.0, 1).await;
        apply(&mut b, &fb, run1.1, 1).await;
        drop(a);
        full_refresh(&cat, &fa).await;
        let mut a = open_engine(&cat, &fa).await;
        apply(&mut a, &fa, run2.0, 2).await;
        apply(&mut b, &fb, run2.1, 2).await;
        let a = table_rows(&open_engine(&cat, &fa).await).await;
        let b = table_rows(&open_engine(&cat, &fb).await).await;
        (a, b)
    })
}

/// Spark: AutoCdcScd1FullRefreshSuite, "selective full refresh wipes only the requested target's
/// auxiliary state".
#[test]
fn scd1_a_selective_full_refresh_keeps_the_other_flows_state() {
    let (a, b) = selective_refresh(
        SCD1_ID_VERSION,
        (r#"{"id": 1, "version": 10}"#, r#"{"id": 1, "version": 10}"#),
        (r#"{"id": 1, "version": 5}"#, r#"{"id": 1, "version": 5}"#),
    );
    assert_eq!(a, rows(&[&["1", "5"]]), "t_a was refreshed: seq 5 lands");
    assert_eq!(
        b,
        rows(&[&["1", "10"]]),
        "t_b kept its state: seq 5 is stale"
    );
}

/// Spark: AutoCdcScd2FullRefreshSuite, "selective full refresh wipes only the requested target's
/// auxiliary state".
#[test]
fn scd2_a_selective_full_refresh_keeps_the_other_flows_state() {
    let (a, b) = selective_refresh(
        SCD2_PIPELINE,
        (
            r#"{"id": 1, "name": "a", "version": 10}"#,
            r#"{"id": 1, "name": "b", "version": 10}"#,
        ),
        (
            r#"{"id": 1, "name": "a2", "version": 5}"#,
            r#"{"id": 1, "name": "b2", "version": 5}"#,
        ),
    );
    assert_eq!(a, rows(&[&["1", "a2", "5", "5", "NULL"]]));
    assert_eq!(
        b,
        rows(&[
            &["1", "b2", "5", "5", "10"],
            &["1", "b", "10", "10", "NULL"]
        ])
    );
}

// ---------------------------------------------------------------------------
// AutoCdcConfigDriftSuite
// ---------------------------------------------------------------------------

/// `(id, name, amount, seq)` as SCD Type 2 with the tracking line `track`
/// (empty: the default).
fn tracking(track: &str) -> String {
    format!(
        "keys = [\"id\"]\nsequence_by = \"seq\"\nstored_as_scd_type = 2\n{}\n{}",
        track,
        r#"columns = [
  { name = "id", type = "int" },
  { name = "name", type = "string" },
  { name = "amount", type = "int" },
  { name = "seq", type = "long" },
]"#
    )
}

/// `(id, seq_long, seq_int)` sequenced by `seq`, SCD Type `scd`.
fn sequenced_by(seq: &str, scd: u8) -> String {
    format!(
        "keys = [\"id\"]\nsequence_by = \"{}\"\nstored_as_scd_type = {}\n{}",
        seq,
        scd,
        r#"columns = [
  { name = "id", type = "int" },
  { name = "seq_long", type = "long" },
  { name = "seq_int", type = "int" },
]"#
    )
}

/// Spark: AutoCdcConfigDriftSuite, "an SCD1 flow whose sequencing type differs from the recorded
/// type triggers SEQUENCING_TYPE_DRIFT".
#[test]
fn scd1_a_changed_sequence_type_is_sequencing_type_drift() {
    refused_on_change(
        &sequenced_by("seq_long", 1),
        &[r#"{"id": 1, "seq_long": 1, "seq_int": 1}"#],
        &sequenced_by("seq_int", 1),
        r#"{"id": 1, "seq_long": 2, "seq_int": 2}"#,
        codes::SEQUENCING_TYPE_DRIFT,
    );
}

/// Spark: AutoCdcConfigDriftSuite, "an SCD2 flow whose sequencing type differs from the recorded
/// type triggers SEQUENCING_TYPE_DRIFT" (checked on the state before the target, whose
/// `__START_AT` / `__END_AT` would also differ).
#[test]
fn scd2_a_changed_sequence_type_is_sequencing_type_drift() {
    refused_on_change(
        &sequenced_by("seq_long", 2),
        &[r#"{"id": 1, "seq_long": 1, "seq_int": 1}"#],
        &sequenced_by("seq_int", 2),
        r#"{"id": 1, "seq_long": 2, "seq_int": 2}"#,
        codes::SEQUENCING_TYPE_DRIFT,
    );
}

/// Spark: AutoCdcConfigDriftSuite, "an SCD2 flow that changes its explicit TRACK HISTORY column set
/// triggers TRACK_HISTORY_DRIFT" (Spark's data). Spark refuses; autocdc re-folds every key's
/// changes under the new tracked set when the flow opens, so the table is what tracking `amount`
/// gives from the start: the amount change at seq 2 opens a version.
#[test]
fn scd2_a_changed_tracked_set_refolds_the_history() {
    reconfigured(
        &tracking(r#"track_history_column_list = ["name"]"#),
        &[r#"{"id": 1, "name": "a", "amount": 10, "seq": 1}"#],
        &[&["1", "a", "10", "1", "1", "NULL"]],
        &tracking(r#"track_history_column_list = ["amount"]"#),
        &[r#"{"id": 1, "name": "a", "amount": 20, "seq": 2}"#],
        &[
            &["1", "a", "10", "1", "1", "2"],
            &["1", "a", "20", "2", "2", "NULL"],
        ],
    );
}

/// Spark: AutoCdcConfigDriftSuite, "an SCD2 flow that changes its explicit TRACK HISTORY column set
/// triggers TRACK_HISTORY_DRIFT", with history that the two tracked sets fold differently: under
/// `name`, the amount change at seq 2 updated key 1's version in place; re-folded under `amount`
/// it opens a version, and the name change at seq 3 then updates in place. Key 2, which the
/// second run does not touch, is re-folded too.
#[test]
fn scd2_a_changed_tracked_set_refolds_every_key() {
    reconfigured(
        &tracking(r#"track_history_column_list = ["name"]"#),
        &[r#"
        {"id": 1, "name": "a", "amount": 10, "seq": 1}
        {"id": 1, "name": "a", "amount": 20, "seq": 2}
        {"id": 2, "name": "x", "amount": 5, "seq": 1}
        {"id": 2, "name": "x", "amount": 6, "seq": 2}
        "#],
        &[
            &["1", "a", "20", "2", "1", "NULL"],
            &["2", "x", "6", "2", "1", "NULL"],
        ],
        &tracking(r#"track_history_column_list = ["amount"]"#),
        &[r#"{"id": 1, "name": "b", "amount": 20, "seq": 3}"#],
        &[
            &["1", "a", "10", "1", "1", "2"],
            &["1", "b", "20", "3", "2", "NULL"],
            &["2", "x", "5", "1", "1", "2"],
            &["2", "x", "6", "2", "2", "NULL"],
        ],
    );
}

/// Spark: AutoCdcConfigDriftSuite, "an SCD2 flow with no TRACK HISTORY (default = all eligible
/// columns) followed by an explicit subset triggers TRACK_HISTORY_DRIFT". Re-folded under `name`
/// alone, the change at seq 2 (same name) updates the version in place.
#[test]
fn scd2_narrowing_the_default_tracked_set_refolds_the_history() {
    reconfigured(
        &tracking(""),
        &[r#"{"id": 1, "name": "a", "amount": 10, "seq": 1}"#],
        &[&["1", "a", "10", "1", "1", "NULL"]],
        &tracking(r#"track_history_column_list = ["name"]"#),
        &[r#"{"id": 1, "name": "a", "amount": 20, "seq": 2}"#],
        &[&["1", "a", "20", "2", "1", "NULL"]],
    );
}

/// Spark: AutoCdcConfigDriftSuite, "an SCD2 flow that reorders the same TRACK HISTORY columns does
/// NOT trigger drift", "an SCD2 flow with no TRACK HISTORY (default = all eligible columns)
/// followed by an explicit selection of that same set does NOT trigger drift" (the default set
/// includes the kept sequence column `seq`, which may be named) and "an SCD2 flow's EXCEPT-based
/// TRACK HISTORY followed by an equivalent explicit include set does NOT trigger drift". Each
/// second run opens cleanly and its change at seq 2 opens a version.
#[test]
fn scd2_restating_the_tracked_set_changes_nothing() {
    let two_versions: &[&[&str]] = &[
        &["1", "a", "10", "1", "1", "2"],
        &["1", "a", "20", "2", "2", "NULL"],
    ];
    for (v1, v2) in [
        (
            r#"track_history_column_list = ["name", "amount"]"#,
            r#"track_history_column_list = ["amount", "name"]"#,
        ),
        (
            "",
            r#"track_history_column_list = ["name", "amount", "seq"]"#,
        ),
        (
            r#"track_history_except_column_list = ["amount"]"#,
            r#"track_history_column_list = ["name", "seq"]"#,
        ),
    ] {
        reconfigured(
            &tracking(v1),
            &[r#"{"id": 1, "name": "a", "amount": 10, "seq": 1}"#],
            &[&["1", "a", "10", "1", "1", "NULL"]],
            &tracking(v2),
            &[r#"{"id": 1, "name": "a", "amount": 20, "seq": 2}"#],
            two_versions,
        );
    }
}

// ---------------------------------------------------------------------------
// AutoCdcOutOfOrderConvergenceSuite
// ---------------------------------------------------------------------------

struct Xorshift(u64);

impl Xorshift {
    fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    fn chance(&mut self, p: f64) -> bool {
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

/// One generated change: the suite's `SourceRow`.
#[derive(Clone)]
struct Event {
    key: i64,
    name: Option<&'static str>,
    amount: Option<i64>,
    active: Option<bool>,
    sequence: i64,
    delete: bool,
}

/// The suite's generator: 5 keys, 1 to 80 changes each with globally unique
/// sequences, 20% deletes, 15% re-emitted as exact duplicates, each payload
/// column null 25% of the time; sorted by sequence.
fn random_stream(rng: &mut Xorshift) -> Vec<Event> {
    const COLORS: [&str; 4] = ["red", "blue", "green", "yellow"];
    let mut first: i64 = 0;
    let mut out = Vec::new();
    for key in 0..5 {
        let n = 1 + rng.below(80) as i64;
        for sequence in first..first + n {
            let delete = rng.chance(0.20);
            let name = if rng.chance(0.75) {
                Some(COLORS[rng.below(4) as usize])
            } else {
                None
            };
            let amount = if rng.chance(0.75) {
                Some(rng.below(100) as i64)
            } else {
                None
            };
            let active = if rng.chance(0.75) {
                Some(rng.below(2) == 1)
            } else {
                None
            };
            let e = Event {
                key,
                name,
                amount,
                active,
                sequence,
                delete,
            };
            if rng.chance(0.15) {
                out.push(e.clone());
            }
            out.push(e);
        }
        first += n;
    }
    out
}

fn event_json(e: &Event) -> String {
    let or_null = |v: Option<String>| v.unwrap_or_else(|| "null".to_string());
    format!(
        r#"{{"key": {}, "name": {}, "amount": {}, "active": {}, "sequence": {}, "is_delete": {}}}"#,
        e.key,
        or_null(e.name.map(|n| format!("\"{n}\""))),
        or_null(e.amount.map(|a| a.to_string())),
        or_null(e.active.map(|a| a.to_string())),
        e.sequence,
        e.delete
    )
}

/// The expected target, from the definitions: SCD Type 1 keeps each key's
/// latest change unless it is a delete. SCD Type 2 with the sequence kept
/// (and so tracked): every upsert is a version, from its sequence to the
/// key's next change (upsert or delete), open when it is the last.
fn convergence_oracle(events: &[Event], scd2: bool) -> Rows {
    let mut by_key: BTreeMap<i64, BTreeMap<i64, &Event>> = BTreeMap::new();
    for e in events {
        by_key.entry(e.key).or_default().insert(e.sequence, e);
    }
    let text = |v: Option<String>| v.unwrap_or_else(|| "NULL".to_string());
    let mut out = Rows::new();
    for changes in by_key.values() {
        let evs: Vec<&Event> = changes.values().copied().collect();
        for (i, e) in evs.iter().enumerate() {
            if e.delete {
                continue;
            }
            let mut row = vec![
                e.key.to_string(),
                text(e.name.map(|n| n.to_string())),
                text(e.amount.map(|a| a.to_string())),
                text(e.active.map(|a| a.to_string())),
                e.sequence.to_string(),
            ];
            if scd2 {
                row.push(e.sequence.to_string());
                row.push(text(evs.get(i + 1).map(|n| n.sequence.to_string())));
                out.insert(row);
            } else if i + 1 == evs.len() {
                out.insert(row);
            }
        }
    }
    out
}

/// The suite's `runConvergenceTest` for three fixed seeds: the stream sorted
/// as one batch, and shuffled into 8 batches (restarting after each), must
/// both give the expected target.
fn converges(scd_type: u8) {
    let body = format!(
        "stored_as_scd_type = {}\n{}",
        scd_type,
        r#"keys = ["key"]
sequence_by = "sequence"
apply_as_deletes = "is_delete"
except_column_list = ["is_delete"]
columns = [
  { name = "key", type = "int" },
  { name = "name", type = "string" },
  { name = "amount", type = "int" },
  { name = "active", type = "boolean" },
  { name = "sequence", type = "long" },
  { name = "is_delete", type = "boolean" },
]"#
    );
    let flow = flow(&body);
    let rt = rt();
    for seed in 1..=3u64 {
        let mut rng = Xorshift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let events = random_stream(&mut rng);
        let in_order: Vec<String> = events.iter().map(event_json).collect();
        let mut shuffled = in_order.clone();
        for i in (1..shuffled.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            shuffled.swap(i, j);
        }
        let n = shuffled.len();
        let batches: Vec<String> = (0..8)
            .map(|b| shuffled[b * n / 8..(b + 1) * n / 8].join("\n"))
            .collect();
        let batches: Vec<&str> = batches.iter().map(String::as_str).collect();
        let one = in_order.join("\n");
        let want = convergence_oracle(&events, scd_type == 2);
        for (what, bs, restart) in [
            ("sorted, one batch", vec![one.as_str()], false),
            ("shuffled, 8 batches, restarting after each", batches, true),
        ] {
            let tmp = tempfile::tempdir().unwrap();
            let got = rt.block_on(run(tmp.path(), &flow, &bs, restart));
            assert_eq!(got, want, "seed {seed} ({n} changes): {what}");
        }
    }
}

/// Spark: AutoCdcOutOfOrderConvergenceSuite, "SCD1 merge converges across micro-batch shuffling
/// for randomly generated CDC events".
#[test]
fn scd1_random_changes_converge_across_shuffled_batches() {
    converges(1);
}

/// Spark: AutoCdcOutOfOrderConvergenceSuite, "SCD2 merge converges across micro-batch shuffling
/// for randomly generated CDC events".
#[test]
fn scd2_random_changes_converge_across_shuffled_batches() {
    converges(2);
}

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

// ---------------------------------------------------------------------------
// The Databricks AUTO CDC documentation example ("users")
// ---------------------------------------------------------------------------

/// The example's change feed, in the batches of its notebook: the initial
/// load, new users, Isabel removed and Mercedes moved, then two updates
/// arriving out of order.
const USERS_FEED: [&str; 4] = [
    r#"
    {"userId": 124, "name": "Raul", "city": "Oaxaca", "operation": "INSERT", "sequenceNum": 1}
    {"userId": 123, "name": "Isabel", "city": "Monterrey", "operation": "INSERT", "sequenceNum": 1}
    "#,
    r#"
    {"userId": 125, "name": "Mercedes", "city": "Tijuana", "operation": "INSERT", "sequenceNum": 2}
    {"userId": 126, "name": "Lily", "city": "Cancun", "operation": "INSERT", "sequenceNum": 2}
    "#,
    r#"
    {"userId": 123, "name": null, "city": null, "operation": "DELETE", "sequenceNum": 6}
    {"userId": 125, "name": "Mercedes", "city": "Guadalajara", "operation": "UPDATE", "sequenceNum": 6}
    "#,
    r#"
    {"userId": 125, "name": "Mercedes", "city": "Mexicali", "operation": "UPDATE", "sequenceNum": 5}
    {"userId": 123, "name": "Isabel", "city": "Chihuahua", "operation": "UPDATE", "sequenceNum": 5}
    "#,
];

/// The example's truncate (the commented-out last row of its data).
const USERS_TRUNCATE: &str =
    r#"{"userId": null, "name": null, "city": null, "operation": "TRUNCATE", "sequenceNum": 3}"#;

const USERS_COLUMNS: &str = r#"columns = [
  { name = "userId", type = "int" },
  { name = "name", type = "string" },
  { name = "city", type = "string" },
  { name = "operation", type = "string" },
  { name = "sequenceNum", type = "int" },
]"#;

fn users(extra: &str) -> String {
    format!(
        "{}\n{}\n{}",
        r#"keys = ["userId"]
sequence_by = "sequenceNum"
apply_as_deletes = "operation = 'DELETE'"
except_column_list = ["operation", "sequenceNum"]"#,
        extra,
        USERS_COLUMNS
    )
}

/// Databricks docs, "The AUTO CDC APIs: Simplify change data capture" (users example), SCD type 1:
/// the target holds Raul, Mercedes in Guadalajara (the late update at 5 is ignored) and Lily;
/// with the TRUNCATE at sequence 3, only Mercedes.
#[test]
fn databricks_users_example_scd1_with_delete_and_truncate() {
    scenario(
        &users(""),
        &USERS_FEED,
        &[
            &["124", "Raul", "Oaxaca"],
            &["125", "Mercedes", "Guadalajara"],
            &["126", "Lily", "Cancun"],
        ],
    );
    let mut with_truncate = USERS_FEED.to_vec();
    with_truncate.push(USERS_TRUNCATE);
    scenario(
        &users(r#"apply_as_truncates = "operation = 'TRUNCATE'""#),
        &with_truncate,
        &[&["125", "Mercedes", "Guadalajara"]],
    );
}

/// Databricks docs, "The AUTO CDC APIs: Simplify change data capture" (users example), SCD type 2,
/// and "Track history for only specified columns with SCD type 2" (`TRACK HISTORY ON * EXCEPT
/// (city)`: city changes update the current row in place).
#[test]
fn databricks_users_example_scd2_and_tracked_columns() {
    scenario(
        &users("stored_as_scd_type = 2"),
        &USERS_FEED,
        &[
            &["123", "Isabel", "Monterrey", "1", "5"],
            &["123", "Isabel", "Chihuahua", "5", "6"],
            &["124", "Raul", "Oaxaca", "1", "NULL"],
            &["125", "Mercedes", "Tijuana", "2", "5"],
            &["125", "Mercedes", "Mexicali", "5", "6"],
            &["125", "Mercedes", "Guadalajara", "6", "NULL"],
            &["126", "Lily", "Cancun", "2", "NULL"],
        ],
    );
    scenario(
        &users("stored_as_scd_type = 2\ntrack_history_except_column_list = [\"city\"]"),
        &USERS_FEED,
        &[
            &["123", "Isabel", "Chihuahua", "1", "6"],
            &["124", "Raul", "Oaxaca", "1", "NULL"],
            &["125", "Mercedes", "Guadalajara", "2", "NULL"],
            &["126", "Lily", "Cancun", "2", "NULL"],
        ],
    );
}

// ---------------------------------------------------------------------------
// Names: case-insensitive resolution, backtick-quoted identifiers
// ---------------------------------------------------------------------------

/// Spark: Scd1ForeachBatchHandlerSuite / Scd2ForeachBatchHandlerSuite, the
/// case-insensitive resolution tests (Spark's default resolver): keys,
/// sequence and column lists name columns in any case, and so do the
/// input's fields.
#[test]
fn names_resolve_regardless_of_case() {
    for (scd, expected) in [
        ("1", vec![vec!["1", "b"]]),
        (
            "2",
            vec![vec!["1", "a", "1", "2"], vec!["1", "b", "2", "NULL"]],
        ),
    ] {
        let toml = format!(
            r#"
keys = ["ID"]
sequence_by = "Seq"
except_column_list = ["SEQ"]
stored_as_scd_type = {scd}
columns = [
  {{ name = "id", type = "int" }},
  {{ name = "Value", type = "string" }},
  {{ name = "seq", type = "long" }},
]
"#
        );
        let expected: Vec<&[&str]> = expected.iter().map(|r| r.as_slice()).collect();
        scenario(
            &toml,
            &[
                r#"{"Id": 1, "VALUE": "a", "SEQ": 1}"#,
                r#"{"id": 1, "value": "b", "seq": 2}"#,
            ],
            &expected,
        );
    }
}

/// `case_sensitive = true`: exact names only, in the definition and the input.
#[test]
fn case_sensitive_flows_match_names_exactly() {
    let exact = r#"
keys = ["id"]
sequence_by = "seq"
case_sensitive = true
columns = [
  { name = "id", type = "int" },
  { name = "seq", type = "long" },
]
"#;
    let f = flow(exact);
    let e = decode_ndjson(&f, br#"{"ID": 1, "seq": 1}"#, Limits::NONE).unwrap_err();
    assert_eq!(e.code(), codes::BAD_COLUMN, "{e}");
    let e = Flow::new(config(
        "p",
        "spark.t",
        &exact.replace(r#"keys = ["id"]"#, r#"keys = ["ID"]"#),
    ))
    .unwrap_err();
    assert_eq!(e.code(), codes::COLUMNS_NOT_FOUND, "{e}");
}

/// Spark: the special-character key tests of the durability suites: a
/// column whose name holds a dot is named with backticks in keys and lists
/// (unquoted, `a.b` stays MULTIPART_COLUMN_IDENTIFIER) and survives restarts.
#[test]
fn dotted_names_are_quoted_with_backticks() {
    let toml = r#"
keys = ["`order.id`"]
sequence_by = "`event.seq`"
column_list = ["`order.id`", "`order.total`"]
columns = [
  { name = "order.id", type = "long" },
  { name = "order.total", type = "double" },
  { name = "event.seq", type = "long" },
]
"#;
    scenario(
        toml,
        &[
            "{\"order.id\": 1, \"order.total\": 2.5, \"event.seq\": 1}\n{\"order.id\": 2, \"order.total\": 4.5, \"event.seq\": 1}",
            "{\"order.id\": 1, \"order.total\": 3.5, \"event.seq\": 2}",
        ],
        &[&["1", "3.5"], &["2", "4.5"]],
    );
    let e = Flow::new(config(
        "p",
        "spark.t",
        &toml.replace("[\"`order.id`\"]", "[\"order.id\"]"),
    ))
    .unwrap_err();
    assert_eq!(e.code(), codes::MULTIPART_IDENTIFIER, "{e}");
}

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

// ---------------------------------------------------------------------------
// sequence_by as an expression (Spark's `sequence_by` takes any orderable
// column expression: `struct(ts, lsn)`, `coalesce(lsn, 0)`, `ts * 1000 + n`)
// ---------------------------------------------------------------------------

/// `(id, v, ts, lsn, n)` sequenced by `seq`, SCD Type `scd`.
fn expression_flow(seq: &str, scd: u8) -> String {
    format!(
        "keys = [\"id\"]\nsequence_by = {seq}\nstored_as_scd_type = {scd}\n{}",
        r#"columns = [
  { name = "id", type = "int" },
  { name = "v", type = "string" },
  { name = "ts", type = "long" },
  { name = "lsn", type = "long" },
  { name = "n", type = "int" },
]"#
    )
}

/// `struct(ts, lsn)` orders by `ts`, then `lsn`: the table is the one
/// `sequence_by = ["ts", "lsn"]` gives, for SCD Type 1 and 2 (whose
/// `__START_AT` / `__END_AT` are then structs of the two).
#[test]
fn a_struct_sequence_orders_by_its_fields_in_turn() {
    let batches = [
        r#"
        {"id": 1, "v": "a", "ts": 1, "lsn": 5}
        {"id": 1, "v": "b", "ts": 1, "lsn": 7}
        "#,
        r#"
        {"id": 1, "v": "late", "ts": 1, "lsn": 6}
        {"id": 2, "v": "x", "ts": 2, "lsn": 0}
        {"id": 2, "v": "y", "ts": 1, "lsn": 9}
        "#,
    ];
    scenario(
        &expression_flow("\"struct(ts, lsn)\"", 1),
        &batches,
        &[&["1", "b", "1", "7", "NULL"], &["2", "x", "2", "0", "NULL"]],
    );
    let rt = rt();
    for scd in [1, 2] {
        let by_struct = flow(&expression_flow("\"STRUCT(ts, `lsn`)\"", scd));
        let by_list = flow(&expression_flow("[\"ts\", \"lsn\"]", scd));
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let got = rt.block_on(run(a.path(), &by_struct, &batches, true));
        let want = rt.block_on(run(b.path(), &by_list, &batches, false));
        assert_eq!(got, want, "SCD Type {scd}");
        assert_eq!(got.len(), if scd == 1 { 2 } else { 5 }, "{got:?}");
    }
}

/// `coalesce(lsn, 0)`: a change without an `lsn` is sequenced 0, so any
/// change with one wins over it, in every order and batching.
#[test]
fn a_coalesce_sequence_puts_changes_without_a_value_first() {
    scenario(
        &expression_flow("\"coalesce(lsn, 0)\"", 1),
        &[
            r#"
            {"id": 1, "v": "unsequenced"}
            {"id": 2, "v": "unsequenced"}
            "#,
            r#"
            {"id": 1, "v": "sequenced", "lsn": 1}
            {"id": 2, "v": "negative", "lsn": -1}
            {"id": 3, "v": "only", "lsn": null}
            "#,
        ],
        &[
            &["1", "sequenced", "NULL", "1", "NULL"],
            &["2", "unsequenced", "NULL", "NULL", "NULL"],
            &["3", "only", "NULL", "NULL", "NULL"],
        ],
    );
}

/// `ts * 1000 + n` as an SCD Type 2 sequence: `__START_AT` / `__END_AT`
/// hold the computed values (a long, as `ts` is).
#[test]
fn an_arithmetic_sequence_bounds_scd2_versions() {
    scenario(
        &expression_flow("\"ts * 1000 + n\"", 2),
        &[
            r#"{"id": 1, "v": "a", "ts": 1, "n": 2}"#,
            r#"
            {"id": 1, "v": "c", "ts": 2, "n": 5}
            {"id": 1, "v": "b", "ts": 1, "n": 999}
            "#,
        ],
        &[
            &["1", "a", "1", "NULL", "2", "1002", "1999"],
            &["1", "b", "1", "NULL", "999", "1999", "2005"],
            &["1", "c", "2", "NULL", "5", "2005", "NULL"],
        ],
    );
}

/// An expression that is null for a row (here `n` is missing) is a null
/// sequence: the batch is refused whole with NULL_SEQUENCE, naming the
/// expression; one that cannot be computed (an overflow) is refused when
/// the batch is read, naming its row.
#[test]
fn a_null_or_failing_sequence_expression_refuses_the_batch() {
    let toml = expression_flow("\"ts * 1000 + n\"", 1);
    rejects(
        &toml,
        &[r#"{"id": 1, "v": "kept", "ts": 1, "n": 0}"#],
        r#"
        {"id": 2, "v": "fine", "ts": 5, "n": 0}
        {"id": 1, "v": "no n", "ts": 9}
        "#,
        codes::NULL_SEQUENCE,
        &[&["1", "kept", "1", "NULL", "0"]],
    );
    let f = flow(&toml);
    let b = decode(&f, r#"{"id": 1, "ts": 1}"#);
    let e = autocdc::core::resolve::validate(&f, &b).unwrap_err();
    assert!(e.to_string().contains("ts * 1000 + n"), "{e}");
    let overflow = format!(
        "{}\n{}",
        r#"{"id": 1, "ts": 1, "n": 0}"#, r#"{"id": 2, "ts": 9223372036854776, "n": 0}"#
    );
    let e = decode_ndjson(&f, overflow.as_bytes(), Limits::NONE).unwrap_err();
    assert_eq!(e.code(), codes::SEQUENCE_EXPRESSION, "{e}");
    match &e {
        autocdc::error::Error::Batch { row, column, .. } => {
            assert_eq!((*row, column.as_str()), (1, "ts * 1000 + n"), "{e}")
        }
        other => panic!("{other}"),
    }
}

/// An expression is typed when the flow is defined: one that yields no
/// order, uses an unknown function, mixes text and numbers or names no
/// column is refused with the usual codes, before any change is read.
#[test]
fn a_sequence_expression_is_checked_when_the_flow_is_defined() {
    for (seq, code) in [
        ("cast(n AS boolean)", codes::NON_ORDERABLE_SEQUENCE),
        ("upper(v)", codes::EXPRESSION_UNSUPPORTED),
        ("ts + v", codes::EXPRESSION_TYPE),
        ("42", codes::EXPRESSION_TYPE),
        ("missing + 1", codes::COLUMNS_NOT_FOUND),
        ("changes.ts", codes::MULTIPART_IDENTIFIER),
        ("ts +", codes::EXPRESSION_PARSE),
    ] {
        let toml = expression_flow(&format!("\"{seq}\""), 1);
        match Flow::new(config("spark_parity", "spark.target", &toml)) {
            Ok(_) => panic!("`{seq}` was accepted"),
            Err(e) => assert_eq!(e.code(), code, "{seq}: {e}"),
        }
    }
}

/// Spark: AutoCdcConfigDriftSuite, a changed sequencing expression of the same type is no drift:
/// the new expression orders the changes that follow against the stored sequences. A changed
/// type still is (`lsn / 2` is a double).
#[test]
fn a_new_sequence_expression_of_the_same_type_is_no_drift() {
    reconfigured(
        &expression_flow("\"coalesce(lsn, 0)\"", 1),
        &[r#"{"id": 1, "v": "a", "ts": 5, "lsn": 3}"#],
        &[&["1", "a", "5", "3", "NULL"]],
        &expression_flow("\"coalesce(lsn, ts)\"", 1),
        &[
            r#"
            {"id": 1, "v": "older", "ts": 2}
            {"id": 2, "v": "b", "ts": 7}
            "#,
            r#"{"id": 1, "v": "newer", "ts": 4, "lsn": 4}"#,
        ],
        &[
            &["1", "newer", "4", "4", "NULL"],
            &["2", "b", "7", "NULL", "NULL"],
        ],
    );
    refused_on_change(
        &expression_flow("\"coalesce(lsn, 0)\"", 1),
        &[r#"{"id": 1, "v": "a", "lsn": 3}"#],
        &expression_flow("\"lsn / 2\"", 1),
        r#"{"id": 1, "v": "b", "lsn": 8}"#,
        codes::SEQUENCING_TYPE_DRIFT,
    );
}

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
