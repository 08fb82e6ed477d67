//! The embedded mode end to end: a job interrupted with SIGINT and started again
//! resumes from its state file and finishes, redoing no finished partition and
//! resuming a released one at its checkpoint.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::time::Duration;

use common::{
    LoggedChild, assert_every_id_processed, chunk_log, eventually, ok, scratch, signal, tranche,
    wait,
};

const MIN: u64 = 1;
const MAX: u64 = 40_000;

#[test]
fn interrupted_embedded_job_resumes_where_it_stopped() {
    let dir = scratch("embedded");
    let log = dir.join("chunks.log");
    let exec = format!("{} && sleep 0.03", common::example_script().display());
    let cmd = |args: &[&str]| {
        let mut c = tranche(&dir, args);
        c.env("TRANCHE_LOG", &log);
        c
    };
    ok(cmd(&[
        "plan",
        "--min",
        &MIN.to_string(),
        "--max",
        &MAX.to_string(),
        "--size",
        "1000",
    ]));
    assert!(
        dir.join(".tranche/tranche.state").exists(),
        "plan saves the state file"
    );

    let run = [
        "run",
        "--exec",
        &exec,
        "--chunk",
        "100",
        "--parallel",
        "2",
        "--concurrency",
        "3",
    ];
    let mut first = LoggedChild::spawn(&mut cmd(&run), &dir, "first");
    eventually(Duration::from_secs(120), "a third of the chunks", || {
        chunk_log(&log).len() >= 140
    });
    signal(&first.child, "INT");
    let status = first.wait(Duration::from_secs(60));
    assert_eq!(status.code(), Some(130), "an interrupted run exits 130");

    // What the first run finished, and where the partitions it released stand.
    let before = chunk_log(&log).len();
    let mut finished = BTreeSet::new();
    let mut checkpoints = BTreeMap::new();
    for pid in 1..=40u64 {
        let v: serde_json::Value =
            serde_json::from_str(&ok(cmd(&["get", &pid.to_string(), "--json"]))).unwrap();
        match v["layer"].as_str() {
            Some("archive") | Some("inbox") => {
                finished.insert(pid);
            }
            Some("active") => {
                let p = &v;
                assert_ne!(
                    p["status"], "claimed",
                    "pid {pid} still claimed after a clean stop: {v}"
                );
                assert_ne!(
                    p["status"], "running",
                    "pid {pid} still running after a clean stop: {v}"
                );
                checkpoints.insert(pid, p["checkpoint"].as_u64().unwrap());
            }
            other => panic!("pid {pid}: unexpected layer {other:?}: {v}"),
        }
    }
    assert!(!finished.is_empty(), "the first run finished nothing");
    assert!(
        finished.len() < 40,
        "the first run finished everything before the signal"
    );
    let resumed: Vec<_> = checkpoints
        .iter()
        .filter(|(pid, cp)| **cp > (*pid - 1) * 1000 + 1)
        .collect();
    assert!(
        !resumed.is_empty(),
        "no released partition carried a checkpoint: {checkpoints:?}"
    );

    let out = ok(cmd(&run));
    assert!(out.contains("run finished"), "{out}");

    let all = chunk_log(&log);
    assert_every_id_processed(&all, MIN, MAX);
    for &(pid, from, _) in &all[before..] {
        assert!(
            !finished.contains(&pid),
            "partition {pid} was finished, and ran again from {from}"
        );
        if let Some(&cp) = checkpoints.get(&pid) {
            assert!(
                from >= cp,
                "partition {pid} restarted at {from}, below its checkpoint {cp}"
            );
        }
    }
    let status: serde_json::Value = serde_json::from_str(&ok(cmd(&["status", "--json"]))).unwrap();
    assert_eq!(status["archived"], 40, "{status}");
    assert_eq!(status["finished"], 40, "{status}");
    let check = ok(cmd(&["check"]));
    assert!(check.contains("consistent"), "{check}");
}

