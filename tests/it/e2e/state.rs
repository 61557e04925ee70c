//! The state table: its log compacted and reloaded exactly, and a large
//! commit's state written as two files.

use super::*;

/// Enough commits that the state log is rewritten whole (an overwrite
/// snapshot of the state table); a restart then reloads exactly that state.
#[test]
fn the_state_log_is_compacted_and_reloads_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let flow = flow_for("compact.t");
        let n = 40_000i64;
        let cities = ["c0", "c1", "c2", "c3", "c4"];
        let mut all = Vec::new();
        let mut engine = open(tmp.path(), &flow).await;
        let mut compacted = false;
        for (i, city) in cities.iter().enumerate() {
            let evs: Vec<Ev> = (0..n)
                .map(|k| {
                    if i == 4 && k % 7 == 0 {
                        d(k, 5)
                    } else {
                        u(k, city, i as i64 + 1)
                    }
                })
                .collect();
            let b = batch(&flow, &evs);
            compacted |= engine.apply(&b, i as i64).await.unwrap().state_compacted;
            all.push(b);
        }
        assert!(compacted, "the state log was never compacted");
        let mut engine = open(tmp.path(), &flow).await;
        assert_eq!(engine.summary().keys, n as usize);
        // Every key's sequence survived: old changes are all stale, tombstones included.
        let stale = batch(&flow, &(0..n).map(|k| u(k, "old", 0)).collect::<Vec<_>>());
        let r = engine.apply(&stale, 10).await.unwrap();
        assert_eq!(r.stats.stale, n as u64);
        // And the positions: newer changes replace the right rows.
        let newer = batch(&flow, &[u(1, "new", 9), d(2, 9), u(7, "back", 9)]);
        engine.apply(&newer, 11).await.unwrap();
        all.push(stale);
        all.push(newer);
        assert_eq!(table_rows(&engine).await, oracle(&flow, &all));
    });
}

/// A commit of more keys than `STATE_SPLIT_ENTRIES` (32,768) builds its
/// state rows on two threads and writes them as two files of one state
/// snapshot; a restart reads both, for SCD Type 1 and both history kinds.
#[test]
fn a_large_commit_writes_its_state_as_two_files_that_reload_exactly() {
    let partial = scd::Shape {
        scd2: false,
        untracked_note: false,
        ignore_nulls: true,
        ties_error: false,
        city_only_nulls: false,
    };
    let plain = scd::Shape {
        scd2: false,
        ignore_nulls: false,
        ..partial
    };
    let two_cores = std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2;
    for (shape, target) in [
        (scd::SCD2, "split.people_scd2"),
        (partial, "split.people_partial"),
        (plain, "split.people_scd1"),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let flow = scd::people(shape, target);
        let n = 40_000i64;
        let first: Vec<scd::PEv> = (0..n).map(|k| scd::up(k, "a", "n1", 10)).collect();
        let second: Vec<scd::PEv> = (0..n)
            .map(|k| match k % 5 {
                0 => scd::del(k, 20),
                1 => (k, false, Some("b"), None, 20),
                _ => scd::up(k, "b", "n2", 20 + k % 3),
            })
            .collect();
        let third = vec![
            scd::up(1, "c", "n3", 30),
            scd::del(2, 30),
            scd::up(5, "back", "n4", 30),
            scd::up(6, "late", "n0", 15),
        ];
        let arrow: Vec<RecordBatch> = [&first, &second, &first, &third]
            .iter()
            .map(|b| scd::people_batch(&flow, b))
            .collect();
        rt().block_on(async {
            let mut engine = open(tmp.path(), &flow).await;
            for (i, b) in arrow[..2].iter().enumerate() {
                engine.apply(b, i as i64).await.unwrap();
                let state = engine.state_table().metadata.current_snapshot().unwrap();
                let added = state
                    .summary()
                    .additional_properties
                    .get("added-data-files");
                let want = if two_cores { "2" } else { "1" };
                assert_eq!(added.map(String::as_str), Some(want), "{target} commit {i}");
            }
            // A restart reads both files of each commit: the old changes
            // are known, the positions of the rows right.
            let mut engine = open(tmp.path(), &flow).await;
            assert_eq!(engine.summary().keys, n as usize, "{target}");
            engine.apply(&arrow[2], 2).await.unwrap();
            engine.apply(&arrow[3], 3).await.unwrap();
            let engine = open(tmp.path(), &flow).await;
            let expected = scd::people_oracle(shape, &flow, &arrow);
            assert_eq!(table_rows(&engine).await, expected, "{target}");
        });
        // Only autocdc reads the state table, whole: its files carry no
        // column statistics; the target's data files do, for readers.
        let (mut state, mut data) = (0, 0);
        for path in parquet_files(tmp.path()) {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let file = std::fs::File::open(&path).unwrap();
            let reader = parquet::file::reader::SerializedFileReader::new(file).unwrap();
            let meta = parquet::file::reader::FileReader::metadata(&reader);
            let chunks = || meta.row_groups().iter().flat_map(|g| g.columns());
            if name.contains("-state-") {
                state += 1;
                assert!(chunks().all(|c| c.statistics().is_none()), "{name}");
            } else if name.contains("-data-") {
                data += 1;
                assert!(chunks().all(|c| c.statistics().is_some()), "{name}");
            }
        }
        assert!(
            state >= 4 && data >= 3,
            "{target}: {state} state, {data} data files"
        );
    }
}

/// Every Parquet file under `dir`.
fn parquet_files(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        if path.is_dir() {
            out.extend(parquet_files(&path));
        } else if path.extension().is_some_and(|x| x == "parquet") {
            out.push(path);
        }
    }
    out
}
