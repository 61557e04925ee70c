//! Debezium change events as a flow's changes: what a `format = "debezium"`
//! flow derives instead of `sequence_by` and `apply_as_deletes` (hidden
//! position columns and the predicates over them), the order of events per
//! key (`Position`, from the connector's source position), and the values of
//! a row decoded by the event's schema (`decode_value`).
//!
//! Architecture invariant: pure. Reading bodies and routing events to flows
//! is `service::debezium`.

use arrow_cast::base64::{BASE64_STANDARD, Engine as _};
use iceberg::spec::{PrimitiveType, Type};
use serde_json::Value;

/// The hidden column holding the event's `op` (`c`, `u`, `d`, `r`, `t`).
pub const OP: &str = "__autocdc_debezium_op";
/// The hidden sequence columns, compared in this order: the phase (0 for a
/// snapshot read, 1 for a streamed change), four numbers of the source
/// position (their meaning depends on the connector, see `position`), and
/// the operation's rank at one position (a delete before a create).
pub const POSITION: [&str; 6] = [
    "__autocdc_debezium_phase",
    "__autocdc_debezium_pos1",
    "__autocdc_debezium_pos2",
    "__autocdc_debezium_pos3",
    "__autocdc_debezium_pos4",
    "__autocdc_debezium_rank",
];
/// What a Debezium flow deletes and truncates with.
pub const DELETES: &str = "__autocdc_debezium_op = 'd'";
pub const TRUNCATES: &str = "__autocdc_debezium_op = 't'";
/// Debezium's default `unavailable.value.placeholder` (a TOASTed column an
/// update left untouched).
pub const PLACEHOLDER: &str = "__debezium_unavailable_value";

/// The hidden columns after the declared ones, with their types: the op,
/// then the position.
pub fn hidden_columns() -> Vec<(&'static str, Type)> {
    let long = Type::Primitive(PrimitiveType::Long);
    let int = Type::Primitive(PrimitiveType::Int);
    let mut v = vec![(OP, Type::Primitive(PrimitiveType::String))];
    v.push((POSITION[0], int.clone()));
    for name in &POSITION[1..5] {
        v.push((*name, long.clone()));
    }
    v.push((POSITION[5], int));
    v
}

/// The operation of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Create,
    Update,
    Delete,
    Read,
    Truncate,
}

impl Op {
    pub fn parse(s: &str) -> Option<Op> {
        Some(match s {
            "c" => Op::Create,
            "u" => Op::Update,
            "d" => Op::Delete,
            "r" => Op::Read,
            "t" => Op::Truncate,
            _ => return None,
        })
    }

    pub fn code(self) -> &'static str {
        match self {
            Op::Create => "c",
            Op::Update => "u",
            Op::Delete => "d",
            Op::Read => "r",
            Op::Truncate => "t",
        }
    }
}

/// Where an event sits in its source's order: compared field by field,
/// this is the flow's sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    /// 0: a snapshot read; 1: a streamed change. A snapshot read never wins
    /// over a streamed change (its position may be below the first streamed
    /// transaction's).
    pub phase: i32,
    pub pos: [i64; 4],
    /// 0 for a delete, 1 otherwise: a primary-key change is a delete and a
    /// create at one position, in that order. -1: the end of a table's
    /// snapshot (`snapshot_end`), below every event at its position.
    pub rank: i32,
}

impl Position {
    /// Where a table's completed snapshot truncates: just below its reads.
    /// A snapshot that runs again (Debezium stopped before it completed) is
    /// authoritative: when it completes, every key whose latest change is a
    /// read of an earlier snapshot (a lower position) is gone from the
    /// source, as FROM SNAPSHOT would have it; the reads of this snapshot
    /// and every streamed change sort above this and stay.
    pub fn snapshot_end(self) -> Position {
        Position {
            phase: 0,
            pos: self.pos,
            rank: -1,
        }
    }
}

