//! Bodies, headers and values that are refused with their 4xx.

use std::io::{Read, Write};
use std::sync::Arc;

use serde_json::json;

use super::{leeds, still_serving};
use crate::common;
use common::http::*;
use common::*;

/// A string key over `max_key_bytes` is refused at ingest with its row and
/// column (it used to be acknowledged and then panic the committer forever).
#[test]
fn a_key_over_max_key_bytes_is_refused_before_the_acknowledgement() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let mut f = flow_cfg("c", "50ms");
        // A string-keyed flow: the customers flow keyed on `city` too.
        f.keys = vec!["id".into(), "city".into()];
        f.max_key_bytes = Some(100);
        let r = start(config(tmp.path(), vec![f])).await;
        let c = reqwest::Client::new();
        let long = "x".repeat(70 << 10);
        let body = format!(
            "{}\n{}",
            json!({"id": 1, "city": "Leeds", "op": "UPSERT", "seq": 1}),
            json!({"id": 2, "city": long, "op": "UPSERT", "seq": 2})
        );
        let (s, v) = post(
            &c,
            &url(&r, "/v1/flows/c/changes"),
            "application/x-ndjson",
            body,
            None,
        )
        .await;
        assert_eq!(s, 400, "{v}");
        assert_eq!(
            v["error"]["code"], "AUTOCDC_MICROBATCH_VALIDATION.KEY_TOO_LONG",
            "{v}"
        );
        assert_eq!(
            (v["error"]["row"].as_u64(), v["error"]["column"].as_str()),
            (Some(1), Some("city")),
            "{v}"
        );
        let st = flow_status(&c, &r, "c").await;
        assert_eq!(st["status"]["accepted_batches"], 0, "{st}");
        let good = [u(1, "Leeds", 1), u(2, "York", 2)];
        let (s, v) = post(
            &c,
            &url(&r, "/v1/flows/c/changes?wait=commit"),
            "application/x-ndjson",
            ndjson(&good),
            None,
        )
        .await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(table(tmp.path(), "c").await, expected(&good));
        r.stop().await.unwrap();
    });
}

/// An upsert without a required column is refused at ingest (it used to be
/// acknowledged and dropped at commit); a delete may leave it out.
#[test]
fn an_upsert_missing_a_required_column_is_refused_at_ingest() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let mut f = flow_cfg("c", "1h");
        f.columns
            .iter_mut()
            .find(|c| c.name == "city")
            .unwrap()
            .required = true;
        let r = start(config(tmp.path(), vec![f])).await;
        let c = reqwest::Client::new();
        let changes = url(&r, "/v1/flows/c/changes");
        let body = format!(
            "{}\n{}",
            json!({"id": 1, "city": "Leeds", "op": "UPSERT", "seq": 1}),
            json!({"id": 2, "op": "UPSERT", "seq": 2})
        );
        let (s, v) = post(&c, &changes, "application/x-ndjson", body, None).await;
        assert_eq!(s, 400, "{v}");
        assert_eq!(
            v["error"]["code"], "AUTOCDC_MICROBATCH_VALIDATION.COLUMN",
            "{v}"
        );
        assert_eq!(
            (v["error"]["row"].as_u64(), v["error"]["column"].as_str()),
            (Some(1), Some("city")),
            "{v}"
        );
        let delete = json!({"id": 2, "op": "DELETE", "seq": 3}).to_string();
        let (s, v) = post(&c, &changes, "application/x-ndjson", delete, None).await;
        assert_eq!(s, 202, "{v}");
        commit(&c, &r, "c").await;
        let st = flow_status(&c, &r, "c").await;
        assert_eq!(st["status"]["rejected_at_commit"], 0, "{st}");
        r.stop().await.unwrap();
    });
}

/// A `Content-Length` over `max_body_bytes` gets 413 at once, before any of
/// the body is sent (it used to wait for the body until the request timeout).
#[test]
fn a_declared_body_over_the_limit_gets_413_before_it_is_sent() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let r = start(config(tmp.path(), vec![flow_cfg("c", "1h")])).await;
        let addr = r.addr;
        let answer = tokio::task::spawn_blocking(move || {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
            write!(
                s,
                "POST /v1/flows/c/changes HTTP/1.1\r\nhost: x\r\ncontent-type: application/x-ndjson\r\ncontent-length: 1000000000\r\n\r\n{{}}"
            )
            .unwrap();
            let mut buf = [0u8; 4096];
            let n = s.read(&mut buf).unwrap();
            String::from_utf8_lossy(&buf[..n]).to_string()
        })
        .await
        .unwrap();
        assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
        assert!(answer.contains("AUTOCDC_BODY_TOO_LARGE"), "{answer}");
        still_serving(&reqwest::Client::new(), &r, tmp.path()).await;
        r.stop().await.unwrap();
    });
}

