//! Reading whole bodies: where UTF-8 is checked, and a body in chunks
//! read as it is in one buffer.

use bumpalo::Bump;
use bytes::Bytes;

use super::*;

const SCHEMA: &str = r#"{"type":"struct","fields":[{"type":"struct","field":"after","fields":[{"type":"string","field":"note"}]}]}"#;

fn event(note: &str, lsn: u64) -> String {
    format!(
        r#"{{"schema":{SCHEMA},"payload":{{"before":null,"after":{{"note":"{note}"}},"source":{{"connector":"postgresql","schema":"public","table":"t","sequence":"[null,\"{lsn}\"]","lsn":{lsn}}},"op":"c"}}}}"#
    )
}

fn limits() -> Limits {
    Limits {
        max_rows: 100,
        max_value_bytes: 1 << 20,
    }
}

fn notes(changes: &[Change]) -> Vec<String> {
    changes
        .iter()
        .map(|c| match c.image().1 {
            Some(Image::Row(Fields(f))) => string(f[0].1).unwrap().into_owned(),
            _ => panic!("no row"),
        })
        .collect()
}

/// A JSON array's UTF-8 is checked event by event, its repeated schemas
/// by comparison: bad bytes anywhere are the body's UTF-8 error, and
/// good non-ASCII text reads as it is, in every format.
#[test]
fn utf8_is_checked_wherever_it_is() {
    let good = [event("a", 1), event("é 😀", 2), event("c", 3)];
    for format in [BodyFormat::JsonArray, BodyFormat::Ndjson] {
        let join = |events: &[Vec<u8>]| -> Vec<u8> {
            match format {
                BodyFormat::Ndjson => events.join(&b'\n'),
                _ => [b"[".to_vec(), events.join(&b','), b"]".to_vec()].concat(),
            }
        };
        let body = join(
            &good
                .iter()
                .map(|e| e.as_bytes().to_vec())
                .collect::<Vec<_>>(),
        );
        let (changes, _) = read_body("t", format, Body::Whole(&body), limits()).unwrap();
        assert_eq!(notes(&changes), ["a", "é 😀", "c"]);
        // One bad byte in the first event's schema, in a later event's
        // payload (read by the scan) and in its repeated schema.
        let spoil = |event: usize, pick: &dyn Fn(&str) -> usize| {
            let mut events: Vec<Vec<u8>> = good.iter().map(|e| e.as_bytes().to_vec()).collect();
            let at = pick(&good[event]);
            events[event][at] = 0xff;
            join(&events)
        };
        let in_schema = |e: &str| e.find("struct").unwrap();
        let in_note = |e: &str| e.rfind("\"note\":\"").unwrap() + 8;
        for body in [
            spoil(0, &in_schema),
            spoil(2, &in_note),
            spoil(1, &in_schema),
        ] {
            let err = read_body("t", format, Body::Whole(&body), limits()).unwrap_err();
            let text = err.to_string();
            assert!(text.contains("not UTF-8"), "{format:?}: {text}");
            assert!(
                matches!(err, Error::Input { code, .. } if code == codes::MALFORMED_BODY),
                "{err:?}"
            );
        }
    }
}

/// The body cut into chunks at `cuts`.
fn chunked(body: &[u8], cuts: &[usize]) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut from = 0;
    for &c in cuts {
        out.push(Bytes::copy_from_slice(&body[from..c.max(from)]));
        from = c.max(from);
    }
    out.push(Bytes::copy_from_slice(&body[from..]));
    out
}

/// What reading `body` gives: its changes and skips, or its error's words.
fn read_in(format: BodyFormat, body: Body<'_>) -> String {
    match read_body("t", format, body, limits()) {
        Ok(read) => format!("{read:?}"),
        Err(e) => format!("error: {e}"),
    }
}

/// A body the HTTP layer hands over in chunks reads as it does in one
/// buffer, wherever the chunks end (inside an event, its schema, a
/// multi-byte character, a number, between events), errors included.
#[test]
fn a_body_in_chunks_reads_as_it_does_whole() {
    let events = [
        event("a", 1),
        event("é 😀", 2),
        "null".to_string(),
        r#"{"before":null,"after":{"note":"bare"},"source":{"connector":"postgresql","schema":"public","table":"t","sequence":"[null,\"4\"]","lsn":4},"op":"c"}"#.to_string(),
        event("c", 5),
    ];
    let array = format!("[{}]", events.join(",\n "));
    let bodies: Vec<(BodyFormat, String)> = vec![
        (BodyFormat::JsonArray, array.clone()),
        (BodyFormat::Ndjson, events.join("\n")),
        (BodyFormat::JsonArray, events[0].clone()),
        // Refused bodies: a number where an event goes, bytes after the
        // array, an array not closed, an event cut short.
        (
            BodyFormat::JsonArray,
            format!("[{},12345,{}]", events[0], events[1]),
        ),
        (BodyFormat::JsonArray, format!("{array} x")),
        (
            BodyFormat::JsonArray,
            format!("[{}, {}", events[0], events[1]),
        ),
        (
            BodyFormat::JsonArray,
            format!("[{}, {}]", events[0], &events[1][..200]),
        ),
    ];
    for (format, body) in &bodies {
        let body = body.as_bytes();
        let whole = read_in(*format, Body::Whole(body));
        let mut cuts: Vec<Vec<usize>> = (0..=body.len()).map(|c| vec![c]).collect();
        // And some bodies in many small chunks.
        for step in [1, 7, 64] {
            cuts.push((step..body.len()).step_by(step).collect());
        }
        for cut in cuts {
            let arena = Bump::new();
            let chunks = chunked(body, &cut);
            let got = read_in(*format, Body::Chunks(&chunks, &arena));
            assert_eq!(got, whole, "{format:?} cut at {cut:?}");
        }
    }
    // What they all read: the four changes and the tombstone.
    let (changes, skipped) = read_body(
        "t",
        BodyFormat::JsonArray,
        Body::Whole(array.as_bytes()),
        limits(),
    )
    .unwrap();
    assert_eq!(notes(&changes), ["a", "é 😀", "bare", "c"]);
    assert_eq!(skipped.tombstones, 1);
}

/// A `source` that is a JSON array is no `source` block (serde's derived
/// reading took it positionally once).
#[test]
fn a_source_that_is_an_array_is_refused() {
    let body = r#"[{"before":null,"after":{"note":"x"},"source":["3.6","postgresql","dbz",1,"false","db","[null,\"1\"]",1,1,"public","t",1,1],"op":"c"}]"#;
    let err = read_body(
        "t",
        BodyFormat::JsonArray,
        Body::Whole(body.as_bytes()),
        limits(),
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("event 0 has no `source` block"),
        "{err}"
    );
    assert!(
        matches!(err, Error::Batch { code, row: 0, .. } if code == codes::DEBEZIUM_EVENT),
        "{err:?}"
    );
}
