//! Debezium change events as a flow's input (`format = "debezium"`): the
//! order derived from source positions under every permutation, batching
//! and redelivery (against the source's own history as the oracle), the
//! routing endpoint `POST /v1/debezium`, and hostile events.

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
    let e =
        debezium::route(&[flow], BodyFormat::Ndjson, body.as_bytes(), Limits::NONE).unwrap_err();
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

/// The table an engine on a fresh Hadoop catalog holds after applying
/// `chunks` in turn (one commit each), reopened halfway as after a restart.
fn engine_table(flow: &Flow, chunks: &[Vec<Value>]) -> BTreeSet<Vec<String>> {
    let mut rows = BTreeSet::new();
    for b in engine_batches(flow, chunks) {
        rows.extend(common::render_all(&b));
    }
    rows
}

/// The target's batches after applying `chunks` as `engine_table` does.
fn engine_batches(flow: &Flow, chunks: &[Vec<Value>]) -> Vec<arrow_array::RecordBatch> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let faults = std::sync::Arc::new(autocdc::fault::Faults::default());
    let cat: std::sync::Arc<dyn autocdc::table::catalog::Catalog> = std::sync::Arc::new(
        autocdc::table::catalog::hadoop::HadoopCatalog::new(
            tmp.path().to_str().unwrap(),
            None,
            faults.clone(),
        )
        .unwrap(),
    );
    rt.block_on(async {
        let open =
            || autocdc::table::engine::Engine::open(flow.clone(), cat.clone(), faults.clone());
        let mut engine = open().await.unwrap();
        for (i, chunk) in chunks.iter().enumerate() {
            if i == chunks.len() / 2 {
                engine = open().await.unwrap();
            }
            engine.apply(&decode(flow, chunk), i as i64).await.unwrap();
        }
        engine.scan_target().await.unwrap()
    })
}

/// A snapshot run again: the first (at 1,000) read ids 0..6 and stopped;
/// meanwhile 1, 3 and 5 were deleted, 2 updated, 7 inserted; the second
/// (at 2,000) reads the table as it is (`now`), its last read marked; then
/// streamed: 3 comes back, 0 is deleted, 4 updated (`want`: the table at
/// the end).
struct Rerun {
    first: Vec<Value>,
    second: Vec<Value>,
    stream: Vec<Value>,
    now: BTreeMap<i32, Row>,
    want: BTreeMap<i32, Row>,
}

fn rerun() -> Rerun {
    let row = |name: &str, cents: i64| (name.to_string(), cents);
    // The first snapshot (at 1,000) delivered ids 0..6 and stopped.
    let first: Vec<Value> = (0..6)
        .map(|id| {
            pg_event(
                "customers",
                "r",
                id,
                Some(&row("first", id as i64)),
                None,
                1_000,
            )
        })
        .collect();
    // Meanwhile 1, 3 and 5 were deleted, 2 updated, 7 inserted; the second
    // snapshot (at 2,000) reads the table as it is, its last read marked.
    let now: BTreeMap<i32, Row> = [
        (0, row("first", 0)),
        (2, row("updated", 22)),
        (4, row("first", 4)),
        (7, row("new", 77)),
    ]
    .into();
    let mut second: Vec<Value> = now
        .iter()
        .map(|(id, r)| pg_event("customers", "r", *id, Some(r), None, 2_000))
        .collect();
    second.last_mut().unwrap()["payload"]["source"]["snapshot"] = json!("last_in_data_collection");
    // Streamed after it: 3 comes back, 0 is deleted, 4 updated.
    let stream = vec![
        pg_event("customers", "c", 3, Some(&row("back", 3)), None, 2_100),
        pg_event("customers", "d", 0, None, Some(2_101), 2_150),
        pg_event(
            "customers",
            "u",
            4,
            Some(&row("streamed", 44)),
            Some(2_151),
            2_200,
        ),
    ];
    let mut want = now.clone();
    want.insert(3, row("back", 3));
    want.remove(&0);
    want.insert(4, row("streamed", 44));
    Rerun {
        first,
        second,
        stream,
        now,
        want,
    }
}

