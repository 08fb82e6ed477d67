//! The control gate fails closed (issue 37): with a probe configured no chunk starts
//! before a probe result is in force, a probe whose input is missing, late, oversized
//! or corrupt throttles, a corrupt control record is read value by value (a WARN, the
//! worker's own option, `status`, `serve`, `/metrics`, `health`, `check --repair`),
//! `--keep-below` at start leaves a newer operator change alone, the flags are bounded
//! at parse time, probes get the chunks' scrubbed environment, and `serve` beyond
//! localhost needs a token to read.
//!
//! Each case on a private redis-server, and embedded where the namespace's record can
//! be reached there (an embedded record lives inside its one worker's process, so the
//! cases that write it from outside are Redis only).

use crate::common;
use crate::support;

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{eventually, ok, output, scratch, signal, tranche, wait};
use support::TestRedis;

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// A namespace `ctl` on a private Redis (`url`) or in a state file.
struct Job {
    dir: PathBuf,
    url: Option<String>,
}

impl Job {
    fn new(name: &str, redis: Option<&TestRedis>) -> Self {
        Self {
            dir: scratch(name),
            url: redis.map(TestRedis::url),
        }
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = tranche(&self.dir, args);
        c.env("TRANCHE_NAMESPACE", "ctl");
        match &self.url {
            Some(url) => c.env("TRANCHE_REDIS_URL", url),
            None => c.env("TRANCHE_STATE", self.dir.join("state")),
        };
        c
    }

    fn ledger(&self) -> PathBuf {
        self.dir.join("ledger")
    }

    /// Chunk start times (ns) from the ledger.
    fn starts(&self) -> Vec<u128> {
        std::fs::read_to_string(self.ledger())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_whitespace().next()?.parse().ok())
            .collect()
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.join("stderr")).unwrap_or_default()
    }

    /// `run --exec` writing each chunk's start to the ledger, with `extra`.
    fn spawn(&self, extra: &[&str]) -> Running {
        let exec = format!(
            "echo \"$(date +%s%N) $TRANCHE_FROM\" >> {} && sleep 0.01",
            self.ledger().display()
        );
        let mut args = vec!["run", "--exec", &exec, "--lease", "2s", "--json"];
        args.extend_from_slice(extra);
        let stderr = std::fs::File::create(self.dir.join("stderr")).unwrap();
        self.cmd(&args)
            .env("TRANCHE_ADMIN_TOKEN", "s3cret-admin")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .map(Running)
            .expect("spawn run")
    }

    /// A probe script in the job's directory.
    fn script(&self, name: &str, body: &str) -> String {
        let path = self.dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        format!("sh {}", path.display())
    }
}

/// A `tranche` child killed when the test ends.
struct Running(Child);

