//! Several flows into one target (Spark-parity issue, item 5): flows that
//! name one target share its state, each with its own log and offsets, so
//! the change with the highest sequence wins whichever flow brought it;
//! flows that cannot share it are refused wherever they are defined.

use crate::common;

use std::sync::Arc;

use autocdc::core::flow::{Flow, FlowConfig};
use autocdc::error::codes;
use autocdc::fault::Faults;
use autocdc::table::catalog::Catalog;
use autocdc::table::catalog::hadoop::HadoopCatalog;
use autocdc::table::engine::Engine;
use common::http::{config, post, start, table, url};
use common::*;
use serde_json::json;

fn catalog(dir: &std::path::Path) -> Arc<dyn Catalog> {
    Arc::new(HadoopCatalog::new(dir.to_str().unwrap(), None, Arc::new(Faults::default())).unwrap())
}

/// The customers flow under `name`, writing `crm.shared`.
fn shard(name: &str) -> FlowConfig {
    let mut c = customers_config();
    c.name = name.to_string();
    c.target = "crm.shared".to_string();
    c
}

/// Changes split at random between two flows on one target, each flow's
/// share cut into random batches, the flows' batches interleaved at random
/// and either flow restarted at random (a fresh engine, as a new process
/// opens it): the table is always the one a single flow makes of all the
/// changes. Each flow's engine stays open while the other commits, so most
/// commits find the state moved on and resolve again.
#[test]
fn two_flows_on_one_target_give_the_single_flow_table_in_any_interleaving() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let rt = rt();
    let mut runner = TestRunner::new(Config {
        cases: 32,
        ..Config::default()
    });
    let strategy = (
        prop::collection::vec(
            (0i64..4, any::<bool>(), 0usize..3, 0i64..6, any::<bool>()),
            1..20,
        ),
        prop::collection::vec(any::<bool>(), 20),
        prop::collection::vec(any::<bool>(), 40),
        prop::collection::vec(0u8..8, 40),
    );
    let (a, b) = (
        Flow::new(shard("shard_a")).unwrap(),
        Flow::new(shard("shard_b")).unwrap(),
    );
    runner
        .run(&strategy, |(changes, cuts, order, restarts)| {
            let cities = ["Leeds", "York", "Bath"];
            let mut evs: [Vec<Ev>; 2] = [Vec::new(), Vec::new()];
            let mut cut: [Vec<bool>; 2] = [Vec::new(), Vec::new()];
            for (i, &(k, del, c, s, second)) in changes.iter().enumerate() {
                evs[second as usize].push(if del { d(k, s) } else { u(k, cities[c], s) });
                cut[second as usize].push(cuts[i]);
            }
            let flows = [&a, &b];
            let batches: Vec<Vec<_>> = (0..2)
                .map(|f| cut_batches(flows[f], &evs[f], &cut[f]))
                .map(|bs| bs.into_iter().filter(|b| b.num_rows() > 0).collect())
                .collect();
            let all: Vec<_> = batches.iter().flatten().cloned().collect();
            let tmp = tempfile::tempdir().unwrap();
            let got = rt.block_on(async {
                let cat = catalog(tmp.path());
                let mut engines = [open_engine(&cat, &a).await, open_engine(&cat, &b).await];
                let mut next = [0usize, 0];
                let mut step = 0;
                while next[0] < batches[0].len() || next[1] < batches[1].len() {
                    let f = match (next[0] < batches[0].len(), next[1] < batches[1].len()) {
                        (true, true) => order[step % order.len()] as usize,
                        (true, false) => 0,
                        _ => 1,
                    };
                    engines[f]
                        .apply(&batches[f][next[f]], step as i64)
                        .await
                        .unwrap();
                    next[f] += 1;
                    // 0 and 1: that flow restarts.
                    if let r @ (0 | 1) = restarts[step % restarts.len()] as usize {
                        engines[r] = open_engine(&cat, flows[r]).await;
                    }
                    step += 1;
                }
                // Each engine's own view may be older than the other's
                // last commit: read the table as each flow opens it again.
                let a_rows = table_rows(&open_engine(&cat, &a).await).await;
                let b_rows = table_rows(&open_engine(&cat, &b).await).await;
                assert_eq!(a_rows, b_rows, "both flows read one table");
                a_rows
            });
            prop_assert_eq!(got, oracle(&a, &all));
            Ok(())
        })
        .unwrap();
}

