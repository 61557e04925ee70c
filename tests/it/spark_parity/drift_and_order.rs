//! Spark's `AutoCdcConfigDriftSuite` and `AutoCdcOutOfOrderConvergenceSuite`.

use super::*;

// ---------------------------------------------------------------------------
// AutoCdcConfigDriftSuite
// ---------------------------------------------------------------------------

/// `(id, name, amount, seq)` as SCD Type 2 with the tracking line `track`
/// (empty: the default).
fn tracking(track: &str) -> String {
    format!(
        "keys = [\"id\"]\nsequence_by = \"seq\"\nstored_as_scd_type = 2\n{}\n{}",
        track,
        r#"columns = [
  { name = "id", type = "int" },
  { name = "name", type = "string" },
  { name = "amount", type = "int" },
  { name = "seq", type = "long" },
]"#
    )
}

/// `(id, seq_long, seq_int)` sequenced by `seq`, SCD Type `scd`.
fn sequenced_by(seq: &str, scd: u8) -> String {
    format!(
        "keys = [\"id\"]\nsequence_by = \"{}\"\nstored_as_scd_type = {}\n{}",
        seq,
        scd,
        r#"columns = [
  { name = "id", type = "int" },
  { name = "seq_long", type = "long" },
  { name = "seq_int", type = "int" },
]"#
    )
}

