//! Looking at and looking after a flow's tables: `autocdc show` (rows
//! through a real Iceberg scan), `state` (the key state's summary),
//! `maintain` (a maintenance run and its report) and `refresh` (drop the
//! target, or rewrite it from the state).

use std::path::Path;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_cast::display::{ArrayFormatter, FormatOptions};

use super::now_ms;
use super::setup::{load_config, open_catalog};
use crate::config::CatalogConfig;
use crate::core::flow::parse_table_ident;
use crate::error::{Error, Result};
use crate::fault::Faults;
use crate::table::engine::Engine;
use crate::table::read;
use crate::tools::measure::human_bytes;

/// `autocdc show`: a table's rows through a real Iceberg scan.
pub(super) async fn show(
    config: &Path,
    warehouse: Option<String>,
    table: &str,
    limit: usize,
) -> Result<()> {
    let catalog = match warehouse {
        Some(warehouse) => open_catalog(&CatalogConfig::Hadoop {
            warehouse,
            s3: None,
        })?,
        None => open_catalog(&load_config(config)?.catalog)?,
    };
    let ident = parse_table_ident("show", table)?;
    let Some(t) = catalog.load_table(&ident).await? else {
        return Err(Error::Config(format!(
            "table {table} does not exist in the catalog"
        )));
    };
    let batches = read::scan(catalog.as_ref(), &t).await?;
    let total: usize = batches.iter().map(|b| b.num_rows()).sum();
    print_rows(&batches, limit)?;
    println!(
        "({total} rows; snapshot {:?}; schema {}; partition spec {})",
        t.metadata.current_snapshot_id(),
        t.metadata.current_schema_id(),
        t.metadata.default_partition_spec_id()
    );
    Ok(())
}

fn print_rows(batches: &[RecordBatch], limit: usize) -> Result<()> {
    let Some(first) = batches.first() else {
        println!("(empty)");
        return Ok(());
    };
    let names: Vec<&str> = first
        .schema_ref()
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .collect();
    println!("{}", names.join("\t"));
    let opts = FormatOptions::default().with_null("NULL");
    let mut shown = 0;
    for b in batches {
        let fmts = b
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &opts))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        for r in 0..b.num_rows() {
            if shown == limit {
                return Ok(());
            }
            println!(
                "{}",
                fmts.iter()
                    .map(|f| f.value(r).to_string())
                    .collect::<Vec<_>>()
                    .join("\t")
            );
            shown += 1;
        }
    }
    Ok(())
}

/// `autocdc state`: the key state of the flow that writes `table`.
pub(super) async fn state(config: &Path, table: &str) -> Result<()> {
    let config = load_config(config)?;
    let flow = config
        .flows()?
        .into_iter()
        .find(|f| f.name == table || f.config.target == table)
        .ok_or_else(|| Error::Config(format!("no flow writes `{table}` in the configuration")))?;
    let catalog = open_catalog(&config.catalog)?;
    if catalog.load_table(&flow.target).await?.is_none() {
        return Err(Error::Config(format!(
            "table {} does not exist yet; apply changes first",
            flow.target
        )));
    }
    let engine = Engine::open(flow, catalog, Arc::new(Faults::default())).await?;
    println!("{}", serde_json::to_string_pretty(&engine.summary())?);
    Ok(())
}

/// `autocdc maintain`: one maintenance run per flow, its report printed.
pub(super) async fn maintain(
    config: &Path,
    only: Option<&str>,
    dry_run: bool,
    orphans: Option<String>,
    compact: bool,
    json: bool,
) -> Result<()> {
    let config = load_config(config)?;
    let flows = match only {
        Some(name) => vec![config.flow(name)?],
        None => config.flows()?,
    };
    let orphans_older_than = match orphans {
        Some(text) => crate::config::parse_orphan_window("--orphans-older-than", &text)?,
        None => config.maintenance.schedule()?.orphans_older_than,
    };
    let catalog = open_catalog(&config.catalog)?;
    for flow in flows {
        if catalog.load_table(&flow.target).await?.is_none() {
            println!(
                "{}: table {} does not exist yet; nothing to maintain",
                flow.name, flow.target
            );
            continue;
        }
        let mut engine = Engine::open(flow, catalog.clone(), Arc::new(Faults::default())).await?;
        let report = engine
            .maintain(&crate::table::engine::MaintainOptions {
                now_ms: now_ms(),
                dry_run,
                orphans_older_than,
                compact,
            })
            .await?;
        if json {
            println!("{}", serde_json::to_string(&report)?);
        } else {
            print_maintenance(&report);
        }
    }
    Ok(())
}

