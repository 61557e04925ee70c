//! Moving the history forward by a plan once its rows are written
//! (`apply`): key by key, or, for a plan of many keys, by two threads each
//! replacing the keys of one half of the slots.

use super::arena::{Half, History, Put};
use super::plan::{KeyChange, Plan};
use crate::core::resolve::Join;
use crate::core::state::Loc;

/// Plans of at least this many keys are applied on two threads.
const APPLY_SPLIT_KEYS: usize = 16_384;

/// Moves the history forward once the inserts are written: `locs[ordinal]`
/// is where insert `ordinal` landed.
///
/// A plan of many keys is applied by `join`'s two threads, each replacing
/// the events of the keys in one half of the slots (the slots are split
/// where half the plan's keys fall below); freeing the plan's target rows
/// goes with the first. The counts and the dirty list are then taken in, in
/// the plan's order, with the keys new to the history, so the history is
/// the one applying the plan key by key gives.
pub fn apply(hist: &mut History, plan: Plan, locs: &[Loc], join: &impl Join) {
    debug_assert_eq!(locs.len(), plan.inserts.len());
    let Plan {
        inserts,
        remove_rows,
        mut changes,
        ..
    } = plan;
    for c in &mut changes {
        for &(at, ordinal) in &c.pending {
            c.events[at].set_loc(Some(locs[ordinal as usize]));
        }
    }
    let n = hist.len();
    let hinted = |c: &KeyChange| c.slot.filter(|&i| (i as usize) < n);
    let mut known: Vec<u32> = changes.iter().filter_map(hinted).collect();
    if known.len() < APPLY_SPLIT_KEYS {
        drop((inserts, remove_rows));
        let hints: Vec<Option<u32>> = changes.iter().map(|c| c.slot).collect();
        for (j, c) in changes.into_iter().enumerate() {
            hist.prefetch_ahead(|m| hints.get(m).copied().flatten(), j);
            hist.put(c.slot, c.key, c.from, c.events);
        }
        return;
    }
    let half = known.len() / 2;
    let mid = *known.select_nth_unstable(half).1;
    drop(known);
    // Each key in plan order: its place in its half, or (not a slot's) put after.
    let mut sides: [Vec<(usize, KeyChange)>; 2] = [Vec::new(), Vec::new()];
    let mut rest = Vec::new();
    let total = changes.len();
    for (j, c) in changes.into_iter().enumerate() {
        match hinted(&c) {
            Some(i) => sides[(i >= mid) as usize].push((j, c)),
            None => rest.push((j, c)),
        }
    }
    let [low, high] = sides;
    let (lo, hi) = hist.halves(mid);
    // A key whose hint is not its slot comes back, put after.
    let side = |mut half: Half<'_>, keys: Vec<(usize, KeyChange)>| {
        let mut done = Vec::with_capacity(keys.len());
        let mut back = Vec::new();
        let hints: Vec<u32> = keys.iter().map(|(_, c)| c.slot.expect("hinted")).collect();
        for (n, (j, c)) in keys.into_iter().enumerate() {
            half.prefetch_ahead(|m| hints.get(m).copied(), n);
            let i = c.slot.expect("a hinted key");
            if half.holds(i, &c.key) {
                done.push((j, i, half.replace(i, c.from, c.events)));
            } else {
                back.push((j, c));
            }
        }
        (done, back)
    };
    let ((done_lo, back_lo), (done_hi, back_hi)) = join.join(
        || {
            drop((inserts, remove_rows));
            side(lo, low)
        },
        || side(hi, high),
    );
    // Taken in in plan order: each key's step at its place in the plan.
    let mut steps: Vec<Option<Step>> = std::iter::repeat_with(|| None).take(total).collect();
    for (j, i, put) in done_lo.into_iter().chain(done_hi) {
        steps[j] = Some(Step::Replaced(i, put));
    }
    for (j, c) in rest.into_iter().chain(back_lo).chain(back_hi) {
        steps[j] = Some(Step::Put(c));
    }
    for step in steps.into_iter().flatten() {
        match step {
            Step::Replaced(i, put) => hist.count_put(i, put),
            Step::Put(c) => hist.put(c.slot, c.key, c.from, c.events),
        }
    }
}

