//! Strict conversion of pushed values into a flow's column types. A value
//! that does not fit exactly is refused with its row, never rounded: a CDC
//! sink that rounds a key merges two different rows into one.
//!
//! The rules (docs/values.md):
//! - `int`, `long`: an integer in range. `1.0` and `1e3` are integers;
//!   `1.9`, `1e400` and `-9223372036854775809` are refused.
//! - `decimal(p, s)`: at most `s` fractional digits (beyond them only zeros)
//!   and at most `p` digits in all.
//! - `float`, `double`: the nearest value; a finite text that overflows to
//!   infinity is refused (the texts `NaN`, `Infinity`, `-Infinity` are kept).
//! - `date`, `timestamp`, `timestamptz`, `time`: ISO text, or an integer of
//!   days / microseconds; years 0001 to 9999 only (what every reader prints).
//! - Arrow numbers into `int`, `long` or `decimal` are kept only if the value
//!   converts back unchanged.
//!
//! Text arrives from JSON as the number's own digits (never through `f64`),
//! so these rules hold for every body format.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type};
use arrow_array::{Array, ArrayRef, Decimal128Array, Float32Array, Float64Array, StringArray};
use arrow_cast::CastOptions;
use arrow_schema::{DataType, TimeUnit};

/// Why a value was refused: its row in the column and the reason.
#[derive(Debug)]
pub struct Refused {
    pub row: usize,
    pub message: String,
}

fn refused<T>(row: usize, message: String) -> Result<T, Refused> {
    Err(Refused { row, message })
}

/// The first microsecond of year 0001 and the last of year 9999.
const MIN_MICROS: i64 = -62_135_596_800_000_000;
const MAX_MICROS: i64 = 253_402_300_799_999_999;
/// 0001-01-01 and 9999-12-31 in days since 1970-01-01.
const MIN_DAYS: i64 = -719_162;
const MAX_DAYS: i64 = 2_932_896;

/// Converts `src` into `to` under the rules above.
pub fn column(src: &ArrayRef, to: &DataType) -> Result<ArrayRef, Refused> {
    let out = match src.data_type() {
        s if s == to => src.clone(),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View if is_textual_target(to) => {
            let text = arrow_cast::cast(src, &DataType::Utf8).map_err(|e| Refused {
                row: 0,
                message: e.to_string(),
            })?;
            from_text(text.as_string::<i32>(), to)?
        }
        _ => from_arrow(src, to)?,
    };
    check_range(&out)?;
    Ok(out)
}

/// Targets whose text form autocdc parses itself.
pub fn is_textual_target(to: &DataType) -> bool {
    matches!(
        to,
        DataType::Int32
            | DataType::Int64
            | DataType::Float32
            | DataType::Float64
            | DataType::Decimal128(..)
            | DataType::Date32
            | DataType::Time64(_)
            | DataType::Timestamp(..)
    )
}

fn from_text(s: &StringArray, to: &DataType) -> Result<ArrayRef, Refused> {
    let name = type_name(to);
    Ok(match to {
        DataType::Int32 => Arc::new(
            integers(s, i32::MIN as i128, i32::MAX as i128, &name)?
                .into_iter()
                .map(|v| v.map(|v| v as i32))
                .collect::<arrow_array::Int32Array>(),
        ),
        DataType::Int64 => Arc::new(
            integers(s, i64::MIN as i128, i64::MAX as i128, &name)?
                .into_iter()
                .map(|v| v.map(|v| v as i64))
                .collect::<arrow_array::Int64Array>(),
        ),
        DataType::Decimal128(p, sc) => {
            let mut out = Vec::with_capacity(s.len());
            for (row, v) in s.iter().enumerate() {
                out.push(match v {
                    None => None,
                    Some(t) => Some(
                        decimal(t, *p as u32, *sc as i32)
                            .or_else(|why| refused(row, format!("`{}` {why}", clip(t))))?,
                    ),
                });
            }
            Arc::new(
                Decimal128Array::from(out)
                    .with_precision_and_scale(*p, *sc)
                    .map_err(|e| Refused {
                        row: 0,
                        message: e.to_string(),
                    })?,
            )
        }
        DataType::Float32 => Arc::new(
            floats(s, &name, |t| {
                t.parse::<f32>().ok().map(|v| (v as f64, v.is_finite()))
            })?
            .into_iter()
            .map(|v| v.map(|v| v as f32))
            .collect::<Float32Array>(),
        ),
        DataType::Float64 => Arc::new(
            floats(s, &name, |t| {
                t.parse::<f64>().ok().map(|v| (v, v.is_finite()))
            })?
            .into_iter()
            .collect::<Float64Array>(),
        ),
        DataType::Date32 | DataType::Time64(_) | DataType::Timestamp(..) => temporal(s, to)?,
        _ => unreachable!("is_textual_target"),
    })
}

