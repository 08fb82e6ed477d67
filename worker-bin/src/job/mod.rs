//! What a chunk of a partition runs: the team's command (`--exec`, `exec.rs`), a warm
//! process kept between chunks (`--exec-persistent`, `persistent.rs`), a library user's
//! handler, or the labelled load generator (`--simulate`). Both kinds of process start
//! the same way (`spawn.rs`), are guarded the same way (`guard.rs`) and leave nothing
//! behind (`reap.rs`).
//!
//! Every way ends the same: done, failed (an attempt spent), refused under a policy of
//! the handler's own, broken (no retry can help), or interrupted (our shutdown or a
//! lease gone unrenewed: the attempt given back). A handler's panic is caught at the
//! chunk and fails its attempt. A chunk runs under its lease's [`Fence`]: a command's
//! guard (`guard.rs`) stops it when renewals stop coming, a handler is not polled again.

mod exec;
mod guard;
mod persistent;
mod reap;
mod spawn;

use std::future::Future;
use std::task::Poll;
use std::time::Duration;

use rand::Rng;

pub(crate) use crate::handler::Chunk;
pub(crate) use guard::Fence;
pub(crate) use persistent::Persistent;
pub use persistent::PersistentCommand;
#[cfg(feature = "cli")]
pub(crate) use spawn::scrubbed_env;

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

/// The rows a chunk affected, when its handler counts them
/// ([`Handler::process_counted`](crate::Handler::process_counted)); `None` for a command
/// and for a handler that does not count.
pub(crate) type Rows = Option<u64>;

/// How chunks are processed.
#[derive(Debug, Clone)]
// `Exec` and `Simulate` come from the command line only.
#[cfg_attr(not(feature = "cli"), allow(dead_code))]
pub(crate) enum Job {
    /// `sh -c CMD` per chunk (a plain command's words `exec`ed directly); exit 0 is
    /// success.
    Exec(String),
    /// One warm process per chunk in flight, fed a chunk per line (`--exec-persistent`).
    Persistent(std::sync::Arc<Persistent>),
    /// Sleep uniformly in `latency` ms, fail with probability `fail`.
    Simulate { latency: (u64, u64), fail: f64 },
    /// A library user's handler ([`crate::Handler`]).
    Handler(crate::handler::HandlerRef),
}

impl Job {
    /// A library user's handler as the run loop runs it: a [`PersistentCommand`] as
    /// `--exec-persistent` (guarded, held to each chunk's lease, a command that cannot
    /// run stopping the run), any other through its `process`.
    pub(crate) fn of_handler<H: crate::handler::Handler>(handler: H) -> Job {
        let any: &dyn std::any::Any = &handler;
        match any.downcast_ref::<PersistentCommand>() {
            Some(warm) => Job::Persistent(warm.0.clone()),
            None => Job::Handler(crate::handler::HandlerRef(std::sync::Arc::new(handler))),
        }
    }

