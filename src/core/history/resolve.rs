//! Resolving a batch against the history (`resolve` → `Plan`): its rows
//! grouped by key (`rows_by_key`), each key's slot looked up ahead, each
//! row placed among its key's events (`seek`, `place_rows`: duplicates,
//! ties, stale rows), the key folded again from where it can change and
//! its rows rewritten (`refold::rewrite_rows`).

use arrow_array::{ArrayRef, RecordBatch};
use arrow_row::Rows;
use hashbrown::HashTable;

use super::arena::History;
use super::event::Event;
use super::fold::{HistCodec, prune, refold_from};
use super::plan::{KeyChange, OutRow, Plan};
use super::refold::rewrite_rows;
use crate::core::flow::Flow;
use crate::core::resolve::{
    BatchStats, Codec, SameSequence, mask, required_null, same_sequence, validate,
};
use crate::core::state::{LOOKUP_AHEAD, hash_key};
use crate::error::Result;

/// Resolves `batch` against the history: every change goes to its place in
/// its key's events, and each touched key is folded again.
#[allow(clippy::too_many_arguments)] // the resolver's inputs, each used once
pub fn resolve(
    flow: &Flow,
    codec: &Codec,
    hc: &HistCodec,
    batch: &RecordBatch,
    hist: &History,
    state_complete: bool,
    now_ms: i64,
    forced_deletes: Option<&arrow_array::BooleanArray>,
) -> Result<Plan> {
    validate(flow, batch)?;
    let n = batch.num_rows();
    let cols =
        |idx: &[usize]| -> Vec<ArrayRef> { idx.iter().map(|&i| batch.column(i).clone()).collect() };
    let keys = codec.keys.convert_columns(&cols(&flow.key_idx))?;
    let seqs = codec.seqs.convert_columns(&cols(&flow.seq_idx))?;
    let mut fps = codec.fingerprints(batch)?;
    crate::core::resolve::sentinel_fingerprints(&mut fps, forced_deletes);
    let vals = hc.encode(batch)?;
    let is_delete = mask(flow, flow.deletes.as_ref(), batch)?;
    let changes = Changes {
        flow,
        hc,
        seqs: &seqs,
        vals: &vals,
        fps: &fps,
        deleted: |i: usize| {
            is_delete.as_ref().is_some_and(|d| d.value(i))
                || forced_deletes.is_some_and(|d| d.value(i))
        },
        now_ms,
    };

    let mut plan = Plan {
        stats: BatchStats {
            rows_in: n as u64,
            ..Default::default()
        },
        ..Default::default()
    };
    // Per key, reused: its rows in sequence order, and their places.
    let (mut by_seq, mut ats): (Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new());
    let groups = rows_by_key(&keys);
    // Every key's slot first, in a loop of lookups only, so the cache
    // misses of one key's lookup overlap the next's.
    let ahead = |n: usize| groups.keys.get(n).map(|g| g.hash);
    let slots: Vec<Option<u32>> = (groups.keys.iter().enumerate())
        .map(|(n, g)| {
            if let Some(h) = ahead(n + 2 * LOOKUP_AHEAD) {
                hist.prefetch_slot_of(h);
            }
            if let Some(h) = ahead(n + LOOKUP_AHEAD) {
                hist.prefetch_key_of(h);
            }
            hist.slot_hashed(g.hash, g.key)
        })
        .collect();
    for (n, (g, &slot)) in groups.keys.iter().zip(&slots).enumerate() {
        hist.prefetch_ahead(|m| slots.get(m).copied().flatten(), n);
        let (key, rows) = (g.key, &groups.rows[g.rows.clone()]);
        let whole: &[Event] = slot.map_or(&[], |i| hist.at(i));
        // Where each row goes among the key's events: found in sequence
        // order, each search starting where the last ended.
        by_seq.clear();
        by_seq.extend(0..rows.len());
        if rows.len() > 1 {
            by_seq.sort_by(|&a, &b| seqs.row(rows[a]).cmp(&seqs.row(rows[b])));
        }
        ats.clear();
        ats.resize(rows.len(), 0);
        let mut lo = 0;
        for &r in &by_seq {
            lo = seek(whole, lo, seqs.row(rows[r]).data());
            ats[r] = lo;
        }
        // Only the events from where the fold may change are copied,
        // changed and folded again (`refold_from`).
        let first = by_seq.first().map_or(0, |&r| ats[r]);
        let from = refold_from(hc, whole, first);
        let old = &whole[from..];
        ats.iter_mut().for_each(|at| *at -= from);
        let mut events = place_rows(&changes, old, rows, &ats, &mut plan.stats)?;
        prune(hc, &mut events);
        if events == old {
            continue;
        }

        let pending = rewrite_rows(
            hc,
            hc,
            hist,
            key,
            old,
            &mut events,
            &mut plan,
            state_complete,
        );
        plan.changes.push(KeyChange {
            slot,
            key: key.into(),
            from,
            events,
            pending,
        });
    }

    check_required(flow, hc, &keys, &plan.inserts)?;
    plan.remove_positions.sort_unstable();
    Ok(plan)
}

