//! Nested columns (struct, list, map) and columns named like iceberg-rust's
//! metadata columns, through the Hadoop catalog with restarts.

use super::*;

/// A nested-column flow definition: `scd` type, `address` of `address`
/// type and `extra` columns before `seq`.
fn nested_definition(target: &str, scd: u8, address: &str, extra: &str) -> Flow {
    let toml = format!(
        r#"
name = "{name}"
target = "{target}"
keys = ["id"]
sequence_by = "seq"
apply_as_deletes = "op = 'D'"
except_column_list = ["op"]
stored_as_scd_type = {scd}
columns = [
  {{ name = "id", type = "int" }},
  {{ name = "address", type = "{address}" }},
  {{ name = "tags", type = "list<string>" }},
  {{ name = "scores", type = "map<string, long>" }},
  {extra}
  {{ name = "seq", type = "long" }},
  {{ name = "op", type = "string" }},
]
"#,
        name = target.replace('.', "_")
    );
    Flow::new(toml::from_str(&toml).unwrap()).unwrap()
}

/// Nested columns (struct, list, map), SCD Type 1 and 2, applied with a
/// restart before every batch, and a table whose nested columns evolve (a
/// struct gains a field and widens one, a nested column is added). With
/// `AUTOCDC_E2E_OUT` the tables are left for the independent readers, their
/// rows as JSON values (`"json": true`): DuckDB and PyIceberg show nested
/// values in their own forms, which `readers.py` brings to one.
#[test]
fn nested_columns_through_the_hadoop_catalog_with_restarts() {
    let batches = [
        r#"
        {"id": 1, "address": {"city": "Leeds", "zip": 1}, "tags": ["a", "b"], "scores": {"x": 1}, "seq": 1}
        {"id": 2, "address": {"city": "York"}, "tags": [], "scores": {}, "seq": 1}
        {"id": 4, "address": {"city": "Hull", "zip": 4}, "tags": ["h"], "scores": {"h": 4}, "seq": 1}
        "#,
        r#"
        {"id": 1, "address": {"city": "Bath", "zip": 2}, "tags": ["c", null], "scores": {"x": 2, "y": 3}, "seq": 3}
        {"id": 1, "address": {"city": "late", "zip": 0}, "seq": 2}
        {"id": 2, "op": "D", "seq": 2}
        {"id": 3, "address": null, "tags": null, "scores": null, "seq": 1}
        "#,
        r#"
        {"id": 4, "address": {"city": "Hull", "zip": 5}, "tags": ["h"], "scores": {"h": 4}, "seq": 2}
        {"id": 1, "address": {"city": "Bath", "zip": 2}, "tags": ["c", null], "scores": {"x": 2, "y": 3}, "seq": 4}
        "#,
    ];
    let v1 = "struct<city: string, zip: int>";
    let v2 = "struct<city: string, country: string, zip: long>";
    let notes = r#"{ name = "notes", type = "list<struct<at: date, text: string>>" },"#;
    let evolved = [
        (
            nested_definition("nested.evolved", 2, v1, ""),
            &batches[..2],
        ),
        (
            nested_definition("nested.evolved", 2, v2, notes),
            &[r#"
            {"id": 4, "address": {"city": "Hull", "country": "UK", "zip": 5}, "notes": [{"at": "2026-12-01", "text": "moved"}], "seq": 2}
            {"id": 5, "address": {"city": "Lyon", "country": "FR", "zip": 69}, "notes": [], "seq": 1}
            "#][..],
        ),
    ];
    let out = e2e_out();
    // SCD Type 2 tracks `seq` too (Spark's default): 8 versions.
    let cases = [
        (
            vec![(
                nested_definition("nested.people_scd1", 1, v1, ""),
                &batches[..],
            )],
            3usize,
        ),
        (
            vec![(
                nested_definition("nested.people_scd2", 2, v1, ""),
                &batches[..],
            )],
            8,
        ),
        (evolved.to_vec(), 8),
    ];
    for (runs, rows) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let wh = out
            .as_ref()
            .map(|o| o.join("warehouse"))
            .unwrap_or_else(|| tmp.path().to_path_buf());
        let flow = runs[0].0.clone();
        rt().block_on(async {
            let cat = catalog(&wh, Arc::new(Faults::default()));
            cat.drop_table(&flow.target).await.unwrap();
            cat.drop_table(&flow.state_ident()).await.unwrap();
            let mut i = 0;
            for (flow, batches) in &runs {
                for b in batches.iter() {
                    let batch = autocdc::service::input::decode_ndjson(
                        flow,
                        b.as_bytes(),
                        autocdc::service::input::Limits::NONE,
                    )
                    .unwrap();
                    let mut engine = open(&wh, flow).await;
                    engine.apply(&batch, 1_000 + i).await.unwrap();
                    i += 1;
                }
            }
            let last = &runs.last().unwrap().0;
            let engine = open(&wh, last).await;
            let got = table_rows(&engine).await;
            let target = &last.config.target;
            assert_eq!(got.len(), rows, "{target}: {got:?}");
            let bath = got.iter().any(|r| {
                r[1].starts_with("{city: Bath") && r.contains(&"{x: 2, y: 3}".to_string())
            });
            assert!(bath, "{target}: {got:?}");
            assert_eq!(
                snapshot_property(&engine, "total-equality-deletes").as_deref(),
                Some("0")
            );
            let Some(o) = &out else { return };
            let columns = column_names(&engine);
            let mut json_rows = Vec::new();
            for b in engine.scan_target().await.unwrap() {
                let mut w = arrow_json::ArrayWriter::new(Vec::new());
                w.write(&b).unwrap();
                w.finish().unwrap();
                let objects: Vec<serde_json::Value> =
                    serde_json::from_slice(&w.into_inner()).unwrap();
                for obj in objects {
                    let row: Vec<serde_json::Value> = columns
                        .iter()
                        .map(|c| obj.get(c).cloned().unwrap_or(serde_json::Value::Null))
                        .collect();
                    json_rows.push(row);
                }
            }
            let dir = o.join("expected");
            std::fs::create_dir_all(&dir).unwrap();
            let case = serde_json::json!({
                "name": target,
                "metadata": engine.target().metadata_location,
                "keys": last.config.keys,
                "columns": columns,
                "json": true,
                "rows": json_rows,
            });
            let file = format!("{}.json", target.replace('.', "_"));
            std::fs::write(dir.join(file), case.to_string()).unwrap();
        });
    }
}