/// Debezium stopped before its initial snapshot completed runs the whole
/// snapshot again from a new position, and streams from there: rows the
/// first, partial snapshot delivered and that were deleted meanwhile are in
/// neither. When the second snapshot of the table completes, they go; rows
/// streamed after it stay, whatever the order and batching of arrival, and
/// a snapshot that never completes deletes nothing.
#[test]
fn a_snapshot_run_again_is_authoritative_when_it_completes() {
    let flow = Flow::new(customers_cfg()).unwrap();
    let Rerun {
        first,
        second,
        stream,
        now,
        want,
    } = rerun();
    let row = |name: &str, cents: i64| (name.to_string(), cents);

    let in_order: Vec<Value> = [first.clone(), second.clone(), stream.clone()].concat();
    let mut rng = StdRng::seed_from_u64(47);
    for round in 0..6 {
        let mut events = in_order.clone();
        match round {
            0 => {}
            1 => events.reverse(),
            // Debezium's redelivery of the first snapshot's reads, late.
            2 => events.extend(first.iter().cloned()),
            _ => events.shuffle(&mut rng),
        }
        let size = [events.len(), 1, 3, 2, 4, 5][round];
        let chunks: Vec<Vec<Value>> = events.chunks(size).map(<[Value]>::to_vec).collect();
        let got = engine_table(&flow, &chunks);
        assert_eq!(got, rendered(&want), "round {round}");
    }

    // The second snapshot never completed (no marked read): nothing goes.
    let mut unmarked = second.clone();
    unmarked.last_mut().unwrap()["payload"]["source"]["snapshot"] = json!("true");
    let mut kept: BTreeMap<i32, Row> = first
        .iter()
        .map(|e| {
            let id = e["payload"]["after"]["id"].as_i64().unwrap() as i32;
            (id, row("first", id as i64))
        })
        .collect();
    kept.extend(now.clone());
    let chunks = vec![first.clone(), unmarked];
    assert_eq!(engine_table(&flow, &chunks), rendered(&kept));
}

fn scd2_customers() -> Flow {
    let cfg: FlowConfig = toml::from_str(&format!("stored_as_scd_type = 2\n{CUSTOMERS}")).unwrap();
    Flow::new(cfg).unwrap()
}

/// (id, name, balance, __START_AT, __END_AT or "open") of every version.
fn versions(batches: &[arrow_array::RecordBatch]) -> BTreeSet<Vec<String>> {
    use arrow_array::Array;
    let mut out = BTreeSet::new();
    for b in batches {
        let end = b.schema().index_of("__END_AT").unwrap();
        for (r, mut cells) in common::render_all(b).into_iter().enumerate() {
            if b.column(end).is_null(r) {
                cells[end] = "open".into();
            }
            out.insert(cells);
        }
    }
    out
}

/// The open versions' (id, name, balance): the current rows.
fn current(v: &BTreeSet<Vec<String>>) -> BTreeSet<Vec<String>> {
    v.iter()
        .filter(|r| r.last().unwrap() == "open")
        .map(|r| r[..3].to_vec())
        .collect()
}

fn closed_ids(v: &BTreeSet<Vec<String>>) -> BTreeSet<String> {
    v.iter()
        .filter(|r| r.last().unwrap() != "open")
        .map(|r| r[0].clone())
        .collect()
}

