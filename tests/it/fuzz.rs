//! Seeded fuzzing of `POST /v1/flows/{flow}/changes` over real HTTP: valid
//! NDJSON, JSON-array and Arrow IPC bodies are mutated (bit flips, special
//! bytes, inserted / deleted / duplicated ranges, truncation, huge or
//! negative little-endian integers where Arrow IPC keeps its lengths, and for
//! JSON odd numbers and very long strings). Every answer must be a 2xx or a
//! 4xx with an `AUTOCDC_` code, never a 5xx or a panic; a refused body leaves
//! the flow's log and counters as they were, an accepted one adds exactly one
//! batch, and at the end everything acknowledged commits.
//!
//! Reproducible: `AUTOCDC_FUZZ_SEED=<u64>` sets the seed (printed at the
//! start), `AUTOCDC_FUZZ_CASES=<n>` the cases per format (default 700).

use crate::common;

use std::time::{Duration, Instant};

use common::http::*;
use common::*;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use serde_json::Value;

const FLOW: &str = "f";
const SPECIAL: &[u8] = b"\x00\xff\x7f\"{},-9e";
const WIDE4: [i32; 4] = [i32::MAX, -1, i32::MIN, 1 << 30];
const WIDE8: [i64; 5] = [i64::MAX, -1, 1 << 40, i64::MIN, i32::MAX as i64];
const NUMBERS: [&str; 10] = [
    "1.9",
    "1e400",
    "-9223372036854775809",
    "99999999999999999999",
    "-0",
    "1e-400",
    "NaN",
    "null",
    "true",
    "\"7\"",
];
const LONG: [&str; 4] = ["x", "é", "\\u0000", "\\ud800"];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Format {
    Ndjson,
    JsonArray,
    Arrow,
}

impl Format {
    fn content_type(self) -> &'static str {
        match self {
            Format::Ndjson => "application/x-ndjson",
            Format::JsonArray => "application/json",
            Format::Arrow => "application/vnd.apache.arrow.stream",
        }
    }
}

/// Two handfuls of valid changes to start every mutation from.
fn seed_rows() -> [Vec<Ev>; 2] {
    [
        CUSTOMERS_EVENTS.to_vec(),
        vec![u(7, "Ürümqi", 1), d(8, 2), u(9, "", i64::MAX)],
    ]
}

fn seed_body(kind: Format, evs: &[Ev]) -> Vec<u8> {
    match kind {
        Format::Ndjson => ndjson(evs).into_bytes(),
        Format::JsonArray => format!("[{}]", ndjson(evs).replace('\n', ",")).into_bytes(),
        Format::Arrow => arrow_body(evs),
    }
}

/// Replaces `body[a..b]` with `with`.
fn replace(body: &mut Vec<u8>, a: usize, b: usize, with: &[u8]) {
    let tail = body.split_off(b);
    body.truncate(a);
    body.extend_from_slice(with);
    body.extend_from_slice(&tail);
}

fn span(rng: &mut StdRng, len: usize) -> (usize, usize) {
    let a = rng.random_range(0..=len);
    (a, rng.random_range(a..=len.min(a + 256)))
}

fn insert(rng: &mut StdRng, body: &mut Vec<u8>, at: usize) -> String {
    let n = rng.random_range(1..32usize);
    let mut bytes = Vec::with_capacity(n);
    for _ in 0..n {
        bytes.push(if rng.random_bool(0.5) {
            rng.random::<u8>()
        } else {
            *SPECIAL.choose(&mut *rng).unwrap()
        });
    }
    replace(body, at, at, &bytes);
    format!("insert {n} bytes at {at}")
}

/// A 4- or 8-byte little-endian integer, huge or negative, at a random
/// (half the time aligned) position: Arrow IPC's lengths and offsets.
fn wide_int(rng: &mut StdRng, body: &mut Vec<u8>) -> String {
    let w = if rng.random_bool(0.5) { 4 } else { 8 };
    if body.len() < w {
        return insert(rng, body, 0);
    }
    let mut at = rng.random_range(0..=body.len() - w);
    if rng.random_bool(0.5) {
        at -= at % w;
    }
    let (v, bytes) = if w == 4 {
        let v = *WIDE4.choose(&mut *rng).unwrap();
        (v as i64, v.to_le_bytes().to_vec())
    } else {
        let v = *WIDE8.choose(&mut *rng).unwrap();
        (v, v.to_le_bytes().to_vec())
    };
    body[at..at + w].copy_from_slice(&bytes);
    format!("{w}-byte {v} at {at}")
}

