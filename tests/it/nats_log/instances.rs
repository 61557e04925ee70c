//! Several `autocdc serve` instances on one NATS log: one commits each
//! flow (its lease holder), every instance takes pushes; a killed or paused
//! holder's flows are taken over with nothing acknowledged lost or doubled;
//! a flow defined on one instance runs on every one; an instance beside the
//! holder keeps nothing pending and answers `/commit`.

use super::*;

#[test]
fn two_instances_on_one_flow_both_take_pushes_one_commits_and_the_table_has_each_once() {
    rt().block_on(async {
        let tmp = tempfile::tempdir().unwrap();
        let p = prefix();
        let n = nats(&nats_url(), &p);
        let client = reqwest::Client::new();
        let a = start(on_nats(
            tmp.path(),
            "a",
            vec![flow_cfg("m", "1s")],
            n.clone(),
        ))
        .await;
        let b = start(on_nats(
            tmp.path(),
            "b",
            vec![flow_cfg("m", "1s")],
            n.clone(),
        ))
        .await;
        let mut all = Vec::new();
        let mut offsets = std::collections::BTreeSet::new();
        for i in 0..20i64 {
            let evs = vec![
                u(i % 7, ["Oslo", "Rome", "Lima"][(i % 3) as usize], i),
                d((i + 3) % 7, i),
            ];
            let (r, other) = if i % 2 == 0 { (&a, &b) } else { (&b, &a) };
            let ack = push(
                &client,
                &url(r, "/v1/flows/m/changes"),
                &evs,
                Some(&format!("k{i}")),
            )
            .await;
            assert!(offsets.insert(ack["offset"].as_i64().unwrap()), "{ack}");
            // A retry on the other instance is the same batch.
            let again = push(
                &client,
                &url(other, "/v1/flows/m/changes"),
                &evs,
                Some(&format!("k{i}")),
            )
            .await;
            assert_eq!(
                (again["duplicate"].clone(), again["offset"].clone()),
                (serde_json::json!(true), ack["offset"].clone())
            );
            all.extend(evs);
        }
        assert_eq!(offsets, (1..=20).collect());
        // Both see the commits through 20 (one commits, the other reads
        // the target), and exactly one holds the lease.
        for r in [&a, &b] {
            let mut status = serde_json::Value::Null;
            for _ in 0..150 {
                status = flow_status(&client, r, "m").await;
                if status["status"]["committed_offset"] == 20 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert_eq!(status["status"]["committed_offset"], 20, "{status}");
        }
        let mut held = Vec::new();
        for r in [&a, &b] {
            held.push(flow_status(&client, r, "m").await["status"]["lease"]["held_here"] == true);
        }
        assert_eq!(held.iter().filter(|h| **h).count(), 1, "{held:?}");
        assert_eq!(table(tmp.path(), "m").await, expected(&all));
        // `?wait=commit` on either instance answers once the holder committed.
        let evs = vec![u(50, "Bern", 100)];
        let (s, ack) = post(
            &client,
            &(url(&b, "/v1/flows/m/changes") + "?wait=commit"),
            "application/x-ndjson",
            ndjson(&evs),
            None,
        )
        .await;
        assert_eq!(s, 200, "{ack}");
        all.extend(evs);
        assert_eq!(table(tmp.path(), "m").await, expected(&all));
        // The instance without the lease never reads the log, yet its
        // status counts what the holder alone acknowledged (it asks the
        // broker for the log's end as it follows the holder's commits).
        let (holder, other) = if held[0] { (&a, &b) } else { (&b, &a) };
        let evs = vec![u(51, "Oslo", 101)];
        let ack = push(
            &client,
            &url(holder, "/v1/flows/m/changes"),
            &evs,
            Some("k-holder"),
        )
        .await;
        all.extend(evs);
        let end = ack["offset"].as_i64().unwrap();
        let mut status = serde_json::Value::Null;
        for _ in 0..150 {
            status = flow_status(&client, other, "m").await;
            if status["status"]["wal"]["next_offset"] == end + 1
                && status["status"]["committed_offset"] == end
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(status["status"]["wal"]["next_offset"], end + 1, "{status}");
        assert_eq!(status["status"]["committed_offset"], end, "{status}");
        assert_eq!(status["status"]["log_lag_batches"], 0, "{status}");
        assert_eq!(table(tmp.path(), "m").await, expected(&all));
        a.stop().await.unwrap();
        b.stop().await.unwrap();
    });
}

/// Flows spread over three instances; the holder of some is killed (its
/// runtime dropped: no last commit, no lease given back) while pushes go
/// on; the others take its flows over within the lease TTL and every
/// acknowledged batch is in its table once.
#[test]
fn a_killed_holders_flows_are_taken_over_and_nothing_acknowledged_is_lost() {
    let tmp = tempfile::tempdir().unwrap();
    let p = prefix();
    let n = nats(&nats_url(), &p);
    let names: Vec<String> = (0..6).map(|i| format!("f{i}")).collect();
    let flows = || {
        names
            .iter()
            .map(|f| flow_cfg(f, "500ms"))
            .collect::<Vec<_>>()
    };
    let mut runtimes: Vec<Option<tokio::runtime::Runtime>> = (0..3).map(|_| Some(rt())).collect();
    let mut addrs = Vec::new();
    for (i, r) in runtimes.iter().enumerate() {
        let mut n = n.clone();
        n.instance = Some(format!("k{i}"));
        let running =
            r.as_ref()
                .unwrap()
                .block_on(start(on_nats(tmp.path(), &format!("d{i}"), flows(), n)));
        addrs.push(format!("http://{}", running.addr));
        // Killed below, or left to end with the test's runtimes.
        std::mem::forget(running);
    }
    let client_rt = rt();
    let client = &reqwest::Client::new();
    let (addrs, names) = (&addrs, &names);
    let mut all: std::collections::BTreeMap<String, Vec<Ev>> = Default::default();
    let mut batches = |round: i64, alive: &[usize]| {
        let mut out = Vec::new();
        for (k, f) in names.iter().enumerate() {
            let seq = round * 10 + k as i64;
            let evs = vec![u(round % 5, "Oslo", seq), d((round + 2) % 5, seq)];
            all.entry(f.clone()).or_default().extend(evs.clone());
            out.push((f.clone(), evs, alive[(round as usize + k) % alive.len()]));
        }
        out
    };
    let push_all = |batches: Vec<(String, Vec<Ev>, usize)>| async move {
        for (f, evs, i) in batches {
            let key = format!("{f}-{}", evs[0].3);
            push(
                client,
                &format!("{}/v1/flows/{f}/changes", addrs[i]),
                &evs,
                Some(&key),
            )
            .await;
        }
    };
    let holders = |alive: Vec<usize>| async move {
        let mut out: std::collections::BTreeMap<String, Vec<usize>> = Default::default();
        for f in names {
            for &i in &alive {
                let v: serde_json::Value = client
                    .get(format!("{}/v1/flows/{f}", addrs[i]))
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                if v["status"]["lease"]["held_here"] == true {
                    out.entry(f.clone()).or_default().push(i);
                }
            }
        }
        out
    };
    let holders = &holders;
    // The instance the lease module assigns `f` to among `alive` (the
    // instances are named `k<i>`).
    let first = |f: &str, alive: &[usize]| {
        let live: std::collections::HashSet<String> =
            alive.iter().map(|i| format!("k{i}")).collect();
        let owners = autocdc::service::lease::Leases::assign(names, &live);
        owners[f][1..].parse::<usize>().unwrap()
    };
    // One holder per flow, the one it is assigned to (an instance that
    // started alone took every flow at first, and gives most back).
    let settled = |alive: Vec<usize>| async move {
        let mut h = Default::default();
        for _ in 0..150 {
            h = holders(alive.clone()).await;
            if h.len() == names.len()
                && h.iter()
                    .all(|(f, v)| v.len() == 1 && v[0] == first(f, &alive))
            {
                return h;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("no single holder per flow: {h:?}");
    };

    let victim = client_rt.block_on(async {
        let h = settled(vec![0, 1, 2]).await;
        // Bounded loads: no instance holds more than its share.
        let mut load: std::collections::BTreeMap<usize, usize> = Default::default();
        for v in h.values() {
            *load.entry(v[0]).or_default() += 1;
        }
        let share = names.len().div_ceil(3);
        assert!(
            load.len() >= 2 && load.values().all(|&n| n <= share),
            "{h:?}"
        );
        for round in 0..5 {
            push_all(batches(round, &[0, 1, 2])).await;
        }
        h["f0"][0]
    });
    runtimes[victim].take().unwrap().shutdown_background();
    let alive: Vec<usize> = (0..3).filter(|i| *i != victim).collect();
    client_rt.block_on(async {
        for round in 5..10 {
            push_all(batches(round, &alive)).await;
        }
    });
    let all = &all;
    client_rt.block_on(async {
        let h = settled(alive.clone()).await;
        assert!(!h.values().any(|v| v[0] == victim));
        for f in names {
            let holder = &addrs[h[f][0]];
            let mut status = serde_json::Value::Null;
            for _ in 0..150 {
                status = client
                    .get(format!("{holder}/v1/flows/{f}"))
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                if status["status"]["committed_offset"] == 10 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert_eq!(status["status"]["committed_offset"], 10, "{f}: {status}");
            assert_eq!(table(tmp.path(), f).await, expected(&all[f]), "{f}");
            one_holder_at_a_time(tmp.path(), f).await;
        }
    });
}

/// `autocdc serve` processes: the holder of a flow is paused (SIGSTOP)
/// while pushes go on, another instance takes the flow over, then the
/// paused one resumes (SIGCONT), possibly in the middle of a commit. Its
/// late commit loses on the catalog or repeats what the target already
/// records: every acknowledged batch is in the table, once.
#[test]
fn a_paused_holder_that_resumes_after_a_takeover_loses_and_doubles_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let p = prefix();
    let mut procs = Vec::new();
    let mut bases = Vec::new();
    for i in 0..2 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut cfg = on_nats(
            tmp.path(),
            &format!("d{i}"),
            vec![flow_cfg("m", "300ms")],
            nats(&nats_url(), &p),
        );
        cfg.server.listen = format!("127.0.0.1:{port}");
        let path = tmp.path().join(format!("i{i}.toml"));
        std::fs::write(&path, toml::to_string(&cfg).unwrap()).unwrap();
        let log = std::fs::File::create(tmp.path().join(format!("i{i}.log"))).unwrap();
        procs.push(
            std::process::Command::new(env!("CARGO_BIN_EXE_autocdc"))
                .args(["serve", "--config"])
                .arg(&path)
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap(),
        );
        bases.push(format!("http://127.0.0.1:{port}"));
    }
    let signal = |pid: u32, sig: &str| {
        // The shell's own `kill`: no procps needed.
        let ok = std::process::Command::new("sh")
            .args(["-c", &format!("kill {sig} {pid}")])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} {pid}");
    };
    rt().block_on(async {
        let client = reqwest::Client::new();
        let status = |i: usize| {
            let client = client.clone();
            let base = bases[i].clone();
            async move {
                let r = client.get(format!("{base}/v1/flows/m")).send().await;
                match r {
                    Ok(r) if r.status() == 200 => r.json::<serde_json::Value>().await.ok(),
                    _ => None,
                }
            }
        };
        // Instance `i`'s committed offset once it reaches `want` (10 s at most).
        let committed_to = |i: usize, want: i64| {
            let status = &status;
            async move {
                let mut committed = 0;
                for _ in 0..200 {
                    committed = status(i)
                        .await
                        .map_or(0, |s| s["status"]["committed_offset"].as_i64().unwrap_or(0));
                    if committed >= want {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                committed
            }
        };
        let holder = || async {
            for _ in 0..200 {
                for i in 0..2 {
                    if let Some(s) = status(i).await
                        && s["status"]["lease"]["held_here"] == true
                    {
                        return i;
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            panic!("nobody holds the lease");
        };
        let mut all = Vec::new();
        let mut n = 0i64;
        let mut push_rounds = |to: usize, rounds: i64| {
            let mut batches = Vec::new();
            for _ in 0..rounds {
                let evs = vec![u(n % 11, "Oslo", n), d((n + 5) % 11, n)];
                all.extend(evs.clone());
                batches.push((n, evs));
                n += 1;
            }
            let client = client.clone();
            let base = bases[to].clone();
            async move {
                let mut last = 0;
                for (k, evs) in batches {
                    let a = push(
                        &client,
                        &format!("{base}/v1/flows/m/changes"),
                        &evs,
                        Some(&format!("k{k}")),
                    )
                    .await;
                    last = a["offset"].as_i64().unwrap();
                }
                last
            }
        };
        for base in &bases {
            let mut ready = false;
            for _ in 0..300 {
                if let Ok(r) = client.get(format!("{base}/readyz")).send().await
                    && r.status() == 200
                {
                    ready = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let logs: Vec<String> = (0..2)
                .map(|i| {
                    std::fs::read_to_string(tmp.path().join(format!("i{i}.log")))
                        .unwrap_or_default()
                })
                .collect();
            assert!(ready, "{base} did not start: {logs:?}");
        }
        let h = holder().await;
        let other = 1 - h;
        let first = push_rounds(h, 10).await;
        push_rounds(other, 10).await;
        // The holder has committed under its lease before it is paused, so
        // the table's history shows both holders (on a slow machine its
        // first commit could otherwise come after the pause).
        let held_commit = committed_to(h, first).await;
        assert!(
            held_commit >= first,
            "the holder committed {held_commit} of {first} before the pause"
        );
        signal(procs[h].id(), "-STOP");
        let last = push_rounds(other, 10).await;
        // The other instance takes the flow over and commits everything.
        let committed = committed_to(other, last).await;
        assert!(
            committed >= last,
            "committed {committed} of {last} while the holder was paused"
        );
        signal(procs[h].id(), "-CONT");
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let last = push_rounds(h, 5).await;
        let mut done = false;
        for _ in 0..300 {
            let c0 = status(0)
                .await
                .map_or(0, |s| s["status"]["committed_offset"].as_i64().unwrap_or(0));
            let c1 = status(1)
                .await
                .map_or(0, |s| s["status"]["committed_offset"].as_i64().unwrap_or(0));
            if c0.max(c1) >= last {
                done = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            done,
            "the batches pushed after the pause were not committed"
        );
        let (got, want) = (table(tmp.path(), "m").await, expected(&all));
        assert!(got == want, "table {got:?}, want {want:?}");
        // The paused holder's late commit, if any, was fenced: one holder
        // at a time in the table's history, and both held the flow.
        let holders = one_holder_at_a_time(tmp.path(), "m").await;
        assert!(holders.len() >= 2, "{holders:?}");
        // One holder at the end.
        let held = [status(0).await, status(1).await]
            .iter()
            .filter(|s| {
                s.as_ref()
                    .is_some_and(|s| s["status"]["lease"]["held_here"] == true)
            })
            .count();
        assert_eq!(held, 1);
    });
    for p in &mut procs {
        let _ = std::process::Command::new("sh")
            .args(["-c", &format!("kill -TERM {}", p.id())])
            .status();
        let _ = p.wait();
    }
}

/// `GET path` on `r` until its status is `want` (10 s at most); the last
/// status and body.
async fn await_status(
    client: &reqwest::Client,
    r: &autocdc::service::run::Running,
    path: &str,
    want: u16,
) -> (u16, serde_json::Value) {
    let mut last = (0, serde_json::Value::Null);
    for _ in 0..100 {
        let resp = client.get(url(r, path)).send().await.unwrap();
        let s = resp.status().as_u16();
        last = (s, resp.json().await.unwrap_or(serde_json::Value::Null));
        if s == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    last
}

/// Flow definitions made over HTTP live in the `<prefix>_FLOWS` bucket:
/// one instance's `PUT` is seen by the others (and by an instance started
/// later with an empty data directory), a change made on another instance
/// replaces the running flow everywhere, and a `DELETE` stops it
/// everywhere.
#[test]
fn a_flow_defined_on_one_instance_is_run_changed_and_deleted_on_every_instance() {
    rt().block_on(async {
        let tmp = tempfile::tempdir().unwrap();
        let p = prefix();
        let n = nats(&nats_url(), &p);
        let client = reqwest::Client::new();
        let a = start(on_nats(tmp.path(), "a", vec![], n.clone())).await;
        let b = start(on_nats(tmp.path(), "b", vec![], n.clone())).await;
        let def = flow_cfg("m", "1s");
        let resp = client
            .put(url(&a, "/v1/flows/m"))
            .json(&def)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 201);
        let (s, view) = await_status(&client, &b, "/v1/flows/m", 200).await;
        assert_eq!(s, 200, "B never saw the flow A defined: {view}");
        assert_eq!(view["definition"]["commit_interval"], "1s", "{view}");

        // Pushed on B, committed by whichever holds the lease.
        let evs = vec![u(1, "Oslo", 1), u(2, "Rome", 1), d(1, 2)];
        push(&client, &url(&b, "/v1/flows/m/changes"), &evs, Some("k1")).await;
        let (s, ack) = post(
            &client,
            &(url(&a, "/v1/flows/m/changes") + "?wait=commit"),
            "application/x-ndjson",
            ndjson(&[u(3, "Lima", 1)]),
            None,
        )
        .await;
        assert_eq!(s, 200, "{ack}");
        let mut all = evs.clone();
        all.push(u(3, "Lima", 1));
        assert_eq!(table(tmp.path(), "m").await, expected(&all));

        // Changed on B: A runs the new definition.
        let mut changed = def.clone();
        changed.commit_interval = Some("2s".into());
        let resp = client
            .put(url(&b, "/v1/flows/m"))
            .json(&changed)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        let mut seen = serde_json::Value::Null;
        for _ in 0..100 {
            seen = flow_status(&client, &a, "m").await;
            if seen["definition"]["commit_interval"] == "2s" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(seen["definition"]["commit_interval"], "2s", "{seen}");

        // An instance started later, with nothing on its disk, runs it
        // from the start, and its table is the same.
        let c = start(on_nats(tmp.path(), "c", vec![], n.clone())).await;
        let view = flow_status(&client, &c, "m").await;
        assert_eq!(view["definition"]["commit_interval"], "2s", "{view}");
        let (s, ack) = post(
            &client,
            &(url(&c, "/v1/flows/m/changes") + "?wait=commit"),
            "application/x-ndjson",
            ndjson(&[u(4, "Bern", 1)]),
            None,
        )
        .await;
        assert_eq!(s, 200, "{ack}");
        all.push(u(4, "Bern", 1));
        assert_eq!(table(tmp.path(), "m").await, expected(&all));

        // Deleted on A: gone everywhere; pushes get 404.
        let resp = client.delete(url(&a, "/v1/flows/m")).send().await.unwrap();
        assert_eq!(resp.status().as_u16(), 204);
        for r in [&b, &c] {
            let (s, body) = await_status(&client, r, "/v1/flows/m", 404).await;
            assert_eq!(s, 404, "{body}");
        }
        let (s, body) = post(
            &client,
            &url(&b, "/v1/flows/m/changes"),
            "application/x-ndjson",
            ndjson(&[u(5, "Kyiv", 1)]),
            None,
        )
        .await;
        assert_eq!(s, 404, "{body}");
        // The table stays.
        assert_eq!(table(tmp.path(), "m").await, expected(&all));
        for r in [a, b, c] {
            r.stop().await.unwrap();
        }
    });
}

/// An instance that starts while the stream holds batches not yet
/// committed, and does not hold the flow's lease, keeps none of them
/// pending (the holder reads them from the stream), and `POST .../commit`
/// on it answers once the holder committed them. (It once replayed them
/// into a pending run it never committed, and `/commit` waited for an
/// offset past the stream's end.)
#[test]
fn an_instance_started_beside_the_holder_keeps_nothing_pending_and_answers_commit() {
    rt().block_on(async {
        let tmp = tempfile::tempdir().unwrap();
        let p = prefix();
        // Names that rank A first for `m` (one flow: the top rendezvous rank), so B
        // never takes the flow over.
        let rank = |i: &str| xxhash_rust::xxh3::xxh3_64(format!("m\n{i}").as_bytes());
        let (first, second) = if rank("ia") > rank("ib") {
            ("ia", "ib")
        } else {
            ("ib", "ia")
        };
        let mut na = nats(&nats_url(), &p);
        na.instance = Some(first.into());
        let mut nb = na.clone();
        nb.instance = Some(second.into());
        let client = reqwest::Client::new();
        let a = start(on_nats(tmp.path(), "a", vec![flow_cfg("m", "1h")], na)).await;
        let mut all = Vec::new();
        for i in 0..3 {
            let evs = vec![u(i, "Oslo", i)];
            push(&client, &url(&a, "/v1/flows/m/changes"), &evs, None).await;
            all.extend(evs);
        }
        let b = start(on_nats(tmp.path(), "b", vec![flow_cfg("m", "1h")], nb)).await;
        // Wait for A to hold the lease.
        let mut holder = None;
        for _ in 0..100 {
            for (i, r) in [&a, &b].into_iter().enumerate() {
                if flow_status(&client, r, "m").await["status"]["lease"]["held_here"] == true {
                    holder = Some(i);
                }
            }
            if holder.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(
            holder,
            Some(0),
            "A ranks first and holds the flow: A {} B {}",
            flow_status(&client, &a, "m").await["status"]["lease"],
            flow_status(&client, &b, "m").await["status"]["lease"]
        );
        let (holder, other) = (&a, &b);
        // Both name the same holder and epoch (the epoch the record holds).
        let mine = flow_status(&client, holder, "m").await["status"]["lease"].clone();
        let mut seen = serde_json::Value::Null;
        for _ in 0..100 {
            seen = flow_status(&client, other, "m").await["status"]["lease"].clone();
            if seen["epoch"] == mine["epoch"] {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(
            (&seen["holder"], &seen["epoch"]),
            (&mine["holder"], &mine["epoch"]),
            "{seen} vs {mine}"
        );
        // Maintenance is the holder's: the other names it.
        let resp = client
            .post(url(other, "/v1/flows/m/maintain"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 503);
        let body: serde_json::Value = resp.json().await.unwrap();
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(&format!("instance `{first}`")) && message.contains(second),
            "{body}"
        );
        let st = flow_status(&client, other, "m").await;
        assert_eq!(st["status"]["pending_batches"], 0, "{st}");
        assert_eq!(st["status"]["committed_offset"], 0, "{st}");
        // `/commit` on the other instance asks the holder to commit now (the
        // flow's commit_interval is an hour): it answers once that commit
        // is made. (It once waited for the holder's next tick, and timed out.)
        let started = std::time::Instant::now();
        let c = commit(&client, other, "m").await;
        assert_eq!(c["offset"], 3, "{c}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        let c = commit(&client, holder, "m").await;
        assert_eq!(c["offset"], 3, "{c}");
        assert_eq!(table(tmp.path(), "m").await, expected(&all));
        a.stop().await.unwrap();
        b.stop().await.unwrap();
    });
}

/// A catalog on which another instance, the flow's holder, commits once
/// (the state table, then the target) right after this instance's first
/// read: between the two tables an instance opening the flow reads.
struct CommitsBetweenReads {
    inner: std::sync::Arc<dyn autocdc::table::catalog::Catalog>,
    holder: tokio::sync::Mutex<Option<(autocdc::table::engine::Engine, autocdc::core::flow::Flow)>>,
}

impl std::fmt::Debug for CommitsBetweenReads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CommitsBetweenReads")
    }
}

#[async_trait::async_trait]
impl autocdc::table::catalog::Catalog for CommitsBetweenReads {
    fn file_io(&self) -> &iceberg::io::FileIO {
        self.inner.file_io()
    }
    async fn load_table(
        &self,
        ident: &iceberg::TableIdent,
    ) -> autocdc::error::Result<Option<autocdc::table::catalog::TableState>> {
        let t = self.inner.load_table(ident).await?;
        if let Some((mut holder, flow)) = self.holder.lock().await.take() {
            holder
                .apply(&batch(&flow, &[u(2, "Rome", 2)]), 2)
                .await
                .unwrap();
        }
        Ok(t)
    }
    async fn create_table(
        &self,
        ident: &iceberg::TableIdent,
        schema: iceberg::spec::Schema,
        spec: iceberg::spec::UnboundPartitionSpec,
        properties: std::collections::HashMap<String, String>,
    ) -> autocdc::error::Result<autocdc::table::catalog::TableState> {
        self.inner
            .create_table(ident, schema, spec, properties)
            .await
    }
    async fn commit(
        &self,
        base: &autocdc::table::catalog::TableState,
        updates: Vec<iceberg::TableUpdate>,
        requirements: Vec<iceberg::TableRequirement>,
    ) -> autocdc::error::Result<autocdc::table::catalog::TableState> {
        self.inner.commit(base, updates, requirements).await
    }
    async fn drop_table(&self, ident: &iceberg::TableIdent) -> autocdc::error::Result<bool> {
        self.inner.drop_table(ident).await
    }
}

/// An instance opens a flow while the holder commits it: each commit writes
/// the state table, then the target naming the new state snapshot. Opening
/// read the state table first, so a commit landing between the two reads
/// gave a target naming a state snapshot the state read did not have yet:
/// `AUTOCDC_INVALID_STATE.STATE_SNAPSHOT_MISSING`, and an instance starting
/// then exited (integration/cluster.sh, about one run in 13). The target is
/// read first now, so the state read has every snapshot the target names.
#[test]
fn opening_a_flow_while_another_instance_commits_it_finds_the_state_the_target_names() {
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let faults = std::sync::Arc::new(autocdc::fault::Faults::default());
        let hadoop: std::sync::Arc<dyn autocdc::table::catalog::Catalog> = std::sync::Arc::new(
            autocdc::table::catalog::hadoop::HadoopCatalog::new(
                tmp.path().to_str().unwrap(),
                None,
                faults.clone(),
            )
            .unwrap(),
        );
        let flow = customers();
        let mut holder = open_engine(&hadoop, &flow).await;
        holder
            .apply(&batch(&flow, &[u(1, "Oslo", 1)]), 1)
            .await
            .unwrap();
        let racing = std::sync::Arc::new(CommitsBetweenReads {
            inner: hadoop.clone(),
            holder: tokio::sync::Mutex::new(Some((holder, flow.clone()))),
        });
        let opened =
            autocdc::table::engine::Engine::open(flow.clone(), racing.clone(), faults.clone())
                .await;
        assert!(
            racing.holder.lock().await.is_none(),
            "the holder did not commit between the reads"
        );
        let opened = opened.unwrap_or_else(|e| panic!("opened while the holder committed: {e}"));
        // The state as of the target it read, before the holder's commit.
        assert_eq!(opened.summary().keys, 1);
    });
}
