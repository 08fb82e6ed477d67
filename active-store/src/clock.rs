//! Wall-clock time in milliseconds, behind a trait so tests can control it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of "now", in milliseconds since the Unix epoch.
///
/// Lease deadlines, backoff and worker liveness are all compared against this clock. With
/// several machines sharing one Redis, their clocks must agree to well within a lease
/// (NTP does); the store never mixes Redis server time with client time.
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
        system_now_ms()
    }
}

fn system_now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis() as u64
}

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
            anchor_ms: system_now_ms(),
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

/// A clock that moves only when told to: for tests against a real Redis, where lease
/// expiry must not depend on sleeping.
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
