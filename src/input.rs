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
        Format::Csv => {
            // Columns are matched by the header's names, in the file's order.
            let (header, _) = arrow_csv::reader::Format::default()
                .with_header(true)
                .infer_schema(BufReader::new(&file), Some(0))
                .map_err(|e| input_err(flow, path, e))?;
            let fields: Vec<arrow_schema::Field> = header
                .fields()
                .iter()
                .map(|h| match schema.field_with_name(h.name()) {
                    Ok(f) => f.clone(),
                    Err(_) => {
                        arrow_schema::Field::new(h.name(), arrow_schema::DataType::Utf8, true)
                    }
                })
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
                        .and_then(|b| conform(flow, &b))
                })
                .collect::<Result<_>>()?
        }
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

/// Decodes a request body of NDJSON (one change per line) into the flow's
/// source schema. Unknown fields are rejected. On error the offending line
/// (0-based row) is found by decoding line by line, only then.
pub fn decode_ndjson(flow: &Flow, body: &[u8]) -> Result<RecordBatch> {
    let decode = |bytes: &[u8]| -> std::result::Result<Vec<RecordBatch>, arrow_schema::ArrowError> {
        arrow_json::ReaderBuilder::new(flow.source_arrow.clone())
            .with_batch_size(64 * 1024)
            .with_strict_mode(true)
            .build(bytes)?
            .collect()
    };
    match decode(body) {
        Ok(batches) => concat(flow, batches),
        Err(e) => {
            let mut row = 0;
            for line in body.split(|&b| b == b'\n') {
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(line) {
                    return Err(body_err(
                        flow,
                        codes::MALFORMED_BODY,
                        Some(row),
                        None,
                        format!("line {} is not valid JSON: {e}", row + 1),
                    ));
                }
                if let Err(e) = decode(line) {
                    return Err(value_err(flow, row, &e));
                }
                row += 1;
            }
            Err(value_err(flow, 0, &e))
        }
    }
}

/// Decodes a JSON array of change objects.
pub fn decode_json_array(flow: &Flow, body: &[u8]) -> Result<RecordBatch> {
    let rows: Vec<serde_json::Map<String, serde_json::Value>> = serde_json::from_slice(body)
        .map_err(|e| {
            body_err(
                flow,
                codes::MALFORMED_BODY,
                None,
                None,
                format!("the body is not a JSON array of objects: {e}"),
            )
        })?;
    let decode = |rows: &[serde_json::Map<String, serde_json::Value>]| -> std::result::Result<Vec<RecordBatch>, arrow_schema::ArrowError> {
        let mut d = arrow_json::ReaderBuilder::new(flow.source_arrow.clone())
            .with_batch_size(rows.len().max(1))
            .with_strict_mode(true)
            .build_decoder()?;
        d.serialize(rows)?;
        Ok(d.flush()?.into_iter().collect())
    };
    match decode(&rows) {
        Ok(batches) => concat(flow, batches),
        Err(e) => {
            for i in 0..rows.len() {
                if let Err(e) = decode(&rows[i..i + 1]) {
                    return Err(value_err(flow, i, &e));
                }
            }
            Err(value_err(flow, 0, &e))
        }
    }
}

/// Decodes an Arrow IPC stream; columns are matched by name and cast.
pub fn decode_arrow_ipc(flow: &Flow, body: &[u8]) -> Result<RecordBatch> {
    let reader = arrow_ipc::reader::StreamReader::try_new(body, None).map_err(|e| {
        body_err(
            flow,
            codes::MALFORMED_BODY,
            None,
            None,
            format!("the body is not an Arrow IPC stream: {e}"),
        )
    })?;
    let mut out = Vec::new();
    for b in reader {
        let b = b.map_err(|e| {
            body_err(
                flow,
                codes::MALFORMED_BODY,
                None,
                None,
                format!("the Arrow IPC stream is damaged: {e}"),
            )
        })?;
        for f in b.schema().fields() {
            if flow.source_arrow.field_with_name(f.name()).is_err() {
                return Err(body_err(
                    flow,
                    codes::BAD_COLUMN,
                    None,
                    Some(f.name().clone()),
                    format!("column `{}` is not a column of the flow", f.name()),
                ));
            }
        }
        out.push(conform(flow, &b)?);
    }
    concat(flow, out)
}

/// The batch as an Arrow IPC stream (the ingest log's payload).
pub fn encode_arrow_ipc(batch: &RecordBatch) -> Result<Vec<u8>> {
    let mut w = arrow_ipc::writer::StreamWriter::try_new(Vec::new(), &batch.schema())?;
    w.write(batch)?;
    w.finish()?;
    Ok(w.into_inner()?)
}

fn concat(flow: &Flow, batches: Vec<RecordBatch>) -> Result<RecordBatch> {
    if batches.is_empty() {
        return Ok(RecordBatch::new_empty(flow.source_arrow.clone()));
    }
    Ok(arrow_select::concat::concat_batches(
        &flow.source_arrow,
        &batches,
    )?)
}

