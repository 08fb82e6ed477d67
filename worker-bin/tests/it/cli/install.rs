//! What an installed binary offers beyond its commands: `--version` with the commit,
//! shell completions and the man page from the clap definitions, and docs/cli.md kept
//! equal to what the binary says (`cargo xtask cli-docs` rewrites it).

use super::*;

#[test]
fn version_names_the_commit() {
    let dir = scratch("version");
    let version = ok(tranche(&dir, &["--version"]));
    let expected = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".to_owned());
    assert_eq!(
        version.trim(),
        format!("tranche {} (commit {expected})", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn completions_and_man_page_come_from_the_clap_definitions() {
    let dir = scratch("completions");
    for (shell, marker) in [
        ("bash", "complete -F _tranche"),
        ("zsh", "#compdef tranche"),
        ("fish", "complete -c tranche"),
    ] {
        let script = ok(tranche(&dir, &["completions", shell]));
        assert!(script.contains(marker), "{shell}: {marker} missing");
        assert!(script.contains("doctor"), "{shell}: subcommands missing");
    }
    let out = output(tranche(&dir, &["completions", "tcsh"]));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid value 'tcsh'"));
    let man = ok(tranche(&dir, &["man"]));
    assert!(man.contains(".TH tranche 1"), "{man}");
    assert!(
        man.contains("doctor"),
        "subcommands missing from the man page"
    );
}

/// docs/cli.md is what `cargo xtask cli-docs` writes: the binary's `cli-markdown`.
#[test]
fn docs_cli_md_is_current() {
    let dir = scratch("cli-docs");
    let generated = ok(tranche(&dir, &["cli-markdown"]));
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/cli.md");
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "docs/cli.md is stale: run `cargo xtask cli-docs` and commit it"
    );
}
