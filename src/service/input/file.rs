//! Change files on disk (NDJSON, CSV with a header, Parquet) read into
//! a flow's source schema.

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use arrow_array::RecordBatch;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use crate::core::flow::Flow;
use crate::error::{Error, Result, codes};

use super::conform::conform_at;
use super::{BodyFormat, Limits, decode, decode_ndjson};

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

pub(super) fn input_err(flow: &Flow, path: &Path, e: impl std::fmt::Display) -> Error {
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
    let mut first_row = 0usize;
    let mut conform_next = |b: RecordBatch| {
        let first = first_row;
        first_row += b.num_rows();
        conform_at(flow, &b, first)
    };
    let batches: Vec<RecordBatch> = match Format::of(path)? {
        Format::Ndjson => {
            let body = std::fs::read(path)
                .map_err(|e| Error::Config(format!("cannot read {}: {e}", path.display())))?;
            if flow.debezium {
                // Events one per line, or a JSON array of them.
                let format = match body.trim_ascii_start().first() {
                    Some(b'[') => BodyFormat::JsonArray,
                    _ => BodyFormat::Ndjson,
                };
                return decode(flow, format, &body, Limits::NONE, true);
            }
            return decode_ndjson(flow, &body, Limits::NONE);
        }
        Format::Csv => {
            // Columns are matched by the header's names, in the file's
            // order, and read as text that `conform` converts strictly.
            let (header, _) = arrow_csv::reader::Format::default()
                .with_header(true)
                .infer_schema(BufReader::new(&file), Some(0))
                .map_err(|e| input_err(flow, path, e))?;
            let fields: Vec<arrow_schema::Field> = header
                .fields()
                .iter()
                .map(|h| arrow_schema::Field::new(h.name(), arrow_schema::DataType::Utf8, true))
                .collect();
            let file_schema = std::sync::Arc::new(arrow_schema::Schema::new(fields));
            let file = File::open(path)
                .map_err(|e| Error::Config(format!("cannot open {}: {e}", path.display())))?;
            arrow_csv::ReaderBuilder::new(file_schema)
                .with_header(true)
                .with_batch_size(64 * 1024)
                .build(file)
                .map_err(|e| input_err(flow, path, e))?
                .map(|b| {
                    b.map_err(|e| input_err(flow, path, e))
                        .and_then(&mut conform_next)
                })
                .collect::<Result<_>>()?
        }
        Format::Parquet => {
            let reader = ParquetRecordBatchReaderBuilder::try_new(file)?
                .with_batch_size(64 * 1024)
                .build()?;
            reader
                .map(|b| b.map_err(Error::from).and_then(&mut conform_next))
                .collect::<Result<_>>()?
        }
    };
    if batches.is_empty() {
        return Ok(RecordBatch::new_empty(schema));
    }
    Ok(arrow_select::concat::concat_batches(&schema, &batches)?)
}