impl std::ops::Deref for Running {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Running {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Stops `run` with SIGTERM and waits for it.
fn stop(mut run: Running) {
    signal(&run, "TERM");
    wait(&mut run, Duration::from_secs(30));
}

/// Runs `run` to its end and returns its `--json` summary.
fn finish(mut run: Running, limit: Duration) -> serde_json::Value {
    let status = wait(&mut run, limit);
    let mut out = String::new();
    run.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    assert!(status.success(), "run failed ({status:?}): {out}");
    serde_json::from_str(out.trim()).expect("run --json")
}

/// A job that starts throttled by `probe` runs no chunk for `hold`, then runs once the
/// probe says go (the file `go` exists).
fn starts_throttled(redis: Option<&TestRedis>, name: &str, probe_body: &str, reason: &str) {
    let job = Job::new(name, redis);
    ok(job.cmd(&["plan", "--min", "1", "--max", "20000", "--size", "1000"]));
    let go = job.dir.join("go");
    let probe = job.script(
        "probe.sh",
        &format!("if [ -f {} ]; then exit 0; fi\n{probe_body}", go.display()),
    );
    let run = job.spawn(&[
        "--throttle-exec",
        &probe,
        "--throttle-interval",
        "200ms",
        "--concurrency",
        "4",
    ]);
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(
        job.starts(),
        Vec::<u128>::new(),
        "no chunk may start while the probe throttles from the start: {}",
        job.stderr()
    );
    assert!(
        job.stderr().contains(reason),
        "the hold is logged with its reason ({reason}): {}",
        job.stderr()
    );
    std::fs::write(&go, "").unwrap();
    let report = finish(run, Duration::from_secs(90));
    assert_eq!(report["namespace"]["outstanding"], 0, "{report}");
    assert_eq!(job.starts().len(), 200);
}

/// The reproduction of issue 37: a probe that says `replica lag 9s` and exits 1.
const LAGGING: &str = "echo 'replica lag 9s'; exit 1";
/// A probe whose reason is 600 bytes: throttles, cut and marked.
const OVERSIZED: &str = "head -c 600 /dev/zero | tr '\\0' x; echo; exit 1";
/// A probe that is not there.
const MISSING: &str = "exec /nonexistent/probe";
/// A probe that prints bytes that are no reason and exits with neither 0 nor 1.
const CORRUPT: &str = "printf '\\377\\376\\000garbage'; exit 7";

#[test]
fn a_job_that_starts_throttled_runs_nothing_on_redis() {
    let redis = TestRedis::start();
    starts_throttled(Some(&redis), "fs-lag-redis", LAGGING, "replica lag 9s");
}

#[test]
fn a_job_that_starts_throttled_runs_nothing_embedded() {
    starts_throttled(None, "fs-lag-embedded", LAGGING, "replica lag 9s");
}

#[test]
fn an_oversized_probe_reason_throttles_on_redis() {
    let redis = TestRedis::start();
    starts_throttled(Some(&redis), "fs-big-redis", OVERSIZED, "(truncated)");
}

#[test]
fn an_oversized_probe_reason_throttles_embedded() {
    starts_throttled(None, "fs-big-embedded", OVERSIZED, "(truncated)");
}

#[test]
fn a_missing_probe_throttles_on_redis() {
    let redis = TestRedis::start();
    starts_throttled(
        Some(&redis),
        "fs-missing-redis",
        MISSING,
        "probe exited 127",
    );
}

#[test]
fn a_missing_probe_throttles_embedded() {
    starts_throttled(None, "fs-missing-embedded", MISSING, "probe exited 127");
}

#[test]
fn a_corrupt_probe_answer_throttles_on_redis() {
    let redis = TestRedis::start();
    starts_throttled(Some(&redis), "fs-corrupt-redis", CORRUPT, "probe exited 7");
}

#[test]
fn a_corrupt_probe_answer_throttles_embedded() {
    starts_throttled(None, "fs-corrupt-embedded", CORRUPT, "probe exited 7");
}

/// A probe whose first answer is late (a go after 2 s): no chunk starts before it.
fn late_first_answer(redis: Option<&TestRedis>, name: &str) {
    let job = Job::new(name, redis);
    ok(job.cmd(&["plan", "--min", "1", "--max", "2000", "--size", "1000"]));
    let probe = job.script("probe.sh", "sleep 2; exit 0");
    let started = now_ns();
    let run = job.spawn(&["--throttle-exec", &probe, "--throttle-interval", "3s"]);
    let report = finish(run, Duration::from_secs(90));
    assert_eq!(report["namespace"]["outstanding"], 0, "{report}");
    let first = job.starts().into_iter().min().expect("chunks ran");
    let after = (first - started) as f64 / 1e9;
    assert!(
        after >= 2.0,
        "the first chunk started {after:.2} s after the run, before the probe's first answer"
    );
}

#[test]
fn no_chunk_before_a_late_first_probe_answer_on_redis() {
    let redis = TestRedis::start();
    late_first_answer(Some(&redis), "fs-late-redis");
}

#[test]
fn no_chunk_before_a_late_first_probe_answer_embedded() {
    late_first_answer(None, "fs-late-embedded");
}

/// Writes `{ns}:control` by hand, as any Redis writer (or a flipped byte) could.
fn put_record(redis: &TestRedis, json: &str) {
    redis.cli(&["SET", "{ctl}:control", json]);
}

/// A record with `chunk: 0` and `parallel: 2^32 - 1` is read value by value: each is
/// logged with a WARN naming it, the worker's own options apply, every partition
/// completes; `status`, `serve` and `/metrics` show the values; `health` fires
/// `control_record_invalid`; `check` lists them and `check --repair` restores a valid
/// record.
#[test]
fn a_corrupt_control_record_is_ignored_value_by_value() {
    let redis = TestRedis::start();
    let job = Job::new("fs-record", Some(&redis));
    ok(job.cmd(&["plan", "--min", "1", "--max", "20000", "--size", "1000"]));
    ok(job.cmd(&["set", "--concurrency", "3"]));
    put_record(
        &redis,
        r#"{"version":7,"settings":{"chunk":0,"parallel":4294967295,"concurrency":3}}"#,
    );
    let run = job.spawn(&["--chunk", "500", "--parallel", "2"]);
    let report = finish(run, Duration::from_secs(90));
    assert_eq!(report["namespace"]["outstanding"], 0, "{report}");
    assert_eq!(job.starts().len(), 40, "chunks of the worker's own 500 IDs");
    let stderr = job.stderr();
    assert!(!stderr.contains("panicked"), "{stderr}");
    for key in ["settings.chunk", "settings.parallel"] {
        assert!(
            stderr.contains(&format!("{key} = ")) && stderr.contains("WARN"),
            "a WARN names {key}: {stderr}"
        );
    }

    let status = ok(job.cmd(&["status"]));
    assert!(
        status.contains("ignored (invalid): settings.chunk = 0"),
        "{status}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&ok(job.cmd(&["status", "--json"]))).expect("status --json");
    let rejected = json["control"]["rejected"].as_array().unwrap();
    assert_eq!(rejected.len(), 2, "{json}");
    assert_eq!(
        json["control"]["settings"]["concurrency"], 3,
        "the valid value stays"
    );

    assert_eq!(health_rule(&job, "control_record_invalid")["firing"], true);

    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let serve = job
        .cmd(&["serve", "--listen", &listen])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(Running)
        .unwrap();
    let metrics = eventually_get(port, "/metrics", None);
    assert!(
        metrics.contains("control_record_invalid_values 2"),
        "{metrics}"
    );
    let body = eventually_get(port, "/api/v1/status", None);
    let api: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(api["control"]["rejected"].as_array().unwrap().len(), 2);
    drop(serve);

    let out = output(job.cmd(&["check"]));
    assert_eq!(out.status.code(), Some(1), "check lists the record");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("control_record.settings.chunk"), "{text}");
    ok(job.cmd(&["check", "--repair"]));
    assert!(!redis.cli(&["GET", "{ctl}:control:quarantine"]).is_empty());
    let json: serde_json::Value =
        serde_json::from_str(&ok(job.cmd(&["status", "--json"]))).expect("status --json");
    assert_eq!(json["control"]["rejected"], serde_json::json!([]), "{json}");
    assert_eq!(json["control"]["settings"]["concurrency"], 3);
    assert_eq!(health_rule(&job, "control_record_invalid")["firing"], false);
    ok(job.cmd(&["set", "--chunk", "100"]));
}

/// `health --json`'s reading of `rule`.
fn health_rule(job: &Job, rule: &str) -> serde_json::Value {
    let out = output(job.cmd(&["health", "--json"]));
    let rules: serde_json::Value = serde_json::from_slice(&out.stdout).expect("health --json");
    rules
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["rule"] == rule)
        .unwrap_or_else(|| panic!("no rule {rule}: {rules}"))
        .clone()
}

/// A record that is not JSON at all (a flipped byte) throttles until it is repaired:
/// a throttle that cannot be read still throttles, `check` lists it, and `throttle off`
/// replaces it.
#[test]
fn a_record_that_is_not_json_throttles_until_repaired() {
    let redis = TestRedis::start();
    let job = Job::new("fs-garbled", Some(&redis));
    ok(job.cmd(&["plan", "--min", "1", "--max", "2000", "--size", "1000"]));
    put_record(&redis, "{\"version\":3,\"manual\":{\"reason\":\"vac");
    let run = job.spawn(&[]);
    std::thread::sleep(Duration::from_secs(3));
    assert!(job.starts().is_empty(), "{}", job.stderr());
    let status = ok(job.cmd(&["status"]));
    assert!(status.contains("throttled"), "{status}");
    let out = output(job.cmd(&["check"]));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("control_record.record"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // A `throttle` (or `set`) is not refused by a corrupt record: it replaces it.
    ok(job.cmd(&["throttle", "off"]));
    let report = finish(run, Duration::from_secs(60));
    assert_eq!(report["namespace"]["outstanding"], 0, "{report}");
}

/// A restarted worker's `--keep-below` never overwrites an operator's later `set`.
#[test]
fn keep_below_at_start_leaves_a_newer_operator_change_alone() {
    let redis = TestRedis::start();
    let job = Job::new("fs-keep", Some(&redis));
    ok(job.cmd(&["plan", "--min", "1", "--max", "2000000", "--size", "1000"]));
    let probe = job.script("probe.sh", "echo 10");
    let args = [
        "--throttle-exec",
        &probe,
        "--keep-below",
        "50",
        "--max-rate",
        "1000",
    ];
    let show = || -> serde_json::Value {
        serde_json::from_str(&ok(job.cmd(&["control", "show", "--json"]))).unwrap()
    };
    let run = job.spawn(&args);
    eventually(Duration::from_secs(20), "keep_below written", || {
        show()["settings"]["keep_below"] == 50.0
    });
    stop(run);
    ok(job.cmd(&["set", "--keep-below", "none"]));
    let run = job.spawn(&args);
    eventually(Duration::from_secs(20), "the restarted worker runs", || {
        !job.starts().is_empty()
    });
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        show()["settings"]["keep_below"],
        serde_json::Value::Null,
        "the operator's none stays: {}",
        job.stderr()
    );
    stop(run);
    // A later start with nothing newer from an operator writes it again.
    ok(job.cmd(&["set", "--keep-below", "40"]));
    let run = job.spawn(&args);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        show()["settings"]["keep_below"],
        40.0,
        "still the operator's"
    );
    stop(run);
}

