//! Reading change files (NDJSON, CSV with header, Parquet) into batches in
//! a flow's source schema. Columns are matched by name and cast to the
//! declared types; a value that does not fit is an error naming the column.

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use arrow_array::{ArrayRef, RecordBatch, new_null_array};
use arrow_schema::SchemaRef;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use crate::core::flow::Flow;
use crate::error::{Error, Result, codes};
use crate::service::infer;

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

/// Limits on one request body, from `[server]`.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Rows in one body (`server.max_rows_per_request`).
    pub max_rows: usize,
    /// Bytes the body's values may take once decoded; only Arrow's
    /// dictionary and view arrays can take more than the body itself
    /// (`server.max_body_bytes`).
    pub max_value_bytes: usize,
}

impl Limits {
    /// No limits: for the ingest log's own records, accepted under the
    /// limits in force when they were pushed.
    pub const NONE: Limits = Limits {
        max_rows: usize::MAX,
        max_value_bytes: usize::MAX,
    };
}

/// Matches `batch`'s columns to the flow's source schema by name and
/// converts them strictly (`convert`). A missing column is all-null (and
/// then fails validation if it is a key, a sequence or a required column
/// that an upsert needs).
pub fn conform(flow: &Flow, batch: &RecordBatch) -> Result<RecordBatch> {
    conform_at(flow, batch, 0)
}

/// `conform` for a batch whose first row is row `first_row` of the body.
/// Input columns name declared columns as `Flow::input_column` says; two
/// that name one column (they differ only in case) are refused.
fn conform_at(flow: &Flow, batch: &RecordBatch, first_row: usize) -> Result<RecordBatch> {
    let schema: SchemaRef = flow.source_arrow.clone();
    let input = batch.schema();
    let mut named: Vec<Option<usize>> = vec![None; schema.fields().len()];
    for (j, f) in input.fields().iter().enumerate() {
        let Some(i) = flow.field_column(f.name()) else {
            continue;
        };
        if let Some(prev) = named[i] {
            return Err(same_column(
                flow,
                first_row,
                input.field(prev).name(),
                f.name(),
                i,
            ));
        }
        named[i] = Some(j);
    }
    let cols = schema
        .fields()
        .iter()
        .zip(&named)
        .map(|(f, j)| -> Result<ArrayRef> {
            match j.map(|j| batch.column(j)) {
                None => Ok(new_null_array(f.data_type(), batch.num_rows())),
                Some(c) => {
                    crate::core::nested::convert(c, f.data_type()).map_err(|r| Error::Batch {
                        code: codes::BAD_COLUMN,
                        flow: flow.name.clone(),
                        row: first_row + r.row,
                        column: f.name().clone(),
                        message: r.message,
                    })
                }
            }
        })
        .collect::<Result<Vec<_>>>()?;
    let mut cols = cols;
    flow.compute_sequences(&mut cols, batch.num_rows(), first_row)?;
    Ok(RecordBatch::try_new(schema, cols)?)
}

/// The schema JSON bodies are decoded in (the source columns that are read): numbers, dates and timestamps
/// arrive as their text (the number's own digits, never through `f64`),
/// which `convert` then reads exactly.
fn json_schema(flow: &Flow) -> SchemaRef {
    // Hidden sequence columns are computed, never read.
    let read = flow.computed.first().map_or(usize::MAX, |c| c.idx);
    std::sync::Arc::new(arrow_schema::Schema::new(
        flow.source_arrow
            .fields()
            .iter()
            .take(read)
            .map(|f| {
                f.as_ref()
                    .clone()
                    .with_data_type(crate::core::nested::textual(f.data_type()))
            })
            .collect::<Vec<_>>(),
    ))
}

/// Rows decoded per arrow-json batch; a value error is looked for row by
/// row inside its chunk only.
const CHUNK: usize = 4096;

fn too_many_rows(flow: &Flow, limits: Limits) -> Error {
    body_err(
        flow,
        codes::BATCH_TOO_LARGE,
        None,
        None,
        format!(
            "the body has more than {} rows (server.max_rows_per_request); split it",
            limits.max_rows
        ),
    )
}

