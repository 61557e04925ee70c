//! Property test of the pure resolver against the oracle ("per key, sort by
//! sequence, keep the last, drop it if it is a delete"): random changes over
//! few keys (to force collisions, duplicates and ties), in a random order, cut
//! into random micro-batches, with state restarts between some of them.

use crate::common;

use common::*;
use proptest::prelude::*;

const CITIES: [&str; 3] = ["Leeds", "York", "Bath"];

fn shuffle<T>(v: &mut [T], mut x: u64) {
    x |= 1;
    for i in (1..v.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(i, (x % (i as u64 + 1)) as usize);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_order_and_batching_gives_the_oracle_table(
        changes in prop::collection::vec((0i64..5, any::<bool>(), 0usize..3, 0i64..6), 1..60),
        order_seed in any::<u64>(),
        cuts in prop::collection::vec(any::<bool>(), 60),
        restarts in prop::collection::vec(any::<bool>(), 60),
    ) {
        let flow = customers();
        let mut evs: Vec<Ev> = changes
            .iter()
            .map(|&(k, del, c, s)| if del { d(k, s) } else { u(k, CITIES[c], s) })
            .collect();
        shuffle(&mut evs, order_seed);
        let mut batches: Vec<Vec<Ev>> = vec![Vec::new()];
        for (i, e) in evs.iter().enumerate() {
            batches.last_mut().unwrap().push(*e);
            if cuts[i] && i + 1 < evs.len() {
                batches.push(Vec::new());
            }
        }
        let arrow: Vec<_> = batches.iter().map(|b| batch(&flow, b)).collect();
        let mut sim = Sim::new(flow.clone());
        for (i, b) in arrow.iter().enumerate() {
            sim.apply(b).unwrap();
            if restarts[i] {
                sim.restart();
            }
        }
        prop_assert_eq!(sim.table(), oracle(&flow, &arrow));
        let s = sim.stats;
        prop_assert_eq!(s.rows_in, s.upserts + s.deletes + s.stale + s.duplicates + s.tie_losers);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A batch resolved on two threads (keys split by hash) is resolved
    /// exactly as one pass: the same rows written and removed in the same
    /// order, the same state changes and counts, and the same error.
    #[test]
    fn a_batch_resolved_in_two_halves_is_resolved_as_one_pass(
        earlier in prop::collection::vec((0i64..40, any::<bool>(), 0usize..3, 0i64..8), 0..80),
        changes in prop::collection::vec((0i64..40, any::<bool>(), 0usize..3, 0i64..8), 1..200),
        tie_error in any::<bool>(),
        state_complete in any::<bool>(),
    ) {
        let mut cfg = customers_config();
        if tie_error {
            cfg.on_sequence_tie = autocdc::core::flow::TiePolicy::Error;
        }
        let flow = autocdc::core::flow::Flow::new(cfg).unwrap();
        let evs = |v: &[(i64, bool, usize, i64)]| -> Vec<Ev> {
            v.iter()
                .map(|&(k, del, c, s)| if del { d(k, s) } else { u(k, CITIES[c], s) })
                .collect()
        };
        let mut sim = Sim::new(flow.clone());
        // A rejected earlier batch leaves the state as it was: still a state.
        let _ = sim.apply(&batch(&flow, &evs(&earlier)));
        let codec = autocdc::core::resolve::Codec::new(&flow).unwrap();
        let b = batch(&flow, &evs(&changes));
        let resolve = |halves| {
            let split = autocdc::core::resolve::Split {
                join: &autocdc::core::resolve::Sequential,
                halves,
            };
            autocdc::core::resolve::resolve_as(
                &flow, &codec, &b, &sim.state, state_complete, None, split,
            )
        };
        match (resolve(false), resolve(true)) {
            (Ok(one), Ok(two)) => {
                prop_assert_eq!(&one.inserts, &two.inserts);
                prop_assert_eq!(&one.remove_positions, &two.remove_positions);
                prop_assert_eq!(&one.remove_keys, &two.remove_keys);
                prop_assert_eq!(&one.changes, &two.changes);
                prop_assert_eq!(one.stats, two.stats);
                prop_assert_eq!(&one.fingerprints, &two.fingerprints);
                prop_assert_eq!(&one.hashes, &two.hashes);
            }
            (Err(one), Err(two)) => prop_assert_eq!(one.to_string(), two.to_string()),
            (one, two) => prop_assert!(false, "one pass {:?}, two halves {:?}", one.err(), two.err()),
        }
    }
}

/// A large SCD Type 1 batch goes through `FlowState::plan`, which resolves
/// it on two threads (8,192 rows or more on a machine with two cores): the
/// plan is the single pass's, round after round against the state it left,
/// and a tie under `on_sequence_tie = "error"` names the single pass's row.
#[test]
fn a_large_batch_resolved_on_two_threads_plans_as_one_pass() {
    use autocdc::core::resolve::{self, Codec};
    use autocdc::core::state::Loc;
    use autocdc::table::flow_state::{FlowState, Plan};
    for tie_error in [false, true] {
        let mut cfg = customers_config();
        if tie_error {
            cfg.on_sequence_tie = autocdc::core::flow::TiePolicy::Error;
        }
        let flow = autocdc::core::flow::Flow::new(cfg).unwrap();
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
            let evs: Vec<Ev> = (0..20_000)
                .map(|_| {
                    let (k, s) = (next(3_000) as i64, next(40) as i64 + round as i64 * 20);
                    if next(10) == 0 {
                        d(k, s)
                    } else {
                        u(k, CITIES[next(3) as usize], s)
                    }
                })
                .collect();
            let b = batch(&flow, &evs);
            let split = state.plan(&flow, &codec, &b, round == 0, 1_000, None);
            let FlowState::Keys(index) = &state else {
                panic!("an SCD Type 1 flow")
            };
            let single = resolve::resolve(&flow, &codec, &b, index, round == 0, None);
            let (split, single) = match (split, single) {
                (Ok(Plan::Keys(split)), Ok(single)) => (split, single),
                (Err(a), Err(b)) => {
                    assert!(tie_error, "only ties are refused here: {a}");
                    assert_eq!(a.to_string(), b.to_string());
                    break;
                }
                (a, b) => panic!("two threads {:?}, one pass {:?}", a.err(), b.err()),
            };
            assert_eq!(split.inserts, single.inserts, "round {round}");
            assert_eq!(split.remove_positions, single.remove_positions);
            assert_eq!(split.remove_keys, single.remove_keys);
            assert_eq!(split.changes, single.changes);
            assert_eq!(split.stats, single.stats);
            assert!(
                split.stats.ties > 0 && split.stats.stale > 0,
                "{:?}",
                split.stats
            );
            let id = state.files_mut().intern(file);
            let locs: Vec<Loc> = (0..split.inserts.len() as u32)
                .map(|pos| Loc { file: id, pos })
                .collect();
            state.apply(&flow, Plan::Keys(split), &locs, 1_000, 0);
        }
    }
}
