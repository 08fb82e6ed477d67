//! What the benches that spawn the real binary share.

#![allow(dead_code, unreachable_pub)]

use std::process::{Command, Stdio};

/// `bin --redis url --namespace ns ARGS` with a clean environment (no inherited
/// TRANCHE_* settings) and warnings only.
pub fn tranche_at(bin: &str, url: &str, ns: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(bin);
    cmd.args(["--redis", url, "--namespace", ns])
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null());
    for (key, _) in std::env::vars() {
        if key.starts_with("TRANCHE_") {
            cmd.env_remove(key);
        }
    }
    cmd
}

/// Runs `cmd` to completion, panicking with its output unless it succeeded; its stdout.
pub fn run_ok(mut cmd: Command) -> String {
    let out = cmd.output().expect("spawn tranche");
    assert!(
        out.status.success(),
        "tranche failed ({:?}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}
