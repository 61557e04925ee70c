//! Parquet files for a commit: data files (rolled at a target size, so every
//! written row's file and position is known), position-delete files (sorted
//! by file path, then position, as the spec requires) and equality-delete
//! files on the key columns (only for rows whose position is unknown).

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{
    Array, ArrayRef, Int64Array, RecordBatch, StringArray, StructArray, UInt32Array,
};
use arrow_row::{RowConverter, SortField};
use arrow_select::take::take;
use iceberg::arrow::schema_to_arrow_schema;
use iceberg::arrow::{PartitionValueCalculator, arrow_struct_to_literal};
use iceberg::io::FileIO;
use iceberg::metadata_columns::{
    RESERVED_COL_NAME_DELETE_FILE_PATH, RESERVED_COL_NAME_DELETE_FILE_POS,
    RESERVED_FIELD_ID_DELETE_FILE_PATH, RESERVED_FIELD_ID_DELETE_FILE_POS,
};
use iceberg::spec::{
    DataContentType, DataFile, Literal, NestedField, PartitionSpecRef, PrimitiveType, Schema,
    SchemaRef, Struct, StructType, Type,
};
use iceberg::writer::file_writer::{FileWriter, FileWriterBuilder, ParquetWriterBuilder};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;
use uuid::Uuid;

use crate::error::{Error, Result, codes};

/// A file of fewer rows is written with snappy, not zstd: parquet makes a
/// zstd compressor and decompressor for each column of each file (a
/// partitioned commit writes a small file per partition; their contexts
/// were a quarter of its time), and on a few KiB the two compress alike.
/// Compaction merges such files into bigger ones, written with zstd.
const SMALL_FILE_ROWS: usize = 4096;

/// Rows per Parquet row group and the cap on rows per data file (positions are u32).
const ROW_GROUP_ROWS: usize = 1 << 20;
const MAX_FILE_ROWS: usize = 1 << 30;

/// What a file is written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileUse {
    /// A file of a table others read (the target, its delete files):
    /// column statistics, by which readers skip files and pages.
    Table,
    /// A file of a state table: only autocdc reads it, always whole
    /// (`read_state`), so it carries no statistics. Comparing every value
    /// for each page's and chunk's bounds was half of its string columns'
    /// encoding.
    State,
}

/// zstd; dictionary encoding only for string columns (where values repeat:
/// statuses, file paths). Hashing every integer into a dictionary costs more
/// than it saves for keys and sequences, which are mostly distinct.
pub fn props(schema: &Schema, used: FileUse) -> WriterProperties {
    let stats = match used {
        FileUse::Table => EnabledStatistics::Page,
        FileUse::State => EnabledStatistics::None,
    };
    let mut b = WriterProperties::builder()
        .set_statistics_enabled(stats)
        .set_compression(Compression::ZSTD(
            ZstdLevel::try_new(1).expect("valid zstd level"),
        ))
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .set_dictionary_enabled(false);
    for f in schema.as_struct().fields() {
        if matches!(*f.field_type, Type::Primitive(PrimitiveType::String)) {
            b = b.set_column_dictionary_enabled(ColumnPath::from(f.name.as_str()), true);
        }
    }
    b.build()
}

/// Groups a batch's rows by partition value (for a partitioned table).
pub struct Partitioner {
    calc: PartitionValueCalculator,
    spec: PartitionSpecRef,
    ptype: StructType,
    /// Which table columns the partition values come from.
    pub source_ids: Vec<i32>,
}

impl Partitioner {
    /// None when `spec` is unpartitioned.
    pub fn new(spec: PartitionSpecRef, schema: &Schema) -> Result<Option<Partitioner>> {
        if spec.is_unpartitioned() {
            return Ok(None);
        }
        Ok(Some(Partitioner {
            calc: PartitionValueCalculator::try_new(&spec, schema)?,
            ptype: spec.partition_type(schema)?,
            source_ids: spec.fields().iter().map(|f| f.source_id).collect(),
            spec,
        }))
    }

