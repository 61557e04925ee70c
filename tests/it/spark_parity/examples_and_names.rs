//! The Databricks documentation example ("users"), and names: case-insensitive resolution, backtick-quoted identifiers.

use super::*;

// ---------------------------------------------------------------------------
// The Databricks AUTO CDC documentation example ("users")
// ---------------------------------------------------------------------------

/// The example's change feed, in the batches of its notebook: the initial
/// load, new users, Isabel removed and Mercedes moved, then two updates
/// arriving out of order.
const USERS_FEED: [&str; 4] = [
    r#"
    {"userId": 124, "name": "Raul", "city": "Oaxaca", "operation": "INSERT", "sequenceNum": 1}
    {"userId": 123, "name": "Isabel", "city": "Monterrey", "operation": "INSERT", "sequenceNum": 1}
    "#,
    r#"
    {"userId": 125, "name": "Mercedes", "city": "Tijuana", "operation": "INSERT", "sequenceNum": 2}
    {"userId": 126, "name": "Lily", "city": "Cancun", "operation": "INSERT", "sequenceNum": 2}
    "#,
    r#"
    {"userId": 123, "name": null, "city": null, "operation": "DELETE", "sequenceNum": 6}
    {"userId": 125, "name": "Mercedes", "city": "Guadalajara", "operation": "UPDATE", "sequenceNum": 6}
    "#,
    r#"
    {"userId": 125, "name": "Mercedes", "city": "Mexicali", "operation": "UPDATE", "sequenceNum": 5}
    {"userId": 123, "name": "Isabel", "city": "Chihuahua", "operation": "UPDATE", "sequenceNum": 5}
    "#,
];

/// The example's truncate (the commented-out last row of its data).
const USERS_TRUNCATE: &str =
    r#"{"userId": null, "name": null, "city": null, "operation": "TRUNCATE", "sequenceNum": 3}"#;

const USERS_COLUMNS: &str = r#"columns = [
  { name = "userId", type = "int" },
  { name = "name", type = "string" },
  { name = "city", type = "string" },
  { name = "operation", type = "string" },
  { name = "sequenceNum", type = "int" },
]"#;

fn users(extra: &str) -> String {
    format!(
        "{}\n{}\n{}",
        r#"keys = ["userId"]
sequence_by = "sequenceNum"
apply_as_deletes = "operation = 'DELETE'"
except_column_list = ["operation", "sequenceNum"]"#,
        extra,
        USERS_COLUMNS
    )
}