/// Debezium stopped during its initial snapshot (at 1,000, which read a
/// random part of the table), the table changed meanwhile (unseen), the
/// snapshot run again and completed (at 2,000), then streamed changes: the
/// events in source order, and the table at the end.
fn rerun_history(seed: u64) -> (Vec<Value>, BTreeMap<i32, Row>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let value = |rng: &mut StdRng| -> Row {
        (
            format!("v{}", rng.random_range(0..3)),
            rng.random_range(0..4),
        )
    };
    let n = rng.random_range(1..10);
    let mut table: BTreeMap<i32, Row> = (0..n).map(|id| (id, value(&mut rng))).collect();
    let read = rng.random_range(0..=table.len());
    let mut events: Vec<Value> = table
        .iter()
        .take(read)
        .map(|(id, r)| pg_event("customers", "r", *id, Some(r), None, 1_000))
        .collect();
    for _ in 0..rng.random_range(0..8) {
        let id = rng.random_range(0..12);
        if rng.random_bool(0.5) {
            table.remove(&id);
        } else {
            table.insert(id, value(&mut rng));
        }
    }
    // A table empty when the snapshot runs again has no read to end it.
    if table.is_empty() {
        table.insert(11, value(&mut rng));
    }
    let mut second: Vec<Value> = table
        .iter()
        .map(|(id, r)| pg_event("customers", "r", *id, Some(r), None, 2_000))
        .collect();
    second.last_mut().unwrap()["payload"]["source"]["snapshot"] = json!("last_in_data_collection");
    events.extend(second);
    let mut lsn = 2_100;
    for _ in 0..rng.random_range(0..10) {
        let id = rng.random_range(0..12);
        lsn += 10;
        if table.contains_key(&id) && rng.random_bool(0.3) {
            table.remove(&id);
            events.push(pg_event("customers", "d", id, None, Some(lsn - 5), lsn));
        } else {
            let op = if table.contains_key(&id) { "u" } else { "c" };
            let r = value(&mut rng);
            events.push(pg_event("customers", op, id, Some(&r), Some(lsn - 5), lsn));
            table.insert(id, r);
        }
    }
    (events, table)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// SCD Type 2 with a snapshot run again: the current rows are the
    /// source table, and any permutation and batching of the events (a
    /// redelivered run among them, the engine reopened halfway) gives the
    /// same versions as applying them in source order.
    #[test]
    fn scd2_a_snapshot_run_again_gives_the_same_versions_in_any_order(
        seed in any::<u64>(),
        size in 1usize..6,
        redeliver in 0usize..6,
    ) {
        let (events, want) = rerun_history(seed);
        let flow = scd2_customers();
        let reference = versions(&engine_batches(&flow, std::slice::from_ref(&events)));
        prop_assert_eq!(current(&reference), rendered(&want));
        let mut rng = StdRng::seed_from_u64(seed ^ 0x2d);
        let mut arrived = events.clone();
        let from = rng.random_range(0..events.len());
        arrived.extend(events[from..(from + redeliver).min(events.len())].iter().cloned());
        arrived.shuffle(&mut rng);
        let chunks: Vec<Vec<Value>> = arrived.chunks(size).map(<[Value]>::to_vec).collect();
        prop_assert_eq!(versions(&engine_batches(&flow, &chunks)), reference);
    }
}