/// Whether an event is the last read of its table's snapshot
/// (`source.snapshot` is `last_in_data_collection`, or `last` for the last
/// table of the snapshot). Incremental snapshots (`incremental`) never end
/// one: they read chunks beside the stream.
pub fn ends_snapshot(snapshot: Option<&str>, op: Op) -> bool {
    op == Op::Read && matches!(snapshot, Some("last" | "last_in_data_collection"))
}

/// An unsigned 64-bit position as a signed one of the same order.
fn ordered(v: u64) -> i64 {
    (v ^ (1 << 63)) as i64
}

/// A number of the source block: a JSON number or a decimal string; null or
/// absent is 0 (PostgreSQL's first transaction after a snapshot has no
/// previous commit).
fn unsigned(v: Option<&Value>, what: &str) -> Result<u64, String> {
    match v {
        None | Some(Value::Null) => Ok(0),
        Some(Value::Number(n)) => n
            .as_u64()
            .ok_or_else(|| format!("source.{what} = {n} is not a whole number of 0 or more")),
        Some(Value::String(s)) => s
            .parse()
            .map_err(|_| format!("source.{what} = \"{}\" is not a whole number", clip(s))),
        Some(other) => Err(format!("source.{what} is {}, not a number", kind(other))),
    }
}

/// The position of an event of connector `source.connector`:
/// - PostgreSQL: `source.sequence` `["<last commit LSN>", "<LSN>"]` (else
///   `source.lsn`): pos1 = the previous transaction's commit LSN, which grows
///   between transactions, pos2 = the event's LSN, which grows inside one.
/// - MySQL and MariaDB: the binlog file's number, `pos`, `row`.
/// - SQL Server: `commit_lsn`, `change_lsn` (each `vlf:block:slot` in hex),
///   `event_serial_no`.
///
/// Any other connector is refused: its order is not derived yet.
pub fn position(source: &Value, op: Op) -> Result<Position, String> {
    position_of(&|k| source.get(k).cloned(), op)
}

/// `position`, the source block's fields given by `get` (a reader that
/// does not build the whole block).
pub fn position_of(get: &dyn Fn(&str) -> Option<Value>, op: Op) -> Result<Position, String> {
    source_pos(get).map(|pos| at(pos, op))
}

/// The source position `position` reads, the same for every event of one
/// source block whatever its op.
pub fn source_pos(get: &dyn Fn(&str) -> Option<Value>) -> Result<[i64; 4], String> {
    let connector = get("connector");
    let connector = connector.as_ref().and_then(Value::as_str).unwrap_or("");
    let pos = match connector {
        "postgresql" => {
            let (last, lsn) = match get("sequence").as_ref() {
                Some(Value::String(s)) => {
                    let pair: Vec<Value> = serde_json::from_str(s).map_err(|_| {
                        format!("source.sequence = \"{}\" is not a JSON array", clip(s))
                    })?;
                    if pair.len() != 2 {
                        return Err(format!(
                            "source.sequence = \"{}\" does not hold two positions",
                            clip(s)
                        ));
                    }
                    let lsn = match &pair[1] {
                        Value::Null => unsigned(get("lsn").as_ref(), "lsn")?,
                        v => unsigned(Some(v), "sequence[1]")?,
                    };
                    (unsigned(Some(&pair[0]), "sequence[0]")?, lsn)
                }
                _ => (0, unsigned(get("lsn").as_ref(), "lsn")?),
            };
            [ordered(last), ordered(lsn), 0, 0]
        }
        "mysql" | "mariadb" => {
            let file = get("file");
            let file = file.as_ref().and_then(Value::as_str).unwrap_or("");
            let number = file
                .rsplit('.')
                .next()
                .and_then(|n| n.parse::<u64>().ok())
                .ok_or_else(|| {
                    format!(
                        "source.file = \"{}\" does not end in a binlog number",
                        clip(file)
                    )
                })?;
            [
                ordered(number),
                ordered(unsigned(get("pos").as_ref(), "pos")?),
                ordered(unsigned(get("row").as_ref(), "row")?),
                0,
            ]
        }
        "sqlserver" => {
            let (c_hi, c_slot) = sqlserver_lsn(get("commit_lsn").as_ref(), "commit_lsn")?;
            let (h_hi, h_slot) = sqlserver_lsn(get("change_lsn").as_ref(), "change_lsn")?;
            let serial = unsigned(get("event_serial_no").as_ref(), "event_serial_no")?;
            if serial > u64::from(u32::MAX) {
                return Err(format!("source.event_serial_no = {serial} is out of range"));
            }
            [
                ordered(c_hi),
                i64::from(c_slot),
                ordered(h_hi),
                (i64::from(h_slot) << 32) | serial as i64,
            ]
        }
        "" => return Err("the event has no source.connector".into()),
        other => {
            return Err(format!(
                "connector `{}` has no derived order yet (PostgreSQL, MySQL, MariaDB and SQL Server have); send its changes as rows with a sequence_by column",
                clip(other)
            ));
        }
    };
    Ok(pos)
}

