//! AUTO CDC FROM SNAPSHOT through the real write path on the Hadoop catalog:
//! each snapshot's difference to the target is applied at its version.

use crate::common;

use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use autocdc::core::flow::Flow;
use autocdc::fault::Faults;
use autocdc::table::catalog::Catalog;
use autocdc::table::catalog::hadoop::HadoopCatalog;
use autocdc::table::engine::Engine;
use common::*;

fn catalog(dir: &std::path::Path) -> Arc<dyn Catalog> {
    Arc::new(HadoopCatalog::new(dir.to_str().unwrap(), None, Arc::new(Faults::default())).unwrap())
}

fn stock(scd: u8) -> Flow {
    Flow::new(
        toml::from_str(&format!(
            r#"
name = "stock"
target = "shop.stock{scd}"
keys = ["sku"]
from_snapshot = true
stored_as_scd_type = {scd}
columns = [
  {{ name = "sku", type = "string", required = true }},
  {{ name = "qty", type = "long" }},
]
"#
        ))
        .unwrap(),
    )
    .unwrap()
}

/// A snapshot: (sku, qty) rows.
fn snap(flow: &Flow, rows: &[(&str, i64)]) -> RecordBatch {
    let cols: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
        Arc::new(Int64Array::from(vec![None::<i64>; rows.len()])),
    ];
    RecordBatch::try_new(flow.source_arrow.clone(), cols).unwrap()
}

async fn apply(
    e: &mut Engine,
    flow: &Flow,
    rows: &[(&str, i64)],
    v: i64,
) -> autocdc::table::engine::CommitReport {
    let off = e.summary().input_offset + 1;
    e.apply_snapshot_at(&snap(flow, rows), v, 1_000 + v, off)
        .await
        .unwrap()
}

#[test]
fn snapshots_insert_update_delete_and_leave_unchanged_rows_alone() {
    let rt = rt();
    let tmp = tempfile::tempdir().unwrap();
    let flow = stock(1);
    rt.block_on(async {
        let mut e = open_engine(&catalog(tmp.path()), &flow).await;
        let r = apply(&mut e, &flow, &[("a", 1), ("b", 2), ("c", 3)], 1).await;
        assert_eq!(
            (r.stats.upserts, r.stats.deletes, r.stats.unchanged),
            (3, 0, 0)
        );
        // b changes, c goes, d is new, a is unchanged.
        let r = apply(&mut e, &flow, &[("a", 1), ("b", 20), ("d", 4)], 2).await;
        assert_eq!(
            (r.stats.upserts, r.stats.deletes, r.stats.unchanged),
            (2, 1, 1)
        );
        assert_eq!(r.stats.removed_by_position, 2, "old b and c");
        assert_eq!(
            table_rows(&e).await,
            rows(&[&["a", "1"], &["b", "20"], &["d", "4"]])
        );
        // An unchanged snapshot writes no files but records its version.
        let r = apply(&mut e, &flow, &[("d", 4), ("b", 20), ("a", 1)], 3).await;
        assert_eq!(
            (r.stats.upserts, r.stats.deletes, r.stats.unchanged),
            (0, 0, 3)
        );
        assert_eq!((r.data_files, r.delete_files, r.rows_written), (0, 0, 0));
        assert!(r.snapshot_id.is_some());
        assert_eq!(e.snapshot_version(), Some(3));
        // After a restart: an older or repeated version is skipped and reported.
        let mut e = open_engine(&catalog(tmp.path()), &flow).await;
        assert_eq!(e.snapshot_version(), Some(3));
        for v in [2, 3] {
            let r = apply(&mut e, &flow, &[("z", 9)], v).await;
            assert_eq!(r.skipped_for_version, Some(3));
            assert_eq!(r.snapshot_id, None);
        }
        assert_eq!(
            table_rows(&e).await,
            rows(&[&["a", "1"], &["b", "20"], &["d", "4"]])
        );
        // An empty snapshot deletes everything.
        let r = apply(&mut e, &flow, &[], 10).await;
        assert_eq!(r.stats.deletes, 3);
        assert!(table_rows(&e).await.is_empty());
    });
}

#[test]
fn snapshots_build_scd2_history_at_their_versions() {
    let rt = rt();
    let tmp = tempfile::tempdir().unwrap();
    let flow = stock(2);
    rt.block_on(async {
        let mut e = open_engine(&catalog(tmp.path()), &flow).await;
        apply(&mut e, &flow, &[("a", 1), ("b", 2)], 1).await;
        apply(&mut e, &flow, &[("a", 5), ("b", 2)], 2).await;
        let mut e = open_engine(&catalog(tmp.path()), &flow).await;
        apply(&mut e, &flow, &[("a", 5)], 3).await;
        apply(&mut e, &flow, &[("a", 5), ("b", 7)], 4).await;
        assert_eq!(
            table_rows(&e).await,
            rows(&[
                &["a", "1", "1", "2"],
                &["a", "5", "2", "NULL"],
                &["b", "2", "1", "3"],
                &["b", "7", "4", "NULL"],
            ])
        );
    });
}

#[test]
fn a_snapshot_with_a_key_twice_is_rejected_naming_the_row() {
    let rt = rt();
    let tmp = tempfile::tempdir().unwrap();
    let flow = stock(1);
    rt.block_on(async {
        let mut e = open_engine(&catalog(tmp.path()), &flow).await;
        let err = e
            .apply_snapshot_at(&snap(&flow, &[("a", 1), ("b", 2), ("a", 3)]), 1, 1, 1)
            .await
            .unwrap_err();
        match err {
            autocdc::Error::Batch {
                code, row, column, ..
            } => {
                assert_eq!(
                    (code, row, column.as_str()),
                    ("AUTOCDC_SNAPSHOT_DUPLICATE_KEY", 2, "sku")
                );
            }
            e => panic!("{e}"),
        }
        assert!(table_rows(&e).await.is_empty(), "nothing applied");
        // Changes are refused on a snapshot flow, and snapshots on a change flow.
        let err = e.apply(&snap(&flow, &[("a", 1)]), 1).await.unwrap_err();
        assert_eq!(err.code(), "AUTOCDC_SNAPSHOT_FLOW_MISMATCH");
        let customers = customers();
        let mut c = open_engine(&catalog(tmp.path()), &customers).await;
        let err = c
            .apply_snapshot_at(&batch(&customers, &[u(1, "Leeds", 1)]), 1, 1, 1)
            .await
            .unwrap_err();
        assert_eq!(err.code(), "AUTOCDC_SNAPSHOT_FLOW_MISMATCH");
    });
}