/// A worker that stops on purpose retires its probe finding: the next run of the fleet
/// is not held by a finding nobody renews.
fn retires(redis: &TestRedis, name: &str) {
    let job = Job::new(name, Some(redis));
    ok(job.cmd(&["plan", "--min", "1", "--max", "3000", "--size", "1000"]));
    let probe = job.script("probe.sh", "exit 0");
    let run = job.spawn(&["--throttle-exec", &probe]);
    let report = finish(run, Duration::from_secs(60));
    assert_eq!(report["namespace"]["outstanding"], 0, "{report}");
    let show: serde_json::Value =
        serde_json::from_str(&ok(job.cmd(&["control", "show", "--json"]))).unwrap();
    assert_eq!(show["probes"], serde_json::json!({}), "{show}");
    assert_eq!(show["throttled"], serde_json::Value::Null, "{show}");
}

#[test]
fn a_clean_stop_retires_the_probe_finding() {
    let redis = TestRedis::start();
    retires(&redis, "fs-retire");
}

/// Flags out of bounds are refused at parse time, by name, in one line, exit 2.
#[test]
fn control_flags_out_of_bounds_are_refused_by_name() {
    for (name, redis) in [
        ("fs-flags-redis", Some(TestRedis::start())),
        ("fs-flags-embedded", None),
    ] {
        let job = Job::new(name, redis.as_ref());
        ok(job.cmd(&["plan", "--min", "1", "--max", "2000", "--size", "1000"]));
        for (args, says) in [
            (&["--max-rate", "1e-300"][..], "below the smallest rate"),
            (&["--max-rate", "2e12"][..], "above the largest rate"),
            (
                &["--throttle-exec", "true", "--throttle-interval", "30m"][..],
                "throttle interval",
            ),
            (
                &["--throttle-exec", "true", "--throttle-interval", "1ms"][..],
                "throttle interval",
            ),
            (
                &["--throttle-exec", "true", "--probe-stale", "maybe"][..],
                "throttle or go",
            ),
        ] {
            let mut all = vec!["run", "--simulate"];
            all.extend_from_slice(args);
            let out = output(job.cmd(&all));
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
            assert!(err.contains(says), "{args:?}: {err}");
        }
        assert!(job.cmd(&["status"]).output().unwrap().status.success());
    }
}

