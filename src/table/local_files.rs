//! The FileIO of a warehouse on local disk: a table's files (data, deletes,
//! manifests, metadata) are written without an fsync each and without a
//! `mkdir` each (a directory is made when creating a file finds it
//! missing). A commit makes them durable at once (`sync`) before its
//! metadata names them and again once the commit point is written
//! (`table::catalog::{hadoop, sql}`).
//!
//! What a sync does depends on how many files wait for it under the
//! table (`Written` notes them, for the FileIO and the catalog's `Storage`
//! alike) and on how much the machine holds dirty. Many files (a
//! partitioned commit touching dozens of partitions): one `syncfs`,
//! several times cheaper than an fsync each. A few (a commit of an
//! unpartitioned table: its data and delete files, manifests, metadata):
//! one `syncfs` too while little is dirty (it then flushes about what the
//! files alone would, in one journal commit), else an fsync of each file
//! and of each directory that gained one, so a commit does not wait for
//! what other programs wrote to the same file system (a `syncfs` did: with
//! 1.5 GB written elsewhere, a commit waited for all of it). (On ext4 a
//! journal commit may still wait for data another program replaced by
//! truncating its file.)
//!
//! iceberg's own local storage (`LocalFsStorage`) makes the parent
//! directories of every file and fsyncs every file as it closes it: a
//! partitioned commit paid one `mkdir -p` and one journal flush per
//! partition. Reads, listings and deletes are its own.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use iceberg::io::{
    FileMetadata, FileRead, FileWrite, InputFile, LocalFsStorage, OutputFile, Storage,
    StorageConfig, StorageFactory,
};
use iceberg::{Error, ErrorKind, Result};
use serde::{Deserialize, Serialize};

/// Builds `LocalFiles` for a FileIO (`FileIOBuilder::new`), all noting
/// what they write in one `Written`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LocalFilesFactory {
    #[serde(skip)]
    written: Arc<Written>,
}

impl LocalFilesFactory {
    /// A factory whose files are noted in `written` (the warehouse's, which
    /// its catalog syncs).
    pub fn new(written: Arc<Written>) -> LocalFilesFactory {
        LocalFilesFactory { written }
    }
}

#[typetag::serde]
impl StorageFactory for LocalFilesFactory {
    fn build(&self, _config: &StorageConfig) -> Result<Arc<dyn Storage>> {
        Ok(Arc::new(LocalFiles {
            inner: LocalFsStorage,
            written: self.written.clone(),
        }))
    }
}

/// Local files, written unsynced; see the module.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LocalFiles {
    #[serde(skip)]
    inner: LocalFsStorage,
    #[serde(skip)]
    written: Arc<Written>,
}

/// Syncs of at most this many files may fsync each one (and the
/// directories that gained them, `sync`); more are synced with one
/// `syncfs`. On this project's ext4 disk 250 files took 80 ms an fsync
/// each against 17 ms for a `syncfs`, and with nothing else dirty the
/// fsyncs of a `bench-long` commit (two tables, two syncs each) cost 3-10
/// ms more than four `syncfs` (docs/dev/benchmarks.md).
pub const FSYNC_EACH_MAX: usize = 16;

/// At most this many files and directories are noted: past it (files
/// written and never committed, say) the notes are dropped and the next
/// sync syncs the file system, which covers them.
const NOTED_MAX: usize = 1 << 16;

/// The files written under a local warehouse and not yet synced, and the
/// directories made for them, so a sync makes durable what its table
/// wrote (`sync`).
#[derive(Debug, Default)]
pub struct Written {
    noted: Mutex<Noted>,
}

#[derive(Debug, Default)]
struct Noted {
    files: BTreeSet<PathBuf>,
    /// Directories made since the last sync: their own parents gained them.
    dirs: BTreeSet<PathBuf>,
    /// Notes were dropped (`NOTED_MAX`): the next sync syncs the file system.
    dropped: bool,
}

impl Noted {
    /// Room for one more note: at `NOTED_MAX` the notes go and the next
    /// sync is the file system's.
    fn room(&mut self) -> &mut Noted {
        if self.files.len() + self.dirs.len() >= NOTED_MAX {
            self.files.clear();
            self.dirs.clear();
            self.dropped = true;
        }
        self
    }
}

