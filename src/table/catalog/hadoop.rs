//! Iceberg Java's HadoopCatalog layout on any object store:
//! `<warehouse>/<ns...>/<table>/metadata/v<N>.metadata.json` plus
//! `version-hint.text`. The commit point is the create-if-absent of
//! `v<N+1>.metadata.json`; the hint is only a hint (readers probe forward
//! from it, as Java's HadoopTableOperations does).

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use iceberg::io::FileIO;
use iceberg::spec::{Schema, TableMetadata, UnboundPartitionSpec};
use iceberg::{TableIdent, TableRequirement, TableUpdate};

use super::{Catalog, TableState};
use crate::config::S3Config;
use crate::error::{Error, Result, codes};
use crate::fault::{FaultPoint, Faults};
use crate::table::storage::Storage;

#[derive(Debug)]
pub struct HadoopCatalog {
    storage: Storage,
    root: String,
    file_io: FileIO,
    faults: Arc<Faults>,
    checked: tokio::sync::OnceCell<()>,
}

const HINT: &str = "version-hint.text";

impl HadoopCatalog {
    pub fn new(warehouse: &str, s3: Option<&S3Config>, faults: Arc<Faults>) -> Result<Self> {
        let warehouse = Storage::for_warehouse(warehouse, s3)?;
        Ok(HadoopCatalog {
            storage: warehouse.storage,
            root: warehouse.root,
            file_io: warehouse.file_io,
            faults,
            checked: tokio::sync::OnceCell::new(),
        })
    }

    /// Checks the warehouse once, before first use.
    async fn ready(&self) -> Result<()> {
        self.checked
            .get_or_try_init(|| self.storage.check(&self.root))
            .await?;
        Ok(())
    }

    pub fn root(&self) -> &str {
        &self.root
    }

    pub fn table_location(&self, ident: &TableIdent) -> String {
        super::table_location(&self.root, ident)
    }

    fn metadata_file(location: &str, version: i64) -> String {
        format!("{location}/metadata/v{version}.metadata.json")
    }

    /// The current version number, or None when the table does not exist.
    async fn current_version(&self, location: &str) -> Result<Option<i64>> {
        let hint = self
            .storage
            .get(&format!("{location}/metadata/{HINT}"))
            .await?
            .and_then(|b| {
                std::str::from_utf8(&b)
                    .ok()
                    .and_then(|s| s.trim().parse::<i64>().ok())
            });
        let mut v = match hint {
            Some(v)
                if self
                    .storage
                    .exists(&Self::metadata_file(location, v))
                    .await? =>
            {
                v
            }
            _ => {
                // No (usable) hint: the highest vN.metadata.json present.
                let names = self.storage.list(&format!("{location}/metadata")).await?;
                match names
                    .iter()
                    .filter_map(|n| {
                        n.strip_prefix('v')?
                            .strip_suffix(".metadata.json")?
                            .parse::<i64>()
                            .ok()
                    })
                    .max()
                {
                    Some(v) => v,
                    None => return Ok(None),
                }
            }
        };
        while self
            .storage
            .exists(&Self::metadata_file(location, v + 1))
            .await?
        {
            v += 1;
        }
        Ok(Some(v))
    }

    fn version_of(metadata_location: &str) -> Result<i64> {
        metadata_location
            .rsplit('/')
            .next()
            .and_then(|n| {
                n.strip_prefix('v')?
                    .strip_suffix(".metadata.json")?
                    .parse()
                    .ok()
            })
            .ok_or_else(|| Error::State {
                code: codes::METADATA_LOCATION,
                message: format!(
                    "`{metadata_location}` is not a Hadoop catalog metadata file (vN.metadata.json)"
                ),
            })
    }

    async fn write_version(
        &self,
        ident: &TableIdent,
        metadata: TableMetadata,
        version: i64,
    ) -> Result<TableState> {
        let location = metadata.location().to_string();
        let file = Self::metadata_file(&location, version);
        let json = serde_json::to_vec(&metadata)?;
        // The files the new metadata names are durable before it is.
        self.storage.sync(&location).await?;
        if !self.storage.put_if_absent(&file, Bytes::from(json)).await? {
            return Err(Error::CommitConflict(format!(
                "table {ident}: {file} already exists; another writer committed first"
            )));
        }
        let is_state = ident.name().ends_with("__autocdc_state");
        self.faults.hit(if is_state {
            FaultPoint::AfterStateMetadata
        } else {
            FaultPoint::AfterTargetMetadata
        })?;
        self.storage
            .put(
                &format!("{location}/metadata/{HINT}"),
                Bytes::from(version.to_string()),
            )
            .await?;
        // The commit is durable before the caller releases what it applied.
        self.storage.sync(&location).await?;
        Ok(TableState {
            ident: ident.clone(),
            metadata: Arc::new(metadata),
            metadata_location: file,
        })
    }
}

#[async_trait::async_trait]
impl Catalog for HadoopCatalog {
    fn file_io(&self) -> &FileIO {
        &self.file_io
    }

    fn storage(&self) -> Option<&Storage> {
        Some(&self.storage)
    }

    async fn load_table(&self, ident: &TableIdent) -> Result<Option<TableState>> {
        self.ready().await?;
        let location = self.table_location(ident);
        let Some(v) = self.current_version(&location).await? else {
            return Ok(None);
        };
        let file = Self::metadata_file(&location, v);
        super::read_metadata(&self.storage, ident, file)
            .await
            .map(Some)
    }

    async fn create_table(
        &self,
        ident: &TableIdent,
        schema: Schema,
        spec: UnboundPartitionSpec,
        properties: HashMap<String, String>,
    ) -> Result<TableState> {
        self.ready().await?;
        let metadata = super::new_metadata(self.table_location(ident), schema, spec, properties)?;
        self.write_version(ident, metadata, 1).await
    }

    async fn commit(
        &self,
        base: &TableState,
        updates: Vec<TableUpdate>,
        requirements: Vec<TableRequirement>,
    ) -> Result<TableState> {
        let version = Self::version_of(&base.metadata_location)?;
        // The new version's file is made only if absent, but that alone is
        // no check against a base more than `previous-versions-max` commits
        // old: the next version's file may have been deleted since, and the
        // commit would land on a version no reader reads (Iceberg Java's
        // HadoopTableOperations refreshes and compares first, too).
        let location = base.metadata.location().to_string();
        if let Some(current) = self.current_version(&location).await?
            && current != version
        {
            return Err(Error::CommitConflict(format!(
                "table {}: its current version is v{current}, not v{version} this commit was made on; another writer committed first",
                base.ident
            )));
        }
        let (metadata, superseded) = super::apply_updates(base, updates, &requirements)?;
        let table = self
            .write_version(&base.ident, metadata, version + 1)
            .await?;
        super::delete_superseded(&self.storage, &table.metadata, superseded).await;
        Ok(table)
    }

    async fn drop_table(&self, ident: &TableIdent) -> Result<bool> {
        let location = self.table_location(ident);
        Ok(self.storage.delete_prefix(&location).await? > 0)
    }
}
