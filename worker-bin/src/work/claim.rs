//! The claim loop of a run: claims in batches into a local queue and starts partitions
//! from it while there is room, one named step per concern (the pause flag, the gate,
//! the embedded save, early splits, starting queued leases, the claim, idle splits, the
//! wait), until nothing is outstanding (unless following) or a signal stops it.
//!
//! The queue holds up to `prefetch` leases beyond the `concurrency` running (see
//! [`auto_prefetch`]), so a finished partition is replaced without a round trip, and a
//! claim is made only once that many slots are free (or nothing is left to start): one
//! claim call per shard visited carries many partitions.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::Instrument;
use tranche_active_store::Lease;

use super::partition::PartitionCtx;
use super::split::{self, Splitter};
use super::{Settings, Shared, Stop, Working};
use crate::backend::Backend;
use crate::control::Gate;
use crate::error::Error;
use crate::event::{Event, StoreOp};
use crate::held::{Hold, LeaseBook};

/// How often the claim loop reads the namespace's pause flag.
const PAUSE_POLL: Duration = Duration::from_secs(1);

/// The shortest wait between claims that found nothing (doubling up to a second, or
/// [`split::IDLE_TURN`] with splitting on).
const FIRST_IDLE: Duration = Duration::from_millis(10);

/// Runs the claim loop; returns with every partition task finished and every queued
/// lease released.
pub(super) async fn claim_loop(
    backend: &Backend,
    settings: &Settings,
    shared: &Arc<Shared>,
    book: &Arc<LeaseBook>,
    gate: &Arc<Gate>,
    stop: watch::Receiver<Stop>,
) -> Result<(), Error> {
    if let Some(traced) = &shared.traced {
        traced.refresh(backend).await;
    }
    let mut l = ClaimLoop {
        ctx: Arc::new(PartitionCtx {
            active: backend.active.clone(),
            settings: settings.clone(),
            shared: shared.clone(),
            book: book.clone(),
            stop: stop.clone(),
            gate: gate.clone(),
        }),
        backend,
        settings,
        shared,
        book,
        gate,
        stop,
        tasks: JoinSet::new(),
        queue: VecDeque::new(),
        idle: FIRST_IDLE,
        splitter: Splitter::default(),
        last_save: Instant::now(),
        paused: false,
        pause_read: None,
    };
    loop {
        if *l.stop.borrow() != Stop::Running || l.shared.is_broken() {
            break;
        }
        if l.read_pause().await {
            l.wait_paused().await;
            continue;
        }
        if l.gate.is_closed() {
            if l.wait_closed().await? {
                break;
            }
            continue;
        }
        let concurrency = l.gate.concurrency();
        l.save_if_due().await?;
        // A partition's slot frees when its chunks end ([`Working`]); its task ends once
        // the store has its outcome. Those in that last round trip are bounded too, at
        // `concurrency` more tasks.
        while l.tasks.try_join_next().is_some() {}
        if l.split_early(concurrency).await {
            continue;
        }
        l.start_queued(concurrency);
        let (want, due) = l.claim_due(concurrency);
        let mut claimed = if due { l.claim(want).await } else { 0 };
        if claimed == 0 {
            claimed = l.split_idle(concurrency).await;
        }
        if claimed > 0 {
            l.idle = FIRST_IDLE;
            continue;
        }
        // Pieces asked for are cut in their holders' next beat: look for them often.
        if l.splitter.awaits_cut() {
            l.idle = l.idle.min(split::AWAIT_TURN);
        }
        if l.nothing_left().await? {
            break;
        }
        l.wait(due).await;
    }
    // Draining: queued leases go back at once, untouched; in-flight partitions
    // checkpoint and release once their chunks are done (the signal handler turns
    // Draining into Abort when the grace period is over).
    release_queued(backend, book, shared, &mut l.queue).await;
    while l.tasks.join_next().await.is_some() {}
    Ok(())
}

