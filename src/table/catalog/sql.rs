//! A JDBC-compatible SQL catalog on PostgreSQL, in the layout of Iceberg
//! Java's JdbcCatalog: one row per table in `iceberg_tables` (catalog name,
//! namespace, table name, `metadata_location`, `previous_metadata_location`).
//! Metadata files are `<table>/metadata/<NNNNN>-<uuid>.metadata.json` as Java
//! names them. The commit point is a compare-and-swap of `metadata_location`
//! whose affected-row count is checked: 0 rows means another writer won.
//!
//! sqlx is used directly rather than iceberg-catalog-sql: the commit must
//! check the rows affected (that crate ignores its transaction's result), and
//! load/create are a few statements each.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use iceberg::io::FileIO;
use iceberg::spec::{Schema, TableMetadata, UnboundPartitionSpec};
use iceberg::{TableIdent, TableRequirement, TableUpdate};
use sqlx::postgres::{PgPool, PgPoolOptions};

use super::{Catalog, TableState};
use crate::config::S3Config;
use crate::error::{Error, Result};
use crate::fault::{FaultPoint, Faults};
use crate::table::storage::Storage;

#[derive(Debug)]
pub struct SqlCatalog {
    pool: PgPool,
    name: String,
    uri: String,
    storage: Storage,
    root: String,
    file_io: FileIO,
    faults: Arc<Faults>,
    ready: tokio::sync::OnceCell<()>,
}

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS iceberg_tables (
    catalog_name VARCHAR(255) NOT NULL,
    table_namespace VARCHAR(255) NOT NULL,
    table_name VARCHAR(255) NOT NULL,
    metadata_location VARCHAR(1000),
    previous_metadata_location VARCHAR(1000),
    iceberg_type VARCHAR(5),
    PRIMARY KEY (catalog_name, table_namespace, table_name))";

const NAMESPACE_PROPS: &str = "CREATE TABLE IF NOT EXISTS iceberg_namespace_properties (
    catalog_name VARCHAR(255) NOT NULL,
    namespace VARCHAR(255) NOT NULL,
    property_key VARCHAR(255),
    property_value VARCHAR(1000),
    PRIMARY KEY (catalog_name, namespace, property_key))";

impl SqlCatalog {
    /// Connects lazily; `init` checks the connection and creates the tables.
    pub fn new(
        uri: &str,
        name: &str,
        warehouse: &str,
        s3: Option<&S3Config>,
        faults: Arc<Faults>,
    ) -> Result<Self> {
        let warehouse = Storage::for_warehouse(warehouse, s3)?;
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(std::time::Duration::from_secs(10))
            .connect_lazy(uri)
            .map_err(|e| Error::Config(format!("catalog.uri: {e}")))?;
        Ok(SqlCatalog {
            pool,
            name: name.to_string(),
            uri: redact(uri),
            storage: warehouse.storage,
            root: warehouse.root,
            file_io: warehouse.file_io,
            faults,
            ready: tokio::sync::OnceCell::new(),
        })
    }

    fn db_err(&self, e: sqlx::Error) -> Error {
        Error::Unavailable(format!("catalog.uri = {}: {e}", self.uri))
    }

    /// Creates the JdbcCatalog tables when missing, once, before first use.
    async fn init(&self) -> Result<()> {
        self.ready
            .get_or_try_init(|| async {
                self.storage.check(&self.root).await?;
                for ddl in [SCHEMA, NAMESPACE_PROPS] {
                    sqlx::query(ddl)
                        .execute(&self.pool)
                        .await
                        .map_err(|e| self.db_err(e))?;
                }
                Ok::<(), Error>(())
            })
            .await?;
        Ok(())
    }

    fn namespace(ident: &TableIdent) -> String {
        ident.namespace().as_ref().join(".")
    }

    fn table_location(&self, ident: &TableIdent) -> String {
        super::table_location(&self.root, ident)
    }

    fn version_of(metadata_location: &str) -> i64 {
        metadata_location
            .rsplit('/')
            .next()
            .and_then(|n| n.split('-').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    async fn write_metadata(&self, metadata: &TableMetadata, version: i64) -> Result<String> {
        let file = format!(
            "{}/metadata/{version:05}-{}.metadata.json",
            metadata.location(),
            uuid::Uuid::new_v4()
        );
        let json = serde_json::to_vec(metadata)?;
        if !self.storage.put_if_absent(&file, Bytes::from(json)).await? {
            return Err(Error::CommitConflict(format!("{file} already exists")));
        }
        Ok(file)
    }
}

fn redact(uri: &str) -> String {
    match (uri.find("://"), uri.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &uri[s + 3..at];
            match creds.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &uri[..s + 3], &uri[at..]),
                None => uri.to_string(),
            }
        }
        _ => uri.to_string(),
    }
}

