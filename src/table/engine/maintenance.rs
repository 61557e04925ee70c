//! The maintenance run of a flow's tables (`table::maintain`: expiry that
//! protects what recovery needs, orphan cleanup, figures) and compaction
//! (`table::compact`) committed like a batch, the state's row locations
//! moved with the rows.

use std::collections::HashMap;

use arrow_array::RecordBatch;
use iceberg::spec::{DataFile, Struct};
use serde::Serialize;

use super::Engine;
use super::commit::{Failure, Mode};
use super::marker::{PROP_STATE_SNAPSHOT, our_latest_id};
use crate::core::state::Loc;
use crate::error::Result;
use crate::fault::FaultPoint;
use crate::table::catalog::TableState;
use crate::table::compact::{self, CompactionReport};
use crate::table::maintain::{self, TableReport, TableStats};
use crate::table::properties::Retention;
use crate::table::row_delta::Rewrite;
use crate::table::write::FileNamer;

/// What to do in one maintenance run (`Engine::maintain`).
#[derive(Debug, Clone)]
pub struct MaintainOptions {
    pub now_ms: i64,
    /// Report what would be done; change nothing.
    pub dry_run: bool,
    /// Also delete unreferenced files older than this (None: skip).
    pub orphans_older_than: Option<std::time::Duration>,
    /// Compact first, when the flow's compaction is enabled.
    pub compact: bool,
}

/// One maintenance run of a flow: what was done to each table and the
/// tables' figures after it.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct MaintenanceReport {
    pub flow: String,
    pub dry_run: bool,
    pub target: TableReport,
    pub state: TableReport,
    pub target_stats: TableStats,
    pub state_stats: TableStats,
    /// The compaction this run made (None: not asked or disabled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction: Option<CompactionReport>,
    pub elapsed_ms: f64,
}

impl MaintenanceReport {
    /// Files deleted from both tables (expired, resumed and orphans).
    pub fn files_deleted(&self) -> usize {
        [&self.target, &self.state]
            .iter()
            .map(|t| {
                t.manifest_lists_deleted
                    + t.manifests_deleted
                    + t.data_files_deleted
                    + t.delete_files_deleted
                    + t.orphans_deleted
                    + t.resumed_files_deleted
            })
            .sum()
    }
}

impl Engine {
    /// The maintenance phase: finish any cleanup a stopped run left, expire
    /// the target's snapshots (never this flow's latest), then the state
    /// table's (never one a kept target snapshot names, so recovery always
    /// finds its state), then, when asked, delete orphan files of both.
    /// Runs between commits, never during one. After an error, reopen.
    pub async fn maintain(&mut self, opts: &MaintainOptions) -> Result<MaintenanceReport> {
        let started = std::time::Instant::now();
        let catalog = self.catalog.clone();
        let io = catalog.file_io().clone();
        let mut report = MaintenanceReport {
            flow: self.flow.name.clone(),
            dry_run: opts.dry_run,
            ..Default::default()
        };
        report.target.table = self.flow.target.to_string();
        report.state.table = self.flow.state_ident().to_string();
        if !opts.dry_run {
            maintain::resume(&io, &self.target, &mut report.target).await?;
            maintain::resume(&io, &self.state_tbl, &mut report.state).await?;
        }
        if opts.compact && self.flow.compaction.enabled {
            report.compaction = Some(self.compact(opts.now_ms, opts.dry_run).await?);
        }
        let policy = self.flow.maintenance;
        let meta = self.target.metadata.clone();
        let protect = our_latest_id(&meta).into_iter().collect();
        let ids = maintain::expirable(&meta, opts.now_ms, Retention::of(&meta, &policy), &protect);
        if let Some(t) = maintain::expire(
            catalog.as_ref(),
            &self.target,
            &ids,
            opts.dry_run,
            &self.faults,
            &mut report.target,
        )
        .await?
        {
            self.target = t;
        }
        // The state snapshots that kept target snapshots name.
        let mut named: std::collections::HashSet<i64> = meta
            .snapshots()
            .filter(|s| !ids.contains(&s.snapshot_id()))
            .filter_map(|s| {
                s.summary()
                    .additional_properties
                    .get(PROP_STATE_SNAPSHOT)?
                    .parse()
                    .ok()
            })
            .collect();
        named.extend(self.state_snapshot);
        let smeta = self.state_tbl.metadata.clone();
        let sids = maintain::expirable(&smeta, opts.now_ms, Retention::of(&smeta, &policy), &named);
        if let Some(t) = maintain::expire(
            catalog.as_ref(),
            &self.state_tbl,
            &sids,
            opts.dry_run,
            &self.faults,
            &mut report.state,
        )
        .await?
        {
            self.state_tbl = t;
        }
        if let Some(older) = opts.orphans_older_than {
            let (now, dry) = (opts.now_ms, opts.dry_run);
            maintain::delete_orphans(
                catalog.as_ref(),
                &self.target,
                now,
                older,
                dry,
                &mut report.target,
            )
            .await?;
            maintain::delete_orphans(
                catalog.as_ref(),
                &self.state_tbl,
                now,
                older,
                dry,
                &mut report.state,
            )
            .await?;
        }
        report.target_stats = maintain::stats(&io, &self.target).await?;
        report.state_stats = maintain::stats(&io, &self.state_tbl).await?;
        report.elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
        Ok(report)
    }