    /// The partition of each group of rows of `batch` (in the table's Arrow
    /// schema) and its rows, ascending; groups in order of their first row.
    pub fn group(&self, batch: &RecordBatch) -> Result<Vec<(Struct, Vec<u32>)>> {
        let values = self.calc.calculate(batch)?;
        let arr = values
            .as_any()
            .downcast_ref::<StructArray>()
            .ok_or_else(|| builder_err("partition values are not a struct"))?;
        let converter = RowConverter::new(
            arr.fields()
                .iter()
                .map(|f| SortField::new(f.data_type().clone()))
                .collect(),
        )?;
        let rows = converter.convert_columns(arr.columns())?;
        let mut index: HashMap<&[u8], usize> = HashMap::new();
        let mut groups: Vec<(usize, Vec<u32>)> = Vec::new();
        for (i, row) in rows.iter().enumerate() {
            let g = *index.entry(row.data()).or_insert_with(|| {
                groups.push((i, Vec::new()));
                groups.len() - 1
            });
            groups[g].1.push(i as u32);
        }
        groups
            .into_iter()
            .map(|(first, rows)| {
                let one: ArrayRef = Arc::new(arr.slice(first, 1));
                match arrow_struct_to_literal(&one, &self.ptype)?.pop().flatten() {
                    Some(Literal::Struct(s)) => Ok((s, rows)),
                    _ => Err(builder_err("a partition value is not a struct")),
                }
            })
            .collect()
    }

    /// `name=value/...` as Iceberg Java lays out data directories, values URL-encoded.
    pub fn path(&self, p: &Struct) -> String {
        let fields = self.ptype.fields();
        self.spec
            .fields()
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let human = f
                    .transform
                    .to_human_string(&fields[i].field_type, p[i].as_ref());
                format!(
                    "{}={}",
                    f.name,
                    url::form_urlencoded::byte_serialize(human.as_bytes()).collect::<String>()
                )
            })
            .collect::<Vec<_>>()
            .join("/")
    }
}

/// The partition directory (`name=value/...`) of `path` under the data
/// directory of the table at `location`, as `FileNamer` lays it out; "" for
/// a file elsewhere. Deletes for files of an older partition spec go beside them.
pub fn partition_dir(location: &str, path: &str) -> String {
    path.strip_prefix(location)
        .and_then(|p| p.strip_prefix("/data/"))
        .and_then(|p| p.rsplit_once('/'))
        .map_or_else(String::new, |(dir, _)| dir.to_string())
}

/// Names files of one commit: `<table>/data/[<partition>/]<commit-uuid>-<kind>-<n>.parquet`.
pub struct FileNamer {
    location: String,
    dir: String,
    commit: Uuid,
    n: usize,
}

impl FileNamer {
    pub fn new(table_location: &str) -> Self {
        FileNamer {
            location: table_location.to_string(),
            dir: format!("{table_location}/data"),
            commit: Uuid::new_v4(),
            n: 0,
        }
    }

    /// The table's location.
    pub fn location(&self) -> &str {
        &self.location
    }

    fn next(&mut self, kind: &str) -> String {
        self.next_in("", kind)
    }

    fn next_in(&mut self, partition: &str, kind: &str) -> String {
        self.n += 1;
        let sep = if partition.is_empty() { "" } else { "/" };
        format!(
            "{}{sep}{partition}/{}-{kind}-{:05}.parquet",
            self.dir, self.commit, self.n
        )
    }
}

async fn write_parquet(
    file_io: &FileIO,
    path: String,
    schema: SchemaRef,
    batches: &[RecordBatch],
    used: FileUse,
) -> Result<iceberg::spec::DataFileBuilder> {
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    let props = match props(&schema, used) {
        p if rows < SMALL_FILE_ROWS => p
            .into_builder()
            .set_compression(Compression::SNAPPY)
            .build(),
        p => p,
    };
    let mut w = ParquetWriterBuilder::new(props, schema)
        .build(file_io.new_output(path.clone())?)
        .await?;
    for b in batches {
        w.write(b).await?;
    }
    let mut built = w.close().await?;
    built.pop().ok_or_else(|| Error::State {
        code: codes::WRITE_EMPTY_FILE,
        message: format!("no rows were written to {path}"),
    })
}

/// Data files written for the batches laid out, and where each of their rows went.
#[derive(Debug, Default)]
pub struct Written {
    pub files: Vec<DataFile>,
    /// Per row of the batches, numbered one after the other: (index into `files`, row position in that file).
    pub locs: Vec<(u32, u32)>,
}

/// One data file of a layout: its path, partition and rows (slices of the
/// batches laid out, in order: a file may span several).
pub struct PlannedFile {
    pub path: String,
    partition: Struct,
    rows: Vec<RecordBatch>,
}

impl PlannedFile {
    pub fn partition(&self) -> &Struct {
        &self.partition
    }

