//! Committing what was acknowledged: backpressure (429), recovery from
//! the log after a crash, commits refused or failing, the commit cadence,
//! the log's bounds, and maintenance and compaction between commits.

use crate::common;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use autocdc::fault::Faults;
use autocdc::service::run;
use common::http::*;
use common::*;
use serde_json::Value;

#[test]
fn over_the_uncommitted_cap_pushes_get_429_with_retry_after() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let mut f = flow_cfg("c", "1h");
        f.max_uncommitted_bytes = Some(100);
        let r = start(config(tmp.path(), vec![f])).await;
        let c = reqwest::Client::new();
        let changes = url(&r, "/v1/flows/c/changes");
        let body = arrow_body(&[u(1, "Leeds", 1), u(2, "York", 1)]);
        let (s, _) = post(
            &c,
            &changes,
            "application/vnd.apache.arrow.stream",
            body.clone(),
            None,
        )
        .await;
        assert_eq!(s, 202);
        let resp = c
            .post(&changes)
            .header("content-type", "application/vnd.apache.arrow.stream")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 429);
        assert!(resp.headers().get("retry-after").is_some());
        // After a commit there is room again.
        commit(&c, &r, "c").await;
        let (s, _) = post(
            &c,
            &changes,
            "application/vnd.apache.arrow.stream",
            body,
            None,
        )
        .await;
        assert_eq!(s, 202);
        r.stop().await.unwrap();
    });
}

/// Acknowledged batches survive a crash (the process dies before any
/// commit): the restarted service replays its log and commits them; a
/// client retrying with its key gets the same offset.
#[test]
fn acknowledged_batches_survive_a_crash_before_commit() {
    let tmp = tempfile::tempdir().unwrap();
    let evs = CUSTOMERS_EVENTS;
    let mut offsets = Vec::new();
    {
        let rt = rt();
        rt.block_on(async {
            let r = start(config(tmp.path(), vec![flow_cfg("c", "1h")])).await;
            let c = reqwest::Client::new();
            for (i, e) in evs.iter().enumerate() {
                let (s, v) = post(
                    &c,
                    &url(&r, "/v1/flows/c/changes"),
                    "application/x-ndjson",
                    ndjson(&[*e]),
                    Some(&format!("k{i}")),
                )
                .await;
                assert_eq!(s, 202);
                offsets.push(v["offset"].as_i64().unwrap());
            }
            std::mem::forget(r);
        });
        // Dropping the runtime kills every task: no shutdown, no commit.
    }
    assert!(table_blocking(tmp.path()).is_empty());
    rt().block_on(async {
        let r = start(config(tmp.path(), vec![flow_cfg("c", "1h")])).await;
        let c = reqwest::Client::new();
        let (_, v) = post(
            &c,
            &url(&r, "/v1/flows/c/changes"),
            "application/x-ndjson",
            ndjson(&evs[2..3]),
            Some("k2"),
        )
        .await;
        assert_eq!(v["offset"].as_i64(), Some(offsets[2]));
        commit(&c, &r, "c").await;
        assert_eq!(table(tmp.path(), "c").await, expected(&evs));
        // A graceful stop commits what is pending.
        let (s, _) = post(
            &c,
            &url(&r, "/v1/flows/c/changes"),
            "application/x-ndjson",
            ndjson(&[u(9, "Ripon", 1)]),
            None,
        )
        .await;
        assert_eq!(s, 202);
        r.stop().await.unwrap();
        let mut all = evs.to_vec();
        all.push(u(9, "Ripon", 1));
        assert_eq!(table(tmp.path(), "c").await, expected(&all));
    });
}

fn table_blocking(dir: &Path) -> BTreeSet<Vec<String>> {
    rt().block_on(table(dir, "c"))
}

