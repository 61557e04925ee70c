//! Compaction inside the writer: small data files and files with many rows
//! deleted are rewritten with their deletes applied (bin-packed per
//! partition, Iceberg Java's `RewriteDataFiles`), position-delete files that
//! only name rewritten files go with them, the rest of a partition's
//! position-delete files are merged into one (`RewritePositionDeleteFiles`,
//! dangling entries dropped), and equality deletes disappear into the
//! rewritten files they applied to.
//!
//! The new files carry the data sequence number of the snapshot the rewrite
//! started from (`use-starting-sequence-number`), so a delete committed after
//! that snapshot still applies to the rows they hold. Every surviving row's
//! old (file, position) → new (file, position) is returned, so the engine
//! moves its state with the rows and keeps removing them by position.
//!
//! This module picks and writes files; the engine commits them (state
//! first, then the target, as for a batch).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, ArrayRef, RecordBatch, UInt32Array};
use arrow_row::{RowConverter, SortField};
use arrow_schema::SchemaRef as ArrowSchemaRef;
use arrow_select::take::take;
use futures::{StreamExt, TryStreamExt};
use iceberg::io::FileIO;
use iceberg::spec::{DataContentType, DataFile, Schema, SchemaRef, Struct, TableMetadata};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde::Serialize;

use crate::core::flow::CompactionPolicy;
use crate::error::{Error, Result, codes};
use crate::table::catalog::TableState;
use crate::table::write::{self, FileNamer, Partitioner};

/// Iceberg's table property for the size data files are written to.
pub const PROP_TARGET_FILE_SIZE: &str = "write.target-file-size-bytes";
const DEFAULT_TARGET_FILE_SIZE: u64 = 128 << 20;
/// Manifests read at once.
const MANIFESTS_IN_FLIGHT: usize = 8;