/// Decodes rows, each one JSON object, into the flow's source schema.
/// Unknown fields are rejected (`strict`) or ignored; an error names its
/// row and column.
pub(crate) fn decode_json_rows(flow: &Flow, rows: &[&[u8]], strict: bool) -> Result<RecordBatch> {
    if !strict {
        // Nothing fails on a key in another case, so rename up front.
        return match json::canonical_keys(flow, rows)? {
            Some(fixed) => {
                let fixed: Vec<&[u8]> = fixed.iter().map(Vec::as_slice).collect();
                decode_json_exact(flow, &fixed, false)
            }
            None => decode_json_exact(flow, rows, false),
        };
    }
    match decode_json_exact(flow, rows, true) {
        // A field named in another case than the definition's: the decoder
        // matches names exactly, so rewrite the keys and decode again (only
        // such bodies pay for it).
        Err(e) if !flow.config.case_sensitive && e.to_string().contains("missing from schema") => {
            match json::canonical_keys(flow, rows)? {
                Some(fixed) => {
                    let fixed: Vec<&[u8]> = fixed.iter().map(Vec::as_slice).collect();
                    decode_json_exact(flow, &fixed, true)
                }
                None => Err(e),
            }
        }
        r => r,
    }
}

/// Decodes rows whose keys are the definition's names exactly.
fn decode_json_exact(flow: &Flow, rows: &[&[u8]], strict: bool) -> Result<RecordBatch> {
    let schema = json_schema(flow);
    let decoder = || {
        arrow_json::ReaderBuilder::new(schema.clone())
            .with_batch_size(CHUNK)
            .with_strict_mode(strict)
            .with_coerce_primitive(true)
            .build_decoder()
    };
    let mut out = Vec::new();
    for (c, chunk) in rows.chunks(CHUNK).enumerate() {
        let first = c * CHUNK;
        let mut d = decoder()?;
        for (i, row) in chunk.iter().enumerate() {
            let at = first + i;
            let read = d.decode(row).map_err(|e| {
                body_err(
                    flow,
                    codes::MALFORMED_BODY,
                    Some(at),
                    None,
                    format!("row {} is not valid JSON: {e}", at + 1),
                )
            })?;
            if read < row.len() || d.has_partial_record() || d.len() != i + 1 {
                return Err(body_err(
                    flow,
                    codes::MALFORMED_BODY,
                    Some(at),
                    None,
                    format!("row {} is not one complete JSON object", at + 1),
                ));
            }
        }
        match d.flush() {
            Ok(Some(b)) => out.push(conform_at(flow, &b, first)?),
            Ok(None) => {}
            Err(e) => {
                for (i, row) in chunk.iter().enumerate() {
                    let mut one = decoder()?;
                    let found = one.decode(row).and_then(|_| one.flush());
                    if let Err(e) = found {
                        return Err(value_err(flow, first + i, &e));
                    }
                }
                return Err(value_err(flow, first, &e));
            }
        }
    }
    concat(flow, out)
}

/// A pushed body's format (from its content type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFormat {
    /// One change per line (`application/x-ndjson`).
    Ndjson,
    /// A JSON array of change objects (`application/json`).
    JsonArray,
    /// An Arrow IPC stream (`application/vnd.apache.arrow.stream`).
    ArrowStream,
}

/// Decodes a pushed body into the flow's source schema. A field that names
/// no column is refused (`strict`) or ignored: an `add_columns` flow, once
/// the fields that have values are columns, ignores those null in every row.
pub fn decode(
    flow: &Flow,
    format: BodyFormat,
    body: &[u8],
    limits: Limits,
    strict: bool,
) -> Result<RecordBatch> {
    if flow.debezium {
        return crate::service::debezium::decode(flow, format, body, limits, strict).map(|d| d.0);
    }
    match format {
        BodyFormat::Ndjson => decode_json_rows(flow, &ndjson_rows(flow, body, limits)?, strict),
        BodyFormat::JsonArray => decode_json_rows(flow, &array_rows(flow, body, limits)?, strict),
        BodyFormat::ArrowStream => decode_ipc(flow, body, limits, strict),
    }
}

/// The columns a body's fields that name no column would add
/// (`schema_evolution = "add_columns"`, typed as `infer` says). A body too
/// damaged to read adds none: decoding it reports why.
pub fn new_columns(
    flow: &Flow,
    format: BodyFormat,
    body: &[u8],
    limits: Limits,
) -> Result<Vec<crate::core::flow::ColumnDef>> {
    if flow.debezium {
        return crate::service::debezium::new_columns(flow, format, body, limits);
    }
    match format {
        BodyFormat::Ndjson => infer::json_columns(flow, &ndjson_rows(flow, body, limits)?),
        BodyFormat::JsonArray => infer::json_columns(flow, &array_rows(flow, body, limits)?),
        BodyFormat::ArrowStream => {
            if check_ipc_framing(body).is_err() {
                return Ok(Vec::new());
            }
            let schema = catch_quietly(|| {
                arrow_ipc::reader::StreamReader::try_new(body, None)
                    .ok()
                    .map(|r| r.schema())
            });
            match schema {
                Ok(Some(s)) => infer::arrow_columns(flow, &s),
                _ => Ok(Vec::new()),
            }
        }
    }
}