/// With `on_sequence_tie = "error"`, two batches that are each valid can
/// tie with each other. Both were acknowledged; at commit the later one is
/// rejected and reported, and the flow goes on.
#[test]
fn a_tie_found_at_commit_rejects_only_the_later_batch() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let mut f = flow_cfg("c", "1h");
        f.on_sequence_tie = autocdc::core::flow::TiePolicy::Error;
        let r = start(config(tmp.path(), vec![f])).await;
        let c = reqwest::Client::new();
        let changes = url(&r, "/v1/flows/c/changes");
        for evs in [
            vec![u(1, "Leeds", 5), u(2, "York", 1)],
            vec![u(1, "Denver", 5)],
            vec![u(3, "Bath", 1)],
        ] {
            let (s, _) = post(&c, &changes, "application/x-ndjson", ndjson(&evs), None).await;
            assert_eq!(s, 202);
        }
        commit(&c, &r, "c").await;
        assert_eq!(
            table(tmp.path(), "c").await,
            rows(&[
                &["1", "Leeds", "5"],
                &["2", "York", "1"],
                &["3", "Bath", "1"]
            ])
        );
        let st = flow_status(&c, &r, "c").await;
        assert_eq!(st["status"]["rejected_at_commit"], 1, "{st}");
        let why = st["status"]["last_rejection"].as_str().unwrap();
        assert!(
            why.contains("offset 2") && why.contains("SEQUENCE_TIE"),
            "{why}"
        );
        assert_eq!(st["status"]["degraded"], false);
        r.stop().await.unwrap();
    });
}

/// Commits that fail are retried with backoff; meanwhile pushes are still
/// accepted and /readyz says degraded; then everything is committed.
#[test]
fn failing_commits_are_retried_and_readyz_says_degraded() {
    use autocdc::fault::FaultPoint;
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let faults = Arc::new(Faults::default());
        for nth in 0..3 {
            faults.arm(FaultPoint::AfterStateCommit, nth);
        }
        let r = run::start(config(tmp.path(), vec![flow_cfg("c", "20ms")]), faults)
            .await
            .unwrap();
        let c = reqwest::Client::new();
        let changes = url(&r, "/v1/flows/c/changes");
        let (s, _) = post(
            &c,
            &changes,
            "application/x-ndjson",
            ndjson(&CUSTOMERS_EVENTS[..3]),
            None,
        )
        .await;
        assert_eq!(s, 202);
        let mut degraded = false;
        for _ in 0..300 {
            let resp = c.get(url(&r, "/readyz")).send().await.unwrap();
            if resp.status().as_u16() == 503 {
                let v: Value = resp.json().await.unwrap();
                assert_eq!(v["status"], "degraded");
                degraded = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert!(degraded, "readyz never reported the failing commits");
        // Ingestion goes on while commits fail.
        let (s, _) = post(
            &c,
            &changes,
            "application/x-ndjson",
            ndjson(&CUSTOMERS_EVENTS[3..]),
            None,
        )
        .await;
        assert_eq!(s, 202);
        let v = commit(&c, &r, "c").await;
        assert!(
            v["snapshot_id"].as_i64().is_some() || v["offset"] == 2,
            "{v}"
        );
        let mut ready = false;
        for _ in 0..300 {
            if c.get(url(&r, "/readyz"))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
                == 200
            {
                ready = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(ready);
        assert_eq!(table(tmp.path(), "c").await, expected(&CUSTOMERS_EVENTS));
        r.stop().await.unwrap();
    });
}

/// Distinct events: key `i % keys`, sequence `i`, a city from a few.
fn events(from: i64, n: i64, keys: i64) -> Vec<Ev> {
    const CITIES: [&str; 4] = ["Leeds", "York", "Bath", "Hull"];
    (from..from + n)
        .map(|i| u(i % keys, CITIES[(i % 4) as usize], i))
        .collect()
}

/// Under a steady load, commits start `commit_interval` apart: the
/// committer does not commit again at once just because something arrived
/// during the last commit.
#[test]
fn under_steady_load_commits_follow_the_interval() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let r = start(config(tmp.path(), vec![flow_cfg("c", "400ms")])).await;
        let c = reqwest::Client::new();
        let changes = url(&r, "/v1/flows/c/changes");
        let started = std::time::Instant::now();
        let mut all = Vec::new();
        let mut i = 0;
        while started.elapsed() < std::time::Duration::from_secs(4) {
            let evs = events(i * 5, 5, 50);
            let (s, _) = post(&c, &changes, "application/x-ndjson", ndjson(&evs), None).await;
            assert_eq!(s, 202);
            all.extend(evs);
            i += 1;
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let elapsed = started.elapsed().as_secs_f64();
        let st = flow_status(&c, &r, "c").await;
        let commits = st["status"]["commits"].as_u64().unwrap();
        // At most one commit per interval (plus the first tick's slack); the
        // pushes alone (hundreds) would have driven many more before.
        let most = (elapsed / 0.4).ceil() as u64 + 1;
        assert!(
            (2..=most).contains(&commits),
            "{commits} commits in {elapsed:.1} s at a 400 ms interval over {i} pushes"
        );
        assert!(
            st["status"]["recent_commit_ms_p50"].as_f64().is_some(),
            "{st}"
        );
        commit(&c, &r, "c").await;
        assert_eq!(table(tmp.path(), "c").await, expected(&all));
        r.stop().await.unwrap();
    });
}