/// A run of digits (with its sign) replaced by an awkward number or token.
fn number(rng: &mut StdRng, body: &mut Vec<u8>) -> String {
    let mut runs = Vec::new();
    let mut i = 0;
    while i < body.len() {
        if body[i].is_ascii_digit() {
            let mut a = i;
            while i < body.len() && body[i].is_ascii_digit() {
                i += 1;
            }
            if a > 0 && body[a - 1] == b'-' {
                a -= 1;
            }
            runs.push((a, i));
        } else {
            i += 1;
        }
    }
    let Some(&(a, b)) = runs.choose(&mut *rng) else {
        return wide_int(rng, body);
    };
    let n = *NUMBERS.choose(&mut *rng).unwrap();
    replace(body, a, b, n.as_bytes());
    format!("number {a}..{b} = {n}")
}

/// A very long run of one (possibly escaped) character after a quote.
fn long_string(rng: &mut StdRng, body: &mut Vec<u8>) -> String {
    let quotes: Vec<usize> = (0..body.len()).filter(|&i| body[i] == b'"').collect();
    let Some(&q) = quotes.choose(&mut *rng) else {
        return wide_int(rng, body);
    };
    let unit = *LONG.choose(&mut *rng).unwrap();
    let n = rng.random_range(1_000..100_000usize);
    replace(body, q + 1, q + 1, unit.repeat(n).as_bytes());
    format!("{n} x {unit:?} after the quote at {q}")
}

/// Applies one random mutation to `body`; returns what it did.
fn mutate(rng: &mut StdRng, body: &mut Vec<u8>, json: bool) -> String {
    let len = body.len();
    if len == 0 {
        return insert(rng, body, 0);
    }
    let pos = rng.random_range(0..len);
    match rng.random_range(0..9u32) {
        0 => {
            let bit = rng.random_range(0..8u32);
            body[pos] ^= 1u8 << bit;
            format!("flip bit {bit} of byte {pos}")
        }
        1 => {
            let b = *SPECIAL.choose(&mut *rng).unwrap();
            body[pos] = b;
            format!("byte {pos} = {b:#04x}")
        }
        2 => insert(rng, body, pos),
        3 => {
            let (a, b) = span(rng, len);
            replace(body, a, b, &[]);
            format!("delete {a}..{b}")
        }
        4 => {
            let (a, b) = span(rng, len);
            let at = rng.random_range(0..=len);
            let chunk = body[a..b].to_vec();
            replace(body, at, at, &chunk);
            format!("copy {a}..{b} to {at}")
        }
        5 => {
            body.truncate(pos);
            format!("truncate to {pos}")
        }
        7 if json => number(rng, body),
        8 if json => long_string(rng, body),
        _ => wide_int(rng, body),
    }
}

fn env_or<T: std::str::FromStr>(var: &str, default: T) -> T {
    match std::env::var(var) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{var}={v} is not a number")),
        Err(_) => default,
    }
}

/// The flow's acknowledged-batch counter and its log's next offset.
async fn counters(c: &reqwest::Client, r: &autocdc::service::run::Running) -> (u64, i64) {
    let st = flow_status(c, r, FLOW).await;
    let s = &st["status"];
    match (
        s["accepted_batches"].as_u64(),
        s["wal"]["next_offset"].as_i64(),
    ) {
        (Some(a), Some(n)) => (a, n),
        _ => panic!("no status.accepted_batches or status.wal.next_offset: {st}"),
    }
}

async fn healthy(c: &reqwest::Client, r: &autocdc::service::run::Running) {
    let s = c.get(url(r, "/healthz")).send().await.unwrap().status();
    assert_eq!(s.as_u16(), 200, "GET /healthz");
}

/// Posts the case; a 429 is retried (same Idempotency-Key) a few times.
async fn post_retrying(
    c: &reqwest::Client,
    to: &str,
    kind: Format,
    body: &[u8],
    key: &str,
) -> (u16, Value) {
    let mut answer = post(c, to, kind.content_type(), body.to_vec(), Some(key)).await;
    for _ in 0..5 {
        if answer.0 != 429 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        answer = post(c, to, kind.content_type(), body.to_vec(), Some(key)).await;
    }
    answer
}