/// The size compaction writes files to: the flow's setting, else the
/// table's `write.target-file-size-bytes`, else 128 MiB.
pub fn target_file_size(meta: &TableMetadata, policy: &CompactionPolicy) -> u64 {
    policy
        .target_file_size_bytes
        .or_else(|| {
            meta.properties()
                .get(PROP_TARGET_FILE_SIZE)
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(DEFAULT_TARGET_FILE_SIZE)
        .max(1)
}

/// One live file of a snapshot, with what deciding its deletes needs.
#[derive(Debug, Clone)]
pub struct Entry {
    pub file: DataFile,
    pub spec_id: i32,
    /// Data sequence number.
    pub seq: i64,
}

impl Entry {
    fn path(&self) -> &str {
        self.file.file_path()
    }

    fn partition_key(&self) -> (i32, &Struct) {
        (self.spec_id, self.file.partition())
    }

    /// Whether this equality delete applies to `data` (spec: a strictly
    /// lower data sequence number, and the same partition unless the delete
    /// is unpartitioned).
    fn eq_applies_to(&self, data: &Entry) -> bool {
        data.seq < self.seq
            && (self.file.partition().fields().is_empty()
                || self.partition_key() == data.partition_key())
    }
}

/// The live files of a table's current snapshot.
#[derive(Debug, Default)]
pub struct Inventory {
    pub data: Vec<Entry>,
    pub pos_deletes: Vec<Entry>,
    pub eq_deletes: Vec<Entry>,
    /// The current snapshot's sequence number: the rewrite's starting one.
    pub snapshot_seq: i64,
}

/// Reads every manifest of the current snapshot (None: no snapshot yet).
pub async fn inventory(file_io: &FileIO, table: &TableState) -> Result<Option<Inventory>> {
    match table.metadata.current_snapshot() {
        Some(snap) => Ok(Some(inventory_of(file_io, table, snap).await?)),
        None => Ok(None),
    }
}

/// Reads every manifest of snapshot `snap` of `table`.
pub async fn inventory_of(
    file_io: &FileIO,
    table: &TableState,
    snap: &iceberg::spec::SnapshotRef,
) -> Result<Inventory> {
    let t = table.table(file_io)?;
    let list = t.manifest_list_reader(snap).load().await?;
    let mut inv = Inventory {
        snapshot_seq: snap.sequence_number(),
        ..Default::default()
    };
    // Owned futures: a stream over borrowed ones is not `Send` for the committer task.
    let manifests: Vec<_> = futures::stream::iter(list.entries().to_vec())
        .map(|m| {
            let io = file_io.clone();
            async move { Ok::<_, Error>((m.partition_spec_id, m.load_manifest(&io).await?)) }
        })
        .buffered(MANIFESTS_IN_FLIGHT)
        .try_collect()
        .await?;
    for (spec_id, manifest) in manifests {
        for e in manifest.entries() {
            if !e.is_alive() {
                continue;
            }
            let entry = Entry {
                file: e.data_file().clone(),
                spec_id,
                seq: e.sequence_number().unwrap_or(0),
            };
            match entry.file.content_type() {
                DataContentType::Data => inv.data.push(entry),
                DataContentType::PositionDeletes => inv.pos_deletes.push(entry),
                DataContentType::EqualityDeletes => inv.eq_deletes.push(entry),
            }
        }
    }
    Ok(inv)
}

/// The rows of every position-delete file of an inventory.
#[derive(Debug, Default)]
pub struct PositionDeletes {
    /// Per data file path: (position, data sequence number of the delete file).
    by_file: HashMap<Arc<str>, Vec<(u64, i64)>>,
    /// Per delete file (in `Inventory::pos_deletes` order): the data files it names.
    refs: Vec<Vec<Arc<str>>>,
    pub bytes_read: u64,
}

impl PositionDeletes {
    /// Positions of `data` that some delete file removes (sorted, unique).
    pub fn deleted(&self, data: &Entry) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .by_file
            .get(data.path())
            .map(|d| {
                d.iter()
                    .filter(|(_, seq)| *seq >= data.seq)
                    .map(|(p, _)| *p)
                    .collect()
            })
            .unwrap_or_default();
        v.sort_unstable();
        v.dedup();
        v
    }
}

pub async fn read_position_deletes(file_io: &FileIO, inv: &Inventory) -> Result<PositionDeletes> {
    let mut out = PositionDeletes::default();
    let mut interned: HashSet<Arc<str>> = HashSet::new();
    let paths: Vec<String> = inv
        .pos_deletes
        .iter()
        .map(|d| d.path().to_string())
        .collect();
    let read: Vec<Vec<RecordBatch>> = futures::stream::iter(paths)
        .map(|p| {
            let io = file_io.clone();
            async move { read_parquet(&io, &p).await }
        })
        .buffered(MANIFESTS_IN_FLIGHT)
        .try_collect()
        .await?;
    for (d, batches) in inv.pos_deletes.iter().zip(read) {
        out.bytes_read += d.file.file_size_in_bytes();
        let mut refs: Vec<Arc<str>> = Vec::new();
        for b in batches {
            if b.num_columns() < 2 {
                return Err(bad_file(
                    d.path(),
                    "a position-delete file without file_path and pos",
                ));
            }
            let paths = arrow_cast::cast(b.column(0), &arrow_schema::DataType::Utf8)?;
            let paths = paths.as_string::<i32>();
            let pos = arrow_cast::cast(b.column(1), &arrow_schema::DataType::Int64)?;
            let pos = pos.as_primitive::<Int64Type>();
            for r in 0..b.num_rows() {
                if paths.is_null(r) || pos.is_null(r) {
                    continue;
                }
                let p = paths.value(r);
                let path = match interned.get(p) {
                    Some(a) => a.clone(),
                    None => {
                        let a: Arc<str> = Arc::from(p);
                        interned.insert(a.clone());
                        a
                    }
                };
                if refs.last() != Some(&path) && !refs.contains(&path) {
                    refs.push(path.clone());
                }
                out.by_file
                    .entry(path)
                    .or_default()
                    .push((pos.value(r).max(0) as u64, d.seq));
            }
        }
        out.refs.push(refs);
    }
    Ok(out)
}

fn bad_file(path: &str, what: &str) -> Error {
    Error::State {
        code: codes::SCHEMA_DRIFT,
        message: format!("compaction cannot read {path}: {what}"),
    }
}

pub(crate) async fn read_parquet(file_io: &FileIO, path: &str) -> Result<Vec<RecordBatch>> {
    let bytes = file_io.new_input(path)?.read().await?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)?
        .with_batch_size(64 * 1024)
        .build()?;
    Ok(reader.collect::<std::result::Result<Vec<_>, _>>()?)
}