/// What `apply` takes in for one key of a plan split in two: slot `i`,
/// replaced on a thread, or a key to put (new to the history, or whose
/// hint was not its slot).
enum Step {
    Replaced(u32, Put),
    Put(KeyChange),
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_large_plan_applied_by_halves_of_the_slots_is_the_plan_applied_key_by_key() {
        use super::{APPLY_SPLIT_KEYS, apply};
        use crate::core::history::event::tests::ev;
        use crate::core::history::{History, KeyChange, OutRow, Plan, Vals};
        use crate::core::state::Loc;
        // The core starts no thread: the split path runs the same with
        // `Sequential` (the engine's e2e tests run it on two threads).
        use crate::core::resolve::Sequential;
        let key = |k: u32| -> Box<[u8]> { k.to_be_bytes().into() };
        let loc = |pos| Some(Loc { file: 0, pos });
        let n = 3 * APPLY_SPLIT_KEYS as u32;
        let mut h = History::new();
        for k in 0..n {
            let deleted = (k % 7 == 0).then_some(5);
            h.put(
                None,
                key(k),
                0,
                vec![ev(1, b"a", None, loc(k)), ev(2, b"b", deleted, None)],
            );
        }
        // Slots of keys put since a commit are written whole: commit first,
        // then dirty a few slots so the plan meets listed ones too.
        h.clear_dirty();
        for k in (0..n).step_by(101) {
            let slot = h.slot(&key(k));
            h.put(slot, key(k), 1, vec![ev(2, b"c", None, None)]);
        }
        // Every other key from event 1 on: the same event (nothing changes),
        // one more, a new value, or a delete; a pending location; new keys;
        // hints that name another key's slot.
        let plan = |h: &History| -> Plan {
            let mut changes = Vec::new();
            let mut ordinal = 0;
            for k in (0..n + 500).step_by(2) {
                let mut pending = Vec::new();
                let events = match k % 5 {
                    _ if k >= n => vec![ev(1, b"new", None, None)],
                    0 => vec![ev(2, b"b", (k % 7 == 0).then_some(5), None)],
                    1 => vec![ev(2, b"b", None, None), ev(3, b"c", None, None)],
                    2 => {
                        pending.push((0, ordinal));
                        ordinal += 1;
                        vec![ev(2, b"z", None, None)]
                    }
                    3 => vec![ev(2, b"", Some(9), None)],
                    _ => vec![ev(2, b"b", None, None), ev(4, b"", Some(9), None)],
                };
                let slot = match h.slot(&key(k)) {
                    Some(s) if k % 11 == 0 => Some((s + 1) % n),
                    s => s,
                };
                let from = if k >= n { 0 } else { 1 };
                changes.push(KeyChange {
                    slot,
                    key: key(k),
                    from,
                    events,
                    pending,
                });
            }
            // A target row per pending location (their contents are not read).
            let inserts = (0..ordinal)
                .map(|o| OutRow {
                    key: key(o),
                    vals: Vals::new([&b"r"[..]].into_iter()),
                    start: None,
                    end: None,
                })
                .collect();
            Plan {
                changes,
                inserts,
                ..Default::default()
            }
        };
        let p = plan(&h);
        let locs: Vec<Loc> = (0..p.changes.iter().map(|c| c.pending.len()).sum::<usize>() as u32)
            .map(|pos| Loc { file: 1, pos })
            .collect();
        let mut by_key = h.clone();
        for mut c in plan(&h).changes {
            for &(at, o) in &c.pending {
                c.events[at].set_loc(Some(locs[o as usize]));
            }
            by_key.put(c.slot, c.key, c.from, c.events);
        }
        let mut split = h.clone();
        apply(&mut split, p, &locs, &Sequential);
        split.check_counts();
        by_key.check_counts();
        assert!(split.iter().eq(by_key.iter()), "the same keys and events");
        assert!(split.dirty().eq(by_key.dirty()), "the same dirty list");
        assert_eq!(
            (
                split.len(),
                split.events(),
                split.live(),
                split.heap_bytes()
            ),
            (
                by_key.len(),
                by_key.events(),
                by_key.live(),
                by_key.heap_bytes()
            )
        );
        assert_eq!(split.gc_tombstones(10), by_key.gc_tombstones(10));
        assert!(split.iter().eq(by_key.iter()), "the same tombstones expire");
        assert_ne!(split.len(), h.len(), "the plan changed the history");
    }
}
