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
//!
//! Nor whatever freezes this process: a SIGSTOPped worker runs no watchdog, so each
//! `--exec` chunk's guard gets the same instant from the hold ([`Hold::fence`]) and
//! stops the chunk itself when no renewal moved it on (`job`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tranche_active_store::{Beat, Error as ActiveError, Lease, PartBeat, Splits};

/// The fractions of a lease `L` that time everything a process does to keep it, as
/// divisors. Instants are counted back from the last one by which the store certainly
/// still holds the lease ([`Hold::renewed`]):
///
/// - every `L / BEAT_DIV` the heartbeat renews it: two beats in a row may fail before
///   the partition is in danger;
/// - `L / FENCE_DIV` before that instant, unrenewed, the partition fences itself: it
///   issues nothing more and stops its running chunks;
/// - `L / STOP_DIV` before it a command's guard sends its group SIGTERM, should this
///   process be frozen and stop nothing (and the guard is told of renewals at most once
///   per `L / STOP_DIV`);
/// - `L / KILL_DIV` before it whatever still runs is killed: the margin against another
///   worker's reaper, which every process's clock must keep within (`split.rs` in the
///   active store, "Clocks"). The watchdog looks at least this often.
const BEAT_DIV: u32 = 3;
/// See [`BEAT_DIV`].
const FENCE_DIV: u32 = 4;
/// See [`BEAT_DIV`].
const STOP_DIV: u32 = 6;
/// See [`BEAT_DIV`].
const KILL_DIV: u32 = 12;

#[cfg(feature = "cli")]
/// How far apart two processes' clocks may be for a lease `lease` to stay safe: the
/// margin a holder keeps ([`KILL_DIV`]), as deadlines are set and reaped by the callers'
/// clocks (`active-store/src/split.rs`, "Clocks"). `health`'s `clock_skew` rule fires
/// past it.
pub(crate) fn skew_bound(lease: Duration) -> Duration {
    lease / KILL_DIV
}

/// Told when a store update (a batch of heartbeats) that started at the given instant
/// has its answer: the run loop records the update's latency.
pub(crate) type TimedUpdate = dyn Fn(std::time::Instant) + Send + Sync;

/// Told when a heartbeat call failed and the next beat tries again: the run loop tells
/// its subscribers (plain values, so that the book knows nothing of the run loop).
pub(crate) type FailedBeat = dyn Fn(&ActiveError) + Send + Sync;

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
    /// later, since it was set when the call arrived. A watch, so that each running
    /// chunk's guard hears of every renewal ([`Hold::fence`]).
    valid_until: watch::Sender<Instant>,
    /// Whether the lease is a piece's (`tranche_active_store::Splits`).
    pub(crate) piece: bool,
    /// How far the partition handed out IDs, and where its range ends now.
    frontier: Mutex<Frontier>,
    /// Wakes an issuer held back while a beat that may cut the lease is in flight.
    thawed: Notify,
}

/// A lease's frontier, for splitting: the first ID not handed out yet (`None` until the
/// partition issues through [`Hold::issue`]; such a lease is never cut), the last ID it
/// may hand out, and whether a beat that may cut it is in flight (nothing is handed out
/// meanwhile: the beat promised the store nothing at or past `next` is).
#[derive(Debug)]
struct Frontier {
    next: Option<u64>,
    end: u64,
    frozen: bool,
    /// When the first chunk was handed out.
    armed_at: Option<Instant>,
}

impl Hold {
    fn new(l: &Lease, piece: bool, lease: Duration, sent: Instant) -> Self {
        Self {
            checkpoint: AtomicU64::new(l.progress),
            lost: AtomicBool::new(false),
            fenced: AtomicBool::new(false),
            notify: Notify::new(),
            lease,
            valid_until: watch::Sender::new(sent + lease),
            piece,
            frontier: Mutex::new(Frontier {
                next: None,
                end: l.max_id,
                frozen: false,
                armed_at: None,
            }),
            thawed: Notify::new(),
        }
    }

