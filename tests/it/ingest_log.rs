//! The ingest-log seam: the service runs on any `IngestLog` a `LogFactory`
//! gives it. Here an in-memory log, written in this test as a broker-backed
//! log would be, carries a flow through HTTP pushes, idempotent retries,
//! commits and a restart on the same log.

use crate::common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use autocdc::Result;
use autocdc::fault::Faults;
use autocdc::service::run;
use autocdc::service::wal::{Appended, IngestLog, LogFactory, LogStats, Record};
use bytes::Bytes;
use common::http::*;
use common::*;

/// A log in memory: offsets from 1, idempotency keys remembered forever,
/// released records dropped.
#[derive(Debug, Default)]
struct MemoryLog {
    inner: Mutex<MemoryInner>,
    /// Other processes append too (`append_elsewhere`): `stats` tells only
    /// what this process appended or replayed, as on a broker.
    shared: bool,
}

#[derive(Debug, Default)]
struct MemoryInner {
    records: Vec<Record>,
    next: i64,
    keys: HashMap<String, i64>,
    released: i64,
    /// The last offset this process appended or replayed.
    seen: i64,
}

impl MemoryLog {
    /// Another process appends `record`'s payload: this one does not see it
    /// until it replays.
    async fn append_elsewhere(&self, record: &Record) -> i64 {
        let seen = self.inner.lock().unwrap().seen;
        let appended = self
            .append(
                record.key.clone(),
                record.payload.clone(),
                record.appended_ms,
            )
            .await
            .unwrap();
        self.inner.lock().unwrap().seen = seen;
        appended.offset
    }
}

#[async_trait::async_trait]
impl IngestLog for MemoryLog {
    async fn append(&self, key: Option<String>, payload: Bytes, now_ms: i64) -> Result<Appended> {
        let mut g = self.inner.lock().unwrap();
        if let Some(&offset) = key.as_ref().and_then(|k| g.keys.get(k)) {
            return Ok(Appended {
                offset,
                duplicate: true,
            });
        }
        g.next = g.next.max(g.released) + 1;
        let offset = g.next;
        if let Some(k) = &key {
            g.keys.insert(k.clone(), offset);
        }
        g.records.push(Record {
            offset,
            key,
            appended_ms: now_ms,
            payload,
        });
        g.seen = offset;
        Ok(Appended {
            offset,
            duplicate: false,
        })
    }

    async fn replay(&self, after: i64) -> Result<Vec<Record>> {
        let mut g = self.inner.lock().unwrap();
        g.seen = g.seen.max(g.next);
        Ok(g.records
            .iter()
            .filter(|r| r.offset > after)
            .cloned()
            .collect())
    }

    async fn release(&self, offset: i64, _keep_after_ms: i64) -> Result<()> {
        let mut g = self.inner.lock().unwrap();
        g.records.retain(|r| r.offset > offset);
        g.released = g.released.max(offset);
        Ok(())
    }

    fn stats(&self) -> LogStats {
        let g = self.inner.lock().unwrap();
        let last = if self.shared { g.seen } else { g.next };
        LogStats {
            next_offset: last.max(g.released) + 1,
            bytes: g.records.iter().map(|r| r.payload.len() as u64).sum(),
            ..LogStats::default()
        }
    }

    async fn last_offset(&self) -> Result<i64> {
        let g = self.inner.lock().unwrap();
        Ok(g.next.max(g.released))
    }

    fn shared(&self) -> bool {
        self.shared
    }
}

/// One `MemoryLog` per flow, kept across service restarts.
#[derive(Default)]
struct MemoryLogs {
    logs: Mutex<HashMap<String, Arc<MemoryLog>>>,
    /// The logs are shared with other processes.
    shared: bool,
}

impl MemoryLogs {
    fn log(&self, flow: &str) -> Arc<MemoryLog> {
        self.logs
            .lock()
            .unwrap()
            .entry(flow.to_string())
            .or_insert_with(|| {
                Arc::new(MemoryLog {
                    shared: self.shared,
                    ..MemoryLog::default()
                })
            })
            .clone()
    }
}

#[async_trait::async_trait]
impl LogFactory for MemoryLogs {
    async fn identity(&self, flow: &str, _recorded: &[String]) -> Result<String> {
        Ok(format!("memory-{flow}"))
    }

    async fn open(
        &self,
        flow: &str,
        _committed: i64,
        _max_bytes: u64,
    ) -> Result<Arc<dyn IngestLog>> {
        Ok(self.log(flow))
    }
}

