//! The saved form of [`MemoryActiveStore`](crate::MemoryActiveStore): everything it
//! holds, as plain serde data, so an embedded run can write it to its state file and
//! resume where it stopped.

use serde::{Deserialize, Serialize};
use tranche_codec::Partition;

use crate::model::{PlanEntry, WorkerInfo};

/// The version of [`ActiveState`] this build writes and reads.
pub const ACTIVE_STATE_VERSION: u32 = 1;

/// Everything a [`MemoryActiveStore`](crate::MemoryActiveStore) holds: the plans, each
/// shard's cursors, materialised partitions (pending with their ready times, leased
/// with token, deadline and checkpoint, failed), fencing-token counter and completed
/// index, and the worker registry. Take it with
/// [`MemoryActiveStore::state`](crate::MemoryActiveStore::state) (or `state_with`),
/// restore it with [`MemoryActiveStore::restore`](crate::MemoryActiveStore::restore).
///
/// The inboxes are not part of it: their records belong to the archive's state, which
/// the memory archive takes while the active store is held still (`state_with`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActiveState {
    /// [`ACTIVE_STATE_VERSION`] when written; restoring another version is refused.
    pub version: u32,
    /// The namespace of the store that saved it.
    pub namespace: String,
    /// Its shard count.
    pub num_shards: u32,
    /// When it was taken, by the store's clock (ms since the epoch).
    pub saved_at_ms: u64,
    /// The plan registry, by first pid.
    pub(crate) plans: Vec<PlanEntry>,
    /// Each shard, in shard order.
    pub(crate) shards: Vec<ShardState>,
    /// The registered workers, by id.
    pub(crate) workers: Vec<WorkerInfo>,
}

/// One shard of an [`ActiveState`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ShardState {
    /// Materialised partitions, by pid. A leased one's deadline is its lease-index entry.
    pub(crate) partitions: Vec<Partition>,
    /// Pending partitions as `(ready_ms, pid)`: the ready time is not in the partition.
    pub(crate) pending: Vec<(u64, u64)>,
    /// Uniform plans' cursors: `(first pid, last pid, next pid to consider)`.
    pub(crate) cursors: Vec<(u64, u64, u64)>,
    /// The completed index as sorted, disjoint runs of pids `(first, last)`: a job
    /// completes mostly in order, so a million pids take a few runs per shard batch.
    pub(crate) completed: Vec<(u64, u64)>,
    /// The last fencing token handed out.
    pub(crate) token: u64,
}

impl ActiveState {
    /// The lowest pid any saved plan issues; `None` without a plan.
    pub fn first_pid(&self) -> Option<u64> {
        self.plans.iter().map(|p| p.plan.first_pid()).min()
    }

    /// Partitions completed so far, over every shard.
    pub fn completed_count(&self) -> u64 {
        self.shards
            .iter()
            .flat_map(|s| &s.completed)
            .map(|&(a, b)| b - a + 1)
            .sum()
    }

    /// The pids leased (claimed or running) when the state was taken, in pid order.
    pub fn leased(&self) -> Vec<u64> {
        let mut out: Vec<u64> = self
            .shards
            .iter()
            .flat_map(|s| &s.partitions)
            .filter(|p| p.status.is_leased())
            .map(|p| p.pid)
            .collect();
        out.sort_unstable();
        out
    }
}

/// What [`MemoryActiveStore::restore`](crate::MemoryActiveStore::restore) does with the
/// leases of the process that saved the state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestoredLeases {
    /// Keep them as they were: their deadlines pass and the reaper makes them pending
    /// again (other workers of that process may still hold them).
    Keep,
    /// Release every one at once, as [`Maintenance::release_worker`] does (an expired
    /// lease): pending and ready now, checkpoint kept, so the next claim resumes at its
    /// first unfinished chunk; the attempt stays counted, and a lease on its last
    /// attempt leaves its partition failed, so a partition that kills its process
    /// every time is not retried for ever. What a resumed embedded run wants: it is
    /// the only worker, so the old leases are dead.
    ///
    /// [`Maintenance::release_worker`]: crate::Maintenance::release_worker
    Release,
}
