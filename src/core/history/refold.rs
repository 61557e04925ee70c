//! Folding keys again and turning the difference into rows: a key's rows
//! before and after as removals and inserts (`rewrite_rows`, which
//! `resolve` shares), every key under a changed folding (`refold`), every
//! key's rows written anew (`rebuild`).

// hashbrown's default hasher (foldhash), as for the arena's keys.
use hashbrown::HashMap;

use super::arena::History;
use super::event::Event;
use super::fold::{HistCodec, Version, fold, row_hash};
use super::plan::{KeyChange, OutRow, Plan, to_out};
use crate::core::state::Loc;

/// Re-folds every key's events under `hc` where they were folded under
/// `was` (the SCD Type 2 tracked set changed): the rows that differ are
/// removed and written again, as for a batch; the events themselves stay,
/// only where their rows are changes.
pub fn refold(was: &HistCodec, hc: &HistCodec, hist: &History, state_complete: bool) -> Plan {
    let mut plan = Plan::default();
    for (slot, key, old) in hist.iter_slots() {
        let mut events = old.to_vec();
        let before = (
            plan.inserts.len(),
            plan.remove_positions.len(),
            plan.remove_rows.len(),
        );
        let pending = rewrite_rows(
            was,
            hc,
            hist,
            key,
            old,
            &mut events,
            &mut plan,
            state_complete,
        );
        let after = (
            plan.inserts.len(),
            plan.remove_positions.len(),
            plan.remove_rows.len(),
        );
        if after != before {
            plan.changes.push(KeyChange {
                slot: Some(slot),
                key: key.into(),
                from: 0,
                events,
                pending,
            });
        }
    }
    plan.remove_positions.sort_unstable();
    plan
}

/// Every key's rows written anew from its events (the target rebuilt from
/// the state, `autocdc refresh --history`): each version is an insert;
/// what the target held before goes with the overwrite that commits it.
pub fn rebuild(hc: &HistCodec, hist: &History) -> Plan {
    let mut plan = Plan::default();
    for (slot, key, old) in hist.iter_slots() {
        let mut events = old.to_vec();
        let mut pending = Vec::new();
        for v in fold(hc, &events) {
            pending.push((v.anchor, plan.inserts.len() as u32));
            plan.stats.placeholders_unfilled += u64::from(v.unfilled);
            plan.inserts.push(to_out(key, &events, &v));
        }
        for e in &mut events {
            e.set_loc(None);
        }
        plan.changes.push(KeyChange {
            slot: Some(slot),
            key: key.into(),
            from: 0,
            events,
            pending,
        });
    }
    plan
}

/// A key's target rows before (`old`, folded under `was`) and after
/// (`events`, folded under `hc`) the batch: rows in both stay where they
/// are; the others are removed (by position when known) and inserted.
/// `events` keep the positions of the rows that stay; returns (event,
/// insert ordinal) of each row to write.
#[allow(clippy::too_many_arguments)] // one key's rewrite, each input used once
pub(super) fn rewrite_rows(
    was: &HistCodec,
    hc: &HistCodec,
    hist: &History,
    key: &[u8],
    old: &[Event],
    events: &mut [Event],
    plan: &mut Plan,
    state_complete: bool,
) -> Vec<(usize, u32)> {
    let before = fold(was, old);
    let after = fold(hc, events);
    let mut olds: Vec<(u64, &Version, bool)> = before
        .iter()
        .map(|v| (row_hash(hc, old, v), v, false))
        .collect();
    // The old rows of each identity not yet matched, in order: a scan
    // finds the first for a few rows; a key with a long history (SCD Type
    // 2 of a hot key) gets a map, so matching stays linear in its rows.
    let mut unmatched: Option<HashMap<u64, std::collections::VecDeque<usize>>> = (olds.len() > 16)
        .then(|| {
            let mut m: HashMap<u64, std::collections::VecDeque<usize>> = HashMap::new();
            for (i, o) in olds.iter().enumerate() {
                m.entry(o.0).or_default().push_back(i);
            }
            m
        });
    let mut kept: Vec<(usize, Loc)> = Vec::new();
    let mut pending = Vec::new();
    for v in &after {
        let h = row_hash(hc, events, v);
        let first = match &unmatched {
            Some(m) => m.get(&h).and_then(|q| q.front().copied()),
            None => olds.iter().position(|o| !o.2 && o.0 == h),
        };
        // A row without a known position is written again, the old removed by key.
        if let Some(i) = first
            && let Some(loc) = old[olds[i].1.anchor].loc()
        {
            olds[i].2 = true;
            if let Some(q) = unmatched.as_mut().and_then(|m| m.get_mut(&h)) {
                q.pop_front();
            }
            kept.push((v.anchor, loc));
            continue;
        }
        pending.push((v.anchor, plan.inserts.len() as u32));
        plan.stats.placeholders_unfilled += u64::from(v.unfilled);
        plan.inserts.push(to_out(key, events, v));
    }
    for (_, v, matched) in &olds {
        if *matched {
            continue;
        }
        match old[v.anchor].loc() {
            Some(loc) if hist.files.is_live(loc.file) => {
                plan.remove_positions.push(loc);
                plan.stats.removed_by_position += 1;
            }
            _ => {
                plan.remove_rows.push(to_out(key, old, v));
                plan.stats.removed_by_key += 1;
            }
        }
    }
    if old.is_empty() && !state_complete && !hc.scd2() {
        // The key may have a row autocdc did not write.
        plan.remove_rows.push(OutRow {
            key: key.into(),
            vals: hc.null_vals(),
            start: None,
            end: None,
        });
        plan.stats.removed_by_key += 1;
    }
    for e in events.iter_mut() {
        e.set_loc(None);
    }
    for (at, loc) in kept {
        events[at].set_loc(Some(loc));
    }
    pending
}
