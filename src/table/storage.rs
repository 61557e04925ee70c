//! Object storage for what the Iceberg `FileIO` cannot do: create-if-absent
//! (the Hadoop catalog's commit point), listing and deleting directories.
//! Two backends behind one type: local disk (`object_store`) and
//! S3-compatible stores (`opendal`, the same S3 client the Iceberg `FileIO`
//! uses through `iceberg-storage-opendal`), so data, delete, manifest and
//! metadata files of a table all go through one configuration.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use futures::TryStreamExt;
use iceberg::io::{FileIO, FileIOBuilder};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use crate::config::S3Config;
use crate::error::{Error, Result};
use crate::table::local_files::{self, LocalFilesFactory, Written};

#[derive(Debug, Clone)]
pub struct Storage {
    backend: Backend,
    /// For messages: which S3 endpoint answered.
    endpoint: Option<String>,
    /// On local disk: the files written and not yet synced, the FileIO's
    /// and this storage's own (`sync`).
    written: Arc<Written>,
}

#[derive(Debug, Clone)]
enum Backend {
    Local(Arc<dyn ObjectStore>),
    S3 {
        bucket: String,
        op: opendal::Operator,
    },
}

/// One listed file.
#[derive(Debug, Clone)]
pub struct FileInfo {
    pub location: String,
    pub size: u64,
    pub modified_ms: i64,
}

/// A warehouse resolved: its storage, its root as written into metadata
/// (`file:///abs/path` or `s3://bucket/prefix`) and the FileIO for its files.
#[derive(Debug, Clone)]
pub struct Warehouse {
    pub storage: Storage,
    pub root: String,
    pub file_io: FileIO,
}

impl Storage {
    /// Resolves a warehouse setting: a local path, a `file://` URL, or
    /// `s3://bucket[/prefix]` with the `[catalog.s3]` settings. A local
    /// directory is created if missing.
    pub fn for_warehouse(warehouse: &str, s3: Option<&S3Config>) -> Result<Warehouse> {
        match warehouse.split_once("://") {
            Some(("s3" | "s3a", rest)) => {
                let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
                if bucket.is_empty() {
                    return Err(Error::Config(format!(
                        "warehouse `{warehouse}`: no bucket; write s3://bucket/prefix"
                    )));
                }
                let cfg = s3.cloned().unwrap_or_default();
                let storage = Storage::s3(bucket, &cfg)?;
                let prefix = prefix.trim_matches('/');
                let root = if prefix.is_empty() {
                    format!("s3://{bucket}")
                } else {
                    format!("s3://{bucket}/{prefix}")
                };
                Ok(Warehouse {
                    storage,
                    root,
                    file_io: s3_file_io(&cfg),
                })
            }
            Some(("file", _)) | None => {
                if s3.is_some() {
                    return Err(Error::Config(format!(
                        "[catalog.s3] is set but warehouse `{warehouse}` is a local path; use s3://bucket/prefix"
                    )));
                }
                Storage::local(warehouse)
            }
            Some((scheme, _)) => Err(Error::Config(format!(
                "warehouse `{warehouse}`: the `{scheme}://` scheme is not supported; use a local path or s3://bucket/prefix"
            ))),
        }
    }

    fn local(warehouse: &str) -> Result<Warehouse> {
        let local = warehouse.strip_prefix("file://").unwrap_or(warehouse);
        let written = Arc::new(Written::default());
        // Directories made here become durable with the first commit's
        // sync, which takes those above its table (`local_files`).
        let missing: Vec<std::path::PathBuf> = std::path::absolute(local)
            .map(|a| {
                a.ancestors()
                    .take_while(|d| !d.exists())
                    .map(std::path::Path::to_path_buf)
                    .collect()
            })
            .unwrap_or_default();
        std::fs::create_dir_all(local).map_err(|e| {
            Error::Config(format!(
                "warehouse `{warehouse}`: cannot create the directory: {e}"
            ))
        })?;
        for d in missing {
            if let Ok(d) = std::fs::canonicalize(d) {
                written.made(&d);
            }
        }
        let abs = std::fs::canonicalize(local)
            .map_err(|e| Error::Config(format!("warehouse `{warehouse}`: {e}")))?;
        let abs = abs
            .to_str()
            .ok_or_else(|| Error::Config(format!("warehouse `{warehouse}` is not UTF-8")))?
            .trim_end_matches('/')
            .to_string();
        Ok(Warehouse {
            storage: Storage {
                backend: Backend::Local(Arc::new(LocalFileSystem::new())),
                endpoint: None,
                written: written.clone(),
            },
            root: format!("file://{abs}"),
            file_io: FileIOBuilder::new(Arc::new(LocalFilesFactory::new(written))).build(),
        })
    }

