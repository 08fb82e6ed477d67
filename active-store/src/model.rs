//! The values that cross the active store's traits.

use std::ops::RangeInclusive;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tranche_codec::KeyLayout;

/// What to plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// `min..=max` cut into partitions of `size` IDs (the last may be shorter). A
    /// generator: nothing per partition is stored until a partition is claimed.
    Uniform {
        /// First row ID.
        min: u64,
        /// Last row ID, inclusive.
        max: u64,
        /// IDs per partition.
        size: u64,
    },
    /// Explicit ranges, one partition each, materialised as pending at once. They must
    /// not overlap each other or any existing plan.
    Ranges(Vec<RangeInclusive<u64>>),
}

pub use tranche_codec::PlanEntry;

impl From<&PlanEntry> for Plan {
    /// The plan that registers the entry again: its uniform plan, or its one explicit
    /// range.
    fn from(entry: &PlanEntry) -> Self {
        let p = &entry.plan;
        if entry.explicit {
            Plan::Ranges(vec![p.min()..=p.max()])
        } else {
            Plan::Uniform {
                min: p.min(),
                max: p.max(),
                size: p.size(),
            }
        }
    }
}

/// What [`Planner::plan`](crate::Planner::plan) did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanOutcome {
    /// The registry entries the plan maps to (one for a uniform plan, one per range).
    pub entries: Vec<PlanEntry>,
    /// False when the same plan was already there: nothing changed.
    pub created: bool,
}

/// A claimed partition. Every call that acts on it presents `token`: a lease that
/// expired and was handed to someone else is refused (fencing).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The partition.
    pub pid: u64,
    /// The fencing token of this claim; unique per shard and never reused.
    pub token: u64,
    /// The worker holding the lease.
    pub worker: String,
    /// First row ID of the partition.
    pub min_id: u64,
    /// Last row ID, inclusive.
    pub max_id: u64,
    /// 1 for the first claim, 2 for the first retry, and so on.
    pub attempt: u32,
    /// The checkpoint to resume from: every ID below it is already done. `min_id` for a
    /// fresh partition; a resumed partition carries the last heartbeat's checkpoint.
    pub progress: u64,
    /// When the lease expires unless renewed, in ms since the epoch.
    pub deadline_ms: u64,
}

impl Lease {
    /// The archived form of this lease's partition, completed at `now_ms` after
    /// `duration_ms`.
    pub fn completed(&self, now_ms: u64, duration_ms: u64) -> tranche_codec::CompletedRecord {
        tranche_codec::CompletedRecord {
            pid: self.pid,
            min_id: self.min_id,
            max_id: self.max_id,
            worker: self.worker.as_str().into(),
            completed_at_ms: now_ms,
            duration_ms,
        }
    }
}

/// The outcome of a completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// The partition left the active set and went to the archive inbox.
    Completed,
    /// It had been completed already; nothing changed.
    Duplicate,
    /// The owner part of a split partition is done and its lease ended, but pieces of
    /// it are outstanding: the partition is not completed (the last piece completes it,
    /// or a failed piece fails it). Also the answer to a lease cut short by a cut the
    /// store no longer holds: the partition is pending again past the lease's end
    /// ([`Leases::complete`](crate::Leases::complete)).
    PartDone,
}

/// The outcome of a failure report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailOutcome {
    /// The partition is pending again, claimable from `ready_at_ms`.
    Retry {
        /// When the backoff ends, ms since the epoch.
        ready_at_ms: u64,
    },
    /// `max_attempts` were spent; the partition is failed until an operator acts.
    Failed,
}

/// How a failed attempt is to be handled, beyond the store's own retry policy
/// ([`Leases::fail_with`](crate::Leases::fail_with)). The default is the ordinary
/// failure: retried after the backoff until `max_attempts` are spent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FailPolicy {
    /// Fail the partition now, whatever attempts are left: no retry can help.
    pub permanent: bool,
    /// Retry after this delay instead of the backoff (ignored when `permanent`, or
    /// when the attempts are spent).
    pub retry_after: Option<std::time::Duration>,
}

/// Partitions by status, across every shard.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusCounts {
    /// Planned but never claimed: still behind a plan cursor, not materialised.
    pub unissued: u64,
    /// Materialised and waiting: retries in backoff, released or reaped leases,
    /// explicit ranges.
    pub pending: u64,
    /// Claimed, no heartbeat yet.
    pub claimed: u64,
    /// Claimed and heartbeating.
    pub running: u64,
    /// Out of attempts, waiting for an operator.
    pub failed: u64,
    /// Given up by an operator: neither outstanding nor completed.
    pub discarded: u64,
}

impl StatusCounts {
    /// Work that is not finished and not given up: unissued, pending, claimed, running.
    pub fn outstanding(&self) -> u64 {
        self.unissued + self.pending + self.claimed + self.running
    }

    /// Counts one materialised partition of `status` (a completed one is not active).
    pub fn add(&mut self, status: tranche_codec::Status) {
        use tranche_codec::Status;
        match status {
            Status::Pending => self.pending += 1,
            Status::Claimed => self.claimed += 1,
            Status::Running => self.running += 1,
            Status::Failed => self.failed += 1,
            Status::Discarded => self.discarded += 1,
            Status::Completed => {}
        }
    }
}

/// A run of planned pids not yet issued by a shard's cursor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unissued {
    /// The shard.
    pub shard: u32,
    /// The next pid the cursor will consider.
    pub next_pid: u64,
    /// The last pid of the plan, inclusive.
    pub last_pid: u64,
    /// How many of those pids belong to this shard.
    pub count: u64,
}