/// The claim loop's state between its turns.
struct ClaimLoop<'a> {
    backend: &'a Backend,
    settings: &'a Settings,
    shared: &'a Arc<Shared>,
    book: &'a Arc<LeaseBook>,
    gate: &'a Arc<Gate>,
    stop: watch::Receiver<Stop>,
    /// What every partition task shares.
    ctx: Arc<PartitionCtx>,
    /// The partition tasks.
    tasks: JoinSet<()>,
    /// Leases claimed (or pieces taken) and held, not started yet.
    queue: VecDeque<(Lease, Arc<Hold>)>,
    /// How long to wait before claiming again after a claim found nothing.
    idle: Duration,
    splitter: Splitter,
    /// When the embedded backend last saved its state.
    last_save: Instant,
    /// Whether the namespace was paused at the last read of its flag.
    paused: bool,
    /// When the pause flag was last read.
    pause_read: Option<Instant>,
}

impl ClaimLoop<'_> {
    /// Whether the namespace is paused (`tranche pause`): a flag read once a
    /// [`PAUSE_POLL`], its changes logged; a failed read keeps the last answer.
    async fn read_pause(&mut self) -> bool {
        if self.pause_read.is_none_or(|at| at.elapsed() >= PAUSE_POLL) {
            self.pause_read = Some(Instant::now());
            let now = self.backend.active.is_paused().await.unwrap_or(self.paused);
            if now != self.paused {
                if now {
                    tracing::info!("namespace paused: claiming nothing until `tranche resume`");
                } else {
                    tracing::info!("namespace resumed");
                }
                self.paused = now;
            }
        }
        self.paused
    }

    /// While paused nothing is claimed or started, queued leases go back, and what
    /// runs finishes: waits for a task, a signal or the next read of the flag.
    async fn wait_paused(&mut self) {
        release_queued(self.backend, self.book, self.shared, &mut self.queue).await;
        while self.tasks.try_join_next().is_some() {}
        tokio::select! {
            Some(_) = self.tasks.join_next(), if !self.tasks.is_empty() => {}
            _ = self.stop.changed() => {}
            () = tokio::time::sleep(PAUSE_POLL) => {}
        }
    }

    /// While the gate is closed (a throttle, the time outside the active hours)
    /// nothing is claimed or started (queued leases stay held and renewed) until it
    /// opens. Returns whether the run is over: nothing of this process's left and,
    /// unless following, nothing outstanding in the namespace.
    async fn wait_closed(&mut self) -> Result<bool, Error> {
        while self.tasks.try_join_next().is_some() {}
        if self.tasks.is_empty()
            && self.queue.is_empty()
            && !self.settings.follow
            && self.backend.active.counts().await?.outstanding() == 0
        {
            return Ok(true);
        }
        tokio::select! {
            Some(_) = self.tasks.join_next(), if !self.tasks.is_empty() => {}
            _ = self.stop.changed() => {}
            () = self.gate.opened() => {}
            () = tokio::time::sleep(PAUSE_POLL) => {}
        }
        Ok(false)
    }

    /// Saves the embedded backend's state once a `save_every` has passed.
    async fn save_if_due(&mut self) -> Result<(), Error> {
        if self.backend.is_embedded() && self.last_save.elapsed() >= self.settings.save_every {
            self.backend.save().await?;
            self.last_save = Instant::now();
        }
        Ok(())
    }

    /// Slots free to start a partition now: none while `2 × concurrency` tasks exist.
    /// (Read afresh each time: on a multi-thread runtime slots free meanwhile, and a
    /// gate that lowered the concurrency leaves more working than it allows.)
    fn free_slots(&self, concurrency: usize) -> usize {
        if self.tasks.len() < 2 * concurrency {
            concurrency.saturating_sub(self.shared.working.load(Relaxed))
        } else {
            0
        }
    }

    /// Long partitions: a free slot takes a straggler's piece, or has stragglers cut,
    /// before it starts a queued partition or claims a fresh one (the heaviest work
    /// first; pieces go first in the queue). Returns whether pieces were taken.
    async fn split_early(&mut self, concurrency: usize) -> bool {
        if !self.settings.split || self.shared.is_broken() || self.free_slots(concurrency) == 0 {
            return false;
        }
        let shared = self.shared;
        let Some(mode) = self.splitter.early(|| shared.median()) else {
            return false;
        };
        let free = self.free_slots(concurrency);
        let pieces = self
            .splitter
            .step(
                self.backend,
                self.settings,
                self.shared,
                self.book,
                &mut self.queue,
                free,
                mode,
            )
            .await;
        pieces > 0
    }

    /// Starts queued leases while slots are free.
    fn start_queued(&mut self, concurrency: usize) {
        while self.free_slots(concurrency) > 0
            && let Some((lease, hold)) = self.queue.pop_front()
        {
            start(&mut self.tasks, &self.ctx, lease, hold);
        }
    }

    /// How many leases would fill the running and the queued up to `concurrency` plus
    /// the prefetch, and whether a claim is due this turn: a quarter of that target is
    /// free, or the queue ran dry with a slot free.
    fn claim_due(&self, concurrency: usize) -> (usize, bool) {
        let working = self.shared.working.load(Relaxed);
        let prefetch = self
            .settings
            .prefetch
            .unwrap_or_else(|| auto_prefetch(concurrency, self.shared.mean_ms()));
        let target = concurrency + prefetch;
        // Claim once a quarter of the target is free: big batches, and a queue that
        // never runs dry while the claim is in flight.
        let refill_at = (target / 4).max(1);
        let want = target.saturating_sub(working + self.queue.len());
        let starving = self.queue.is_empty() && self.free_slots(concurrency) > 0;
        (want, want > 0 && (want >= refill_at || starving))
    }

    /// Claims what the gate allows of `want` into the queue, each lease held (renewed
    /// by the heartbeats) from now on. Returns how many were claimed. A claim Redis
    /// refuses for good stops the run with its reason; connection trouble is retried.
    async fn claim(&mut self, want: usize) -> usize {
        let want = self.gate.claim(want, self.shared.rate_limit_failed()).await;
        let sent = Instant::now();
        let answer = match want {
            0 => Ok(Vec::new()),
            _ => self.backend.active.claim(&self.settings.worker, want).await,
        };
        match answer {
            Ok(leases) => {
                let claimed = leases.len();
                if let Some(traced) = &self.shared.traced
                    && leases.iter().any(|l| traced.misses(l.pid))
                {
                    traced.refresh(self.backend).await;
                }
                self.shared.claimed.fetch_add(claimed as u64, Relaxed);
                for lease in leases {
                    self.shared.emit(|| Event::Claimed {
                        pid: lease.pid,
                        attempt: lease.attempt,
                    });
                    let hold = self.book.hold(&lease, false, sent.into());
                    self.queue.push_back((lease, hold));
                }
                claimed
            }
            // Redis refusing the claim itself (a script error, a missing ACL
            // permission, a corrupt record) will refuse it again: stop with its
            // reason rather than retry for ever.
            Err(err) if err.is_permanent() => {
                self.shared.broken(format!("claim refused: {err}"));
                0
            }
            Err(err) => {
                tracing::warn!(%err, "claim failed; retrying");
                self.shared.store_error(StoreOp::Claim, &err);
                0
            }
        }
    }

    /// Nothing to claim and a slot free: take a piece of a split partition, or ask
    /// for one (the holder cuts it in its next beat). Returns the pieces taken.
    async fn split_idle(&mut self, concurrency: usize) -> usize {
        let free = self.free_slots(concurrency);
        if !self.settings.split || !self.queue.is_empty() || free == 0 || self.shared.is_broken() {
            return 0;
        }
        self.splitter
            .step(
                self.backend,
                self.settings,
                self.shared,
                self.book,
                &mut self.queue,
                free,
                split::Mode::Idle,
            )
            .await
    }

    /// Whether the run is over: nothing of this process's runs or waits and, unless it
    /// follows, it only wanted what it could claim or the namespace has nothing
    /// outstanding.
    async fn nothing_left(&self) -> Result<bool, Error> {
        if !self.tasks.is_empty() || !self.queue.is_empty() || self.settings.follow {
            return Ok(false);
        }
        if self.settings.until_idle {
            return Ok(true);
        }
        Ok(self.backend.active.counts().await?.outstanding() == 0)
    }

    /// Nothing to claim now: waits for a slot, a signal, or a while (retries in
    /// back-off and other workers' expiring leases become claimable over time), the
    /// while doubling each time it passes.
    async fn wait(&mut self, claim_due: bool) {
        tokio::select! {
            Some(_) = self.tasks.join_next(), if !self.tasks.is_empty() => {}
            () = self.shared.slot_freed.notified() => {}
            _ = self.stop.changed() => {}
            () = tokio::time::sleep(self.idle), if claim_due || self.tasks.is_empty() => {
                // With splitting on, idle slots look for pieces and stragglers often.
                let most = if self.settings.split {
                    split::IDLE_TURN
                } else {
                    Duration::from_secs(1)
                };
                self.idle = (self.idle * 2).min(most);
            }
        }
    }
}

