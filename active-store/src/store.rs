//! The active layer's capability traits. Callers hold `Arc<dyn ActiveStore>`; a piece
//! that only claims work can take `&dyn Leases`.

use std::sync::Arc;

use async_trait::async_trait;
use tranche_codec::Partition;

use crate::Result;
use crate::model::{
    ActiveSnapshot, Completion, CorruptRecord, FailOutcome, FailPolicy, Lease, Plan, PlanEntry,
    PlanOutcome, Repair, StatusCounts, WorkerInfo, WorkerState,
};
use crate::split::{Beat, PartBeat, Piece, PieceDone, Running, SplitAnswer, Splits};

/// Plans: the generators of partitions.
#[async_trait]
pub trait Planner: Send + Sync {
    /// Adds a plan. Validated first (`max >= min`, `size > 0`, no overlap with another
    /// plan); a rejected plan writes nothing, and the same plan twice is a no-op.
    async fn plan(&self, plan: &Plan) -> Result<PlanOutcome>;

    /// Every plan entry of the namespace, by first pid.
    async fn plans(&self) -> Result<Vec<PlanEntry>>;

    /// Restores an exported plan registry into this namespace, which must have no plan
    /// yet (`tranche import`). `entries` (as [`Planner::plans`] listed them: from pid 1,
    /// no gap) are registered in order and so keep their pids; the pids of `completed`
    /// (strictly increasing, each in an entry) go to the completed index and are never
    /// issued; every other pid of the entries is pending, ready now: work the export
    /// did not hold as done is done again. Returns how many pids are pending.
    ///
    /// Checked before anything is written. Not atomic as a whole: an interrupted
    /// adoption leaves a partial namespace to be deleted before trying again.
    async fn adopt(&self, entries: &[PlanEntry], completed: &[u64]) -> Result<u64>;
}

/// The lease lifecycle: claim, heartbeat, then complete, fail or release.
#[async_trait]
pub trait Leases: Send + Sync {
    /// Claims up to `n` partitions for `worker`: ready retries first, then fresh pids.
    /// One round trip per shard visited; starts at a shard derived from the worker id
    /// and moves on only while it has fewer than `n`. Empty when there is no work. A
    /// shard that fails after others handed out leases ends the claim with those
    /// leases (never dropped with the error); an error only when nothing was taken.
    async fn claim(&self, worker: &str, n: usize) -> Result<Vec<Lease>>;

    /// Renews `lease` and stores `progress` (every ID below it is done) as its
    /// checkpoint. [`Error::LeaseLost`](crate::Error::LeaseLost) if the token is stale.
    async fn heartbeat(&self, lease: &Lease, progress: u64) -> Result<()>;

    /// Renews many leases at once, each with its checkpoint: what a process holds,
    /// heartbeated together (one round trip per shard on Redis, whatever the number of
    /// leases). Each lease has its own outcome, as [`heartbeat`](Self::heartbeat) would
    /// give it; the outer error is for the store as a whole.
    async fn heartbeat_many(&self, beats: &[(Lease, u64)]) -> Result<Vec<Result<()>>> {
        let mut out = Vec::with_capacity(beats.len());
        for (lease, progress) in beats {
            out.push(self.heartbeat(lease, *progress).await);
        }
        Ok(out)
    }

    /// Completes `lease`: the partition leaves the active set, its completed-index bit is
    /// set and its record goes to the archive inbox, atomically.
    ///
    /// `lease.max_id` is the last ID its holder processed: the lease's end after every
    /// cut it was told of (`Splits::beat_parts`). When the partition's record ends later,
    /// the store no longer holds a cut the holder was told of (acknowledged, then lost in
    /// a failover), and no piece holds the IDs past it: the partition is not completed
    /// but pending again from `max_id + 1`, its attempt given back, and the answer is
    /// [`Completion::PartDone`].
    async fn complete(&self, lease: &Lease, duration_ms: u64) -> Result<Completion> {
        let mut out = self.complete_many(&[(lease.clone(), duration_ms)]).await?;
        out.pop().expect("one outcome per completion")
    }

