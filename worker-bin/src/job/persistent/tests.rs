//! The warm-process pool's unit tests: the protocol, restarts, the timeout and the fence.

use std::time::Duration;

use super::super::test_support::{chunk, fence};
use super::super::{ChunkError, Job};
use super::*;

#[test]
fn answers_are_read_strictly() {
    assert_eq!(parse_answer(b"ok\n"), Some(Answer::Ok));
    assert_eq!(parse_answer(b"ok\r\n"), Some(Answer::Ok));
    assert_eq!(
        parse_answer(b"error: lock timeout\n"),
        Some(Answer::Error("lock timeout".into()))
    );
    assert_eq!(parse_answer(b"error\n"), Some(Answer::Error(String::new())));
    assert_eq!(
        parse_answer(b"permanent: bad row 7\n"),
        Some(Answer::Permanent("bad row 7".into()))
    );
    for garbage in [
        &b"ok"[..],
        b"OK\n",
        b"ok \n",
        b"okay\n",
        b"errors: x\n",
        b"\n",
        b"{\"ok\":true}\n",
        b"\xff\n",
    ] {
        assert_eq!(parse_answer(garbage), None, "{garbage:?}");
    }
}

#[test]
fn a_request_is_one_json_line() {
    let line = request(&chunk());
    assert!(line.ends_with('\n') && line.matches('\n').count() == 1);
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"pid": 7, "chunk": 2, "from": 6201, "to": 6300, "attempt": 3, "fence": 41})
    );
}

/// With a trace context the line carries it, and a warm process reads it; a run
/// without one sends none (above).
#[tokio::test]
async fn a_traced_request_carries_its_traceparent() {
    let tp = crate::trace::TraceParent::new([0x4b; 16], [0x3c; 8], true).unwrap();
    let line = crate::trace::scoped(&chunk(), tp, async { request(&chunk()) }).await;
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["traceparent"], tp.to_string().as_str());
    assert_eq!(v["fence"], 41);
    // Through a warm process: it answers `ok` only for a line with the traceparent.
    let job = job(
        &format!(
            "while read l; do case \"$l\" in *'\"traceparent\":\"{tp}\"'*) echo ok;; *) echo 'error: none';; esac; done"
        ),
        None,
    );
    let run = job.run(chunk(), std::future::pending(), None);
    assert_eq!(crate::trace::scoped(&chunk(), tp, run).await, Ok(None));
    assert!(
        job.run(chunk(), std::future::pending(), None)
            .await
            .is_err()
    );
}

fn job(cmd: &str, timeout: Option<Duration>) -> Job {
    Job::Persistent(std::sync::Arc::new(Persistent::new(cmd, timeout)))
}