/// SCD Type 2: a snapshot run again and completed closes the versions of
/// the keys it did not read (rows the first, partial snapshot delivered and
/// that were deleted meanwhile) at its position, as if deleted there; the
/// keys it read go on with no gap; whatever the order and batching of
/// arrival (the cut before or after the reads it spares), and with the
/// first snapshot's reads redelivered late. Without the completing read,
/// nothing closes.
#[test]
fn a_snapshot_run_again_closes_the_versions_it_did_not_read_in_scd2() {
    let flow = scd2_customers();
    let Rerun {
        first,
        second,
        stream,
        now: _,
        want,
    } = rerun();

    let in_order: Vec<Value> = [first.clone(), second.clone(), stream.clone()].concat();
    let reference = versions(&engine_batches(&flow, std::slice::from_ref(&in_order)));
    assert_eq!(current(&reference), rendered(&want), "{reference:#?}");
    // 1 and 5 close at the cut; 3 too (then comes back); 0 is deleted
    // after; 2 and 4 change; 7 is new. 0, 2 and 4 were read by both
    // snapshots: their first version runs until it changed, not the cut.
    assert_eq!(
        closed_ids(&reference),
        ["0", "1", "2", "3", "4", "5"].map(String::from).into(),
        "{reference:#?}"
    );
    let stale_versions = reference
        .iter()
        .filter(|r| ["1", "3", "5"].contains(&r[0].as_str()) && r[1] == "first")
        .count();
    assert_eq!(stale_versions, 3, "{reference:#?}");
    let still = reference
        .iter()
        .filter(|r| r[0] == "4" && r[1] == "first")
        .collect::<Vec<_>>();
    assert_eq!(
        still.len(),
        1,
        "4 read by both snapshots is one version until its update"
    );

    let mut rng = StdRng::seed_from_u64(48);
    for round in 0..8 {
        let mut events = in_order.clone();
        match round {
            0 => {}
            1 => events.reverse(),
            2 => events.extend(first.iter().cloned()),
            // The completing read first, the rest of the second snapshot after.
            3 => events.rotate_left(first.len() + second.len() - 1),
            _ => events.shuffle(&mut rng),
        }
        let size = [events.len(), 1, 3, 2, 1, 4, 5, 3][round];
        let chunks: Vec<Vec<Value>> = events.chunks(size).map(<[Value]>::to_vec).collect();
        assert_eq!(
            versions(&engine_batches(&flow, &chunks)),
            reference,
            "round {round}"
        );
    }

    // The second snapshot never completed: nothing closes but by changes.
    let mut unmarked = second.clone();
    unmarked.last_mut().unwrap()["payload"]["source"]["snapshot"] = json!("true");
    let got = versions(&engine_batches(&flow, &[first.clone(), unmarked]));
    assert!(
        ["1", "3", "5"].iter().all(|id| got
            .iter()
            .any(|r| &r[0] == id && r.last().unwrap() == "open")),
        "{got:#?}"
    );
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

/// A second flow of orders, routed by its table.
const ORDERS: &str = r#"
name = "orders"
target = "crm.orders"
keys = ["order_id"]
format = "debezium"
source_table = "public.orders"
commit_interval = "1h"
columns = [
  { name = "order_id", type = "long", required = true },
  { name = "placed", type = "date" },
  { name = "at", type = "timestamp" },
]
"#;

fn order_event(op: &str, id: i64, days: i64, micros: i64, lsn: u64) -> Value {
    let row = json!({"order_id": id, "placed": days, "at": micros});
    json!({"schema": {"type": "struct", "fields": [
        {"type": "struct", "field": "after", "fields": [
            {"type": "int64", "field": "order_id"},
            {"type": "int32", "field": "placed", "name": "io.debezium.time.Date"},
            {"type": "int64", "field": "at", "name": "io.debezium.time.MicroTimestamp"}
        ]},
        {"type": "struct", "field": "before", "fields": [
            {"type": "int64", "field": "order_id"}
        ]}
    ]}, "payload": {
        "before": if op == "d" { json!({"order_id": id}) } else { Value::Null },
        "after": if op == "d" { Value::Null } else { row },
        "source": {"connector": "postgresql", "schema": "public", "table": "orders",
                   "sequence": json!([null, lsn.to_string()]).to_string(), "lsn": lsn},
        "op": op
    }})
}

fn serve_config(dir: &std::path::Path) -> autocdc::config::Config {
    let mut customers = customers_cfg();
    customers.commit_interval = Some("1h".into());
    config(dir, vec![customers, toml::from_str(ORDERS).unwrap()])
}

/// Flows' logs that open only when `go` says so: the service stays
/// recovering (listening, not ready) until then.
struct HeldLogs {
    inner: autocdc::service::wal::LocalLogs,
    go: tokio::sync::watch::Receiver<bool>,
}

#[async_trait::async_trait]
impl autocdc::service::wal::LogFactory for HeldLogs {
    async fn identity(&self, flow: &str, recorded: &[String]) -> autocdc::Result<String> {
        self.inner.identity(flow, recorded).await
    }
    async fn open(
        &self,
        flow: &str,
        committed: i64,
        max_bytes: u64,
    ) -> autocdc::Result<std::sync::Arc<dyn autocdc::service::wal::IngestLog>> {
        let _ = self.go.clone().wait_for(|g| *g).await;
        self.inner.open(flow, committed, max_bytes).await
    }
}

/// Regression: while the flows recover, `/v1/debezium` answered 202 and
/// skipped every event as "a table no flow takes" (the flows were not
/// back yet), so the sink dropped them. It answers 503 until they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_sent_while_the_flows_recover_are_refused_not_dropped() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = serve_config(tmp.path());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    cfg.server.listen = format!("127.0.0.1:{port}");
    let faults = std::sync::Arc::new(autocdc::fault::Faults::default());
    let (go, held) = tokio::sync::watch::channel(false);
    let logs = std::sync::Arc::new(HeldLogs {
        inner: autocdc::service::wal::LocalLogs::new(tmp.path().join("data/flows"), faults.clone()),
        go: held,
    });
    let starting = tokio::spawn(autocdc::service::run::start_with_logs(cfg, faults, logs));
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let event = pg_event("customers", "c", 1, Some(&("Ann".into(), 1)), None, 10);
    let body = json!([event]).to_string();
    let mut answered = None;
    for _ in 0..200 {
        match client
            .post(format!("{base}/v1/debezium"))
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
        {
            Ok(r) => {
                let s = r.status().as_u16();
                answered = Some((s, r.json::<Value>().await.unwrap_or_default()));
                break;
            }
            // Not listening yet.
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
        }
    }
    let (s, v) = answered.expect("the service listens while it recovers");
    assert_eq!(s, 503, "{v}");
    assert_eq!(v["error"]["code"], codes::UNAVAILABLE, "{v}");
    go.send(true).unwrap();
    let r = starting.await.unwrap().unwrap();
    let (s, v) = post(
        &client,
        &url(&r, "/v1/debezium"),
        "application/json",
        body,
        None,
    )
    .await;
    assert_eq!(
        (s, v["flows"]["customers"]["accepted"].as_u64()),
        (202, Some(1)),
        "{v}"
    );
    commit(&client, &r, "customers").await;
    r.stop().await.unwrap();
    assert_eq!(
        table(tmp.path(), "customers").await,
        common::rows(&[&["1", "Ann", "0.01"]])
    );
}

