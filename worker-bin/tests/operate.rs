//! Operating a job through the real binary: error lines an operator reads, the
//! statistics' counts, and moving a namespace's archive out and back in (dumps, JSON
//! lines, and the seed's hashes of JSON).

#[path = "../../active-store/tests/support/mod.rs"]
mod support;

mod common;

use common::{ok, output, scratch, tranche};
use serde_json::Value;
use std::path::Path;
use support::TestRedis;

/// `tranche ARGS` as JSON (the command must succeed).
fn json(dir: &Path, args: &[&str]) -> Value {
    let out = ok(tranche(dir, args));
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
}

/// Runs `tranche ARGS`, asserts exit `code` and exactly one line on stderr, returns it.
fn fails(dir: &Path, args: &[&str], code: i32) -> String {
    let out = output(tranche(dir, args));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(
        lines.len(),
        1,
        "{args:?}: expected one line, got:\n{stderr}"
    );
    assert!(lines[0].starts_with("tranche: "), "{args:?}: {stderr}");
    lines[0].to_owned()
}

/// `rest` after `--redis URL` (or alone, embedded, when `url` is `None`).
fn with(url: Option<&str>, rest: &[&str]) -> Vec<String> {
    let mut v = Vec::new();
    if let Some(url) = url {
        v.extend(["--redis".to_owned(), url.to_owned()]);
    }
    v.extend(rest.iter().map(|s| s.to_string()));
    v
}

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn an_overlapping_plan_says_invalid_plan_once() {
    let redis = TestRedis::start();
    let url = redis.url();
    for url in [None, Some(url.as_str())] {
        let dir = scratch(&format!("overlap-{}", url.is_some()));
        ok(tranche(
            &dir,
            &args(&with(url, &["plan", "--min", "1", "--max", "10000"])),
        ));
        let line = fails(
            &dir,
            &args(&with(url, &["plan", "--min", "5000", "--max", "20000"])),
            2,
        );
        assert_eq!(line.matches("invalid plan").count(), 1, "{line}");
        assert!(line.contains("overlap"), "{line}");
    }
}

#[test]
fn a_server_that_is_not_redis_is_one_line() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // Answers every connection as a web server would, then closes it.
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let _ = stream.set_read_timeout(Some(std::time::Duration::from_millis(500)));
            let mut buf = [0u8; 1024];
            let _ = stream.read(&mut buf);
            let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
    });
    let dir = scratch("not-redis");
    let url = format!("redis://127.0.0.1:{port}");
    let line = fails(&dir, &["--redis", &url, "status"], 2);
    assert!(line.contains("did not answer as Redis"), "{line}");
    assert!(line.contains(&url), "{line}");
}

#[test]
fn stats_counts_discarded_partitions() {
    let dir = scratch("stats-discarded");
    ok(tranche(
        &dir,
        &["plan", "--min", "1", "--max", "10000", "--size", "1000"],
    ));
    let out = output(tranche(
        &dir,
        &[
            "run",
            "--simulate",
            "--sim-fail",
            "1.0",
            "--max-attempts",
            "1",
        ],
    ));
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    ok(tranche(&dir, &["discard", "4"]));
    let status = json(&dir, &["status", "--json"]);
    assert_eq!(status["partitions"], 10, "{status}");
    assert_eq!(status["discarded"], 1, "{status}");
    let stats = json(&dir, &["stats", "--json"]);
    assert_eq!(stats["total"], 10, "{stats}");
    assert_eq!(stats["active"]["discarded"], 1, "{stats}");
    assert_eq!(stats["active"]["failed"], 9, "{stats}");
    let table = ok(tranche(&dir, &["stats"]));
    assert!(table.contains("partitions 10\n"), "{table}");
    assert!(table.contains("9 failed, 1 discarded"), "{table}");
}

/// The counts of `status --json` a restored namespace must show as the source did.
fn counts(status: &Value) -> (u64, u64, u64, u64) {
    let n = |k: &str| {
        status[k]
            .as_u64()
            .unwrap_or_else(|| panic!("{k}: {status}"))
    };
    (
        n("partitions"),
        n("archived"),
        n("unissued") + n("pending"),
        n("failed") + n("discarded"),
    )
}

#[test]
fn a_jsonl_export_imports_back() {
    let redis = TestRedis::start();
    let url = redis.url();
    for url in [None, Some(url.as_str())] {
        let dir = scratch(&format!("jsonl-{}", url.is_some()));
        let r = |rest: &[&str]| with(url, rest);
        ok(tranche(
            &dir,
            &args(&r(&[
                "plan", "--min", "1", "--max", "10000", "--shards", "3",
            ])),
        ));
        ok(tranche(
            &dir,
            &args(&r(&["run", "--simulate", "--sim-latency", "0..0"])),
        ));
        // A second plan nobody ran: its pids must come back pending.
        ok(tranche(
            &dir,
            &args(&r(&["plan", "--min", "10001", "--max", "15000"])),
        ));
        let file = dir.join("job.jsonl");
        let file = file.to_str().unwrap();
        ok(tranche(&dir, &args(&r(&["export", "--jsonl", "-o", file]))));
        let text = std::fs::read_to_string(file).unwrap();
        assert_eq!(
            text.lines().count(),
            11,
            "a header and ten records:\n{text}"
        );

        let fresh = |rest: &[&str]| {
            let mut v = r(&["--namespace", "restored"]);
            v.extend(rest.iter().map(|s| s.to_string()));
            v
        };
        ok(tranche(&dir, &args(&fresh(&["import", file]))));
        let before = json(&dir, &args(&r(&["status", "--json"])));
        let after = json(&dir, &args(&fresh(&["status", "--json"])));
        assert_eq!(counts(&after), counts(&before), "{before}\n{after}");
        assert_eq!(counts(&after), (15, 10, 5, 0));
        assert_eq!(after["shards"], 3, "{after}");

        let done = json(&dir, &args(&fresh(&["get", "7", "--json"])));
        assert_eq!(done["status"], "completed", "{done}");
        assert_eq!(
            (&done["min_id"], &done["max_id"]),
            (&6001.into(), &7000.into())
        );
        let left = json(&dir, &args(&fresh(&["get", "12", "--json"])));
        assert_eq!(left["status"], "pending", "{left}");
        // Archived pids are never issued again: a run does the five others only.
        ok(tranche(
            &dir,
            &args(&fresh(&["run", "--simulate", "--sim-latency", "0..0"])),
        ));
        let done = json(&dir, &args(&fresh(&["status", "--json"])));
        assert_eq!(counts(&done), (15, 15, 0, 0), "{done}");
        let stats = json(&dir, &args(&fresh(&["stats", "--json"])));
        assert_eq!(stats["completed"]["global_stats"]["total_completed"], 15);
        // Not into a namespace that holds anything.
        let line = fails(&dir, &args(&fresh(&["import", file])), 2);
        assert!(line.contains("not empty"), "{line}");
    }
}
