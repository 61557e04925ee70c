use std::sync::Arc;

use arrow_array::{Int64Array, RecordBatch, StringArray};
use arrow_select::concat::concat_batches;
use iceberg::spec::{
    NestedField, PartitionSpec, PrimitiveType, Schema, Transform, Type, UnboundPartitionField,
};

use super::{
    FileNamer, IN_FLIGHT_ROWS, Layout, OBJECT_STORE_WRITES, Partitioner, layout, local_writes,
    write_parallelism,
};

#[test]
fn object_stores_write_small_files_more_at_once_than_a_local_disk() {
    let local = local_writes();
    assert!((1..=4).contains(&local));
    for rows in [1, 5_000, IN_FLIGHT_ROWS * 4] {
        assert_eq!(write_parallelism("/w/db/t/data/a.parquet", rows), local);
        assert_eq!(
            write_parallelism("file:///w/db/t/data/a.parquet", rows),
            local
        );
    }
    let s3 = |rows| write_parallelism("s3://bucket/w/db/t/data/a.parquet", rows);
    assert_eq!(s3(5_000), OBJECT_STORE_WRITES);
    assert_eq!(s3(IN_FLIGHT_ROWS / 4), 4.max(local));
    // Files of a row group or more: no more at once than on a disk.
    assert_eq!(s3(IN_FLIGHT_ROWS), local);
    assert_eq!(s3(IN_FLIGHT_ROWS * 8), local);
}

fn people() -> Schema {
    Schema::builder()
        .with_fields(vec![
            Arc::new(NestedField::required(
                1,
                "id",
                Type::Primitive(PrimitiveType::Long),
            )),
            Arc::new(NestedField::optional(
                2,
                "region",
                Type::Primitive(PrimitiveType::String),
            )),
        ])
        .build()
        .unwrap()
}

fn batch(schema: &Schema, ids: std::ops::Range<i64>) -> RecordBatch {
    let arrow = Arc::new(iceberg::arrow::schema_to_arrow_schema(schema).unwrap());
    let regions: StringArray = ids
        .clone()
        .map(|i| (i % 5 != 0).then(|| ["eu", "us", "apac"][(i % 3) as usize]))
        .collect();
    RecordBatch::try_new(
        arrow,
        vec![
            Arc::new(Int64Array::from_iter_values(ids)),
            Arc::new(regions),
        ],
    )
    .unwrap()
}

/// A file's partition (as debug text) and its rows, joined.
type Seen = (String, RecordBatch);

/// Each file's partition and rows, and each row's place.
fn seen(l: &Layout) -> (Vec<Seen>, Vec<(u32, u32)>) {
    let files = l
        .files
        .iter()
        .map(|f| {
            let rows = concat_batches(&f.rows[0].schema(), &f.rows).unwrap();
            (format!("{:?}", f.partition()), rows)
        })
        .collect();
    (files, l.locs.clone())
}

/// Compaction lays out the surviving rows of many files as read; that must
/// place every row where laying out the batches joined would have.
#[test]
fn laying_out_batches_as_read_places_rows_as_one_batch_would() {
    let schema = people();
    let spec = PartitionSpec::builder(schema.clone())
        .with_spec_id(1)
        .add_unbound_fields(vec![
            UnboundPartitionField::builder()
                .source_id(2)
                .field_id(1000)
                .name("region".into())
                .transform(Transform::Identity)
                .build(),
            UnboundPartitionField::builder()
                .source_id(1)
                .field_id(1001)
                .name("id_bucket".into())
                .transform(Transform::Bucket(4))
                .build(),
        ])
        .unwrap()
        .build()
        .unwrap();
    let partitioner = Partitioner::new(Arc::new(spec), &schema).unwrap().unwrap();
    // Cuts of 5,000 rows, some empty, some past a file's 1,024-row floor.
    let cuts = [0, 0, 1, 700, 701, 2_100, 2_100, 3_333, 5_000];
    let parts: Vec<RecordBatch> = cuts
        .windows(2)
        .map(|w| batch(&schema, w[0]..w[1]))
        .collect();
    let whole = concat_batches(&parts[0].schema(), &parts).unwrap();
    for p in [None, Some(&partitioner)] {
        // A tiny target: files of the floor's 1,024 rows, so some span parts.
        let one = layout(
            &mut FileNamer::new("/w/t"),
            p,
            std::slice::from_ref(&whole),
            1,
        )
        .unwrap();
        let many = layout(&mut FileNamer::new("/w/t"), p, &parts, 1).unwrap();
        assert!(one.files.len() > 1, "rolled into several files");
        let (one_files, one_locs) = seen(&one);
        let (many_files, many_locs) = seen(&many);
        assert_eq!(one_locs, many_locs);
        assert_eq!(one_files, many_files);
        // Every row is in its file at its place.
        for (row, &(f, pos)) in many_locs.iter().enumerate() {
            let (_, rows) = &many_files[f as usize];
            assert_eq!(rows.slice(pos as usize, 1), whole.slice(row, 1));
        }
    }
    let none = layout(&mut FileNamer::new("/w/t"), None, &[], 1).unwrap();
    assert!(none.files.is_empty() && none.locs.is_empty());
}
