//! Catalogs: where a table's current metadata lives and how a new version is
//! committed atomically. autocdc produces its own snapshots (iceberg-rust 0.10
//! has no row-delta commit), so each catalog takes our `TableUpdate`s and
//! `TableRequirement`s and commits them its own way.
//!
//! API boundary: the engine sees only `Catalog` and `TableState`.

pub mod hadoop;
pub mod rest;
pub mod sql;

use std::collections::HashMap;
use std::sync::Arc;

use iceberg::io::FileIO;
use iceberg::spec::{
    FormatVersion, Schema, SortOrder, TableMetadata, TableMetadataBuilder, TableMetadataRef,
    UnboundPartitionSpec,
};
use iceberg::table::Table;
use iceberg::{TableIdent, TableRequirement, TableUpdate};

use crate::config::CatalogConfig;
use crate::error::{Error, Result, codes};

/// One loaded version of a table.
#[derive(Debug, Clone)]
pub struct TableState {
    pub ident: TableIdent,
    pub metadata: TableMetadataRef,
    pub metadata_location: String,
}

impl TableState {
    /// An `iceberg::table::Table` over this version, for scans and manifest reads.
    pub fn table(&self, file_io: &FileIO) -> Result<Table> {
        Ok(Table::builder()
            .identifier(self.ident.clone())
            .metadata(self.metadata.clone())
            .metadata_location(self.metadata_location.clone())
            .file_io(file_io.clone())
            .runtime(iceberg::Runtime::try_current()?)
            .readonly(true)
            .build()?)
    }

    pub fn location(&self) -> &str {
        self.metadata.location()
    }
}

#[async_trait::async_trait]
pub trait Catalog: Send + Sync + std::fmt::Debug {
    /// The FileIO for data, delete, manifest and metadata files.
    fn file_io(&self) -> &FileIO;

    /// The storage under the tables' locations, when this process can list
    /// it (orphan cleanup needs to); the REST catalog's is the server's.
    fn storage(&self) -> Option<&crate::table::storage::Storage> {
        None
    }

    /// The table's current version, or `None` when it does not exist.
    async fn load_table(&self, ident: &TableIdent) -> Result<Option<TableState>>;

    /// Creates an empty format-v2 table; fails if it exists.
    async fn create_table(
        &self,
        ident: &TableIdent,
        schema: Schema,
        spec: UnboundPartitionSpec,
        properties: HashMap<String, String>,
    ) -> Result<TableState>;

    /// Atomically moves the table from `base` to `base + updates`, provided
    /// the requirements hold and nobody committed since `base`; otherwise
    /// `Error::CommitConflict` and nothing changes.
    async fn commit(
        &self,
        base: &TableState,
        updates: Vec<TableUpdate>,
        requirements: Vec<TableRequirement>,
    ) -> Result<TableState>;

    /// Removes the table and its files. Returns false when it did not exist.
    async fn drop_table(&self, ident: &TableIdent) -> Result<bool>;
}

/// `<root>/<ns...>/<table>`: where both catalogs put a table.
pub(crate) fn table_location(root: &str, ident: &TableIdent) -> String {
    let mut loc = root.to_string();
    for part in ident.namespace().as_ref() {
        loc.push('/');
        loc.push_str(part);
    }
    loc.push('/');
    loc.push_str(ident.name());
    loc
}

/// The first metadata of a new format-v2 table.
pub(crate) fn new_metadata(
    location: String,
    schema: Schema,
    spec: UnboundPartitionSpec,
    properties: HashMap<String, String>,
) -> Result<TableMetadata> {
    Ok(TableMetadataBuilder::new(
        schema,
        spec,
        SortOrder::unsorted_order(),
        location,
        FormatVersion::V2,
        properties,
    )?
    .build()?
    .metadata)
}

/// `base` moved forward by `updates`, once `requirements` hold on it; and
/// the metadata files its log no longer keeps
/// (`write.metadata.previous-versions-max`).
pub(crate) fn apply_updates(
    base: &TableState,
    updates: Vec<TableUpdate>,
    requirements: &[TableRequirement],
) -> Result<(TableMetadata, Vec<String>)> {
    for r in requirements {
        r.check(Some(&base.metadata))
            .map_err(|e| Error::CommitConflict(format!("table {}: {e}", base.ident)))?;
    }
    let mut builder = TableMetadataBuilder::new_from_metadata(
        (*base.metadata).clone(),
        Some(base.metadata_location.clone()),
    );
    for u in updates {
        builder = u.apply(builder)?;
    }
    let built = builder.build()?;
    let superseded = built
        .expired_metadata_logs
        .into_iter()
        .map(|l| l.metadata_file)
        .collect();
    Ok((built.metadata, superseded))
}

/// After a commit has landed: deletes the metadata files its log dropped,
/// when the table asks for it (`write.metadata.delete-after-commit.enabled`).
/// A failure is only logged; orphan cleanup finds the file later.
pub(crate) async fn delete_superseded(
    storage: &crate::table::storage::Storage,
    metadata: &TableMetadata,
    superseded: Vec<String>,
) {
    if !crate::table::properties::delete_after_commit(metadata) {
        return;
    }
    for file in superseded {
        if let Err(e) = storage.delete(&file).await {
            tracing::warn!(file = %file, error = %e, "metadata_delete_failed");
        }
    }
}

/// The version of `ident` whose metadata file is `file` (the one the catalog names).
pub(crate) async fn read_metadata(
    storage: &crate::table::storage::Storage,
    ident: &TableIdent,
    file: String,
) -> Result<TableState> {
    let bytes = storage.get(&file).await?.ok_or_else(|| Error::State {
        code: codes::METADATA_MISSING,
        message: format!("table {ident}: the catalog names {file}, which does not exist"),
    })?;
    let metadata: TableMetadata = serde_json::from_slice(&bytes)?;
    Ok(TableState {
        ident: ident.clone(),
        metadata: Arc::new(metadata),
        metadata_location: file,
    })
}

/// Opens the catalog a configuration names.
pub fn open(config: &CatalogConfig, faults: Arc<crate::fault::Faults>) -> Result<Arc<dyn Catalog>> {
    match config {
        CatalogConfig::Hadoop { warehouse, s3 } => Ok(Arc::new(hadoop::HadoopCatalog::new(
            warehouse,
            s3.as_ref(),
            faults,
        )?)),
        CatalogConfig::Sql {
            uri,
            name,
            warehouse,
            s3,
        } => Ok(Arc::new(sql::SqlCatalog::new(
            uri,
            name,
            warehouse,
            s3.as_ref(),
            faults,
        )?)),
        CatalogConfig::Rest(cfg) => Ok(Arc::new(rest::RestCatalog::new(cfg)?)),
    }
}
