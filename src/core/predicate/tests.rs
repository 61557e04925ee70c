use super::*;
use arrow_array::{Decimal128Array, Float64Array, Int64Array, TimestampMicrosecondArray};
use arrow_schema::Field;

fn arr(a: impl Array + 'static) -> ArrayRef {
    Arc::new(a)
}

fn batch() -> RecordBatch {
    let op = StringArray::from(vec![Some("DELETE"), Some("UPSERT"), None, Some("D")]);
    let soft = BooleanArray::from(vec![Some(true), Some(false), None, Some(false)]);
    let kind = Int64Array::from(vec![Some(10), Some(11), None, Some(2)]);
    let limit = Int64Array::from(vec![Some(10), Some(5), Some(1), None]);
    let amount = Float64Array::from(vec![Some(10.5), Some(1.0), Some(20.0), None]);
    let ts =
        TimestampMicrosecondArray::from(vec![Some(1_704_067_200_000_000), None, Some(0), None]);
    let price = Decimal128Array::from(vec![Some(1050), Some(999), None, Some(0)]);
    let price = price.with_precision_and_scale(10, 2).unwrap();
    let cols = [("op", arr(op)), ("soft", arr(soft)), ("kind", arr(kind))];
    let more = [
        ("limit", arr(limit)),
        ("amount", arr(amount)),
        ("deleted_at", arr(ts)),
    ];
    RecordBatch::try_from_iter(cols.into_iter().chain(more).chain([("price", arr(price))])).unwrap()
}

/// Evaluates `sql` over `batch()`; one letter per row, `T` or `F`.
fn eval(sql: &str) -> String {
    let b = batch();
    let p = Predicate::parse(sql, &b.schema()).unwrap_or_else(|e| panic!("{e}"));
    let out = p.evaluate(&b).unwrap();
    assert_eq!(out.null_count(), 0);
    out.iter()
        .map(|v| if v == Some(true) { 'T' } else { 'F' })
        .collect()
}

fn err(sql: &str) -> PredicateError {
    Predicate::parse(sql, &batch().schema()).expect_err(sql)
}

#[test]
fn string_equality() {
    assert_eq!(eval("op = 'DELETE'"), "TFFF");
    assert_eq!(eval("'DELETE' <> \"op\""), "FTFT");
}

#[test]
fn in_list() {
    assert_eq!(eval("op IN ('D', 'DELETE')"), "TFFT");
}

#[test]
fn not_in_list() {
    assert_eq!(eval("op NOT IN ('D', 'X')"), "TTFF");
    assert_eq!(eval("op NOT IN ('D', NULL)"), "FFFF"); // never true with a NULL in the list
}

#[test]
fn not_boolean_column() {
    assert_eq!(eval("NOT soft"), "FTFT");
    assert_eq!(eval("op IN ('D','DELETE') AND NOT soft"), "FFFT");
    assert_eq!(eval("soft IS NOT TRUE"), "FTTT");
}

#[test]
fn is_not_null_on_timestamp() {
    assert_eq!(eval("deleted_at IS NOT NULL"), "TFTF");
    assert_eq!(eval("deleted_at >= '2024-01-01 00:00:00'"), "TFFF");
    let ts = TimestampMicrosecondArray::from(vec![0, 1_704_067_200_000_000]);
    let b = RecordBatch::try_from_iter([("ts", arr(ts.with_timezone("UTC")))]).unwrap();
    let p = Predicate::parse("ts < '2024-01-01T00:00:00Z'", &b.schema()).unwrap();
    assert_eq!(
        p.evaluate(&b).unwrap(),
        BooleanArray::from(vec![true, false])
    );
}

#[test]
fn three_valued_and_or() {
    // Row 2 has op NULL: NULL OR TRUE is true, NULL AND TRUE is NULL, which reads as false.
    assert_eq!(eval("op = 'x' OR TRUE"), "TTTT");
    assert_eq!(eval("op = 'x' AND TRUE"), "FFFF");
    assert_eq!(eval("(op = 'DELETE') IS NOT TRUE"), "FTTT");
    assert_eq!(eval("op = 'D' OR op = 'UPSERT' AND kind = 11"), "FTFT"); // AND binds tighter
    assert_eq!(
        eval("op <> 'UPSERT' OR (kind = 2 AND amount >= 10.5)"),
        "TFFT"
    );
}

#[test]
fn between() {
    assert_eq!(eval("kind BETWEEN 2 AND 10"), "TFFT");
    assert_eq!(eval("kind NOT BETWEEN 2 AND 10"), "FTFF");
}

