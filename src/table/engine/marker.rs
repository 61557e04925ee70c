//! The marker each target snapshot of a flow carries in its summary (the
//! `autocdc.*` properties): what a commit records (`Engine::marker`), and
//! reading it back: the latest snapshot autocdc wrote (by this flow or
//! another flow sharing the target) and whether another writer came after it, the truncate floor, how a history flow's rows were folded,
//! and the lease under which the snapshot was made (fencing).

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::RecordBatch;
use iceberg::spec::{Schema, TableMetadata};

use super::Engine;
use crate::core::flow::Flow;
use crate::core::history::{Cut, Folding};
use crate::core::offsets::{self, Offsets, PROP_INPUT_OFFSETS};
use crate::core::resolve::Codec;
use crate::error::{Error, Result, codes};
use crate::table::maintain::ancestors;

pub const PROP_FLOW: &str = "autocdc.flow";
pub const PROP_STATE_SNAPSHOT: &str = "autocdc.state-snapshot-id";
pub const PROP_INPUT_OFFSET: &str = "autocdc.input-offset";
pub const PROP_GENERATION: &str = "autocdc.generation";
/// "false" once the target held rows autocdc did not write (their positions are unknown).
pub const PROP_STATE_COMPLETE: &str = "autocdc.state-complete";
/// `apply_as_truncates`: the highest truncate's sequence, as a JSON object.
pub const PROP_TRUNCATED_BELOW: &str = "autocdc.truncated-below";
/// SCD Type 2 Debezium flows: the cuts of completed snapshots the rows were
/// folded with (`core::history::Cut`), a JSON list of sequences.
pub const PROP_SNAPSHOT_CUTS: &str = "autocdc.snapshot-cuts";
/// `from_snapshot` flows: the version of the last snapshot applied.
pub const PROP_SNAPSHOT_VERSION: &str = "autocdc.snapshot-version";
/// SCD Type 2: the tracked columns the target's rows were folded with, a
/// JSON list of names. Absent on targets of earlier versions, which
/// tracked every value column but the sequence columns (or the list given).
pub const PROP_TRACK_HISTORY: &str = "autocdc.track-history";
/// History flows: the columns whose nulls kept their value when the rows
/// were folded, a JSON list of names. Absent on targets of earlier
/// versions: every value column with `ignore_null_updates`, else none.
pub const PROP_IGNORE_NULLS: &str = "autocdc.ignore-null-columns";
/// On a shared log: the instance that made the snapshot and the epoch of
/// the lease it held. A commit under an older epoch than the target's is
/// refused (`AUTOCDC_LEASE_LOST`): the epoch is a fencing token.
pub const PROP_COMMITTER: &str = "autocdc.committer";
pub const PROP_LEASE_EPOCH: &str = "autocdc.lease-epoch";

/// The latest snapshot of the target written by autocdc (by this flow or
/// another flow sharing the target: they share its state), walking back
/// from the current one; and whether any snapshot after it came from
/// elsewhere.
pub(super) fn our_latest(meta: &TableMetadata) -> (Option<HashMap<String, String>>, bool) {
    let mut foreign = false;
    for s in ancestors(meta, meta.current_snapshot_id()) {
        if by_autocdc(s) {
            return (Some(s.summary().additional_properties.clone()), foreign);
        }
        foreign = true;
    }
    (None, foreign)
}

/// The id of the latest snapshot of the target autocdc wrote.
pub(super) fn our_latest_id(meta: &TableMetadata) -> Option<i64> {
    ancestors(meta, meta.current_snapshot_id())
        .find(|s| by_autocdc(s))
        .map(|s| s.snapshot_id())
}

/// The schema of the latest snapshot of the target autocdc wrote.
pub(super) fn our_latest_schema(meta: &TableMetadata) -> Option<&Schema> {
    let s = meta.snapshot_by_id(our_latest_id(meta)?)?;
    meta.schema_by_id(s.schema_id()?).map(|s| s.as_ref())
}

/// The flow that wrote `s`, if autocdc did.
pub(super) fn writer(s: &iceberg::spec::Snapshot) -> Option<&str> {
    s.summary()
        .additional_properties
        .get(PROP_FLOW)
        .map(String::as_str)
}

fn by_autocdc(s: &iceberg::spec::Snapshot) -> bool {
    writer(s).is_some()
}

/// The truncate floor as a JSON object of the sequence columns, so it reads
/// back whatever the row format's version.
fn seq_to_json(flow: &Flow, codec: &Codec, floor: &[u8]) -> Result<String> {
    let cols = codec
        .seqs
        .convert_rows(std::iter::once(codec.seqs.parser().parse(floor)))?;
    let fields: Vec<arrow_schema::Field> = flow
        .seq_idx
        .iter()
        .map(|&i| flow.source_arrow.field(i).clone())
        .collect();
    let batch = RecordBatch::try_new(Arc::new(arrow_schema::Schema::new(fields)), cols)?;
    let mut w = arrow_json::LineDelimitedWriter::new(Vec::new());
    w.write(&batch)?;
    w.finish()?;
    Ok(String::from_utf8_lossy(&w.into_inner()).trim().to_string())
}

