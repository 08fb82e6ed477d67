//! The files of `deploy/` that are not rules: the systemd unit passes `systemd-analyze
//! verify` and its stop timeout outlasts the drain it asks for; the Grafana board's
//! queries parse and use only metrics `serve` exports on a namespace whose every control
//! is set. (The alerting rules are checked in `serve.rs`, beside the scrape they use.)

use crate::common;
use crate::support::TestRedis;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{BIN, eventually, ok, scratch, tranche};
use serde_json::Value;

const UNIT: &str = include_str!("../../../deploy/systemd/tranche-worker@.service");
const BOARD: &str = include_str!("../../../deploy/grafana/tranche.json");

/// Where the shipped unit expects the binary (`cargo install` puts it in ~/.cargo/bin;
/// the docs say to copy it here).
const INSTALLED: &str = "/usr/local/bin/tranche";

/// `systemd-analyze verify` accepts the unit, as an instance, with `ExecStart` pointing
/// at the binary under test (verify refuses a command that does not exist). Any line it
/// prints about the unit fails the test: systemd only warns about an unknown key or a
/// bad value, and ignores it.
#[test]
fn the_systemd_unit_passes_systemd_analyze_verify() {
    assert!(
        UNIT.contains(&format!("ExecStart={INSTALLED} run ")),
        "the unit runs something else than `{INSTALLED} run`"
    );
    let dir = scratch("deploy-unit");
    let unit = dir.join("tranche-worker@reindex.service");
    std::fs::write(&unit, UNIT.replace(INSTALLED, BIN)).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&unit)
        .output()
        .expect("systemd-analyze not found: apt-get install systemd");
    let said = [out.stdout, out.stderr].concat();
    let said = String::from_utf8_lossy(&said);
    let about_the_unit: Vec<&str> = said
        .lines()
        .filter(|l| l.contains("tranche-worker@"))
        .collect();
    assert!(
        out.status.success() && about_the_unit.is_empty(),
        "systemd-analyze verify ({}):\n{said}",
        out.status
    );

    // The check can fail: a misspelt key is reported.
    let bad = dir.join("tranche-worker@typo.service");
    std::fs::write(
        &bad,
        UNIT.replace(INSTALLED, BIN)
            .replace("KillMode=mixed", "KillMode=mixd"),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&bad)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("tranche-worker@typo.service"), "{said}");
}

/// The unit's stop timeout covers what tranche may take after SIGTERM: its `--grace`,
/// then at most 5 s to stop chunks and release leases with Redis gone (docs/guide.md),
/// plus a margin; its grace is the binary's default, which the docs state; SIGTERM goes
/// to tranche alone, so the chunks get their grace; the drain's exit is a clean stop.
#[test]
fn the_units_stop_timeout_outlasts_the_drain() {
    let directive = |key: &str| -> Vec<&str> {
        UNIT.lines()
            .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .collect()
    };
    let seconds = |value: &str| -> u64 {
        value
            .strip_suffix('s')
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{value:?} is not whole seconds"))
    };
    let exec = directive("ExecStart");
    assert_eq!(exec.len(), 1, "{exec:?}");
    let words: Vec<&str> = exec[0].split_whitespace().collect();
    let grace = words
        .windows(2)
        .find(|w| w[0] == "--grace")
        .map(|w| seconds(w[1]))
        .expect("the unit's ExecStart sets --grace, beside TimeoutStopSec");
    let timeout = seconds(directive("TimeoutStopSec")[0]);
    assert!(
        timeout > grace + 5,
        "TimeoutStopSec={timeout}s leaves no margin over --grace {grace}s + 5 s"
    );
    assert_eq!(directive("KillMode"), ["mixed"]);
    assert_eq!(directive("KillSignal"), ["SIGTERM"]);
    assert_eq!(directive("SuccessExitStatus"), ["130"]);

    let help = ok(tranche(&scratch("deploy-help"), &["run", "--help"]));
    let default = help
        .split("--grace <DURATION>")
        .nth(1)
        .and_then(|h| h.split("[default: ").nth(1))
        .and_then(|h| h.split(']').next())
        .unwrap_or_else(|| panic!("no default --grace in:\n{help}"));
    assert_eq!(
        seconds(default),
        grace,
        "the unit's --grace is not the default"
    );
    let guide = include_str!("../../../docs/guide.md");
    assert!(
        guide.contains(&format!("(`--grace`, {grace} s)")) && guide.contains("`--grace` plus 5 s"),
        "docs/guide.md no longer states the grace and the stop bound the unit follows"
    );
}