/// An empty `Idempotency-Key` is a 400 (it used to count as a key, so a
/// second, different batch was answered `duplicate` and never applied).
#[test]
fn an_empty_idempotency_key_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let r = start(config(tmp.path(), vec![flow_cfg("c", "1h")])).await;
        let c = reqwest::Client::new();
        for key in ["", "  "] {
            let (s, v) = post(
                &c,
                &url(&r, "/v1/flows/c/changes"),
                "application/x-ndjson",
                ndjson(&CUSTOMERS_EVENTS),
                Some(key),
            )
            .await;
            assert_eq!(
                (s, v["error"]["code"].as_str()),
                (400, Some("AUTOCDC_BAD_IDEMPOTENCY_KEY")),
                "{v}"
            );
        }
        let st = flow_status(&c, &r, "c").await;
        assert_eq!(st["status"]["accepted_batches"], 0, "{st}");
        still_serving(&c, &r, tmp.path()).await;
        r.stop().await.unwrap();
    });
}

/// The stream's messages: (metadata range, body length).
fn ipc_messages(stream: &[u8]) -> Vec<(std::ops::Range<usize>, i64)> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos + 8 <= stream.len() {
        let len = i32::from_le_bytes(stream[pos + 4..pos + 8].try_into().unwrap()) as usize;
        if len == 0 {
            break;
        }
        let meta = pos + 8..pos + 8 + len;
        let body = arrow_ipc::root_as_message(&stream[meta.clone()])
            .unwrap()
            .bodyLength();
        pos = meta.end + body as usize;
        out.push((meta, body));
    }
    out
}

/// Replaces every little-endian i64 `from` inside `range` with `to`.
fn patch_i64(stream: &mut [u8], range: std::ops::Range<usize>, from: i64, to: i64) -> usize {
    let (from, to) = (from.to_le_bytes(), to.to_le_bytes());
    let mut n = 0;
    let mut i = range.start;
    while i + 8 <= range.end {
        if stream[i..i + 8] == from {
            stream[i..i + 8].copy_from_slice(&to);
            n += 1;
            i += 8;
        } else {
            i += 1;
        }
    }
    n
}

/// Arrow IPC bodies that lie about their lengths used to abort the process
/// (a 2^40-byte allocation) or make it allocate 2 GiB for a 72-byte body;
/// now each is a 400 before anything is allocated on its say-so.
#[test]
fn arrow_bodies_that_lie_about_lengths_are_refused_and_the_process_lives() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let r = start(config(tmp.path(), vec![flow_cfg("c", "50ms")])).await;
        let c = reqwest::Client::new();
        let good = arrow_body(&leeds(77));
        let msgs = ipc_messages(&good);
        let (batch_meta, batch_body) = msgs.last().unwrap().clone();
        let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
        let mut huge_meta = vec![0xff, 0xff, 0xff, 0xff];
        huge_meta.extend_from_slice(&0x7fff_ffffi32.to_le_bytes());
        huge_meta.extend_from_slice(&[0u8; 64]);
        cases.push(("metadata length 0x7fffffff", huge_meta));
        let mut negative = vec![0xff, 0xff, 0xff, 0xff];
        negative.extend_from_slice(&(-5i32).to_le_bytes());
        negative.extend_from_slice(&[0u8; 64]);
        cases.push(("negative metadata length", negative));
        let mut body_len = good.clone();
        assert!(patch_i64(&mut body_len, batch_meta.clone(), batch_body, 1 << 40) >= 1);
        cases.push(("body length 2^40", body_len));
        let mut rows = good.clone();
        assert!(patch_i64(&mut rows, batch_meta.clone(), 77, 1 << 40) >= 1);
        cases.push(("row count 2^40", rows));
        let mut truncated = good.clone();
        truncated.truncate(good.len() - 40);
        cases.push(("truncated body", truncated));
        for (what, body) in cases {
            let (s, v) = post(
                &c,
                &url(&r, "/v1/flows/c/changes"),
                "application/vnd.apache.arrow.stream",
                body,
                None,
            )
            .await;
            assert_eq!(s, 400, "{what}: {v}");
            let code = v["error"]["code"].as_str().unwrap_or_default().to_string();
            assert!(
                code.starts_with("AUTOCDC_MICROBATCH_VALIDATION."),
                "{what}: {v}"
            );
            let msg = v["error"]["message"].as_str().unwrap_or_default();
            assert!(!msg.contains("panicked"), "{what}: {v}");
        }
        let st = flow_status(&c, &r, "c").await;
        assert_eq!(st["status"]["accepted_batches"], 0, "{st}");
        // The untouched stream is accepted.
        let (s, v) = post(
            &c,
            &url(&r, "/v1/flows/c/changes?wait=commit"),
            "application/vnd.apache.arrow.stream",
            good,
            None,
        )
        .await;
        assert_eq!(s, 200, "{v}");
        r.stop().await.unwrap();
    });
}

