//! What a run tells its subscribers as it goes: [`Event`]s, delivered to the callbacks
//! given to [`Runner::on_event`](crate::Runner::on_event).
//!
//! The design choice a reader might get wrong: **callbacks are called inline**, on the
//! task where the thing happened (a chunk's, a partition's, the claim loop's), so they
//! must return quickly and never block: count, record, or send into a channel of your
//! own (`tokio::sync::mpsc::UnboundedSender::send` is fine). The command line's progress
//! bar and `--metrics-listen` histogram are built from the same events.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

/// Something that happened in a run. `#[non_exhaustive]`: match with a `_` arm, new
/// kinds may come.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Event {
    /// This runner claimed a partition (it is queued, then started).
    Claimed {
        /// The partition.
        pid: u64,
        /// Its attempt, from 1.
        attempt: u32,
    },
    /// A chunk ended, successfully or not.
    ChunkDone {
        /// The partition.
        pid: u64,
        /// The chunk's number within the partition, from 0.
        index: u64,
        /// How long the handler took.
        duration: Duration,
        /// Whether it succeeded.
        ok: bool,
        /// The rows it affected, when the handler counts them
        /// ([`Handler::process_counted`](crate::Handler::process_counted)).
        rows: Option<u64>,
    },
    /// A partition completed here.
    PartitionDone {
        /// The partition.
        pid: u64,
        /// The attempt that completed it.
        attempt: u32,
        /// From its start here to its completion.
        duration: Duration,
        /// The rows its chunks affected in the attempt that completed it, here (not
        /// those of chunks an earlier attempt finished), when the handler counts them.
        rows: Option<u64>,
    },
    /// An attempt of a partition failed here (a chunk's error or panic).
    AttemptFailed {
        /// The partition.
        pid: u64,
        /// The attempt that failed, from 1.
        attempt: u32,
        /// The reason, as recorded in the store.
        error: String,
        /// Whether the handler said no retry can help.
        permanent: bool,
        /// In how long it is retried; `None` when the partition ended failed.
        retry_in: Option<Duration>,
    },
    /// A partition was given back unfinished, its attempt returned (a drain).
    Released {
        /// The partition.
        pid: u64,
    },
    /// A partition's lease was lost (it expired and another worker may hold it): its
    /// result here is dropped.
    LeaseLost {
        /// The partition.
        pid: u64,
    },
    /// The runner's admission gate closed: no partition is claimed and no chunk
    /// starts until [`Event::Resumed`] (running chunks finish). Sent when the gate
    /// closes, not for every wait: a manual throttle (`tranche throttle on`), a probe's
    /// finding ([`Runner::throttle_probe`](crate::Runner::throttle_probe)), or the
    /// hours outside `active_hours`. A rate limit paces without closing it.
    Throttled {
        /// Why, as `tranche status` says it.
        reason: String,
    },
    /// The gate opened again after [`Event::Throttled`]: work resumes.
    Resumed,
    /// A snapshot of this runner's counters, about once a second while it runs.
    Progress(Progress),
    /// A call to the job's store failed (Redis unreachable, a connection reset, a
    /// timeout, once the store's own quick retries were spent) and the run went on
    /// without it: a claim or a beat is made again at its next turn, a partition whose
    /// outcome could not be reported is run again once its lease expires. Sent once
    /// per failed call, never while calls succeed. A store that stays unreachable shows
    /// here first; this runner's leases then fence themselves
    /// ([`Event::LeaseLost`]) and the run waits for the store to come back.
    StoreError {
        /// What the run was doing.
        op: StoreOp,
        /// The error, as the store gave it.
        error: String,
    },
}

/// What a run was doing when a call to its store failed ([`Event::StoreError`]).
/// `#[non_exhaustive]`: match with a `_` arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreOp {
    /// Claiming partitions.
    Claim,
    /// Claiming pieces of split partitions.
    ClaimPieces,
    /// Renewing this runner's leases (with their checkpoints).
    Heartbeat,
    /// Reporting a partition's outcome (completed, failed, released).
    Report,
    /// Giving back queued partitions at a drain.
    Release,
    /// Looking for, or asking for, a split of a running partition.
    Split,
    /// Requeueing expired leases, or forgetting silent workers.
    Reap,
    /// Recording this runner in the worker registry.
    WorkerHeartbeat,
    /// Archiving the completed partitions at the run's end, or publishing the last
    /// statistics snapshot.
    Archive,
    /// Asking the namespace's rate limiter (`tranche set --rate`) for partitions to
    /// claim or IDs to start a chunk on.
    RateLimit,
}