/// What one run rewrites and removes (indices into the inventory).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Selection {
    /// Data files read and rewritten, their deletes applied.
    pub rewrite: Vec<usize>,
    /// Data files every row of which is deleted: removed without reading.
    pub drop_data: Vec<usize>,
    /// Position-delete files that only name removed (or absent) data files.
    pub drop_pos: Vec<usize>,
    /// Groups of position-delete files (one partition each) merged into one.
    pub merge_pos: Vec<Vec<usize>>,
    /// Equality-delete files that no remaining data file is old enough for.
    pub drop_eq: Vec<usize>,
    /// Bytes of data files to read.
    pub bytes: u64,
}

impl Selection {
    pub fn is_empty(&self) -> bool {
        self.rewrite.is_empty()
            && self.drop_data.is_empty()
            && self.drop_pos.is_empty()
            && self.merge_pos.is_empty()
            && self.drop_eq.is_empty()
    }
}

/// One partition's candidates: (partition, urgent, (data index, size)).
type Group<'a> = ((i32, &'a Struct), bool, Vec<(usize, u64)>);

/// Where the rows of one rewritten file went: per old position, (index
/// into the new files, position), or None for a deleted row.
pub type Moves = Vec<Option<(u32, u32)>>;

/// Decides a run (pure). A data file of the default spec is a candidate when
/// it is small (under `min_file_size_ratio` of the target), has more than
/// `delete_ratio` of its rows deleted, or an equality delete applies to it;
/// a data file of an older spec always is (it is rewritten into the default
/// spec, as Iceberg Java rewrites files whose spec is not the output spec).
/// A partition's candidates are rewritten when there are `min_input_files`
/// of them, or two that fill a target file, or one has too many deletes, an
/// equality delete or an older spec. Fully deleted files go without being read. Partitions
/// are taken, most urgent first, until `max_bytes_per_run` would be passed
/// (the first always, cut to the budget).
pub fn select(
    inv: &Inventory,
    pd: &PositionDeletes,
    policy: &CompactionPolicy,
    target: u64,
    default_spec: i32,
) -> Selection {
    let mut sel = Selection::default();
    let small_below = (target as f64 * policy.min_file_size_ratio) as u64;
    // (partition) → (urgent, candidates (index, size))
    let mut groups: Vec<Group> = Vec::new();
    for (i, d) in inv.data.iter().enumerate() {
        let respec = d.spec_id != default_spec;
        let records = d.file.record_count();
        let deleted = pd.deleted(d).len() as u64;
        let eq = inv.eq_deletes.iter().any(|e| e.eq_applies_to(d));
        if records > 0 && deleted >= records && !eq {
            sel.drop_data.push(i);
            continue;
        }
        let size = d.file.file_size_in_bytes();
        let heavy = records > 0 && deleted as f64 > records as f64 * policy.delete_ratio;
        if !(size < small_below || heavy || eq || respec) {
            continue;
        }
        let key = d.partition_key();
        let at = match groups.iter().position(|(k, _, _)| *k == key) {
            Some(at) => at,
            None => {
                groups.push((key, false, Vec::new()));
                groups.len() - 1
            }
        };
        groups[at].1 |= heavy || eq || respec;
        groups[at].2.push((i, size));
    }
    let mut groups: Vec<(bool, Vec<(usize, u64)>)> = groups
        .into_iter()
        .filter(|(_, urgent, c)| {
            let bytes: u64 = c.iter().map(|x| x.1).sum();
            *urgent || c.len() >= policy.min_input_files || (c.len() >= 2 && bytes >= target)
        })
        .map(|(_, urgent, c)| (urgent, c))
        .collect();
    groups.sort_by_key(|(urgent, c)| (!*urgent, std::cmp::Reverse(c.len())));
    for (_, mut cands) in groups {
        let bytes: u64 = cands.iter().map(|x| x.1).sum();
        if sel.bytes + bytes <= policy.max_bytes_per_run {
            sel.bytes += bytes;
            sel.rewrite.extend(cands.iter().map(|x| x.0));
        } else if sel.rewrite.is_empty() {
            // One partition over the budget: its smallest files first, up to it.
            cands.sort_by_key(|x| x.1);
            for (i, size) in cands {
                if !sel.rewrite.is_empty() && sel.bytes + size > policy.max_bytes_per_run {
                    break;
                }
                sel.bytes += size;
                sel.rewrite.push(i);
            }
        }
    }
    sel.rewrite.sort_unstable();

    // What stays, and which deletes still apply to it.
    let removed: HashSet<usize> = sel.rewrite.iter().chain(&sel.drop_data).copied().collect();
    let remaining: HashMap<&str, &Entry> = inv
        .data
        .iter()
        .enumerate()
        .filter(|(i, _)| !removed.contains(i))
        .map(|(_, d)| (d.path(), d))
        .collect();
    let mut pos_groups: Vec<((i32, &Struct), Vec<usize>)> = Vec::new();
    for (j, d) in inv.pos_deletes.iter().enumerate() {
        let live = pd.refs[j]
            .iter()
            .any(|p| remaining.get(&**p).is_some_and(|f| d.seq >= f.seq));
        if !live {
            sel.drop_pos.push(j);
            continue;
        }
        let key = d.partition_key();
        match pos_groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, g)) => g.push(j),
            None => pos_groups.push((key, vec![j])),
        }
    }
    sel.merge_pos = pos_groups
        .into_iter()
        .filter(|(_, g)| g.len() >= policy.min_delete_files.max(2))
        .map(|(_, g)| g)
        .collect();
    for (k, e) in inv.eq_deletes.iter().enumerate() {
        if !remaining.values().any(|d| e.eq_applies_to(d)) {
            sel.drop_eq.push(k);
        }
    }
    sel
}

