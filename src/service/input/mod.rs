//! Reading change files (NDJSON, CSV with header, Parquet) into batches in
//! a flow's source schema. Columns are matched by name and cast to the
//! declared types; a value that does not fit is an error naming the column.
//!
//! `body` (formats, limits, errors), `json`, `ipc`, `file`, `conform`;
//! this file dispatches a body to them or, for a Debezium flow, to
//! `service::debezium`.

use arrow_array::RecordBatch;

use crate::core::flow::Flow;
use crate::error::Result;
use crate::service::infer;

pub mod body;
mod conform;
mod file;
mod ipc;
pub mod json;

pub use body::{BodyFormat, Limits};
pub use conform::conform;
pub use file::{Format, read_file};
pub use ipc::{catch_quietly, decode_arrow_ipc, decode_log_payload, encode_arrow_ipc};

use ipc::{check_ipc_framing, decode_ipc};
use json::{array_rows, decode_json_rows, ndjson_rows};

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

/// Decodes a JSON array of change objects. The array is split into its
/// elements by a scan (no recursion, no tree), then read like NDJSON.
pub fn decode_json_array(flow: &Flow, body: &[u8], limits: Limits) -> Result<RecordBatch> {
    decode(flow, BodyFormat::JsonArray, body, limits, true)
}

#[cfg(test)]
mod tests;
