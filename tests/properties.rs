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
