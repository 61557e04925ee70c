//! Flow definitions: the TOML a user writes, and the validated `Flow` the rest
//! of the crate works with. Validation happens once, here, at load time; every
//! rejection has a stable code and names the column and the fix.
//!
//! `Flow::new` runs the stages a file each: `config` (the serde shapes and
//! the checks that need no column), `columns` (declaration and types),
//! `roles` (keys, sequence, tracked and null-ignoring columns), `target`
//! (the selected columns, the target schema and partition spec) and
//! `policy` (commit, maintenance and compaction settings); `share` says
//! when two flows may write one target. Their public
//! items are re-exported here: every path is `core::flow::X`.

use std::time::Duration;

use arrow_schema::SchemaRef;
use iceberg::TableIdent;
use iceberg::spec::{PartitionSpec, PrimitiveType, Schema, Type};

use crate::core::debezium;
use crate::core::predicate::Predicate;
use crate::core::seq_expr::SeqExpr;
use crate::error::{Error, Result, codes};

mod columns;
mod config;
mod policy;
mod roles;
mod share;
mod target;
#[cfg(test)]
mod tests;

/// At its old path for the service; `core::nested` reads type names.
pub use crate::core::nested::parse_type;
pub use columns::{COMPUTED_PREFIX, END_AT, SNAPSHOT_VERSION, START_AT, arrow_type, parse_ident};
pub use config::{
    ColumnDef, CompactionConfig, FlowConfig, InputFormat, MAX_FLOW_NAME, MAX_PROPERTY_BYTES,
    MAX_TABLE_PROPERTIES, OneOrMany, SchemaEvolution, TiePolicy, parse_table_ident,
};
pub use policy::{
    CommitPolicy, CompactionPolicy, DEFAULT_MAX_KEY_BYTES, MAX_KEY_BYTES_LIMIT, MIN_LOG_BYTES,
    MaintenancePolicy, parse_duration,
};
pub use share::{CUTS_ALONE, FROM_SNAPSHOT_ALONE, check_shared, writes_alone};
pub use target::parse_partition_field;

use columns::{declared_columns, source_schema};
use config::{check_modes, check_name, check_table_properties};
use policy::{compaction_policy, maintenance_policy, settings};
use roles::{ignored_columns, keys_and_sequence, tracked_columns};
use target::{check_drops, partition_spec, selected_columns, target_schema};

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
    /// SCD Type 2 Debezium flows: the rows that are completed snapshots'
    /// cuts (`core::history::Cut`; a real truncate is skipped when read),
    /// which need no key and are no change of a row.
    pub cuts: Option<Predicate>,
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
        let fixed: Vec<&str> = key_idx
            .iter()
            .chain(&seq_idx)
            .filter_map(|&c| fields.iter().find(|f| f.0 == c).map(|f| f.1.as_str()))
            .collect();
        check_drops(&config, &target_schema, &fixed)?;
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
        let (deletes, truncates, cuts) = match config.format {
            InputFormat::Rows => (
                config.apply_as_deletes.clone(),
                config.apply_as_truncates.clone(),
                None,
            ),
            // SCD Type 2 takes no truncates, as Spark's AUTO CDC; its `t`
            // rows are the cuts of completed snapshots.
            InputFormat::Debezium => (
                Some(debezium::DELETES.to_string()),
                (!scd2).then(|| debezium::TRUNCATES.to_string()),
                scd2.then(|| debezium::TRUNCATES.to_string()),
            ),
        };
        let deletes = predicate(&deletes)?;
        let truncates = predicate(&truncates)?;
        let cuts = predicate(&cuts)?;
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
            cuts,
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
