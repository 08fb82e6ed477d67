//! One partition's run: its chunks through the sliding window (or its one chunk
//! directly), checkpoints moved as chunks finish, and its outcome reported to the store.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinSet;
use tranche_active_store::{
    ActiveStore, Completion, Error as ActiveError, FailOutcome, FailPolicy, Lease, PieceDone,
};
use tranche_window::SlidingWindow;

use crate::event::{Event, StoreOp};
use crate::held::{Hold, LeaseBook};
use crate::job::{Chunk, ChunkError, KILL_AFTER};

use super::{Settings, Shared, Stop, Working};
use crate::duration::now_ms;
use crate::sync::until;

mod timed;

/// What the partition tasks of one run share.
pub(super) struct PartitionCtx {
    pub(super) active: Arc<dyn ActiveStore>,
    pub(super) settings: Settings,
    pub(super) shared: Arc<Shared>,
    pub(super) book: Arc<LeaseBook>,
    pub(super) stop: watch::Receiver<Stop>,
    /// Throttles, rate limits and live settings (`crate::control`).
    pub(super) gate: Arc<crate::control::Gate>,
}

enum Ended {
    Done,
    /// The attempt failed, under the handler's policy (the default for `--exec`).
    Failed(String, FailPolicy),
    /// The command cannot run at all (see [`ChunkError::Broken`]).
    Broken(String),
    Lost,
    Stopped,
}

impl PartitionCtx {
    /// Closes `window` once the run stops, the lease of `pid` is lost or its fence
    /// passes (said, and noted in `fenced`), which stops the partition's issuing (waking
    /// it if it is parked on a full window); then stays pending, to be selected on
    /// while the chunks in flight finish.
    async fn closer(&self, pid: u64, hold: &Hold, window: &SlidingWindow, fenced: &AtomicBool) {
        let mut stop = self.stop.clone();
        tokio::select! {
            () = until(&mut stop, |s| *s != Stop::Running) => {}
            () = hold.lost() => {}
            () = hold.fenced() => {
                fenced.store(true, Relaxed);
                tracing::warn!(pid, "lease not renewed in time; stopping its partition");
            }
        }
        window.close();
        std::future::pending::<()>().await;
    }