/// More than one commit's worth waiting is committed at once, commit after
/// commit; less than that waits for the interval (or `/commit`).
#[test]
fn a_commits_worth_pending_is_committed_at_once_and_the_rest_waits() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let mut f = flow_cfg("c", "1h");
        f.commit_max_rows = Some(4);
        let r = start(config(tmp.path(), vec![f])).await;
        let c = reqwest::Client::new();
        let changes = url(&r, "/v1/flows/c/changes");
        let mut all = Vec::new();
        for i in 0..5 {
            let evs = events(i * 2, 2, 100);
            let (s, _) = post(&c, &changes, "application/x-ndjson", ndjson(&evs), None).await;
            assert_eq!(s, 202);
            all.extend(evs);
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let st = loop {
            let st = flow_status(&c, &r, "c").await;
            if st["status"]["applied_offset"] == 4 || std::time::Instant::now() > deadline {
                break st;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        };
        assert_eq!(st["status"]["applied_offset"], 4, "{st}");
        assert_eq!(st["status"]["commits"], 2, "{st}");
        // The fifth batch (2 rows, under commit_max_rows) waits for the hour.
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let st = flow_status(&c, &r, "c").await;
        assert_eq!(st["status"]["pending_batches"], 1, "{st}");
        assert_eq!(commit(&c, &r, "c").await["offset"], 5);
        assert_eq!(table(tmp.path(), "c").await, expected(&all));
        r.stop().await.unwrap();
    });
}

/// `max_log_bytes`: committed records leave the log before their
/// idempotency window ends to keep it under the bound; the shortened window
/// is reported; a retry of a forgotten key is applied again, harmlessly.
#[test]
fn the_log_stays_under_max_log_bytes_and_reports_the_shorter_window() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let mut f = flow_cfg("c", "1h");
        f.max_log_bytes = Some(64 << 10);
        let r = start(config(tmp.path(), vec![f])).await;
        let c = reqwest::Client::new();
        let changes = url(&r, "/v1/flows/c/changes?wait=commit");
        let mut all = Vec::new();
        let mut first = None;
        for i in 0..60 {
            let evs = events(i * 40, 40, 500);
            let (s, body) = post(
                &c,
                &changes,
                "application/x-ndjson",
                ndjson(&evs),
                Some(&format!("k{i}")),
            )
            .await;
            assert_eq!(s, 200, "{body}");
            first.get_or_insert(body);
            all.extend(evs);
            let st = flow_status(&c, &r, "c").await;
            let bytes = st["status"]["wal"]["bytes"].as_u64().unwrap();
            assert!(bytes <= 64 << 10, "log at {bytes} bytes: {st}");
        }
        let st = flow_status(&c, &r, "c").await;
        assert_eq!(st["status"]["wal"]["max_bytes"], 64 << 10, "{st}");
        assert!(
            st["status"]["wal"]["early_released_segments"]
                .as_u64()
                .unwrap()
                > 0,
            "{st}"
        );
        let window = st["status"]["idempotency_window_ms"].as_i64().unwrap();
        assert!(window < 15 * 60 * 1000, "window {window}: {st}");
        // The first key was forgotten early: its retry is appended again and
        // its changes resolve as duplicates.
        let (s, again) = post(
            &c,
            &changes,
            "application/x-ndjson",
            ndjson(&events(0, 40, 500)),
            Some("k0"),
        )
        .await;
        assert_eq!(s, 200, "{again}");
        assert_eq!(again["duplicate"], false, "{again}");
        assert_ne!(again["offset"], first.unwrap()["offset"]);
        assert_eq!(table(tmp.path(), "c").await, expected(&all));
        let metrics = get_text(&c, &r, "/metrics").await;
        for m in [
            "autocdc_wal_max_bytes{flow=\"c\"} 65536",
            "autocdc_wal_early_released_segments_total{flow=\"c\"}",
            "autocdc_idempotency_window_seconds{flow=\"c\"}",
            "autocdc_wal_oldest_record_age_seconds{flow=\"c\"}",
        ] {
            assert!(metrics.contains(m), "{m} missing from\n{metrics}");
        }
        r.stop().await.unwrap();
    });
}

