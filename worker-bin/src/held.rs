//! The leases one `run` process holds, and the one task that heartbeats them all.
//!
//! A lease is renewed per process, not per partition: every `lease / 3` the heartbeat
//! task sends every lease in the book with its checkpoint in one
//! [`Leases::heartbeat_many`](tranche_active_store::Leases::heartbeat_many) call, one
//! script per shard on Redis however many partitions the process runs. Claimed leases
//! enter the book at once (prefetched ones too, so they are renewed while they wait for a
//! slot) and leave it when their partition reports its outcome. A lease the store
//! refuses is marked lost: its partition stops issuing chunks and drops its result.
//!
//! A lease the process cannot renew fences itself. Each hold knows the last instant
//! by which the store certainly still counted it ([`Hold::renewed`]: when the last
//! accepted renewal, or the claim, was *sent*, plus the lease), since the store's own
//! deadline was set later than that. A quarter of a lease before it, with no renewal
//! accepted in between (Redis unreachable, a slow network, a stalled process), the
//! partition stops as if the lease were lost and its running chunks are stopped,
//! killed outright before the deadline: by the time another worker's reaper can
//! reclaim the partition, nothing of this process runs it any more. No range is ever
//! processed by two live leases at once, whatever keeps the heartbeats from Redis.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tranche_active_store::{ActiveStore, Error as ActiveError, Lease};

use crate::work::{Shared, until};

/// What the heartbeat task and a partition share about one lease.
#[derive(Debug)]
pub(crate) struct Hold {
    /// Every ID below it is done: what the next heartbeat records.
    checkpoint: AtomicU64,
    /// Set once the store refused the lease.
    lost: AtomicBool,
    /// Set by the book's watchdog once the lease went unrenewed too long.
    fenced: AtomicBool,
    /// Wakes the partition when the lease is lost or fenced.
    notify: Notify,
    /// The lease's length, which every accepted renewal extends it by.
    lease: Duration,
    /// Until when the store certainly holds the lease for us: the send instant of the
    /// last accepted renewal (or of the claim) plus the lease. The store's deadline is
    /// later, since it was set when the call arrived.
    valid_until: Mutex<Instant>,
}

impl Hold {
    fn new(checkpoint: u64, lease: Duration, sent: Instant) -> Self {
        Self {
            checkpoint: AtomicU64::new(checkpoint),
            lost: AtomicBool::new(false),
            fenced: AtomicBool::new(false),
            notify: Notify::new(),
            lease,
            valid_until: Mutex::new(sent + lease),
        }
    }

    /// A renewal sent at `sent` was accepted: the lease holds until `sent + lease`.
    pub(crate) fn renewed(&self, sent: Instant) {
        let mut until = self.valid_until.lock().expect("not poisoned");
        *until = (*until).max(sent + self.lease);
    }

    fn valid_until(&self) -> Instant {
        *self.valid_until.lock().expect("not poisoned")
    }

    /// When the partition fences itself if no renewal is accepted before: a quarter of
    /// a lease before [`valid_until`](Self::valid_until).
    fn fence_at(&self) -> Instant {
        self.valid_until() - self.lease / 4
    }

    /// Whether the lease went unrenewed too long to go on working under it.
    pub(crate) fn is_fenced(&self) -> bool {
        self.fenced.load(Relaxed) || Instant::now() >= self.fence_at()
    }

    /// Resolves once the book's watchdog fenced the lease. No timer of its own: one
    /// watchdog per process watches every lease, so a chunk that waits on this costs
    /// a waiter in a list, not an entry in the timer wheel.
    pub(crate) async fn fenced(&self) {
        loop {
            let notified = self.notify.notified();
            if self.fenced.load(Relaxed) {
                return;
            }
            notified.await;
        }
    }

    fn mark_fenced(&self) {
        self.fenced.store(true, Relaxed);
        self.notify.notify_waiters();
    }

    /// Once [fenced](Self::fenced), how long a running chunk may take to stop before
    /// it is killed: until a twelfth of a lease before the lease could expire.
    pub(crate) fn grace_left(&self) -> Duration {
        (self.valid_until() - self.lease / 12).saturating_duration_since(Instant::now())
    }

    /// Moves the checkpoint forward (never back).
    pub(crate) fn advance(&self, checkpoint: u64) {
        self.checkpoint.fetch_max(checkpoint, Relaxed);
    }

    /// Whether the store refused the lease.
    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Relaxed)
    }

    /// Resolves once the lease is lost.
    pub(crate) async fn lost(&self) {
        loop {
            let notified = self.notify.notified();
            if self.is_lost() {
                return;
            }
            notified.await;
        }
    }

    fn mark_lost(&self) {
        self.lost.store(true, Relaxed);
        self.notify.notify_waiters();
    }
}

/// Held leases by (pid, token): a process holds a pid under one token at a time, but a
/// lost lease may still be in the book when the same pid is claimed again.
type Held = HashMap<(u64, u64), (Lease, Arc<Hold>)>;

