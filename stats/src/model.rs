//! The statistics as read: the seed's JSON shape, merged across shards.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tranche_codec::CompletedRecord;

use crate::aggregate::{Aggregate, Counters, RANGE_SIZE, RangeAgg};
use crate::hist::Histogram;

/// Every statistic of a namespace's completed partitions, in the seed's JSON shape.
///
/// Units: counts and IDs are integers; durations (`avg_duration`, `total_duration`,
/// `p50`, ...) are seconds with millisecond precision, and times (`last_updated`,
/// `completed_time_range`) are seconds since the Unix epoch with millisecond precision,
/// as the seed's whole-second numbers extended by a fraction.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Totals over every completed partition.
    pub global_stats: GlobalStats,
    /// By worker id.
    pub worker_stats: BTreeMap<String, WorkerStats>,
    /// By 100,000-ID range, keyed `"{start}_{end}"` (end exclusive, as the seed's
    /// `"4900000_5000000"`), the range of a partition being that of its `min_id`.
    pub range_stats: BTreeMap<String, RangeStats>,
    /// By UTC day `YYYY-MM-DD`.
    pub time_series_stats: BTreeMap<String, DayStats>,
}

/// The statistics that stay small however many partitions completed: [`Stats`] without
/// its per-range part, in the same JSON shape (`global_stats`, `worker_stats`,
/// `time_series_stats`).
///
/// Its size grows with the workers and the days, never with the ID space, and
/// [`StatsStore::summary`](crate::StatsStore::summary) reads it without touching the
/// per-range statistics, so it is the read to make often (a dashboard, `status`,
/// `Router::stats`). The full [`Stats`] is [`StatsStore::stats`](crate::StatsStore::stats).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StatsSummary {
    /// Totals over every completed partition.
    pub global_stats: GlobalStats,
    /// By worker id.
    pub worker_stats: BTreeMap<String, WorkerStats>,
    /// By UTC day `YYYY-MM-DD`.
    pub time_series_stats: BTreeMap<String, DayStats>,
}

/// Totals over every completed partition.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GlobalStats {
    /// Completed partitions.
    pub total_completed: u64,
    /// Row IDs they covered (`max_id - min_id + 1` summed; saturates at `u64::MAX`).
    pub total_processed_data: u64,
    /// Mean duration, seconds.
    pub avg_duration: f64,
    /// When the statistics were last written, seconds since the epoch (0 if never).
    pub last_updated: f64,
    /// Median duration, seconds (see [`PERCENTILE_RELATIVE_ERROR`](crate::PERCENTILE_RELATIVE_ERROR)).
    pub p50: f64,
    /// 95th percentile duration, seconds.
    pub p95: f64,
    /// 99th percentile duration, seconds.
    pub p99: f64,
}

/// One worker's completions.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerStats {
    /// Partitions it completed.
    pub completed_count: u64,
    /// Mean duration, seconds.
    pub avg_duration: f64,
    /// Row IDs it covered.
    pub total_data: u64,
    /// Median duration, seconds.
    pub p50: f64,
    /// 95th percentile duration, seconds.
    pub p95: f64,
    /// 99th percentile duration, seconds.
    pub p99: f64,
}

/// One 100,000-ID range: what the router answers with when a batch expired or fails
/// to decode.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RangeStats {
    /// Partitions completed whose `min_id` lies in the range.
    pub completed_count: u64,
    /// The workers that completed them, sorted.
    pub workers: Vec<String>,
    /// Mean duration, seconds.
    pub avg_duration: f64,
    /// Least `min_id` and greatest `max_id` of those partitions.
    pub data_range: DataRange,
    /// Earliest and latest completion.
    pub completed_time_range: TimeRange,
    /// Summed duration, seconds.
    pub total_duration: f64,
    /// By worker.
    pub worker_distribution: BTreeMap<String, WorkerShare>,
}

/// Row ID bounds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataRange {
    /// Least row ID.
    pub min: u64,
    /// Greatest row ID.
    pub max: u64,
}

/// Completion time bounds, seconds since the epoch.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TimeRange {
    /// Earliest.
    pub start: f64,
    /// Latest.
    pub end: f64,
}

/// One worker's part of a range.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerShare {
    /// Partitions.
    pub count: u64,
    /// Mean duration, seconds.
    pub avg_duration: f64,
    /// Row IDs.
    pub data_processed: u64,
}

/// One UTC day.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DayStats {
    /// Completions per hour, 00 to 23 UTC.
    pub hourly_completion: [u64; 24],
}

