//! Tidy checks over the workspace's sources, run as ordinary tests.

use std::fs;
use std::path::{Path, PathBuf};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Every Rust file under `*/src`, `*/tests` and `*/benches` of every member folder.
fn sources() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for member in fs::read_dir(workspace_root()).unwrap() {
        let member = member.unwrap().path();
        if !member.join("Cargo.toml").is_file() {
            continue;
        }
        for sub in ["src", "tests", "benches"] {
            collect(&member.join(sub), &mut out);
        }
    }
    assert!(
        !out.is_empty(),
        "found no sources under {}",
        workspace_root().display()
    );
    out
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// A reader opening any file learns first what it is for.
#[test]
fn every_file_opens_with_module_docs() {
    let missing: Vec<String> = sources()
        .into_iter()
        .filter(|path| {
            let text = fs::read_to_string(path).unwrap();
            let first = text
                .lines()
                .find(|line| !line.trim().is_empty())
                .unwrap_or("");
            !first.starts_with("//!")
        })
        .map(|path| path.display().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "files without `//!` docs at the top: {missing:#?}"
    );
}

/// Stubs and debug prints do not land.
#[test]
fn no_stubs_or_debug_prints() {
    // Spelled in pieces so that this file does not match its own list (and needs no
    // exemption).
    let banned = [
        concat!("todo", "!("),
        concat!("unimplemented", "!("),
        concat!("dbg", "!("),
        concat!("#[", "ignore"),
        concat!("#[", "should_panic"),
    ];
    let mut found = Vec::new();
    for path in sources() {
        let text = fs::read_to_string(&path).unwrap();
        for (n, line) in text.lines().enumerate() {
            if banned.iter().any(|b| line.contains(b)) {
                found.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(found.is_empty(), "{found:#?}");
}
