//! `sequence_by` as an expression.

use super::*;

// ---------------------------------------------------------------------------
// sequence_by as an expression (Spark's `sequence_by` takes any orderable
// column expression: `struct(ts, lsn)`, `coalesce(lsn, 0)`, `ts * 1000 + n`)
// ---------------------------------------------------------------------------

/// `(id, v, ts, lsn, n)` sequenced by `seq`, SCD Type `scd`.
fn expression_flow(seq: &str, scd: u8) -> String {
    format!(
        "keys = [\"id\"]\nsequence_by = {seq}\nstored_as_scd_type = {scd}\n{}",
        r#"columns = [
  { name = "id", type = "int" },
  { name = "v", type = "string" },
  { name = "ts", type = "long" },
  { name = "lsn", type = "long" },
  { name = "n", type = "int" },
]"#
    )
}

/// `struct(ts, lsn)` orders by `ts`, then `lsn`: the table is the one
/// `sequence_by = ["ts", "lsn"]` gives, for SCD Type 1 and 2 (whose
/// `__START_AT` / `__END_AT` are then structs of the two).
#[test]
fn a_struct_sequence_orders_by_its_fields_in_turn() {
    let batches = [
        r#"
        {"id": 1, "v": "a", "ts": 1, "lsn": 5}
        {"id": 1, "v": "b", "ts": 1, "lsn": 7}
        "#,
        r#"
        {"id": 1, "v": "late", "ts": 1, "lsn": 6}
        {"id": 2, "v": "x", "ts": 2, "lsn": 0}
        {"id": 2, "v": "y", "ts": 1, "lsn": 9}
        "#,
    ];
    scenario(
        &expression_flow("\"struct(ts, lsn)\"", 1),
        &batches,
        &[&["1", "b", "1", "7", "NULL"], &["2", "x", "2", "0", "NULL"]],
    );
    let rt = rt();
    for scd in [1, 2] {
        let by_struct = flow(&expression_flow("\"STRUCT(ts, `lsn`)\"", scd));
        let by_list = flow(&expression_flow("[\"ts\", \"lsn\"]", scd));
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let got = rt.block_on(run(a.path(), &by_struct, &batches, true));
        let want = rt.block_on(run(b.path(), &by_list, &batches, false));
        assert_eq!(got, want, "SCD Type {scd}");
        assert_eq!(got.len(), if scd == 1 { 2 } else { 5 }, "{got:?}");
    }
}

/// `coalesce(lsn, 0)`: a change without an `lsn` is sequenced 0, so any
/// change with one wins over it, in every order and batching.
#[test]
fn a_coalesce_sequence_puts_changes_without_a_value_first() {
    scenario(
        &expression_flow("\"coalesce(lsn, 0)\"", 1),
        &[
            r#"
            {"id": 1, "v": "unsequenced"}
            {"id": 2, "v": "unsequenced"}
            "#,
            r#"
            {"id": 1, "v": "sequenced", "lsn": 1}
            {"id": 2, "v": "negative", "lsn": -1}
            {"id": 3, "v": "only", "lsn": null}
            "#,
        ],
        &[
            &["1", "sequenced", "NULL", "1", "NULL"],
            &["2", "unsequenced", "NULL", "NULL", "NULL"],
            &["3", "only", "NULL", "NULL", "NULL"],
        ],
    );
}

/// `ts * 1000 + n` as an SCD Type 2 sequence: `__START_AT` / `__END_AT`
/// hold the computed values (a long, as `ts` is).
#[test]
fn an_arithmetic_sequence_bounds_scd2_versions() {
    scenario(
        &expression_flow("\"ts * 1000 + n\"", 2),
        &[
            r#"{"id": 1, "v": "a", "ts": 1, "n": 2}"#,
            r#"
            {"id": 1, "v": "c", "ts": 2, "n": 5}
            {"id": 1, "v": "b", "ts": 1, "n": 999}
            "#,
        ],
        &[
            &["1", "a", "1", "NULL", "2", "1002", "1999"],
            &["1", "b", "1", "NULL", "999", "1999", "2005"],
            &["1", "c", "2", "NULL", "5", "2005", "NULL"],
        ],
    );
}

