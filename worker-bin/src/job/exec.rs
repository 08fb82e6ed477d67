//! A command's chunk (`--exec`): `sh -c CMD` under the guard (`guard.rs`), in a
//! process group of its own; a plain command (`./reindex.sh --fast`) `exec`ed by the
//! guard itself, without the `sh -c`.
//!
//! A Ctrl-C in the terminal reaches tranche alone (which drains), never the chunks, and
//! when the grace period is over the whole group is stopped (SIGTERM, then SIGKILL),
//! grandchildren included, so no chunk outlives the lease it ran under. Nor does a chunk
//! outlive its worker, however the worker dies, or its lease when the worker is frozen:
//! the guard sees to both from inside the group.
//!
//! The child's environment is tranche's minus the variables tranche reads secrets
//! from (`spawn.rs`), plus the chunk's variables: `TRANCHE_PID`, `TRANCHE_FROM`,
//! `TRANCHE_TO`, `TRANCHE_ATTEMPT`, `TRANCHE_CHUNK`, `TRANCHE_FENCE` (the lease's
//! fencing token, larger for every later lease on the range: guard the chunk's writes
//! with it, `UPDATE … SET fence = $TRANCHE_FENCE WHERE id BETWEEN … AND fence <
//! $TRANCHE_FENCE`, and a worker that lost its lease unawares cannot overwrite its
//! successor's rows) and the tag its leftovers are found by (`reap.rs`); and, when the
//! run exports traces, `TRACEPARENT`, the W3C trace context of the chunk's span
//! ([`Chunk::traceparent`]), for the command to continue its trace.
//!
//! [`exec`] runs it in named steps: [`usable_fence`], [`spawn_guarded`], the wait (the
//! command's end or the drain's abort), [`collect`] (the stderr tail and the sweep of
//! what it left behind) and [`verdict`].

use std::future::Future;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::guard::{GUARD, GUARD_DIRECT, plain_words, secs, tell, usable_fence};
use super::reap;
use super::spawn::{prepare, signal_group};
use super::{Chunk, ChunkError, Fence, KILL_AFTER};

/// The most of a failed command's stderr kept in its failure message.
const STDERR_TAIL: usize = 1024;

/// Reads `stderr` to its end, or until told to `stop`, keeping its tail only: a chatty
/// command must not grow this process's memory. Says `done` at end-of-file.
async fn read_tail(
    mut stderr: tokio::process::ChildStderr,
    done: oneshot::Sender<()>,
    mut stop: oneshot::Receiver<()>,
) -> Vec<u8> {
    let mut tail: Vec<u8> = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let read = tokio::select! {
            biased;
            read = stderr.read(&mut buf) => read,
            _ = &mut stop => break,
        };
        match read {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                tail.extend_from_slice(&buf[..n]);
                if tail.len() > 2 * STDERR_TAIL {
                    tail.drain(..tail.len() - STDERR_TAIL);
                }
            }
        }
    }
    let _ = done.send(());
    tail
}

