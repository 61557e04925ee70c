//! The table properties autocdc reads and sets, with Iceberg Java's
//! names and defaults: snapshot retention (`history.expire.*`, and
//! autocdc's count limit), metadata.json hygiene (`write.metadata.*`) and
//! manifest merging (`commit.manifest*`). The catalogs' commits, the
//! snapshot producer (`row_delta`) and maintenance read them here.

use std::collections::HashMap;

use iceberg::spec::TableMetadata;

use crate::core::flow::MaintenancePolicy;

pub const PROP_MAX_AGE: &str = "history.expire.max-snapshot-age-ms";
pub const PROP_MIN_KEEP: &str = "history.expire.min-snapshots-to-keep";
/// autocdc's own (Iceberg Java has no count limit): at most this many
/// snapshots of a branch are kept, however young, so metadata.json stays
/// bounded at any commit rate.
pub const PROP_MAX_COUNT: &str = "autocdc.expire.max-snapshots";
pub const PROP_DELETE_AFTER_COMMIT: &str = "write.metadata.delete-after-commit.enabled";
pub const PROP_PREVIOUS_MAX: &str = "write.metadata.previous-versions-max";
pub const PROP_MERGE_ENABLED: &str = "commit.manifest-merge.enabled";
pub const PROP_MERGE_MIN_COUNT: &str = "commit.manifest.min-count-to-merge";
pub const PROP_MANIFEST_TARGET_BYTES: &str = "commit.manifest.target-size-bytes";

/// Iceberg Java's defaults, used when a table does not say.
const DEFAULT_MAX_AGE_MS: i64 = 5 * 24 * 3600 * 1000;
const DEFAULT_MIN_KEEP: usize = 1;
/// About 1 KB of metadata.json per snapshot: 500 keep it near 0.5 MiB (at a
/// 1 s commit interval, a time-travel window of about 8 minutes).
pub const DEFAULT_MAX_COUNT: usize = 500;
const DEFAULT_MERGE_MIN_COUNT: usize = 100;
const DEFAULT_MANIFEST_TARGET_BYTES: u64 = 8 << 20;

/// What autocdc sets on the tables it creates: old metadata.json files go
/// after each commit (20 kept), snapshots older than 30 minutes expire (at
/// a 10 s interval, 180 snapshots: a metadata.json of about 190 KB).
pub const CREATED_MAX_AGE_MS: i64 = 30 * 60 * 1000;
pub const CREATED_PREVIOUS_VERSIONS: usize = 20;

/// The maintenance properties autocdc sets on a table it creates.
pub fn created_table_properties() -> HashMap<String, String> {
    HashMap::from([
        (PROP_DELETE_AFTER_COMMIT.to_string(), "true".to_string()),
        (
            PROP_PREVIOUS_MAX.to_string(),
            CREATED_PREVIOUS_VERSIONS.to_string(),
        ),
        (PROP_MAX_AGE.to_string(), CREATED_MAX_AGE_MS.to_string()),
    ])
}

fn prop<T: std::str::FromStr>(meta: &TableMetadata, key: &str) -> Option<T> {
    meta.properties()
        .get(key)
        .and_then(|v| v.trim().parse().ok())
}

/// Whether superseded metadata.json files are deleted after a commit.
pub fn delete_after_commit(meta: &TableMetadata) -> bool {
    prop::<bool>(meta, PROP_DELETE_AFTER_COMMIT).unwrap_or(false)
}

/// How long and how many snapshots a branch keeps: those younger than
/// `max_age_ms`, at most `max_count` of them, and never fewer than
/// `min_keep` (which wins over `max_count`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub max_age_ms: i64,
    pub min_keep: usize,
    pub max_count: usize,
}

impl Retention {
    /// The flow's setting, else the table's property, else Java's default.
    pub fn of(meta: &TableMetadata, policy: &MaintenancePolicy) -> Retention {
        Retention {
            max_age_ms: policy
                .snapshot_max_age
                .map(|d| d.as_millis() as i64)
                .or_else(|| prop(meta, PROP_MAX_AGE))
                .unwrap_or(DEFAULT_MAX_AGE_MS)
                .max(0),
            min_keep: policy
                .min_snapshots_to_keep
                .or_else(|| prop(meta, PROP_MIN_KEEP))
                .unwrap_or(DEFAULT_MIN_KEEP)
                .max(1),
            max_count: policy
                .snapshot_max_count
                .or_else(|| prop(meta, PROP_MAX_COUNT))
                .unwrap_or(DEFAULT_MAX_COUNT)
                .max(1),
        }
    }
}

/// `commit.manifest-merge.*`: when a commit bin-packs small manifests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MergePolicy {
    pub enabled: bool,
    pub min_count: usize,
    pub target_bytes: u64,
}

impl MergePolicy {
    pub fn of(meta: &TableMetadata) -> MergePolicy {
        MergePolicy {
            enabled: prop(meta, PROP_MERGE_ENABLED).unwrap_or(true),
            min_count: prop(meta, PROP_MERGE_MIN_COUNT)
                .unwrap_or(DEFAULT_MERGE_MIN_COUNT)
                .max(2),
            target_bytes: prop(meta, PROP_MANIFEST_TARGET_BYTES)
                .unwrap_or(DEFAULT_MANIFEST_TARGET_BYTES)
                .max(1),
        }
    }
}
