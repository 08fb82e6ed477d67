//! The raw, mergeable statistics of one shard (or of several, merged), and the delta
//! type the archive builds from a batch of records.

use std::collections::BTreeMap;
use std::sync::Arc;

use tranche_codec::CompletedRecord;

use crate::hist::Histogram;

/// IDs per range of the range statistics.
pub const RANGE_SIZE: u64 = 100_000;

/// Count, summed IDs and summed milliseconds of some records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Counters {
    pub(crate) count: u64,
    /// Sums of `max_id - min_id + 1`: one record alone can hold 2^64 IDs, so u128.
    pub(crate) ids: u128,
    pub(crate) dur: u128,
}

impl Counters {
    fn add(&mut self, ids: u128, dur: u64) {
        self.count = self.count.saturating_add(1);
        self.ids += ids;
        self.dur += u128::from(dur);
    }

    fn merge(&mut self, other: &Counters) {
        self.count = self.count.saturating_add(other.count);
        self.ids += other.ids;
        self.dur += other.dur;
    }
}

/// A worker's counters and duration histogram.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct WorkerAgg {
    pub(crate) totals: Counters,
    pub(crate) hist: Histogram,
}

/// One 100,000-ID range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RangeAgg {
    pub(crate) count: u64,
    pub(crate) dur: u128,
    /// Least `min_id` and greatest `max_id` seen (the seed's `data_range`).
    pub(crate) min: u64,
    pub(crate) max: u64,
    /// Earliest and latest completion, in ms.
    pub(crate) first: u64,
    pub(crate) last: u64,
    pub(crate) workers: BTreeMap<Arc<str>, Counters>,
}

impl RangeAgg {
    fn merge(&mut self, o: &RangeAgg) {
        self.count = self.count.saturating_add(o.count);
        self.dur += o.dur;
        self.min = self.min.min(o.min);
        self.max = self.max.max(o.max);
        self.first = self.first.min(o.first);
        self.last = self.last.max(o.last);
        for (w, c) in &o.workers {
            self.workers.entry(w.clone()).or_default().merge(c);
        }
    }
}

/// Everything the statistics layer keeps, in mergeable form.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Aggregate {
    pub(crate) totals: Counters,
    /// Earliest and latest completion in ms; `None` while empty.
    pub(crate) first: Option<u64>,
    pub(crate) last: Option<u64>,
    /// When these statistics were last written, in ms (not a fact of the records).
    pub(crate) updated: Option<u64>,
    pub(crate) hist: Histogram,
    pub(crate) workers: BTreeMap<Arc<str>, WorkerAgg>,
    /// By range number `min_id / RANGE_SIZE`.
    pub(crate) ranges: BTreeMap<u64, RangeAgg>,
    /// Completions per UTC day (`YYYY-MM-DD`) and hour.
    pub(crate) hourly: BTreeMap<String, [u64; 24]>,
}

fn min_opt(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, y) => x.or(y),
    }
}

fn max_opt(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    a.max(b)
}

impl Aggregate {
    pub(crate) fn add(&mut self, r: &CompletedRecord) {
        let ids = u128::from(r.max_id.saturating_sub(r.min_id)) + 1;
        let t = r.completed_at_ms;
        self.totals.add(ids, r.duration_ms);
        self.first = min_opt(self.first, Some(t));
        self.last = max_opt(self.last, Some(t));
        self.hist.record(r.duration_ms);
        let w = self.workers.entry(r.worker.clone()).or_default();
        w.totals.add(ids, r.duration_ms);
        w.hist.record(r.duration_ms);
        let range = self
            .ranges
            .entry(r.min_id / RANGE_SIZE)
            .or_insert_with(|| RangeAgg {
                count: 0,
                dur: 0,
                min: r.min_id,
                max: r.max_id,
                first: t,
                last: t,
                workers: BTreeMap::new(),
            });
        range.merge(&RangeAgg {
            count: 1,
            dur: u128::from(r.duration_ms),
            min: r.min_id,
            max: r.max_id,
            first: t,
            last: t,
            workers: BTreeMap::new(),
        });
        range
            .workers
            .entry(r.worker.clone())
            .or_default()
            .add(ids, r.duration_ms);
        let (day, hour) = day_and_hour(t);
        self.hourly.entry(day).or_default()[hour] += 1;
    }

    pub(crate) fn merge(&mut self, o: &Aggregate) {
        self.merge_summary(o);
        for (r, range) in &o.ranges {
            match self.ranges.get_mut(r) {
                Some(mine) => mine.merge(range),
                None => {
                    self.ranges.insert(*r, range.clone());
                }
            }
        }
    }

    /// [`Aggregate::merge`] taking `o` by value: its ranges move rather than being
    /// copied (the whole of a read of one shard, or of the first shard read).
    pub(crate) fn absorb(&mut self, mut o: Aggregate) {
        if self.ranges.is_empty() {
            std::mem::swap(&mut self.ranges, &mut o.ranges);
        }
        self.merge_summary(&o);
        for (r, range) in std::mem::take(&mut o.ranges) {
            match self.ranges.entry(r) {
                std::collections::btree_map::Entry::Occupied(mut mine) => {
                    mine.get_mut().merge(&range);
                }
                std::collections::btree_map::Entry::Vacant(slot) => {
                    slot.insert(range);
                }
            }
        }
    }

