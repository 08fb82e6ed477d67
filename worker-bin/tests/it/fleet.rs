//! End to end on a private redis-server, and on a private 3-master Redis Cluster: three
//! `tranche run` processes share a job, one is killed with SIGKILL half way, and the job
//! still finishes with every ID processed, every partition archived exactly once and the
//! statistics consistent.

use crate::support;

use crate::common;

use std::time::Duration;

use common::{LoggedChild, assert_every_id_processed, chunk_log, eventually, ok, scratch, tranche};
use support::{TestCluster, TestRedis};

const MIN: u64 = 1;
const MAX: u64 = 60_000;
const SIZE: u64 = 1000;

#[test]
fn three_workers_one_killed_half_way() {
    let redis = TestRedis::start();
    fleet(&redis.url(), None, "fleet");
}

/// The same fleet on three masters, its 16 shards spread over all of them: each
/// worker's claims, completions and the archivers' passes go to every master.
#[test]
fn three_workers_one_killed_half_way_on_three_masters() {
    let cluster = TestCluster::start(3);
    fleet(&cluster.url(), Some(16), "fleet-cluster");
    let mut holding = 0;
    for master in cluster.masters() {
        let keys: Vec<String> = master.query(redis::cmd("KEYS").arg("{reindex:*"));
        if !keys.is_empty() {
            holding += 1;
        }
    }
    assert_eq!(holding, 3, "every master holds shard keys of the job");
}

/// Plans 60 partitions (`shards` of them, or the default), runs three workers, kills
/// one half way and checks everything the job left behind.
fn fleet(url: &str, shards: Option<u32>, name: &str) {
    let url = url.to_owned();
    let dir = scratch(name);
    let log = dir.join("chunks.log");
    let script = common::example_script();
    let exec = format!("{} && sleep 0.02", script.display());
    let cmd = |args: &[&str]| {
        let mut c = tranche(&dir, args);
        c.env("TRANCHE_REDIS_URL", &url)
            .env("TRANCHE_NAMESPACE", "reindex")
            .env("TRANCHE_LOG", &log)
            .env("TRANCHE_ARCHIVE_CLAIM_IDLE", "1s");
        c
    };
    let (min, max, size) = (MIN.to_string(), MAX.to_string(), SIZE.to_string());
    let mut plan = vec!["plan", "--min", &min, "--max", &max, "--size", &size];
    let shards = shards.map(|s| s.to_string());
    if let Some(shards) = &shards {
        plan.extend(["--shards", shards.as_str()]);
    }
    ok(cmd(&plan));

    let spawn = |id: &str| {
        let mut run = cmd(&[
            "run",
            "--exec",
            &exec,
            "--chunk",
            "250",
            "--parallel",
            "2",
            "--concurrency",
            "2",
            "--lease",
            "2s",
            "--worker-id",
            id,
            // Small thresholds: the job crosses into the compressed tier.
            "--compressed-at",
            "20",
            "--summary-at",
            "100000",
        ]);
        LoggedChild::spawn(&mut run, &dir, id)
    };
    let mut workers = [spawn("w1"), spawn("w2"), spawn("w3")];

    // Half way through, w1 dies without a word: its leases must expire and be redone.
    let partitions = (MAX - MIN + 1) / SIZE;
    eventually(Duration::from_secs(120), "a third of the chunks", || {
        chunk_log(&log).len() as u64 >= partitions * 4 / 3
    });
    workers[0].child.kill().expect("SIGKILL w1");
    let killed = workers[0].wait(Duration::from_secs(10));
    assert_eq!(killed.code(), None, "w1 should die of SIGKILL");

    for w in workers.iter_mut().skip(1) {
        let status = w.wait(Duration::from_secs(180));
        let out = w.stdout() + &w.stderr();
        assert!(status.success(), "{} exited {status:?}\n{out}", w.name());
        assert!(out.contains("run finished"), "{}:\n{out}", w.name());
    }

    let log = chunk_log(&log);
    assert_every_id_processed(&log, MIN, MAX);

    // Nothing is left active and every partition is archived, once.
    let status: serde_json::Value = serde_json::from_str(&ok(cmd(&["status", "--json"]))).unwrap();
    for field in [
        "unissued", "pending", "claimed", "running", "failed", "inbox",
    ] {
        assert_eq!(status[field], 0, "{field} in {status}");
    }
    assert_eq!(status["archived"], partitions, "{status}");
    let stats: serde_json::Value = serde_json::from_str(&ok(cmd(&["stats", "--json"]))).unwrap();
    assert_eq!(
        stats["completed"]["global_stats"]["total_completed"],
        partitions
    );
    assert_eq!(
        stats["completed"]["global_stats"]["total_processed_data"],
        MAX - MIN + 1
    );
    // The default leaves the per-range statistics out and says so; `--ranges` adds them.
    assert_eq!(stats["ranges_included"], false, "{stats}");
    assert!(stats["completed"].get("range_stats").is_none(), "{stats}");
    let full: serde_json::Value =
        serde_json::from_str(&ok(cmd(&["stats", "--ranges", "--json"]))).unwrap();
    assert_eq!(full["ranges_included"], true, "{full}");
    let ranges = full["completed"]["range_stats"].as_object().unwrap();
    let counted: u64 = ranges
        .values()
        .map(|r| r["completed_count"].as_u64().unwrap())
        .sum();
    assert_eq!(counted, partitions);
    assert_eq!(
        full["completed"]["global_stats"],
        stats["completed"]["global_stats"]
    );

    // The statistics agree with the archive record by record.
    let check = ok(cmd(&["check"]));
    assert!(
        check.contains(&format!("against {partitions} archived record(s)")),
        "{check}"
    );
    assert!(check.contains("consistent"), "{check}");

    // Every pid answers as archived, with a worker that really ran it.
    for pid in [1, 17, 33, 60] {
        let v: serde_json::Value =
            serde_json::from_str(&ok(cmd(&["get", &pid.to_string(), "--json"]))).unwrap();
        assert_eq!(v["layer"], "archive", "{v}");
        let worker = v["worker"].as_str().unwrap().to_owned();
        assert!(["w1", "w2", "w3"].contains(&worker.as_str()), "{v}");
    }
    // An export holds each partition once.
    let dump = dir.join("reindex.dump");
    let out = ok(cmd(&["export", "-o", dump.to_str().unwrap()]));
    assert!(
        out.starts_with(&format!("exported {partitions} records")),
        "{out}"
    );
    let health = common::output(cmd(&["health"]));
    assert!(
        health.status.success(),
        "{}",
        String::from_utf8_lossy(&health.stdout)
    );
}

