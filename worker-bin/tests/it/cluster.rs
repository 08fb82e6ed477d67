//! Scale-out on a Redis Cluster of 3 masters with a replica each: a job of 16 shards
//! spreads its keys over all three masters, and when one master is SIGKILLed mid-run its
//! replica is promoted, the three workers ride the failover without help, and the job
//! finishes with every ID processed at least once, every partition counted once, and
//! `check` clean. With every master stopped for 10 s, the workers wait and go on. A
//! job of 16 shards puts as many shard keys on each master within 1.5x whatever the
//! namespace is called (key layout 2's spread tags); and when the busiest shard's slot is migrated to another master mid-run, the
//! workers follow the ASK and TRYAGAIN replies and MOVED afterwards, and the job
//! finishes as cleanly as without it.

use crate::support;

use crate::common;

use std::time::Duration;

use common::{LoggedChild, assert_every_id_processed, chunk_log, eventually, ok, scratch, tranche};
use support::TestCluster;

const MAX: u64 = 120_000;

/// `tranche` in `dir` against the cluster at `url`, namespace `ns`, chunks logged to
/// `log` by the example script.
fn on_cluster<'a>(
    dir: &'a std::path::Path,
    url: &'a str,
    ns: &'a str,
    log: &'a std::path::Path,
) -> impl Fn(&[&str]) -> std::process::Command + 'a {
    move |args| {
        let mut c = tranche(dir, args);
        c.env("TRANCHE_REDIS_URL", url)
            .env("TRANCHE_NAMESPACE", ns)
            .env("TRANCHE_LOG", log)
            .env("TRANCHE_ARCHIVE_CLAIM_IDLE", "2s");
        c
    }
}

/// Starts a `run --exec` worker `id` with a lease of `lease`, its output in
/// `dir/{id}.stdout` and `dir/{id}.stderr` (the cluster client warns on every failed
/// reconnect while a master is down: more than a pipe holds).
fn worker(
    cmd: &dyn Fn(&[&str]) -> std::process::Command,
    dir: &std::path::Path,
    id: &str,
    lease: &str,
) -> LoggedChild {
    let exec = format!("{} && sleep 0.01", common::example_script().display());
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
        lease,
        "--worker-id",
        id,
    ]);
    LoggedChild::spawn(&mut run, dir, id)
}

/// Waits (240 s each at most) for every worker and asserts each exited 0, with its
/// stderr if not.
fn all_succeed(workers: &mut [LoggedChild]) {
    for w in workers.iter_mut() {
        let status = w.wait(Duration::from_secs(240));
        assert!(
            status.success(),
            "worker {} exited {status}: {}",
            w.name(),
            w.stderr()
        );
    }
}

