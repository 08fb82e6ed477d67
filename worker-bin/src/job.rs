//! What a chunk of a partition runs: the team's command (`--exec`) or the labelled load
//! generator (`--simulate`).
//!
//! Each `--exec` chunk runs in a process group of its own: a Ctrl-C in the terminal
//! reaches tranche alone (which drains), never the chunks, and when the grace period is
//! over the whole group is stopped (SIGTERM, then SIGKILL), grandchildren included, so
//! no chunk outlives the lease it ran under.
//!
//! Nor does a chunk outlive its worker, however the worker dies (SIGKILL, the OOM
//! killer): the chunk's stdin is a pipe whose write end only the worker holds, and a
//! small shell guard ([`GUARD`]) watches it from inside the chunk's group. The kernel
//! closes that end when the worker dies, the watcher reads end-of-file and kills the
//! whole group. No `pre_exec` (the crate forbids unsafe code), and grandchildren are
//! covered, which `PR_SET_PDEATHSIG` would not do.
//!
//! The child's environment is tranche's minus the variables tranche reads secrets
//! from ([`SECRETS`]), plus the chunk's variables.

use std::future::Future;
use std::process::Stdio;
use std::time::Duration;

use rand::Rng;
use tokio::io::AsyncReadExt;
use tokio::process::Command;

/// The most of a failed command's stderr kept in its failure message.
const STDERR_TAIL: usize = 1024;

/// Variables tranche reads a secret from, never passed to a chunk: the Redis URL may
/// carry a password, the admin token is one, and the others name the files that hold
/// one or a private key.
const SECRETS: &[&str] = &[
    "TRANCHE_REDIS_URL",
    "TRANCHE_REDIS_FILE",
    "TRANCHE_TLS_CERT",
    "TRANCHE_TLS_KEY",
    "TRANCHE_ADMIN_TOKEN",
    "TRANCHE_ADMIN_TOKEN_FILE",
];

/// The shell every chunk starts in (`sh -c GUARD tranche-chunk CMD`), its stdin the
/// worker's lifeline pipe. It moves the pipe to fd 3 (stdin becomes /dev/null), starts
/// the watcher, a background subshell of the same process group that blocks reading
/// fd 3 and, at end-of-file, kills the group (`kill -KILL 0`), then `exec`s the command
/// itself, so the chunk's pid, group, exit status and terminating signal stay the
/// command's own (126 and 127 included). The watcher starts before the command: a
/// worker that dies at any moment after the spawn leaves a pipe at end-of-file, which
/// the watcher finds whenever it reads. When the chunk ends, the worker closes its end
/// too, and the watcher takes what the command left running in its group along: the
/// chunk is over, so is everything it started.
const GUARD: &str = r#"exec 3<&0 </dev/null; { read -r _ <&3; kill -KILL 0; } >/dev/null 2>&1 & exec sh -c "$1" sh 3<&-"#;

/// How long a chunk's process group has between SIGTERM and SIGKILL once aborted at
/// the end of a drain.
pub(crate) const KILL_AFTER: Duration = Duration::from_secs(2);

/// Why a chunk did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ChunkError {
    /// It failed: a one-line reason, with the tail of the command's stderr when there
    /// is one. The partition's attempt is spent.
    Failed(String),
    /// Our own shutdown stopped it (the grace period was over): not the chunk's fault,
    /// so the partition is released and the attempt given back.
    Interrupted,
    /// The command itself cannot run: the shell said it is not found (exit 127) or not
    /// executable (126). No retry can help, so the run stops at once instead of
    /// spending every partition's attempts; the partition is released, its attempt
    /// given back.
    Broken(String),
    /// A handler's error that names its own policy (permanent, or retry after a
    /// delay): the partition's attempt is spent under that policy.
    Refused(String, tranche_active_store::FailPolicy),
}

/// One chunk: the IDs `from..=to` of partition `pid`, on attempt `attempt`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    /// The partition.
    pub pid: u64,
    /// The chunk's number within the partition, from 0.
    pub index: u64,
    /// First row ID of the chunk.
    pub from: u64,
    /// Last row ID of the chunk (inclusive).
    pub to: u64,
    /// The partition's attempt, from 1.
    pub attempt: u32,
}

/// How chunks are processed.
#[derive(Debug, Clone)]
pub(crate) enum Job {
    /// `sh -c CMD` per chunk; exit 0 is success.
    Exec(String),
    /// Sleep uniformly in `latency` ms, fail with probability `fail`.
    Simulate { latency: (u64, u64), fail: f64 },
    /// A library user's handler ([`crate::runner::Handler`]).
    Handler(crate::handler::HandlerRef),
}