/// A probe command runs with the chunks' environment: no Redis URL, no admin token.
fn probe_env(redis: Option<&TestRedis>, name: &str) {
    let job = Job::new(name, redis);
    ok(job.cmd(&["plan", "--min", "1", "--max", "2000", "--size", "1000"]));
    let seen = job.dir.join("env");
    let probe = job.script("probe.sh", &format!("env > {}; exit 0", seen.display()));
    let run = job.spawn(&["--throttle-exec", &probe]);
    finish(run, Duration::from_secs(60));
    let env = std::fs::read_to_string(&seen).expect("the probe ran");
    assert!(env.contains("PATH="), "{env}");
    for secret in ["TRANCHE_REDIS_URL", "TRANCHE_ADMIN_TOKEN", "s3cret-admin"] {
        assert!(!env.contains(secret), "the probe saw {secret}");
    }
}

#[test]
fn a_probe_gets_the_chunks_scrubbed_environment_on_redis() {
    let redis = TestRedis::start();
    probe_env(Some(&redis), "fs-env-redis");
}

#[test]
fn a_probe_gets_the_chunks_scrubbed_environment_embedded() {
    probe_env(None, "fs-env-embedded");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One GET with an optional bearer token: (status, body).
fn get(port: u16, path: &str, token: Option<&str>) -> Option<(u16, String)> {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
    Some((code, body))
}

/// The body of a 200 to `path`, once the server answers.
fn eventually_get(port: u16, path: &str, token: Option<&str>) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some((200, body)) = get(port, path, token) {
            return body;
        }
        assert!(Instant::now() < deadline, "no 200 from {path}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `serve` beyond localhost refuses to start without a token, and then answers reads
/// only with the read token or the admin token.
fn serve_reads(redis: Option<&TestRedis>, name: &str) {
    let job = Job::new(name, redis);
    ok(job.cmd(&["plan", "--min", "1", "--max", "2000", "--size", "1000"]));
    let port = free_port();
    let listen = format!("0.0.0.0:{port}");
    let out = output(job.cmd(&["serve", "--listen", &listen]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--read-token"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");

    let serve = job
        .cmd(&[
            "serve",
            "--listen",
            &listen,
            "--read-token",
            "r3ad",
            "--admin-token",
            "adm1n",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(Running)
        .unwrap();
    eventually_get(port, "/api/v1/status", Some("r3ad"));
    for path in ["/api/v1/status", "/metrics", "/api/v1/config"] {
        assert_eq!(
            get(port, path, None).unwrap().0,
            401,
            "{path} without a token"
        );
        assert_eq!(
            get(port, path, Some("r3a")).unwrap().0,
            401,
            "{path}, a prefix"
        );
        assert_eq!(
            get(port, path, Some("r3adX")).unwrap().0,
            401,
            "{path}, longer"
        );
        assert_eq!(get(port, path, Some("r3ad")).unwrap().0, 200, "{path}");
        assert_eq!(
            get(port, path, Some("adm1n")).unwrap().0,
            200,
            "{path}, admin"
        );
    }
    assert_eq!(
        get(port, "/", None).unwrap().0,
        200,
        "the page itself is static"
    );
    drop(serve);

    // The admin token alone guards reads too.
    let port = free_port();
    let listen = format!("0.0.0.0:{port}");
    let serve = job
        .cmd(&["serve", "--listen", &listen])
        .env("TRANCHE_ADMIN_TOKEN", "adm1n")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(Running)
        .unwrap();
    eventually_get(port, "/api/v1/status", Some("adm1n"));
    assert_eq!(get(port, "/api/v1/status", None).unwrap().0, 401);
    drop(serve);
}

#[test]
fn serve_beyond_localhost_needs_a_read_token_on_redis() {
    let redis = TestRedis::start();
    serve_reads(Some(&redis), "fs-serve-redis");
}

#[test]
fn serve_beyond_localhost_needs_a_read_token_embedded() {
    serve_reads(None, "fs-serve-embedded");
}
