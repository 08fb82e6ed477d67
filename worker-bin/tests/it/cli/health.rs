//! `health` rules firing on a broken job, dead letters counted and alerted, and
//! `check --repair` re-driving them.

use super::*;

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