/// The files a run wrote, and where the rows of the files it read went.
#[derive(Debug, Default)]
pub struct Rewritten {
    /// New data files, in the default spec.
    pub data: Vec<DataFile>,
    /// Merged position deletes, each with its spec id.
    pub deletes: Vec<(i32, DataFile)>,
    /// Data and delete files the commit removes.
    pub removed: HashSet<String>,
    /// Per rewritten file: its path and, per old position, the (index into
    /// `data`, position) its row moved to (None: the row was deleted).
    pub moves: Vec<(String, Moves)>,
    pub rows_moved: u64,
    pub rows_dropped: u64,
    pub bytes_read: u64,
}

/// Equality deletes of one file, as row-encoded values of its columns.
struct EqSet {
    /// Columns of the target (by index in the target Arrow schema).
    cols: Vec<usize>,
    conv: RowConverter,
    rows: HashSet<Box<[u8]>>,
}

async fn load_eq(
    file_io: &FileIO,
    e: &Entry,
    schema: &Schema,
    arrow: &ArrowSchemaRef,
) -> Result<EqSet> {
    let ids = e.file.equality_ids().unwrap_or_default();
    let mut cols = Vec::new();
    for id in &ids {
        let name = schema
            .field_by_id(*id)
            .map(|f| f.name.clone())
            .ok_or_else(|| {
                bad_file(e.path(), &format!("equality field id {id} is not a column"))
            })?;
        cols.push(arrow.index_of(&name)?);
    }
    let fields: Vec<SortField> = cols
        .iter()
        .map(|&c| SortField::new(arrow.field(c).data_type().clone()))
        .collect();
    let conv = RowConverter::new(fields)?;
    let mut rows = HashSet::new();
    for b in read_parquet(file_io, e.path()).await? {
        let arrays = ids
            .iter()
            .zip(&cols)
            .map(|(id, &c)| {
                let at = write::column_for(&b, *id, arrow.field(c).name())
                    .ok_or_else(|| bad_file(e.path(), &format!("no column for field id {id}")))?;
                Ok(arrow_cast::cast(b.column(at), arrow.field(c).data_type())?)
            })
            .collect::<Result<Vec<ArrayRef>>>()?;
        let r = conv.convert_columns(&arrays)?;
        rows.extend(r.iter().map(|row| Box::<[u8]>::from(row.as_ref())));
    }
    Ok(EqSet { cols, conv, rows })
}