#[test]
fn three_workers_ride_a_master_failover() {
    let mut cluster = TestCluster::start(3);
    // Pids 1..=120 are batches 0 and 1 (batches are 100 pids), so shards 0 and 1 hold
    // the whole job, both on the master of slots 0-5460 for `scale`. The victim is the
    // master of shard 0 and the workers get another master's URL: killing any other
    // master would leave every lease alone.
    let schema = tranche_codec::KeySchema::new("scale", 16).unwrap();
    let victim = owner_of(
        &cluster,
        &cluster.nodes[0],
        tranche_codec::key_slot(schema.shard_tag(0)),
    );
    assert_eq!(
        owner_of(
            &cluster,
            &cluster.nodes[0],
            tranche_codec::key_slot(schema.shard_tag(1))
        ),
        victim,
        "shards 0 and 1 share a master"
    );
    let url = cluster.nodes[(0..3).find(|&m| m != victim).unwrap()].url();
    let dir = scratch("cluster-failover");
    let log = dir.join("chunks.log");
    let cmd = on_cluster(&dir, &url, "scale", &log);
    ok(cmd(&[
        "plan",
        "--min",
        "1",
        "--max",
        &MAX.to_string(),
        "--size",
        "1000",
        "--shards",
        "16",
    ]));

    // The shards' keys live on every master.
    let per_master: Vec<u64> = cluster
        .masters()
        .iter()
        .map(|m| m.cli(&["DBSIZE"]).trim().parse().unwrap())
        .collect();
    assert_eq!(per_master.len(), 3);
    assert!(
        per_master.iter().all(|&n| n > 0),
        "keys per master: {per_master:?}"
    );

    let mut workers = ["c1", "c2", "c3"].map(|id| worker(&cmd, &dir, id, "3s"));
    let partitions = MAX / 1000;
    eventually(Duration::from_secs(120), "a quarter of the chunks", || {
        chunk_log(&log).len() as u64 >= partitions
    });

    // Kill the master of the job's shards; its replica takes over.
    cluster.nodes[victim].kill();
    eventually(Duration::from_secs(60), "a replica promoted", || {
        cluster.masters().len() == 3
    });
    cluster.wait_ok(Duration::from_secs(60));

    all_succeed(&mut workers);
    let status: serde_json::Value = serde_json::from_str(&ok(cmd(&["status", "--json"]))).unwrap();
    assert_eq!(status["archived"], partitions, "{status}");
    assert_eq!(status["failed"], 0, "{status}");
    let stats: serde_json::Value = serde_json::from_str(&ok(cmd(&["stats", "--json"]))).unwrap();
    assert_eq!(
        stats["completed"]["global_stats"]["total_completed"], partitions,
        "every partition counted exactly once: {stats}"
    );
    assert_every_id_processed(&chunk_log(&log), 1, MAX);
    let check = ok(cmd(&["check"]));
    assert!(check.contains("consistent"), "{check}");
}

#[test]
fn workers_wait_out_a_cluster_that_is_briefly_down() {
    let cluster = TestCluster::start(3);
    let url = cluster.url();
    let dir = scratch("cluster-down");
    let log = dir.join("chunks.log");
    let cmd = on_cluster(&dir, &url, "down", &log);
    let max = 60_000u64;
    ok(cmd(&[
        "plan",
        "--min",
        "1",
        "--max",
        &max.to_string(),
        "--size",
        "1000",
        "--shards",
        "16",
    ]));
    let mut workers = ["d1", "d2"].map(|id| worker(&cmd, &dir, id, "30s"));
    eventually(Duration::from_secs(120), "some chunks", || {
        chunk_log(&log).len() as u64 >= 20
    });
    let masters = cluster.masters();
    for m in &masters {
        m.signal("STOP");
    }
    std::thread::sleep(Duration::from_secs(10));
    for w in workers.iter_mut() {
        assert!(
            w.child.try_wait().unwrap().is_none(),
            "a worker gave up while the cluster was down"
        );
    }
    for m in &masters {
        m.signal("CONT");
    }
    cluster.wait_ok(Duration::from_secs(60));
    all_succeed(&mut workers);
    let status: serde_json::Value = serde_json::from_str(&ok(cmd(&["status", "--json"]))).unwrap();
    assert_eq!(
        (&status["archived"], &status["failed"]),
        (&60.into(), &0.into()),
        "{status}"
    );
    assert_every_id_processed(&chunk_log(&log), 1, max);
}

/// How many of `ns`'s 16 shard tags fall in each third of the slot space, as
/// `redis-cli --cluster create` splits it over 3 masters (0-5460, 5461-10922,
/// 10923-16383), under key layout `layout`.
fn shards_per_third(ns: &str, layout: tranche_codec::KeyLayout) -> [u32; 3] {
    let third = |slot: u16| match slot {
        0..=5460 => 0,
        5461..=10922 => 1,
        _ => 2,
    };
    let schema = tranche_codec::KeySchema::new(ns, 16)
        .unwrap()
        .with_layout(layout);
    let mut per = [0; 3];
    for shard in schema.shards() {
        per[third(tranche_codec::key_slot(schema.shard_tag(shard)))] += 1;
    }
    per
}

/// Whether the largest of `counts` is at most 1.5 times the smallest, none empty.
fn within_half(counts: &[u64]) -> bool {
    let (max, min) = (counts.iter().max().unwrap(), counts.iter().min().unwrap());
    *min > 0 && *max as f64 / *min as f64 <= 1.5
}

