//! The trait every statistics backend implements, and the snapshot types.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::{Damage, RangeStats, Repaired, Result, Stats, StatsDelta, StatsSummary};

/// How many snapshot versions are kept; publishing one more deletes the oldest.
pub const SNAPSHOTS_KEPT: u64 = 10;

/// Reading, repairing and snapshotting the statistics of one namespace.
///
/// Writing is not here: statistics change only through [`StatsDelta`]s applied in the
/// same atomic step as the archive write ([`APPLY_DELTA_LUA`] on Redis,
/// [`MemoryStats::apply`] in memory), so that each partition counts once.
///
/// [`APPLY_DELTA_LUA`]: crate::archive_protocol::APPLY_DELTA_LUA
/// [`MemoryStats::apply`]: crate::MemoryStats::apply
#[async_trait]
pub trait StatsStore: Send + Sync {
    /// Every statistic, merged across shards, the per-range statistics included: a
    /// read that grows with the ID space the completed partitions cover (thousands of
    /// ranges at a few hundred thousand partitions). For the figures asked for often,
    /// read [`StatsStore::summary`].
    async fn stats(&self) -> Result<Stats>;

    /// The global, per-worker and daily statistics, merged across shards: what
    /// [`StatsStore::stats`] answers without its `range_stats`, equal to its
    /// [`Stats::summary`] at the same instant. Never reads the per-range statistics, so
    /// it costs what the workers, their duration histograms and the days cost, whatever
    /// the number of partitions or ranges.
    async fn summary(&self) -> Result<StatsSummary>;

    /// The statistics of the 100,000-ID range holding row ID `id`, merged across
    /// shards; `None` if nothing completed there. The router's answer when a batch has
    /// expired or fails to decode.
    async fn range_summary(&self, id: u64) -> Result<Option<RangeStats>>;

    /// Overwrites shard `shard`'s statistics with `delta`, recomputed from every record
    /// the archive holds for that shard (`check --repair`). Atomic per shard.
    async fn replace(&self, shard: u32, delta: &StatsDelta) -> Result<()>;

    /// Every stored value of shard `shard`'s statistics that does not decode, each on
    /// its own (a read stops at the first with [`Error::Corrupt`]; this goes on). Reads
    /// the whole shard, the per-range values included: a `check`, not a poll.
    ///
    /// [`Error::Corrupt`]: crate::Error::Corrupt
    async fn damage(&self, shard: u32) -> Result<Vec<Damage>>;

    /// Repairs shard `shard` from `rebuilt`, the statistics of every archived record of
    /// the shard that could be read, `unreadable` being the count of those that could
    /// not (expired or undecodable batches): every damaged value is set aside in the
    /// quarantine, and the shard is replaced whole or only its damaged values rebuilt,
    /// by the rule in [`Repaired`]'s module docs (whole when nothing is unreadable or
    /// the worker palette is damaged). Atomic per shard; a shard without damage and
    /// with unreadable records is left alone.
    async fn repair(&self, shard: u32, rebuilt: &StatsDelta, unreadable: u64) -> Result<Repaired>;

    /// Publishes the current statistics as the next snapshot version and returns it.
    /// The last [`SNAPSHOTS_KEPT`] versions are kept.
    async fn publish_snapshot(&self) -> Result<u64>;

    /// The latest published snapshot, if any.
    async fn latest_snapshot(&self) -> Result<Option<Snapshot>>;

    /// Snapshot `version`, if published and still kept.
    async fn snapshot(&self, version: u64) -> Result<Option<Snapshot>>;
}

macro_rules! forward {
    ($($ty:ty),*) => {$(
        #[async_trait]
        impl<T: StatsStore + ?Sized> StatsStore for $ty {
            async fn stats(&self) -> Result<Stats> {
                (**self).stats().await
            }
            async fn summary(&self) -> Result<StatsSummary> {
                (**self).summary().await
            }
            async fn range_summary(&self, id: u64) -> Result<Option<RangeStats>> {
                (**self).range_summary(id).await
            }
            async fn replace(&self, shard: u32, delta: &StatsDelta) -> Result<()> {
                (**self).replace(shard, delta).await
            }
            async fn damage(&self, shard: u32) -> Result<Vec<Damage>> {
                (**self).damage(shard).await
            }
            async fn repair(
                &self,
                shard: u32,
                rebuilt: &StatsDelta,
                unreadable: u64,
            ) -> Result<Repaired> {
                (**self).repair(shard, rebuilt, unreadable).await
            }
            async fn publish_snapshot(&self) -> Result<u64> {
                (**self).publish_snapshot().await
            }
            async fn latest_snapshot(&self) -> Result<Option<Snapshot>> {
                (**self).latest_snapshot().await
            }
            async fn snapshot(&self, version: u64) -> Result<Option<Snapshot>> {
                (**self).snapshot(version).await
            }
        }
    )*};
}

forward!(std::sync::Arc<T>, Box<T>);

/// The most per-range entries a snapshot holds: the ranges completed most recently
/// (seed 003's snapshot keeps the top 100 hot paths). Every snapshot would otherwise
/// hold the whole per-range section (about 15 MB at five billion IDs, ten kept), and
/// the full statistics are one [`StatsStore::stats`] away.
pub const SNAPSHOT_RANGES: usize = 100;

/// Keeps the [`SNAPSHOT_RANGES`] ranges completed most recently, for a snapshot.
pub(crate) fn bound_snapshot_ranges(stats: &mut Stats) {
    let ranges = &mut stats.range_stats;
    if ranges.len() <= SNAPSHOT_RANGES {
        return;
    }
    let mut latest: Vec<(f64, String)> = ranges
        .iter()
        .map(|(label, r)| (r.completed_time_range.end, label.clone()))
        .collect();
    // Latest first; equal times by label, so every backend keeps the same ones.
    latest.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let keep: std::collections::BTreeSet<String> = latest
        .into_iter()
        .take(SNAPSHOT_RANGES)
        .map(|(_, label)| label)
        .collect();
    ranges.retain(|label, _| keep.contains(label));
}

/// A published snapshot (seed 003's `snapshot:v{n}`): every statistic, but of the
/// per-range ones only the [`SNAPSHOT_RANGES`] completed most recently.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Its version, from 1.
    pub version: u64,
    /// When it was published, in ms since the Unix epoch.
    pub timestamp_ms: u64,
    /// The statistics at that time (ranges bounded, see [`SNAPSHOT_RANGES`]).
    pub stats: Stats,
}

/// The snapshot metadata kept beside the latest version (seed 003's `snapshot:config`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotConfig {
    /// The latest version.
    pub version: u64,
    /// When it was published, in ms since the Unix epoch.
    pub timestamp_ms: u64,
    /// Completed partitions it counts.
    pub count: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_and_boxed_stores_are_stores() {
        fn store<S: StatsStore>(_: &S) {}
        let memory = std::sync::Arc::new(crate::MemoryStats::new());
        store(&memory);
        let boxed: Box<dyn StatsStore> = Box::new(crate::MemoryStats::new());
        store(&boxed);
    }
}
