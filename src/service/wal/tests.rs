//! The local log against its invariants: order after a reopen, a failed
//! sync rolled back, idempotency keys, a torn tail, release, concurrency.

use std::fs::OpenOptions;

use super::segment::segment_path;
use super::*;
use crate::error::codes;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

#[test]
fn appends_replay_in_order_after_reopen() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let log = LocalLog::open(tmp.path(), 0, 1 << 20, u64::MAX, 8).unwrap();
        for (i, s) in ["a", "b", "c"].iter().enumerate() {
            let a = log.append(None, b(s), 10).await.unwrap();
            assert_eq!(a.offset, i as i64 + 1);
        }
        drop(log);
        let log = LocalLog::open(tmp.path(), 0, 1 << 20, u64::MAX, 8).unwrap();
        let got: Vec<(i64, Bytes)> = log
            .replay(1)
            .await
            .unwrap()
            .into_iter()
            .map(|r| (r.offset, r.payload))
            .collect();
        assert_eq!(got, vec![(2, b("b")), (3, b("c"))]);
        assert_eq!(log.append(None, b("d"), 11).await.unwrap().offset, 4);
    });
}

/// A failed sync (a full disk) refuses the group, leaves nothing of it
/// in the file, keeps the offsets dense and forgets its keys; the next
/// append succeeds by itself, without a restart. Also when the failed
/// group had rolled into new segments.
#[test]
fn a_failed_sync_rolls_back_and_the_log_recovers_by_itself() {
    for segment_bytes in [1 << 20, 1] {
        let tmp = tempfile::tempdir().unwrap();
        rt().block_on(async {
            let faults = Arc::new(crate::fault::Faults::default());
            let log = LocalLog::open_with_faults(
                tmp.path(),
                0,
                segment_bytes,
                u64::MAX,
                8,
                faults.clone(),
            )
            .unwrap();
            log.append(Some("a".into()), b("a"), 1).await.unwrap();
            faults.arm(crate::fault::FaultPoint::LogSync, 0);
            let e = log.append(Some("b".into()), b("b"), 2).await.unwrap_err();
            assert_eq!(e.code(), codes::WAL_WRITE_FAILED, "{e}");
            let st = log.stats();
            assert!(st.failing && st.write_failures == 1, "{st:?}");
            assert_eq!(st.next_offset, 2);
            // The retry is appended (not a duplicate), at the next offset.
            let again = log.append(Some("b".into()), b("b2"), 3).await.unwrap();
            assert_eq!(
                again,
                Appended {
                    offset: 2,
                    duplicate: false
                }
            );
            assert!(!log.stats().failing);
            drop(log);
            let log = LocalLog::open(tmp.path(), 0, segment_bytes, u64::MAX, 8).unwrap();
            let got: Vec<(i64, Bytes)> = log
                .replay(0)
                .await
                .unwrap()
                .into_iter()
                .map(|r| (r.offset, r.payload))
                .collect();
            assert_eq!(got, vec![(1, b("a")), (2, b("b2"))], "{segment_bytes}");
        });
    }
}

/// A segment that cannot be deleted at release is kept and reported;
/// the log goes on (the segments after it used to be forgotten, and the
/// next append panicked the writer: the flow's log was dead).
#[test]
fn a_segment_that_cannot_be_deleted_does_not_break_the_log() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let log = LocalLog::open(tmp.path(), 0, 1, u64::MAX, 8).unwrap();
        for s in ["a", "b", "c"] {
            log.append(None, b(s), 1).await.unwrap();
        }
        // Offset 1's segment becomes a directory that unlink refuses.
        let seg = segment_path(tmp.path(), 1);
        std::fs::remove_file(&seg).unwrap();
        std::fs::create_dir(&seg).unwrap();
        std::fs::write(seg.join("x"), b"x").unwrap();
        assert!(log.release(3, 100).await.is_err());
        let d = log.append(None, b("d"), 2).await.unwrap();
        assert_eq!(d.offset, 4);
        std::fs::remove_dir_all(&seg).unwrap();
        log.release(4, 100).await.unwrap();
        assert_eq!(log.append(None, b("e"), 3).await.unwrap().offset, 5);
        let left: Vec<i64> = log
            .replay(0)
            .await
            .unwrap()
            .iter()
            .map(|r| r.offset)
            .collect();
        assert_eq!(left, vec![5]);
    });
}

#[test]
fn a_retried_key_gets_the_first_offset_and_appends_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let log = LocalLog::open(tmp.path(), 0, 1 << 20, u64::MAX, 8).unwrap();
        let a = log.append(Some("k1".into()), b("x"), 1).await.unwrap();
        let again = log.append(Some("k1".into()), b("x"), 2).await.unwrap();
        assert_eq!(
            again,
            Appended {
                offset: a.offset,
                duplicate: true
            }
        );
        drop(log);
        // Still remembered after a restart.
        let log = LocalLog::open(tmp.path(), 0, 1 << 20, u64::MAX, 8).unwrap();
        let again = log.append(Some("k1".into()), b("x"), 3).await.unwrap();
        assert!(again.duplicate);
        assert_eq!(log.replay(0).await.unwrap().len(), 1);
    });
}

