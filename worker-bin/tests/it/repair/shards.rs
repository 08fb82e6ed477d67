//! A corrupt statistics value stalls its shard alone: `archive` ends naming it,
//! `check --repair` rebuilds it, `run` ends promptly on it.

use super::*;

/// The scenario: a finished 50-partition job on 2 shards, a corrupt `ranges`
/// value of shard 0, 50 more partitions run with `--no-archiver`.
#[test]
fn a_corrupt_statistics_value_stalls_one_shard_and_is_repaired() {
    let redis = TestRedis::start();
    let dir = scratch("repair-stats");
    let url = redis.url();
    let cmd = |args: &[&str]| {
        tranche(
            &dir,
            &[
                &["--redis", &url, "--namespace", "st", "--shards", "2"][..],
                args,
            ]
            .concat(),
        )
    };
    let run = |extra: &[&str]| {
        ok(cmd(&[
            &["run", "--simulate", "--sim-latency", "0..1"][..],
            extra,
        ]
        .concat()))
    };
    ok(cmd(&[
        "plan", "--min", "1", "--max", "50000", "--size", "1000",
    ]));
    run(&[]);
    let schema = tranche_codec::KeySchema::new("st", 2).unwrap();
    let ranges = schema.stats(0, "ranges");
    let _: i64 = redis.query(redis::cmd("HSET").arg(&ranges).arg("0").arg(b"\x80"));
    ok(cmd(&[
        "plan", "--min", "50001", "--max", "100000", "--size", "1000",
    ]));
    run(&["--no-archiver"]);
    let (inbox0, inbox1) = (schema.inbox(0), schema.inbox(1));
    let stuck = xlen(&redis, &inbox0);
    assert!(stuck > 0 && xlen(&redis, &inbox1) > 0);

    // The archive ends, non-zero, naming shard 0; shard 1's records are archived.
    let started = Instant::now();
    let out = output(cmd(&["archive"]));
    let (stdout, stderr) = text(&out);
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    // Log lines say what each pass met; the outcome is one line.
    let said: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("tranche: "))
        .collect();
    assert_eq!(said.len(), 1, "{stderr}");
    assert!(said[0].contains("archive stalled on shard 0:"), "{stderr}");
    assert!(stderr.contains("check --repair"), "{stderr}");
    assert!(stdout.contains("shard 0: statistics damaged"), "{stdout}");
    assert_eq!(xlen(&redis, &inbox1), 0, "shard 1 archived");
    assert_eq!(
        xlen(&redis, &inbox0),
        stuck,
        "shard 0's records left in place"
    );
    // In JSON too, with the stall.
    let out = output(cmd(&["archive", "--json"]));
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["inbox_left"], stuck, "{v}");
    assert_eq!(v["stalled"][0]["shard"], 0, "{v}");

    // `health` fires the stall and the damage, naming the shard.
    let fired = firing(&cmd, &[]);
    assert_eq!(
        names(&fired),
        ["archive_stalled_shards", "statistics_damaged"],
        "{fired:?}"
    );
    assert!(
        fired[0].1.contains("archive stalled on shard 0"),
        "{fired:?}"
    );
    assert!(
        fired[1].1.contains("statistics damaged on shard 0"),
        "{fired:?}"
    );
    // And `/metrics`, which the shipped alerting rules read.
    let serve = Serve::start(cmd(&["serve", "--listen", "127.0.0.1:0"]));
    assert_eq!(serve.gauge("tranche_archive_stalled_shards"), 1.0);
    assert_eq!(serve.gauge("tranche_statistics_damaged_shards"), 1.0);

    // `check` reports the damage as a finding (exit 1), not an error (exit 2).
    let out = output(cmd(&["check"]));
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(
        stdout.contains("damaged: shard 0 stats:ranges field \"0\""),
        "{stdout}"
    );
    assert!(stderr.contains("corrupt statistics in shard 0"), "{stderr}");
    let out = output(cmd(&["check", "--json"]));
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["damaged"][0]["shard"], 0, "{v}");
    assert_eq!(v["damaged"][0]["hash"], "ranges", "{v}");

    // `check --repair` quarantines the bad value and rebuilds the shard.
    let out = output(cmd(&["check", "--repair"]));
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("shard 0: 1 damaged value(s) quarantined"),
        "{stdout}"
    );
    let quarantine = schema.stats(0, "quarantine");
    let kept: Vec<(String, Vec<u8>)> = redis.query(redis::cmd("HGETALL").arg(&quarantine));
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert!(kept[0].0.starts_with("ranges:0@"), "{kept:?}");
    assert_eq!(kept[0].1, b"\x80");

    // Then the archive drains, `check` is clean, `health` all ok, and every partition
    // is counted once.
    let out = ok(cmd(&["archive"]));
    assert!(
        out.contains("archive drained; 0 inbox entries left"),
        "{out}"
    );
    let out = ok(cmd(&["check"]));
    assert!(out.contains("consistent"), "{out}");
    assert_eq!(firing(&cmd, &[]), Vec::<(String, String)>::new());
    assert_eq!(firing(&cmd, &["--check"]), Vec::<(String, String)>::new());
    assert_eq!(serve.gauge("tranche_archive_stalled_shards"), 0.0);
    assert_eq!(serve.gauge("tranche_statistics_damaged_shards"), 0.0);
    let stats: Value = serde_json::from_str(&ok(cmd(&["stats", "--json"]))).unwrap();
    assert_eq!(
        stats["completed"]["global_stats"]["total_completed"], 100,
        "{stats}"
    );
}