impl Job {
    /// Runs one chunk until it ends or `abort` resolves (then it is stopped and
    /// [`ChunkError::Interrupted`]). `abort` gives how long a command's process group
    /// has between SIGTERM and SIGKILL; a handler's future is dropped at once.
    pub(crate) async fn run(
        &self,
        chunk: Chunk,
        abort: impl Future<Output = Duration>,
    ) -> Result<(), ChunkError> {
        match self {
            // Boxed: a child process's state would make every chunk's future that big.
            Job::Exec(cmd) => Box::pin(exec(cmd, chunk, abort)).await,
            Job::Handler(handler) => {
                use futures_util::FutureExt;
                let handler = handler.0.clone();
                // A panic is caught here, at the chunk: it fails the attempt like an
                // error (retried up to max_attempts) instead of unwinding through the
                // partition's task, which would leave its lease held and renewed for
                // ever. AssertUnwindSafe: after a panic the future is dropped, and
                // nothing of it is used again.
                let process = std::panic::AssertUnwindSafe(handler.process(chunk)).catch_unwind();
                tokio::select! {
                    r = process => match r {
                        Ok(r) => r.map_err(|err| {
                            let reason = format!(
                                "chunk {} ({}..={}) failed: {err}",
                                chunk.index, chunk.from, chunk.to
                            );
                            if err.policy() == Default::default() {
                                ChunkError::Failed(reason)
                            } else {
                                ChunkError::Refused(reason, err.policy())
                            }
                        }),
                        Err(payload) => Err(ChunkError::Failed(format!(
                            "chunk {} ({}..={}) failed: handler panicked: {}",
                            chunk.index, chunk.from, chunk.to, panic_message(payload.as_ref())
                        ))),
                    },
                    // The handler's future is dropped: see `runner`.
                    _ = abort => Err(ChunkError::Interrupted),
                }
            }
            Job::Simulate { latency, fail } => {
                let (ms, failed) = {
                    let mut rng = rand::rng();
                    (
                        rng.random_range(latency.0..=latency.1),
                        rng.random_bool(*fail),
                    )
                };
                // A zero latency is no sleep: a timer would round it up to the
                // timer wheel's millisecond.
                if ms > 0 {
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_millis(ms)) => {}
                        _ = abort => return Err(ChunkError::Interrupted),
                    }
                }
                if failed {
                    Err(ChunkError::Failed(format!(
                        "simulated failure of chunk {} ({}..={})",
                        chunk.index, chunk.from, chunk.to
                    )))
                } else {
                    Ok(())
                }
            }
        }
    }
}

/// A panic's message: its payload when that is a string (as `panic!` makes it).
fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a non-string payload")
}

/// Sends `signal` to process group `pgid`; a group already gone is fine.
fn signal_group(pgid: u32, signal: nix::sys::signal::Signal) {
    let pgid = nix::unistd::Pid::from_raw(pgid as i32);
    if let Err(err) = nix::sys::signal::killpg(pgid, signal)
        && err != nix::errno::Errno::ESRCH
    {
        tracing::warn!(%err, ?signal, %pgid, "could not signal a chunk's process group");
    }
}