    fn num_rows(&self) -> usize {
        self.rows.iter().map(RecordBatch::num_rows).sum()
    }
}

/// Where the rows of the batches laid out go, decided before any byte is written: the
/// data files (one set per partition, rolled at about the target size) and
/// each row's (file index, position). So the state can take the rows'
/// locations while the files are still being encoded.
pub struct Layout {
    pub files: Vec<PlannedFile>,
    pub locs: Vec<(u32, u32)>,
}

/// Rows of one partition from one of the batches laid out: the rows, and
/// each one's row number among all the batches' rows.
struct Piece {
    rows: RecordBatch,
    numbers: Numbers,
}

enum Numbers {
    /// The whole batch, its first row numbered `base`.
    From(usize),
    /// Rows taken from the batch whose first row is numbered `base`.
    Taken { base: usize, rows: Vec<u32> },
}

impl Numbers {
    fn of(&self, i: usize) -> usize {
        match self {
            Numbers::From(base) => base + i,
            Numbers::Taken { base, rows } => base + rows[i] as usize,
        }
    }
}

/// Lays out `parts` (batches in the table's Arrow schema, their rows
/// numbered one after the other) as data files of about `target_bytes`
/// each, one set per partition when `partitioner` is given. Unpartitioned,
/// the files are slices of `parts` (no copy: compaction lays out the
/// surviving rows of many files without first joining them into one batch);
/// partitioned, each partition's rows are taken once.
pub fn layout(
    namer: &mut FileNamer,
    partitioner: Option<&Partitioner>,
    parts: &[RecordBatch],
    target_bytes: u64,
) -> Result<Layout> {
    let n: usize = parts.iter().map(RecordBatch::num_rows).sum();
    let mut out = Layout {
        files: Vec::new(),
        locs: vec![(0, 0); n],
    };
    if n == 0 {
        return Ok(out);
    }
    // Parquet with zstd is typically 3-5x smaller than Arrow in memory.
    let memory: usize = parts.iter().map(RecordBatch::get_array_memory_size).sum();
    let arrow_bytes_per_row = (memory / n).max(1) as u64;
    let rows_per_file =
        ((target_bytes * 4) / arrow_bytes_per_row).clamp(1024, MAX_FILE_ROWS as u64) as usize;
    for (partition, dir, pieces) in partition_pieces(partitioner, parts)? {
        let mut rows: Vec<RecordBatch> = Vec::new();
        let mut len = 0usize;
        for piece in pieces {
            let mut start = 0;
            while start < piece.rows.num_rows() {
                if len == rows_per_file {
                    out.files.push(PlannedFile {
                        path: namer.next_in(&dir, "data"),
                        partition: partition.clone(),
                        rows: std::mem::take(&mut rows),
                    });
                    len = 0;
                }
                let take = (rows_per_file - len).min(piece.rows.num_rows() - start);
                let file_idx = out.files.len() as u32;
                for i in 0..take {
                    out.locs[piece.numbers.of(start + i)] = (file_idx, (len + i) as u32);
                }
                rows.push(piece.rows.slice(start, take));
                (start, len) = (start + take, len + take);
            }
        }
        if len > 0 {
            out.files.push(PlannedFile {
                path: namer.next_in(&dir, "data"),
                partition,
                rows,
            });
        }
    }
    Ok(out)
}

/// The partitions of `parts`' rows in order of their first row, each with
/// its directory and its rows, one piece per batch holding any.
fn partition_pieces(
    partitioner: Option<&Partitioner>,
    parts: &[RecordBatch],
) -> Result<Vec<(Struct, String, Vec<Piece>)>> {
    let mut base = 0usize;
    let Some(p) = partitioner else {
        let pieces = parts
            .iter()
            .filter(|b| b.num_rows() > 0)
            .map(|b| {
                let piece = Piece {
                    rows: b.clone(),
                    numbers: Numbers::From(base),
                };
                base += b.num_rows();
                piece
            })
            .collect();
        return Ok(vec![(Struct::empty(), String::new(), pieces)]);
    };
    let mut out: Vec<(Struct, String, Vec<Piece>)> = Vec::new();
    let mut by_dir: HashMap<String, usize> = HashMap::new();
    for b in parts {
        for (partition, rows) in p.group(b)? {
            let dir = p.path(&partition);
            let at = match by_dir.get(&dir) {
                Some(&at) => at,
                None => {
                    by_dir.insert(dir.clone(), out.len());
                    out.push((partition, dir, Vec::new()));
                    out.len() - 1
                }
            };
            out[at].2.push(Piece {
                rows: take_batch(b, &rows)?,
                numbers: Numbers::Taken { base, rows },
            });
        }
        base += b.num_rows();
    }
    Ok(out)
}

