//! The library floor is a stack: every module of `worker-bin/src` imports only modules
//! below it in [`FLOOR`], and `anyhow` stays in the command-line floor (`src/cli/`).
//! Read from the sources (comments skipped), so a new upward import fails here rather
//! than in review.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The library floor, bottom first: a module may name (`crate::m`) only the modules
/// before it. `cli`, the command-line floor, is on top of all.
const FLOOR: &[&str] = &[
    "atomic", "error", "duration", "defaults", "sync", "signal", "event", "plan", "handler",
    "trace", "sql", "job", "slot", "layers", "state", "embedded", "backend", "held", "control",
    "check", "work", "query", "metrics", "runner", "cli",
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`, with its path relative to `src/`.
fn sources(dir: &Path, out: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).expect("readable src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path.strip_prefix(src()).expect("under src");
            let text = std::fs::read_to_string(&path).expect("readable source");
            out.push((rel.to_string_lossy().into_owned(), text));
        }
    }
}

/// The code of `text`, its comment lines (`//`, `///`, `//!`) dropped.
fn code(text: &str) -> impl Iterator<Item = &str> {
    text.lines().filter(|l| !l.trim_start().starts_with("//"))
}

/// The top-level module a file under `src/` belongs to (`work/split.rs` is `work`).
fn module_of(rel: &str) -> &str {
    rel.split('/')
        .next()
        .expect("a path")
        .trim_end_matches(".rs")
}

/// The names following `crate::` in `line`, `crate::{a, b}` read as both.
fn crate_paths(line: &str) -> Vec<String> {
    let mut names = Vec::new();
    for (at, _) in line.match_indices("crate::") {
        let rest = &line[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = group.split('}').next().unwrap_or("");
            for item in group.split(',') {
                let name: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                names.push(name);
            }
        } else {
            names.push(
                rest.chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect(),
            );
        }
    }
    names.retain(|n| !n.is_empty());
    names
}

#[test]
fn the_library_floor_only_imports_down() {
    let mut files = Vec::new();
    sources(&src(), &mut files);
    let rank: BTreeMap<&str, usize> = FLOOR.iter().enumerate().map(|(i, m)| (*m, i)).collect();
    let mut wrong = Vec::new();
    for (rel, text) in &files {
        let module = module_of(rel);
        if matches!(module, "lib" | "main") {
            continue;
        }
        let Some(&own) = rank.get(module) else {
            wrong.push(format!("{rel}: module `{module}` is missing from FLOOR"));
            continue;
        };
        if module == "cli" {
            continue;
        }
        for line in code(text) {
            for name in crate_paths(line) {
                match rank.get(name.as_str()) {
                    Some(&theirs) if theirs > own => wrong.push(format!(
                        "{rel}: `{module}` imports `{name}`, above it: {}",
                        line.trim()
                    )),
                    Some(_) => {}
                    // `crate::Error`, `crate::Runner`: the root's re-exports hide which
                    // module is named; name the module.
                    None => wrong.push(format!(
                        "{rel}: `crate::{name}` goes through the crate root; name its module: {}",
                        line.trim()
                    )),
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the floor:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn anyhow_stays_in_the_command_line_floor() {
    let mut files = Vec::new();
    sources(&src(), &mut files);
    let mut wrong = Vec::new();
    for (rel, text) in &files {
        if rel.starts_with("cli/") || matches!(rel.as_str(), "main.rs") {
            continue;
        }
        if code(text).any(|l| l.contains("anyhow")) {
            wrong.push(format!("{rel} uses anyhow below the command line"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_checks_see_an_upward_import() {
    // A tidy check that cannot fail proves nothing.
    assert_eq!(
        crate_paths("use crate::{work, held::Hold};"),
        ["work", "held"]
    );
    assert_eq!(crate_paths("let x = crate::work::hostname();"), ["work"]);
    assert_eq!(module_of("work/split.rs"), "work");
    let lines: Vec<&str> = code("// crate::work\nuse crate::sync;").collect();
    assert_eq!(lines, ["use crate::sync;"]);
}
