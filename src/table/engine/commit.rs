//! The commit phases 2 to 5 of a planned batch, shared by apply, re-fold,
//! rebuild and compaction: write the target's files, write and commit the
//! state table, commit the target naming that state snapshot, publish.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::RecordBatch;
use iceberg::arrow::schema_to_arrow_schema;
use iceberg::spec::{DataFile, Struct};

use super::marker::{PROP_FLOW, PROP_GENERATION};
use super::{CommitReport, Engine};
use crate::core::offsets::Offsets;
use crate::core::state::Loc;
use crate::error::{Error, Result};
use crate::fault::FaultPoint;
use crate::table::catalog::TableState;
use crate::table::flow_state::Plan;
use crate::table::row_delta::{self, Rewrite, RowDelta};
use crate::table::state_table;
use crate::table::write::{self, FileNamer};

/// The snapshot a commit makes of the target.
pub(super) enum Mode {
    /// Rows added and removed (`append` or `overwrite`).
    Delta,
    /// A compaction: files rewritten, nothing changed (`replace`).
    Compaction(Rewrite),
    /// The target's rows replaced whole (`overwrite` of everything).
    Rebuild,
}

/// A batch resolved, before anything is written.
pub(super) struct Planned {
    pub(super) plan: Plan,
    /// The batch the plan's rows refer to, when a truncate or a snapshot
    /// diff rewrote the input.
    pub(super) rewritten: Option<RecordBatch>,
    /// Truncate flows: the floor after this batch.
    pub(super) floor: Option<Option<Box<[u8]>>>,
    pub(super) floor_raised: bool,
    pub(super) snapshot_version: Option<i64>,
}

impl Planned {
    /// A plan made from the state alone (no input batch).
    pub(super) fn of(plan: Plan) -> Planned {
        Planned {
            plan,
            rewritten: None,
            floor: None,
            floor_raised: false,
            snapshot_version: None,
        }
    }
}

/// Why one attempt at a batch failed.
pub(super) enum Failure {
    /// The target commit lost a race or its outcome is unknown: reload, look
    /// for our snapshot, rebuild if it is not there.
    AtCommit {
        error: Error,
        snapshot_id: i64,
    },
    Other(Error),
}

impl<E: Into<Error>> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure::Other(e.into())
    }
}

impl Failure {
    pub(super) fn into_error(self) -> Error {
        match self {
            Failure::AtCommit { error, .. } | Failure::Other(error) => error,
        }
    }
}

/// The target files of one commit, not yet committed: the delete files are
/// written, the data files may still be being encoded on other workers.
struct TargetFiles {
    data: DataWrite,
    /// Each with the partition spec of the files it applies to.
    deletes: Vec<(i32, DataFile)>,
    /// Where each inserted row went.
    locs: Vec<Loc>,
    rows: u64,
    /// (spec id, partition) of each new data file.
    partitions: Vec<(String, (i32, Struct))>,
}

/// The data files of a commit, encoded on other runtime workers while the
/// commit goes on (`finish` waits for them); dropped early (the commit
/// failed), it stops.
struct DataWrite(tokio::task::JoinHandle<Result<Vec<DataFile>>>);

impl DataWrite {
    async fn finish(mut self) -> Result<Vec<DataFile>> {
        match (&mut self.0).await {
            Ok(written) => written,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => {
                Err(std::io::Error::other(format!("the data files' writer stopped: {e}")).into())
            }
        }
    }
}

