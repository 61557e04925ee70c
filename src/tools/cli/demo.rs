//! `autocdc demo` (a day of ghost-kitchen orders through the whole path,
//! the table checked against a naive recomputation) and `autocdc gen
//! ghost-kitchen` (the same feed as files, with its flow definition).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use arrow_array::RecordBatch;
use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;

use super::now_ms;
use super::setup::{open_catalog, progress, stats_line};
use crate::config::Config;
use crate::core::flow::Flow;
use crate::core::resolve::BatchStats;
use crate::error::{Error, Result, codes};
use crate::fault::Faults;
use crate::service::input;
use crate::table::engine::Engine;
use crate::tools::generate::{self as gk, GhostKitchen};

/// `autocdc demo`: a day of ghost-kitchen orders through the whole path.
pub(super) async fn demo(warehouse: &str, orders: usize, batches: usize, seed: u64) -> Result<()> {
    let config = Config::from_toml(&format!(
        "[catalog]\ntype = \"hadoop\"\nwarehouse = \"{}\"\n\n{}",
        warehouse.replace('\\', "\\\\").replace('"', "\\\""),
        gk::ghost_kitchen_flow_toml("ghost_kitchen", "demo.orders")
    ))?;
    let flow = config.flow("ghost_kitchen")?;
    let catalog = open_catalog(&config.catalog)?;
    if catalog.drop_table(&flow.target).await? | catalog.drop_table(&flow.state_ident()).await? {
        println!("removed the previous demo's {} and its state", flow.target);
    }
    let t = Instant::now();
    let (feed, stats) = gk::generate(&GhostKitchen {
        orders,
        seed,
        files: batches,
        ..Default::default()
    });
    println!(
        "generated {} in {:.2} s",
        describe(&stats),
        t.elapsed().as_secs_f64()
    );
    let mut engine =
        Engine::open(flow.clone(), catalog.clone(), Arc::new(Faults::default())).await?;
    let key = flow.key_idx[0];
    let pb = progress(feed.len() as u64, "batches");
    let mut total = BatchStats::default();
    let mut null_keys = 0usize;
    let mut applied: Vec<RecordBatch> = Vec::new();
    let started = Instant::now();
    for raw in &feed {
        let b = input::conform(&flow, raw)?;
        let keep = arrow_arith::boolean::is_not_null(b.column(key))?;
        null_keys += keep.len() - keep.true_count();
        let b = arrow_select::filter::filter_record_batch(&b, &keep)?;
        let r = engine.apply(&b, now_ms()).await?;
        total.add(&r.stats);
        applied.push(b);
        pb.inc(1);
        if applied.len() == feed.len() / 2 {
            let midday = status_counts(&engine.scan_target().await?)?;
            pb.suspend(|| {
                println!(
                    "live orders by status after {} of {} micro-batches:",
                    applied.len(),
                    feed.len()
                );
                for (s, n) in &midday {
                    println!("  {s:<18} {n}");
                }
            });
        }
    }
    pb.finish_and_clear();
    let secs = started.elapsed().as_secs_f64();
    println!(
        "applied {} micro-batches in {:.2} s ({:.0} events/s): {}; {} null-key events filtered before apply",
        feed.len(),
        secs,
        total.rows_in as f64 / secs.max(1e-9),
        stats_line(&total),
        null_keys
    );

    let rows = engine.scan_target().await?;
    let by_status = status_counts(&rows)?;
    let table = order_seqs(&rows)?;
    println!("live orders by status at the end of the day:");
    for (s, n) in &by_status {
        println!("  {s:<18} {n}");
    }
    let s = engine.summary();
    println!(
        "cancelled orders removed: {} deletes applied, {} tombstones kept in the state ({} keys, {:.1} bytes/key)",
        total.deletes, s.tombstones, s.keys, s.bytes_per_key
    );

    let naive = naive_recomputation(&flow, &applied)?;
    let matches = naive == table;
    println!(
        "naive recomputation (latest per order, cancelled dropped): {} rows; Iceberg table: {} rows; match as sets: {}",
        naive.len(),
        table.len(),
        if matches { "yes" } else { "NO" }
    );
    println!(
        "table: {}/demo/orders (read it with `autocdc show --warehouse {} demo.orders`, DuckDB or PyIceberg)",
        warehouse.trim_end_matches('/'),
        warehouse
    );
    if !matches {
        return Err(Error::State {
            code: codes::DEMO_MISMATCH,
            message: "the table differs from the naive recomputation".into(),
        });
    }
    Ok(())
}

