//! Table maintenance with Iceberg Java's semantics and table properties:
//! snapshot expiry (`RemoveSnapshots`) and the cleanup of the files only
//! expired snapshots referenced, a resumable record of that cleanup, and
//! orphan-file cleanup (`DeleteOrphanFiles`). Manifest merging happens at
//! commit (`row_delta`); metadata.json hygiene in the catalogs' commits.
//!
//! Nothing here knows a flow: the engine says which snapshots to protect.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use iceberg::io::FileIO;
use iceberg::spec::{
    MAIN_BRANCH, ManifestContentType, ManifestStatus, SnapshotRef, SnapshotReference,
    SnapshotRetention, TableMetadata,
};
use iceberg::{TableRequirement, TableUpdate};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::fault::{FaultPoint, Faults};
use crate::table::catalog::{Catalog, TableState};
use crate::table::properties::Retention;

/// The pending-cleanup record, next to the table's metadata files: Avro,
/// as the manifests there (stores that guard a table's layout, like a REST
/// catalog's, accept only Avro files under `metadata/`).
const PENDING: &str = "autocdc-expire-pending.avro";
const PENDING_SCHEMA: &str = r#"{"type": "record", "name": "autocdc_expire_pending", "fields": [
  {"name": "expired", "type": {"type": "array", "items": "long"}},
  {"name": "files", "type": {"type": "array", "items": {"type": "record", "name": "pending_file", "fields": [
    {"name": "path", "type": "string"}, {"name": "size", "type": "long"}, {"name": "kind", "type": "string"}]}}}]}"#;

/// The snapshot `from` and its ancestors through their parents, newest
/// first: the one walk up a table's snapshot chain. Bounded by the table's
/// snapshot count: a chain has no cycle, but a hand-edited table might.
pub fn ancestors(meta: &TableMetadata, from: Option<i64>) -> impl Iterator<Item = &SnapshotRef> {
    let mut next = from;
    std::iter::from_fn(move || {
        let s = meta.snapshot_by_id(next?)?;
        next = s.parent_snapshot_id();
        Some(s)
    })
    .take(meta.snapshots().len())
}

/// The snapshots that expire at `now_ms`, as Java's `RemoveSnapshots`
/// decides: each branch keeps its head's ancestors while they are younger
/// than its age limit or fewer than its minimum count (a branch's own
/// retention settings first); tags keep their snapshot; a snapshot on no
/// branch's retained line expires once older than the table's limit; and
/// `protect` never expires. Beyond Java: a branch keeps at most the table's
/// `max_count` ancestors above its minimum count, however young. Pure.
pub fn expirable(
    meta: &TableMetadata,
    now_ms: i64,
    table: Retention,
    protect: &HashSet<i64>,
) -> Vec<i64> {
    let mut keep: HashSet<i64> = protect.clone();
    // Young ancestors past a branch's count limit.
    let mut cut: HashSet<i64> = HashSet::new();
    for reference in refs(meta).values() {
        keep.insert(reference.snapshot_id);
        let SnapshotRetention::Branch {
            min_snapshots_to_keep,
            max_snapshot_age_ms,
            ..
        } = &reference.retention
        else {
            continue;
        };
        let min_keep = min_snapshots_to_keep
            .map(|n| n.max(1) as usize)
            .unwrap_or(table.min_keep);
        let older_than = now_ms - max_snapshot_age_ms.unwrap_or(table.max_age_ms);
        let mut kept = 0;
        let mut over_count = false;
        for s in ancestors(meta, Some(reference.snapshot_id)) {
            if over_count {
                cut.insert(s.snapshot_id());
            } else if kept < min_keep || (s.timestamp_ms() >= older_than && kept < table.max_count)
            {
                keep.insert(s.snapshot_id());
                kept += 1;
            } else if s.timestamp_ms() >= older_than {
                // Past the count limit: the rest of the line goes, however young.
                over_count = true;
                cut.insert(s.snapshot_id());
            } else {
                break;
            }
        }
    }
    let older_than = now_ms - table.max_age_ms;
    let mut out: Vec<i64> = meta
        .snapshots()
        .filter(|s| {
            let id = s.snapshot_id();
            !keep.contains(&id) && (s.timestamp_ms() < older_than || cut.contains(&id))
        })
        .map(|s| s.snapshot_id())
        .collect();
    out.sort_unstable();
    out
}

