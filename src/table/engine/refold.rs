//! History flows' commits made from the state alone, no input read: the
//! re-fold when the tracked or null-ignoring columns changed, and
//! `autocdc refresh --history`'s rebuild of the whole target.

use arrow_array::RecordBatch;

use super::commit::{Failure, Mode, Planned};
use super::{CommitReport, Engine};
use crate::core::history::{Cut, Folding};
use crate::error::Result;
use crate::table::flow_state::Plan;

impl Engine {
    /// A history flow whose tracked set (SCD Type 2) or null-ignoring
    /// columns changed since the target's rows were folded: one commit
    /// re-folds every key's events in the state as the flow folds. Only the
    /// rows that differ are removed and written; no input is read and the
    /// offsets stay.
    pub(super) async fn refold(&mut self, now_ms: i64) -> Result<CommitReport> {
        self.usable()?;
        let clock = std::time::Instant::now();
        let plan = self
            .state
            .refold(&self.flow, &self.folded_with, self.state_complete)?;
        let now = Folding::of(&self.flow);
        let names = |cols: &[usize]| {
            cols.iter()
                .map(|&c| self.flow.column_name(c))
                .collect::<Vec<_>>()
                .join(", ")
        };
        tracing::info!(
            flow = %self.flow.name,
            tracked_was = %names(&self.folded_with.tracked),
            tracked = %names(&now.tracked),
            ignore_nulls_was = %names(&self.folded_with.ignored),
            ignore_nulls = %names(&now.ignored),
            "the tracked or null-ignoring columns changed: re-folding the history"
        );
        self.folded_with = now;
        self.commit_from_state(plan, now_ms, Mode::Delta, clock)
            .await
    }

    /// SCD Type 2 Debezium flows: cuts of completed snapshots the history
    /// did not fold with yet (`core::history::Cut`). One commit folds every
    /// key again with them: the open versions of keys a snapshot did not
    /// read (rows an earlier, partial snapshot left) close at its cut. No
    /// input is read and the offsets stay; the target records the cuts.
    pub(super) async fn cut(&mut self, new: Vec<Cut>, now_ms: i64) -> Result<CommitReport> {
        self.usable()?;
        let clock = std::time::Instant::now();
        let n = new.len();
        let plan = self.state.add_cuts(&self.flow, new, self.state_complete)?;
        tracing::info!(
            flow = %self.flow.name,
            cuts = n,
            "a snapshot of the source completed: keys it did not read close at its position"
        );
        self.commit_from_state(plan, now_ms, Mode::Delta, clock)
            .await
    }

    /// Commits a plan made from the state alone (a re-fold, a rebuild): no
    /// input batch, and the input offsets stay where they are.
    async fn commit_from_state(
        &mut self,
        plan: Plan,
        now_ms: i64,
        mode: Mode,
        clock: std::time::Instant,
    ) -> Result<CommitReport> {
        let empty = RecordBatch::new_empty(self.flow.source_arrow.clone());
        let (input_offset, offsets) = (self.input_offset, self.offsets.clone());
        self.commit_planned(
            Planned::of(plan),
            &empty,
            now_ms,
            input_offset,
            offsets,
            mode,
            clock,
        )
        .await
        .map_err(Failure::into_error)
    }

    /// `autocdc refresh --history`: the target's rows replaced whole by the
    /// fold of every key's events in the state, in one overwrite commit (a
    /// history flow's state holds every value it applied). Rows another
    /// writer added go; the offsets stay.
    pub async fn rebuild(&mut self, now_ms: i64) -> Result<CommitReport> {
        self.usable()?;
        let clock = std::time::Instant::now();
        let plan = self.state.rebuild(&self.flow)?;
        self.folded_with = Folding::of(&self.flow);
        self.state_complete = true;
        let report = self
            .commit_from_state(plan, now_ms, Mode::Rebuild, clock)
            .await?;
        // Every row is in a new file: forget the old ones.
        self.file_partitions = None;
        self.gone_files = 0;
        self.state.shrink_files();
        Ok(report)
    }
}