/// The same binary on a (one-node) Redis Cluster: the cluster client is chosen by
/// itself, and every script keeps to one slot (the node refuses cross-slot scripts).
#[test]
fn a_job_on_redis_cluster() {
    let redis = TestRedis::start_cluster();
    let dir = scratch("cluster");
    let url = redis.url();
    let base = ["--redis", url.as_str(), "--namespace", "c"];
    let with = |rest: &[&str]| {
        let mut v = base.to_vec();
        v.extend_from_slice(rest);
        tranche(&dir, &v)
    };
    ok(with(&[
        "plan", "--min", "1", "--max", "50000", "--size", "500", "--shards", "3",
    ]));
    let out = ok(with(&[
        "run",
        "--simulate",
        "--sim-latency",
        "0..2",
        "--concurrency",
        "4",
        "--compressed-at",
        "30",
        "--summary-at",
        "60",
        "--summary-ttl",
        "1h",
    ]));
    assert!(out.contains("run finished"), "{out}");
    let status: serde_json::Value = serde_json::from_str(&ok(with(&["status", "--json"]))).unwrap();
    assert_eq!(status["archived"], 100, "{status}");
    assert_eq!(status["shards"], 3, "{status}");
    assert!(ok(with(&["check"])).contains("consistent"));
    // Records of all three tiers answer.
    for pid in [1, 45, 99] {
        let v: serde_json::Value =
            serde_json::from_str(&ok(with(&["get", &pid.to_string(), "--json"]))).unwrap();
        assert_eq!(v["layer"], "archive", "{v}");
    }
}

