//! Signals and child processes, with the real binary: a terminal's Ctrl-C reaches
//! tranche alone (its `--exec` chunks run in process groups of their own) and spends no
//! attempt; once the grace period is over no chunk outlives tranche; chunks never see
//! the Redis URL's password.

use crate::support;

use crate::common;

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{eventually, ok, scratch, tranche, wait};
use serde_json::Value;
use support::TestRedis;

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The process groups of the live (not zombie) processes.
fn groups() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("stat")).ok())
        .filter_map(|stat| {
            let mut rest = stat[stat.rfind(')')? + 2..].split_whitespace();
            let state = rest.next()?;
            (state != "Z").then(|| rest.nth(1)?.parse().ok())?
        })
        .collect()
}

fn status(dir: &Path) -> Value {
    serde_json::from_str(&ok(tranche(dir, &["--json", "status"]))).unwrap()
}

/// Ctrl-C in a terminal signals the whole foreground process group. The chunks must
/// not see it: they finish within the grace period and their partitions complete,
/// with no attempt spent even at `--max-attempts 1`.
#[test]
fn a_terminal_ctrl_c_reaches_tranche_alone() {
    let dir = scratch("signals-terminal");
    ok(tranche(
        &dir,
        &["plan", "--min", "1", "--max", "4", "--size", "1"],
    ));
    let started = dir.join("started");
    let exec = format!("echo $TRANCHE_PID >> {}; sleep 2", started.display());
    let mut cmd = tranche(
        &dir,
        &[
            "run",
            "--exec",
            &exec,
            "--chunk",
            "1",
            "--concurrency",
            "2",
            "--max-attempts",
            "1",
            "--grace",
            "20s",
        ],
    );
    // As a shell does for a foreground job: a group of its own.
    cmd.process_group(0).stdin(Stdio::null());
    let mut run = cmd.spawn().unwrap();
    eventually(Duration::from_secs(20), "two chunks started", || {
        lines(&started).len() >= 2
    });
    let status_kill = Command::new("kill")
        .args(["-INT", "--", &format!("-{}", run.id())])
        .status()
        .unwrap();
    assert!(status_kill.success());
    let exit = wait(&mut run, Duration::from_secs(30));
    assert_eq!(exit.code(), Some(130), "a signal ends the run with 130");
    let s = status(&dir);
    assert_eq!(s["failed"], 0, "{s}");
    assert_eq!(
        s["finished"], 2,
        "the two chunks finished and completed: {s}"
    );
    assert_eq!(lines(&started).len(), 2, "no claim after the signal");
}

/// When the grace period is over, every chunk's whole process group is stopped (a
/// grandchild too), its partition released with the attempt given back, and tranche
/// exits within the grace plus the kill delay.
#[test]
fn no_chunk_outlives_the_grace_period() {
    let dir = scratch("signals-grace");
    ok(tranche(
        &dir,
        &["plan", "--min", "1", "--max", "4", "--size", "1"],
    ));
    let pids = dir.join("pids");
    // `true` keeps sh alive, so `sleep` is its child, a grandchild of tranche.
    let exec = format!("echo $$ >> {}; sleep 30; true", pids.display());
    let mut cmd = tranche(
        &dir,
        &[
            "run",
            "--exec",
            &exec,
            "--chunk",
            "1",
            "--concurrency",
            "2",
            "--grace",
            "1s",
        ],
    );
    cmd.stdin(Stdio::null());
    let mut run = cmd.spawn().unwrap();
    eventually(Duration::from_secs(20), "two chunks started", || {
        lines(&pids).len() >= 2
    });
    let chunk_groups: Vec<u32> = lines(&pids).iter().map(|p| p.parse().unwrap()).collect();
    assert!(chunk_groups.iter().all(|g| groups().contains(g)));
    let signalled = Instant::now();
    common::signal(&run, "INT");
    let exit = wait(&mut run, Duration::from_secs(20));
    assert_eq!(exit.code(), Some(130));
    assert!(
        signalled.elapsed() < Duration::from_secs(8),
        "the grace period bounds the shutdown: {:?}",
        signalled.elapsed()
    );
    let alive = groups();
    for g in &chunk_groups {
        assert!(!alive.contains(g), "chunk group {g} outlived tranche");
    }
    let s = status(&dir);
    assert_eq!((&s["failed"], &s["pending"]), (&0.into(), &4.into()), "{s}");
    let got: Value = serde_json::from_str(&ok(tranche(&dir, &["--json", "get", "1"]))).unwrap();
    assert_eq!(
        got["attempt"], 0,
        "an interrupted attempt is given back: {got}"
    );
}

