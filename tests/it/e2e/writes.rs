//! How autocdc replaces rows it wrote (by position only), a batch that
//! changes nothing, and keys whose schema changed.

use super::*;

#[test]
fn rows_autocdc_wrote_are_removed_by_position_only() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = rt();
    rt.block_on(async {
        let flow = flow_for("pos.only");
        let mut engine = open(tmp.path(), &flow).await;
        engine
            .apply(
                &batch(&flow, &[u(1, "A", 1), u(2, "B", 1), u(3, "C", 1)]),
                1,
            )
            .await
            .unwrap();
        let r = engine
            .apply(&batch(&flow, &[u(1, "A2", 2), d(2, 2)]), 2)
            .await
            .unwrap();
        assert_eq!(r.stats.removed_by_position, 2);
        assert_eq!(r.stats.removed_by_key, 0);
        let s = engine
            .target()
            .metadata
            .current_snapshot()
            .unwrap()
            .summary()
            .additional_properties
            .clone();
        assert_eq!(
            s.get("added-position-deletes").map(String::as_str),
            Some("2")
        );
        assert_eq!(
            s.get("total-equality-deletes").map(String::as_str),
            Some("0")
        );
        assert_eq!(s.get("total-records").map(String::as_str), Some("4"));
        assert_eq!(s.get("total-data-files").map(String::as_str), Some("2"));
        assert_eq!(
            table_rows(&engine).await,
            rows(&[&["1", "A2", "2"], &["3", "C", "1"]])
        );
        // The metadata of the target says merge-on-read and format v2, and keys are identifier fields.
        let m = &engine.target().metadata;
        assert_eq!(m.format_version(), iceberg::spec::FormatVersion::V2);
        assert_eq!(
            m.properties().get("write.delete.mode").map(String::as_str),
            Some("merge-on-read")
        );
        assert_eq!(
            m.current_schema()
                .identifier_field_ids()
                .collect::<Vec<_>>(),
            vec![1]
        );
        // The layout is Iceberg Java's HadoopCatalog's.
        let meta = tmp.path().join("pos/only/metadata");
        assert_eq!(
            std::fs::read_to_string(meta.join("version-hint.text")).unwrap(),
            "3"
        );
        assert!(meta.join("v3.metadata.json").exists());
    });
}

#[test]
fn a_batch_that_changes_nothing_commits_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let flow = flow_for("noop.t");
        let mut engine = open(tmp.path(), &flow).await;
        let first = engine
            .apply(&batch(&flow, &[u(1, "A", 5)]), 1)
            .await
            .unwrap();
        let again = engine
            .apply(&batch(&flow, &[u(1, "A", 5), u(1, "old", 2)]), 2)
            .await
            .unwrap();
        assert!(first.snapshot_id.is_some());
        assert_eq!(again.snapshot_id, None);
        assert_eq!((again.stats.duplicates, again.stats.stale), (1, 1));
        assert_eq!(
            engine.target().metadata.current_snapshot_id(),
            first.snapshot_id
        );
    });
}

#[test]
fn changed_keys_are_rejected_as_key_schema_drift() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let flow = flow_for("drift.t");
        let cat = catalog(tmp.path(), Arc::new(Faults::default()));
        open(tmp.path(), &flow).await;
        let mut cfg = flow.config.clone();
        cfg.keys = vec!["city".into()];
        let e = Engine::open(
            Flow::new(cfg).unwrap(),
            cat.clone(),
            Arc::new(Faults::default()),
        )
        .await
        .err()
        .unwrap();
        assert_eq!(e.code(), autocdc::error::codes::KEY_SCHEMA_DRIFT);
        assert!(e.to_string().contains("refresh --full"), "{e}");
    });
}

/// A local warehouse's files are written without a sync each; every
/// commit syncs what its tables wrote (an fsync each when few, the file
/// system when many, `table::local_files`). After every commit of an
/// unpartitioned table, of one partitioned into more partitions than
/// `FSYNC_EACH_MAX`, and after compaction (of five small files per
/// partition), nothing is left waiting for a
/// sync.
#[test]
fn every_commit_leaves_nothing_it_wrote_unsynced() {
    use autocdc::table::local_files::FSYNC_EACH_MAX;
    let tmp = tempfile::tempdir().unwrap();
    let cities: Vec<&'static str> = (0..2 * FSYNC_EACH_MAX)
        .map(|k| &*Box::leak(format!("c{k}").into_boxed_str()))
        .collect();
    rt().block_on(async {
        let faults = Arc::new(Faults::default());
        let cat = catalog(tmp.path(), faults.clone());
        let storage = cat.storage().unwrap().clone();
        for (t, by) in [("sync.flat", vec![]), ("sync.parts", vec!["city"])] {
            let flow = partitioned_flow_for(t, &by);
            let mut engine = Engine::open(flow.clone(), cat.clone(), faults.clone())
                .await
                .unwrap();
            assert_eq!(storage.unsynced_files(), 0, "{t} created");
            for i in 0..5i64 {
                let evs: Vec<Ev> = (cities.iter().enumerate())
                    .map(|(k, c)| u(k as i64 + 100 * i, c, i + 1))
                    .collect();
                engine.apply(&batch(&flow, &evs), i).await.unwrap();
                assert_eq!(storage.unsynced_files(), 0, "{t}, commit {i}");
            }
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as i64;
            let compacted = engine.compact(now, false).await.unwrap();
            assert!(compacted.data_files_written > 0, "{t}: {compacted:?}");
            assert_eq!(storage.unsynced_files(), 0, "{t}, compacted");
        }
    });
}
