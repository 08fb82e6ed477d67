//! Damaged records: a corrupt active record or run set aside and rebuilt, and a corrupt
//! archived value reported and set aside.

use super::*;

/// One flipped byte in a claimed partition's active record: `check` names it (exit 1,
/// not 2), `check --repair` sets its raw bytes aside in the shard's quarantine and makes
/// the partition pending again, and `run` then finishes every partition, each counted
/// once.
#[test]
fn a_corrupt_active_record_is_set_aside_and_rebuilt() {
    let redis = TestRedis::start();
    let dir = scratch("repair-active");
    let url = redis.url();
    let cmd = |args: &[&str]| {
        tranche(
            &dir,
            &[
                &["--redis", &url, "--namespace", "ca", "--shards", "2"][..],
                args,
            ]
            .concat(),
        )
    };
    ok(cmd(&[
        "plan", "--min", "1", "--max", "10000", "--size", "1000",
    ]));
    ok(cmd(&["run", "--simulate", "--sim-latency", "0..1"]));
    ok(cmd(&[
        "plan", "--min", "10001", "--max", "20000", "--size", "1000",
    ]));
    // A worker takes pid 11 and dies holding it.
    let mut worker = cmd(&[
        "run",
        "--exec",
        "sleep 30",
        "--concurrency",
        "1",
        "--prefetch",
        "0",
        "--grace",
        "0s",
        "--lease",
        "2s",
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let schema = tranche_codec::KeySchema::new("ca", 2).unwrap();
    let held = || {
        (0..2).find_map(|shard| {
            let active = schema.active(shard);
            let rec: Option<Vec<u8>> = redis.query(redis::cmd("HGET").arg(&active).arg(11));
            rec.filter(|r| r.starts_with(b"c|") || r.starts_with(b"r|"))
                .map(|r| (active, r))
        })
    };
    eventually(Duration::from_secs(30), "pid 11 claimed", || {
        held().is_some()
    });
    worker.kill().unwrap();
    worker.wait().unwrap();
    let (active, mut record) = held().unwrap();
    // Its attempts ('1') becomes 'q'.
    record[2] ^= 0x40;
    let _: i64 = redis.query(redis::cmd("HSET").arg(&active).arg(11).arg(&record));

    let out = output(cmd(&["check"]));
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    let named: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("active_records."))
        .collect();
    assert_eq!(named.len(), 1, "{stdout}");
    assert!(
        named[0].contains(".11 (") && named[0].contains("unreadable record"),
        "{stdout}"
    );
    assert!(stderr.contains("1 corrupt active record"), "{stderr}");
    let fired = firing(&cmd, &["--check"]);
    let corrupt = fired
        .iter()
        .find(|(n, _)| n == "active_records_corrupt")
        .unwrap_or_else(|| panic!("{fired:?}"));
    assert!(corrupt.1.contains("pid 11"), "{fired:?}");

    let out = output(cmd(&["check", "--repair"]));
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    let kept: Vec<(String, Vec<u8>)> =
        redis.query(redis::cmd("HGETALL").arg(format!("{active}:quarantine")));
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert!(kept[0].0.starts_with("11@"), "{kept:?}");
    assert_eq!(kept[0].1, record);

    ok(cmd(&["run", "--simulate", "--sim-latency", "0..1"]));
    let out = ok(cmd(&["check"]));
    assert!(out.contains("consistent"), "{out}");
    assert_eq!(firing(&cmd, &["--check"]), Vec::<(String, String)>::new());
    let stats: Value = serde_json::from_str(&ok(cmd(&["stats", "--json"]))).unwrap();
    assert_eq!(
        stats["completed"]["global_stats"]["total_completed"], 20,
        "{stats}"
    );
}

/// Two claims' runs on one shard, both damaged: one whose first and last fields no
/// longer read (its pids unknown), one whose do and whose rest is not UTF-8; and a
/// corrupt record of a pid no plan has, which the store refuses to rebuild. `check`
/// names all three (exit 1); `check --repair` rebuilds the second run's pids, says the
/// first run is left in place because its pids cannot be read and the record because
/// its repair was refused, and exits 1 naming both; the first run is as it was, and
/// `check` and `health --check` go on naming the two alone.
#[test]
fn a_run_whose_pids_cannot_be_read_does_not_stop_the_repair_of_the_rest() {
    use tranche_active_store::{Config, Leases, RedisActiveStore, RedisConnection};
    let redis = TestRedis::start();
    let dir = scratch("repair-runs");
    let url = redis.url();
    let cmd = |args: &[&str]| {
        tranche(
            &dir,
            &[
                &["--redis", &url, "--namespace", "cr", "--shards", "1"][..],
                args,
            ]
            .concat(),
        )
    };
    ok(cmd(&[
        "plan", "--min", "1", "--max", "10000", "--size", "1000",
    ]));
    // Pids 1..=3 in one run, 4 and 5 in another, as two workers' claims leave them.
    let (lost, other) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let conn = RedisConnection::connect(&url).await.unwrap();
            let config = Config {
                namespace: "cr".into(),
                num_shards: 1,
                ..Config::default()
            };
            let store = RedisActiveStore::new(conn, config).unwrap();
            let lost = store.claim("w", 3).await.unwrap();
            let other = store.claim("v", 2).await.unwrap();
            (lost[0].token, other[0].token)
        });
    let schema = tranche_codec::KeySchema::new("cr", 1).unwrap();
    let (runs, active) = (schema.runs(0), schema.active(0));
    let garbage = b"\xffgarbage".to_vec();
    let _: i64 = redis.query(redis::cmd("HSET").arg(&runs).arg(lost).arg(&garbage));
    let _: i64 = redis.query(
        redis::cmd("HSET")
            .arg(&runs)
            .arg(other)
            .arg(&b"4|5|\xfe|x"[..]),
    );
    let _: i64 = redis.query(redis::cmd("HSET").arg(&active).arg(99_999).arg("garbage"));
    let lost_key = format!("{runs} {lost}");
    let named = |stdout: &str| -> Vec<String> {
        stdout
            .lines()
            .filter(|l| l.contains("active_records."))
            .map(str::to_owned)
            .collect()
    };

    let out = output(cmd(&["check"]));
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    let lines = named(&stdout);
    assert_eq!(lines.len(), 4, "{stdout}");
    assert!(
        lines[0].contains(&format!(".run ({lost_key})")) && lines[0].contains("cannot be read"),
        "{stdout}"
    );
    assert!(
        lines[1].contains(".4 (") && lines[2].contains(".5 ("),
        "{stdout}"
    );
    assert!(lines[3].contains(".99999 ("), "{stdout}");
    assert!(
        stderr.contains("1 run(s) whose pids cannot be read"),
        "{stderr}"
    );

    let out = output(cmd(&["check", "--repair"]));
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    let lines = named(&stdout);
    assert_eq!(lines.len(), 4, "{stdout}");
    assert!(lines[0].contains("left in place"), "{stdout}");
    assert!(
        lines[1].contains("set aside in the quarantine and rebuilt pending")
            && lines[2].contains("rebuilt pending with the rest of its run"),
        "{stdout}"
    );
    assert!(
        lines[3].contains("left in place, not repaired") && lines[3].contains("in no plan"),
        "{stdout}"
    );
    assert!(
        stderr.contains(&format!(
            "2 corrupt active record(s) left in place ({lost_key}, {active} 99999)"
        )) && stderr.contains("the rest repaired"),
        "{stderr}"
    );
    for pid in [4, 5] {
        let rec: Vec<u8> = redis.query(redis::cmd("HGET").arg(&active).arg(pid));
        assert!(rec.starts_with(b"p|"), "pid {pid}: {rec:?}");
    }
    let kept: Vec<u8> = redis.query(redis::cmd("HGET").arg(&runs).arg(lost));
    assert_eq!(kept, garbage);

    let out = output(cmd(&["check"]));
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    let lines = named(&stdout);
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(
        lines[0].contains(&lost_key) && lines[1].contains(".99999 ("),
        "{stdout}"
    );
    let fired = firing(&cmd, &["--check"]);
    let corrupt = fired
        .iter()
        .find(|(n, _)| n == "active_records_corrupt")
        .unwrap_or_else(|| panic!("{fired:?}"));
    assert!(
        corrupt
            .1
            .contains(&format!("run {lost_key} (its pids cannot be read)")),
        "{fired:?}"
    );
}