/// `check` recomputes the statistics from the archive page by page and reports what
/// differs (exit 1); `check --repair` rewrites them, after which they agree again.
#[test]
fn check_finds_and_repairs_damaged_statistics() {
    let redis = TestRedis::start();
    let dir = scratch("repair");
    let url = redis.url();
    let with = |rest: &[&str]| {
        let mut v = vec!["--redis", url.as_str(), "--namespace", "r"];
        v.extend_from_slice(rest);
        tranche(&dir, &v)
    };
    ok(with(&[
        "plan", "--min", "1", "--max", "30000", "--size", "100", "--shards", "2",
    ]));
    ok(with(&[
        "run",
        "--simulate",
        "--sim-latency",
        "0..3",
        "--concurrency",
        "8",
    ]));
    assert!(ok(with(&["check"])).contains("consistent"));

    // Lose shard 0's statistics: its partitions vanish from the totals.
    let schema = tranche_codec::KeySchema::new("r", 2).unwrap();
    let keys: Vec<String> = redis.query(redis::cmd("KEYS").arg(schema.stats(0, "*")));
    assert!(!keys.is_empty(), "shard 0 keeps statistics");
    let _: () = redis.query(redis::cmd("DEL").arg(&keys));
    let stats = |w: &dyn Fn(&[&str]) -> std::process::Command| -> serde_json::Value {
        serde_json::from_str(&ok(w(&["stats", "--json"]))).unwrap()
    };
    let left = stats(&with)["completed"]["global_stats"]["total_completed"]
        .as_u64()
        .unwrap();
    assert!(0 < left && left < 300, "{left} of 300 left");

    // And put shard 1's kept status counters off (a writer that does not count).
    let counts = schema.shard_key(1, "counts");
    let _: () = redis.query(redis::cmd("HSET").arg(counts).arg("p").arg(5));
    let status: serde_json::Value = serde_json::from_str(&ok(with(&["status", "--json"]))).unwrap();
    assert_eq!(status["pending"], 5, "{status}");

    let damaged = common::output(with(&["check"]));
    assert_eq!(damaged.status.code(), Some(1), "{damaged:?}");
    let report = String::from_utf8_lossy(&damaged.stdout);
    assert!(report.contains("total_completed"), "{report}");
    assert!(
        report.contains("active_counts.pending: expected 0, found 5"),
        "{report}"
    );

    ok(with(&["check", "--repair"]));
    assert!(ok(with(&["check"])).contains("consistent"));
    let status: serde_json::Value = serde_json::from_str(&ok(with(&["status", "--json"]))).unwrap();
    assert_eq!(status["pending"], 0, "{status}");
    let repaired = stats(&with);
    assert_eq!(
        repaired["completed"]["global_stats"]["total_completed"],
        300
    );
    assert_eq!(
        repaired["completed"]["global_stats"]["total_processed_data"],
        30000
    );
}

/// A dump carries the plans: imported into another namespace, archived pids answer from
/// the archive and are never issued again, and the partitions the export did not hold
/// as archived are pending, so one `run` finishes the job there.
#[test]
fn import_restores_plans_and_leaves_only_unarchived_work() {
    let redis = TestRedis::start();
    let dir = scratch("import-plans");
    let url = redis.url();
    let log = dir.join("chunks.log");
    let with = |ns: &str, rest: &[&str]| {
        let mut v = vec!["--redis", url.as_str(), "--namespace", ns];
        v.extend_from_slice(rest);
        let mut c = tranche(&dir, &v);
        c.env("TRANCHE_LOG", &log);
        c
    };
    ok(with(
        "a",
        &[
            "plan", "--min", "1", "--max", "20000", "--size", "100", "--shards", "2",
        ],
    ));
    // One attempt each and a failure rate: some partitions end failed, not archived.
    let first = common::output(with(
        "a",
        &[
            "run",
            "--simulate",
            "--sim-latency",
            "0..1",
            "--sim-fail",
            "0.05",
            "--max-attempts",
            "1",
            "--chunk",
            "50",
        ],
    ));
    assert_eq!(first.status.code(), Some(1), "{first:?}");
    let a: serde_json::Value = serde_json::from_str(&ok(with("a", &["status", "--json"]))).unwrap();
    let failed = a["failed"].as_u64().unwrap();
    assert!(failed > 0 && failed < 200, "{a}");
    assert_eq!(a["archived"].as_u64().unwrap() + failed, 200, "{a}");
    let failed_pids: Vec<u64> = (1..=200)
        .filter(|pid| {
            let v: serde_json::Value =
                serde_json::from_str(&ok(with("a", &["get", &pid.to_string(), "--json"]))).unwrap();
            v["layer"] == "active"
        })
        .collect();
    assert_eq!(failed_pids.len() as u64, failed);

    let dump = dir.join("a.dump");
    ok(with("a", &["export", "-o", dump.to_str().unwrap()]));
    let out = ok(with("b", &["import", dump.to_str().unwrap()]));
    assert!(out.contains(&format!("{failed} partition(s)")), "{out}");

    let b: serde_json::Value = serde_json::from_str(&ok(with("b", &["status", "--json"]))).unwrap();
    assert_eq!(b["partitions"], 200, "{b}");
    assert_eq!(b["unissued"], 0, "{b}");
    assert_eq!(b["pending"].as_u64().unwrap(), failed, "{b}");
    assert_eq!(b["archived"].as_u64().unwrap(), 200 - failed, "{b}");
    let archived_pid = (1..=200).find(|p| !failed_pids.contains(p)).unwrap();
    let v: serde_json::Value = serde_json::from_str(&ok(with(
        "b",
        &["get", &archived_pid.to_string(), "--json"],
    )))
    .unwrap();
    assert_eq!(v["layer"], "archive", "{v}");
    let v: serde_json::Value = serde_json::from_str(&ok(with(
        "b",
        &["get", &failed_pids[0].to_string(), "--json"],
    )))
    .unwrap();
    assert_eq!(v["status"], "pending", "{v}");

    // Only the unarchived partitions run again, each once.
    std::fs::remove_file(&log).ok();
    let exec = common::example_script();
    ok(with(
        "b",
        &["run", "--exec", exec.to_str().unwrap(), "--chunk", "100"],
    ));
    let mut ran: Vec<u64> = chunk_log(&log).iter().map(|c| c.0).collect();
    ran.sort_unstable();
    assert_eq!(ran, failed_pids);
    let b: serde_json::Value = serde_json::from_str(&ok(with("b", &["status", "--json"]))).unwrap();
    assert_eq!(b["archived"], 200, "{b}");
    assert!(ok(with("b", &["check"])).contains("consistent"));
}

