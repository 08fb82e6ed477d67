//! The orchestrator's view: a worker's own `/metrics` (`run --metrics-listen`), the
//! probes `/healthz` and `/readyz` on `serve` and on a worker, and SIGTERM draining a
//! run as Ctrl-C does.

use super::*;

/// `run --metrics-listen` serves the worker's own counters while it runs.
#[test]
fn a_worker_serves_its_own_metrics() {
    let redis = TestRedis::start();
    let dir = scratch("worker-metrics");
    let url = redis.url();
    ok(tranche(
        &dir,
        &["--redis", &url, "plan", "--min", "1", "--max", "40000"],
    ));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut run = tranche(
        &dir,
        &[
            "--redis",
            &url,
            "run",
            "--simulate",
            "--sim-latency",
            "5..10",
            "--concurrency",
            "1",
            "--metrics-listen",
            &addr,
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let completed = loop {
        assert!(
            std::time::Instant::now() < deadline,
            "no metrics with progress"
        );
        if TcpStream::connect(&addr).is_ok() {
            let (code, text) = request(&addr, "GET", "/metrics", None);
            assert_eq!(code, 200);
            let lines = text
                .lines()
                .filter(|l| *l != "# EOF")
                .map(|l| Ok(l.to_owned()));
            let scrape = prometheus_parse::Scrape::parse(lines).expect("valid exposition text");
            let get = |name: &str| {
                scrape
                    .samples
                    .iter()
                    .find(|s| s.metric == name)
                    .map(|s| match s.value {
                        prometheus_parse::Value::Gauge(v)
                        | prometheus_parse::Value::Counter(v)
                        | prometheus_parse::Value::Untyped(v) => v,
                        _ => f64::NAN,
                    })
            };
            for name in [
                "tranche_worker_partitions_in_flight",
                "tranche_worker_chunks_in_flight",
                "tranche_worker_claimed_total",
                "tranche_worker_failed_attempts_total",
                "tranche_worker_released_total",
                "tranche_worker_lost_leases_total",
                "tranche_worker_store_errors_total",
                "tranche_worker_partition_duration_seconds",
            ] {
                assert!(get(name).is_some(), "{name} missing: {text}");
            }
            assert!(
                text.contains("# TYPE tranche_worker_chunk_duration_seconds histogram"),
                "{text}"
            );
            let done = get("tranche_worker_completed_total").unwrap();
            if done > 0.0 {
                break done;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(completed >= 1.0);
    let _ = run.kill();
    let _ = run.wait();
}

/// `/readyz`'s answer: the status code and the body.
fn readyz(addr: &str) -> (u16, Value) {
    let (code, body) = request(addr, "GET", "/readyz", None);
    let body = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    (code, body)
}

/// `serve`'s probes: live while it runs; ready unless the namespace is paused, an
/// operator throttled it, or Redis is gone, each named in the body; and
/// `/api/v1/health` answers 503 while a rule fires (a plan with no worker).
#[test]
fn serve_answers_the_orchestrators_probes() {
    let mut redis = TestRedis::start();
    let url = redis.url();
    let dir = scratch("serve-probes");
    let cmd = |args: &[&str]| tranche(&dir, &[&["--redis", &url][..], args].concat());
    ok(cmd(&[
        "plan", "--min", "1", "--max", "4000", "--size", "1000",
    ]));
    let server = Server::start(&dir, Some(&url), None);
    let (code, body) = server.request("GET", "/healthz", None);
    assert_eq!((code, body.as_str()), (200, r#"{"live":true}"#));
    let (code, body) = readyz(&server.addr);
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        body,
        serde_json::json!({"ready": true, "store": "ok", "draining": false, "paused": false, "throttled": null, "why": []})
    );
    // Planned, no worker: `outstanding_no_worker` fires.
    let rules = server.health();
    assert!(
        rules
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["rule"] == "outstanding_no_worker" && r["firing"] == true),
        "{rules}"
    );

    ok(cmd(&["pause"]));
    let (code, body) = readyz(&server.addr);
    assert_eq!(
        (code, &body["paused"], &body["why"]),
        (503, &Value::Bool(true), &serde_json::json!(["paused"])),
        "{body}"
    );
    ok(cmd(&["resume"]));
    ok(cmd(&["throttle", "on", "--reason", "replica rebuild"]));
    let (code, body) = readyz(&server.addr);
    assert_eq!(code, 503, "{body}");
    assert_eq!(body["throttled"], "replica rebuild");
    assert_eq!(body["why"], serde_json::json!(["throttled by an operator"]));
    ok(cmd(&["throttle", "off"]));
    assert_eq!(readyz(&server.addr).0, 200);

    // Redis gone: not ready, and saying so within the probe's timeout; still live.
    redis.kill();
    let asked = std::time::Instant::now();
    let (code, body) = readyz(&server.addr);
    assert!(
        asked.elapsed() < Duration::from_secs(10),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(code, 503, "{body}");
    assert!(
        body["store"].as_str().unwrap().starts_with("unreachable"),
        "{body}"
    );
    assert_eq!(body["why"], serde_json::json!(["store unreachable"]));
    assert_eq!(server.request("GET", "/healthz", None).0, 200);
}

/// A worker's `--metrics-listen` answers `/healthz` and `/readyz` beside `/metrics`;
/// SIGTERM drains the run as Ctrl-C does (no claim after it, the running partition
/// released, exit 130), and `/readyz` says `draining` meanwhile.
#[test]
fn a_worker_answers_probes_and_drains_on_sigterm() {
    let redis = TestRedis::start();
    let dir = scratch("worker-probes");
    let url = redis.url();
    let cmd = |args: &[&str]| tranche(&dir, &[&["--redis", &url][..], args].concat());
    ok(cmd(&["plan", "--min", "1", "--max", "40", "--size", "1"]));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let started = dir.join("started");
    let exec = format!("echo $TRANCHE_PID >> {}; sleep 6", started.display());
    let mut run = cmd(&[
        "run",
        "--exec",
        &exec,
        "--chunk",
        "1",
        "--concurrency",
        "1",
        "--grace",
        "20s",
        "--metrics-listen",
        &addr,
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    common::eventually(Duration::from_secs(30), "a chunk and the probes", || {
        std::fs::read_to_string(&started).is_ok_and(|t| !t.is_empty())
            && TcpStream::connect(&addr).is_ok()
    });
    let (code, body) = request(&addr, "GET", "/healthz", None);
    assert_eq!((code, body.as_str()), (200, r#"{"live":true}"#));
    let (code, body) = readyz(&addr);
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["ready"], true);
    ok(cmd(&["throttle", "on"]));
    let (code, body) = readyz(&addr);
    assert_eq!(
        (code, &body["why"]),
        (503, &serde_json::json!(["throttled by an operator"])),
        "{body}"
    );
    ok(cmd(&["throttle", "off"]));

    common::signal(&run, "TERM");
    // The server stays up until the running chunk has finished.
    common::eventually(Duration::from_secs(5), "readyz to say draining", || {
        TcpStream::connect(&addr).is_ok() && {
            let (code, body) = readyz(&addr);
            code == 503 && body["why"] == serde_json::json!(["draining"])
        }
    });
    let exit = common::wait(&mut run, Duration::from_secs(30));
    assert_eq!(exit.code(), Some(130), "SIGTERM ends a run as Ctrl-C does");
    let claimed = std::fs::read_to_string(&started).unwrap();
    assert_eq!(
        claimed.lines().count(),
        1,
        "no claim after SIGTERM: {claimed}"
    );
    let status: Value = serde_json::from_str(&ok(cmd(&["--json", "status"]))).unwrap();
    assert_eq!(
        status["finished"], 1,
        "the running chunk finished: {status}"
    );
    assert_eq!(
        status["claimed"].as_u64().unwrap() + status["running"].as_u64().unwrap(),
        0,
        "{status}"
    );
}