/// One flipped byte in each tier's archived values (a simple-tier record, a record of
/// an open batch, a sealed batch): the archiver's scrub finds them and `health` fires
/// `archive_damaged`; `check` names them (exit 1, not 2), `get` and `list` answer
/// "archived record damaged" for their pids; `check --repair` sets each aside in its
/// shard's `archive:quarantine` as it was, the records stay counted once, and `check`
/// and `health` are clean after.
#[test]
fn a_corrupt_archived_value_is_reported_and_set_aside() {
    let redis = TestRedis::start();
    let dir = scratch("repair-archive");
    let url = redis.url();
    let cmd = |args: &[&str]| {
        tranche(
            &dir,
            &[
                &["--redis", &url, "--namespace", "ab", "--shards", "2"][..],
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
    // Pids 1..=10 in the simple tier (batch 0, shard 0); 11..=99 in batch 0's open hash;
    // 100..=199 sealed whole (batch 1, shard 1); 200..=400 in batches 2 to 4.
    ok(cmd(&[
        "plan", "--min", "1", "--max", "10000", "--size", "1000",
    ]));
    run(&[]);
    ok(cmd(&[
        "plan", "--min", "10001", "--max", "400000", "--size", "1000",
    ]));
    run(&["--compressed-at", "0"]);
    let schema = tranche_codec::KeySchema::new("ab", 2).unwrap();
    let flip = |key: &str, field: Option<&str>| -> Vec<u8> {
        let mut v: Vec<u8> = match field {
            Some(f) => redis.query(redis::cmd("HGET").arg(key).arg(f)),
            None => redis.query(redis::cmd("GET").arg(key)),
        };
        // A structural byte of a JSON record (a flip inside a string could leave valid
        // JSON); the middle of a sealed batch (its checksum covers every byte).
        let at = if field.is_some() { 1 } else { v.len() / 2 };
        v[at] ^= 0x5a;
        let _: () = match field {
            Some(f) => redis.query(redis::cmd("HSET").arg(key).arg(f).arg(&v)),
            None => redis.query(redis::cmd("SET").arg(key).arg(&v)),
        };
        v
    };
    let simple = schema.completed(0);
    let open = format!("{}:open", schema.completed_batch(0));
    let sealed = schema.completed_batch(1);
    let bad_simple = flip(&simple, Some("3"));
    let bad_open = flip(&open, Some("42"));
    let bad_sealed = flip(&sealed, None);

    // No reader met them yet: the archiver's scrub finds them, `health` fires.
    let mut archiver = Reaped(
        cmd(&["archive", "--follow"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let damaged = || {
        firing(&cmd, &[])
            .into_iter()
            .find(|(n, _)| n == "archive_damaged")
            .map(|(_, d)| d)
    };
    eventually(
        Duration::from_secs(60),
        "archive_damaged firing with all three",
        || {
            damaged().is_some_and(|d| {
                d.contains(&sealed)
                    && d.contains(&format!("{open} 42"))
                    && d.contains(&format!("{simple} 3"))
            })
        },
    );
    common::signal(&archiver, "INT");
    common::wait(&mut archiver, Duration::from_secs(30));
    let serve = Serve::start(cmd(&["serve", "--listen", "127.0.0.1:0"]));
    assert_eq!(serve.gauge("tranche_archive_damaged_values"), 3.0);

    // `check` reports them by key, as findings.
    let out = output(cmd(&["check"]));
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    let named: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("archive_records."))
        .collect();
    assert_eq!(named.len(), 3, "{stdout}");
    assert!(
        named.iter().any(|l| l.contains(&format!("{simple} 3"))),
        "{stdout}"
    );
    assert!(
        named.iter().any(|l| l.contains(&format!("{open} 42"))),
        "{stdout}"
    );
    assert!(named.iter().any(|l| l.contains(&sealed)), "{stdout}");
    assert!(stderr.contains("3 damaged archived value(s)"), "{stderr}");

    // `get` and `list` answer for the pids.
    for pid in ["3", "42", "150"] {
        let out = ok(cmd(&["get", pid]));
        assert!(out.contains("archived record damaged"), "{pid}: {out}");
    }
    let out = ok(cmd(&["get", "4"]));
    assert!(out.contains("worker"), "{out}");
    let out = ok(cmd(&["list", "archived", "--limit", "500"]));
    let rows: Vec<&str> = out.lines().filter(|l| l.contains("damaged")).collect();
    assert_eq!(rows.len(), 3, "{out}");
    assert!(
        out.lines()
            .any(|l| l.trim_start().starts_with("4 ") && l.contains("archived")),
        "{out}"
    );

    // `check --repair` sets each aside as it was; the records stay counted once.
    let out = output(cmd(&["check", "--repair"]));
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    let kept0: Vec<(String, Vec<u8>)> =
        redis.query(redis::cmd("HGETALL").arg(schema.shard_key(0, "archive:quarantine")));
    let mut kept0 = kept0;
    kept0.sort();
    assert_eq!(
        kept0,
        vec![("3".to_owned(), bad_simple), ("42".to_owned(), bad_open)]
    );
    let kept1: Vec<(String, Vec<u8>)> =
        redis.query(redis::cmd("HGETALL").arg(schema.shard_key(1, "archive:quarantine")));
    assert_eq!(kept1, vec![("batch:1".to_owned(), bad_sealed)]);

    let out = ok(cmd(&["check"]));
    assert!(out.contains("consistent"), "{out}");
    assert_eq!(firing(&cmd, &["--check"]), Vec::<(String, String)>::new());
    assert_eq!(serve.gauge("tranche_archive_damaged_values"), 0.0);
    let out = ok(cmd(&["get", "42"]));
    assert!(out.contains("archived record damaged: set aside"), "{out}");
    let stats: Value = serde_json::from_str(&ok(cmd(&["stats", "--json"]))).unwrap();
    assert_eq!(
        stats["completed"]["global_stats"]["total_completed"], 400,
        "{stats}"
    );

    // The archive goes on: more work is archived and counted once, `check` stays clean.
    ok(cmd(&[
        "plan", "--min", "400001", "--max", "450000", "--size", "1000",
    ]));
    run(&["--compressed-at", "0"]);
    let out = ok(cmd(&["check"]));
    assert!(out.contains("consistent"), "{out}");
    let stats: Value = serde_json::from_str(&ok(cmd(&["stats", "--json"]))).unwrap();
    assert_eq!(
        stats["completed"]["global_stats"]["total_completed"], 450,
        "{stats}"
    );
}
