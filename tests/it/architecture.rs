//! The layout's rules, checked on the source: the pure core performs no I/O
//! and reads no clock, and the layers only look down (tools → service →
//! table → core). A rule broken here is a design change: discuss it in
//! ARCHITECTURE.md before loosening the list.

use std::path::{Path, PathBuf};

/// What `src/core` may not name: the async runtime, the file system, the
/// network, clocks, randomness, the I/O halves of `iceberg` and `parquet`,
/// and the shell around it.
const CORE_FORBIDDEN: &[&str] = &[
    "tokio",
    "std::fs",
    "std::net",
    "std::thread",
    "std::env",
    "std::process",
    "SystemTime",
    "Instant",
    "Utc::now",
    "Local::now",
    "rand::",
    "iceberg::io",
    "iceberg::table",
    "iceberg::scan",
    "iceberg::transaction",
    "iceberg::Catalog",
    "iceberg::writer",
    "parquet",
    "object_store",
    "opendal",
    "reqwest",
    "sqlx",
    "axum",
    "hyper",
    "crate::config",
    "crate::table",
    "crate::service",
    "crate::tools",
];

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Each place in `dir`'s code (comments left out) where one of `names`
/// starts a path: not preceded by an identifier character.
fn uses(dir: &str, names: &[&str]) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut found = Vec::new();
    for file in rust_files(&root) {
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for name in names {
                let hit = code.match_indices(name).any(|(i, _)| {
                    code[..i]
                        .chars()
                        .next_back()
                        .is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
                });
                if hit {
                    found.push(format!("{}:{}: {name}", file.display(), n + 1));
                }
            }
        }
    }
    found
}

#[test]
fn the_core_performs_no_io_and_reads_no_clock() {
    let found = uses("src/core", CORE_FORBIDDEN);
    assert!(
        found.is_empty(),
        "the core names I/O:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_table_layer_does_not_know_the_service_or_the_tools() {
    let found = uses("src/table", &["crate::service", "crate::tools"]);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn the_service_does_not_know_the_tools() {
    let found = uses("src/service", &["crate::tools"]);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn the_checker_sees_a_forbidden_import() {
    // The scan itself: a file under src that names tokio is found, and a
    // word that merely ends in a forbidden name is not.
    let found = uses("src/service", &["tokio::"]);
    assert!(!found.is_empty());
    assert!(uses("src/core", &["rand::"]).is_empty());
    assert!(!uses("src/core", &["Operand::"]).is_empty());
}
