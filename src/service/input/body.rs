//! What a pushed body is: its format, the limits it is decoded under,
//! and the errors that name its row and column. A leaf of `input`: the
//! Debezium reader builds on it too.

use arrow_array::RecordBatch;

use crate::core::flow::Flow;
use crate::error::{Error, Result, codes};

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

pub(super) fn too_many_rows(flow: &Flow, limits: Limits) -> Error {
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

pub(super) fn concat(flow: &Flow, batches: Vec<RecordBatch>) -> Result<RecordBatch> {
    if batches.is_empty() {
        return Ok(RecordBatch::new_empty(flow.source_arrow.clone()));
    }
    Ok(arrow_select::concat::concat_batches(
        &flow.source_arrow,
        &batches,
    )?)
}

pub(super) fn body_err(
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
pub(super) fn same_column(flow: &Flow, row: usize, first: &str, second: &str, col: usize) -> Error {
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