/// Integers in `[min, max]`, written as exact numbers.
fn integers(
    s: &StringArray,
    min: i128,
    max: i128,
    name: &str,
) -> Result<Vec<Option<i128>>, Refused> {
    let mut out = Vec::with_capacity(s.len());
    for (row, v) in s.iter().enumerate() {
        let Some(t) = v else {
            out.push(None);
            continue;
        };
        let Some(n) = Exact::parse(t) else {
            return refused(row, format!("`{}` cannot be read as a {name}", clip(t)));
        };
        match n.integer() {
            Some(i) if (min..=max).contains(&i) => out.push(Some(i)),
            Some(_) | None if n.is_integral() => {
                return refused(row, format!("`{}` is out of range for {name}", clip(t)));
            }
            _ => {
                return refused(
                    row,
                    format!(
                        "`{}` has a fraction; a {name} takes whole numbers only",
                        clip(t)
                    ),
                );
            }
        }
    }
    Ok(out)
}

fn floats(
    s: &StringArray,
    name: &str,
    parse: impl Fn(&str) -> Option<(f64, bool)>,
) -> Result<Vec<Option<f64>>, Refused> {
    let mut out = Vec::with_capacity(s.len());
    for (row, v) in s.iter().enumerate() {
        let Some(t) = v else {
            out.push(None);
            continue;
        };
        let t = t.trim();
        let named = matches!(
            t.to_ascii_lowercase().as_str(),
            "nan" | "infinity" | "-infinity" | "+infinity" | "inf" | "-inf" | "+inf"
        );
        match parse(t) {
            Some((v, finite)) if finite || named => out.push(Some(v)),
            Some(_) => {
                return refused(row, format!("`{}` is out of range for {name}", clip(t)));
            }
            None => return refused(row, format!("`{}` cannot be read as a {name}", clip(t))),
        }
    }
    Ok(out)
}

