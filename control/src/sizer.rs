//! Chunks sized by time: `--chunk-time 2s --chunk-min 100 --chunk-max 100000`.

use std::time::Duration;

/// Chooses each partition's next chunk size so chunks take about `target`.
///
/// It keeps a smoothed throughput (IDs per second, an exponential moving average of the
/// chunks observed), proposes `throughput × target`, moves at most by a factor of
/// [`ChunkSizer::MAX_STEP`] per observation (one slow chunk does not collapse the size)
/// and stays within `[min, max]`. Pure: the caller measures durations.
#[derive(Debug, Clone, PartialEq)]
pub struct ChunkSizer {
    target: Duration,
    min: u64,
    max: u64,
    /// The size in force.
    size: u64,
    /// Smoothed IDs per second, `None` before the first observation.
    throughput: Option<f64>,
}

impl ChunkSizer {
    /// The largest factor one observation changes the size by.
    pub const MAX_STEP: f64 = 2.0;
    /// The weight of the newest observation in the smoothed throughput.
    pub const SMOOTHING: f64 = 0.3;

    /// A sizer aiming at `target`, starting at `initial`, within `[min, max]` (`min` is
    /// raised to 1 and `max` to `min`).
    pub fn new(target: Duration, min: u64, max: u64, initial: u64) -> Self {
        let min = min.max(1);
        let max = max.max(min);
        Self {
            target,
            min,
            max,
            size: initial.clamp(min, max),
            throughput: None,
        }
    }

    /// The size of the next chunk.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Takes in that a chunk of `ids` IDs took `took`, and returns the next size.
    pub fn observe(&mut self, ids: u64, took: Duration) -> u64 {
        if ids == 0 {
            return self.size;
        }
        let seconds = took.as_secs_f64().max(1e-6);
        let sample = ids as f64 / seconds;
        let smoothed = match self.throughput {
            None => sample,
            Some(t) => t + Self::SMOOTHING * (sample - t),
        };
        self.throughput = Some(smoothed);
        let wanted = smoothed * self.target.as_secs_f64();
        let current = self.size as f64;
        let stepped = wanted.clamp(current / Self::MAX_STEP, current * Self::MAX_STEP);
        self.size = (stepped.round() as u64).clamp(self.min, self.max);
        self.size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker doing 1000 IDs/s plus 50 ms per chunk, aiming at 2 s chunks: the size
    /// converges to about 1950 and chunks to within 5 % of 2 s.
    #[test]
    fn the_size_converges_to_the_target_duration() {
        let mut sizer = ChunkSizer::new(Duration::from_secs(2), 10, 1_000_000, 100);
        let took = |ids: u64| Duration::from_secs_f64(0.05 + ids as f64 / 1000.0);
        for _ in 0..40 {
            let size = sizer.size();
            sizer.observe(size, took(size));
        }
        let last = took(sizer.size()).as_secs_f64();
        assert!(
            (last - 2.0).abs() < 0.1,
            "chunk takes {last}s at size {}",
            sizer.size()
        );
    }

    #[test]
    fn steps_are_bounded_and_the_size_stays_in_range() {
        let mut sizer = ChunkSizer::new(Duration::from_secs(1), 50, 400, 100);
        assert_eq!(sizer.observe(100, Duration::from_millis(1)), 200);
        assert_eq!(sizer.observe(200, Duration::from_millis(1)), 400);
        assert_eq!(sizer.observe(400, Duration::from_millis(1)), 400);
        let mut slow = ChunkSizer::new(Duration::from_secs(1), 50, 400, 400);
        assert_eq!(slow.observe(400, Duration::from_secs(100)), 200);
        assert_eq!(slow.observe(200, Duration::from_secs(100)), 100);
        assert_eq!(slow.observe(100, Duration::from_secs(100)), 50);
        assert_eq!(slow.observe(50, Duration::from_secs(100)), 50);
        assert_eq!(slow.observe(0, Duration::ZERO), 50);
    }
}