/// One process answers chunk after chunk: its pid is the same each time.
#[tokio::test]
async fn one_process_answers_every_chunk() {
    let dir = scratch("warm-one");
    let log = dir.join("log");
    let job = job(
        &format!(
            "while read -r l; do echo \"$$ $l\" >> {}; echo ok; done",
            log.display()
        ),
        None,
    );
    for _ in 0..3 {
        assert_eq!(
            job.run(chunk(), std::future::pending(), None).await,
            Ok(None)
        );
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let pids: Vec<&str> = text.lines().map(|l| l.split(' ').next().unwrap()).collect();
    assert_eq!(pids.len(), 3, "{text}");
    assert!(pids.iter().all(|p| *p == pids[0]), "{text}");
    assert!(text.contains("\"fence\":41"), "{text}");
}

#[tokio::test]
async fn error_and_permanent_answers_keep_the_process() {
    let job = job(
        "n=0; while read -r l; do n=$((n+1)); case $n in 1) echo 'error: try again';; \
         2) echo 'permanent: row 7 is bad';; *) echo ok;; esac; done",
        None,
    );
    let run = || job.run(chunk(), std::future::pending(), None);
    assert!(matches!(
        run().await,
        Err(ChunkError::Failed(e)) if e == "chunk 2 (6201..=6300) failed: try again"
    ));
    assert!(matches!(
        run().await,
        Err(ChunkError::Refused(e, p)) if e.ends_with("row 7 is bad") && p.permanent
    ));
    // The same process: its count went on.
    assert_eq!(run().await, Ok(None));
}

#[tokio::test]
async fn garbage_fails_the_attempt_and_restarts_the_process() {
    let job = job(
        "read -r l; echo 'what?'; while read -r l; do echo ok; done",
        None,
    );
    let run = || job.run(chunk(), std::future::pending(), None);
    assert!(matches!(
        run().await,
        Err(ChunkError::Failed(e)) if e.contains("answered \"what?\"")
    ));
    // A new process, which answers garbage first again.
    assert!(matches!(run().await, Err(ChunkError::Failed(_))));
}

#[tokio::test]
async fn a_death_fails_with_the_stderr_tail_and_a_missing_command_is_broken() {
    let died = job("read -r l; echo 'out of memory' >&2; exit 3", None);
    assert!(matches!(
        died.run(chunk(), std::future::pending(), None).await,
        Err(ChunkError::Failed(e)) if e.ends_with("(exit status 3): out of memory")
    ));
    let missing = job("no-such-command-here", None);
    assert!(matches!(
        missing.run(chunk(), std::future::pending(), None).await,
        Err(ChunkError::Broken(_))
    ));
    let missing = job("no-such-command-here; true", None);
    assert!(matches!(
        missing.run(chunk(), std::future::pending(), None).await,
        Err(ChunkError::Failed(_)) | Err(ChunkError::Broken(_))
    ));
}

/// No answer within the timeout: the process is stopped (it traps SIGTERM and says
/// so) and the attempt fails.
#[tokio::test]
async fn a_silent_process_is_stopped_at_the_timeout() {
    let dir = scratch("warm-silent");
    let termed = dir.join("termed");
    let job = job(
        &format!(
            "trap 'echo TERM > {}; exit 143' TERM; read -r l; sleep 30 & wait $!",
            termed.display()
        ),
        Some(Duration::from_millis(300)),
    );
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        job.run(chunk(), std::future::pending(), None),
    )
    .await
    .expect("stopped at the timeout");
    assert!(
        matches!(&r, Err(ChunkError::Failed(e)) if e.contains("did not answer within")),
        "{r:?}"
    );
    assert_eq!(std::fs::read_to_string(&termed).unwrap(), "TERM\n");
}

/// The worker is as good as frozen: no renewal comes, and the guard stops the warm
/// process at the fence's stop instant; the chunk is interrupted, not failed.
#[tokio::test]
async fn the_guard_stops_a_warm_process_whose_lease_goes_unrenewed() {
    let job = job("read -r l; sleep 30", None);
    let ms = Duration::from_millis;
    let (_renewals, fence) = fence(ms(1500), ms(1000), ms(500), ms(100));
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        job.run(chunk(), std::future::pending(), Some(fence)),
    )
    .await
    .expect("the guard stopped it");
    assert_eq!(r, Err(ChunkError::Interrupted));
}

/// Between chunks the guard stays armed: an idle process whose last chunk's stop
/// instant came is stopped by its guard, and the next chunk starts another, which
/// answers it.
#[tokio::test]
async fn an_idle_process_whose_stop_instant_came_is_replaced() {
    let dir = scratch("warm-idle");
    let log = dir.join("log");
    let job = job(
        &format!(
            "while read -r l; do echo $$ >> {}; echo ok; done",
            log.display()
        ),
        None,
    );
    let ms = Duration::from_millis;
    let (_renewals, first) = fence(ms(1000), ms(600), ms(300), ms(100));
    assert_eq!(
        job.run(chunk(), std::future::pending(), Some(first)).await,
        Ok(None)
    );
    // The guard stops it at the first chunk's instant (400 ms on), SIGKILL 300 ms later.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !warm(&job).idle.lock().unwrap().iter_mut().all(Warm::ended) {
        assert!(
            std::time::Instant::now() < deadline,
            "the idle process's guard never stopped it"
        );
        tokio::time::sleep(ms(10)).await;
    }
    let hour = Duration::from_secs(3600);
    let (_renewals, far) = fence(hour, hour / 6, hour / 12, hour / 6);
    assert_eq!(
        job.run(chunk(), std::future::pending(), Some(far)).await,
        Ok(None)
    );
    let text = std::fs::read_to_string(&log).unwrap();
    let pids: Vec<&str> = text.lines().collect();
    assert!(pids.len() == 2 && pids[0] != pids[1], "{text}");
}