/// Debezium Server's HTTP sink: one URL for every table, a JSON array per
/// batch, `webhook-id` stable across retries; what no flow takes is
/// skipped and counted, never refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_endpoint_routes_every_table_and_skips_the_rest() {
    let tmp = tempfile::tempdir().unwrap();
    let r = start(serve_config(tmp.path())).await;
    let client = reqwest::Client::new();
    let body = json!([
        pg_event("customers", "c", 1, Some(&("Ann".into(), 1250)), None, 10),
        order_event("c", 7, 19_000, 1_700_000_000_123_456, 11),
        Value::Null,
        {"schema": {"name": "io.debezium.connector.common.Heartbeat"}, "payload": {"ts_ms": 5}},
        {"status": "BEGIN", "id": "571:53195832", "event_count": null},
        pg_event("invoices", "c", 3, Some(&("x".into(), 1)), None, 12),
        {"op": "m", "source": {"connector": "postgresql"}, "message": {"prefix": "p"}},
        pg_event("customers", "u", 1, Some(&("Ann B".into(), -5)), Some(12), 14),
        pg_event("customers", "c", 2, Some(&("Bo".into(), 0)), Some(12), 15),
        order_event("c", 8, 19_001, 0, 16),
        order_event("d", 7, 0, 0, 17),
    ]);
    let send = |key: &'static str| {
        client
            .post(url(&r, "/v1/debezium"))
            .header("content-type", "application/json")
            .header("webhook-id", key)
            .body(body.to_string())
            .send()
    };
    let resp = send("msg_1").await.unwrap();
    assert_eq!(resp.status().as_u16(), 202);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["flows"]["customers"]["accepted"], 3, "{v}");
    assert_eq!(v["flows"]["orders"]["accepted"], 3, "{v}");
    assert_eq!(v["skipped"]["tombstones"], 1, "{v}");
    assert_eq!(v["skipped"]["not_changes"], 2, "{v}");
    assert_eq!(v["skipped"]["messages"], 1, "{v}");
    assert_eq!(v["skipped"]["other_tables"], 1, "{v}");
    // The sink's retry of the same request: applied once.
    let again: Value = send("msg_1").await.unwrap().json().await.unwrap();
    assert_eq!(again["flows"]["customers"]["duplicate"], true, "{again}");
    assert_eq!(
        again["flows"]["customers"]["offset"],
        v["flows"]["customers"]["offset"]
    );
    for f in ["customers", "orders"] {
        commit(&client, &r, f).await;
    }
    let metrics = get_text(&client, &r, "/metrics").await;
    assert!(
        metrics.contains("autocdc_debezium_skipped_total{reason=\"other_table\"} 2"),
        "{metrics}"
    );
    r.stop().await.unwrap();
    let rows = |v: &[&[&str]]| common::rows(v);
    assert_eq!(
        table(tmp.path(), "customers").await,
        rows(&[&["1", "Ann B", "-0.05"], &["2", "Bo", "0.00"]])
    );
    assert_eq!(
        table(tmp.path(), "orders").await,
        rows(&[&["8", "2022-01-09", "1970-01-01T00:00:00"]])
    );
}