    /// The compaction phase (`table::compact`): rewrite the target's small
    /// and delete-heavy data files with their deletes applied, drop or merge
    /// the delete files that go with them, move the state's row locations
    /// with the rows and commit like a batch: the state table (whole, when
    /// its own files are many), then the target as one `replace` snapshot
    /// naming it. A commit another writer beat is abandoned (the engine is
    /// reopened) and left for the next run. Runs between commits only.
    pub async fn compact(&mut self, now_ms: i64, dry_run: bool) -> Result<CompactionReport> {
        let started = std::time::Instant::now();
        let mut report = CompactionReport::default();
        let policy = self.flow.compaction;
        let io = self.catalog.file_io().clone();
        let meta = self.target.metadata.clone();
        let target = compact::target_file_size(&meta, &policy);
        let Some(inv) = compact::inventory(&io, &self.target).await? else {
            report.skipped = Some("the target has no snapshot yet".into());
            return Ok(report);
        };
        let pd = compact::read_position_deletes(&io, &inv).await?;
        let sel = compact::select(&inv, &pd, &policy, target, meta.default_partition_spec_id());
        let state_figure = |name: &str| {
            self.state_tbl
                .metadata
                .current_snapshot()
                .and_then(|s| {
                    s.summary()
                        .additional_properties
                        .get(name)?
                        .parse::<u64>()
                        .ok()
                })
                .unwrap_or(0)
        };
        let state_files = state_figure("total-data-files") as usize;
        // The state table is rewritten into one file once it has many, when
        // that fits the run's budget (a larger state is rewritten by the
        // commits' own rule, once its log is 3 times its entries).
        let state_whole = state_files >= policy.min_input_files.max(2)
            && state_figure("total-files-size") <= policy.max_bytes_per_run;
        report.data_files_rewritten = sel.rewrite.len();
        report.data_files_dropped = sel.drop_data.len();
        report.delete_files_removed = sel.drop_pos.len()
            + sel.drop_eq.len()
            + sel.merge_pos.iter().map(Vec::len).sum::<usize>();
        report.equality_delete_files_removed = sel.drop_eq.len();
        report.bytes_read = sel.bytes;
        if state_whole {
            report.state_files_rewritten = state_files;
        }
        if sel.is_empty() && !state_whole {
            report.skipped = Some("nothing to compact".into());
            report.elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
            return Ok(report);
        }
        if dry_run {
            report.elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
            return Ok(report);
        }
        self.usable()?;
        self.poisoned = true;
        let schema = meta.current_schema().clone();
        let spec_id = meta.default_partition_spec_id();
        let mut namer = FileNamer::new(meta.location());
        let done = compact::rewrite(
            &io,
            &inv,
            &pd,
            &sel,
            schema,
            spec_id,
            self.partitioner.as_deref(),
            &mut namer,
            target,
        )
        .await?;
        self.faults.hit(FaultPoint::AfterCompactionFiles)?;
        report.data_files_written = done.data.len();
        report.delete_files_written = done.deletes.len();
        report.bytes_read = done.bytes_read + pd.bytes_read;
        report.bytes_written = done
            .data
            .iter()
            .chain(done.deletes.iter().map(|(_, f)| f))
            .map(|f| f.file_size_in_bytes())
            .sum();
        report.rows_moved = done.rows_moved;
        report.rows_dropped = done.rows_dropped;

        // The state follows the rows.
        let new_ids: Vec<u32> = done
            .data
            .iter()
            .map(|f| self.state.files_mut().intern(f.file_path()))
            .collect();
        let mut moves: HashMap<u32, compact::Moves> = HashMap::new();
        for (path, to) in done.moves {
            let id = self.state.files_mut().intern(&path);
            moves.insert(id, to);
        }
        self.state.relocate(|loc| {
            let (f, pos) = (*moves.get(&loc.file)?.get(loc.pos as usize)?)?;
            Some(Loc {
                file: new_ids[f as usize],
                pos,
            })
        });
        // A position in a removed file no longer locates anything.
        self.state
            .files_mut()
            .mark_gone(|p| !done.removed.contains(p));
        let generation = self.generation + 1;
        let whole = state_whole || self.state.needs_compaction(self.state_log_rows);
        let delta = self
            .state
            .delta(&self.flow, &self.codec, generation, whole)?;
        let rewrite = Rewrite {
            removed: done.removed,
            data_sequence: inv.snapshot_seq,
        };
        let committed = self
            .commit_compaction(
                done.data,
                done.deletes,
                rewrite,
                delta,
                generation,
                whole,
                now_ms,
            )
            .await;
        match committed {
            Ok(()) => {}
            Err(Failure::AtCommit { error, .. }) => {
                // Another writer committed first: nothing of ours is in the
                // target. Reload everything and leave the work for the next run.
                *self = self.reopen().await?;
                report.skipped = Some(format!(
                    "abandoned, another writer committed first: {error}"
                ));
            }
            Err(Failure::Other(e)) => return Err(e),
        }
        report.elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
        Ok(report)
    }