/// Runs `cmd` for `chunk` (see the module's docs).
pub(super) async fn exec(
    cmd: &str,
    chunk: Chunk,
    abort: impl Future<Output = Duration>,
    fence: Option<Fence>,
) -> Result<(), ChunkError> {
    let fence = usable_fence(fence).await?;
    // How long what the command leaves behind may live on after it: the fence's
    // grace, or a drain's.
    let grace = fence.as_ref().map_or(KILL_AFTER, Fence::grace);
    let tag = reap::new_tag();
    // `told`: the stop instant the guard has, set here, moved on by `tell`.
    let (mut child, mut told) = spawn_guarded(cmd, &chunk, fence.as_ref(), &tag)?;
    let pgid = child.id().expect("a child just spawned has a pid");
    // Written to only by `tell`; held until the command has ended (or this future is
    // dropped, after an abort): closing it, or this process dying, is what tells the
    // guard to kill the group.
    let mut lifeline = child.stdin.take().expect("stdin is piped");
    let stderr = child.stderr.take().expect("stderr is piped");
    // Said when stderr reaches end-of-file: every process of the chunk that held it is
    // gone.
    let (tail_done, mut tail_done_rx) = oneshot::channel::<()>();
    // Ends the tail's reading early: a process the chunk left behind may hold stderr
    // open, and is killed before its end-of-file.
    let (stop_tail, stop_tail_rx) = oneshot::channel::<()>();
    let mut tail = tokio::spawn(read_tail(stderr, tail_done, stop_tail_rx));
    let wait = async {
        let status = tokio::select! {
            status = child.wait() => status,
            never = tell(&mut lifeline, fence, &mut told) => match never {},
        };
        // Killed by a signal, as a stop is (the guard's SIGTERM, or a drain's): a lone
        // command under `sh -c` is a child of `sh` (dash does not exec it), which
        // dies of the SIGTERM at once while the command may still be running its own
        // handler. Closing the lifeline now would have the guard SIGKILL it a few ms
        // after its SIGTERM; the group keeps it until its stderr closes (every process
        // of it gone), `KILL_AFTER` at most. The guard's timer and the abort's grace
        // still bound the group as before.
        if matches!(&status, Ok(s) if s.signal().is_some()) {
            let _ = tokio::time::timeout(KILL_AFTER, &mut tail_done_rx).await;
        }
        drop(lifeline);
        (status, told)
    };
    tokio::pin!(wait);
    let (status, told) = tokio::select! {
        done = &mut wait => done,
        grace = abort => {
            // The whole group, grandchildren too: SIGTERM, SIGKILL if it lingers. A
            // process that left the group could still hold stderr open, so the wait
            // for the pipe is bounded as well.
            signal_group(pgid, Signal::SIGTERM);
            let _ = tokio::time::timeout(grace, async {
                let _ = (&mut wait).await;
                let _ = (&mut tail).await;
            })
            .await;
            let _ = stop_tail.send(());
            reap::sweep(pgid, &tag, KILL_AFTER).await;
            return Err(ChunkError::Interrupted);
        }
    };
    let tail = collect(tail, stop_tail, pgid, &tag, grace).await;
    let status = status.map_err(|e| ChunkError::Failed(format!("waiting for `{cmd}`: {e}")))?;
    record_end(status, tail.len());
    verdict(cmd, &chunk, status, told, &tail)
}

/// Spawns `cmd` for `chunk` under its guard ([`GUARD`], or [`GUARD_DIRECT`] for a
/// plain command), its stdin the lifeline, the chunk in its environment; with the stop
/// instant the guard was given when there is a `fence`.
fn spawn_guarded(
    cmd: &str,
    chunk: &Chunk,
    fence: Option<&Fence>,
    tag: &str,
) -> Result<(Child, Option<Instant>), ChunkError> {
    reap::become_subreaper();
    let words = plain_words(cmd);
    let mut command = Command::new("sh");
    let guard = if words.is_some() { GUARD_DIRECT } else { GUARD };
    command.arg("-c").arg(guard).arg("tranche-chunk").arg(cmd);
    let mut told = None;
    if let Some(fence) = fence {
        let stop_at = fence.stop_at();
        command
            .arg(secs(stop_at.saturating_duration_since(Instant::now())))
            .arg(secs(fence.grace()));
        told = Some(stop_at);
    }
    if let Some(words) = words {
        // `STOP GRACE` are always there for the direct guard, empty without a fence.
        if told.is_none() {
            command.args(["", ""]);
        }
        command.args(words);
    }
    // A group of its own (the terminal's Ctrl-C is for tranche, not the chunk); should
    // this future be dropped, at least `sh` goes.
    prepare(&mut command, tag, 0);
    if let Some(traceparent) = chunk.traceparent() {
        command.env("TRACEPARENT", traceparent.to_string());
    }
    let child = command
        .env("TRANCHE_PID", chunk.pid.to_string())
        .env("TRANCHE_FROM", chunk.from.to_string())
        .env("TRANCHE_TO", chunk.to.to_string())
        .env("TRANCHE_ATTEMPT", chunk.attempt.to_string())
        .env("TRANCHE_CHUNK", chunk.index.to_string())
        .env("TRANCHE_FENCE", chunk.fence.to_string())
        // The lifeline: its write end, created close-on-exec, stays in this process.
        .stdin(Stdio::piped())
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| ChunkError::Failed(format!("cannot start `sh -c {cmd}`: {e}")))?;
    Ok((child, told))
}