/// Dates, times and timestamps: an integer is days (dates) or the column's
/// unit (times, timestamps); anything else is parsed as ISO text by Arrow.
fn temporal(s: &StringArray, to: &DataType) -> Result<ArrayRef, Refused> {
    let name = type_name(to);
    let mut values: Vec<Option<i64>> = vec![None; s.len()];
    let mut texts: Vec<Option<&str>> = vec![None; s.len()];
    for (row, v) in s.iter().enumerate() {
        let Some(t) = v else { continue };
        match Exact::parse(t) {
            Some(n) => match n.integer().map(i64::try_from) {
                Some(Ok(i)) => values[row] = Some(i),
                _ if n.is_integral() => {
                    return refused(row, format!("`{}` is out of range for {name}", clip(t)));
                }
                _ => {
                    return refused(
                        row,
                        format!(
                            "`{}` has a fraction; a {name} written as a number is a whole count of {}",
                            clip(t),
                            unit_name(to)
                        ),
                    );
                }
            },
            None => texts[row] = Some(t),
        }
    }
    if texts.iter().any(Option::is_some) {
        let texts: ArrayRef = Arc::new(StringArray::from(texts.clone()));
        let parsed = arrow_cast::cast_with_options(&texts, to, &CastOptions::default())
            .and_then(|a| {
                let as_int = if matches!(to, DataType::Date32) {
                    DataType::Int32
                } else {
                    DataType::Int64
                };
                arrow_cast::cast(&a, &as_int)
            })
            .map_err(|e| Refused {
                row: 0,
                message: e.to_string(),
            })?;
        for (row, value) in values.iter_mut().enumerate() {
            if texts.is_null(row) {
                continue;
            }
            if parsed.is_null(row) {
                return refused(row, format!("`{}` is not a {name}", clip(s.value(row))));
            }
            *value = Some(match parsed.data_type() {
                DataType::Int32 => parsed.as_primitive::<Int32Type>().value(row) as i64,
                _ => parsed.as_primitive::<Int64Type>().value(row),
            });
        }
    }
    let ints: ArrayRef = if matches!(to, DataType::Date32) {
        let mut out = Vec::with_capacity(values.len());
        for (row, v) in values.iter().enumerate() {
            out.push(match v {
                None => None,
                Some(d) => match i32::try_from(*d) {
                    Ok(d) => Some(d),
                    Err(_) => return refused(row, format!("{d} days is out of range for date")),
                },
            });
        }
        Arc::new(arrow_array::Int32Array::from(out))
    } else {
        Arc::new(arrow_array::Int64Array::from(values))
    };
    arrow_cast::cast(&ints, to).map_err(|e| Refused {
        row: 0,
        message: e.to_string(),
    })
}

fn unit_name(to: &DataType) -> &'static str {
    match to {
        DataType::Date32 => "days",
        DataType::Time64(TimeUnit::Nanosecond) | DataType::Timestamp(TimeUnit::Nanosecond, _) => {
            "nanoseconds"
        }
        DataType::Timestamp(TimeUnit::Millisecond, _) => "milliseconds",
        DataType::Timestamp(TimeUnit::Second, _) => "seconds",
        _ => "microseconds",
    }
}

/// Arrow values of another type: cast, refuse what the cast cannot
/// represent, and for integer and decimal targets refuse what does not
/// convert back unchanged (1.9 into long, 1.005 into decimal(10,2)).
fn from_arrow(src: &ArrayRef, to: &DataType) -> Result<ArrayRef, Refused> {
    let name = type_name(to);
    let out =
        arrow_cast::cast_with_options(src, to, &CastOptions::default()).map_err(|e| Refused {
            row: 0,
            message: format!("{} cannot be read as {name}: {e}", src.data_type()),
        })?;
    for row in 0..src.len() {
        if src.is_valid(row) && out.is_null(row) {
            return refused(row, format!("the value does not fit {name}"));
        }
    }
    let exact_target = matches!(
        to,
        DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::Decimal128(..)
    );
    let numeric_source = src.data_type().is_numeric();
    if exact_target && numeric_source {
        let back = arrow_cast::cast(&out, src.data_type()).map_err(|e| Refused {
            row: 0,
            message: e.to_string(),
        })?;
        let differs = arrow_ord::cmp::distinct(&back, src).map_err(|e| Refused {
            row: 0,
            message: e.to_string(),
        })?;
        if let Some(row) = differs.values().set_indices().next() {
            let shown = arrow_cast::display::array_value_to_string(src, row).unwrap_or_default();
            return refused(row, format!("{shown} cannot be stored exactly as {name}"));
        }
    }
    if matches!(to, DataType::Float32) && src.data_type() != &DataType::Float32 {
        let f = out.as_primitive::<arrow_array::types::Float32Type>();
        for row in 0..f.len() {
            if f.is_valid(row) && f.value(row).is_infinite() {
                let was_finite = arrow_cast::cast(&src.slice(row, 1), &DataType::Float64)
                    .ok()
                    .map(|a| a.as_primitive::<arrow_array::types::Float64Type>().value(0))
                    .is_some_and(f64::is_finite);
                if was_finite {
                    return refused(row, format!("the value is out of range for {name}"));
                }
            }
        }
    }
    Ok(out)
}