/// A chunk's environment has its own variables but not the Redis URL (nor the
/// password in it), nor the admin token.
#[test]
fn chunks_never_see_the_redis_password() {
    let redis = TestRedis::start_with_password("s3cret-pw");
    let url = format!("redis://:s3cret-pw@127.0.0.1:{}", redis.port());
    let dir = scratch("signals-env");
    let env_dir = dir.join("env");
    std::fs::create_dir_all(&env_dir).unwrap();
    let with_url = |args: &[&str]| {
        let mut c = tranche(&dir, args);
        c.env("TRANCHE_REDIS_URL", &url)
            .env("TRANCHE_ADMIN_TOKEN", "adm1n-t0ken")
            .env("TRANCHE_LOG", dir.join("chunks.log"));
        c
    };
    ok(with_url(&[
        "plan", "--min", "1", "--max", "2", "--size", "1",
    ]));
    let exec = format!("env > {}/$TRANCHE_PID.env", env_dir.display());
    ok(with_url(&["run", "--exec", &exec, "--chunk", "1"]));
    for pid in [1, 2] {
        let env = std::fs::read_to_string(env_dir.join(format!("{pid}.env"))).unwrap();
        assert!(env.contains(&format!("TRANCHE_PID={pid}")), "{env}");
        assert!(env.contains("TRANCHE_LOG="), "other variables pass: {env}");
        assert!(!env.contains("TRANCHE_REDIS_URL"), "{env}");
        assert!(!env.contains("s3cret-pw"), "{env}");
        assert!(!env.contains("adm1n-t0ken"), "nor the admin token: {env}");
    }
}

/// A SIGKILLed worker (or one the OOM killer takes) leaves no chunk behind: the kernel
/// closes its end of each chunk's lifeline pipe and the chunk's guard kills the whole
/// group, grandchildren included. So when the next worker reclaims the range, no copy
/// of it still runs: the ledger of START/END lines never has two copies open at once.
#[test]
fn a_sigkilled_workers_chunks_die_with_it() {
    let dir = scratch("signals-sigkill");
    ok(tranche(
        &dir,
        &["plan", "--min", "1", "--max", "100", "--size", "100"],
    ));
    let ledger = dir.join("ledger");
    // `$$` names the copy (and its process group); `sleep` is a grandchild.
    let exec = format!(
        "echo START $$ $TRANCHE_FROM >> {l}; sleep 4; echo END $$ $TRANCHE_FROM >> {l}",
        l = ledger.display()
    );
    let worker = |exec: &str| {
        let mut cmd = tranche(
            &dir,
            &["run", "--exec", exec, "--chunk", "100", "--lease", "3s"],
        );
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        cmd.spawn().unwrap()
    };
    let mut first = worker(&exec);
    eventually(Duration::from_secs(20), "the first copy started", || {
        !lines(&ledger).is_empty()
    });
    let copy: u32 = lines(&ledger)[0]
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert!(groups().contains(&copy));
    common::signal(&first, "KILL");
    first.wait().unwrap();
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        !groups().contains(&copy),
        "the chunk of a SIGKILLed worker is still alive 1 s later"
    );
    let mut second = worker(&exec);
    let exit = wait(&mut second, Duration::from_secs(60));
    assert!(exit.success(), "{exit:?}");
    // The first copy would have written its END by now (4 s after its START): the
    // ledger is its START, then the second copy's START and END, never two open.
    let ledger = lines(&ledger);
    assert_eq!(ledger.len(), 3, "{ledger:?}");
    let second_copy = ledger[1].split_whitespace().nth(1).unwrap();
    assert_ne!(second_copy, copy.to_string(), "{ledger:?}");
    assert_eq!(ledger[1], format!("START {second_copy} 1"), "{ledger:?}");
    assert_eq!(ledger[2], format!("END {second_copy} 1"), "{ledger:?}");
}