/// The batch's rows at `idx`.
fn take_rows(b: &RecordBatch, idx: Vec<u32>) -> Result<RecordBatch> {
    let take_idx = UInt32Array::from(idx);
    let cols = b
        .columns()
        .iter()
        .map(|c| take(c.as_ref(), &take_idx, None))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(RecordBatch::try_new(b.schema(), cols)?)
}

/// Data file `d` read into `schema` (`arrow` its Arrow form), batch by
/// batch, each with the positions in it that no delete of the inventory
/// removes. `eq_sets` caches equality-delete files across calls.
async fn live_rows(
    file_io: &FileIO,
    inv: &Inventory,
    pd: &PositionDeletes,
    d: &Entry,
    schema: &Schema,
    arrow: &ArrowSchemaRef,
    eq_sets: &mut HashMap<usize, EqSet>,
) -> Result<Vec<(RecordBatch, Vec<u32>)>> {
    let deleted = pd.deleted(d);
    let applying: Vec<usize> = inv
        .eq_deletes
        .iter()
        .enumerate()
        .filter(|(_, e)| e.eq_applies_to(d))
        .map(|(k, _)| k)
        .collect();
    for &k in &applying {
        if let std::collections::hash_map::Entry::Vacant(slot) = eq_sets.entry(k) {
            slot.insert(load_eq(file_io, &inv.eq_deletes[k], schema, arrow).await?);
        }
    }
    let mut out = Vec::new();
    let mut base = 0usize;
    let mut del = deleted.iter().peekable();
    for raw in read_parquet(file_io, d.path()).await? {
        let b = write::to_schema(&raw, schema, arrow).map_err(|what| bad_file(d.path(), &what))?;
        let n = b.num_rows();
        let mut keep = vec![true; n];
        while let Some(&&p) = del.peek() {
            if p as usize >= base + n {
                break;
            }
            if p as usize >= base {
                keep[p as usize - base] = false;
            }
            del.next();
        }
        for k in &applying {
            let set = &eq_sets[k];
            let arrays: Vec<ArrayRef> = set.cols.iter().map(|&c| b.column(c).clone()).collect();
            let rows = set.conv.convert_columns(&arrays)?;
            for (r, row) in rows.iter().enumerate() {
                if keep[r] && set.rows.contains(row.as_ref()) {
                    keep[r] = false;
                }
            }
        }
        let idx: Vec<u32> = (0..n as u32).filter(|&r| keep[r as usize]).collect();
        out.push((b, idx));
        base += n;
    }
    let records = d.file.record_count() as usize;
    if base != records {
        return Err(bad_file(
            d.path(),
            &format!("{base} rows read, the manifest says {records}"),
        ));
    }
    Ok(out)
}