    /// A compaction's commits: the state table (its moved locations, or
    /// all of it when `whole`), then the target's `replace` snapshot naming
    /// it; then the engine takes both.
    #[allow(clippy::too_many_arguments)]
    async fn commit_compaction(
        &mut self,
        data: Vec<DataFile>,
        deletes: Vec<(i32, DataFile)>,
        rewrite: Rewrite,
        delta: Vec<RecordBatch>,
        generation: i64,
        whole: bool,
        now_ms: i64,
    ) -> std::result::Result<(), Failure> {
        let mut file_ms = 0.0;
        let state = self
            .commit_state(delta, generation, whole, now_ms, &mut file_ms)
            .await?;
        let spec_id = self.target.metadata.default_partition_spec_id();
        let partitions: Vec<(String, (i32, Struct))> = data
            .iter()
            .map(|f| (f.file_path().to_string(), (spec_id, f.partition().clone())))
            .collect();
        let (offsets, input_offset) = (self.offsets.clone(), self.input_offset);
        let floor = self.floor.clone();
        let removed = rewrite.removed.clone();
        let (target, _) = self
            .commit_target(
                data,
                deletes,
                &state,
                &offsets,
                floor.as_deref(),
                None,
                input_offset,
                now_ms,
                Mode::Compaction(rewrite),
            )
            .await?;
        self.publish(target, state, offsets, partitions, None, None, input_offset);
        if let Some(map) = &mut self.file_partitions {
            map.retain(|p, _| !removed.contains(p));
        }
        // Forget the rewritten files' ids: the file table stays as large
        // as the set of files rows are in.
        self.state.shrink_files();
        Ok(())
    }

    /// How many snapshots of the target and the state table would expire
    /// at `now_ms` (in memory; the service's "thresholds crossed" check).
    pub fn expirable_snapshots(&self, now_ms: i64) -> usize {
        let policy = self.flow.maintenance;
        let count = |t: &TableState, protect: Option<i64>| {
            let meta = &t.metadata;
            if meta.snapshots().len() <= 1 {
                return 0;
            }
            maintain::expirable(
                meta,
                now_ms,
                Retention::of(meta, &policy),
                &protect.into_iter().collect(),
            )
            .len()
        };
        count(&self.target, our_latest_id(&self.target.metadata))
            + count(&self.state_tbl, self.state_snapshot)
    }
}
