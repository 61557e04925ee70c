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