/// Records on the chunk's span, when it is enabled, how the command ended and how much
/// of its stderr was kept (the failure message holds the last [`STDERR_TAIL`] bytes).
pub(super) fn record_end(status: ExitStatus, stderr_kept: usize) {
    let span = tracing::Span::current();
    if span.is_disabled() {
        return;
    }
    match (status.code(), status.signal()) {
        (Some(code), _) => span.record("exit_status", code),
        (None, Some(signal)) => span.record("exit_status", format!("signal {signal}")),
        (None, None) => span.record("exit_status", "unknown"),
    };
    span.record("stderr_bytes", stderr_kept.min(STDERR_TAIL) as u64);
}

/// After the command ended: what it left behind holding stderr has the `grace` to end
/// by itself; then whatever is left of group `pgid` or carries `tag`, holding stderr
/// or not, is killed. The stderr tail read.
async fn collect(
    mut tail: JoinHandle<Vec<u8>>,
    stop_tail: oneshot::Sender<()>,
    pgid: u32,
    tag: &str,
    grace: Duration,
) -> Vec<u8> {
    match tokio::time::timeout(grace, &mut tail).await {
        Ok(tail) => {
            reap::sweep(pgid, tag, KILL_AFTER).await;
            tail
        }
        Err(_) => {
            reap::sweep(pgid, tag, KILL_AFTER).await;
            let _ = stop_tail.send(());
            tail.await
        }
    }
    .unwrap_or_default()
}

/// What the command's exit `status` means for the chunk: done; interrupted, when it
/// ended past the instant its guard was `told` to stop it; broken (126, 127); or
/// failed, with the `tail` of its stderr.
fn verdict(
    cmd: &str,
    chunk: &Chunk,
    status: ExitStatus,
    told: Option<Instant>,
    tail: &[u8],
) -> Result<(), ChunkError> {
    if status.success() {
        return Ok(());
    }
    // Ended past the instant its guard was to stop it: the guard did (or would have), the
    // lease having gone unrenewed. Not the chunk's failure: no attempt is spent on it.
    if told.is_some_and(|t| Instant::now() >= t) {
        tracing::warn!(
            pid = chunk.pid,
            from = chunk.from,
            %status,
            "lease not renewed in time; the chunk's guard stopped it"
        );
        return Err(ChunkError::Interrupted);
    }
    let tail = String::from_utf8_lossy(&tail[tail.len().saturating_sub(STDERR_TAIL)..]);
    let tail = tail.trim();
    let how = how_it_ended(cmd, status, tail)?;
    Err(ChunkError::Failed(if tail.is_empty() {
        format!(
            "chunk {} ({}..={}) failed: {how}",
            chunk.index, chunk.from, chunk.to
        )
    } else {
        format!(
            "chunk {} ({}..={}) failed: {how}: {tail}",
            chunk.index, chunk.from, chunk.to
        )
    }))
}

