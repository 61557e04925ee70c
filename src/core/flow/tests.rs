//! `Flow::new` on definitions that pass and on those it refuses, a code each.

use iceberg::spec::Transform;

use super::*;

fn base() -> FlowConfig {
    toml::from_str(
        r#"
        name = "customers"
        target = "crm.customers"
        keys = ["id"]
        sequence_by = "seq"
        apply_as_deletes = "op = 'DELETE'"
        except_column_list = ["op"]
        columns = [
          { name = "id", type = "long", required = true },
          { name = "city", type = "string" },
          { name = "op", type = "string" },
          { name = "seq", type = "long", required = true },
        ]
        "#,
    )
    .unwrap()
}

fn code_of(c: FlowConfig) -> &'static str {
    Flow::new(c).unwrap_err().code()
}

#[test]
fn valid_flow_builds_target_schema_with_identifier_keys() {
    let f = Flow::new(base()).unwrap();
    let names: Vec<_> = f
        .target_schema
        .as_struct()
        .fields()
        .iter()
        .map(|f| f.name.clone())
        .collect();
    assert_eq!(names, ["id", "city", "seq"]);
    assert_eq!(
        f.target_schema.identifier_field_ids().collect::<Vec<_>>(),
        vec![1]
    );
    assert!(f.target_schema.as_struct().fields()[0].required);
    assert_eq!(f.state_ident().name(), "customers__autocdc_state");
    assert_eq!(f.tombstone_gc, Duration::from_secs(172_800));
}

#[test]
fn empty_keys() {
    let mut c = base();
    c.keys.clear();
    assert_eq!(code_of(c), codes::EMPTY_KEYS);
}

#[test]
fn unknown_key_column() {
    let mut c = base();
    c.keys = vec!["customer_id".into()];
    let e = Flow::new(c).unwrap_err();
    assert_eq!(e.code(), codes::COLUMNS_NOT_FOUND);
    assert!(e.to_string().contains("customer_id"));
}

#[test]
fn multipart_sequence() {
    let mut c = base();
    c.sequence_by = OneOrMany::One("changes.seq".into());
    let e = Flow::new(c).unwrap_err();
    assert_eq!(e.code(), codes::MULTIPART_IDENTIFIER);
    assert!(e.to_string().contains("`seq`"), "{e}");
}

#[test]
fn reserved_column() {
    let mut c = base();
    c.columns.push(ColumnDef {
        name: "__START_AT".into(),
        ty: "long".into(),
        required: false,
        renamed_from: None,
    });
    assert_eq!(code_of(c), codes::RESERVED_COLUMN);
}

#[test]
fn both_selections() {
    let mut c = base();
    c.column_list = Some(vec!["id".into()]);
    assert_eq!(code_of(c), codes::INVALID_SELECTION);
}

#[test]
fn key_left_out_of_selection() {
    let mut c = base();
    c.except_column_list = Some(vec!["id".into()]);
    assert_eq!(code_of(c), codes::INVALID_SELECTION);
}

#[test]
fn boolean_sequence_is_not_orderable() {
    let mut c = base();
    c.columns.push(ColumnDef {
        name: "flag".into(),
        ty: "boolean".into(),
        required: false,
        renamed_from: None,
    });
    c.sequence_by = OneOrMany::Many(vec!["seq".into(), "flag".into()]);
    assert_eq!(code_of(c), codes::NON_ORDERABLE_SEQUENCE);
}

#[test]
fn scd_types_other_than_1_and_2_are_rejected() {
    let mut c = base();
    c.stored_as_scd_type = 3;
    assert_eq!(code_of(c), codes::INVALID_DEFINITION);
}

#[test]
fn scd2_target_has_the_interval_columns_and_no_identifier() {
    let mut c = base();
    c.stored_as_scd_type = 2;
    let f = Flow::new(c).unwrap();
    let fields = f.target_schema.as_struct().fields();
    let names: Vec<_> = fields.iter().map(|f| f.name.clone()).collect();
    assert_eq!(names, ["id", "city", "seq", START_AT, END_AT]);
    assert_eq!(fields[3].field_type, fields[2].field_type);
    assert!(!fields[4].required);
    assert_eq!(f.target_schema.identifier_field_ids().count(), 0);
    // Tracked by default, as in Spark: every value column, the sequence too.
    assert_eq!(f.tracked, vec![1, 3]);
    assert!(f.keeps_history());
}