    /// Completes many leases at once (group commit): one round trip per shard. Each
    /// completion has its own outcome; the outer error is for the store as a whole.
    async fn complete_many(&self, done: &[(Lease, u64)]) -> Result<Vec<Result<Completion>>>;

    /// Reports a failed attempt: retried after a backoff, or failed once `max_attempts`
    /// were spent. A split partition failed so is whole again: its pieces cancelled,
    /// running ones fenced (`src/split.rs`, step 4).
    async fn fail(&self, lease: &Lease, error: &str) -> Result<FailOutcome>;

    /// Gives `lease` back before its deadline with checkpoint `progress` (graceful
    /// shutdown): pending again at once, and the next claimant resumes from `progress`.
    /// The attempt is given back too (the next claim has the same attempt number), so
    /// interruptions never use up `max_attempts`; an expired lease, reaped, keeps it.
    async fn release(&self, lease: &Lease, progress: u64) -> Result<()>;

    /// Reports a failed attempt under the caller's [`FailPolicy`]: failed at once when
    /// `permanent` (whatever attempts are left), or retried after `retry_after`
    /// instead of the backoff. The default serves the ordinary policy through
    /// [`fail`](Self::fail) and refuses any other with [`Error::InvalidArgument`](crate::Error::InvalidArgument)
    /// (crate::Error::InvalidArgument), writing nothing: a store that cannot honour
    /// the policy says so rather than retry a permanent failure.
    async fn fail_with(
        &self,
        lease: &Lease,
        error: &str,
        policy: FailPolicy,
    ) -> Result<FailOutcome> {
        if policy == FailPolicy::default() {
            self.fail(lease, error).await
        } else {
            Err(crate::Error::InvalidArgument(format!(
                "this store cannot fail with {policy:?}"
            )))
        }
    }
}

/// Housekeeping that keeps the active set moving when workers die or give up.
#[async_trait]
pub trait Maintenance: Send + Sync {
    /// Returns every lease whose deadline is at or before `now_ms` to pending, checkpoint
    /// kept, its attempt counted: one that expired on its last attempt fails its
    /// partition instead (a split one whole again, as [`Leases::fail`] makes it). Pieces of split partitions too, their pids not listed. Scans
    /// only the lease indexes up to `now_ms`. Idempotent. Returns the partitions' pids.
    async fn reap(&self, now_ms: u64) -> Result<Vec<u64>>;

    /// Releases every lease `worker` holds, partitions' and pieces', whatever its
    /// deadline (the worker was found inactive), as [`reap`](Self::reap) does an
    /// expired one. Returns the pids of the partitions with a part pending again,
    /// sorted, once each.
    async fn release_worker(&self, worker: &str) -> Result<Vec<u64>>;

    /// Puts failed partitions back to pending with a fresh attempt budget: one pid, or
    /// every failed partition. Returns the pids.
    async fn retry_failed(&self, pid: Option<u64>) -> Result<Vec<u64>>;

    /// Gives up a failed or pending partition for good: it stays, marked discarded, and
    /// is never claimed or archived. A split one is discarded whole: its range as
    /// planned, its pieces cancelled, running ones fenced (`src/split.rs`, step 4).
    /// False if the pid was not pending or failed;
    /// [`Error::Leased`](crate::Error::Leased) if a worker holds it.
    async fn discard(&self, pid: u64) -> Result<bool>;

    /// Pauses or resumes the namespace. While paused, workers claim nothing (what they
    /// hold runs to its end); a flag, not a lock: claims themselves do not check it.
    async fn set_paused(&self, paused: bool) -> Result<()>;

    /// Whether the namespace is paused.
    async fn is_paused(&self) -> Result<bool>;

    /// Sets aside `pid`'s active record if it does not decode (`check --repair`): the
    /// raw value goes to the shard's quarantine, and the partition is pending again
    /// from its min id with no attempt spent, or only removed if it was completed; the
    /// shard's counters are derived again. One atomic step. On Redis a run that does
    /// not decode and names `pid` in its first and last fields is broken up first, into
    /// a record of its raw value per pid it may have held (those fields' span and, its
    /// mask's length still read, the spans that length gives from either end, less any
    /// pid not issued yet or held by a sound run), and every one of those is repaired
    /// in this call; one whose first and last fields do not read is never touched. The
    /// default (a store that cannot hold a corrupt record, as the memory store) has
    /// nothing to repair.
    async fn repair_corrupt(&self, pid: u64) -> Result<Repair> {
        let _ = pid;
        Ok(Repair::Nothing)
    }
}