/// The position of an event of `op` at source position `pos`.
pub fn at(pos: [i64; 4], op: Op) -> Position {
    Position {
        phase: i32::from(op != Op::Read),
        pos,
        rank: i32::from(op != Op::Delete),
    }
}

/// The position of a PostgreSQL event whose `source.sequence` is
/// `[last, lsn]` (as `position` reads it).
pub fn postgres_position(last: u64, lsn: u64, op: Op) -> Position {
    at(postgres_pos(last, lsn), op)
}

/// The source position of a PostgreSQL event (`postgres_position`).
pub fn postgres_pos(last: u64, lsn: u64) -> [i64; 4] {
    [ordered(last), ordered(lsn), 0, 0]
}

/// PostgreSQL's `source.sequence` as its JSON text in the event
/// (`"[\"12\",\"34\"]"`, either may be `null`): the two positions, read
/// without building values. `None` for any other shape: `position` reads
/// (and explains) those.
pub fn postgres_sequence(raw: &str) -> Option<(Option<u64>, Option<u64>)> {
    let inner = raw.strip_prefix("\"[")?.strip_suffix("]\"")?;
    let item = |t: &str| -> Option<Option<u64>> {
        if t == "null" {
            return Some(None);
        }
        let digits = t.strip_prefix("\\\"")?.strip_suffix("\\\"")?;
        if digits.is_empty() || digits.len() > 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        digits.parse().ok().map(Some)
    };
    let (a, b) = inner.split_once(',')?;
    Some((item(a)?, item(b)?))
}

/// A SQL Server LSN `vvvvvvvv:bbbbbbbb:ssss` (hex) as (vlf << 32 | block, slot); null is 0.
fn sqlserver_lsn(v: Option<&Value>, what: &str) -> Result<(u64, u16), String> {
    let s = match v {
        None | Some(Value::Null) => return Ok((0, 0)),
        Some(Value::String(s)) => s,
        Some(other) => return Err(format!("source.{what} is {}, not an LSN", kind(other))),
    };
    let bad = || {
        format!(
            "source.{what} = \"{}\" is not an LSN (vlf:block:slot in hex)",
            clip(s)
        )
    };
    let mut parts = s.split(':');
    let (Some(a), Some(b), Some(c), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad());
    };
    let vlf = u32::from_str_radix(a, 16).map_err(|_| bad())?;
    let block = u32::from_str_radix(b, 16).map_err(|_| bad())?;
    let slot = u16::from_str_radix(c, 16).map_err(|_| bad())?;
    Ok(((u64::from(vlf) << 32) | u64::from(block), slot))
}

/// A value decoded for its column: JSON the row decoder reads (numbers,
/// strings in the text forms `convert` parses), or the bytes of a binary
/// column.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    Json(Value),
    Bytes(Vec<u8>),
}

