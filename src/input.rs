//! Reading change files (NDJSON, CSV with header, Parquet) into batches in
//! a flow's source schema. Columns are matched by name and cast to the
//! declared types; a value that does not fit is an error naming the column.

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use arrow_array::{ArrayRef, RecordBatch, new_null_array};
use arrow_cast::CastOptions;
use arrow_schema::SchemaRef;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use crate::error::{Error, Result, codes};
use crate::flow::Flow;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Ndjson,
    Csv,
    Parquet,
}

impl Format {
    pub fn of(path: &Path) -> Result<Format> {
        match path
            .extension()
            .and_then(|e| e.to_str())
            .map(|e| e.to_ascii_lowercase())
            .as_deref()
        {
            Some("ndjson" | "jsonl" | "json") => Ok(Format::Ndjson),
            Some("csv") => Ok(Format::Csv),
            Some("parquet") => Ok(Format::Parquet),
            _ => Err(Error::Config(format!(
                "{}: unknown file type; use .ndjson/.jsonl/.json (one object per line), .csv (with a header) or .parquet",
                path.display()
            ))),
        }
    }
}

fn input_err(flow: &Flow, path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Input {
        code: codes::BAD_COLUMN,
        flow: flow.name.clone(),
        message: format!("{}: {e}", path.display()),
    }
}

/// Reads one file as one batch in `flow.source_arrow`.
pub fn read_file(flow: &Flow, path: &Path) -> Result<RecordBatch> {
    let file = File::open(path)
        .map_err(|e| Error::Config(format!("cannot open {}: {e}", path.display())))?;
    let schema = flow.source_arrow.clone();
    let batches: Vec<RecordBatch> = match Format::of(path)? {
        Format::Ndjson => arrow_json::ReaderBuilder::new(schema.clone())
            .with_batch_size(64 * 1024)
            .build(BufReader::new(file))
            .map_err(|e| input_err(flow, path, e))?
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| input_err(flow, path, e))?,
        Format::Csv => arrow_csv::ReaderBuilder::new(schema.clone())
            .with_header(true)
            .with_batch_size(64 * 1024)
            .build(file)
            .map_err(|e| input_err(flow, path, e))?
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| input_err(flow, path, e))?,
        Format::Parquet => {
            let reader = ParquetRecordBatchReaderBuilder::try_new(file)?
                .with_batch_size(64 * 1024)
                .build()?;
            reader
                .map(|b| b.map_err(Error::from).and_then(|b| conform(flow, &b)))
                .collect::<Result<_>>()?
        }
    };
    if batches.is_empty() {
        return Ok(RecordBatch::new_empty(schema));
    }
    Ok(arrow_select::concat::concat_batches(&schema, &batches)?)
}

/// Matches `batch`'s columns to the flow's source schema by name and casts
/// them. A missing column is all-null (and then fails validation if it is a
/// key, a sequence or a required column that an upsert needs).
pub fn conform(flow: &Flow, batch: &RecordBatch) -> Result<RecordBatch> {
    let schema: SchemaRef = flow.source_arrow.clone();
    let opts = CastOptions {
        safe: false,
        ..Default::default()
    };
    let cols = schema
        .fields()
        .iter()
        .map(|f| -> Result<ArrayRef> {
            match batch.column_by_name(f.name()) {
                None => Ok(new_null_array(f.data_type(), batch.num_rows())),
                Some(c) if c.data_type() == f.data_type() => Ok(c.clone()),
                Some(c) => arrow_cast::cast_with_options(c, f.data_type(), &opts).map_err(|e| {
                    Error::Input {
                        code: codes::BAD_COLUMN,
                        flow: flow.name.clone(),
                        message: format!(
                            "column `{}` ({}) cannot be read as {}: {e}",
                            f.name(),
                            c.data_type(),
                            f.data_type()
                        ),
                    }
                }),
            }
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(schema, cols)?)
}