/// The worker registry.
#[async_trait]
pub trait WorkerRegistry: Send + Sync {
    /// Registers or refreshes a worker; `last_beat_ms` is set from the store's clock.
    async fn worker_heartbeat(&self, info: WorkerInfo) -> Result<()>;

    /// Every registered worker, inactive ones marked.
    async fn workers(&self) -> Result<Vec<WorkerState>>;

    /// Forgets a worker (it stopped cleanly).
    async fn deregister(&self, worker: &str) -> Result<()>;

    /// Forgets every worker whose last beat is more than `retention` old, and every entry
    /// that does not decode, so the registry holds the recent past, not every process
    /// that ever ran. A pruned worker that beats again simply registers again. Returns
    /// the ids forgotten.
    async fn prune_workers(&self, retention: std::time::Duration) -> Result<Vec<String>>;
}

/// Reads of the active layer, for the router and the operator.
#[async_trait]
pub trait ActiveQuery: Send + Sync {
    /// The partition if it is active, or planned and not yet issued (then pending, with
    /// no attempts). `None` for a pid that is completed, discarded or never planned.
    async fn get(&self, pid: u64) -> Result<Option<Partition>>;

    /// Every materialised partition plus a summary of the unissued plan ranges.
    async fn all_active(&self) -> Result<ActiveSnapshot>;

    /// Partitions by status. Kept as counters, not counted per call: the cost does not
    /// grow with the active set. Each shard's part equals its part of
    /// [`all_active`](Self::all_active), counted by status, at one instant.
    async fn counts(&self) -> Result<StatusCounts>;

    /// Every active record that does not decode, by pid (`check`), a run whose pids
    /// cannot be read first: read like [`all_active`](Self::all_active), which leaves
    /// them out. The default (a store that cannot hold a corrupt record, as the memory
    /// store) finds none.
    async fn corrupt_records(&self) -> Result<Vec<CorruptRecord>> {
        Ok(Vec::new())
    }
}

/// The whole active layer: what the router and the worker binary hold.
pub trait ActiveStore:
    Planner + Leases + Maintenance + WorkerRegistry + ActiveQuery + Splits
{
}

impl<T: Planner + Leases + Maintenance + WorkerRegistry + ActiveQuery + Splits + ?Sized> ActiveStore
    for T
{
}