/// Files written at once on a local disk: the machine's cores, at most 4
/// (each file is encoding on a core; ext4 serializes the creates anyway).
fn local_writes() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
}

/// Files written at once to an object store, where a file's time is mostly
/// waiting for its PUT: more in flight hides that wait (a partitioned commit
/// of small files on SeaweedFS, 2,500 files over 10 commits: 2.5 s two at
/// once, 2.0 s at 8, 1.8 s at 16). Each holds its rows encoded until its
/// upload ends, so big files go fewer at once (`IN_FLIGHT_ROWS`).
const OBJECT_STORE_WRITES: usize = 16;

/// Rows an object store's writes hold at once beyond the local number of
/// writes: one row group's worth.
const IN_FLIGHT_ROWS: usize = ROW_GROUP_ROWS;

/// How many files to write at once under `path` (any of them), the
/// largest of `max_rows` rows.
fn write_parallelism(path: &str, max_rows: usize) -> usize {
    match path.split_once("://") {
        Some((scheme, _)) if scheme != "file" => {
            (IN_FLIGHT_ROWS / max_rows.max(1)).clamp(local_writes(), OBJECT_STORE_WRITES)
        }
        _ => local_writes(),
    }
}

/// How many of these files (path, rows) to write at once.
fn at_once<'a>(mut files: impl Iterator<Item = (&'a str, usize)>) -> usize {
    let Some((path, rows)) = files.next() else {
        return 1;
    };
    write_parallelism(path, files.map(|f| f.1).fold(rows, usize::max))
}

/// Runs `writes` (each writes one file) `at_once` at a time, each on a
/// runtime worker, and answers their files in order.
async fn write_all<T: Send + 'static>(
    writes: Vec<impl std::future::Future<Output = Result<T>> + Send + 'static>,
    at_once: usize,
) -> Result<Vec<T>> {
    use futures::StreamExt;
    let tasks = writes.into_iter().map(|w| {
        let task = tokio::spawn(w);
        async move {
            match task.await {
                Ok(written) => written,
                // A bug in a writer is the commit's bug: raised where the
                // commit runs, as if the file were written there.
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(e) => {
                    Err(std::io::Error::other(format!("a file's writer stopped: {e}")).into())
                }
            }
        }
    });
    futures::stream::iter(tasks)
        .buffered(at_once.max(1))
        .collect::<Vec<Result<T>>>()
        .await
        .into_iter()
        .collect()
}

/// Writes the files of a layout, several at once, and returns them in the
/// layout's order.
pub async fn write_layout(
    file_io: &FileIO,
    schema: SchemaRef,
    spec_id: i32,
    files: Vec<PlannedFile>,
    used: FileUse,
) -> Result<Vec<DataFile>> {
    let at_once = at_once(files.iter().map(|f| (f.path.as_str(), f.num_rows())));
    let writes = files
        .into_iter()
        .map(|f| {
            let (file_io, schema) = (file_io.clone(), schema.clone());
            async move {
                write_parquet(&file_io, f.path, schema, &f.rows, used)
                    .await?
                    .partition_spec_id(spec_id)
                    .partition(f.partition)
                    .build()
                    .map_err(builder_err)
            }
        })
        .collect();
    write_all(writes, at_once).await
}

/// Writes `parts` (in the table's Arrow schema, rows numbered one after the
/// other) as data files of about `target_bytes` each, one set per partition
/// when `partitioner` is given.
pub async fn data_files(
    file_io: &FileIO,
    namer: &mut FileNamer,
    schema: SchemaRef,
    spec_id: i32,
    partitioner: Option<&Partitioner>,
    parts: Vec<RecordBatch>,
    target_bytes: u64,
) -> Result<Written> {
    let Layout { files, locs } = layout(namer, partitioner, &parts, target_bytes)?;
    // Unpartitioned, the files hold slices of `parts`; partitioned, copies.
    drop(parts);
    Ok(Written {
        files: write_layout(file_io, schema, spec_id, files, FileUse::Table).await?,
        locs,
    })
}

fn take_batch(batch: &RecordBatch, rows: &[u32]) -> Result<RecordBatch> {
    let idx = UInt32Array::from(rows.to_vec());
    let cols = batch
        .columns()
        .iter()
        .map(|c| take(c.as_ref(), &idx, None))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(RecordBatch::try_new(batch.schema(), cols)?)
}