/// Every live row of the table's current snapshot, read into its current
/// schema (deletes applied): autocdc's own reader, for `show` and tests.
pub async fn scan(file_io: &FileIO, table: &TableState) -> Result<Vec<RecordBatch>> {
    let Some(inv) = inventory(file_io, table).await? else {
        return Ok(Vec::new());
    };
    let schema = table.metadata.current_schema().clone();
    let arrow: ArrowSchemaRef = Arc::new(iceberg::arrow::schema_to_arrow_schema(&schema)?);
    let pd = read_position_deletes(file_io, &inv).await?;
    let mut eq_sets = HashMap::new();
    let mut out = Vec::new();
    for d in &inv.data {
        for (b, idx) in live_rows(file_io, &inv, &pd, d, &schema, &arrow, &mut eq_sets).await? {
            if idx.len() == b.num_rows() {
                out.push(b);
            } else if !idx.is_empty() {
                out.push(take_rows(&b, idx)?);
            }
        }
    }
    Ok(out)
}

/// Reads the selected files, applies their deletes, writes the survivors
/// (bin-packed to `target` per partition) and the merged position deletes.
#[allow(clippy::too_many_arguments)]
pub async fn rewrite(
    file_io: &FileIO,
    inv: &Inventory,
    pd: &PositionDeletes,
    sel: &Selection,
    schema: SchemaRef,
    spec_id: i32,
    partitioner: Option<&Partitioner>,
    namer: &mut FileNamer,
    target: u64,
) -> Result<Rewritten> {
    let arrow: ArrowSchemaRef = Arc::new(iceberg::arrow::schema_to_arrow_schema(&schema)?);
    let mut out = Rewritten::default();
    let mut eq_sets: HashMap<usize, EqSet> = HashMap::new();
    let mut parts: Vec<RecordBatch> = Vec::new();
    // Per surviving row, in `parts` order: (index into out.moves, old position).
    let mut origin: Vec<(u32, u32)> = Vec::new();
    for &i in &sel.rewrite {
        let d = &inv.data[i];
        out.bytes_read += d.file.file_size_in_bytes();
        out.removed.insert(d.path().to_string());
        let records = d.file.record_count() as usize;
        let slot = out.moves.len() as u32;
        out.moves.push((d.path().to_string(), vec![None; records]));
        let mut base = 0usize;
        for (b, idx) in live_rows(file_io, inv, pd, d, &schema, &arrow, &mut eq_sets).await? {
            let n = b.num_rows();
            out.rows_dropped += (n - idx.len()) as u64;
            origin.extend(idx.iter().map(|&r| (slot, (base + r as usize) as u32)));
            if idx.len() == n {
                parts.push(b);
            } else if !idx.is_empty() {
                parts.push(take_rows(&b, idx)?);
            }
            base += n;
        }
    }
    if !parts.is_empty() {
        // Written from the pieces as read: joining them into one batch first
        // held the surviving rows twice at compaction's peak.
        let written = write::data_files(
            file_io,
            namer,
            schema.clone(),
            spec_id,
            partitioner,
            parts,
            target,
        )
        .await?;
        for (&(slot, pos), &(f, p)) in origin.iter().zip(&written.locs) {
            out.moves[slot as usize].1[pos as usize] = Some((f, p));
        }
        out.rows_moved = written.locs.len() as u64;
        out.data = written.files;
    }
    for &i in &sel.drop_data {
        out.removed.insert(inv.data[i].path().to_string());
    }
    for &j in &sel.drop_pos {
        out.removed.insert(inv.pos_deletes[j].path().to_string());
    }
    for &k in &sel.drop_eq {
        out.removed.insert(inv.eq_deletes[k].path().to_string());
    }
    // Merged position deletes: the entries of the group that still apply to
    // a data file that stays.
    let seq_of: HashMap<&str, i64> = inv
        .data
        .iter()
        .filter(|d| !out.removed.contains(d.path()))
        .map(|d| (d.path(), d.seq))
        .collect();
    // The merged files are made first, then written several at once.
    let mut merged = Vec::new();
    for group in &sel.merge_pos {
        let mut entries: Vec<(&str, u32)> = Vec::new();
        let first = &inv.pos_deletes[group[0]];
        for &j in group {
            let d = &inv.pos_deletes[j];
            out.bytes_read += d.file.file_size_in_bytes();
            out.removed.insert(d.path().to_string());
            for path in &pd.refs[j] {
                let Some(&data_seq) = seq_of.get(&**path) else {
                    continue;
                };
                if d.seq < data_seq {
                    continue;
                }
                for &(pos, s) in &pd.by_file[path] {
                    if s == d.seq && pos <= u32::MAX as u64 {
                        entries.push((&**path, pos as u32));
                    }
                }
            }
        }
        entries.sort_unstable();
        entries.dedup();
        let dir = write::partition_dir(namer.location(), first.path());
        merged.extend(write::position_deletes(
            namer,
            first.spec_id,
            first.file.partition(),
            &dir,
            entries,
        )?);
    }
    out.deletes
        .extend(write::write_deletes(file_io, merged).await?);
    Ok(out)
}

