//! Debezium change events as a flow's input (`format = "debezium"`): the
//! order derived from source positions under every permutation, batching
//! and redelivery (against the source's own history as the oracle), the
//! decoders and placeholders, and real captured events. The service's
//! endpoint and hostile events: `service`; snapshots that run again:
//! `snapshot_rerun`.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};

use arrow_cast::base64::{BASE64_STANDARD, Engine as _};
use autocdc::core::flow::{Flow, FlowConfig};
use autocdc::error::codes;
use autocdc::service::debezium;
use autocdc::service::input::{BodyFormat, Limits};
use common::Sim;
use common::http::*;
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

mod service;
mod snapshot_rerun;

const CUSTOMERS: &str = r#"
name = "customers"
target = "crm.customers"
keys = ["id"]
format = "debezium"
source_table = "public.customers"
columns = [
  { name = "id", type = "int", required = true },
  { name = "name", type = "string" },
  { name = "balance", type = "decimal(12,2)" },
]
"#;

fn customers_cfg() -> FlowConfig {
    toml::from_str(CUSTOMERS).unwrap()
}

/// A decimal(12,2) as Debezium sends it: the unscaled value, base64.
fn b64_cents(cents: i64) -> String {
    let bytes = cents.to_be_bytes();
    // The shortest two's-complement form, as Kafka Connect writes it.
    let mut start = 0;
    while start < 7
        && ((bytes[start] == 0 && bytes[start + 1] & 0x80 == 0)
            || (bytes[start] == 0xff && bytes[start + 1] & 0x80 != 0))
    {
        start += 1;
    }
    BASE64_STANDARD.encode(&bytes[start..])
}

fn cents_text(cents: i64) -> String {
    let sign = if cents < 0 { "-" } else { "" };
    format!("{sign}{}.{:02}", cents.abs() / 100, cents.abs() % 100)
}

/// The value schema Debezium's JSON converter wraps a customers event in.
fn schema() -> Value {
    let row = |name: &str| {
        json!({"type": "struct", "optional": true, "field": name, "name": "dbz.public.customers.Value", "fields": [
            {"type": "int32", "optional": false, "field": "id"},
            {"type": "string", "optional": true, "field": "name"},
            {"type": "bytes", "optional": true, "field": "balance", "name": "org.apache.kafka.connect.data.Decimal",
             "version": 1, "parameters": {"scale": "2", "connect.decimal.precision": "12"}}
        ]})
    };
    json!({"type": "struct", "name": "dbz.public.customers.Envelope", "fields": [
        row("before"), row("after"),
        {"type": "struct", "field": "source", "fields": []},
        {"type": "string", "field": "op"}
    ]})
}

/// A row of the source table: id -> (name, balance in cents).
type Row = (String, i64);

/// One PostgreSQL change event, wrapped with its schema.
fn pg_event(
    table: &str,
    op: &str,
    id: i32,
    row: Option<&Row>,
    last_commit: Option<u64>,
    lsn: u64,
) -> Value {
    let image = |r: Option<&Row>| match r {
        Some((name, cents)) => json!({"id": id, "name": name, "balance": b64_cents(*cents)}),
        None => json!({"id": id, "name": null, "balance": null}),
    };
    let (before, after) = match op {
        "d" => (image(None), Value::Null),
        _ => (Value::Null, image(row)),
    };
    let sequence = json!([last_commit.map(|l| l.to_string()), lsn.to_string()]).to_string();
    json!({"schema": schema(), "payload": {
        "before": before,
        "after": after,
        "source": {"version": "3.6.3.Final", "connector": "postgresql", "name": "dbz", "db": "shop",
                   "schema": "public", "table": table, "snapshot": if op == "r" { "true" } else { "false" },
                   "sequence": sequence, "lsn": lsn, "txId": 1},
        "op": op, "ts_ms": 1
    }})
}

/// A random history of the source table as PostgreSQL's Debezium connector
/// delivers it: a snapshot (whose position is above the first streamed
/// transaction's LSN, as it can be), then transactions of inserts, updates,
/// deletes and primary-key changes (a delete and a create at one LSN).
/// Returns the events in source order and the table at the end.
fn history(seed: u64, txns: usize) -> (Vec<Value>, BTreeMap<i32, Row>) {
    history_of(seed, txns, false)
}

