//! The command line as a user meets it: `--help`, and every kind of bad input giving
//! one clear line on stderr, a non-zero exit, and nothing written; then connecting
//! (connection.rs), health and repair (health.rs) and the operator's commands
//! (operate/).

use crate::pki;
use crate::support;

use crate::common;

use common::{eventually, ok, output, scratch, tranche};
use std::process::Stdio;
use std::time::Duration;
use support::TestRedis;

mod connection;
mod doctor;
mod health;
mod install;
mod oneshot;
mod operate;
mod pipe;

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

/// Embedded, a namespace names a file: `.` and `..` are refused (with the key
/// schema's rules, which Redis follows too), and nothing is written.
#[test]
fn embedded_namespaces_are_safe_file_names() {
    let dir = scratch("embedded-ns");
    let long = "n".repeat(65);
    for ns in [".", "..", "...", long.as_str(), "a/b", ""] {
        fails(
            &dir,
            &["--namespace", ns, "plan", "--min", "1", "--max", "10"],
            2,
            "invalid namespace",
        );
    }
    fails(
        &dir,
        &["plan", "--min", "1", "--max", "10", "--shards", "1025"],
        2,
        "--shards must be between 1 and 1024",
    );
    let written: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .flat_map(|e| std::fs::read_dir(e.path()).into_iter().flatten().flatten())
        .map(|e| e.path())
        .collect();
    assert!(
        written
            .iter()
            .all(|p| !p.to_string_lossy().ends_with(".state")),
        "{written:?}"
    );
    ok(tranche(
        &dir,
        &[
            "--namespace",
            "a.b-c_d",
            "plan",
            "--min",
            "1",
            "--max",
            "10",
        ],
    ));
}

/// `plan --dry-run` validates as `plan` does, existing plans included: what `plan`
/// refuses, the dry run refuses with the same message and exit 2.
#[test]
fn a_dry_run_refuses_what_plan_refuses() {
    let redis = TestRedis::start();
    let url = redis.url();
    let dir = scratch("dry-run-overlap");
    for redis in [None, Some(url.as_str())] {
        let cmd = |rest: &[&str]| -> Vec<String> {
            let mut v: Vec<String> = redis
                .map(|u| vec!["--redis".to_owned(), u.to_owned()])
                .unwrap_or_default();
            v.extend(rest.iter().map(|s| s.to_string()));
            v
        };
        ok(tranche(
            &dir,
            &args(&cmd(&["plan", "--min", "1", "--max", "100"])),
        ));
        let overlapping = ["plan", "--min", "50", "--max", "200"];
        let real = output(tranche(&dir, &args(&cmd(&overlapping))));
        assert_eq!(real.status.code(), Some(2));
        let message = String::from_utf8_lossy(&real.stderr).trim().to_owned();
        assert!(message.contains("overlap"), "{message}");
        let dry = output(tranche(
            &dir,
            &args(&cmd(&[&overlapping[..], &["--dry-run"]].concat())),
        ));
        assert_eq!(dry.status.code(), Some(2), "{redis:?}");
        assert_eq!(String::from_utf8_lossy(&dry.stderr).trim(), message);
        // A repeated plan is a no-op for both; a disjoint one is fine.
        ok(tranche(
            &dir,
            &args(&cmd(&["plan", "--min", "1", "--max", "100", "--dry-run"])),
        ));
        ok(tranche(
            &dir,
            &args(&cmd(&["plan", "--min", "101", "--max", "200", "--dry-run"])),
        ));
    }
}

/// Every field of an imported JSON line is bounded: a worker id longer than the
/// registry allows (or with a `|`), a range upside down, a pid of 0, refuse the whole
/// import before anything is written.
#[test]
fn an_import_with_an_unbounded_field_writes_nothing() {
    let redis = TestRedis::start();
    let url = redis.url();
    let dir = scratch("import-bounds");
    let header = r#"{"tranche_jsonl":1,"namespace":"tranche","shards":1,"batch_size":1024,"plans":[{"first_pid":1,"min_id":1,"max_id":20,"size":10,"explicit":false}]}"#;
    let line = |pid: u64, min: u64, max: u64, worker: &str| {
        format!(
            r#"{{"pid":{pid},"min_id":{min},"max_id":{max},"worker_id":"{worker}","completed_at":1719234405.0,"duration":2.5}}"#
        )
    };
    let good = line(1, 1, 10, "w1");
    let long = "w".repeat(257);
    for (bad, needle) in [
        (line(2, 11, 20, &long), "worker id"),
        (line(2, 11, 20, "a|b"), "worker id"),
        (line(2, 11, 20, ""), "worker id"),
        (line(2, 20, 11, "w1"), "min_id"),
        (line(0, 11, 20, "w1"), "pid"),
    ] {
        let file = dir.join("bad.jsonl");
        std::fs::write(&file, format!("{header}\n{good}\n{bad}\n")).unwrap();
        for redis in [None, Some(url.as_str())] {
            let mut v: Vec<&str> = redis.map(|u| vec!["--redis", u]).unwrap_or_default();
            v.extend(["import", file.to_str().unwrap()]);
            fails(&dir, &v, 2, needle);
        }
        assert_eq!(dbsize(&redis), 0, "a refused import wrote to Redis");
        assert!(!dir.join(".tranche/tranche.state").exists());
    }
    let file = dir.join("good.jsonl");
    let fine = line(2, 11, 20, &"w".repeat(256));
    std::fs::write(&file, format!("{header}\n{good}\n{fine}\n")).unwrap();
    ok(tranche(
        &dir,
        &["--redis", &url, "import", file.to_str().unwrap()],
    ));
}