/// What a compaction run did (or, dry, would do) to a table.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct CompactionReport {
    pub data_files_rewritten: usize,
    pub data_files_written: usize,
    /// Data files every row of which was deleted, removed without a rewrite.
    pub data_files_dropped: usize,
    pub delete_files_removed: usize,
    pub delete_files_written: usize,
    pub equality_delete_files_removed: usize,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub rows_moved: u64,
    /// Rows the deletes removed, now gone from the files.
    pub rows_dropped: u64,
    /// State table files replaced by one.
    pub state_files_rewritten: usize,
    /// Why nothing was committed, when nothing was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
    pub elapsed_ms: f64,
}

#[cfg(test)]
mod tests {
    use iceberg::spec::{DataFileBuilder, DataFileFormat, Literal};

    use super::*;

    fn file(path: &str, content: DataContentType, size: u64, records: u64, part: i64) -> DataFile {
        let mut b = DataFileBuilder::default();
        b.content(content)
            .file_path(path.to_string())
            .file_format(DataFileFormat::Parquet)
            .partition(Struct::from_iter([Some(Literal::long(part))]))
            .partition_spec_id(0)
            .record_count(records)
            .file_size_in_bytes(size);
        if content == DataContentType::EqualityDeletes {
            b.equality_ids(Some(vec![1]));
        }
        b.build().unwrap()
    }

    fn data(path: &str, size: u64, records: u64, seq: i64, part: i64) -> Entry {
        Entry {
            file: file(path, DataContentType::Data, size, records, part),
            spec_id: 0,
            seq,
        }
    }

    fn pos(path: &str, seq: i64, part: i64) -> Entry {
        Entry {
            file: file(path, DataContentType::PositionDeletes, 100, 1, part),
            spec_id: 0,
            seq,
        }
    }

    /// Position deletes: per delete file, (data file, positions).
    fn deletes(inv: &Inventory, rows: &[&[(&str, &[u64])]]) -> PositionDeletes {
        let mut pd = PositionDeletes::default();
        for (d, entries) in inv.pos_deletes.iter().zip(rows) {
            let mut refs = Vec::new();
            for (path, positions) in entries.iter() {
                let p: Arc<str> = Arc::from(*path);
                refs.push(p.clone());
                for &q in positions.iter() {
                    pd.by_file.entry(p.clone()).or_default().push((q, d.seq));
                }
            }
            pd.refs.push(refs);
        }
        pd
    }

    fn policy(min_files: usize, max_bytes: u64) -> CompactionPolicy {
        CompactionPolicy {
            min_input_files: min_files,
            min_delete_files: 2,
            max_bytes_per_run: max_bytes,
            ..CompactionPolicy::default()
        }
    }

