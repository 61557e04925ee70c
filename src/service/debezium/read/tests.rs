//! Reading whole bodies: where UTF-8 is checked.

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
        let (changes, _) = read_body("t", format, &body, limits()).unwrap();
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
            let err = read_body("t", format, &body, limits()).unwrap_err();
            let text = err.to_string();
            assert!(text.contains("not UTF-8"), "{format:?}: {text}");
            assert!(
                matches!(err, Error::Input { code, .. } if code == codes::MALFORMED_BODY),
                "{err:?}"
            );
        }
    }
}
