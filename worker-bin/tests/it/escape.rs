//! A chunk cannot escape its guard: whatever its command leaves running in the
//! background, in its process group or out of it (`setsid`, `nohup`, a daemon's double
//! fork), is killed once the command has ended, and the worker does not wait on it.
//! Each run has one chunk per partition on three partitions, with the real binary and
//! an embedded state file.

use crate::common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{ok, scratch, tranche, wait};

/// The live (not zombie) processes whose command line is `sleep SECS`.
fn sleeping(secs: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            let state = stat[stat.rfind(')')? + 2..].split_whitespace().next()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            (state != "Z" && cmdline == format!("sleep\0{secs}\0").as_bytes()).then_some(pid)
        })
        .collect()
}

/// Kills what a failed run left behind, by pid, so that a failing test leaves no
/// process for ever.
struct Survivors(&'static str);

impl Drop for Survivors {
    fn drop(&mut self) {
        for pid in sleeping(self.0) {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
}

/// Runs `exec` (which leaves `sleep SECS` behind) on three partitions: the run ends
/// in well under the sleep's time, every partition done, and no such `sleep` is left.
fn leaves_nothing_behind(name: &str, exec: &str, secs: &'static str) {
    let _survivors = Survivors(secs);
    let dir = scratch(name);
    ok(tranche(
        &dir,
        &["plan", "--min", "1", "--max", "3", "--size", "1"],
    ));
    let started = Instant::now();
    let mut run = tranche(
        &dir,
        &[
            "run",
            "--exec",
            exec,
            "--chunk",
            "1",
            "--concurrency",
            "3",
            "--max-attempts",
            "1",
        ],
    )
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    // Hanging on the escaped process's stderr is the failure this guards against:
    // `wait` kills the run and fails the test after 30 s.
    let status = wait(&mut run, Duration::from_secs(30));
    let took = started.elapsed();
    assert!(status.success(), "{status:?}");
    // The escaped process's grace (2 s) and the run's own start and end.
    assert!(took < Duration::from_secs(15), "{took:?}");
    let json: serde_json::Value =
        serde_json::from_str(&ok(tranche(&dir, &["--json", "status"]))).unwrap();
    assert_eq!(json["finished"], 3, "{json}");
    // SIGKILL lands when the process is next scheduled: allow a moment.
    let deadline = Instant::now() + Duration::from_secs(2);
    while !sleeping(secs).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(sleeping(secs), Vec::<u32>::new(), "escaped `sleep {secs}`s");
}

/// `setsid` leaves the chunk's group and session, holding its stderr open: on main
/// the worker waited for that stderr for ever, and the `sleep`s outlived it.
#[test]
fn a_setsid_process_is_killed_and_not_waited_for() {
    leaves_nothing_behind("escape-setsid", "setsid sleep 4711 & exit 0", "4711");
}

/// `nohup … &` stays in the group (the guard's group kill already took it on main):
/// kept so that the sweep never lets it through.
#[test]
fn a_nohup_process_is_killed() {
    leaves_nothing_behind("escape-nohup", "nohup sleep 4712 & exit 0", "4712");
}

/// A daemon's double fork: the middle process exits, the grandchild (in a session of
/// its own, every standard stream closed) is orphaned; on main it went to init and
/// lived on.
#[test]
fn a_double_forked_daemon_is_killed() {
    leaves_nothing_behind(
        "escape-double-fork",
        "( (setsid sleep 4713 </dev/null >/dev/null 2>&1 &) & ); exit 0",
        "4713",
    );
}