    /// Runs the partition of `lease` and reports its outcome, recorded on `span` (its
    /// own, [`super::spans::partition`]).
    pub(super) async fn process(
        self: Arc<Self>,
        lease: Lease,
        hold: Arc<Hold>,
        slot: Working,
        span: tracing::Span,
    ) {
        self.shared.in_flight.fetch_add(1, Relaxed);
        let pid = lease.pid;
        let started = Instant::now();
        let (ended, checkpoint) = if hold.is_fenced() {
            // Queued for longer than its renewals could reach the store: another worker
            // may hold it by now.
            (Ended::Lost, lease.progress)
        } else {
            self.chunks(&lease, &hold).await
        };
        // Every chunk of the lease is over: their rows are the partition's.
        let rows = self.shared.take_rows(pid, lease.token);
        // Out of the book before the outcome: no heartbeat renews a finished lease. Its
        // slot is free from here: the next partition starts while this one reports.
        self.book.drop_lease(&lease);
        drop(slot);
        let update = Instant::now();
        let (outcome, error) = match &ended {
            Ended::Done => ("done", None),
            Ended::Failed(reason, _) => ("failed", Some(reason.as_str())),
            Ended::Broken(reason) => ("broken", Some(reason.as_str())),
            Ended::Lost => ("lost", Some("lease lost")),
            Ended::Stopped => ("released", None),
        };
        super::spans::partition_ended(&span, outcome, checkpoint, error);
        let result = match ended {
            Ended::Done => {
                let ms = started.elapsed().as_millis() as u64;
                // Counted once, by whoever finishes the partition's last part: an owner
                // part with pieces left is not (a piece may still fail the partition),
                // and neither is a piece with other parts left, nor a late completion
                // the store found done already (`Duplicate`: a stale owner's, its
                // partition counted by whoever completed it).
                let r = if hold.piece {
                    self.active
                        .complete_piece(&lease)
                        .await
                        .map(|done| done == PieceDone::Completed)
                } else {
                    // The end it was told (a cut moves it down): a store that no longer
                    // holds that cut (lost in a failover) then does not count the
                    // partition done, its tail undone (`Leases::complete`).
                    let told = Lease {
                        max_id: hold.end(),
                        ..lease.clone()
                    };
                    self.active.complete(&told, ms).await.map(|done| {
                        if done == Completion::Duplicate {
                            tracing::info!(pid, "completed already; not counted again");
                        }
                        done == Completion::Completed
                    })
                };
                if matches!(r, Ok(true)) {
                    self.shared.completed.fetch_add(1, Relaxed);
                    self.shared.emit(|| Event::PartitionDone {
                        pid,
                        attempt: lease.attempt,
                        duration: started.elapsed(),
                        rows,
                    });
                    self.shared
                        .durations_ms
                        .lock()
                        .expect("not poisoned")
                        .saturating_record(ms.max(1));
                }
                r.map(|_| ())
            }
            Ended::Failed(reason, policy) => {
                self.shared.failed_attempts.fetch_add(1, Relaxed);
                // A piece spends an attempt as its partition would; its last one (or a
                // permanent failure) fails the partition, which is then whole again.
                let piece_from = hold.piece.then_some(lease.min_id);
                let r = if hold.piece {
                    self.active
                        .fail_piece(&lease, checkpoint, &reason, policy)
                        .await
                } else {
                    // Keep the checkpoint, so the retry resumes past the chunks that
                    // finished.
                    match self.active.heartbeat(&lease, checkpoint).await {
                        Ok(()) => self.active.fail_with(&lease, &reason, policy).await,
                        Err(e) => Err(e),
                    }
                };
                if let Ok(outcome) = &r {
                    self.shared.emit(|| Event::AttemptFailed {
                        pid,
                        attempt: lease.attempt,
                        error: reason.clone(),
                        permanent: policy.permanent,
                        retry_in: match outcome {
                            FailOutcome::Retry { ready_at_ms } => {
                                Some(Duration::from_millis(ready_at_ms.saturating_sub(now_ms())))
                            }
                            FailOutcome::Failed => None,
                        },
                    });
                }
                if let Ok(FailOutcome::Failed) = &r {
                    self.shared.failed_for_good(pid);
                }
                match &r {
                    Ok(FailOutcome::Retry { ready_at_ms }) => tracing::info!(
                        pid,
                        piece_from,
                        "attempt {} of {} failed, retrying in {}: {reason}",
                        lease.attempt,
                        self.settings.max_attempts,
                        crate::duration::ms(ready_at_ms.saturating_sub(now_ms()) as f64),
                    ),
                    Ok(FailOutcome::Failed) if policy.permanent => tracing::warn!(
                        pid,
                        piece_from,
                        "partition failed on attempt {} (permanent, not retried): {reason}",
                        lease.attempt
                    ),
                    Ok(FailOutcome::Failed) => tracing::warn!(
                        pid,
                        piece_from,
                        "partition failed after {} attempt(s): {reason}",
                        lease.attempt
                    ),
                    Err(_) => {}
                }
                r.map(|_| ())
            }
            Ended::Broken(reason) => {
                // Not the partition's fault: its attempt goes back, and the run stops.
                self.shared.broken(reason);
                self.shared.released.fetch_add(1, Relaxed);
                self.shared.emit(|| Event::Released { pid });
                self.release(&lease, &hold, checkpoint).await
            }
            Ended::Stopped => {
                self.shared.released.fetch_add(1, Relaxed);
                self.shared.emit(|| Event::Released { pid });
                self.release(&lease, &hold, checkpoint).await
            }
            Ended::Lost => Err(ActiveError::LeaseLost {
                pid,
                token: lease.token,
            }),
        };
        self.shared.timed_update(update);
        match result {
            Ok(()) => {}
            Err(ActiveError::LeaseLost { .. }) => {
                self.shared.lost.fetch_add(1, Relaxed);
                self.shared.emit(|| Event::LeaseLost { pid });
                tracing::warn!(
                    pid,
                    "lease lost to another worker (expired); its result is dropped"
                );
            }
            Err(err) => {
                tracing::warn!(pid, %err, "could not report the partition; its lease will expire");
                self.shared.store_error(StoreOp::Report, &err);
            }
        }
        self.shared.in_flight.fetch_sub(1, Relaxed);
    }

    /// Gives the lease back, a partition's or a piece's, with its checkpoint.
    async fn release(
        &self,
        lease: &Lease,
        hold: &Hold,
        checkpoint: u64,
    ) -> Result<(), ActiveError> {
        if hold.piece {
            self.active.release_piece(lease, checkpoint).await
        } else {
            self.active.release(lease, checkpoint).await
        }
    }

