//! History flows (SCD Type 2, ignore_null_updates): the `people` flow, its
//! batches, an oracle written from the definitions (per key: sort by
//! sequence, fold into intervals), and `HistSim`, a model table that applies
//! history plans as Iceberg readers would.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, ArrayRef, Int64Array, RecordBatch, StringArray};
use autocdc::core::flow::Flow;
use autocdc::core::history::{self, HistCodec, History};
use autocdc::core::resolve::{BatchStats, Codec};
use autocdc::core::state::Loc;
use autocdc::table::state_table;

use super::render_all;

/// How a `people` flow is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub scd2: bool,
    /// SCD Type 2: `note` is not tracked (a change to it alone opens no version).
    pub untracked_note: bool,
    pub ignore_nulls: bool,
    /// `on_sequence_tie = "error"` (the generator then makes sequences unique per key).
    pub ties_error: bool,
    /// With `ignore_nulls`: only `city` keeps its value on a null
    /// (`ignore_null_updates_column_list = ["city"]`); a null `note` is taken.
    pub city_only_nulls: bool,
}

pub const SCD2: Shape = Shape {
    scd2: true,
    untracked_note: false,
    ignore_nulls: false,
    ties_error: false,
    city_only_nulls: false,
};

pub fn people_toml(shape: Shape, target: &str) -> String {
    let mut t = format!(
        r#"
name = "{}"
target = "{target}"
keys = ["id"]
sequence_by = "seq"
apply_as_deletes = "op = 'DELETE'"
except_column_list = ["op"]
stored_as_scd_type = {}
ignore_null_updates = {}
columns = [
  {{ name = "id", type = "long", required = true }},
  {{ name = "city", type = "string" }},
  {{ name = "note", type = "string" }},
  {{ name = "op", type = "string", required = true }},
  {{ name = "seq", type = "long", required = true }},
]
"#,
        target.replace('.', "_"),
        if shape.scd2 { 2 } else { 1 },
        shape.ignore_nulls && !shape.city_only_nulls,
    );
    if shape.ignore_nulls && shape.city_only_nulls {
        t.push_str("ignore_null_updates_column_list = [\"city\"]\n");
    }
    if shape.ties_error {
        t.push_str("on_sequence_tie = \"error\"\n");
    }
    // The sequence is left untracked (Spark's default tracks it; see
    // tests/it/drift.rs): an upsert that changes nothing else updates in place.
    if shape.scd2 && shape.untracked_note {
        t.push_str("track_history_except_column_list = [\"note\", \"seq\"]\n");
    } else if shape.scd2 {
        t.push_str("track_history_except_column_list = [\"seq\"]\n");
    }
    t
}

pub fn people(shape: Shape, target: &str) -> Flow {
    Flow::new(toml::from_str(&people_toml(shape, target)).unwrap()).unwrap()
}

/// One change: (id, is delete, city, note, seq).
pub type PEv = (i64, bool, Option<&'static str>, Option<&'static str>, i64);

pub fn up(id: i64, city: &'static str, note: &'static str, seq: i64) -> PEv {
    (id, false, Some(city), Some(note), seq)
}

pub fn del(id: i64, seq: i64) -> PEv {
    (id, true, None, None, seq)
}

pub fn people_batch(flow: &Flow, evs: &[PEv]) -> RecordBatch {
    let cols: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(evs.iter().map(|e| e.0))),
        Arc::new(StringArray::from_iter(evs.iter().map(|e| e.2))),
        Arc::new(StringArray::from_iter(evs.iter().map(|e| e.3))),
        Arc::new(StringArray::from_iter_values(
            evs.iter().map(|e| if e.1 { "DELETE" } else { "UPSERT" }),
        )),
        Arc::new(Int64Array::from_iter_values(evs.iter().map(|e| e.4))),
    ];
    RecordBatch::try_new(flow.source_arrow.clone(), cols).unwrap()
}

fn s(v: Option<&str>) -> String {
    v.unwrap_or("NULL").to_string()
}

