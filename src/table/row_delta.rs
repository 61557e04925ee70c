//! Our snapshot producer: one row-delta snapshot per commit (new data files,
//! position and equality delete files), on top of the manifests of a base
//! snapshot, with a correct summary and inherited sequence numbers.
//! iceberg-rust 0.10 keeps its own producer private and has no row delta.

use std::collections::{HashMap, HashSet};

use iceberg::io::FileIO;
use iceberg::spec::{
    DataContentType, DataFile, MAIN_BRANCH, ManifestContentType, ManifestFile, ManifestListWriter,
    ManifestStatus, ManifestWriterBuilder, Operation, Snapshot, SnapshotReference,
    SnapshotRetention, SnapshotSummaryCollector, Summary,
};
use iceberg::{TableRequirement, TableUpdate};
use uuid::Uuid;

use crate::error::Result;
use crate::table::catalog::TableState;
use crate::table::properties::MergePolicy;

pub struct Produced {
    pub snapshot_id: i64,
    /// Manifests the new snapshot names.
    pub manifests: usize,
    /// Manifests merged into fewer (`commit.manifest-merge.*`); 0 when none.
    pub merged: usize,
    pub updates: Vec<TableUpdate>,
    pub requirements: Vec<TableRequirement>,
}

/// What one snapshot adds.
pub struct RowDelta {
    /// New data files, all in the table's default partition spec.
    pub data: Vec<DataFile>,
    /// New delete files, each with the partition spec of the data files it
    /// applies to (an older spec's, after `partition_by` changed).
    pub deletes: Vec<(i32, DataFile)>,
    /// Keep the manifests of this snapshot (None: start empty).
    pub base_snapshot: Option<i64>,
    /// Drop everything of the base: an overwrite that replaces the table's contents.
    pub replace: bool,
    pub properties: HashMap<String, String>,
    pub now_ms: i64,
    /// A compaction: files of the base that go, and the data sequence number
    /// the added files keep (None: an ordinary row delta).
    pub rewrite: Option<Rewrite>,
}

/// What a `replace` snapshot (a compaction) removes, and the data sequence
/// number its new files carry: the one of the snapshot the rewrite started
/// from (Iceberg's `use-starting-sequence-number`), so an equality delete
/// committed after that snapshot still applies to the rewritten rows.
#[derive(Debug, Clone, Default)]
pub struct Rewrite {
    pub removed: HashSet<String>,
    pub data_sequence: i64,
}

const TOTALS: [(&str, &str); 6] = [
    ("total-records", "added-records"),
    ("total-files-size", "added-files-size"),
    ("total-data-files", "added-data-files"),
    ("total-delete-files", "added-delete-files"),
    ("total-position-deletes", "added-position-deletes"),
    ("total-equality-deletes", "added-equality-deletes"),
];

fn new_snapshot_id(table: &TableState) -> i64 {
    loop {
        let (a, b) = Uuid::new_v4().as_u64_pair();
        let id = ((a ^ b) & (i64::MAX as u64)) as i64;
        if id != 0 && table.metadata.snapshot_by_id(id).is_none() {
            return id;
        }
    }
}

