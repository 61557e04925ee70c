//! What a user writes: the serde shapes of a flow definition (`FlowConfig`
//! and the settings inside it), and the checks that need no column: the
//! flow's name, its target, the SCD mode and the table properties.

use iceberg::TableIdent;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result, codes};

/// The longest flow name (it names a folder and a metric label).
pub const MAX_FLOW_NAME: usize = 128;

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl Default for OneOrMany {
    fn default() -> Self {
        OneOrMany::Many(Vec::new())
    }
}

impl OneOrMany {
    pub fn to_vec(&self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s.clone()],
            OneOrMany::Many(v) => v.clone(),
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TiePolicy {
    /// Two different changes with one sequence: an upsert over a delete in
    /// SCD Type 1 (the delete in SCD Type 2), else the one with the larger
    /// row fingerprint, whatever the arrival order. Counted as a tie.
    #[default]
    Deterministic,
    /// Reject the batch that contains (or meets) a tie.
    Error,
}

/// What a pushed field that names no column does.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SchemaEvolution {
    /// It is refused (`400 ...COLUMN`).
    #[default]
    None,
    /// It adds an optional column, and a column the target has that the
    /// definition lacks is kept (a restart does not drop it).
    AddColumns,
}

impl SchemaEvolution {
    pub fn is_none(&self) -> bool {
        *self == SchemaEvolution::None
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ColumnDef {
    pub name: String,
    #[serde(rename = "type")]
    pub ty: String,
    #[serde(default)]
    pub required: bool,
    /// The column's name before a rename: the target's column keeps its
    /// field id and its values (schema evolution).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renamed_from: Option<String>,
}

/// A flow as written in TOML (or sent over HTTP), fields named after
/// `create_auto_cdc_flow`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FlowConfig {
    pub name: String,
    pub target: String,
    pub columns: Vec<ColumnDef>,
    pub keys: Vec<String>,
    /// Columns or SQL expressions over them (`coalesce(lsn, 0)`,
    /// `struct(ts, lsn)`), compared in order. Empty for `from_snapshot`
    /// flows (the snapshot version orders them).
    #[serde(default)]
    pub sequence_by: OneOrMany,
    #[serde(default)]
    pub apply_as_deletes: Option<String>,
    #[serde(default)]
    pub column_list: Option<Vec<String>>,
    #[serde(default)]
    pub except_column_list: Option<Vec<String>>,
    /// Columns to drop from the target. A column the definition no longer
    /// selects stays in the target, as in Spark's AUTO CDC: existing rows
    /// keep their values, new rows and updates leave it null. Naming it
    /// here drops it (never a column the flow selects: keys and sequence
    /// columns always are).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drop_columns: Vec<String>,
    #[serde(default = "default_scd_type")]
    pub stored_as_scd_type: u8,
    /// SCD Type 2: only changes to these columns open a new version ...
    #[serde(default)]
    pub track_history_column_list: Option<Vec<String>>,
    /// ... or to every target column but these (default: every target column
    /// except the keys and the sequence columns).
    #[serde(default)]
    pub track_history_except_column_list: Option<Vec<String>>,
    /// AUTO CDC FROM SNAPSHOT: the input is full snapshots of the source,
    /// each with a version; autocdc applies the difference to the last one.
    #[serde(default)]
    pub from_snapshot: bool,
    /// A null in an upsert keeps the column's current value (partial updates).
    #[serde(default)]
    pub ignore_null_updates: bool,
    /// Only these target columns keep their value on a null; the others
    /// take the null (Spark's column-subset form of ignore_null_updates) ...
    #[serde(default)]
    pub ignore_null_updates_column_list: Option<Vec<String>>,
    /// ... or every target column but these (keys aside).
    #[serde(default)]
    pub ignore_null_updates_except_column_list: Option<Vec<String>>,
    /// SCD Type 1: a change for which this is true removes every row with a
    /// lower sequence (a source table truncate).
    #[serde(default)]
    pub apply_as_truncates: Option<String>,
    #[serde(default)]
    pub partition_by: Vec<String>,
    /// How long a tombstone is kept after its delete was committed, e.g. "2d", "36h".
    #[serde(default)]
    pub tombstone_gc_threshold: Option<String>,
    #[serde(default)]
    pub on_sequence_tie: TiePolicy,
    /// Target size of one data file; files roll over at about this many bytes.
    #[serde(default)]
    pub target_file_size_bytes: Option<u64>,
    /// `autocdc serve`: commit pending changes this often (default "10s") ...
    #[serde(default)]
    pub commit_interval: Option<String>,
    /// ... or as soon as this many rows (default 1,000,000) ...
    #[serde(default)]
    pub commit_max_rows: Option<u64>,
    /// ... or bytes (default 256 MiB) are pending.
    #[serde(default)]
    pub commit_max_bytes: Option<u64>,
    /// Pushes are refused with 429 above this many uncommitted bytes (default 1 GiB).
    #[serde(default)]
    pub max_uncommitted_bytes: Option<u64>,
    /// The flow's ingest log holds at most this many bytes (default 4 GiB):
    /// committed records go before their idempotency window ends to stay
    /// under it; when uncommitted records alone fill it, pushes get 429.
    #[serde(default)]
    pub max_log_bytes: Option<u64>,
    /// The most bytes of a change's string and binary key values together
    /// (and, apart, of its sequence values); default 1024, at most 32768.
    #[serde(default)]
    pub max_key_bytes: Option<usize>,
    /// Snapshots older than this expire (with the files only they
    /// reference); default: the table's `history.expire.max-snapshot-age-ms`.
    #[serde(default)]
    pub snapshot_max_age: Option<String>,
    /// Never expire below this many snapshots of a branch; default: the
    /// table's `history.expire.min-snapshots-to-keep`.
    #[serde(default)]
    pub min_snapshots_to_keep: Option<u32>,
    /// Keep at most this many snapshots of a branch, however young (so a
    /// short commit_interval keeps metadata.json small); default: the
    /// table's `autocdc.expire.max-snapshots`, else 500.
    #[serde(default)]
    pub snapshot_max_count: Option<u32>,
    /// `autocdc serve` runs maintenance for this flow on its schedule
    /// (default true); `autocdc maintain` and the endpoint work either way.
    #[serde(default)]
    pub maintenance: Option<bool>,
    /// Iceberg table properties of the target and the state table, set when
    /// the flow opens (e.g. `commit.manifest.min-count-to-merge`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub table_properties: std::collections::BTreeMap<String, String>,
    /// Match column names exactly. By default, as in Spark, names in keys,
    /// sequences, column lists and input fields match regardless of case.
    #[serde(default)]
    pub case_sensitive: bool,
    /// `add_columns`: a pushed field that names no column adds an optional
    /// column (its type from the Arrow field or the JSON values). Default
    /// `none`: such a field is refused.
    #[serde(default, skip_serializing_if = "SchemaEvolution::is_none")]
    pub schema_evolution: SchemaEvolution,
    /// Compaction of the target's and the state table's files (`[flow.compaction]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction: Option<CompactionConfig>,
    /// `debezium`: the input is Debezium change events; the sequence and the
    /// deletes are derived from them (`core::debezium`). Default `rows`.
    #[serde(default, skip_serializing_if = "InputFormat::is_rows")]
    pub format: InputFormat,
    /// A Debezium flow: the source table it takes (`schema.table`, or
    /// `db.table` for MySQL); `POST /v1/debezium` routes events by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_table: Option<String>,
    /// A Debezium flow: string or binary columns that PostgreSQL may store
    /// out of line (TOAST). An update that leaves such a value untouched
    /// sends Debezium's placeholder, which keeps the key's earlier value
    /// (the flow keeps each key's changes, as `ignore_null_updates` does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toasted_columns: Option<Vec<String>>,
}

/// What a flow's input is.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum InputFormat {
    /// Rows in the flow's columns, with their sequence.
    #[default]
    Rows,
    /// Debezium change events (`core::debezium`).
    Debezium,
}