    /// Runs the partition's chunks from its checkpoint. Returns how it ended and the
    /// checkpoint reached (an ID: every ID below it is done).
    async fn chunks(&self, lease: &Lease, hold: &Arc<Hold>) -> (Ended, u64) {
        // Live settings apply from a partition's start (`tranche set --chunk`).
        let chunk = self.gate.chunk();
        if let Some(sizer) = self.gate.sizer() {
            return Box::pin(self.timed(lease, hold, sizer)).await;
        }
        let ids = (lease.max_id - lease.min_id) as u128 + 1;
        let n_chunks = ids.div_ceil(chunk as u128) as u64;
        let first = lease.progress.saturating_sub(lease.min_id) / chunk;
        // The range ends where the lease ends now: a split cuts it short (`held`).
        let min_id = lease.min_id;
        let end = hold.clone();
        let checkpoint = move |done: u64| {
            let id = min_id as u128 + done as u128 * chunk as u128;
            id.min(end.end() as u128 + 1).min(u64::MAX as u128) as u64
        };
        if first >= n_chunks {
            return (Ended::Done, checkpoint(n_chunks));
        }
        if n_chunks - first == 1 {
            return self.last_chunk(lease, hold, first, chunk, checkpoint).await;
        }
        // Boxed: the window's state would otherwise make every partition's task as big
        // as the largest, and a task is copied when it is spawned.
        Box::pin(self.windowed(lease, hold, first, n_chunks, chunk, checkpoint)).await
    }

    /// Runs chunks `first..n_chunks` through the sliding window, at most `--parallel`
    /// at once; the checkpoint follows the window's low-water mark.
    async fn windowed(
        &self,
        lease: &Lease,
        hold: &Arc<Hold>,
        first: u64,
        n_chunks: u64,
        chunk: u64,
        checkpoint: impl Fn(u64) -> u64 + Clone + Send + 'static,
    ) -> (Ended, u64) {
        let mut permits = crate::control::Permits::new(self.gate.clone());
        let window = SlidingWindow::new(
            permits.window(self.settings.parallel, self.settings.window),
            first,
        );
        let failure = Failure::default();

        // A signal, a lost lease or a fenced one closes the window, which stops the
        // issuing below (waking it if it is parked on a full window).
        let fenced = AtomicBool::new(false);
        let closer = self.closer(lease.pid, hold, &window, &fenced);
        let mut running = JoinSet::new();
        // Whether the partition's span is enabled: only then are the gate's waits timed.
        let traced = super::spans::in_enabled_span();
        let issue = async {
            for _ in first..n_chunks {
                let Ok(permit) = permits.acquire().await else {
                    break;
                };
                // The window hands out first, first + 1, ...: one number per turn.
                let Ok(index) = window.next().await else {
                    break;
                };
                let from = lease.min_id + index * chunk;
                // Past the lease's end once a split cut it: nothing more to issue.
                let Some(to) = hold.issue(from, chunk).await else {
                    break;
                };
                // Throttled or rate-limited: wait here (the closer above still ends it).
                let ids = to - from + 1;
                super::spans::gate_wait(
                    traced,
                    ids,
                    self.gate.chunk_start(ids, self.shared.rate_limit_failed()),
                )
                .await;
                let c = Chunk {
                    pid: lease.pid,
                    index,
                    from,
                    to,
                    attempt: lease.attempt,
                    fence: lease.token,
                };
                let span = super::spans::chunk(&c);
                let (job, window, failure, stop, shared, hold, checkpoint) = (
                    self.settings.job.clone(),
                    window.clone(),
                    failure.clone(),
                    self.stop.clone(),
                    self.shared.clone(),
                    hold.clone(),
                    checkpoint.clone(),
                );
                running.spawn(async move {
                    let fence = hold.fence();
                    let abort = abort(stop, hold.clone());
                    let r = shared.chunk(&job, c, abort, fence, span).await;
                    drop(permit);
                    settle(r, index, &window, &failure);
                    // The checkpoint follows the chunks as they finish, for the beats:
                    // what a reclaim resumes from, and the remainder a split divides.
                    hold.advance(checkpoint(window.progress()));
                });
            }
        };
        tokio::pin!(closer);
        tokio::select! {
            () = issue => {}
            () = &mut closer => {}
        }
        // Let in-flight chunks finish; once the grace period is over each one stops its
        // process group itself. The checkpoint moves with them, for the heartbeats.
        loop {
            tokio::select! {
                next = running.join_next() => {
                    hold.advance(checkpoint(window.progress()));
                    if next.is_none() { break }
                }
                () = &mut closer => {}
            }
        }
        let done = checkpoint(window.progress());
        // `issue` stops at a fence before the closer may have said so.
        if hold.is_lost() || fenced.load(Relaxed) || hold.is_fenced() {
            return (Ended::Lost, done);
        }
        if let Some(ended) = failed(&failure) {
            return (ended, done);
        }
        // The chunks up to the lease's end now (fewer than `n_chunks` once cut).
        let ids = (hold.end() - lease.min_id) as u128 + 1;
        let n_now = ids.div_ceil(chunk as u128).min(n_chunks as u128) as u64;
        if window.progress() >= n_now {
            (Ended::Done, done)
        } else {
            (Ended::Stopped, done)
        }
    }

