//! Wall-clock time in milliseconds, behind a trait so tests can control it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of "now", in milliseconds since the Unix epoch: the one every store takes.
///
/// Lease deadlines, backoff, worker liveness, completion and statistics stamps and
/// snapshot times are all read from a clock. With several machines sharing one Redis,
/// their clocks must agree to well within a lease (NTP does); a store never mixes Redis
/// server time with client time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now_ms(&self) -> u64 {
        (**self).now_ms()
    }
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// A clock that moves only when told to: for tests against a real Redis, where expiry
/// and time stamps must not depend on sleeping.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    /// A clock standing at `now_ms`.
    pub fn new(now_ms: u64) -> Self {
        Self(AtomicU64::new(now_ms))
    }

    /// Moves the clock forward by `ms`.
    pub fn advance(&self, ms: u64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }

    /// Sets the clock to `now_ms`.
    pub fn set(&self, now_ms: u64) {
        self.0.store(now_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told() {
        let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(5));
        assert_eq!(clock.now_ms(), 5);
        let manual = ManualClock::new(10);
        manual.advance(7);
        assert_eq!(manual.now_ms(), 17);
        manual.set(3);
        assert_eq!(manual.now_ms(), 3);
    }

    #[test]
    fn the_system_clock_is_past_2024() {
        assert!(SystemClock.now_ms() > 1_704_067_200_000);
    }
}