/// The table's branches and tags (iceberg-rust keeps them private; they
/// are read back from the metadata's JSON form).
fn refs(meta: &TableMetadata) -> HashMap<String, SnapshotReference> {
    let parsed = serde_json::to_value(meta)
        .ok()
        .and_then(|v| serde_json::from_value(v.get("refs")?.clone()).ok())
        .unwrap_or_default();
    match (parsed, meta.current_snapshot_id()) {
        (r, Some(id)) if HashMap::is_empty(&r) => HashMap::from([(
            MAIN_BRANCH.to_string(),
            SnapshotReference::new(id, SnapshotRetention::branch(None, None, None)),
        )]),
        (r, _) => r,
    }
}

/// The files some snapshots reach: manifest lists, manifests, and the data
/// and delete files of their live entries (with sizes).
#[derive(Debug, Default)]
pub struct Reachable {
    pub lists: HashSet<String>,
    pub manifests: HashMap<String, u64>,
    pub files: HashMap<String, (u64, bool)>,
    /// Files named only by deleted entries (gone from those snapshots).
    pub removed: HashMap<String, (u64, bool)>,
}

impl Reachable {
    fn all_paths(&self) -> impl Iterator<Item = &String> {
        self.lists
            .iter()
            .chain(self.manifests.keys())
            .chain(self.files.keys())
            .chain(self.removed.keys())
    }
}

/// Reads the manifest lists of `snapshots` and every manifest they name
/// (each once), with up to 8 reads in flight.
pub async fn reachable(
    file_io: &FileIO,
    table: &TableState,
    snapshots: impl IntoIterator<Item = i64>,
) -> Result<Reachable> {
    let meta = &table.metadata;
    let t = table.table(file_io)?;
    let mut r = Reachable::default();
    let mut manifests = Vec::new();
    for id in snapshots {
        let Some(s) = meta.snapshot_by_id(id) else {
            continue;
        };
        if !r.lists.insert(s.manifest_list().to_string()) {
            continue;
        }
        let list = t.manifest_list_reader(s).load().await?;
        for m in list.entries() {
            if !r.manifests.contains_key(&m.manifest_path) {
                r.manifests
                    .insert(m.manifest_path.clone(), m.manifest_length.max(0) as u64);
                manifests.push(m.clone());
            }
        }
    }
    let mut loads = futures::stream::iter(manifests.into_iter().map(|m| {
        let io = file_io.clone();
        async move {
            let deletes = m.content == ManifestContentType::Deletes;
            m.load_manifest(&io).await.map(|man| (man, deletes))
        }
    }))
    .buffer_unordered(8);
    while let Some(loaded) = loads.next().await {
        let (manifest, deletes) = loaded?;
        for e in manifest.entries() {
            let f = e.data_file();
            let item = (f.file_size_in_bytes(), deletes);
            if e.status() == ManifestStatus::Deleted {
                r.removed.insert(f.file_path().to_string(), item);
            } else {
                r.files.insert(f.file_path().to_string(), item);
            }
        }
    }
    for live in r.files.keys() {
        r.removed.remove(live);
    }
    Ok(r)
}

/// What one maintenance run did (or, dry, would do) to one table.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct TableReport {
    pub table: String,
    pub snapshots_expired: usize,
    pub snapshots_kept: usize,
    pub manifest_lists_deleted: usize,
    pub manifests_deleted: usize,
    pub data_files_deleted: usize,
    pub delete_files_deleted: usize,
    pub orphans_deleted: usize,
    pub bytes_deleted: u64,
    /// Files a crashed earlier run left to delete, deleted now.
    pub resumed_files_deleted: usize,
    /// Why a step was skipped (a lost race, a catalog that cannot list).
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub notes: Vec<String>,
}

/// The record of a cleanup under way, written before the expiry commit:
/// if the run stops before its deletes end, the next run finishes them.
#[derive(Debug, Serialize, Deserialize)]
struct Pending {
    expired: Vec<i64>,
    files: Vec<PendingFile>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct PendingFile {
    path: String,
    size: i64,
    /// `list`, `manifest`, `data` or `delete`.
    kind: String,
}

impl Pending {
    fn encode(&self) -> Result<Vec<u8>> {
        let avro = |e: apache_avro::Error| {
            Error::Iceberg(iceberg::Error::new(
                iceberg::ErrorKind::Unexpected,
                format!("the cleanup record: {e}"),
            ))
        };
        let schema = apache_avro::Schema::parse_str(PENDING_SCHEMA).map_err(avro)?;
        let mut w = apache_avro::Writer::new(&schema, Vec::new());
        w.append_ser(self).map_err(avro)?;
        w.into_inner().map_err(avro)
    }