fn print_maintenance(r: &crate::table::engine::MaintenanceReport) {
    let verb = if r.dry_run { "would delete" } else { "deleted" };
    println!(
        "{}{} ({:.0} ms)",
        r.flow,
        if r.dry_run {
            " (dry run: nothing changed)"
        } else {
            ""
        },
        r.elapsed_ms
    );
    if let Some(c) = &r.compaction {
        match &c.skipped {
            Some(why) => println!("  compaction: {why}"),
            None => println!(
                "  compaction: {} data files rewritten into {}, {} fully deleted dropped, {} delete files removed ({} equality), {} written; {} rows moved, {} deleted rows gone; read {}, wrote {}{} ({:.0} ms)",
                c.data_files_rewritten,
                c.data_files_written,
                c.data_files_dropped,
                c.delete_files_removed,
                c.equality_delete_files_removed,
                c.delete_files_written,
                c.rows_moved,
                c.rows_dropped,
                human_bytes(c.bytes_read),
                human_bytes(c.bytes_written),
                if c.state_files_rewritten > 0 {
                    format!("; state table: {} files into 1", c.state_files_rewritten)
                } else {
                    String::new()
                },
                c.elapsed_ms
            ),
        }
    }
    for (t, s) in [(&r.target, &r.target_stats), (&r.state, &r.state_stats)] {
        println!(
            "  {}: {} snapshots expired, {} kept; {verb} {} manifest lists, {} manifests, {} data files, {} delete files, {} orphans, {} ({} bytes){}",
            t.table,
            t.snapshots_expired,
            t.snapshots_kept,
            t.manifest_lists_deleted,
            t.manifests_deleted,
            t.data_files_deleted,
            t.delete_files_deleted,
            t.orphans_deleted,
            human_bytes(t.bytes_deleted),
            t.bytes_deleted,
            if t.resumed_files_deleted > 0 {
                format!(
                    "; finished an earlier run's cleanup ({} files)",
                    t.resumed_files_deleted
                )
            } else {
                String::new()
            }
        );
        println!(
            "    now: {} snapshots, {} manifests, {} data files, {} delete files, metadata.json {}, table {}",
            s.snapshots,
            s.manifests,
            s.data_files,
            s.delete_files,
            human_bytes(s.metadata_bytes),
            human_bytes(s.table_bytes)
        );
        for n in &t.notes {
            println!("    note: {n}");
        }
    }
}

/// `autocdc refresh --full`: drops the target and its state;
/// `autocdc refresh --history`: rewrites the target from the state.
pub(super) async fn refresh(config: &Path, full: bool, history: bool, flow: &str) -> Result<()> {
    if !full && !history {
        return Err(Error::Config(
            "say which refresh: `--full` drops the target and its state (the next apply rebuilds both from its input); `--history` rewrites the target from the state of an SCD Type 2 or ignore_null_updates flow".into(),
        ));
    }
    let config = load_config(config)?;
    let flow = config.flow(flow)?;
    let catalog = open_catalog(&config.catalog)?;
    if history {
        let mut engine = Engine::open(flow.clone(), catalog, Arc::new(Faults::default())).await?;
        let r = engine.rebuild(now_ms()).await?;
        println!(
            "rewrote {} from its state: {} rows in {} data files (snapshot {})",
            flow.target,
            r.rows_written,
            r.data_files,
            r.snapshot_id.map_or("none".into(), |s| s.to_string())
        );
        return Ok(());
    }
    let t = catalog.drop_table(&flow.target).await?;
    let s = catalog.drop_table(&flow.state_ident()).await?;
    println!(
        "dropped {} ({}) and {} ({}); the next apply rebuilds both from the input it is given",
        flow.target,
        if t { "existed" } else { "absent" },
        flow.state_ident(),
        if s { "existed" } else { "absent" }
    );
    let sharing: Vec<String> = config
        .flows()?
        .into_iter()
        .filter(|o| o.name != flow.name && o.target == flow.target)
        .map(|o| format!("`{}`", o.name))
        .collect();
    if !sharing.is_empty() {
        println!(
            "{} shared the target: their rows went with it; give the next applies their input too",
            sharing.join(", ")
        );
    }
    if matches!(config.ingest, crate::config::IngestConfig::Nats(_)) {
        println!(
            "the flow's NATS stream keeps what it holds: while it holds messages, `serve` does not open the flow on the new target until `autocdc log --flow {0} adopt` (apply them to it) or `reset` (drop them)",
            flow.name
        );
    }
    Ok(())
}
