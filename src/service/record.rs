//! A batch as its ingest log record: a change batch is an Arrow IPC stream;
//! a snapshot's record adds a marker and its version. A record that no
//! longer decodes is set aside as a dead letter.

use arrow_array::RecordBatch;
use bytes::Bytes;

use super::input;
use super::now_ms;
use crate::core::flow::Flow;
use crate::error::Result;

/// The log record of a snapshot: a marker, the version, then the rows as
/// Arrow IPC. A change batch is the Arrow IPC stream alone.
pub(super) const SNAPSHOT_MAGIC: &[u8; 8] = b"ACDCSNAP";

pub(super) fn encode_record(batch: &RecordBatch, version: Option<i64>) -> Result<Bytes> {
    let ipc = input::encode_arrow_ipc(batch)?;
    Ok(match version {
        None => Bytes::from(ipc),
        Some(v) => {
            let mut out = Vec::with_capacity(16 + ipc.len());
            out.extend_from_slice(SNAPSHOT_MAGIC);
            out.extend_from_slice(&v.to_le_bytes());
            out.extend_from_slice(&ipc);
            Bytes::from(out)
        }
    })
}

pub(super) fn decode_record(flow: &Flow, payload: &[u8]) -> Result<(RecordBatch, Option<i64>)> {
    match payload.strip_prefix(SNAPSHOT_MAGIC.as_slice()) {
        Some(rest) if rest.len() >= 8 => {
            let v = i64::from_le_bytes(rest[..8].try_into().expect("8 bytes"));
            Ok((input::decode_log_payload(flow, &rest[8..])?, Some(v)))
        }
        _ => Ok((input::decode_log_payload(flow, payload)?, None)),
    }
}

/// A logged record as a batch; one that no longer decodes (a definition
/// changed under it, a damaged disk) is set aside in the dead letters and
/// becomes an empty batch, so its offset is applied as nothing and the flow
/// moves on.
pub(super) fn decode_or_set_aside(
    flow: &Flow,
    dead: &crate::service::dead_letter::DeadLetters,
    r: &crate::service::wal::Record,
) -> Result<(RecordBatch, Option<i64>)> {
    match decode_record(flow, &r.payload) {
        Ok(d) => Ok(d),
        Err(e) => {
            dead.put(
                r.offset,
                &e,
                crate::service::dead_letter::Contents::Raw(&r.payload),
                now_ms(),
            )?;
            tracing::error!(flow = %flow.name, offset = r.offset, error = %e, "dead_letter");
            Ok((RecordBatch::new_empty(flow.source_arrow.clone()), None))
        }
    }
}
