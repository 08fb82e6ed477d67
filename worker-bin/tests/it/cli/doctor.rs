//! `tranche doctor` against private servers each configured to fail one check (the
//! clock cannot be: Redis's `TIME` follows this host's, so that threshold is a unit
//! test of `judge_clock`), and the start-up warnings of `plan`, `run` and `serve`.

use super::*;

/// A server doctor passes: no eviction, AOF on.
const SOUND: &[&str] = &["--maxmemory-policy", "noeviction", "--appendonly", "yes"];

/// `doctor` against `redis` with `extra` arguments: its exit code and its lines by
/// check name (`verdict text`).
fn doctor(redis: &str, extra: &[&str]) -> (Option<i32>, Vec<(String, String)>, String) {
    let dir = scratch("doctor");
    let out = output(tranche(
        &dir,
        &[&["doctor", "--redis", redis][..], extra].concat(),
    ));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines = stdout
        .lines()
        .skip(1)
        .map(|l| {
            let (verdict, rest) = l.split_once(' ').expect("a verdict");
            let rest = rest.trim_start();
            let (check, _) = rest.split_once(' ').expect("a check");
            assert!(["ok", "WARN", "FAIL", "skip"].contains(&verdict), "{l}");
            (check.to_owned(), l.to_owned())
        })
        .collect();
    (
        out.status.code(),
        lines,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The line of `check`.
fn line<'a>(lines: &'a [(String, String)], check: &str) -> &'a str {
    &lines
        .iter()
        .find(|(c, _)| c == check)
        .unwrap_or_else(|| panic!("no `{check}` line in {lines:?}"))
        .1
}

#[test]
fn a_sound_redis_passes_every_check_with_one_line_each() {
    let redis = TestRedis::start_with_args(SOUND);
    let (code, lines, stderr) = doctor(&redis.url(), &[]);
    assert_eq!(code, Some(0), "{lines:?} {stderr}");
    let checks: Vec<&str> = lines.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(
        checks,
        [
            "version",
            "eviction",
            "persistence",
            "replicas",
            "clock",
            "cluster",
            "acl",
            "latency"
        ]
    );
    assert!(line(&lines, "version").contains("Redis 7."), "{lines:?}");
    assert!(line(&lines, "persistence").starts_with("ok"), "{lines:?}");
    assert!(line(&lines, "clock").starts_with("ok"), "{lines:?}");
    assert!(line(&lines, "cluster").contains("standalone"), "{lines:?}");
    assert!(line(&lines, "acl").starts_with("ok"), "{lines:?}");
    assert!(line(&lines, "latency").contains("round trip"), "{lines:?}");
    // No replica only warns.
    assert!(line(&lines, "replicas").starts_with("WARN"), "{lines:?}");
}

#[test]
fn eviction_fails_and_names_the_fix() {
    let redis =
        TestRedis::start_with_args(&["--maxmemory-policy", "allkeys-lru", "--appendonly", "yes"]);
    let dir = scratch("doctor-evict");
    fails(
        &dir,
        &["doctor", "--redis", &redis.url()],
        1,
        "doctor: eviction failed",
    );
    let (_, lines, _) = doctor(&redis.url(), &[]);
    let eviction = line(&lines, "eviction");
    assert!(eviction.starts_with("FAIL"), "{eviction}");
    assert!(
        eviction.contains("CONFIG SET maxmemory-policy noeviction"),
        "{eviction}"
    );
}

#[test]
fn no_persistence_fails_and_appendfsync_no_only_warns() {
    // TestRedis starts with `--save "" --appendonly no`.
    let redis = TestRedis::start_with_args(&["--maxmemory-policy", "noeviction"]);
    let (code, lines, _) = doctor(&redis.url(), &[]);
    assert_eq!(code, Some(1));
    assert!(line(&lines, "persistence").starts_with("FAIL"), "{lines:?}");
    assert!(line(&lines, "persistence").contains("CONFIG SET appendonly yes"));

    let rdb = TestRedis::start_with_args(&["--maxmemory-policy", "noeviction", "--save", "3600 1"]);
    let (code, lines, _) = doctor(&rdb.url(), &[]);
    assert_eq!(code, Some(0), "{lines:?}");
    assert!(line(&lines, "persistence").contains("RDB"), "{lines:?}");

    let lazy = TestRedis::start_with_args(&[SOUND, &["--appendfsync", "no"][..]].concat());
    let (code, lines, _) = doctor(&lazy.url(), &[]);
    assert_eq!(code, Some(0), "{lines:?}");
    assert!(line(&lines, "persistence").starts_with("WARN"), "{lines:?}");
}

