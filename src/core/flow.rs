//! Flow definitions: the TOML a user writes, and the validated `Flow` the rest
//! of the crate works with. Validation happens once, here, at load time; every
//! rejection has a stable code and names the column and the fix.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use arrow_schema::{Field, Schema as ArrowSchema, SchemaRef};
use iceberg::TableIdent;
use iceberg::arrow::schema_to_arrow_schema;
use iceberg::spec::{
    NestedField, PartitionSpec, PrimitiveType, Schema, StructType, Transform, Type,
};
use serde::{Deserialize, Serialize};

use crate::core::debezium;
use crate::core::predicate::Predicate;
use crate::core::seq_expr::{self, Part, SeqExpr};
use crate::error::{Error, Result, codes};

/// Columns autocdc reserves for SCD Type 2 and its own bookkeeping.
const RESERVED: &[&str] = &["__start_at", "__end_at"];
/// The SCD Type 2 interval columns.
pub const START_AT: &str = "__START_AT";
pub const END_AT: &str = "__END_AT";
/// The hidden sequence column of a `from_snapshot` flow: the snapshot version.
pub const SNAPSHOT_VERSION: &str = "__autocdc_snapshot_version";
const RESERVED_PREFIX: &str = "__autocdc";
/// The hidden source column of a `sequence_by` expression is this and the
/// expression's position among the sequence columns.
pub const COMPUTED_PREFIX: &str = "__autocdc_sequence_";

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

/// The longest flow name (it names a folder and a metric label).
pub const MAX_FLOW_NAME: usize = 128;
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

