//! Operating a job through the real binary: error lines an operator reads, the
//! statistics' counts, and moving a namespace's archive out and back in (dumps, JSON
//! lines, and the seed's hashes of JSON).

use crate::support;

use crate::common;

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

/// The seed's record of a completed partition `pid` (of 1,000 IDs), as its hash holds it.
fn seed_record(pid: u64, worker: &str, completed_at: u64, duration: u64) -> String {
    format!(
        r#"{{"pid":{pid},"min_id":{},"max_id":{},"worker_id":"{worker}","completed_at":{completed_at},"duration":{duration}}}"#,
        (pid - 1) * 1000 + 1,
        pid * 1000
    )
}

fn hgetall(redis: &TestRedis, key: &str) -> std::collections::BTreeMap<String, String> {
    redis.query(redis::cmd("HGETALL").arg(key))
}

#[test]
fn the_seed_hashes_are_adopted_and_rolled_back() {
    let redis = TestRedis::start();
    let url = redis.url();
    let dir = scratch("seed-hashes");
    // Ten partitions of 1,000 IDs: 1..=4 completed, the rest active in every status.
    for pid in 1..=4 {
        let value = seed_record(
            pid,
            ["worker1", "worker2"][pid as usize % 2],
            1_719_234_400 + pid,
            290 + pid,
        );
        let _: i64 = redis.query(redis::cmd("HSET").arg("elk_completed").arg(pid).arg(value));
    }
    let active = [
        (5, "pending", "", Some(0)),
        (6, "claimed", "old-1", Some(1)),
        (7, "running", "old-1", Some(2)),
        (8, "failed", "old-2", Some(5)),
        (9, "pending", "", None),
        (10, "pending", "", Some(3)),
    ];
    for (pid, status, worker, attempts) in active {
        let attempts = attempts.map_or(String::new(), |a| format!(r#","attempts":{a}"#));
        let value = format!(
            r#"{{"pid":{pid},"min_id":{},"max_id":{},"worker_id":"{worker}","status":"{status}"{attempts}}}"#,
            (pid - 1) * 1000 + 1,
            pid * 1000
        );
        let _: i64 = redis.query(redis::cmd("HSET").arg("elk_partitions").arg(pid).arg(value));
    }
    let r = |rest: &[&str]| {
        let mut v = with(Some(&url), &["--namespace", "adopted"]);
        v.extend(rest.iter().map(|s| s.to_string()));
        v
    };
    let import = r(&[
        "import",
        "--from-hash",
        "elk_partitions",
        "--completed-hash",
        "elk_completed",
    ]);
    let said = ok(tranche(&dir, &args(&import)));
    assert!(
        said.contains("one plan of 10 partitions of 1000 IDs"),
        "{said}"
    );
    let status = json(&dir, &args(&r(&["status", "--json"])));
    let n = |k: &str| status[k].as_u64().unwrap();
    assert_eq!(
        (
            n("partitions"),
            n("archived"),
            n("pending"),
            n("failed"),
            n("unissued")
        ),
        (10, 4, 5, 1, 0),
        "{status}"
    );
    let stats = json(&dir, &args(&r(&["stats", "--json"])));
    assert_eq!(
        stats["completed"]["global_stats"]["total_completed"], 4,
        "{stats}"
    );
    assert_eq!(
        stats["completed"]["worker_stats"]["worker1"]["completed_count"], 2,
        "{stats}"
    );

    let done = json(&dir, &args(&r(&["get", "3", "--json"])));
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["completed_at_ms"], 1_719_234_403_000u64, "{done}");
    assert_eq!(done["duration_ms"], 293_000, "{done}");
    let running = json(&dir, &args(&r(&["get", "7", "--json"])));
    assert_eq!(
        (&running["status"], &running["attempt"]),
        (&"pending".into(), &2.into()),
        "{running}"
    );
    let failed = json(&dir, &args(&r(&["get", "8", "--json"])));
    assert_eq!(
        (&failed["status"], &failed["attempt"]),
        (&"failed".into(), &5.into()),
        "{failed}"
    );
    assert_eq!(failed["worker"], "old-2", "{failed}");
    assert_eq!(json(&dir, &args(&r(&["get", "9", "--json"])))["attempt"], 0);

    // Again: nothing changes.
    let again = ok(tranche(&dir, &args(&import)));
    assert!(again.contains("nothing changed"), "{again}");
    assert_eq!(json(&dir, &args(&r(&["status", "--json"]))), status);
    // Another job's hashes are refused, in one line.
    let _: i64 = redis.query(
        redis::cmd("HSET")
            .arg("other")
            .arg(1)
            .arg(seed_record(1, "x", 1, 1)),
    );
    let line = fails(&dir, &args(&r(&["import", "--completed-hash", "other"])), 2);
    assert!(line.contains("not empty"), "{line}");

    // The rest runs here; the failed one stays failed (exit 1 says so).
    let out = output(tranche(
        &dir,
        &args(&r(&[
            "run",
            "--simulate",
            "--sim-latency",
            "0..0",
            "--worker-id",
            "new-1",
        ])),
    ));
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = json(&dir, &args(&r(&["status", "--json"])));
    assert_eq!(
        (status["archived"].as_u64(), status["failed"].as_u64()),
        (Some(9), Some(1))
    );

    // Back into one hash of the seed's JSON, twice: the second writes the same.
    let export = r(&["export", "--to-hash", "elk_completed_back"]);
    for _ in 0..2 {
        let said = ok(tranche(&dir, &args(&export)));
        assert!(said.contains("exported 9 records"), "{said}");
        let back = hgetall(&redis, "elk_completed_back");
        let pids: Vec<u64> = back
            .keys()
            .map(|k| k.parse().unwrap())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        assert_eq!(pids, [1, 2, 3, 4, 5, 6, 7, 9, 10]);
        for (pid, value) in &back {
            let pid: u64 = pid.parse().unwrap();
            if pid <= 4 {
                assert_eq!(value, &hgetall(&redis, "elk_completed")[&pid.to_string()]);
                continue;
            }
            // Run here: this worker, times in whole seconds, in the seed's exact form.
            let v: Value = serde_json::from_str(value).unwrap();
            let (at, took) = (v["completed_at"].as_u64(), v["duration"].as_u64());
            assert!(at.is_some() && took.is_some(), "integers: {value}");
            assert_eq!(
                value,
                &seed_record(pid, "new-1", at.unwrap(), took.unwrap())
            );
        }
    }
    // And the rolled-back hash adopts again, into a fresh namespace.
    let fresh = with(
        Some(&url),
        &[
            "--namespace",
            "again",
            "import",
            "--completed-hash",
            "elk_completed_back",
            "--from-hash",
            "elk_partitions_none",
        ],
    );
    let line = fails(&dir, &args(&fresh), 2);
    assert!(line.contains("pid 8 is in neither hash"), "{line}");

    // Partitions of different sizes become one explicit range each.
    let uneven = [
        (
            "elk_done_uneven",
            2,
            r#"{"pid":2,"min_id":1001,"max_id":1500,"worker_id":"w","completed_at":1719234405,"duration":295}"#,
        ),
        (
            "elk_active_uneven",
            1,
            r#"{"pid":1,"min_id":1,"max_id":1000,"status":"pending"}"#,
        ),
        (
            "elk_active_uneven",
            3,
            r#"{"pid":3,"min_id":1501,"max_id":2500,"status":"claimed","attempts":1}"#,
        ),
    ];
    for (key, pid, value) in uneven {
        let _: i64 = redis.query(redis::cmd("HSET").arg(key).arg(pid).arg(value));
    }
    let u = |rest: &[&str]| {
        let mut v = with(Some(&url), &["--namespace", "uneven"]);
        v.extend(rest.iter().map(|s| s.to_string()));
        v
    };
    let said = ok(tranche(
        &dir,
        &args(&u(&[
            "import",
            "--from-hash",
            "elk_active_uneven",
            "--completed-hash",
            "elk_done_uneven",
        ])),
    ));
    assert!(said.contains("3 explicit ranges"), "{said}");
    let pending = json(&dir, &args(&u(&["get", "3", "--json"])));
    assert_eq!(
        (&pending["status"], &pending["attempt"]),
        (&"pending".into(), &1.into()),
        "{pending}"
    );
    assert_eq!(
        (&pending["min_id"], &pending["max_id"]),
        (&1501.into(), &2500.into())
    );
    ok(tranche(
        &dir,
        &args(&u(&["run", "--simulate", "--sim-latency", "0..0"])),
    ));
    let status = json(&dir, &args(&u(&["status", "--json"])));
    assert_eq!(
        (status["partitions"].as_u64(), status["archived"].as_u64()),
        (Some(3), Some(3)),
        "{status}"
    );
    assert_eq!(
        json(&dir, &args(&u(&["get", "2", "--json"])))["max_id"],
        1500
    );

    // Neither is offered embedded.
    let line = fails(&dir, &["import", "--from-hash", "elk_partitions"], 2);
    assert!(line.contains("give --redis"), "{line}");
    ok(tranche(&dir, &["plan", "--min", "1", "--max", "10"]));
    let line = fails(&dir, &["export", "--to-hash", "k"], 2);
    assert!(line.contains("give --redis"), "{line}");
}

/// Embedded, `namespaces` asks each state file beside `--state` which namespace it
/// holds: a file named freely (`x.state` holding `tranche`) is listed, not refused.
#[test]
fn embedded_namespaces_read_each_state_file() {
    let dir = scratch("namespaces-embedded");
    let x = dir.join("x.state");
    let y = dir.join("y.state");
    let (x, y) = (x.to_str().unwrap(), y.to_str().unwrap());
    ok(tranche(
        &dir,
        &["--state", x, "plan", "--min", "1", "--max", "3000"],
    ));
    ok(tranche(
        &dir,
        &[
            "--state",
            y,
            "--namespace",
            "other",
            "plan",
            "--min",
            "1",
            "--max",
            "5000",
        ],
    ));
    let out = output(tranche(&dir, &["--state", x, "namespaces", "--json"]));
    assert!(out.status.success());
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let listed: Vec<(&str, u64)> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["namespace"].as_str().unwrap(),
                r["partitions"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(listed, [("tranche", 3), ("other", 5)]);
}

/// `list archived --worker W` reads a bounded number of records per page: where W
/// holds nothing, a page over 25,000 archived partitions ends early with a cursor to go
/// on from, instead of walking the whole archive, and following the cursors ends.
#[test]
fn a_filtered_archive_listing_is_paged_by_what_it_reads() {
    let dir = scratch("list-bounded");
    ok(tranche(
        &dir,
        &["plan", "--min", "1", "--max", "25000", "--size", "1"],
    ));
    ok(tranche(
        &dir,
        &[
            "run",
            "--simulate",
            "--sim-latency",
            "0..0",
            "--chunk",
            "1",
            "--concurrency",
            "64",
            "--worker-id",
            "w1",
        ],
    ));
    let page = |after: u64| -> Value {
        serde_json::from_str(&ok(tranche(
            &dir,
            &[
                "list",
                "archived",
                "--worker",
                "nobody",
                "--after",
                &after.to_string(),
                "--json",
            ],
        )))
        .unwrap()
    };
    let first = page(0);
    assert_eq!(first["partitions"], serde_json::json!([]));
    let next = first["next"].as_u64().expect("a cursor to go on from");
    assert!((1..25_000).contains(&next), "{first}");
    let mut after = next;
    for _ in 0..10 {
        let Some(n) = page(after)["next"].as_u64() else {
            break;
        };
        assert!(n > after, "the cursor moves forward");
        after = n;
    }
    assert!(page(after)["next"].is_null(), "the pages never end");
    // The worker that did the job is found on the first page.
    let mine = serde_json::from_str::<Value>(&ok(tranche(
        &dir,
        &[
            "list", "archived", "--worker", "w1", "--limit", "3", "--json",
        ],
    )))
    .unwrap();
    assert_eq!(mine["partitions"].as_array().unwrap().len(), 3);
}

/// `archive-format`: a namespace is at format 1 until raised, is never lowered, and a
/// job archived at format 2 (layout 2 segments, ranked batches) reads back whole:
/// `get`, `check --repair` finding nothing, and a dump restored elsewhere. Embedded
/// namespaces have no segment format and say so in one line.
#[test]
fn archive_format_2_is_raised_only_when_asked_and_reads_back() {
    archive_format_is_raised_only_when_asked_and_reads_back(2);
}

/// The same at format 3: the statistics' ranges are packed bodies (flag 16), which
/// `check --repair` reads and compares with the records, finding nothing.
#[test]
fn archive_format_3_is_raised_only_when_asked_and_reads_back() {
    archive_format_is_raised_only_when_asked_and_reads_back(3);
}

/// The flags byte of the first range body of a statistics ranges block value
/// (`varint(base)`, then `slot`, `varint(len)`, body; `apply_delta.lua`'s layout).
fn first_range_flags(block: &[u8]) -> u8 {
    let mut at = block.iter().position(|&b| b < 0x80).unwrap() + 1;
    at += 1; // slot
    at += block[at..].iter().position(|&b| b < 0x80).unwrap() + 1;
    block[at]
}

fn archive_format_is_raised_only_when_asked_and_reads_back(to: u8) {
    let redis = TestRedis::start();
    let url = redis.url();
    let dir = scratch("archive-format");
    let r = |rest: &[&str]| with(Some(url.as_str()), rest);
    ok(tranche(
        &dir,
        &args(&r(&[
            "plan",
            "--min",
            "1",
            "--max",
            "30000",
            "--size",
            "10",
            "--shards",
            "1",
            "--compressed-at",
            "100",
        ])),
    ));
    let format = |rest: &[&str]| {
        let mut v = vec!["--json", "archive-format"];
        v.extend(rest);
        json(&dir, &args(&r(&v)))
    };
    assert_eq!(format(&[])["archive_format"], 1);
    let raised = format(&["--raise", &to.to_string()]);
    assert_eq!(
        (&raised["was"], &raised["archive_format"]),
        (&1.into(), &to.into())
    );
    assert_eq!(
        format(&["--raise", "1"])["archive_format"],
        to,
        "never lowered"
    );
    ok(tranche(
        &dir,
        &args(&r(&[
            "run",
            "--simulate",
            "--sim-latency",
            "0..0",
            "--chunk",
            "10",
            "--compressed-at",
            "100",
        ])),
    ));
    // Three segments of ten batches, each in layout 2.
    let mut conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let segments: Vec<String> = redis::cmd("KEYS")
        .arg("*:completed:seg:*")
        .query(&mut conn)
        .unwrap();
    assert!(!segments.is_empty(), "no segment was joined");
    for key in &segments {
        let head: Vec<u8> = redis::cmd("GETRANGE")
            .arg(key)
            .arg(0)
            .arg(0)
            .query(&mut conn)
            .unwrap();
        assert_eq!(head, [2], "{key} is not in segment layout 2");
    }
    // Format 3 packs the statistics' ranges (flag 16); format 2 does not.
    let ranges: Vec<String> = redis::cmd("KEYS")
        .arg("*:stats:ranges")
        .query(&mut conn)
        .unwrap();
    assert!(!ranges.is_empty(), "no statistics ranges");
    for key in &ranges {
        let blocks: Vec<Vec<u8>> = redis::cmd("HVALS").arg(key).query(&mut conn).unwrap();
        for block in blocks {
            let packed = first_range_flags(&block) & 16 != 0;
            assert_eq!(packed, to >= 3, "{key}: {block:?}");
        }
    }
    let got = json(&dir, &args(&r(&["get", "1234", "--json"])));
    assert_eq!(got["status"], "completed", "{got}");
    assert_eq!(
        (&got["min_id"], &got["max_id"]),
        (&12331.into(), &12340.into())
    );
    let repair = json(&dir, &args(&r(&["check", "--repair", "--json"])));
    assert_eq!(repair["differences"], serde_json::json!([]), "{repair}");
    assert_eq!(repair["damaged"], serde_json::json!([]), "{repair}");
    assert_eq!(repair["records"], 3000, "{repair}");

    let file = dir.join(format!("f{to}.dump"));
    let file = file.to_str().unwrap();
    ok(tranche(&dir, &args(&r(&["export", "-o", file]))));
    ok(tranche(
        &dir,
        &args(&r(&["--namespace", "restored", "import", file])),
    ));
    let back = json(
        &dir,
        &args(&r(&["--namespace", "restored", "get", "1234", "--json"])),
    );
    assert_eq!(back["status"], "completed", "{back}");

    let embedded = scratch("archive-format-embedded");
    ok(tranche(&embedded, &["plan", "--min", "1", "--max", "100"]));
    let line = fails(
        &embedded,
        &["archive-format", "--raise", &to.to_string()],
        2,
    );
    assert!(line.contains("needs --redis"), "{line}");
}