/// How a sync makes its files durable (`Written::plan`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyncPlan {
    /// fsync each file, then each directory (those that gained a file or
    /// a directory).
    Each {
        files: Vec<PathBuf>,
        dirs: Vec<PathBuf>,
    },
    /// One `syncfs` of the file system under the location.
    FileSystem,
}

impl Written {
    /// `path` was written (and closed).
    pub fn file(&self, path: &Path) {
        self.lock().room().files.insert(path.to_path_buf());
    }

    /// `dir` was made (its parent gained it).
    pub fn made(&self, dir: &Path) {
        self.lock().room().dirs.insert(dir.to_path_buf());
    }

    /// Runs `put`, a write of `location` by another writer (the catalog's
    /// `Storage`, which makes missing directories itself), and notes the
    /// file and the directories missing before it, once it succeeded.
    pub async fn put<T, E>(
        &self,
        location: &str,
        put: impl Future<Output = std::result::Result<T, E>>,
    ) -> std::result::Result<T, E> {
        let path = local_path(location);
        let missing: Vec<PathBuf> = path
            .ancestors()
            .skip(1)
            .take_while(|d| !d.exists())
            .map(Path::to_path_buf)
            .collect();
        let done = put.await?;
        missing.iter().for_each(|d| self.made(d));
        self.file(&path);
        Ok(done)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Noted> {
        // A panic while holding the lock leaves sets that are still sets.
        self.noted.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many files wait for a sync, anywhere (tests).
    pub fn pending(&self) -> usize {
        self.lock().files.len()
    }

    /// Takes the notes under `location` and says how to sync them: an
    /// fsync each for at most `FSYNC_EACH_MAX` files, else (or when notes
    /// were dropped) the file system.
    pub fn plan(&self, location: &str) -> SyncPlan {
        let under = local_path(location);
        let mut n = self.lock();
        let take = |set: &mut BTreeSet<PathBuf>| -> Vec<PathBuf> {
            let inside: Vec<PathBuf> = set
                .range(under.clone()..)
                .take_while(|p| p.starts_with(&under))
                .cloned()
                .collect();
            inside.iter().for_each(|p| {
                set.remove(p);
            });
            inside
        };
        let files = take(&mut n.files);
        let mut made = take(&mut n.dirs);
        // Directories made above the location, for its first files.
        made.extend(
            under
                .ancestors()
                .skip(1)
                .filter(|d| n.dirs.remove(*d))
                .map(Path::to_path_buf),
        );
        if std::mem::take(&mut n.dropped) || files.len() > FSYNC_EACH_MAX {
            return SyncPlan::FileSystem;
        }
        let dirs: BTreeSet<PathBuf> = files
            .iter()
            .chain(&made)
            .filter_map(|p| p.parent().map(Path::to_path_buf))
            .collect();
        SyncPlan::Each {
            files,
            dirs: dirs.into_iter().collect(),
        }
    }
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
/// missing (each directory made is noted in `written`).
fn create(path: &Path, written: &Written) -> Result<std::fs::File> {
    match std::fs::File::create(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(dir) = path.parent() {
                make_dirs(dir, written)?;
            }
            std::fs::File::create(path).map_err(|e| io_err("cannot create", path, e))
        }
        r => r.map_err(|e| io_err("cannot create", path, e)),
    }
}

/// `mkdir -p dir`, noting each directory it makes.
fn make_dirs(dir: &Path, written: &Written) -> Result<()> {
    let missing: Vec<PathBuf> = dir
        .ancestors()
        .take_while(|d| !d.exists())
        .map(Path::to_path_buf)
        .collect();
    std::fs::create_dir_all(dir).map_err(|e| io_err("cannot create the directory", dir, e))?;
    missing.iter().for_each(|d| written.made(d));
    Ok(())
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
        create(&path, &self.written)?
            .write_all(&bs)
            .map_err(|e| io_err("cannot write", &path, e))?;
        self.written.file(&path);
        Ok(())
    }

    async fn writer(&self, path: &str) -> Result<Box<dyn FileWrite>> {
        let path = local_path(path);
        Ok(Box::new(Unsynced {
            file: Some(create(&path, &self.written)?),
            path,
            written: self.written.clone(),
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

/// A file being written; closed without an fsync, and noted for the
/// commit's sync.
#[derive(Debug)]
struct Unsynced {
    file: Option<std::fs::File>,
    path: PathBuf,
    written: Arc<Written>,
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
        let file = self
            .file
            .take()
            .ok_or_else(|| Error::new(ErrorKind::DataInvalid, "closed twice"))?;
        drop(file);
        self.written.file(&self.path);
        Ok(())
    }
}

/// Makes every file written under `location` (a local directory, or where
/// one will be) durable, with its name, as `written` plans it: an fsync of
/// each file and of each directory that gained one, or one `syncfs` of
/// the file system its nearest existing directory is on (where there is
/// none, `sync`). A file deleted since it was written is skipped.
pub fn sync(written: &Written, location: &str) -> std::io::Result<()> {
    match written.plan(location) {
        // Little is dirty: one syncfs flushes about what the files alone
        // would, and costs one journal commit where an fsync each costs one
        // per file and directory.
        SyncPlan::Each { .. } if quiet(system_dirty_bytes()) => sync_file_system(location),
        SyncPlan::Each { files, dirs } => {
            let all: Vec<PathBuf> = files.into_iter().chain(dirs).collect();
            fsync_each(&all)
        }
        SyncPlan::FileSystem => sync_file_system(location),
    }
}

/// At most this many bytes dirty or being written back, over the whole
/// machine, and a sync of a few files is one `syncfs`: on this project's
/// disk a `syncfs` flushes about 0.8 GB/s, so 8 MiB cost it about 10 ms,
/// what an fsync each costs a commit more than a quiet `syncfs` there.
const QUIET_DIRTY_BYTES: u64 = 8 << 20;

/// Whether the machine's dirty bytes (None: unknown) are few enough for a
/// `syncfs` to cost no more than an fsync of each file.
fn quiet(dirty: Option<u64>) -> bool {
    dirty.is_some_and(|d| d <= QUIET_DIRTY_BYTES)
}

/// Bytes the kernel holds dirty or is writing back (`/proc/meminfo`'s
/// `Dirty` and `Writeback`); None where there is no such file.
fn system_dirty_bytes() -> Option<u64> {
    dirty_in(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

/// `Dirty` + `Writeback` of a `/proc/meminfo` text, in bytes.
fn dirty_in(meminfo: &str) -> Option<u64> {
    let kb = |name: &str| -> Option<u64> {
        let line = meminfo.lines().find(|l| l.starts_with(name))?;
        line[name.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()
    };
    Some((kb("Dirty:")? + kb("Writeback:")?) * 1024)
}

/// fsyncs `paths` (files and directories), one after another (from a
/// thread each they measured no faster: the journal commits for each).
/// A path deleted since it was written is skipped.
fn fsync_each(paths: &[PathBuf]) -> std::io::Result<()> {
    for p in paths {
        match std::fs::File::open(p) {
            Ok(f) => f.sync_all()?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// One `syncfs` of the file system under `location`'s nearest existing
/// directory.
fn sync_file_system(location: &str) -> std::io::Result<()> {
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

    #[test]
    fn a_few_files_are_synced_with_the_file_system_only_while_little_is_dirty() {
        let meminfo = "MemTotal:       24683784 kB\nDirty:              5120 kB\nWriteback:          1024 kB\nAnonPages: 1 kB\n";
        assert_eq!(dirty_in(meminfo), Some(6 << 20));
        assert_eq!(dirty_in("MemTotal: 1 kB\n"), None, "no Dirty line");
        assert!(quiet(Some(6 << 20)));
        assert!(quiet(Some(QUIET_DIRTY_BYTES)));
        assert!(!quiet(Some(QUIET_DIRTY_BYTES + 1)));
        assert!(!quiet(None), "unknown: an fsync each");
        #[cfg(target_os = "linux")]
        assert!(system_dirty_bytes().is_some());
    }

    #[tokio::test]
    async fn files_are_written_read_and_deleted_in_new_directories() {
        let dir = tempfile::tempdir().unwrap();
        let written = Arc::new(Written::default());
        let io = FileIOBuilder::new(Arc::new(LocalFilesFactory::new(written.clone()))).build();
        let root = format!("file://{}", dir.path().display());
        let a = format!("{root}/t/data/p=1/a.parquet");
        let b = format!("{root}/t/metadata/b.json");
        let mut w = io.new_output(&a).unwrap().writer().await.unwrap();
        w.write(Bytes::from_static(b"abc")).await.unwrap();
        w.write(Bytes::from_static(b"def")).await.unwrap();
        assert_eq!(written.pending(), 0, "noted once closed");
        w.close().await.unwrap();
        io.new_output(&b)
            .unwrap()
            .write(Bytes::from_static(b"{}"))
            .await
            .unwrap();
        assert_eq!(written.pending(), 2);
        sync(&written, &root).unwrap();
        assert_eq!(written.pending(), 0);
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
        sync_file_system(&format!("{root}/missing/table")).unwrap();
    }

    #[tokio::test]
    async fn a_sync_takes_its_tables_files_an_fsync_each_when_few_the_file_system_when_many() {
        let dir = tempfile::tempdir().unwrap();
        let written = Arc::new(Written::default());
        let io = FileIOBuilder::new(Arc::new(LocalFilesFactory::new(written.clone()))).build();
        let root = dir.path().canonicalize().unwrap();
        let url = |p: &str| format!("file://{}/{p}", root.display());
        let write = |p: &'static str| {
            let io = io.clone();
            let at = url(p);
            async move {
                io.new_output(&at)
                    .unwrap()
                    .write(Bytes::from_static(b"x"))
                    .await
                    .unwrap()
            }
        };
        // A table whose name another's extends: their notes stay apart.
        write("ns/t/data/p=1/a.parquet").await;
        write("ns/t/data/p=2/b.parquet").await;
        write("ns/t__autocdc_state/data/s.parquet").await;
        // Another writer (the catalog's metadata), in a new directory.
        let hint = root.join("ns/t/metadata/hint");
        written
            .put(&url("ns/t/metadata/hint"), async {
                std::fs::create_dir_all(hint.parent().unwrap())?;
                std::fs::write(&hint, b"1")
            })
            .await
            .unwrap();
        let plan = written.plan(&url("ns/t"));
        let at = |p: &str| root.join(p);
        assert_eq!(
            plan,
            SyncPlan::Each {
                files: vec![
                    at("ns/t/data/p=1/a.parquet"),
                    at("ns/t/data/p=2/b.parquet"),
                    at("ns/t/metadata/hint"),
                ],
                // Each file's directory, and the parent of each directory
                // made for them (`ns` was made above the table, for it).
                dirs: vec![
                    root.clone(),
                    at("ns"),
                    at("ns/t"),
                    at("ns/t/data"),
                    at("ns/t/data/p=1"),
                    at("ns/t/data/p=2"),
                    at("ns/t/metadata"),
                ],
            }
        );
        assert_eq!(
            written.pending(),
            1,
            "the state table's file waits for its own sync"
        );
        // Many files: the file system, once; their notes go.
        for i in 0..=FSYNC_EACH_MAX {
            let p = url(&format!("ns/u/data/p={i}/f.parquet"));
            io.new_output(&p)
                .unwrap()
                .write(Bytes::from_static(b"x"))
                .await
                .unwrap();
        }
        assert_eq!(written.plan(&url("ns/u")), SyncPlan::FileSystem);
        assert_eq!(written.pending(), 1);
        // Syncing what the plan says: a file deleted since is skipped.
        std::fs::remove_file(at("ns/t__autocdc_state/data/s.parquet")).unwrap();
        sync(&written, &url("ns/t__autocdc_state")).unwrap();
        assert_eq!(written.pending(), 0);
        // Past the bound on notes they go, and the next sync is the file
        // system's, whatever it is asked for; then notes start again.
        for i in 0..=NOTED_MAX {
            written.file(&at(&format!("v/{i}")));
        }
        assert!(written.pending() < NOTED_MAX);
        assert_eq!(written.plan(&url("elsewhere")), SyncPlan::FileSystem);
        written.file(&at("v/again"));
        let last = at(&format!("v/{NOTED_MAX}"));
        assert!(
            matches!(written.plan(&url("v")), SyncPlan::Each { files, .. } if files == vec![last, at("v/again")]),
            "the note made after the bound was passed, and the new one"
        );
    }
}