/// The oracle. Per key and sequence an upsert wins over a delete in SCD
/// Type 1, the delete in SCD Type 2, else the larger fingerprint (the
/// documented tie rule); then, in sequence order: a delete closes
/// the open version; an upsert (nulls filled from the open version with
/// ignore_nulls) updates the open version in place when its tracked columns
/// are unchanged, else closes it at its sequence and opens a new one.
/// SCD Type 1 tracks nothing and shows only the open version.
/// Rows: id, city, note, seq (of the version's latest change), and for SCD
/// Type 2 `__START_AT`, `__END_AT`.
pub fn people_oracle(shape: Shape, flow: &Flow, batches: &[RecordBatch]) -> BTreeSet<Vec<String>> {
    let codec = Codec::new(flow).unwrap();
    type Change = (u64, bool, Option<String>, Option<String>);
    let mut per_key: BTreeMap<i64, BTreeMap<i64, Change>> = BTreeMap::new();
    for b in batches {
        let fps = codec.fingerprints(b).unwrap();
        let dels = flow.deletes.as_ref().unwrap().evaluate(b).unwrap();
        let id = b.column(0).as_primitive::<Int64Type>();
        let city = b.column(1).as_string::<i32>();
        let note = b.column(2).as_string::<i32>();
        let seq = b.column(4).as_primitive::<Int64Type>();
        let get =
            |a: &arrow_array::StringArray, r: usize| a.is_valid(r).then(|| a.value(r).to_string());
        for (r, &fp) in fps.iter().enumerate() {
            let c = (fp, dels.value(r), get(city, r), get(note, r));
            let m = per_key.entry(id.value(r)).or_default();
            // An upsert over a delete (SCD Type 1), the delete (SCD Type 2).
            let rank = |c: &Change| (c.1 == shape.scd2, c.0);
            match m.get(&seq.value(r)) {
                Some(cur) if rank(cur) >= rank(&c) => {}
                _ => {
                    m.insert(seq.value(r), c);
                }
            }
        }
    }
    let mut out = BTreeSet::new();
    for (id, changes) in per_key {
        // (start, city, note, latest seq)
        let mut cur: Option<(i64, Option<String>, Option<String>, i64)> = None;
        let mut versions = Vec::new();
        for (seq, (_, is_del, city, note)) in changes {
            if is_del {
                if let Some(v) = cur.take() {
                    versions.push((v, Some(seq)));
                }
                continue;
            }
            let (city, note) = match &cur {
                Some(v) if shape.ignore_nulls && shape.city_only_nulls => {
                    (city.or(v.1.clone()), note)
                }
                Some(v) if shape.ignore_nulls => (city.or(v.1.clone()), note.or(v.2.clone())),
                _ => (city, note),
            };
            let same = match &cur {
                Some(v) => !shape.scd2 || (v.1 == city && (shape.untracked_note || v.2 == note)),
                None => false,
            };
            if same {
                let v = cur.as_mut().unwrap();
                (v.1, v.2, v.3) = (city, note, seq);
            } else {
                if let Some(v) = cur.take() {
                    versions.push((v, Some(seq)));
                }
                cur = Some((seq, city, note, seq));
            }
        }
        if let Some(v) = cur {
            versions.push((v, None));
        }
        for ((start, city, note, last), end) in versions {
            let mut row = vec![
                id.to_string(),
                s(city.as_deref()),
                s(note.as_deref()),
                last.to_string(),
            ];
            if shape.scd2 {
                row.push(start.to_string());
                row.push(end.map(|e| e.to_string()).unwrap_or_else(|| "NULL".into()));
            } else if end.is_some() {
                continue;
            }
            out.insert(row);
        }
    }
    out
}

/// A model of the target for history plans: data files as vectors of rows,
/// removed rows set to `None`; a position delete must hit a live row.
pub struct HistSim {
    pub flow: Flow,
    codec: Codec,
    hc: HistCodec,
    pub hist: History,
    /// The state log: each commit's delta, as the engine commits it.
    log: Vec<RecordBatch>,
    files: Vec<(String, Vec<Option<Vec<String>>>)>,
    target_arrow: arrow_schema::SchemaRef,
    pub now_ms: i64,
    pub stats: BatchStats,
    /// The state log is written as autocdc wrote it before `__autocdc_starts`
    /// (each touched key whole, the column null), until a restart.
    legacy: bool,
}

impl HistSim {
    pub fn new(flow: Flow) -> HistSim {
        HistSim {
            codec: Codec::new(&flow).unwrap(),
            hc: HistCodec::new(&flow).unwrap(),
            target_arrow: Arc::new(
                iceberg::arrow::schema_to_arrow_schema(&flow.target_schema).unwrap(),
            ),
            hist: History::new(),
            flow,
            log: Vec::new(),
            files: Vec::new(),
            now_ms: 1_000,
            stats: BatchStats::default(),
            legacy: false,
        }
    }

