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
    },
    /// A partition completed here.
    PartitionDone {
        /// The partition.
        pid: u64,
        /// The attempt that completed it.
        attempt: u32,
        /// From its start here to its completion.
        duration: Duration,
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
    /// The runner holds back claims (reserved for rate limiting).
    Throttled {
        /// Why.
        reason: String,
    },
    /// The runner claims again after [`Event::Throttled`] (reserved).
    Resumed,
    /// A snapshot of this runner's counters, about once a second while it runs.
    Progress(Progress),
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