/// Everything in the active layer: the materialised partitions, and a summary of the
/// planned work not yet issued.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ActiveSnapshot {
    /// Every materialised partition (pending, claimed, running, failed), by pid.
    pub partitions: Vec<tranche_codec::Partition>,
    /// The planned pid runs not yet issued, per shard.
    pub unissued: Vec<Unissued>,
    /// The pids left out of `partitions` because what holds them does not decode,
    /// sorted, each once: those whose active record does not
    /// ([`ActiveQuery::corrupt_records`](crate::ActiveQuery::corrupt_records) reads them
    /// whole; `tranche check --repair` sets them aside), and those a run that does not
    /// decode still names by its first and last pid (at most 128) and nothing else
    /// holds (a pid with a record of its own left its run). Always empty in memory.
    pub corrupt: Vec<u64>,
}

/// A worker's own report, sent with every worker heartbeat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerInfo {
    /// The worker id (unique across the fleet).
    pub id: String,
    /// Host name.
    pub host: String,
    /// Operating-system process id.
    pub process_id: u32,
    /// When the worker started, ms since the epoch.
    pub started_ms: u64,
    /// When this report was sent, ms since the epoch (set by the store).
    pub last_beat_ms: u64,
    /// Partitions held right now.
    pub in_flight: u64,
    /// Partitions completed since start.
    pub completed: u64,
    /// Completions per second over the last interval.
    pub rate_per_s: f64,
    /// Median partition latency, ms.
    pub latency_p50_ms: f64,
    /// 99th percentile partition latency, ms.
    pub latency_p99_ms: f64,
    /// tranche version of the worker.
    pub version: String,
}

/// A registered worker and whether it is still beating.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerState {
    /// The worker's last report.
    pub info: WorkerInfo,
    /// False once the worker missed [`Config::missed_beats`] heartbeats.
    pub active: bool,
}

/// Settings of one namespace's active layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The namespace all keys live under (`elk` in the seed).
    pub namespace: String,
    /// Shards, 1..=1024. Each is its own Redis Cluster slot.
    pub num_shards: u32,
    /// How the shards' keys are named: the layout `{ns}:meta` records for the
    /// namespace ([`KeysMeta`](crate::KeysMeta)); new namespaces get the default.
    pub layout: KeyLayout,
    /// How long a claim or heartbeat keeps a lease, by the caller's clock: every
    /// process on the namespace must agree with every other's clock within a twelfth
    /// of it (`src/split.rs`, "Clocks").
    pub lease: Duration,
    /// Claims per partition before it fails for good.
    pub max_attempts: u32,
    /// Backoff after the first failure; doubles per attempt.
    pub backoff_base: Duration,
    /// The longest backoff.
    pub backoff_max: Duration,
    /// How often workers report.
    pub worker_heartbeat: Duration,
    /// Heartbeats a worker may miss before it counts as inactive.
    pub missed_beats: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            namespace: "elk".to_owned(),
            num_shards: 1,
            layout: KeyLayout::default(),
            lease: Duration::from_secs(30),
            max_attempts: 5,
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
            worker_heartbeat: Duration::from_secs(10),
            missed_beats: 3,
        }
    }
}

impl Config {
    /// The backoff before retry number `attempts` (after `attempts` failed claims).
    pub fn backoff(&self, attempts: u32) -> Duration {
        let factor = 1u32
            .checked_shl(attempts.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.backoff_base
            .checked_mul(factor)
            .unwrap_or(self.backoff_max)
            .min(self.backoff_max)
    }

    /// Whether a worker last heard from at `last_beat_ms` is still active at `now_ms`.
    pub fn worker_active(&self, last_beat_ms: u64, now_ms: u64) -> bool {
        let allowance = self.worker_heartbeat.as_millis() as u64 * u64::from(self.missed_beats);
        now_ms.saturating_sub(last_beat_ms) <= allowance
    }
}

/// The state an adopted partition had in the system it came from, for
/// [`RedisActiveStore::carry`](crate::RedisActiveStore::carry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Carried {
    /// The partition.
    pub pid: u64,
    /// The attempts it had used: a partition that failed twice there has two fewer
    /// left here.
    pub attempts: u32,
    /// Out of attempts there: failed here too, for `retry-failed` or `discard`.
    pub failed: bool,
    /// The worker that last held it (kept on a failed partition; empty for none).
    pub worker: String,
}

/// An active record that does not decode, found by
/// [`ActiveQuery::corrupt_records`](crate::ActiveQuery::corrupt_records): a record of
/// the active hash, or a run of the runs hash (on Redis) listed once per pid it names.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CorruptRecord {
    /// The shard holding it.
    pub shard: u32,
    /// Its partition. `None` for a run whose first and last fields do not read: the
    /// pids it holds are unknown, so nothing can rebuild them
    /// ([`Maintenance::repair_corrupt`](crate::Maintenance::repair_corrupt) takes a
    /// pid), and the run is left as it is: its holder's calls on them answer the
    /// corruption, and no reaper frees them.
    pub pid: Option<u64>,
    /// The hash holding it, and for a run its token after a space.
    pub key: String,
    /// Its value as stored.
    pub raw: Vec<u8>,
}

/// What [`Maintenance::repair_corrupt`](crate::Maintenance::repair_corrupt) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Repair {
    /// Set aside, and the partition pending again from its min id.
    Rebuilt,
    /// Set aside, and the record removed: the partition was completed.
    Removed,
    /// Nothing to repair: no record, or one that decodes.
    Nothing,
}