/// When uncommitted records alone fill `max_log_bytes`, pushes get 429 with
/// Retry-After and nothing acknowledged is dropped; a batch over half the
/// bound is refused as too large.
#[test]
fn a_log_full_of_uncommitted_records_answers_429_and_keeps_them() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let mut f = flow_cfg("c", "1h");
        f.max_log_bytes = Some(64 << 10);
        let r = start(config(tmp.path(), vec![f])).await;
        let c = reqwest::Client::new();
        let changes = url(&r, "/v1/flows/c/changes");
        let mut acked = Vec::new();
        let mut refused = None;
        for i in 0..200 {
            let evs = events(i * 40, 40, 500);
            let resp = c
                .post(&changes)
                .header("content-type", "application/x-ndjson")
                .body(ndjson(&evs))
                .send()
                .await
                .unwrap();
            match resp.status().as_u16() {
                202 => acked.extend(evs),
                429 => {
                    assert!(resp.headers().get("retry-after").is_some());
                    refused = Some(resp.text().await.unwrap());
                    break;
                }
                s => panic!("{s}: {}", resp.text().await.unwrap()),
            }
        }
        let refused = refused.expect("the log filled up");
        assert!(refused.contains("max_log_bytes"), "{refused}");
        let st = flow_status(&c, &r, "c").await;
        assert!(
            st["status"]["wal"]["bytes"].as_u64().unwrap() <= 64 << 10,
            "{st}"
        );
        commit(&c, &r, "c").await;
        assert_eq!(table(tmp.path(), "c").await, expected(&acked));
        // After the commit there is room again.
        let (s, _) = post(
            &c,
            &changes,
            "application/x-ndjson",
            ndjson(&events(90_000, 40, 500)),
            None,
        )
        .await;
        assert_eq!(s, 202);
        // One batch over half the bound can never fit: 400, not 429.
        let (s, body) = post(
            &c,
            &changes,
            "application/x-ndjson",
            ndjson(&events(100_000, 2000, 5000)),
            None,
        )
        .await;
        assert_eq!(
            (s, body["error"]["code"].as_str()),
            (400, Some("AUTOCDC_MICROBATCH_VALIDATION.TOO_LARGE")),
            "{body}"
        );
        r.stop().await.unwrap();
    });
}

