//! JSON bodies: NDJSON lines and JSON arrays split into rows, decoded
//! into the flow's source schema (the Debezium reader decodes its rows
//! here too).

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

use crate::core::flow::Flow;
use crate::error::{Error, Result, codes};

use super::body::{Limits, body_err, concat, same_column, too_many_rows};
use super::conform::conform_at;

/// The schema JSON bodies are decoded in (the source columns that are read): numbers, dates and timestamps
/// arrive as their text (the number's own digits, never through `f64`),
/// which `convert` then reads exactly.
pub(super) fn json_schema(flow: &Flow) -> SchemaRef {
    // Hidden sequence columns are computed, never read.
    let read = flow.computed.first().map_or(usize::MAX, |c| c.idx);
    std::sync::Arc::new(arrow_schema::Schema::new(
        flow.source_arrow
            .fields()
            .iter()
            .take(read)
            .map(|f| {
                f.as_ref()
                    .clone()
                    .with_data_type(crate::core::nested::textual(f.data_type()))
            })
            .collect::<Vec<_>>(),
    ))
}

/// Rows decoded per arrow-json batch; a value error is looked for row by
/// row inside its chunk only.
pub(super) const CHUNK: usize = 4096;

/// Decodes rows, each one JSON object, into the flow's source schema.
/// Unknown fields are rejected (`strict`) or ignored; an error names its
/// row and column.
pub(crate) fn decode_json_rows(flow: &Flow, rows: &[&[u8]], strict: bool) -> Result<RecordBatch> {
    if !strict {
        // Nothing fails on a key in another case, so rename up front.
        return match keys::canonical_keys(flow, rows)? {
            Some(fixed) => {
                let fixed: Vec<&[u8]> = fixed.iter().map(Vec::as_slice).collect();
                decode_json_exact(flow, &fixed, false)
            }
            None => decode_json_exact(flow, rows, false),
        };
    }
    match decode_json_exact(flow, rows, true) {
        // A field named in another case than the definition's: the decoder
        // matches names exactly, so rewrite the keys and decode again (only
        // such bodies pay for it).
        Err(e) if !flow.config.case_sensitive && e.to_string().contains("missing from schema") => {
            match keys::canonical_keys(flow, rows)? {
                Some(fixed) => {
                    let fixed: Vec<&[u8]> = fixed.iter().map(Vec::as_slice).collect();
                    decode_json_exact(flow, &fixed, true)
                }
                None => Err(e),
            }
        }
        r => r,
    }
}

/// Decodes rows whose keys are the definition's names exactly.
pub(super) fn decode_json_exact(flow: &Flow, rows: &[&[u8]], strict: bool) -> Result<RecordBatch> {
    let schema = json_schema(flow);
    let decoder = || {
        arrow_json::ReaderBuilder::new(schema.clone())
            .with_batch_size(CHUNK)
            .with_strict_mode(strict)
            .with_coerce_primitive(true)
            .build_decoder()
    };
    let mut out = Vec::new();
    for (c, chunk) in rows.chunks(CHUNK).enumerate() {
        let first = c * CHUNK;
        let mut d = decoder()?;
        for (i, row) in chunk.iter().enumerate() {
            let at = first + i;
            let read = d.decode(row).map_err(|e| {
                body_err(
                    flow,
                    codes::MALFORMED_BODY,
                    Some(at),
                    None,
                    format!("row {} is not valid JSON: {e}", at + 1),
                )
            })?;
            if read < row.len() || d.has_partial_record() || d.len() != i + 1 {
                return Err(body_err(
                    flow,
                    codes::MALFORMED_BODY,
                    Some(at),
                    None,
                    format!("row {} is not one complete JSON object", at + 1),
                ));
            }
        }
        match d.flush() {
            Ok(Some(b)) => out.push(conform_at(flow, &b, first)?),
            Ok(None) => {}
            Err(e) => {
                for (i, row) in chunk.iter().enumerate() {
                    let mut one = decoder()?;
                    let found = one.decode(row).and_then(|_| one.flush());
                    if let Err(e) = found {
                        return Err(value_err(flow, first + i, &e));
                    }
                }
                return Err(value_err(flow, first, &e));
            }
        }
    }
    concat(flow, out)
}

/// The non-blank lines of an NDJSON body, trimmed.
pub(super) fn ndjson_rows<'a>(
    flow: &Flow,
    body: &'a [u8],
    limits: Limits,
) -> Result<Vec<&'a [u8]>> {
    let mut rows = Vec::new();
    for line in body.split(|&b| b == b'\n') {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if rows.len() == limits.max_rows {
            return Err(too_many_rows(flow, limits));
        }
        rows.push(line.trim_ascii());
    }
    Ok(rows)
}

pub(super) fn array_rows<'a>(flow: &Flow, body: &'a [u8], limits: Limits) -> Result<Vec<&'a [u8]>> {
    array_elements(body, limits.max_rows).map_err(|e| match e {
        None => too_many_rows(flow, limits),
        Some(why) => body_err(
            flow,
            codes::MALFORMED_BODY,
            None,
            None,
            format!("the body is not a JSON array of objects: {why}"),
        ),
    })
}

