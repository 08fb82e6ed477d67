//! The statistics layer of tranche: global, per-worker, per-100,000-ID-range and hourly
//! statistics of completed partitions, with duration percentiles, versioned snapshots
//! and a consistency check.
//!
//! [`StatsStore`] is what readers hold (`Arc<dyn StatsStore>`): [`RedisStats`] is the
//! real implementation and [`MemoryStats`] the embedded one, with the same behaviour.
//! [`Stats`] is the seed's JSON shape, merged across shards; [`diff`] compares it with
//! [`Stats::from_records`] for `check`, and [`StatsStore::replace`] repairs a shard.
//!
//! Two reads, by cost: [`StatsStore::summary`] ([`StatsSummary`]: global, per worker
//! with percentiles, per day) grows only with the workers, their histogram buckets and
//! the days, and never reads the per-range statistics, so it is the one to poll;
//! [`StatsStore::stats`] adds every 100,000-ID range (thousands of them at a few
//! hundred thousand partitions) and is what snapshots and `check` use.
//! [`StatsStore::range_summary`] reads one range.
//!
//! The design choice a reader might get wrong: **this crate never updates statistics
//! by itself, and exactly-once is not its job.** The archiver aggregates a batch of one
//! shard's records into a [`StatsDelta`] and applies it in the *same atomic step* as
//! the archive write: on Redis by composing [`archive_protocol::APPLY_DELTA_LUA`]
//! with its own script and passing [`archive_protocol::stats_keys`] and
//! [`archive_protocol::delta_args`]; in memory by calling
//! [`MemoryStats::apply`] under its own lock. The archive's per-pid "archived" bit,
//! set in that same step, decides which records enter the delta, so a partition whose
//! completion or archiving is retried still counts once.
//!
//! Statistics are kept per shard (every key of a script in one cluster slot) and merged
//! on read. On Redis the per-range statistics, the bulk of them, are packed (64 ranges
//! to a hash field, workers as palette indexes, IDs and times as small offsets) so
//! that a range of a hundred partitions costs well under a byte per partition; only
//! the Lua fragment writes that format, and reading it back gives exact values. Percentiles come from a log-linear histogram whose buckets merge by
//! addition; a reported percentile is within [`PERCENTILE_RELATIVE_ERROR`] (1/64) of
//! the exact nearest-rank percentile, and exact below 64 ms.
//!
//! ```
//! use std::sync::Arc;
//! use tranche_codec::{CompletedRecord, KeySchema};
//! use tranche_stats::archive_protocol::{delta_args, stats_keys};
//! use tranche_stats::{MemoryStats, Stats, StatsDelta, StatsStore, diff};
//!
//! let records = vec![CompletedRecord {
//!     pid: 4970,
//!     min_id: 4_969_001,
//!     max_id: 4_970_000,
//!     worker: Arc::from("worker1"),
//!     completed_at_ms: 1_719_234_405_000,
//!     duration_ms: 295_000,
//! }];
//! // The archiver: one delta per batch of one shard's freshly archived records.
//! let delta = StatsDelta::from_records(&records);
//! let schema = KeySchema::new("elk", 1).unwrap();
//! let keys = stats_keys(&schema, 0); // KEYS for apply_stats, "{elk:0}:stats:global", ...
//! let args = delta_args(&delta, 1_719_234_500_000); // ARGV, starting with their count
//! assert_eq!(keys[0], "{elk:0}:stats:global");
//! assert_eq!(args[0], (args.len() - 1).to_string());
//!
//! // In memory the same delta goes to MemoryStats::apply.
//! let memory = MemoryStats::new();
//! memory.apply(0, &delta).unwrap();
//! let stats = Stats::from_records(&records);
//! assert_eq!(stats.global_stats.avg_duration, 295.0);
//! // What was applied is what the records say, and `diff` tells a difference.
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let applied = memory.stats().await.unwrap();
//! assert!(diff(&stats, &applied).is_empty());
//! let twice = Stats::from_records(&[records.clone(), records].concat());
//! assert!(!diff(&twice, &applied).is_empty());
//! # });
//! ```

mod aggregate;
mod damage;
mod diff;
mod error;
mod hist;
mod memory;
mod model;
mod packed;
mod redis_store;
mod state;
mod store;
#[cfg(feature = "testing")]
pub mod testing;

pub use aggregate::{RANGE_SIZE, StatsDelta};
pub use damage::{Damage, Repaired};
pub use diff::{Difference, diff};
pub use error::{Error, Result};
pub use hist::PERCENTILE_RELATIVE_ERROR;
pub use memory::MemoryStats;
pub use model::{
    DataRange, DayStats, GlobalStats, RangeStats, Stats, StatsSummary, TimeRange, WorkerShare,
    WorkerStats,
};
pub use redis_store::RedisStats;

/// The archive's side of the statistics: what `tranche-archive-store` needs to apply a
/// [`StatsDelta`] inside its own archive script, in the same atomic step as the archive
/// write. Not for anything else: a delta applied outside that step is counted twice.
pub mod archive_protocol {
    pub use crate::redis_store::{APPLY_DELTA_LUA, delta_args, stats_keys};
}
pub use state::{STATS_STATE_VERSION, StatsState};
pub use store::{SNAPSHOT_RANGES, SNAPSHOTS_KEPT, Snapshot, SnapshotConfig, StatsStore};