impl InputFormat {
    pub fn is_rows(&self) -> bool {
        *self == InputFormat::Rows
    }
}

/// `[flow.compaction]`: which files a compaction run rewrites, and how
/// much one run may do. Defaults follow Iceberg Java's `RewriteDataFiles`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompactionConfig {
    /// Compact on the service's schedule and in `autocdc maintain` (default true).
    #[serde(default)]
    pub enabled: Option<bool>,
    /// Files are written up to about this size (default: the flow's
    /// `target_file_size_bytes`, else the table's `write.target-file-size-bytes`, else 128 MiB).
    #[serde(default)]
    pub target_file_size_bytes: Option<u64>,
    /// A data file under this share of the target size is small (default 0.75).
    #[serde(default)]
    pub min_file_size_ratio: Option<f64>,
    /// A data file with more than this share of its rows deleted is rewritten (default 0.3).
    #[serde(default)]
    pub delete_ratio: Option<f64>,
    /// A partition's small files are rewritten once it has this many (default 5).
    #[serde(default)]
    pub min_input_files: Option<usize>,
    /// A partition's position-delete files are merged into one once it has this many (default 5).
    #[serde(default)]
    pub min_delete_files: Option<usize>,
    /// The most bytes of data files one run reads (default 256 MiB), so a
    /// run never holds up commits for long; the rest waits for the next run.
    #[serde(default)]
    pub max_bytes_per_run: Option<u64>,
    /// `autocdc serve` compacts this often (default "10m").
    #[serde(default)]
    pub interval: Option<String>,
}

