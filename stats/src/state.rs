//! The saved form of [`MemoryStats`](crate::MemoryStats): everything it holds, as plain
//! serde data, so an embedded run can write it to its state file and resume.
//!
//! The statistics cannot always be recomputed from the archive (summary-tier batches
//! expire), so they are saved as they are: per shard, in the mergeable raw form, with
//! the published snapshots beside them.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::aggregate::{Aggregate, Counters, RangeAgg, WorkerAgg};
use crate::hist::{BUCKETS, Histogram};
use crate::store::{Snapshot, SnapshotConfig};
use crate::{Error, Result};

/// The version of [`StatsState`] this build writes and reads.
pub const STATS_STATE_VERSION: u32 = 1;

/// Everything a [`MemoryStats`](crate::MemoryStats) holds: take it with
/// [`MemoryStats::state`](crate::MemoryStats::state), restore it with
/// [`MemoryStats::restore`](crate::MemoryStats::restore).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatsState {
    /// [`STATS_STATE_VERSION`] when written; restoring another version is refused.
    pub version: u32,
    /// Each shard's statistics, by shard number.
    pub(crate) shards: Vec<(u32, AggState)>,
    /// The last snapshot version handed out.
    pub(crate) next_snapshot: u64,
    /// The published snapshots still kept.
    pub(crate) snapshots: Vec<Snapshot>,
    /// The latest snapshot's metadata.
    pub(crate) snapshot_config: Option<SnapshotConfig>,
}

impl StatsState {
    /// How many partitions the saved statistics count, over every shard.
    pub fn total_completed(&self) -> u64 {
        self.shards.iter().map(|(_, a)| a.totals.0).sum()
    }
}

/// Count, summed IDs and summed milliseconds: [`Counters`] as a tuple.
type CountersState = (u64, u128, u128);

/// A histogram's non-empty buckets as `(bucket, count)`.
type HistState = Vec<(u32, u64)>;

/// One shard's [`Aggregate`], field for field; histograms as `(bucket, count)` lists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct AggState {
    totals: CountersState,
    first: Option<u64>,
    last: Option<u64>,
    updated: Option<u64>,
    hist: HistState,
    /// Worker id, counters, histogram.
    workers: Vec<(String, CountersState, HistState)>,
    ranges: Vec<(u64, RangeState)>,
    hourly: Vec<(String, [u64; 24])>,
}

/// One range's [`RangeAgg`], field for field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct RangeState {
    count: u64,
    dur: u128,
    min: u64,
    max: u64,
    first: u64,
    last: u64,
    workers: Vec<(String, CountersState)>,
}

fn counters_state(c: &Counters) -> CountersState {
    (c.count, c.ids, c.dur)
}

fn counters(c: CountersState) -> Counters {
    Counters {
        count: c.0,
        ids: c.1,
        dur: c.2,
    }
}

fn hist_state(h: &Histogram) -> Vec<(u32, u64)> {
    h.counts.iter().map(|(&b, &n)| (b, n)).collect()
}

fn hist(buckets: Vec<(u32, u64)>) -> Result<Histogram> {
    if let Some(&(b, _)) = buckets.iter().find(|(b, _)| *b >= BUCKETS) {
        return Err(Error::Corrupt {
            key: "stats state".into(),
            detail: format!("histogram bucket {b} out of range"),
        });
    }
    Ok(Histogram {
        counts: buckets.into_iter().filter(|&(_, n)| n > 0).collect(),
    })
}

/// Interns worker ids, so the restored statistics share one `Arc` per worker as the
/// live ones do.
#[derive(Default)]
struct Names(BTreeMap<String, Arc<str>>);

impl Names {
    fn get(&mut self, name: String) -> Arc<str> {
        self.0
            .entry(name)
            .or_insert_with_key(|k| Arc::from(k.as_str()))
            .clone()
    }
}

impl AggState {
    pub(crate) fn from_agg(a: &Aggregate) -> Self {
        Self {
            totals: counters_state(&a.totals),
            first: a.first,
            last: a.last,
            updated: a.updated,
            hist: hist_state(&a.hist),
            workers: a
                .workers
                .iter()
                .map(|(w, agg)| {
                    (
                        w.to_string(),
                        counters_state(&agg.totals),
                        hist_state(&agg.hist),
                    )
                })
                .collect(),
            ranges: a
                .ranges
                .iter()
                .map(|(&r, range)| {
                    (
                        r,
                        RangeState {
                            count: range.count,
                            dur: range.dur,
                            min: range.min,
                            max: range.max,
                            first: range.first,
                            last: range.last,
                            workers: range
                                .workers
                                .iter()
                                .map(|(w, c)| (w.to_string(), counters_state(c)))
                                .collect(),
                        },
                    )
                })
                .collect(),
            hourly: a.hourly.iter().map(|(d, h)| (d.clone(), *h)).collect(),
        }
    }