/// `history`, where (with `toast`) an update that leaves a row's name as it
/// was sends Debezium's placeholder for it, as PostgreSQL does for an
/// untouched TOASTed value under REPLICA IDENTITY DEFAULT.
fn history_of(seed: u64, txns: usize, toast: bool) -> (Vec<Value>, BTreeMap<i32, Row>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut table: BTreeMap<i32, Row> = BTreeMap::new();
    let mut events = Vec::new();
    let snapshot_at = 5_000;
    for id in 0..rng.random_range(0..5) {
        let row = (format!("s{id}"), rng.random_range(-500..500));
        events.push(pg_event(
            "customers",
            "r",
            id,
            Some(&row),
            None,
            snapshot_at,
        ));
        table.insert(id, row);
    }
    // The first transaction after the snapshot: no previous commit, and an
    // LSN below the snapshot's.
    let mut last_commit: Option<u64> = None;
    let mut lsn = 4_000;
    for t in 0..txns {
        for _ in 0..rng.random_range(1..4) {
            lsn += rng.random_range(1..3);
            let id = rng.random_range(0..8);
            let row = (
                format!("t{t}-{}", rng.random_range(0..3)),
                rng.random_range(-500..500),
            );
            match (table.contains_key(&id), rng.random_range(0..10)) {
                (false, _) => {
                    events.push(pg_event("customers", "c", id, Some(&row), last_commit, lsn));
                    table.insert(id, row);
                }
                (true, 0..=5) => {
                    let keep_name = toast && rng.random_bool(0.5);
                    let row = if keep_name {
                        (table[&id].0.clone(), row.1)
                    } else {
                        row
                    };
                    let mut e = pg_event("customers", "u", id, Some(&row), last_commit, lsn);
                    if keep_name {
                        e["payload"]["after"]["name"] = json!("__debezium_unavailable_value");
                    }
                    events.push(e);
                    table.insert(id, row);
                }
                (true, 6..=7) => {
                    events.push(pg_event("customers", "d", id, None, last_commit, lsn));
                    table.remove(&id);
                }
                (true, _) => {
                    // UPDATE ... SET id = to: a delete and a create at one position.
                    let to = rng.random_range(0..8);
                    if table.contains_key(&to) {
                        continue;
                    }
                    let moved = table.remove(&id).unwrap();
                    events.push(pg_event("customers", "d", id, None, last_commit, lsn));
                    events.push(pg_event(
                        "customers",
                        "c",
                        to,
                        Some(&moved),
                        last_commit,
                        lsn,
                    ));
                    table.insert(to, moved);
                }
            }
        }
        lsn += 1;
        last_commit = Some(lsn);
    }
    (events, table)
}

fn ndjson_of(events: &[Value]) -> Vec<u8> {
    events
        .iter()
        .map(|e| e.to_string())
        .collect::<Vec<_>>()
        .join("\n")
        .into_bytes()
}

fn decode(flow: &Flow, events: &[Value]) -> arrow_array::RecordBatch {
    debezium::decode(
        flow,
        BodyFormat::Ndjson,
        &ndjson_of(events),
        Limits::NONE,
        true,
    )
    .unwrap()
    .0
}

/// Gives `events` to `step` in the batches `cuts` (percentages of the
/// length) make, and `None` (a restart) after batch `restart_at`.
fn in_batches(
    events: &[Value],
    cuts: &[usize],
    restart_at: usize,
    mut step: impl FnMut(Option<&[Value]>),
) {
    let mut ends: Vec<usize> = cuts.iter().map(|c| c * events.len() / 100).collect();
    ends.push(events.len());
    ends.sort_unstable();
    let mut from = 0;
    for (i, &to) in ends.iter().enumerate() {
        if to > from {
            step(Some(&events[from..to]));
            from = to;
        }
        if i == restart_at {
            step(None);
        }
    }
}

