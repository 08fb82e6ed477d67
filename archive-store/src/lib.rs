//! The archive layer of tranche: completed partitions, drained from the active store's
//! inboxes into tiers, for ever queryable.
//!
//! [`Archiver`] drains (and [`run`] loops it, publishing statistics snapshots as a
//! [`SnapshotPolicy`] says); [`ArchiveQuery`] reads ([`Lookup`] says
//! what is known of a pid); [`Compaction`] seals open batches and moves older records
//! to the current [`Tier`]; [`Export`] and [`Import`] write and restore a [`Dump`].
//! [`RedisArchive`] is the real implementation and [`MemoryArchive`] the embedded one;
//! one behaviour suite runs against both.
//!
//! The design choice a reader might get wrong: **the archive keeps its own bitmap of
//! archived pids** (`{ns:s}:archived`), distinct from the active store's completed index.
//! The index says "completed"; the archived bit says "stored and counted". Every archive
//! batch is one Lua script that checks the archived bits first and writes nothing if any
//! is set, so the caller can drop those records and recompute the statistics delta:
//! a record delivered twice (a retried completion, an archiver that died before
//! acknowledging its entries and was taken over) is stored and counted exactly once.
//! A set index bit with a clear archived bit answers [`Lookup::Archiving`].
//!
//! Tiers follow the archived count, read once per pass, so a threshold is crossed
//! between passes and never stops the archiver. Compressed batches take records in any
//! order into a small hash (`…:completed:batch:N:open`, a listpack: no `APPEND`
//! over-allocation) and are sealed into codec's binary v2 once they hold every planned
//! pid of the batch; sealing replaces the hash only if it is unchanged. An open batch
//! answers [`Tier::Compressed`] even in the summary tier (it has no expiry until it is
//! sealed). Once all [`SEGMENT_BATCHES`] batches of a segment are sealed whole, they are
//! joined into one segment string (`…:completed:seg:K`): a Redis key costs about as
//! much as a sealed batch of 100 records, so the archive keeps one key per thousand
//! pids, not per hundred; a joined segment expires when its last batch would have.
//! How batches and segments are encoded follows the namespace's [`ArchiveFormat`]
//! (`{ns}:meta` `archive_format`), which only [`RedisArchive::raise_format`] raises:
//! every reader reads every format, so a rolling upgrade raises it last.
//! The worker
//! dictionary (`{ns}:dict`) grows by compare-and-set, so every archiver agrees on it.
//! A batch that fails to decode answers [`Lookup::Undecodable`] and counts in
//! `{ns}:meta` `decode_failures`; an expired summary batch answers [`Lookup::Expired`]:
//! in both cases the statistics layer answers instead.
//!
//! Archive a completion and read it back, on the embedded backend (its inbox is a
//! channel the active store's completions arrive on; on Redis, a stream):
//!
//! ```
//! use std::sync::Arc;
//! use tranche_archive_store::{ArchiveQuery, Archiver, Config, Lookup, MemoryArchive, Tier};
//! use tranche_codec::CompletedRecord;
//! use tranche_stats::{MemoryStats, StatsStore};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let (inbox, received) = crossbeam_channel::unbounded();
//! let stats = Arc::new(MemoryStats::new());
//! let archive = MemoryArchive::new(Config::default(), vec![received], stats.clone())?;
//! let record = CompletedRecord {
//!     pid: 7,
//!     min_id: 6001,
//!     max_id: 7000,
//!     worker: Arc::from("worker-1"),
//!     completed_at_ms: 1_719_234_405_000,
//!     duration_ms: 295,
//! };
//! inbox.send(record.clone()).unwrap();
//! archive.archive_once().await?;
//! assert_eq!(
//!     archive.get(7).await?,
//!     Lookup::Archived { record, tier: Tier::Simple }
//! );
//! // Counted once by the statistics layer.
//! assert_eq!(stats.summary().await.unwrap().global_stats.total_completed, 1);
//! # Ok::<(), tranche_archive_store::Error>(())
//! # }).unwrap();
//! ```

mod dump;
mod error;
mod memory;
mod model;
mod redis_store;
mod segment;
mod snapshots;
mod state;
mod store;

pub use dump::{Dump, DumpBatch};
pub use error::{Error, Result};
pub use memory::MemoryArchive;
pub use model::{
    ARCHIVE_DAMAGED, ArchiveDamage, ArchiveFormat, ArchivePass, Config, DeadLetter, Lookup,
    RangePage, Redrive, STATS_DAMAGED, Stall, Tier,
};
pub use redis_store::RedisArchive;
#[cfg(feature = "testing")]
pub use redis_store::scripts;
pub use segment::SEGMENT_BATCHES;
pub use snapshots::{SnapshotPolicy, Snapshots};
pub use state::{ARCHIVE_STATE_VERSION, ArchiveState};
pub use store::{ArchiveQuery, Archiver, Compaction, Export, Import, run};
pub use tranche_stats::{Damage, Repaired};
