//! Property tests of the history resolver (SCD Type 2, ignore_null_updates)
//! against the oracle in `common::scd`: random changes over few keys and
//! sequences (to force late events, duplicates and ties), in a random order,
//! cut into random micro-batches, committed one or several at a time, with
//! state restarts between some of them.

use crate::common;

use common::scd::*;
use proptest::prelude::*;

const CITIES: [Option<&str>; 4] = [Some("Leeds"), Some("York"), Some("Bath"), None];
const NOTES: [Option<&str>; 3] = [Some("vip"), Some("new"), None];

fn shuffle<T>(v: &mut [T], mut x: u64) {
    x |= 1;
    for i in (1..v.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(i, (x % (i as u64 + 1)) as usize);
    }
}

fn run(
    shape: Shape,
    changes: &[(i64, bool, usize, usize, i64)],
    order_seed: u64,
    cuts: &[bool],
    restarts: &[bool],
) -> Result<(), TestCaseError> {
    run_with(shape, changes, order_seed, cuts, restarts, false)
}

/// `whole_keys`: the state log is written as before every history appended
/// (a touched key's events whole, unmarked) until the first restart, which
/// reads it as the flow reads it now and appends from then on.
fn run_with(
    shape: Shape,
    changes: &[(i64, bool, usize, usize, i64)],
    order_seed: u64,
    cuts: &[bool],
    restarts: &[bool],
    whole_keys: bool,
) -> Result<(), TestCaseError> {
    let flow = people(shape, "crm.people");
    let mut seen = std::collections::HashSet::new();
    let mut evs: Vec<PEv> = changes
        .iter()
        .filter(|c| !shape.ties_error || seen.insert((c.0, c.4)))
        .map(|&(k, d, c, n, s)| {
            if d {
                del(k, s)
            } else {
                (k, false, CITIES[c], NOTES[n], s)
            }
        })
        .collect();
    shuffle(&mut evs, order_seed);
    let mut batches: Vec<Vec<PEv>> = vec![Vec::new()];
    for (i, e) in evs.iter().enumerate() {
        batches.last_mut().unwrap().push(*e);
        if cuts[i] && i + 1 < evs.len() {
            batches.push(Vec::new());
        }
    }
    let arrow: Vec<_> = batches.iter().map(|b| people_batch(&flow, b)).collect();
    let mut sim = HistSim::new(flow.clone());
    if whole_keys {
        sim = sim.writing_whole_keys();
    }
    // Some runs commit every second or third batch, as the service does
    // when batches arrive faster than commits.
    let commit_every = 1 + (order_seed >> 32) as usize % 3;
    for (i, b) in arrow.iter().enumerate() {
        sim.apply_uncommitted(b).unwrap();
        if restarts[i] || (i + 1) % commit_every == 0 || i + 1 == arrow.len() {
            sim.commit();
        }
        if restarts[i] {
            sim.restart();
        }
    }
    prop_assert_eq!(sim.table(), people_oracle(shape, &flow, &arrow));
    let s = sim.stats;
    prop_assert_eq!(
        s.rows_in,
        s.upserts + s.deletes + s.stale + s.duplicates + s.tie_losers
    );
    Ok(())
}

fn changes() -> impl Strategy<Value = Vec<(i64, bool, usize, usize, i64)>> {
    // Few keys and sequences: late events, duplicates and ties are common.
    prop::collection::vec(
        (
            0i64..3,
            prop::bool::weighted(0.2),
            0usize..4,
            0usize..3,
            0i64..8,
        ),
        1..50,
    )
}