fn status_counts(rows: &[RecordBatch]) -> Result<BTreeMap<String, usize>> {
    let mut out = BTreeMap::new();
    for b in rows {
        let status = b
            .column_by_name("status")
            .ok_or_else(|| Error::Config("the demo table lacks a status column".into()))?
            .as_string::<i32>();
        for r in 0..b.num_rows() {
            *out.entry(status.value(r).to_string()).or_default() += 1;
        }
    }
    Ok(out)
}

/// (order_id, seq) of every row of the demo table.
fn order_seqs(rows: &[RecordBatch]) -> Result<HashSet<(i64, i64)>> {
    let mut table: HashSet<(i64, i64)> = HashSet::new();
    for b in rows {
        let ids = b
            .column_by_name("order_id")
            .map(|c| c.as_primitive::<Int64Type>().clone());
        let seqs = b
            .column_by_name("seq")
            .map(|c| c.as_primitive::<Int64Type>().clone());
        let (Some(ids), Some(seqs)) = (ids, seqs) else {
            return Err(Error::Config("the demo table lacks order_id or seq".into()));
        };
        for r in 0..b.num_rows() {
            table.insert((ids.value(r), seqs.value(r)));
        }
    }
    Ok(table)
}

/// The demo's oracle: per order the latest event by seq, cancelled orders
/// dropped, as (order_id, seq).
fn naive_recomputation(flow: &Flow, applied: &[RecordBatch]) -> Result<HashSet<(i64, i64)>> {
    let mut latest: HashMap<i64, (i64, bool)> = HashMap::new();
    for b in applied {
        let ids = b.column(flow.key_idx[0]).as_primitive::<Int64Type>();
        let seqs = b
            .column_by_name("seq")
            .map(|c| c.as_primitive::<Int64Type>().clone());
        let ops = b.column_by_name("op").map(|c| c.as_string::<i32>().clone());
        let (Some(seqs), Some(ops)) = (seqs, ops) else {
            return Err(Error::Config("the demo feed lacks seq or op".into()));
        };
        for r in 0..b.num_rows() {
            let e = latest.entry(ids.value(r)).or_insert((i64::MIN, false));
            if seqs.value(r) > e.0 {
                *e = (seqs.value(r), ops.value(r) == "DELETE");
            }
        }
    }
    Ok(latest
        .into_iter()
        .filter(|(_, (_, del))| !del)
        .map(|(k, (s, _))| (k, s))
        .collect())
}

/// `autocdc gen ghost-kitchen`: the synthetic feed as files, with its flow definition.
pub(super) fn gen_ghost_kitchen(
    orders: usize,
    seed: u64,
    files: usize,
    out: &Path,
    format: &str,
    no_null_keys: bool,
) -> Result<()> {
    let cfg = GhostKitchen {
        orders,
        seed,
        files,
        null_keys: !no_null_keys,
        ..Default::default()
    };
    let (batches, stats) = gk::generate(&cfg);
    let paths = match format {
        "parquet" => gk::write_parquet(out, &batches),
        "ndjson" => gk::write_ndjson(out, &batches),
        other => {
            return Err(Error::Config(format!(
                "--format {other}: use parquet or ndjson"
            )));
        }
    }
    .map_err(|e| Error::Config(format!("writing {}: {e}", out.display())))?;
    let flow_file = out.join("flow.toml");
    std::fs::write(
        &flow_file,
        gk::ghost_kitchen_flow_toml("ghost_kitchen", "kitchen.orders"),
    )?;
    println!(
        "wrote {} files ({}) to {}",
        paths.len(),
        describe(&stats),
        out.display()
    );
    println!("flow definition: {}", flow_file.display());
    Ok(())
}

fn describe(s: &gk::GenStats) -> String {
    format!(
        "{} events for {} orders: {} cancelled, {} late, {} duplicates, {} with a null order_id",
        s.events, s.orders, s.cancelled_orders, s.late_events, s.duplicates, s.null_key_events
    )
}