/// One flow's commit does not hold back the other's offsets: each flow's
/// log offset is kept in every snapshot, whichever flow made it, so a
/// restarted flow replays only what it had not committed.
#[test]
fn each_flow_sharing_a_target_keeps_its_own_offset() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let cat = catalog(tmp.path());
        let (a, b) = (
            Flow::new(shard("shard_a")).unwrap(),
            Flow::new(shard("shard_b")).unwrap(),
        );
        let log = |id: &str| autocdc::core::offsets::LogRef {
            id: id.to_string(),
            retention_ms: 7 * 24 * 3600 * 1000,
            adopt: false,
        };
        let open = |f: &Flow, l: &str| {
            Engine::open_for_log(
                f.clone(),
                cat.clone(),
                Arc::new(Faults::default()),
                Some(log(l)),
            )
        };
        let mut ea = open(&a, "log-a").await.unwrap();
        let mut eb = open(&b, "log-b").await.unwrap();
        ea.apply_at(&batch(&a, &[u(1, "Leeds", 1)]), 1, 7)
            .await
            .unwrap();
        eb.apply_at(&batch(&b, &[u(2, "York", 1)]), 2, 3)
            .await
            .unwrap();
        ea.apply_at(&batch(&a, &[u(2, "Bath", 2)]), 3, 9)
            .await
            .unwrap();
        for (f, l, want) in [(&a, "log-a", 9), (&b, "log-b", 3)] {
            let (offset, _) = Engine::committed_offset(f, cat.as_ref(), &log(l))
                .await
                .unwrap();
            assert_eq!(offset, want, "{l}");
            assert_eq!(open(f, l).await.unwrap().summary().input_offset, want);
        }
        assert_eq!(
            table_rows(&ea).await,
            expected_rows(&[u(1, "Leeds", 1), u(2, "York", 1), u(2, "Bath", 2)])
        );
    });
}

/// A flow whose view is older than the catalog's `previous-versions-max`
/// (20) commits of the other: the metadata file after its base was deleted
/// since, so making it "only if absent" succeeded and the commit landed on
/// a version no reader reads (found measuring two flows in turn under
/// `serve`: a flow's acknowledged, "committed" batches were not in the
/// table). The commit now finds the table moved, reloads and goes again.
#[test]
fn a_flow_many_commits_behind_the_other_still_lands_its_commit() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let cat = catalog(tmp.path());
        let (a, b) = (
            Flow::new(shard("shard_a")).unwrap(),
            Flow::new(shard("shard_b")).unwrap(),
        );
        let mut eb = open_engine(&cat, &b).await;
        let mut all = vec![u(1, "Leeds", 1)];
        eb.apply(&batch(&b, &all), 1).await.unwrap();
        let mut ea = open_engine(&cat, &a).await;
        for i in 0..25 {
            let e = u(100 + i, "York", 1);
            ea.apply(&batch(&a, &[e]), 2).await.unwrap();
            all.push(e);
        }
        let late = u(1, "Bath", 2);
        let r = eb.apply(&batch(&b, &[late]), 3).await.unwrap();
        all.push(late);
        assert!(r.commit_retries > 0, "{r:?}");
        let id = r.snapshot_id.expect("a snapshot");
        let fresh = open_engine(&cat, &a).await;
        assert!(
            fresh.target().metadata.snapshot_by_id(id).is_some(),
            "the late flow's snapshot is in the table"
        );
        assert_eq!(table_rows(&fresh).await, expected_rows(&all));
    });
}

fn expected_rows(evs: &[Ev]) -> std::collections::BTreeSet<Vec<String>> {
    let f = customers();
    oracle(&f, &[batch(&f, evs)])
}

/// A second definition that cannot share the first's target, and why.
struct Unshareable {
    what: &'static str,
    change: fn(&mut FlowConfig),
    /// The code the engine answers when the definitions meet only in the
    /// catalog; None when only the definitions tell (the tie rule).
    engine_code: Option<&'static str>,
}

const UNSHAREABLE: &[Unshareable] = &[
    Unshareable {
        what: "other keys",
        change: |c| c.keys = vec!["id".into(), "city".into()],
        engine_code: Some(codes::KEY_SCHEMA_DRIFT),
    },
    Unshareable {
        what: "SCD Type 2",
        change: |c| c.stored_as_scd_type = 2,
        engine_code: Some(codes::SCHEMA_DRIFT),
    },
    Unshareable {
        what: "from_snapshot",
        change: |c| {
            c.from_snapshot = true;
            c.sequence_by = Default::default();
            c.apply_as_deletes = None;
        },
        engine_code: None,
    },
    Unshareable {
        what: "partitioned otherwise",
        change: |c| c.partition_by = vec!["bucket[4](id)".into()],
        engine_code: Some(codes::TARGET_IN_USE),
    },
    Unshareable {
        what: "other table properties",
        change: |c| {
            c.table_properties
                .insert("write.parquet.compression-codec".into(), "zstd".into());
        },
        engine_code: Some(codes::TARGET_IN_USE),
    },
    Unshareable {
        what: "another tie rule",
        change: |c| c.on_sequence_tie = autocdc::core::flow::TiePolicy::Error,
        engine_code: None,
    },
];

