//! The `--keep-below` controller: additive increase, multiplicative decrease.

use std::time::Duration;

/// Turns probe samples into a rate that keeps the probed metric under a target.
///
/// Under the target the rate grows by `increase` per sample; above it, it is multiplied
/// by `decrease`, at most once per `decrease_every` (the metric lags the rate, so a
/// second cut before the first shows would overshoot downwards). The rate stays within
/// `[floor, ceiling]`. Pure: no clock of its own, the caller passes the sample time.
#[derive(Debug, Clone, PartialEq)]
pub struct Aimd {
    /// Units per second added per sample under the target.
    pub increase: f64,
    /// The factor a sample above the target multiplies the rate by, in (0, 1).
    pub decrease: f64,
    /// The lowest rate it sets.
    pub floor: f64,
    /// The highest rate it sets (the `--max-rate` in force).
    pub ceiling: f64,
    /// The least time between two decreases.
    pub decrease_every: Duration,
    /// When the rate was last decreased (ms), so cuts are spaced.
    last_decrease_ms: Option<u64>,
}

impl Aimd {
    /// A controller between `floor` and `ceiling` with the defaults: an increase of a
    /// hundredth of the ceiling per sample, a decrease to 70 %, at most every 3 s.
    pub fn new(floor: f64, ceiling: f64) -> Self {
        let floor = floor.max(f64::MIN_POSITIVE);
        let ceiling = ceiling.max(floor);
        Self {
            increase: ceiling / 100.0,
            decrease: 0.7,
            floor,
            ceiling,
            decrease_every: Duration::from_secs(3),
            last_decrease_ms: None,
        }
    }

    /// The rate to use after a sample `value` taken at `now_ms` at rate `rate`.
    pub fn next(&mut self, rate: f64, value: f64, keep_below: f64, now_ms: u64) -> f64 {
        let rate = if rate.is_finite() { rate } else { self.ceiling };
        let next = if value > keep_below {
            let spaced = self.last_decrease_ms.is_none_or(|last| {
                now_ms.saturating_sub(last) >= self.decrease_every.as_millis() as u64
            });
            if spaced {
                self.last_decrease_ms = Some(now_ms);
                rate * self.decrease
            } else {
                rate
            }
        } else {
            rate + self.increase
        };
        next.clamp(self.floor, self.ceiling)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plant whose metric follows the rate with a lag (half the gap per second) and
    /// ±2 % noise: metric → 2 × target at the ceiling. After a minute of settling the
    /// metric must stay within 10 % of the target, and not be held far below it.
    #[test]
    fn a_lagging_noisy_plant_settles_under_the_target() {
        use rand::{Rng, SeedableRng};
        let target = 1_000.0;
        let ceiling = 10_000.0;
        let gain = 2.0 * target / ceiling;
        for seed in 0..20 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut aimd = Aimd::new(10.0, ceiling);
            let (mut rate, mut metric) = (ceiling, 0.0);
            let mut settled = Vec::new();
            for second in 0..600u64 {
                metric += 0.5 * (gain * rate - metric);
                let sample = metric * (1.0 + rng.random_range(-0.02..0.02));
                rate = aimd.next(rate, sample, target, second * 1000);
                if second >= 60 {
                    settled.push(sample);
                }
            }
            let worst = settled.iter().cloned().fold(0.0, f64::max);
            let mean = settled.iter().sum::<f64>() / settled.len() as f64;
            assert!(worst <= 1.1 * target, "seed {seed}: worst {worst}");
            assert!(mean >= 0.7 * target, "seed {seed}: mean {mean}");
        }
    }

    #[test]
    fn the_rate_stays_between_floor_and_ceiling() {
        let mut aimd = Aimd::new(5.0, 50.0);
        let mut rate = 50.0;
        for t in 0..100 {
            rate = aimd.next(rate, 1e9, 1.0, t * 10_000);
            assert!(rate >= 5.0);
        }
        assert_eq!(rate, 5.0);
        for t in 100..300 {
            rate = aimd.next(rate, 0.0, 1.0, t * 10_000);
        }
        assert_eq!(rate, 50.0);
    }

    #[test]
    fn decreases_are_spaced() {
        let mut aimd = Aimd::new(1.0, 100.0);
        assert_eq!(aimd.next(100.0, 2.0, 1.0, 0), 70.0);
        assert_eq!(aimd.next(70.0, 2.0, 1.0, 1_000), 70.0);
        assert_eq!(aimd.next(70.0, 2.0, 1.0, 3_000), 49.0);
    }
}