macro_rules! forward {
    ($($ptr:ty),*) => {$(
        #[async_trait]
        impl<T: Planner + ?Sized> Planner for $ptr {
            async fn plan(&self, plan: &Plan) -> Result<PlanOutcome> { (**self).plan(plan).await }
            async fn plans(&self) -> Result<Vec<PlanEntry>> { (**self).plans().await }
            async fn adopt(&self, entries: &[PlanEntry], completed: &[u64]) -> Result<u64> {
                (**self).adopt(entries, completed).await
            }
        }

        #[async_trait]
        impl<T: Leases + ?Sized> Leases for $ptr {
            async fn claim(&self, worker: &str, n: usize) -> Result<Vec<Lease>> {
                (**self).claim(worker, n).await
            }
            async fn heartbeat(&self, lease: &Lease, progress: u64) -> Result<()> {
                (**self).heartbeat(lease, progress).await
            }
            async fn heartbeat_many(&self, beats: &[(Lease, u64)]) -> Result<Vec<Result<()>>> {
                (**self).heartbeat_many(beats).await
            }
            async fn complete(&self, lease: &Lease, duration_ms: u64) -> Result<Completion> {
                (**self).complete(lease, duration_ms).await
            }
            async fn complete_many(&self, done: &[(Lease, u64)]) -> Result<Vec<Result<Completion>>> {
                (**self).complete_many(done).await
            }
            async fn fail(&self, lease: &Lease, error: &str) -> Result<FailOutcome> {
                (**self).fail(lease, error).await
            }
            async fn release(&self, lease: &Lease, progress: u64) -> Result<()> {
                (**self).release(lease, progress).await
            }
            async fn fail_with(&self, lease: &Lease, error: &str, policy: FailPolicy) -> Result<FailOutcome> {
                (**self).fail_with(lease, error, policy).await
            }
        }

        #[async_trait]
        impl<T: Maintenance + ?Sized> Maintenance for $ptr {
            async fn reap(&self, now_ms: u64) -> Result<Vec<u64>> { (**self).reap(now_ms).await }
            async fn release_worker(&self, worker: &str) -> Result<Vec<u64>> {
                (**self).release_worker(worker).await
            }
            async fn retry_failed(&self, pid: Option<u64>) -> Result<Vec<u64>> {
                (**self).retry_failed(pid).await
            }
            async fn discard(&self, pid: u64) -> Result<bool> { (**self).discard(pid).await }
            async fn set_paused(&self, paused: bool) -> Result<()> {
                (**self).set_paused(paused).await
            }
            async fn is_paused(&self) -> Result<bool> { (**self).is_paused().await }
            async fn repair_corrupt(&self, pid: u64) -> Result<Repair> {
                (**self).repair_corrupt(pid).await
            }
        }

        #[async_trait]
        impl<T: WorkerRegistry + ?Sized> WorkerRegistry for $ptr {
            async fn worker_heartbeat(&self, info: WorkerInfo) -> Result<()> {
                (**self).worker_heartbeat(info).await
            }
            async fn workers(&self) -> Result<Vec<WorkerState>> { (**self).workers().await }
            async fn deregister(&self, worker: &str) -> Result<()> {
                (**self).deregister(worker).await
            }
            async fn prune_workers(&self, retention: std::time::Duration) -> Result<Vec<String>> {
                (**self).prune_workers(retention).await
            }
        }

        #[async_trait]
        impl<T: ActiveQuery + ?Sized> ActiveQuery for $ptr {
            async fn get(&self, pid: u64) -> Result<Option<Partition>> { (**self).get(pid).await }
            async fn all_active(&self) -> Result<ActiveSnapshot> { (**self).all_active().await }
            async fn counts(&self) -> Result<StatusCounts> { (**self).counts().await }
            async fn corrupt_records(&self) -> Result<Vec<CorruptRecord>> {
                (**self).corrupt_records().await
            }
        }

        #[async_trait]
        impl<T: Splits + ?Sized> Splits for $ptr {
            async fn split_candidates(&self) -> Result<Vec<Running>> {
                (**self).split_candidates().await
            }
            async fn request_split(&self, part: &Running, worker: &str, split_min: u64) -> Result<SplitAnswer> {
                (**self).request_split(part, worker, split_min).await
            }
            async fn request_pieces(&self, part: &Running, worker: &str, cuts: &[(u64, u64)]) -> Result<SplitAnswer> {
                (**self).request_pieces(part, worker, cuts).await
            }
            async fn beat_parts(&self, beats: &[PartBeat]) -> Result<Vec<Result<Beat>>> {
                (**self).beat_parts(beats).await
            }
            async fn claim_pieces(&self, worker: &str, n: usize) -> Result<Vec<Lease>> {
                (**self).claim_pieces(worker, n).await
            }
            async fn complete_piece(&self, lease: &Lease) -> Result<PieceDone> {
                (**self).complete_piece(lease).await
            }
            async fn release_piece(&self, lease: &Lease, progress: u64) -> Result<()> {
                (**self).release_piece(lease, progress).await
            }
            async fn fail_piece(&self, lease: &Lease, progress: u64, error: &str, policy: FailPolicy) -> Result<FailOutcome> {
                (**self).fail_piece(lease, progress, error, policy).await
            }
            async fn pieces(&self, pid: u64) -> Result<Vec<Piece>> {
                (**self).pieces(pid).await
            }
        }
    )*};
}

forward!(Arc<T>, Box<T>);