fn builder_err(e: impl std::fmt::Display) -> Error {
    Error::Iceberg(iceberg::Error::new(
        iceberg::ErrorKind::DataInvalid,
        e.to_string(),
    ))
}

fn position_delete_schema() -> Result<Schema> {
    Ok(Schema::builder()
        .with_fields(vec![
            Arc::new(NestedField::required(
                RESERVED_FIELD_ID_DELETE_FILE_PATH,
                RESERVED_COL_NAME_DELETE_FILE_PATH,
                Type::Primitive(PrimitiveType::String),
            )),
            Arc::new(NestedField::required(
                RESERVED_FIELD_ID_DELETE_FILE_POS,
                RESERVED_COL_NAME_DELETE_FILE_POS,
                Type::Primitive(PrimitiveType::Long),
            )),
        ])
        .build()?)
}

/// A delete file of a commit, its rows made and not yet written:
/// `write_deletes` writes a commit's several at once (a partitioned commit
/// has one or two per partition it touches).
pub struct PlannedDelete {
    path: String,
    spec_id: i32,
    partition: Struct,
    schema: SchemaRef,
    rows: RecordBatch,
    /// The equality columns' field ids; none for position deletes.
    equality_ids: Option<Vec<i32>>,
}

/// The position-delete file for `(path, pos)` pairs, which it sorts (none
/// for none). All the paths are data files of `partition` (of spec
/// `spec_id`), whose directory is `dir`.
pub fn position_deletes(
    namer: &mut FileNamer,
    spec_id: i32,
    partition: &Struct,
    dir: &str,
    mut deletes: Vec<(&str, u32)>,
) -> Result<Option<PlannedDelete>> {
    if deletes.is_empty() {
        return Ok(None);
    }
    deletes.sort_unstable();
    debug_assert!(
        deletes.windows(2).all(|w| w[0] != w[1]),
        "a row is deleted twice in one commit"
    );
    let schema = Arc::new(position_delete_schema()?);
    let arrow = Arc::new(schema_to_arrow_schema(&schema)?);
    let paths = StringArray::from_iter_values(deletes.iter().map(|d| d.0));
    let pos = Int64Array::from_iter_values(deletes.iter().map(|d| d.1 as i64));
    let rows = RecordBatch::try_new(arrow, vec![Arc::new(paths), Arc::new(pos)])?;
    Ok(Some(PlannedDelete {
        path: namer.next_in(dir, "pos-deletes"),
        spec_id,
        partition: partition.clone(),
        schema,
        rows,
        equality_ids: None,
    }))
}