/// Dates and timestamps must fall in years 0001 to 9999.
fn check_range(a: &ArrayRef) -> Result<(), Refused> {
    let (values, lo, hi, what): (Vec<Option<i64>>, i64, i64, &str) = match a.data_type() {
        DataType::Date32 => (
            a.as_primitive::<arrow_array::types::Date32Type>()
                .iter()
                .map(|v| v.map(i64::from))
                .collect(),
            MIN_DAYS,
            MAX_DAYS,
            "date",
        ),
        DataType::Timestamp(TimeUnit::Microsecond, _) => (
            arrow_cast::cast(a, &DataType::Int64)
                .map_err(|e| Refused {
                    row: 0,
                    message: e.to_string(),
                })?
                .as_primitive::<Int64Type>()
                .iter()
                .collect(),
            MIN_MICROS,
            MAX_MICROS,
            "timestamp",
        ),
        _ => return Ok(()),
    };
    for (row, v) in values.iter().enumerate() {
        if let Some(v) = v
            && !(lo..=hi).contains(v)
        {
            return refused(
                row,
                format!("{v} is outside years 0001 to 9999, which a {what} must be in"),
            );
        }
    }
    Ok(())
}

/// The Iceberg name of an Arrow type, for messages.
pub fn type_name(t: &DataType) -> String {
    match t {
        DataType::Int32 => "int".into(),
        DataType::Int64 => "long".into(),
        DataType::Float32 => "float".into(),
        DataType::Float64 => "double".into(),
        DataType::Decimal128(p, s) => format!("decimal({p}, {s})"),
        DataType::Date32 => "date".into(),
        DataType::Time64(_) => "time".into(),
        DataType::Timestamp(_, None) => "timestamp".into(),
        DataType::Timestamp(_, Some(_)) => "timestamptz".into(),
        DataType::Utf8 | DataType::LargeUtf8 => "string".into(),
        DataType::Binary | DataType::LargeBinary => "binary".into(),
        DataType::FixedSizeBinary(16) => "uuid".into(),
        DataType::Boolean => "boolean".into(),
        other => other.to_string(),
    }
}

/// At most 60 characters of a refused value, for messages.
fn clip(t: &str) -> String {
    if t.chars().count() <= 60 {
        t.to_string()
    } else {
        format!("{}...", t.chars().take(57).collect::<String>())
    }
}

/// A decimal number read exactly: `mantissa * 10^exp`, the mantissa without
/// trailing zeros (they move into `exp`).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Exact {
    mantissa: i128,
    exp: i64,
}

impl Exact {
    /// `[+-]digits[.digits][(e|E)[+-]digits]`, surrounding spaces allowed.
    /// None for anything else, or more than 38 significant digits.
    fn parse(t: &str) -> Option<Exact> {
        let b = t.trim().as_bytes();
        let (neg, mut i) = match b.first()? {
            b'-' => (true, 1),
            b'+' => (false, 1),
            _ => (false, 0),
        };
        let mut mantissa: i128 = 0;
        let mut exp: i64 = 0;
        let mut pending_zeros: i64 = 0;
        let mut digits = 0usize;
        let mut significant = 0usize;
        let mut seen_point = false;
        while i < b.len() {
            match b[i] {
                b'0'..=b'9' => {
                    digits += 1;
                    let d = (b[i] - b'0') as i128;
                    if seen_point {
                        exp -= 1;
                    }
                    if d == 0 {
                        if mantissa != 0 {
                            pending_zeros += 1;
                        }
                    } else {
                        if mantissa == 0 {
                            significant = 1;
                        } else {
                            significant += pending_zeros as usize + 1;
                            for _ in 0..pending_zeros {
                                mantissa *= 10;
                            }
                        }
                        if significant > 38 {
                            return None;
                        }
                        mantissa = mantissa * 10 + d;
                        pending_zeros = 0;
                    }
                }
                b'.' if !seen_point => seen_point = true,
                _ => break,
            }
            i += 1;
        }
        if digits == 0 {
            return None;
        }
        exp += pending_zeros;
        if i < b.len() {
            if !matches!(b[i], b'e' | b'E') {
                return None;
            }
            let rest = std::str::from_utf8(&b[i + 1..]).ok()?;
            let rest = rest.strip_prefix('+').unwrap_or(rest);
            let unsigned = rest.strip_prefix('-').unwrap_or(rest);
            if unsigned.is_empty() || !unsigned.bytes().all(|c| c.is_ascii_digit()) {
                return None;
            }
            // Exponents past a few hundred cannot matter: clamp them.
            let e: i64 = rest.parse().unwrap_or(if rest.starts_with('-') {
                -100_000
            } else {
                100_000
            });
            exp = exp.saturating_add(e.clamp(-100_000, 100_000));
        }
        if mantissa == 0 {
            exp = 0;
        }
        Some(Exact {
            mantissa: if neg { -mantissa } else { mantissa },
            exp,
        })
    }