/// Whether `decode_value` gives every value of a field with this schema
/// back as it is for a column of type `column` (a reader may then copy the
/// value's JSON text instead of decoding it).
pub fn passes_through(schema: Option<&Value>, column: &Type) -> bool {
    let name = schema.and_then(|s| s.get("name")).and_then(Value::as_str);
    let ty = schema.and_then(|s| s.get("type")).and_then(Value::as_str);
    let decoded_name = matches!(
        name,
        Some(
            "org.apache.kafka.connect.data.Decimal"
                | "io.debezium.data.VariableScaleDecimal"
                | "io.debezium.time.Date"
                | "org.apache.kafka.connect.data.Date"
                | "io.debezium.time.Time"
                | "org.apache.kafka.connect.data.Time"
                | "io.debezium.time.MicroTime"
                | "io.debezium.time.NanoTime"
                | "io.debezium.time.Timestamp"
                | "org.apache.kafka.connect.data.Timestamp"
                | "io.debezium.time.MicroTimestamp"
                | "io.debezium.time.NanoTimestamp"
        )
    );
    !decoded_name
        && ty != Some("bytes")
        && !matches!(
            column,
            Type::Primitive(
                PrimitiveType::Binary | PrimitiveType::Uuid | PrimitiveType::Decimal { .. }
            )
        )
}

/// Decodes one field of `after` / `before` for a column of type `column`,
/// by the field's schema (`schema`, a Kafka Connect field schema) when the
/// event carries one, else by the column's type:
/// - `Decimal` (base64 unscaled, `parameters.scale`) and
///   `VariableScaleDecimal` (`{scale, value}`): the decimal's text.
/// - `Date` (days), `Time` / `MicroTime` / `NanoTime` (of the day),
///   `Timestamp` / `MicroTimestamp` / `NanoTimestamp` (since the epoch) and
///   Kafka Connect's `Date` / `Time` / `Timestamp`: ISO text (nanoseconds
///   that are not whole microseconds are refused: Iceberg keeps microseconds).
/// - `bytes`: base64, decoded for a binary column.
/// - Everything else (`ZonedTimestamp`, `Json`, `Uuid`, numbers, strings,
///   booleans) as it is.
///
/// Without a schema: a string in a binary column is base64, a string in a
/// decimal column that is not a number is a base64 unscaled value at the
/// column's scale; integers in date, time and timestamp columns are days,
/// microseconds of the day and microseconds since the epoch (`convert`'s
/// rules); the rest as it is.
pub fn decode_value(schema: Option<&Value>, v: &Value, column: &Type) -> Result<Cell, String> {
    if v.is_null() {
        return Ok(Cell::Json(Value::Null));
    }
    let name = schema.and_then(|s| s.get("name")).and_then(Value::as_str);
    let ty = schema.and_then(|s| s.get("type")).and_then(Value::as_str);
    let binary_column = matches!(column, Type::Primitive(PrimitiveType::Binary));
    let text = |s: String| -> Result<Cell, String> { Ok(Cell::Json(Value::String(s))) };
    match name {
        Some("org.apache.kafka.connect.data.Decimal") => {
            let scale = schema
                .and_then(|s| s.get("parameters"))
                .and_then(|p| p.get("scale"))
                .and_then(|s| match s {
                    Value::String(s) => s.parse().ok(),
                    Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
                    _ => None,
                })
                .ok_or("a Decimal field's schema has no parameters.scale")?;
            let b64 = v
                .as_str()
                .ok_or_else(|| format!("a Decimal is base64 text, not {}", kind(v)))?;
            text(decimal_text(&unscaled(b64)?, scale))
        }
        Some("io.debezium.data.VariableScaleDecimal") => {
            let scale = v
                .get("scale")
                .and_then(Value::as_u64)
                .and_then(|s| u32::try_from(s).ok())
                .ok_or("a VariableScaleDecimal has no scale")?;
            let b64 = v
                .get("value")
                .and_then(Value::as_str)
                .ok_or("a VariableScaleDecimal has no value")?;
            text(decimal_text(&unscaled(b64)?, scale))
        }
        Some("io.debezium.time.Date" | "org.apache.kafka.connect.data.Date") => {
            let days = whole(v)?;
            let d = chrono::NaiveDate::from_ymd_opt(1970, 1, 1)
                .and_then(|e| e.checked_add_signed(chrono::TimeDelta::try_days(days)?))
                .ok_or_else(|| format!("{days} days is out of range for a date"))?;
            text(d.format("%Y-%m-%d").to_string())
        }
        Some("io.debezium.time.Time" | "org.apache.kafka.connect.data.Time") => {
            text(time_text(micros(whole(v)?, 1000)?)?)
        }
        Some("io.debezium.time.MicroTime") => text(time_text(whole(v)?)?),
        Some("io.debezium.time.NanoTime") => text(time_text(from_nanos(whole(v)?)?)?),
        Some("io.debezium.time.Timestamp" | "org.apache.kafka.connect.data.Timestamp") => {
            text(timestamp_text(micros(whole(v)?, 1000)?)?)
        }
        Some("io.debezium.time.MicroTimestamp") => text(timestamp_text(whole(v)?)?),
        Some("io.debezium.time.NanoTimestamp") => text(timestamp_text(from_nanos(whole(v)?)?)?),
        _ if ty == Some("bytes") || (schema.is_none() && binary_column) => {
            let b64 = v
                .as_str()
                .ok_or_else(|| format!("bytes are base64 text, not {}", kind(v)))?;
            let bytes = BASE64_STANDARD
                .decode(b64)
                .map_err(|e| format!("`{}` is not base64: {e}", clip(b64)))?;
            if binary_column {
                Ok(Cell::Bytes(bytes))
            } else if let (Type::Primitive(PrimitiveType::Decimal { scale, .. }), None) =
                (column, name)
            {
                text(decimal_text(&bytes, *scale))
            } else {
                text(b64.to_string())
            }
        }
        _ => match (column, v) {
            // `io.debezium.data.Uuid` is the canonical text; a uuid column
            // reads its 32 hex digits.
            (Type::Primitive(PrimitiveType::Uuid), Value::String(s))
                if s.len() == 36 && s.bytes().filter(|&b| b == b'-').count() == 4 =>
            {
                text(s.replace('-', ""))
            }
            (Type::Primitive(PrimitiveType::Decimal { scale, .. }), Value::String(s))
                if schema.is_none() && s.parse::<f64>().is_err() =>
            {
                text(decimal_text(&unscaled(s)?, *scale))
            }
            _ => Ok(Cell::Json(v.clone())),
        },
    }
}