    /// Files written to a local warehouse that no sync has made durable
    /// yet (0 elsewhere): after a commit, none of its tables' are.
    pub fn unsynced_files(&self) -> usize {
        self.written.pending()
    }

    /// Makes what was written under `location` durable, names included:
    /// on local disk the FileIO writes without syncing
    /// (`table::local_files`), so a commit calls this before its metadata
    /// names the new files and once its commit point is written. S3 stores
    /// a file durably when it is written: nothing to do.
    pub async fn sync(&self, location: &str) -> Result<()> {
        if !matches!(self.backend, Backend::Local(_)) {
            return Ok(());
        }
        let at = location.to_string();
        let written = self.written.clone();
        tokio::task::spawn_blocking(move || local_files::sync(&written, &at))
            .await
            .map_err(|e| Error::Io(std::io::Error::other(e)))?
            .map_err(|e| {
                Error::Io(std::io::Error::new(
                    e.kind(),
                    format!("syncing {location}: {e}"),
                ))
            })
    }

    /// Storage for the objects of one S3 bucket.
    pub fn s3(bucket: &str, cfg: &S3Config) -> Result<Storage> {
        let mut b = opendal::services::S3::default().bucket(bucket).root("/");
        if let Some(e) = &cfg.endpoint {
            b = b.endpoint(e);
        }
        b = b.region(cfg.region.as_deref().unwrap_or("us-east-1"));
        if let Some(k) = &cfg.access_key_id {
            b = b.access_key_id(k);
        }
        if let Some(k) = &cfg.secret_access_key {
            b = b.secret_access_key(k);
        }
        if let Some(t) = &cfg.session_token {
            b = b.session_token(t);
        }
        if !cfg.path_style() {
            b = b.enable_virtual_host_style();
        }
        let op = opendal::Operator::new(b)
            .map_err(|e| Error::Config(format!("[catalog.s3]: {e}")))?
            .finish();
        Ok(Storage {
            backend: Backend::S3 {
                bucket: bucket.to_string(),
                op,
            },
            endpoint: cfg.endpoint.clone(),
            written: Arc::default(),
        })
    }