/// A batch's changes, row-encoded, as `place_rows` reads them.
struct Changes<'a, D> {
    flow: &'a Flow,
    hc: &'a HistCodec,
    seqs: &'a Rows,
    vals: &'a [Rows],
    fps: &'a [u64],
    /// Whether row `i` is a delete.
    deleted: D,
    /// The commit time a delete records.
    now_ms: i64,
}

impl<'a, D: Fn(usize) -> bool> Changes<'a, D> {
    fn seq(&self, i: usize) -> &'a [u8] {
        self.seqs.row(i).data()
    }

    /// Row `i` as an event (no location yet).
    fn event(&self, i: usize) -> Event {
        Event::new(
            self.seq(i),
            self.vals.iter().map(|r| r.row(i).data()),
            self.fps[i],
            (self.deleted)(i).then_some(self.now_ms),
            None,
        )
    }

    /// Whether row `i` takes the place of `other`, the event at its
    /// sequence (`same_sequence`); counts duplicates and ties.
    fn takes_place(&self, i: usize, other: &Event, stats: &mut BatchStats) -> Result<bool> {
        Ok(
            match same_sequence(
                self.flow,
                i,
                (self.fps[i], (self.deleted)(i)),
                other.fp(),
                other.is_delete(),
            )? {
                SameSequence::ReplacesSentinel => true,
                SameSequence::Duplicate => {
                    stats.duplicates += 1;
                    false
                }
                SameSequence::Tie { wins } => {
                    stats.ties += 1;
                    if !wins {
                        stats.tie_losers += 1;
                    }
                    wins
                }
            },
        )
    }

    /// Counts row `i`, which took a place: stale (behind a delete), a
    /// delete or an upsert.
    fn count(&self, i: usize, stale: bool, stats: &mut BatchStats) {
        if stale {
            stats.stale += 1;
        } else if (self.deleted)(i) {
            stats.deletes += 1;
        } else {
            stats.upserts += 1;
        }
    }
}

/// `place_rows` for a key's only row in the batch (most keys' case), with
/// no map.
fn place_one(
    changes: &Changes<'_, impl Fn(usize) -> bool>,
    old: &[Event],
    i: usize,
    at: usize,
    stats: &mut BatchStats,
) -> Result<Vec<Event>> {
    let seq = changes.seq(i);
    let here = old.get(at).filter(|e| e.seq() == seq);
    let mut stale = false;
    if let Some(e) = here {
        if !changes.takes_place(i, e, stats)? {
            return Ok(old.to_vec());
        }
    } else {
        stale = !changes.hc.scd2() && old[at..].iter().any(Event::is_delete);
    }
    changes.count(i, stale, stats);
    let mut events = Vec::with_capacity(old.len() + 1);
    events.extend_from_slice(&old[..at]);
    events.push(changes.event(i));
    events.extend_from_slice(&old[at + here.is_some() as usize..]);
    Ok(events)
}

/// The first of `events[lo..]` whose sequence is not below `seq`, every
/// event before `lo` being below it: a gallop from `lo`, so a run of
/// ascending searches over a long history (a hot key's) costs the log of
/// each distance, not of the whole.
fn seek(events: &[Event], mut lo: usize, seq: &[u8]) -> usize {
    let mut step = 1;
    loop {
        let probe = lo + step - 1;
        if probe >= events.len() || events[probe].seq() >= seq {
            let hi = probe.min(events.len());
            return lo + events[lo..hi].partition_point(|e| e.seq() < seq);
        }
        lo = probe + 1;
        step *= 2;
    }
}

