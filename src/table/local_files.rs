//! The FileIO of a warehouse on local disk: a table's files (data, deletes,
//! manifests, metadata) are written without an fsync each and without a
//! `mkdir` each (a directory is made when creating a file finds it
//! missing). A commit makes them durable at once, by syncing the file
//! system under the table (`sync`) before its metadata names them and again
//! once the commit point is written (`table::catalog::{hadoop, sql}`).
//!
//! iceberg's own local storage (`LocalFsStorage`) makes the parent
//! directories of every file and fsyncs every file as it closes it: a
//! partitioned commit paid one `mkdir -p` and one journal flush per
//! partition. Reads, listings and deletes are its own.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use iceberg::io::{
    FileMetadata, FileRead, FileWrite, InputFile, LocalFsStorage, OutputFile, Storage,
    StorageConfig, StorageFactory,
};
use iceberg::{Error, ErrorKind, Result};
use serde::{Deserialize, Serialize};

/// Builds `LocalFiles` for a FileIO (`FileIOBuilder::new`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LocalFilesFactory;

#[typetag::serde]
impl StorageFactory for LocalFilesFactory {
    fn build(&self, _config: &StorageConfig) -> Result<Arc<dyn Storage>> {
        Ok(Arc::new(LocalFiles::default()))
    }
}

/// Local files, written unsynced; see the module.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LocalFiles {
    #[serde(skip)]
    inner: LocalFsStorage,
}

/// `file:///a/b`, `file:/a/b` or `/a/b` as a path.
fn local_path(path: &str) -> PathBuf {
    let p = path
        .strip_prefix("file://")
        .or_else(|| path.strip_prefix("file:"))
        .unwrap_or(path);
    if p.starts_with('/') {
        PathBuf::from(p)
    } else {
        PathBuf::from(format!("/{p}"))
    }
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::new(
        ErrorKind::Unexpected,
        format!("{what} {}: {e}", path.display()),
    )
}

/// Creates (or truncates) `path`, making its directory only when it is
/// missing.
fn create(path: &Path) -> Result<std::fs::File> {
    match std::fs::File::create(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)
                    .map_err(|e| io_err("cannot create the directory", dir, e))?;
            }
            std::fs::File::create(path).map_err(|e| io_err("cannot create", path, e))
        }
        r => r.map_err(|e| io_err("cannot create", path, e)),
    }
}

#[async_trait]
#[typetag::serde]
impl Storage for LocalFiles {
    async fn exists(&self, path: &str) -> Result<bool> {
        self.inner.exists(path).await
    }

    async fn metadata(&self, path: &str) -> Result<FileMetadata> {
        self.inner.metadata(path).await
    }

    async fn read(&self, path: &str) -> Result<Bytes> {
        self.inner.read(path).await
    }

    async fn reader(&self, path: &str) -> Result<Box<dyn FileRead>> {
        self.inner.reader(path).await
    }

    async fn write(&self, path: &str, bs: Bytes) -> Result<()> {
        let path = local_path(path);
        create(&path)?
            .write_all(&bs)
            .map_err(|e| io_err("cannot write", &path, e))
    }

    async fn writer(&self, path: &str) -> Result<Box<dyn FileWrite>> {
        let path = local_path(path);
        Ok(Box::new(Unsynced {
            file: Some(create(&path)?),
            path,
        }))
    }

    async fn delete(&self, path: &str) -> Result<()> {
        self.inner.delete(path).await
    }

    async fn delete_prefix(&self, path: &str) -> Result<()> {
        self.inner.delete_prefix(path).await
    }

    async fn delete_stream(&self, paths: BoxStream<'static, String>) -> Result<()> {
        self.inner.delete_stream(paths).await
    }

    fn new_input(&self, path: &str) -> Result<InputFile> {
        Ok(InputFile::new(Arc::new(self.clone()), path.to_string()))
    }

    fn new_output(&self, path: &str) -> Result<OutputFile> {
        Ok(OutputFile::new(Arc::new(self.clone()), path.to_string()))
    }
}

/// A file being written; closed without an fsync (the commit syncs).
#[derive(Debug)]
struct Unsynced {
    file: Option<std::fs::File>,
    path: PathBuf,
}

#[async_trait]
impl FileWrite for Unsynced {
    async fn write(&mut self, bs: Bytes) -> Result<()> {
        let Some(f) = self.file.as_mut() else {
            return Err(Error::new(ErrorKind::DataInvalid, "write after close"));
        };
        f.write_all(&bs)
            .map_err(|e| io_err("cannot write", &self.path, e))
    }

    async fn close(&mut self) -> Result<()> {
        self.file
            .take()
            .map(drop)
            .ok_or_else(|| Error::new(ErrorKind::DataInvalid, "closed twice"))
    }
}

/// Makes every file written under `location` (a local directory, or where
/// one will be) durable, with its name: one `syncfs` of the file system
/// its nearest existing directory is on (where there is none, `sync`).
pub fn sync(location: &str) -> std::io::Result<()> {
    let mut at = local_path(location);
    loop {
        match std::fs::File::open(&at) {
            Ok(dir) => return sync_fs(&dir),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if !at.pop() {
                    return Err(e);
                }
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(target_os = "linux")]
fn sync_fs(dir: &std::fs::File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: `dir` is an open descriptor for the duration of the call.
    if unsafe { libc::syncfs(dir.as_raw_fd()) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn sync_fs(_dir: &std::fs::File) -> std::io::Result<()> {
    // SAFETY: no arguments; flushes every file system.
    unsafe { libc::sync() };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use iceberg::io::FileIOBuilder;

    #[tokio::test]
    async fn files_are_written_read_and_deleted_in_new_directories() {
        let dir = tempfile::tempdir().unwrap();
        let io = FileIOBuilder::new(Arc::new(LocalFilesFactory)).build();
        let root = format!("file://{}", dir.path().display());
        let a = format!("{root}/t/data/p=1/a.parquet");
        let b = format!("{root}/t/metadata/b.json");
        let mut w = io.new_output(&a).unwrap().writer().await.unwrap();
        w.write(Bytes::from_static(b"abc")).await.unwrap();
        w.write(Bytes::from_static(b"def")).await.unwrap();
        w.close().await.unwrap();
        io.new_output(&b)
            .unwrap()
            .write(Bytes::from_static(b"{}"))
            .await
            .unwrap();
        sync(&root).unwrap();
        assert_eq!(
            io.new_input(&a).unwrap().read().await.unwrap().as_ref(),
            b"abcdef"
        );
        assert!(io.exists(&b).await.unwrap());
        assert_eq!(
            std::fs::read(dir.path().join("t/metadata/b.json")).unwrap(),
            b"{}"
        );
        io.delete(&a).await.unwrap();
        assert!(!io.exists(&a).await.unwrap());
        // Where a table will be: its file system.
        sync(&format!("{root}/missing/table")).unwrap();
    }
}
