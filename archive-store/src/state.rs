//! The saved form of [`MemoryArchive`](crate::MemoryArchive): every tier's content, the
//! archived set, the received records not archived yet, the worker dictionary, the
//! decode-failure count and the statistics, as plain serde data for the embedded
//! state file.

use serde::{Deserialize, Serialize};
use tranche_codec::{CompletedRecord, WorkerDict};
use tranche_stats::StatsState;

use crate::model::Tier;

/// The version of [`ArchiveState`] this build writes and reads.
pub const ARCHIVE_STATE_VERSION: u32 = 1;

/// Everything a [`MemoryArchive`](crate::MemoryArchive) holds, and the statistics it
/// counts into, taken at one instant: take it with
/// [`MemoryArchive::state`](crate::MemoryArchive::state), restore it with
/// [`MemoryArchive::restore`](crate::MemoryArchive::restore).
///
/// The records still in the inbox channels when it is taken are moved into the
/// archive's own queue of received records first, so they are saved too (and answer
/// "archiving" until the next pass stores them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArchiveState {
    /// [`ARCHIVE_STATE_VERSION`] when written; restoring another version is refused.
    pub version: u32,
    /// The namespace of the archive that saved it.
    pub namespace: String,
    /// Its shard count.
    pub num_shards: u32,
    /// Pids per batch.
    pub(crate) batch_size: u64,
    /// The worker dictionary every sealed batch was written with.
    pub(crate) dict: WorkerDict,
    /// Batches that failed to decode so far.
    pub(crate) decode_failures: u64,
    /// Each shard, in shard order.
    pub(crate) shards: Vec<ShardState>,
    /// The statistics, taken while no archive write could change them.
    pub(crate) stats: StatsState,
}

/// One shard of an [`ArchiveState`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ShardState {
    /// The archived pids as sorted, disjoint runs `(first, last)`.
    pub(crate) archived: Vec<(u64, u64)>,
    /// The simple tier, by pid.
    pub(crate) simple: Vec<CompletedRecord>,
    /// Open batches: id, tier, records by pid.
    pub(crate) open: Vec<(u64, Tier, Vec<CompletedRecord>)>,
    /// Sealed batches, by id.
    pub(crate) sealed: Vec<SealedState>,
    /// Received records not archived yet, oldest first.
    pub(crate) received: Vec<CompletedRecord>,
}

/// A sealed batch of an [`ArchiveState`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SealedState {
    pub(crate) batch: u64,
    /// Its binary v2 bytes, as stored (a corrupted batch stays corrupted).
    pub(crate) bytes: Vec<u8>,
    pub(crate) count: u64,
    pub(crate) tier: Tier,
    /// When a summary batch expires, in wall-clock ms since the epoch: time spent
    /// stopped counts towards its TTL.
    pub(crate) expires_at_ms: Option<u64>,
}

impl ArchiveState {
    /// Records archived, over every shard.
    pub fn archived_count(&self) -> u64 {
        self.shards
            .iter()
            .flat_map(|s| &s.archived)
            .map(|&(a, b)| b - a + 1)
            .sum()
    }

    /// Records received from the inboxes and not archived yet.
    pub fn received_count(&self) -> u64 {
        self.shards.iter().map(|s| s.received.len() as u64).sum()
    }

    /// The statistics saved with the archive.
    pub fn stats(&self) -> &StatsState {
        &self.stats
    }
}