#[test]
fn the_service_runs_on_an_in_memory_log() {
    rt().block_on(async {
        let tmp = tempfile::tempdir().unwrap();
        let logs = Arc::new(MemoryLogs::default());
        let cfg = config(tmp.path(), vec![flow_cfg("m", "1h")]);
        let client = reqwest::Client::new();
        let first = [u(1, "Oslo", 1), u(2, "Rome", 1), d(1, 2)];
        let second = [u(2, "Lima", 3), u(3, "Kyiv", 1)];

        let r = run::start_with_logs(cfg.clone(), Arc::new(Faults::default()), logs.clone())
            .await
            .unwrap();
        let changes = url(&r, "/v1/flows/m/changes");
        let (s, a) = post(
            &client,
            &changes,
            "application/x-ndjson",
            ndjson(&first),
            Some("k1"),
        )
        .await;
        assert_eq!(s, 202, "{a}");
        // A retry with the same key is answered from the log, not appended.
        let (s, again) = post(
            &client,
            &changes,
            "application/x-ndjson",
            ndjson(&first),
            Some("k1"),
        )
        .await;
        assert_eq!(s, 202, "{again}");
        assert_eq!(again["duplicate"], true, "{again}");
        assert_eq!(again["offset"], a["offset"]);
        assert_eq!(logs.log("m").replay(0).await.unwrap().len(), 1);
        commit(&client, &r, "m").await;
        assert_eq!(table(tmp.path(), "m").await, expected(&first));
        // Committed records are released from the log (after the commit).
        let mut released = false;
        for _ in 0..100 {
            released = logs.log("m").replay(0).await.unwrap().is_empty();
            if released {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert!(released, "the committed record is still in the log");
        // The service kept no log of its own.
        assert!(!tmp.path().join("data/flows/m/wal").exists());
        r.stop().await.unwrap();

        // A restart on the same log resumes after the committed offset.
        let r = run::start_with_logs(cfg, Arc::new(Faults::default()), logs.clone())
            .await
            .unwrap();
        let changes = url(&r, "/v1/flows/m/changes");
        let (s, b) = post(
            &client,
            &changes,
            "application/x-ndjson",
            ndjson(&second),
            Some("k2"),
        )
        .await;
        assert_eq!(s, 202, "{b}");
        assert!(b["offset"].as_i64() > a["offset"].as_i64(), "{a} {b}");
        commit(&client, &r, "m").await;
        let all: Vec<_> = first.iter().chain(&second).copied().collect();
        assert_eq!(table(tmp.path(), "m").await, expected(&all));
        r.stop().await.unwrap();
    });
}

/// Regression (the cluster chaos run): on a shared log `POST /commit` took
/// the log's end from this instance's own view, so it answered before a
/// batch another instance had acknowledged after this one's last commit.
#[test]
fn commit_waits_for_what_other_instances_appended_to_a_shared_log() {
    rt().block_on(async {
        let client = reqwest::Client::new();
        let first = [u(1, "Oslo", 1), u(2, "Rome", 1)];
        let second = [u(2, "Lima", 3), u(3, "Kyiv", 1)];
        // The record another instance appends: `second` as a service logs it.
        let elsewhere = tempfile::tempdir().unwrap();
        let scratch = Arc::new(MemoryLogs::default());
        let r = run::start_with_logs(
            config(elsewhere.path(), vec![flow_cfg("m", "1h")]),
            Arc::new(Faults::default()),
            scratch.clone(),
        )
        .await
        .unwrap();
        let changes = url(&r, "/v1/flows/m/changes");
        let (s, b) = post(
            &client,
            &changes,
            "application/x-ndjson",
            ndjson(&second),
            Some("k2"),
        )
        .await;
        assert_eq!(s, 202, "{b}");
        let record = scratch.log("m").replay(0).await.unwrap().remove(0);
        r.stop().await.unwrap();

        let tmp = tempfile::tempdir().unwrap();
        let logs = Arc::new(MemoryLogs {
            shared: true,
            ..MemoryLogs::default()
        });
        let r = run::start_with_logs(
            config(tmp.path(), vec![flow_cfg("m", "1h")]),
            Arc::new(Faults::default()),
            logs.clone(),
        )
        .await
        .unwrap();
        let changes = url(&r, "/v1/flows/m/changes");
        let (s, a) = post(
            &client,
            &changes,
            "application/x-ndjson",
            ndjson(&first),
            Some("k1"),
        )
        .await;
        assert_eq!(s, 202, "{a}");
        assert_eq!(commit(&client, &r, "m").await["offset"], 1);
        // Another instance appends `second` after this one committed; this
        // one has not replayed it.
        assert_eq!(logs.log("m").append_elsewhere(&record).await, 2);
        assert_eq!(
            logs.log("m").stats().next_offset,
            2,
            "the test's view must lag"
        );
        let done = commit(&client, &r, "m").await;
        assert_eq!(done["offset"], 2, "{done}");
        let all: Vec<_> = first.iter().chain(&second).copied().collect();
        assert_eq!(table(tmp.path(), "m").await, expected(&all));
        r.stop().await.unwrap();
    });
}