impl Drop for DataWrite {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The state table's file for one batch, written and not yet committed.
struct StateFile {
    /// None, one or (a large delta) two files.
    files: Vec<DataFile>,
    rows: u64,
    generation: i64,
    /// The file holds every entry (it replaces the state log).
    whole: bool,
}

/// The state table's commit for one batch.
pub(super) struct StateCommit {
    table: TableState,
    pub(super) snapshot_id: i64,
    pub(super) generation: i64,
    /// The state log was rewritten whole.
    compacted: bool,
    /// Rows in the state log after this commit.
    log_rows: u64,
}

impl Engine {
    /// Phases 2 to 5 of a planned commit: write target files, persist
    /// state, commit the target (`mode`), publish. `batch`: the rows the
    /// plan refers to.
    #[allow(clippy::too_many_arguments)] // the commit's inputs, each used once
    pub(super) async fn commit_planned(
        &mut self,
        planned: Planned,
        batch: &RecordBatch,
        now_ms: i64,
        input_offset: i64,
        offsets: Offsets,
        mode: Mode,
        mut clock: std::time::Instant,
    ) -> std::result::Result<CommitReport, Failure> {
        let mut report = CommitReport {
            stats: planned.plan.stats(),
            input_offset: self.input_offset,
            snapshot_version: planned.snapshot_version,
            ..Default::default()
        };
        report.timings.resolve_ms = ms_since(&mut clock);
        // A raised truncate floor or a new snapshot version is committed
        // even when no row changes (no files are written then).
        if planned.plan.is_empty()
            && !planned.floor_raised
            && planned.snapshot_version.is_none()
            && !matches!(mode, Mode::Rebuild)
        {
            return Ok(report);
        }
        self.poisoned = true;
        let files = self.write_target_files(batch, &planned.plan).await?;
        report.timings.target_files_ms = ms_since(&mut clock);
        // The data files are encoded on another core meanwhile.
        let state_file = self
            .write_state(planned.plan, &files.locs, now_ms, &mut report, &mut clock)
            .await?;
        let started = std::time::Instant::now();
        let data = files.data.finish().await?;
        report.timings.target_files_ms += started.elapsed().as_secs_f64() * 1e3;
        self.faults.hit(FaultPoint::AfterTargetFiles)?;
        report.data_files = data.len();
        report.delete_files = files.deletes.len();
        report.rows_written = files.rows;
        report.bytes_written = data
            .iter()
            .chain(files.deletes.iter().map(|(_, f)| f))
            .map(|f| f.file_size_in_bytes())
            .sum();
        clock = std::time::Instant::now();
        let state = self.commit_state_file(state_file, now_ms).await?;
        let (target, snapshot_id) = self
            .commit_target(
                data,
                files.deletes,
                &state,
                &offsets,
                planned.floor.as_ref().and_then(|f| f.as_deref()),
                planned.snapshot_version,
                input_offset,
                now_ms,
                mode,
            )
            .await?;
        report.timings.commits_ms = ms_since(&mut clock);
        report.snapshot_id = Some(snapshot_id);
        report.input_offset = input_offset;
        report.state_compacted = state.compacted;
        self.publish(
            target,
            state,
            offsets,
            files.partitions,
            planned.floor,
            planned.snapshot_version,
            input_offset,
        );
        Ok(report)
    }

    /// Phase 2, target files: the new rows are laid out in data files
    /// (every row's file and position is known from here on) whose encoding
    /// starts on other workers; then the delete files of the rows they
    /// replace are written here.
    async fn write_target_files(
        &mut self,
        batch: &RecordBatch,
        plan: &Plan,
    ) -> Result<TargetFiles> {
        let file_io = self.catalog.file_io().clone();
        let meta = self.target.metadata.clone();
        let schema = meta.current_schema().clone();
        let spec_id = meta.default_partition_spec_id();
        let mut namer = FileNamer::new(meta.location());
        let target_arrow = Arc::new(schema_to_arrow_schema(&schema)?);
        let rows = self
            .state
            .target_rows(&self.flow, &self.codec, &target_arrow, batch, plan)?;
        let layout = write::layout(
            &mut namer,
            self.partitioner.as_deref(),
            std::slice::from_ref(&rows.inserts),
            self.flow.target_file_size_bytes,
        )?;
        let ids: Vec<u32> = layout
            .files
            .iter()
            .map(|f| self.state.files_mut().intern(&f.path))
            .collect();
        let locs: Vec<Loc> = layout
            .locs
            .iter()
            .map(|&(f, pos)| Loc {
                file: ids[f as usize],
                pos,
            })
            .collect();
        debug_assert_eq!(
            locs.len(),
            rows.inserts.num_rows(),
            "every inserted row has a position"
        );
        let partitions = layout
            .files
            .iter()
            .map(|f| (f.path.clone(), (spec_id, f.partition().clone())))
            .collect();
        let data = {
            let file_io = file_io.clone();
            DataWrite(tokio::spawn(async move {
                write::write_layout(
                    &file_io,
                    schema,
                    spec_id,
                    layout.files,
                    write::FileUse::Table,
                )
                .await
            }))
        };
        let deletes = self
            .delete_files(
                &file_io,
                &mut namer,
                &rows.remove_positions,
                &rows.remove_rows,
            )
            .await?;
        Ok(TargetFiles {
            data,
            deletes,
            locs,
            rows: rows.inserts.num_rows() as u64,
            partitions,
        })
    }