// The shares are compared as written; a NaN is refused by `Flow::new`.
impl Eq for CompactionConfig {}

/// At most this many `table_properties`, each key and value at most
/// `MAX_PROPERTY_BYTES`.
pub const MAX_TABLE_PROPERTIES: usize = 64;
pub const MAX_PROPERTY_BYTES: usize = 1024;
/// Properties autocdc owns: what it writes depends on them.
const RESERVED_PROPERTIES: [&str; 5] = [
    "format-version",
    "write.delete.mode",
    "write.update.mode",
    "write.merge.mode",
    "write.format.default",
];

pub(super) fn check_table_properties(config: &FlowConfig) -> Result<()> {
    let refuse = |m: String| {
        Err(Error::definition(
            &config.name,
            codes::INVALID_DEFINITION,
            m,
        ))
    };
    if config.table_properties.len() > MAX_TABLE_PROPERTIES {
        return refuse(format!(
            "table_properties has {} entries; at most {MAX_TABLE_PROPERTIES}",
            config.table_properties.len()
        ));
    }
    for (k, v) in &config.table_properties {
        if k.is_empty() || k.len() > MAX_PROPERTY_BYTES || v.len() > MAX_PROPERTY_BYTES {
            let shown: String = k.chars().take(40).collect();
            return refuse(format!(
                "table_properties `{shown}`: keys are 1 to {MAX_PROPERTY_BYTES} bytes, values at most {MAX_PROPERTY_BYTES}"
            ));
        }
        if k.starts_with("autocdc.") || RESERVED_PROPERTIES.contains(&k.as_str()) {
            return refuse(format!(
                "table_properties `{k}`: autocdc sets this one (its writes depend on it)"
            ));
        }
    }
    Ok(())
}

fn default_scd_type() -> u8 {
    1
}

/// Splits `a.b.table` into a namespace and a table name.
pub fn parse_table_ident(flow: &str, target: &str) -> Result<TableIdent> {
    let parts: Vec<&str> = target.split('.').collect();
    if parts.len() < 2 || parts.iter().any(|p| p.is_empty()) {
        return Err(Error::definition(
            flow,
            codes::INVALID_DEFINITION,
            format!(
                "target `{target}` must be `namespace.table` (multi-level namespaces allowed: `a.b.table`)"
            ),
        ));
    }
    TableIdent::from_strs(parts).map_err(Error::from)
}

/// A flow name names a folder and a metric label: 1 to `MAX_FLOW_NAME`
/// letters, digits, `_` and `-`.
pub(super) fn check_name(flow: &str) -> Result<()> {
    if flow.is_empty()
        || flow.len() > MAX_FLOW_NAME
        || !flow
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        let shown: String = flow.chars().take(40).collect();
        return Err(Error::definition(
            &shown,
            codes::INVALID_DEFINITION,
            format!(
                "flow names are 1 to {MAX_FLOW_NAME} letters, digits, `_` and `-` (this one has {} characters)",
                flow.chars().count()
            ),
        ));
    }
    Ok(())
}

/// The SCD type and the options that depend on it; returns whether the
/// flow is SCD Type 2.
pub(super) fn check_modes(config: &FlowConfig) -> Result<bool> {
    let f = config.name.as_str();
    if !matches!(config.stored_as_scd_type, 1 | 2) {
        return Err(Error::definition(
            f,
            codes::INVALID_DEFINITION,
            format!(
                "stored_as_scd_type = {}; use 1 (one current row per key) or 2 (every version, with __START_AT and __END_AT)",
                config.stored_as_scd_type
            ),
        ));
    }
    let scd2 = config.stored_as_scd_type == 2;
    if scd2 && config.apply_as_truncates.is_some() {
        return Err(Error::definition(
            f,
            codes::TRUNCATE_SCD2,
            "apply_as_truncates is only supported with stored_as_scd_type = 1; an SCD Type 2 target keeps history, which a truncate would have to rewrite",
        ));
    }
    if !scd2
        && (config.track_history_column_list.is_some()
            || config.track_history_except_column_list.is_some())
    {
        return Err(Error::definition(
            f,
            codes::INVALID_DEFINITION,
            "track_history_column_list / track_history_except_column_list need stored_as_scd_type = 2",
        ));
    }
    Ok(scd2)
}
