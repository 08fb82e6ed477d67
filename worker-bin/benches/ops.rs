//! Operator commands at scale: the real `tranche` binary against a private redis-server.
//!
//! - `check` on a 5e9-ID plan (5,000,000 partitions) of which 10,000 are done: it must
//!   cost what is active and archived, never the unissued rest of the plan;
//! - `list archived` (first page and a page 90% in), `status`, `get` and `stats` on a
//!   namespace of 5,000,000 archived partitions, and a `/metrics` scrape of `tranche
//!   serve` on it (the request alone, the server already running).
//!
//! Each command runs `TRANCHE_BENCH_REPEAT` times (default 5); the table shows the
//! median wall time of the whole process (connect included), the slowest, and, where
//! an issue set one, the target the median must meet (`check` under 2 s, a scrape
//! under 20 ms). Knobs: `TRANCHE_BENCH_ARCHIVED` (partitions of the big namespace,
//! default 5,000,000; filling it runs the real pipeline, a few minutes) and
//! `TRANCHE_BENCH_OUT` (default `target/tranche-bench/ops.json`).
//!
//! With `TRANCHE_BENCH_SMOKE=1` it runs under `cargo test` too (with the binary of that
//! profile), with 2,000 partitions done before `check` and 2,000 archived, one run per
//! command: a few seconds, figures not judged, every command and assert still run.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use common::run_ok;
use serde_json::json;
use tranche_testkit::TestRedis;

const BIN: &str = env!("CARGO_BIN_EXE_tranche");

fn tranche(url: &str, ns: &str, args: &[&str]) -> Command {
    common::tranche_at(BIN, url, ns, args)
}

/// Plans `min..=max` in partitions of 1000 and runs 4 simulated processes until done.
fn fill(url: &str, ns: &str, max: u64) {
    run_ok(tranche(
        url,
        ns,
        &[
            "plan",
            "--min",
            "1",
            "--max",
            &max.to_string(),
            "--size",
            "1000",
            "--shards",
            "16",
        ],
    ));
    let args = [
        "run",
        "--simulate",
        "--sim-latency",
        "0..0",
        "--chunk",
        "1000",
        "--parallel",
        "1",
        "--concurrency",
        "64",
    ];
    let mut runs: Vec<_> = (0..4)
        .map(|i| {
            let mut cmd = tranche(url, ns, &args);
            cmd.args(["--worker-id", &format!("bench-{i}")]);
            cmd.stdout(Stdio::null()).stderr(Stdio::null());
            cmd.spawn().expect("spawn run")
        })
        .collect();
    for run in &mut runs {
        assert!(run.wait().expect("wait").success());
    }
}