    /// Runs one chunk until it ends or `abort` resolves (then it is stopped and
    /// [`ChunkError::Interrupted`]). `abort` gives how long a command's process group
    /// has between SIGTERM and SIGKILL; a handler's future is dropped at once. With a
    /// `fence`, the chunk is also stopped (and [`ChunkError::Interrupted`]) when its
    /// lease goes unrenewed too long, whether or not this process is running then: a
    /// command by its guard, a handler by not being polled again.
    pub(crate) async fn run(
        &self,
        chunk: Chunk,
        abort: impl Future<Output = Duration>,
        fence: Option<Fence>,
    ) -> Result<Rows, ChunkError> {
        match self {
            // Boxed: a child process's state would make every chunk's future that big.
            Job::Exec(cmd) => Box::pin(exec::exec(cmd, chunk, abort, fence))
                .await
                .map(|()| None),
            Job::Persistent(warm) => Box::pin(warm.run(chunk, abort, fence)).await.map(|()| None),
            Job::Handler(handler) => {
                use futures_util::FutureExt;
                let handler = handler.0.clone();
                // A panic is caught here, at the chunk: it fails the attempt like an
                // error (retried up to max_attempts) instead of unwinding through the
                // partition's task, which would leave its lease held and renewed for
                // ever. AssertUnwindSafe: after a panic the future is dropped, and
                // nothing of it is used again.
                let process =
                    std::panic::AssertUnwindSafe(handler.process_counted(chunk)).catch_unwind();
                tokio::select! {
                    r = unless_due(process, fence) => match r {
                        None => {
                            tracing::warn!(
                                pid = chunk.pid,
                                from = chunk.from,
                                "lease not renewed in time; the chunk's handler is dropped"
                            );
                            Err(ChunkError::Interrupted)
                        }
                        Some(Ok(r)) => r.map_err(|err| {
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
                        Some(Err(payload)) => Err(ChunkError::Failed(format!(
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
                    Ok(None)
                }
            }
        }
    }
}

/// Polls `work` until it is ready, `None` if `fence` comes due first. It is checked
/// before every poll, not by a timer: a worker frozen past its lease (SIGSTOP) finds
/// it due at the first poll after the thaw, before the work takes another step.
async fn unless_due<F: Future>(work: F, fence: Option<Fence>) -> Option<F::Output> {
    let mut work = std::pin::pin!(work);
    std::future::poll_fn(|cx| {
        if fence.as_ref().is_some_and(Fence::is_due) {
            return Poll::Ready(None);
        }
        work.as_mut().poll(cx).map(Some)
    })
    .await
}

/// A panic's message: its payload when that is a string (as `panic!` makes it).
fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a non-string payload")
}

#[cfg(test)]
pub(crate) mod test_support {
    //! What the chunk tests of every part of this module start from.

    use std::time::Duration;

    use tokio::sync::watch;
    use tokio::time::Instant;

    use super::{Chunk, Fence};

    pub(crate) fn chunk() -> Chunk {
        Chunk {
            pid: 7,
            index: 2,
            from: 6201,
            to: 6300,
            attempt: 3,
            fence: 41,
        }
    }

    /// A fence on a lease that holds until `valid_until` from now (the sender keeps it
    /// open: drop it and no renewal can come), stopping the chunk `stop` before it,
    /// killing it `kill` before it, telling renewals `step` apart.
    pub(crate) fn fence(
        valid_until: Duration,
        stop: Duration,
        kill: Duration,
        step: Duration,
    ) -> (watch::Sender<Instant>, Fence) {
        let (tx, rx) = watch::channel(Instant::now() + valid_until);
        (tx, Fence::new(rx, stop, kill, step))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::test_support::{chunk, fence};
    use super::*;

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
            always.run(chunk(), std::future::pending(), None).await,
            Err(ChunkError::Failed(reason)) if reason.contains("simulated failure")
        ));
        assert_eq!(
            never.run(chunk(), std::future::pending(), None).await,
            Ok(None)
        );
    }

    /// A handler whose worker thawed after its lease ran out is not polled again: it
    /// does not finish its work (`done` stays unset) however ready it is.
    #[tokio::test(start_paused = true)]
    async fn a_handler_is_not_polled_past_its_fence() {
        struct Slow(Arc<std::sync::atomic::AtomicBool>);
        #[async_trait::async_trait]
        impl crate::handler::Handler for Slow {
            async fn process(&self, _: Chunk) -> Result<(), crate::handler::HandlerError> {
                tokio::time::sleep(Duration::from_millis(500)).await;
                self.0.store(true, std::sync::atomic::Ordering::Relaxed);
                Ok(())
            }
        }
        use std::sync::Arc;
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let job = Job::Handler(crate::handler::HandlerRef(Arc::new(Slow(done.clone()))));
        let ms = Duration::from_millis;
        // Due 100 ms in: the handler wakes at 500 ms and finds it so.
        let (_renewals, fence) = fence(ms(300), ms(200), ms(100), ms(50));
        let r = job.run(chunk(), std::future::pending(), Some(fence)).await;
        assert_eq!(r, Err(ChunkError::Interrupted));
        assert!(!done.load(std::sync::atomic::Ordering::Relaxed));
        // Without a fence the same handler runs to its end.
        let r = job.run(chunk(), std::future::pending(), None).await;
        assert_eq!(r, Ok(None));
        assert!(done.load(std::sync::atomic::Ordering::Relaxed));
    }
}