/// The leases this process holds.
#[derive(Debug)]
pub(crate) struct LeaseBook {
    /// The length of every lease in it.
    lease: Duration,
    held: Mutex<Held>,
    /// Wakes the heartbeat task when a partition starts, so that it shows as running
    /// within [`FIRST_BEAT`] instead of at the next regular beat.
    starts: Notify,
}

/// How soon after a partition starts the heartbeat that marks it running goes out:
/// every start within it rides the same call.
pub(crate) const FIRST_BEAT: Duration = Duration::from_secs(1);

impl LeaseBook {
    /// An empty book of leases of length `lease`.
    pub(crate) fn new(lease: Duration) -> Self {
        Self {
            lease,
            held: Mutex::default(),
            starts: Notify::new(),
        }
    }

    /// Enters `lease`, its checkpoint where the claim left it; the claim was sent at
    /// `sent`.
    pub(crate) fn hold(&self, lease: &Lease, sent: Instant) -> Arc<Hold> {
        let hold = Arc::new(Hold::new(lease.progress, self.lease, sent));
        self.lock()
            .insert((lease.pid, lease.token), (lease.clone(), hold.clone()));
        hold
    }

    /// Says that a held lease's partition started running.
    pub(crate) fn started(&self) {
        self.starts.notify_one();
    }

    /// Takes `lease` out before its outcome is reported: no heartbeat renews it after.
    pub(crate) fn drop_lease(&self, lease: &Lease) {
        self.lock().remove(&(lease.pid, lease.token));
    }

    /// How many leases are held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().expect("not poisoned")
    }

    /// Fences every held lease past its fence instant; returns the earliest fence
    /// instant of those still good, if any.
    fn fence_overdue(&self) -> Option<Instant> {
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        for (_, hold) in self.lock().values() {
            if hold.fenced.load(Relaxed) {
                continue;
            }
            let at = hold.fence_at();
            if now >= at {
                hold.mark_fenced();
            } else {
                next = Some(next.map_or(at, |n| n.min(at)));
            }
        }
        next
    }

    /// Every held lease with its checkpoint now.
    fn beats(&self) -> Vec<(Lease, u64, Arc<Hold>)> {
        self.lock()
            .values()
            .map(|(lease, hold)| (lease.clone(), hold.checkpoint.load(Relaxed), hold.clone()))
            .collect()
    }

    /// Renews every held lease in one call; marks the refused ones lost and forgets them.
    async fn beat(&self, active: &dyn ActiveStore, shared: &Shared) {
        let beats = self.beats();
        if beats.is_empty() {
            return;
        }
        let batch: Vec<(Lease, u64)> = beats
            .iter()
            .map(|(lease, checkpoint, _)| (lease.clone(), *checkpoint))
            .collect();
        let at = std::time::Instant::now();
        let outcomes = active.heartbeat_many(&batch).await;
        shared.timed_update(at);
        let outcomes = match outcomes {
            Ok(outcomes) => outcomes,
            Err(err) => {
                tracing::warn!(%err, leases = beats.len(), "heartbeat failed; retrying");
                return;
            }
        };
        for ((lease, _, hold), outcome) in beats.iter().zip(outcomes) {
            match outcome {
                Ok(()) => hold.renewed(at.into()),
                Err(ActiveError::LeaseLost { .. }) => {
                    tracing::warn!(pid = lease.pid, "lease lost (expired and reclaimed?)");
                    self.drop_lease(lease);
                    hold.mark_lost();
                }
                Err(err) => tracing::warn!(pid = lease.pid, %err, "heartbeat failed; retrying"),
            }
        }
    }
}

/// Heartbeats every lease in `book` every `lease / 3` until `done`, and [`FIRST_BEAT`]
/// after a partition starts (the store marks a lease running at its first heartbeat).
pub(crate) async fn heartbeat(
    book: Arc<LeaseBook>,
    active: Arc<dyn ActiveStore>,
    shared: Arc<Shared>,
    lease: Duration,
    done: watch::Receiver<bool>,
) {
    tokio::join!(
        beats(book.clone(), active, shared, lease, done.clone()),
        watchdog(book, lease, done),
    );
}

async fn beats(
    book: Arc<LeaseBook>,
    active: Arc<dyn ActiveStore>,
    shared: Arc<Shared>,
    lease: Duration,
    mut done: watch::Receiver<bool>,
) {
    let every = (lease / 3).max(Duration::from_millis(100));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let first = FIRST_BEAT.min(every);
    loop {
        tokio::select! {
            () = until(&mut done, |d| *d) => return,
            _ = tick.tick() => {}
            () = book.starts.notified() => {
                // Starts gather for a moment; the beat then renews everything, so the
                // regular one can wait a whole period again.
                tokio::select! {
                    () = until(&mut done, |d| *d) => return,
                    () = tokio::time::sleep(first) => {}
                }
                tick.reset();
            }
        }
        book.beat(active.as_ref(), &shared).await;
    }
}