#[async_trait::async_trait]
impl Catalog for SqlCatalog {
    fn file_io(&self) -> &FileIO {
        &self.file_io
    }

    fn storage(&self) -> Option<&Storage> {
        Some(&self.storage)
    }

    async fn load_table(&self, ident: &TableIdent) -> Result<Option<TableState>> {
        self.init().await?;
        let row: Option<(Option<String>,)> = sqlx::query_as(
            "SELECT metadata_location FROM iceberg_tables
             WHERE catalog_name = $1 AND table_namespace = $2 AND table_name = $3",
        )
        .bind(&self.name)
        .bind(Self::namespace(ident))
        .bind(ident.name())
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| self.db_err(e))?;
        let Some((Some(file),)) = row else {
            return Ok(None);
        };
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
        self.init().await?;
        let metadata = super::new_metadata(self.table_location(ident), schema, spec, properties)?;
        let file = self.write_metadata(&metadata, 0).await?;
        self.storage.sync(metadata.location()).await?;
        let res = sqlx::query(
            "INSERT INTO iceberg_tables
               (catalog_name, table_namespace, table_name, metadata_location, previous_metadata_location, iceberg_type)
             VALUES ($1, $2, $3, $4, NULL, 'TABLE') ON CONFLICT DO NOTHING",
        )
        .bind(&self.name)
        .bind(Self::namespace(ident))
        .bind(ident.name())
        .bind(&file)
        .execute(&self.pool)
        .await
        .map_err(|e| self.db_err(e))?;
        if res.rows_affected() != 1 {
            return Err(Error::CommitConflict(format!(
                "table {ident} was created by another writer first"
            )));
        }
        Ok(TableState {
            ident: ident.clone(),
            metadata: Arc::new(metadata),
            metadata_location: file,
        })
    }

    async fn commit(
        &self,
        base: &TableState,
        updates: Vec<TableUpdate>,
        requirements: Vec<TableRequirement>,
    ) -> Result<TableState> {
        let (metadata, superseded) = super::apply_updates(base, updates, &requirements)?;
        let file = self
            .write_metadata(&metadata, Self::version_of(&base.metadata_location) + 1)
            .await?;
        let is_state = base.ident.name().ends_with("__autocdc_state");
        self.faults.hit(if is_state {
            FaultPoint::AfterStateMetadata
        } else {
            FaultPoint::AfterTargetMetadata
        })?;
        // The files the new metadata names, and the metadata, are durable
        // before the commit point names them.
        self.storage.sync(metadata.location()).await?;
        // The commit point: swap only if nobody committed since `base`.
        let res = sqlx::query(
            "UPDATE iceberg_tables SET metadata_location = $1, previous_metadata_location = $2
             WHERE catalog_name = $3 AND table_namespace = $4 AND table_name = $5
               AND metadata_location = $2",
        )
        .bind(&file)
        .bind(&base.metadata_location)
        .bind(&self.name)
        .bind(Self::namespace(&base.ident))
        .bind(base.ident.name())
        .execute(&self.pool)
        .await
        .map_err(|e| self.db_err(e))?;
        if res.rows_affected() != 1 {
            return Err(Error::CommitConflict(format!(
                "table {}: another writer committed since {}",
                base.ident, base.metadata_location
            )));
        }
        super::delete_superseded(&self.storage, &metadata, superseded).await;
        Ok(TableState {
            ident: base.ident.clone(),
            metadata: Arc::new(metadata),
            metadata_location: file,
        })
    }

    async fn drop_table(&self, ident: &TableIdent) -> Result<bool> {
        self.init().await?;
        let res = sqlx::query(
            "DELETE FROM iceberg_tables
             WHERE catalog_name = $1 AND table_namespace = $2 AND table_name = $3",
        )
        .bind(&self.name)
        .bind(Self::namespace(ident))
        .bind(ident.name())
        .execute(&self.pool)
        .await
        .map_err(|e| self.db_err(e))?;
        let files = self
            .storage
            .delete_prefix(&self.table_location(ident))
            .await?;
        Ok(res.rows_affected() > 0 || files > 0)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn passwords_are_redacted_from_messages() {
        assert_eq!(
            super::redact("postgres://app:s3cret@db:5432/cat"),
            "postgres://app:***@db:5432/cat"
        );
        assert_eq!(super::redact("postgres://db/cat"), "postgres://db/cat");
    }
}