/// Spark: AutoCdcConfigDriftSuite, "an SCD1 flow whose sequencing type differs from the recorded
/// type triggers SEQUENCING_TYPE_DRIFT".
#[test]
fn scd1_a_changed_sequence_type_is_sequencing_type_drift() {
    refused_on_change(
        &sequenced_by("seq_long", 1),
        &[r#"{"id": 1, "seq_long": 1, "seq_int": 1}"#],
        &sequenced_by("seq_int", 1),
        r#"{"id": 1, "seq_long": 2, "seq_int": 2}"#,
        codes::SEQUENCING_TYPE_DRIFT,
    );
}

/// Spark: AutoCdcConfigDriftSuite, "an SCD2 flow whose sequencing type differs from the recorded
/// type triggers SEQUENCING_TYPE_DRIFT" (checked on the state before the target, whose
/// `__START_AT` / `__END_AT` would also differ).
#[test]
fn scd2_a_changed_sequence_type_is_sequencing_type_drift() {
    refused_on_change(
        &sequenced_by("seq_long", 2),
        &[r#"{"id": 1, "seq_long": 1, "seq_int": 1}"#],
        &sequenced_by("seq_int", 2),
        r#"{"id": 1, "seq_long": 2, "seq_int": 2}"#,
        codes::SEQUENCING_TYPE_DRIFT,
    );
}

/// Spark: AutoCdcConfigDriftSuite, "an SCD2 flow that changes its explicit TRACK HISTORY column set
/// triggers TRACK_HISTORY_DRIFT" (Spark's data). Spark refuses; autocdc re-folds every key's
/// changes under the new tracked set when the flow opens, so the table is what tracking `amount`
/// gives from the start: the amount change at seq 2 opens a version.
#[test]
fn scd2_a_changed_tracked_set_refolds_the_history() {
    reconfigured(
        &tracking(r#"track_history_column_list = ["name"]"#),
        &[r#"{"id": 1, "name": "a", "amount": 10, "seq": 1}"#],
        &[&["1", "a", "10", "1", "1", "NULL"]],
        &tracking(r#"track_history_column_list = ["amount"]"#),
        &[r#"{"id": 1, "name": "a", "amount": 20, "seq": 2}"#],
        &[
            &["1", "a", "10", "1", "1", "2"],
            &["1", "a", "20", "2", "2", "NULL"],
        ],
    );
}

/// Spark: AutoCdcConfigDriftSuite, "an SCD2 flow that changes its explicit TRACK HISTORY column set
/// triggers TRACK_HISTORY_DRIFT", with history that the two tracked sets fold differently: under
/// `name`, the amount change at seq 2 updated key 1's version in place; re-folded under `amount`
/// it opens a version, and the name change at seq 3 then updates in place. Key 2, which the
/// second run does not touch, is re-folded too.
#[test]
fn scd2_a_changed_tracked_set_refolds_every_key() {
    reconfigured(
        &tracking(r#"track_history_column_list = ["name"]"#),
        &[r#"
        {"id": 1, "name": "a", "amount": 10, "seq": 1}
        {"id": 1, "name": "a", "amount": 20, "seq": 2}
        {"id": 2, "name": "x", "amount": 5, "seq": 1}
        {"id": 2, "name": "x", "amount": 6, "seq": 2}
        "#],
        &[
            &["1", "a", "20", "2", "1", "NULL"],
            &["2", "x", "6", "2", "1", "NULL"],
        ],
        &tracking(r#"track_history_column_list = ["amount"]"#),
        &[r#"{"id": 1, "name": "b", "amount": 20, "seq": 3}"#],
        &[
            &["1", "a", "10", "1", "1", "2"],
            &["1", "b", "20", "3", "2", "NULL"],
            &["2", "x", "5", "1", "1", "2"],
            &["2", "x", "6", "2", "2", "NULL"],
        ],
    );
}

/// Spark: AutoCdcConfigDriftSuite, "an SCD2 flow with no TRACK HISTORY (default = all eligible
/// columns) followed by an explicit subset triggers TRACK_HISTORY_DRIFT". Re-folded under `name`
/// alone, the change at seq 2 (same name) updates the version in place.
#[test]
fn scd2_narrowing_the_default_tracked_set_refolds_the_history() {
    reconfigured(
        &tracking(""),
        &[r#"{"id": 1, "name": "a", "amount": 10, "seq": 1}"#],
        &[&["1", "a", "10", "1", "1", "NULL"]],
        &tracking(r#"track_history_column_list = ["name"]"#),
        &[r#"{"id": 1, "name": "a", "amount": 20, "seq": 2}"#],
        &[&["1", "a", "20", "2", "1", "NULL"]],
    );
}

/// Spark: AutoCdcConfigDriftSuite, "an SCD2 flow that reorders the same TRACK HISTORY columns does
/// NOT trigger drift", "an SCD2 flow with no TRACK HISTORY (default = all eligible columns)
/// followed by an explicit selection of that same set does NOT trigger drift" (the default set
/// includes the kept sequence column `seq`, which may be named) and "an SCD2 flow's EXCEPT-based
/// TRACK HISTORY followed by an equivalent explicit include set does NOT trigger drift". Each
/// second run opens cleanly and its change at seq 2 opens a version.
#[test]
fn scd2_restating_the_tracked_set_changes_nothing() {
    let two_versions: &[&[&str]] = &[
        &["1", "a", "10", "1", "1", "2"],
        &["1", "a", "20", "2", "2", "NULL"],
    ];
    for (v1, v2) in [
        (
            r#"track_history_column_list = ["name", "amount"]"#,
            r#"track_history_column_list = ["amount", "name"]"#,
        ),
        (
            "",
            r#"track_history_column_list = ["name", "amount", "seq"]"#,
        ),
        (
            r#"track_history_except_column_list = ["amount"]"#,
            r#"track_history_column_list = ["name", "seq"]"#,
        ),
    ] {
        reconfigured(
            &tracking(v1),
            &[r#"{"id": 1, "name": "a", "amount": 10, "seq": 1}"#],
            &[&["1", "a", "10", "1", "1", "NULL"]],
            &tracking(v2),
            &[r#"{"id": 1, "name": "a", "amount": 20, "seq": 2}"#],
            two_versions,
        );
    }
}

// ---------------------------------------------------------------------------
// AutoCdcOutOfOrderConvergenceSuite
// ---------------------------------------------------------------------------

struct Xorshift(u64);

impl Xorshift {
    fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    fn chance(&mut self, p: f64) -> bool {
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

/// One generated change: the suite's `SourceRow`.
#[derive(Clone)]
struct Event {
    key: i64,
    name: Option<&'static str>,
    amount: Option<i64>,
    active: Option<bool>,
    sequence: i64,
    delete: bool,
}

/// The suite's generator: 5 keys, 1 to 80 changes each with globally unique
/// sequences, 20% deletes, 15% re-emitted as exact duplicates, each payload
/// column null 25% of the time; sorted by sequence.
fn random_stream(rng: &mut Xorshift) -> Vec<Event> {
    const COLORS: [&str; 4] = ["red", "blue", "green", "yellow"];
    let mut first: i64 = 0;
    let mut out = Vec::new();
    for key in 0..5 {
        let n = 1 + rng.below(80) as i64;
        for sequence in first..first + n {
            let delete = rng.chance(0.20);
            let name = if rng.chance(0.75) {
                Some(COLORS[rng.below(4) as usize])
            } else {
                None
            };
            let amount = if rng.chance(0.75) {
                Some(rng.below(100) as i64)
            } else {
                None
            };
            let active = if rng.chance(0.75) {
                Some(rng.below(2) == 1)
            } else {
                None
            };
            let e = Event {
                key,
                name,
                amount,
                active,
                sequence,
                delete,
            };
            if rng.chance(0.15) {
                out.push(e.clone());
            }
            out.push(e);
        }
        first += n;
    }
    out
}

fn event_json(e: &Event) -> String {
    let or_null = |v: Option<String>| v.unwrap_or_else(|| "null".to_string());
    format!(
        r#"{{"key": {}, "name": {}, "amount": {}, "active": {}, "sequence": {}, "is_delete": {}}}"#,
        e.key,
        or_null(e.name.map(|n| format!("\"{n}\""))),
        or_null(e.amount.map(|a| a.to_string())),
        or_null(e.active.map(|a| a.to_string())),
        e.sequence,
        e.delete
    )
}

/// The expected target, from the definitions: SCD Type 1 keeps each key's
/// latest change unless it is a delete. SCD Type 2 with the sequence kept
/// (and so tracked): every upsert is a version, from its sequence to the
/// key's next change (upsert or delete), open when it is the last.
fn convergence_oracle(events: &[Event], scd2: bool) -> Rows {
    let mut by_key: BTreeMap<i64, BTreeMap<i64, &Event>> = BTreeMap::new();
    for e in events {
        by_key.entry(e.key).or_default().insert(e.sequence, e);
    }
    let text = |v: Option<String>| v.unwrap_or_else(|| "NULL".to_string());
    let mut out = Rows::new();
    for changes in by_key.values() {
        let evs: Vec<&Event> = changes.values().copied().collect();
        for (i, e) in evs.iter().enumerate() {
            if e.delete {
                continue;
            }
            let mut row = vec![
                e.key.to_string(),
                text(e.name.map(|n| n.to_string())),
                text(e.amount.map(|a| a.to_string())),
                text(e.active.map(|a| a.to_string())),
                e.sequence.to_string(),
            ];
            if scd2 {
                row.push(e.sequence.to_string());
                row.push(text(evs.get(i + 1).map(|n| n.sequence.to_string())));
                out.insert(row);
            } else if i + 1 == evs.len() {
                out.insert(row);
            }
        }
    }
    out
}

/// The suite's `runConvergenceTest` for three fixed seeds: the stream sorted
/// as one batch, and shuffled into 8 batches (restarting after each), must
/// both give the expected target.
fn converges(scd_type: u8) {
    let body = format!(
        "stored_as_scd_type = {}\n{}",
        scd_type,
        r#"keys = ["key"]
sequence_by = "sequence"
apply_as_deletes = "is_delete"
except_column_list = ["is_delete"]
columns = [
  { name = "key", type = "int" },
  { name = "name", type = "string" },
  { name = "amount", type = "int" },
  { name = "active", type = "boolean" },
  { name = "sequence", type = "long" },
  { name = "is_delete", type = "boolean" },
]"#
    );
    let flow = flow(&body);
    let rt = rt();
    for seed in 1..=3u64 {
        let mut rng = Xorshift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let events = random_stream(&mut rng);
        let in_order: Vec<String> = events.iter().map(event_json).collect();
        let mut shuffled = in_order.clone();
        for i in (1..shuffled.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            shuffled.swap(i, j);
        }
        let n = shuffled.len();
        let batches: Vec<String> = (0..8)
            .map(|b| shuffled[b * n / 8..(b + 1) * n / 8].join("\n"))
            .collect();
        let batches: Vec<&str> = batches.iter().map(String::as_str).collect();
        let one = in_order.join("\n");
        let want = convergence_oracle(&events, scd_type == 2);
        for (what, bs, restart) in [
            ("sorted, one batch", vec![one.as_str()], false),
            ("shuffled, 8 batches, restarting after each", batches, true),
        ] {
            let tmp = tempfile::tempdir().unwrap();
            let got = rt.block_on(run(tmp.path(), &flow, &bs, restart));
            assert_eq!(got, want, "seed {seed} ({n} changes): {what}");
        }
    }
}

/// Spark: AutoCdcOutOfOrderConvergenceSuite, "SCD1 merge converges across micro-batch shuffling
/// for randomly generated CDC events".
#[test]
fn scd1_random_changes_converge_across_shuffled_batches() {
    converges(1);
}

/// Spark: AutoCdcOutOfOrderConvergenceSuite, "SCD2 merge converges across micro-batch shuffling
/// for randomly generated CDC events".
#[test]
fn scd2_random_changes_converge_across_shuffled_batches() {
    converges(2);
}