/// Numbers are converted exactly or refused with their row and column:
/// `1.9` into a long key used to become 1, merging two rows into one.
#[test]
fn numbers_are_never_rounded_in_any_body_format() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let r = start(config(tmp.path(), vec![flow_cfg("c", "1h")])).await;
        let c = reqwest::Client::new();
        let changes = url(&r, "/v1/flows/c/changes");
        let cases: [(&str, &str, &str); 5] = [
            (
                r#"{"id": 20.7, "op": "UPSERT", "seq": 1}"#,
                "id",
                "fraction",
            ),
            (
                r#"{"id": 1, "op": "UPSERT", "seq": 1.9}"#,
                "seq",
                "fraction",
            ),
            (
                r#"{"id": -9223372036854775809, "op": "UPSERT", "seq": 1}"#,
                "id",
                "out of range",
            ),
            (
                r#"{"id": 1e400, "op": "UPSERT", "seq": 1}"#,
                "id",
                "out of range",
            ),
            (
                r#"{"id": "x1", "op": "UPSERT", "seq": 1}"#,
                "id",
                "cannot be read",
            ),
        ];
        for (row, column, why) in cases {
            let good = r#"{"id": 5, "op": "UPSERT", "seq": 5}"#;
            for (ctype, body) in [
                ("application/x-ndjson", format!("{good}\n{row}")),
                ("application/json", format!("[{good}, {row}]")),
            ] {
                let (s, v) = post(&c, &changes, ctype, body, None).await;
                assert_eq!(s, 400, "{ctype} {row}: {v}");
                assert_eq!(
                    (
                        v["error"]["code"].as_str(),
                        v["error"]["row"].as_u64(),
                        v["error"]["column"].as_str()
                    ),
                    (
                        Some("AUTOCDC_MICROBATCH_VALIDATION.COLUMN"),
                        Some(1),
                        Some(column)
                    ),
                    "{ctype} {row}: {v}"
                );
                assert!(
                    v["error"]["message"].as_str().unwrap().contains(why),
                    "{ctype} {row}: {v}"
                );
            }
        }
        // Arrow doubles into a long: 1.0 is 1, 1.9 is refused.
        let seq = |v: f64| {
            let b = arrow_array::RecordBatch::try_from_iter([
                (
                    "id",
                    Arc::new(arrow_array::Int64Array::from(vec![9])) as arrow_array::ArrayRef,
                ),
                (
                    "op",
                    Arc::new(arrow_array::StringArray::from(vec!["UPSERT"])) as _,
                ),
                (
                    "seq",
                    Arc::new(arrow_array::Float64Array::from(vec![v])) as _,
                ),
            ])
            .unwrap();
            let mut w = arrow_ipc::writer::StreamWriter::try_new(Vec::new(), &b.schema()).unwrap();
            w.write(&b).unwrap();
            w.finish().unwrap();
            w.into_inner().unwrap()
        };
        let (s, v) = post(
            &c,
            &changes,
            "application/vnd.apache.arrow.stream",
            seq(1.9),
            None,
        )
        .await;
        assert_eq!(
            (s, v["error"]["column"].as_str()),
            (400, Some("seq")),
            "{v}"
        );
        let st = flow_status(&c, &r, "c").await;
        assert_eq!(st["status"]["accepted_batches"], 0, "{st}");
        let (s, v) = post(
            &c,
            &changes,
            "application/vnd.apache.arrow.stream",
            seq(1.0),
            None,
        )
        .await;
        assert_eq!(s, 202, "{v}");
        // Integral forms of a long are whole numbers, read exactly.
        let exact = r#"{"id": 1.0, "op": "UPSERT", "city": "Leeds", "seq": 2e0}
{"id": 9007199254740993, "op": "UPSERT", "city": "York", "seq": 3}"#;
        let (s, v) = post(&c, &changes, "application/x-ndjson", exact, None).await;
        assert_eq!(s, 202, "{v}");
        commit(&c, &r, "c").await;
        let rows = table(tmp.path(), "c").await;
        assert!(
            rows.iter()
                .any(|row| row.contains(&"9007199254740993".to_string())),
            "{rows:?}"
        );
        r.stop().await.unwrap();
    });
}