#[test]
fn sixteen_shards_spread_evenly_over_three_masters() {
    use tranche_codec::KeyLayout;
    // With the plain tags `{ns:s}` of key layout 1 where a shard lands is a hash of
    // the namespace name: `tranche` spread 4/6/6, `scale` 6/4/6, `reindex` 3/6/7. The
    // spread tags of layout 2 put shard s's slot in the middle of the s-th sixteenth of
    // the slots, so the thirds hold 5/6/5 shards whatever the name.
    let names = ["tranche", "scale", "reindex", "elk"];
    assert_eq!(shards_per_third("reindex", KeyLayout::Plain), [3, 6, 7]);
    for ns in names {
        assert_eq!(shards_per_third(ns, KeyLayout::Spread), [5, 6, 5], "{ns}");
    }

    let cluster = TestCluster::start(3);
    let url = cluster.url();
    let dir = scratch("cluster-spread");
    let log = dir.join("chunks.log");
    for ns in names {
        let cmd = on_cluster(&dir, &url, ns, &log);
        // 1,600 partitions of 100 pids: batches 0..16, so every shard gets work.
        ok(cmd(&[
            "plan", "--min", "1", "--max", "160000", "--size", "100", "--shards", "16",
        ]));
        ok(cmd(&["run", "--simulate", "--sim-latency", "0..0"]));
    }
    for ns in names {
        // The shards' keys on each master, after a whole run and its archive.
        let pattern = format!("{{{ns}:*");
        let per: Vec<u64> = cluster
            .masters()
            .iter()
            .map(|m| {
                let keys: Vec<String> = m.query(redis::cmd("KEYS").arg(&pattern));
                keys.len() as u64
            })
            .collect();
        eprintln!("{ns}: shard keys per master {per:?}");
        assert_eq!(per.len(), 3, "{per:?}");
        assert!(within_half(&per), "{ns}: shard keys per master {per:?}");
    }
}

/// The index in `cluster.nodes` of the master serving `slot`, as `node` sees it in
/// CLUSTER NODES (a slot being migrated is listed as `[slot->-id]`, not as a range).
fn owner_of(cluster: &TestCluster, node: &support::TestRedis, slot: u16) -> usize {
    let nodes = node.cli(&["CLUSTER", "NODES"]);
    let line = nodes
        .lines()
        .find(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            f.len() > 8
                && f[2].contains("master")
                && f[8..].iter().filter(|r| !r.starts_with('[')).any(|r| {
                    let (lo, hi) = r.split_once('-').unwrap_or((r, r));
                    (lo.parse().unwrap()..=hi.parse().unwrap()).contains(&slot)
                })
        })
        .unwrap_or_else(|| panic!("nobody serves slot {slot}: {nodes}"));
    let port: u16 = line
        .split_whitespace()
        .nth(1)
        .unwrap()
        .split(['@', ':'])
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    cluster
        .nodes
        .iter()
        .position(|n| n.port() == port)
        .expect("a node of the cluster")
}