/// Cuts as `PROP_SNAPSHOT_CUTS` holds them: each sequence as a JSON object.
fn cuts_to_json(flow: &Flow, codec: &Codec, cuts: &[Cut]) -> Result<String> {
    let each = cuts
        .iter()
        .map(|c| seq_to_json(flow, codec, &c.seq))
        .collect::<Result<Vec<_>>>()?;
    Ok(format!("[{}]", each.join(",")))
}

/// The cuts `PROP_SNAPSHOT_CUTS` holds.
pub(super) fn cuts_from_json(flow: &Flow, codec: &Codec, json: &str) -> Result<Vec<Cut>> {
    let list: Vec<serde_json::Value> = serde_json::from_str(json).map_err(|e| Error::State {
        code: codes::TRUNCATE_FLOOR,
        message: format!("flow `{}`: {PROP_SNAPSHOT_CUTS} = {json}: {e}", flow.name),
    })?;
    list.iter()
        .map(|v| {
            let seq = seq_from_json(flow, codec, PROP_SNAPSHOT_CUTS, &v.to_string())?;
            Ok(Cut { seq: seq.into() })
        })
        .collect()
}

pub(super) fn seq_from_json(
    flow: &Flow,
    codec: &Codec,
    prop: &str,
    json: &str,
) -> Result<Box<[u8]>> {
    let fields: Vec<arrow_schema::Field> = flow
        .seq_idx
        .iter()
        .map(|&i| flow.source_arrow.field(i).clone())
        .collect();
    let bad = |m: String| Error::State {
        code: codes::TRUNCATE_FLOOR,
        message: format!("flow `{}`: {prop} = {json}: {m}", flow.name),
    };
    let batch = arrow_json::ReaderBuilder::new(Arc::new(arrow_schema::Schema::new(fields)))
        .build(std::io::Cursor::new(json.as_bytes()))
        .map_err(|e| bad(e.to_string()))?
        .next()
        .ok_or_else(|| bad("empty".into()))?
        .map_err(|e| bad(e.to_string()))?;
    if batch.num_rows() != 1 || batch.columns().iter().any(|c| c.null_count() > 0) {
        return Err(bad("not one complete sequence".into()));
    }
    let rows = codec.seqs.convert_columns(batch.columns())?;
    Ok(rows.row(0).data().into())
}

/// How a history flow's target rows were folded, as its latest snapshot
/// of this flow records it. The recorded names are those of that
/// snapshot's schema (`was`), followed by field id into the current one
/// (`now`): a renamed column stays in its set, a dropped one leaves it. A
/// column added since is null in every event folded then, so both choices
/// folded alike: it takes the definition's, and adding it re-folds nothing.
pub(super) fn recorded_folding(
    flow: &Flow,
    marker: &HashMap<String, String>,
    was: Option<&Schema>,
    now: &Schema,
) -> Result<Folding> {
    let tracked = match marker.get(PROP_TRACK_HISTORY) {
        _ if !flow.scd2 => Vec::new(),
        Some(json) => column_set(flow, PROP_TRACK_HISTORY, json, was, now)?,
        // Written before the property: the sequence columns were never tracked.
        None => flow
            .tracked
            .iter()
            .copied()
            .filter(|c| !flow.seq_idx.contains(c))
            .collect(),
    };
    let ignored = match marker.get(PROP_IGNORE_NULLS) {
        Some(json) => column_set(flow, PROP_IGNORE_NULLS, json, was, now)?,
        // Written before the property: no column lists existed.
        None if flow.config.ignore_null_updates => flow.value_cols(),
        None => Vec::new(),
    };
    let added = |c: usize| {
        was.zip(now.field_by_name(flow.column_name(c)))
            .is_some_and(|(was, f)| was.field_by_id(f.id).is_none())
    };
    let want = Folding::of(flow);
    let with_added = |mut set: Vec<usize>, wanted: &[usize]| {
        set.retain(|&c| !added(c));
        set.extend(wanted.iter().copied().filter(|&c| added(c)));
        set.sort_unstable();
        set.dedup();
        set
    };
    Ok(Folding {
        tracked: with_added(tracked, &want.tracked),
        ignored: with_added(ignored, &want.ignored),
    })
}

/// A column named in schema `was` (a snapshot's), by its name in `now` (the
/// current schema): None when it was dropped since.
pub(super) fn follow(name: &str, was: Option<&Schema>, now: &Schema) -> Option<String> {
    match was.and_then(|w| w.field_by_name(name)) {
        Some(f) => now.field_by_id(f.id).map(|g| g.name.clone()),
        None => Some(name.to_string()),
    }
}