/// Fences the leases that went unrenewed too long, however long a heartbeat call hangs
/// (it runs beside the beats, not after them). It sleeps until the earliest fence
/// instant, looking at least every twelfth of a lease (a renewal only moves a fence
/// instant later, and a new lease's is most of a lease away).
async fn watchdog(book: Arc<LeaseBook>, lease: Duration, mut done: watch::Receiver<bool>) {
    let step = (lease / 12).max(Duration::from_millis(20));
    loop {
        let latest = Instant::now() + step;
        let next = book.fence_overdue().map_or(latest, |at| at.min(latest));
        tokio::select! {
            () = until(&mut done, |d| *d) => return,
            () = tokio::time::sleep_until(next) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tranche_active_store::{
        ActiveQuery, Clock, Config, Leases, Maintenance, ManualClock, MemoryActiveStore, Plan,
        Planner,
    };

    /// One batch heartbeat where one lease of several was lost: the others are renewed
    /// with their checkpoints, the lost one is marked and leaves the book.
    #[tokio::test]
    async fn a_lost_lease_among_several_is_marked_and_dropped() {
        let clock = Arc::new(ManualClock::new(1_000_000));
        let config = Config {
            lease: Duration::from_secs(30),
            ..Config::default()
        };
        let store = Arc::new(MemoryActiveStore::with_clock(config, clock.clone()).unwrap());
        store
            .plan(&Plan::Uniform {
                min: 1,
                max: 10_000,
                size: 1000,
            })
            .await
            .unwrap();
        let leases = store.claim("me", 3).await.unwrap();
        let book = LeaseBook::new(Duration::from_secs(30));
        let holds: Vec<_> = leases
            .iter()
            .map(|l| book.hold(l, Instant::now()))
            .collect();
        // The first and third are renewed (by a heartbeat the book did not see); the
        // second expires and goes to another worker.
        clock.advance(20_000);
        let renew = [0, 2].map(|i| (leases[i].clone(), leases[i].min_id));
        for outcome in store.heartbeat_many(&renew).await.unwrap() {
            outcome.unwrap();
        }
        clock.advance(10_000);
        assert_eq!(
            store.reap(clock.now_ms()).await.unwrap(),
            vec![leases[1].pid]
        );
        let other = store.claim("other", 1).await.unwrap();
        assert_eq!(other[0].pid, leases[1].pid);

        for i in [0, 2] {
            holds[i].advance(leases[i].min_id + 700);
        }
        book.beat(store.as_ref(), &Shared::new(None)).await;
        assert!(!holds[0].is_lost() && !holds[2].is_lost());
        assert!(holds[1].is_lost());
        tokio::time::timeout(Duration::from_secs(1), holds[1].lost())
            .await
            .expect("the lost lease's partition is woken");
        assert_eq!(book.len(), 2);
        for i in [0, 2] {
            let p = store.get(leases[i].pid).await.unwrap().unwrap();
            assert_eq!(p.progress, leases[i].min_id + 700, "checkpoint recorded");
        }
    }

    /// A lease nobody renews is fenced a quarter of a lease before it could expire, and
    /// not before; a renewal moves its fence on. Paused time: the watchdog sleeps on
    /// tokio's clock.
    #[tokio::test(start_paused = true)]
    async fn the_watchdog_fences_an_unrenewed_lease_in_time() {
        let store = MemoryActiveStore::new(Config::default()).unwrap();
        store
            .plan(&Plan::Uniform {
                min: 1,
                max: 2000,
                size: 1000,
            })
            .await
            .unwrap();
        let leases = store.claim("me", 2).await.unwrap();
        let lease = Duration::from_secs(12);
        let book = Arc::new(LeaseBook::new(lease));
        let start = Instant::now();
        let stale = book.hold(&leases[0], start);
        let renewed = book.hold(&leases[1], start);
        let (tx, rx) = watch::channel(false);
        let dog = tokio::spawn(watchdog(book.clone(), lease, rx));
        tokio::time::sleep(Duration::from_secs(8)).await;
        assert!(
            !stale.is_fenced(),
            "fenced before three quarters of a lease"
        );
        renewed.renewed(Instant::now());
        tokio::time::timeout(Duration::from_millis(1100), stale.fenced())
            .await
            .expect("fenced at nine seconds");
        assert!(stale.grace_left() <= Duration::from_secs(2));
        assert!(!renewed.is_fenced(), "the renewed lease runs on");
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert!(!renewed.is_fenced(), "its fence moved to 17 s");
        tokio::time::timeout(Duration::from_secs(4), renewed.fenced())
            .await
            .expect("fenced once its renewal ran out too");
        tx.send(true).unwrap();
        dog.await.unwrap();
    }
}