/// Median and slowest wall time of `repeat` runs of `args`, in ms.
fn time(url: &str, ns: &str, args: &[&str], repeat: usize, check: impl Fn(&str)) -> (f64, f64) {
    let mut ms: Vec<f64> = (0..repeat)
        .map(|_| {
            let started = Instant::now();
            let out = run_ok(tranche(url, ns, args));
            let took = started.elapsed().as_secs_f64() * 1000.0;
            check(&out);
            took
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    (ms[ms.len() / 2], ms[ms.len() - 1])
}

fn main() {
    let smoke = std::env::var("TRANCHE_BENCH_SMOKE").is_ok_and(|v| v == "1");
    // `cargo test` runs a harness-less bench with no argument; `cargo bench` passes
    // `--bench`. Only the smoke run is cheap enough for the former.
    if !smoke && !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let archived: u64 = std::env::var("TRANCHE_BENCH_ARCHIVED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if smoke { 2_000 } else { 5_000_000 });
    let repeat: usize = std::env::var("TRANCHE_BENCH_REPEAT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if smoke { 1 } else { 5 })
        .max(1);
    // Partitions done before the rest of the 5e9-ID plan is planned.
    let done: u64 = if smoke { 2_000 } else { 10_000 };
    let out = std::env::var_os("TRANCHE_BENCH_OUT").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/tranche-bench/ops.json"),
        PathBuf::from,
    );
    let redis = TestRedis::start();
    let url = redis.url();
    let mut rows = Vec::new();
    let mut row = |what: &str, (median, slowest): (f64, f64), target: Option<f64>| {
        let verdict = target.map_or(String::new(), |t| {
            format!("< {t} {}", if median < t { "met" } else { "MISSED" })
        });
        println!("{what:<58} {median:>10.1} {slowest:>10.1}  {verdict}");
        rows.push(json!({
            "command": what,
            "median_ms": median,
            "slowest_ms": slowest,
            "target_ms": target,
            "met": target.map(|t| median < t),
        }));
    };
    println!(
        "{:<58} {:>10} {:>10}  target ms",
        "command", "median ms", "slowest ms"
    );

    // `done` done, then the rest of a 5e9-ID plan planned and never issued.
    fill(&url, "big-plan", done * 1000);
    run_ok(tranche(
        &url,
        "big-plan",
        &[
            "plan",
            "--min",
            &(done * 1000 + 1).to_string(),
            "--max",
            "5000000000",
            "--size",
            "1000",
        ],
    ));
    row(
        &format!("check: 5e9-ID plan (5,000,000 partitions), {done} done"),
        time(&url, "big-plan", &["check"], repeat, |out| {
            assert!(out.contains(&format!("against {done} archived")), "{out}");
        }),
        Some(2000.0),
    );

    fill(&url, "archived", archived * 1000);
    let n = archived.to_string();
    row(
        &format!("status: {archived} archived"),
        time(&url, "archived", &["status", "--json"], repeat, |out| {
            assert!(out.contains(&format!("\"archived\":{n}")), "{out}");
        }),
        None,
    );
    row(
        "list archived --limit 100 (first page)",
        time(
            &url,
            "archived",
            &["list", "archived", "--limit", "100"],
            repeat,
            |out| {
                assert_eq!(out.lines().count(), 102, "{out}");
            },
        ),
        None,
    );
    let deep = (archived * 9 / 10).to_string();
    row(
        &format!("list archived --limit 100 --after {deep}"),
        time(
            &url,
            "archived",
            &["list", "archived", "--limit", "100", "--after", &deep],
            repeat,
            |out| assert!(out.lines().count() > 2, "{out}"),
        ),
        None,
    );
    let pid = (archived / 2 + 7).to_string();
    row(
        &format!("get {pid}"),
        time(&url, "archived", &["get", &pid], repeat, |out| {
            assert!(out.contains("completed"), "{out}");
        }),
        None,
    );
    row(
        "stats",
        time(&url, "archived", &["stats", "--json"], repeat, |_| {}),
        None,
    );

    // A /metrics scrape of `tranche serve` on the same namespace: O(shards) Redis work,
    // timed from the request to the last byte (the process is already running).
    let mut serve = tranche(&url, "archived", &["serve", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn serve");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(serve.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let addr = line
        .trim()
        .rsplit("http://")
        .next()
        .and_then(|a| a.strip_suffix('/'))
        .expect("serve's address")
        .to_owned();
    let mut ms: Vec<f64> = (0..repeat.max(5))
        .map(|_| {
            use std::io::{Read, Write};
            let started = Instant::now();
            let mut s = std::net::TcpStream::connect(&addr).unwrap();
            write!(
                s,
                "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
            )
            .unwrap();
            let mut body = String::new();
            s.read_to_string(&mut body).unwrap();
            assert!(body.contains("tranche_partitions"), "{body}");
            started.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    let _ = serve.kill();
    let _ = serve.wait();
    ms.sort_by(f64::total_cmp);
    row(
        &format!("serve /metrics scrape: {archived} archived"),
        (ms[ms.len() / 2], ms[ms.len() - 1]),
        Some(20.0),
    );

    let report = json!({"archived": archived, "repeat": repeat, "rows": rows});
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent).expect("output dir");
    }
    std::fs::write(&out, serde_json::to_string_pretty(&report).unwrap()).expect("write output");
    println!("figures written to {}", out.display());
}