async fn exec(
    cmd: &str,
    chunk: Chunk,
    abort: impl Future<Output = Duration>,
) -> Result<(), ChunkError> {
    let mut command = Command::new("sh");
    command.arg("-c").arg(GUARD).arg("tranche-chunk").arg(cmd);
    for key in SECRETS {
        command.env_remove(key);
    }
    let mut child = command
        .env("TRANCHE_PID", chunk.pid.to_string())
        .env("TRANCHE_FROM", chunk.from.to_string())
        .env("TRANCHE_TO", chunk.to.to_string())
        .env("TRANCHE_ATTEMPT", chunk.attempt.to_string())
        .env("TRANCHE_CHUNK", chunk.index.to_string())
        // The lifeline: its write end, created close-on-exec, stays in this process.
        .stdin(Stdio::piped())
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped())
        // A group of its own: the terminal's Ctrl-C is for tranche, not the chunk.
        .process_group(0)
        // Should this future be dropped, at least `sh` goes.
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| ChunkError::Failed(format!("cannot start `sh -c {cmd}`: {e}")))?;
    let pgid = child.id().expect("a child just spawned has a pid");
    // Never written; held until the command has ended (or this future is dropped,
    // after an abort): closing it, or this process dying, is what tells the guard to
    // kill the group.
    let lifeline = child.stdin.take().expect("stdin is piped");
    let mut stderr = child.stderr.take().expect("stderr is piped");
    // Keep only the tail: a chatty command must not grow this process's memory.
    let read_tail = async {
        let mut tail: Vec<u8> = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match stderr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    tail.extend_from_slice(&buf[..n]);
                    if tail.len() > 2 * STDERR_TAIL {
                        tail.drain(..tail.len() - STDERR_TAIL);
                    }
                }
            }
        }
        tail
    };
    let wait = async {
        let status = child.wait().await;
        drop(lifeline);
        status
    };
    let finished = async { tokio::join!(wait, read_tail) };
    tokio::pin!(finished);
    let (status, tail) = tokio::select! {
        done = &mut finished => done,
        grace = abort => {
            // The whole group, grandchildren too: SIGTERM, SIGKILL if it lingers. A
            // process that left the group could still hold stderr open, so the wait
            // for the pipe is bounded as well.
            signal_group(pgid, nix::sys::signal::Signal::SIGTERM);
            if tokio::time::timeout(grace, &mut finished).await.is_err() {
                signal_group(pgid, nix::sys::signal::Signal::SIGKILL);
                let _ = tokio::time::timeout(KILL_AFTER, &mut finished).await;
            }
            return Err(ChunkError::Interrupted);
        }
    };
    let status = status.map_err(|e| ChunkError::Failed(format!("waiting for `{cmd}`: {e}")))?;
    if status.success() {
        return Ok(());
    }
    let tail = String::from_utf8_lossy(&tail[tail.len().saturating_sub(STDERR_TAIL)..]);
    let tail = tail.trim();
    let how = match status.code() {
        Some(code @ (126 | 127)) => {
            let what = if code == 127 {
                "not found"
            } else {
                "not executable"
            };
            return Err(ChunkError::Broken(if tail.is_empty() {
                format!("`{cmd}` cannot run: exit status {code} (command {what})")
            } else {
                format!("`{cmd}` cannot run: exit status {code} (command {what}): {tail}")
            }));
        }
        Some(code) => format!("exit status {code}"),
        None => "killed by a signal".to_owned(),
    };
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

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk() -> Chunk {
        Chunk {
            pid: 7,
            index: 2,
            from: 6201,
            to: 6300,
            attempt: 3,
        }
    }

    #[tokio::test]
    async fn exec_sees_the_chunk_in_its_environment() {
        let job = Job::Exec(
            r#"test "$TRANCHE_PID/$TRANCHE_FROM/$TRANCHE_TO/$TRANCHE_ATTEMPT/$TRANCHE_CHUNK" = 7/6201/6300/3/2"#
                .into(),
        );
        assert_eq!(job.run(chunk(), std::future::pending()).await, Ok(()));
    }

    #[tokio::test]
    async fn a_failure_carries_the_tail_of_stderr() {
        let job = Job::Exec("echo first >&2; echo 'the real reason' >&2; exit 3".into());
        let Err(ChunkError::Failed(err)) = job.run(chunk(), std::future::pending()).await else {
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
        let Err(ChunkError::Failed(err)) = job.run(chunk(), std::future::pending()).await else {
            panic!("a failure")
        };
        assert!(err.len() < STDERR_TAIL + 100, "{}", err.len());
        assert!(err.ends_with("END"));
    }

    #[tokio::test]
    async fn simulate_fails_at_its_rate() {
        let always = Job::Simulate {
            latency: (0, 0),
            fail: 1.0,
        };
        let never = Job::Simulate {
            latency: (0, 1),
            fail: 0.0,
        };
        assert!(matches!(
            always.run(chunk(), std::future::pending()).await,
            Err(ChunkError::Failed(reason)) if reason.contains("simulated failure")
        ));
        assert_eq!(never.run(chunk(), std::future::pending()).await, Ok(()));
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

    #[tokio::test]
    async fn an_aborted_chunk_takes_its_whole_group_along() {
        let dir = std::env::temp_dir().join(format!("tranche-job-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pid_file = dir.join("sh.pid");
        // sh stays (the `true` after sleep), so sleep is a grandchild of this process.
        let job = Job::Exec(format!("echo $$ > {}; sleep 30; true", pid_file.display()));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let run = tokio::spawn(async move {
            job.run(chunk(), async {
                let _ = rx.await;
                KILL_AFTER
            })
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
        assert!(
            !groups().contains(&pgid),
            "sleep, a grandchild, is gone with its group"
        );
    }

    #[tokio::test]
    async fn the_guard_keeps_the_commands_own_exit() {
        async fn run(cmd: &str) -> Result<(), ChunkError> {
            Job::Exec(cmd.into())
                .run(chunk(), std::future::pending())
                .await
        }
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

    #[tokio::test]
    async fn a_dropped_chunk_takes_its_whole_group_along() {
        let dir = std::env::temp_dir().join(format!("tranche-job-drop-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pid_file = dir.join("sh.pid");
        let job = Job::Exec(format!("echo $$ > {}; sleep 30; true", pid_file.display()));
        let run = tokio::spawn(async move { job.run(chunk(), std::future::pending()).await });
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
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while groups().contains(&pgid) {
            assert!(
                std::time::Instant::now() < deadline,
                "the group outlived its chunk"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
