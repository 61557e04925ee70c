//! The `autocdc` command line: apply, gen, demo, show, state, maintain,
//! refresh, log, serve, push and the benches. Library errors become messages and
//! exit codes here and nowhere else. This file dispatches; the commands live
//! in `apply` (change files into a flow's target), `inspect` (show, state,
//! maintain, refresh), `log` (a NATS stream its target does not know),
//! `demo` (`demo` and `gen`), with what they share in
//! `setup`; `args` is the clap definition.

use std::path::Path;
use std::sync::Arc;

use crate::config::Config;
use crate::error::Result;
use crate::fault::Faults;

mod apply;
mod args;
mod demo;
mod inspect;
mod log;
mod setup;

pub use crate::service::now_ms;
pub use args::{Cli, Command, GenFeed, LogAction};
pub use log::log;

use apply::{apply_files, apply_snapshot};
use demo::{demo, gen_ghost_kitchen};
use inspect::{maintain, refresh, show, state};
use setup::load_config;

pub async fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Apply {
            config,
            flow,
            batch_rows,
            snapshot_version,
            files,
        } => {
            let config = load_config(&config)?;
            let flow = config.flow(&flow)?;
            match snapshot_version {
                Some(v) => apply_snapshot(&config.catalog, flow, &files, v).await,
                None => apply_files(&config.catalog, flow, &files, batch_rows).await,
            }
        }
        Command::Gen {
            feed:
                GenFeed::GhostKitchen {
                    orders,
                    seed,
                    files,
                    out,
                    format,
                    no_null_keys,
                },
        } => gen_ghost_kitchen(orders, seed, files, &out, &format, no_null_keys),
        Command::Demo {
            warehouse,
            orders,
            batches,
            seed,
        } => demo(&warehouse, orders, batches, seed).await,
        Command::Show {
            config,
            warehouse,
            table,
            limit,
        } => show(&config, warehouse, &table, limit).await,
        Command::State { config, table } => state(&config, &table).await,
        Command::Refresh {
            config,
            full,
            history,
            flow,
        } => refresh(&config, full, history, &flow).await,
        Command::Maintain {
            config,
            flow,
            dry_run,
            orphans_older_than,
            no_compact,
            json,
        } => {
            maintain(
                &config,
                flow.as_deref(),
                dry_run,
                orphans_older_than,
                !no_compact,
                json,
            )
            .await
        }
        Command::Log {
            config,
            flow,
            action,
        } => log::run(&config, &flow, action).await,
        Command::Bench(args) => crate::tools::bench::run(args).await,
        Command::BenchServe(args) => crate::tools::loadgen::run(args).await,
        Command::BenchLong(args) => crate::tools::bench_long::run(args).await,
        Command::Soak(args) => crate::tools::soak::run(args).await,
        Command::Serve { config, listen } => {
            let mut cfg = match config {
                Some(p) => load_config(&p)?,
                None if Path::new("autocdc.toml").exists() => {
                    load_config(Path::new("autocdc.toml"))?
                }
                None => Config::default(),
            };
            if let Some(l) = listen {
                cfg.server.listen = l;
            }
            crate::service::run::serve(cfg, Arc::new(Faults::default())).await
        }
        Command::Push {
            url,
            flow,
            token,
            batch_rows,
            wait_commit,
            max_attempts,
            files,
        } => {
            let args = crate::tools::push::PushArgs {
                url,
                flow,
                files,
                token: token.or_else(|| std::env::var("AUTOCDC_TOKEN").ok()),
                batch_rows,
                wait_commit,
                max_attempts,
            };
            let (batches, rows) = crate::tools::push::push(&args).await?;
            println!(
                "pushed {rows} rows in {batches} batches to flow `{}`",
                args.flow
            );
            Ok(())
        }
    }
}
