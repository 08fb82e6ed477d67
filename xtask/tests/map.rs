//! Tidy: `ARCHITECTURE.md` is a map that cannot go stale.
//!
//! Every path it cites in backticks (a span with a `/`, or naming a `.rs`, `.lua`, `.md`
//! or `.toml` file) must exist, from the workspace root; and every Rust file under a
//! member's `src/` and every Lua script under its `lua/` must be covered: cited by its
//! own path, or under a folder cited (a member's `src/` itself does not count, or one
//! citation would cover a whole crate). The map stays short, and points nowhere outside
//! the repository.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// The most lines the map may have: past that it is a manual, and goes stale.
const MAX_LINES: usize = 300;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn map() -> String {
    fs::read_to_string(workspace_root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md")
}

/// The spans of `text` between backticks that read as paths.
fn cited(text: &str) -> BTreeSet<String> {
    let mut paths = BTreeSet::new();
    for (i, span) in text.split('`').enumerate() {
        if i % 2 == 0 || span.is_empty() {
            continue;
        }
        let pathlike = span
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c));
        let file = [".rs", ".lua", ".md", ".toml"]
            .iter()
            .any(|ext| span.ends_with(ext));
        if pathlike && !span.starts_with('/') && (span.contains('/') || file) {
            paths.insert(span.to_owned());
        }
    }
    paths
}

/// Every `.rs` under `dir` (recursively) with the extension `ext`, relative to the root.
fn files(dir: &Path, ext: &str, out: &mut Vec<String>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, ext, out);
        } else if path.extension().is_some_and(|e| e == ext) {
            let rel = path.strip_prefix(workspace_root()).unwrap();
            out.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
}

/// Every source file and Lua script of the workspace's members, and the members.
fn modules() -> (Vec<String>, Vec<String>) {
    let (mut out, mut members) = (Vec::new(), Vec::new());
    for member in fs::read_dir(workspace_root()).unwrap() {
        let member = member.unwrap().path();
        if !member.join("Cargo.toml").is_file() {
            continue;
        }
        members.push(member.file_name().unwrap().to_string_lossy().into_owned());
        files(&member.join("src"), "rs", &mut out);
        files(&member.join("lua"), "lua", &mut out);
    }
    assert!(!out.is_empty(), "found no sources");
    (out, members)
}

#[test]
fn every_path_the_map_cites_exists() {
    let root = workspace_root();
    let missing: Vec<String> = cited(&map())
        .into_iter()
        .filter(|p| !root.join(p.trim_end_matches('/')).exists())
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md cites paths that do not exist (name files by their whole path):\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_map_covers_every_module() {
    let paths = cited(&map());
    let (modules, members) = modules();
    let too_wide: BTreeSet<String> = members.iter().map(|m| format!("{m}/src/")).collect();
    let folders: Vec<&String> = paths
        .iter()
        .filter(|p| p.ends_with('/') && !too_wide.contains(*p))
        .collect();
    let uncovered: Vec<&String> = modules
        .iter()
        .filter(|m| !paths.contains(*m) && !folders.iter().any(|f| m.starts_with(f.as_str())))
        .collect();
    assert!(
        uncovered.is_empty(),
        "ARCHITECTURE.md names neither these files nor a folder holding them:\n{}",
        uncovered
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn the_map_is_short_and_stays_in_the_repository() {
    let text = map();
    let lines = text.lines().count();
    assert!(
        lines <= MAX_LINES,
        "ARCHITECTURE.md has {lines} lines, more than {MAX_LINES}: move mechanism into the files' //! docs"
    );
    let outside: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("../") || l.contains("http://") || l.contains("https://"))
        .collect();
    assert!(
        outside.is_empty(),
        "ARCHITECTURE.md points outside the repository:\n{}",
        outside.join("\n")
    );
}

#[test]
fn the_checks_read_what_they_should() {
    let spans = cited("see `a/b.rs`, `c.lua`, `{ns:s}:active`, `/api/v1/`, `x y/z`, `d/`");
    let want: BTreeSet<String> = ["a/b.rs", "c.lua", "d/"].map(String::from).into();
    assert_eq!(spans, want);
}