impl StoreOp {
    /// Every operation, in the order of [`StoreOp::as_str`]'s names.
    pub const ALL: [StoreOp; 10] = [
        StoreOp::Claim,
        StoreOp::ClaimPieces,
        StoreOp::Heartbeat,
        StoreOp::Report,
        StoreOp::Release,
        StoreOp::Split,
        StoreOp::Reap,
        StoreOp::WorkerHeartbeat,
        StoreOp::Archive,
        StoreOp::RateLimit,
    ];

    /// The name `tranche` logs it by (and labels `tranche_worker_store_errors_total`
    /// with): `claim`, `claim-pieces`, `heartbeat`, `report`, `release`, `split`,
    /// `reap`, `worker-heartbeat`, `archive`, `rate-limit`.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreOp::Claim => "claim",
            StoreOp::ClaimPieces => "claim-pieces",
            StoreOp::Heartbeat => "heartbeat",
            StoreOp::Report => "report",
            StoreOp::Release => "release",
            StoreOp::Split => "split",
            StoreOp::Reap => "reap",
            StoreOp::WorkerHeartbeat => "worker-heartbeat",
            StoreOp::Archive => "archive",
            StoreOp::RateLimit => "rate-limit",
        }
    }
}

impl fmt::Display for StoreOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// This runner's counters at one instant ([`Event::Progress`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[non_exhaustive]
pub struct Progress {
    /// Partitions claimed.
    pub claimed: u64,
    /// Partitions completed.
    pub completed: u64,
    /// Attempts that failed (retried, or ending failed).
    pub attempts_failed: u64,
    /// Partitions given back unfinished.
    pub released: u64,
    /// Leases lost.
    pub lost: u64,
    /// Partitions running now.
    pub in_flight: u64,
    /// Chunks running now.
    pub chunks_in_flight: u64,
    /// Since the run started.
    pub elapsed: Duration,
}

/// A subscriber's callback.
pub(crate) type Callback = Arc<dyn Fn(&Event) + Send + Sync>;

/// The callbacks of one runner, called in the order they were added.
#[derive(Clone, Default)]
pub(crate) struct Subscribers(pub(crate) Vec<Callback>);

impl Subscribers {
    pub(crate) fn emit(&self, event: &Event) {
        for callback in &self.0 {
            callback(event);
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Subscribers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} subscriber(s)", self.0.len())
    }
}

/// Sends [`Event::Throttled`] each time `closed` (why the admission gate is closed,
/// `None` while open) turns closed, and [`Event::Resumed`] each time it opens again,
/// until `done` turns true. A gate closed at the start is announced at once.
pub(crate) async fn announce_throttle(
    mut closed: watch::Receiver<Option<String>>,
    emit: impl Fn(Event),
    mut done: watch::Receiver<bool>,
) {
    let mut was_closed = false;
    loop {
        let now = closed.borrow_and_update().clone();
        match (was_closed, now) {
            (false, Some(reason)) => {
                was_closed = true;
                emit(Event::Throttled { reason });
            }
            (true, None) => {
                was_closed = false;
                emit(Event::Resumed);
            }
            _ => {}
        }
        tokio::select! {
            changed = closed.changed() => if changed.is_err() { return },
            _ = done.wait_for(|d| *d) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Only flips are announced: a closed gate whose reason changes says nothing new,
    /// and an open one that stays open says nothing.
    #[tokio::test]
    async fn throttled_and_resumed_are_sent_when_the_gate_flips() {
        let (gate, closed) = watch::channel(None::<String>);
        let (stop, done) = watch::channel(false);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        let task = tokio::spawn(announce_throttle(
            closed,
            move |e| sink.lock().unwrap().push(e),
            done,
        ));
        let settle = || tokio::time::sleep(Duration::from_millis(20));
        settle().await;
        gate.send_replace(Some("throttled: replica lag".to_owned()));
        settle().await;
        gate.send_replace(Some("outside active hours".to_owned()));
        settle().await;
        gate.send_replace(None);
        settle().await;
        gate.send_replace(None);
        settle().await;
        stop.send_replace(true);
        task.await.unwrap();
        assert_eq!(
            *seen.lock().unwrap(),
            vec![
                Event::Throttled {
                    reason: "throttled: replica lag".to_owned()
                },
                Event::Resumed
            ]
        );
    }
}
