//! `autocdc log`: a flow's NATS stream that holds messages its target has
//! no record of, which `serve` refuses to open the flow on
//! (`AUTOCDC_INVALID_STATE.FOREIGN_LOG`): shown, adopted into the target,
//! or reset.

use std::path::Path;
use std::sync::Arc;

use super::LogAction;
use super::setup::{load_config, open_catalog};
use crate::config::{Config, IngestConfig};
use crate::core::flow::Flow;
use crate::core::offsets::LogRef;
use crate::error::{Error, Result};
use crate::fault::Faults;
use crate::service::definitions::Definitions;
use crate::service::nats_log::NatsLogs;
use crate::table::engine::Engine;

pub(super) async fn run(config: &Path, flow: &str, action: Option<LogAction>) -> Result<()> {
    let config = load_config(config)?;
    for line in log(&config, flow, action).await? {
        println!("{line}");
    }
    Ok(())
}

/// `autocdc log` with a configuration: what it found and did, a line each.
pub async fn log(config: &Config, flow: &str, action: Option<LogAction>) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let IngestConfig::Nats(nats) = &config.ingest else {
        return Err(Error::Config(
            "`autocdc log` looks after a flow's NATS stream: the configuration's [ingest] is not type = \"nats\" (a local log lives beside its flow and is never another table's)".into(),
        ));
    };
    let logs = NatsLogs::connect(nats, config.server.idempotency_window()?).await?;
    let flow = find_flow(config, &logs, flow).await?;
    let name = logs.stream_name(&flow.name);
    let Some(held) = logs.holding(&flow.name).await? else {
        out.push(format!(
            "flow `{}` has no stream `{name}` yet: it is made when the flow opens",
            flow.name
        ));
        return Ok(out);
    };
    let catalog = open_catalog(&config.catalog)?;
    let recorded = Engine::recorded_logs(&flow, catalog.as_ref()).await?;
    let known = recorded.contains(&held.id);
    out.push(format!(
        "stream `{name}` ({}): {} messages, sequences {}..={}; the target {} {}",
        held.id,
        held.messages,
        held.first,
        held.last,
        flow.target,
        if known {
            "knows this stream"
        } else {
            "has no record of this stream"
        }
    ));
    match action {
        None => {}
        Some(LogAction::Adopt) => {
            let log = LogRef {
                id: held.id.clone(),
                retention_ms: config.server.log_offsets_retention()?.as_millis() as i64,
                adopt: true,
            };
            // Opening for the log creates the target if missing and records
            // the log as adopted (nothing is committed from it here).
            Engine::open_for_log(
                flow.clone(),
                catalog,
                Arc::new(Faults::default()),
                Some(log),
            )
            .await?;
            out.push(format!(
                "adopted: {} takes the stream's messages after its committed offset when flow `{}` opens",
                flow.target, flow.name
            ));
        }
        Some(LogAction::Reset) => {
            let purged = logs.purge(&flow.name).await?;
            out.push(format!(
                "reset: dropped {purged} messages of `{name}`; its sequences go on from {}",
                held.last + 1
            ));
        }
    }
    Ok(out)
}

/// The flow named `name`: from the configuration, else as defined over
/// HTTP (kept on NATS).
async fn find_flow(config: &Config, logs: &NatsLogs, name: &str) -> Result<Flow> {
    if let Ok(f) = config.flow(name) {
        return Ok(f);
    }
    let loaded = logs.definitions().await?.load().await?;
    match loaded.flows.into_iter().find(|(c, _)| c.name == name) {
        Some((cfg, _)) => Flow::new(cfg),
        None => config.flow(name),
    }
}
