//! A frozen worker's chunks, with the real binary and a real Redis: a SIGSTOPped
//! `tranche run --exec` cannot stop its chunks, which run in process groups of their
//! own, so each chunk's guard stops its group when no renewal of its lease came in
//! time, before another worker can reclaim the range. A healthy chunk that runs over
//! many leases is renewed, never stopped.

use crate::support;

use crate::common;

use std::path::Path;
use std::process::{Child, Stdio};
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

/// Whether any live (not zombie) process is in group `pgid`.
fn group_alive(pgid: u32) -> bool {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("stat")).ok())
        .any(|stat| {
            let Some(close) = stat.rfind(')') else {
                return false;
            };
            let mut rest = stat[close + 2..].split_whitespace();
            rest.next().is_some_and(|state| state != "Z")
                && rest.nth(1).and_then(|g| g.parse().ok()) == Some(pgid)
        })
}

/// The chunk command: a START line, `work`, an END line, each with `$$` (the copy, and
/// its process group); a SIGTERM is written down as TERM and ends it. `work` must run
/// in the background and be waited for, so that the trap runs at once.
fn ledger_exec(ledger: &Path, work: &str) -> String {
    format!(
        "echo START $$ >> {l}; trap 'echo TERM $$ >> {l}; exit 143' TERM; {work} & wait $!; \
         echo END $$ >> {l}",
        l = ledger.display()
    )
}

/// `tranche --json run --exec EXEC` on `url` with a lease of `lease`, its summary in
/// `out` and its log in `log`.
fn worker(dir: &Path, url: &str, exec: &str, lease: &str, name: &str) -> Child {
    let mut cmd = tranche(
        dir,
        &[
            "--redis", url, "--json", "run", "--exec", exec, "--chunk", "100", "--lease", lease,
        ],
    );
    cmd.stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join(format!("{name}.out"))).unwrap())
        .stderr(std::fs::File::create(dir.join(format!("{name}.log"))).unwrap());
    cmd.spawn().unwrap()
}

/// Kills the worker if the test ends before it does: a SIGSTOPped one would otherwise
/// wait for ever (SIGKILL ends a stopped process too).
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn summary(dir: &Path, name: &str) -> Value {
    let out = std::fs::read_to_string(dir.join(format!("{name}.out"))).unwrap();
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// The case: a worker SIGSTOPped while its chunk runs. Its lease (3 s) is
/// renewed no more; the chunk's guard sends SIGTERM, then kills the group, before the
/// last renewal's lease could end: the group is gone within 3 s of the stop. A second
/// worker then reclaims the range and runs it, and the ledger never has two copies
/// open at once. Thawed, the first worker finds its lease lost and exits cleanly.
#[test]
fn a_sigstopped_workers_chunk_is_stopped_before_its_lease_can_be_reclaimed() {
    let redis = TestRedis::start();
    let url = redis.url();
    let dir = scratch("fence-sigstop");
    ok(tranche(
        &dir,
        &[
            "--redis", &url, "plan", "--min", "1", "--max", "100", "--size", "100",
        ],
    ));
    let ledger = dir.join("ledger");
    let mut first = Reap(worker(
        &dir,
        &url,
        &ledger_exec(&ledger, "sleep 30"),
        "3s",
        "first",
    ));
    eventually(Duration::from_secs(20), "the first copy started", || {
        !lines(&ledger).is_empty()
    });
    let copy: u32 = lines(&ledger)[0]
        .strip_prefix("START ")
        .unwrap()
        .parse()
        .unwrap();
    assert!(group_alive(copy));
    // Renewed a few times first: the guard is re-armed by the pipe before the stop.
    std::thread::sleep(Duration::from_millis(2500));
    common::signal(&first.0, "STOP");
    let stopped = Instant::now();
    let mut second = Reap(worker(
        &dir,
        &url,
        &ledger_exec(&ledger, "sleep 1"),
        "3s",
        "second",
    ));
    // Every renewal was sent before the stop, so the lease holds until at most 3 s
    // after it: the chunk must be gone before then.
    while group_alive(copy) {
        assert!(
            stopped.elapsed() < Duration::from_secs(3),
            "the frozen worker's chunk still runs {:?} after the stop",
            stopped.elapsed()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let exit = wait(&mut second.0, Duration::from_secs(60));
    assert!(exit.success(), "{exit:?}");
    let ledger = lines(&ledger);
    assert_eq!(ledger.len(), 4, "{ledger:?}");
    let second_copy = ledger[2].strip_prefix("START ").expect("a second start");
    assert_ne!(second_copy, copy.to_string());
    assert_eq!(
        ledger,
        [
            format!("START {copy}"),
            format!("TERM {copy}"),
            format!("START {second_copy}"),
            format!("END {second_copy}"),
        ],
        "the first copy stopped before the second started"
    );
    assert_eq!(summary(&dir, "second")["completed"], 1);
    common::signal(&first.0, "CONT");
    let exit = wait(&mut first.0, Duration::from_secs(30));
    let log = std::fs::read_to_string(dir.join("first.log")).unwrap();
    assert!(exit.success(), "{exit:?}: {log}");
    let s = summary(&dir, "first");
    assert_eq!(
        (&s["lost_leases"], &s["completed"]),
        (&1.into(), &0.into()),
        "{s}"
    );
    let status: Value =
        serde_json::from_str(&ok(tranche(&dir, &["--redis", &url, "--json", "status"]))).unwrap();
    assert_eq!(
        (&status["finished"], &status["failed"]),
        (&1.into(), &0.into()),
        "{status}"
    );
}

/// A chunk that runs over several leases (7 s under a 2 s lease) on a healthy worker
/// is renewed all along: its guard never stops it, and it finishes once, with no
/// lease lost.
#[test]
fn a_healthy_chunk_runs_on_over_many_leases() {
    let redis = TestRedis::start();
    let url = redis.url();
    let dir = scratch("fence-healthy");
    ok(tranche(
        &dir,
        &[
            "--redis", &url, "plan", "--min", "1", "--max", "100", "--size", "100",
        ],
    ));
    let ledger = dir.join("ledger");
    let mut run = worker(&dir, &url, &ledger_exec(&ledger, "sleep 7"), "2s", "run");
    let exit = wait(&mut run, Duration::from_secs(60));
    assert!(exit.success(), "{exit:?}");
    let ledger = lines(&ledger);
    assert_eq!(ledger.len(), 2, "{ledger:?}");
    assert!(ledger[0].starts_with("START ") && ledger[1].starts_with("END "));
    let s = summary(&dir, "run");
    assert_eq!(
        (&s["completed"], &s["lost_leases"]),
        (&1.into(), &0.into()),
        "{s}"
    );
}