fn whole(v: &Value) -> Result<i64, String> {
    v.as_i64()
        .ok_or_else(|| format!("expected a whole number, got {}", kind(v)))
}

fn micros(v: i64, per: i64) -> Result<i64, String> {
    v.checked_mul(per)
        .ok_or_else(|| format!("{v} is out of range for a time or timestamp"))
}

fn from_nanos(v: i64) -> Result<i64, String> {
    if v % 1000 != 0 {
        return Err(format!(
            "{v} ns is not a whole number of microseconds; Iceberg keeps times to the microsecond (set time.precision.mode=adaptive_time_microseconds)"
        ));
    }
    Ok(v / 1000)
}

fn time_text(us: i64) -> Result<String, String> {
    if !(0..86_400_000_000).contains(&us) {
        return Err(format!("{us} µs is not a time of day"));
    }
    let (s, frac) = (us / 1_000_000, us % 1_000_000);
    Ok(format!(
        "{:02}:{:02}:{:02}.{frac:06}",
        s / 3600,
        s / 60 % 60,
        s % 60
    ))
}

fn timestamp_text(us: i64) -> Result<String, String> {
    let t = chrono::DateTime::from_timestamp_micros(us)
        .ok_or_else(|| format!("{us} µs is out of range for a timestamp"))?;
    Ok(t.naive_utc().format("%Y-%m-%dT%H:%M:%S%.6f").to_string())
}