/// A key's batch `rows` placed among its events `old` (those from the
/// refold point on; `ats[r]`: where `rows[r]`'s sequence falls among them):
/// the events after, in sequence order. Rows are taken
/// in batch order; a row meeting an event at its sequence (old, or an
/// earlier row's) is a duplicate, a tie or replaces a sentinel
/// (`same_sequence`). SCD Type 1: a row older than a delete changes
/// nothing now and counts stale (it is kept in case a tie displaces that
/// delete). Counts into `stats`.
///
/// The rows go into a map by sequence and are merged with `old` in one
/// pass, so a long history (a hot key's, rows arriving out of order)
/// costs O(events + rows log rows), where inserting each row into the
/// events cost O(events) per row.
fn place_rows<'a>(
    changes: &Changes<'a, impl Fn(usize) -> bool>,
    old: &'a [Event],
    rows: &[usize],
    ats: &[usize],
    stats: &mut BatchStats,
) -> Result<Vec<Event>> {
    use std::collections::{BTreeMap, BTreeSet};
    use std::ops::Bound::{Excluded, Unbounded};
    if let (&[i], &[at]) = (rows, ats) {
        return place_one(changes, old, i, at, stats);
    }
    let mut new: BTreeMap<&[u8], Event> = BTreeMap::new();
    // SCD Type 1: the sequences of the batch's deletes placed so far, and
    // (made when first needed) the first delete of `old[j..]` per `j`.
    let mut new_deletes: BTreeSet<&[u8]> = BTreeSet::new();
    let mut next_delete: Option<Vec<usize>> = None;
    for (&i, &at) in rows.iter().zip(ats) {
        let seq = changes.seq(i);
        debug_assert_eq!(at, old.partition_point(|e| e.seq() < seq));
        let here = new
            .get(seq)
            .or_else(|| old.get(at).filter(|e| e.seq() == seq));
        let mut stale = false;
        if let Some(e) = here {
            if !changes.takes_place(i, e, stats)? {
                continue;
            }
        } else if !changes.hc.scd2() {
            let next = next_delete.get_or_insert_with(|| {
                let mut next = vec![old.len(); old.len() + 1];
                for j in (0..old.len()).rev() {
                    next[j] = if old[j].is_delete() { j } else { next[j + 1] };
                }
                next
            });
            // A delete after `seq`: the batch's, or an old one no row replaced.
            let mut j = at;
            let old_delete = loop {
                let d = next[j];
                match old.get(d).map(|e| new.get(e.seq())) {
                    None => break false,
                    Some(None) => break true,
                    Some(Some(e)) if e.is_delete() => break true,
                    Some(Some(_)) => j = d + 1,
                }
            };
            stale = old_delete
                || new_deletes
                    .range::<[u8], _>((Excluded(seq), Unbounded))
                    .next()
                    .is_some();
        }
        if (changes.deleted)(i) {
            new_deletes.insert(seq);
        } else {
            new_deletes.remove(seq);
        }
        changes.count(i, stale, stats);
        new.insert(seq, changes.event(i));
    }
    // One pass: the old events between the rows, a row in place of the
    // old event at its sequence.
    let mut events = Vec::with_capacity(old.len() + new.len());
    let mut j = 0;
    for (seq, e) in new {
        let k = seek(old, j, seq);
        events.extend_from_slice(&old[j..k]);
        j = k + old.get(k).is_some_and(|o| o.seq() == seq) as usize;
        events.push(e);
    }
    events.extend_from_slice(&old[j..]);
    Ok(events)
}

/// The batch's rows grouped by key.
struct KeyGroups<'a> {
    /// In order of first appearance.
    keys: Vec<KeyGroup<'a>>,
    /// The rows, key after key, each key's in batch order.
    rows: Vec<usize>,
}

struct KeyGroup<'a> {
    key: &'a [u8],
    /// `hash_key(key)`.
    hash: u64,
    /// Where its rows are in `KeyGroups::rows`.
    rows: std::ops::Range<usize>,
}