/// A worker cut off from Redis (every call hangs: `CLIENT PAUSE`) cannot renew its
/// lease, so it fences itself: its running chunk is stopped before the lease could
/// expire, so no other worker's reaper can hand the range out while it still runs.
/// Once Redis answers again the partition is done, once, from the start.
#[test]
fn a_worker_cut_off_from_redis_stops_its_chunks_before_its_lease_ends() {
    let redis = TestRedis::start();
    let url = redis.url();
    let dir = scratch("signals-fenced");
    ok(tranche(
        &dir,
        &[
            "--redis", &url, "plan", "--min", "1", "--max", "100", "--size", "100",
        ],
    ));
    let ledger = dir.join("ledger");
    let exec = format!(
        "echo START $$ >> {l}; sleep 8; echo END $$ >> {l}",
        l = ledger.display()
    );
    let mut cmd = tranche(
        &dir,
        &[
            "--redis", &url, "run", "--exec", &exec, "--chunk", "100", "--lease", "3s",
        ],
    );
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut run = cmd.spawn().unwrap();
    eventually(Duration::from_secs(20), "the chunk started", || {
        !lines(&ledger).is_empty()
    });
    let copy: u32 = lines(&ledger)[0]
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    // The heartbeat that marks it running goes out within a second of its start.
    std::thread::sleep(Duration::from_millis(1500));
    let paused = Instant::now();
    redis.cli(&["CLIENT", "PAUSE", "6000", "ALL"]);
    // The last renewal was sent before the pause: the lease holds until at most 3 s
    // after it, and the chunk must be gone before then.
    while groups().contains(&copy) {
        assert!(
            paused.elapsed() < Duration::from_secs(3),
            "the chunk still runs {:?} into the outage",
            paused.elapsed()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let exit = wait(&mut run, Duration::from_secs(90));
    assert!(exit.success(), "{exit:?}");
    let ledger = lines(&ledger);
    assert_eq!(
        ledger.len(),
        3,
        "the stopped copy, then one whole run: {ledger:?}"
    );
    assert!(ledger[0].starts_with("START") && ledger[1].starts_with("START"));
    assert!(ledger[2].starts_with("END"), "{ledger:?}");
}

/// With Redis gone, Ctrl-C still ends the run within the grace period plus the abort's
/// bound, with 130: no store call that keeps failing holds the drain.
#[test]
fn ctrl_c_with_redis_down_is_bounded_and_exits_130() {
    let redis = TestRedis::start();
    let url = redis.url();
    let dir = scratch("signals-redis-down");
    ok(tranche(
        &dir,
        &[
            "--redis", &url, "plan", "--min", "1", "--max", "4", "--size", "1",
        ],
    ));
    let started = dir.join("started");
    let exec = format!("echo $TRANCHE_PID >> {}; sleep 60", started.display());
    let mut cmd = tranche(
        &dir,
        &[
            "--redis",
            &url,
            "run",
            "--exec",
            &exec,
            "--chunk",
            "1",
            "--concurrency",
            "2",
            "--grace",
            "2s",
        ],
    );
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut run = cmd.spawn().unwrap();
    eventually(Duration::from_secs(20), "two chunks started", || {
        lines(&started).len() >= 2
    });
    drop(redis);
    std::thread::sleep(Duration::from_millis(500));
    let signalled = Instant::now();
    common::signal(&run, "INT");
    let exit = wait(&mut run, Duration::from_secs(60));
    let took = signalled.elapsed();
    assert_eq!(exit.code(), Some(130), "after {took:?}");
    assert!(
        took < Duration::from_secs(10),
        "2 s of grace took {took:?} with Redis down"
    );
}
