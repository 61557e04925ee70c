//! The apply entry points: a batch of changes or a whole snapshot, planned
//! (phase 1) and committed, with the retry of a commit that lost a race or
//! whose outcome is unknown (reopen, look for the attempt's snapshot,
//! rebuild on the new base).

use arrow_array::{Array, RecordBatch};

use super::commit::{Failure, Mode, Planned};
use super::{CommitReport, Engine};
use crate::core::from_snapshot;
use crate::core::history::{Cut, Folding};
use crate::core::offsets;
use crate::core::resolve::{self, BatchStats};
use crate::core::truncate;
use crate::error::{Error, Result, codes};

/// What one apply takes in: changes, or (`from_snapshot` flows) a whole
/// snapshot of the source with its version.
#[derive(Debug, Clone, Copy)]
pub enum Input<'a> {
    Changes(&'a RecordBatch),
    Snapshot { rows: &'a RecordBatch, version: i64 },
}

impl<'a> Input<'a> {
    /// The rows: the changes, or the whole snapshot.
    fn rows_batch(&self) -> &'a RecordBatch {
        match *self {
            Input::Changes(b) => b,
            Input::Snapshot { rows, .. } => rows,
        }
    }

    fn rows(&self) -> usize {
        match self {
            Input::Changes(b) => b.num_rows(),
            Input::Snapshot { rows, .. } => rows.num_rows(),
        }
    }
}

/// Completed snapshots' cuts a history folds with, at most (each is a
/// snapshot of the source that ran to its end).
const MAX_CUTS: usize = 256;

/// How often a batch is rebuilt after a lost race or an unknown outcome
/// before the error goes to the caller.
const MAX_COMMIT_ATTEMPTS: u32 = 8;

impl Engine {
    /// Resolves, writes and commits one micro-batch (columns in the flow's
    /// source order). A rejected batch changes nothing. After any other
    /// error the engine must be reopened (its memory may be ahead of the catalog).
    pub async fn apply(&mut self, batch: &RecordBatch, now_ms: i64) -> Result<CommitReport> {
        let offset = self.input_offset + 1;
        self.apply_at(batch, now_ms, offset).await
    }

    /// Like `apply`, recording `input_offset` (the ingest log offset of the
    /// last change in `batch`) as the committed offset.
    ///
    /// A commit that loses a race with another writer, or whose outcome is
    /// unknown (timeout, 5xx, lost connection), is resolved by reloading the
    /// target: if our snapshot is there (or the target already records this
    /// input offset) the batch is done; otherwise it is resolved again
    /// against the reloaded state and committed on the new base. Never twice.
    pub async fn apply_at(
        &mut self,
        batch: &RecordBatch,
        now_ms: i64,
        input_offset: i64,
    ) -> Result<CommitReport> {
        self.apply_input(Input::Changes(batch), now_ms, input_offset)
            .await
    }

    /// `from_snapshot` flows: applies the difference between `rows` (a whole
    /// snapshot of the source) and the target as changes at `version`. A
    /// version not above the last one applied is skipped (and reported).
    pub async fn apply_snapshot_at(
        &mut self,
        rows: &RecordBatch,
        version: i64,
        now_ms: i64,
        input_offset: i64,
    ) -> Result<CommitReport> {
        if !self.flow.from_snapshot {
            return Err(Error::Input {
                code: codes::NOT_A_SNAPSHOT_FLOW,
                flow: self.flow.name.clone(),
                message: "this flow takes changes, not snapshots; declare it with from_snapshot = true to send snapshots".into(),
            });
        }
        self.apply_input(Input::Snapshot { rows, version }, now_ms, input_offset)
            .await
    }

