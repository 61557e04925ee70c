//! Our snapshot producer: one row-delta snapshot per commit (new data files,
//! position and equality delete files), on top of the manifests of a base
//! snapshot, with a correct summary and inherited sequence numbers.
//! iceberg-rust 0.10 keeps its own producer private and has no row delta.

use std::collections::HashMap;

use iceberg::io::FileIO;
use iceberg::spec::{
    DataFile, MAIN_BRANCH, ManifestFile, ManifestListWriter, ManifestWriterBuilder, Operation,
    Snapshot, SnapshotReference, SnapshotRetention, SnapshotSummaryCollector, Summary,
};
use iceberg::{TableRequirement, TableUpdate};
use uuid::Uuid;

use crate::error::Result;
use crate::table::catalog::TableState;

pub struct Produced {
    pub snapshot_id: i64,
    pub updates: Vec<TableUpdate>,
    pub requirements: Vec<TableRequirement>,
}

/// What one snapshot adds.
pub struct RowDelta {
    pub data: Vec<DataFile>,
    pub deletes: Vec<DataFile>,
    /// Keep the manifests of this snapshot (None: start empty).
    pub base_snapshot: Option<i64>,
    /// Drop everything of the base: an overwrite that replaces the table's contents.
    pub replace: bool,
    pub properties: HashMap<String, String>,
    pub now_ms: i64,
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
    prev: Option<&HashMap<String, String>>,
    replace: bool,
) -> HashMap<String, String> {
    let empty = HashMap::new();
    let prev_props = prev.unwrap_or(&empty);
    let num = |m: &HashMap<String, String>, k: &str| {
        m.get(k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
    };
    props.extend(added.clone());
    for (total, add) in TOTALS {
        let before = if replace { 0 } else { num(prev_props, total) };
        props.insert(total.to_string(), (before + num(&added, add)).to_string());
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

pub async fn produce(file_io: &FileIO, table: &TableState, delta: RowDelta) -> Result<Produced> {
    let meta = &table.metadata;
    let snapshot_id = new_snapshot_id(table);
    let seq = meta.next_sequence_number();
    let schema = meta.current_schema().clone();
    let spec = meta.default_partition_spec().clone();
    let commit = Uuid::new_v4();
    let manifest_path = |n: usize| format!("{}/metadata/{commit}-m{n}.avro", meta.location());

    let base = delta
        .base_snapshot
        .and_then(|id| meta.snapshot_by_id(id).cloned());
    let mut manifests: Vec<ManifestFile> = Vec::new();
    let mut summary = SnapshotSummaryCollector::default();
    for (n, files, deletes) in [(0, &delta.data, false), (1, &delta.deletes, true)] {
        if files.is_empty() {
            continue;
        }
        let builder = ManifestWriterBuilder::new(
            file_io.new_output(manifest_path(n))?,
            Some(snapshot_id),
            schema.clone(),
            (*spec).clone(),
        );
        let mut w = if deletes {
            builder.build_v2_deletes()
        } else {
            builder.build_v2_data()
        };
        for f in files {
            summary.add_file(f, schema.clone(), spec.clone());
            // -1: the entry inherits this snapshot's sequence number.
            w.add_file(f.clone(), -1)?;
        }
        manifests.push(w.write_manifest_file().await?);
    }
    if let (Some(b), false) = (&base, delta.replace) {
        let t = table.table(file_io)?;
        let list = t.manifest_list_reader(b).load().await?;
        manifests.extend(list.consume_entries());
    }

    let prev = base.as_ref().map(|b| &b.summary().additional_properties);
    let props = summary_properties(delta.properties, summary.build(), prev, delta.replace);
    let operation = match (
        delta.data.is_empty(),
        delta.deletes.is_empty() && !delta.replace,
    ) {
        (_, false) => Operation::Overwrite,
        (false, true) => Operation::Append,
        (true, true) => Operation::Append,
    };

    let list_path = format!(
        "{}/metadata/snap-{snapshot_id}-1-{commit}.avro",
        meta.location()
    );
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