/// Gives every queued (not started) lease back at once, untouched.
async fn release_queued(
    backend: &Backend,
    book: &LeaseBook,
    shared: &Shared,
    queue: &mut VecDeque<(Lease, Arc<Hold>)>,
) {
    for (lease, hold) in queue.drain(..) {
        book.drop_lease(&lease);
        shared.released.fetch_add(1, Relaxed);
        shared.emit(|| Event::Released { pid: lease.pid });
        let released = if hold.piece {
            backend.active.release_piece(&lease, lease.progress).await
        } else {
            backend.active.release(&lease, lease.progress).await
        };
        if let Err(err) = released {
            tracing::warn!(pid = lease.pid, %err, "could not release a queued partition; its lease will expire");
            shared.store_error(StoreOp::Release, &err);
        }
    }
}

/// How many leases to queue beyond `concurrency` when `--prefetch` is not given: as
/// many again while partitions take under a second on average (a queued lease waits
/// about one partition, and claims carry many partitions each), an eighth once they
/// take longer (a long partition queued behind a busy worker's would wait for it while
/// another worker idles at the end of a job).
fn auto_prefetch(concurrency: usize, mean_ms: Option<f64>) -> usize {
    match mean_ms {
        Some(ms) if ms >= 1000.0 => (concurrency / 8).max(1),
        _ => concurrency,
    }
}

