//! The answers the router gives.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;

use tranche_active_store::StatusCounts;
use tranche_archive_store::Tier;
use tranche_codec::{CompletedRecord, Partition};
use tranche_stats::{RangeStats, Stats, StatsSummary};

/// Everything known about one pid, from whichever layer holds it.
#[derive(Debug, Clone, PartialEq)]
pub enum PartitionView {
    /// Not finished: pending (issued or not), claimed, running or failed.
    Active(Partition),
    /// Completed and archived: the record exactly as completed.
    Archived {
        /// The record.
        record: CompletedRecord,
        /// The tier it was read from.
        tier: Tier,
    },
    /// Completed, and the archiver has not stored it yet (it is in the inbox).
    Archiving {
        /// The pid.
        pid: u64,
        /// The row IDs it covers, from its plan.
        range: RangeInclusive<u64>,
    },
    /// Completed and archived, but its batch expired or did not decode: the statistics
    /// of the 100,000-ID range holding its first ID stand in for the record.
    Summarised {
        /// The pid.
        pid: u64,
        /// The row IDs it covers, from its plan.
        range: RangeInclusive<u64>,
        /// Why the record itself could not be read.
        cause: Fallback,
        /// The range's statistics; `None` if the statistics layer has nothing for it
        /// (it was repaired or reset since).
        summary: Option<RangeStats>,
    },
    /// No plan covers the pid.
    Unknown,
}

impl PartitionView {
    /// Whether the partition is finished (archived, archiving or summarised).
    pub fn is_completed(&self) -> bool {
        matches!(
            self,
            PartitionView::Archived { .. }
                | PartitionView::Archiving { .. }
                | PartitionView::Summarised { .. }
        )
    }
}

/// Why a [`PartitionView::Summarised`] answer replaced the record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fallback {
    /// The batch was in the summary tier and its TTL ran out.
    Expired,
    /// The batch did not decode (the archive counted the failure).
    Undecodable {
        /// What was wrong, as the archive reported it.
        detail: String,
    },
}

/// The answer to [`Router::locate`](crate::Router::locate): the partition covering a row
/// ID, and what happened to it.
#[derive(Debug, Clone, PartialEq)]
pub struct Located {
    /// The row ID asked about.
    pub id: u64,
    /// The partition covering it.
    pub pid: u64,
    /// Every row ID of that partition.
    pub range: RangeInclusive<u64>,
    /// What is known of the partition (never [`PartitionView::Unknown`]).
    pub view: PartitionView,
}

/// The live picture: active counts merged with the completed statistics (the seed's
/// "统计合并策略").
///
/// From [`Router::stats`](crate::Router::stats), the statistics are the summary
/// (global, per worker with percentiles, per day): small and cheap whatever the number
/// of partitions, and `ranges` is `None`. From
/// [`Router::stats_with_ranges`](crate::Router::stats_with_ranges), the per-100,000-ID
/// range statistics come too, read in the same step as the summary.
#[derive(Debug)]
pub struct MergedStats {
    /// Partitions of the active layer by status, read now.
    pub active: StatusCounts,
    /// The statistics of completed (archived) partitions, or why the statistics layer
    /// could not give them; the active counts stand on their own either way.
    pub completed: Result<StatsSummary, tranche_stats::Error>,
    /// The per-range statistics (keyed `"{start}_{end}"` as [`Stats::range_stats`]),
    /// when they were asked for and the statistics layer answered; `None` otherwise.
    pub ranges: Option<BTreeMap<String, RangeStats>>,
}

impl MergedStats {
    /// The completed statistics in the seed's full shape ([`Stats`]), when the ranges
    /// were read (a copy); `None` without them or without the statistics layer.
    pub fn full_stats(&self) -> Option<Stats> {
        let summary = self.completed.as_ref().ok()?;
        let ranges = self.ranges.as_ref()?;
        Some(Stats::from_parts(summary.clone(), ranges.clone()))
    }

    /// Completed partitions the statistics layer counts, if it answered. Partitions
    /// still in the archive inbox are counted by neither side until archived.
    pub fn completed_count(&self) -> Option<u64> {
        self.completed
            .as_ref()
            .ok()
            .map(|s| s.global_stats.total_completed)
    }

    /// Every partition the job has, as far as known: outstanding, failed, discarded and
    /// completed (archived). Without the statistics layer, the active part alone.
    pub fn total(&self) -> u64 {
        self.active.outstanding()
            + self.active.failed
            + self.active.discarded
            + self.completed_count().unwrap_or(0)
    }

    /// The share of partitions completed, 0.0 to 1.0; `None` without the statistics
    /// layer or before anything is planned.
    pub fn completed_ratio(&self) -> Option<f64> {
        let done = self.completed_count()?;
        let total = self.total();
        (total > 0).then(|| done as f64 / total as f64)
    }
}
