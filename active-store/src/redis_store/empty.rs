//! Which shards a claim recently found without ready work, so that claiming does not
//! walk every shard on every call.
//!
//! A claim visits shards in the worker's order and moves on while it has fewer than it
//! asked for. Near the end of a job, or on a namespace with many shards and little
//! work, most of those visits find nothing: each is a script call, so the cost of an
//! idle claim would grow with the shard count. A shard found short is skipped for a
//! back-off that doubles while it stays empty; whatever this process does that puts
//! work back in a shard (a plan, a release, a reap, a retry) wakes it at once, and work
//! put there by another process is found when the back-off ends.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// The first back-off after a shard is found empty.
const FIRST: Duration = Duration::from_millis(50);
/// The longest back-off: work another process puts in a shard waits at most this long
/// (plus the caller's own polling) before this process claims it.
const LONGEST: Duration = Duration::from_secs(1);

/// Per shard: skipped until when (ms on the store's clock), and how many claims in a row
/// found it empty.
#[derive(Debug)]
pub(super) struct EmptyShards {
    until: Box<[AtomicU64]>,
    streak: Box<[AtomicU32]>,
}

impl EmptyShards {
    pub(super) fn new(shards: u32) -> Self {
        Self {
            until: (0..shards).map(|_| AtomicU64::new(0)).collect(),
            streak: (0..shards).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    /// Whether a claim at `now_ms` should pass `shard` by.
    pub(super) fn skip(&self, shard: u32, now_ms: u64) -> bool {
        self.until[shard as usize].load(Relaxed) > now_ms
    }

    /// A claim at `now_ms` got fewer partitions from `shard` than it asked for: nothing
    /// more is ready there now.
    pub(super) fn found_short(&self, shard: u32, now_ms: u64) {
        let streak = self.streak[shard as usize].fetch_add(1, Relaxed).min(16);
        let wait = FIRST.saturating_mul(1 << streak).min(LONGEST);
        self.until[shard as usize].store(now_ms + wait.as_millis() as u64, Relaxed);
    }

    /// `shard` may have work: the next claim visits it.
    pub(super) fn wake(&self, shard: u32) {
        self.streak[shard as usize].store(0, Relaxed);
        self.until[shard as usize].store(0, Relaxed);
    }

    /// Every shard may have work (a plan was added).
    pub(super) fn wake_all(&self) {
        for shard in 0..self.until.len() {
            self.wake(shard as u32);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn back_off_doubles_up_to_the_longest_and_a_wake_ends_it() {
        let e = EmptyShards::new(2);
        assert!(!e.skip(0, 0));
        e.found_short(0, 1000);
        assert!(e.skip(0, 1049) && !e.skip(0, 1050));
        assert!(!e.skip(1, 1000), "other shards are not affected");
        e.found_short(0, 2000);
        assert!(e.skip(0, 2099) && !e.skip(0, 2100));
        for _ in 0..40 {
            e.found_short(0, 10_000);
        }
        assert!(e.skip(0, 10_999) && !e.skip(0, 11_000));
        e.wake(0);
        assert!(!e.skip(0, 10_000));
        e.found_short(0, 20_000);
        assert!(!e.skip(0, 20_050), "a wake resets the streak");
        e.found_short(1, 0);
        e.wake_all();
        assert!(!e.skip(0, 20_000) && !e.skip(1, 0));
    }
}