impl Stats {
    /// The statistics of `records`, computed from scratch (what `check` compares the
    /// kept statistics with). `last_updated` is the last completion here; [`diff`]
    /// ignores it.
    ///
    /// [`diff`]: crate::diff
    pub fn from_records<'a>(records: impl IntoIterator<Item = &'a CompletedRecord>) -> Self {
        let mut agg = Aggregate::default();
        for r in records {
            agg.add(r);
        }
        agg.updated = agg.last;
        agg.render()
    }

    /// Everything but the per-range statistics (a copy).
    pub fn summary(&self) -> StatsSummary {
        StatsSummary {
            global_stats: self.global_stats.clone(),
            worker_stats: self.worker_stats.clone(),
            time_series_stats: self.time_series_stats.clone(),
        }
    }

    /// The summary and the per-range statistics, apart.
    pub fn into_parts(self) -> (StatsSummary, BTreeMap<String, RangeStats>) {
        let summary = StatsSummary {
            global_stats: self.global_stats,
            worker_stats: self.worker_stats,
            time_series_stats: self.time_series_stats,
        };
        (summary, self.range_stats)
    }

    /// A summary and per-range statistics together again.
    pub fn from_parts(summary: StatsSummary, range_stats: BTreeMap<String, RangeStats>) -> Self {
        Self {
            global_stats: summary.global_stats,
            worker_stats: summary.worker_stats,
            range_stats,
            time_series_stats: summary.time_series_stats,
        }
    }
}

fn secs(ms: u128) -> f64 {
    ms as f64 / 1000.0
}

/// Mean milliseconds, rounded to the nearest millisecond, as seconds.
fn avg(sum: u128, count: u64) -> f64 {
    if count == 0 {
        return 0.0;
    }
    let c = u128::from(count);
    secs((sum + c / 2) / c)
}

fn sat(x: u128) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

fn pct(h: &Histogram, num: u64) -> f64 {
    h.percentile(num, 100)
        .map_or(0.0, |ms| secs(u128::from(ms)))
}

/// `"{start}_{end}"` of range `r`.
pub(crate) fn range_key(r: u64) -> String {
    let start = u128::from(r) * u128::from(RANGE_SIZE);
    format!("{start}_{}", start + u128::from(RANGE_SIZE))
}

pub(crate) fn render_range(range: &RangeAgg) -> RangeStats {
    let share = |c: &Counters| WorkerShare {
        count: c.count,
        avg_duration: avg(c.dur, c.count),
        data_processed: sat(c.ids),
    };
    RangeStats {
        completed_count: range.count,
        workers: range.workers.keys().map(|w| w.to_string()).collect(),
        avg_duration: avg(range.dur, range.count),
        data_range: DataRange {
            min: range.min,
            max: range.max,
        },
        completed_time_range: TimeRange {
            start: secs(u128::from(range.first)),
            end: secs(u128::from(range.last)),
        },
        total_duration: secs(range.dur),
        worker_distribution: range
            .workers
            .iter()
            .map(|(w, c)| (w.to_string(), share(c)))
            .collect(),
    }
}

impl Aggregate {
    /// Everything, ranges included.
    pub(crate) fn render(&self) -> Stats {
        let ranges = self
            .ranges
            .iter()
            .map(|(&r, range)| (range_key(r), render_range(range)))
            .collect();
        Stats::from_parts(self.render_summary(), ranges)
    }

    /// Everything but the ranges (which it never looks at, so they may be absent).
    pub(crate) fn render_summary(&self) -> StatsSummary {
        let t = &self.totals;
        StatsSummary {
            global_stats: GlobalStats {
                total_completed: t.count,
                total_processed_data: sat(t.ids),
                avg_duration: avg(t.dur, t.count),
                last_updated: secs(u128::from(self.updated.unwrap_or(0))),
                p50: pct(&self.hist, 50),
                p95: pct(&self.hist, 95),
                p99: pct(&self.hist, 99),
            },
            worker_stats: self
                .workers
                .iter()
                .map(|(name, w)| {
                    let c = &w.totals;
                    let stats = WorkerStats {
                        completed_count: c.count,
                        avg_duration: avg(c.dur, c.count),
                        total_data: sat(c.ids),
                        p50: pct(&w.hist, 50),
                        p95: pct(&w.hist, 95),
                        p99: pct(&w.hist, 99),
                    };
                    (name.to_string(), stats)
                })
                .collect(),
            time_series_stats: self
                .hourly
                .iter()
                .map(|(day, hours)| {
                    (
                        day.clone(),
                        DayStats {
                            hourly_completion: *hours,
                        },
                    )
                })
                .collect(),
        }
    }
}