    /// Merges everything but the ranges: what a summary needs, at a cost that grows
    /// with workers, histogram buckets and days only.
    pub(crate) fn merge_summary(&mut self, o: &Aggregate) {
        self.totals.merge(&o.totals);
        self.first = min_opt(self.first, o.first);
        self.last = max_opt(self.last, o.last);
        self.updated = max_opt(self.updated, o.updated);
        self.hist.merge(&o.hist);
        for (name, w) in &o.workers {
            let mine = self.workers.entry(name.clone()).or_default();
            mine.totals.merge(&w.totals);
            mine.hist.merge(&w.hist);
        }
        for (day, hours) in &o.hourly {
            let mine = self.hourly.entry(day.clone()).or_default();
            for (m, h) in mine.iter_mut().zip(hours) {
                *m = m.saturating_add(*h);
            }
        }
    }
}

/// The statistics of a batch of completed records of one shard, ready to be applied
/// to that shard in one step: on Redis as the arguments of [`APPLY_DELTA_LUA`]
/// (see [`delta_args`]), in memory with [`MemoryStats::apply`].
///
/// A delta is an aggregate, not a list: its size grows with the workers, ranges, hours
/// and histogram buckets the records touch, not with their number. Exactly-once is the
/// caller's job: add only records whose statistics were never applied.
///
/// [`APPLY_DELTA_LUA`]: crate::archive_protocol::APPLY_DELTA_LUA
/// [`delta_args`]: crate::archive_protocol::delta_args
/// [`MemoryStats::apply`]: crate::MemoryStats::apply
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatsDelta {
    pub(crate) agg: Aggregate,
}

impl StatsDelta {
    /// Adds one record.
    pub fn add(&mut self, record: &CompletedRecord) {
        self.agg.add(record);
    }

    /// The delta of `records`.
    pub fn from_records(records: &[CompletedRecord]) -> Self {
        let mut d = Self::default();
        for r in records {
            d.add(r);
        }
        d
    }

    /// Whether no record was added.
    pub fn is_empty(&self) -> bool {
        self.agg.totals.count == 0
    }

    /// How many records were added.
    pub fn len(&self) -> u64 {
        self.agg.totals.count
    }
}

impl crate::Stats {
    /// The statistics of every record added to `deltas`, merged: what
    /// [`Stats::from_records`](crate::Stats::from_records) gives for the same records,
    /// without holding them. `check` builds one delta per shard page by page, so its
    /// memory grows with workers, ranges and days, not with the archive.
    pub fn from_deltas<'a>(deltas: impl IntoIterator<Item = &'a StatsDelta>) -> Self {
        let mut agg = Aggregate::default();
        for d in deltas {
            agg.merge(&d.agg);
        }
        agg.updated = agg.last;
        agg.render()
    }
}

/// The UTC day (`YYYY-MM-DD`) and hour of `ms` since the Unix epoch.
pub(crate) fn day_and_hour(ms: u64) -> (String, usize) {
    let hours = ms / 3_600_000;
    let days = hours / 24;
    let (y, m, d) = civil_from_days(days);
    (format!("{y:04}-{m:02}-{d:02}"), (hours % 24) as usize)
}

/// Howard Hinnant's `civil_from_days`, for days since 1970-01-01 (non-negative).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record() -> impl Strategy<Value = CompletedRecord> {
        (
            any::<u64>(),
            0u64..5000,
            0usize..4,
            0u64..(1 << 45),
            any::<u64>(),
        )
            .prop_map(|(min_id, len, w, at, dur)| CompletedRecord {
                pid: min_id / 1000,
                min_id,
                max_id: min_id.saturating_add(len),
                worker: Arc::from(["a", "b", "c", "d"][w]),
                completed_at_ms: at,
                duration_ms: dur,
            })
    }

    proptest! {
        /// Shards merge on read: the order and grouping of deltas never matters.
        #[test]
        fn merging_deltas_equals_one_delta_of_everything(
            records in proptest::collection::vec(record(), 0..40),
            cut in 0usize..40,
        ) {
            let cut = cut.min(records.len());
            let mut merged = StatsDelta::from_records(&records[cut..]).agg;
            merged.merge(&StatsDelta::from_records(&records[..cut]).agg);
            prop_assert_eq!(&merged, &StatsDelta::from_records(&records).agg);
            // Taking the other side by value gives the same, whichever side is empty.
            let mut absorbed = StatsDelta::from_records(&records[cut..]).agg;
            absorbed.absorb(StatsDelta::from_records(&records[..cut]).agg);
            prop_assert_eq!(&absorbed, &merged);
            let mut summary = Aggregate::default();
            summary.merge_summary(&merged);
            prop_assert!(summary.ranges.is_empty());
            summary.ranges = merged.ranges.clone();
            prop_assert_eq!(summary, merged);
        }
    }

    #[test]
    fn days_and_hours_are_utc_calendar_dates() {
        assert_eq!(day_and_hour(0), ("1970-01-01".to_owned(), 0));
        assert_eq!(
            day_and_hour(1_719_234_405_000),
            ("2024-06-24".to_owned(), 13)
        );
        // 2024-02-29 23:59:59.999 and the next millisecond.
        assert_eq!(
            day_and_hour(1_709_251_199_999),
            ("2024-02-29".to_owned(), 23)
        );
        assert_eq!(
            day_and_hour(1_709_251_200_000),
            ("2024-03-01".to_owned(), 0)
        );
        assert_eq!(day_and_hour(951_868_800_000), ("2000-03-01".to_owned(), 0));
        assert_eq!(
            day_and_hour(4_102_444_800_000),
            ("2100-01-01".to_owned(), 0)
        );
        // The far future stays a date rather than overflowing.
        assert!(day_and_hour(u64::MAX).0.len() > 10);
    }
}