/// A bad element refuses the whole body with its index, nothing of it is
/// applied, and the service goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_events_are_refused_with_their_index_and_nothing_applies() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = serve_config(tmp.path());
    cfg.server.max_rows_per_request = 50;
    let r = start(cfg).await;
    let client = reqwest::Client::new();
    let good = pg_event("customers", "c", 1, Some(&("Ann".into(), 1)), None, 10);
    let mut no_key = pg_event("customers", "d", 2, None, None, 11);
    no_key["payload"]["before"] = Value::Null;
    let mut too_wide = pg_event("customers", "c", 3, Some(&("x".into(), 1)), None, 12);
    too_wide["payload"]["after"]["balance"] = json!(b64_cents(i64::MAX / 2));
    let mut no_source = good.clone();
    no_source["payload"]
        .as_object_mut()
        .unwrap()
        .remove("source");
    let mut mongo = good.clone();
    mongo["payload"]["source"]["connector"] = json!("mongodb");
    let cases: Vec<(Value, u16, &str, &str)> = vec![
        (
            json!({"hello": "world"}),
            400,
            codes::DEBEZIUM_EVENT,
            "no `op`",
        ),
        (
            json!({"__op": "c", "id": 1}),
            400,
            codes::DEBEZIUM_EVENT,
            "ExtractNewRecordState",
        ),
        (
            json!({"op": "x", "source": {}}),
            400,
            codes::DEBEZIUM_EVENT,
            "op",
        ),
        (no_source, 400, codes::DEBEZIUM_EVENT, "source"),
        (mongo, 400, codes::DEBEZIUM_EVENT, "mongodb"),
        (no_key, 422, codes::DEBEZIUM_NO_KEY, "REPLICA IDENTITY"),
        (too_wide, 400, codes::BAD_COLUMN, "balance"),
        (json!(17), 400, codes::DEBEZIUM_EVENT, "a number"),
    ];
    for (bad, status, code, says) in cases {
        let body = json!([good.clone(), bad]).to_string();
        let (s, v) = post(
            &client,
            &url(&r, "/v1/debezium"),
            "application/json",
            body,
            None,
        )
        .await;
        assert_eq!(s, status, "{v}");
        assert_eq!(v["error"]["code"], code, "{v}");
        let text = v.to_string();
        assert!(text.contains(says), "{says}: {v}");
        assert_eq!(v["error"]["row"], 1, "the event's index: {v}");
    }
    // Over max_rows_per_request.
    let many = Value::Array(vec![good.clone(); 51]).to_string();
    let (s, v) = post(
        &client,
        &url(&r, "/v1/debezium"),
        "application/json",
        many,
        None,
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (400, Some(codes::BATCH_TOO_LARGE)),
        "{v}"
    );
    let (s, v) = post(
        &client,
        &url(&r, "/v1/debezium"),
        "application/json",
        "[{\"op\":",
        None,
    )
    .await;
    assert_eq!(s, 400, "{v}");
    // Nothing was logged, and the service still takes good events.
    let status = flow_status(&client, &r, "customers").await;
    assert_eq!(status["status"]["accepted_batches"], 0, "{status}");
    let (s, v) = post(
        &client,
        &url(&r, "/v1/debezium"),
        "application/x-ndjson",
        good.to_string(),
        None,
    )
    .await;
    assert_eq!(s, 202, "{v}");
    // The flow's own endpoint takes its events too.
    let (s, v) = post(
        &client,
        &url(&r, "/v1/flows/customers/changes"),
        "application/json",
        pg_event(
            "customers",
            "u",
            1,
            Some(&("Ann 2".into(), 1)),
            Some(10),
            20,
        )
        .to_string(),
        None,
    )
    .await;
    assert_eq!((s, v["accepted"].as_u64()), (202, Some(1)), "{v}");
    commit(&client, &r, "customers").await;
    r.stop().await.unwrap();
    assert_eq!(
        table(tmp.path(), "customers").await,
        common::rows(&[&["1", "Ann 2", "0.01"]])
    );
}

