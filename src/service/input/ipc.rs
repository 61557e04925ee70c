//! Arrow IPC streams: pushed bodies, checked before they are trusted, and
//! the ingest log's own records.

use arrow_array::{ArrayRef, RecordBatch};

use crate::core::flow::Flow;
use crate::error::{Error, Result, codes};

use super::body::{Limits, body_err, concat, too_many_rows};
use super::conform::conform_at;

/// The most metadata one Arrow IPC message may declare.
pub(super) const MAX_IPC_METADATA: usize = 16 << 20;

pub(super) fn arrow_err(flow: &Flow, message: String) -> Error {
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
pub(super) fn decode_ipc(
    flow: &Flow,
    body: &[u8],
    limits: Limits,
    strict: bool,
) -> Result<RecordBatch> {
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
pub(super) fn check_ipc_framing(body: &[u8]) -> std::result::Result<(), String> {
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

pub(super) fn read_ipc(
    flow: &Flow,
    body: &[u8],
    limits: Limits,
    strict: bool,
) -> Result<RecordBatch> {
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
pub(super) fn plain(t: &arrow_schema::DataType, top: bool) -> bool {
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
pub(super) fn expanded_bytes(a: &ArrayRef) -> usize {
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

pub(super) fn offsets<O: arrow_array::OffsetSizeTrait>(o: &[O]) -> Vec<usize> {
    o.windows(2)
        .map(|w| (w[1].as_usize()).saturating_sub(w[0].as_usize()))
        .collect()
}

pub(super) fn view_lengths(views: &[u128]) -> Vec<usize> {
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
