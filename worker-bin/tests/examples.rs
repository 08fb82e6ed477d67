//! The library examples run as they stand: embedded ones with no service at all, the
//! Redis ones against a private redis-server.

#[path = "../../active-store/tests/support/mod.rs"]
mod support;

use std::process::Command;

use support::TestRedis;

/// Runs `cargo run --example NAME -- ARGS` and returns its stdout; fails on a non-zero
/// exit, showing stderr.
fn example(name: &str, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO"))
        .args(["run", "-q", "-p", "tranche-worker", "--example", name, "--"])
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{name} failed: {stderr}");
    String::from_utf8(out.stdout).unwrap()
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
