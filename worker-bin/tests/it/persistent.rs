//! `run --exec-persistent` with the real binary on a private Redis: warm processes
//! answer every chunk; one that dies mid-chunk, answers garbage or never answers fails
//! that attempt only, is replaced, and the retry completes; nothing a warm process
//! started outlives the run; a frozen worker's warm process, its guard kept armed from
//! chunk to chunk, is stopped before the lease can pass. The two examples run as they
//! stand, the Python one against a private PostgreSQL.

use crate::support;

use crate::common;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{eventually, ok, scratch, tranche, wait};
use serde_json::Value;
use support::TestRedis;

/// Lines `FROM TO ATTEMPT PID` the test's warm command writes after each chunk it
/// answered `ok`.
fn ledger(path: &Path) -> Vec<(u64, u64, u64, u64)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let w: Vec<u64> = l.split(' ').map(|w| w.parse().unwrap()).collect();
            (w[0], w[1], w[2], w[3])
        })
        .collect()
}

/// A warm command in shell that answers `ok` to every chunk, writing a ledger line,
/// but runs `misbehave` instead on the first attempt of the chunk from ID 41; `start`
/// runs once when it starts.
fn warm(ledger: &Path, start: &str, misbehave: &str) -> String {
    format!(
        r#"{start}
while IFS= read -r l; do
  f=${{l#*\"from\":}}; f=${{f%%,*}}
  t=${{l#*\"to\":}}; t=${{t%%,*}}
  a=${{l#*\"attempt\":}}; a=${{a%%,*}}
  if [ "$f" = 41 ] && [ "$a" = 1 ]; then {misbehave}; fi
  echo "$f $t $a $$" >> {ledger}
  echo ok
done"#,
        ledger = ledger.display()
    )
}

/// Plans IDs 1..=100 in partitions of 20 on `url` and runs `cmd` over them in chunks
/// of 10 (`extra` flags added); the run's exit status and its log.
fn run(dir: &Path, url: &str, cmd: &str, extra: &[&str]) -> (std::process::ExitStatus, String) {
    ok(tranche(
        dir,
        &[
            "--redis", url, "plan", "--min", "1", "--max", "100", "--size", "20",
        ],
    ));
    let log = dir.join("run.log");
    let mut args = vec![
        "--redis",
        url,
        "run",
        "--exec-persistent",
        cmd,
        "--chunk",
        "10",
        "--concurrency",
        "2",
        "--parallel",
        "2",
        "--backoff",
        "100ms",
        "--max-attempts",
        "3",
    ];
    args.extend_from_slice(extra);
    let mut child = tranche(dir, &args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let status = wait(&mut child, Duration::from_secs(90));
    (status, std::fs::read_to_string(&log).unwrap())
}

/// Every partition finished, none failed.
fn all_finished(dir: &Path, url: &str) {
    let status: Value =
        serde_json::from_str(&ok(tranche(dir, &["--redis", url, "--json", "status"]))).unwrap();
    assert_eq!(
        (&status["finished"], &status["failed"]),
        (&5.into(), &0.into()),
        "{status}"
    );
}

/// Every ID answered `ok` for, and the chunk from 41 only on a second attempt.
fn retried_once(ledger: &[(u64, u64, u64, u64)]) {
    let mut covered = [false; 100];
    for &(from, to, _, _) in ledger {
        for id in from..=to {
            covered[id as usize - 1] = true;
        }
    }
    assert!(covered.iter().all(|c| *c), "{ledger:?}");
    let chunk41: Vec<u64> = ledger.iter().filter(|l| l.0 == 41).map(|l| l.2).collect();
    assert_eq!(chunk41, [2], "{ledger:?}");
}

/// The ok path: all partitions done by at most `concurrency × parallel` processes.
#[test]
fn warm_processes_answer_every_chunk() {
    let redis = TestRedis::start();
    let dir = scratch("persistent-ok");
    let ledger_path = dir.join("ledger");
    let (status, log) = run(&dir, &redis.url(), &warm(&ledger_path, ":", "true"), &[]);
    assert!(status.success(), "{status:?}: {log}");
    all_finished(&dir, &redis.url());
    let ledger = ledger(&ledger_path);
    assert_eq!(ledger.len(), 10, "{ledger:?}");
    let mut pids: Vec<u64> = ledger.iter().map(|l| l.3).collect();
    pids.sort_unstable();
    pids.dedup();
    assert!(
        pids.len() <= 4,
        "one process per chunk in flight at most: {pids:?}"
    );
}

/// A warm process killed in the middle of a chunk: that attempt fails, a new process
/// takes the next chunk, and the retry (attempt 2) completes.
#[test]
fn a_process_killed_mid_chunk_is_replaced_and_the_chunk_retried() {
    let redis = TestRedis::start();
    let dir = scratch("persistent-killed");
    let ledger_path = dir.join("ledger");
    let (status, log) = run(
        &dir,
        &redis.url(),
        &warm(&ledger_path, ":", "kill -KILL $$"),
        &[],
    );
    assert!(status.success(), "{status:?}: {log}");
    all_finished(&dir, &redis.url());
    assert!(
        log.contains("ended before answering (killed by a signal)"),
        "{log}"
    );
    retried_once(&ledger(&ledger_path));
}

/// An answer that is none: the attempt fails (and the process is replaced).
#[test]
fn a_garbage_answer_fails_the_attempt() {
    let redis = TestRedis::start();
    let dir = scratch("persistent-garbage");
    let ledger_path = dir.join("ledger");
    let (status, log) = run(
        &dir,
        &redis.url(),
        &warm(&ledger_path, ":", "echo 'bogus'; continue"),
        &[],
    );
    assert!(status.success(), "{status:?}: {log}");
    all_finished(&dir, &redis.url());
    assert!(
        log.contains(r#"answered \"bogus\""#) || log.contains(r#"answered "bogus""#),
        "{log}"
    );
    retried_once(&ledger(&ledger_path));
}

/// A process that never answers is stopped at `--chunk-timeout` (its `sleep` with
/// it), and the retry completes.
#[test]
fn a_silent_process_is_stopped_at_the_chunk_timeout() {
    let _survivors = Survivors("4731");
    let redis = TestRedis::start();
    let dir = scratch("persistent-silent");
    let ledger_path = dir.join("ledger");
    let started = Instant::now();
    let (status, log) = run(
        &dir,
        &redis.url(),
        &warm(&ledger_path, ":", "sleep 4731"),
        &["--chunk-timeout", "1s"],
    );
    assert!(status.success(), "{status:?}: {log}");
    assert!(started.elapsed() < Duration::from_secs(60));
    all_finished(&dir, &redis.url());
    assert!(log.contains("did not answer within 1s"), "{log}");
    retried_once(&ledger(&ledger_path));
    gone("4731");
}

/// A warm process that starts a `setsid sleep` (out of its group and session) leaves
/// nothing behind once the run is over.
#[test]
fn what_a_warm_process_starts_does_not_outlive_the_run() {
    let _survivors = Survivors("4732");
    let redis = TestRedis::start();
    let dir = scratch("persistent-setsid");
    let ledger_path = dir.join("ledger");
    let (status, log) = run(
        &dir,
        &redis.url(),
        &warm(
            &ledger_path,
            "setsid sleep 4732 </dev/null >/dev/null 2>&1 &",
            "true",
        ),
        &[],
    );
    assert!(status.success(), "{status:?}: {log}");
    all_finished(&dir, &redis.url());
    gone("4732");
}

/// A worker SIGSTOPped while its warm process runs a chunk, the third that process
/// got (its guard armed once and kept, or moved by renewals): no renewal comes any
/// more, and the guard stops the process's group within the lease (3 s) of the stop.
/// A second worker then finishes the partition, starting after the first's process
/// was stopped.
#[test]
fn a_frozen_workers_warm_process_is_stopped_before_its_lease_can_pass() {
    let redis = TestRedis::start();
    let url = redis.url();
    let dir = scratch("persistent-sigstop");
    ok(tranche(
        &dir,
        &[
            "--redis", &url, "plan", "--min", "1", "--max", "100", "--size", "100",
        ],
    ));
    let ledger = dir.join("ledger");
    // The first worker's process answers the chunks from 1 and 11 at once and hangs on
    // the one from 21; the second's writes down each chunk it answers.
    let first_cmd = format!(
        r#"trap 'echo TERM $$ >> {l}; exit 143' TERM
while IFS= read -r l; do
  f=${{l#*\"from\":}}; f=${{f%%,*}}
  if [ "$f" = 21 ]; then echo START $$ >> {l}; sleep 4733 & wait $!; fi
  echo ok
done"#,
        l = ledger.display()
    );
    let second_cmd = format!(
        r#"while IFS= read -r l; do
  f=${{l#*\"from\":}}; f=${{f%%,*}}
  echo "SECOND $f" >> {l}
  echo ok
done"#,
        l = ledger.display()
    );
    let worker = |cmd: &str, name: &str| {
        let mut c = tranche(
            &dir,
            &[
                "--redis",
                &url,
                "run",
                "--exec-persistent",
                cmd,
                "--chunk",
                "10",
                "--concurrency",
                "1",
                "--parallel",
                "1",
                "--lease",
                "3s",
            ],
        );
        c.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join(format!("{name}.log"))).unwrap());
        Reap(c.spawn().unwrap())
    };
    let _survivors = Survivors("4733");
    let first = worker(&first_cmd, "first");
    eventually(Duration::from_secs(20), "the chunk from 21 started", || {
        !lines(&ledger).is_empty()
    });
    let pid: u32 = lines(&ledger)[0]
        .strip_prefix("START ")
        .unwrap()
        .parse()
        .unwrap();
    let pgid = pgid_of(pid).expect("the warm process runs");
    std::thread::sleep(Duration::from_millis(1500));
    common::signal(&first.0, "STOP");
    let stopped = Instant::now();
    // Every renewal was sent before the stop: the lease holds until at most 3 s after
    // it, and the warm process's group must be gone before then.
    while group_alive(pgid) {
        assert!(
            stopped.elapsed() < Duration::from_secs(3),
            "the frozen worker's warm process still runs {:?} after the stop",
            stopped.elapsed()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    gone("4733");
    let mut second = worker(&second_cmd, "second");
    let exit = wait(&mut second.0, Duration::from_secs(60));
    assert!(exit.success(), "{exit:?}");
    let ledger = lines(&ledger);
    assert_eq!(
        ledger[..2],
        [format!("START {pid}"), format!("TERM {pid}")],
        "{ledger:?}"
    );
    assert!(
        ledger[2..].iter().all(|l| l.starts_with("SECOND "))
            && ledger.contains(&"SECOND 21".to_owned()),
        "{ledger:?}"
    );
    all_done(&dir, &url, 1);
}

/// Every partition of `count` finished, none failed.
fn all_done(dir: &Path, url: &str, count: u64) {
    let status: Value =
        serde_json::from_str(&ok(tranche(dir, &["--redis", url, "--json", "status"]))).unwrap();
    assert_eq!(
        (&status["finished"], &status["failed"]),
        (&count.into(), &0.into()),
        "{status}"
    );
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The process group of live process `pid`.
fn pgid_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 2..]
        .split_whitespace()
        .nth(2)?
        .parse()
        .ok()
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

/// Kills a worker the test leaves running: a SIGSTOPped one would wait for ever
/// (SIGKILL ends a stopped process too).
struct Reap(std::process::Child);

impl Drop for Reap {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// `examples/persistent.sh` as it stands.
#[test]
fn the_shell_example_runs() {
    let redis = TestRedis::start();
    let dir = scratch("persistent-example-sh");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/persistent.sh");
    let log_path = dir.join("chunks");
    ok(tranche(
        &dir,
        &[
            "--redis",
            &redis.url(),
            "plan",
            "--min",
            "1",
            "--max",
            "1000",
            "--size",
            "100",
        ],
    ));
    let mut cmd = tranche(
        &dir,
        &[
            "--redis",
            &redis.url(),
            "run",
            "--exec-persistent",
            script.to_str().unwrap(),
            "--chunk",
            "25",
        ],
    );
    cmd.env("TRANCHE_LOG", &log_path);
    ok(cmd);
    let log = common::chunk_log(&log_path);
    assert_eq!(log.len(), 40);
    common::assert_every_id_processed(&log, 1, 1000);
}

/// `examples/persistent-psycopg.py` against a private PostgreSQL: every row is
/// backfilled with its chunk's fence, except the rows a later lease already wrote
/// (a larger fence), which are left as they are.
#[test]
fn the_python_example_backfills_postgres() {
    let python3 = support::psycopg_python()
        .expect("no python3 imports psycopg2: apt-get install python3-psycopg2");
    let python = |script: &str, url: &str| {
        let out = std::process::Command::new(python3)
            .args(["-c", script])
            .env("DATABASE_URL", url)
            .output()
            .expect("python3");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{err}\n(psycopg2 is needed: pip install psycopg2-binary)"
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let pg = support::TestPostgres::start();
    python(
        "import os, psycopg2
c = psycopg2.connect(os.environ['DATABASE_URL'])
c.autocommit = True
with c.cursor() as c:
    c.execute(\"CREATE TABLE users (id bigint PRIMARY KEY, email text NOT NULL, \
email_lower text, fence bigint NOT NULL DEFAULT 0)\")
    c.execute(\"INSERT INTO users (id, email) SELECT i, 'User' || i || '@Example.COM' \
FROM generate_series(1, 2000) i\")
    c.execute(\"UPDATE users SET email_lower = 'kept', fence = 9223372036854775807 \
WHERE id BETWEEN 500 AND 509\")",
        &pg.url(),
    );
    let redis = TestRedis::start();
    let dir = scratch("persistent-example-py");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/persistent-psycopg.py");
    ok(tranche(
        &dir,
        &[
            "--redis",
            &redis.url(),
            "plan",
            "--min",
            "1",
            "--max",
            "2000",
            "--size",
            "200",
        ],
    ));
    let exec = format!("{python3} {}", script.display());
    let mut cmd = tranche(
        &dir,
        &[
            "--redis",
            &redis.url(),
            "run",
            "--exec-persistent",
            &exec,
            "--chunk",
            "50",
            "--concurrency",
            "2",
            "--parallel",
            "2",
        ],
    );
    cmd.env("DATABASE_URL", pg.url());
    ok(cmd);
    let counts = python(
        "import os, psycopg2
with psycopg2.connect(os.environ['DATABASE_URL']).cursor() as c:
    c.execute(\"SELECT count(*) FILTER (WHERE email_lower = lower(email) AND fence > 0), \
count(*) FILTER (WHERE email_lower = 'kept'), count(*) FROM users\")
    print(*c.fetchone())",
        &pg.url(),
    );
    assert_eq!(counts.trim(), "1990 10 2000");
}

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

/// No `sleep SECS` is left (SIGKILL lands when the process is next scheduled: a
/// moment is allowed).
fn gone(secs: &str) {
    let deadline = Instant::now() + Duration::from_secs(2);
    while !sleeping(secs).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        sleeping(secs),
        Vec::<u32>::new(),
        "`sleep {secs}` outlived the run"
    );
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
