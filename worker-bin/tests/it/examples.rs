//! The library examples run as they stand: embedded ones with no service at all, the
//! Redis ones against a private redis-server.

use crate::support;

use std::process::Command;

use support::TestRedis;

/// Runs example NAME with ARGS and returns its stdout; fails on a non-zero exit,
/// showing stderr. The binary `cargo test` built beside this test's (in
/// `target/<profile>/examples/`) runs as it is; only where there is none does `cargo run
/// --example` build it, which is slow and waits on the build directory's lock.
fn example(name: &str, args: &[&str]) -> String {
    let built = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.join("examples")))
        .and_then(|dir| built_example(&dir, name));
    let out = match built {
        Some(path) => Command::new(path).args(args).output().unwrap(),
        None => Command::new(env!("CARGO"))
            .args(["run", "-q", "-p", "tranche-worker", "--example", name, "--"])
            .args(args)
            .output()
            .unwrap(),
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{name} failed: {stderr}");
    String::from_utf8(out.stdout).unwrap()
}

/// The newest binary of example `name` in `dir`: `name` itself, or `name-HASH` as
/// `cargo test` leaves it (not its `.d` file).
fn built_example(dir: &std::path::Path, name: &str) -> Option<std::path::PathBuf> {
    let prefix = format!("{name}-");
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter(|e| {
            let file = e.file_name().to_string_lossy().into_owned();
            file == name
                || (file.starts_with(&prefix)
                    && !file.contains('.')
                    && file[prefix.len()..].chars().all(|c| c.is_ascii_hexdigit()))
        })
        .filter(|e| e.metadata().is_ok_and(|m| m.is_file()))
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
        .map(|e| e.path())
}

#[test]
fn hello_embedded_runs() {
    let out = example("hello_embedded", &[]);
    assert!(
        out.contains("20 partitions completed; the IDs sum to 500000500000"),
        "{out}"
    );
}

fn new_user_says(out: &str) {
    for line in [
        "here: 199 completed, 2 attempts failed, failed pids [13]",
        "row 123456: partition 124, completed: true",
        "job: 199 of 200 completed",
    ] {
        assert!(out.contains(line), "{line} in:\n{out}");
    }
    assert!(out.contains("failed: pid 13") && out.contains("a row is malformed"));
}

#[test]
fn new_user_runs_embedded() {
    new_user_says(&example("new_user", &[]));
}

#[test]
fn new_user_runs_on_redis() {
    let redis = TestRedis::start();
    new_user_says(&example("new_user", &["--redis", &redis.url()]));
}

#[test]
fn fleet_redis_shares_the_job_between_two_processes() {
    let redis = TestRedis::start();
    let out = example("fleet_redis", &[&redis.url()]);
    assert!(
        out.contains("the job: 100 of 100 partitions completed"),
        "{out}"
    );
    let share = |who: &str| -> u64 {
        let line = out.lines().find(|l| l.starts_with(who)).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    assert_eq!(share("first:"), 100 - share("second:"), "{out}");
}
