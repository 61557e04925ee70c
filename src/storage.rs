//! Object storage for what the Iceberg `FileIO` cannot do: create-if-absent
//! (the Hadoop catalog's commit point), listing and deleting directories.
//! Local disk today; S3-compatible stores go through the same `ObjectStore`.

use std::sync::Arc;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use crate::error::{Error, Result};

#[derive(Debug, Clone)]
pub struct Storage {
    store: Arc<dyn ObjectStore>,
}

impl Storage {
    /// Resolves a warehouse setting (a local path or a `file://` URL) to the
    /// store and the warehouse's root location as written into metadata
    /// (`file:///abs/path`). The directory is created if missing.
    pub fn for_warehouse(warehouse: &str) -> Result<(Storage, String)> {
        if let Some((scheme, _)) = warehouse.split_once("://")
            && scheme != "file"
        {
            return Err(Error::Config(format!(
                "warehouse `{warehouse}`: the `{scheme}://` scheme is not supported yet; use a local path"
            )));
        }
        let local = warehouse.strip_prefix("file://").unwrap_or(warehouse);
        std::fs::create_dir_all(local).map_err(|e| {
            Error::Config(format!(
                "warehouse `{warehouse}`: cannot create the directory: {e}"
            ))
        })?;
        let abs = std::fs::canonicalize(local)
            .map_err(|e| Error::Config(format!("warehouse `{warehouse}`: {e}")))?;
        let abs = abs
            .to_str()
            .ok_or_else(|| Error::Config(format!("warehouse `{warehouse}` is not UTF-8")))?
            .trim_end_matches('/')
            .to_string();
        let store = Arc::new(LocalFileSystem::new());
        Ok((Storage { store }, format!("file://{abs}")))
    }

    fn path(&self, location: &str) -> Result<Path> {
        let p = location
            .strip_prefix("file://")
            .ok_or_else(|| Error::Config(format!("location `{location}` is not a file:// URL")))?;
        Path::parse(p.trim_start_matches('/'))
            .map_err(|e| Error::Config(format!("location `{location}`: {e}")))
    }

    pub async fn get(&self, location: &str) -> Result<Option<Bytes>> {
        match self.store.get(&self.path(location)?).await {
            Ok(r) => Ok(Some(r.bytes().await?)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    pub async fn exists(&self, location: &str) -> Result<bool> {
        match self.store.head(&self.path(location)?).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Writes `bytes` only if nothing is at `location`; false when something was.
    pub async fn put_if_absent(&self, location: &str, bytes: Bytes) -> Result<bool> {
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match self
            .store
            .put_opts(&self.path(location)?, PutPayload::from(bytes), opts)
            .await
        {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    pub async fn put(&self, location: &str, bytes: Bytes) -> Result<()> {
        self.store
            .put(&self.path(location)?, PutPayload::from(bytes))
            .await?;
        Ok(())
    }

    /// File names (last path segment) directly or indirectly under `location`.
    pub async fn list(&self, location: &str) -> Result<Vec<String>> {
        let prefix = self.path(location)?;
        let metas: Vec<_> = match self.store.list(Some(&prefix)).try_collect().await {
            Ok(m) => m,
            Err(object_store::Error::NotFound { .. }) => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        Ok(metas
            .into_iter()
            .filter_map(|m| m.location.filename().map(str::to_string))
            .collect())
    }

    /// Deletes everything under `location`; returns how many objects.
    pub async fn delete_prefix(&self, location: &str) -> Result<usize> {
        let prefix = self.path(location)?;
        let metas: Vec<_> = self.store.list(Some(&prefix)).try_collect().await?;
        for m in &metas {
            self.store.delete(&m.location).await?;
        }
        Ok(metas.len())
    }
}