/// `POST /v1/flows/{flow}/maintain`: a dry run reports and changes nothing,
/// a run expires and says so; the flow's status and `/metrics` show the
/// run and the tables' figures; the table is unchanged.
#[test]
fn the_maintain_endpoint_runs_between_commits_and_reports() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = flow_cfg("c", "1h");
    cfg.snapshot_max_age = Some("1ms".into());
    cfg.min_snapshots_to_keep = Some(1);
    // Expiry alone here (compaction has its own test below).
    cfg.compaction = Some(autocdc::core::flow::CompactionConfig {
        enabled: Some(false),
        ..Default::default()
    });
    rt().block_on(async {
        let r = start(config(tmp.path(), vec![cfg])).await;
        let c = reqwest::Client::new();
        let mut all = Vec::new();
        for i in 0..3 {
            let evs = [u(i, "Leeds", 10 + i), u(100, "York", 10 + i)];
            all.extend(evs);
            let (st, _) = post(
                &c,
                &url(&r, "/v1/flows/c/changes?wait=commit"),
                "application/x-ndjson",
                ndjson(&evs),
                None,
            )
            .await;
            assert_eq!(st, 200);
        }
        let maintain = |dry: bool| {
            let c = c.clone();
            let u = url(&r, &format!("/v1/flows/c/maintain?dry_run={dry}"));
            async move {
                let resp = c.post(u).send().await.unwrap();
                (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
            }
        };
        let (st, dry) = maintain(true).await;
        assert_eq!(st, 200, "{dry}");
        assert_eq!(dry["dry_run"], true);
        assert_eq!(dry["target"]["snapshots_expired"], 2, "{dry}");
        assert_eq!(dry["target_stats"]["snapshots"], 3, "{dry}");
        let (st, wet) = maintain(false).await;
        assert_eq!(st, 200, "{wet}");
        assert_eq!(wet["target"]["snapshots_expired"], 2, "{wet}");
        assert_eq!(wet["target_stats"]["snapshots"], 1, "{wet}");
        assert!(
            wet["target"]["manifest_lists_deleted"].as_u64().unwrap() >= 2,
            "{wet}"
        );
        let status = flow_status(&c, &r, "c").await;
        let m = &status["status"]["maintenance"];
        assert_eq!(m["runs"], 1, "{status}");
        assert_eq!(m["snapshots_expired_total"], 4, "{status}");
        assert!(m["bytes_deleted_total"].as_u64().unwrap() > 0, "{status}");
        let metrics = get_text(&c, &r, "/metrics").await;
        for line in [
            "autocdc_maintenance_runs_total{flow=\"c\"} 1",
            "autocdc_maintenance_last_ok{flow=\"c\"} 1",
            "autocdc_table_snapshots{flow=\"c\",table=\"target\"} 1",
        ] {
            assert!(metrics.contains(line), "no `{line}` in\n{metrics}");
        }
        let resp = c
            .post(url(&r, "/v1/flows/nope/maintain"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 404);
        r.stop().await.unwrap();
        assert_eq!(table(tmp.path(), "c").await, expected(&all));
    });
}

/// Compaction in the service: on the flow's `compaction.interval` between
/// commits (with nobody asking), and when asked through `/maintain`; the
/// status and `/metrics` count it and the table stays right.
#[test]
fn serve_compacts_on_the_flows_interval_and_when_asked() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = flow_cfg("k", "100ms");
    cfg.compaction = Some(autocdc::core::flow::CompactionConfig {
        min_input_files: Some(2),
        interval: Some("1s".into()),
        ..Default::default()
    });
    rt().block_on(async {
        let r = start(config(tmp.path(), vec![cfg])).await;
        let c = reqwest::Client::new();
        let mut all = Vec::new();
        for i in 0..4 {
            let evs = [u(i, "Leeds", 10 + i), u(100, "York", 10 + i)];
            all.extend(evs);
            let (st, _) = post(
                &c,
                &url(&r, "/v1/flows/k/changes?wait=commit"),
                "application/x-ndjson",
                ndjson(&evs),
                None,
            )
            .await;
            assert_eq!(st, 200);
        }
        // The scheduled run: within a few intervals.
        let mut compactions = 0;
        for _ in 0..100 {
            let status = flow_status(&c, &r, "k").await;
            compactions = status["status"]["maintenance"]["compactions"]
                .as_u64()
                .unwrap();
            if compactions > 0 {
                let m = &status["status"]["maintenance"];
                assert!(
                    m["compaction_files_rewritten_total"].as_u64().unwrap() >= 4,
                    "{status}"
                );
                assert!(
                    m["compaction_rows_moved_total"].as_u64().unwrap() >= 5,
                    "{status}"
                );
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        assert_eq!(compactions, 1, "no scheduled compaction");
        // Asked for: more commits, then the endpoint compacts them now.
        for i in 4..7 {
            let evs = [u(i, "Bath", 10 + i), u(100, "Ely", 10 + i)];
            all.extend(evs);
            let (st, _) = post(
                &c,
                &url(&r, "/v1/flows/k/changes?wait=commit"),
                "application/x-ndjson",
                ndjson(&evs),
                None,
            )
            .await;
            assert_eq!(st, 200);
        }
        let resp = c
            .post(url(&r, "/v1/flows/k/maintain"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        let report: Value = resp.json().await.unwrap();
        let comp = &report["compaction"];
        assert!(
            comp["data_files_rewritten"].as_u64().unwrap() >= 2,
            "{report}"
        );
        assert_eq!(comp["data_files_written"], 1, "{report}");
        assert_eq!(report["target_stats"]["data_files"], 1, "{report}");
        assert_eq!(report["target_stats"]["delete_files"], 0, "{report}");
        let metrics = get_text(&c, &r, "/metrics").await;
        assert!(
            metrics.contains("autocdc_compactions_total{flow=\"k\"} 2"),
            "{metrics}"
        );
        r.stop().await.unwrap();
        assert_eq!(table(tmp.path(), "k").await, expected(&all));
    });
}