    async fn apply_input(
        &mut self,
        input: Input<'_>,
        now_ms: i64,
        input_offset: i64,
    ) -> Result<CommitReport> {
        if let (Input::Changes(_), true) = (input, self.flow.from_snapshot) {
            return Err(Error::Input {
                code: codes::NOT_A_SNAPSHOT_FLOW,
                flow: self.flow.name.clone(),
                message: "this flow is from_snapshot: send whole snapshots with a version (POST /v1/flows/{flow}/snapshots?version=V, or autocdc apply --snapshot-version V)".into(),
            });
        }
        if self.flow.keeps_history() && self.folded_with != Folding::of(&self.flow) {
            self.refold(now_ms).await?;
        }
        // Completed snapshots' cuts are no change of a row: new ones are
        // committed first (a re-fold), then the batch goes on without them.
        let without_cuts;
        let input = match input {
            Input::Changes(batch) => match self.split_cuts(batch)? {
                Some((rest, new)) => {
                    if !new.is_empty() {
                        self.cut(new, now_ms).await?;
                    }
                    without_cuts = rest;
                    Input::Changes(&without_cuts)
                }
                None => input,
            },
            snapshot => snapshot,
        };
        let mut attempted: Vec<i64> = Vec::new();
        let mut delay = std::time::Duration::from_millis(50);
        loop {
            let (error, snapshot_id) = match self.try_apply_at(input, now_ms, input_offset).await {
                Ok(mut report) => {
                    report.commit_retries = attempted.len() as u32;
                    return Ok(report);
                }
                Err(Failure::Other(e)) => return Err(e),
                Err(Failure::AtCommit { error, snapshot_id }) => (error, snapshot_id),
            };
            attempted.push(snapshot_id);
            let retryable = matches!(error, Error::CommitConflict(_) | Error::Unavailable(_));
            let fresh = self.reopen().await?;
            let landed = attempted
                .iter()
                .find(|id| fresh.target.metadata.snapshot_by_id(**id).is_some())
                .copied();
            // Without an ingest log the offset is a count of applies shared
            // by the flows writing the target: only this flow's own count
            // says the batch is in.
            let same_count =
                self.log.is_some() || fresh.last_writer() == Some(self.flow.name.as_str());
            let already = same_count
                && fresh.input_offset >= input_offset
                && input_offset > self.input_offset;
            *self = fresh;
            let done = landed.or(if already {
                self.target.metadata.current_snapshot_id()
            } else {
                None
            });
            if let Some(id) = done {
                return Ok(CommitReport {
                    snapshot_id: Some(id),
                    input_offset: self.input_offset,
                    commit_retries: attempted.len() as u32,
                    ..Default::default()
                });
            }
            // Deposed meanwhile: the new holder replays what this batch had.
            self.fenced()?;
            if !retryable || attempted.len() as u32 >= MAX_COMMIT_ATTEMPTS {
                return Err(error);
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(std::time::Duration::from_secs(5));
        }
    }

    /// One attempt at a batch, in the phases of the commit protocol:
    /// plan → write target files → persist state → commit target → publish.
    /// Maintenance work (compaction, expiry) goes in as phases of its own.
    async fn try_apply_at(
        &mut self,
        input: Input<'_>,
        now_ms: i64,
        input_offset: i64,
    ) -> std::result::Result<CommitReport, Failure> {
        self.usable()?;
        self.fenced()?;
        let clock = std::time::Instant::now();
        if let Some(report) = self.skip_old_snapshot(input) {
            return Ok(report);
        }
        let mut planned = self.plan(input, now_ms)?;
        let rewritten = planned.rewritten.take();
        let batch = rewritten.as_ref().unwrap_or(input.rows_batch());
        let offsets = match &self.log {
            Some(log) => offsets::record(&self.offsets, log, input_offset, now_ms),
            None => self.offsets.clone(),
        };
        self.commit_planned(
            planned,
            batch,
            now_ms,
            input_offset,
            offsets,
            Mode::Delta,
            clock,
        )
        .await
    }

    /// A snapshot whose version is not above the last one applied is
    /// skipped; its report says so.
    fn skip_old_snapshot(&self, input: Input<'_>) -> Option<CommitReport> {
        let (Input::Snapshot { rows, version }, Some(have)) = (input, self.snapshot_version) else {
            return None;
        };
        (version <= have).then(|| CommitReport {
            stats: BatchStats {
                rows_in: rows.num_rows() as u64,
                stale: rows.num_rows() as u64,
                ..Default::default()
            },
            input_offset: self.input_offset,
            snapshot_version: Some(version),
            skipped_for_version: Some(have),
            ..Default::default()
        })
    }

    /// SCD Type 2 Debezium flows: the batch without its cut rows (`Flow::cuts`),
    /// and the cuts among them the history does not fold with yet. None
    /// when the batch has no cut row.
    fn split_cuts(&self, batch: &RecordBatch) -> Result<Option<(RecordBatch, Vec<Cut>)>> {
        let Some(is_cut) = resolve::mask(&self.flow, self.flow.cuts.as_ref(), batch)? else {
            return Ok(None);
        };
        // A null is no cut.
        let is_cut = arrow_array::BooleanArray::from_iter(
            (0..is_cut.len()).map(|i| Some(is_cut.is_valid(i) && is_cut.value(i))),
        );
        if is_cut.true_count() == 0 {
            return Ok(None);
        }
        let rest =
            arrow_select::filter::filter_record_batch(batch, &arrow_arith::boolean::not(&is_cut)?)?;
        let cut_rows = arrow_select::filter::filter_record_batch(batch, &is_cut)?;
        let seqs: Vec<arrow_array::ArrayRef> = self
            .flow
            .seq_idx
            .iter()
            .map(|&i| cut_rows.column(i).clone())
            .collect();
        let encoded = self.codec.seqs.convert_columns(&seqs)?;
        let known = self.state.cuts();
        let mut new: Vec<Cut> = Vec::new();
        for row in encoded.iter() {
            let cut = Cut {
                seq: row.as_ref().into(),
            };
            if known.contains(&cut) || new.contains(&cut) {
                continue;
            }
            if known.len() + new.len() >= MAX_CUTS {
                tracing::warn!(
                    flow = %self.flow.name,
                    max = MAX_CUTS,
                    "a completed snapshot's cut is not applied: the flow has the most it keeps"
                );
                continue;
            }
            new.push(cut);
        }
        Ok(Some((rest, new)))
    }

    /// Phase 1, plan: a snapshot becomes its changes, truncates rewrite the
    /// batch, and the flow's resolver turns it into a `Plan`. Nothing changes.
    fn plan(&self, input: Input<'_>, now_ms: i64) -> Result<Planned> {
        let batch = input.rows_batch();
        let snapshot_version = match input {
            Input::Snapshot { version, .. } => Some(version),
            Input::Changes(_) => None,
        };
        let diffed = match snapshot_version {
            Some(version) => Some(from_snapshot::diff(
                &self.flow,
                &self.codec,
                batch,
                version,
                self.state.live_keys().into_iter().map(|(k, _, fp)| (k, fp)),
            )?),
            None => None,
        };
        let truncated = match &self.flow.truncates {
            Some(_) => {
                resolve::validate(&self.flow, batch)?;
                truncate::rewrite(
                    &self.flow,
                    &self.codec,
                    batch,
                    self.floor.as_deref(),
                    || {
                        self.state
                            .live_keys()
                            .into_iter()
                            .map(|(k, seq, _)| (k, seq))
                    },
                )?
            }
            None => None,
        };
        let (resolved, forced, origin) = match (&truncated, &diffed) {
            (Some(t), _) => (&t.batch, Some(&t.forced_deletes), Some(&t.origin)),
            (_, Some(d)) => (&d.batch, Some(&d.forced_deletes), Some(&d.origin)),
            _ => (batch, None, None),
        };
        let mut plan = self
            .state
            .plan(
                &self.flow,
                &self.codec,
                resolved,
                self.state_complete,
                now_ms,
                forced,
            )
            // Errors name the row of the input, not of the rewritten batch.
            .map_err(|e| match (e, origin) {
                (
                    Error::Batch {
                        code,
                        flow,
                        row,
                        column,
                        message,
                    },
                    Some(origin),
                ) => Error::Batch {
                    code,
                    flow,
                    row: origin.get(row).copied().flatten().unwrap_or(0) as usize,
                    column,
                    message,
                },
                (e, _) => e,
            })?;
        if let Some(d) = &diffed {
            let stats = plan.stats_mut();
            stats.rows_in = input.rows() as u64;
            stats.unchanged = d.unchanged;
        }
        if let Some(t) = &truncated {
            let stats = plan.stats_mut();
            stats.rows_in = input.rows() as u64;
            stats.stale += t.below_floor;
            stats.truncates = t.truncates;
            stats.deletes -= t.removed;
            stats.truncated = t.removed;
        }
        let floor_raised = truncated.as_ref().is_some_and(|t| t.raised);
        let (rewritten, floor) = match (truncated, diffed) {
            (Some(t), _) => (Some(t.batch), Some(t.floor)),
            (None, Some(d)) => (Some(d.batch), None),
            (None, None) => (None, None),
        };
        Ok(Planned {
            plan,
            rewritten,
            floor,
            floor_raised,
            snapshot_version,
        })
    }
}