/// Decodes a request body of NDJSON (one change per line) into the flow's
/// source schema. Blank lines are skipped and do not count as rows.
pub fn decode_ndjson(flow: &Flow, body: &[u8], limits: Limits) -> Result<RecordBatch> {
    decode(flow, BodyFormat::Ndjson, body, limits, true)
}

/// The non-blank lines of an NDJSON body, trimmed.
fn ndjson_rows<'a>(flow: &Flow, body: &'a [u8], limits: Limits) -> Result<Vec<&'a [u8]>> {
    let mut rows = Vec::new();
    for line in body.split(|&b| b == b'\n') {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if rows.len() == limits.max_rows {
            return Err(too_many_rows(flow, limits));
        }
        rows.push(line.trim_ascii());
    }
    Ok(rows)
}

/// Decodes a JSON array of change objects. The array is split into its
/// elements by a scan (no recursion, no tree), then read like NDJSON.
pub fn decode_json_array(flow: &Flow, body: &[u8], limits: Limits) -> Result<RecordBatch> {
    decode(flow, BodyFormat::JsonArray, body, limits, true)
}

fn array_rows<'a>(flow: &Flow, body: &'a [u8], limits: Limits) -> Result<Vec<&'a [u8]>> {
    array_elements(body, limits.max_rows).map_err(|e| match e {
        None => too_many_rows(flow, limits),
        Some(why) => body_err(
            flow,
            codes::MALFORMED_BODY,
            None,
            None,
            format!("the body is not a JSON array of objects: {why}"),
        ),
    })
}

/// The elements of a JSON array, as byte slices; `Err(None)` when there are
/// more than `max`. Each element is checked later by the JSON decoder.
pub(crate) fn array_elements(
    body: &[u8],
    max: usize,
) -> std::result::Result<Vec<&[u8]>, Option<String>> {
    let skip_ws = |mut i: usize| {
        while body.get(i).is_some_and(u8::is_ascii_whitespace) {
            i += 1;
        }
        i
    };
    let mut i = skip_ws(0);
    if body.get(i) != Some(&b'[') {
        return Err(Some("it does not start with `[`".into()));
    }
    i = skip_ws(i + 1);
    let mut out = Vec::new();
    if body.get(i) == Some(&b']') {
        i += 1;
    } else {
        loop {
            let start = i;
            let (mut depth, mut in_str) = (0usize, false);
            loop {
                let Some(&b) = body.get(i) else {
                    return Err(Some("the array is not closed".into()));
                };
                if in_str {
                    match b {
                        b'\\' => i += 1,
                        b'"' => in_str = false,
                        _ => {}
                    }
                } else {
                    match b {
                        b'"' => in_str = true,
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' if depth > 0 => depth -= 1,
                        b']' | b',' if depth == 0 => break,
                        _ => {}
                    }
                }
                i += 1;
            }
            if out.len() == max {
                return Err(None);
            }
            out.push(body[start..i].trim_ascii());
            i += 1;
            if body[i - 1] == b']' {
                break;
            }
        }
    }
    if skip_ws(i) != body.len() {
        return Err(Some(format!(
            "unexpected bytes after the array at byte {i}"
        )));
    }
    Ok(out)
}

/// The most metadata one Arrow IPC message may declare.
const MAX_IPC_METADATA: usize = 16 << 20;

fn arrow_err(flow: &Flow, message: String) -> Error {
    body_err(flow, codes::ARROW, None, None, message)
}

/// Decodes an Arrow IPC stream pushed by a client; columns are matched by
/// name and converted strictly. Every length the stream declares is checked
/// against the body before anything is allocated on its say-so, and a panic
/// inside the decoder is a 400, not a dead worker.
pub fn decode_arrow_ipc(flow: &Flow, body: &[u8], limits: Limits) -> Result<RecordBatch> {
    decode_ipc(flow, body, limits, true)
}

/// `strict`: a field that names no column (nor a renamed column's previous
/// name) is refused. A log record is read leniently: it was accepted under
/// the definition of its time, whose dropped columns it may still hold.
fn decode_ipc(flow: &Flow, body: &[u8], limits: Limits, strict: bool) -> Result<RecordBatch> {
    if let Err(why) = check_ipc_framing(body) {
        return Err(arrow_err(
            flow,
            format!("the Arrow IPC stream is refused: {why}"),
        ));
    }
    match catch_quietly(|| read_ipc(flow, body, limits, strict)) {
        Ok(r) => r,
        Err(_) => Err(arrow_err(
            flow,
            "the Arrow IPC stream is damaged (its buffers contradict its metadata)".into(),
        )),
    }
}