#[test]
fn mutated_bodies_are_refused_with_a_4xx_and_nothing_is_applied() {
    let seed: u64 = env_or("AUTOCDC_FUZZ_SEED", 0xAC0C_F022);
    let cases: usize = env_or("AUTOCDC_FUZZ_CASES", 700);
    eprintln!("fuzz: AUTOCDC_FUZZ_SEED={seed}, AUTOCDC_FUZZ_CASES={cases} (per format)");
    let tmp = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let r = start(config(tmp.path(), vec![flow_cfg(FLOW, "50ms")])).await;
        let c = reqwest::Client::new();
        let changes = url(&r, &format!("/v1/flows/{FLOW}/changes"));
        let (mut accepted, mut next) = counters(&c, &r).await;
        let started = Instant::now();
        let mut tally = Vec::new();
        let kinds = [Format::Ndjson, Format::JsonArray, Format::Arrow];
        for (k, kind) in kinds.into_iter().enumerate() {
            let seeds: Vec<Vec<u8>> = seed_rows().iter().map(|evs| seed_body(kind, evs)).collect();
            let (mut ok, mut refused) = (0usize, 0usize);
            for i in 0..cases {
                let mut rng = StdRng::seed_from_u64(seed ^ ((k as u64) << 40) ^ i as u64);
                let mut body = seeds.choose(&mut rng).unwrap().clone();
                let n = if rng.random_bool(0.3) {
                    rng.random_range(2..=4usize)
                } else {
                    1
                };
                let mut what = Vec::with_capacity(n);
                for _ in 0..n {
                    what.push(mutate(&mut rng, &mut body, kind != Format::Arrow));
                }
                let ctx = format!(
                    "seed {seed}, {kind:?} case {i}, {what:?}, body starts {:?}",
                    String::from_utf8_lossy(&body[..body.len().min(300)])
                );
                let key = format!("fuzz-{seed}-{k}-{i}");
                let (status, v) = post_retrying(&c, &changes, kind, &body, &key).await;
                let text = v.to_string();
                assert!(
                    !text.contains("panicked") && !text.contains("RUST_BACKTRACE"),
                    "{ctx}: a panic in the answer: {text}"
                );
                assert!(status < 500, "{ctx}: {status} {text}");
                assert_ne!(status, 429, "{ctx}: still 429 after retries: {text}");
                let (a, nx) = counters(&c, &r).await;
                if (200..300).contains(&status) {
                    ok += 1;
                    assert_eq!(
                        (a, nx),
                        (accepted + 1, next + 1),
                        "{ctx}: an accepted body adds exactly one batch: {text}"
                    );
                    assert_eq!(v["offset"].as_i64(), Some(next), "{ctx}: {text}");
                    assert_eq!(v["duplicate"], false, "{ctx}: {text}");
                } else {
                    refused += 1;
                    assert!((400..500).contains(&status), "{ctx}: {status} {text}");
                    let code = v["error"]["code"].as_str().unwrap_or_default();
                    assert!(
                        code.starts_with("AUTOCDC_"),
                        "{ctx}: {status} no code: {text}"
                    );
                    assert_eq!(
                        (a, nx),
                        (accepted, next),
                        "{ctx}: a refused body ({status} {code}) changed the log or counters"
                    );
                }
                (accepted, next) = (a, nx);
                if i % 50 == 49 {
                    healthy(&c, &r).await;
                }
            }
            tally.push(format!("{kind:?} {cases} (2xx {ok}, 4xx {refused})"));
        }
        healthy(&c, &r).await;
        // Everything acknowledged commits: a last good batch, waited for.
        let last = [u(1_000_000, "Leeds", 1)];
        let (s, v) = post(
            &c,
            &format!("{changes}?wait=commit"),
            "application/x-ndjson",
            ndjson(&last),
            Some(&format!("fuzz-{seed}-final")),
        )
        .await;
        assert_eq!(s, 200, "the final batch commits: {v}");
        let (a, nx) = counters(&c, &r).await;
        assert_eq!((a, nx), (accepted + 1, next + 1), "{v}");
        commit(&c, &r, FLOW).await;
        let st = flow_status(&c, &r, FLOW).await;
        let s = &st["status"];
        assert_eq!(s["degraded"], false, "{st}");
        assert!(s["last_error"].is_null(), "{st}");
        assert_eq!(s["rejected_at_commit"], 0, "{st}");
        assert_eq!(s["pending_batches"], 0, "{st}");
        assert_eq!(
            s["applied_offset"].as_i64(),
            Some(nx - 1),
            "all is applied: {st}"
        );
        let ready = c.get(url(&r, "/readyz")).send().await.unwrap().status();
        assert_eq!(ready.as_u16(), 200);
        eprintln!(
            "fuzz: seed {seed}: {}; {:.1?}",
            tally.join(", "),
            started.elapsed()
        );
        r.stop().await.unwrap();
    });
}