/// More rows than `max_rows_per_request` are refused in every format.
#[test]
fn a_body_over_max_rows_per_request_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let mut cfg = config(tmp.path(), vec![flow_cfg("c", "1h")]);
        cfg.server.max_rows_per_request = 10;
        let r = start(cfg).await;
        let c = reqwest::Client::new();
        let changes = url(&r, "/v1/flows/c/changes");
        let evs = leeds(11);
        let lines = ndjson(&evs);
        let array = format!("[{}]", lines.replace('\n', ","));
        for (ctype, body) in [
            ("application/x-ndjson", lines.clone().into_bytes()),
            ("application/json", array.into_bytes()),
            ("application/vnd.apache.arrow.stream", arrow_body(&evs)),
        ] {
            let (s, v) = post(&c, &changes, ctype, body, None).await;
            assert_eq!(
                (s, v["error"]["code"].as_str()),
                (400, Some("AUTOCDC_MICROBATCH_VALIDATION.TOO_LARGE")),
                "{ctype}: {v}"
            );
        }
        let (s, v) = post(
            &c,
            &changes,
            "application/x-ndjson",
            ndjson(&evs[..10]),
            None,
        )
        .await;
        assert_eq!(s, 202, "{v}");
        r.stop().await.unwrap();
    });
}

/// Decimals, timestamps, ints and doubles over HTTP: a lossy decimal, an
/// out-of-range timestamp, a fraction into an int and an overflowing double
/// are each a 400 naming the row and column (they used to become 1.00,
/// 9999-12-31, 1 and infinity).
#[test]
fn typed_columns_refuse_what_they_cannot_hold_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let r = start(config(tmp.path(), vec![])).await;
        let c = reqwest::Client::new();
        let def = json!({
            "target": "shop.typed",
            "keys": ["id"],
            "sequence_by": "seq",
            "columns": [
                {"name": "id", "type": "long", "required": true},
                {"name": "seq", "type": "long", "required": true},
                {"name": "amount", "type": "decimal(10,2)"},
                {"name": "at", "type": "timestamp"},
                {"name": "qty", "type": "int"},
                {"name": "ratio", "type": "double"},
            ],
        });
        let resp = c
            .put(url(&r, "/v1/flows/typed"))
            .json(&def)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 201, "{:?}", resp.text().await);
        let changes = url(&r, "/v1/flows/typed/changes");
        let good = r#"{"id": 1, "seq": 1, "amount": "12.50", "at": "2026-11-30T12:00:00", "qty": 3, "ratio": 0.5}"#;
        for (bad, column) in [
            (r#"{"id": 2, "seq": 1, "amount": 1.005}"#, "amount"),
            (r#"{"id": 2, "seq": 1, "amount": 123456789}"#, "amount"),
            (r#"{"id": 2, "seq": 1, "at": 1e30}"#, "at"),
            (r#"{"id": 2, "seq": 1, "at": "10000-01-01T00:00:00"}"#, "at"),
            (r#"{"id": 2, "seq": 1, "qty": 1.5}"#, "qty"),
            (r#"{"id": 2, "seq": 1, "qty": 3000000000}"#, "qty"),
            (r#"{"id": 2, "seq": 1, "ratio": 1e400}"#, "ratio"),
        ] {
            let (s, v) = post(
                &c,
                &changes,
                "application/x-ndjson",
                format!("{good}\n{bad}"),
                None,
            )
            .await;
            assert_eq!(
                (s, v["error"]["row"].as_u64(), v["error"]["column"].as_str()),
                (400, Some(1), Some(column)),
                "{bad}: {v}"
            );
        }
        let (s, v) = post(
            &c,
            &url(&r, "/v1/flows/typed/changes?wait=commit"),
            "application/x-ndjson",
            good.to_string(),
            None,
        )
        .await;
        assert_eq!(s, 200, "{v}");
        r.stop().await.unwrap();
    });
}
