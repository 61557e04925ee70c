//! The ingest path: a decoded batch validated, appended to the flow's log
//! (durable before it is acknowledged) and queued for its committer.

use arrow_array::RecordBatch;

use super::record::{decode_record, encode_record};
use super::runtime::{Accepted, FlowRuntime};
use super::{Service, now_ms};
use crate::core::resolve::{self};
use crate::error::{Error, Result, codes};

impl Service {
    /// Validates a decoded batch, makes it durable and queues it for commit.
    pub async fn ingest(
        &self,
        rt: &FlowRuntime,
        batch: RecordBatch,
        key: Option<String>,
    ) -> Result<Accepted> {
        if rt.flow.from_snapshot {
            rt.lock().status.rejected_batches += 1;
            return Err(Error::Input {
                code: codes::NOT_A_SNAPSHOT_FLOW,
                flow: rt.flow.name.clone(),
                message: "this flow is from_snapshot: send whole snapshots to POST /v1/flows/{flow}/snapshots?version=V".into(),
            });
        }
        self.append(rt, batch, key, None).await
    }

    /// `from_snapshot` flows: validates a whole snapshot, makes it durable and
    /// queues it. A version not above the highest accepted one is skipped.
    pub async fn ingest_snapshot(
        &self,
        rt: &FlowRuntime,
        batch: RecordBatch,
        version: i64,
        key: Option<String>,
    ) -> Result<Accepted> {
        if !rt.flow.from_snapshot {
            rt.lock().status.rejected_batches += 1;
            return Err(Error::Input {
                code: codes::NOT_A_SNAPSHOT_FLOW,
                flow: rt.flow.name.clone(),
                message: "this flow takes changes (POST /v1/flows/{flow}/changes); declare it with from_snapshot = true to send snapshots".into(),
            });
        }
        let batch = match crate::core::from_snapshot::check(&rt.flow, &batch, version) {
            Ok(b) => b,
            Err(e) => {
                rt.lock().status.rejected_batches += 1;
                return Err(e);
            }
        };
        // Reserve the version, so that two pushes of one version log it once.
        let before = {
            let mut inner = rt.lock();
            let have = inner.status.snapshot_version;
            if let Some(have) = have.filter(|&h| version <= h) {
                return Ok(Accepted {
                    accepted: 0,
                    offset: inner.status.applied_offset,
                    duplicate: false,
                    skipped_for_version: Some(have),
                });
            }
            inner.status.snapshot_version = Some(version);
            have
        };
        let res = self.append(rt, batch, key, Some(version)).await;
        if res.is_err() {
            let mut inner = rt.lock();
            if inner.status.snapshot_version == Some(version) {
                inner.status.snapshot_version = before;
            }
        }
        res
    }

    pub(super) async fn append(
        &self,
        rt: &FlowRuntime,
        batch: RecordBatch,
        key: Option<String>,
        version: Option<i64>,
    ) -> Result<Accepted> {
        if let Err(e) = resolve::validate(&rt.flow, &batch) {
            rt.lock().status.rejected_batches += 1;
            return Err(e);
        }
        if *rt.stop.borrow() {
            return Err(Error::Unavailable(format!(
                "flow `{}` is stopping",
                rt.flow.name
            )));
        }
        let payload = encode_record(&batch, version)?;
        let bytes = payload.len() as u64;
        if bytes > rt.flow.commit.max_log_bytes / 2 {
            rt.lock().status.rejected_batches += 1;
            return Err(Error::Input {
                code: codes::BATCH_TOO_LARGE,
                flow: rt.flow.name.clone(),
                message: format!(
                    "this batch is {bytes} bytes in the log, over half of max_log_bytes = {}; send it in smaller requests",
                    rt.flow.commit.max_log_bytes
                ),
            });
        }
        {
            let inner = rt.lock();
            let cap = rt.flow.commit.max_uncommitted_bytes;
            if inner.status.pending_bytes > 0 && inner.status.pending_bytes + bytes > cap {
                let secs = rt.flow.commit.interval.as_secs().clamp(1, 60);
                return Err(Error::Overloaded {
                    message: format!(
                        "flow `{}` has {} uncommitted bytes (max_uncommitted_bytes = {cap}); retry after a commit",
                        rt.flow.name, inner.status.pending_bytes
                    ),
                    retry_after_secs: secs,
                });
            }
        }
        let rows = batch.num_rows();
        let started = std::time::Instant::now();
        let appended = match rt.log.append(key, payload, now_ms()).await {
            Err(Error::Overloaded { message, .. }) => {
                return Err(Error::Overloaded {
                    message: format!("flow `{}`: {message}", rt.flow.name),
                    retry_after_secs: rt.flow.commit.interval.as_secs().clamp(1, 60),
                });
            }
            r => r?,
        };
        rt.recent_appends
            .push(started.elapsed().as_secs_f64() * 1e3);
        // A duplicate this process never queued: a shared log stored an
        // append that was answered 503 (no acknowledgement in time). The
        // stored record is queued, not this request's body, which may
        // differ under a reused key.
        // (Only where it would be queued: another instance's holder reads
        // it from the log itself.)
        let stored = if appended.duplicate && rt.commits_here().is_some() && {
            let inner = rt.lock();
            appended.offset > inner.status.applied_offset
                && !inner.pending.contains_key(&appended.offset)
        } {
            match rt.log.read(appended.offset).await? {
                Some(r) => Some(decode_record(&rt.flow, &r.payload).map(|d| (d, r.payload.len()))?),
                None => None,
            }
        } else {
            None
        };
        if let Some(((batch, version), bytes)) = stored {
            rt.queue(appended.offset, batch, bytes as u64, version, true);
        }
        if !appended.duplicate {
            // A retry of a batch that is already committed and released is not re-queued.
            rt.queue(appended.offset, batch, bytes, version, true);
        }
        let wake = {
            let inner = rt.lock();
            inner.status.pending_rows >= rt.flow.commit.max_rows
                || inner.status.pending_bytes >= rt.flow.commit.max_bytes
        };
        if wake {
            rt.wake.notify_one();
        }
        Ok(Accepted {
            accepted: rows,
            offset: appended.offset,
            duplicate: appended.duplicate,
            skipped_for_version: None,
        })
    }
}