/// One word for a planned partition no worker has claimed yet: `get` says pending, so
/// does `status` (no other word for them), and `list pending` lists them, a page at a
/// time, each row what `get --json` says of it; on both backends.
#[test]
fn never_claimed_partitions_are_pending_everywhere() {
    let redis = TestRedis::start();
    let url = redis.url();
    let dir = scratch("pending-vocabulary");
    for redis in [None, Some(url.as_str())] {
        let cmd = |rest: &[&str]| -> Vec<String> {
            let mut v: Vec<String> = redis
                .map(|u| vec!["--redis".to_owned(), u.to_owned()])
                .unwrap_or_default();
            v.extend(rest.iter().map(|s| s.to_string()));
            v
        };
        ok(tranche(
            &dir,
            &args(&cmd(&[
                "plan", "--min", "1", "--max", "10", "--size", "1", "--shards", "3",
            ])),
        ));
        let json = |rest: &[&str]| -> serde_json::Value {
            serde_json::from_str(&ok(tranche(&dir, &args(&cmd(rest))))).unwrap()
        };
        let get = json(&["get", "1", "--json"]);
        assert_eq!(get["status"], "pending", "{get}");
        let status = ok(tranche(&dir, &args(&cmd(&["status"]))));
        assert!(!status.contains("unissued"), "{status}");
        assert!(
            status
                .lines()
                .any(|l| l.split_whitespace().take(2).eq(["pending", "10"])),
            "{status}"
        );
        let mut seen = Vec::new();
        let mut after = 0;
        loop {
            let page = json(&[
                "list",
                "pending",
                "--json",
                "--limit",
                "4",
                "--after",
                &after.to_string(),
            ]);
            for row in page["partitions"].as_array().unwrap() {
                let pid = row["pid"].as_u64().unwrap();
                // `get` adds the pieces of a split partition (none here) to the row.
                let mut get = json(&["get", &pid.to_string(), "--json"]);
                let pieces = get.as_object_mut().unwrap().remove("pieces");
                assert_eq!(pieces, Some(serde_json::json!([])), "{pid}");
                assert_eq!(row, &get, "{pid}");
                seen.push(pid);
            }
            match page["next"].as_u64() {
                Some(next) => after = next,
                None => break,
            }
        }
        assert_eq!(seen, (1..=10).collect::<Vec<u64>>(), "{redis:?}");
        let all = json(&["list", "--json"]);
        assert_eq!(all["partitions"].as_array().unwrap().len(), 10, "{all}");
        let claimed = json(&["list", "claimed", "--json"]);
        assert_eq!(
            claimed["partitions"].as_array().unwrap().len(),
            0,
            "{claimed}"
        );
        let table = ok(tranche(
            &dir,
            &args(&cmd(&["list", "pending", "--limit", "2"])),
        ));
        assert!(table.contains("more: --after 2"), "{table}");
        let _ = std::fs::remove_dir_all(dir.join(".tranche"));
    }
}

/// A refused discard says what the partition is instead, in `get`'s words.
#[test]
fn a_refused_discard_names_the_partitions_state() {
    let dir = scratch("discard-state");
    ok(tranche(
        &dir,
        &["plan", "--min", "1", "--max", "2", "--size", "1"],
    ));
    ok(tranche(
        &dir,
        &["run", "--simulate", "--sim-latency", "0..1"],
    ));
    fails(
        &dir,
        &["discard", "1"],
        2,
        "partition 1 is not pending or failed (it is completed): nothing discarded",
    );
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
    // One rule, the key schema's: at most 64 characters.
    let long = "n".repeat(65);
    fails(
        &dir,
        &args(&r(&[
            "--namespace",
            &long,
            "plan",
            "--min",
            "1",
            "--max",
            "10",
        ])),
        2,
        "invalid namespace",
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
        "partition 999 is not pending or failed (it is unknown): nothing discarded",
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
    // Nor a password with a `?` in it, nor one in a malformed URL, whatever the error.
    for (url, secret) in [
        (format!("redis://:pa?ss@127.0.0.1:{port}"), "pa?ss"),
        (format!("redis://:pa?ss@127.0.0.1:{port}"), "ss@"),
        ("redis:/:S3cretPW@example.invalid".to_owned(), "S3cretPW"),
        ("redis//:S3cretPW@example.invalid".to_owned(), "S3cretPW"),
        (format!("redis://u:p@ss#w/rd@127.0.0.1:{port}"), "ss#w"),
    ] {
        let out = output(tranche(&dir, &["--redis", &url, "status"]));
        assert_eq!(out.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains(secret), "{url}: {stderr}");
        assert!(stderr.contains("***@"), "{url}: {stderr}");
    }
}