fn body_err(
    flow: &Flow,
    code: &'static str,
    row: Option<usize>,
    column: Option<String>,
    message: String,
) -> Error {
    match (row, column) {
        (Some(row), column) => Error::Batch {
            code,
            flow: flow.name.clone(),
            row,
            column: column.unwrap_or_default(),
            message,
        },
        (None, Some(column)) => Error::Input {
            code,
            flow: flow.name.clone(),
            message: format!("column `{column}`: {message}"),
        },
        (None, None) => Error::Input {
            code,
            flow: flow.name.clone(),
            message,
        },
    }
}

/// A value arrow-json could not read: name the row and, when the message
/// names one, the column.
fn value_err(flow: &Flow, row: usize, e: &arrow_schema::ArrowError) -> Error {
    let msg = e.to_string();
    let column = flow
        .source_arrow
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .find(|n| {
            msg.contains(&format!("'{n}'"))
                || msg.contains(&format!("\"{n}\""))
                || msg.contains(&format!("`{n}`"))
        })
        .or_else(|| {
            // Strict mode names an unknown field: "column 'x' missing from schema".
            msg.split('\'').nth(1).map(str::to_string)
        })
        .unwrap_or_default();
    Error::Batch {
        code: codes::BAD_COLUMN,
        flow: flow.name.clone(),
        row,
        column,
        message: format!("cannot be read as the flow's columns: {msg}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;

    fn flow() -> Flow {
        Flow::new(
            toml::from_str(
                r#"
                name = "c"
                target = "a.c"
                keys = ["id"]
                sequence_by = "seq"
                columns = [
                  { name = "id", type = "long", required = true },
                  { name = "city", type = "string" },
                  { name = "seq", type = "long", required = true },
                ]
                "#,
            )
            .unwrap(),
        )
        .unwrap()
    }

    fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn ndjson_and_csv_read_into_the_source_schema_missing_fields_null() {
        let dir = tempfile::tempdir().unwrap();
        let f = flow();
        let j = write(
            dir.path(),
            "a.ndjson",
            "{\"id\": 1, \"city\": \"Leeds\", \"seq\": 3}\n{\"id\": 2, \"seq\": 4}\n",
        );
        let c = write(dir.path(), "a.csv", "seq,id,city\n3,1,Leeds\n4,2,\n");
        for p in [j, c] {
            let b = read_file(&f, &p).unwrap();
            assert_eq!(b.schema(), f.source_arrow, "{}", p.display());
            assert_eq!(b.column(0).as_primitive::<Int64Type>().values(), &[1, 2]);
            assert_eq!(b.column(2).as_primitive::<Int64Type>().values(), &[3, 4]);
            assert_eq!(b.column(1).as_string::<i32>().value(0), "Leeds");
        }
    }

    #[test]
    fn parquet_columns_are_matched_by_name_and_cast() {
        let dir = tempfile::tempdir().unwrap();
        let f = flow();
        // Different order, int32 ids, an extra column.
        let schema = std::sync::Arc::new(arrow_schema::Schema::new(vec![
            arrow_schema::Field::new("seq", arrow_schema::DataType::Int64, false),
            arrow_schema::Field::new("extra", arrow_schema::DataType::Utf8, true),
            arrow_schema::Field::new("id", arrow_schema::DataType::Int32, false),
        ]));
        let b = RecordBatch::try_new(
            schema.clone(),
            vec![
                std::sync::Arc::new(arrow_array::Int64Array::from(vec![7])),
                std::sync::Arc::new(arrow_array::StringArray::from(vec!["x"])),
                std::sync::Arc::new(arrow_array::Int32Array::from(vec![5])),
            ],
        )
        .unwrap();
        let p = dir.path().join("a.parquet");
        let mut w =
            parquet::arrow::ArrowWriter::try_new(File::create(&p).unwrap(), schema, None).unwrap();
        w.write(&b).unwrap();
        w.close().unwrap();
        let got = read_file(&f, &p).unwrap();
        assert_eq!(got.column(0).as_primitive::<Int64Type>().value(0), 5);
        assert!(got.column(1).is_null(0));
        assert_eq!(got.column(2).as_primitive::<Int64Type>().value(0), 7);
    }

    #[test]
    fn a_value_of_the_wrong_type_names_the_column() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path(), "bad.ndjson", "{\"id\": \"abc\", \"seq\": 1}\n");
        let e = read_file(&flow(), &p).unwrap_err();
        assert_eq!(e.code(), codes::BAD_COLUMN);
        assert!(e.to_string().contains("id"), "{e}");
        let e = read_file(&flow(), Path::new("x.txt")).unwrap_err();
        assert!(
            e.to_string().contains("unknown file type") || e.to_string().contains("cannot open"),
            "{e}"
        );
    }
}
