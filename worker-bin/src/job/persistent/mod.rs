//! A warm command (`--exec-persistent`): one long-lived process per chunk in flight,
//! started when a chunk first needs one, fed one chunk per line on its stdin and
//! answering one line per chunk on its stdout. It pays a process start, a runtime's
//! start-up and a database connection once, not once per chunk.
//!
//! The request is a JSON object on one line:
//! `{"pid":7,"chunk":2,"from":6201,"to":6300,"attempt":3,"fence":41}` (the fields of
//! `--exec`'s `TRANCHE_*` variables, `fence` being the lease's fencing token), with
//! `"traceparent":"00-…"` after `fence` when the run exports traces (the chunk span's
//! W3C trace context, `TRACEPARENT` for `--exec`). The
//! answer is `ok`, `error: REASON` (the attempt fails and is retried as a failed
//! `--exec` chunk is) or `permanent: REASON` (the partition fails at once, no retry).
//! The process keeps running after either. Anything else (garbage, end-of-file, a line
//! over [`MAX_ANSWER`] bytes, no answer within the chunk timeout) fails the chunk's
//! attempt and ends the process (SIGTERM to its group, the grace, SIGKILL, then
//! [`reap::sweep`]); the next chunk starts a new one. Its stderr is logged line by line,
//! and its tail is in the failure message when the process dies.
//!
//! The guarantees of `--exec` hold, through the same parts: the process runs in a
//! group of its own with the scrubbed environment and a tag ([`spawn::prepare`]); the
//! guard's watcher (`guard.rs`, [`WARM_GUARD`]) leads that group and kills it when the
//! worker dies, and while a chunk runs it holds the chunk's fence, moved by its renewals
//! ([`tell`]): a frozen worker's warm process is stopped before its lease could pass to
//! another worker. Its guard stays armed between chunks, since a line to it costs two
//! forks, more than a quick chunk's own work. Before a chunk is sent (`Warm::arm`) the
//! instant the guard holds is kept if the chunk's fence [keeps](Fence::keeps) it (no
//! later than the chunk's stop instant, less than a step earlier, not about to come),
//! moved otherwise, and a chunk without a fence disarms it: the guard's instant is never
//! later than the running chunk's stop instant. An idle process whose instant came is
//! stopped by its guard, and the next chunk starts another; a chunk sent as its guard
//! fires fails that attempt (it is retried) and runs nothing past its lease. What the
//! process leaves behind out of its group is swept when it ends, and an idle process is
//! stopped with the run (dropped: [`Warm`]'s `Drop`).

use std::fmt;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::time::Instant;

use super::exec::how_it_ended;
use super::guard::{WARM_GUARD, plain_words, secs, tell, usable_fence};
use super::spawn::{self, signal_group};
use super::{Chunk, ChunkError, Fence, KILL_AFTER, reap};

/// The longest answer line read; a longer one is garbage.
pub(crate) const MAX_ANSWER: u64 = 64 * 1024;

/// The most of a dead process's stderr kept in the failure message.
const STDERR_TAIL: usize = 1024;

/// The longest stderr line logged as it is; longer ones are logged in pieces.
const STDERR_LINE: usize = 4096;

/// `--exec-persistent CMD`: the command and its idle warm processes.
pub(crate) struct Persistent {
    /// The command, as `--exec` takes it (a plain one without `sh -c`).
    cmd: String,
    /// How long a chunk may wait for its answer before its process is stopped.
    timeout: Option<Duration>,
    /// Warm processes between chunks. A chunk takes one (or starts one) and gives it
    /// back after a well-formed answer, so there are never more than chunks in flight.
    idle: Mutex<Vec<Warm>>,
}

impl fmt::Debug for Persistent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Persistent")
            .field("cmd", &self.cmd)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// What a warm process answered for a chunk.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    Ok,
    Error(String),
    Permanent(String),
}