fn rendered(table: &BTreeMap<i32, Row>) -> BTreeSet<Vec<String>> {
    table
        .iter()
        .map(|(id, (name, cents))| vec![id.to_string(), name.clone(), cents_text(*cents)])
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any permutation and batching of the events, with a redelivered run
    /// of them (Debezium after a crash), gives the source table, and exact
    /// duplicates count no ties.
    #[test]
    fn any_order_batching_and_redelivery_gives_the_source_table(
        seed in any::<u64>(),
        txns in 1usize..25,
        redeliver in 0usize..20,
        cuts in prop::collection::vec(0usize..100, 0..6),
        restart_at in 0usize..4,
    ) {
        let (mut events, want) = history(seed, txns);
        let mut rng = StdRng::seed_from_u64(seed ^ 0x9e37);
        if !events.is_empty() {
            let from = rng.random_range(0..events.len());
            let to = (from + redeliver).min(events.len());
            let again: Vec<Value> = events[from..to].to_vec();
            events.extend(again);
        }
        events.shuffle(&mut rng);
        let flow = Flow::new(customers_cfg()).unwrap();
        let mut sim = Sim::new(flow.clone());
        in_batches(&events, &cuts, restart_at, |b| {
            match b {
                Some(events) => { sim.apply(&decode(&flow, events)).unwrap(); }
                None => sim.restart(),
            }
        });
        prop_assert_eq!(sim.table(), rendered(&want));
        prop_assert_eq!(sim.stats.ties, 0);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// `toasted_columns`: a placeholder keeps the key's earlier value, by
    /// sequence, whatever the arrival order and batching, across restarts.
    #[test]
    fn a_placeholder_keeps_the_earlier_value_in_any_order(
        seed in any::<u64>(),
        txns in 1usize..25,
        cuts in prop::collection::vec(0usize..100, 0..6),
        restart_at in 0usize..4,
    ) {
        let (mut events, want) = history_of(seed, txns, true);
        events.shuffle(&mut StdRng::seed_from_u64(seed ^ 0x51));
        let flow = Flow::new(toasted_cfg("")).unwrap();
        let mut sim = common::scd::HistSim::new(flow.clone());
        in_batches(&events, &cuts, restart_at, |b| {
            match b {
                Some(events) => { sim.apply(&decode(&flow, events)).unwrap(); }
                None => sim.restart(),
            }
        });
        prop_assert_eq!(sim.table(), rendered(&want));
    }
}

/// An event as Debezium's ExtractNewRecordState SMT flattens it, with
/// `add.fields=op,table,schema,sequence,lsn` and
/// `delete.handling.mode=rewrite`: the row (`before` for a delete), the
/// metadata as `__` fields; `wrapped` with the flattened value schema.
fn flatten(e: &Value, wrapped: bool) -> Value {
    let p = &e["payload"];
    let op = p["op"].as_str().unwrap();
    let mut row = p[if op == "d" { "before" } else { "after" }].clone();
    let src = &p["source"];
    for (k, v) in [
        ("__op", json!(op)),
        ("__table", src["table"].clone()),
        ("__schema", src["schema"].clone()),
        ("__sequence", src["sequence"].clone()),
        ("__lsn", src["lsn"].clone()),
        ("__deleted", json!(if op == "d" { "true" } else { "false" })),
    ] {
        row[k] = v;
    }
    if !wrapped {
        return row;
    }
    let mut fields = schema()["fields"][1]["fields"].as_array().unwrap().clone();
    for (f, t) in [
        ("__op", "string"),
        ("__table", "string"),
        ("__schema", "string"),
        ("__sequence", "string"),
        ("__lsn", "int64"),
        ("__deleted", "string"),
    ] {
        fields.push(json!({"type": t, "optional": true, "field": f}));
    }
    json!({"schema": {"type": "struct", "name": "dbz.public.customers.Value", "fields": fields}, "payload": row})
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Events flattened by ExtractNewRecordState (wrapped with their
    /// schema or bare) give the source table under any order and batching.
    #[test]
    fn flattened_events_in_any_order_give_the_source_table(
        seed in any::<u64>(),
        txns in 1usize..25,
        cuts in prop::collection::vec(0usize..100, 0..6),
        restart_at in 0usize..4,
    ) {
        let (events, want) = history(seed, txns);
        let mut rng = StdRng::seed_from_u64(seed ^ 0xf1a7);
        let mut flat: Vec<Value> = events.iter().map(|e| flatten(e, rng.random_bool(0.5))).collect();
        flat.shuffle(&mut rng);
        let flow = Flow::new(customers_cfg()).unwrap();
        let mut sim = Sim::new(flow.clone());
        in_batches(&flat, &cuts, restart_at, |b| {
            match b {
                Some(events) => { sim.apply(&decode(&flow, events)).unwrap(); }
                None => sim.restart(),
            }
        });
        prop_assert_eq!(sim.table(), rendered(&want));
    }
}

/// A flattened event without what its order needs is refused, saying which
/// `add.fields` to set; one without `__table` is taken by its own flow but
/// cannot be routed by `/v1/debezium`.
#[test]
fn flattened_events_need_their_op_and_position() {
    let flow = Flow::new(customers_cfg()).unwrap();
    let e = flatten(
        &pg_event("customers", "c", 1, Some(&("Ann".into(), 1)), None, 10),
        false,
    );
    let refused = |e: Value| {
        debezium::decode(
            &flow,
            BodyFormat::Ndjson,
            e.to_string().as_bytes(),
            Limits::NONE,
            true,
        )
        .unwrap_err()
        .to_string()
    };
    let mut no_op = e.clone();
    no_op.as_object_mut().unwrap().remove("__op");
    assert!(refused(no_op).contains("add op to the SMT's add.fields"));
    let mut no_position = e.clone();
    for k in ["__sequence", "__lsn"] {
        no_position.as_object_mut().unwrap().remove(k);
    }
    assert!(refused(no_position).contains("without its source position"));
    let mut no_table = e.clone();
    no_table.as_object_mut().unwrap().remove("__table");
    let body = no_table.to_string();
    let rows = debezium::decode(
        &flow,
        BodyFormat::Ndjson,
        body.as_bytes(),
        Limits::NONE,
        true,
    )
    .unwrap()
    .0;
    assert_eq!(rows.num_rows(), 1);
    let e = debezium::route(
        &[flow],
        BodyFormat::Ndjson,
        debezium::Body::Whole(body.as_bytes()),
        Limits::NONE,
    )
    .unwrap_err();
    assert!(e.to_string().contains("names no table"), "{e}");
}

fn toasted_cfg(extra: &str) -> FlowConfig {
    let toml = CUSTOMERS.replace(
        "format = ",
        &format!("toasted_columns = [\"name\"]\n{extra}\nformat = "),
    );
    toml::from_str(&toml).unwrap()
}

/// SCD Type 2: the version an untouched TOASTed value opens keeps it; a
/// placeholder with no earlier value (its insert not seen) is a null, and
/// counted in `placeholders_unfilled`; the
/// settings that would make a null mean "unchanged" are refused.
#[test]
fn placeholders_in_history_and_without_an_earlier_value() {
    let flow = Flow::new(toasted_cfg("stored_as_scd_type = 2")).unwrap();
    let mut sim = common::scd::HistSim::new(flow.clone());
    let mut upd = pg_event("customers", "u", 1, Some(&("x".into(), 20)), Some(10), 12);
    upd["payload"]["after"]["name"] = json!("__debezium_unavailable_value");
    let ins = pg_event(
        "customers",
        "c",
        1,
        Some(&("long text".into(), 10)),
        None,
        5,
    );
    // Before its insert arrives the update has no earlier value: counted.
    let st = sim.apply(&decode(&flow, &[upd.clone()])).unwrap();
    assert_eq!(st.placeholders_unfilled, 1, "{st:?}");
    let st = sim.apply(&decode(&flow, &[ins])).unwrap();
    assert_eq!(st.placeholders_unfilled, 0, "{st:?}");
    let names: BTreeSet<(String, String)> = sim
        .table()
        .into_iter()
        .map(|r| (r[1].clone(), r[2].clone()))
        .collect();
    assert_eq!(
        names,
        [
            ("long text".to_string(), "0.10".to_string()),
            ("long text".to_string(), "0.20".to_string())
        ]
        .into()
    );
    // No earlier value: a null.
    let flow = Flow::new(toasted_cfg("")).unwrap();
    let mut sim = common::scd::HistSim::new(flow.clone());
    let st = sim.apply(&decode(&flow, &[upd])).unwrap();
    assert_eq!(sim.table(), common::rows(&[&["1", "NULL", "0.20"]]));
    assert_eq!(st.placeholders_unfilled, 1, "{st:?}");
    let e = Flow::new(toasted_cfg("ignore_null_updates = true")).unwrap_err();
    assert!(e.to_string().contains("ignore_null_updates"), "{e}");
    let e = Flow::new(
        toml::from_str(
            &CUSTOMERS.replace("format = ", "toasted_columns = [\"balance\"]\nformat = "),
        )
        .unwrap(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("string and binary"), "{e}");
    let e = Flow::new(
        toml::from_str(
            &common::CUSTOMERS.replace("keys = ", "toasted_columns = [\"city\"]\nkeys = "),
        )
        .unwrap(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("debezium"), "{e}");
}

#[test]
fn a_snapshot_read_never_wins_over_a_streamed_change() {
    let flow = Flow::new(customers_cfg()).unwrap();
    // The streamed update's LSN (100) is below the snapshot's position (900).
    let snap = pg_event("customers", "r", 1, Some(&("old".into(), 1)), None, 900);
    let streamed = pg_event("customers", "u", 1, Some(&("new".into(), 2)), None, 100);
    for order in [[&snap, &streamed], [&streamed, &snap]] {
        let mut sim = Sim::new(flow.clone());
        for e in order {
            sim.apply(&decode(&flow, std::slice::from_ref(e))).unwrap();
        }
        let want: BTreeMap<i32, Row> = [(1, ("new".to_string(), 2))].into();
        assert_eq!(sim.table(), rendered(&want));
    }
}

#[test]
fn definitions_derive_what_the_events_give() {
    let flow = Flow::new(customers_cfg()).unwrap();
    assert!(flow.debezium);
    assert_eq!(flow.seq_idx.len(), 6);
    assert_eq!(
        flow.target_cols,
        vec![0, 1, 2],
        "no hidden column in the target"
    );
    assert!(flow.truncates.is_some(), "SCD Type 1 truncates");
    for (line, what) in [
        ("sequence_by = \"id\"", "sequence_by"),
        ("apply_as_deletes = \"id = 1\"", "apply_as_deletes"),
        ("apply_as_truncates = \"id = 1\"", "apply_as_truncates"),
    ] {
        let toml = CUSTOMERS.replace("format = ", &format!("{line}\nformat = "));
        let e = Flow::new(toml::from_str(&toml).unwrap()).unwrap_err();
        assert_eq!(e.code(), codes::INVALID_DEFINITION, "{e}");
        assert!(e.to_string().contains(what), "{e}");
    }
    let scd2 = CUSTOMERS.replace("format = ", "stored_as_scd_type = 2\nformat = ");
    let f = Flow::new(toml::from_str(&scd2).unwrap()).unwrap();
    assert!(
        f.truncates.is_none(),
        "SCD Type 2 takes no truncates, as Spark"
    );
}

/// Real events: Debezium 3.6.3 on PostgreSQL 15 (tests/fixtures/debezium,
/// made by integration/debezium_capture.py): a snapshot, multi-statement
/// transactions, a many-row update, a primary-key change, a delete and
/// re-insert in one transaction, REPLICA IDENTITY FULL, a TOASTed column
/// an update leaves untouched (`toasted_columns`), ADD COLUMN and a TRUNCATE. Applied through the engine in arrival order,
/// one event per commit, and shuffled in random batches, each table equals
/// `SELECT *` of its source at the end.
#[test]
fn real_postgres_events_give_the_source_tables() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/debezium");
    let events: Vec<Value> = std::fs::read_to_string(dir.join("pg_customers_orders.ndjson"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let customers: FlowConfig = toml::from_str(
        r#"
name = "customers"
target = "shop.customers"
keys = ["id"]
format = "debezium"
source_table = "public.customers"
toasted_columns = ["notes"]
columns = [
  { name = "id", type = "int", required = true },
  { name = "name", type = "string" },
  { name = "email", type = "string" },
  { name = "balance", type = "decimal(12,2)" },
  { name = "created_at", type = "timestamp" },
  { name = "updated_at", type = "timestamptz" },
  { name = "tags", type = "string" },
  { name = "ext_id", type = "string" },
  { name = "notes", type = "string" },
  { name = "tier", type = "string" },
]
"#,
    )
    .unwrap();
    let orders: FlowConfig = toml::from_str(
        r#"
name = "orders"
target = "shop.orders"
keys = ["order_id"]
format = "debezium"
source_table = "public.orders"
columns = [
  { name = "order_id", type = "long", required = true },
  { name = "customer_id", type = "int" },
  { name = "amount", type = "decimal(10,2)" },
  { name = "placed", type = "date" },
]
"#,
    )
    .unwrap();
    // The source tables at the end, rendered as the engine's rows are.
    let expected = |file: &str, cols: &[&str]| -> BTreeSet<Vec<String>> {
        std::fs::read_to_string(dir.join(file))
            .unwrap()
            .lines()
            .map(|l| {
                let row: Value = serde_json::from_str(l).unwrap();
                cols.iter()
                    .map(|c| match &row[*c] {
                        Value::Null => "NULL".to_string(),
                        Value::String(s) => seconds(&s.replace("+00:00", "Z")),
                        v => v.to_string(),
                    })
                    .collect()
            })
            .collect()
    };
    let cols: Vec<String> = customers.columns.iter().map(|c| c.name.clone()).collect();
    let cols: Vec<&str> = cols.iter().map(String::as_str).collect();
    let want_customers = expected("expected_customers.ndjson", &cols);
    let want_orders = expected(
        "expected_orders.ndjson",
        &["order_id", "customer_id", "amount", "placed"],
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut rng = StdRng::seed_from_u64(11);
    for round in 0..4 {
        let mut order = events.clone();
        if round >= 2 {
            order.shuffle(&mut rng);
        }
        let tmp = tempfile::tempdir().unwrap();
        let cat: std::sync::Arc<dyn autocdc::table::catalog::Catalog> = std::sync::Arc::new(
            autocdc::table::catalog::hadoop::HadoopCatalog::new(
                tmp.path().to_str().unwrap(),
                None,
                std::sync::Arc::new(autocdc::fault::Faults::default()),
            )
            .unwrap(),
        );
        for (cfg, want) in [(&customers, &want_customers), (&orders, &want_orders)] {
            let flow = Flow::new(cfg.clone()).unwrap();
            let got = rt.block_on(async {
                let mut engine = autocdc::table::engine::Engine::open(
                    flow.clone(),
                    cat.clone(),
                    std::sync::Arc::new(autocdc::fault::Faults::default()),
                )
                .await
                .unwrap();
                let size = match round {
                    0 => order.len(),
                    1 => 1,
                    _ => rng.random_range(1..8),
                };
                for (i, chunk) in order.chunks(size).enumerate() {
                    engine.apply(&decode(&flow, chunk), i as i64).await.unwrap();
                }
                let mut rows = BTreeSet::new();
                for b in engine.scan_target().await.unwrap() {
                    rows.extend(common::render_all(&b));
                }
                rows
            });
            let got: BTreeSet<Vec<String>> = got
                .into_iter()
                .map(|r| r.iter().map(|v| seconds(v)).collect())
                .collect();
            assert_eq!(&got, want, "round {round}, {}", cfg.name);
        }
    }
}

/// A time's fractional seconds without trailing zeros (`07.700` and `07.7`
/// are one value: the reader and the source print them apart).
fn seconds(v: &str) -> String {
    let b = v.as_bytes();
    let Some(dot) = v.find('.') else {
        return v.to_string();
    };
    if dot < 8 || b[dot - 3] != b':' || !b[dot - 2].is_ascii_digit() {
        return v.to_string();
    }
    let end = v[dot + 1..]
        .find(|c: char| !c.is_ascii_digit())
        .map_or(v.len(), |i| dot + 1 + i);
    let frac = v[dot + 1..end].trim_end_matches('0');
    let dot_part = if frac.is_empty() {
        String::new()
    } else {
        format!(".{frac}")
    };
    format!("{}{dot_part}{}", &v[..dot], &v[end..])
}

/// The bench's Debezium events (`bench-serve --format debezium`) are the
/// bench's changes: both give one table.
#[test]
fn the_bench_events_are_the_bench_changes() {
    use autocdc::tools::generate;
    let rows = Flow::new(generate::changes_flow("c", "b.c").unwrap()).unwrap();
    let mut rng = StdRng::seed_from_u64(3);
    let b = generate::changes(&rows.source_arrow, &mut rng, 500, 50, 0, 0, 0.2).unwrap();
    let dbz = Flow::new(toml::from_str(generate::DEBEZIUM_FLOW).unwrap()).unwrap();
    let body = generate::to_debezium(&b).unwrap();
    let (events, skipped) =
        debezium::decode(&dbz, BodyFormat::JsonArray, &body, Limits::NONE, true).unwrap();
    assert_eq!(skipped, debezium::Skipped::default());
    assert_eq!(events.num_rows(), 500);
    let (mut a, mut d) = (Sim::new(rows), Sim::new(dbz));
    a.apply(&b).unwrap();
    d.apply(&events).unwrap();
    // The rows flow's target also keeps seq and op.
    let projected: BTreeSet<Vec<String>> = a
        .table()
        .into_iter()
        .map(|r| vec![r[0].clone(), r[3].clone(), r[4].clone()])
        .collect();
    assert!(!projected.is_empty());
    assert_eq!(d.table(), projected);
}

/// The flow docs/debezium.md shows is a valid definition.
#[test]
fn the_documented_flow_is_valid() {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/debezium.md")).unwrap();
    let open = "```toml\n[[flow]]\n";
    let start = doc.find(open).expect("a [[flow]] example") + open.len();
    let end = start + doc[start..].find("```").unwrap();
    let cfg: FlowConfig = toml::from_str(&doc[start..end]).unwrap();
    let flow = Flow::new(cfg).unwrap();
    assert!(flow.debezium);
    assert_eq!(
        flow.config.source_table.as_deref(),
        Some("public.customers")
    );
}
