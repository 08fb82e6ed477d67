//! The one task that keeps a process's leases: its beats (every third of a lease, the
//! straggling ones every [`SPLIT_BEAT`], a start's soon after it) and the watchdog
//! that fences the leases no renewal reached in time.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tranche_active_store::ActiveStore;

use super::{BEAT_DIV, FIRST_BEAT, KILL_DIV, LeaseBook, SPLIT_BEAT, TimedUpdate};
use crate::sync::until;

/// Heartbeats every lease in `book` every `lease / 3` until `done`, and [`FIRST_BEAT`]
/// after a partition starts (the store marks a lease running at its first heartbeat).
pub(crate) async fn heartbeat(
    book: Arc<LeaseBook>,
    active: Arc<dyn ActiveStore>,
    timed: Arc<TimedUpdate>,
    lease: Duration,
    done: watch::Receiver<bool>,
) {
    tokio::join!(
        beats(book.clone(), active, timed, lease, done.clone()),
        watchdog(book, lease, done),
    );
}

async fn beats(
    book: Arc<LeaseBook>,
    active: Arc<dyn ActiveStore>,
    timed: Arc<TimedUpdate>,
    lease: Duration,
    mut done: watch::Receiver<bool>,
) {
    let every = (lease / BEAT_DIV).max(Duration::from_millis(100));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    // With splitting on, the straggling leases beat more often in between.
    let mut fast = tokio::time::interval(SPLIT_BEAT);
    fast.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    fast.tick().await;
    let first = FIRST_BEAT.min(every);
    // When the beat that marks the partitions started since the last one as running is
    // due. The straggling leases go on beating meanwhile: a start must not hold back
    // their cuts (in a skewed job something starts every moment).
    let mut start_beat: Option<Instant> = None;
    loop {
        let started = async {
            match start_beat {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = until(&mut done, |d| *d) => return,
            _ = tick.tick() => {}
            _ = fast.tick(), if book.split && SPLIT_BEAT < every => {
                book.beat(active.as_ref(), &*timed, true).await;
                continue;
            }
            () = book.cut_asked.notified(), if book.split => {
                book.beat(active.as_ref(), &*timed, true).await;
                fast.reset();
                continue;
            }
            () = book.starts.notified(), if start_beat.is_none() => {
                // Starts gather for a moment before their beat.
                start_beat = Some(Instant::now() + first);
                continue;
            }
            () = started => {
                // The beat renews everything, so the regular one can wait a whole
                // period again.
                tick.reset();
            }
        }
        start_beat = None;
        book.beat(active.as_ref(), &*timed, false).await;
    }
}

/// Fences the leases that went unrenewed too long, however long a heartbeat call hangs
/// (it runs beside the beats, not after them). It sleeps until the earliest fence
/// instant, looking at least every twelfth of a lease (a renewal only moves a fence
/// instant later, and a new lease's is most of a lease away).
pub(super) async fn watchdog(
    book: Arc<LeaseBook>,
    lease: Duration,
    mut done: watch::Receiver<bool>,
) {
    let step = (lease / KILL_DIV).max(Duration::from_millis(20));
    loop {
        let latest = Instant::now() + step;
        let next = book.fence_overdue().map_or(latest, |at| at.min(latest));
        tokio::select! {
            () = until(&mut done, |d| *d) => return,
            () = tokio::time::sleep_until(next) => {}
        }
    }
}
