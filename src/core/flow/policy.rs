//! The flow's policies, read from its settings: when `autocdc serve`
//! commits (`CommitPolicy`), maintenance (`MaintenancePolicy`) and
//! compaction (`CompactionPolicy`); the tombstone lifetime and the key
//! length bound; `parse_duration`, the one duration parser.

use std::time::Duration;

use super::FlowConfig;
use crate::error::{Error, Result, codes};

/// Reads a duration setting such as "30s", "36h" or "2d"; the error names
/// the setting and shows how to write one. The one duration parser of the
/// definitions and the process settings.
pub fn parse_duration(setting: &str, text: &str) -> std::result::Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| {
        format!(
            "{setting} = \"{text}\" is not a duration ({e}); write e.g. \"30s\", \"36h\" or \"2d\""
        )
    })
}

pub const DEFAULT_MAX_KEY_BYTES: usize = 1024;
/// The key index stores a key in at most 64 KiB of row-encoded bytes.
pub const MAX_KEY_BYTES_LIMIT: usize = 32 << 10;

/// The smallest `max_log_bytes` honoured (smaller settings are raised to it).
pub const MIN_LOG_BYTES: u64 = 64 << 10;

/// When `autocdc serve` commits a flow's pending changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitPolicy {
    pub interval: Duration,
    pub max_rows: u64,
    pub max_bytes: u64,
    /// Over this many uncommitted bytes, pushes are refused (429) until a commit.
    pub max_uncommitted_bytes: u64,
    /// The bound on the flow's ingest log (see `wal::LogStats::max_bytes`).
    pub max_log_bytes: u64,
}

/// A flow's own maintenance settings; what it leaves unset comes from the
/// table's properties (see `table::maintain`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MaintenancePolicy {
    pub snapshot_max_age: Option<Duration>,
    pub min_snapshots_to_keep: Option<usize>,
    /// At most this many snapshots of a branch are kept, however young.
    pub snapshot_max_count: Option<usize>,
    /// Run on the service's schedule (false: only when asked).
    pub scheduled: bool,
}

/// The flow's compaction settings, validated (`CompactionConfig`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CompactionPolicy {
    pub enabled: bool,
    /// None: the table's `write.target-file-size-bytes`, else 128 MiB.
    pub target_file_size_bytes: Option<u64>,
    pub min_file_size_ratio: f64,
    pub delete_ratio: f64,
    pub min_input_files: usize,
    pub min_delete_files: usize,
    pub max_bytes_per_run: u64,
    pub interval: Duration,
}

impl Default for CompactionPolicy {
    fn default() -> Self {
        CompactionPolicy {
            enabled: true,
            target_file_size_bytes: None,
            min_file_size_ratio: 0.75,
            delete_ratio: 0.3,
            min_input_files: 5,
            min_delete_files: 5,
            max_bytes_per_run: 256 << 20,
            interval: Duration::from_secs(600),
        }
    }
}

/// The flow's durations and bounds: tombstone lifetime, commit policy, key length.
pub(super) fn settings(config: &FlowConfig) -> Result<(Duration, CommitPolicy, usize)> {
    let f = config.name.as_str();
    let duration = |setting: &str, value: &Option<String>, default: Duration| match value {
        None => Ok(default),
        Some(text) => parse_duration(setting, text)
            .map_err(|m| Error::definition(f, codes::INVALID_DEFINITION, m)),
    };
    let tombstone_gc = duration(
        "tombstone_gc_threshold",
        &config.tombstone_gc_threshold,
        Duration::from_secs(2 * 24 * 3600),
    )?;
    let interval = duration(
        "commit_interval",
        &config.commit_interval,
        Duration::from_secs(10),
    )?;
    let max_key_bytes = config.max_key_bytes.unwrap_or(DEFAULT_MAX_KEY_BYTES);
    if max_key_bytes == 0 || max_key_bytes > MAX_KEY_BYTES_LIMIT {
        return Err(Error::definition(
            f,
            codes::INVALID_DEFINITION,
            format!("max_key_bytes = {max_key_bytes}: use 1 to {MAX_KEY_BYTES_LIMIT}"),
        ));
    }
    let commit = CommitPolicy {
        interval: interval.max(Duration::from_millis(10)),
        max_rows: config.commit_max_rows.unwrap_or(1_000_000).max(1),
        max_bytes: config.commit_max_bytes.unwrap_or(256 << 20).max(1),
        max_uncommitted_bytes: config.max_uncommitted_bytes.unwrap_or(1 << 30).max(1),
        max_log_bytes: config.max_log_bytes.unwrap_or(4 << 30).max(MIN_LOG_BYTES),
    };
    Ok((tombstone_gc, commit, max_key_bytes))
}

