//! Stamps the binary with the commit it was built from, for `tranche --version`:
//! `git rev-parse --short HEAD` when the source is a git checkout and git is on the
//! path, `unknown` otherwise (a crate tarball, a build without git).

use std::process::Command;

fn main() {
    let commit = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=TRANCHE_GIT_COMMIT={commit}");
    // HEAD moves on a checkout; the branch it names moves on a commit (`--git-path`
    // finds both in a worktree too). A path that does not exist would rerun this on
    // every build, so a packed ref is left out.
    let branch = git(&["symbolic-ref", "-q", "HEAD"]);
    for name in std::iter::once("HEAD").chain(branch.as_deref()) {
        if let Some(p) = git(&["rev-parse", "--git-path", name])
            && std::path::Path::new(&p).exists()
        {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}

/// One line of git's output, or `None` when git is missing or fails.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (!text.is_empty()).then_some(text)
}