/// The big-endian two's-complement integer in base64 `b64`.
fn unscaled(b64: &str) -> Result<Vec<u8>, String> {
    BASE64_STANDARD
        .decode(b64)
        .map_err(|e| format!("`{}` is not a base64 decimal: {e}", clip(b64)))
}

/// The decimal text of a big-endian two's-complement unscaled value.
fn decimal_text(bytes: &[u8], scale: u32) -> String {
    let negative = bytes.first().is_some_and(|b| b & 0x80 != 0);
    // Magnitude as base-10^9 limbs, by repeated division of the bytes.
    let mut mag: Vec<u8> = if negative {
        // Two's complement: invert and add one.
        let mut m: Vec<u8> = bytes.iter().map(|b| !b).collect();
        for b in m.iter_mut().rev() {
            let (v, carry) = b.overflowing_add(1);
            *b = v;
            if !carry {
                break;
            }
        }
        m
    } else {
        bytes.to_vec()
    };
    let mut digits = Vec::new();
    while mag.iter().any(|&b| b != 0) {
        let mut rem = 0u32;
        for b in mag.iter_mut() {
            let cur = (rem << 8) | u32::from(*b);
            *b = (cur / 10) as u8;
            rem = cur % 10;
        }
        digits.push(b'0' + rem as u8);
    }
    let scale = scale as usize;
    while digits.len() <= scale {
        digits.push(b'0');
    }
    digits.reverse();
    let (int, frac) = digits.split_at(digits.len() - scale);
    let mut out = String::with_capacity(digits.len() + 2);
    if negative {
        out.push('-');
    }
    out.push_str(std::str::from_utf8(int).unwrap_or("0"));
    if scale > 0 {
        out.push('.');
        out.push_str(std::str::from_utf8(frac).unwrap_or("0"));
    }
    out
}

