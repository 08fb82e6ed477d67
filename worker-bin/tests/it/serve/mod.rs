//! `tranche serve` against a private Redis with a real job run by the binary: every API
//! endpoint's JSON, 400s for bad input, 401/403 for actions without the token, actions
//! with it, /metrics parsed by a real exposition-format parser, no password in any
//! response, and the orchestrator's probes (`/healthz`, `/readyz`, health's 503) on
//! `serve` and on `run --metrics-listen`, with SIGTERM draining a run as Ctrl-C does.

use crate::support;

use crate::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Stdio};
use std::time::Duration;

use common::{ok, output, scratch, steady, tranche};
use serde_json::Value;
use support::TestRedis;

/// A running `tranche serve`, stopped on drop.
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    /// `serve` on Redis at `url`, or embedded (the state file under `dir`) when
    /// `url` is `None`.
    fn start(dir: &std::path::Path, url: Option<&str>, token: Option<&str>) -> Self {
        let mut args = match url {
            Some(url) => vec!["--redis", url],
            None => vec![],
        };
        args.extend(["serve", "--listen", "127.0.0.1:0"]);
        if let Some(t) = token {
            args.extend(["--admin-token", t]);
        }
        let mut child = tranche(dir, &args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .rsplit("http://")
            .next()
            .and_then(|a| a.strip_suffix('/'))
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_owned();
        Self { child, addr }
    }

    /// One HTTP/1.1 request; returns the status code and the body.
    fn request(&self, method: &str, path: &str, token: Option<&str>) -> (u16, String) {
        request(&self.addr, method, path, token)
    }

    fn json(&self, path: &str) -> Value {
        let (code, body) = self.request("GET", path, None);
        assert_eq!(code, 200, "{path}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
    }

    /// `/api/v1/health`: 503 exactly when a rule fires, the list of rules either way.
    fn health(&self) -> Value {
        let (code, body) = self.request("GET", "/api/v1/health", None);
        let rules: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
        let firing = rules
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["firing"] == true);
        assert_eq!(code, if firing { 503 } else { 200 }, "{body}");
        rules
    }
}

/// One HTTP/1.1 request to `addr`; returns the status code and the body.
fn request(addr: &str, method: &str, path: &str, token: Option<&str>) -> (u16, String) {
    {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).unwrap();
        let code = raw[9..12].parse().unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap();
        let body = if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            dechunk(body)
        } else {
            body.to_owned()
        };
        (code, body)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        body = &rest[n + 2..];
    }
    out
}

