//! The embedded mode end to end: a job interrupted with SIGINT and started again
//! resumes from its state file and finishes, redoing no finished partition and
//! resuming a released one at its checkpoint.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::time::Duration;

use common::{
    assert_every_id_processed, chunk_log, eventually, ok, scratch, signal, tranche, wait,
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
    let mut first = cmd(&run)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    eventually(Duration::from_secs(120), "a third of the chunks", || {
        chunk_log(&log).len() >= 140
    });
    signal(&first, "INT");
    let status = wait(&mut first, Duration::from_secs(60));
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
