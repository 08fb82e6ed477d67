//! The router itself: one question, asked of each layer in turn.

use std::ops::RangeInclusive;
use std::sync::Arc;

use futures_util::stream::{self, Stream, StreamExt};
use tranche_active_store::{ActiveSnapshot, ActiveStore};
use tranche_archive_store::{ArchiveQuery, Lookup};
use tranche_stats::{Stats, StatsStore};

use crate::Result;
use crate::model::{Fallback, Located, MergedStats, PartitionView};
use crate::plans::PlanCache;

/// How many pids [`Router::range`] resolves at once, unless told otherwise.
pub const DEFAULT_RANGE_CONCURRENCY: usize = 32;

/// Answers for partitions across the active, archive and statistics layers.
///
/// Holds each layer as a trait object, the way tower's `Steer` holds boxed services, so
/// the same router serves the Redis and the memory backends, or a mix.
pub struct Router {
    active: Arc<dyn ActiveStore>,
    archive: Arc<dyn ArchiveQuery>,
    stats: Arc<dyn StatsStore>,
    /// The plan registry, for pid ranges and `locate`; cached because plans are
    /// append-only, refreshed on a miss.
    plans: PlanCache,
    /// How many pids a range stream resolves at once: its memory bound.
    concurrency: usize,
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router")
            .field("concurrency", &self.concurrency)
            .finish_non_exhaustive()
    }
}

impl Router {
    /// A router over the three layers of one namespace.
    pub fn new(
        active: Arc<dyn ActiveStore>,
        archive: Arc<dyn ArchiveQuery>,
        stats: Arc<dyn StatsStore>,
    ) -> Self {
        Self {
            active,
            archive,
            stats,
            plans: PlanCache::default(),
            concurrency: DEFAULT_RANGE_CONCURRENCY,
        }
    }