/// One process writes an embedded state file at a time: a second one may read it, never
/// overwrite it; a killed holder's lock is free at once.
#[test]
fn one_writer_per_state_file() {
    let dir = scratch("embedded-lock");
    ok(tranche(
        &dir,
        &["plan", "--min", "1", "--max", "20000", "--size", "1000"],
    ));
    let run = [
        "run",
        "--simulate",
        "--sim-latency",
        "200..300",
        "--concurrency",
        "1",
        "--parallel",
        "1",
    ];
    let mut first = tranche(&dir, &run)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let lock = dir.join(".tranche/tranche.state.lock");
    // The lock file outlives every holder (plan's too); the run's pid in it says the
    // run holds it now.
    let pid = first.id().to_string();
    eventually(Duration::from_secs(30), "the run's lock", || {
        std::fs::read_to_string(&lock).is_ok_and(|s| s.trim() == pid)
    });

    // Reading is fine; writing is refused with one line, exit 2.
    let status = ok(tranche(&dir, &["status", "--json"]));
    assert!(status.contains("\"partitions\":20"), "{status}");
    for args in [&["discard", "20"][..], &run[..]] {
        let out = common::output(tranche(&dir, args));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(&format!("another tranche process (pid {})", first.id())),
            "{stderr}"
        );
    }

    // A reader sees the live run's lease and worker entry as saved, not released.
    eventually(
        Duration::from_secs(30),
        "a reader seeing the run's lease",
        || {
            let v: serde_json::Value =
                serde_json::from_str(&ok(tranche(&dir, &["status", "--json"]))).unwrap();
            v["claimed"].as_u64().unwrap() + v["running"].as_u64().unwrap() == 1
        },
    );
    let workers: serde_json::Value =
        serde_json::from_str(&ok(tranche(&dir, &["workers", "--json"]))).unwrap();
    assert_eq!(workers[0]["process_id"], first.id(), "{workers}");

    // Killed without a word, the holder leaves its lock file behind, unheld; the next
    // run takes it.
    first.kill().expect("SIGKILL");
    wait(&mut first, Duration::from_secs(10));
    // Whoever takes the lock over knows the saver is gone: no lease, no worker left.
    let status: serde_json::Value =
        serde_json::from_str(&ok(tranche(&dir, &["status", "--json"]))).unwrap();
    assert_eq!(status["claimed"], 0, "{status}");
    assert_eq!(status["running"], 0, "{status}");
    assert_eq!(ok(tranche(&dir, &["workers", "--json"])).trim(), "[]");
    let out = ok(tranche(
        &dir,
        &["run", "--simulate", "--sim-latency", "0..1"],
    ));
    assert!(out.contains("run finished"), "{out}");
    // The lock file stays (a flock, not a pid file), unheld: a writer goes on.
    assert!(lock.exists());
    let out = common::output(tranche(&dir, &["discard", "20"]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("partition 20 is not pending"), "{stderr}");
}

/// A `run` that starts while another process holds the state file's lock for a moment
/// (a `status` or `health` that started first) waits the hold out and runs; a hold that
/// lasts past the grace is a live writer, and the run is refused with one line, exit 2.
#[test]
fn a_run_waits_out_a_short_hold_on_the_state_file() {
    let dir = scratch("embedded-short-hold");
    ok(tranche(
        &dir,
        &["plan", "--min", "1", "--max", "5000", "--size", "1000"],
    ));
    let lock_path = dir.join(".tranche/tranche.state.lock");
    let hold = || {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&lock_path)
            .expect("the lock file");
        file.try_lock().expect("nobody else holds the lock");
        file
    };
    let run = ["run", "--simulate", "--sim-latency", "0..1"];

    // Held for 1 s, then let go: the run waits and finishes.
    let held = hold();
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(1));
        drop(held);
    });
    let out = ok(tranche(&dir, &run));
    assert!(out.contains("run finished"), "{out}");
    release.join().unwrap();

    // Held throughout: refused after the grace, nothing written.
    let _held = hold();
    let before = std::fs::read(dir.join(".tranche/tranche.state")).unwrap();
    let out = common::output(tranche(&dir, &run));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("another tranche process"), "{stderr}");
    assert_eq!(
        std::fs::read(dir.join(".tranche/tranche.state")).unwrap(),
        before
    );
}

