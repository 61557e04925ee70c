//! Fingerprints: the numbers the whole row's encoding gives, whichever
//! way they are made.

use super::*;
use crate::core::flow::Flow;
use proptest::prelude::*;

/// A Debezium flow (its six position columns end its columns, and are
/// its sequence) and a flat flow whose sequence column is not last.
fn flows() -> [Flow; 2] {
    let dbz = r#"
        name = "d"
        target = "db.d"
        keys = ["id"]
        format = "debezium"
        source_table = "public.d"
        columns = [
          { name = "id", type = "long", required = true },
          { name = "name", type = "string" },
          { name = "n", type = "int" },
        ]"#;
    let flat = r#"
        name = "f"
        target = "db.f"
        keys = ["id"]
        sequence_by = "seq"
        columns = [
          { name = "id", type = "long", required = true },
          { name = "seq", type = "long", required = true },
          { name = "name", type = "string" },
        ]"#;
    [dbz, flat].map(|t| Flow::new(toml::from_str(t).unwrap()).unwrap())
}

/// `cells` as a batch of `flow`'s source columns (nulls where a column
/// may hold them), each cast from a long.
fn batch(flow: &Flow, cells: &[Option<i64>], rows: usize) -> RecordBatch {
    let n = flow.source_arrow.fields().len();
    let cols: Vec<ArrayRef> = flow
        .source_arrow
        .fields()
        .iter()
        .enumerate()
        .map(|(c, f)| {
            let longs: arrow_array::Int64Array = (0..rows)
                .map(|r| {
                    let v = cells[(r * n + c) % cells.len()];
                    if f.is_nullable() {
                        v
                    } else {
                        Some(v.unwrap_or(7))
                    }
                })
                .collect();
            arrow_cast::cast(&longs, f.data_type()).unwrap()
        })
        .collect();
    RecordBatch::try_new(flow.source_arrow.clone(), cols).unwrap()
}

/// The fingerprint as every version before the sequence's bytes were
/// taken from `seqs`: all the columns in one row encoding.
fn whole_row_fingerprints(flow: &Flow, b: &RecordBatch) -> Vec<u64> {
    let fields = flow
        .source_arrow
        .fields()
        .iter()
        .map(|f| SortField::new(crate::core::nested::row_type(f.data_type())))
        .collect();
    let rows = RowConverter::new(fields)
        .unwrap()
        .convert_columns(b.columns())
        .unwrap();
    rows.iter().map(|r| xxh3_64(r.as_ref())).collect()
}

#[test]
fn the_sequence_is_taken_from_its_encoding_where_it_ends_the_columns() {
    let [dbz, flat] = flows();
    assert!(Codec::new(&dbz).unwrap().seq_tail);
    assert!(!Codec::new(&flat).unwrap().seq_tail);
}

proptest! {
    /// The state keeps fingerprints across versions: they are the
    /// numbers the whole row's encoding gives, whichever way made.
    #[test]
    fn fingerprints_are_the_whole_rows_hash(
        cells in proptest::collection::vec(proptest::option::of(-3i64..1000), 1..200),
        rows in 1usize..40,
    ) {
        for flow in flows() {
            let codec = Codec::new(&flow).unwrap();
            let b = batch(&flow, &cells, rows);
            let want = whole_row_fingerprints(&flow, &b);
            prop_assert_eq!(&codec.fingerprints(&b).unwrap(), &want);
            let seqs = codec.seq_rows(&b).unwrap();
            let heads = codec.fingerprint_heads(&b).unwrap();
            prop_assert_eq!(codec.fingerprints_of(heads.as_ref(), Some(&seqs), rows), want);
        }
    }
}