/// Reads an answer line (with its newline). `None`: not an answer.
fn parse_answer(line: &[u8]) -> Option<Answer> {
    let line = std::str::from_utf8(line.strip_suffix(b"\n")?).ok()?;
    let line = line.strip_suffix('\r').unwrap_or(line);
    let reason = |rest: &str| match rest {
        "" => Some(String::new()),
        _ => Some(rest.strip_prefix(':')?.trim().to_owned()),
    };
    if line == "ok" {
        Some(Answer::Ok)
    } else if let Some(rest) = line.strip_prefix("error") {
        reason(rest).map(Answer::Error)
    } else if let Some(rest) = line.strip_prefix("permanent") {
        reason(rest).map(Answer::Permanent)
    } else {
        None
    }
}

/// The request line for `chunk`, with its trace context when it has one.
fn request(chunk: &Chunk) -> String {
    let traced = chunk
        .traceparent()
        .map(|tp| format!(",\"traceparent\":\"{tp}\""))
        .unwrap_or_default();
    format!(
        "{{\"pid\":{},\"chunk\":{},\"from\":{},\"to\":{},\"attempt\":{},\"fence\":{}{traced}}}\n",
        chunk.pid, chunk.index, chunk.from, chunk.to, chunk.attempt, chunk.fence
    )
}

/// How a chunk sent to a warm process ended, before it is judged.
enum Outcome {
    /// A well-formed answer.
    Answered(Answer),
    /// End-of-file or an error on its stdout, or its stdin closed: it died.
    Died,
    /// A line that is no answer, shown cut to a length a log line can hold.
    Garbage(String),
    /// No answer within the chunk timeout.
    TimedOut(Duration),
    /// Our drain's grace was over: stop it with this grace.
    Aborted(Duration),
}