/// How a process that failed ended (`exit status N`, `killed by a signal`), or, with
/// 127 or 126 (as `sh` ends when it cannot find or execute `cmd`), that no retry can
/// help: [`ChunkError::Broken`], with the `tail` of its stderr.
pub(super) fn how_it_ended(
    cmd: &str,
    status: ExitStatus,
    tail: &str,
) -> Result<String, ChunkError> {
    match status.code() {
        Some(code @ (126 | 127)) => {
            let what = if code == 127 {
                "not found"
            } else {
                "not executable"
            };
            Err(ChunkError::Broken(if tail.is_empty() {
                format!("`{cmd}` cannot run: exit status {code} (command {what})")
            } else {
                format!("`{cmd}` cannot run: exit status {code} (command {what}): {tail}")
            }))
        }
        Some(code) => Ok(format!("exit status {code}")),
        None => Ok("killed by a signal".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::super::test_support::{chunk, fence};
    use super::super::{ChunkError, Job, KILL_AFTER};
    use super::STDERR_TAIL;

    #[tokio::test]
    async fn exec_sees_the_chunk_in_its_environment() {
        let job = Job::Exec(
            r#"test "$TRANCHE_PID/$TRANCHE_FROM/$TRANCHE_TO/$TRANCHE_ATTEMPT/$TRANCHE_CHUNK/$TRANCHE_FENCE" = 7/6201/6300/3/2/41"#
                .into(),
        );
        assert_eq!(
            job.run(chunk(), std::future::pending(), None).await,
            Ok(None)
        );
    }

    /// `TRACEPARENT` is the chunk's trace context when it has one, and absent (not
    /// empty) when not.
    #[tokio::test]
    async fn exec_gets_its_traceparent_when_traced() {
        let tp = crate::trace::TraceParent::new([0x4b; 16], [0x3c; 8], true).unwrap();
        let job = Job::Exec(format!(r#"test "$TRACEPARENT" = {tp}"#));
        let run = job.run(chunk(), std::future::pending(), None);
        assert_eq!(crate::trace::scoped(&chunk(), tp, run).await, Ok(None));
        let job = Job::Exec(r#"test -z "${TRACEPARENT+set}""#.into());
        assert_eq!(
            job.run(chunk(), std::future::pending(), None).await,
            Ok(None),
            "no TRACEPARENT without a trace (nor in this test's environment)"
        );
    }

    #[tokio::test]
    async fn a_failure_carries_the_tail_of_stderr() {
        let job = Job::Exec("echo first >&2; echo 'the real reason' >&2; exit 3".into());
        let Err(ChunkError::Failed(err)) = job.run(chunk(), std::future::pending(), None).await
        else {
            panic!("a failure")
        };
        assert!(
            err.starts_with("chunk 2 (6201..=6300) failed: exit status 3"),
            "{err}"
        );
        assert!(err.ends_with("first\nthe real reason"), "{err}");
    }

    #[tokio::test]
    async fn a_long_stderr_is_cut_to_its_tail() {
        let job =
            Job::Exec("head -c 100000 /dev/zero | tr '\\0' x >&2; echo END >&2; exit 1".into());
        let Err(ChunkError::Failed(err)) = job.run(chunk(), std::future::pending(), None).await
        else {
            panic!("a failure")
        };
        assert!(err.len() < STDERR_TAIL + 100, "{}", err.len());
        assert!(err.ends_with("END"));
    }

    /// The process groups of the processes alive now (field 5 of /proc/PID/stat; a
    /// zombie, state Z, is dead and only waits to be reaped).
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

    /// Waits until process group `pgid` has no live process, failing with `what` if
    /// it still has one `within` from now.
    async fn gone_within(pgid: u32, within: Duration, what: &str) {
        let deadline = std::time::Instant::now() + within;
        while groups().contains(&pgid) {
            assert!(std::time::Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn an_aborted_chunk_takes_its_whole_group_along() {
        let dir = std::env::temp_dir().join(format!("tranche-job-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pid_file = dir.join("sh.pid");
        // sh stays (the `true` after sleep), so sleep is a grandchild of this process.
        let job = Job::Exec(format!("echo $$ > {}; sleep 30; true", pid_file.display()));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let run = tokio::spawn(async move {
            job.run(
                chunk(),
                async {
                    let _ = rx.await;
                    KILL_AFTER
                },
                None,
            )
            .await
        });
        let pgid: u32 = loop {
            if let Some(pid) = std::fs::read_to_string(&pid_file)
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                break pid;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert!(
            groups().contains(&pgid),
            "the chunk runs in a group of its own"
        );
        assert_ne!(pgid, std::process::id());
        let started = std::time::Instant::now();
        tx.send(()).unwrap();
        assert_eq!(run.await.unwrap(), Err(ChunkError::Interrupted));
        assert!(
            started.elapsed() < KILL_AFTER * 2,
            "{:?}",
            started.elapsed()
        );
        // SIGKILL is delivered when the killed process is next scheduled: on a loaded
        // machine that can take a moment after `run` returns. Gone within 1 s.
        gone_within(
            pgid,
            Duration::from_secs(1),
            "sleep, a grandchild, is gone with its group",
        )
        .await;
    }

    #[tokio::test]
    async fn the_guard_keeps_the_commands_own_exit() {
        let hour = Duration::from_secs(3600);
        let (_renewals, far) = fence(hour, hour / 6, hour / 12, hour / 6);
        // With no fence, and with one far off (the guard's timer armed).
        for fence in [None, Some(far)] {
            let run = |cmd: &str| {
                let (job, fence) = (Job::Exec(cmd.into()), fence.clone());
                async move { job.run(chunk(), std::future::pending(), fence).await }
            };
            assert!(matches!(
                run("no-such-command-here").await,
                Err(ChunkError::Broken(e)) if e.contains("exit status 127 (command not found)")
            ));
            assert!(matches!(run("exit 126").await, Err(ChunkError::Broken(_))));
            assert!(matches!(
                run("kill -KILL $$").await,
                Err(ChunkError::Failed(e)) if e.ends_with("killed by a signal")
            ));
            assert!(
                matches!(
                    run("read line; exit 4").await,
                    Err(ChunkError::Failed(e)) if e.ends_with("exit status 4"),
                ),
                "stdin is /dev/null, never the lifeline"
            );
        }
    }

    /// A plain command is `exec`ed by its guard: the chunk's process is the command
    /// itself (its parent is this process, not a `sh -c`), with the chunk in its
    /// environment, and it ends as the command does, 126 for a file it cannot execute
    /// and 127 for none, with a fence and without.
    #[tokio::test]
    async fn a_plain_command_is_the_chunk_itself() {
        let dir = std::env::temp_dir().join(format!("tranche-job-plain-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (script, parent) = (dir.join("parent.sh"), dir.join("parent"));
        std::fs::write(
            &script,
            format!(
                "echo $PPID $TRANCHE_PID/$TRANCHE_FROM/$TRANCHE_TO/$TRANCHE_ATTEMPT/$TRANCHE_CHUNK > {}\nexit \"$1\"\n",
                parent.display()
            ),
        )
        .unwrap();
        let cmd = |args: &str| format!("sh {} {args}", script.display());
        assert!(
            super::plain_words(&cmd("0")).is_some(),
            "a temporary directory with shell syntax in its path: {}",
            dir.display()
        );
        let hour = Duration::from_secs(3600);
        let (_renewals, far) = fence(hour, hour / 6, hour / 12, hour / 6);
        for fence in [None, Some(far)] {
            let run = |cmd: String| {
                let (job, fence) = (Job::Exec(cmd), fence.clone());
                async move { job.run(chunk(), std::future::pending(), fence).await }
            };
            let _ = std::fs::remove_file(&parent);
            assert_eq!(run(cmd("0")).await, Ok(None));
            let said = std::fs::read_to_string(&parent).unwrap();
            assert_eq!(
                said,
                format!("{} 7/6201/6300/3/2\n", std::process::id()),
                "the command's parent is the worker, and it sees the chunk"
            );
            assert!(matches!(
                run(cmd("5")).await,
                Err(ChunkError::Failed(e)) if e.ends_with("exit status 5")
            ));
            // No execute bit (root included), and no file.
            assert!(matches!(
                run(script.display().to_string()).await,
                Err(ChunkError::Broken(e)) if e.contains("exit status 126")
            ));
            assert!(matches!(
                run(dir.join("none").display().to_string()).await,
                Err(ChunkError::Broken(e)) if e.contains("exit status 127")
            ));
        }
    }

    /// The worker is as good as frozen: nothing in it stops the chunk, and no renewal
    /// comes. The guard stops the chunk (SIGTERM, which the command traps) at the
    /// fence's stop instant, then its whole group, and the chunk is interrupted, not
    /// failed. Its `sleep` would run 30 s: the deadline only bounds a broken guard.
    #[tokio::test]
    async fn the_guard_stops_a_chunk_whose_lease_goes_unrenewed() {
        let dir = std::env::temp_dir().join(format!("tranche-job-fence-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (pid_file, termed) = (dir.join("sh.pid"), dir.join("termed"));
        let _ = std::fs::remove_file(&termed);
        let job = Job::Exec(format!(
            "echo $$ > {}; trap 'echo TERM > {}; exit 143' TERM; sleep 30 & wait $!",
            pid_file.display(),
            termed.display()
        ));
        let ms = Duration::from_millis;
        let (_renewals, fence) = fence(ms(1500), ms(1000), ms(500), ms(100));
        let r = tokio::time::timeout(
            Duration::from_secs(20),
            job.run(chunk(), std::future::pending(), Some(fence)),
        )
        .await
        .expect("the guard stopped the chunk");
        assert_eq!(r, Err(ChunkError::Interrupted));
        assert_eq!(std::fs::read_to_string(&termed).unwrap(), "TERM\n");
        let pgid: u32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // `sleep 30` and the guard's own processes go with the group.
        gone_within(pgid, Duration::from_secs(5), "the group outlived its fence").await;
    }

    /// A lone command (`sh -c` keeps itself as its parent) that traps SIGTERM runs its
    /// trap, 200 ms of cleaning up, when the guard stops it: `sh` dies of the SIGTERM at
    /// once, and the lifeline stays until the command is gone, so the guard does not
    /// SIGKILL it before the stop-to-kill gap (300 ms here) is over.
    #[tokio::test]
    async fn a_lone_command_runs_its_trap_when_stopped() {
        let dir = std::env::temp_dir().join(format!("tranche-job-lone-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let termed = dir.join("termed");
        for round in 0..5 {
            let _ = std::fs::remove_file(&termed);
            let job = Job::Exec(format!(
                "bash -c 'trap \"sleep 0.2; echo TERM > {}; exit 143\" TERM; sleep 30 & wait $!'",
                termed.display()
            ));
            let ms = Duration::from_millis;
            let (_renewals, fence) = fence(ms(1000), ms(600), ms(300), ms(100));
            let r = tokio::time::timeout(
                Duration::from_secs(20),
                job.run(chunk(), std::future::pending(), Some(fence)),
            )
            .await
            .expect("the guard stopped the chunk");
            assert_eq!(r, Err(ChunkError::Interrupted));
            assert_eq!(
                std::fs::read_to_string(&termed).ok().as_deref(),
                Some("TERM\n"),
                "round {round}: the command was killed before its trap ran"
            );
        }
    }

    /// A command that ignores SIGTERM is killed a grace period later, by the guard
    /// alone.
    #[tokio::test]
    async fn the_guard_kills_a_chunk_that_ignores_its_sigterm() {
        let job = Job::Exec("trap '' TERM; sleep 30".into());
        let ms = Duration::from_millis;
        let (_renewals, fence) = fence(ms(1000), ms(600), ms(300), ms(100));
        let r = tokio::time::timeout(
            Duration::from_secs(20),
            job.run(chunk(), std::future::pending(), Some(fence)),
        )
        .await
        .expect("the guard killed the chunk");
        assert_eq!(r, Err(ChunkError::Interrupted));
    }

    /// Renewals keep a chunk going well past the fence it started with: each one
    /// reaches its guard and re-arms its timer.
    #[tokio::test]
    async fn renewals_keep_a_long_chunk_alive() {
        // Left alone, stopped 2.5 s in; each renewal puts that 2.5 s ahead again, which
        // leaves a loaded machine seconds, not milliseconds, to fork the guard's timer.
        let job = Job::Exec("sleep 5".into());
        let ms = Duration::from_millis;
        let (renewals, fence) = fence(ms(4000), ms(1500), ms(750), ms(100));
        let renew = async {
            loop {
                tokio::time::sleep(ms(100)).await;
                renewals.send_replace(Instant::now() + ms(4000));
            }
        };
        let r = tokio::select! {
            r = job.run(chunk(), std::future::pending(), Some(fence)) => r,
            never = renew => never,
        };
        assert_eq!(r, Ok(None));
    }

    #[tokio::test]
    async fn a_dropped_chunk_takes_its_whole_group_along() {
        let dir = std::env::temp_dir().join(format!("tranche-job-drop-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pid_file = dir.join("sh.pid");
        let job = Job::Exec(format!("echo $$ > {}; sleep 30; true", pid_file.display()));
        let run = tokio::spawn(async move { job.run(chunk(), std::future::pending(), None).await });
        let pgid: u32 = loop {
            if let Some(pid) = std::fs::read_to_string(&pid_file)
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                break pid;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        // As when the worker dies: the lifeline's write end closes, nothing signals.
        run.abort();
        gone_within(pgid, Duration::from_secs(5), "the group outlived its chunk").await;
    }
}