    /// Fails fast, naming the warehouse and the store's answer, when the
    /// warehouse cannot be listed: wrong credentials, a missing bucket, an
    /// unreachable endpoint.
    pub async fn check(&self, root: &str) -> Result<()> {
        let endpoint = self.endpoint.as_deref().unwrap_or("AWS S3");
        match &self.backend {
            Backend::Local(_) => Ok(()),
            Backend::S3 { op, .. } => {
                let path = self.s3_path(root)?;
                let dir = if path.is_empty() {
                    String::new()
                } else {
                    format!("{path}/")
                };
                let check = op.list_with(&dir).limit(1);
                match tokio::time::timeout(std::time::Duration::from_secs(30), check).await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(e)) if e.kind() == opendal::ErrorKind::NotFound => Ok(()),
                    Ok(Err(e)) => Err(Error::Config(format!(
                        "warehouse `{root}` is not usable (S3 endpoint {endpoint}): {}",
                        opendal_message(&e)
                    ))),
                    Err(_) => Err(Error::Config(format!(
                        "warehouse `{root}`: no answer from the S3 endpoint {endpoint} within 30 s (check [catalog.s3] endpoint)"
                    ))),
                }
            }
        }
    }

    fn local_path(location: &str) -> Result<Path> {
        let p = location
            .strip_prefix("file://")
            .ok_or_else(|| Error::Config(format!("location `{location}` is not a file:// URL")))?;
        Path::parse(p.trim_start_matches('/'))
            .map_err(|e| Error::Config(format!("location `{location}`: {e}")))
    }

    /// The key of `location` (`s3://bucket/key`) within this storage's bucket.
    fn s3_path(&self, location: &str) -> Result<String> {
        let Backend::S3 { bucket, .. } = &self.backend else {
            unreachable!("s3_path on local storage")
        };
        let rest = location
            .strip_prefix("s3://")
            .or_else(|| location.strip_prefix("s3a://"))
            .ok_or_else(|| Error::Config(format!("location `{location}` is not an s3:// URL")))?;
        let (b, key) = rest.split_once('/').unwrap_or((rest, ""));
        if b != bucket {
            return Err(Error::Config(format!(
                "location `{location}` is outside the warehouse bucket `{bucket}`"
            )));
        }
        Ok(key.trim_matches('/').to_string())
    }

    fn s3_err(location: &str, e: opendal::Error) -> Error {
        Error::Unavailable(format!("{location}: {}", opendal_message(&e)))
    }

    pub async fn get(&self, location: &str) -> Result<Option<Bytes>> {
        match &self.backend {
            Backend::Local(store) => match store.get(&Self::local_path(location)?).await {
                Ok(r) => Ok(Some(r.bytes().await?)),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e.into()),
            },
            Backend::S3 { op, .. } => match op.read(&self.s3_path(location)?).await {
                Ok(buf) => Ok(Some(buf.to_bytes())),
                Err(e) if e.kind() == opendal::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(Self::s3_err(location, e)),
            },
        }
    }

    pub async fn exists(&self, location: &str) -> Result<bool> {
        match &self.backend {
            Backend::Local(store) => match store.head(&Self::local_path(location)?).await {
                Ok(_) => Ok(true),
                Err(object_store::Error::NotFound { .. }) => Ok(false),
                Err(e) => Err(e.into()),
            },
            Backend::S3 { op, .. } => op
                .exists(&self.s3_path(location)?)
                .await
                .map_err(|e| Self::s3_err(location, e)),
        }
    }

    /// Writes `bytes` only if nothing is at `location`; false when something was.
    /// On S3 this is a conditional PUT (`If-None-Match: *`).
    pub async fn put_if_absent(&self, location: &str, bytes: Bytes) -> Result<bool> {
        match &self.backend {
            Backend::Local(store) => {
                let opts = PutOptions {
                    mode: PutMode::Create,
                    ..Default::default()
                };
                let path = Self::local_path(location)?;
                let made = self.written.put(location, async {
                    store.put_opts(&path, PutPayload::from(bytes), opts).await
                });
                match made.await {
                    Ok(_) => Ok(true),
                    Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
                    Err(e) => Err(e.into()),
                }
            }
            Backend::S3 { op, .. } => {
                match op
                    .write_with(&self.s3_path(location)?, bytes)
                    .if_not_exists(true)
                    .await
                {
                    Ok(_) => Ok(true),
                    Err(e) if e.kind() == opendal::ErrorKind::ConditionNotMatch => Ok(false),
                    Err(e) => Err(Self::s3_err(location, e)),
                }
            }
        }
    }

    pub async fn put(&self, location: &str, bytes: Bytes) -> Result<()> {
        match &self.backend {
            Backend::Local(store) => {
                let path = Self::local_path(location)?;
                let put = store.put(&path, PutPayload::from(bytes));
                self.written.put(location, put).await?;
                Ok(())
            }
            Backend::S3 { op, .. } => {
                op.write(&self.s3_path(location)?, bytes)
                    .await
                    .map_err(|e| Self::s3_err(location, e))?;
                Ok(())
            }
        }
    }

    /// File names (last path segment) directly or indirectly under `location`.
    pub async fn list(&self, location: &str) -> Result<Vec<String>> {
        Ok(self
            .list_files(location)
            .await?
            .into_iter()
            .filter_map(|f| f.location.rsplit('/').next().map(str::to_string))
            .collect())
    }

    /// Every file under `location` with its size and modification time,
    /// named as table metadata names them (`file:///…`, `s3://bucket/…`).
    pub async fn list_files(&self, location: &str) -> Result<Vec<FileInfo>> {
        match &self.backend {
            Backend::Local(store) => {
                let prefix = Self::local_path(location)?;
                let metas: Vec<_> = match store.list(Some(&prefix)).try_collect().await {
                    Ok(m) => m,
                    Err(object_store::Error::NotFound { .. }) => Vec::new(),
                    Err(e) => return Err(e.into()),
                };
                Ok(metas
                    .into_iter()
                    .map(|m| FileInfo {
                        location: format!("file:///{}", m.location),
                        size: m.size,
                        modified_ms: m.last_modified.timestamp_millis(),
                    })
                    .collect())
            }
            Backend::S3 { op, bucket } => {
                let scheme = if location.starts_with("s3a://") {
                    "s3a"
                } else {
                    "s3"
                };
                let entries = self.s3_list(op, location).await?;
                let mut out = Vec::with_capacity(entries.len());
                for e in entries.into_iter().filter(|e| !e.path().ends_with('/')) {
                    let mut meta = e.metadata().clone();
                    if meta.last_modified().is_none() {
                        meta = op
                            .stat(e.path())
                            .await
                            .map_err(|err| Self::s3_err(location, err))?;
                    }
                    out.push(FileInfo {
                        location: format!("{scheme}://{bucket}/{}", e.path()),
                        size: meta.content_length(),
                        // Unknown age: treated as new, so never deleted.
                        modified_ms: meta
                            .last_modified()
                            .map(|t| t.into_inner().as_millisecond())
                            .unwrap_or(i64::MAX),
                    });
                }
                Ok(out)
            }
        }
    }

    /// Deletes one file; a file already gone is not an error.
    pub async fn delete(&self, location: &str) -> Result<()> {
        match &self.backend {
            Backend::Local(store) => match store.delete(&Self::local_path(location)?).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(e.into()),
            },
            Backend::S3 { op, .. } => op
                .delete(&self.s3_path(location)?)
                .await
                .map_err(|e| Self::s3_err(location, e)),
        }
    }

    async fn s3_list(&self, op: &opendal::Operator, location: &str) -> Result<Vec<opendal::Entry>> {
        let dir = format!("{}/", self.s3_path(location)?);
        match op.list_with(&dir).recursive(true).await {
            Ok(v) => Ok(v),
            Err(e) if e.kind() == opendal::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(Self::s3_err(location, e)),
        }
    }

    /// Deletes everything under `location`; returns how many objects.
    pub async fn delete_prefix(&self, location: &str) -> Result<usize> {
        match &self.backend {
            Backend::Local(store) => {
                let prefix = Self::local_path(location)?;
                let metas: Vec<_> = store.list(Some(&prefix)).try_collect().await?;
                for m in &metas {
                    store.delete(&m.location).await?;
                }
                Ok(metas.len())
            }
            Backend::S3 { op, .. } => {
                let entries = self.s3_list(op, location).await?;
                let mut n = 0;
                for e in entries.iter().filter(|e| !e.path().ends_with('/')) {
                    op.delete(e.path())
                        .await
                        .map_err(|err| Self::s3_err(location, err))?;
                    n += 1;
                }
                Ok(n)
            }
        }
    }
}