/// Starts the partition of `lease` on `tasks`, in a span of its own when the span is
/// enabled (`super::spans`): a disabled span is not attached at all.
fn start(tasks: &mut JoinSet<()>, ctx: &Arc<PartitionCtx>, lease: Lease, hold: Arc<Hold>) {
    ctx.book.started();
    let span = super::spans::partition(&lease, hold.piece, ctx.shared.traced.as_ref());
    // Boxed: the future is some kilobytes, and tokio moves an unboxed one several times
    // on its way into the task and keeps its whole size in the task's stage (written
    // again when it finishes); a pointer moves for free.
    let working = Working::new(&ctx.shared);
    let task = Box::pin(ctx.clone().process(lease, hold, working, span.clone()));
    if span.is_disabled() {
        tasks.spawn(task);
    } else {
        tasks.spawn(task.instrument(span));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefetch_follows_the_partition_duration() {
        assert_eq!(auto_prefetch(64, None), 64, "short until shown otherwise");
        assert_eq!(auto_prefetch(64, Some(3.5)), 64);
        assert_eq!(auto_prefetch(64, Some(999.0)), 64);
        assert_eq!(auto_prefetch(64, Some(1000.0)), 8);
        assert_eq!(auto_prefetch(4, Some(60_000.0)), 1);
    }
}
