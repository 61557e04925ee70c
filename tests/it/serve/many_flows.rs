//! Many flows on one instance: more flows committing at once than the
//! runtime has blocking threads, and more flows than the process may open
//! files; every flow's rows committed, and recovered after a restart.

use crate::common;

use std::time::Duration;

use common::http::*;
use common::*;
use futures::StreamExt;

/// The runtime `autocdc serve` runs on, with fewer blocking threads (16
/// here, 64 there) so that a few dozen flows are "many".
fn small_blocking_rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(16)
        .enable_all()
        .build()
        .unwrap()
}

/// Pushes `evs` to every flow, 32 requests at a time (`?wait=commit` when
/// `wait`), and returns how many were answered with a success.
async fn push_all(r: &run::Running, names: &[String], evs: &[Ev], wait: bool) -> usize {
    let c = reqwest::Client::new();
    let body = ndjson(evs);
    let q = if wait { "?wait=commit" } else { "" };
    futures::stream::iter(names)
        .map(|n| {
            let (c, body) = (c.clone(), body.clone());
            let url = url(r, &format!("/v1/flows/{n}/changes{q}"));
            async move {
                let (s, v) = post(&c, &url, "application/x-ndjson", body, None).await;
                assert!(s == 200 || s == 202, "{n}: {s} {v}");
            }
        })
        .buffer_unordered(32)
        .count()
        .await
}

use autocdc::service::run;

/// Regression: each commit ran under `block_in_place`, taking a thread of
/// the runtime's bounded blocking pool and waiting there for its file I/O,
/// which needs a thread of the same pool: with more flows committing at
/// once than the pool had threads, every thread waited and nothing moved.
#[test]
fn more_flows_committing_at_once_than_blocking_threads_all_commit() {
    let tmp = tempfile::tempdir().unwrap();
    small_blocking_rt().block_on(async {
        let names: Vec<String> = (0..48).map(|i| format!("f{i:02}")).collect();
        let flows = names.iter().map(|n| flow_cfg(n, "1h")).collect();
        let r = start(config(tmp.path(), flows)).await;
        let evs = [u(1, "Leeds", 1), u(2, "York", 1)];
        let pushed =
            tokio::time::timeout(Duration::from_secs(120), push_all(&r, &names, &evs, true))
                .await
                .expect("the commits did not finish in 120 s");
        assert_eq!(pushed, names.len());
        r.stop().await.unwrap();
        for n in [&names[0], &names[47]] {
            assert_eq!(table(tmp.path(), n).await, expected(&evs), "{n}");
        }
    });
}

/// 1,100 flows under an open-file limit of 1,024 (where one file per flow
/// ran out at the 1,013th): every flow's rows committed, and after a
/// restart every flow recovered and took a second batch.
#[test]
fn more_flows_than_open_files_commit_and_recover() {
    let limit = 1024;
    // This test's own process: nextest runs each test in a process of its own.
    let lim = libc::rlimit {
        rlim_cur: limit,
        rlim_max: limit,
    };
    // SAFETY: setrlimit reads the struct it is given.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
    let tmp = tempfile::tempdir().unwrap();
    common::rt().block_on(async {
        let names: Vec<String> = (0..1100).map(|i| format!("f{i:04}")).collect();
        let flows = || names.iter().map(|n| flow_cfg(n, "1s")).collect();
        let r = start(config(tmp.path(), flows())).await;
        let first = [u(1, "Leeds", 1)];
        assert_eq!(push_all(&r, &names, &first, false).await, names.len());
        let fds = std::fs::read_dir("/proc/self/fd").unwrap().count();
        assert!(fds < 900, "{fds} files open with {} flows", names.len());
        r.stop().await.unwrap();

        let r = start(config(tmp.path(), flows())).await;
        let c = reqwest::Client::new();
        for n in names.iter().step_by(100) {
            let st = flow_status(&c, &r, n).await;
            assert_eq!(st["status"]["committed_offset"], 1, "{n}: {st}");
        }
        let second = [u(2, "York", 2)];
        assert_eq!(push_all(&r, &names, &second, true).await, names.len());
        r.stop().await.unwrap();
        let both: Vec<Ev> = first.iter().chain(&second).copied().collect();
        for n in names.iter().step_by(100) {
            assert_eq!(table(tmp.path(), n).await, expected(&both), "{n}");
        }
    });
}