/// A FileIO for `s3://` locations configured by `[catalog.s3]`.
pub fn s3_file_io(cfg: &S3Config) -> FileIO {
    FileIOBuilder::new(Arc::new(
        iceberg_storage_opendal::OpenDalStorageFactory::S3 {
            customized_credential_load: None,
        },
    ))
    .with_props(s3_props(cfg))
    .build()
}

/// `[catalog.s3]` as Iceberg FileIO properties (`s3.endpoint`, ...).
pub fn s3_props(cfg: &S3Config) -> HashMap<String, String> {
    use iceberg::io::{
        S3_ACCESS_KEY_ID, S3_ENDPOINT, S3_PATH_STYLE_ACCESS, S3_REGION, S3_SECRET_ACCESS_KEY,
        S3_SESSION_TOKEN,
    };
    let mut props = HashMap::new();
    for (k, v) in [
        (S3_ENDPOINT, &cfg.endpoint),
        (S3_ACCESS_KEY_ID, &cfg.access_key_id),
        (S3_SECRET_ACCESS_KEY, &cfg.secret_access_key),
        (S3_SESSION_TOKEN, &cfg.session_token),
    ] {
        if let Some(v) = v {
            props.insert(k.to_string(), v.clone());
        }
    }
    props.insert(
        S3_REGION.to_string(),
        cfg.region.clone().unwrap_or_else(|| "us-east-1".into()),
    );
    props.insert(
        S3_PATH_STYLE_ACCESS.to_string(),
        cfg.path_style().to_string(),
    );
    props
}

/// The store's answer (its error code and message, e.g. `AccessDenied`)
/// and opendal's kind, without the response headers opendal adds as context.
fn opendal_message(e: &opendal::Error) -> String {
    let mut s = format!("{}: {}", e.kind(), e.message());
    let mut source = std::error::Error::source(e);
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}
