//! Several ingest logs feeding one flow (two `serve` instances on one
//! target): each log's committed offset is its own entry of
//! `autocdc.input-offsets`, so after any interleaving of commits and
//! restarts each log's replay starts right after its own last committed
//! batch, and the table holds every batch once.

use crate::common;

use std::sync::Arc;

use autocdc::core::offsets::LogRef;
use autocdc::fault::Faults;
use autocdc::table::catalog::Catalog;
use autocdc::table::catalog::hadoop::HadoopCatalog;
use autocdc::table::engine::Engine;
use common::*;
use proptest::prelude::*;

fn log(i: usize) -> LogRef {
    LogRef {
        id: format!("log-{i}"),
        retention_ms: i64::MAX,
        adopt: false,
    }
}

async fn open(cat: &Arc<dyn Catalog>, i: usize) -> Engine {
    Engine::open_for_log(
        customers(),
        cat.clone(),
        Arc::new(Faults::default()),
        Some(log(i)),
    )
    .await
    .unwrap()
}

#[derive(Debug, Clone)]
enum Step {
    /// Log `0` commits its next batch.
    Commit(usize),
    /// Log `0`'s process restarts: its engine is opened again.
    Restart(usize),
}

fn step(logs: usize) -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0..logs).prop_map(Step::Commit),
        1 => (0..logs).prop_map(Step::Restart),
    ]
}

const CITIES: [&str; 3] = ["Leeds", "York", "Bath"];

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]
    #[test]
    fn each_log_replays_after_its_own_last_commit(
        logs in 2usize..=3,
        steps in proptest::collection::vec(step(3), 1..14),
    ) {
        let tmp = tempfile::tempdir().unwrap();
        rt().block_on(async {
            let faults = Arc::new(Faults::default());
            let cat: Arc<dyn Catalog> =
                Arc::new(HadoopCatalog::new(tmp.path().to_str().unwrap(), None, faults).unwrap());
            let mut engines = Vec::new();
            for i in 0..logs {
                engines.push(open(&cat, i).await);
            }
            let mut committed = vec![0i64; logs];
            let mut all = Vec::new();
            let mut seq = 0;
            for s in steps {
                match s {
                    Step::Commit(i) if i < logs => {
                        seq += 1;
                        let evs = vec![
                            u(seq % 5, CITIES[i], seq),
                            d((seq + 2) % 5, seq),
                        ];
                        let b = batch(&customers(), &evs);
                        let next = committed[i] + 1;
                        let r = engines[i].apply_at(&b, 0, next).await.unwrap();
                        assert!(r.snapshot_id.is_some());
                        committed[i] = next;
                        all.push(b);
                    }
                    Step::Restart(i) if i < logs => {
                        engines[i] = open(&cat, i).await;
                    }
                    _ => {}
                }
                // Each log, opened now, resumes after its own last batch.
                for (i, &want) in committed.iter().enumerate() {
                    assert_eq!(open(&cat, i).await.summary().input_offset, want, "log {i}");
                }
            }
            let e = open(&cat, 0).await;
            assert_eq!(table_rows(&e).await, oracle(&customers(), &all));
        });
    }
}

/// A target last written before per-log offsets (only the single
/// `autocdc.input-offset`) is read as the offset of whichever log opens it
/// first, and from its next commit on each log has its own entry.
#[test]
fn a_single_offset_summary_is_adopted_by_the_log_that_reads_it() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let faults = Arc::new(Faults::default());
        let cat: Arc<dyn Catalog> = Arc::new(
            HadoopCatalog::new(tmp.path().to_str().unwrap(), None, faults.clone()).unwrap(),
        );
        // `autocdc apply` (no log) writes the single offset only.
        let mut plain = Engine::open(customers(), cat.clone(), faults.clone())
            .await
            .unwrap();
        plain
            .apply_at(&batch(&customers(), &[u(1, "Leeds", 1)]), 0, 4)
            .await
            .unwrap();
        let t = cat.load_table(&customers().target).await.unwrap().unwrap();
        let props = &t
            .metadata
            .current_snapshot()
            .unwrap()
            .summary()
            .additional_properties;
        assert_eq!(
            props.get("autocdc.input-offset").map(String::as_str),
            Some("4")
        );
        assert!(!props.contains_key("autocdc.input-offsets"));
        let mut a = open(&cat, 0).await;
        assert_eq!(a.summary().input_offset, 4);
        a.apply_at(&batch(&customers(), &[u(2, "York", 2)]), 0, 5)
            .await
            .unwrap();
        assert_eq!(open(&cat, 0).await.summary().input_offset, 5);
        // Another log does not take log 0's offset.
        assert_eq!(open(&cat, 1).await.summary().input_offset, 0);
        let t = cat.load_table(&customers().target).await.unwrap().unwrap();
        let props = &t
            .metadata
            .current_snapshot()
            .unwrap()
            .summary()
            .additional_properties;
        let map: serde_json::Value = serde_json::from_str(&props["autocdc.input-offsets"]).unwrap();
        assert_eq!(map["log-0"]["offset"], 5, "{map}");
    });
}