/// An expression that is null for a row (here `n` is missing) is a null
/// sequence: the batch is refused whole with NULL_SEQUENCE, naming the
/// expression; one that cannot be computed (an overflow) is refused when
/// the batch is read, naming its row.
#[test]
fn a_null_or_failing_sequence_expression_refuses_the_batch() {
    let toml = expression_flow("\"ts * 1000 + n\"", 1);
    rejects(
        &toml,
        &[r#"{"id": 1, "v": "kept", "ts": 1, "n": 0}"#],
        r#"
        {"id": 2, "v": "fine", "ts": 5, "n": 0}
        {"id": 1, "v": "no n", "ts": 9}
        "#,
        codes::NULL_SEQUENCE,
        &[&["1", "kept", "1", "NULL", "0"]],
    );
    let f = flow(&toml);
    let b = decode(&f, r#"{"id": 1, "ts": 1}"#);
    let e = autocdc::core::resolve::validate(&f, &b).unwrap_err();
    assert!(e.to_string().contains("ts * 1000 + n"), "{e}");
    let overflow = format!(
        "{}\n{}",
        r#"{"id": 1, "ts": 1, "n": 0}"#, r#"{"id": 2, "ts": 9223372036854776, "n": 0}"#
    );
    let e = decode_ndjson(&f, overflow.as_bytes(), Limits::NONE).unwrap_err();
    assert_eq!(e.code(), codes::SEQUENCE_EXPRESSION, "{e}");
    match &e {
        autocdc::error::Error::Batch { row, column, .. } => {
            assert_eq!((*row, column.as_str()), (1, "ts * 1000 + n"), "{e}")
        }
        other => panic!("{other}"),
    }
}

/// An expression is typed when the flow is defined: one that yields no
/// order, uses an unknown function, mixes text and numbers or names no
/// column is refused with the usual codes, before any change is read.
#[test]
fn a_sequence_expression_is_checked_when_the_flow_is_defined() {
    for (seq, code) in [
        ("cast(n AS boolean)", codes::NON_ORDERABLE_SEQUENCE),
        ("upper(v)", codes::EXPRESSION_UNSUPPORTED),
        ("ts + v", codes::EXPRESSION_TYPE),
        ("42", codes::EXPRESSION_TYPE),
        ("missing + 1", codes::COLUMNS_NOT_FOUND),
        ("changes.ts", codes::MULTIPART_IDENTIFIER),
        ("ts +", codes::EXPRESSION_PARSE),
    ] {
        let toml = expression_flow(&format!("\"{seq}\""), 1);
        match Flow::new(config("spark_parity", "spark.target", &toml)) {
            Ok(_) => panic!("`{seq}` was accepted"),
            Err(e) => assert_eq!(e.code(), code, "{seq}: {e}"),
        }
    }
}

/// Spark: AutoCdcConfigDriftSuite, a changed sequencing expression of the same type is no drift:
/// the new expression orders the changes that follow against the stored sequences. A changed
/// type still is (`lsn / 2` is a double).
#[test]
fn a_new_sequence_expression_of_the_same_type_is_no_drift() {
    reconfigured(
        &expression_flow("\"coalesce(lsn, 0)\"", 1),
        &[r#"{"id": 1, "v": "a", "ts": 5, "lsn": 3}"#],
        &[&["1", "a", "5", "3", "NULL"]],
        &expression_flow("\"coalesce(lsn, ts)\"", 1),
        &[
            r#"
            {"id": 1, "v": "older", "ts": 2}
            {"id": 2, "v": "b", "ts": 7}
            "#,
            r#"{"id": 1, "v": "newer", "ts": 4, "lsn": 4}"#,
        ],
        &[
            &["1", "newer", "4", "4", "NULL"],
            &["2", "b", "7", "NULL", "NULL"],
        ],
    );
    refused_on_change(
        &expression_flow("\"coalesce(lsn, 0)\"", 1),
        &[r#"{"id": 1, "v": "a", "lsn": 3}"#],
        &expression_flow("\"lsn / 2\"", 1),
        r#"{"id": 1, "v": "b", "lsn": 8}"#,
        codes::SEQUENCING_TYPE_DRIFT,
    );
}