/// `run`'s final drain ends at once when every partition is done and the only inbox
/// entries left are on a stalled shard, naming it and the repair, with exit 1 (it
/// waited some 65 s for them before).
#[test]
fn run_ends_promptly_on_a_stalled_shard() {
    let redis = TestRedis::start();
    let dir = scratch("repair-run-stall");
    let url = redis.url();
    let cmd = |args: &[&str]| {
        tranche(
            &dir,
            &[
                &["--redis", &url, "--namespace", "rs", "--shards", "2"][..],
                args,
            ]
            .concat(),
        )
    };
    let run = || cmd(&["run", "--simulate", "--sim-latency", "0..1"]);
    ok(cmd(&[
        "plan", "--min", "1", "--max", "20000", "--size", "1000",
    ]));
    ok(run());
    let schema = tranche_codec::KeySchema::new("rs", 2).unwrap();
    let _: i64 = redis.query(
        redis::cmd("HSET")
            .arg(schema.stats(0, "ranges"))
            .arg("0")
            .arg(b"\x80"),
    );
    ok(cmd(&[
        "plan", "--min", "20001", "--max", "40000", "--size", "1000",
    ]));
    let started = Instant::now();
    let out = output(run());
    let (stdout, stderr) = text(&out);
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    let said: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("tranche: "))
        .collect();
    assert_eq!(said.len(), 1, "{stderr}");
    assert!(said[0].contains("archive stalled on shard 0:"), "{stderr}");
    assert!(said[0].contains("statistics damaged"), "{stderr}");
    assert!(said[0].contains("check --repair"), "{stderr}");
    assert_eq!(xlen(&redis, &schema.inbox(1)), 0, "shard 1 archived");
    assert!(xlen(&redis, &schema.inbox(0)) > 0, "shard 0's records kept");

    // The run's archiver read those entries and left them pending under its name; the
    // next archiver takes them over at once, not after the dead-archiver wait.
    ok(cmd(&["check", "--repair"]));
    let started = Instant::now();
    let out = ok(cmd(&["archive"]));
    assert!(out.contains("0 inbox entries left"), "{out}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    let stats: Value = serde_json::from_str(&ok(cmd(&["stats", "--json"]))).unwrap();
    assert_eq!(
        stats["completed"]["global_stats"]["total_completed"], 40,
        "{stats}"
    );
}