/// The batch's rows grouped by key: a hash table of keys and one counting
/// pass, so a batch of distinct keys allocates no vector per key.
fn rows_by_key(keys: &Rows) -> KeyGroups<'_> {
    let n = keys.num_rows();
    let mut table: HashTable<u32> = HashTable::with_capacity(n);
    let mut groups: Vec<KeyGroup<'_>> = Vec::new();
    let mut group_of: Vec<u32> = Vec::with_capacity(n);
    for i in 0..n {
        let key: &[u8] = keys.row(i).data();
        let hash = hash_key(key);
        let found = table
            .find(hash, |&g| groups[g as usize].key == key)
            .copied();
        let g = found.unwrap_or_else(|| {
            let g = groups.len() as u32;
            table.insert_unique(hash, g, |&g| groups[g as usize].hash);
            groups.push(KeyGroup {
                key,
                hash,
                rows: 0..0,
            });
            g
        });
        // Counted in `end` for now.
        groups[g as usize].rows.end += 1;
        group_of.push(g);
    }
    let mut at = 0;
    for g in &mut groups {
        let count = g.rows.end;
        g.rows = at..at;
        at += count;
    }
    let mut rows = vec![0; n];
    for (i, &g) in group_of.iter().enumerate() {
        let r = &mut groups[g as usize].rows;
        rows[r.end] = i;
        r.end += 1;
    }
    KeyGroups { keys: groups, rows }
}

/// Every row to write fills the target's required columns.
fn check_required(flow: &Flow, hc: &HistCodec, keys: &Rows, inserts: &[OutRow]) -> Result<()> {
    for (j, &c) in hc.cols.iter().enumerate() {
        if !flow.required(c) {
            continue;
        }
        if let Some(r) = inserts.iter().find(|r| hc.is_null(j, r.vals.get(j))) {
            let row = (0..keys.num_rows())
                .find(|&i| keys.row(i).data() == &*r.key)
                .unwrap_or(0);
            return Err(required_null(flow, row, c));
        }
    }
    Ok(())
}

