//! Time for the active store: codec's [`Clock`] (the one every store takes), and
//! [`TokioClock`], which follows tokio's clock so that tests of the embedded backend
//! can pause and advance time.

pub use tranche_codec::{Clock, ManualClock, SystemClock};

/// Wall-clock time that follows tokio's clock: anchored to the system time when created,
/// then advanced by `tokio::time::Instant`, so `tokio::time::pause()` and `advance()`
/// move it in tests.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    anchor_ms: u64,
    anchor: tokio::time::Instant,
}

impl TokioClock {
    /// A clock reading the system time now and following tokio's clock from here on.
    pub fn new() -> Self {
        Self {
            anchor_ms: SystemClock.now_ms(),
            anchor: tokio::time::Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now_ms(&self) -> u64 {
        self.anchor_ms + self.anchor.elapsed().as_millis() as u64
    }
}