    #[test]
    fn small_files_are_rewritten_per_partition_once_there_are_enough() {
        let inv = Inventory {
            data: vec![
                data("a1", 10, 10, 1, 0),
                data("a2", 10, 10, 2, 0),
                data("a3", 10, 10, 3, 0),
                data("b1", 10, 10, 1, 1),
                data("big", 1000, 10, 1, 0),
            ],
            snapshot_seq: 3,
            ..Default::default()
        };
        let pd = PositionDeletes::default();
        // Target 1000: "big" is not small; partition 1 has one small file only.
        let sel = select(&inv, &pd, &policy(3, 1 << 30), 1000, 0);
        assert_eq!(sel.rewrite, vec![0, 1, 2]);
        assert_eq!(sel.bytes, 30);
        let sel = select(&inv, &pd, &policy(4, 1 << 30), 1000, 0);
        assert!(sel.is_empty(), "{sel:?}");
        // Under another default spec every file is rewritten into it, each
        // partition however few files it has.
        let sel = select(&inv, &pd, &policy(4, 1 << 30), 1000, 7);
        assert_eq!(sel.rewrite, vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn deletes_decide_heavy_files_fully_deleted_files_and_which_delete_files_go() {
        let inv = Inventory {
            data: vec![
                data("big1", 1000, 10, 1, 0),
                data("big2", 1000, 10, 2, 0),
                data("gone", 1000, 2, 2, 0),
                data("big3", 1000, 10, 3, 0),
            ],
            pos_deletes: vec![
                pos("d1", 2, 0),
                pos("d2", 3, 0),
                pos("d3", 3, 0),
                pos("d4", 4, 0),
            ],
            snapshot_seq: 4,
            ..Default::default()
        };
        let pd = deletes(
            &inv,
            &[
                &[("big1", &[0, 1, 2, 3])],
                &[("gone", &[0, 1]), ("big2", &[5])],
                &[("big3", &[1])],
                &[("big3", &[2])],
            ],
        );
        let sel = select(&inv, &pd, &policy(5, 1 << 30), 1000, 0);
        // big1: 40% deleted (> 30%): rewritten alone; gone: dropped unread.
        assert_eq!(sel.rewrite, vec![0]);
        assert_eq!(sel.drop_data, vec![2]);
        // d1 only named big1: it goes. d2 still names big2, d3/d4 big3: merged.
        assert_eq!(sel.drop_pos, vec![0]);
        assert_eq!(sel.merge_pos, vec![vec![1, 2, 3]]);
    }

    #[test]
    fn an_equality_delete_goes_once_no_older_file_stays_and_the_budget_holds() {
        let eq = Entry {
            file: file("eq", DataContentType::EqualityDeletes, 100, 1, 0),
            spec_id: 0,
            seq: 3,
        };
        let inv = Inventory {
            data: vec![
                data("old", 1000, 10, 1, 0),
                data("new", 1000, 10, 3, 0),
                data("other", 1000, 10, 1, 1),
            ],
            eq_deletes: vec![eq],
            snapshot_seq: 3,
            ..Default::default()
        };
        let pd = PositionDeletes::default();
        let sel = select(&inv, &pd, &policy(5, 1 << 30), 1000, 0);
        // "old" is older than the delete, same partition: rewritten; "new"
        // is not older; "other" is in another partition.
        assert_eq!(sel.rewrite, vec![0]);
        assert_eq!(sel.drop_eq, vec![0]);
        // A budget smaller than one file still takes the most urgent one.
        let sel = select(&inv, &pd, &policy(5, 10), 1000, 0);
        assert_eq!(sel.rewrite, vec![0]);
        assert!(sel.bytes > 10);
    }

    #[test]
    fn the_byte_budget_cuts_a_run_into_partitions() {
        let mut files = Vec::new();
        for p in 0..3 {
            for i in 0..4 {
                files.push(data(&format!("p{p}-{i}"), 100, 10, 1, p));
            }
        }
        let inv = Inventory {
            data: files,
            snapshot_seq: 1,
            ..Default::default()
        };
        let pd = PositionDeletes::default();
        let sel = select(&inv, &pd, &policy(2, 800), 1000, 0);
        assert_eq!(sel.rewrite.len(), 8, "two whole partitions fit: {sel:?}");
        assert_eq!(sel.bytes, 800);
        // Within one partition over the budget: its smallest files, up to it.
        let sel = select(&inv, &pd, &policy(2, 250), 1000, 0);
        assert_eq!(sel.rewrite.len(), 2, "{sel:?}");
    }
}
