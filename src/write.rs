//! Parquet files for a commit: data files (rolled at a target size, so every
//! written row's file and position is known), position-delete files (sorted
//! by file path, then position, as the spec requires) and equality-delete
//! files on the key columns (only for rows whose position is unknown).

use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray, UInt32Array};
use arrow_select::take::take;
use iceberg::arrow::schema_to_arrow_schema;
use iceberg::io::FileIO;
use iceberg::metadata_columns::{
    RESERVED_COL_NAME_DELETE_FILE_PATH, RESERVED_COL_NAME_DELETE_FILE_POS,
    RESERVED_FIELD_ID_DELETE_FILE_PATH, RESERVED_FIELD_ID_DELETE_FILE_POS,
};
use iceberg::spec::{
    DataContentType, DataFile, NestedField, PrimitiveType, Schema, SchemaRef, Type,
};
use iceberg::writer::file_writer::{FileWriter, FileWriterBuilder, ParquetWriterBuilder};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use parquet::schema::types::ColumnPath;
use uuid::Uuid;

use crate::error::{Error, Result};

/// Rows per Parquet row group and the cap on rows per data file (positions are u32).
const ROW_GROUP_ROWS: usize = 1 << 20;
const MAX_FILE_ROWS: usize = 1 << 30;

/// zstd; dictionary encoding only for string columns (where values repeat:
/// statuses, file paths). Hashing every integer into a dictionary costs more
/// than it saves for keys and sequences, which are mostly distinct.
fn props(schema: &Schema) -> WriterProperties {
    let mut b = WriterProperties::builder()
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

/// Names files of one commit: `<table>/data/<commit-uuid>-<kind>-<n>.parquet`.
pub struct FileNamer {
    dir: String,
    commit: Uuid,
    n: usize,
}

impl FileNamer {
    pub fn new(table_location: &str) -> Self {
        FileNamer {
            dir: format!("{table_location}/data"),
            commit: Uuid::new_v4(),
            n: 0,
        }
    }

    fn next(&mut self, kind: &str) -> String {
        self.n += 1;
        format!("{}/{}-{kind}-{:05}.parquet", self.dir, self.commit, self.n)
    }
}

async fn write_parquet(
    file_io: &FileIO,
    path: String,
    schema: SchemaRef,
    batches: &[RecordBatch],
) -> Result<iceberg::spec::DataFileBuilder> {
    let mut w = ParquetWriterBuilder::new(props(&schema), schema)
        .build(file_io.new_output(path.clone())?)
        .await?;
    for b in batches {
        w.write(b).await?;
    }
    let mut built = w.close().await?;
    built.pop().ok_or_else(|| Error::State {
        code: "AUTOCDC_WRITE.EMPTY_FILE",
        message: format!("no rows were written to {path}"),
    })
}

/// Writes `batch` (already in the table's Arrow schema) as data files of
/// about `target_bytes` each. Returns the files in order; row `i` of the
/// batch is in the file whose cumulative row range contains it.
pub async fn data_files(
    file_io: &FileIO,
    namer: &mut FileNamer,
    schema: SchemaRef,
    spec_id: i32,
    batch: &RecordBatch,
    target_bytes: u64,
) -> Result<Vec<DataFile>> {
    let n = batch.num_rows();
    if n == 0 {
        return Ok(Vec::new());
    }
    // Parquet with zstd is typically 3-5x smaller than Arrow in memory.
    let arrow_bytes_per_row = (batch.get_array_memory_size() / n).max(1) as u64;
    let rows_per_file =
        ((target_bytes * 4) / arrow_bytes_per_row).clamp(1024, MAX_FILE_ROWS as u64) as usize;
    let mut out = Vec::new();
    let mut start = 0;
    while start < n {
        let len = rows_per_file.min(n - start);
        let path = namer.next("data");
        let b = write_parquet(file_io, path, schema.clone(), &[batch.slice(start, len)]).await?;
        let mut b = b;
        out.push(b.partition_spec_id(spec_id).build().map_err(builder_err)?);
        start += len;
    }
    Ok(out)
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

/// One position-delete file for `(path, pos)` pairs, which it sorts.
pub async fn position_delete_file(
    file_io: &FileIO,
    namer: &mut FileNamer,
    spec_id: i32,
    mut deletes: Vec<(&str, u32)>,
) -> Result<Option<DataFile>> {
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
    let batch = RecordBatch::try_new(arrow, vec![Arc::new(paths), Arc::new(pos)])?;
    let mut b = write_parquet(file_io, namer.next("pos-deletes"), schema, &[batch]).await?;
    Ok(Some(
        b.content(DataContentType::PositionDeletes)
            .partition_spec_id(spec_id)
            .build()
            .map_err(builder_err)?,
    ))
}

/// One equality-delete file on the key columns `key_names` (whose arrays,
/// in the same order, are `key_cols`), for rows `rows` of those arrays.
pub async fn equality_delete_file(
    file_io: &FileIO,
    namer: &mut FileNamer,
    table_schema: &Schema,
    spec_id: i32,
    key_names: &[&str],
    key_cols: &[ArrayRef],
    rows: &[u32],
) -> Result<Option<DataFile>> {
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
                    code: "AUTOCDC_INVALID_STATE.KEY_SCHEMA_DRIFT",
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
    let batch = RecordBatch::try_new(arrow, cols)?;
    let mut b = write_parquet(file_io, namer.next("eq-deletes"), schema, &[batch]).await?;
    Ok(Some(
        b.content(DataContentType::EqualityDeletes)
            .equality_ids(Some(ids))
            .partition_spec_id(spec_id)
            .build()
            .map_err(builder_err)?,
    ))
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
    )
    .await?;
    Ok(Some(
        b.partition_spec_id(spec_id).build().map_err(builder_err)?,
    ))
}