thread_local! {
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f`, turning a panic into `Err` without the panic hook's report:
/// for decoders of untrusted bytes, whose panics are the body's fault (the
/// answer is a 400) and would otherwise fill stderr with backtraces.
pub fn catch_quietly<T>(f: impl FnOnce() -> T) -> std::thread::Result<T> {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(std::cell::Cell::get) {
                previous(info)
            }
        }));
    });
    let was = QUIET.with(|q| q.replace(true));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    QUIET.with(|q| q.set(was));
    r
}

/// Walks the stream's framing: metadata lengths, body lengths and buffer
/// ranges must fit the body; row and value counts must fit what the body
/// could hold (a bit per value at least; 64 more for the odd all-null
/// column, which has no buffers at all).
fn check_ipc_framing(body: &[u8]) -> std::result::Result<(), String> {
    let max_rows = body.len().saturating_mul(8).saturating_add(64);
    let read_i32 = |at: usize| {
        body.get(at..at + 4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or_else(|| "the stream ends inside a message length".to_string())
    };
    let count = |what: &str, n: i64| {
        if n < 0 || n as u64 > max_rows as u64 {
            Err(format!(
                "a message declares {n} {what}; a body of this size holds at most {max_rows}"
            ))
        } else {
            Ok(())
        }
    };
    let mut pos = 0usize;
    while pos < body.len() {
        let mut len = read_i32(pos)?;
        pos += 4;
        if len == -1 {
            len = read_i32(pos)?;
            pos += 4;
        }
        if len == 0 {
            return Ok(());
        }
        let remaining = body.len() - pos;
        if pos == 4 && (len < 0 || len as usize > remaining) {
            return Err("the body is not an Arrow IPC stream (it does not begin with one)".into());
        }
        if len < 0 || len as usize > remaining || len as usize > MAX_IPC_METADATA {
            return Err(format!(
                "a message declares {len} bytes of metadata; {remaining} bytes remain in the body"
            ));
        }
        let meta = &body[pos..pos + len as usize];
        let msg = arrow_ipc::root_as_message(meta)
            .map_err(|e| format!("a message's metadata is not valid: {e}"))?;
        pos += len as usize;
        let body_len = msg.bodyLength();
        let remaining = body.len() - pos;
        if body_len < 0 || body_len as u64 > remaining as u64 {
            return Err(format!(
                "a message declares a body of {body_len} bytes; {remaining} bytes remain"
            ));
        }
        let batch = msg
            .header_as_record_batch()
            .or_else(|| msg.header_as_dictionary_batch().and_then(|d| d.data()));
        if let Some(rb) = batch {
            if rb.compression().is_some() {
                return Err("compressed buffers are not accepted; send uncompressed IPC".into());
            }
            count("rows", rb.length())?;
            if let Some(nodes) = rb.nodes() {
                for n in nodes.iter() {
                    count("values in a column", n.length())?;
                    if n.null_count() < 0 || n.null_count() > n.length() {
                        return Err(format!("a column declares {} nulls", n.null_count()));
                    }
                }
            }
            if let Some(buffers) = rb.buffers() {
                for b in buffers.iter() {
                    let end = b.offset().checked_add(b.length());
                    if b.offset() < 0 || b.length() < 0 || end.is_none_or(|e| e > body_len) {
                        return Err(format!(
                            "a buffer at {} of {} bytes lies outside its message's {body_len}-byte body",
                            b.offset(),
                            b.length()
                        ));
                    }
                }
            }
        }
        pos += body_len as usize;
    }
    Ok(())
}

fn read_ipc(flow: &Flow, body: &[u8], limits: Limits, strict: bool) -> Result<RecordBatch> {
    let reader = arrow_ipc::reader::StreamReader::try_new(body, None)
        .map_err(|e| arrow_err(flow, format!("the body is not an Arrow IPC stream: {e}")))?;
    let schema = reader.schema();
    for f in schema.fields() {
        if strict && flow.field_column(f.name()).is_none() {
            return Err(body_err(
                flow,
                codes::BAD_COLUMN,
                None,
                Some(f.name().clone()),
                format!("column `{}` is not a column of the flow", f.name()),
            ));
        }
        let dt = f.data_type();
        if !plain(dt, true) {
            return Err(body_err(
                flow,
                codes::BAD_COLUMN,
                None,
                Some(f.name().clone()),
                format!(
                    "column `{}` is {dt}; send a plain array (run-end encoded arrays, and dictionary or view arrays inside a struct, list or map, are not read)",
                    f.name()
                ),
            ));
        }
    }
    if strict && schema.fields().len() > flow.source_arrow.fields().len() {
        return Err(arrow_err(
            flow,
            format!(
                "the stream has {} columns, more than the flow's {} (a column named twice?)",
                schema.fields().len(),
                flow.source_arrow.fields().len()
            ),
        ));
    }
    let mut out = Vec::new();
    let (mut rows, mut value_bytes) = (0usize, 0usize);
    for b in reader {
        let b = b.map_err(|e| arrow_err(flow, format!("the Arrow IPC stream is damaged: {e}")))?;
        let first = rows;
        rows += b.num_rows();
        if rows > limits.max_rows {
            return Err(too_many_rows(flow, limits));
        }
        value_bytes += b.columns().iter().map(expanded_bytes).sum::<usize>();
        if value_bytes > limits.max_value_bytes {
            return Err(body_err(
                flow,
                codes::BATCH_TOO_LARGE,
                None,
                None,
                format!(
                    "the stream's dictionary or view arrays expand to more than {} bytes (server.max_body_bytes)",
                    limits.max_value_bytes
                ),
            ));
        }
        out.push(conform_at(flow, &b, first)?);
    }
    concat(flow, out)
}

/// Whether a column of type `t` is read: no run-end encoding, and below
/// the top level (`top` false) no dictionaries or views either (the
/// expanded-size check looks at top-level arrays only).
fn plain(t: &arrow_schema::DataType, top: bool) -> bool {
    use arrow_schema::DataType as T;
    match t {
        T::RunEndEncoded(..) | T::Union(..) | T::ListView(_) | T::LargeListView(_) => false,
        T::Dictionary(..) | T::Utf8View | T::BinaryView => top,
        T::Struct(fs) => fs.iter().all(|f| plain(f.data_type(), false)),
        T::List(f) | T::LargeList(f) | T::FixedSizeList(f, _) | T::Map(f, _) => {
            plain(f.data_type(), false)
        }
        _ => true,
    }
}

/// Bytes of values a dictionary or view array expands to once converted
/// to a plain array; 0 for plain arrays (their values are in the body).
fn expanded_bytes(a: &ArrayRef) -> usize {
    use arrow_array::cast::AsArray;
    use arrow_schema::DataType as T;
    let lengths = |v: &ArrayRef| -> Vec<usize> {
        match v.data_type() {
            T::Utf8 => offsets(v.as_string::<i32>().value_offsets()),
            T::LargeUtf8 => offsets(v.as_string::<i64>().value_offsets()),
            T::Binary => offsets(v.as_binary::<i32>().value_offsets()),
            T::LargeBinary => offsets(v.as_binary::<i64>().value_offsets()),
            T::Utf8View => view_lengths(v.as_string_view().views()),
            T::BinaryView => view_lengths(v.as_binary_view().views()),
            t => vec![t.primitive_width().unwrap_or(16); v.len()],
        }
    };
    match a.data_type() {
        T::Dictionary(..) => {
            let d = a.as_any_dictionary();
            let lens = lengths(d.values());
            d.normalized_keys()
                .iter()
                .map(|&k| lens.get(k).copied().unwrap_or(0))
                .fold(0usize, usize::saturating_add)
        }
        T::Utf8View | T::BinaryView => lengths(a).into_iter().fold(0usize, usize::saturating_add),
        _ => 0,
    }
}

fn offsets<O: arrow_array::OffsetSizeTrait>(o: &[O]) -> Vec<usize> {
    o.windows(2)
        .map(|w| (w[1].as_usize()).saturating_sub(w[0].as_usize()))
        .collect()
}

fn view_lengths(views: &[u128]) -> Vec<usize> {
    views.iter().map(|v| (*v as u32) as usize).collect()
}

/// Decodes a record of this service's own ingest log (written by
/// `encode_arrow_ipc` after the push was accepted).
pub fn decode_log_payload(flow: &Flow, payload: &[u8]) -> Result<RecordBatch> {
    decode_ipc(flow, payload, Limits::NONE, false)
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

/// Two input fields (JSON keys, Arrow or CSV columns) of row `row` that
/// name declared column `col`: they differ only in case.
fn same_column(flow: &Flow, row: usize, first: &str, second: &str, col: usize) -> Error {
    Error::Batch {
        code: codes::BAD_COLUMN,
        flow: flow.name.clone(),
        row,
        column: second.to_string(),
        message: format!(
            "fields `{first}` and `{second}` both name column `{}` (names match regardless of case unless the flow sets case_sensitive = true); send one",
            flow.source_arrow.field(col).name()
        ),
    }
}

/// JSON object keys in another case than the definition's names.
mod json {
    use super::*;

    /// Each row with its top-level keys renamed to the declared names they
    /// match regardless of case; None when no key needed it (or a row
    /// cannot be scanned: the decoder then reports it). Two keys of a row
    /// that name one column are refused.
    pub(super) fn canonical_keys(flow: &Flow, rows: &[&[u8]]) -> Result<Option<Vec<Vec<u8>>>> {
        let mut out = Vec::with_capacity(rows.len());
        let mut renamed = false;
        for (r, row) in rows.iter().enumerate() {
            let Some(keys) = top_level_keys(row) else {
                out.push(row.to_vec());
                continue;
            };
            let mut seen: Vec<Option<&str>> = vec![None; flow.source_arrow.fields().len()];
            let mut fixed = Vec::with_capacity(row.len());
            let mut at = 0;
            for (start, end) in keys {
                // Keys hold no escapes (top_level_keys gives up on those).
                let key = std::str::from_utf8(&row[start..end]).unwrap_or_default();
                let Some(i) = flow.input_column(key) else {
                    continue;
                };
                let name = flow.source_arrow.field(i).name();
                if let Some(prev) = seen[i] {
                    return Err(same_column(flow, r, prev, key, i));
                }
                seen[i] = Some(key);
                if key != name {
                    fixed.extend_from_slice(&row[at..start]);
                    fixed.extend_from_slice(name.as_bytes());
                    at = end;
                    renamed = true;
                }
            }
            fixed.extend_from_slice(&row[at..]);
            out.push(fixed);
        }
        Ok(renamed.then_some(out))
    }

    fn ws(row: &[u8], mut i: usize) -> usize {
        while i < row.len() && row[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    }

    /// `row[i]` opens a string: the index after its closing quote.
    fn string_end(row: &[u8], i: usize) -> Option<usize> {
        let mut j = i + 1;
        while j < row.len() {
            match row[j] {
                b'\\' => j += 2,
                b'"' => return Some(j + 1),
                _ => j += 1,
            }
        }
        None
    }

    /// The index after the value starting at or after `i`.
    fn value_end(row: &[u8], i: usize) -> Option<usize> {
        let mut j = ws(row, i);
        match row.get(j)? {
            b'"' => string_end(row, j),
            b'{' | b'[' => {
                let mut depth = 0usize;
                while j < row.len() {
                    match row[j] {
                        b'"' => {
                            j = string_end(row, j)?;
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                return Some(j + 1);
                            }
                        }
                        _ => {}
                    }
                    j += 1;
                }
                None
            }
            _ => {
                while j < row.len()
                    && !matches!(row[j], b',' | b'}' | b']')
                    && !row[j].is_ascii_whitespace()
                {
                    j += 1;
                }
                Some(j)
            }
        }
    }

    /// The byte ranges of the top-level keys of a JSON object (inside the
    /// quotes); None when `row` is not one, or a key has an escape.
    pub(super) fn top_level_keys(row: &[u8]) -> Option<Vec<(usize, usize)>> {
        let mut i = ws(row, 0);
        if row.get(i) != Some(&b'{') {
            return None;
        }
        i = ws(row, i + 1);
        let mut keys = Vec::new();
        if row.get(i) == Some(&b'}') {
            return Some(keys);
        }
        loop {
            if row.get(i) != Some(&b'"') {
                return None;
            }
            let end = string_end(row, i)?;
            if row[i + 1..end - 1].contains(&b'\\') {
                return None;
            }
            keys.push((i + 1, end - 1));
            i = ws(row, end);
            if row.get(i) != Some(&b':') {
                return None;
            }
            i = ws(row, value_end(row, i + 1)?);
            match row.get(i)? {
                b',' => i = ws(row, i + 1),
                b'}' => return Some(keys),
                _ => return None,
            }
        }
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
    use arrow_array::{ArrayRef, Int64Array};
    use std::sync::Arc;

    fn flow() -> Flow {
        flow_of(r#"{ name = "city", type = "string" },"#)
    }

    /// The flow `c` keyed on `id`, sequenced by `seq`, with `columns` between them.
    fn flow_of(columns: &str) -> Flow {
        let toml = format!(
            r#"
            name = "c"
            target = "a.c"
            keys = ["id"]
            sequence_by = "seq"
            columns = [
              {{ name = "id", type = "long", required = true }},
              {columns}
              {{ name = "seq", type = "long", required = true }},
            ]
            "#
        );
        Flow::new(toml::from_str(&toml).unwrap()).unwrap()
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

    /// A `sequence_by` expression's hidden column is computed from the
    /// other columns on every read, also of the log's own records (which
    /// hold it), and a pushed field cannot set it.
    #[test]
    fn a_sequence_expression_is_computed_on_every_read() {
        let toml = r#"
            name = "c"
            target = "a.c"
            keys = ["id"]
            sequence_by = "coalesce(lsn, ts * 10)"
            columns = [
              { name = "id", type = "long" },
              { name = "ts", type = "long" },
              { name = "lsn", type = "long" },
            ]
        "#;
        let f = Flow::new(toml::from_str(toml).unwrap()).unwrap();
        let body = b"{\"id\": 1, \"ts\": 2}\n{\"id\": 2, \"ts\": 2, \"lsn\": 7}\n";
        let b = decode_ndjson(&f, body, Limits::NONE).unwrap();
        let seq = |b: &RecordBatch| b.column(3).as_primitive::<Int64Type>().values().to_vec();
        assert_eq!(seq(&b), [20, 7]);
        let logged = decode_log_payload(&f, &encode_arrow_ipc(&b).unwrap()).unwrap();
        assert_eq!(logged, b);
        // The hidden column is no input field: strict bodies refuse it.
        let sent = RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from(vec![1])) as ArrayRef),
            ("ts", Arc::new(Int64Array::from(vec![1]))),
            ("__autocdc_sequence_0", Arc::new(Int64Array::from(vec![99]))),
        ])
        .unwrap();
        let ipc = encode_arrow_ipc(&sent).unwrap();
        let e = decode(&f, BodyFormat::ArrowStream, &ipc, Limits::NONE, true).unwrap_err();
        assert_eq!(e.code(), codes::BAD_COLUMN, "{e}");
        let lenient = decode(&f, BodyFormat::ArrowStream, &ipc, Limits::NONE, false).unwrap();
        assert_eq!(seq(&lenient), [10]);
        let e = decode(
            &f,
            BodyFormat::Ndjson,
            b"{\"id\": 1, \"ts\": 1, \"__autocdc_sequence_0\": 5}",
            Limits::NONE,
            true,
        )
        .unwrap_err();
        assert_eq!(e.code(), codes::BAD_COLUMN, "{e}");
    }

    /// Nested columns arrive as Arrow struct and list arrays too, read
    /// leaf by leaf (an int32 field into a long); a dictionary inside a
    /// struct is refused (its expanded size is not checked there).
    #[test]
    fn nested_arrow_columns_are_read_leaf_by_leaf() {
        use arrow_array::{Array, Int32Array, StringArray, StructArray};
        use arrow_schema::{DataType, Field};
        let f = flow_of(r#"{ name = "addr", type = "struct<city: string, zip: long>" },"#);
        let addr = StructArray::from(vec![
            (
                Arc::new(Field::new("city", DataType::Utf8, true)),
                Arc::new(StringArray::from(vec!["Leeds"])) as ArrayRef,
            ),
            (
                Arc::new(Field::new("zip", DataType::Int32, true)),
                Arc::new(Int32Array::from(vec![7])) as ArrayRef,
            ),
        ]);
        let sent = RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from(vec![1])) as ArrayRef),
            ("addr", Arc::new(addr) as ArrayRef),
            ("seq", Arc::new(Int64Array::from(vec![1]))),
        ])
        .unwrap();
        let ipc = encode_arrow_ipc(&sent).unwrap();
        let b = decode(&f, BodyFormat::ArrowStream, &ipc, Limits::NONE, true).unwrap();
        let got = b.column(1).as_struct();
        assert_eq!(got.column(1).as_primitive::<Int64Type>().values(), &[7]);
        let dict: arrow_array::DictionaryArray<arrow_array::types::Int32Type> =
            vec!["Leeds"].into_iter().collect();
        let addr = StructArray::from(vec![(
            Arc::new(Field::new("city", dict.data_type().clone(), true)),
            Arc::new(dict) as ArrayRef,
        )]);
        let sent = RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from(vec![1])) as ArrayRef),
            ("addr", Arc::new(addr) as ArrayRef),
            ("seq", Arc::new(Int64Array::from(vec![1]))),
        ])
        .unwrap();
        let ipc = encode_arrow_ipc(&sent).unwrap();
        let e = decode(&f, BodyFormat::ArrowStream, &ipc, Limits::NONE, true).unwrap_err();
        assert_eq!(e.code(), codes::BAD_COLUMN, "{e}");
    }

    /// A record the log kept from before the definition changed decodes
    /// under the new one: a renamed column's values arrive under its new
    /// name, an added one is null, a dropped one is left out. A body is
    /// still strict about fields that name no column.
    #[test]
    fn a_logged_record_decodes_after_a_rename_an_add_and_a_drop() {
        let old = flow();
        let batch = decode_ndjson(
            &old,
            b"{\"id\": 1, \"city\": \"Leeds\", \"seq\": 3}\n",
            Limits::NONE,
        )
        .unwrap();
        let payload = encode_arrow_ipc(&batch).unwrap();
        let new = flow_of(
            r#"{ name = "town", type = "string", renamed_from = "city" },
               { name = "note", type = "string" },"#,
        );
        let b = decode_log_payload(&new, &payload).unwrap();
        assert_eq!(b.schema(), new.source_arrow);
        assert_eq!(b.column(1).as_string::<i32>().value(0), "Leeds");
        assert!(b.column(2).is_null(0));
        assert_eq!(b.column(3).as_primitive::<Int64Type>().value(0), 3);
        let dropped = flow_of("");
        let b = decode_log_payload(&dropped, &payload).unwrap();
        assert_eq!(b.schema(), dropped.source_arrow);
        let e = decode_arrow_ipc(&dropped, &payload, Limits::NONE).unwrap_err();
        assert_eq!(e.code(), codes::BAD_COLUMN, "{e}");
    }

    /// Spark's default: input fields match the definition regardless of
    /// case; two that differ only in case are refused; `case_sensitive`
    /// restores exact matching.
    #[test]
    fn input_names_match_regardless_of_case_unless_case_sensitive() {
        let f = flow();
        let body = b"{\"ID\": 1, \"City\": \"Leeds\", \"seq\": 3}\n{\"id\": 2, \"CITY\": {\"x\": [1, \"}\"]}, \"Seq\": 4}\n";
        // The second row's city is an object: the keys are found around it,
        // and the value is then refused as a string.
        let e = decode_ndjson(&f, body, Limits::NONE).unwrap_err();
        assert_eq!(e.code(), codes::BAD_COLUMN, "{e}");
        let body = b"{\"ID\": 1, \"City\": \"Leeds\", \"seq\": 3}\n{\"id\": 2, \"SEQ\": 4, \"city\" : null}\n";
        let b = decode_ndjson(&f, body, Limits::NONE).unwrap();
        assert_eq!(b.column(0).as_primitive::<Int64Type>().values(), &[1, 2]);
        assert_eq!(b.column(1).as_string::<i32>().value(0), "Leeds");
        assert!(b.column(1).is_null(1));
        assert_eq!(b.column(2).as_primitive::<Int64Type>().values(), &[3, 4]);
        let b = decode_json_array(&f, br#"[{"Id": 5, "SEQ": 6}]"#, Limits::NONE).unwrap();
        assert_eq!(b.column(0).as_primitive::<Int64Type>().value(0), 5);

        let dup = b"{\"id\": 1, \"seq\": 3}\n{\"id\": 2, \"ID\": 2, \"seq\": 4}\n";
        match decode_ndjson(&f, dup, Limits::NONE).unwrap_err() {
            Error::Batch {
                code,
                row,
                column,
                message,
                ..
            } => {
                assert_eq!((code, row, column.as_str()), (codes::BAD_COLUMN, 1, "ID"));
                assert!(message.contains("`id` and `ID`"), "{message}");
            }
            e => panic!("{e}"),
        }
        // Arrow columns too.
        let schema = std::sync::Arc::new(arrow_schema::Schema::new(vec![
            arrow_schema::Field::new("Id", arrow_schema::DataType::Int64, false),
            arrow_schema::Field::new("SEQ", arrow_schema::DataType::Int64, false),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                std::sync::Arc::new(arrow_array::Int64Array::from(vec![7])),
                std::sync::Arc::new(arrow_array::Int64Array::from(vec![8])),
            ],
        )
        .unwrap();
        let ipc = encode_arrow_ipc(&batch).unwrap();
        let got = decode_arrow_ipc(&f, &ipc, Limits::NONE).unwrap();
        assert_eq!(got.column(0).as_primitive::<Int64Type>().value(0), 7);
        assert_eq!(got.column(2).as_primitive::<Int64Type>().value(0), 8);

        let mut config = f.config.clone();
        config.case_sensitive = true;
        let exact = Flow::new(config).unwrap();
        let e = decode_ndjson(&exact, b"{\"ID\": 1, \"seq\": 3}\n", Limits::NONE).unwrap_err();
        assert_eq!(e.code(), codes::BAD_COLUMN, "{e}");
        let e = decode_arrow_ipc(&exact, &ipc, Limits::NONE).unwrap_err();
        assert_eq!(e.code(), codes::BAD_COLUMN, "{e}");
    }

    #[test]
    fn top_level_keys_are_found_around_nested_values_and_strings() {
        let row = br#" { "a" : 1 , "b":{"c":"}\"]"}, "d" :[1,{"e":2}] ,"f":null}"#;
        let keys: Vec<&str> = json::top_level_keys(row)
            .unwrap()
            .into_iter()
            .map(|(s, e)| std::str::from_utf8(&row[s..e]).unwrap())
            .collect();
        assert_eq!(keys, ["a", "b", "d", "f"]);
        assert_eq!(json::top_level_keys(b"{}"), Some(vec![]));
        for bad in [
            &b"[1]"[..],
            b"{\"a\" 1}",
            b"{\"a\\u0041\": 1}",
            b"{\"a\": 1",
            b"",
        ] {
            assert_eq!(
                json::top_level_keys(bad),
                None,
                "{}",
                String::from_utf8_lossy(bad)
            );
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
