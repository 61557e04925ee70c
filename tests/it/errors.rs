//! The error registry: every code autocdc emits is defined once in
//! `error::REGISTRY` with its HTTP status, and the table of docs/errors.md
//! says the same. The statuses themselves are asserted over HTTP in
//! `tests/it/serve/` and `tests/it/hostile/`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use autocdc::error::{REGISTRY, codes, lookup, status_of};

/// Every `<quote>AUTOCDC_...<quote>` in `text`, leaving out environment
/// variables' names (`var("AUTOCDC_LOG")`).
fn codes_in(text: &str, quote: char) -> BTreeSet<String> {
    let open = format!("{quote}AUTOCDC_");
    text.match_indices(&open)
        .filter(|(i, _)| !text[..*i].ends_with("var("))
        .filter_map(|(i, _)| {
            let rest = &text[i + 1..];
            let name = &rest[..rest.find(quote)?];
            name.chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_' || c == '.')
                .then(|| name.to_string())
        })
        .collect()
}

fn codes_in_src() -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut dirs = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("src")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                found.extend(codes_in(&std::fs::read_to_string(&p).unwrap(), '"'));
            }
        }
    }
    found
}

/// The error table of docs/errors.md: code → the HTTP cell.
fn readme_table() -> BTreeMap<String, String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/errors.md");
    let readme = std::fs::read_to_string(path).unwrap();
    let section = readme
        .split("## Error codes")
        .nth(1)
        .and_then(|s| s.split("\n#").next())
        .expect("docs/errors.md has an Error codes section");
    let mut table = BTreeMap::new();
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<_> = line.split('|').map(str::trim).collect();
        let names = codes_in(cells[1], '`');
        assert_eq!(names.len(), 1, "one code per row: {line}");
        let name = names.into_iter().next().unwrap();
        assert!(
            table.insert(name.clone(), cells[2].to_string()).is_none(),
            "{name} is in docs/errors.md twice"
        );
    }
    table
}

#[test]
fn every_code_is_registered_once() {
    let mut seen = BTreeSet::new();
    for c in REGISTRY {
        assert!(seen.insert(c.code), "{} is registered twice", c.code);
        assert!(
            (400..600).contains(&c.status),
            "{}: status {}",
            c.code,
            c.status
        );
        assert!(!c.meaning.is_empty(), "{} has no meaning", c.code);
    }
    let missing: Vec<_> = codes_in_src()
        .into_iter()
        .filter(|c| lookup(c).is_none())
        .collect();
    assert!(
        missing.is_empty(),
        "codes in src/ without a registry entry: {missing:?}"
    );
}

#[test]
fn the_readme_error_table_is_the_registry() {
    let table = readme_table();
    let registry: BTreeMap<_, _> = REGISTRY
        .iter()
        .map(|c| (c.code.to_string(), c.status.to_string()))
        .collect();
    assert_eq!(
        table, registry,
        "docs/errors.md's error table (left) vs error::REGISTRY (right)"
    );
}

#[test]
fn statuses_come_from_the_registry() {
    use autocdc::Error;
    let cases = [
        (Error::FlowNotFound("x".into()), 404),
        (
            Error::Overloaded {
                message: "x".into(),
                retry_after_secs: 1,
            },
            429,
        ),
        (Error::Unavailable("x".into()), 503),
        (Error::Config("x".into()), 400),
        (
            Error::State {
                code: codes::SCHEMA_DRIFT,
                message: "x".into(),
            },
            409,
        ),
        (
            Error::State {
                code: codes::WAL_WRITE_FAILED,
                message: "x".into(),
            },
            503,
        ),
        (
            Error::State {
                code: codes::STATE_SCHEMA,
                message: "x".into(),
            },
            500,
        ),
    ];
    for (e, status) in cases {
        assert_eq!(e.status(), status, "{e}");
    }
    assert_eq!(status_of(codes::NULL_KEY), 422);
    assert_eq!(status_of("AUTOCDC_NOT_A_CODE"), 500);
}