/// The `sleep` processes an `--exec` chunk left behind when its tranche was SIGKILLed
/// (a chunk runs in a process group of its own, which nothing signals then): each chunk
/// wrote its shell's pid to `pids` before becoming `sleep`.
fn kill_orphans(pids: &std::path::Path) {
    for pid in std::fs::read_to_string(pids)
        .unwrap_or_default()
        .split_whitespace()
    {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", pid])
            .stderr(Stdio::null())
            .status();
    }
    let _ = std::fs::remove_file(pids);
}

/// Waits until `run` holds the state lock (a command that found the lock free would
/// take it, and the run would be refused).
fn wait_for_lock(dir: &std::path::Path, run: &std::process::Child) {
    let lock = dir.join(".tranche/tranche.state.lock");
    let holder = run.id().to_string();
    eventually(Duration::from_secs(30), "the run's lock", || {
        std::fs::read_to_string(&lock).is_ok_and(|s| s.trim() == holder)
    });
}

/// Waits until `run` holds the state lock and a reader of the state file sees some
/// partition leased (claimed or running): the first run on a state has saved a lease.
fn wait_for_saved_leases(dir: &std::path::Path, run: &std::process::Child) {
    wait_for_lock(dir, run);
    eventually(Duration::from_secs(60), "the run's leases saved", || {
        let v: serde_json::Value =
            serde_json::from_str(&ok(tranche(dir, &["status", "--json"]))).unwrap();
        v["claimed"].as_u64().unwrap() + v["running"].as_u64().unwrap() > 0
    });
}

/// Waits until `run` holds the state lock and has saved partition 1 leased on its
/// attempt `attempt`.
fn wait_for_saved_lease(dir: &std::path::Path, run: &std::process::Child, attempt: u32) {
    wait_for_lock(dir, run);
    eventually(Duration::from_secs(60), "the run's lease saved", || {
        let v: serde_json::Value =
            serde_json::from_str(&ok(tranche(dir, &["get", "1", "--json"]))).unwrap();
        ["claimed", "running"].contains(&v["status"].as_str().unwrap_or_default())
            && v["attempt"] == attempt
    });
}

/// A partition whose process dies mid-run on every attempt (here SIGKILLed) is not
/// retried for ever: the lease found when the next run takes the state over is an
/// expired lease, its attempt counted, and after `--max-attempts` the partition is
/// failed, as the reaper leaves it on Redis.
#[test]
fn a_partition_that_kills_its_process_every_time_ends_failed() {
    let dir = scratch("embedded-crash-loop");
    let pids = dir.join("chunks.pids");
    ok(tranche(
        &dir,
        &["plan", "--min", "1", "--max", "1000", "--size", "1000"],
    ));
    let exec = format!("echo $$ >> {}; exec sleep 30", pids.display());
    let run = ["run", "--exec", &exec, "--max-attempts", "2"];
    for attempt in 1..=2 {
        let mut child = tranche(&dir, &run)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn");
        // Until this run saves, the file still holds the last run's lease.
        wait_for_saved_lease(&dir, &child, attempt);
        child.kill().expect("SIGKILL");
        wait(&mut child, Duration::from_secs(10));
        kill_orphans(&pids);
    }
    // The third run takes the state over, finds the second attempt's lease dead on the
    // last attempt: failed, nothing left to run, exit 1.
    let out = common::output(tranche(&dir, &run));
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    kill_orphans(&pids);
    let v: serde_json::Value =
        serde_json::from_str(&ok(tranche(&dir, &["get", "1", "--json"]))).unwrap();
    assert_eq!(v["status"], "failed", "{v}");
    assert_eq!(v["attempt"], 2, "{v}");
    let error = v["last_error"].as_str().unwrap_or_default();
    assert!(error.contains("lease expired on attempt 2 of 2"), "{v}");
}

