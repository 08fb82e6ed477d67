//! The operator's commands on both backends: `list` pages, `discard`, retries of a
//! broken command, export targets, pause and resume, namespaces, `--json` errors and
//! the key layout a namespace keeps; in `archive`, the statistics' counts and moving
//! a namespace's archive out and back in.

use super::*;

mod archive;

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
