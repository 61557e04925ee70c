//! Matching a batch's columns to the flow's source schema by name and
//! casting them to the declared types.

use arrow_array::{ArrayRef, RecordBatch, new_null_array};
use arrow_schema::SchemaRef;

use crate::core::flow::Flow;
use crate::error::{Error, Result, codes};

use super::body::same_column;

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
pub(super) fn conform_at(
    flow: &Flow,
    batch: &RecordBatch,
    first_row: usize,
) -> Result<RecordBatch> {
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