    fn decode(bytes: &[u8]) -> std::result::Result<Pending, String> {
        let mut r = apache_avro::Reader::new(bytes).map_err(|e| e.to_string())?;
        let value = r
            .next()
            .ok_or("an empty record")?
            .map_err(|e| e.to_string())?;
        apache_avro::from_value(&value).map_err(|e| e.to_string())
    }
}

fn pending_path(location: &str) -> String {
    format!("{location}/metadata/{PENDING}")
}

/// Deletes `files` (path, size, kind), counting into the report. A file
/// already gone counts as deleted; any other failure is returned.
async fn delete_all(
    file_io: &FileIO,
    files: &[PendingFile],
    report: &mut TableReport,
    faults: &Faults,
) -> Result<()> {
    for (i, f) in files.iter().enumerate() {
        if i == files.len() / 2 && i > 0 {
            faults.hit(FaultPoint::MidMaintenanceDeletes)?;
        }
        file_io.delete(&f.path).await?;
        report.count(f);
    }
    Ok(())
}

/// Finishes the cleanup an earlier run recorded, if any: when its expiry
/// landed the files go now; when it did not, the record goes.
pub async fn resume(file_io: &FileIO, table: &TableState, report: &mut TableReport) -> Result<()> {
    let path = pending_path(table.location());
    // Read, not probed: a store that may not list answers a probe for a
    // missing object with 403 (S3 without ListBucket), like a REST
    // catalog's vended credentials. Unreadable = none; orphan cleanup
    // finds what such a record would have named.
    let bytes = match file_io.new_input(&path)?.read().await {
        Ok(b) => b,
        Err(_) => return Ok(()),
    };
    let pending = match Pending::decode(&bytes) {
        Ok(p) => p,
        Err(e) => {
            report
                .notes
                .push(format!("ignored an unreadable cleanup record {path}: {e}"));
            file_io.delete(&path).await?;
            return Ok(());
        }
    };
    let landed = pending
        .expired
        .iter()
        .all(|id| table.metadata.snapshot_by_id(*id).is_none());
    if landed {
        // Counted as resumed, not as this run's own deletes.
        let mut done = TableReport::default();
        delete_all(file_io, &pending.files, &mut done, &Faults::default()).await?;
        report.resumed_files_deleted += pending.files.len();
        report.bytes_deleted += done.bytes_deleted;
    }
    file_io.delete(&path).await?;
    Ok(())
}

/// Expires `ids` from `table` (one commit that requires the main branch
/// unchanged), then deletes the manifest lists, manifests, data and delete
/// files that only the expired snapshots reached. `dry_run` reports the
/// same figures and changes nothing. A commit lost to another writer
/// changes nothing and is reported; the next run tries again.
pub async fn expire(
    catalog: &dyn Catalog,
    table: &TableState,
    ids: &[i64],
    dry_run: bool,
    faults: &Faults,
    report: &mut TableReport,
) -> Result<Option<TableState>> {
    let meta = &table.metadata;
    report.snapshots_kept = meta.snapshots().count() - ids.len();
    if ids.is_empty() {
        return Ok(None);
    }
    let file_io = catalog.file_io();
    let expired_set: HashSet<i64> = ids.iter().copied().collect();
    let retained = meta
        .snapshots()
        .map(|s| s.snapshot_id())
        .filter(|id| !expired_set.contains(id));
    let live = reachable(file_io, table, retained.collect::<Vec<_>>()).await?;
    let gone = reachable(file_io, table, ids.iter().copied()).await?;
    let mut files: Vec<PendingFile> = Vec::new();
    for l in gone.lists.difference(&live.lists) {
        let size = match file_io.new_input(l)?.metadata().await {
            Ok(m) => m.size,
            Err(_) => 0, // already gone: nothing to count
        };
        files.push(PendingFile {
            path: l.clone(),
            size: size as i64,
            kind: "list".into(),
        });
    }
    for (m, size) in &gone.manifests {
        if !live.manifests.contains_key(m) {
            files.push(PendingFile {
                path: m.clone(),
                size: *size as i64,
                kind: "manifest".into(),
            });
        }
    }
    for (f, (size, deletes)) in gone.files.iter().chain(gone.removed.iter()) {
        if !live.files.contains_key(f) {
            let kind = if *deletes { "delete" } else { "data" };
            files.push(PendingFile {
                path: f.clone(),
                size: *size as i64,
                kind: kind.into(),
            });
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    files.dedup_by(|a, b| a.path == b.path);
    report.snapshots_expired = ids.len();
    if dry_run {
        delete_dry(&files, report);
        return Ok(None);
    }
    let record = Pending {
        expired: ids.to_vec(),
        files,
    };
    let path = pending_path(table.location());
    file_io
        .new_output(&path)?
        .write(Bytes::from(record.encode()?))
        .await?;
    let committed = catalog
        .commit(
            table,
            vec![TableUpdate::RemoveSnapshots {
                snapshot_ids: ids.to_vec(),
            }],
            vec![
                TableRequirement::UuidMatch { uuid: meta.uuid() },
                TableRequirement::RefSnapshotIdMatch {
                    r#ref: MAIN_BRANCH.to_string(),
                    snapshot_id: meta.current_snapshot_id(),
                },
            ],
        )
        .await;
    let new = match committed {
        Ok(t) => t,
        Err(Error::CommitConflict(m)) => {
            file_io.delete(&path).await?;
            report.snapshots_expired = 0;
            report
                .notes
                .push(format!("expiry left for the next run: {m}"));
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    faults.hit(FaultPoint::AfterExpireCommit)?;
    delete_all(file_io, &record.files, report, faults).await?;
    file_io.delete(&path).await?;
    Ok(Some(new))
}

fn delete_dry(files: &[PendingFile], report: &mut TableReport) {
    for f in files {
        report.count(f);
    }
}

impl TableReport {
    /// One file deleted (or, dry, to be): its kind's count and its bytes.
    fn count(&mut self, f: &PendingFile) {
        self.bytes_deleted += f.size.max(0) as u64;
        match f.kind.as_str() {
            "list" => self.manifest_lists_deleted += 1,
            "manifest" => self.manifests_deleted += 1,
            "delete" => self.delete_files_deleted += 1,
            _ => self.data_files_deleted += 1,
        }
    }
}

/// Every file the table's metadata reaches: all snapshots' files, the
/// current metadata file and those in its log, statistics files.
async fn referenced(file_io: &FileIO, table: &TableState) -> Result<HashSet<String>> {
    let meta = &table.metadata;
    let ids: Vec<i64> = meta.snapshots().map(|s| s.snapshot_id()).collect();
    let r = reachable(file_io, table, ids).await?;
    let mut out: HashSet<String> = r.all_paths().cloned().collect();
    out.insert(table.metadata_location.clone());
    out.extend(meta.metadata_log().iter().map(|l| l.metadata_file.clone()));
    out.extend(meta.statistics_iter().map(|s| s.statistics_path.clone()));
    out.extend(
        meta.partition_statistics_iter()
            .map(|s| s.statistics_path.clone()),
    );
    Ok(out)
}

/// `DeleteOrphanFiles`: deletes the files under the table's location that
/// its metadata does not reach and that are older than `older_than`
/// (so no commit in flight, here or in another writer, loses a file it is
/// about to name). The catalog's own files (`version-hint.text`, newer
/// metadata versions) are never touched.
pub async fn delete_orphans(
    catalog: &dyn Catalog,
    table: &TableState,
    now_ms: i64,
    older_than: Duration,
    dry_run: bool,
    report: &mut TableReport,
) -> Result<()> {
    let Some(storage) = catalog.storage() else {
        report
            .notes
            .push("orphan cleanup skipped: this catalog's storage cannot be listed".into());
        return Ok(());
    };
    let location = table.location().trim_end_matches('/');
    let listed = storage.list_files(location).await?;
    let file_io = catalog.file_io();
    let keep = referenced(file_io, table).await?;
    let cutoff = now_ms - older_than.as_millis() as i64;
    let current_version = metadata_version(&table.metadata_location);
    for f in listed {
        let name = f.location.rsplit('/').next().unwrap_or_default();
        let protected = keep.contains(&f.location)
            || name == "version-hint.text"
            || name == PENDING
            || metadata_version(&f.location)
                .zip(current_version)
                .is_some_and(|(v, cur)| v >= cur);
        if protected || f.modified_ms > cutoff {
            continue;
        }
        if !dry_run {
            storage.delete(&f.location).await?;
        }
        report.orphans_deleted += 1;
        report.bytes_deleted += f.size;
    }
    Ok(())
}

/// `N` of a Hadoop or JDBC metadata file name (`vN.metadata.json`,
/// `NNNNN-uuid.metadata.json`).
fn metadata_version(path: &str) -> Option<i64> {
    let name = path.rsplit('/').next()?;
    let stem = name.strip_suffix(".metadata.json")?;
    let digits = stem.strip_prefix('v').unwrap_or(stem);
    let digits = digits.split('-').next()?;
    digits.parse().ok()
}

/// The figures a table is watched by (`/metrics`, `autocdc maintain`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct TableStats {
    pub snapshots: usize,
    pub manifests: usize,
    pub data_files: u64,
    pub delete_files: u64,
    pub metadata_bytes: u64,
    pub table_bytes: u64,
}

/// The table's figures: counts from the current snapshot's summary and
/// its manifest list, metadata.json bytes as serialized.
pub async fn stats(file_io: &FileIO, table: &TableState) -> Result<TableStats> {
    let meta = &table.metadata;
    let mut s = TableStats {
        snapshots: meta.snapshots().count(),
        metadata_bytes: serde_json::to_vec(&**meta)?.len() as u64,
        ..Default::default()
    };
    if let Some(cur) = meta.current_snapshot() {
        let num = |k: &str| {
            cur.summary()
                .additional_properties
                .get(k)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        s.data_files = num("total-data-files");
        s.delete_files = num("total-delete-files");
        s.table_bytes = num("total-files-size");
        let t = table.table(file_io)?;
        s.manifests = t.manifest_list_reader(cur).load().await?.entries().len();
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cleanup_record_reads_back() {
        let p = Pending {
            expired: vec![3, -7],
            files: vec![PendingFile {
                path: "s3://b/t/metadata/snap-1.avro".into(),
                size: 42,
                kind: "list".into(),
            }],
        };
        let back = Pending::decode(&p.encode().unwrap()).unwrap();
        assert_eq!(back.expired, p.expired);
        assert_eq!(back.files[0].path, p.files[0].path);
        assert_eq!(back.files[0].size, 42);
        assert!(Pending::decode(b"not avro").is_err());
    }

    /// A table of snapshots 1..=n, each the child of the one before;
    /// snapshot 1's parent is `first_parent`.
    fn chain(n: i64, first_parent: Option<i64>) -> TableMetadata {
        let snapshots: Vec<serde_json::Value> = (1..=n)
            .map(|id| {
                let mut s = serde_json::json!({
                    "snapshot-id": id,
                    "timestamp-ms": 1_000 * id,
                    "sequence-number": id,
                    "summary": {"operation": "append"},
                    "manifest-list": format!("s3://b/t/metadata/snap-{id}.avro"),
                });
                if let Some(p) = if id == 1 { first_parent } else { Some(id - 1) } {
                    s["parent-snapshot-id"] = p.into();
                }
                s
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "format-version": 2,
            "table-uuid": "9c12d441-03fe-4693-9a96-a0705ddf69c1",
            "location": "s3://b/t",
            "last-sequence-number": n,
            "last-updated-ms": 1_000 * n,
            "last-column-id": 1,
            "current-schema-id": 0,
            "schemas": [{"type": "struct", "schema-id": 0, "fields": [
                {"id": 1, "name": "x", "required": true, "type": "long"}
            ]}],
            "default-spec-id": 0,
            "partition-specs": [{"spec-id": 0, "fields": []}],
            "last-partition-id": 999,
            "default-sort-order-id": 0,
            "sort-orders": [{"order-id": 0, "fields": []}],
            "properties": {},
            "current-snapshot-id": n,
            "snapshots": snapshots,
            "snapshot-log": [],
            "metadata-log": []
        }))
        .unwrap()
    }

    #[test]
    fn the_walk_up_the_parents_is_newest_first_and_bounded() {
        let walk = |meta: &TableMetadata, from: Option<i64>| -> Vec<i64> {
            ancestors(meta, from).map(|s| s.snapshot_id()).collect()
        };
        let meta = chain(3, None);
        assert_eq!(walk(&meta, meta.current_snapshot_id()), [3, 2, 1]);
        assert_eq!(walk(&meta, Some(2)), [2, 1]);
        assert!(walk(&meta, None).is_empty());
        assert!(walk(&meta, Some(7)).is_empty());
        // A parent that is not in the table ends the chain.
        assert_eq!(walk(&chain(2, Some(7)), Some(2)), [2, 1]);
        // A hand-edited table whose chain loops: each snapshot once, then it stops.
        assert_eq!(walk(&chain(3, Some(3)), Some(3)), [3, 2, 1]);
    }

    #[test]
    fn metadata_versions_of_both_layouts() {
        assert_eq!(
            metadata_version("file:///w/t/metadata/v12.metadata.json"),
            Some(12)
        );
        assert_eq!(
            metadata_version("s3://b/t/metadata/00042-0f6e-4a.metadata.json"),
            Some(42)
        );
        assert_eq!(
            metadata_version("file:///w/t/metadata/snap-1-1-x.avro"),
            None
        );
        assert_eq!(
            metadata_version("file:///w/t/metadata/version-hint.text"),
            None
        );
    }
}