#[test]
fn the_api_answers_as_the_cli_does() {
    let redis = TestRedis::start_with_password("s3cret-pw");
    let dir = scratch("serve-api");
    let url = format!("redis://:s3cret-pw@127.0.0.1:{}", redis.port());
    let cmd = |args: &[&str]| tranche(&dir, &[&["--redis", &url][..], args].concat());
    ok(cmd(&[
        "plan", "--min", "1", "--max", "40000", "--size", "1000",
    ]));
    let run = output(cmd(&[
        "run",
        "--simulate",
        "--sim-latency",
        "0..1",
        "--sim-fail",
        "0.05",
        "--max-attempts",
        "1",
    ]));
    assert!(matches!(run.status.code(), Some(0 | 1)));
    let cli: Value = serde_json::from_str(&ok(cmd(&["status", "--json"]))).unwrap();
    let failed = cli["failed"].as_u64().unwrap();
    assert!(failed >= 2, "the test needs failed partitions: {cli}");

    let server = Server::start(&dir, Some(&url), Some("admin-t0ken"));
    // The same answers as the CLI's --json.
    let mut status = server.json("/api/v1/status");
    // The CLI's shape, without the store's address.
    assert_eq!(status["location"], "redis");
    status["location"] = cli["location"].clone();
    assert_eq!(status, cli);
    assert_eq!(server.json("/api/v1/config")["actions"], true);
    assert_eq!(server.json("/api/v1/plans")[0]["partitions"], 40);
    let got = server.json("/api/v1/get/7");
    let cli_get: Value = serde_json::from_str(&ok(cmd(&["get", "7", "--json"]))).unwrap();
    assert_eq!(got, cli_get);
    assert_eq!(server.json("/api/v1/locate/7500")["pid"], 8);
    let page = server.json("/api/v1/partitions?state=failed&limit=1");
    assert_eq!(page["partitions"].as_array().unwrap().len(), 1);
    let first_failed = page["partitions"][0]["pid"].as_u64().unwrap();
    assert!(page["next"].is_u64(), "{page}");
    assert!(
        server
            .health()
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["rule"] == "failed_partitions" && r["firing"] == true)
    );
    assert!(server.json("/api/v1/workers").is_array());
    let memory = server.json("/api/v1/memory");
    assert!(
        memory["redis_memory_bytes"].as_u64().unwrap() > 0,
        "{memory}"
    );
    assert_eq!(memory["archived"], cli["archived"]);
    assert!(
        memory["redis_bytes_per_archived_partition"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    assert!(server.json("/api/v1/stats")["completed"].is_object());

    // Bad input: 400 with a JSON error, never a panic; unknown paths 404.
    for path in [
        "/api/v1/get/abc",
        "/api/v1/get/-1",
        "/api/v1/locate/1e9",
        "/api/v1/partitions?limit=0",
        "/api/v1/partitions?limit=abc",
        "/api/v1/partitions?state=bogus",
        "/api/v1/partitions?after=-3",
        "/api/v1/partitions?worker=%1b%5b31m",
    ] {
        let (code, body) = server.request("GET", path, None);
        assert_eq!(code, 400, "{path}: {body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["error"]["kind"], "bad_request", "{path}: {body}");
    }
    assert_eq!(server.request("GET", "/api/v1/nope", None).0, 404);

    // Actions: 401 without or with a wrong token, then done with it.
    for token in [None, Some("wrong"), Some("admin-t0ke")] {
        let (code, body) = server.request("POST", "/api/v1/pause", token);
        assert_eq!(code, 401, "{token:?}: {body}");
    }
    let (code, body) = server.request(
        "POST",
        &format!("/api/v1/retry-failed?pid={first_failed}"),
        Some("admin-t0ken"),
    );
    assert_eq!(code, 200, "{body}");
    assert!(body.contains(&first_failed.to_string()), "{body}");
    let status = server.json("/api/v1/status");
    assert_eq!(
        (status["failed"].as_u64(), status["pending"].as_u64()),
        (Some(failed - 1), Some(1))
    );
    let (code, _) = server.request(
        "POST",
        &format!("/api/v1/discard/{first_failed}"),
        Some("admin-t0ken"),
    );
    assert_eq!(code, 200);
    assert_eq!(
        server.json(&format!("/api/v1/get/{first_failed}"))["status"],
        "discarded"
    );
    assert_eq!(
        server
            .request("POST", "/api/v1/pause", Some("admin-t0ken"))
            .0,
        200
    );
    assert_eq!(server.json("/api/v1/status")["paused"], true);
    assert_eq!(
        server
            .request("POST", "/api/v1/resume", Some("admin-t0ken"))
            .0,
        200
    );

    // /metrics through a real exposition-format parser, agreeing with status, while a
    // worker is alive (its update latency is a metric of live workers only).
    let mut follower = cmd(&["run", "--simulate", "--follow", "--worker-id", "f1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let text = loop {
        let (code, text) = server.request("GET", "/metrics", None);
        assert_eq!(code, 200);
        if text.contains("tranche_worker_update_latency_seconds{") {
            break text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no live worker in /metrics: {text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let _ = follower.kill();
    let _ = follower.wait();
    assert_eq!(code, 200);
    let lines = text
        .lines()
        .filter(|l| *l != "# EOF")
        .map(|l| Ok(l.to_owned()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("valid exposition text");
    let status = server.json("/api/v1/status");
    let value = |name: &str, label: Option<(&str, &str)>| -> f64 {
        let s = scrape
            .samples
            .iter()
            .find(|s| s.metric == name && label.is_none_or(|(k, v)| s.labels.get(k) == Some(v)))
            .unwrap_or_else(|| panic!("{name} {label:?} not in {text}"));
        match s.value {
            prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Untyped(v) => v,
            ref other => panic!("{name}: {other:?}"),
        }
    };
    assert_eq!(
        value("tranche_partitions", Some(("state", "failed"))),
        status["failed"].as_f64().unwrap()
    );
    assert_eq!(
        value("tranche_partitions", Some(("state", "archived"))),
        status["archived"].as_f64().unwrap()
    );
    assert_eq!(
        value("tranche_partitions", Some(("state", "discarded"))),
        1.0
    );
    assert_eq!(value("tranche_planned_partitions", None), 40.0);
    assert_eq!(value("tranche_paused", None), 0.0);
    assert_eq!(
        value("tranche_partitions_completed_total", None),
        status["archived"].as_f64().unwrap()
    );
    assert_eq!(value("tranche_inbox_backlog", None), 0.0);
    assert_eq!(value("tranche_dead_letters", None), 0.0);
    assert_eq!(value("tranche_decode_failures_total", None), 0.0);
    value("tranche_workers", Some(("state", "alive")));
    value("tranche_workers", Some(("state", "inactive")));
    value(
        "tranche_partition_duration_seconds",
        Some(("quantile", "0.99")),
    );
    assert!(value("tranche_redis_memory_bytes", None) > 0.0);
    // The scrape itself read every layer once, and the `get` above read the archive.
    for layer in ["active", "archive", "stats", "inbox"] {
        assert!(
            text.contains(&format!(
                "tranche_query_latency_seconds_count{{layer=\"{layer}\"}}"
            )),
            "no query latency of {layer}: {text}"
        );
    }

    // Every metric the shipped alerting rules use is exported (deploy.rs checks the
    // Grafana board's on a namespace with a control record, which its panels need).
    let rules = include_str!("../../../../deploy/prometheus/alerts.yml");
    let mut used: Vec<&str> = rules
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("tranche_"))
        .collect();
    used.sort_unstable();
    used.dedup();
    assert!(used.len() >= 6, "{used:?}");
    let declared = metric_names(&text);
    for name in used {
        assert!(
            declared.contains(&name.to_owned()),
            "alerts.yml or the dashboard uses {name}, not exported: {declared:?}"
        );
    }

    // Nothing the server says carries the password, or the store's address.
    let port = format!("127.0.0.1:{}", redis.port());
    for path in [
        "/api/v1/status",
        "/api/v1/config",
        "/api/v1/namespaces",
        "/api/v1/workers",
        "/metrics",
        "/api/v1/health",
        "/",
    ] {
        let (_, body) = server.request("GET", path, None);
        assert!(!body.contains("s3cret-pw"), "{path} leaks the password");
        assert!(!body.contains(&port), "{path} says where Redis is: {body}");
    }
    let (code, page) = server.request("GET", "/", None);
    assert_eq!(code, 200);
    assert!(
        page.contains("<title>tranche</title>")
            && !page.contains("http://")
            && !page.contains("https://"),
        "the page loads something from elsewhere"
    );
}

/// Every name a PromQL expression may use for the metrics of an exposition: each
/// family's name from its `# TYPE` line (so an empty family counts), with `_total` for
/// a counter and `_bucket`, `_sum`, `_count` for a histogram.
fn metric_names(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        if let (Some("#"), Some("TYPE"), Some(name), Some(kind)) =
            (words.next(), words.next(), words.next(), words.next())
        {
            match kind {
                "counter" => names.push(format!("{name}_total")),
                "histogram" => {
                    for suffix in ["_bucket", "_sum", "_count"] {
                        names.push(format!("{name}{suffix}"));
                    }
                }
                _ => {}
            }
            names.push(name.to_owned());
        }
    }
    names
}

/// The shipped alerting rules pass `promtool check rules` (Debian's prometheus
/// package, which `cargo xtask test` installs when missing).
#[test]
fn the_shipped_alerting_rules_pass_promtool() {
    let rules = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/prometheus/alerts.yml"
    );
    let out = std::process::Command::new("promtool")
        .args(["check", "rules", rules])
        .output()
        .expect("promtool not found: run `cargo xtask test` (it installs prometheus) or apt-get install prometheus");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Each rule has a severity and a runbook_url to its section of operations.md,
    // which names the alert with that severity.
    let docs = include_str!("../../../../docs/operations.md");
    let text = std::fs::read_to_string(rules).unwrap();
    for rule in text.split("- alert: ").skip(1) {
        let name = rule.split_whitespace().next().unwrap();
        let value = |key: &str| {
            let line = rule.lines().find_map(|l| l.trim().strip_prefix(key));
            line.unwrap_or_else(|| panic!("{name} has no {key}")).trim()
        };
        let severity = value("severity:");
        assert!(
            ["critical", "warning"].contains(&severity),
            "{name}: {severity}"
        );
        let anchor = value("runbook_url:")
            .strip_prefix("docs/operations.md#")
            .unwrap_or_else(|| panic!("{name}'s runbook_url is not in operations.md"));
        let section = docs
            .split(&format!("\n### {anchor}\n"))
            .nth(1)
            .unwrap_or_else(|| panic!("{name}: no section {anchor} in operations.md"));
        let section = section.split("\n#").next().unwrap();
        let section = section.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            section.contains(&format!("`{name}` ({severity}")),
            "operations.md#{anchor} does not name {name} ({severity})"
        );
    }
}

/// Every read endpoint's JSON, snapshotted, from a job whose outcome is fixed (pids 3
/// and 7 fail): the same snapshots on Redis and embedded, so both backends answer in
/// one shape.
#[test]
fn every_endpoint_answers_in_one_shape_on_both_backends() {
    let redis = TestRedis::start();
    let url = redis.url();
    for backend in ["redis", "embedded"] {
        let dir = scratch(&format!("serve-shapes-{backend}"));
        let global: Vec<&str> = match backend {
            "redis" => vec!["--redis", &url],
            _ => vec![],
        };
        let cmd = |args: &[&str]| tranche(&dir, &[&global[..], args].concat());
        ok(cmd(&[
            "plan", "--min", "1", "--max", "40000", "--size", "1000",
        ]));
        let run = output(cmd(&[
            "run",
            "--exec",
            r#"test "$TRANCHE_PID" != 3 && test "$TRANCHE_PID" != 7"#,
            "--max-attempts",
            "1",
            "--worker-id",
            "w1",
            "--parallel",
            "1",
        ]));
        assert_eq!(
            run.status.code(),
            Some(1),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
        let server = Server::start(&dir, global.get(1).copied(), None);
        for (name, path) in [
            ("status", "/api/v1/status"),
            ("config", "/api/v1/config"),
            ("plans", "/api/v1/plans"),
            ("namespaces", "/api/v1/namespaces"),
            ("health", "/api/v1/health"),
            ("stats", "/api/v1/stats"),
            ("workers", "/api/v1/workers"),
            ("get_archived", "/api/v1/get/5"),
            ("get_failed", "/api/v1/get/3"),
            ("get_unknown", "/api/v1/get/99"),
            ("locate", "/api/v1/locate/6500"),
            ("partitions_failed", "/api/v1/partitions?state=failed"),
            (
                "partitions_archived",
                "/api/v1/partitions?state=archived&after=30&limit=3",
            ),
        ] {
            let mut body = if name == "health" {
                server.health()
            } else {
                server.json(path)
            };
            steady(&mut body, &["active", "workers", "range_summary"]);
            insta::assert_json_snapshot!(format!("shape_{name}"), body);
        }
        let (code, body) = server.request("GET", "/api/v1/get/x", None);
        assert_eq!(code, 400);
        let body: Value = serde_json::from_str(&body).unwrap();
        insta::assert_json_snapshot!("shape_bad_request", body);
        let (code, body) = server.request("GET", "/metrics", None);
        assert_eq!(code, 200);
        let mut names = metric_names(&body);
        // Redis only: the server's memory, and this clock against the server's.
        names.retain(|n| !n.contains("redis_memory") && !n.contains("clock_skew"));
        insta::assert_json_snapshot!("shape_metric_names", names);
    }
}

/// Without a token the server is read-only: actions are refused (403), reads work.
#[test]
fn without_a_token_the_server_is_read_only() {
    let redis = TestRedis::start();
    let dir = scratch("serve-read-only");
    let url = redis.url();
    ok(tranche(
        &dir,
        &["--redis", &url, "plan", "--min", "1", "--max", "3000"],
    ));
    let server = Server::start(&dir, Some(&url), None);
    assert_eq!(server.json("/api/v1/config")["actions"], false);
    for path in ["/api/v1/pause", "/api/v1/retry-failed", "/api/v1/discard/1"] {
        let (code, body) = server.request("POST", path, Some("anything"));
        assert_eq!(code, 403, "{path}: {body}");
        assert!(body.contains("read_only"), "{body}");
    }
    assert_eq!(server.json("/api/v1/status")["paused"], false);
}

/// The admin token can come from a file (`--admin-token-file`), out of `ps`.
#[test]
fn the_admin_token_can_come_from_a_file() {
    let dir = scratch("serve-token-file");
    ok(tranche(&dir, &["plan", "--min", "1", "--max", "3000"]));
    let file = dir.join("token");
    std::fs::write(&file, "t0ken-from-file\n").unwrap();
    let mut child = tranche(
        &dir,
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-token-file",
            file.to_str().unwrap(),
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let server = Server {
        child,
        addr: line
            .trim()
            .rsplit("http://")
            .next()
            .unwrap()
            .trim_end_matches('/')
            .to_owned(),
    };
    assert_eq!(server.json("/api/v1/config")["actions"], true);
    let (code, body) = server.request("POST", "/api/v1/retry-failed", Some("wrong"));
    assert_eq!(code, 401, "{body}");
    let (code, body) = server.request("POST", "/api/v1/retry-failed", Some("t0ken-from-file"));
    assert_eq!(code, 200, "{body}");
    let cmdline = std::fs::read_to_string(format!("/proc/{}/cmdline", server.child.id())).unwrap();
    assert!(!cmdline.contains("t0ken-from-file"));
    // Both forms at once, or an empty file, are refused.
    let out = output(tranche(
        &dir,
        &[
            "serve",
            "--admin-token",
            "x",
            "--admin-token-file",
            file.to_str().unwrap(),
        ],
    ));
    assert_eq!(out.status.code(), Some(2));
    std::fs::write(&file, "\n").unwrap();
    let out = output(tranche(
        &dir,
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-token-file",
            file.to_str().unwrap(),
        ],
    ));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("holds no token"));
}

mod connections;
mod probes;
