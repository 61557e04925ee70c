//! Partition specs: a changed `partition_by` adds a spec and deletes follow
//! each file's spec; tables another engine wrote (positions unknown: equality
//! deletes into the right partitions).

use super::*;

/// (content, spec id) of every live file of the target's current snapshot.
async fn live_specs(dir: &std::path::Path, engine: &Engine) -> BTreeSet<(&'static str, i32)> {
    use iceberg::spec::DataContentType;
    let cat = catalog(dir, Arc::new(Faults::default()));
    let t = engine.target().table(cat.file_io()).unwrap();
    let mut out = BTreeSet::new();
    let Some(snap) = t.metadata().current_snapshot() else {
        return out;
    };
    let list = t.manifest_list_reader(snap).load().await.unwrap();
    for m in list.entries() {
        let manifest = m.load_manifest(cat.file_io()).await.unwrap();
        for e in manifest.entries().iter().filter(|e| e.is_alive()) {
            let kind = match e.data_file().content_type() {
                DataContentType::Data => "data",
                DataContentType::PositionDeletes => "pos",
                DataContentType::EqualityDeletes => "eq",
            };
            out.insert((kind, m.partition_spec_id));
        }
    }
    out
}

/// A changed `partition_by` adds a spec: new files take it, a row replaced
/// or deleted in an older file is deleted in that file's spec, compaction
/// moves every file into the default spec, and going back reuses a spec.
#[test]
fn a_changed_partitioning_adds_a_spec_and_deletes_follow_each_files_spec() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    rt().block_on(async {
        let t = "respec.t";
        let flow = |by: &[&str]| partitioned_flow_for(t, by);
        let cities = ["a", "b", "c"];
        let first: Vec<Ev> = (1..=8).map(|k| u(k, cities[k as usize % 3], 1)).collect();
        let mut all = vec![batch(&flow(&[]), &first)];
        let mut engine = open(dir, &flow(&[])).await;
        engine.apply(&all[0], 1).await.unwrap();
        drop(engine);

        // Partitioned by city: one metadata commit, spec 1, reopened as is.
        let engine = open(dir, &flow(&["city"])).await;
        let meta = engine.target().metadata.clone();
        assert_eq!(meta.default_partition_spec_id(), 1);
        assert_eq!(meta.partition_specs_iter().len(), 2);
        assert!(
            engine
                .evolved()
                .iter()
                .any(|e| e.contains("partition spec 1")),
            "{:?}",
            engine.evolved()
        );
        let loc = engine.target().metadata_location.clone();
        drop(engine);
        let mut engine = open(dir, &flow(&["city"])).await;
        assert_eq!(engine.target().metadata_location, loc);
        let b = batch(&flow(&["city"]), &[u(1, "b", 2), d(2, 2), u(9, "a", 2)]);
        engine.apply(&b, 2).await.unwrap();
        all.push(b);
        assert_eq!(table_rows(&engine).await, oracle(&flow(&[]), &all));
        // Keys 1 and 2 were in a file of spec 0: deleted in spec 0.
        assert_eq!(
            live_specs(dir, &engine).await,
            BTreeSet::from([("data", 0), ("data", 1), ("pos", 0)])
        );

        // Then by a bucket of the key: rows in files of both older specs go.
        let by_key = flow(&["bucket[4](id)"]);
        let mut engine = open(dir, &by_key).await;
        assert_eq!(engine.target().metadata.default_partition_spec_id(), 2);
        let b = batch(
            &by_key,
            &[u(1, "c", 3), u(3, "a", 3), d(9, 3), u(10, "b", 3)],
        );
        engine.apply(&b, 3).await.unwrap();
        all.push(b);
        assert_eq!(table_rows(&engine).await, oracle(&flow(&[]), &all));
        assert_eq!(
            live_specs(dir, &engine).await,
            BTreeSet::from([
                ("data", 0),
                ("data", 1),
                ("data", 2),
                ("pos", 0),
                ("pos", 1)
            ])
        );

        // Compaction rewrites every file of an older spec into spec 2, and
        // their deletes go with them.
        let r = engine.compact(4, false).await.unwrap();
        // Spec 0's file is rewritten; spec 1's two, every row deleted, are dropped.
        assert_eq!(
            (r.data_files_rewritten, r.data_files_dropped),
            (1, 2),
            "{r:?}"
        );
        assert_eq!(
            live_specs(dir, &engine).await,
            BTreeSet::from([("data", 2)])
        );
        assert_eq!(table_rows(&engine).await, oracle(&flow(&[]), &all));
        // The state followed the rows: later changes replace the right ones.
        let b = batch(&by_key, &[u(4, "z", 4), d(5, 4), u(1, "y", 4)]);
        engine.apply(&b, 5).await.unwrap();
        all.push(b);
        assert_eq!(table_rows(&engine).await, oracle(&flow(&[]), &all));
        drop(engine);

        // Back to unpartitioned: spec 0 again, no fourth spec.
        let mut engine = open(dir, &flow(&[])).await;
        let meta = engine.target().metadata.clone();
        assert_eq!(meta.default_partition_spec_id(), 0);
        assert_eq!(meta.partition_specs_iter().len(), 3);
        let b = batch(&flow(&[]), &[u(6, "q", 5), u(11, "r", 5), u(7, "stale", 0)]);
        engine.apply(&b, 6).await.unwrap();
        all.push(b);
        assert_eq!(table_rows(&engine).await, oracle(&flow(&[]), &all));
        assert!(live_specs(dir, &engine).await.contains(&("pos", 2)));
        // A restart recovers the same table and state.
        let mut engine = open(dir, &flow(&[])).await;
        let b = batch(&flow(&[]), &[d(8, 6)]);
        engine.apply(&b, 7).await.unwrap();
        all.push(b);
        assert_eq!(table_rows(&engine).await, oracle(&flow(&[]), &all));
    });
}