    /// Resolves and applies `batch` to the history (and the target files),
    /// leaving its state delta for the next `commit`.
    pub fn apply_uncommitted(&mut self, batch: &RecordBatch) -> autocdc::Result<BatchStats> {
        let plan = history::resolve(
            &self.flow,
            &self.codec,
            &self.hc,
            batch,
            &self.hist,
            true,
            self.now_ms,
            None,
        )?;
        for loc in &plan.remove_positions {
            let path = self.hist.files.path(loc.file).to_string();
            let f = self.files.iter_mut().find(|f| f.0 == path).unwrap();
            let row = &mut f.1[loc.pos as usize];
            assert!(
                row.is_some(),
                "position delete of a removed row {path}:{}",
                loc.pos
            );
            *row = None;
        }
        assert!(
            plan.remove_rows.is_empty(),
            "a complete state needs no equality deletes"
        );
        let rows = history::rows_batch(
            &self.flow,
            &self.codec,
            &self.hc,
            &self.target_arrow,
            &plan.inserts,
        )?;
        let rows = render_all(&rows);
        let path = format!("sim-{}.parquet", self.files.len());
        let id = self.hist.files.intern(&path);
        let locs: Vec<Loc> = (0..rows.len() as u32)
            .map(|pos| Loc { file: id, pos })
            .collect();
        self.files
            .push((path, rows.into_iter().map(Some).collect()));
        let stats = plan.stats;
        history::apply(
            &mut self.hist,
            plan,
            &locs,
            &autocdc::core::resolve::Sequential,
        );
        self.hist.check_counts();
        self.stats.add(&stats);
        self.now_ms += 1;
        Ok(stats)
    }

    /// `apply_uncommitted`, then `commit`.
    pub fn apply(&mut self, batch: &RecordBatch) -> autocdc::Result<BatchStats> {
        let stats = self.apply_uncommitted(batch)?;
        self.commit();
        Ok(stats)
    }

    /// Writes what changed since the last commit to the state log, as the
    /// engine commits it (several batches may go in one commit).
    pub fn commit(&mut self) {
        let generation = self.log.len() as i64 + 1;
        let hist = &self.hist;
        // The old format wrote every event of each touched key.
        let legacy = self.legacy;
        let keys: Vec<_> = hist
            .dirty()
            .map(|(key, events, starts)| match legacy {
                true => (key, hist.get(key).unwrap(), true),
                false => (key, events, starts),
            })
            .collect();
        let mut delta = state_table::history_to_batch(
            &self.flow,
            &self.codec,
            &self.hc,
            hist,
            keys.into_iter(),
            generation,
        )
        .unwrap();
        if self.legacy {
            // As an old file reads in the evolved schema: the column null.
            let at = delta.schema().index_of(state_table::COL_STARTS).unwrap();
            let mut cols = delta.columns().to_vec();
            cols[at] = arrow_array::new_null_array(cols[at].data_type(), delta.num_rows());
            delta = RecordBatch::try_new(delta.schema(), cols).unwrap();
        }
        self.log.push(delta);
        self.hist.clear_dirty();
        self.hist.check_counts();
    }

    /// Writes the state log as autocdc did before it appended every
    /// history's changes and marked where a key starts: each commit
    /// rewrites a touched key's events whole, the mark null. The first
    /// restart loads it as an upgraded engine does, which appends from
    /// then on.
    pub fn writing_whole_keys(mut self) -> HistSim {
        self.legacy = true;
        self
    }

    /// Forgets the keys whose latest change is a delete applied before
    /// `cutoff_ms` (`tombstone_gc`, as a commit does); returns how many.
    pub fn gc(&mut self, cutoff_ms: i64) -> usize {
        let n = self.hist.gc_tombstones(cutoff_ms);
        self.hist.check_counts();
        n
    }

    /// Loads the history back from the state log (every commit's delta),
    /// as a restarted engine does, and checks it is the one in memory.
    pub fn restart(&mut self) {
        assert_eq!(self.hist.dirty_len(), 0, "a restart follows a commit");
        let mut fresh = History::new();
        self.legacy = false;
        // Same file ids as before: intern the paths in order.
        for (p, _) in &self.files {
            fresh.files.intern(p);
        }
        state_table::load_history(&self.flow, &self.codec, &self.hc, &mut fresh, &self.log)
            .unwrap();
        assert_eq!(fresh.len(), self.hist.len());
        assert_eq!(fresh.events(), self.hist.events());
        fresh.check_counts();
        assert_eq!(fresh.live(), self.hist.live());
        for (key, events) in self.hist.iter() {
            assert_eq!(
                fresh.get(key),
                Some(events),
                "the events of a key, reloaded"
            );
        }
        self.hist = fresh;
    }

    pub fn table(&self) -> BTreeSet<Vec<String>> {
        let mut out = BTreeSet::new();
        for (_, rows) in &self.files {
            for r in rows.iter().flatten() {
                assert!(out.insert(r.clone()), "row {r:?} twice");
            }
        }
        out
    }
}