/// The snapshot summary: our properties, the added-* figures of the new
/// files, and total-* = the base's totals (none when `replace`) + added.
fn summary_properties(
    mut props: HashMap<String, String>,
    added: HashMap<String, String>,
    removed: &Removed,
    prev: Option<&HashMap<String, String>>,
    replace: bool,
) -> HashMap<String, String> {
    let empty = HashMap::new();
    let prev_props = prev.unwrap_or(&empty);
    let num = |m: &HashMap<String, String>, k: &str| {
        m.get(k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
    };
    props.extend(added.clone());
    let gone = removed.figures();
    for (total, add) in TOTALS {
        let before = if replace { 0 } else { num(prev_props, total) };
        let minus = gone
            .iter()
            .find(|(k, _)| *k == total)
            .map_or(0, |(_, v)| *v);
        props.insert(
            total.to_string(),
            (before + num(&added, add))
                .saturating_sub(minus)
                .to_string(),
        );
    }
    for (name, v) in removed.summary() {
        props.insert(name.to_string(), v.to_string());
    }
    if replace && prev.is_some() {
        props.insert(
            "deleted-data-files".into(),
            num(prev_props, "total-data-files").to_string(),
        );
        props.insert(
            "deleted-records".into(),
            num(prev_props, "total-records").to_string(),
        );
    }
    props
}

/// The files a rewrite took out of the base, for the summary.
#[derive(Default)]
struct Removed {
    data_files: u64,
    records: u64,
    bytes: u64,
    delete_files: u64,
    position_deletes: u64,
    equality_deletes: u64,
}

impl Removed {
    fn add(&mut self, f: &DataFile) {
        let n = f.record_count();
        self.bytes += f.file_size_in_bytes();
        match f.content_type() {
            DataContentType::Data => {
                self.data_files += 1;
                self.records += n;
            }
            DataContentType::PositionDeletes => {
                self.delete_files += 1;
                self.position_deletes += n;
            }
            DataContentType::EqualityDeletes => {
                self.delete_files += 1;
                self.equality_deletes += n;
            }
        }
    }

    /// How much each total drops.
    fn figures(&self) -> [(&'static str, u64); 6] {
        [
            ("total-records", self.records),
            ("total-files-size", self.bytes),
            ("total-data-files", self.data_files),
            ("total-delete-files", self.delete_files),
            ("total-position-deletes", self.position_deletes),
            ("total-equality-deletes", self.equality_deletes),
        ]
    }

    /// Iceberg Java's removed-* / deleted-* summary fields (those not zero).
    fn summary(&self) -> Vec<(&'static str, u64)> {
        [
            ("deleted-data-files", self.data_files),
            ("deleted-records", self.records),
            ("removed-files-size", self.bytes),
            ("removed-delete-files", self.delete_files),
            ("removed-position-deletes", self.position_deletes),
            ("removed-equality-deletes", self.equality_deletes),
        ]
        .into_iter()
        .filter(|(_, v)| *v > 0)
        .collect()
    }
}

/// The names of one commit's manifests: `<commit>-m<n>.avro`, one counter
/// for the new, rewritten and merged manifests, so no two share a name.
struct ManifestNames {
    prefix: String,
    next: std::sync::atomic::AtomicUsize,
}

impl ManifestNames {
    fn new(location: &str, commit: Uuid) -> ManifestNames {
        ManifestNames {
            prefix: format!("{location}/metadata/{commit}-m"),
            next: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    fn next(&self) -> String {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("{}{n}.avro", self.prefix)
    }
}

pub async fn produce(file_io: &FileIO, table: &TableState, delta: RowDelta) -> Result<Produced> {
    let meta = &table.metadata;
    let snapshot_id = new_snapshot_id(table);
    let commit = Uuid::new_v4();
    let names = ManifestNames::new(meta.location(), commit);
    let base = delta
        .base_snapshot
        .and_then(|id| meta.snapshot_by_id(id).cloned());
    let mut summary = SnapshotSummaryCollector::default();
    let mut manifests =
        write_added(file_io, meta, snapshot_id, &delta, &names, &mut summary).await?;
    let mut removed = Removed::default();
    if let (Some(b), false) = (&base, delta.replace) {
        manifests
            .extend(carried(file_io, table, b, &delta, snapshot_id, &names, &mut removed).await?);
    }
    let (manifests, merged) = merge_manifests(
        file_io,
        meta,
        snapshot_id,
        manifests,
        MergePolicy::of(meta),
        |_| names.next(),
    )
    .await?;
    let manifest_count = manifests.len();

    let prev = base.as_ref().map(|b| &b.summary().additional_properties);
    let operation = operation(&delta);
    let props = summary_properties(
        delta.properties,
        summary.build(),
        &removed,
        prev,
        delta.replace,
    );
    let list_path = format!(
        "{}/metadata/snap-{snapshot_id}-1-{commit}.avro",
        meta.location()
    );
    let seq = meta.next_sequence_number();
    let mut list = ManifestListWriter::v2(
        file_io.new_output(list_path.clone())?.writer().await?,
        snapshot_id,
        meta.current_snapshot_id(),
        seq,
    );
    list.add_manifests(manifests.into_iter())?;
    list.close().await?;

    let snapshot = Snapshot::builder()
        .with_manifest_list(list_path)
        .with_snapshot_id(snapshot_id)
        .with_parent_snapshot_id(meta.current_snapshot_id())
        .with_sequence_number(seq)
        .with_summary(Summary {
            operation,
            additional_properties: props,
        })
        .with_schema_id(meta.current_schema_id())
        .with_timestamp_ms(delta.now_ms.max(meta.last_updated_ms() + 1))
        .build();
    Ok(Produced {
        snapshot_id,
        manifests: manifest_count,
        merged,
        updates: vec![
            TableUpdate::AddSnapshot { snapshot },
            TableUpdate::SetSnapshotRef {
                ref_name: MAIN_BRANCH.to_string(),
                reference: SnapshotReference::new(
                    snapshot_id,
                    SnapshotRetention::branch(None, None, None),
                ),
            },
        ],
        requirements: vec![
            TableRequirement::UuidMatch { uuid: meta.uuid() },
            TableRequirement::RefSnapshotIdMatch {
                r#ref: MAIN_BRANCH.to_string(),
                snapshot_id: meta.current_snapshot_id(),
            },
        ],
    })
}

/// The snapshot's operation, as Iceberg Java names it: a rewrite replaces,
/// deletes overwrite, new rows alone append.
fn operation(delta: &RowDelta) -> Operation {
    if delta.rewrite.is_some() {
        Operation::Replace
    } else if !delta.deletes.is_empty() || delta.replace {
        Operation::Overwrite
    } else {
        Operation::Append
    }
}

/// The manifests of what the snapshot adds: one of the data files, one of
/// delete files per partition spec; each file counted in `summary`.
async fn write_added(
    file_io: &FileIO,
    meta: &iceberg::spec::TableMetadata,
    snapshot_id: i64,
    delta: &RowDelta,
    names: &ManifestNames,
    summary: &mut SnapshotSummaryCollector,
) -> Result<Vec<ManifestFile>> {
    let schema = meta.current_schema().clone();
    let mut groups: Vec<(bool, i32, Vec<&DataFile>)> = Vec::new();
    if !delta.data.is_empty() {
        groups.push((
            false,
            meta.default_partition_spec().spec_id(),
            delta.data.iter().collect(),
        ));
    }
    for (spec_id, f) in &delta.deletes {
        match groups.iter_mut().find(|g| g.0 && g.1 == *spec_id) {
            Some(g) => g.2.push(f),
            None => groups.push((true, *spec_id, vec![f])),
        }
    }
    let mut manifests = Vec::with_capacity(groups.len());
    for (deletes, spec_id, files) in groups {
        let Some(spec) = meta.partition_spec_by_id(spec_id) else {
            return Err(crate::error::Error::State {
                code: crate::error::codes::UNSUPPORTED,
                message: format!(
                    "a delete file names partition spec {spec_id}, which the table does not have"
                ),
            });
        };
        let builder = ManifestWriterBuilder::new(
            file_io.new_output(names.next())?,
            Some(snapshot_id),
            schema.clone(),
            (**spec).clone(),
        );
        let mut w = if deletes {
            builder.build_v2_deletes()
        } else {
            builder.build_v2_data()
        };
        // -1: the entry inherits this snapshot's sequence number; a
        // rewrite's files keep the starting snapshot's.
        let data_seq = delta.rewrite.as_ref().map_or(-1, |r| r.data_sequence);
        for f in files {
            summary.add_file(f, schema.clone(), spec.clone());
            w.add_file(f.clone(), data_seq)?;
        }
        manifests.push(w.write_manifest_file().await?);
    }
    Ok(manifests)
}

/// The base snapshot's manifests the new one keeps: as they are, or, for a
/// rewrite, each naming a removed file rewritten without it (what it drops
/// counted in `removed`).
async fn carried(
    file_io: &FileIO,
    table: &TableState,
    base: &iceberg::spec::SnapshotRef,
    delta: &RowDelta,
    snapshot_id: i64,
    names: &ManifestNames,
    removed: &mut Removed,
) -> Result<Vec<ManifestFile>> {
    let list = table
        .table(file_io)?
        .manifest_list_reader(base)
        .load()
        .await?;
    let Some(r) = delta.rewrite.as_ref().filter(|r| !r.removed.is_empty()) else {
        return Ok(list.consume_entries().into_iter().collect());
    };
    let base: Vec<ManifestFile> = list.consume_entries().into_iter().collect();
    let mut out = Vec::with_capacity(base.len());
    for m in base {
        match drop_entries(
            file_io,
            &table.metadata,
            snapshot_id,
            &m,
            &r.removed,
            removed,
            || names.next(),
        )
        .await?
        {
            Some(rewritten) => out.extend(rewritten),
            None => out.push(m),
        }
    }
    Ok(out)
}

/// A base manifest naming any of `removed` is rewritten: those entries
/// become DELETED by this snapshot (keeping their sequence numbers), the
/// others EXISTING, DELETED entries of earlier snapshots drop. None: the
/// manifest names none of them and is kept as it is. Returns no manifest
/// when nothing of it stays live.
async fn drop_entries(
    file_io: &FileIO,
    meta: &iceberg::spec::TableMetadata,
    snapshot_id: i64,
    m: &ManifestFile,
    removed: &HashSet<String>,
    tally: &mut Removed,
    path: impl FnOnce() -> String,
) -> Result<Option<Vec<ManifestFile>>> {
    let manifest = m.load_manifest(file_io).await?;
    let hit = manifest
        .entries()
        .iter()
        .any(|e| e.is_alive() && removed.contains(e.data_file().file_path()));
    if !hit {
        return Ok(None);
    }
    let Some(spec) = meta.partition_spec_by_id(m.partition_spec_id) else {
        return Err(crate::error::Error::State {
            code: crate::error::codes::STATE_SCHEMA,
            message: format!(
                "manifest {} names partition spec {}, which the table does not have",
                m.manifest_path, m.partition_spec_id
            ),
        });
    };
    let builder = ManifestWriterBuilder::new(
        file_io.new_output(path())?,
        Some(snapshot_id),
        meta.current_schema().clone(),
        (**spec).clone(),
    );
    let mut w = if m.content == ManifestContentType::Deletes {
        builder.build_v2_deletes()
    } else {
        builder.build_v2_data()
    };
    let mut live = 0;
    for e in manifest.entries() {
        if !e.is_alive() {
            continue;
        }
        let file = e.data_file().clone();
        let seq = e.sequence_number().unwrap_or(0);
        let file_seq = Some(e.file_sequence_number.unwrap_or(seq));
        if removed.contains(file.file_path()) {
            tally.add(&file);
            w.add_delete_file(file, seq, file_seq)?;
        } else {
            live += 1;
            w.add_existing_file(file, e.snapshot_id().unwrap_or(snapshot_id), seq, file_seq)?;
        }
    }
    let written = w.write_manifest_file().await?;
    Ok(Some(if live == 0 {
        // Nothing stays: the DELETED entries need no manifest of their own
        // (a reader of this snapshot sees the files gone either way).
        file_io.delete(&written.manifest_path).await?;
        Vec::new()
    } else {
        vec![written]
    }))
}

/// Iceberg Java's `ManifestMergeManager`: data and delete manifests are
/// grouped apart (and by partition spec), each group is bin-packed from its
/// end to `target_bytes` (so the under-filled bin is the newest and fills
/// up first), and a bin of several manifests is rewritten as one, except
/// the bin holding the group's newest manifest while it has fewer than
/// `min_count`. Entries keep their snapshot id and data and file sequence
/// numbers (EXISTING), so every delete applies exactly as before; entries
/// of this snapshot stay ADDED; DELETED entries of earlier snapshots drop.
/// Returns the snapshot's manifests and how many were merged away.
async fn merge_manifests(
    file_io: &FileIO,
    meta: &iceberg::spec::TableMetadata,
    snapshot_id: i64,
    manifests: Vec<ManifestFile>,
    policy: MergePolicy,
    path: impl Fn(usize) -> String,
) -> Result<(Vec<ManifestFile>, usize)> {
    if !policy.enabled || manifests.len() < policy.min_count {
        return Ok((manifests, 0));
    }
    let mut groups: Vec<((bool, i32), Vec<ManifestFile>)> = Vec::new();
    for m in manifests {
        let key = (
            m.content == ManifestContentType::Deletes,
            m.partition_spec_id,
        );
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, g)) => g.push(m),
            None => groups.push((key, vec![m])),
        }
    }
    let (mut out, mut merged, mut written) = (Vec::new(), 0, 0);
    for ((deletes, spec_id), group) in groups {
        let newest = group[0].manifest_path.clone();
        for bin in pack_end(group, policy.target_bytes) {
            let holds_newest = bin.iter().any(|m| m.manifest_path == newest);
            if bin.len() == 1 || (holds_newest && bin.len() < policy.min_count) {
                out.extend(bin);
                continue;
            }
            let Some(spec) = meta.partition_spec_by_id(spec_id) else {
                out.extend(bin);
                continue;
            };
            let builder = ManifestWriterBuilder::new(
                file_io.new_output(path(written))?,
                Some(snapshot_id),
                meta.current_schema().clone(),
                (**spec).clone(),
            );
            written += 1;
            let mut w = if deletes {
                builder.build_v2_deletes()
            } else {
                builder.build_v2_data()
            };
            for m in &bin {
                for e in m.load_manifest(file_io).await?.entries() {
                    let file = e.data_file().clone();
                    let ours = e.snapshot_id() == Some(snapshot_id);
                    match (e.status(), ours) {
                        (ManifestStatus::Deleted, _) => {}
                        // A rewrite's new files keep their explicit data sequence number.
                        (ManifestStatus::Added, true) => {
                            w.add_file(file, e.sequence_number().filter(|s| *s >= 0).unwrap_or(-1))?
                        }
                        _ => {
                            let seq = e.sequence_number().unwrap_or(0);
                            w.add_existing_file(
                                file,
                                e.snapshot_id().unwrap_or(snapshot_id),
                                seq,
                                Some(e.file_sequence_number.unwrap_or(seq)),
                            )?
                        }
                    }
                }
                if m.added_snapshot_id == snapshot_id {
                    // Written by this commit and now merged: never named anywhere.
                    file_io.delete(&m.manifest_path).await?;
                }
            }
            merged += bin.len();
            out.push(w.write_manifest_file().await?);
        }
    }
    Ok((out, merged))
}

/// Java's `BinPacking.ListPacker.packEnd` with a lookback of 1: bins of
/// consecutive items up to `target` bytes, filled from the end.
fn pack_end(items: Vec<ManifestFile>, target: u64) -> Vec<Vec<ManifestFile>> {
    let mut bins: Vec<(u64, Vec<ManifestFile>)> = Vec::new();
    for m in items.into_iter().rev() {
        let size = m.manifest_length.max(0) as u64;
        match bins.last_mut() {
            Some((weight, bin)) if *weight + size <= target => {
                *weight += size;
                bin.push(m);
            }
            _ => bins.push((size, vec![m])),
        }
    }
    bins.into_iter()
        .rev()
        .map(|(_, mut bin)| {
            bin.reverse();
            bin
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use iceberg::spec::ManifestContentType;

    #[test]
    fn one_counter_names_every_manifest_of_a_commit() {
        // New, rewritten and merged manifests draw from one counter: once
        // they drew from three (n, 201.., 100 + n), and a 101st merged
        // manifest took a rewritten one's name.
        let names = ManifestNames::new("s3://b/t", Uuid::nil());
        let all: Vec<String> = (0..400).map(|_| names.next()).collect();
        let distinct: HashSet<&String> = all.iter().collect();
        assert_eq!(distinct.len(), all.len());
        assert_eq!(all[0], format!("s3://b/t/metadata/{}-m0.avro", Uuid::nil()));
    }

    fn manifest(path: &str, len: i64) -> ManifestFile {
        ManifestFile {
            manifest_path: path.into(),
            manifest_length: len,
            partition_spec_id: 0,
            content: ManifestContentType::Data,
            sequence_number: 1,
            min_sequence_number: 1,
            added_snapshot_id: 1,
            added_files_count: None,
            existing_files_count: None,
            deleted_files_count: None,
            added_rows_count: None,
            existing_rows_count: None,
            deleted_rows_count: None,
            partitions: None,
            key_metadata: None,
            first_row_id: None,
        }
    }

    #[test]
    fn pack_end_fills_from_the_end_and_keeps_order() {
        let items: Vec<_> = [("a", 5), ("b", 5), ("c", 5), ("d", 20), ("e", 4)]
            .iter()
            .map(|(p, l)| manifest(p, *l))
            .collect();
        let bins: Vec<Vec<String>> = pack_end(items, 10)
            .into_iter()
            .map(|b| b.into_iter().map(|m| m.manifest_path).collect())
            .collect();
        assert_eq!(bins, vec![vec!["a"], vec!["b", "c"], vec!["d"], vec!["e"]]);
    }
}
