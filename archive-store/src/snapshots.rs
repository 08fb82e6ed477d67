//! When the archiver publishes statistics snapshots (seed 003): every few archive
//! batches, or after a while when anything was archived, off the archiving path.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tranche_stats::StatsStore;

use crate::model::ArchivePass;

/// When [`run`](crate::run) publishes a statistics snapshot
/// ([`StatsStore::publish_snapshot`]): after every `every` archive batches, or once
/// `interval` has passed since the last snapshot if anything was archived since. An
/// archive batch is a pass that archived at least one record (up to
/// [`Config::batch`](crate::Config::batch) inbox entries per shard), the seed's "every
/// 10 batches". Counting batches rather than time keeps snapshots fresh under load and
/// absent when idle (nothing archived, nothing published); the interval bounds how stale
/// the latest snapshot gets at a trickle.
///
/// Each archiver process counts its own batches, so with several archivers snapshots
/// come more often; each is complete and versions only move forward. However fast
/// batches go by, snapshots are at least `min_gap` apart: a snapshot reads and renders
/// every statistic (the ranges grow with the ID space), and at tens of thousands of
/// partitions a second ten batches pass in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotPolicy {
    /// Archive batches between snapshots (the seed's `SNAPSHOT_REFRESH_INTERVAL`, 10);
    /// 0 counts as 1.
    pub every: u32,
    /// The longest a snapshot lags an archived record, give or take one idle wait of
    /// the archiver ([`Config::block`](crate::Config::block)).
    pub interval: Duration,
    /// The shortest time between two snapshots of one archiver.
    pub min_gap: Duration,
}

impl Default for SnapshotPolicy {
    fn default() -> Self {
        Self {
            every: 10,
            interval: Duration::from_secs(60),
            min_gap: Duration::from_secs(5),
        }
    }
}

/// Where [`run`](crate::run) publishes statistics snapshots, and when.
#[derive(Clone)]
pub struct Snapshots {
    /// The statistics the archiver counts into (the same namespace).
    pub stats: Arc<dyn StatsStore>,
    /// When to publish.
    pub policy: SnapshotPolicy,
}

impl std::fmt::Debug for Snapshots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshots")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

/// Counts archive batches and time since the last snapshot.
#[derive(Debug)]
struct Schedule {
    policy: SnapshotPolicy,
    /// Archive batches since the last snapshot started.
    batches: u32,
    /// When the last snapshot started (or the schedule, before the first).
    last: Instant,
    /// Snapshots started so far: the first is not held back by `min_gap`.
    snapshots: u64,
}

impl Schedule {
    fn new(policy: SnapshotPolicy, now: Instant) -> Self {
        Self {
            policy,
            batches: 0,
            last: now,
            snapshots: 0,
        }
    }

    /// Notes a pass: one that archived anything is an archive batch.
    fn note(&mut self, pass: &ArchivePass) {
        if pass.archived > 0 {
            self.batches = self.batches.saturating_add(1);
        }
    }

    /// Whether a snapshot is due at `now`.
    fn due(&self, now: Instant) -> bool {
        let since = now.duration_since(self.last);
        if self.batches == 0 || (self.snapshots > 0 && since < self.policy.min_gap) {
            return false;
        }
        self.batches >= self.policy.every.max(1) || since >= self.policy.interval
    }

    /// A snapshot started at `now`: it covers every batch noted so far.
    fn started(&mut self, now: Instant) {
        self.batches = 0;
        self.last = now;
        self.snapshots += 1;
    }
}

/// Publishes snapshots for the archiver loop on a task of their own, so a snapshot
/// (which reads every statistic, ranges included) never holds up archiving. At most one
/// is in flight: while one runs, a due snapshot waits for it and then covers both.
pub(crate) struct Publisher {
    stats: Arc<dyn StatsStore>,
    schedule: Schedule,
    running: Option<JoinHandle<()>>,
}

impl Publisher {
    pub(crate) fn new(snapshots: Snapshots) -> Self {
        Self {
            stats: snapshots.stats,
            schedule: Schedule::new(snapshots.policy, Instant::now()),
            running: None,
        }
    }

    /// Notes a pass, and starts a snapshot if one is due and none is running.
    pub(crate) fn after(&mut self, pass: &ArchivePass) {
        self.schedule.note(pass);
        let now = Instant::now();
        if !self.schedule.due(now) || self.running.as_ref().is_some_and(|r| !r.is_finished()) {
            return;
        }
        self.schedule.started(now);
        let stats = Arc::clone(&self.stats);
        self.running = Some(tokio::spawn(async move {
            match stats.publish_snapshot().await {
                Ok(version) => tracing::debug!(version, "published a statistics snapshot"),
                Err(err) => tracing::warn!(%err, "statistics snapshot failed"),
            }
        }));
    }

    /// Waits for the snapshot in flight, if any (a publish is a bounded read and one
    /// script call, so the loop's owner sees it land before `run` returns).
    pub(crate) async fn finish(self) {
        if let Some(running) = self.running {
            let _ = running.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pass(archived: usize) -> ArchivePass {
        ArchivePass {
            entries: archived.max(1),
            archived,
            ..ArchivePass::default()
        }
    }

    fn schedule(every: u32, interval_s: u64) -> (Schedule, Instant) {
        let t0 = Instant::now();
        let policy = SnapshotPolicy {
            every,
            interval: Duration::from_secs(interval_s),
            min_gap: Duration::ZERO,
        };
        (Schedule::new(policy, t0), t0)
    }

    #[test]
    fn due_after_every_n_archive_batches() {
        let (mut s, t0) = schedule(3, 3600);
        for n in 1..=2 {
            s.note(&pass(100));
            assert!(!s.due(t0), "after {n} batches");
        }
        // Passes that archived nothing (duplicates, empty inboxes) are no batches.
        s.note(&pass(0));
        s.note(&ArchivePass::default());
        assert!(!s.due(t0));
        s.note(&pass(1));
        assert!(s.due(t0));
        s.started(t0);
        assert!(!s.due(t0));
    }

    #[test]
    fn due_after_the_interval_only_when_something_was_archived() {
        let (mut s, t0) = schedule(10, 60);
        let later = t0 + Duration::from_secs(61);
        assert!(!s.due(later), "nothing archived, nothing published");
        s.note(&pass(5));
        assert!(!s.due(t0 + Duration::from_secs(59)));
        assert!(s.due(later));
        s.started(later);
        assert!(!s.due(later + Duration::from_secs(120)));
    }

    #[test]
    fn snapshots_are_at_least_min_gap_apart() {
        let t0 = Instant::now();
        let mut s = Schedule::new(
            SnapshotPolicy {
                every: 2,
                interval: Duration::from_secs(60),
                min_gap: Duration::from_secs(5),
            },
            t0,
        );
        s.note(&pass(1));
        s.note(&pass(1));
        assert!(s.due(t0), "the first snapshot is not held back");
        s.started(t0);
        for _ in 0..100 {
            s.note(&pass(1000));
        }
        assert!(!s.due(t0 + Duration::from_millis(4999)));
        assert!(s.due(t0 + Duration::from_secs(5)));
    }

    #[test]
    fn every_zero_means_every_batch() {
        let (mut s, t0) = schedule(0, 3600);
        assert!(!s.due(t0));
        s.note(&pass(1));
        assert!(s.due(t0));
    }
}