    /// Sets how many pids [`Router::range`] resolves at once (at least 1).
    pub fn with_range_concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency.max(1);
        self
    }

    /// What is known of `pid`.
    ///
    /// A pid no plan has is [`PartitionView::Unknown`]. Otherwise the active layer's
    /// answer wins (a planned pid not yet issued is active too: pending); failing that,
    /// the archive's: the record, "archiving" (completed, not yet stored), "expired" or
    /// "undecodable"; for the last two, the statistics layer's summary of the 100,000-ID
    /// range holding the pid's first ID. A planned pid that neither the active layer
    /// nor the archive holds was completed and is still in the archive inbox:
    /// [`PartitionView::Archiving`].
    ///
    /// **One round trip**, whatever the tier: the active read and the archive read are
    /// issued together, active first, and pipelined on the shared connection (and on a
    /// cold plan cache, the plan read with them). Only the statistics fallback, for an
    /// expired or undecodable batch, costs a second one. The price is an archive read
    /// that an active pid did not need; see the source for why the combined answer is
    /// always one that was true at some instant during the call.
    pub async fn get(&self, pid: u64) -> Result<PartitionView> {
        // Why reading both layers at once gives a legal answer. A pid moves one way:
        // active (unissued, pending, claimed, running, failed) -> completed, which the
        // active store's `complete` does atomically: the record leaves the active set in
        // the same step that sets its completed-index bit -> archived, when an archiver
        // stores it (and, in the summary tier, later expired). Plans never overlap, so a
        // pid never comes back. Say the active read runs at instant A and the archive
        // read at instant B, each atomic on its own.
        //
        // - The active read found the pid: it was active at A. Whatever the archive read
        //   says is ignored (it cannot have seen the pid archived before A anyway).
        // - It did not: the pid was completed before A. The active read is queued first
        //   on one multiplexed connection, and Redis runs the commands of one client in
        //   order (one shard's keys share a hash slot, so in a cluster they also run on
        //   one node), so B comes after A and the archive sees the completed-index bit
        //   or the stored record: "archiving", archived, expired or undecodable, each
        //   true at B.
        // - Should B ever run before A (a backend that reorders requests), the archive
        //   may still say "unknown" for a pid completed in between. The router answers
        //   "archiving" for every planned pid that neither layer holds, and that was
        //   true at the instant of completion, which lies between B and A. So even then
        //   the answer is one that was true during the call; it is never "unknown".
        //
        // This is the same argument as for the sequential reads it replaces; only the
        // latency changed (one round trip instead of two).
        let (range, active, archive) = match self.plans.cached_range(pid) {
            Some(range) => {
                let (active, archive) =
                    futures_util::future::join(self.active.get(pid), self.archive.get(pid)).await;
                (range, active, archive)
            }
            None => {
                // A cold cache, a plan added since it was read, or an unplanned pid: read
                // the plans in the same round trip as the two layers, and discard the
                // layers' answers (errors included) if no plan has the pid.
                let (range, active, archive) = futures_util::future::join3(
                    self.plans.refresh_range(&*self.active, pid),
                    self.active.get(pid),
                    self.archive.get(pid),
                )
                .await;
                let Some(range) = range? else {
                    return Ok(PartitionView::Unknown);
                };
                (range, active, archive)
            }
        };
        if let Some(partition) = active? {
            return Ok(PartitionView::Active(partition));
        }
        let cause = match archive? {
            Lookup::Archived { record, tier } => {
                return Ok(PartitionView::Archived { record, tier });
            }
            Lookup::Expired => Fallback::Expired,
            Lookup::Undecodable { detail } => Fallback::Undecodable { detail },
            // Archiving, Unknown (a backend that cannot see the completed index), and
            // any answer a newer archive adds: the active layer let go of a planned pid,
            // so it was completed and waits in the inbox.
            _ => return Ok(PartitionView::Archiving { pid, range }),
        };
        let summary = self.stats.range_summary(*range.start()).await?;
        Ok(PartitionView::Summarised {
            pid,
            range,
            cause,
            summary,
        })
    }

    /// The partition covering row ID `id` and what happened to it; `None` if no plan
    /// covers `id`. Plans are cached (they are append-only), so this costs what
    /// [`Router::get`] costs, plus one read of the plans when `id` is new to the cache.
    pub async fn locate(&self, id: u64) -> Result<Option<Located>> {
        let Some((pid, range)) = self.plans.locate(&*self.active, id).await? else {
            return Ok(None);
        };
        let view = self.get(pid).await?;
        Ok(Some(Located {
            id,
            pid,
            range,
            view,
        }))
    }

    /// Every materialised active partition, and the unissued plan runs (the active
    /// layer's answer, unchanged).
    pub async fn all_active(&self) -> Result<ActiveSnapshot> {
        Ok(self.active.all_active().await?)
    }

    /// What is known of each pid of `pids`, in pid order, each exactly once.
    ///
    /// Memory stays bounded whatever the range: pids are resolved as the stream is
    /// polled, at most [`with_range_concurrency`](Router::with_range_concurrency) at a
    /// time (each is a [`Router::get`]). A failed pid yields its error and the stream
    /// goes on.
    pub fn range(
        &self,
        pids: RangeInclusive<u64>,
    ) -> impl Stream<Item = Result<PartitionView>> + Send + '_ {
        stream::iter(pids)
            .map(move |pid| self.get(pid))
            .buffered(self.concurrency)
    }

    /// The live active counts merged with the summary of the completed partitions'
    /// statistics (global, per worker with percentiles, per day), read at the same
    /// time. The per-range statistics are left out: their size grows with the ID
    /// space, the summary's only with the workers and days, so this stays cheap for a
    /// dashboard to poll at any size; [`Router::stats_with_ranges`] adds them. If the
    /// statistics layer fails, the active counts are still returned, with its error in
    /// [`MergedStats::completed`]; only an active-layer failure fails the call.
    pub async fn stats(&self) -> Result<MergedStats> {
        let (active, completed) =
            futures_util::future::join(self.active.counts(), self.stats.summary()).await;
        Ok(MergedStats {
            active: active?,
            completed,
            ranges: None,
        })
    }

    /// [`Router::stats`] with every 100,000-ID range's statistics too
    /// ([`MergedStats::ranges`]), read in the same step as the summary, so the two
    /// agree. Costs what the ranges cost: thousands of them at a few hundred thousand
    /// partitions. A statistics-layer failure leaves both `completed` (with the error)
    /// and `ranges` (`None`) empty.
    pub async fn stats_with_ranges(&self) -> Result<MergedStats> {
        let (active, full) =
            futures_util::future::join(self.active.counts(), self.stats.stats()).await;
        let (completed, ranges) = match full.map(Stats::into_parts) {
            Ok((summary, ranges)) => (Ok(summary), Some(ranges)),
            Err(e) => (Err(e), None),
        };
        Ok(MergedStats {
            active: active?,
            completed,
            ranges,
        })
    }

    /// Batches the archive failed to decode since the namespace was created (each such
    /// read was answered from the statistics layer).
    pub async fn decode_failures(&self) -> Result<u64> {
        Ok(self.archive.decode_failures().await?)
    }
}