impl Persistent {
    /// A warm command; `timeout` bounds the wait for each chunk's answer.
    pub(crate) fn new(cmd: impl Into<String>, timeout: Option<Duration>) -> Self {
        Self {
            cmd: cmd.into(),
            timeout,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Runs one chunk on a warm process (see the module's docs).
    pub(crate) async fn run(
        &self,
        chunk: Chunk,
        abort: impl std::future::Future<Output = Duration>,
        fence: Option<Fence>,
    ) -> Result<(), ChunkError> {
        let fence = usable_fence(fence).await?;
        let grace = fence.as_ref().map_or(KILL_AFTER, Fence::grace);
        let mut warm = loop {
            let idle = self.idle.lock().expect("not poisoned").pop();
            let Some(mut warm) = idle else {
                break Warm::start(&self.cmd, grace)?;
            };
            let fenced = warm.fenced();
            if !fenced && !warm.ended() {
                break warm;
            }
            // Ended while idle, or being stopped by its guard (its last chunk's stop
            // instant came): not this chunk's failure. Swept, and said.
            let (status, tail) = warm.stop(grace).await;
            if fenced {
                tracing::debug!("the guard stopped an idle warm process; starting another");
            } else {
                let how = status.map_or("exit status unknown".to_owned(), |s| s.to_string());
                tracing::warn!(%how, %tail, "`{}` ended between chunks; starting another", self.cmd);
            }
        };
        let outcome = warm.send(&chunk, abort, fence, self.timeout).await;
        let guarded_past = warm.fenced();
        let fail = |why: String| {
            ChunkError::Failed(format!(
                "chunk {} ({}..={}) failed: {why}",
                chunk.index, chunk.from, chunk.to
            ))
        };
        match outcome {
            // Past its stop instant the guard is stopping the group, answer or not: the
            // process is not kept. Else it is, its guard still armed.
            Outcome::Answered(answer) if !guarded_past => {
                self.idle.lock().expect("not poisoned").push(warm);
                match answer {
                    Answer::Ok => Ok(()),
                    Answer::Error(why) => Err(fail(or_unsaid(why))),
                    Answer::Permanent(why) => Err(ChunkError::Refused(
                        format!(
                            "chunk {} ({}..={}) failed: {}",
                            chunk.index,
                            chunk.from,
                            chunk.to,
                            or_unsaid(why)
                        ),
                        tranche_active_store::FailPolicy {
                            permanent: true,
                            retry_after: None,
                        },
                    )),
                }
            }
            Outcome::Answered(answer) => {
                warm.stop(grace).await;
                if answer == Answer::Ok {
                    Ok(())
                } else {
                    Err(ChunkError::Interrupted)
                }
            }
            Outcome::Aborted(grace) => {
                warm.stop(grace).await;
                Err(ChunkError::Interrupted)
            }
            Outcome::TimedOut(after) => {
                warm.stop(grace).await;
                Err(fail(format!(
                    "`{}` did not answer within {after:?} (the chunk timeout); stopped",
                    self.cmd
                )))
            }
            Outcome::Garbage(line) => {
                warm.stop(grace).await;
                Err(fail(format!(
                    "`{}` answered {line:?}, not `ok`, `error: …` or `permanent: …`; \
                     restarted",
                    self.cmd
                )))
            }
            Outcome::Died => {
                let answered = warm.answered;
                let (status, tail) = warm.stop(grace).await;
                if let Some(status) = status {
                    super::exec::record_end(status, tail.len());
                }
                if guarded_past {
                    tracing::warn!(
                        pid = chunk.pid,
                        from = chunk.from,
                        "lease not renewed in time; the chunk's guard stopped its warm process"
                    );
                    return Err(ChunkError::Interrupted);
                }
                let how = match status {
                    // Dead before its first answer with 127 or 126: it cannot run.
                    Some(status) if answered == 0 => how_it_ended(&self.cmd, status, &tail)?,
                    Some(status) => how_it_ended(&self.cmd, status, &tail)
                        .unwrap_or_else(|_| format!("exit status {}", status.code().unwrap_or(0))),
                    None => "exit status unknown".to_owned(),
                };
                Err(fail(with_tail(
                    format!("`{}` ended before answering ({how})", self.cmd),
                    &tail,
                )))
            }
        }
    }
}

impl Drop for Persistent {
    /// The idle processes at the run's end, stopped together: each sees its stdin end
    /// first, then each [`Warm`]'s `Drop` waits for its own, which by then has mostly
    /// ended too; one after another, eight warm Python processes took 0.7 s.
    fn drop(&mut self) {
        let mut idle = std::mem::take(&mut *self.idle.lock().unwrap_or_else(|e| e.into_inner()));
        for warm in &mut idle {
            drop(warm.input.take());
        }
        drop(idle);
    }
}

/// A ready-made [`Handler`](crate::Handler) for library users: each chunk on a warm
/// process, as `tranche run --exec-persistent CMD` runs it (the protocol, the
/// guarantees and the examples: `docs/persistent.md`).
///
/// Given to [`Runner::run`](crate::Runner::run) (or its siblings) it runs exactly as
/// the command line's: guarded, held to each chunk's lease even while the worker is
/// frozen, and a command that cannot run (exit 127 or 126 before its first answer)
/// stops the run. Called through [`Handler::process`](crate::Handler::process) by your
/// own code, it has no lease to hold: `permanent:` and a command that cannot run are
/// [`HandlerError::permanent`](crate::HandlerError::permanent), any other failure an
/// ordinary error.
///
/// ```no_run
/// # async fn demo(runner: tranche_worker::Runner) -> Result<(), tranche_worker::Error> {
/// use std::time::Duration;
/// use tranche_worker::PersistentCommand;
///
/// let warm = PersistentCommand::new("python3 examples/persistent-psycopg.py")
///     .chunk_timeout(Duration::from_secs(30));
/// let report = runner.run(warm).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PersistentCommand(pub(crate) Arc<Persistent>);

impl PersistentCommand {
    /// Runs `cmd`: a program and its arguments, started as they are, or anything else
    /// through `sh -c`.
    pub fn new(cmd: impl Into<String>) -> Self {
        Self(Arc::new(Persistent::new(cmd, None)))
    }

    /// Stops a process that has not answered a chunk within `timeout` (SIGTERM, the
    /// grace, SIGKILL); the attempt fails.
    pub fn chunk_timeout(self, timeout: Duration) -> Self {
        Self(Arc::new(Persistent::new(self.0.cmd.clone(), Some(timeout))))
    }
}

#[async_trait::async_trait]
impl crate::handler::Handler for PersistentCommand {
    async fn process(&self, chunk: Chunk) -> Result<(), crate::handler::HandlerError> {
        match self.0.run(chunk, std::future::pending(), None).await {
            Ok(()) => Ok(()),
            Err(ChunkError::Refused(why, _) | ChunkError::Broken(why)) => {
                Err(crate::handler::HandlerError::permanent(why))
            }
            Err(ChunkError::Failed(why)) => Err(why.into()),
            Err(ChunkError::Interrupted) => Err("the warm process was interrupted".into()),
        }
    }
}

/// A reason, or a word saying there was none.
fn or_unsaid(why: String) -> String {
    if why.is_empty() {
        "(no reason given)".to_owned()
    } else {
        why
    }
}

/// `msg`, then the stderr tail after a colon when there is one.
fn with_tail(msg: String, tail: &str) -> String {
    if tail.is_empty() {
        msg
    } else {
        format!("{msg}: {tail}")
    }
}

/// One warm process and its guard's watcher, in one process group.
struct Warm {
    /// The guard's watcher ([`WARM_GUARD`]), the group's leader: it kills the group
    /// when `lifeline` closes and stops it when a chunk's fence comes due.
    watcher: Child,
    /// The command itself.
    child: Child,
    /// Its pid, known to `reap.rs` as waited for here until it is.
    pid: u32,
    /// The group of both.
    pgid: u32,
    /// The tag of the process and its descendants ([`reap::TAG`]).
    tag: String,
    /// The watcher's stdin, held only here: the fence's lines go down it, and its
    /// end-of-file (this process dying included) kills the group.
    lifeline: ChildStdin,
    /// The command's stdin: one request line per chunk; closed first when an idle
    /// process is stopped (`Drop`).
    input: Option<ChildStdin>,
    /// Whether a chunk was sent and not yet answered: a process dropped then is killed
    /// at once, with no time to end by itself.
    busy: bool,
    /// The command's stdout: one answer line per chunk.
    output: BufReader<ChildStdout>,
    /// The logger of its stderr, which keeps the tail too.
    stderr: tokio::task::JoinHandle<()>,
    /// Its stderr's last [`STDERR_TAIL`] bytes.
    tail: Arc<Mutex<Vec<u8>>>,
    /// The stop instant the guard is armed for (`None`: unarmed), the last chunk's
    /// between chunks.
    told: Option<Instant>,
    /// Chunks it answered: one that dies with 126 or 127 before its first cannot run.
    answered: u64,
    /// Set once [`Warm::stop`] ran: nothing left for `Drop` to do.
    stopped: bool,
}

impl Warm {
    /// Starts the watcher, then the command in the watcher's group; `grace` is the
    /// watcher's time between SIGTERM and SIGKILL at a chunk's fence.
    fn start(cmd: &str, grace: Duration) -> Result<Self, ChunkError> {
        reap::become_subreaper();
        let tag = reap::new_tag();
        let mut guard = Command::new("sh");
        guard
            .arg("-c")
            .arg(WARM_GUARD)
            .args(["tranche-warm", "", ""])
            .arg(secs(grace));
        spawn::prepare(&mut guard, &tag, 0);
        let mut watcher = guard
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| ChunkError::Failed(format!("cannot start a guard: {e}")))?;
        let pgid = watcher.id().expect("a child just spawned has a pid");
        let lifeline = watcher.stdin.take().expect("stdin is piped");
        let mut command = match plain_words(cmd) {
            Some(words) => {
                let mut c = Command::new(words[0]);
                c.args(&words[1..]);
                c
            }
            None => {
                let mut c = Command::new("sh");
                c.arg("-c").arg(cmd);
                c
            }
        };
        spawn::prepare(&mut command, &tag, pgid);
        let spawned = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let mut child = match spawned {
            Ok(child) => child,
            Err(e) => {
                // The watcher goes with its lifeline.
                drop(lifeline);
                let kind = e.kind();
                let why = format!("`{cmd}` cannot run: {e}");
                return Err(match kind {
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => {
                        ChunkError::Broken(why)
                    }
                    _ => ChunkError::Failed(why),
                });
            }
        };
        let pid = child.id().expect("a child just spawned has a pid");
        reap::waited_elsewhere(pid, true);
        let input = child.stdin.take().expect("stdin is piped");
        let output = BufReader::new(child.stdout.take().expect("stdout is piped"));
        let tail = Arc::new(Mutex::new(Vec::new()));
        let stderr = tokio::spawn(log_stderr(
            child.stderr.take().expect("stderr is piped"),
            pid,
            tail.clone(),
        ));
        tracing::debug!(pgid, %cmd, "started a warm process");
        Ok(Self {
            watcher,
            child,
            pid,
            pgid,
            tag,
            lifeline,
            input: Some(input),
            busy: false,
            output,
            stderr,
            tail,
            told: None,
            answered: 0,
            stopped: false,
        })
    }

    /// Sends `chunk` under `fence` and waits for its answer, the `timeout`, or `abort`.
    async fn send(
        &mut self,
        chunk: &Chunk,
        abort: impl std::future::Future<Output = Duration>,
        fence: Option<Fence>,
        timeout: Option<Duration>,
    ) -> Outcome {
        if !self.arm(fence.as_ref()).await {
            return Outcome::Died;
        }
        self.busy = true;
        let Some(input) = self.input.as_mut() else {
            return Outcome::Died;
        };
        if input.write_all(request(chunk).as_bytes()).await.is_err() {
            return Outcome::Died;
        }
        let mut line = Vec::new();
        let mut bounded = (&mut self.output).take(MAX_ANSWER);
        let answer = bounded.read_until(b'\n', &mut line);
        let timer = async {
            match timeout {
                Some(after) => {
                    tokio::time::sleep(after).await;
                    after
                }
                None => std::future::pending().await,
            }
        };
        let read = tokio::select! {
            read = answer => read,
            never = tell(&mut self.lifeline, fence, &mut self.told) => match never {},
            after = timer => return Outcome::TimedOut(after),
            grace = abort => return Outcome::Aborted(grace),
        };
        match read {
            Ok(0) | Err(_) => Outcome::Died,
            Ok(_) => match parse_answer(&line) {
                Some(answer) => {
                    self.answered += 1;
                    self.busy = false;
                    Outcome::Answered(answer)
                }
                // End-of-file in the middle of a line is a death, not garbage.
                None if !line.ends_with(b"\n") && (line.len() as u64) < MAX_ANSWER => Outcome::Died,
                None => {
                    let shown = String::from_utf8_lossy(&line[..line.len().min(200)]);
                    Outcome::Garbage(shown.trim_end().to_owned())
                }
            },
        }
    }

    /// Whether the command has ended (or cannot be asked).
    fn ended(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// Readies the guard for a chunk under `fence`, before it is sent: the instant it is
    /// armed for is kept when the fence [keeps](Fence::keeps) it, moved to the fence's
    /// stop instant otherwise (earlier, or later by a step, or about to come), and a
    /// chunk without a fence disarms it. False if the guard is gone.
    async fn arm(&mut self, fence: Option<&Fence>) -> bool {
        let now = Instant::now();
        let (line, told) = match (fence, self.told) {
            (None, None) => return true,
            (Some(fence), Some(armed)) if fence.keeps(armed, now) => return true,
            (None, Some(_)) => ("-\n".to_owned(), None),
            (Some(fence), _) => {
                let stop_at = fence.stop_at();
                let secs = secs(stop_at.saturating_duration_since(now));
                (format!("{secs}\n"), Some(stop_at))
            }
        };
        if self.lifeline.write_all(line.as_bytes()).await.is_err() {
            return false;
        }
        self.told = told;
        true
    }

    /// Whether the instant its guard is armed for came: the guard is stopping its group,
    /// or has stopped it.
    fn fenced(&self) -> bool {
        self.told.is_some_and(|t| Instant::now() >= t)
    }

    /// Stops the process and everything of its group (SIGTERM, `grace`, SIGKILL), then
    /// what left the group; its exit status, if it could be had, and its stderr tail.
    async fn stop(mut self, grace: Duration) -> (Option<std::process::ExitStatus>, String) {
        self.stopped = true;
        signal_group(self.pgid, Signal::SIGTERM);
        let status = match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(status) => {
                signal_group(self.pgid, Signal::SIGKILL);
                status.ok()
            }
            Err(_) => {
                signal_group(self.pgid, Signal::SIGKILL);
                self.child.wait().await.ok()
            }
        };
        reap::waited_elsewhere(self.pid, false);
        let _ = self.watcher.wait().await;
        reap::sweep(self.pgid, &self.tag, KILL_AFTER).await;
        // Every process that held stderr is gone: the logger reads its end-of-file.
        let _ = tokio::time::timeout(KILL_AFTER, &mut self.stderr).await;
        let tail = self.tail.lock().expect("not poisoned").clone();
        let tail = String::from_utf8_lossy(&tail[tail.len().saturating_sub(STDERR_TAIL)..])
            .trim()
            .to_owned();
        (status, tail)
    }
}

impl Drop for Warm {
    /// An idle process at the run's end, or one whose chunk was dropped: its group is
    /// killed at once, both children reaped, and what left the group swept, here and
    /// now, since no task may be left to do it.
    fn drop(&mut self) {
        if self.stopped {
            return;
        }
        self.stderr.abort();
        // An idle process first sees its stdin end (a `while read` loop ends, a client
        // closes its connection), then SIGTERM, each with a moment to end; then SIGKILL.
        // One dropped in the middle of a chunk (this thread is not to wait for it) is
        // killed at once.
        drop(self.input.take());
        if !self.busy {
            let mut ended = || {
                let deadline = std::time::Instant::now() + Duration::from_millis(250);
                while matches!(self.child.try_wait(), Ok(None)) {
                    if std::time::Instant::now() >= deadline {
                        return false;
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                true
            };
            if !ended() {
                signal_group(self.pgid, Signal::SIGTERM);
                ended();
            }
        }
        signal_group(self.pgid, Signal::SIGKILL);
        // Reaped through their `Child`s, which then know it: no signal on drop may
        // reach a recycled pid.
        for child in [&mut self.child, &mut self.watcher] {
            let deadline = std::time::Instant::now() + KILL_AFTER;
            while matches!(child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        reap::waited_elsewhere(self.pid, false);
        reap::sweep_now(self.pgid, &self.tag, KILL_AFTER);
    }
}

/// Logs each line of a warm process's stderr (INFO, with its pid), keeping the last
/// [`STDERR_TAIL`] bytes in `tail`, until end-of-file.
async fn log_stderr(stderr: tokio::process::ChildStderr, pid: u32, tail: Arc<Mutex<Vec<u8>>>) {
    let mut stderr = BufReader::new(stderr);
    let mut line = Vec::new();
    loop {
        line.clear();
        match (&mut stderr)
            .take(STDERR_LINE as u64)
            .read_until(b'\n', &mut line)
            .await
        {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                let text = String::from_utf8_lossy(&line);
                tracing::info!(pid, "warm process: {}", text.trim_end());
                let mut tail = tail.lock().expect("not poisoned");
                tail.extend_from_slice(&line);
                if tail.len() > 2 * STDERR_TAIL {
                    let cut = tail.len() - STDERR_TAIL;
                    tail.drain(..cut);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
