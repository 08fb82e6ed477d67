//! Latency quantiles over recent behaviour only: what a worker reports as its
//! store-update latency (`health`'s `worker_update_p99_ms`), so that an outage that
//! made a few updates take seconds is forgotten once updates flow again, instead of
//! holding the p99 of the whole run (and with it the alert) high for good.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// How long one half of the window collects: quantiles cover the updates of the last
/// `RECENT_HALF` to twice that.
pub(crate) const RECENT_HALF: Duration = Duration::from_secs(10);

/// Two histograms that take turns: `current` collects from `since`; once it is
/// [`RECENT_HALF`] old it becomes `previous` and a fresh one starts. Quantiles read both.
#[derive(Debug)]
pub(crate) struct RecentLatency {
    current: Histogram<u64>,
    previous: Histogram<u64>,
    since: Instant,
}

fn empty() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 2).expect("valid bounds")
}

impl RecentLatency {
    /// An empty window starting at `now`.
    pub(crate) fn new(now: Instant) -> Self {
        Self {
            current: empty(),
            previous: empty(),
            since: now,
        }
    }

    /// Drops what is older than the window as of `now`.
    fn turn(&mut self, now: Instant) {
        let age = now.saturating_duration_since(self.since);
        if age < RECENT_HALF {
            return;
        }
        if age >= RECENT_HALF * 2 {
            self.previous.reset();
        } else {
            std::mem::swap(&mut self.previous, &mut self.current);
        }
        self.current.reset();
        // Turns stay on the grid that started at `since`.
        let halves = (age.as_nanos() / RECENT_HALF.as_nanos()) as u32;
        self.since += RECENT_HALF * halves;
    }

    /// Records one update that took `us` microseconds and ended at `now`.
    pub(crate) fn record(&mut self, us: u64, now: Instant) {
        self.turn(now);
        self.current.saturating_record(us.clamp(1, 3_600_000_000));
    }

    /// The values at `quantiles` (in µs) over the updates of the window as of `now`;
    /// 0 when none.
    pub(crate) fn quantiles<const N: usize>(
        &mut self,
        quantiles: [f64; N],
        now: Instant,
    ) -> [u64; N] {
        self.turn(now);
        let mut both = self.previous.clone();
        // Same bounds: adding cannot fail.
        let _ = both.add(&self.current);
        quantiles.map(|q| both.value_at_quantile(q))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn an_outage_is_forgotten_once_updates_flow_again() {
        let t0 = Instant::now();
        let mut w = RecentLatency::new(t0);
        // Steady 2 ms updates, then five that waited out a 15 s outage, ending at 20 s.
        for i in 0..200 {
            w.record(2_000, t0 + S * i / 10);
        }
        for _ in 0..5 {
            w.record(15_000_000, t0 + S * 20);
        }
        let [p99] = w.quantiles([0.99], t0 + S * 20);
        assert!(
            p99 >= 14_000_000,
            "the outage shows while it is recent: {p99}"
        );
        // Updates flow again at 2 ms; within two halves the outage is gone.
        let mut t = t0 + S * 20;
        while t < t0 + S * 20 + RECENT_HALF * 2 {
            t += S / 10;
            w.record(2_000, t);
        }
        let [p50, p99] = w.quantiles([0.5, 0.99], t);
        assert!((1_900..=2_100).contains(&p99), "{p99}");
        assert!((1_900..=2_100).contains(&p50), "{p50}");
    }

    #[test]
    fn the_window_keeps_the_last_half_and_forgets_silence() {
        let t0 = Instant::now();
        let mut w = RecentLatency::new(t0);
        w.record(9_000, t0 + S);
        // One half later the old half still counts ...
        w.record(1_000, t0 + RECENT_HALF + S);
        let [max] = w.quantiles([1.0], t0 + RECENT_HALF + S);
        assert!(max >= 8_900, "{max}");
        // ... two halves later it does not.
        let [max] = w.quantiles([1.0], t0 + RECENT_HALF * 2 + S);
        assert!((900..=1_100).contains(&max), "{max}");
        // Nothing recorded for long: nothing to report.
        let [max] = w.quantiles([1.0], t0 + RECENT_HALF * 10);
        assert_eq!(max, 0);
    }
}