/// Flows that cannot share a target (other keys, another SCD type or
/// partitioning, a from_snapshot flow, ...) are refused wherever they meet:
/// in one configuration file (`autocdc apply`, `serve`), and in the catalog
/// (an engine opened on a target another flow writes); the first flow's
/// table is left as it was.
#[test]
fn flows_that_cannot_share_a_target_are_refused_and_change_nothing() {
    let rt = rt();
    for case in UNSHAREABLE {
        let first = shard("shard_a");
        let mut second = shard("shard_b");
        (case.change)(&mut second);
        let Ok(second_flow) = Flow::new(second.clone()) else {
            panic!("{}: the second definition is valid alone", case.what);
        };
        let config = autocdc::config::Config {
            flows: vec![first.clone(), second.clone()],
            ..autocdc::config::Config::from_toml("").unwrap()
        };
        for e in [
            config.flows().unwrap_err(),
            config.flow("shard_b").unwrap_err(),
            config.flow("shard_a").unwrap_err(),
        ] {
            assert_eq!(e.code(), codes::TARGET_IN_USE, "{}: {e}", case.what);
            assert!(e.to_string().contains("crm.shared"), "{e}");
        }
        let Some(code) = case.engine_code else {
            continue;
        };
        let tmp = tempfile::tempdir().unwrap();
        rt.block_on(async {
            let cat = catalog(tmp.path());
            let a = Flow::new(first.clone()).unwrap();
            let mut engine = open_engine(&cat, &a).await;
            engine
                .apply(&batch(&a, &[u(1, "Leeds", 1), u(2, "York", 1)]), 1)
                .await
                .unwrap();
            let want = table_rows(&engine).await;
            let snaps = engine.target().metadata.snapshots().count();
            let e = Engine::open(
                second_flow.clone(),
                cat.clone(),
                Arc::new(Faults::default()),
            )
            .await
            .err()
            .unwrap_or_else(|| panic!("{}: opened", case.what));
            assert_eq!(e.code(), code, "{}: {e}", case.what);
            assert!(e.to_string().contains("flow `shard_a`"), "{e}");
            let e = Engine::check_target(&second_flow, cat.as_ref())
                .await
                .unwrap_err();
            assert_eq!(e.code(), code, "{}: {e}", case.what);
            let engine = open_engine(&cat, &a).await;
            assert_eq!(engine.target().metadata.snapshots().count(), snaps);
            assert_eq!(table_rows(&engine).await, want, "{}", case.what);
        });
    }
}

/// `serve` with two flows on one target (one per source shard): pushes to
/// either, interleaved and out of order, give one table; a restart keeps it
/// and both flows go on; a third flow that cannot share it is refused.
#[test]
fn serve_runs_two_flows_into_one_target() {
    let rt = rt();
    let tmp = tempfile::tempdir().unwrap();
    rt.block_on(async {
        let c = reqwest::Client::new();
        let cfg = || config(tmp.path(), vec![shard("shard_a"), shard("shard_b")]);
        let pushes: [(&str, Vec<Ev>); 4] = [
            ("shard_a", vec![u(1, "Leeds", 1), u(2, "York", 5)]),
            (
                "shard_b",
                vec![u(1, "Bath", 3), u(2, "Hull", 2), u(3, "Ely", 1)],
            ),
            ("shard_a", vec![d(3, 4), u(1, "Derby", 2)]),
            ("shard_b", vec![u(3, "Wells", 2), d(1, 6)]),
        ];
        let mut all = Vec::new();
        for (i, (flow, evs)) in pushes.iter().enumerate() {
            // A restart before the last push.
            let r = start(cfg()).await;
            let path = format!("/v1/flows/{flow}/changes?wait=commit");
            let (s, v) = post(
                &c,
                &url(&r, &path),
                "application/x-ndjson",
                common::http::ndjson(evs),
                None,
            )
            .await;
            assert_eq!(s, 200, "push {i}: {v}");
            all.extend_from_slice(evs);
            if i + 1 < pushes.len() {
                r.stop().await.unwrap();
                continue;
            }
            // Another flow that cannot share the target: refused, nothing stored.
            let mut other = shard("shard_c");
            other.keys = vec!["id".into(), "city".into()];
            let resp = c
                .put(url(&r, "/v1/flows/shard_c"))
                .json(&other)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status().as_u16(), 400);
            let v: serde_json::Value = resp.json().await.unwrap();
            assert_eq!(v["error"]["code"], json!(codes::TARGET_IN_USE), "{v}");
            r.stop().await.unwrap();
        }
        assert_eq!(table(tmp.path(), "shared").await, expected_rows(&all));
        assert!(!tmp.path().join("data/flows/shard_c/flow.json").exists());
    });
}