/// `place_rows` against the placement it replaced: each row inserted into a
/// copy of the events, one by one.
#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
    use proptest::prelude::*;

    use super::{Changes, place_rows, seek};
    use crate::core::flow::Flow;
    use crate::core::history::{Event, HistCodec};
    use crate::core::resolve::{BatchStats, Codec, SameSequence, same_sequence};
    use crate::error::Result;

    fn flow(scd2: bool, ties_error: bool) -> Flow {
        let toml = format!(
            r#"
name = "p"
target = "db.p"
keys = ["id"]
sequence_by = "seq"
apply_as_deletes = "op = 'DELETE'"
except_column_list = ["op"]
stored_as_scd_type = {}
ignore_null_updates = {}
on_sequence_tie = "{}"
columns = [
  {{ name = "id", type = "long", required = true }},
  {{ name = "city", type = "string" }},
  {{ name = "op", type = "string", required = true }},
  {{ name = "seq", type = "long", required = true }},
]
"#,
            if scd2 { 2 } else { 1 },
            !scd2,
            if ties_error { "error" } else { "deterministic" },
        );
        Flow::new(toml::from_str(&toml).unwrap()).unwrap()
    }

    /// (sequence, delete, city) changes of one key.
    type Change = (i64, bool, u8);

    fn batch(flow: &Flow, changes: &[Change]) -> RecordBatch {
        const CITIES: [Option<&str>; 3] = [Some("a"), Some("b"), None];
        let cols: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from_iter_values(changes.iter().map(|_| 1))),
            Arc::new(StringArray::from_iter(
                changes.iter().map(|c| CITIES[c.2 as usize]),
            )),
            Arc::new(StringArray::from_iter_values(
                changes
                    .iter()
                    .map(|c| if c.1 { "DELETE" } else { "UPSERT" }),
            )),
            Arc::new(Int64Array::from_iter_values(changes.iter().map(|c| c.0))),
        ];
        RecordBatch::try_new(flow.source_arrow.clone(), cols).unwrap()
    }

    /// The placement before `place_rows`.
    fn by_insertion(
        c: &Changes<'_, impl Fn(usize) -> bool>,
        old: &[Event],
        rows: &[usize],
        stats: &mut BatchStats,
    ) -> Result<Vec<Event>> {
        let Changes {
            flow,
            hc,
            seqs,
            vals,
            fps,
            deleted,
            now_ms,
        } = c;
        let mut events = old.to_vec();
        for &i in rows {
            let seq: &[u8] = seqs.row(i).data();
            let fp = fps[i];
            let at = events.partition_point(|e| e.seq() < seq);
            let event = Event::new(
                seq,
                vals.iter().map(|r| r.row(i).data()),
                fp,
                deleted(i).then_some(*now_ms),
                None,
            );
            if let Some(e) = events.get(at).filter(|e| e.seq() == seq) {
                match same_sequence(flow, i, (fp, deleted(i)), e.fp(), e.is_delete())? {
                    SameSequence::ReplacesSentinel => {}
                    SameSequence::Duplicate => {
                        stats.duplicates += 1;
                        continue;
                    }
                    SameSequence::Tie { wins } => {
                        stats.ties += 1;
                        if !wins {
                            stats.tie_losers += 1;
                            continue;
                        }
                    }
                }
                events[at] = event;
            } else {
                let behind_delete = !hc.scd2() && events[at..].iter().any(Event::is_delete);
                events.insert(at, event);
                if behind_delete {
                    stats.stale += 1;
                    continue;
                }
            }
            if deleted(i) {
                stats.deletes += 1;
            } else {
                stats.upserts += 1;
            }
        }
        Ok(events)
    }

    proptest! {
        #[test]
        fn seeking_from_any_point_below_is_the_partition_point(
            seqs in proptest::collection::btree_set(any::<u8>(), 0..80),
            seq: u8,
            back: usize,
        ) {
            let events: Vec<Event> = seqs
                .iter()
                .map(|&s| Event::new(&[s], std::iter::empty(), 0, None, None))
                .collect();
            let want = events.partition_point(|e| e.seq() < [seq].as_slice());
            let lo = want.saturating_sub(back % (want + 1));
            prop_assert_eq!(seek(&events, lo, &[seq]), want);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]
        #[test]
        fn placing_rows_by_merge_is_inserting_them_one_by_one(
            scd2: bool,
            ties_error: bool,
            old in proptest::collection::vec((0i64..16, any::<bool>(), 0u8..3), 0..12),
            new in proptest::collection::vec((0i64..16, any::<bool>(), 0u8..3), 1..32),
        ) {
            let flow = flow(scd2, ties_error);
            let codec = Codec::new(&flow).unwrap();
            let hc = HistCodec::new(&flow).unwrap();
            // The old events: one per sequence, in order.
            let mut olds: Vec<Change> = old;
            olds.sort_by_key(|c| c.0);
            olds.dedup_by_key(|c| c.0);
            let ob = batch(&flow, &olds);
            let oseqs = codec.seqs.convert_columns(&[ob.column(3).clone()]).unwrap();
            let ovals = hc.encode(&ob).unwrap();
            let ofps = codec.fingerprints(&ob).unwrap();
            let old: Vec<Event> = (0..olds.len())
                .map(|i| {
                    Event::new(
                        oseqs.row(i).data(),
                        ovals.iter().map(|r| r.row(i).data()),
                        ofps[i],
                        olds[i].1.then_some(5),
                        None,
                    )
                })
                .collect();
            let nb = batch(&flow, &new);
            let seqs = codec.seqs.convert_columns(&[nb.column(3).clone()]).unwrap();
            let vals = hc.encode(&nb).unwrap();
            let fps = codec.fingerprints(&nb).unwrap();
            let changes = Changes {
                flow: &flow,
                hc: &hc,
                seqs: &seqs,
                vals: &vals,
                fps: &fps,
                deleted: |i: usize| new[i].1,
                now_ms: 9,
            };
            let rows: Vec<usize> = (0..new.len()).collect();
            let ats: Vec<usize> = rows
                .iter()
                .map(|&i| old.partition_point(|e| e.seq() < seqs.row(i).data()))
                .collect();
            let (mut a, mut b) = (BatchStats::default(), BatchStats::default());
            let merged = place_rows(&changes, &old, &rows, &ats, &mut a);
            let inserted = by_insertion(&changes, &old, &rows, &mut b);
            match (merged, inserted) {
                (Ok(m), Ok(i)) => {
                    prop_assert_eq!(m, i);
                    prop_assert_eq!(a, b);
                }
                (m, i) => prop_assert_eq!(m.is_err(), i.is_err()),
            }
            // A key's only row (`place_one`).
            let (mut a, mut b) = (BatchStats::default(), BatchStats::default());
            let one = place_rows(&changes, &old, &[0], &ats[..1], &mut a);
            let inserted = by_insertion(&changes, &old, &[0], &mut b);
            match (one, inserted) {
                (Ok(m), Ok(i)) => {
                    prop_assert_eq!(m, i);
                    prop_assert_eq!(a, b);
                }
                (m, i) => prop_assert_eq!(m.is_err(), i.is_err()),
            }
        }
    }
}
