//! Debezium snapshots that run again (Debezium stopped before its initial
//! snapshot completed): a completed snapshot is authoritative, for SCD Type
//! 1 (a truncate below its reads) and SCD Type 2 (a cut closing the versions
//! it did not read), under every order, batching, redelivery and restart,
//! through the engine on a real catalog.

use super::*;

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