/// The equality-delete file on the key columns `key_names` (whose arrays,
/// in the same order, are `key_cols`) for rows `rows` of those arrays,
/// applying to data files of `partition` (of spec `spec_id`, directory
/// `dir`); none for no rows.
#[allow(clippy::too_many_arguments)]
pub fn equality_deletes(
    namer: &mut FileNamer,
    table_schema: &Schema,
    spec_id: i32,
    partition: &Struct,
    dir: &str,
    key_names: &[&str],
    key_cols: &[ArrayRef],
    rows: &[u32],
) -> Result<Option<PlannedDelete>> {
    if rows.is_empty() {
        return Ok(None);
    }
    let fields = key_names
        .iter()
        .map(|name| {
            table_schema
                .field_by_name(name)
                .cloned()
                .ok_or_else(|| Error::State {
                    code: codes::KEY_SCHEMA_DRIFT,
                    message: format!("key column `{name}` is missing from the table schema"),
                })
        })
        .collect::<Result<Vec<_>>>()?;
    let ids: Vec<i32> = fields.iter().map(|f| f.id).collect();
    let schema = Arc::new(Schema::builder().with_fields(fields).build()?);
    let arrow = Arc::new(schema_to_arrow_schema(&schema)?);
    let idx = UInt32Array::from(rows.to_vec());
    let cols = key_cols
        .iter()
        .zip(arrow.fields())
        .map(|(c, f)| {
            Ok(arrow_cast::cast(
                &take(c.as_ref(), &idx, None)?,
                f.data_type(),
            )?)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Some(PlannedDelete {
        path: namer.next_in(dir, "eq-deletes"),
        spec_id,
        partition: partition.clone(),
        schema,
        rows: RecordBatch::try_new(arrow, cols)?,
        equality_ids: Some(ids),
    }))
}

/// Writes a commit's delete files, several at once, and answers each with
/// its spec id, in their order.
pub async fn write_deletes(
    file_io: &FileIO,
    files: Vec<PlannedDelete>,
) -> Result<Vec<(i32, DataFile)>> {
    let at_once = at_once(files.iter().map(|f| (f.path.as_str(), f.rows.num_rows())));
    let writes = files
        .into_iter()
        .map(|f| {
            let file_io = file_io.clone();
            async move {
                let mut b =
                    write_parquet(&file_io, f.path, f.schema, &[f.rows], FileUse::Table).await?;
                match f.equality_ids {
                    None => b.content(DataContentType::PositionDeletes),
                    Some(ids) => b
                        .content(DataContentType::EqualityDeletes)
                        .equality_ids(Some(ids)),
                };
                let file = b
                    .partition_spec_id(f.spec_id)
                    .partition(f.partition)
                    .build()
                    .map_err(builder_err)?;
                Ok((f.spec_id, file))
            }
        })
        .collect();
    write_all(writes, at_once).await
}

/// Writes each non-empty batch as its own file, all at once (the state
/// table's parts of one commit).
pub async fn state_files(
    file_io: &FileIO,
    namer: &mut FileNamer,
    schema: SchemaRef,
    spec_id: i32,
    parts: Vec<RecordBatch>,
) -> Result<Vec<DataFile>> {
    let mut parts: Vec<RecordBatch> = parts.into_iter().filter(|b| b.num_rows() > 0).collect();
    if parts.len() <= 1 {
        let Some(part) = parts.pop() else {
            return Ok(Vec::new());
        };
        return Ok(single_data_file(file_io, namer, schema, spec_id, &part)
            .await?
            .into_iter()
            .collect());
    }
    let files = parts
        .into_iter()
        .map(|rows| PlannedFile {
            path: namer.next("state"),
            partition: Struct::empty(),
            rows: vec![rows],
        })
        .collect();
    write_layout(file_io, schema, spec_id, files, FileUse::State).await
}

/// Writes a whole batch as one file (used for the state table).
pub async fn single_data_file(
    file_io: &FileIO,
    namer: &mut FileNamer,
    schema: SchemaRef,
    spec_id: i32,
    batch: &RecordBatch,
) -> Result<Option<DataFile>> {
    if batch.num_rows() == 0 {
        return Ok(None);
    }
    let mut b = write_parquet(
        file_io,
        namer.next("state"),
        schema,
        std::slice::from_ref(batch),
        FileUse::State,
    )
    .await?;
    Ok(Some(
        b.partition_spec_id(spec_id).build().map_err(builder_err)?,
    ))
}

/// The column of `b` holding Iceberg field `id` (by its Parquet field id),
/// else the one named `name`.
pub fn column_for(b: &RecordBatch, id: i32, name: &str) -> Option<usize> {
    let schema = b.schema();
    schema
        .fields()
        .iter()
        .position(|f| {
            f.metadata()
                .get(parquet::arrow::PARQUET_FIELD_ID_META_KEY)
                .and_then(|v| v.parse::<i32>().ok())
                == Some(id)
        })
        .or_else(|| schema.index_of(name).ok())
}

/// A batch read in an older schema of a table (a file's, a snapshot's), in
/// the table's `schema` (`arrow` its Arrow form): columns found by field id
/// (else name), cast to the current type (a widened column, a struct with
/// fields added or dropped since); a column the batch lacks (added since)
/// is null. Err names a required column missing.
pub fn to_schema(
    b: &RecordBatch,
    schema: &Schema,
    arrow: &arrow_schema::SchemaRef,
) -> std::result::Result<RecordBatch, String> {
    let cols = arrow
        .fields()
        .iter()
        .map(|f| {
            let id = schema.field_by_name(f.name()).map(|n| n.id).unwrap_or(-1);
            match column_for(b, id, f.name()) {
                Some(at) => crate::core::nested::conform(b.column(at), f.data_type())
                    .map_err(|e| e.to_string()),
                None if f.is_nullable() => {
                    Ok(arrow_array::new_null_array(f.data_type(), b.num_rows()))
                }
                None => Err(format!("required column `{}` is missing", f.name())),
            }
        })
        .collect::<std::result::Result<Vec<ArrayRef>, String>>()?;
    RecordBatch::try_new(arrow.clone(), cols).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests;