/// Databricks docs, "The AUTO CDC APIs: Simplify change data capture" (users example), SCD type 1:
/// the target holds Raul, Mercedes in Guadalajara (the late update at 5 is ignored) and Lily;
/// with the TRUNCATE at sequence 3, only Mercedes.
#[test]
fn databricks_users_example_scd1_with_delete_and_truncate() {
    scenario(
        &users(""),
        &USERS_FEED,
        &[
            &["124", "Raul", "Oaxaca"],
            &["125", "Mercedes", "Guadalajara"],
            &["126", "Lily", "Cancun"],
        ],
    );
    let mut with_truncate = USERS_FEED.to_vec();
    with_truncate.push(USERS_TRUNCATE);
    scenario(
        &users(r#"apply_as_truncates = "operation = 'TRUNCATE'""#),
        &with_truncate,
        &[&["125", "Mercedes", "Guadalajara"]],
    );
}

/// Databricks docs, "The AUTO CDC APIs: Simplify change data capture" (users example), SCD type 2,
/// and "Track history for only specified columns with SCD type 2" (`TRACK HISTORY ON * EXCEPT
/// (city)`: city changes update the current row in place).
#[test]
fn databricks_users_example_scd2_and_tracked_columns() {
    scenario(
        &users("stored_as_scd_type = 2"),
        &USERS_FEED,
        &[
            &["123", "Isabel", "Monterrey", "1", "5"],
            &["123", "Isabel", "Chihuahua", "5", "6"],
            &["124", "Raul", "Oaxaca", "1", "NULL"],
            &["125", "Mercedes", "Tijuana", "2", "5"],
            &["125", "Mercedes", "Mexicali", "5", "6"],
            &["125", "Mercedes", "Guadalajara", "6", "NULL"],
            &["126", "Lily", "Cancun", "2", "NULL"],
        ],
    );
    scenario(
        &users("stored_as_scd_type = 2\ntrack_history_except_column_list = [\"city\"]"),
        &USERS_FEED,
        &[
            &["123", "Isabel", "Chihuahua", "1", "6"],
            &["124", "Raul", "Oaxaca", "1", "NULL"],
            &["125", "Mercedes", "Guadalajara", "2", "NULL"],
            &["126", "Lily", "Cancun", "2", "NULL"],
        ],
    );
}

// ---------------------------------------------------------------------------
// Names: case-insensitive resolution, backtick-quoted identifiers
// ---------------------------------------------------------------------------

/// Spark: Scd1ForeachBatchHandlerSuite / Scd2ForeachBatchHandlerSuite, the
/// case-insensitive resolution tests (Spark's default resolver): keys,
/// sequence and column lists name columns in any case, and so do the
/// input's fields.
#[test]
fn names_resolve_regardless_of_case() {
    for (scd, expected) in [
        ("1", vec![vec!["1", "b"]]),
        (
            "2",
            vec![vec!["1", "a", "1", "2"], vec!["1", "b", "2", "NULL"]],
        ),
    ] {
        let toml = format!(
            r#"
keys = ["ID"]
sequence_by = "Seq"
except_column_list = ["SEQ"]
stored_as_scd_type = {scd}
columns = [
  {{ name = "id", type = "int" }},
  {{ name = "Value", type = "string" }},
  {{ name = "seq", type = "long" }},
]
"#
        );
        let expected: Vec<&[&str]> = expected.iter().map(|r| r.as_slice()).collect();
        scenario(
            &toml,
            &[
                r#"{"Id": 1, "VALUE": "a", "SEQ": 1}"#,
                r#"{"id": 1, "value": "b", "seq": 2}"#,
            ],
            &expected,
        );
    }
}

/// `case_sensitive = true`: exact names only, in the definition and the input.
#[test]
fn case_sensitive_flows_match_names_exactly() {
    let exact = r#"
keys = ["id"]
sequence_by = "seq"
case_sensitive = true
columns = [
  { name = "id", type = "int" },
  { name = "seq", type = "long" },
]
"#;
    let f = flow(exact);
    let e = decode_ndjson(&f, br#"{"ID": 1, "seq": 1}"#, Limits::NONE).unwrap_err();
    assert_eq!(e.code(), codes::BAD_COLUMN, "{e}");
    let e = Flow::new(config(
        "p",
        "spark.t",
        &exact.replace(r#"keys = ["id"]"#, r#"keys = ["ID"]"#),
    ))
    .unwrap_err();
    assert_eq!(e.code(), codes::COLUMNS_NOT_FOUND, "{e}");
}

/// Spark: the special-character key tests of the durability suites: a
/// column whose name holds a dot is named with backticks in keys and lists
/// (unquoted, `a.b` stays MULTIPART_COLUMN_IDENTIFIER) and survives restarts.
#[test]
fn dotted_names_are_quoted_with_backticks() {
    let toml = r#"
keys = ["`order.id`"]
sequence_by = "`event.seq`"
column_list = ["`order.id`", "`order.total`"]
columns = [
  { name = "order.id", type = "long" },
  { name = "order.total", type = "double" },
  { name = "event.seq", type = "long" },
]
"#;
    scenario(
        toml,
        &[
            "{\"order.id\": 1, \"order.total\": 2.5, \"event.seq\": 1}\n{\"order.id\": 2, \"order.total\": 4.5, \"event.seq\": 1}",
            "{\"order.id\": 1, \"order.total\": 3.5, \"event.seq\": 2}",
        ],
        &[&["1", "3.5"], &["2", "4.5"]],
    );
    let e = Flow::new(config(
        "p",
        "spark.t",
        &toml.replace("[\"`order.id`\"]", "[\"order.id\"]"),
    ))
    .unwrap_err();
    assert_eq!(e.code(), codes::MULTIPART_IDENTIFIER, "{e}");
}