/// A run SIGKILLed while it holds the state lock (and leases, saved) is taken over at
/// once: the kernel freed its `flock`, so the next run neither waits nor is refused,
/// and it releases the dead leases on taking the lock instead of waiting them out
/// (they are ten minutes long here). It finishes the job, nothing lost, and `check`
/// finds everything consistent.
#[test]
fn a_sigkilled_run_is_taken_over_at_once_and_nothing_is_lost() {
    let dir = scratch("embedded-sigkill");
    let log = dir.join("chunks.log");
    let pids = dir.join("chunks.pids");
    let cmd = |args: &[&str]| {
        let mut c = tranche(&dir, args);
        c.env("TRANCHE_LOG", &log);
        c
    };
    ok(cmd(&[
        "plan", "--min", "1", "--max", "20000", "--size", "1000",
    ]));
    let exec = format!(
        "echo $$ >> {}; {} && sleep 0.05",
        pids.display(),
        common::example_script().display()
    );
    let run = [
        "run",
        "--exec",
        &exec,
        "--chunk",
        "100",
        "--parallel",
        "2",
        "--concurrency",
        "2",
        "--lease",
        "10m",
    ];
    let mut first = cmd(&run)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    eventually(Duration::from_secs(120), "some chunks done", || {
        chunk_log(&log).len() >= 30
    });
    wait_for_saved_leases(&dir, &first);
    first.kill().expect("SIGKILL");
    wait(&mut first, Duration::from_secs(10));
    kill_orphans(&pids);

    // At once: no retry, no refusal, and no wait for the ten-minute leases.
    let out = ok(cmd(&run));
    assert!(out.contains("run finished"), "{out}");
    kill_orphans(&pids);
    assert_every_id_processed(&chunk_log(&log), 1, 20_000);
    let status: serde_json::Value = serde_json::from_str(&ok(cmd(&["status", "--json"]))).unwrap();
    assert_eq!(status["archived"], 20, "{status}");
    assert_eq!(status["finished"], 20, "{status}");
    assert_eq!(status["failed"], 0, "{status}");
    let check = ok(cmd(&["check"]));
    assert!(check.contains("consistent"), "{check}");
}

/// Two first commands at once in a directory without a state: never both write. Each
/// one either writes (the other waiting its turn or finding the lock free afterwards)
/// or is refused with one line naming the other process and exit 2; whatever
/// succeeded is in the state file, so nothing a successful command wrote is lost.
#[test]
fn two_first_commands_at_once_never_both_write() {
    for round in 0..8 {
        let dir = scratch(&format!("embedded-first-{round}"));
        let plans = [["1", "10000"], ["10001", "30000"]];
        let mut children: Vec<_> = plans
            .iter()
            .map(|[min, max]| {
                let mut plan = tranche(
                    &dir,
                    &["plan", "--min", min, "--max", max, "--size", "1000"],
                );
                LoggedChild::spawn(&mut plan, &dir, &format!("plan-{min}"))
            })
            .collect();
        let mut planned = 0;
        for (child, [min, max]) in children.iter_mut().zip(plans) {
            let status = child.wait(common::OUTPUT_LIMIT);
            let stderr = child.stderr();
            match status.code() {
                Some(0) => {
                    planned +=
                        (max.parse::<u64>().unwrap() - min.parse::<u64>().unwrap() + 1) / 1000
                }
                Some(2) => {
                    let lines: Vec<&str> = stderr.lines().filter(|l| !l.is_empty()).collect();
                    assert_eq!(lines.len(), 1, "{stderr}");
                    assert!(lines[0].contains("another tranche process"), "{stderr}");
                }
                other => panic!("plan {min}..{max} exited {other:?}: {stderr}"),
            }
        }
        assert!(planned > 0, "round {round}: neither plan was written");
        let status: serde_json::Value =
            serde_json::from_str(&ok(tranche(&dir, &["status", "--json"]))).unwrap();
        assert_eq!(status["partitions"], planned, "round {round}: {status}");
    }
}