    fn frontier(&self) -> std::sync::MutexGuard<'_, Frontier> {
        self.frontier.lock().expect("not poisoned")
    }

    /// The last ID the lease may hand out now (a cut moves it down).
    pub(crate) fn end(&self) -> u64 {
        self.frontier().end
    }

    /// Hands out the chunk of up to `chunk` IDs from `from` (every ID before `from` was
    /// handed out or is done): the chunk's last ID, or `None` if `from` is past the
    /// lease's end or the lease is lost or fenced. Waits while a beat that may cut the
    /// lease is in flight, or failed (until one succeeds). The first call arms the
    /// lease for splitting.
    pub(crate) async fn issue(&self, from: u64, chunk: u64) -> Option<u64> {
        loop {
            let thawed = self.thawed.notified();
            let gone = self.notify.notified();
            if self.is_lost() || self.is_fenced() {
                return None;
            }
            {
                let mut f = self.frontier();
                if !f.frozen {
                    if from > f.end {
                        return None;
                    }
                    let to = from.saturating_add(chunk - 1).min(f.end);
                    f.next = Some(f.next.unwrap_or(0).max(to.saturating_add(1)));
                    f.armed_at.get_or_insert_with(Instant::now);
                    return Some(to);
                }
            }
            tokio::select! {
                () = thawed => {}
                () = gone => {}
            }
        }
    }

    /// Whether the lease has run long enough to be worth cutting soon: armed for at
    /// least [`STRAGGLING`]. Such leases also beat every [`SPLIT_BEAT`].
    fn straggling(&self) -> bool {
        self.frontier()
            .armed_at
            .is_some_and(|at| at.elapsed() >= STRAGGLING)
    }

    /// Before a beat: the first ID not handed out, if the lease is armed, with issuing
    /// held back until [`thaw`](Self::thaw).
    fn freeze(&self) -> Option<u64> {
        let mut f = self.frontier();
        let next = f.next?;
        f.frozen = true;
        Some(next)
    }

    /// After a beat the store answered: the lease ends at `last` now, if that is
    /// before its end (a cut moves the end down, never up); issuing goes on.
    fn thaw(&self, last: Option<u64>) {
        let mut f = self.frontier();
        if let Some(last) = last {
            f.end = f.end.min(last);
        }
        f.frozen = false;
        drop(f);
        self.thawed.notify_waiters();
    }

    /// A renewal sent at `sent` was accepted: the lease holds until `sent + lease`.
    pub(crate) fn renewed(&self, sent: Instant) {
        let until = sent + self.lease;
        self.valid_until.send_if_modified(|v| {
            let later = until > *v;
            if later {
                *v = until;
            }
            later
        });
    }

    fn valid_until(&self) -> Instant {
        *self.valid_until.borrow()
    }

    /// How long before [`valid_until`](Self::valid_until) a chunk still running is
    /// killed: a twelfth of a lease, the reaper's margin.
    fn kill_margin(&self) -> Duration {
        self.lease / KILL_DIV
    }

    /// The lease's fence for a chunk's guard, which must stop the chunk without this
    /// process (frozen, it fences nothing): SIGTERM a sixth of a lease before
    /// [`valid_until`](Self::valid_until), after this process's own stop (a quarter
    /// before), SIGKILL when this process would ([`grace_left`](Self::grace_left)).
    /// Renewals are told at most once per sixth of a lease.
    pub(crate) fn fence(&self) -> crate::job::Fence {
        crate::job::Fence::new(
            self.valid_until.subscribe(),
            self.lease / STOP_DIV,
            self.kill_margin(),
            self.lease / STOP_DIV,
        )
    }

    /// When the partition fences itself if no renewal is accepted before: a quarter of
    /// a lease before [`valid_until`](Self::valid_until).
    fn fence_at(&self) -> Instant {
        self.valid_until() - self.lease / FENCE_DIV
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
        (self.valid_until() - self.kill_margin()).saturating_duration_since(Instant::now())
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
pub(crate) struct LeaseBook {
    /// The length of every lease in it.
    lease: Duration,
    /// Whether its leases may be cut (`--no-split` turns it off): beats then carry
    /// each lease's frontier, and straggling leases beat every [`SPLIT_BEAT`].
    split: bool,
    held: Mutex<Held>,
    /// Wakes the heartbeat task when a partition starts, so that it shows as running
    /// within [`FIRST_BEAT`] instead of at the next regular beat.
    starts: Notify,
    /// Wakes the heartbeat task to beat the straggling leases now: this process asked
    /// one of its own parts for pieces, which it cuts in that beat.
    cut_asked: Notify,
    /// Told of each heartbeat call that failed, if anything listens
    /// ([`LeaseBook::on_failed_beat`]).
    failed: Option<Box<FailedBeat>>,
}

impl std::fmt::Debug for LeaseBook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseBook")
            .field("lease", &self.lease)
            .field("split", &self.split)
            .field("held", &self.held.lock().map_or(0, |h| h.len()))
            .finish_non_exhaustive()
    }
}

/// How soon after a partition starts the heartbeat that marks it running goes out:
/// every start within it rides the same call.
pub(crate) const FIRST_BEAT: Duration = Duration::from_secs(1);

impl LeaseBook {
    /// An empty book of leases of length `lease`, which may be cut if `split`.
    pub(crate) fn new(lease: Duration, split: bool) -> Self {
        Self {
            lease,
            split,
            held: Mutex::default(),
            starts: Notify::new(),
            cut_asked: Notify::new(),
            failed: None,
        }
    }