    /// A partition with one chunk left runs it directly: no window, no permits, no
    /// task of its own. A drain lets it finish; the end of the grace period stops it.
    async fn last_chunk(
        &self,
        lease: &Lease,
        hold: &Arc<Hold>,
        index: u64,
        chunk: u64,
        checkpoint: impl Fn(u64) -> u64,
    ) -> (Ended, u64) {
        let from = lease.min_id + index * chunk;
        let Some(to) = hold.issue(from, chunk).await else {
            if hold.is_lost() || hold.is_fenced() {
                return (Ended::Lost, checkpoint(index));
            }
            return (Ended::Done, checkpoint(index));
        };
        let c = Chunk {
            pid: lease.pid,
            index,
            from,
            to,
            attempt: lease.attempt,
            fence: lease.token,
        };
        let mut stop = self.stop.clone();
        let traced = super::spans::in_enabled_span();
        let ids = c.to - c.from + 1;
        // Biased, the gate first: with no limit it is open at once, and nothing else is
        // polled (no waiter registered) on the path every one-chunk partition takes.
        tokio::select! {
            biased;
            () = super::spans::gate_wait(traced, ids, self.gate.chunk_start(ids, self.shared.rate_limit_failed())) => {}
            () = until(&mut stop, |s| *s != Stop::Running) => return (Ended::Stopped, checkpoint(index)),
            () = hold.lost() => return (Ended::Lost, checkpoint(index)),
            () = hold.fenced() => return (Ended::Lost, checkpoint(index)),
        }
        let fenced = AtomicBool::new(false);
        let abort = async {
            let grace = abort(self.stop.clone(), hold.clone()).await;
            fenced.store(hold.is_fenced(), Relaxed);
            grace
        };
        let fence = hold.fence();
        let span = super::spans::chunk(&c);
        match self
            .shared
            .chunk(&self.settings.job, c, abort, fence, span)
            .await
        {
            _ if hold.is_lost() || fenced.load(Relaxed) => (Ended::Lost, checkpoint(index)),
            Ok(()) => (Ended::Done, checkpoint(index + 1)),
            Err(ChunkError::Failed(reason)) => (
                Ended::Failed(reason, FailPolicy::default()),
                checkpoint(index),
            ),
            Err(ChunkError::Refused(reason, policy)) => {
                (Ended::Failed(reason, policy), checkpoint(index))
            }
            Err(ChunkError::Broken(reason)) => (Ended::Broken(reason), checkpoint(index)),
            Err(ChunkError::Interrupted) => (Ended::Stopped, checkpoint(index)),
        }
    }
}

/// What stops a running chunk, and how long it then has before it is killed: the end of
/// the drain's grace period ([`KILL_AFTER`]), or its lease going unrenewed too long
/// (until shortly before the lease could expire, so that no other worker can have
/// reclaimed the partition while the chunk still runs).
async fn abort(mut stop: watch::Receiver<Stop>, hold: Arc<Hold>) -> Duration {
    tokio::select! {
        () = until(&mut stop, |s| *s == Stop::Abort) => KILL_AFTER,
        () = hold.fenced() => hold.grace_left(),
    }
}

/// The first failure among a partition's chunks: whether the command is broken, the
/// reason, and the policy the handler asked for.
type Failure = Arc<Mutex<Option<(bool, String, FailPolicy)>>>;

/// What a finished chunk does to its partition's window: acked, or closed (nothing
/// more is issued) with the first failure kept for the outcome.
fn settle(r: Result<(), ChunkError>, index: u64, window: &SlidingWindow, failure: &Failure) {
    let first = match r {
        Ok(()) => {
            let _ = window.ack(index);
            return;
        }
        // Stopped by our shutdown: unacked, so the checkpoint stays below it.
        Err(ChunkError::Interrupted) => None,
        Err(ChunkError::Failed(reason)) => Some((false, reason, FailPolicy::default())),
        Err(ChunkError::Refused(reason, policy)) => Some((false, reason, policy)),
        Err(ChunkError::Broken(reason)) => Some((true, reason, FailPolicy::default())),
    };
    if let Some(first) = first {
        failure.lock().expect("not poisoned").get_or_insert(first);
    }
    window.close();
}

/// How a partition ended if one of its chunks failed.
fn failed(failure: &Failure) -> Option<Ended> {
    Some(match failure.lock().expect("not poisoned").take()? {
        (true, reason, _) => Ended::Broken(reason),
        (false, reason, policy) => Ended::Failed(reason, policy),
    })
}