/// Moves `slot` from master `from` to master `to` the way `redis-cli --cluster reshard`
/// does: IMPORTING on the target, MIGRATING on the source, MIGRATE of its keys (one key
/// at a time, a little apart, so clients meet the migration half done and are sent ASK
/// and TRYAGAIN), then SETSLOT NODE on every master, target and source first.
fn move_slot(cluster: &TestCluster, slot: u16, from: usize, to: usize) -> usize {
    let (src, dst) = (&cluster.nodes[from], &cluster.nodes[to]);
    let id = |n: &support::TestRedis| n.cli(&["CLUSTER", "MYID"]);
    let (src_id, dst_id, slot_s) = (id(src), id(dst), slot.to_string());
    assert_eq!(
        dst.cli(&["CLUSTER", "SETSLOT", &slot_s, "IMPORTING", &src_id]),
        "OK"
    );
    assert_eq!(
        src.cli(&["CLUSTER", "SETSLOT", &slot_s, "MIGRATING", &dst_id]),
        "OK"
    );
    let mut moved = 0;
    loop {
        let keys: Vec<String> =
            src.query(redis::cmd("CLUSTER").arg("GETKEYSINSLOT").arg(slot).arg(1));
        let Some(key) = keys.first() else { break };
        let reply: redis::Value = src.query(
            redis::cmd("MIGRATE")
                .arg("127.0.0.1")
                .arg(dst.port())
                .arg(key)
                .arg(0)
                .arg(10_000),
        );
        // NOKEY: a script deleted the key since GETKEYSINSLOT listed it.
        assert!(
            matches!(reply, redis::Value::Okay) || format!("{reply:?}").contains("NOKEY"),
            "MIGRATE {key}: {reply:?}"
        );
        moved += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    let others = cluster
        .masters()
        .into_iter()
        .filter(|m| m.port() != src.port() && m.port() != dst.port());
    for m in [dst, src].into_iter().chain(others) {
        assert_eq!(
            m.cli(&["CLUSTER", "SETSLOT", &slot_s, "NODE", &dst_id]),
            "OK"
        );
    }
    moved
}

#[test]
fn workers_ride_a_reshard_of_a_busy_shard() {
    let cluster = TestCluster::start(3);
    let url = cluster.url();
    let dir = scratch("cluster-reshard");
    let log = dir.join("chunks.log");
    let ns = "reshard";
    let cmd = on_cluster(&dir, &url, ns, &log);
    let max = 60_000u64;
    ok(cmd(&[
        "plan",
        "--min",
        "1",
        "--max",
        &max.to_string(),
        "--size",
        "1000",
        "--shards",
        "16",
    ]));
    // Pids 1..=60 are all in batch 0 (batches are 100 pids), so shard 0 holds this
    // whole job: move its slot.
    let schema = tranche_codec::KeySchema::new(ns, 16).unwrap();
    let slot = tranche_codec::key_slot(schema.shard_tag(0));
    let first = &cluster.nodes[0];
    assert_eq!(
        first.cli(&["CLUSTER", "KEYSLOT", &schema.active(0)]),
        slot.to_string(),
        "codec and Redis agree on the slot"
    );
    let from = owner_of(&cluster, first, slot);
    let to = (0..3).find(|&m| m != from).unwrap();

    let mut workers = ["r1", "r2", "r3"].map(|id| worker(&cmd, &dir, id, "10s"));
    eventually(Duration::from_secs(120), "some chunks", || {
        chunk_log(&log).len() >= 20
    });
    let moved = move_slot(&cluster, slot, from, to);
    let logged_at_move = chunk_log(&log).len();
    assert!(moved >= 3, "the shard's keys were migrated ({moved})");

    all_succeed(&mut workers);
    // Shard 0 kept being worked on after its slot moved.
    let after = chunk_log(&log);
    assert!(
        after[logged_at_move..]
            .iter()
            .any(|&(pid, _, _)| schema.shard_of(pid) == 0),
        "no chunk of shard 0 after the move ({logged_at_move} of {} chunks before)",
        after.len()
    );
    let status: serde_json::Value = serde_json::from_str(&ok(cmd(&["status", "--json"]))).unwrap();
    let partitions = max / 1000;
    assert_eq!(status["archived"], partitions, "{status}");
    assert_eq!(status["failed"], 0, "{status}");
    let stats: serde_json::Value = serde_json::from_str(&ok(cmd(&["stats", "--json"]))).unwrap();
    assert_eq!(
        stats["completed"]["global_stats"]["total_completed"], partitions,
        "every partition counted exactly once: {stats}"
    );
    assert_every_id_processed(&after, 1, max);
    let check = ok(cmd(&["check"]));
    assert!(check.contains("consistent"), "{check}");

    // Every master now sends the slot to the target, which holds the shard's keys.
    for m in cluster.masters() {
        assert_eq!(
            owner_of(&cluster, m, slot),
            to,
            "slot {slot} as {} sees it",
            m.port()
        );
    }
    let count = |n: &support::TestRedis| -> u64 {
        n.cli(&["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()])
            .parse()
            .unwrap()
    };
    assert_eq!(count(&cluster.nodes[from]), 0);
    assert!(count(&cluster.nodes[to]) >= 3);
}
