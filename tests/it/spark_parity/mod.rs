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

mod drift_and_order;
mod durability;
mod examples_and_names;
mod nested;
mod pipelines;
mod reconciliation;
mod scd1_batches;
mod scd2_batches;
mod schema_evolution;
mod sequence_expressions;

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
