//! Reaching Redis: passwords in the URL, a password file and TLS, the shipped ACL users,
//! and a claim Redis refuses.

use super::*;

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