/// A JSON value's kind, for errors.
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// At most 60 characters of `s`, for errors.
fn clip(s: &str) -> String {
    let mut c: String = s.chars().take(60).collect();
    if c.len() < s.len() {
        c.push('…');
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pg(seq: &str, op: Op) -> Position {
        position(
            &json!({"connector": "postgresql", "sequence": seq, "lsn": 7}),
            op,
        )
        .unwrap()
    }

    /// The fast reader of `source.sequence` agrees with `position` on every
    /// shape it takes, and leaves the others to it.
    #[test]
    fn postgres_sequence_text_read_fast_agrees_with_position() {
        for seq in [
            "[\"150\",\"130\"]",
            "[null,\"900\"]",
            "[\"18446744073709551615\",\"0\"]",
        ] {
            let raw = serde_json::to_string(seq).unwrap();
            let (last, lsn) = postgres_sequence(&raw).unwrap();
            for op in [Op::Read, Op::Create, Op::Delete] {
                assert_eq!(
                    postgres_position(last.unwrap_or(0), lsn.unwrap(), op),
                    pg(seq, op),
                    "{seq}"
                );
            }
        }
        assert_eq!(
            postgres_sequence(&serde_json::to_string("[\"5\",null]").unwrap()),
            Some((Some(5), None))
        );
        for other in [
            "[\"1\"]",
            "[\"1\",\"2\",\"3\"]",
            "[\"-1\",\"2\"]",
            "[\"1x\",\"2\"]",
            "[1,2]",
            "[\"99999999999999999999\",\"1\"]",
        ] {
            let raw = serde_json::to_string(other).unwrap();
            assert_eq!(postgres_sequence(&raw), None, "{other}");
        }
        assert_eq!(postgres_sequence("17"), None);
    }

    #[test]
    fn postgres_orders_snapshot_then_transactions_then_lsn_then_delete_first() {
        let snap = pg("[null,\"900\"]", Op::Read);
        let first_tx = pg("[null,\"100\"]", Op::Create);
        let later = pg("[\"150\",\"120\"]", Op::Update);
        let later_lsn = pg("[\"150\",\"130\"]", Op::Update);
        let key_change_delete = pg("[\"150\",\"130\"]", Op::Delete);
        assert!(
            snap < first_tx,
            "a snapshot read never wins over a streamed change"
        );
        assert!(first_tx < later && later < later_lsn);
        assert!(key_change_delete < later_lsn);
        // A second snapshot (one that ran again) is later than the first.
        assert!(pg("[null,\"800\"]", Op::Read) < snap);
        // No sequence: the LSN.
        let lsn_only = position(&json!({"connector": "postgresql", "lsn": 5}), Op::Create).unwrap();
        assert_eq!(lsn_only.pos[1], ordered(5));
    }

    #[test]
    fn unsigned_positions_keep_their_order_as_signed() {
        let mut v = [0u64, 1, 1 << 62, (1 << 63) - 1, 1 << 63, u64::MAX];
        v.sort();
        let s: Vec<i64> = v.iter().map(|&x| ordered(x)).collect();
        assert!(s.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn mysql_and_sqlserver_positions() {
        let my = |file: &str, pos: u64, row: u64| {
            position(
                &json!({"connector": "mysql", "file": file, "pos": pos, "row": row}),
                Op::Update,
            )
            .unwrap()
        };
        assert!(my("mysql-bin.000002", 900, 0) < my("mysql-bin.000003", 4, 0));
        assert!(my("mysql-bin.000003", 4, 0) < my("mysql-bin.000003", 4, 1));
        let ss = |commit: &str, change: &str, serial: u64| {
            position(
                &json!({"connector": "sqlserver", "commit_lsn": commit, "change_lsn": change, "event_serial_no": serial}),
                Op::Update,
            )
            .unwrap()
        };
        assert!(
            ss("0000002a:00000320:0002", "0000002a:00000318:0002", 2)
                < ss("0000002a:00000320:0003", "0000002a:00000300:0001", 1)
        );
        assert!(
            ss("0000002a:00000320:0002", "0000002a:00000318:0002", 1)
                < ss("0000002a:00000320:0002", "0000002a:00000318:0002", 2)
        );
        let e = position(&json!({"connector": "mongodb"}), Op::Create).unwrap_err();
        assert!(e.contains("mongodb") && e.contains("sequence_by"), "{e}");
        let e = position(
            &json!({"connector": "sqlserver", "commit_lsn": "zz"}),
            Op::Create,
        )
        .unwrap_err();
        assert!(e.contains("commit_lsn"), "{e}");
    }

    fn dec(scale: u32) -> Value {
        json!({"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal", "parameters": {"scale": scale.to_string()}})
    }

    #[test]
    fn decimals_from_base64_unscaled_values() {
        let col = Type::Primitive(PrimitiveType::Decimal {
            precision: 12,
            scale: 2,
        });
        // 12345 = 0x3039; -12345 = 0xCFC7; 5 = 0x05.
        for (b64, want) in [
            ("MDk=", "123.45"),
            ("z8c=", "-123.45"),
            ("BQ==", "0.05"),
            ("AA==", "0.00"),
        ] {
            assert_eq!(
                decode_value(Some(&dec(2)), &json!(b64), &col).unwrap(),
                Cell::Json(json!(want))
            );
        }
        let vsd = json!({"type": "struct", "name": "io.debezium.data.VariableScaleDecimal"});
        assert_eq!(
            decode_value(Some(&vsd), &json!({"scale": 3, "value": "MDk="}), &col).unwrap(),
            Cell::Json(json!("12.345"))
        );
        // Without a schema: a number's text as it is, base64 at the column's scale.
        assert_eq!(
            decode_value(None, &json!("1.50"), &col).unwrap(),
            Cell::Json(json!("1.50"))
        );
        assert_eq!(
            decode_value(None, &json!("MDk="), &col).unwrap(),
            Cell::Json(json!("123.45"))
        );
        // A long value (over 16 bytes) still decodes.
        let big = BASE64_STANDARD.encode([0x7f; 20]);
        let Cell::Json(Value::String(t)) = decode_value(Some(&dec(0)), &json!(big), &col).unwrap()
        else {
            panic!()
        };
        assert_eq!(t.len(), 48);
    }

    #[test]
    fn times_by_their_logical_type() {
        let any = Type::Primitive(PrimitiveType::String);
        let named = |n: &str| json!({"type": "int64", "name": n});
        let cases = [
            ("io.debezium.time.Date", json!(19000), "2022-01-08"),
            (
                "io.debezium.time.MicroTimestamp",
                json!(1_700_000_000_123_456i64),
                "2023-11-14T22:13:20.123456",
            ),
            (
                "io.debezium.time.Timestamp",
                json!(1_700_000_000_123i64),
                "2023-11-14T22:13:20.123000",
            ),
            (
                "io.debezium.time.NanoTimestamp",
                json!(1_700_000_000_123_456_000i64),
                "2023-11-14T22:13:20.123456",
            ),
            (
                "io.debezium.time.MicroTime",
                json!(3_723_000_001i64),
                "01:02:03.000001",
            ),
            (
                "io.debezium.time.Time",
                json!(3_723_001i64),
                "01:02:03.001000",
            ),
            ("io.debezium.time.Date", json!(-1), "1969-12-31"),
        ];
        for (name, v, want) in cases {
            assert_eq!(
                decode_value(Some(&named(name)), &v, &any).unwrap(),
                Cell::Json(json!(want)),
                "{name}"
            );
        }
        let e = decode_value(
            Some(&named("io.debezium.time.NanoTimestamp")),
            &json!(1001),
            &any,
        )
        .unwrap_err();
        assert!(e.contains("microsecond"), "{e}");
        let e =
            decode_value(Some(&named("io.debezium.time.MicroTime")), &json!(-1), &any).unwrap_err();
        assert!(e.contains("time of day"), "{e}");
        // Zoned timestamps, JSON and UUIDs are strings as they are.
        let z = json!({"type": "string", "name": "io.debezium.time.ZonedTimestamp"});
        assert_eq!(
            decode_value(Some(&z), &json!("2024-01-01T10:00:00Z"), &any).unwrap(),
            Cell::Json(json!("2024-01-01T10:00:00Z"))
        );
    }

    #[test]
    fn uuids_in_canonical_text_fill_uuid_columns() {
        let uuid = Type::Primitive(PrimitiveType::Uuid);
        let named = json!({"type": "string", "name": "io.debezium.data.Uuid"});
        let v = json!("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11");
        for schema in [Some(&named), None] {
            assert_eq!(
                decode_value(schema, &v, &uuid).unwrap(),
                Cell::Json(json!("a0eebc999c0b4ef8bb6d6bb9bd380a11"))
            );
        }
        // A string column keeps the text as it is.
        let s = Type::Primitive(PrimitiveType::String);
        assert_eq!(
            decode_value(Some(&named), &v, &s).unwrap(),
            Cell::Json(v.clone())
        );
    }

    #[test]
    fn bytes_are_base64() {
        let bin = Type::Primitive(PrimitiveType::Binary);
        let bytes = json!({"type": "bytes"});
        assert_eq!(
            decode_value(Some(&bytes), &json!("AAEC"), &bin).unwrap(),
            Cell::Bytes(vec![0, 1, 2])
        );
        assert_eq!(
            decode_value(None, &json!("AAEC"), &bin).unwrap(),
            Cell::Bytes(vec![0, 1, 2])
        );
        assert!(
            decode_value(Some(&bytes), &json!("!!"), &bin)
                .unwrap_err()
                .contains("base64")
        );
        assert!(
            decode_value(Some(&bytes), &json!(5), &bin)
                .unwrap_err()
                .contains("a number")
        );
    }
}