#[test]
fn replicas_are_counted_and_a_replica_is_refused() {
    let master =
        TestRedis::start_with_args(&[SOUND, &["--min-replicas-to-write", "1"][..]].concat());
    let port = master.port().to_string();
    let replica =
        TestRedis::start_with_args(&[SOUND, &["--replicaof", "127.0.0.1", &port][..]].concat());
    eventually(Duration::from_secs(10), "the replica connects", || {
        master
            .query::<String>(redis::cmd("INFO").arg("replication"))
            .contains("connected_slaves:1")
    });
    let (code, lines, _) = doctor(&master.url(), &[]);
    assert_eq!(code, Some(0), "{lines:?}");
    let replicas = line(&lines, "replicas");
    assert!(replicas.starts_with("ok"), "{replicas}");
    assert!(
        replicas.contains("1 replica(s), min-replicas-to-write 1"),
        "{replicas}"
    );
    let (code, lines, _) = doctor(&replica.url(), &[]);
    assert_eq!(code, Some(1), "{lines:?}");
    assert!(
        line(&lines, "replicas").contains("is a replica"),
        "{lines:?}"
    );
}

#[test]
fn a_cluster_with_unserved_slots_fails() {
    let whole = TestRedis::start_cluster();
    let (_, lines, _) = doctor(&whole.url(), &[]);
    assert!(
        line(&lines, "cluster").contains("all 16384 slots served"),
        "{lines:?}"
    );
    // A cluster node that was never given its slots.
    let empty = TestRedis::start_with_args(&[SOUND, &["--cluster-enabled", "yes"][..]].concat());
    let (code, lines, _) = doctor(&empty.url(), &[]);
    assert_eq!(code, Some(1), "{lines:?}");
    let cluster = line(&lines, "cluster");
    assert!(cluster.starts_with("FAIL"), "{cluster}");
    assert!(cluster.contains("0 of 16384 slots served"), "{cluster}");
}

/// On a cluster every master is checked, whichever node the URL names, and each line
/// names its master: one master that evicts, or one that persists nothing, fails.
#[test]
fn every_cluster_master_is_checked_and_named() {
    let cluster = crate::support::TestCluster::start_with(3, 0);
    let config_set = |node: &TestRedis, name: &str, value: &str| {
        let out = node.cli(&["CONFIG", "SET", name, value]);
        assert!(out.contains("OK"), "CONFIG SET {name} {value}: {out}");
    };
    for node in &cluster.nodes {
        config_set(node, "maxmemory-policy", "noeviction");
        config_set(node, "appendonly", "yes");
    }
    let name = |node: &TestRedis| format!("127.0.0.1:{}", node.port());
    let url = cluster.nodes[0].url();
    let (code, lines, stderr) = doctor(&url, &[]);
    assert_eq!(code, Some(0), "{lines:?} {stderr}");
    for node in &cluster.nodes {
        let said: Vec<&str> = lines
            .iter()
            .filter(|(_, l)| l.contains(&format!("{}: ", name(node))))
            .map(|(c, _)| c.as_str())
            .collect();
        assert_eq!(
            said,
            [
                "version",
                "eviction",
                "persistence",
                "replicas",
                "clock",
                "cluster",
                "acl",
                "latency"
            ],
            "{lines:?}"
        );
    }

    // Neither is the node the URL names.
    let evicts = &cluster.nodes[1];
    let forgets = &cluster.nodes[2];
    config_set(evicts, "maxmemory-policy", "allkeys-lru");
    config_set(forgets, "appendonly", "no");
    let (code, lines, stderr) = doctor(&url, &[]);
    assert_eq!(code, Some(1), "{lines:?} {stderr}");
    let failed = |check: &str| -> Vec<&str> {
        lines
            .iter()
            .filter(|(c, l)| c == check && l.starts_with("FAIL"))
            .map(|(_, l)| l.as_str())
            .collect()
    };
    let eviction = failed("eviction");
    assert_eq!(eviction.len(), 1, "{lines:?}");
    assert!(eviction[0].contains(&name(evicts)), "{eviction:?}");
    let persistence = failed("persistence");
    assert_eq!(persistence.len(), 1, "{lines:?}");
    assert!(persistence[0].contains(&name(forgets)), "{persistence:?}");
    assert!(
        stderr.contains(&format!("eviction failed on {}", name(evicts)))
            && stderr.contains(&format!("persistence failed on {}", name(forgets))),
        "{stderr}"
    );
}

