//! Property test of the pure resolver against the oracle ("per key, sort by
//! sequence, keep the last, drop it if it is a delete"): random changes over
//! few keys (to force collisions, duplicates and ties), in a random order, cut
//! into random micro-batches, with state restarts between some of them.

mod common;

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