#[test]
fn truncates_are_rejected_on_scd2() {
    let mut c = base();
    c.stored_as_scd_type = 2;
    c.apply_as_truncates = Some("op = 'TRUNCATE'".into());
    let e = Flow::new(c).unwrap_err();
    assert_eq!(e.code(), "AUTOCDC_TRUNCATE_SCD2_NOT_SUPPORTED");
}

#[test]
fn track_history_needs_scd2_and_plain_value_columns() {
    let mut c = base();
    c.track_history_column_list = Some(vec!["city".into()]);
    assert_eq!(code_of(c.clone()), codes::INVALID_DEFINITION);
    c.stored_as_scd_type = 2;
    assert!(Flow::new(c.clone()).is_ok());
    // A sequence column kept in the target may be tracked (Spark's default tracks it).
    c.track_history_column_list = Some(vec!["seq".into()]);
    assert_eq!(Flow::new(c.clone()).unwrap().tracked, vec![3]);
    c.track_history_column_list = Some(vec!["id".into()]);
    assert_eq!(code_of(c.clone()), codes::INVALID_SELECTION);
    c.track_history_except_column_list = Some(vec!["city".into()]);
    assert_eq!(code_of(c.clone()), codes::INVALID_SELECTION);
    c.track_history_column_list = None;
    assert_eq!(Flow::new(c).unwrap().tracked, vec![3]);
}

#[test]
fn ignore_nulls_of_some_columns_take_a_list_or_an_except_list() {
    let mut c = base();
    assert!(Flow::new(c.clone()).unwrap().ignore_null_cols.is_empty());
    c.ignore_null_updates = true;
    assert_eq!(Flow::new(c.clone()).unwrap().ignore_null_cols, vec![1, 3]);
    c.ignore_null_updates = false;
    c.ignore_null_updates_column_list = Some(vec!["city".into()]);
    let f = Flow::new(c.clone()).unwrap();
    assert_eq!(
        (f.ignore_null_cols.clone(), f.keeps_history()),
        (vec![1], true)
    );
    c.ignore_null_updates_column_list = Some(vec!["id".into()]);
    assert_eq!(code_of(c.clone()), codes::INVALID_SELECTION);
    c.ignore_null_updates_column_list = Some(vec!["op".into()]);
    assert_eq!(code_of(c.clone()), codes::INVALID_SELECTION);
    c.ignore_null_updates_column_list = Some(vec!["nope".into()]);
    assert_eq!(code_of(c.clone()), codes::COLUMNS_NOT_FOUND);
    c.ignore_null_updates_except_column_list = Some(vec!["city".into()]);
    assert_eq!(code_of(c.clone()), codes::INVALID_SELECTION);
    c.ignore_null_updates_column_list = None;
    assert_eq!(Flow::new(c.clone()).unwrap().ignore_null_cols, vec![3]);
    // Every column excepted: nothing is ignored, no history is kept.
    c.ignore_null_updates_except_column_list = Some(vec!["city".into(), "seq".into()]);
    assert!(!Flow::new(c.clone()).unwrap().keeps_history());
    c.from_snapshot = true;
    c.sequence_by = OneOrMany::default();
    c.apply_as_deletes = None;
    assert_eq!(code_of(c), codes::INVALID_DEFINITION);
}

/// Spark resolves names regardless of case by default; backticks quote
/// a name that holds a dot; an unquoted dotted name stays multi-part.
#[test]
fn names_resolve_regardless_of_case_and_quoted_with_backticks() {
    let mut c = base();
    c.keys = vec!["ID".into()];
    c.sequence_by = OneOrMany::One("Seq".into());
    c.except_column_list = Some(vec!["OP".into()]);
    c.partition_by = vec!["bucket[4](Id)".into()];
    let f = Flow::new(c.clone()).unwrap();
    assert_eq!((f.key_idx.clone(), f.seq_idx.clone()), (vec![0], vec![3]));
    assert_eq!(f.target_cols, vec![0, 1, 3]);
    assert_eq!(f.partition_spec.fields().len(), 1);
    assert_eq!(f.input_column("CITY"), Some(1));
    c.case_sensitive = true;
    assert_eq!(code_of(c.clone()), codes::COLUMNS_NOT_FOUND);

    let mut c = base();
    c.columns[1].name = "addr.city".into();
    c.keys = vec!["id".into(), "`addr.city`".into()];
    let f = Flow::new(c.clone()).unwrap();
    assert_eq!(f.key_idx, vec![0, 1]);
    assert_eq!(f.column_name(1), "addr.city");
    for (key, code) in [
        ("addr.city", codes::MULTIPART_IDENTIFIER),
        ("`addr.city", codes::INVALID_DEFINITION),
        ("``", codes::INVALID_DEFINITION),
        ("`a`b`", codes::INVALID_DEFINITION),
    ] {
        c.keys = vec![key.into()];
        assert_eq!(code_of(c.clone()), code, "{key}");
    }
    c.columns[1].name = "a`b".into();
    c.keys = vec!["`a``b`".into()];
    assert_eq!(Flow::new(c).unwrap().key_idx, vec![1]);
}