/// A key column named `pos` (or a column `file_path`): iceberg-rust's scan
/// takes those names for its metadata columns, so a flow keyed by `pos`
/// could not read its state back at a restart, nor `autocdc show` its
/// target. The state is now read from its files, and such a target with
/// autocdc's own reader.
#[test]
fn columns_named_like_iceberg_rust_metadata_columns_survive_restarts() {
    let toml = r#"
name = "meta_names"
target = "meta.names"
keys = ["pos"]
sequence_by = "seq"
columns = [
  { name = "pos", type = "long" },
  { name = "file_path", type = "string" },
  { name = "seq", type = "long" },
]
"#;
    let flow = Flow::new(toml::from_str(toml).unwrap()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let batch = |body: &str| {
        autocdc::service::input::decode_ndjson(
            &flow,
            body.as_bytes(),
            autocdc::service::input::Limits::NONE,
        )
        .unwrap()
    };
    rt().block_on(async {
        let mut e = open(tmp.path(), &flow).await;
        e.apply(&batch(r#"{"pos": 1, "file_path": "a", "seq": 5}"#), 1)
            .await
            .unwrap();
        drop(e);
        let mut e = open(tmp.path(), &flow).await;
        let r = e
            .apply(
                &batch(
                    "{\"pos\": 1, \"file_path\": \"old\", \"seq\": 4}\n{\"pos\": 2, \"seq\": 1}",
                ),
                2,
            )
            .await
            .unwrap();
        assert_eq!((r.stats.stale, r.stats.upserts), (1, 1), "{:?}", r.stats);
        assert_eq!(
            table_rows(&e).await,
            rows(&[&["1", "a", "5"], &["2", "NULL", "1"]])
        );
    });
}