#[test]
fn a_torn_tail_is_cut_and_offsets_continue() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let log = LocalLog::open(tmp.path(), 0, 1 << 20, u64::MAX, 8).unwrap();
        log.append(None, b("one"), 1).await.unwrap();
        log.append(None, b("two"), 1).await.unwrap();
        drop(log);
        // A crash in the middle of the second record's write.
        let seg = segment_path(tmp.path(), 1);
        let len = std::fs::metadata(&seg).unwrap().len();
        OpenOptions::new()
            .write(true)
            .open(&seg)
            .unwrap()
            .set_len(len - 2)
            .unwrap();
        let log = LocalLog::open(tmp.path(), 0, 1 << 20, u64::MAX, 8).unwrap();
        let got = log.replay(0).await.unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].payload, b("one"));
        // Offset 2 was never acknowledged, so it is handed out again.
        assert_eq!(log.append(None, b("two"), 2).await.unwrap().offset, 2);
    });
}

#[test]
fn release_deletes_committed_segments_after_the_window_and_offsets_never_go_back() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        // Tiny segments: every record rolls a new one.
        let log = LocalLog::open(tmp.path(), 0, 1, u64::MAX, 8).unwrap();
        for i in 0..4 {
            log.append(Some(format!("k{i}")), b("p"), 100 + i)
                .await
                .unwrap();
        }
        // Committed through 2, but appended inside the window: kept.
        log.release(2, 100).await.unwrap();
        assert_eq!(log.replay(0).await.unwrap().len(), 4);
        // After the window, records 1 and 2 go, with their keys.
        log.release(2, 1000).await.unwrap();
        let left: Vec<i64> = log
            .replay(0)
            .await
            .unwrap()
            .iter()
            .map(|r| r.offset)
            .collect();
        assert_eq!(left, vec![3, 4]);
        assert!(
            !log.append(Some("k0".into()), b("p"), 5)
                .await
                .unwrap()
                .duplicate
        );
        assert!(
            log.append(Some("k3".into()), b("p"), 5)
                .await
                .unwrap()
                .duplicate
        );
        // Everything committed and released: a reopen continues after it.
        log.release(5, 10_000).await.unwrap();
        drop(log);
        let log = LocalLog::open(tmp.path(), 5, 1, u64::MAX, 8).unwrap();
        assert!(log.replay(0).await.unwrap().is_empty());
        assert_eq!(log.append(None, b("p"), 6).await.unwrap().offset, 6);
    });
}

#[test]
fn concurrent_appends_get_distinct_offsets() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let log = Arc::new(LocalLog::open(tmp.path(), 0, 1 << 20, u64::MAX, 64).unwrap());
        let mut tasks = Vec::new();
        for i in 0..200 {
            let log = log.clone();
            tasks.push(tokio::spawn(async move {
                log.append(Some(format!("k{}", i % 150)), b("p"), 1)
                    .await
                    .unwrap()
            }));
        }
        let mut offsets = Vec::new();
        for t in tasks {
            let a = t.await.unwrap();
            if !a.duplicate {
                offsets.push(a.offset);
            }
        }
        offsets.sort_unstable();
        assert_eq!(offsets, (1..=150).collect::<Vec<_>>());
        assert_eq!(log.stats().next_offset, 151);
    });
}

/// Logs cost neither a thread nor a file each: many logs share the pool's
/// threads, hold at most `MAX_OPEN` segment files (plus one per thread at
/// work), and a log whose file was closed appends and replays as before.
#[test]
fn many_logs_share_the_pool_and_a_bounded_set_of_open_files() {
    let tmp = tempfile::tempdir().unwrap();
    let fds = || std::fs::read_dir("/proc/self/fd").unwrap().count();
    rt().block_on(async {
        let before = fds();
        let n = 2 * MAX_OPEN_SEGMENTS + 10;
        let dir = |i: usize| tmp.path().join(format!("flow{i}"));
        let logs: Vec<LocalLog> = (0..n)
            .map(|i| LocalLog::open(&dir(i), 0, 1 << 20, u64::MAX, 8).unwrap())
            .collect();
        for round in 1..=2i64 {
            for log in &logs {
                let a = log.append(None, b("x"), round).await.unwrap();
                assert_eq!(a.offset, round);
                let (open, threads) = writer_usage();
                assert!(
                    open <= MAX_OPEN_SEGMENTS + WRITER_THREADS,
                    "{open} files open"
                );
                assert!(threads <= WRITER_THREADS, "{threads} writer threads");
            }
        }
        let open_fds = fds() - before;
        assert!(
            open_fds <= MAX_OPEN_SEGMENTS + WRITER_THREADS + 16,
            "{open_fds} descriptors for {n} logs"
        );
        drop(logs);
        for i in [0, n / 2, n - 1] {
            let log = LocalLog::open(&dir(i), 0, 1 << 20, u64::MAX, 8).unwrap();
            let offsets: Vec<i64> = log
                .replay(0)
                .await
                .unwrap()
                .iter()
                .map(|r| r.offset)
                .collect();
            assert_eq!(offsets, vec![1, 2], "log {i}");
        }
    });
}