/// A running `tranche` (a worker, `serve`), killed on drop so a failed test leaves
/// none behind.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Every panel's query parses as PromQL (promtool, with Grafana's variables filled in)
/// and uses only metric names `serve`'s /metrics declares on a Redis namespace whose
/// control record has every setting, a throttle and a probe value: the throttle and
/// control families appear only then.
#[test]
fn the_grafana_board_queries_parse_and_use_exported_metrics() {
    let board: Value = serde_json::from_str(BOARD).expect("the Grafana board is JSON");
    let panels = board["panels"].as_array().expect("panels");
    let exprs: Vec<&str> = panels
        .iter()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .map(|t| t["expr"].as_str().expect("every target has an expr"))
        .collect();
    assert!(exprs.len() >= 20, "{exprs:?}");
    let mut ids: Vec<u64> = panels.iter().map(|p| p["id"].as_u64().unwrap()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), panels.len(), "panel ids repeat");

    // promtool parses a recording rule's expression: one rule per query.
    let dir = scratch("deploy-board");
    let mut rules = String::from("groups:\n  - name: board\n    rules:\n");
    for (i, expr) in exprs.iter().enumerate() {
        let expr = expr.replace("$namespace", ".*").replace("$__range", "1h");
        rules.push_str(&format!(
            "      - record: board:query{i}\n        expr: {}\n",
            serde_json::to_string(&expr).unwrap()
        ));
    }
    let file = dir.join("board-queries.yml");
    std::fs::write(&file, rules).unwrap();
    let out = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .expect("promtool not found: run `cargo xtask test` (it installs prometheus) or apt-get install prometheus");
    assert!(
        out.status.success(),
        "a board query does not parse: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // A namespace with every control set, a throttle on, and a probe value recorded
    // (the probe runs once as the run starts).
    let redis = TestRedis::start();
    let url = redis.url();
    let cmd = |args: &[&str]| tranche(&dir, &[&["--redis", &url][..], args].concat());
    ok(cmd(&[
        "plan", "--min", "1", "--max", "1000", "--size", "100",
    ]));
    ok(cmd(&[
        "run",
        "--simulate",
        "--throttle-exec",
        "echo 7",
        "--max-rate",
        "100000/s",
        "--keep-below",
        "40",
    ]));
    ok(cmd(&[
        "set",
        "--concurrency",
        "8",
        "--parallel",
        "2",
        "--chunk",
        "50",
        "--max-partitions-rate",
        "20",
    ]));
    ok(cmd(&["throttle", "on", "--reason", "backup window"]));
    // A live worker, throttled, for the per-worker gauges.
    let _worker = cmd(&["run", "--simulate", "--follow"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(Killed)
        .expect("spawn run");
    let mut serve = cmd(&["serve", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map(Killed)
        .expect("spawn serve");
    let mut line = String::new();
    BufReader::new(serve.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .rsplit("http://")
        .next()
        .and_then(|a| a.strip_suffix('/'))
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    let mut text = String::new();
    eventually(Duration::from_secs(20), "a live worker's metrics", || {
        text = get(addr, "/metrics");
        text.contains("tranche_worker_update_latency_seconds{")
    });
    assert!(
        text.contains("tranche_throttled{reason=\"backup window\"} 1"),
        "{text}"
    );

    let declared = metric_names(&text);
    let mut used: Vec<&str> = exprs
        .iter()
        .flat_map(|e| e.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')))
        .filter(|w| w.starts_with("tranche_"))
        .collect();
    used.sort_unstable();
    used.dedup();
    for family in [
        "tranche_throttled",
        "tranche_control_",
        "tranche_probe_value",
    ] {
        assert!(
            used.iter().any(|u| u.starts_with(family)),
            "the board has no panel of {family}"
        );
    }
    for name in used {
        assert!(
            declared.iter().any(|d| d == name),
            "the board uses {name}, not exported: {declared:?}"
        );
    }
}

/// The body of a GET over HTTP/1.0 (so it comes unchunked), asserting a 200.
fn get(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect to serve");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("a response");
    assert!(
        head.starts_with("HTTP/1.") && head.contains(" 200 "),
        "{head}"
    );
    assert!(!head.to_ascii_lowercase().contains("chunked"), "{head}");
    body.to_owned()
}

/// Every name a PromQL expression may use for the metrics of an exposition: each
/// family's name from its `# TYPE` line, with `_total` for a counter and `_bucket`,
/// `_sum`, `_count` for a histogram. (The same as `serve.rs`'s: small enough to exist
/// twice.)
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