/// A snapshot property's JSON list of value column names, as source indices (sorted).
fn column_set(
    flow: &Flow,
    prop: &str,
    json: &str,
    was: Option<&Schema>,
    now: &Schema,
) -> Result<Vec<usize>> {
    let bad = |message: String| Error::State {
        code: codes::SCHEMA_DRIFT,
        message: format!("flow `{}`: {prop} {message}", flow.name),
    };
    let names: Vec<String> =
        serde_json::from_str(json).map_err(|e| bad(format!("is unreadable: {e}")))?;
    let value_cols = flow.value_cols();
    let mut out = names
        .iter()
        .filter_map(|n| follow(n, was, now))
        .map(|n| {
            value_cols
                .iter()
                .copied()
                .find(|&c| flow.column_name(c) == n)
                .ok_or_else(|| {
                    bad(format!(
                        "names `{n}`, which is not a value column of the flow"
                    ))
                })
        })
        .collect::<Result<Vec<_>>>()?;
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

impl Engine {
    /// The marker a target commit records: the flow, the state snapshot it
    /// goes with, the offsets, generation and completeness, and as they
    /// apply the lease, the truncate floor, the snapshot version and how a
    /// history flow's rows are folded. `state`: the state table's snapshot
    /// and generation this target commit goes with.
    pub(super) fn marker(
        &self,
        state: (i64, i64),
        offsets: &Offsets,
        floor: Option<&[u8]>,
        snapshot_version: Option<i64>,
        input_offset: i64,
    ) -> Result<HashMap<String, String>> {
        let mut properties = HashMap::from([
            (PROP_FLOW.to_string(), self.flow.name.clone()),
            (PROP_STATE_SNAPSHOT.to_string(), state.0.to_string()),
            (PROP_INPUT_OFFSET.to_string(), input_offset.to_string()),
            (PROP_GENERATION.to_string(), state.1.to_string()),
            (
                PROP_STATE_COMPLETE.to_string(),
                self.state_complete.to_string(),
            ),
        ]);
        if !offsets.is_empty() {
            properties.insert(PROP_INPUT_OFFSETS.to_string(), offsets::to_json(offsets)?);
        }
        if let Some((me, epoch)) = &self.lease {
            properties.insert(PROP_COMMITTER.to_string(), me.clone());
            properties.insert(PROP_LEASE_EPOCH.to_string(), epoch.to_string());
        }
        if let Some(f) = floor {
            properties.insert(
                PROP_TRUNCATED_BELOW.to_string(),
                seq_to_json(&self.flow, &self.codec, f)?,
            );
        }
        let cuts = self.state.cuts();
        if !cuts.is_empty() {
            properties.insert(
                PROP_SNAPSHOT_CUTS.to_string(),
                cuts_to_json(&self.flow, &self.codec, cuts)?,
            );
        }
        if let Some(v) = snapshot_version.or(self.snapshot_version) {
            properties.insert(PROP_SNAPSHOT_VERSION.to_string(), v.to_string());
        }
        let names = |cols: &[usize]| -> Vec<&str> {
            cols.iter().map(|&c| self.flow.column_name(c)).collect()
        };
        if self.flow.scd2 {
            let tracked = names(&self.folded_with.tracked);
            properties.insert(
                PROP_TRACK_HISTORY.to_string(),
                serde_json::to_string(&tracked)?,
            );
        }
        if self.flow.keeps_history() {
            let ignored = names(&self.folded_with.ignored);
            properties.insert(
                PROP_IGNORE_NULLS.to_string(),
                serde_json::to_string(&ignored)?,
            );
        }
        Ok(properties)
    }

    /// Commits from now on under `instance`'s lease at `epoch` (a shared
    /// log): recorded in each snapshot's summary, and refused once the
    /// target has a snapshot of a newer epoch.
    pub fn set_lease(&mut self, instance: &str, epoch: u64) {
        self.lease = Some((instance.to_string(), epoch));
    }

    /// The flow that wrote the target's latest autocdc snapshot.
    pub(super) fn last_writer(&self) -> Option<&str> {
        ancestors(
            &self.target.metadata,
            self.target.metadata.current_snapshot_id(),
        )
        .find_map(|s| writer(s))
    }

    /// `AUTOCDC_LEASE_LOST` when the target has a snapshot of this flow
    /// under a newer lease epoch than this engine's: another instance took
    /// the flow over. (Each flow sharing a target has its own lease.)
    pub(super) fn fenced(&self) -> Result<()> {
        if let Some((_, ours)) = &self.lease
            && let Some((theirs, who)) = Engine::lease_of(&self.target.metadata, &self.flow.name)
            && theirs > *ours
        {
            return Err(Error::State {
                code: codes::LEASE_LOST,
                message: format!(
                    "flow `{}`: instance `{who}` committed under lease epoch {theirs}; this instance's epoch {ours} is over, so it does not commit",
                    self.flow.name
                ),
            });
        }
        Ok(())
    }

    /// The lease epoch of the latest snapshot of `flow` that records one
    /// (maintenance snapshots do not), and who held it.
    pub fn lease_of(metadata: &TableMetadata, flow: &str) -> Option<(u64, String)> {
        ancestors(metadata, metadata.current_snapshot_id()).find_map(|s| {
            if writer(s) != Some(flow) {
                return None;
            }
            let props = &s.summary().additional_properties;
            let e = props.get(PROP_LEASE_EPOCH)?.parse().ok()?;
            Some((e, props.get(PROP_COMMITTER).cloned().unwrap_or_default()))
        })
    }
}