/// A guard armed for one partition's chunk (a late stop instant) is re-armed for the
/// next chunk when that one's lease stops earlier (another partition's): with no
/// renewal (a frozen worker), the second chunk's process is stopped at its own instant,
/// not at the first's, an hour away.
#[tokio::test]
async fn a_chunk_whose_lease_stops_earlier_re_arms_the_guard() {
    let job = job("read -r l; echo ok; read -r l; sleep 60", None);
    let ms = Duration::from_millis;
    let hour = Duration::from_secs(3600);
    let (_a, late) = fence(hour, hour / 6, hour / 12, hour / 6);
    assert_eq!(
        job.run(chunk(), std::future::pending(), Some(late)).await,
        Ok(None)
    );
    let (_b, early) = fence(ms(1500), ms(1000), ms(500), ms(100));
    let mut other = chunk();
    other.pid = 8;
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        job.run(other, std::future::pending(), Some(early)),
    )
    .await
    .expect("stopped at the second chunk's instant, not at the first's");
    assert_eq!(r, Err(ChunkError::Interrupted));
}

/// A chunk under a fence that keeps the instant the guard has (the same lease, not
/// renewed since) costs the guard no line: the timer `sleep` the first chunk started is
/// the one still running after the second.
#[tokio::test]
async fn a_chunk_under_the_same_lease_keeps_the_guards_timer() {
    let job = job("while read -r l; do echo ok; done", None);
    let hour = Duration::from_secs(3600);
    let (_renewals, fence) = fence(hour, hour / 6, hour / 12, hour / 6);
    let run = || job.run(chunk(), std::future::pending(), Some(fence.clone()));
    assert_eq!(run().await, Ok(None));
    let pgid = warm(&job).idle.lock().unwrap()[0].pgid;
    // The watcher starts its timer as the chunk is sent: wait for it.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let first = loop {
        let timers = timers(pgid);
        if !timers.is_empty() {
            break timers;
        }
        assert!(std::time::Instant::now() < deadline, "no timer started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(run().await, Ok(None));
    assert_eq!(warm(&job).idle.lock().unwrap()[0].pgid, pgid);
    // A line would have the watcher cancel that timer and start another: time for it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(timers(pgid), first);
}

/// A chunk without a fence on a process whose guard is armed disarms it: the chunk
/// runs on past the instant the last chunk had.
#[tokio::test]
async fn a_chunk_without_a_fence_disarms_the_guard() {
    let job = job("read -r l; echo ok; read -r l; sleep 1; echo ok", None);
    let ms = Duration::from_millis;
    let (_renewals, first) = fence(ms(1000), ms(600), ms(300), ms(100));
    assert_eq!(
        job.run(chunk(), std::future::pending(), Some(first)).await,
        Ok(None)
    );
    assert_eq!(
        job.run(chunk(), std::future::pending(), None).await,
        Ok(None)
    );
}

/// The pool of a persistent job.
fn warm(job: &Job) -> &Persistent {
    let Job::Persistent(warm) = job else {
        unreachable!()
    };
    warm
}

/// The live (not zombie) `sleep` processes of group `pgid`: a guard's timers.
fn timers(pgid: u32) -> Vec<u32> {
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            let mut rest = stat[stat.rfind(')')? + 2..].split_whitespace();
            let state = rest.next()?;
            let group: u32 = rest.nth(1)?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            (state != "Z" && group == pgid && cmdline.starts_with(b"sleep\0")).then_some(pid)
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// A process that ends between chunks costs the next chunk nothing: another one
/// is started for it.
#[tokio::test]
async fn a_process_that_ended_while_idle_is_replaced_before_the_chunk() {
    let job = job("read -r l; echo ok", None);
    let run = || job.run(chunk(), std::future::pending(), None);
    assert_eq!(run().await, Ok(None));
    // It reads one line only: by the next chunk it has ended.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !warm(&job).idle.lock().unwrap().iter_mut().all(Warm::ended) {
        assert!(std::time::Instant::now() < deadline, "it never ended");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(run().await, Ok(None));
}

/// A library user's `PersistentCommand` runs as `--exec-persistent` does when a
/// `Runner` runs it, and as a plain handler when called by hand.
#[tokio::test]
async fn the_library_handler_is_the_same_job() {
    use crate::handler::Handler;
    let warm = PersistentCommand::new(
        "while read -r l; do case $l in *'\"attempt\":3'*) echo 'permanent: no';; *) echo ok;; esac; done",
    );
    assert!(matches!(Job::of_handler(warm.clone()), Job::Persistent(_)));
    let err = warm.process(chunk()).await.unwrap_err();
    assert!(
        err.is_permanent() && err.to_string().ends_with("no"),
        "{err}"
    );
    let mut first = chunk();
    first.attempt = 1;
    assert!(warm.process(first).await.is_ok());
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("tranche-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