/// An archiver killed mid-pass leaves the inbox entries it had read pending under its
/// name; a sweep takes them over only after `claim_idle` (here an hour). The drain that
/// ends `tranche archive` and `run` takes them over after a few seconds instead: the
/// job is done, every live archiver is finishing too, and the fleet does not wait the
/// dead one's hour. (Before, this `archive` waited `claim_idle` and 5 s, then gave up.)
#[test]
fn a_drain_takes_over_a_killed_archivers_entries_without_waiting_claim_idle() {
    let redis = TestRedis::start();
    let dir = scratch("drain-takeover");
    let url = redis.url();
    let cmd = |args: &[&str]| {
        let mut c = tranche(
            &dir,
            &[
                &["--redis", &url, "--namespace", "dt", "--shards", "2"][..],
                args,
            ]
            .concat(),
        );
        c.env("TRANCHE_ARCHIVE_CLAIM_IDLE", "1h");
        c
    };
    ok(cmd(&[
        "plan", "--min", "1", "--max", "40000", "--size", "1000",
    ]));
    ok(cmd(&[
        "run",
        "--simulate",
        "--sim-latency",
        "0..1",
        "--no-archiver",
    ]));
    // The killed archiver: it read every entry (so they are pending under its name) and
    // never acknowledged one.
    let schema = tranche_codec::KeySchema::new("dt", 2).unwrap();
    let mut held = 0;
    for shard in schema.shards() {
        let inbox = schema.inbox(shard);
        let _: redis::Value = redis.query(
            redis::cmd("XGROUP")
                .arg("CREATE")
                .arg(&inbox)
                .arg("archivers")
                .arg("0")
                .arg("MKSTREAM"),
        );
        let _: redis::Value = redis.query(
            redis::cmd("XREADGROUP")
                .arg("GROUP")
                .arg("archivers")
                .arg("killed")
                .arg("STREAMS")
                .arg(&inbox)
                .arg(">"),
        );
        let pending: (u64, redis::Value, redis::Value, redis::Value) =
            redis.query(redis::cmd("XPENDING").arg(&inbox).arg("archivers"));
        held += pending.0;
    }
    assert!(held > 0);

    let mut archive = LoggedChild::spawn(&mut cmd(&["archive", "--json"]), &dir, "archive");
    // A hang guard, far below the hour the old drain waited.
    let status = archive.wait(Duration::from_secs(120));
    let stdout = archive.stdout();
    assert!(status.success(), "{status:?} {stdout}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["inbox_left"], 0, "{v}");
    for shard in schema.shards() {
        let len: u64 = redis.query(redis::cmd("XLEN").arg(schema.inbox(shard)));
        assert_eq!(len, 0, "shard {shard}");
    }
    let out = ok(cmd(&["check"]));
    assert!(out.contains("consistent"), "{out}");
    let status = ok(cmd(&["status", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(v["archived"], 40, "{v}");
}
