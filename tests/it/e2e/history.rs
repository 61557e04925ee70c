//! SCD Type 2 and `ignore_null_updates` through the Hadoop catalog, with a
//! restart before every batch, against the people oracle.

use super::*;

/// A `people` feed for the history flows: a hand-written key (100) that
/// moves, gets a late event splitting an interval, a late delete inside its
/// history, a duplicate and a reinsert; then pseudo-random changes over six
/// keys (nulls, deletes, late events, ties), in eight micro-batches.
fn people_feed() -> Vec<Vec<scd::PEv>> {
    use scd::{del, up};
    let mut batches = vec![
        vec![
            up(100, "Leeds", "a", 1),
            up(100, "York", "a", 5),
            up(100, "Bath", "a", 9),
        ],
        vec![
            up(100, "Hull", "a", 3),
            del(100, 7),
            up(100, "York", "a", 5),
        ],
        vec![
            (100, false, Some("Leeds"), None, 12),
            (100, false, None, Some("b"), 14),
        ],
    ];
    let cities = [Some("Leeds"), Some("York"), Some("Bath"), None];
    let notes = [Some("vip"), Some("new"), None];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    for _ in 0..8 {
        let len = 1 + next(30) as usize;
        let mut b = Vec::with_capacity(len);
        for _ in 0..len {
            let (id, seq) = (next(6) as i64, next(40) as i64);
            b.push(if next(100) < 15 {
                del(id, seq)
            } else {
                (
                    id,
                    false,
                    cities[next(4) as usize],
                    notes[next(3) as usize],
                    seq,
                )
            });
        }
        batches.push(b);
    }
    batches
}

/// Applies `people_feed` to a history flow with a restart before every
/// batch and checks the table against `people_oracle`. With
/// `AUTOCDC_E2E_OUT` the table and its expected rows are left for the
/// independent readers (`integration/readers.py`), like the battery.
fn history_table(shape: scd::Shape, target: &str) -> BTreeSet<Vec<String>> {
    let tmp = tempfile::tempdir().unwrap();
    let out = e2e_out();
    let wh = out
        .as_ref()
        .map(|o| o.join("warehouse"))
        .unwrap_or_else(|| tmp.path().to_path_buf());
    let flow = scd::people(shape, target);
    let feed = people_feed();
    let arrow: Vec<RecordBatch> = feed.iter().map(|b| scd::people_batch(&flow, b)).collect();
    let expected = scd::people_oracle(shape, &flow, &arrow);
    rt().block_on(async {
        let cat = catalog(&wh, Arc::new(Faults::default()));
        cat.drop_table(&flow.target).await.unwrap();
        cat.drop_table(&flow.state_ident()).await.unwrap();
        for (i, b) in arrow.iter().enumerate() {
            let mut engine = open(&wh, &flow).await;
            engine.apply(b, 1_000 + i as i64).await.unwrap();
        }
        let engine = open(&wh, &flow).await;
        assert_eq!(table_rows(&engine).await, expected, "{target}");
        // Only position deletes: PyIceberg reads the table.
        assert_eq!(
            snapshot_property(&engine, "total-equality-deletes").as_deref(),
            Some("0")
        );
        let columns = column_names(&engine);
        if let Some(o) = &out {
            let dir = o.join("expected");
            std::fs::create_dir_all(&dir).unwrap();
            let json = serde_json::json!({
                "name": target,
                "metadata": engine.target().metadata_location,
                "keys": flow.config.keys,
                "columns": columns,
                "rows": expected.iter().collect::<Vec<_>>(),
            });
            let file = format!("{}.json", target.replace('.', "_"));
            std::fs::write(dir.join(file), json.to_string()).unwrap();
        }
    });
    expected
}

#[test]
fn scd2_people_through_the_hadoop_catalog_with_restarts() {
    let rows = history_table(scd::SCD2, "history.people_scd2");
    // The feed exercises history: closed versions, and keys with several.
    let closed = rows.iter().filter(|r| r[5] != "NULL").count();
    assert!(closed >= 10, "{closed} closed versions");
    assert!(rows.iter().filter(|r| r[0] == "100").count() >= 4);
}

#[test]
fn ignore_null_updates_people_through_the_hadoop_catalog_with_restarts() {
    let shape = scd::Shape {
        scd2: false,
        untracked_note: false,
        ignore_nulls: true,
        ties_error: false,
        city_only_nulls: false,
    };
    let rows = history_table(shape, "history.people_partial");
    // The nulls matter: without ignore_null_updates the table differs.
    let flow = scd::people(shape, "history.people_partial");
    let arrow: Vec<RecordBatch> = people_feed()
        .iter()
        .map(|b| scd::people_batch(&flow, b))
        .collect();
    let plain = scd::Shape {
        ignore_nulls: false,
        ..shape
    };
    assert_ne!(rows, scd::people_oracle(plain, &flow, &arrow));
}
