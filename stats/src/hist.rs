//! A mergeable log-linear histogram of durations in milliseconds.
//!
//! Values below 64 ms have a bucket each (exact). Above, every power of two is cut into
//! 32 equal sub-buckets, so a bucket `[low, low + width)` has `low >= 32 * width`.
//! Reporting a bucket's midpoint is therefore within `width / 2 <= low / 64` of any value
//! in it: a relative error of at most 1/64 (about 1.6 %). Buckets are plain integers, so
//! histograms of different shards merge by adding counts, on Redis (`HINCRBY`) as in
//! memory. The bucket function runs only in Rust; Lua just adds the counts.

use std::collections::BTreeMap;

/// The largest relative error of a reported percentile against the exact nearest-rank
/// percentile of the same data: 1/64 (about 1.6 %), and none below 64 ms.
pub const PERCENTILE_RELATIVE_ERROR: f64 = 1.0 / 64.0;

/// Values with a bucket of their own.
const EXACT: u64 = 64;
/// log2 of the sub-buckets per power of two.
const SUB_BITS: u32 = 5;
/// How many buckets there are: 64 exact ones, then 32 for each exponent 6..=63.
pub(crate) const BUCKETS: u32 = 64 + 58 * 32;

/// The bucket of `v` milliseconds.
pub(crate) fn bucket_of(v: u64) -> u32 {
    if v < EXACT {
        return v as u32;
    }
    let e = 63 - v.leading_zeros();
    let sub = ((v >> (e - SUB_BITS)) & 31) as u32;
    64 + (e - 6) * 32 + sub
}

/// The smallest and largest value of bucket `b` (`b < BUCKETS`).
pub(crate) fn bucket_bounds(b: u32) -> (u64, u64) {
    if b < 64 {
        return (u64::from(b), u64::from(b));
    }
    let e = (b - 64) / 32 + 6;
    let sub = u64::from((b - 64) % 32);
    let shift = e - SUB_BITS;
    let low = (32 + sub) << shift;
    (low, low + ((1u64 << shift) - 1))
}

/// The value reported for bucket `b`: its midpoint.
pub(crate) fn bucket_value(b: u32) -> u64 {
    let (low, high) = bucket_bounds(b);
    low + (high - low) / 2
}

/// Counts per bucket; empty buckets are absent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Histogram {
    pub(crate) counts: BTreeMap<u32, u64>,
}

impl Histogram {
    /// Counts one value.
    pub(crate) fn record(&mut self, v: u64) {
        self.add_bucket(bucket_of(v), 1);
    }

    /// Adds `n` to bucket `b`.
    pub(crate) fn add_bucket(&mut self, b: u32, n: u64) {
        let c = self.counts.entry(b).or_default();
        *c = c.saturating_add(n);
    }

    /// Adds every count of `other`.
    pub(crate) fn merge(&mut self, other: &Histogram) {
        for (&b, &n) in &other.counts {
            self.add_bucket(b, n);
        }
    }

    /// The nearest-rank percentile `num / den` (the smallest value with at least
    /// `ceil(total * num / den)` values at or below it), as its bucket's midpoint;
    /// `None` when empty.
    pub(crate) fn percentile(&self, num: u64, den: u64) -> Option<u64> {
        let total: u128 = self.counts.values().map(|&n| u128::from(n)).sum();
        if total == 0 {
            return None;
        }
        let rank = (total * u128::from(num)).div_ceil(u128::from(den)).max(1);
        let mut seen = 0u128;
        for (&b, &n) in &self.counts {
            seen += u128::from(n);
            if seen >= rank {
                return Some(bucket_value(b));
            }
        }
        self.counts.keys().next_back().map(|&b| bucket_value(b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn buckets_tile_the_whole_range() {
        let mut next = 0u64;
        for b in 0..BUCKETS {
            let (low, high) = bucket_bounds(b);
            assert_eq!(low, next, "bucket {b}");
            assert!(high >= low);
            assert_eq!(bucket_of(low), b);
            assert_eq!(bucket_of(high), b);
            next = high.wrapping_add(1);
        }
        assert_eq!(next, 0, "the last bucket ends at u64::MAX");
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
    }

    proptest! {
        #[test]
        fn a_bucket_midpoint_is_within_the_bound(v in any::<u64>()) {
            let b = bucket_of(v);
            let (low, high) = bucket_bounds(b);
            prop_assert!(low <= v && v <= high);
            let mid = bucket_value(b);
            let err = (mid as f64 - v as f64).abs() / (v.max(1) as f64);
            prop_assert!(err <= PERCENTILE_RELATIVE_ERROR, "v {v} mid {mid} err {err}");
            if v < EXACT {
                prop_assert_eq!(mid, v);
            }
        }
    }

    fn exact(sorted: &[u64], num: u64, den: u64) -> u64 {
        let rank = (sorted.len() as u64 * num).div_ceil(den).max(1);
        sorted[rank as usize - 1]
    }

    #[test]
    fn percentiles_match_exact_ones_within_the_bound() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for round in 0..200 {
            let n = rng.random_range(1..2000);
            let scale = [100u64, 10_000, 1_000_000, u64::MAX / 4][round % 4];
            let mut values: Vec<u64> = (0..n).map(|_| rng.random_range(0..scale)).collect();
            let mut h = Histogram::default();
            for &v in &values {
                h.record(v);
            }
            values.sort_unstable();
            for (num, den) in [(50, 100), (95, 100), (99, 100), (1, 1)] {
                let want = exact(&values, num, den);
                let got = h.percentile(num, den).unwrap();
                let err = (got as f64 - want as f64).abs() / (want.max(1) as f64);
                assert!(
                    err <= PERCENTILE_RELATIVE_ERROR,
                    "p{num}/{den}: exact {want}, got {got}, error {err}"
                );
            }
        }
    }

    #[test]
    fn merging_equals_recording_everything_in_one() {
        let (mut a, mut b, mut all) = (
            Histogram::default(),
            Histogram::default(),
            Histogram::default(),
        );
        for v in 0..5000u64 {
            let v = v * v;
            if v % 3 == 0 {
                a.record(v)
            } else {
                b.record(v)
            }
            all.record(v);
        }
        a.merge(&b);
        assert_eq!(a, all);
        assert_eq!(Histogram::default().percentile(50, 100), None);
    }
}