/// A target that already held rows autocdc did not write: their positions are
/// unknown, so replacing one takes an equality delete on the key, and the
/// state stays marked incomplete across restarts.
#[test]
fn rows_written_by_another_engine_are_replaced_by_equality_delete() {
    adopted_table(&[], &[]);
}

/// Partitioned on a non-key column: the old row's partition is unknown, so
/// the equality delete is written into every partition that has data.
#[test]
fn adopted_table_partitioned_by_a_non_key_column() {
    adopted_table(&["city"], &["city"]);
}

/// Partitioned on the key: the equality delete goes to the key's partition.
#[test]
fn adopted_table_partitioned_by_the_key() {
    adopted_table(&["bucket[4](id)"], &["bucket[4](id)"]);
}

/// Written by city, then repartitioned by a bucket of the key: the old row
/// is in a file of the older spec, so the equality delete goes into every
/// partition of that spec that has data (and none into the new one, which
/// has no data yet).
#[test]
fn adopted_table_repartitioned_by_the_key() {
    adopted_table(&["city"], &["bucket[4](id)"]);
}

/// Written unpartitioned, then partitioned by city: the equality delete is
/// in the unpartitioned spec of the old file.
#[test]
fn adopted_unpartitioned_table_repartitioned() {
    adopted_table(&[], &["city"]);
}

/// A table another engine wrote with `created` partitioning, adopted by a
/// flow partitioned by `opened`.
fn adopted_table(created: &[&str], opened: &[&str]) {
    use autocdc::table::row_delta::{self, RowDelta};
    use autocdc::table::write::{self, FileNamer, Partitioner};
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let flow = partitioned_flow_for("adopt.t", created);
        let cat = catalog(tmp.path(), Arc::new(Faults::default()));
        // Another engine creates the table and appends two rows.
        let t = cat
            .create_table(
                &flow.target,
                flow.target_schema.clone(),
                flow.partition_spec.clone().into_unbound(),
                Default::default(),
            )
            .await
            .unwrap();
        let arrow =
            Arc::new(iceberg::arrow::schema_to_arrow_schema(t.metadata.current_schema()).unwrap());
        let foreign = RecordBatch::try_new(
            arrow,
            vec![
                Arc::new(arrow_array::Int64Array::from(vec![1, 2])),
                Arc::new(arrow_array::StringArray::from(vec![
                    Some("Old1"),
                    Some("Old2"),
                ])),
                Arc::new(arrow_array::Int64Array::from(vec![1, 1])),
            ],
        )
        .unwrap();
        let mut namer = FileNamer::new(t.location());
        let partitioner = Partitioner::new(
            t.metadata.default_partition_spec().clone(),
            t.metadata.current_schema(),
        )
        .unwrap();
        let files = write::data_files(
            cat.file_io(),
            &mut namer,
            t.metadata.current_schema().clone(),
            0,
            partitioner.as_ref(),
            vec![foreign.clone()],
            1 << 20,
        )
        .await
        .unwrap()
        .files;
        // Partitioned by city, the two rows are in two partitions.
        let by_city = created == ["city"];
        assert_eq!(files.len(), if by_city { 2 } else { 1 });
        let p = row_delta::produce(
            cat.file_io(),
            &t,
            RowDelta {
                data: files,
                deletes: vec![],
                base_snapshot: None,
                replace: false,
                properties: Default::default(),
                now_ms: 1,
                rewrite: None,
            },
        )
        .await
        .unwrap();
        cat.commit(&t, p.updates, p.requirements).await.unwrap();

        let flow = partitioned_flow_for("adopt.t", opened);
        let mut engine = open(tmp.path(), &flow).await;
        let respecced = created != opened;
        assert_eq!(
            engine.target().metadata.default_partition_spec_id(),
            respecced as i32
        );
        assert!(!engine.summary().complete);
        let r = engine
            .apply(&batch(&flow, &[u(1, "New1", 2)]), 2)
            .await
            .unwrap();
        assert_eq!(
            (r.stats.removed_by_key, r.stats.removed_by_position),
            (1, 0)
        );
        // One equality-delete file, or one per partition holding data.
        assert_eq!(r.delete_files, if by_city { 2 } else { 1 });
        assert_eq!(
            table_rows(&engine).await,
            rows(&[&["1", "New1", "2"], &["2", "Old2", "1"]])
        );
        // After a restart the state is still known to be incomplete.
        let mut engine = open(tmp.path(), &flow).await;
        assert!(!engine.summary().complete);
        // Key 1 is ours now: replaced by position. Key 2 still needs its key.
        let r = engine
            .apply(&batch(&flow, &[u(1, "Newer1", 3), d(2, 3)]), 3)
            .await
            .unwrap();
        assert_eq!(
            (r.stats.removed_by_key, r.stats.removed_by_position),
            (1, 1)
        );
        assert_eq!(table_rows(&engine).await, rows(&[&["1", "Newer1", "3"]]));
    });
}