pub(super) fn maintenance_policy(config: &FlowConfig) -> Result<MaintenancePolicy> {
    let snapshot_max_age = match &config.snapshot_max_age {
        None => None,
        Some(text) => Some(
            parse_duration("snapshot_max_age", text)
                .map_err(|m| Error::definition(&config.name, codes::INVALID_DEFINITION, m))?,
        ),
    };
    if config.min_snapshots_to_keep == Some(0) {
        return Err(Error::definition(
            &config.name,
            codes::INVALID_DEFINITION,
            "min_snapshots_to_keep = 0: keep at least 1 (the current snapshot)",
        ));
    }
    if config.snapshot_max_count == Some(0) {
        return Err(Error::definition(
            &config.name,
            codes::INVALID_DEFINITION,
            "snapshot_max_count = 0: keep at least 1 (the current snapshot)",
        ));
    }
    Ok(MaintenancePolicy {
        snapshot_max_age,
        min_snapshots_to_keep: config.min_snapshots_to_keep.map(|n| n as usize),
        snapshot_max_count: config.snapshot_max_count.map(|n| n as usize),
        scheduled: config.maintenance.unwrap_or(true),
    })
}

pub(super) fn compaction_policy(config: &FlowConfig) -> Result<CompactionPolicy> {
    let mut p = CompactionPolicy {
        target_file_size_bytes: config.target_file_size_bytes,
        ..CompactionPolicy::default()
    };
    let Some(c) = &config.compaction else {
        return Ok(p);
    };
    let bad = |m: String| Error::definition(&config.name, codes::INVALID_DEFINITION, m);
    let ratio = |name: &str, v: Option<f64>, default: f64| match v {
        None => Ok(default),
        Some(r) if (0.0..=1.0).contains(&r) => Ok(r),
        Some(r) => Err(bad(format!(
            "compaction.{name} = {r}: a share, from 0 to 1"
        ))),
    };
    p.enabled = c.enabled.unwrap_or(true);
    if let Some(t) = c.target_file_size_bytes {
        if t < 1 << 20 {
            return Err(bad(format!(
                "compaction.target_file_size_bytes = {t}: at least 1 MiB (1048576)"
            )));
        }
        p.target_file_size_bytes = Some(t);
    }
    p.min_file_size_ratio = ratio(
        "min_file_size_ratio",
        c.min_file_size_ratio,
        p.min_file_size_ratio,
    )?;
    p.delete_ratio = ratio("delete_ratio", c.delete_ratio, p.delete_ratio)?;
    for (name, v, slot) in [
        ("min_input_files", c.min_input_files, &mut p.min_input_files),
        (
            "min_delete_files",
            c.min_delete_files,
            &mut p.min_delete_files,
        ),
    ] {
        match v {
            Some(n) if !(1..=100_000).contains(&n) => {
                return Err(bad(format!("compaction.{name} = {n}: from 1 to 100000")));
            }
            Some(n) => *slot = n,
            None => {}
        }
    }
    if let Some(b) = c.max_bytes_per_run {
        if b < 1 << 20 {
            return Err(bad(format!(
                "compaction.max_bytes_per_run = {b}: at least 1 MiB (1048576)"
            )));
        }
        p.max_bytes_per_run = b;
    }
    if let Some(text) = &c.interval {
        p.interval = parse_duration("compaction.interval", text).map_err(bad)?;
    }
    Ok(p)
}