    pub(crate) fn into_agg(self) -> Result<Aggregate> {
        let mut names = Names::default();
        let mut workers = BTreeMap::new();
        for (w, totals, h) in self.workers {
            let agg = WorkerAgg {
                totals: counters(totals),
                hist: hist(h)?,
            };
            workers.insert(names.get(w), agg);
        }
        let ranges = self
            .ranges
            .into_iter()
            .map(|(r, s)| {
                let workers = s
                    .workers
                    .into_iter()
                    .map(|(w, c)| (names.get(w), counters(c)))
                    .collect();
                let range = RangeAgg {
                    count: s.count,
                    dur: s.dur,
                    min: s.min,
                    max: s.max,
                    first: s.first,
                    last: s.last,
                    workers,
                };
                (r, range)
            })
            .collect();
        Ok(Aggregate {
            totals: counters(self.totals),
            first: self.first,
            last: self.last,
            updated: self.updated,
            hist: hist(self.hist)?,
            workers,
            ranges,
            hourly: self.hourly.into_iter().collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use tranche_codec::CompletedRecord;

    use super::*;
    use crate::{MemoryStats, StatsDelta, StatsStore};

    fn record(pid: u64) -> CompletedRecord {
        CompletedRecord {
            pid,
            min_id: (pid - 1) * 1000 + 1,
            max_id: pid * 1000,
            worker: Arc::from(format!("worker{}", pid % 3)),
            completed_at_ms: 1_719_234_405_000 + pid * 3_600_017,
            duration_ms: 1 + pid * 977 % 100_000,
        }
    }

    fn apply(stats: &MemoryStats, pids: std::ops::Range<u64>) {
        for pid in pids {
            stats.apply_at(
                (pid % 3) as u32,
                &StatsDelta::from_records(&[record(pid)]),
                pid,
            );
        }
    }

    /// Every read of the statistics, to compare two stores by.
    async fn answers(s: &MemoryStats) -> Vec<String> {
        let mut out = vec![
            format!("{:?}", s.stats().await.unwrap()),
            format!("{:?}", s.latest_snapshot().await.unwrap()),
            format!("{:?}", s.snapshot_config()),
        ];
        for v in 0..15 {
            out.push(format!("{:?}", s.snapshot(v).await.unwrap()));
        }
        for id in (0..=500_000).step_by(50_000) {
            out.push(format!("{:?}", s.range_summary(id).await.unwrap()));
        }
        out
    }

    #[tokio::test]
    async fn a_restored_store_answers_and_continues_as_the_original() {
        let live = MemoryStats::new();
        apply(&live, 1..200);
        for _ in 0..12 {
            live.publish_snapshot().await.unwrap();
        }
        apply(&live, 200..400);
        let state = live.state();
        assert_eq!(state.total_completed(), 399);
        // Through text and back, as a state file would carry it.
        let json = serde_json::to_string(&state).unwrap();
        let back: StatsState = serde_json::from_str(&json).unwrap();
        assert_eq!(back, state);
        let restored = MemoryStats::restore(back).unwrap();
        assert_eq!(answers(&restored).await, answers(&live).await);
        assert_eq!(restored.state(), state);
        // Both go on the same way: the same deltas, the same next snapshot version.
        apply(&live, 400..450);
        apply(&restored, 400..450);
        assert_eq!(live.publish_snapshot().await.unwrap(), 13);
        assert_eq!(restored.publish_snapshot().await.unwrap(), 13);
        let (a, b) = (answers(&live).await, answers(&restored).await);
        // Snapshot 13's timestamps may differ by the time between the two publishes:
        // compare the statistics, snapshots 0 to 12 and the range summaries.
        assert_eq!(a[0], b[0]);
        assert_eq!(a[3..16], b[3..16]);
        assert_eq!(a[18..], b[18..]);
    }

    #[test]
    fn a_bad_state_is_refused() {
        let live = MemoryStats::new();
        apply(&live, 1..10);
        let state = live.state();
        let other = StatsState {
            version: STATS_STATE_VERSION + 1,
            ..state.clone()
        };
        assert!(matches!(
            MemoryStats::restore(other),
            Err(Error::Corrupt { detail, .. }) if detail.contains("version 2")
        ));
        let mut bad = state.clone();
        bad.shards[0].1.hist.push((BUCKETS, 1));
        assert!(MemoryStats::restore(bad).is_err());
        let mut twice = state.clone();
        twice.shards.push(twice.shards[0].clone());
        assert!(MemoryStats::restore(twice).is_err());
        let mut future = state;
        future.next_snapshot = 0;
        future.snapshots.push(crate::Snapshot {
            version: 3,
            timestamp_ms: 0,
            stats: crate::Stats::default(),
        });
        assert!(MemoryStats::restore(future).is_err());
    }
}
