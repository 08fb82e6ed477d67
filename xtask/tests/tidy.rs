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

/// worker-bin's library floor (everything under `src/` but `src/cli/` and `main.rs`)
/// imports nothing from its command-line floor, the terminal or HTTP: arrows only point
/// down, so the library builds without the `cli` feature.
#[test]
fn worker_library_floor_does_not_reach_up() {
    let src = workspace_root().join("worker-bin/src");
    let cli = src.join("cli");
    let crates = [
        "clap",
        "indicatif",
        "axum",
        "hyper",
        "prometheus_client",
        "tracing_subscriber",
    ];
    let mut files = Vec::new();
    collect(&src, &mut files);
    assert!(
        !files.is_empty(),
        "found no sources under {}",
        src.display()
    );
    let mut found = Vec::new();
    for path in files {
        if path.starts_with(&cli) || path == src.join("main.rs") {
            continue;
        }
        // `metrics.rs`, behind the opt-in `metrics` feature, fills the application's
        // own prometheus-client registry; it serves nothing.
        let metrics = path == src.join("metrics.rs");
        let text = fs::read_to_string(&path).unwrap();
        for (n, line) in text.lines().enumerate() {
            let up = line.contains("crate::cli") || line.contains("super::cli");
            let foreign = crates
                .iter()
                .filter(|name| !(metrics && **name == "prometheus_client"))
                .find(|name| uses_crate(line, name));
            if up || foreign.is_some() {
                found.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "the library floor reaches into the cli floor or a cli-only crate: {found:#?}"
    );
}

/// Whether `line` names the crate `name` as a path (`name::…`, `::name::…`) or in an
/// `extern crate`, not merely as part of a longer identifier.
fn uses_crate(line: &str, name: &str) -> bool {
    let path = format!("{name}::");
    line.match_indices(&path).any(|(at, _)| {
        line[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
    }) || line.contains(&format!("extern crate {name}"))
}