    fn is_integral(&self) -> bool {
        self.exp >= 0
    }

    /// The integer value, if integral and within i128.
    fn integer(&self) -> Option<i128> {
        if self.exp < 0 {
            return None;
        }
        let mut v = self.mantissa;
        for _ in 0..self.exp {
            v = v.checked_mul(10)?;
        }
        Some(v)
    }

    /// The unscaled value of decimal(p, s).
    fn scaled(&self, precision: u32, scale: i32) -> Result<i128, &'static str> {
        let shift = self.exp + scale as i64;
        if shift < 0 {
            return Err("has more fractional digits than the column's scale");
        }
        let mut v = self.mantissa;
        for _ in 0..shift {
            v = v
                .checked_mul(10)
                .ok_or("has more digits than the column's precision")?;
        }
        if v.unsigned_abs() >= 10u128.pow(precision) {
            return Err("has more digits than the column's precision");
        }
        Ok(v)
    }
}

fn decimal(t: &str, precision: u32, scale: i32) -> Result<i128, String> {
    let n = Exact::parse(t).ok_or_else(|| "is not a number".to_string())?;
    n.scaled(precision, scale)
        .map_err(|why| format!("{why} (decimal({precision}, {scale}))"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(v: &[Option<&str>]) -> ArrayRef {
        Arc::new(StringArray::from(v.to_vec()))
    }

    #[test]
    fn exact_numbers_read_digit_by_digit() {
        let e = |t: &str| Exact::parse(t).map(|n| (n.mantissa, n.exp));
        assert_eq!(e("1.0"), Some((1, 0)));
        assert_eq!(e("1e3"), Some((1, 3)));
        assert_eq!(e("-120"), Some((-12, 1)));
        assert_eq!(e("1.005"), Some((1005, -3)));
        assert_eq!(e("0.000"), Some((0, 0)));
        assert_eq!(e("1.9E-1"), Some((19, -2)));
        assert_eq!(
            e("1.00000000000000000000000000000000000000000000"),
            Some((1, 0))
        );
        assert_eq!(e("abc"), None);
        assert_eq!(e("1.2.3"), None);
        assert_eq!(e("."), None);
        assert_eq!(e("1e"), None);
        assert_eq!(e("123456789012345678901234567890123456789"), None);
    }

    #[test]
    fn integers_refuse_fractions_and_out_of_range() {
        let ok = column(
            &text(&[Some("1"), Some("1.0"), Some("1e3"), None]),
            &DataType::Int64,
        )
        .unwrap();
        assert_eq!(
            ok.as_primitive::<Int64Type>().iter().collect::<Vec<_>>(),
            vec![Some(1), Some(1), Some(1000), None]
        );
        for (bad, why) in [
            ("1.9", "fraction"),
            ("20.7", "fraction"),
            ("-9223372036854775809", "out of range"),
            ("1e400", "out of range"),
            ("x", "cannot be read"),
        ] {
            let e = column(&text(&[Some("5"), Some(bad)]), &DataType::Int64).unwrap_err();
            assert_eq!(e.row, 1, "{bad}");
            assert!(e.message.contains(why), "{bad}: {}", e.message);
        }
        let e = column(&text(&[Some("3000000000")]), &DataType::Int32).unwrap_err();
        assert!(e.message.contains("out of range"), "{}", e.message);
    }

    #[test]
    fn decimals_keep_every_digit_or_refuse() {
        let t = DataType::Decimal128(10, 2);
        let ok = column(
            &text(&[Some("1.5"), Some("1.000"), Some("-12345678.9")]),
            &t,
        )
        .unwrap();
        let d = ok.as_primitive::<arrow_array::types::Decimal128Type>();
        assert_eq!(d.values().to_vec(), vec![150, 100, -1234567890]);
        let e = column(&text(&[Some("1.005")]), &t).unwrap_err();
        assert!(e.message.contains("fractional"), "{}", e.message);
        let e = column(&text(&[Some("123456789")]), &t).unwrap_err();
        assert!(e.message.contains("precision"), "{}", e.message);
    }

    #[test]
    fn floats_refuse_overflow_but_keep_named_values() {
        let e = column(&text(&[Some("1e400")]), &DataType::Float64).unwrap_err();
        assert!(e.message.contains("out of range"), "{}", e.message);
        let e = column(&text(&[Some("1e39")]), &DataType::Float32).unwrap_err();
        assert!(e.message.contains("out of range"), "{}", e.message);
        let ok = column(&text(&[Some("NaN"), Some("1.5")]), &DataType::Float64).unwrap();
        assert!(
            ok.as_primitive::<arrow_array::types::Float64Type>()
                .value(0)
                .is_nan()
        );
    }

    #[test]
    fn timestamps_take_text_or_micros_within_years_1_to_9999() {
        let t = DataType::Timestamp(TimeUnit::Microsecond, None);
        let ok = column(
            &text(&[Some("2026-11-30T12:00:00"), Some("1700000000000000")]),
            &t,
        )
        .unwrap();
        let v = arrow_cast::cast(&ok, &DataType::Int64).unwrap();
        assert_eq!(
            v.as_primitive::<Int64Type>().values().to_vec(),
            vec![1_796_040_000_000_000, 1_700_000_000_000_000]
        );
        for bad in ["1e30", "999999999999999999", "not a time", "1.5"] {
            let e = column(&text(&[Some(bad)]), &t).unwrap_err();
            assert_eq!(e.row, 0, "{bad}");
        }
        let d = column(&text(&[Some("2026-11-30"), Some("0")]), &DataType::Date32).unwrap();
        assert_eq!(
            d.as_primitive::<arrow_array::types::Date32Type>().value(1),
            0
        );
        assert!(column(&text(&[Some("3000000")]), &DataType::Date32).is_err());
    }

    #[test]
    fn arrow_numbers_must_convert_back_unchanged() {
        let f: ArrayRef = Arc::new(Float64Array::from(vec![1.0, 1.9]));
        let e = column(&f, &DataType::Int64).unwrap_err();
        assert_eq!(e.row, 1);
        let f: ArrayRef = Arc::new(Float64Array::from(vec![1e30]));
        assert!(column(&f, &DataType::Int64).is_err());
        let i: ArrayRef = Arc::new(arrow_array::Int64Array::from(vec![7, 3_000_000_000]));
        let e = column(&i, &DataType::Int32).unwrap_err();
        assert_eq!(e.row, 1);
        let ok = column(&i.slice(0, 1), &DataType::Int32).unwrap();
        assert_eq!(ok.as_primitive::<Int32Type>().value(0), 7);
        let d: ArrayRef = Arc::new(
            Decimal128Array::from(vec![1005])
                .with_precision_and_scale(10, 3)
                .unwrap(),
        );
        assert!(column(&d, &DataType::Decimal128(10, 2)).is_err());
    }
}
