//! The router itself: one question, asked of each layer in turn.

use std::ops::RangeInclusive;
use std::sync::Arc;

use futures_util::stream::{self, Stream, StreamExt};
use tranche_active_store::{ActiveSnapshot, ActiveStore};
use tranche_archive_store::{ArchiveQuery, Lookup};
use tranche_stats::StatsStore;

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
    /// A pid no plan has is [`PartitionView::Unknown`] at once (the plans are cached).
    /// Otherwise the active layer first (a planned pid not yet issued is active too:
    /// pending); then the archive, which answers with the record, "archiving"
    /// (completed, not yet stored), "expired" or "undecodable"; for the last two, the
    /// statistics layer's summary of the 100,000-ID range holding the pid's first ID.
    /// A planned pid that neither the active layer nor the archive holds was completed
    /// and is still in the archive inbox: [`PartitionView::Archiving`].
    pub async fn get(&self, pid: u64) -> Result<PartitionView> {
        // The plans are cached, so an unplanned pid costs no store a round trip (and
        // no store has to cope with pids beyond every plan).
        let Some(range) = self.plans.range_of(&*self.active, pid).await? else {
            return Ok(PartitionView::Unknown);
        };
        if let Some(partition) = self.active.get(pid).await? {
            return Ok(PartitionView::Active(partition));
        }
        let cause = match self.archive.get(pid).await? {
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

    /// The live active counts merged with the statistics of completed partitions, read
    /// at the same time. If the statistics layer fails, the active counts are still
    /// returned, with its error in [`MergedStats::completed`]; only an active-layer
    /// failure fails the call.
    pub async fn stats(&self) -> Result<MergedStats> {
        let (active, completed) =
            futures_util::future::join(self.active.counts(), self.stats.stats()).await;
        Ok(MergedStats {
            active: active?,
            completed,
        })
    }

    /// Batches the archive failed to decode since the namespace was created (each such
    /// read was answered from the statistics layer).
    pub async fn decode_failures(&self) -> Result<u64> {
        Ok(self.archive.decode_failures().await?)
    }
}