    /// Phase 3, state: apply the plan to the in-memory state and write its
    /// delta (or, when the log has grown too long, all of it) as the state
    /// table's file; `commit_state_file` commits it once the target's data
    /// files are written. The target commit names that snapshot.
    async fn write_state(
        &mut self,
        plan: Plan,
        locs: &[Loc],
        now_ms: i64,
        report: &mut CommitReport,
        clock: &mut std::time::Instant,
    ) -> Result<StateFile> {
        let cutoff = now_ms.saturating_sub(self.flow.tombstone_gc.as_millis() as i64);
        let generation = self.generation + 1;
        report.tombstones_collected = self.state.apply(&self.flow, plan, locs, now_ms, cutoff);
        let compacted = self.state.needs_compaction(self.state_log_rows);
        let delta = self
            .state
            .delta(&self.flow, &self.codec, generation, compacted)?;
        report.timings.state_apply_ms = ms_since(clock);
        let file = self.state_file(delta, generation, compacted).await?;
        report.timings.state_file_ms = ms_since(clock);
        Ok(file)
    }

    /// Writes the state table's rows for a commit (the changed entries, or
    /// all of them when `whole`) and commits them.
    pub(super) async fn commit_state(
        &mut self,
        delta: Vec<RecordBatch>,
        generation: i64,
        whole: bool,
        now_ms: i64,
        file_ms: &mut f64,
    ) -> std::result::Result<StateCommit, Failure> {
        let started = std::time::Instant::now();
        let file = self.state_file(delta, generation, whole).await?;
        *file_ms = started.elapsed().as_secs_f64() * 1e3;
        self.commit_state_file(file, now_ms).await
    }

    /// Writes the state table's file for a commit.
    async fn state_file(
        &mut self,
        delta: Vec<RecordBatch>,
        generation: i64,
        whole: bool,
    ) -> Result<StateFile> {
        let smeta = self.state_tbl.metadata.clone();
        let schema = Arc::new(schema_to_arrow_schema(smeta.current_schema())?);
        let parts = delta
            .iter()
            .map(|part| state_table::conform(part, schema.clone()))
            .collect::<Result<Vec<_>>>()?;
        let rows = parts.iter().map(|p| p.num_rows() as u64).sum();
        let mut snamer = FileNamer::new(smeta.location());
        let files = write::state_files(
            self.catalog.file_io(),
            &mut snamer,
            smeta.current_schema().clone(),
            smeta.default_partition_spec_id(),
            parts,
        )
        .await?;
        Ok(StateFile {
            files,
            rows,
            generation,
            whole,
        })
    }

