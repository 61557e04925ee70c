//! Committed offsets per ingest log, kept in the target's snapshot summary
//! as `autocdc.input-offsets`: `{"<log id>": {"offset": N, "ms": T}}`.
//!
//! Several logs can feed one flow (two `serve` instances in a rolling
//! deploy's overlap, a double start, replicas behind one load balancer):
//! each log replays, checks "already applied" and releases by its own
//! entry only, so one instance's commits never move another's offset.
//!
//! Pure: no I/O, no clock (commit time is a parameter).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result, codes};

pub const PROP_INPUT_OFFSETS: &str = "autocdc.input-offsets";

/// One log's committed offset and when it was last committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogMark {
    pub offset: i64,
    pub ms: i64,
}

pub type Offsets = BTreeMap<String, LogMark>;

/// The ingest log an engine commits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRef {
    /// The log's identity (a UUID made when the log was created).
    pub id: String,
    /// Entries of other logs not committed for this long are dropped.
    pub retention_ms: i64,
    /// Recorded in the target as adopted when the target does not know it
    /// (`LogFactory::adopts`): a broker's log.
    pub adopt: bool,
}

/// The target's table property naming the logs it has taken as its own
/// before committing from them: a JSON list of log identities.
pub const PROP_ADOPTED_LOGS: &str = "autocdc.adopted-logs";

/// Adopted logs kept (the oldest go first; a log committed from is in the
/// offsets as well).
pub const MAX_ADOPTED_LOGS: usize = 16;

/// The logs a target's property says it adopted (none when absent or
/// unreadable: then the log is adopted again).
pub fn adopted(json: Option<&String>) -> Vec<String> {
    json.and_then(|j| serde_json::from_str(j).ok())
        .unwrap_or_default()
}

/// The property's value with `id` adopted as well (`None`: it is already).
pub fn adopt(json: Option<&String>, id: &str) -> Option<String> {
    let mut logs = adopted(json);
    if logs.iter().any(|l| l == id) {
        return None;
    }
    logs.push(id.to_string());
    let over = logs.len().saturating_sub(MAX_ADOPTED_LOGS);
    logs.drain(..over);
    Some(serde_json::to_string(&logs).expect("a list of strings is JSON"))
}

/// The map in a summary (empty when the summary has none).
pub fn parse(json: Option<&String>) -> Result<Offsets> {
    match json {
        None => Ok(Offsets::new()),
        Some(text) => serde_json::from_str(text).map_err(|e| Error::State {
            code: codes::INPUT_OFFSETS,
            message: format!("the target's {PROP_INPUT_OFFSETS} `{text}` is not readable: {e}"),
        }),
    }
}

/// The committed offset of `log`. A summary written before per-log offsets
/// (only the single `autocdc.input-offset`) is read as the offset of the
/// log that reads it: one instance wrote it, and that is the upgrade path.
/// Without a log (`autocdc apply`), the single offset is used.
pub fn offset_for(offsets: &Offsets, single: Option<i64>, log: Option<&LogRef>) -> i64 {
    match log {
        None => single.unwrap_or(0),
        Some(l) => match offsets.get(&l.id) {
            Some(m) => m.offset,
            None if offsets.is_empty() => single.unwrap_or(0),
            None => 0,
        },
    }
}

/// The map a commit by `log` through `offset` at `now_ms` records: its own
/// entry set, other logs' entries kept unless older than the retention.
pub fn record(offsets: &Offsets, log: &LogRef, offset: i64, now_ms: i64) -> Offsets {
    let mut out: Offsets = offsets
        .iter()
        .filter(|(id, m)| **id != log.id && now_ms.saturating_sub(m.ms) <= log.retention_ms)
        .map(|(id, m)| (id.clone(), *m))
        .collect();
    out.insert(log.id.clone(), LogMark { offset, ms: now_ms });
    out
}

pub fn to_json(offsets: &Offsets) -> Result<String> {
    Ok(serde_json::to_string(offsets)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(id: &str) -> LogRef {
        LogRef {
            id: id.into(),
            retention_ms: 1000,
            adopt: false,
        }
    }

    #[test]
    fn adopting_adds_a_log_once_and_keeps_the_newest() {
        let one = adopt(None, "a").unwrap();
        assert_eq!(adopted(Some(&one)), vec!["a".to_string()]);
        assert_eq!(adopt(Some(&one), "a"), None);
        let mut json = one;
        for i in 0..MAX_ADOPTED_LOGS + 3 {
            json = adopt(Some(&json), &format!("l{i}")).unwrap();
        }
        let logs = adopted(Some(&json));
        assert_eq!(logs.len(), MAX_ADOPTED_LOGS);
        assert_eq!(logs.last().unwrap(), &format!("l{}", MAX_ADOPTED_LOGS + 2));
        assert!(!logs.contains(&"a".to_string()));
        assert!(adopted(Some(&"not json".to_string())).is_empty());
    }

    #[test]
    fn each_log_reads_its_own_entry_and_a_single_offset_only_without_a_map() {
        let empty = Offsets::new();
        assert_eq!(offset_for(&empty, Some(7), Some(&log("a"))), 7);
        assert_eq!(offset_for(&empty, None, Some(&log("a"))), 0);
        let m = record(&empty, &log("a"), 9, 100);
        assert_eq!(offset_for(&m, Some(9), Some(&log("a"))), 9);
        // Another log does not take a's offset (the lost-batches bug).
        assert_eq!(offset_for(&m, Some(9), Some(&log("b"))), 0);
        assert_eq!(offset_for(&m, Some(9), None), 9);
    }

    #[test]
    fn recording_keeps_other_logs_until_their_retention_ends() {
        let m = record(&Offsets::new(), &log("a"), 3, 0);
        let m = record(&m, &log("b"), 5, 500);
        assert_eq!(m.len(), 2);
        assert_eq!(m["a"], LogMark { offset: 3, ms: 0 });
        let m = record(&m, &log("b"), 6, 1500);
        assert_eq!(m.keys().collect::<Vec<_>>(), vec!["b"]);
        assert_eq!(parse(Some(&to_json(&m).unwrap())).unwrap(), m);
        assert!(parse(Some(&"{nope".to_string())).is_err());
    }
}