    /// The book, telling `failed` of each heartbeat call that fails.
    pub(crate) fn on_failed_beat(self, failed: Box<FailedBeat>) -> Self {
        Self {
            failed: Some(failed),
            ..self
        }
    }

    /// Enters `lease` (a piece's if `piece`), its checkpoint where the claim left it;
    /// the claim was sent at `sent`.
    pub(crate) fn hold(&self, lease: &Lease, piece: bool, sent: Instant) -> Arc<Hold> {
        let hold = Arc::new(Hold::new(lease, piece, self.lease, sent));
        self.lock()
            .insert((lease.pid, lease.token), (lease.clone(), hold.clone()));
        hold
    }

    /// Says that a held lease's partition started running.
    pub(crate) fn started(&self) {
        self.starts.notify_one();
    }

    /// Says that this process asked one of its own parts for pieces: the straggling
    /// leases beat at once, and the part is cut in that beat rather than up to a
    /// [`SPLIT_BEAT`] later.
    pub(crate) fn cut_asked(&self) {
        self.cut_asked.notify_one();
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

    /// Every held lease with its checkpoint now (only the straggling ones if
    /// `stragglers`).
    fn beats(&self, stragglers: bool) -> Vec<(Lease, u64, Arc<Hold>)> {
        self.lock()
            .values()
            .filter(|(_, hold)| !stragglers || hold.straggling())
            .map(|(lease, hold)| (lease.clone(), hold.checkpoint.load(Relaxed), hold.clone()))
            .collect()
    }

    /// Renews every held lease in one call; marks the refused ones lost and forgets them.
    /// With splitting, each armed lease sends its frontier and hands nothing out until
    /// the answer, which may cut it.
    async fn beat(&self, active: &dyn Splits, timed: &TimedUpdate, stragglers: bool) {
        let beats = self.beats(stragglers);
        if beats.is_empty() {
            return;
        }
        let batch: Vec<PartBeat> = beats
            .iter()
            .map(|(lease, checkpoint, hold)| PartBeat {
                lease: lease.clone(),
                piece: hold.piece,
                progress: *checkpoint,
                next: if self.split { hold.freeze() } else { None },
            })
            .collect();
        let at = std::time::Instant::now();
        let outcomes = active.beat_parts(&batch).await;
        timed(at);
        // A beat with no answer stays frozen: it may have cut the lease, its reply
        // lost, so nothing more is handed out until a beat is answered (each tells
        // the part's end), or the lease is fenced.
        let outcomes = match outcomes {
            Ok(outcomes) => outcomes,
            Err(err) => {
                tracing::warn!(%err, leases = beats.len(), "heartbeat failed; retrying");
                if let Some(failed) = &self.failed {
                    failed(&err);
                }
                return;
            }
        };
        // One call: its leases' errors are told once.
        let mut told = false;
        for ((lease, _, hold), outcome) in beats.iter().zip(outcomes) {
            match outcome {
                Ok(beat) => {
                    if let Beat::Cut { last } = beat {
                        tracing::info!(
                            pid = lease.pid,
                            from = lease.min_id,
                            last,
                            "split: the rest of the range went to another worker"
                        );
                    } else if beat.last() < hold.end() {
                        // A cut whose reply was lost: this beat found it made.
                        tracing::info!(
                            pid = lease.pid,
                            from = lease.min_id,
                            last = beat.last(),
                            "split: the range was cut in an earlier beat; it ends sooner"
                        );
                    }
                    hold.thaw(Some(beat.last()));
                    hold.renewed(at.into());
                }
                Err(ActiveError::LeaseLost { .. }) => {
                    tracing::warn!(pid = lease.pid, "lease lost (expired and reclaimed?)");
                    self.drop_lease(lease);
                    hold.mark_lost();
                    hold.thaw(None);
                }
                Err(err) => {
                    tracing::warn!(pid = lease.pid, %err, "heartbeat failed; retrying");
                    if let Some(failed) = self.failed.as_ref().filter(|_| !told) {
                        failed(&err);
                        told = true;
                    }
                }
            }
        }
    }
}

/// How often a process that splits beats its straggling leases: the latency of a cut.
/// Its other leases beat as usual (every third of a lease): a job of short partitions
/// pays nothing for it.
pub(crate) const SPLIT_BEAT: Duration = Duration::from_millis(250);

/// How long a lease hands out chunks before it straggles ([`SPLIT_BEAT`]).
const STRAGGLING: Duration = Duration::from_millis(250);

mod beat;
#[cfg(test)]
mod beat_fails;
#[cfg(test)]
mod tests;

pub(crate) use beat::heartbeat;