/// One key with many sequences: its history grows past the rows at which
/// a re-fold matches old and new rows through a map instead of a scan.
fn long_changes() -> impl Strategy<Value = Vec<(i64, bool, usize, usize, i64)>> {
    prop::collection::vec(
        (
            0i64..1,
            prop::bool::weighted(0.1),
            0usize..4,
            0usize..3,
            0i64..200,
        ),
        30..50,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn scd2_a_long_history_of_one_key_gives_the_oracle_history(
        changes in long_changes(),
        order_seed in any::<u64>(),
        cuts in prop::collection::vec(any::<bool>(), 50),
        restarts in prop::collection::vec(any::<bool>(), 50),
    ) {
        run(SCD2, &changes, order_seed, &cuts, &restarts)?;
    }

    #[test]
    fn scd1_ignoring_null_updates_a_long_history_of_one_key(
        changes in long_changes(),
        order_seed in any::<u64>(),
        cuts in prop::collection::vec(any::<bool>(), 50),
        restarts in prop::collection::vec(any::<bool>(), 50),
        ties_error in any::<bool>(),
    ) {
        run(Shape { scd2: false, untracked_note: false, ignore_nulls: true, ties_error, city_only_nulls: false }, &changes, order_seed, &cuts, &restarts)?;
    }

    #[test]
    fn scd2_ignoring_null_updates_a_long_history_of_one_key(
        changes in long_changes(),
        order_seed in any::<u64>(),
        cuts in prop::collection::vec(any::<bool>(), 50),
        restarts in prop::collection::vec(any::<bool>(), 50),
    ) {
        run(Shape { ignore_nulls: true, ..SCD2 }, &changes, order_seed, &cuts, &restarts)?;
    }

    #[test]
    fn scd2_any_order_and_batching_gives_the_oracle_history(
        changes in changes(),
        order_seed in any::<u64>(),
        cuts in prop::collection::vec(any::<bool>(), 50),
        restarts in prop::collection::vec(any::<bool>(), 50),
    ) {
        run(SCD2, &changes, order_seed, &cuts, &restarts)?;
    }

    #[test]
    fn scd2_reads_a_state_log_written_whole_per_key(
        changes in changes(),
        order_seed in any::<u64>(),
        cuts in prop::collection::vec(any::<bool>(), 50),
        restarts in prop::collection::vec(any::<bool>(), 50),
    ) {
        run_with(Shape { untracked_note: true, ..SCD2 }, &changes, order_seed, &cuts, &restarts, true)?;
    }

    #[test]
    fn scd2_with_an_untracked_column(
        changes in changes(),
        order_seed in any::<u64>(),
        cuts in prop::collection::vec(any::<bool>(), 50),
        restarts in prop::collection::vec(any::<bool>(), 50),
    ) {
        run(Shape { untracked_note: true, ..SCD2 }, &changes, order_seed, &cuts, &restarts)?;
    }

    #[test]
    fn scd2_ignoring_null_updates(
        changes in changes(),
        order_seed in any::<u64>(),
        cuts in prop::collection::vec(any::<bool>(), 50),
        restarts in prop::collection::vec(any::<bool>(), 50),
    ) {
        run(Shape { untracked_note: true, ignore_nulls: true, ..SCD2 }, &changes, order_seed, &cuts, &restarts)?;
    }

    #[test]
    fn scd1_ignoring_null_updates(
        changes in changes(),
        order_seed in any::<u64>(),
        cuts in prop::collection::vec(any::<bool>(), 50),
        restarts in prop::collection::vec(any::<bool>(), 50),
    ) {
        run(Shape { scd2: false, untracked_note: false, ignore_nulls: true, ties_error: false, city_only_nulls: false }, &changes, order_seed, &cuts, &restarts)?;
    }

    #[test]
    fn scd1_ignoring_null_updates_reads_a_state_log_written_whole_per_key(
        changes in changes(),
        order_seed in any::<u64>(),
        cuts in prop::collection::vec(any::<bool>(), 50),
        restarts in prop::collection::vec(any::<bool>(), 50),
    ) {
        run_with(Shape { scd2: false, untracked_note: false, ignore_nulls: true, ties_error: false, city_only_nulls: false }, &changes, order_seed, &cuts, &restarts, true)?;
    }

    #[test]
    fn scd1_ignoring_nulls_of_one_column_only(
        changes in changes(),
        order_seed in any::<u64>(),
        cuts in prop::collection::vec(any::<bool>(), 50),
        restarts in prop::collection::vec(any::<bool>(), 50),
    ) {
        run(Shape { scd2: false, untracked_note: false, ignore_nulls: true, ties_error: false, city_only_nulls: true }, &changes, order_seed, &cuts, &restarts)?;
    }

    #[test]
    fn scd1_ignoring_nulls_of_one_column_with_ties_rejected(
        changes in changes(),
        order_seed in any::<u64>(),
        cuts in prop::collection::vec(any::<bool>(), 50),
        restarts in prop::collection::vec(any::<bool>(), 50),
    ) {
        run(Shape { scd2: false, untracked_note: false, ignore_nulls: true, ties_error: true, city_only_nulls: true }, &changes, order_seed, &cuts, &restarts)?;
    }

    #[test]
    fn scd2_ignoring_nulls_of_one_column_only(
        changes in changes(),
        order_seed in any::<u64>(),
        cuts in prop::collection::vec(any::<bool>(), 50),
        restarts in prop::collection::vec(any::<bool>(), 50),
    ) {
        run(Shape { ignore_nulls: true, city_only_nulls: true, ..SCD2 }, &changes, order_seed, &cuts, &restarts)?;
    }

    #[test]
    fn scd1_ignoring_null_updates_with_ties_rejected(
        changes in changes(),
        order_seed in any::<u64>(),
        cuts in prop::collection::vec(any::<bool>(), 50),
        restarts in prop::collection::vec(any::<bool>(), 50),
    ) {
        run(Shape { scd2: false, untracked_note: false, ignore_nulls: true, ties_error: true, city_only_nulls: false }, &changes, order_seed, &cuts, &restarts)?;
    }
}

/// A plan with its parts in a canonical order: the keys' changes (with the
/// rows each writes), the positions and rows it removes, and its counts.
fn canonical(p: &autocdc::core::history::Plan) -> (String, Vec<String>, Vec<String>, Vec<String>) {
    let mut changes: Vec<String> = p
        .changes
        .iter()
        .map(|c| {
            let rows: Vec<String> = c
                .pending
                .iter()
                .map(|&(at, ord)| format!("{at}:{:?}", p.inserts[ord as usize]))
                .collect();
            format!("{:?} {:?} {rows:?}", c.key, c.events)
        })
        .collect();
    changes.sort();
    let positions = p
        .remove_positions
        .iter()
        .map(|l| format!("{l:?}"))
        .collect();
    let mut removed: Vec<String> = p.remove_rows.iter().map(|r| format!("{r:?}")).collect();
    removed.sort();
    (format!("{:?}", p.stats), changes, positions, removed)
}

/// Large history batches are resolved on two threads, each taking half of
/// the keys: the joined plan is the single pass's, for a first batch and
/// for a second one full of late changes, duplicates and ties.
#[test]
fn a_large_history_batch_resolved_on_two_threads_plans_as_one_pass() {
    use autocdc::core::history;
    use autocdc::core::resolve::Codec;
    use autocdc::core::state::Loc;
    use autocdc::table::flow_state::{FlowState, Plan};
    for shape in [
        Shape {
            untracked_note: true,
            ..SCD2
        },
        Shape {
            scd2: false,
            untracked_note: false,
            ignore_nulls: true,
            ties_error: false,
            city_only_nulls: false,
        },
    ] {
        let flow = people(shape, "crm.people");
        let codec = Codec::new(&flow).unwrap();
        let mut state = FlowState::new(&flow).unwrap();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        for (round, file) in ["f1", "f2"].into_iter().enumerate() {
            let evs: Vec<PEv> = (0..40_000)
                .map(|_| {
                    let (k, s) = (next(3_000) as i64, next(40) as i64 + round as i64 * 20);
                    if next(10) == 0 {
                        del(k, s)
                    } else {
                        (
                            k,
                            false,
                            CITIES[next(4) as usize],
                            NOTES[next(3) as usize],
                            s,
                        )
                    }
                })
                .collect();
            let batch = people_batch(&flow, &evs);
            let plan = state
                .plan(&flow, &codec, &batch, true, 1_000, None)
                .unwrap();
            let Plan::History(split) = &plan else {
                panic!("a history flow")
            };
            let FlowState::History { codec: hc, events } = &state else {
                panic!("a history flow")
            };
            let single =
                history::resolve(&flow, &codec, hc, &batch, events, true, 1_000, None).unwrap();
            assert_eq!(canonical(split), canonical(&single), "round {round}");
            let inserts = split.inserts.len() as u32;
            let id = state.files_mut().intern(file);
            let locs: Vec<Loc> = (0..inserts).map(|pos| Loc { file: id, pos }).collect();
            state.apply(&flow, plan, &locs, 1_000, i64::MIN);
        }
    }
}

/// A key forgotten when its tombstone was collected and put again by an
/// older upsert starts anew: its earlier rows in the state log (the upsert
/// and the delete) are not its events after a restart, though every
/// commit appends. For both ways of writing the log before it.
#[test]
fn a_key_put_again_after_its_tombstone_was_collected_reloads_as_it_is() {
    let shape = Shape {
        scd2: false,
        untracked_note: false,
        ignore_nulls: true,
        ties_error: false,
        city_only_nulls: false,
    };
    for legacy in [false, true] {
        let flow = people(shape, "crm.people");
        let mut sim = HistSim::new(flow.clone());
        if legacy {
            sim = sim.writing_whole_keys();
        }
        let batch = |evs: &[PEv]| people_batch(&flow, evs);
        sim.apply(&batch(&[up(1, "Leeds", "a", 5), up(2, "York", "b", 5)]))
            .unwrap();
        sim.apply(&batch(&[del(1, 6)])).unwrap();
        // Key 1's tombstone (deleted at the last apply's time) is collected.
        let now = sim.now_ms;
        assert_eq!(sim.gc(now + 1), 1);
        // Older than the forgotten delete: key 1 lives again.
        let stats = sim
            .apply(&batch(&[(1, false, Some("Bath"), None, 3)]))
            .unwrap();
        assert_eq!(stats.upserts, 1);
        sim.apply(&batch(&[(1, false, None, Some("c"), 4)]))
            .unwrap();
        let want: std::collections::BTreeSet<Vec<String>> =
            [vec!["1", "Bath", "c", "4"], vec!["2", "York", "b", "5"]]
                .into_iter()
                .map(|r| r.into_iter().map(String::from).collect())
                .collect();
        assert_eq!(sim.table(), want, "legacy log: {legacy}");
        // The reloaded history is the one in memory (checked by restart);
        // a legacy log is read by an upgraded engine, which appends from here.
        sim.restart();
        sim.apply(&batch(&[(1, false, None, Some("d"), 7)]))
            .unwrap();
        sim.restart();
        let mut want = want;
        want.remove(["1", "Bath", "c", "4"].map(String::from).as_slice());
        want.insert(["1", "Bath", "d", "7"].map(String::from).to_vec());
        assert_eq!(sim.table(), want, "legacy log: {legacy}");
    }
}