/// The elements of a JSON array, as byte slices; `Err(None)` when there are
/// more than `max`. Each element is checked later by the JSON decoder.
pub(crate) fn array_elements(
    body: &[u8],
    max: usize,
) -> std::result::Result<Vec<&[u8]>, Option<String>> {
    let skip_ws = |mut i: usize| {
        while body.get(i).is_some_and(u8::is_ascii_whitespace) {
            i += 1;
        }
        i
    };
    let mut i = skip_ws(0);
    if body.get(i) != Some(&b'[') {
        return Err(Some("it does not start with `[`".into()));
    }
    i = skip_ws(i + 1);
    let mut out = Vec::new();
    if body.get(i) == Some(&b']') {
        i += 1;
    } else {
        loop {
            let start = i;
            let (mut depth, mut in_str) = (0usize, false);
            loop {
                let Some(&b) = body.get(i) else {
                    return Err(Some("the array is not closed".into()));
                };
                if in_str {
                    match b {
                        b'\\' => i += 1,
                        b'"' => in_str = false,
                        _ => {}
                    }
                } else {
                    match b {
                        b'"' => in_str = true,
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' if depth > 0 => depth -= 1,
                        b']' | b',' if depth == 0 => break,
                        _ => {}
                    }
                }
                i += 1;
            }
            if out.len() == max {
                return Err(None);
            }
            out.push(body[start..i].trim_ascii());
            i += 1;
            if body[i - 1] == b']' {
                break;
            }
        }
    }
    if skip_ws(i) != body.len() {
        return Err(Some(format!(
            "unexpected bytes after the array at byte {i}"
        )));
    }
    Ok(out)
}

/// JSON object keys in another case than the definition's names.
pub(super) mod keys {
    use super::*;

    /// Each row with its top-level keys renamed to the declared names they
    /// match regardless of case; None when no key needed it (or a row
    /// cannot be scanned: the decoder then reports it). Two keys of a row
    /// that name one column are refused.
    pub(super) fn canonical_keys(flow: &Flow, rows: &[&[u8]]) -> Result<Option<Vec<Vec<u8>>>> {
        let mut out = Vec::with_capacity(rows.len());
        let mut renamed = false;
        for (r, row) in rows.iter().enumerate() {
            let Some(keys) = top_level_keys(row) else {
                out.push(row.to_vec());
                continue;
            };
            let mut seen: Vec<Option<&str>> = vec![None; flow.source_arrow.fields().len()];
            let mut fixed = Vec::with_capacity(row.len());
            let mut at = 0;
            for (start, end) in keys {
                // Keys hold no escapes (top_level_keys gives up on those).
                let key = std::str::from_utf8(&row[start..end]).unwrap_or_default();
                let Some(i) = flow.input_column(key) else {
                    continue;
                };
                let name = flow.source_arrow.field(i).name();
                if let Some(prev) = seen[i] {
                    return Err(same_column(flow, r, prev, key, i));
                }
                seen[i] = Some(key);
                if key != name {
                    fixed.extend_from_slice(&row[at..start]);
                    fixed.extend_from_slice(name.as_bytes());
                    at = end;
                    renamed = true;
                }
            }
            fixed.extend_from_slice(&row[at..]);
            out.push(fixed);
        }
        Ok(renamed.then_some(out))
    }

    fn ws(row: &[u8], mut i: usize) -> usize {
        while i < row.len() && row[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    }

    /// `row[i]` opens a string: the index after its closing quote.
    fn string_end(row: &[u8], i: usize) -> Option<usize> {
        let mut j = i + 1;
        while j < row.len() {
            match row[j] {
                b'\\' => j += 2,
                b'"' => return Some(j + 1),
                _ => j += 1,
            }
        }
        None
    }

    /// The index after the value starting at or after `i`.
    fn value_end(row: &[u8], i: usize) -> Option<usize> {
        let mut j = ws(row, i);
        match row.get(j)? {
            b'"' => string_end(row, j),
            b'{' | b'[' => {
                let mut depth = 0usize;
                while j < row.len() {
                    match row[j] {
                        b'"' => {
                            j = string_end(row, j)?;
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                return Some(j + 1);
                            }
                        }
                        _ => {}
                    }
                    j += 1;
                }
                None
            }
            _ => {
                while j < row.len()
                    && !matches!(row[j], b',' | b'}' | b']')
                    && !row[j].is_ascii_whitespace()
                {
                    j += 1;
                }
                Some(j)
            }
        }
    }

    /// The byte ranges of the top-level keys of a JSON object (inside the
    /// quotes); None when `row` is not one, or a key has an escape.
    pub(in crate::service::input) fn top_level_keys(row: &[u8]) -> Option<Vec<(usize, usize)>> {
        let mut i = ws(row, 0);
        if row.get(i) != Some(&b'{') {
            return None;
        }
        i = ws(row, i + 1);
        let mut keys = Vec::new();
        if row.get(i) == Some(&b'}') {
            return Some(keys);
        }
        loop {
            if row.get(i) != Some(&b'"') {
                return None;
            }
            let end = string_end(row, i)?;
            if row[i + 1..end - 1].contains(&b'\\') {
                return None;
            }
            keys.push((i + 1, end - 1));
            i = ws(row, end);
            if row.get(i) != Some(&b':') {
                return None;
            }
            i = ws(row, value_end(row, i + 1)?);
            match row.get(i)? {
                b',' => i = ws(row, i + 1),
                b'}' => return Some(keys),
                _ => return None,
            }
        }
    }
}

/// A value arrow-json could not read: name the row and, when the message
/// names one, the column.
pub(super) fn value_err(flow: &Flow, row: usize, e: &arrow_schema::ArrowError) -> Error {
    let msg = e.to_string();
    let column = flow
        .source_arrow
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .find(|n| {
            msg.contains(&format!("'{n}'"))
                || msg.contains(&format!("\"{n}\""))
                || msg.contains(&format!("`{n}`"))
        })
        .or_else(|| {
            // Strict mode names an unknown field: "column 'x' missing from schema".
            msg.split('\'').nth(1).map(str::to_string)
        })
        .unwrap_or_default();
    Error::Batch {
        code: codes::BAD_COLUMN,
        flow: flow.name.clone(),
        row,
        column,
        message: format!("cannot be read as the flow's columns: {msg}"),
    }
}
