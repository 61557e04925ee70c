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
    if dir.is_file() {
        return vec![dir.to_path_buf()];
    }
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

/// The ground floor: `error.rs` names no other part of the crate but the
/// fault points it converts from, and `fault.rs` names none; `config.rs`
/// (read by every layer's entry points) names only the core and the errors.
#[test]
fn the_error_type_and_the_configuration_look_down_only() {
    let upper = [
        "crate::core",
        "crate::table",
        "crate::service",
        "crate::tools",
    ];
    let mut found = uses("src/error.rs", &upper);
    found.extend(uses("src/error.rs", &["crate::config"]));
    found.extend(uses("src/fault.rs", &["crate::"]));
    found.extend(uses(
        "src/config.rs",
        &["crate::table", "crate::service", "crate::tools"],
    ));
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// Each file of `src` as a module path (`service::http` for
/// `src/service/http/mod.rs`), with the file.
fn modules() -> Vec<(String, PathBuf)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    rust_files(&root)
        .into_iter()
        .filter_map(|f| {
            let rel = f.strip_prefix(&root).ok()?.with_extension("");
            let mut parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if parts.last().is_some_and(|p| p == "mod") {
                parts.pop();
            }
            if parts == ["main"] || parts == ["lib"] {
                return None;
            }
            Some((parts.join("::"), f))
        })
        .collect()
}

/// The modules a file names by `crate::` paths (a `use crate::a::{b, c}`
/// names `a::b` and `a::c`), each resolved to the longest module path; and
/// by `super::` paths from module `at` to a sibling (`super::b::X` in
/// `a::c` names `a::b`; naming one's own parent is nesting, not an import).
fn named_modules(text: &str, known: &std::collections::BTreeSet<String>, at: &str) -> Vec<String> {
    let parent = at.rsplit_once("::").map_or("", |(p, _)| p);
    let mut out = Vec::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let code = if parent.is_empty() {
            code.to_string()
        } else {
            code.replace("super::", &format!("crate::{parent}::"))
        };
        let code = code.as_str();
        for (i, _) in code.match_indices("crate::") {
            if code[..i]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_')
            {
                continue;
            }
            let rest = &code[i + "crate::".len()..];
            let path: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            let mut heads = vec![path.trim_end_matches(':').to_string()];
            // One level of braces: `crate::a::{b, c::D}`.
            if path.ends_with("::") && rest[path.len()..].starts_with('{') {
                let inner = rest[path.len() + 1..].split('}').next().unwrap_or("");
                heads = inner
                    .split(',')
                    .map(|p| format!("{path}{}", p.trim()))
                    .collect();
            }
            for head in heads {
                let segs: Vec<&str> = head.split("::").filter(|s| !s.is_empty()).collect();
                if let Some(m) = (1..=segs.len())
                    .rev()
                    .map(|n| segs[..n].join("::"))
                    .find(|m| known.contains(m))
                {
                    // An ancestor is the file's own nesting.
                    if !(at == m || at.starts_with(&format!("{m}::"))) {
                        out.push(m);
                    }
                }
            }
        }
    }
    out
}

/// The import circles between the modules of `src` (by `crate::` paths):
/// each strongly connected set of more than one module, sorted.
fn circles() -> Vec<Vec<String>> {
    use std::collections::{BTreeMap, BTreeSet};
    let mods = modules();
    let known: BTreeSet<String> = mods.iter().map(|(m, _)| m.clone()).collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, f) in &mods {
        let text = std::fs::read_to_string(f).unwrap();
        let text = text.split("\n#[cfg(test)]").next().unwrap_or(&text);
        let to = edges.entry(m.clone()).or_default();
        for n in named_modules(text, &known, m) {
            if &n != m {
                to.insert(n);
            }
        }
    }
    // Tarjan's strongly connected components.
    struct T<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let i = t.index.len();
        t.index.insert(v, i);
        t.low.insert(v, i);
        t.stack.push(v);
        t.on.insert(v);
        let edges = t.edges;
        for w in edges.get(v).into_iter().flatten() {
            if !t.index.contains_key(w.as_str()) {
                visit(t, w);
                let lw = t.low[w.as_str()];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.on.contains(w.as_str()) {
                let iw = t.index[w.as_str()];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                scc.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                scc.sort();
                t.out.push(scc);
            }
        }
    }
    let mut t = T {
        edges: &edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out.sort();
    t.out
}

#[test]
fn no_two_modules_import_each_other() {
    let found = circles();
    assert!(
        found.is_empty(),
        "import circles (each a set of modules that reach each other by crate:: paths):\n{}",
        found
            .iter()
            .map(|c| c.join(" <-> "))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn the_circle_finder_reads_crate_and_sibling_paths() {
    let known: std::collections::BTreeSet<String> =
        ["a", "a::b", "c"].iter().map(|s| s.to_string()).collect();
    let named = named_modules(
        "use crate::a::{b::X, Y};\nlet z = crate::c::f(); // crate::d\n",
        &known,
        "c",
    );
    assert_eq!(named, ["a::b", "a"]);
    // From `a::b`: a sibling by `super::`, and not its own parent.
    let known: std::collections::BTreeSet<String> = ["a", "a::b", "a::e"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let named = named_modules("use super::e::Z;\nuse super::{W};\n", &known, "a::b");
    assert_eq!(named, ["a::e"]);
}
