//! The library examples run as they stand: embedded ones with no service at all, the
//! Redis ones against a private redis-server. Each drains on SIGTERM, an orchestrator's
//! stop, as on Ctrl-C: it exits 0 with its report, its work left unfinished.

use crate::support;

use std::process::Command;
use std::time::{Duration, Instant};

use support::TestRedis;

use crate::logged::{LoggedChild, scratch};

/// Runs example NAME with ARGS and returns its stdout; fails on a non-zero exit,
/// showing stderr.
fn example(name: &str, args: &[&str]) -> String {
    let out = command(name, args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{name} failed: {stderr}");
    String::from_utf8(out.stdout).unwrap()
}

/// The command that runs example NAME with ARGS (see [`example`]).
fn command(name: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(built_example(name));
    cmd.args(args);
    cmd
}

/// Starts example NAME with ARGS, its output in files of a scratch directory of its own.
fn start(name: &str, args: &[&str]) -> LoggedChild {
    let dir = scratch(&format!("example-{name}"));
    LoggedChild::spawn(&mut command(name, args), &dir, name)
}

/// Sends SIGTERM to `child`, then waits (at most a minute) for it to exit 0 and returns
/// its stdout.
fn terminate(mut child: LoggedChild) -> String {
    let sent = Command::new("kill")
        .args(["-TERM", &child.child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let status = child.wait(Duration::from_secs(60));
    assert!(
        status.success(),
        "SIGTERM ended it with {status}: {}",
        child.stderr()
    );
    child.stdout()
}

/// Waits (at most half a minute) until `redis` holds `n` workers of `namespace`: their
/// runs, and the signal handlers set up before them, have started.
fn workers_started(redis: &TestRedis, namespace: &str, n: usize) {
    let key = format!("{{{namespace}}}:workers");
    let deadline = Instant::now() + Duration::from_secs(30);
    while redis.cli(&["HLEN", &key]).parse::<usize>().unwrap_or(0) < n {
        assert!(Instant::now() < deadline, "{n} workers never registered");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Example NAME's binary, built by `cargo build --workspace --example` now (the
/// workspace's features, as the tests were built with): a no-op when it is up
/// to date, and never a stale binary of an earlier build (nextest builds no examples).
/// Built before the test starts it, so that a test's SIGTERM meets the example, not
/// cargo in the middle of a build.
fn built_example(name: &str) -> std::path::PathBuf {
    let out = Command::new(env!("CARGO"))
        .args(["build", "-q", "--locked", "--workspace", "--example", name])
        .arg("--message-format=json")
        .output()
        .expect("cargo");
    assert!(
        out.status.success(),
        "cargo build --example {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == name)
        .find_map(|m| m["executable"].as_str().map(std::path::PathBuf::from))
        .unwrap_or_else(|| panic!("cargo build --example {name} named no executable"))
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

#[test]
fn hello_embedded_drains_on_sigterm() {
    // Counting to 10^10 takes minutes: the signal comes while it works.
    let child = start("hello_embedded", &["10000000000"]);
    std::thread::sleep(Duration::from_millis(1500));
    let out = terminate(child);
    let done: u64 = out
        .strip_prefix("stopped by a signal: ")
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no drain report: {out}"));
    assert!(done < 200_000, "{out}");
}

/// Redis writes are held back (`CLIENT PAUSE ... WRITE`) from the moment the run has
/// started, so that the job cannot end before the signal arrives.
fn hold_writes(redis: &TestRedis) {
    assert_eq!(redis.cli(&["CLIENT", "PAUSE", "2000", "WRITE"]), "OK");
    std::thread::sleep(Duration::from_millis(300));
}

#[test]
fn new_user_drains_on_sigterm() {
    let redis = TestRedis::start();
    let child = start("new_user", &["--redis", &redis.url()]);
    workers_started(&redis, "import", 1);
    hold_writes(&redis);
    let out = terminate(child);
    let here: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("here: "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no report: {out}"));
    assert!(here < 199, "drained before the end: {out}");
    assert!(
        out.contains("job: ") && out.contains(" of 200 completed"),
        "{out}"
    );
}

/// SIGTERM reaches the first process alone (as Kubernetes sends it to PID 1); it
/// drains and passes the stop on, so the second drains too and reports its share.
#[test]
fn fleet_redis_drains_both_workers_on_sigterm() {
    let redis = TestRedis::start();
    let child = start("fleet_redis", &[&redis.url()]);
    workers_started(&redis, "fleet-example", 2);
    hold_writes(&redis);
    let out = terminate(child);
    assert!(
        out.contains("second: "),
        "the second worker drained and reported: {out}"
    );
    let job = out
        .lines()
        .find_map(|l| l.strip_prefix("the job: "))
        .unwrap_or_else(|| panic!("no job line: {out}"));
    let completed: u64 = job.split_whitespace().next().unwrap().parse().unwrap();
    assert!(completed < 100, "drained before the end: {out}");
    assert!(job.ends_with("(exit status: 0)"), "{out}");
}