#[test]
fn like() {
    assert_eq!(eval("op LIKE 'DEL%'"), "TFFF");
    assert_eq!(eval("op NOT LIKE '_'"), "TTFF");
}

#[test]
fn int_column_vs_decimal_literal() {
    assert_eq!(eval("kind >= 10.5"), "FTFF");
    assert_eq!(
        eval("kind < -1.25 OR kind = 2.0 OR kind = 300000000000000000000"),
        "FFFT"
    );
    assert_eq!(eval("price > 9.99"), "TFFF");
    assert_eq!(eval("price = 10.500"), "TFFF");
}

#[test]
fn column_vs_column() {
    assert_eq!(eval("kind = \"limit\""), "TFFF");
    assert_eq!(eval("kind > \"limit\""), "FTFF");
    assert_eq!(eval("amount > kind"), "TFFF");
}

#[test]
fn columns_and_long_chains() {
    let b = batch();
    let p = Predicate::parse("op = 'D' OR (OP IS NULL AND soft)", &b.schema()).unwrap();
    assert_eq!(
        (p.columns(), p.sql()),
        (
            &["op".into(), "soft".into()][..],
            "op = 'D' OR (OP IS NULL AND soft)"
        )
    );
    let long: Vec<_> = (0..3000).map(|i| format!("kind = {i}")).collect();
    let p = Predicate::parse(&long.join(" OR "), &b.schema()).unwrap();
    assert_eq!(
        p.evaluate(&b).unwrap(),
        BooleanArray::from(vec![true, true, false, true])
    );
}

#[test]
fn error_codes() {
    let e = err("opp = 'D'");
    assert_eq!(e.code(), "AUTOCDC_COLUMNS_NOT_FOUND_IN_SCHEMA");
    assert!(e.to_string().contains("`opp`"), "{e}");
    let e = err("changes.op = 'D'");
    assert_eq!(e.code(), "AUTOCDC_MULTIPART_COLUMN_IDENTIFIER");
    let e = e.to_string();
    assert!(
        e.contains("`changes.op`") && e.contains("such as `op`"),
        "{e}"
    );
    let e = err("lower(op) = 'd'");
    assert_eq!(e.code(), "AUTOCDC_INVALID_EXPRESSION.UNSUPPORTED");
    assert!(e.to_string().contains("function call `lower(op)`"), "{e}");
    let e = err("op");
    assert_eq!(e.code(), "AUTOCDC_INVALID_EXPRESSION.TYPE");
    assert!(e.to_string().contains("column `op` has type Utf8"), "{e}");
    let cases = [
        ("kind + 1 > 2", "UNSUPPORTED"),
        ("op IN (SELECT 1)", "UNSUPPORTED"),
        ("1 = 1", "UNSUPPORTED"),
        ("op ILIKE 'd'", "UNSUPPORTED"),
        ("op = = 'D'", "PARSE"),
        ("", "PARSE"),
        ("op = 'D' garbage", "PARSE"),
        ("))((", "PARSE"),
        ("op = 5", "TYPE"),
        ("kind = 'abc'", "TYPE"),
        ("kind LIKE '1%'", "TYPE"),
        ("op = deleted_at", "TYPE"),
        ("NOT kind", "TYPE"),
        ("soft = 1", "TYPE"),
    ];
    for (sql, code) in cases {
        assert_eq!(
            err(sql).code(),
            format!("AUTOCDC_INVALID_EXPRESSION.{code}"),
            "{sql}"
        );
    }
}

#[test]
fn eval_error_on_missing_column() {
    let schema = Schema::new(vec![Field::new("other", DataType::Utf8, true)]);
    let e = Predicate::parse("other = 'D'", &schema)
        .unwrap()
        .evaluate(&batch());
    assert_eq!(e.unwrap_err().code(), "AUTOCDC_INVALID_EXPRESSION.EVAL");
}

/// Chains the compiler refuses are built thousands deep: refusing them
/// (and showing them) must not overflow the stack.
#[test]
fn deep_chains_are_refused_without_overflowing_the_stack() {
    let schema = Schema::new(vec![Field::new("kind", DataType::Int64, true)]);
    for sql in [
        format!("kind = {}", vec!["kind"; 9_000].join(" + ")),
        vec!["kind"; 9_000].join(" = "),
        format!("CASE WHEN {} THEN 1 END", vec!["kind"; 9_000].join(" - ")),
    ] {
        let e = Predicate::parse(&sql, &schema).unwrap_err();
        assert_eq!(e.code(), codes::UNSUPPORTED, "{}", &sql[..40]);
    }
}
