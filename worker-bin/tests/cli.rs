//! The command line as a user meets it: `--help`, and every kind of bad input giving
//! one clear line on stderr, a non-zero exit, and nothing written.

#[path = "../../active-store/tests/support/mod.rs"]
mod support;

mod common;

use common::{ok, output, scratch, tranche};
use support::TestRedis;

/// Runs `tranche ARGS`, asserts it failed with exit code `code` and one line on stderr
/// starting `tranche: ` and containing `needle`.
fn fails(dir: &std::path::Path, args: &[&str], code: i32, needle: &str) {
    let out = output(tranche(dir, args));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(
        lines.len(),
        1,
        "{args:?}: expected one line, got:\n{stderr}"
    );
    assert!(lines[0].starts_with("tranche: "), "{args:?}: {stderr}");
    assert!(
        lines[0].contains(needle),
        "{args:?}: `{needle}` not in: {stderr}"
    );
}

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn dbsize(redis: &TestRedis) -> u64 {
    redis.query(&redis::cmd("DBSIZE"))
}

#[test]
fn help_is_stable() {
    let dir = scratch("help");
    insta::assert_snapshot!("help", ok(tranche(&dir, &["--help"])));
    insta::assert_snapshot!("run_help", ok(tranche(&dir, &["run", "--help"])));
    insta::assert_snapshot!("plan_help", ok(tranche(&dir, &["plan", "--help"])));
}

#[test]
fn bad_input_against_redis_writes_nothing() {
    let redis = TestRedis::start();
    let url = redis.url();
    let dir = scratch("bad-redis");
    let r = |rest: &[&str]| -> Vec<String> {
        let mut v = vec!["--redis".to_owned(), url.clone()];
        v.extend(rest.iter().map(|s| s.to_string()));
        v
    };

    for cmd in [
        &["status"][..],
        &["run", "--simulate"],
        &["get", "1"],
        &["stats"],
        &["check"],
    ] {
        let v = r(cmd);
        fails(
            &dir,
            &args(&v),
            2,
            "namespace `tranche` is unknown on redis://",
        );
    }
    fails(
        &dir,
        &args(&r(&["plan", "--min", "5", "--max", "1"])),
        2,
        "invalid plan: plan max 1 is below its min 5",
    );
    fails(
        &dir,
        &args(&r(&["plan", "--min", "1", "--max", "10", "--size", "0"])),
        2,
        "invalid plan",
    );
    fails(
        &dir,
        &args(&r(&["plan", "--min", "1", "--max", "10", "--shards", "0"])),
        2,
        "--shards must be between 1 and 1024",
    );
    fails(
        &dir,
        &args(&r(&["--namespace", "a b", "status"])),
        2,
        "invalid namespace `a b`",
    );
    assert_eq!(dbsize(&redis), 0, "a rejected command wrote to Redis");

    // A dry run prints the cost and writes nothing either.
    let cost = ok(tranche(
        &dir,
        &args(&r(&[
            "plan",
            "--min",
            "1",
            "--max",
            "5000000000",
            "--dry-run",
        ])),
    ));
    assert!(cost.contains("5000000 partitions"), "{cost}");
    assert!(cost.contains("nothing written"), "{cost}");
    assert_eq!(dbsize(&redis), 0);

    // Once planned, the shard count is the namespace's own.
    ok(tranche(
        &dir,
        &args(&r(&[
            "plan", "--min", "1", "--max", "10000", "--shards", "2",
        ])),
    ));
    fails(
        &dir,
        &args(&r(&["status", "--shards", "3"])),
        2,
        "has 2 shards, not 3",
    );
    fails(
        &dir,
        &args(&r(&["discard", "999"])),
        2,
        "partition 999 is not pending or failed",
    );
    fails(
        &dir,
        &args(&r(&["retry-failed", "3"])),
        2,
        "partition 3 is not failed",
    );
    fails(
        &dir,
        &args(&r(&["locate", "20000"])),
        2,
        "no plan of namespace `tranche` covers row ID 20000",
    );
}

#[test]
fn unreachable_or_malformed_redis() {
    let dir = scratch("bad-url");
    // A port nobody listens on: bind one, then free it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://127.0.0.1:{port}");
    fails(
        &dir,
        &["--redis", &url, "status"],
        2,
        &format!("cannot connect to Redis at {url}"),
    );
    fails(
        &dir,
        &["--redis", "http://example.invalid", "status"],
        2,
        "invalid --redis URL",
    );
    // The password never reaches the message.
    let with_password = format!("redis://:hunter2@127.0.0.1:{port}");
    let out = output(tranche(&dir, &["--redis", &with_password, "status"]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("hunter2"), "{stderr}");
    assert!(stderr.contains("redis://:***@127.0.0.1"), "{stderr}");
}

#[test]
fn passwords_in_the_url_work() {
    let redis = TestRedis::start_with_password("s3cret");
    let dir = scratch("password");
    let url = format!("redis://:s3cret@127.0.0.1:{}", redis.port());
    ok(tranche(
        &dir,
        &["--redis", &url, "plan", "--min", "1", "--max", "3000"],
    ));
    let status = ok(tranche(&dir, &["--redis", &url, "status", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(v["partitions"], 3);
    assert_eq!(
        v["location"],
        format!("redis://:***@127.0.0.1:{}", redis.port())
    );
    let wrong = format!("redis://:nope@127.0.0.1:{}", redis.port());
    fails(
        &dir,
        &["--redis", &wrong, "status"],
        2,
        "redis://:***@127.0.0.1",
    );
}

#[test]
fn clap_errors_exit_2() {
    let dir = scratch("clap");
    for args in [
        &[][..],
        &["run"],
        &["plan", "--min", "1"],
        &["frobnicate"],
        &["run", "--simulate", "--exec", "true"],
    ] {
        let out = output(tranche(&dir, args));
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("Usage: tranche"), "{args:?}: {stderr}");
    }
}

#[test]
fn embedded_bad_input() {
    let dir = scratch("bad-embedded");
    fails(
        &dir,
        &["status"],
        2,
        "namespace `tranche` has no state file at .tranche/tranche.state",
    );
    fails(
        &dir,
        &["plan", "--min", "9", "--max", "3"],
        2,
        "invalid plan",
    );
    assert!(
        !dir.join(".tranche").exists(),
        "a rejected plan created state"
    );
    let cost = ok(tranche(
        &dir,
        &["plan", "--min", "1", "--max", "1000000", "--dry-run"],
    ));
    assert!(cost.contains("1000 partitions"), "{cost}");
    assert!(!dir.join(".tranche").exists(), "a dry run created state");
}
