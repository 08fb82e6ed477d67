//! The command line as a user meets it: `--help`, and every kind of bad input giving
//! one clear line on stderr, a non-zero exit, and nothing written.

use crate::pki;
use crate::support;

use crate::common;

use common::{eventually, ok, output, scratch, tranche};
use std::process::Stdio;
use std::time::Duration;
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

/// The URL from a file keeps the password out of `ps`; TLS trusts a CA file and presents
/// a client certificate; TLS options without TLS are refused.
#[test]
fn redis_file_and_tls_options() {
    let redis = TestRedis::start_with_password("s3cret");
    let dir = scratch("redis-file");
    let file = dir.join("redis.url");
    std::fs::write(
        &file,
        format!("redis://:s3cret@127.0.0.1:{}\n", redis.port()),
    )
    .unwrap();
    let file = file.to_str().unwrap();
    ok(tranche(
        &dir,
        &["--redis-file", file, "plan", "--min", "1", "--max", "3000"],
    ));
    let status = ok(tranche(&dir, &["--redis-file", file, "status", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(v["partitions"], 3);
    assert!(!status.contains("s3cret"), "{status}");
    fails(
        &dir,
        &["--redis-file", "/nonexistent/url", "status"],
        2,
        "cannot read --redis-file /nonexistent/url",
    );

    let [ca, cert, key, client_cert, client_key] = pki::write(&dir);
    let server = TestRedis::start_mtls(&cert, &key, &ca);
    let url = format!("rediss://127.0.0.1:{}", server.port());
    let paths = [&ca, &client_cert, &client_key].map(|p| p.to_str().unwrap().to_owned());
    let [ca, client_cert, client_key] = [&paths[0], &paths[1], &paths[2]].map(String::as_str);
    let mtls = [
        "--redis",
        &url,
        "--tls-ca",
        ca,
        "--tls-cert",
        client_cert,
        "--tls-key",
        client_key,
    ];
    ok(tranche(
        &dir,
        &[&mtls[..], &["plan", "--min", "1", "--max", "3000"]].concat(),
    ));
    let status = ok(tranche(&dir, &[&mtls[..], &["status", "--json"]].concat()));
    assert!(status.contains("\"partitions\":3"), "{status}");
    // Without the client certificate the server refuses; without the CA, so does tranche.
    fails(
        &dir,
        &["--redis", &url, "--tls-ca", ca, "status"],
        2,
        "cannot connect to Redis",
    );
    fails(
        &dir,
        &["--redis", &url, "status"],
        2,
        "cannot connect to Redis",
    );
    fails(
        &dir,
        &["--redis", &redis.url(), "--tls-ca", ca, "status"],
        2,
        "need a rediss:// URL",
    );
    fails(&dir, &["--tls-ca", ca, "status"], 2, "need --redis");
}

/// The shipped ACL file: its worker user runs a whole job and every write command; its
/// operator user runs every read command and no write.
#[test]
fn the_shipped_acl_users_can_do_their_job_and_no_more() {
    let acl = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/redis/acl.conf");
    let redis = TestRedis::start_with_args(&["--aclfile", acl]);
    let dir = scratch("acl");
    let url = |user: &str| {
        format!(
            "redis://tranche-{user}:{user}-secret@127.0.0.1:{}",
            redis.port()
        )
    };
    let (worker, operator) = (url("worker"), url("operator"));
    let as_user = |url: &str, args: &[&str]| tranche(&dir, &[&["--redis", url][..], args].concat());
    ok(as_user(
        &worker,
        &["plan", "--min", "1", "--max", "50000", "--size", "1000"],
    ));
    let run = [
        "run",
        "--simulate",
        "--sim-latency",
        "0..1",
        "--sim-fail",
        "0.2",
        "--max-attempts",
        "1",
    ];
    let out = output(as_user(&worker, &run));
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for args in [&["retry-failed"][..], &["compact"], &["check", "--repair"]] {
        ok(as_user(&worker, args));
    }
    ok(as_user(
        &worker,
        &["run", "--simulate", "--sim-latency", "0..1"],
    ));
    let export = dir.join("acl.jsonl");
    let export = export.to_str().unwrap();
    for args in [
        &["status"][..],
        &["get", "5"],
        &["locate", "7777"],
        &["stats"],
        &["workers"],
        &["health"],
        &["check"],
        &["dead-letters"],
        &["export", "-o", export],
    ] {
        ok(as_user(&operator, args));
    }
    let status = ok(as_user(&operator, &["status", "--json"]));
    assert!(status.contains("\"partitions\":50"), "{status}");
    for args in [
        &["retry-failed"][..],
        &["plan", "--min", "50001", "--max", "60000"],
    ] {
        let out = output(as_user(&operator, args));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{args:?} wrote as the operator");
        assert!(
            stderr.contains("NoPerm") || stderr.contains("NOPERM"),
            "{args:?}: {stderr}"
        );
    }
    // Nobody gets in without a user.
    fails(
        &dir,
        &["--redis", &redis.url(), "status"],
        2,
        "cannot connect to Redis",
    );
}

/// A claim Redis refuses for what it is (here a user the claim script's `TIME` is
/// denied to) ends the run with that reason at once, instead of retrying for ever.
#[test]
fn a_claim_redis_refuses_ends_the_run_with_its_reason() {
    let redis = TestRedis::start_with_args(&[
        "--user", "default", "on", "nopass", "~*", "&*", "+@all", "-time",
    ]);
    let dir = scratch("claim-refused");
    let url = redis.url();
    ok(tranche(
        &dir,
        &[
            "--redis", &url, "plan", "--min", "1", "--max", "5000", "--size", "1000",
        ],
    ));
    let started = std::time::Instant::now();
    let out = output(tranche(&dir, &["--redis", &url, "run", "--simulate"]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("claim refused"), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
    let status: serde_json::Value =
        serde_json::from_str(&ok(tranche(&dir, &["--redis", &url, "status", "--json"]))).unwrap();
    assert_eq!(status["failed"], 0, "{status}");
}

/// Runs `health --json` and returns the names of the rules that fire, after checking
/// that the exit code and the one line on stderr agree with them.
fn firing(dir: &std::path::Path, extra: &[&str]) -> Vec<String> {
    let out = output(tranche(dir, &[&["health", "--json"][..], extra].concat()));
    let rules: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<String> = rules
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["firing"] == true)
        .map(|r| r["rule"].as_str().unwrap().to_owned())
        .collect();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if names.is_empty() {
        assert!(out.status.success(), "{stderr}");
    } else {
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains(&format!("alert firing: {}", names.join(", "))),
            "{stderr}"
        );
    }
    names
}

/// Each rule an operator needs fires when its condition holds, and only then.
#[test]
fn health_rules_fire_when_the_job_is_broken() {
    let dir = scratch("health");
    ok(tranche(
        &dir,
        &["plan", "--min", "1", "--max", "10000", "--size", "1000"],
    ));
    assert_eq!(firing(&dir, &[]), ["outstanding_no_worker"]);
    let out = output(tranche(
        &dir,
        &[
            "run",
            "--simulate",
            "--sim-latency",
            "0..1",
            "--sim-fail",
            "1",
            "--max-attempts",
            "1",
        ],
    ));
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(firing(&dir, &[]), ["failed_partitions", "failed_share"]);
    assert_eq!(
        firing(&dir, &["--max-failed", "10"]),
        ["failed_share"],
        "all 10 of 10 failed"
    );
    assert_eq!(
        firing(&dir, &["--max-failed", "10", "--max-failed-share", "1"]),
        Vec::<String>::new()
    );
    ok(tranche(&dir, &["retry-failed"]));
    assert_eq!(firing(&dir, &[]), ["outstanding_no_worker"]);
    ok(tranche(
        &dir,
        &["run", "--simulate", "--sim-latency", "0..1"],
    ));
    assert_eq!(firing(&dir, &[]), Vec::<String>::new());
    // New work, nothing archived since: stalled once the allowance is gone.
    ok(tranche(
        &dir,
        &["plan", "--min", "10001", "--max", "20000", "--size", "1000"],
    ));
    assert_eq!(
        firing(&dir, &["--max-stall", "0s"]),
        ["outstanding_no_worker", "stalled_minutes"]
    );
}

/// The rules the other health test cannot reach embedded, each made to fire on Redis:
/// too many partitions active, a slow worker, completions waiting for an archiver that
/// is not running (count and age), a fleet stuck since it started, and statistics that
/// disagree with the archive.
#[test]
fn health_rules_fire_on_redis() {
    let redis = TestRedis::start();
    let dir = scratch("health-redis");
    let url = redis.url();
    let cmd = |args: &[&str]| tranche(&dir, &[&["--redis", &url][..], args].concat());
    let firing_redis =
        |extra: &[&str]| firing(&dir, &[&["--redis", url.as_str()][..], extra].concat());
    ok(cmd(&[
        "plan", "--min", "1", "--max", "4000", "--size", "1000",
    ]));
    // Two partitions that take their time.
    let mut run = cmd(&[
        "run",
        "--exec",
        "sleep 20",
        "--chunk",
        "1000",
        "--concurrency",
        "2",
        "--prefetch",
        "0",
        "--grace",
        "0s",
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    eventually(Duration::from_secs(30), "2 partitions running", || {
        firing_redis(&["--max-active", "1"]).contains(&"active_partitions".to_owned())
    });
    // The worker's registry entry carries its update latency once it has updated.
    eventually(Duration::from_secs(30), "a slow worker", || {
        firing_redis(&["--max-update-p99-ms", "0"]).contains(&"worker_update_p99_ms".to_owned())
    });
    // Nothing archived since the fleet started: stalled once the allowance is gone.
    eventually(Duration::from_secs(30), "stalled from the start", || {
        firing_redis(&["--max-stall", "0s"]).contains(&"stalled_minutes".to_owned())
    });
    assert!(firing_redis(&[]).is_empty());
    common::signal(&run, "INT");
    common::wait(&mut run, Duration::from_secs(30));

    // Completions with no archiver: the backlog and its age fire, then clear once an
    // archiver drains it.
    ok(cmd(&[
        "run",
        "--simulate",
        "--sim-latency",
        "0..1",
        "--no-archiver",
    ]));
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        firing_redis(&["--max-inbox", "0", "--max-archive-lag", "0s"]),
        ["archive_queue", "archive_lag_seconds"]
    );
    ok(cmd(&["archive"]));
    assert!(firing_redis(&["--max-inbox", "0", "--max-archive-lag", "0s"]).is_empty());

    // Statistics that disagree with the archive: only `--check` looks. The namespace
    // has the default 4 shards and layout 2.
    let schema = tranche_codec::KeySchema::new("tranche", 4).unwrap();
    let _: i64 = redis.query(
        redis::cmd("HINCRBY")
            .arg(schema.stats(0, "global"))
            .arg("count")
            .arg(1),
    );
    assert!(firing_redis(&[]).is_empty());
    assert_eq!(firing_redis(&["--check"]), ["statistics_consistency"]);
}

/// A record set aside as a dead letter is counted in `status` and fires `health`.
#[test]
fn dead_letters_are_counted_and_alerted() {
    let redis = TestRedis::start();
    let dir = scratch("dead-health");
    let url = redis.url();
    let cmd = |args: &[&str]| {
        tranche(
            &dir,
            &[&["--redis", &url, "--shards", "1"][..], args].concat(),
        )
    };
    ok(cmd(&[
        "plan", "--min", "1", "--max", "5000", "--size", "1000",
    ]));
    ok(cmd(&[
        "run",
        "--simulate",
        "--sim-latency",
        "0..1",
        "--no-archiver",
    ]));
    // Poison one completion in the inbox: a duration no counter can hold.
    let inbox = "{tranche:0}:inbox";
    let entries: Vec<(String, Vec<(String, String)>)> =
        redis.query(redis::cmd("XRANGE").arg(inbox).arg("-").arg("+"));
    let (id, fields) = &entries[0];
    let lines = &fields.iter().find(|(k, _)| k == "r").unwrap().1;
    let mut poisoned: Vec<String> = lines.lines().map(str::to_owned).collect();
    let at = poisoned[0].find("\"duration\":").unwrap();
    poisoned[0] = format!("{}\"duration\":10000000000000000}}", &poisoned[0][..at]);
    redis.cli(&["XDEL", inbox, id]);
    redis.cli(&["XADD", inbox, "*", "r", &poisoned.join("\n")]);
    ok(cmd(&["archive"]));
    let status: serde_json::Value = serde_json::from_str(&ok(cmd(&["status", "--json"]))).unwrap();
    assert_eq!(status["dead_letters"], 1, "{status}");
    let out = output(cmd(&["health"]));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("dead_letters"));
}

/// `check --repair` re-drives the dead letters through the archive path: one
/// archivable now is archived and counted once however often the repair runs (its
/// poisoned copy before it in the stream is refused, then dropped as a duplicate), one
/// of a pid archived already is dropped; a poisoned one, one of no plan and one never
/// completed are kept with their reasons.
#[test]
fn check_repair_redrives_dead_letters() {
    let redis = TestRedis::start();
    let dir = scratch("dead-repair");
    let url = redis.url();
    let cmd = |args: &[&str]| {
        tranche(
            &dir,
            &[&["--redis", &url, "--shards", "1"][..], args].concat(),
        )
    };
    ok(cmd(&[
        "plan", "--min", "1", "--max", "5000", "--size", "1000",
    ]));
    ok(cmd(&[
        "run",
        "--simulate",
        "--sim-latency",
        "0..1",
        "--no-archiver",
    ]));
    // Pid 6 is planned but never run: its completed-index bit is clear.
    ok(cmd(&[
        "plan", "--min", "5001", "--max", "6000", "--size", "1000",
    ]));
    let (inbox, dead) = ("{tranche:0}:inbox", "{tranche:0}:dead");
    let entries: Vec<(String, Vec<(String, String)>)> =
        redis.query(redis::cmd("XRANGE").arg(inbox).arg("-").arg("+"));
    let mut lines: Vec<String> = Vec::new();
    for (id, fields) in &entries {
        let text = &fields.iter().find(|(k, _)| k == "r").unwrap().1;
        lines.extend(text.lines().map(str::to_owned));
        redis.cli(&["XDEL", inbox, id]);
    }
    let pid_of = |line: &str| {
        serde_json::from_str::<serde_json::Value>(line).unwrap()["pid"]
            .as_u64()
            .unwrap()
    };
    let one = lines.iter().find(|l| pid_of(l) == 1).unwrap().clone();
    let two = lines.iter().find(|l| pid_of(l) == 2).unwrap().clone();
    let three = lines.iter().find(|l| pid_of(l) == 3).unwrap().clone();
    // Pid 1's and 3's completions never reached the archive but as dead letters.
    let rest: Vec<&str> = lines
        .iter()
        .filter(|l| ![1, 3].contains(&pid_of(l)))
        .map(String::as_str)
        .collect();
    redis.cli(&["XADD", inbox, "*", "r", &rest.join("\n")]);
    ok(cmd(&["archive"]));
    let poison = |line: &str| {
        let at = line.find("\"duration\":").unwrap();
        format!("{}\"duration\":10000000000000000}}", &line[..at])
    };
    let poisoned = poison(&one);
    let unplanned = one.replacen("\"pid\":1,", "\"pid\":999,", 1);
    let never = one.replacen("\"pid\":1,", "\"pid\":6,", 1);
    for line in [&poisoned, &two, &unplanned, &never, &one, &poison(&three)] {
        redis.cli(&[
            "XADD",
            dead,
            "*",
            "r",
            line,
            "reason",
            "set aside by the test",
        ]);
    }

    let repair = |args: &[&str]| -> serde_json::Value {
        serde_json::from_str(&ok(cmd(&[&["check", "--json"][..], args].concat()))).unwrap()
    };
    let v = repair(&["--repair"]);
    let letters = &v["dead_letters"];
    // Pid 1's poisoned copy is refused, its good one archived after it: the poisoned
    // one is then a duplicate. Pid 2 was archived before.
    assert_eq!(
        (
            &letters["found"],
            &letters["archived"],
            &letters["duplicates"],
            &letters["kept"]
        ),
        (&6.into(), &1.into(), &2.into(), &3.into()),
        "{v}"
    );
    let reasons: Vec<&str> = letters["kept_letters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["reason"].as_str().unwrap())
        .collect();
    assert_eq!(reasons.len(), 3, "{v}");
    for needle in [
        "a delta counter reached",
        "pid 999 is in no plan",
        "never completed here",
    ] {
        assert!(
            reasons.iter().any(|r| r.contains(needle)),
            "{needle}: {reasons:?}"
        );
    }
    assert_eq!(v["differences"], serde_json::json!([]), "{v}");
    let kept: u64 = redis.query(redis::cmd("XLEN").arg(dead));
    assert_eq!(kept, 3);

    // Counted once: four archived (pid 3's only record is poisoned), the statistics
    // agree, and a second repair archives nothing again.
    let status: serde_json::Value = serde_json::from_str(&ok(cmd(&["status", "--json"]))).unwrap();
    assert_eq!(status["archived"], 4, "{status}");
    assert_eq!(status["dead_letters"], 3, "{status}");
    let v = repair(&["--repair"]);
    let letters = &v["dead_letters"];
    assert_eq!(
        (
            &letters["found"],
            &letters["archived"],
            &letters["duplicates"],
            &letters["kept"]
        ),
        (&3.into(), &0.into(), &0.into(), &3.into()),
        "{v}"
    );
    let v = repair(&[]);
    assert_eq!(v["records"], 4, "{v}");
    assert_eq!(v["differences"], serde_json::json!([]), "{v}");
    assert_eq!(v["dead_letters"], serde_json::json!({"found": 3}), "{v}");
    let human = ok(cmd(&["check", "--repair"]));
    assert!(
        human.contains("dead letters: 3 found, 0 archived now, 0 duplicate(s) dropped, 3 kept"),
        "{human}"
    );
    assert!(human.contains("pid 999 is in no plan"), "{human}");
}

/// `list` pages through the partitions of one state, on both backends: every failed
/// partition exactly once across pages, with its worker, attempt and last error; the
/// archived ones through the archive; a worker filter; JSON with the next cursor.
fn list_pages_by_state(cmd: &dyn Fn(&[&str]) -> std::process::Command) {
    ok(cmd(&[
        "plan", "--min", "1", "--max", "30000", "--size", "1000",
    ]));
    let out = output(cmd(&[
        "run",
        "--simulate",
        "--sim-latency",
        "0..1",
        "--sim-fail",
        "0.1",
        "--max-attempts",
        "1",
        "--worker-id",
        "w-list",
    ]));
    assert!(matches!(out.status.code(), Some(0 | 1)));
    let status: serde_json::Value = serde_json::from_str(&ok(cmd(&["status", "--json"]))).unwrap();
    let (failed, archived) = (
        status["failed"].as_u64().unwrap(),
        status["archived"].as_u64().unwrap(),
    );
    assert_eq!(failed + archived, 30, "{status}");
    assert!(
        failed >= 2 && archived >= 2,
        "{status}: the test needs both"
    );

    let mut seen = Vec::new();
    for (state, total) in [("failed", failed), ("archived", archived)] {
        let mut after = 0u64;
        let mut pids = Vec::new();
        loop {
            let page: serde_json::Value = serde_json::from_str(&ok(cmd(&[
                "list",
                state,
                "--limit",
                "2",
                "--after",
                &after.to_string(),
                "--json",
            ])))
            .unwrap();
            for p in page["partitions"].as_array().unwrap() {
                assert_eq!(p["worker"], "w-list", "{p}");
                if state == "failed" {
                    assert_eq!(
                        (p["status"].as_str(), p["attempt"].as_u64()),
                        (Some("failed"), Some(1))
                    );
                    assert!(
                        p["last_error"]
                            .as_str()
                            .unwrap()
                            .contains("simulated failure"),
                        "{p}"
                    );
                } else {
                    assert_eq!(p["layer"], "archive", "{p}");
                }
                pids.push(p["pid"].as_u64().unwrap());
            }
            match page["next"].as_u64() {
                Some(next) => after = next,
                None => break,
            }
        }
        assert_eq!(pids.len() as u64, total, "{state}: {pids:?}");
        assert!(pids.windows(2).all(|w| w[0] < w[1]), "{state}: {pids:?}");
        seen.extend(pids);
    }
    seen.sort_unstable();
    assert_eq!(seen, (1..=30).collect::<Vec<u64>>());
    assert_eq!(ok(cmd(&["list", "--worker", "nobody"])), "no partitions\n");
    let table = ok(cmd(&["list", "failed", "--limit", "1"]));
    assert!(
        table.contains("error: simulated failure") && table.contains("more: --after"),
        "{table}"
    );
}

#[test]
fn list_pages_by_state_embedded() {
    let dir = scratch("list-embedded");
    list_pages_by_state(&|args| tranche(&dir, args));
}

#[test]
fn list_pages_by_state_on_redis() {
    let redis = TestRedis::start();
    let dir = scratch("list-redis");
    let url = redis.url();
    list_pages_by_state(&|args| tranche(&dir, &[&["--redis", &url][..], args].concat()));
}

/// A discarded partition says so for ever: `get` answers discarded (not completed),
/// `status` counts it on its own, `list` finds it, nothing archives it, `check` agrees.
fn discard_is_final_and_visible(cmd: &dyn Fn(&[&str]) -> std::process::Command) {
    ok(cmd(&[
        "plan", "--min", "1", "--max", "5000", "--size", "1000",
    ]));
    let out = output(cmd(&[
        "run",
        "--simulate",
        "--sim-latency",
        "0..1",
        "--sim-fail",
        "1",
        "--max-attempts",
        "1",
    ]));
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(ok(cmd(&["discard", "3"])).trim(), "partition 3 discarded");
    let get: serde_json::Value = serde_json::from_str(&ok(cmd(&["get", "3", "--json"]))).unwrap();
    assert_eq!(get["status"], "discarded", "{get}");
    assert!(ok(cmd(&["get", "3"])).contains("status     discarded"));
    ok(cmd(&["retry-failed"]));
    ok(cmd(&["run", "--simulate", "--sim-latency", "0..1"]));
    let status: serde_json::Value = serde_json::from_str(&ok(cmd(&["status", "--json"]))).unwrap();
    assert_eq!(
        (
            &status["discarded"],
            &status["archived"],
            &status["finished"],
            &status["failed"]
        ),
        (&1.into(), &4.into(), &4.into(), &0.into()),
        "{status}"
    );
    let stats: serde_json::Value = serde_json::from_str(&ok(cmd(&["stats", "--json"]))).unwrap();
    assert_eq!(
        stats["completed"]["global_stats"]["total_completed"], 4,
        "{stats}"
    );
    let listed = ok(cmd(&["list", "discarded", "--json"]));
    assert!(
        listed.contains("\"pid\":3") && listed.contains("\"status\":\"discarded\""),
        "{listed}"
    );
    let get: serde_json::Value = serde_json::from_str(&ok(cmd(&["get", "3", "--json"]))).unwrap();
    assert_eq!(get["status"], "discarded", "{get}");
    assert!(ok(cmd(&["check"])).contains("consistent"));
}

#[test]
fn discard_is_final_and_visible_embedded() {
    let dir = scratch("discard-embedded");
    discard_is_final_and_visible(&|args| tranche(&dir, args));
}

#[test]
fn discard_is_final_and_visible_on_redis() {
    let redis = TestRedis::start();
    let dir = scratch("discard-redis");
    let url = redis.url();
    discard_is_final_and_visible(&|args| tranche(&dir, &[&["--redis", &url][..], args].concat()));
}

/// A command that cannot run (exit 127 not found, 126 not executable) stops the run at
/// once with one line, spending no attempt; a command that fails is retried with INFO
/// lines and a WARN only when the partition ends failed; --sim-fail needs --simulate.
#[test]
fn a_broken_command_fails_fast_and_retries_say_so() {
    let dir = scratch("fail-fast");
    ok(tranche(
        &dir,
        &["plan", "--min", "1", "--max", "30000", "--size", "1000"],
    ));
    let not_executable = dir.join("not-executable.sh");
    std::fs::write(&not_executable, "#!/bin/sh\nexit 0\n").unwrap();
    for (cmd, code) in [
        ("/nonexistent/process.sh", 127),
        (not_executable.to_str().unwrap(), 126),
    ] {
        let started = std::time::Instant::now();
        let out = output(tranche(&dir, &["run", "--exec", cmd, "--concurrency", "4"]));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        let last = stderr.lines().last().unwrap();
        assert!(
            last.starts_with("tranche: ")
                && last.contains(&format!("cannot run: exit status {code}")),
            "{stderr}"
        );
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        let status: serde_json::Value =
            serde_json::from_str(&ok(tranche(&dir, &["status", "--json"]))).unwrap();
        assert_eq!(
            (&status["failed"], &status["archived"]),
            (&0.into(), &0.into()),
            "{status}"
        );
        // The attempt was given back.
        let listed = ok(tranche(&dir, &["list", "pending", "--json"]));
        let page: serde_json::Value = serde_json::from_str(&listed).unwrap();
        assert!(
            page["partitions"]
                .as_array()
                .unwrap()
                .iter()
                .all(|p| p["attempt"] == 0),
            "{listed}"
        );
    }

    let failing = dir.join("failing.sh");
    std::fs::write(&failing, "#!/bin/sh\necho disk full >&2\nexit 3\n").unwrap();
    std::fs::set_permissions(
        &failing,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let mut retrying = tranche(
        &dir,
        &[
            "run",
            "--exec",
            failing.to_str().unwrap(),
            "--max-attempts",
            "2",
            "--backoff",
            "10ms",
            "--concurrency",
            "1",
        ],
    );
    retrying.env("RUST_LOG", "info");
    let out = output(retrying);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let retry = stderr
        .lines()
        .find(|l| l.contains("attempt 1 of 2 failed, retrying in"))
        .expect(&stderr);
    assert!(
        retry.contains("INFO") && retry.contains("disk full"),
        "{retry}"
    );
    let last = stderr
        .lines()
        .find(|l| l.contains("partition failed after 2 attempt(s)"))
        .expect(&stderr);
    assert!(last.contains("WARN"), "{last}");
    assert!(
        !stderr
            .lines()
            .any(|l| l.contains("WARN") && l.contains("attempt 1 of")),
        "{stderr}"
    );

    fails(
        &dir,
        &["run", "--exec", "true", "--sim-fail", "0.5"],
        2,
        "only shape --simulate",
    );
}

/// `-o -` writes the dump to stdout (the summary to stderr), a missing directory is an
/// error rather than a new tree, and rediss:// against a plain server says why it waits.
#[test]
fn export_targets_and_connection_errors() {
    let dir = scratch("export-targets");
    ok(tranche(
        &dir,
        &["plan", "--min", "1", "--max", "5000", "--size", "1000"],
    ));
    ok(tranche(
        &dir,
        &["run", "--simulate", "--sim-latency", "0..1"],
    ));
    let out = output(tranche(&dir, &["export", "-o", "-"]));
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let reported: usize = stderr
        .split('(')
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{stderr}"));
    assert_eq!(out.stdout.len(), reported, "{stderr}");
    assert!(!dir.join("-").exists(), "a file named - was written");
    let to = dir.join("no-such-dir").join("x.dump");
    fails(
        &dir,
        &["export", "-o", to.to_str().unwrap()],
        2,
        "does not exist",
    );
    assert!(!dir.join("no-such-dir").exists());

    let plain = TestRedis::start();
    let url = format!("rediss://127.0.0.1:{}", plain.port());
    fails(
        &dir,
        &["--redis", &url, "status"],
        2,
        "needs a server speaking TLS",
    );
}

/// `pause` holds every worker of a namespace off (a run started paused claims nothing
/// and waits), `resume` lets it finish; `plans` and `namespaces` list what is there;
/// `drop` needs --yes, refuses while a worker lives, and deletes every key.
#[test]
fn pause_resume_plans_namespaces_drop_on_redis() {
    let redis = TestRedis::start();
    let dir = scratch("namespace-ops");
    let url = redis.url();
    let cmd = |args: &[&str]| tranche(&dir, &[&["--redis", &url][..], args].concat());
    ok(cmd(&[
        "plan", "--min", "1", "--max", "10000", "--size", "1000",
    ]));
    ok(cmd(&[
        "--namespace",
        "other",
        "plan",
        "--min",
        "1",
        "--max",
        "5000",
        "--shards",
        "2",
    ]));
    let plans: serde_json::Value = serde_json::from_str(&ok(cmd(&["plans", "--json"]))).unwrap();
    assert_eq!(plans[0]["partitions"], 10, "{plans}");
    assert_eq!(
        (&plans[0]["min_id"], &plans[0]["kind"]),
        (&1.into(), &"uniform".into())
    );
    let spaces: serde_json::Value =
        serde_json::from_str(&ok(cmd(&["namespaces", "--json"]))).unwrap();
    let names: Vec<&str> = spaces
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["namespace"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["other", "tranche"], "{spaces}");

    assert!(ok(cmd(&["pause"])).contains("paused"));
    let status: serde_json::Value = serde_json::from_str(&ok(cmd(&["status", "--json"]))).unwrap();
    assert_eq!(status["paused"], true);
    let mut run = cmd(&[
        "run",
        "--simulate",
        "--sim-latency",
        "0..1",
        "--worker-id",
        "paused-run",
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    eventually(
        Duration::from_secs(20),
        "the paused run registering",
        || ok(cmd(&["workers"])).contains("paused-run"),
    );
    std::thread::sleep(Duration::from_millis(1500));
    let status: serde_json::Value = serde_json::from_str(&ok(cmd(&["status", "--json"]))).unwrap();
    assert_eq!(
        (&status["archived"], &status["claimed"]),
        (&0.into(), &0.into()),
        "{status}"
    );
    assert!(run.try_wait().unwrap().is_none(), "a paused run waits");
    fails(&dir, &["--redis", &url, "drop"], 2, "pass --yes");
    fails(
        &dir,
        &["--redis", &url, "drop", "--yes"],
        2,
        "live worker(s) (paused-run)",
    );
    ok(cmd(&["resume"]));
    let exit = common::wait(&mut run, Duration::from_secs(60));
    assert!(exit.success());
    let status: serde_json::Value = serde_json::from_str(&ok(cmd(&["status", "--json"]))).unwrap();
    assert_eq!(
        (&status["archived"], &status["paused"]),
        (&10.into(), &false.into()),
        "{status}"
    );

    assert!(ok(cmd(&["drop", "--yes"])).contains("dropped"));
    let keys: Vec<String> = redis.query(redis::cmd("KEYS").arg("{tranche*"));
    assert!(keys.is_empty(), "left behind: {keys:?}");
    let spaces = ok(cmd(&["namespaces", "--json"]));
    assert!(
        spaces.contains("other") && !spaces.contains("\"tranche\""),
        "{spaces}"
    );
    assert!(
        redis.cli(&["KEYS", "{other*"]).contains("other"),
        "drop touched another namespace"
    );
}

/// Embedded: pause is refused (one process at a time), drop removes the state file.
#[test]
fn namespace_ops_embedded() {
    let dir = scratch("namespace-embedded");
    ok(tranche(&dir, &["plan", "--min", "1", "--max", "3000"]));
    fails(&dir, &["pause"], 2, "need --redis");
    assert!(ok(tranche(&dir, &["namespaces"])).contains("tranche"));
    ok(tranche(&dir, &["drop", "--yes"]));
    assert!(!dir.join(".tranche/tranche.state").exists());
    fails(&dir, &["status"], 2, "has no state file");
}

/// With --json, failures are JSON too: one `{"error": {"kind", "message"}}` line on
/// stderr, the exit code unchanged; `status --watch --json` is one object per line.
#[test]
fn json_errors_and_watch() {
    let dir = scratch("json-errors");
    for (args, code, kind) in [
        (&["--json", "get", "abc"][..], 2, "usage"),
        (
            &["--json", "--redis", "redis://127.0.0.1:1", "status"],
            2,
            "error",
        ),
        (&["--json", "status"], 2, "error"),
    ] {
        let out = output(tranche(&dir, args));
        assert_eq!(out.status.code(), Some(code), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let v: serde_json::Value = serde_json::from_str(stderr.trim())
            .unwrap_or_else(|e| panic!("{args:?}: not one JSON object ({e}): {stderr}"));
        assert_eq!(v["error"]["kind"], kind, "{v}");
        assert!(!v["error"]["message"].as_str().unwrap().is_empty());
    }
    ok(tranche(&dir, &["plan", "--min", "1", "--max", "3000"]));
    let watch = tranche(
        &dir,
        &["status", "--watch", "--json", "--interval", "200ms"],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    std::thread::sleep(Duration::from_millis(900));
    common::signal(&watch, "INT");
    let out = watch.wait_with_output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() >= 2, "{text:?}");
    for l in lines {
        let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}"));
        assert_eq!(v["partitions"], 3);
    }
}

/// A record that no script can read is beyond `discard`; `discard --force` replaces it
/// with a discarded one, and the job goes on and ends consistent.
#[test]
fn discard_force_removes_a_corrupt_record() {
    let redis = TestRedis::start();
    let dir = scratch("discard-force");
    let url = redis.url();
    let cmd = |args: &[&str]| {
        tranche(
            &dir,
            &[&["--redis", &url, "--shards", "1"][..], args].concat(),
        )
    };
    ok(cmd(&[
        "plan", "--min", "1", "--max", "10000", "--size", "1000",
    ]));
    let out = output(cmd(&[
        "run",
        "--simulate",
        "--sim-latency",
        "0..1",
        "--sim-fail",
        "1",
        "--max-attempts",
        "1",
    ]));
    assert_eq!(out.status.code(), Some(1));
    ok(cmd(&["retry-failed"]));
    let active = "{tranche:0}:active";
    redis.cli(&["HSET", active, "4", "garbage"]);
    fails(
        &dir,
        &["--redis", &url, "discard", "4"],
        2,
        "nothing discarded",
    );
    fails(
        &dir,
        &["--redis", &url, "discard", "99", "--force"],
        2,
        "no plan has partition 99",
    );
    assert!(ok(cmd(&["discard", "4", "--force"])).contains("discarded"));
    let get: serde_json::Value = serde_json::from_str(&ok(cmd(&["get", "4", "--json"]))).unwrap();
    assert_eq!(get["status"], "discarded", "{get}");
    ok(cmd(&["run", "--simulate", "--sim-latency", "0..1"]));
    let status: serde_json::Value = serde_json::from_str(&ok(cmd(&["status", "--json"]))).unwrap();
    assert_eq!(
        (&status["archived"], &status["discarded"]),
        (&9.into(), &1.into()),
        "{status}"
    );
    assert!(ok(cmd(&["check"])).contains("consistent"));
    fails(
        &dir,
        &["--redis", &url, "discard", "5", "--force"],
        2,
        "is completed",
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

/// A started partition shows as running within a second or two, not at the first
/// regular heartbeat (lease / 3, 10 s by default).
#[test]
fn started_partitions_show_as_running_at_once() {
    let redis = TestRedis::start();
    let dir = scratch("running-at-once");
    let url = redis.url();
    ok(tranche(
        &dir,
        &[
            "--redis", &url, "plan", "--min", "1", "--max", "4000", "--size", "1000",
        ],
    ));
    let mut run = tranche(
        &dir,
        &[
            "--redis",
            &url,
            "run",
            "--exec",
            "sleep 8",
            "--chunk",
            "1000",
            "--concurrency",
            "2",
            "--prefetch",
            "0",
            "--grace",
            "0s",
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let started = std::time::Instant::now();
    eventually(Duration::from_secs(6), "2 partitions running", || {
        let status: serde_json::Value =
            serde_json::from_str(&ok(tranche(&dir, &["--redis", &url, "status", "--json"])))
                .unwrap();
        status["running"] == 2
    });
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "running only after {:?}",
        started.elapsed()
    );
    // A drain with no grace stops the chunks' process groups too.
    common::signal(&run, "INT");
    common::wait(&mut run, Duration::from_secs(30));
}

/// A namespace planned by a version that recorded no key layout (`{ns}:meta` with
/// `shards` only) keeps the plain shard tags `{ns:s}` for ever, through plans, runs and
/// the archive; a new one records layout 2 and its spread tags; a layout this version
/// does not know is refused before anything is written.
#[test]
fn a_namespace_keeps_the_key_layout_it_was_planned_with() {
    let redis = TestRedis::start();
    let dir = scratch("key-layout");
    let url = redis.url();
    let on = |ns: &str, args: &[&str]| {
        tranche(
            &dir,
            &[&["--redis", &url, "--namespace", ns][..], args].concat(),
        )
    };
    let keys = |pattern: &str| -> Vec<String> {
        let mut keys: Vec<String> = redis.query(redis::cmd("KEYS").arg(pattern));
        keys.sort();
        keys
    };
    let plan = ["plan", "--min", "1", "--max", "1600000", "--size", "1000"];
    let run = ["run", "--simulate", "--sim-latency", "0..0"];

    // Version 1: what an older tranche left after `plan --shards 16`.
    redis.cli(&["HSET", "{old}:meta", "shards", "16"]);
    ok(on("old", &plan));
    ok(on("old", &run));
    let v1 = tranche_codec::KeySchema::new("old", 16)
        .unwrap()
        .with_layout(tranche_codec::KeyLayout::Plain);
    let spread = tranche_codec::KeySchema::new("old", 16).unwrap();
    assert_ne!(
        v1.shard_tag(5),
        spread.shard_tag(5),
        "the premise of this test"
    );
    for shard in v1.shards() {
        let tagged = keys(&format!("{}:*", v1.shard_tag(shard)));
        assert!(
            tagged.contains(&v1.completed_index(shard))
                && tagged.contains(&v1.shard_key(shard, "plans")),
            "shard {shard}: {tagged:?}"
        );
    }
    assert!(
        keys("{old:*~*}*").is_empty(),
        "no spread key beside the plain ones"
    );
    let meta: Vec<String> = redis.query(redis::cmd("HKEYS").arg("{old}:meta"));
    assert!(!meta.contains(&"layout".to_owned()), "{meta:?}");
    let status: serde_json::Value =
        serde_json::from_str(&ok(on("old", &["status", "--json"]))).unwrap();
    assert_eq!(status["archived"], 1600, "{status}");

    // A new namespace records layout 2 and uses the spread tags.
    ok(on(
        "new",
        &[
            "--shards", "16", "plan", "--min", "1", "--max", "1600", "--size", "100",
        ],
    ));
    let layout: String = redis.query(redis::cmd("HGET").arg("{new}:meta").arg("layout"));
    assert_eq!(layout, "2");
    let spread = tranche_codec::KeySchema::new("new", 16).unwrap();
    for shard in spread.shards() {
        assert_eq!(keys(&format!("{}:*", spread.shard_tag(shard))).len(), 1);
    }

    // A layout from the future: refused, nothing written.
    redis.cli(&["HSET", "{future}:meta", "shards", "4", "layout", "3"]);
    fails(
        &dir,
        &[
            "--redis",
            &url,
            "--namespace",
            "future",
            "plan",
            "--min",
            "1",
            "--max",
            "10",
        ],
        2,
        "key layout `3` is unknown",
    );
    assert_eq!(keys("{future*"), ["{future}:meta"]);
}