#[test]
fn partition_by_parses_iceberg_and_spark_notation() {
    for (text, col, t) in [
        ("city", "city", Transform::Identity),
        ("identity(city)", "city", Transform::Identity),
        ("bucket[16](id)", "id", Transform::Bucket(16)),
        ("bucket(16, id)", "id", Transform::Bucket(16)),
        ("truncate[2](city)", "city", Transform::Truncate(2)),
        ("truncate(2, city)", "city", Transform::Truncate(2)),
        ("day(ts)", "ts", Transform::Day),
        ("days(ts)", "ts", Transform::Day),
        (" HOUR( ts ) ", "ts", Transform::Hour),
        ("year(ts)", "ts", Transform::Year),
        ("month(ts)", "ts", Transform::Month),
    ] {
        assert_eq!(
            parse_partition_field(text),
            Some((col.to_string(), t)),
            "{text}"
        );
    }
    for bad in [
        "bucket(id)",
        "bucket[0](id)",
        "void(id)",
        "day(ts",
        "f(a, b)",
        "day()",
    ] {
        assert_eq!(parse_partition_field(bad), None, "{bad}");
    }
}

#[test]
fn partition_by_builds_a_bound_spec() {
    let mut c = base();
    c.partition_by = vec!["bucket[8](id)".into(), "truncate[1](city)".into()];
    let f = Flow::new(c).unwrap();
    let names: Vec<_> = f
        .partition_spec
        .fields()
        .iter()
        .map(|p| (p.name.clone(), p.source_id, p.transform))
        .collect();
    assert_eq!(
        names,
        [
            ("id_bucket".to_string(), 1, Transform::Bucket(8)),
            ("city_trunc".to_string(), 2, Transform::Truncate(1)),
        ]
    );
    assert!(Flow::new(base()).unwrap().partition_spec.is_unpartitioned());
}

#[test]
fn partition_by_errors_name_the_entry() {
    let mut c = base();
    c.partition_by = vec!["day(op)".into()];
    // `op` is left out of the target by except_column_list.
    let e = Flow::new(c).unwrap_err();
    assert_eq!(e.code(), codes::COLUMNS_NOT_FOUND);
    assert!(e.to_string().contains("`op`"), "{e}");
    let mut c = base();
    c.partition_by = vec!["day(city)".into()];
    let e = Flow::new(c).unwrap_err();
    assert_eq!(e.code(), codes::INVALID_DEFINITION);
    assert!(
        e.to_string().contains("day(city)") && e.to_string().contains("string"),
        "{e}"
    );
    let mut c = base();
    c.partition_by = vec!["zorder(city)".into()];
    let e = Flow::new(c).unwrap_err();
    assert_eq!(e.code(), codes::INVALID_DEFINITION);
    assert!(e.to_string().contains("zorder(city)"), "{e}");
}

#[test]
fn bad_delete_expression_names_column() {
    let mut c = base();
    c.apply_as_deletes = Some("operation = 'DELETE'".into());
    let e = Flow::new(c).unwrap_err();
    assert_eq!(e.code(), codes::COLUMNS_NOT_FOUND);
    assert!(e.to_string().contains("operation"));
}

#[test]
fn multi_level_namespace() {
    let mut c = base();
    c.target = "a.b.customers".into();
    let f = Flow::new(c).unwrap();
    assert_eq!(f.target.namespace().as_ref().len(), 2);
    let mut c = base();
    c.target = "customers".into();
    assert_eq!(code_of(c), codes::INVALID_DEFINITION);
}