/// `schema_evolution = "add_columns"` (plain rows): a new field that is
/// null in every row of a push is accepted (not added yet), as
/// docs/schema-changes.md says; after `ALTER TABLE ... ADD COLUMN` every
/// event carries it so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_field_null_in_every_row_is_accepted_by_add_columns() {
    let tmp = tempfile::tempdir().unwrap();
    let mut f = flow_cfg("people", "1h");
    f.schema_evolution = autocdc::core::flow::SchemaEvolution::AddColumns;
    let r = start(config(tmp.path(), vec![f])).await;
    let client = reqwest::Client::new();
    let body = "{\"id\": 1, \"op\": \"UPSERT\", \"city\": \"Leeds\", \"seq\": 1, \"tier\": null}";
    let (s, v) = post(
        &client,
        &url(&r, "/v1/flows/people/changes"),
        "application/x-ndjson",
        body,
        None,
    )
    .await;
    assert_eq!(s, 202, "{v}");
    let status = flow_status(&client, &r, "people").await;
    assert_eq!(
        status["definition"]["columns"].as_array().unwrap().len(),
        4,
        "{status}"
    );
    r.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debezium_flow_adds_a_new_source_column_with_its_schema_type() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = customers_cfg();
    c.commit_interval = Some("1h".into());
    c.schema_evolution = autocdc::core::flow::SchemaEvolution::AddColumns;
    let r = start(config(tmp.path(), vec![c])).await;
    let client = reqwest::Client::new();
    let mut e = pg_event("customers", "c", 1, Some(&("Ann".into(), 1)), None, 10);
    e["payload"]["after"]["tier"] = Value::Null;
    e["schema"]["fields"][1]["fields"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "int64", "optional": true, "field": "tier"}));
    let (s, v) = post(
        &client,
        &url(&r, "/v1/debezium"),
        "application/json",
        e.to_string(),
        None,
    )
    .await;
    assert_eq!(s, 202, "{v}");
    let status = flow_status(&client, &r, "customers").await;
    let cols = status["definition"]["columns"].as_array().unwrap();
    assert_eq!(cols.last().unwrap()["name"], "tier", "{status}");
    assert_eq!(cols.last().unwrap()["type"], "long", "{status}");
    commit(&client, &r, "customers").await;
    r.stop().await.unwrap();
    assert_eq!(
        table(tmp.path(), "customers").await,
        common::rows(&[&["1", "Ann", "0.01", "NULL"]])
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