fn check_table_properties(config: &FlowConfig) -> Result<()> {
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

/// A validated flow. Column indices refer to `source_arrow`.
#[derive(Debug, Clone)]
pub struct Flow {
    pub name: String,
    pub target: TableIdent,
    pub config: FlowConfig,
    /// The declared source columns; every field nullable so that nulls reach
    /// validation (and get a precise error) instead of failing inside Arrow.
    pub source_arrow: SchemaRef,
    pub key_idx: Vec<usize>,
    pub seq_idx: Vec<usize>,
    /// Hidden sequence columns, after the declared ones, that hold the
    /// value of a `sequence_by` expression; filled when a batch is read.
    pub computed: Vec<Computed>,
    pub deletes: Option<Predicate>,
    pub truncates: Option<Predicate>,
    /// SCD Type 2: the target keeps every version with `__START_AT` / `__END_AT`.
    pub scd2: bool,
    /// Source columns whose change opens a new SCD Type 2 version, sorted.
    pub tracked: Vec<usize>,
    /// Some value column keeps its value on a null (`ignore_null_cols` is not empty).
    pub ignore_null_updates: bool,
    /// Source columns a null in an upsert leaves unchanged, sorted.
    pub ignore_null_cols: Vec<usize>,
    pub from_snapshot: bool,
    /// The input is Debezium change events: the hidden columns of
    /// `core::debezium` follow the declared ones.
    pub debezium: bool,
    /// Source column index of each target column, in target order.
    pub target_cols: Vec<usize>,
    /// The target's Iceberg schema (field ids 1..n, keys required and identifier fields).
    pub target_schema: Schema,
    /// The target's partition spec, bound to `target_schema` (unpartitioned when empty).
    pub partition_spec: PartitionSpec,
    pub tombstone_gc: Duration,
    pub commit: CommitPolicy,
    pub maintenance: MaintenancePolicy,
    pub compaction: CompactionPolicy,
    pub on_tie: TiePolicy,
    pub target_file_size_bytes: u64,
    /// The most bytes of a change's string and binary key values (and, apart,
    /// of its sequence values); longer ones are refused at ingest.
    pub max_key_bytes: usize,
}

/// A hidden source column computed from a `sequence_by` expression.
#[derive(Debug, Clone)]
pub struct Computed {
    /// Its source column index.
    pub idx: usize,
    pub expr: SeqExpr,
    pub ty: PrimitiveType,
}

/// Parses an Iceberg primitive type name as written in a flow definition.
pub fn parse_type(s: &str) -> Option<PrimitiveType> {
    let t = s.trim().to_ascii_lowercase();
    Some(match t.as_str() {
        "boolean" | "bool" => PrimitiveType::Boolean,
        "int" | "integer" => PrimitiveType::Int,
        "long" | "bigint" => PrimitiveType::Long,
        "float" => PrimitiveType::Float,
        "double" => PrimitiveType::Double,
        "date" => PrimitiveType::Date,
        "time" => PrimitiveType::Time,
        "timestamp" => PrimitiveType::Timestamp,
        "timestamptz" => PrimitiveType::Timestamptz,
        "string" => PrimitiveType::String,
        "uuid" => PrimitiveType::Uuid,
        "binary" => PrimitiveType::Binary,
        _ => {
            let inner = t.strip_prefix("decimal(")?.strip_suffix(')')?;
            let (p, s) = inner.split_once(',')?;
            let precision: u32 = p.trim().parse().ok()?;
            let scale: u32 = s.trim().parse().ok()?;
            if precision == 0 || precision > 38 || scale > precision {
                return None;
            }
            PrimitiveType::Decimal { precision, scale }
        }
    })
}

fn orderable(t: &Type) -> bool {
    crate::core::nested::orderable(t)
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

impl Flow {
    pub fn new(config: FlowConfig) -> Result<Flow> {
        check_name(&config.name)?;
        let f = config.name.as_str();
        let target = parse_table_ident(f, &config.target)?;
        let scd2 = check_modes(&config)?;
        check_table_properties(&config)?;
        let mut fields = declared_columns(&config)?;
        let (key_idx, seq_idx, computed) = keys_and_sequence(&config, &mut fields)?;
        let target_cols = selected_columns(&config, &fields, &key_idx)?;
        let source_arrow = source_schema(&fields)?;
        let target_schema = target_schema(&fields, &target_cols, &key_idx, &seq_idx, scd2)?;
        let partition_spec = partition_spec(
            f,
            &config.partition_by,
            &target_schema,
            config.case_sensitive,
        )?;
        let predicate = |sql: &Option<String>| match sql {
            Some(sql) => Predicate::parse(sql, &source_arrow)
                .map(Some)
                .map_err(|e| Error::from_predicate(f, e)),
            None => Ok(None),
        };
        let (deletes, truncates) = match config.format {
            InputFormat::Rows => (
                config.apply_as_deletes.clone(),
                config.apply_as_truncates.clone(),
            ),
            // SCD Type 2 takes no truncates, as Spark's AUTO CDC.
            InputFormat::Debezium => (
                Some(debezium::DELETES.to_string()),
                (!scd2).then(|| debezium::TRUNCATES.to_string()),
            ),
        };
        let deletes = predicate(&deletes)?;
        let truncates = predicate(&truncates)?;
        // Both sorted: `Folding` compares them with the sets a target records.
        let mut tracked = tracked_columns(&config, &target_cols, &key_idx)?;
        tracked.sort_unstable();
        let mut ignore_null_cols = ignored_columns(&config, &target_cols, &key_idx)?;
        ignore_null_cols.sort_unstable();
        let (tombstone_gc, commit, max_key_bytes) = settings(&config)?;
        let maintenance = maintenance_policy(&config)?;
        let compaction = compaction_policy(&config)?;
        Ok(Flow {
            compaction,
            ignore_null_updates: !ignore_null_cols.is_empty(),
            ignore_null_cols,
            from_snapshot: config.from_snapshot,
            debezium: config.format == InputFormat::Debezium,
            commit,
            name: config.name.clone(),
            target,
            on_tie: config.on_sequence_tie,
            target_file_size_bytes: config.target_file_size_bytes.unwrap_or(128 << 20),
            max_key_bytes,
            config,
            source_arrow,
            key_idx,
            seq_idx,
            computed,
            deletes,
            truncates,
            scd2,
            tracked,
            target_cols,
            target_schema,
            partition_spec,
            tombstone_gc,
            maintenance,
        })
    }

    /// `(new, old)` for each column the definition says was renamed.
    pub fn renames(&self) -> Vec<(String, String)> {
        self.config
            .columns
            .iter()
            .filter_map(|c| Some((c.name.clone(), c.renamed_from.clone()?)))
            .filter(|(n, o)| n != o)
            .collect()
    }

    /// The column an input field stands for: `input_column`, else the
    /// column renamed from it (records logged before the rename).
    pub fn field_column(&self, field: &str) -> Option<usize> {
        self.input_column(field).or_else(|| {
            self.config
                .columns
                .iter()
                .position(|c| c.renamed_from.as_deref() == Some(field))
        })
    }

    pub fn column_name(&self, source_idx: usize) -> &str {
        self.source_arrow.field(source_idx).name()
    }

    /// A source column as errors name it: its name, or for a hidden
    /// sequence column the expression it holds.
    pub fn column_label(&self, source_idx: usize) -> &str {
        match self.computed.iter().find(|c| c.idx == source_idx) {
            Some(c) => c.expr.sql(),
            None => self.column_name(source_idx),
        }
    }

    /// The Iceberg type of source column `i` (field ids inside nested types
    /// are 0: the schema holding it numbers them).
    pub fn column_type(&self, i: usize) -> Option<Type> {
        if let Some(c) = self.computed.iter().find(|c| c.idx == i) {
            return Some(Type::Primitive(c.ty.clone()));
        }
        if self.from_snapshot && self.column_name(i) == SNAPSHOT_VERSION {
            return Some(Type::Primitive(PrimitiveType::Long));
        }
        if self.debezium && i >= self.config.columns.len() {
            let hidden = debezium::hidden_columns();
            return Some(hidden.get(i - self.config.columns.len())?.1.clone());
        }
        crate::core::nested::parse(&self.config.columns.get(i)?.ty).ok()
    }

    /// Fills the hidden columns of `sequence_by` expressions in `cols` (the
    /// source columns of `rows` rows, those placeholders). Rows in errors
    /// count from `first_row`.
    pub fn compute_sequences(
        &self,
        cols: &mut [arrow_array::ArrayRef],
        rows: usize,
        first_row: usize,
    ) -> Result<()> {
        for c in &self.computed {
            let want = self.source_arrow.field(c.idx).data_type();
            let value = c
                .expr
                .evaluate(cols, rows, want)
                .map_err(|(row, why)| Error::Batch {
                    code: codes::SEQUENCE_EXPRESSION,
                    flow: self.name.clone(),
                    row: first_row + row,
                    column: c.expr.sql().to_string(),
                    message: format!(
                        "sequence_by `{}` cannot be computed for this row: {why}",
                        c.expr.sql()
                    ),
                })?;
            cols[c.idx] = value;
        }
        Ok(())
    }

    /// Whether source column `i` must not be null.
    pub fn required(&self, i: usize) -> bool {
        self.config.columns.get(i).is_none_or(|c| c.required) || self.key_idx.contains(&i)
    }

    /// Whether the flow keeps change history per key (SCD Type 2 or
    /// ignore_null_updates) rather than only the winning change.
    pub fn keeps_history(&self) -> bool {
        self.scd2 || self.ignore_null_updates
    }

    /// Target columns that are not keys, in target order.
    pub fn value_cols(&self) -> Vec<usize> {
        self.target_cols
            .iter()
            .copied()
            .filter(|c| !self.key_idx.contains(c))
            .collect()
    }

    /// The declared column an input field (JSON key, Arrow or Parquet
    /// column, CSV header) names: exactly, or regardless of ASCII case
    /// unless `case_sensitive`.
    pub fn input_column(&self, name: &str) -> Option<usize> {
        // Hidden sequence columns are computed, never read.
        let fields = match self.computed.first() {
            Some(c) => &self.source_arrow.fields()[..c.idx],
            None => &self.source_arrow.fields()[..],
        };
        fields.iter().position(|f| f.name() == name).or_else(|| {
            (!self.config.case_sensitive)
                .then(|| {
                    fields
                        .iter()
                        .position(|f| f.name().eq_ignore_ascii_case(name))
                })
                .flatten()
        })
    }

    /// The identifier of the aux sequence-state table kept beside the target.
    pub fn state_ident(&self) -> TableIdent {
        TableIdent::new(
            self.target.namespace().clone(),
            format!("{}__autocdc_state", self.target.name()),
        )
    }
}

/// A flow name names a folder and a metric label: 1 to `MAX_FLOW_NAME`
/// letters, digits, `_` and `-`.
fn check_name(flow: &str) -> Result<()> {
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
fn check_modes(config: &FlowConfig) -> Result<bool> {
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

/// A declared column: its source index, name, type and `required`.
type Declared = (usize, String, Type, bool);

/// The declared columns: plain names, no duplicates, no reserved names,
/// known types.
fn declared_columns(config: &FlowConfig) -> Result<Vec<Declared>> {
    let f = config.name.as_str();
    let mut seen = HashSet::new();
    let mut fields = Vec::new();
    for (i, c) in config.columns.iter().enumerate() {
        if c.name.is_empty() {
            return Err(Error::definition(
                f,
                codes::INVALID_DEFINITION,
                format!("column {} has an empty name", i + 1),
            ));
        }
        let lower = c.name.to_ascii_lowercase();
        if RESERVED.contains(&lower.as_str()) || lower.starts_with(RESERVED_PREFIX) {
            return Err(Error::definition(
                f,
                codes::RESERVED_COLUMN,
                format!(
                    "column `{}` uses a name autocdc reserves (`__START_AT`, `__END_AT`, `__autocdc*`); rename it in the source",
                    c.name
                ),
            ));
        }
        if !seen.insert(lower) {
            return Err(Error::definition(
                f,
                codes::INVALID_DEFINITION,
                format!("column `{}` is declared twice", c.name),
            ));
        }
        let ty = match crate::core::nested::parse(&c.ty) {
            Ok(ty) => ty,
            Err(why) => {
                let shown: String = c.ty.chars().take(80).collect();
                return Err(Error::definition(
                    f,
                    codes::INVALID_DEFINITION,
                    format!(
                        "column `{}` has type `{shown}`, which autocdc cannot read ({why}); use one of boolean, int, long, float, double, decimal(p,s), date, time, timestamp, timestamptz, string, uuid, binary, or struct<name: type, ...>, list<type>, map<key type, value type> of them",
                        c.name
                    ),
                ));
            }
        };
        fields.push((i, c.name.clone(), ty, c.required));
    }
    for c in &config.columns {
        let Some(old) = &c.renamed_from else { continue };
        let taken = config
            .columns
            .iter()
            .find(|o| o.name != c.name && o.name.eq_ignore_ascii_case(old));
        if old.is_empty() || taken.is_some() {
            return Err(Error::definition(
                f,
                codes::INVALID_DEFINITION,
                format!(
                    "column `{}` is renamed_from `{old}`, which {}; renamed_from names the column's previous name in the target",
                    c.name,
                    match taken {
                        Some(o) => format!("is declared too (as `{}`)", o.name),
                        None => "is empty".to_string(),
                    }
                ),
            ));
        }
    }
    Ok(fields)
}

/// The source index of column `name`, named in setting `what`.
fn find_column(config: &FlowConfig, name: &str, what: &str) -> Result<usize> {
    let f = config.name.as_str();
    if config.from_snapshot && name == SNAPSHOT_VERSION {
        return Ok(config.columns.len());
    }
    if config.format == InputFormat::Debezium
        && let Some(i) = debezium::hidden_columns().iter().position(|c| c.0 == name)
    {
        return Ok(config.columns.len() + i);
    }
    let name = parse_ident(f, name)?;
    let exact = config.columns.iter().position(|c| c.name == name);
    // Declared names differ in more than case, so this match is unique.
    let folded = || {
        config
            .columns
            .iter()
            .position(|c| c.name.eq_ignore_ascii_case(&name))
            .filter(|_| !config.case_sensitive)
    };
    exact.or_else(folded).ok_or_else(|| {
        Error::definition(
            f,
            codes::COLUMNS_NOT_FOUND,
            format!("{what} column `{name}` is not among the declared columns ({}); declare it under `columns` or fix the name",
                config.columns.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", ")),
        )
    })
}

/// The key and sequence columns (a `from_snapshot` flow's hidden version
/// column is added to `fields` as its sequence).
fn keys_and_sequence(
    config: &FlowConfig,
    fields: &mut Vec<Declared>,
) -> Result<(Vec<usize>, Vec<usize>, Vec<Computed>)> {
    let f = config.name.as_str();
    if config.keys.is_empty() {
        return Err(Error::definition(
            f,
            codes::EMPTY_KEYS,
            "`keys` is empty; name the column(s) that identify a row, e.g. keys = [\"id\"]",
        ));
    }
    let key_idx = config
        .keys
        .iter()
        .map(|k| find_column(config, k, "key"))
        .collect::<Result<Vec<_>>>()?;
    let mut seq_names = config.sequence_by.to_vec();
    if config.from_snapshot {
        let misplaced = [
            (
                !seq_names.is_empty(),
                "sequence_by (the snapshot version orders the changes)",
            ),
            (
                config.apply_as_deletes.is_some(),
                "apply_as_deletes (a key missing from a snapshot is deleted)",
            ),
            (config.apply_as_truncates.is_some(), "apply_as_truncates"),
            (
                config.ignore_null_updates
                    || config.ignore_null_updates_column_list.is_some()
                    || config.ignore_null_updates_except_column_list.is_some(),
                "ignore_null_updates (a snapshot holds whole rows)",
            ),
        ];
        if let Some((_, what)) = misplaced.iter().find(|m| m.0) {
            return Err(Error::definition(
                f,
                codes::INVALID_DEFINITION,
                format!("a from_snapshot flow takes no {what}"),
            ));
        }
        // The version, as a hidden sequence column after the declared ones.
        fields.push((
            fields.len(),
            SNAPSHOT_VERSION.to_string(),
            Type::Primitive(PrimitiveType::Long),
            true,
        ));
        seq_names.push(SNAPSHOT_VERSION.to_string());
    }
    if config.format == InputFormat::Debezium {
        debezium_columns(config, fields, &mut seq_names)?;
    }
    if seq_names.is_empty() {
        return Err(Error::definition(
            f,
            codes::INVALID_DEFINITION,
            "`sequence_by` is empty; name the column(s) that order changes, e.g. sequence_by = \"seq\"",
        ));
    }
    let declared = source_schema(fields)?;
    let (mut seq_idx, mut computed) = (Vec::new(), Vec::new());
    for s in &seq_names {
        for part in sequence_parts(config, s)? {
            let sql = match part {
                Part::Column(name) => {
                    seq_idx.push(find_column(config, &name, "sequence_by")?);
                    continue;
                }
                Part::Expr(sql) => sql,
            };
            let expr =
                SeqExpr::compile(&sql, &declared, &|t: &str| arrow_type(&cast_type(t)?).ok())
                    .map_err(|e| Error::from_predicate(f, e))?;
            let ty = match iceberg_type(expr.data_type()) {
                Some(t) if orderable(&Type::Primitive(t.clone())) => t,
                _ => {
                    return Err(Error::definition(
                        f,
                        codes::NON_ORDERABLE_SEQUENCE,
                        format!(
                            "sequence_by `{sql}` yields {}, which has no order; make it a number, a date, a timestamp or a string",
                            expr.data_type()
                        ),
                    ));
                }
            };
            let idx = fields.len();
            let name = format!("{COMPUTED_PREFIX}{}", seq_idx.len());
            fields.push((idx, name, Type::Primitive(ty.clone()), true));
            computed.push(Computed { idx, expr, ty });
            seq_idx.push(idx);
        }
    }
    for &i in &seq_idx {
        if !orderable(&fields[i].2) {
            return Err(Error::definition(
                f,
                codes::NON_ORDERABLE_SEQUENCE,
                format!(
                    "sequence_by column `{}` has type {} which has no order; use a numeric, temporal or string column (or a struct of them)",
                    fields[i].1, fields[i].2
                ),
            ));
        }
    }
    for &i in &key_idx {
        if !fields[i].2.is_primitive() {
            return Err(Error::definition(
                f,
                codes::INVALID_DEFINITION,
                format!(
                    "key column `{}` is {}; keys are primitive columns (Iceberg identifier fields)",
                    fields[i].1, fields[i].2
                ),
            ));
        }
        if matches!(
            fields[i].2,
            Type::Primitive(PrimitiveType::Float | PrimitiveType::Double)
        ) {
            return Err(Error::definition(
                f,
                codes::INVALID_DEFINITION,
                format!(
                    "key column `{}` is a floating-point column; Iceberg identifier fields cannot be float or double",
                    fields[i].1
                ),
            ));
        }
    }
    Ok((key_idx, seq_idx, computed))
}

/// A Debezium flow's hidden columns (`core::debezium`), after the declared
/// ones; its sequence is their position. What the events give is refused
/// when declared.
fn debezium_columns(
    config: &FlowConfig,
    fields: &mut Vec<Declared>,
    seq_names: &mut Vec<String>,
) -> Result<()> {
    let misplaced = [
        (
            !seq_names.is_empty(),
            "sequence_by (the source position of each event orders them)",
        ),
        (
            config.apply_as_deletes.is_some(),
            "apply_as_deletes (events with op = 'd' delete)",
        ),
        (
            config.apply_as_truncates.is_some(),
            "apply_as_truncates (events with op = 't' truncate)",
        ),
        (config.from_snapshot, "from_snapshot"),
    ];
    if let Some((_, what)) = misplaced.iter().find(|m| m.0) {
        return Err(Error::definition(
            &config.name,
            codes::INVALID_DEFINITION,
            format!("a format = \"debezium\" flow takes no {what}: remove it from the definition"),
        ));
    }
    for (name, ty) in debezium::hidden_columns() {
        fields.push((fields.len(), name.to_string(), ty, true));
    }
    seq_names.extend(debezium::POSITION.iter().map(|s| s.to_string()));
    Ok(())
}

/// A `sequence_by` entry as columns and expressions: a name (plain,
/// backtick-quoted or dotted, which `find_column` refuses) is one column;
/// anything else is an expression, `struct(...)` one part per field.
fn sequence_parts(config: &FlowConfig, s: &str) -> Result<Vec<Part>> {
    let dotted_name = |s: &str| {
        s.split('.').all(|p| {
            p.chars().next().is_some_and(|c| !c.is_ascii_digit())
                && p.chars().all(|c| c.is_alphanumeric() || c == '_')
        })
    };
    let declared = config
        .columns
        .iter()
        .any(|c| c.name.eq_ignore_ascii_case(s));
    if s.is_empty() || s.starts_with('`') || declared || dotted_name(s) {
        return Ok(vec![Part::Column(s.to_string())]);
    }
    seq_expr::parts(s).map_err(|e| Error::from_predicate(&config.name, e))
}

/// The column type a `CAST(x AS name)` names: a column type, or one of the
/// SQL spellings of one (`bigint`, `varchar`, `double precision`, ...).
fn cast_type(name: &str) -> Option<PrimitiveType> {
    let t = name.trim().to_ascii_lowercase();
    let t = match t.as_str() {
        "varchar" | "text" | "char" | "character varying" => "string",
        "timestamp with time zone" | "timestamp_ltz" => "timestamptz",
        "timestamp without time zone" | "timestamp_ntz" => "timestamp",
        "double precision" | "float8" | "float64" => "double",
        "real" | "float4" | "float32" => "float",
        "smallint" | "tinyint" | "int4" | "int32" => "int",
        "int8" | "int64" => "long",
        t => t,
    };
    parse_type(t)
}

/// The Arrow type autocdc reads and writes an Iceberg primitive type as.
pub fn arrow_type(ty: &PrimitiveType) -> Result<arrow_schema::DataType> {
    let nf = NestedField::optional(1, "c", Type::Primitive(ty.clone()));
    let schema = Schema::builder().with_fields(vec![Arc::new(nf)]).build()?;
    Ok(schema_to_arrow_schema(&schema)?
        .field(0)
        .data_type()
        .clone())
}

/// The Iceberg type of a computed Arrow type, if it has one.
fn iceberg_type(t: &arrow_schema::DataType) -> Option<PrimitiveType> {
    use arrow_schema::{DataType as D, TimeUnit};
    Some(match t {
        D::Boolean => PrimitiveType::Boolean,
        D::Int8 | D::Int16 | D::Int32 => PrimitiveType::Int,
        D::Int64 => PrimitiveType::Long,
        D::Float16 | D::Float32 => PrimitiveType::Float,
        D::Float64 => PrimitiveType::Double,
        D::Decimal128(p, s) if *s >= 0 && *p <= 38 => PrimitiveType::Decimal {
            precision: u32::from(*p),
            scale: *s as u32,
        },
        D::Date32 => PrimitiveType::Date,
        D::Time64(TimeUnit::Microsecond) => PrimitiveType::Time,
        D::Timestamp(TimeUnit::Microsecond, None) => PrimitiveType::Timestamp,
        D::Timestamp(TimeUnit::Microsecond, Some(_)) => PrimitiveType::Timestamptz,
        D::Utf8 | D::LargeUtf8 | D::Utf8View => PrimitiveType::String,
        D::Binary | D::LargeBinary | D::BinaryView => PrimitiveType::Binary,
        _ => return None,
    })
}

/// The source columns the target keeps (`column_list` /
/// `except_column_list`); every key among them.
fn selected_columns(
    config: &FlowConfig,
    fields: &[Declared],
    key_idx: &[usize],
) -> Result<Vec<usize>> {
    let f = config.name.as_str();
    let target_cols: Vec<usize> = match (&config.column_list, &config.except_column_list) {
        (Some(_), Some(_)) => {
            return Err(Error::definition(
                f,
                codes::INVALID_SELECTION,
                "column_list and except_column_list are mutually exclusive; keep one",
            ));
        }
        (Some(list), None) => {
            let mut v = Vec::new();
            for c in list {
                let i = find_column(config, c, "column_list")?;
                if !v.contains(&i) {
                    v.push(i);
                }
            }
            v.sort_unstable();
            v
        }
        (None, Some(except)) => {
            let ex = except
                .iter()
                .map(|c| find_column(config, c, "except_column_list"))
                .collect::<Result<HashSet<_>>>()?;
            (0..config.columns.len())
                .filter(|i| !ex.contains(i))
                .collect()
        }
        (None, None) => (0..config.columns.len()).collect(),
    };
    for &k in key_idx {
        if !target_cols.contains(&k) {
            return Err(Error::definition(
                f,
                codes::INVALID_SELECTION,
                format!(
                    "key column `{}` is left out of the target by the column selection; keys must be in the target",
                    fields[k].1
                ),
            ));
        }
    }
    Ok(target_cols)
}

/// The source schema in Arrow, every column nullable so that nulls reach
/// validation (and get a precise error) instead of failing inside Arrow.
fn source_schema(fields: &[Declared]) -> Result<SchemaRef> {
    let all_nullable: Vec<Field> = fields
        .iter()
        .map(|(i, name, ty, _)| {
            let id = *i as i32 + 1;
            let nf = NestedField::optional(id, name, ty.clone());
            let fields = crate::core::nested::number_all(vec![Arc::new(nf)]);
            let schema = Schema::builder().with_fields(fields).build()?;
            let arrow = schema_to_arrow_schema(&schema)?;
            Ok(arrow.field(0).clone())
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Arc::new(ArrowSchema::new(all_nullable)))
}

/// The target's Iceberg schema: the selected columns (field ids 1..n, keys
/// required and, but for SCD Type 2, identifier fields), then for SCD Type 2
/// `__START_AT` / `__END_AT` of the sequence's type.
fn target_schema(
    fields: &[Declared],
    target_cols: &[usize],
    key_idx: &[usize],
    seq_idx: &[usize],
    scd2: bool,
) -> Result<Schema> {
    let mut target_fields = Vec::new();
    for (pos, &i) in target_cols.iter().enumerate() {
        let (_, name, ty, required) = &fields[i];
        let id = pos as i32 + 1;
        let is_key = key_idx.contains(&i);
        let nf = if *required || is_key {
            NestedField::required(id, name, ty.clone())
        } else {
            NestedField::optional(id, name, ty.clone())
        };
        target_fields.push(Arc::new(nf));
    }
    // Identifier ids in key order.
    let identifier: Vec<i32> = key_idx
        .iter()
        .map(|k| {
            target_cols
                .iter()
                .position(|c| c == k)
                .map(|p| p as i32 + 1)
                .unwrap_or(0)
        })
        .collect();
    // SCD Type 2: every version of a key is a row, so the keys identify
    // no row; each version carries the sequence interval it covers.
    let identifier = if scd2 { Vec::new() } else { identifier };
    if scd2 {
        let base = target_cols.len() as i32;
        let mut next = base + 2;
        let mut seq_type = || -> Type {
            if seq_idx.len() == 1 {
                return fields[seq_idx[0]].2.clone();
            }
            let subs = seq_idx
                .iter()
                .map(|&i| {
                    next += 1;
                    Arc::new(NestedField::optional(
                        next,
                        &fields[i].1,
                        fields[i].2.clone(),
                    ))
                })
                .collect::<Vec<_>>();
            Type::Struct(StructType::new(subs))
        };
        let (start, end) = (seq_type(), seq_type());
        target_fields.push(Arc::new(NestedField::optional(base + 1, START_AT, start)));
        target_fields.push(Arc::new(NestedField::optional(base + 2, END_AT, end)));
    }
    Ok(Schema::builder()
        .with_schema_id(0)
        .with_fields(crate::core::nested::number_all(target_fields))
        .with_identifier_field_ids(identifier)
        .build()?)
}

/// The columns whose change opens a new SCD Type 2 version. As in Spark's
/// AUTO CDC, by default every target column but the keys, the sequence
/// columns included when the target keeps them; a list or an except list
/// names target columns that are not keys.
fn tracked_columns(
    config: &FlowConfig,
    target_cols: &[usize],
    key_idx: &[usize],
) -> Result<Vec<usize>> {
    let value_cols = without(target_cols, key_idx);
    Ok(value_selection(
        config,
        &value_cols,
        [
            (
                "track_history_column_list",
                &config.track_history_column_list,
            ),
            (
                "track_history_except_column_list",
                &config.track_history_except_column_list,
            ),
        ],
    )?
    .unwrap_or(value_cols))
}

/// The value columns whose null in an upsert keeps the current value:
/// every one with `ignore_null_updates = true`, or those a list names (or
/// an except list leaves), Spark's column-subset form.
fn ignored_columns(
    config: &FlowConfig,
    target_cols: &[usize],
    key_idx: &[usize],
) -> Result<Vec<usize>> {
    let value_cols = without(target_cols, key_idx);
    if config.format == InputFormat::Debezium {
        return toasted_columns(config, &value_cols);
    }
    if config.toasted_columns.is_some() {
        return Err(Error::definition(
            &config.name,
            codes::INVALID_DEFINITION,
            "toasted_columns is for format = \"debezium\" flows (Debezium's placeholder for an unchanged TOASTed value)",
        ));
    }
    let selected = value_selection(
        config,
        &value_cols,
        [
            (
                "ignore_null_updates_column_list",
                &config.ignore_null_updates_column_list,
            ),
            (
                "ignore_null_updates_except_column_list",
                &config.ignore_null_updates_except_column_list,
            ),
        ],
    )?;
    Ok(match selected {
        Some(cols) => cols,
        None if config.ignore_null_updates => value_cols,
        None => Vec::new(),
    })
}

/// A Debezium flow's columns whose placeholder keeps the earlier value
/// (`toasted_columns`: string or binary value columns). Its nulls are
/// values: the `ignore_null_updates` settings are refused.
fn toasted_columns(config: &FlowConfig, value_cols: &[usize]) -> Result<Vec<usize>> {
    let f = config.name.as_str();
    if config.ignore_null_updates
        || config.ignore_null_updates_column_list.is_some()
        || config.ignore_null_updates_except_column_list.is_some()
    {
        return Err(Error::definition(
            f,
            codes::INVALID_DEFINITION,
            "a format = \"debezium\" flow takes no ignore_null_updates: a null in an event is the column's value; name the columns whose untouched TOASTed values arrive as a placeholder in toasted_columns",
        ));
    }
    let Some(names) = &config.toasted_columns else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for name in names {
        let c = find_column(config, name, "toasted_columns")?;
        if !value_cols.contains(&c) {
            return Err(Error::definition(
                f,
                codes::INVALID_SELECTION,
                format!("toasted_columns names `{name}`, which is a key or not in the target"),
            ));
        }
        let ty = config.columns[c].ty.trim().to_ascii_lowercase();
        if ty != "string" && ty != "binary" {
            return Err(Error::definition(
                f,
                codes::INVALID_DEFINITION,
                format!(
                    "toasted_columns names `{name}` of type {ty}; Debezium's placeholder fills string and binary columns"
                ),
            ));
        }
        if !out.contains(&c) {
            out.push(c);
        }
    }
    Ok(out)
}

fn without(cols: &[usize], drop: &[usize]) -> Vec<usize> {
    cols.iter().copied().filter(|c| !drop.contains(c)).collect()
}

/// The value columns (target order) a setting's list names, or its except
/// list leaves; None when neither is set. A list names target columns that
/// are not keys; an except list may name any declared column.
fn value_selection(
    config: &FlowConfig,
    value_cols: &[usize],
    [(list_name, list), (except_name, except)]: [(&str, &Option<Vec<String>>); 2],
) -> Result<Option<Vec<usize>>> {
    let f = config.name.as_str();
    Ok(match (list, except) {
        (Some(_), Some(_)) => {
            return Err(Error::definition(
                f,
                codes::INVALID_SELECTION,
                format!("{list_name} and {except_name} are mutually exclusive; keep one"),
            ));
        }
        (Some(names), None) => {
            let mut set = HashSet::new();
            for c in names {
                let i = find_column(config, c, list_name)?;
                if !value_cols.contains(&i) {
                    return Err(Error::definition(
                        f,
                        codes::INVALID_SELECTION,
                        format!(
                            "{list_name} names `{c}`, which is a key or not a target column; list target columns that are not keys"
                        ),
                    ));
                }
                set.insert(i);
            }
            Some(
                value_cols
                    .iter()
                    .copied()
                    .filter(|c| set.contains(c))
                    .collect(),
            )
        }
        (None, Some(names)) => {
            let set: HashSet<usize> = names
                .iter()
                .map(|c| find_column(config, c, except_name))
                .collect::<Result<_>>()?;
            Some(
                value_cols
                    .iter()
                    .copied()
                    .filter(|c| !set.contains(c))
                    .collect(),
            )
        }
        (None, None) => None,
    })
}

/// The flow's durations and bounds: tombstone lifetime, commit policy, key length.
fn settings(config: &FlowConfig) -> Result<(Duration, CommitPolicy, usize)> {
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

fn maintenance_policy(config: &FlowConfig) -> Result<MaintenancePolicy> {
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

fn compaction_policy(config: &FlowConfig) -> Result<CompactionPolicy> {
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

/// Parses one `partition_by` entry: `col` (identity), Iceberg's notation
/// (`identity(col)`, `bucket[16](col)`, `truncate[4](col)`, `year(col)`,
/// `month(col)`, `day(col)`, `hour(col)`) or Spark's (`bucket(16, col)`,
/// `truncate(4, col)`, `years(col)`, `months(col)`, `days(col)`, `hours(col)`).
pub fn parse_partition_field(s: &str) -> Option<(String, Transform)> {
    let s = s.trim();
    let Some(open) = s.find('(') else {
        return Some((s.to_string(), Transform::Identity));
    };
    let inner = s[open + 1..].strip_suffix(')')?;
    let name = s[..open].trim().to_ascii_lowercase();
    let args: Vec<&str> = inner.split(',').map(str::trim).collect();
    let (transform, col) = match (name.as_str(), args.as_slice()) {
        ("bucket", [n, col]) => (Transform::Bucket(n.parse().ok()?), *col),
        ("truncate", [w, col]) => (Transform::Truncate(w.parse().ok()?), *col),
        ("years", [col]) => (Transform::Year, *col),
        ("months", [col]) => (Transform::Month, *col),
        ("days", [col]) => (Transform::Day, *col),
        ("hours", [col]) => (Transform::Hour, *col),
        (t, [col]) => match t.parse::<Transform>().ok()? {
            t @ (Transform::Identity
            | Transform::Bucket(_)
            | Transform::Truncate(_)
            | Transform::Year
            | Transform::Month
            | Transform::Day
            | Transform::Hour) => (t, *col),
            _ => return None,
        },
        _ => return None,
    };
    if col.is_empty() || col.contains(['(', ')', ' ']) {
        return None;
    }
    if matches!(transform, Transform::Bucket(0) | Transform::Truncate(0)) {
        return None;
    }
    Some((col.to_string(), transform))
}

/// The partition field's name, as Iceberg Java names them.
fn partition_field_name(col: &str, t: &Transform) -> String {
    match t {
        Transform::Identity => col.to_string(),
        Transform::Bucket(_) => format!("{col}_bucket"),
        Transform::Truncate(_) => format!("{col}_trunc"),
        Transform::Year => format!("{col}_year"),
        Transform::Month => format!("{col}_month"),
        Transform::Day => format!("{col}_day"),
        Transform::Hour => format!("{col}_hour"),
        _ => format!("{col}_{t}"),
    }
}

fn partition_spec(
    flow: &str,
    entries: &[String],
    schema: &Schema,
    case_sensitive: bool,
) -> Result<PartitionSpec> {
    let mut b = PartitionSpec::builder(schema.clone()).with_spec_id(0);
    for e in entries {
        let Some((col, t)) = parse_partition_field(e) else {
            return Err(Error::definition(
                flow,
                codes::INVALID_DEFINITION,
                format!(
                    "partition_by entry `{e}` is not a partition transform; write `col`, `bucket[16](col)`, `truncate[4](col)`, `year(col)`, `month(col)`, `day(col)` or `hour(col)`"
                ),
            ));
        };
        let col = parse_ident(flow, &col)?;
        let found = schema
            .as_struct()
            .fields()
            .iter()
            .find(|f| f.name == col)
            .or_else(|| {
                (!case_sensitive)
                    .then(|| {
                        schema
                            .as_struct()
                            .fields()
                            .iter()
                            .find(|f| f.name.eq_ignore_ascii_case(&col))
                    })
                    .flatten()
            });
        let Some(field) = found else {
            return Err(Error::definition(
                flow,
                codes::COLUMNS_NOT_FOUND,
                format!(
                    "partition_by column `{col}` is not a column of the target ({}); partition on a target column",
                    schema
                        .as_struct()
                        .fields()
                        .iter()
                        .map(|f| f.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        };
        let ty = field.field_type.to_string();
        let col = field.name.clone();
        b = b
            .add_partition_field(&col, partition_field_name(&col, &t), t)
            .map_err(|err| {
                Error::definition(
                    flow,
                    codes::INVALID_DEFINITION,
                    format!(
                        "partition_by entry `{e}` does not apply to column `{col}` of type {ty}: {}",
                        err.message()
                    ),
                )
            })?;
    }
    Ok(b.build()?)
}

/// A column name as written in a key, sequence, list or partition entry:
/// plain (`city`), or quoted with backticks (`` `a.b` ``, a doubled backtick
/// for one) when it holds a dot. An unquoted dotted name is a multi-part
/// identifier, which names no top-level column.
pub fn parse_ident(flow: &str, text: &str) -> Result<String> {
    let bad = |message: String| Err(Error::definition(flow, codes::INVALID_DEFINITION, message));
    if let Some(inner) = text.strip_prefix('`') {
        let Some(inner) = inner.strip_suffix('`') else {
            return bad(format!("`{text}` opens a backtick quote it does not close"));
        };
        let name = inner.replace("``", "`");
        if name.is_empty() || inner.replace("``", "").contains('`') {
            return bad(format!(
                "{text} is not a quoted column name; write `a.b` in backticks, a backtick inside as two"
            ));
        }
        return Ok(name);
    }
    if text.contains('.') {
        return Err(Error::definition(
            flow,
            codes::MULTIPART_IDENTIFIER,
            format!(
                "`{text}` is a multi-part identifier; use the plain column name (`{}`), or quote a name that holds a dot with backticks",
                text.rsplit('.').next().unwrap_or(text)
            ),
        ));
    }
    if text.is_empty() {
        return bad("a column name is empty".into());
    }
    Ok(text.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> FlowConfig {
        toml::from_str(
            r#"
            name = "customers"
            target = "crm.customers"
            keys = ["id"]
            sequence_by = "seq"
            apply_as_deletes = "op = 'DELETE'"
            except_column_list = ["op"]
            columns = [
              { name = "id", type = "long", required = true },
              { name = "city", type = "string" },
              { name = "op", type = "string" },
              { name = "seq", type = "long", required = true },
            ]
            "#,
        )
        .unwrap()
    }

    fn code_of(c: FlowConfig) -> &'static str {
        Flow::new(c).unwrap_err().code()
    }

    #[test]
    fn valid_flow_builds_target_schema_with_identifier_keys() {
        let f = Flow::new(base()).unwrap();
        let names: Vec<_> = f
            .target_schema
            .as_struct()
            .fields()
            .iter()
            .map(|f| f.name.clone())
            .collect();
        assert_eq!(names, ["id", "city", "seq"]);
        assert_eq!(
            f.target_schema.identifier_field_ids().collect::<Vec<_>>(),
            vec![1]
        );
        assert!(f.target_schema.as_struct().fields()[0].required);
        assert_eq!(f.state_ident().name(), "customers__autocdc_state");
        assert_eq!(f.tombstone_gc, Duration::from_secs(172_800));
    }

    #[test]
    fn empty_keys() {
        let mut c = base();
        c.keys.clear();
        assert_eq!(code_of(c), codes::EMPTY_KEYS);
    }

    #[test]
    fn unknown_key_column() {
        let mut c = base();
        c.keys = vec!["customer_id".into()];
        let e = Flow::new(c).unwrap_err();
        assert_eq!(e.code(), codes::COLUMNS_NOT_FOUND);
        assert!(e.to_string().contains("customer_id"));
    }

    #[test]
    fn multipart_sequence() {
        let mut c = base();
        c.sequence_by = OneOrMany::One("changes.seq".into());
        let e = Flow::new(c).unwrap_err();
        assert_eq!(e.code(), codes::MULTIPART_IDENTIFIER);
        assert!(e.to_string().contains("`seq`"), "{e}");
    }

    #[test]
    fn reserved_column() {
        let mut c = base();
        c.columns.push(ColumnDef {
            name: "__START_AT".into(),
            ty: "long".into(),
            required: false,
            renamed_from: None,
        });
        assert_eq!(code_of(c), codes::RESERVED_COLUMN);
    }

    #[test]
    fn both_selections() {
        let mut c = base();
        c.column_list = Some(vec!["id".into()]);
        assert_eq!(code_of(c), codes::INVALID_SELECTION);
    }

    #[test]
    fn key_left_out_of_selection() {
        let mut c = base();
        c.except_column_list = Some(vec!["id".into()]);
        assert_eq!(code_of(c), codes::INVALID_SELECTION);
    }

    #[test]
    fn boolean_sequence_is_not_orderable() {
        let mut c = base();
        c.columns.push(ColumnDef {
            name: "flag".into(),
            ty: "boolean".into(),
            required: false,
            renamed_from: None,
        });
        c.sequence_by = OneOrMany::Many(vec!["seq".into(), "flag".into()]);
        assert_eq!(code_of(c), codes::NON_ORDERABLE_SEQUENCE);
    }

    #[test]
    fn scd_types_other_than_1_and_2_are_rejected() {
        let mut c = base();
        c.stored_as_scd_type = 3;
        assert_eq!(code_of(c), codes::INVALID_DEFINITION);
    }

    #[test]
    fn scd2_target_has_the_interval_columns_and_no_identifier() {
        let mut c = base();
        c.stored_as_scd_type = 2;
        let f = Flow::new(c).unwrap();
        let fields = f.target_schema.as_struct().fields();
        let names: Vec<_> = fields.iter().map(|f| f.name.clone()).collect();
        assert_eq!(names, ["id", "city", "seq", START_AT, END_AT]);
        assert_eq!(fields[3].field_type, fields[2].field_type);
        assert!(!fields[4].required);
        assert_eq!(f.target_schema.identifier_field_ids().count(), 0);
        // Tracked by default, as in Spark: every value column, the sequence too.
        assert_eq!(f.tracked, vec![1, 3]);
        assert!(f.keeps_history());
    }

    #[test]
    fn truncates_are_rejected_on_scd2() {
        let mut c = base();
        c.stored_as_scd_type = 2;
        c.apply_as_truncates = Some("op = 'TRUNCATE'".into());
        let e = Flow::new(c).unwrap_err();
        assert_eq!(e.code(), "AUTOCDC_TRUNCATE_SCD2_NOT_SUPPORTED");
    }

    #[test]
    fn track_history_needs_scd2_and_plain_value_columns() {
        let mut c = base();
        c.track_history_column_list = Some(vec!["city".into()]);
        assert_eq!(code_of(c.clone()), codes::INVALID_DEFINITION);
        c.stored_as_scd_type = 2;
        assert!(Flow::new(c.clone()).is_ok());
        // A sequence column kept in the target may be tracked (Spark's default tracks it).
        c.track_history_column_list = Some(vec!["seq".into()]);
        assert_eq!(Flow::new(c.clone()).unwrap().tracked, vec![3]);
        c.track_history_column_list = Some(vec!["id".into()]);
        assert_eq!(code_of(c.clone()), codes::INVALID_SELECTION);
        c.track_history_except_column_list = Some(vec!["city".into()]);
        assert_eq!(code_of(c.clone()), codes::INVALID_SELECTION);
        c.track_history_column_list = None;
        assert_eq!(Flow::new(c).unwrap().tracked, vec![3]);
    }

    #[test]
    fn ignore_nulls_of_some_columns_take_a_list_or_an_except_list() {
        let mut c = base();
        assert!(Flow::new(c.clone()).unwrap().ignore_null_cols.is_empty());
        c.ignore_null_updates = true;
        assert_eq!(Flow::new(c.clone()).unwrap().ignore_null_cols, vec![1, 3]);
        c.ignore_null_updates = false;
        c.ignore_null_updates_column_list = Some(vec!["city".into()]);
        let f = Flow::new(c.clone()).unwrap();
        assert_eq!(
            (f.ignore_null_cols.clone(), f.keeps_history()),
            (vec![1], true)
        );
        c.ignore_null_updates_column_list = Some(vec!["id".into()]);
        assert_eq!(code_of(c.clone()), codes::INVALID_SELECTION);
        c.ignore_null_updates_column_list = Some(vec!["op".into()]);
        assert_eq!(code_of(c.clone()), codes::INVALID_SELECTION);
        c.ignore_null_updates_column_list = Some(vec!["nope".into()]);
        assert_eq!(code_of(c.clone()), codes::COLUMNS_NOT_FOUND);
        c.ignore_null_updates_except_column_list = Some(vec!["city".into()]);
        assert_eq!(code_of(c.clone()), codes::INVALID_SELECTION);
        c.ignore_null_updates_column_list = None;
        assert_eq!(Flow::new(c.clone()).unwrap().ignore_null_cols, vec![3]);
        // Every column excepted: nothing is ignored, no history is kept.
        c.ignore_null_updates_except_column_list = Some(vec!["city".into(), "seq".into()]);
        assert!(!Flow::new(c.clone()).unwrap().keeps_history());
        c.from_snapshot = true;
        c.sequence_by = OneOrMany::default();
        c.apply_as_deletes = None;
        assert_eq!(code_of(c), codes::INVALID_DEFINITION);
    }

    /// Spark resolves names regardless of case by default; backticks quote
    /// a name that holds a dot; an unquoted dotted name stays multi-part.
    #[test]
    fn names_resolve_regardless_of_case_and_quoted_with_backticks() {
        let mut c = base();
        c.keys = vec!["ID".into()];
        c.sequence_by = OneOrMany::One("Seq".into());
        c.except_column_list = Some(vec!["OP".into()]);
        c.partition_by = vec!["bucket[4](Id)".into()];
        let f = Flow::new(c.clone()).unwrap();
        assert_eq!((f.key_idx.clone(), f.seq_idx.clone()), (vec![0], vec![3]));
        assert_eq!(f.target_cols, vec![0, 1, 3]);
        assert_eq!(f.partition_spec.fields().len(), 1);
        assert_eq!(f.input_column("CITY"), Some(1));
        c.case_sensitive = true;
        assert_eq!(code_of(c.clone()), codes::COLUMNS_NOT_FOUND);

        let mut c = base();
        c.columns[1].name = "addr.city".into();
        c.keys = vec!["id".into(), "`addr.city`".into()];
        let f = Flow::new(c.clone()).unwrap();
        assert_eq!(f.key_idx, vec![0, 1]);
        assert_eq!(f.column_name(1), "addr.city");
        for (key, code) in [
            ("addr.city", codes::MULTIPART_IDENTIFIER),
            ("`addr.city", codes::INVALID_DEFINITION),
            ("``", codes::INVALID_DEFINITION),
            ("`a`b`", codes::INVALID_DEFINITION),
        ] {
            c.keys = vec![key.into()];
            assert_eq!(code_of(c.clone()), code, "{key}");
        }
        c.columns[1].name = "a`b".into();
        c.keys = vec!["`a``b`".into()];
        assert_eq!(Flow::new(c).unwrap().key_idx, vec![1]);
    }

    #[test]
    fn partition_by_parses_iceberg_and_spark_notation() {
        for (text, col, t) in [
            ("city", "city", Transform::Identity),
            ("identity(city)", "city", Transform::Identity),
            ("bucket[16](id)", "id", Transform::Bucket(16)),
            ("bucket(16, id)", "id", Transform::Bucket(16)),
            ("truncate[2](city)", "city", Transform::Truncate(2)),
            ("truncate(2, city)", "city", Transform::Truncate(2)),
            ("day(ts)", "ts", Transform::Day),
            ("days(ts)", "ts", Transform::Day),
            (" HOUR( ts ) ", "ts", Transform::Hour),
            ("year(ts)", "ts", Transform::Year),
            ("month(ts)", "ts", Transform::Month),
        ] {
            assert_eq!(
                parse_partition_field(text),
                Some((col.to_string(), t)),
                "{text}"
            );
        }
        for bad in [
            "bucket(id)",
            "bucket[0](id)",
            "void(id)",
            "day(ts",
            "f(a, b)",
            "day()",
        ] {
            assert_eq!(parse_partition_field(bad), None, "{bad}");
        }
    }

    #[test]
    fn partition_by_builds_a_bound_spec() {
        let mut c = base();
        c.partition_by = vec!["bucket[8](id)".into(), "truncate[1](city)".into()];
        let f = Flow::new(c).unwrap();
        let names: Vec<_> = f
            .partition_spec
            .fields()
            .iter()
            .map(|p| (p.name.clone(), p.source_id, p.transform))
            .collect();
        assert_eq!(
            names,
            [
                ("id_bucket".to_string(), 1, Transform::Bucket(8)),
                ("city_trunc".to_string(), 2, Transform::Truncate(1)),
            ]
        );
        assert!(Flow::new(base()).unwrap().partition_spec.is_unpartitioned());
    }

    #[test]
    fn partition_by_errors_name_the_entry() {
        let mut c = base();
        c.partition_by = vec!["day(op)".into()];
        // `op` is left out of the target by except_column_list.
        let e = Flow::new(c).unwrap_err();
        assert_eq!(e.code(), codes::COLUMNS_NOT_FOUND);
        assert!(e.to_string().contains("`op`"), "{e}");
        let mut c = base();
        c.partition_by = vec!["day(city)".into()];
        let e = Flow::new(c).unwrap_err();
        assert_eq!(e.code(), codes::INVALID_DEFINITION);
        assert!(
            e.to_string().contains("day(city)") && e.to_string().contains("string"),
            "{e}"
        );
        let mut c = base();
        c.partition_by = vec!["zorder(city)".into()];
        let e = Flow::new(c).unwrap_err();
        assert_eq!(e.code(), codes::INVALID_DEFINITION);
        assert!(e.to_string().contains("zorder(city)"), "{e}");
    }

    #[test]
    fn bad_delete_expression_names_column() {
        let mut c = base();
        c.apply_as_deletes = Some("operation = 'DELETE'".into());
        let e = Flow::new(c).unwrap_err();
        assert_eq!(e.code(), codes::COLUMNS_NOT_FOUND);
        assert!(e.to_string().contains("operation"));
    }

    #[test]
    fn types_parse() {
        assert_eq!(
            parse_type("decimal(10, 2)"),
            Some(PrimitiveType::Decimal {
                precision: 10,
                scale: 2
            })
        );
        assert_eq!(parse_type("timestamptz"), Some(PrimitiveType::Timestamptz));
        assert_eq!(parse_type("decimal(2,5)"), None);
        assert_eq!(parse_type("varchar"), None);
    }

    #[test]
    fn multi_level_namespace() {
        let mut c = base();
        c.target = "a.b.customers".into();
        let f = Flow::new(c).unwrap();
        assert_eq!(f.target.namespace().as_ref().len(), 2);
        let mut c = base();
        c.target = "customers".into();
        assert_eq!(code_of(c), codes::INVALID_DEFINITION);
    }
}