    /// Commits the state table's file of a commit.
    async fn commit_state_file(
        &mut self,
        state: StateFile,
        now_ms: i64,
    ) -> std::result::Result<StateCommit, Failure> {
        self.faults.hit(FaultPoint::AfterStateFile)?;
        let StateFile {
            files,
            rows: delta_rows,
            generation,
            whole: compacted,
        } = state;
        let produced = row_delta::produce(
            self.catalog.file_io(),
            &self.state_tbl,
            RowDelta {
                data: files,
                deletes: Vec::new(),
                base_snapshot: self.state_snapshot,
                replace: compacted,
                properties: HashMap::from([
                    (PROP_FLOW.to_string(), self.flow.name.clone()),
                    (PROP_GENERATION.to_string(), generation.to_string()),
                ]),
                now_ms,
                rewrite: None,
            },
        )
        .await?;
        if produced.merged > 0 {
            self.faults.hit(FaultPoint::AfterManifestMerge)?;
        }
        let snapshot_id = produced.snapshot_id;
        // Another writer of this flow (a second instance) may have committed
        // the state table first: reload and rebuild, as for the target.
        let table = self
            .catalog
            .commit(&self.state_tbl, produced.updates, produced.requirements)
            .await
            .map_err(|error| match error {
                Error::CommitConflict(_) | Error::Unavailable(_) => {
                    Failure::AtCommit { error, snapshot_id }
                }
                error => Failure::Other(error),
            })?;
        self.faults.hit(FaultPoint::AfterStateCommit)?;
        Ok(StateCommit {
            table,
            snapshot_id,
            generation,
            compacted,
            log_rows: if compacted {
                delta_rows
            } else {
                self.state_log_rows + delta_rows
            },
        })
    }

    /// Phase 4, commit target: one row-delta snapshot naming the state
    /// snapshot it goes with and the offset of each ingest log.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn commit_target(
        &self,
        data: Vec<DataFile>,
        deletes: Vec<(i32, DataFile)>,
        state: &StateCommit,
        offsets: &Offsets,
        floor: Option<&[u8]>,
        snapshot_version: Option<i64>,
        input_offset: i64,
        now_ms: i64,
        mode: Mode,
    ) -> std::result::Result<(TableState, i64), Failure> {
        let properties = self.marker(
            (state.snapshot_id, state.generation),
            offsets,
            floor,
            snapshot_version,
            input_offset,
        )?;
        let (replace, rewrite) = match mode {
            Mode::Delta => (false, None),
            Mode::Compaction(r) => (false, Some(r)),
            Mode::Rebuild => (true, None),
        };
        let produced = row_delta::produce(
            self.catalog.file_io(),
            &self.target,
            RowDelta {
                data,
                deletes,
                base_snapshot: self.target.metadata.current_snapshot_id(),
                replace,
                properties,
                now_ms,
                rewrite,
            },
        )
        .await?;
        if produced.merged > 0 {
            self.faults.hit(FaultPoint::AfterManifestMerge)?;
        }
        let snapshot_id = produced.snapshot_id;
        let target = self
            .catalog
            .commit(&self.target, produced.updates, produced.requirements)
            .await
            .map_err(|error| match error {
                Error::InjectedFault(_) => Failure::Other(error),
                error => Failure::AtCommit { error, snapshot_id },
            })?;
        self.faults.hit(FaultPoint::AfterTargetCommit)?;
        Ok((target, snapshot_id))
    }

    /// Phase 5, publish: both commits landed; the engine takes on the new
    /// tables, generation, offsets, floor and version.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn publish(
        &mut self,
        target: TableState,
        state: StateCommit,
        offsets: Offsets,
        partitions: Vec<(String, (i32, Struct))>,
        floor: Option<Option<Box<[u8]>>>,
        snapshot_version: Option<i64>,
        input_offset: i64,
    ) {
        self.offsets = offsets;
        self.state_log_rows = state.log_rows;
        self.state.clear_dirty();
        self.state_tbl = state.table;
        self.target = target;
        self.state_snapshot = Some(state.snapshot_id);
        self.generation = state.generation;
        self.input_offset = input_offset;
        if let Some(floor) = floor {
            self.floor = floor;
        }
        if snapshot_version.is_some() {
            self.snapshot_version = snapshot_version;
        }
        self.poisoned = false;
        if let Some(map) = &mut self.file_partitions {
            map.extend(partitions);
        }
    }
}

fn ms_since(t: &mut std::time::Instant) -> f64 {
    let now = std::time::Instant::now();
    let ms = (now - *t).as_secs_f64() * 1e3;
    *t = now;
    ms
}