#[test]
fn a_missing_acl_permission_fails_naming_the_command() {
    let redis = TestRedis::start_with_args(SOUND);
    // deploy/redis/acl.conf's worker passes; the same without scripting does not.
    let acl = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/redis/acl.conf"),
    )
    .unwrap();
    let worker = acl
        .lines()
        .find_map(|l| l.strip_prefix("user tranche-worker "))
        .expect("the worker's ACL line");
    let rules: Vec<&str> = worker.split_whitespace().collect();
    let mut setuser = redis::cmd("ACL");
    setuser
        .arg("SETUSER")
        .arg("tranche-worker")
        .arg("reset")
        .arg(&rules);
    let _: () = redis.query(&setuser);
    let mut crippled = redis::cmd("ACL");
    crippled
        .arg("SETUSER")
        .arg("no-scripts")
        .arg("reset")
        .arg(&rules)
        .arg("-@scripting");
    let _: () = redis.query(&crippled);

    let (code, lines, _) = doctor(&redis.url(), &["--acl-user", "tranche-worker"]);
    assert_eq!(code, Some(0), "{lines:?}");
    assert!(line(&lines, "acl").contains("`tranche-worker` may send every command"));

    let (code, lines, stderr) = doctor(&redis.url(), &["--acl-user", "no-scripts"]);
    assert_eq!(code, Some(1), "{lines:?}");
    let acl = line(&lines, "acl");
    assert!(acl.starts_with("FAIL"), "{acl}");
    assert!(acl.contains("may not send EVALSHA, EVAL, SCRIPT"), "{acl}");
    assert!(stderr.contains("doctor: acl failed"), "{stderr}");

    // Connected as the worker itself, DRYRUN is not allowed: skipped, with the way out.
    let url = format!(
        "redis://tranche-worker:worker-secret@127.0.0.1:{}",
        redis.port()
    );
    let (code, lines, _) = doctor(&url, &[]);
    assert_eq!(code, Some(0), "{lines:?}");
    assert!(line(&lines, "acl").contains("--acl-user"), "{lines:?}");
}

#[test]
fn doctor_needs_a_redis() {
    let dir = scratch("doctor-embedded");
    fails(&dir, &["doctor"], 2, "doctor checks a Redis");
}

/// `plan` (and `run`, `serve`) warn once at start about eviction and persistence;
/// `--quiet` keeps the warning off the terminal.
#[test]
fn plan_warns_once_at_start_unless_quiet() {
    let redis = TestRedis::start_with_args(&["--maxmemory-policy", "allkeys-lru"]);
    let dir = scratch("doctor-warn");
    let plan = |ns: &str, quiet: bool| {
        let mut cmd = tranche(
            &dir,
            &[
                "plan",
                "--redis",
                &redis.url(),
                "--namespace",
                ns,
                "--min",
                "1",
                "--max",
                "10",
            ],
        );
        if !quiet {
            cmd.env_remove("TRANCHE_QUIET");
        }
        let out = output(cmd);
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let loud = plan("loud", false);
    let warnings: Vec<&str> = loud
        .lines()
        .filter(|l| l.starts_with("tranche: warning:"))
        .collect();
    assert_eq!(warnings.len(), 2, "{loud}");
    assert!(
        warnings[0].contains("maxmemory-policy allkeys-lru"),
        "{loud}"
    );
    assert!(warnings[1].contains("neither AOF nor RDB"), "{loud}");
    let quiet = plan("quiet", true);
    assert!(!quiet.contains("warning"), "{quiet}");
}
