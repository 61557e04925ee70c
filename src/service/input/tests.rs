use super::*;
use std::fs::File;
use std::path::Path;

use crate::error::{Error, codes};
use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{ArrayRef, Int64Array};
use std::sync::Arc;

fn flow() -> Flow {
    flow_of(r#"{ name = "city", type = "string" },"#)
}

/// The flow `c` keyed on `id`, sequenced by `seq`, with `columns` between them.
fn flow_of(columns: &str) -> Flow {
    let toml = format!(
        r#"
        name = "c"
        target = "a.c"
        keys = ["id"]
        sequence_by = "seq"
        columns = [
          {{ name = "id", type = "long", required = true }},
          {columns}
          {{ name = "seq", type = "long", required = true }},
        ]
        "#
    );
    Flow::new(toml::from_str(&toml).unwrap()).unwrap()
}

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn ndjson_and_csv_read_into_the_source_schema_missing_fields_null() {
    let dir = tempfile::tempdir().unwrap();
    let f = flow();
    let j = write(
        dir.path(),
        "a.ndjson",
        "{\"id\": 1, \"city\": \"Leeds\", \"seq\": 3}\n{\"id\": 2, \"seq\": 4}\n",
    );
    let c = write(dir.path(), "a.csv", "seq,id,city\n3,1,Leeds\n4,2,\n");
    for p in [j, c] {
        let b = read_file(&f, &p).unwrap();
        assert_eq!(b.schema(), f.source_arrow, "{}", p.display());
        assert_eq!(b.column(0).as_primitive::<Int64Type>().values(), &[1, 2]);
        assert_eq!(b.column(2).as_primitive::<Int64Type>().values(), &[3, 4]);
        assert_eq!(b.column(1).as_string::<i32>().value(0), "Leeds");
    }
}

/// A `sequence_by` expression's hidden column is computed from the
/// other columns on every read, also of the log's own records (which
/// hold it), and a pushed field cannot set it.
#[test]
fn a_sequence_expression_is_computed_on_every_read() {
    let toml = r#"
        name = "c"
        target = "a.c"
        keys = ["id"]
        sequence_by = "coalesce(lsn, ts * 10)"
        columns = [
          { name = "id", type = "long" },
          { name = "ts", type = "long" },
          { name = "lsn", type = "long" },
        ]
    "#;
    let f = Flow::new(toml::from_str(toml).unwrap()).unwrap();
    let body = b"{\"id\": 1, \"ts\": 2}\n{\"id\": 2, \"ts\": 2, \"lsn\": 7}\n";
    let b = decode_ndjson(&f, body, Limits::NONE).unwrap();
    let seq = |b: &RecordBatch| b.column(3).as_primitive::<Int64Type>().values().to_vec();
    assert_eq!(seq(&b), [20, 7]);
    let logged = decode_log_payload(&f, &encode_arrow_ipc(&b).unwrap()).unwrap();
    assert_eq!(logged, b);
    // The hidden column is no input field: strict bodies refuse it.
    let sent = RecordBatch::try_from_iter([
        ("id", Arc::new(Int64Array::from(vec![1])) as ArrayRef),
        ("ts", Arc::new(Int64Array::from(vec![1]))),
        ("__autocdc_sequence_0", Arc::new(Int64Array::from(vec![99]))),
    ])
    .unwrap();
    let ipc = encode_arrow_ipc(&sent).unwrap();
    let e = decode(&f, BodyFormat::ArrowStream, &ipc, Limits::NONE, true).unwrap_err();
    assert_eq!(e.code(), codes::BAD_COLUMN, "{e}");
    let lenient = decode(&f, BodyFormat::ArrowStream, &ipc, Limits::NONE, false).unwrap();
    assert_eq!(seq(&lenient), [10]);
    let e = decode(
        &f,
        BodyFormat::Ndjson,
        b"{\"id\": 1, \"ts\": 1, \"__autocdc_sequence_0\": 5}",
        Limits::NONE,
        true,
    )
    .unwrap_err();
    assert_eq!(e.code(), codes::BAD_COLUMN, "{e}");
}

/// Nested columns arrive as Arrow struct and list arrays too, read
/// leaf by leaf (an int32 field into a long); a dictionary inside a
/// struct is refused (its expanded size is not checked there).
#[test]
fn nested_arrow_columns_are_read_leaf_by_leaf() {
    use arrow_array::{Array, Int32Array, StringArray, StructArray};
    use arrow_schema::{DataType, Field};
    let f = flow_of(r#"{ name = "addr", type = "struct<city: string, zip: long>" },"#);
    let addr = StructArray::from(vec![
        (
            Arc::new(Field::new("city", DataType::Utf8, true)),
            Arc::new(StringArray::from(vec!["Leeds"])) as ArrayRef,
        ),
        (
            Arc::new(Field::new("zip", DataType::Int32, true)),
            Arc::new(Int32Array::from(vec![7])) as ArrayRef,
        ),
    ]);
    let sent = RecordBatch::try_from_iter([
        ("id", Arc::new(Int64Array::from(vec![1])) as ArrayRef),
        ("addr", Arc::new(addr) as ArrayRef),
        ("seq", Arc::new(Int64Array::from(vec![1]))),
    ])
    .unwrap();
    let ipc = encode_arrow_ipc(&sent).unwrap();
    let b = decode(&f, BodyFormat::ArrowStream, &ipc, Limits::NONE, true).unwrap();
    let got = b.column(1).as_struct();
    assert_eq!(got.column(1).as_primitive::<Int64Type>().values(), &[7]);
    let dict: arrow_array::DictionaryArray<arrow_array::types::Int32Type> =
        vec!["Leeds"].into_iter().collect();
    let addr = StructArray::from(vec![(
        Arc::new(Field::new("city", dict.data_type().clone(), true)),
        Arc::new(dict) as ArrayRef,
    )]);
    let sent = RecordBatch::try_from_iter([
        ("id", Arc::new(Int64Array::from(vec![1])) as ArrayRef),
        ("addr", Arc::new(addr) as ArrayRef),
        ("seq", Arc::new(Int64Array::from(vec![1]))),
    ])
    .unwrap();
    let ipc = encode_arrow_ipc(&sent).unwrap();
    let e = decode(&f, BodyFormat::ArrowStream, &ipc, Limits::NONE, true).unwrap_err();
    assert_eq!(e.code(), codes::BAD_COLUMN, "{e}");
}

/// A record the log kept from before the definition changed decodes
/// under the new one: a renamed column's values arrive under its new
/// name, an added one is null, a dropped one is left out. A body is
/// still strict about fields that name no column.
#[test]
fn a_logged_record_decodes_after_a_rename_an_add_and_a_drop() {
    let old = flow();
    let batch = decode_ndjson(
        &old,
        b"{\"id\": 1, \"city\": \"Leeds\", \"seq\": 3}\n",
        Limits::NONE,
    )
    .unwrap();
    let payload = encode_arrow_ipc(&batch).unwrap();
    let new = flow_of(
        r#"{ name = "town", type = "string", renamed_from = "city" },
           { name = "note", type = "string" },"#,
    );
    let b = decode_log_payload(&new, &payload).unwrap();
    assert_eq!(b.schema(), new.source_arrow);
    assert_eq!(b.column(1).as_string::<i32>().value(0), "Leeds");
    assert!(b.column(2).is_null(0));
    assert_eq!(b.column(3).as_primitive::<Int64Type>().value(0), 3);
    let dropped = flow_of("");
    let b = decode_log_payload(&dropped, &payload).unwrap();
    assert_eq!(b.schema(), dropped.source_arrow);
    let e = decode_arrow_ipc(&dropped, &payload, Limits::NONE).unwrap_err();
    assert_eq!(e.code(), codes::BAD_COLUMN, "{e}");
}

/// Spark's default: input fields match the definition regardless of
/// case; two that differ only in case are refused; `case_sensitive`
/// restores exact matching.
#[test]
fn input_names_match_regardless_of_case_unless_case_sensitive() {
    let f = flow();
    let body = b"{\"ID\": 1, \"City\": \"Leeds\", \"seq\": 3}\n{\"id\": 2, \"CITY\": {\"x\": [1, \"}\"]}, \"Seq\": 4}\n";
    // The second row's city is an object: the keys are found around it,
    // and the value is then refused as a string.
    let e = decode_ndjson(&f, body, Limits::NONE).unwrap_err();
    assert_eq!(e.code(), codes::BAD_COLUMN, "{e}");
    let body =
        b"{\"ID\": 1, \"City\": \"Leeds\", \"seq\": 3}\n{\"id\": 2, \"SEQ\": 4, \"city\" : null}\n";
    let b = decode_ndjson(&f, body, Limits::NONE).unwrap();
    assert_eq!(b.column(0).as_primitive::<Int64Type>().values(), &[1, 2]);
    assert_eq!(b.column(1).as_string::<i32>().value(0), "Leeds");
    assert!(b.column(1).is_null(1));
    assert_eq!(b.column(2).as_primitive::<Int64Type>().values(), &[3, 4]);
    let b = decode_json_array(&f, br#"[{"Id": 5, "SEQ": 6}]"#, Limits::NONE).unwrap();
    assert_eq!(b.column(0).as_primitive::<Int64Type>().value(0), 5);

    let dup = b"{\"id\": 1, \"seq\": 3}\n{\"id\": 2, \"ID\": 2, \"seq\": 4}\n";
    match decode_ndjson(&f, dup, Limits::NONE).unwrap_err() {
        Error::Batch {
            code,
            row,
            column,
            message,
            ..
        } => {
            assert_eq!((code, row, column.as_str()), (codes::BAD_COLUMN, 1, "ID"));
            assert!(message.contains("`id` and `ID`"), "{message}");
        }
        e => panic!("{e}"),
    }
    // Arrow columns too.
    let schema = std::sync::Arc::new(arrow_schema::Schema::new(vec![
        arrow_schema::Field::new("Id", arrow_schema::DataType::Int64, false),
        arrow_schema::Field::new("SEQ", arrow_schema::DataType::Int64, false),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            std::sync::Arc::new(arrow_array::Int64Array::from(vec![7])),
            std::sync::Arc::new(arrow_array::Int64Array::from(vec![8])),
        ],
    )
    .unwrap();
    let ipc = encode_arrow_ipc(&batch).unwrap();
    let got = decode_arrow_ipc(&f, &ipc, Limits::NONE).unwrap();
    assert_eq!(got.column(0).as_primitive::<Int64Type>().value(0), 7);
    assert_eq!(got.column(2).as_primitive::<Int64Type>().value(0), 8);

    let mut config = f.config.clone();
    config.case_sensitive = true;
    let exact = Flow::new(config).unwrap();
    let e = decode_ndjson(&exact, b"{\"ID\": 1, \"seq\": 3}\n", Limits::NONE).unwrap_err();
    assert_eq!(e.code(), codes::BAD_COLUMN, "{e}");
    let e = decode_arrow_ipc(&exact, &ipc, Limits::NONE).unwrap_err();
    assert_eq!(e.code(), codes::BAD_COLUMN, "{e}");
}

#[test]
fn top_level_keys_are_found_around_nested_values_and_strings() {
    let row = br#" { "a" : 1 , "b":{"c":"}\"]"}, "d" :[1,{"e":2}] ,"f":null}"#;
    let keys: Vec<&str> = json::keys::top_level_keys(row)
        .unwrap()
        .into_iter()
        .map(|(s, e)| std::str::from_utf8(&row[s..e]).unwrap())
        .collect();
    assert_eq!(keys, ["a", "b", "d", "f"]);
    assert_eq!(json::keys::top_level_keys(b"{}"), Some(vec![]));
    for bad in [
        &b"[1]"[..],
        b"{\"a\" 1}",
        b"{\"a\\u0041\": 1}",
        b"{\"a\": 1",
        b"",
    ] {
        assert_eq!(
            json::keys::top_level_keys(bad),
            None,
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
}

#[test]
fn parquet_columns_are_matched_by_name_and_cast() {
    let dir = tempfile::tempdir().unwrap();
    let f = flow();
    // Different order, int32 ids, an extra column.
    let schema = std::sync::Arc::new(arrow_schema::Schema::new(vec![
        arrow_schema::Field::new("seq", arrow_schema::DataType::Int64, false),
        arrow_schema::Field::new("extra", arrow_schema::DataType::Utf8, true),
        arrow_schema::Field::new("id", arrow_schema::DataType::Int32, false),
    ]));
    let b = RecordBatch::try_new(
        schema.clone(),
        vec![
            std::sync::Arc::new(arrow_array::Int64Array::from(vec![7])),
            std::sync::Arc::new(arrow_array::StringArray::from(vec!["x"])),
            std::sync::Arc::new(arrow_array::Int32Array::from(vec![5])),
        ],
    )
    .unwrap();
    let p = dir.path().join("a.parquet");
    let mut w =
        parquet::arrow::ArrowWriter::try_new(File::create(&p).unwrap(), schema, None).unwrap();
    w.write(&b).unwrap();
    w.close().unwrap();
    let got = read_file(&f, &p).unwrap();
    assert_eq!(got.column(0).as_primitive::<Int64Type>().value(0), 5);
    assert!(got.column(1).is_null(0));
    assert_eq!(got.column(2).as_primitive::<Int64Type>().value(0), 7);
}

#[test]
fn a_value_of_the_wrong_type_names_the_column() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "bad.ndjson", "{\"id\": \"abc\", \"seq\": 1}\n");
    let e = read_file(&flow(), &p).unwrap_err();
    assert_eq!(e.code(), codes::BAD_COLUMN);
    assert!(e.to_string().contains("id"), "{e}");
    let e = read_file(&flow(), Path::new("x.txt")).unwrap_err();
    assert!(
        e.to_string().contains("unknown file type") || e.to_string().contains("cannot open"),
        "{e}"
    );
}
