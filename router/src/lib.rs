//! The query router of tranche: one answer for any partition, whichever layer holds it.
//!
//! [`Router`] holds the three layers as trait objects (`Arc<dyn ActiveStore>`,
//! `Arc<dyn ArchiveQuery>`, `Arc<dyn StatsStore>`) and takes their answers in a fixed
//! order (the seed's "查询路由优化"), once the cached plans say the pid exists at all.
//! The active and the archive read are sent together, so a `get` costs one round trip
//! whatever the tier:
//!
//! 1. the **active layer**: pending (issued or not), claimed, running or failed;
//! 2. the **archive**: its bitmap, then the simple hash or the batch, decoded (one round
//!    trip on Redis); a completed pid not yet stored is "completed, archiving";
//! 3. the **statistics layer**, only when the archive says the pid's batch expired (the
//!    summary tier's TTL) or does not decode: the summary of the pid's 100,000-ID range
//!    stands in for the record ([`PartitionView::Summarised`]).
//!
//! The design choice a reader might get wrong: **[`PartitionView::Unknown`] means "no
//! plan has this pid", never "not found in any store".** A planned pid leaves the active
//! layer only by being completed, and reaches the archive only when an archiver has
//! drained it from the inbox; in between, neither store holds it. The router therefore
//! answers [`PartitionView::Archiving`] for a planned pid that neither the active layer
//! nor the archive holds, whether or not the archive backend can see the completed index
//! itself (Redis can; the memory archive knows the pids it has received). The price is
//! that a partition an operator discarded (`Maintenance::discard`) also reads as
//! archiving.
//!
//! The plans are cached: they are append-only, so a cached entry never goes stale and
//! only a miss re-reads them (in the same round trip as the layers' reads).
//! [`Router::stats`] merges the live active counts with the summary of the completed
//! statistics (the seed's "统计合并策略": global, per worker, per day) and, if the
//! statistics layer fails, still answers with the active counts and the error beside
//! them. It leaves out the per-100,000-ID range statistics, whose number grows with the
//! ID space (thousands at a few hundred thousand partitions), so that the figures asked
//! for often cost the same at any size; [`Router::stats_with_ranges`] adds them.
//!
//! ```
//! use std::sync::Arc;
//! use tranche_active_store::{Config, Leases, MemoryActiveStore, Plan, Planner};
//! use tranche_archive_store::{Archiver, MemoryArchive};
//! use tranche_router::{PartitionView, Router};
//! use tranche_stats::MemoryStats;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let active = Arc::new(MemoryActiveStore::new(Config::default())?);
//! active.plan(&Plan::Uniform { min: 1, max: 10_000, size: 1000 }).await?;
//! let stats = Arc::new(MemoryStats::new());
//! let inboxes = vec![active.inbox(0).unwrap()];
//! let archive = Arc::new(MemoryArchive::new(Default::default(), inboxes, stats.clone())?);
//! let router = Router::new(active.clone(), archive.clone(), stats);
//!
//! let lease = active.claim("w1", 1).await?.remove(0);
//! active.complete(&lease, 295_000).await?;
//! // Completed, still in the inbox: neither store holds it, and it is not unknown.
//! assert!(matches!(router.get(lease.pid).await?, PartitionView::Archiving { .. }));
//!
//! archive.archive_once().await?;
//! let located = router.locate(lease.max_id).await?.expect("planned");
//! assert_eq!(located.pid, lease.pid);
//! assert!(matches!(located.view, PartitionView::Archived { .. }));
//!
//! let merged = router.stats().await?;
//! assert_eq!((merged.completed_count(), merged.total()), (Some(1), 10));
//! assert!(merged.ranges.is_none(), "the summary only");
//! let full = router.stats_with_ranges().await?;
//! assert_eq!(full.ranges.map(|r| r.len()), Some(1));
//! # Ok(())
//! # }
//! ```

mod error;
mod model;
mod plans;
mod router;

pub use error::{Error, Result};
pub use model::{Fallback, Located, MergedStats, PartitionView};
pub use router::{DEFAULT_RANGE_CONCURRENCY, Router};
