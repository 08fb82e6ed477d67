//! `tranche run`: claim partitions, run each one's chunks through a sliding window,
//! report the outcome, and keep the reaper, the archiver and the worker heartbeat going
//! beside it until nothing is left (or a signal says stop).
//!
//! The design choice a reader might get wrong: **the checkpoint is the window's
//! low-water mark, never "the chunks that finished".** Chunks finish out of order; the
//! heartbeat sends `min_id + progress × chunk`, below which every ID is done. A
//! partition reclaimed after a crash restarts at its first unfinished chunk and redoes
//! at most one window of chunks above it, so `--exec` commands must be idempotent.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tranche_active_store::{ActiveStore, StatusCounts};
use tranche_archive_store::{SnapshotPolicy, Snapshots};

use crate::backend::Backend;
use crate::error::Error;
use crate::event::{Event, Progress, StoreOp};
use crate::held::{self, LeaseBook};
use crate::job::{Chunk, ChunkError, Job};
use crate::sync::until;
use tranche_control::ControlStore;

mod claim;
mod partition;
mod recent;
mod spans;
mod split;
mod tasks;

use claim::claim_loop;
pub(crate) use tasks::drain_archive;
use tasks::{reaper, worker_heartbeat};

/// What a signal asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Stop {
    /// Keep going.
    Running,
    /// Stop claiming; let in-flight chunks finish, then checkpoint and release.
    Draining,
    /// The grace period is over (or a second signal came): every in-flight chunk stops
    /// its process group now, and its partition is released.
    Abort,
}

/// How `run` works.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) job: Job,
    pub(crate) chunk: u64,
    pub(crate) parallel: usize,
    pub(crate) window: usize,
    pub(crate) concurrency: usize,
    /// Claimed leases queued beyond `concurrency`, so a finished partition is replaced
    /// without waiting for a claim; `None` chooses by how long partitions take
    /// ([`auto_prefetch`]).
    pub(crate) prefetch: Option<usize>,
    pub(crate) worker: String,
    pub(crate) lease: Duration,
    /// Attempts before a partition ends failed (for the retry log lines).
    pub(crate) max_attempts: u32,
    pub(crate) follow: bool,
    /// Stop once this process has nothing running and a claim found nothing, rather
    /// than wait for the namespace to drain (others' leases, retries in back-off).
    pub(crate) until_idle: bool,
    pub(crate) reaper: bool,
    pub(crate) archiver: bool,
    pub(crate) heartbeat: bool,
    /// When the archiver publishes statistics snapshots.
    pub(crate) snapshots: SnapshotPolicy,
    /// How often the embedded backend saves its state while running.
    pub(crate) save_every: Duration,
    /// What watches the run from outside (the command line's progress and
    /// `--metrics-listen`), if anything.
    pub(crate) observer: Option<Arc<dyn Observer>>,
    /// Rate limits, probes and active hours of the worker's own (`crate::control`).
    pub(crate) control: crate::control::Options,
    /// Whether idle slots split other workers' running partitions, and this process's
    /// own may be cut (`--no-split` turns it off).
    pub(crate) split: bool,
    /// The smallest piece a split cuts off, in chunks (`--split-min`).
    pub(crate) split_min: u64,
    /// Puts the partition and chunk spans into distributed traces, if anything does.
    pub(crate) trace: Option<Arc<dyn crate::trace::TraceContext>>,
}

/// Something attached to a run from outside the engine: how the command line hangs its
/// progress reporter and its `--metrics-listen` server on a run without the run loop
/// knowing either. Small and internal on purpose: a later step turns it into public
/// typed events.
#[async_trait::async_trait]
pub(crate) trait Observer: Send + Sync {
    /// Called once as the run starts, before its first claim, with what it may read
    /// of the run. Tasks it spawns on `background` must end once `done` turns true: the
    /// run waits for them before it drains the archive and reports.
    async fn attach(
        &self,
        watched: Watched,
        done: watch::Receiver<bool>,
        background: &mut JoinSet<()>,
    ) -> Result<(), Error>;

    /// Something happened in the run (called inline: return quickly).
    fn event(&self, event: &Event);

    /// The run is over; `counts` is where the namespace stands.
    fn finish(&self, counts: &StatusCounts);
}

/// What an [`Observer`] reads of a run, and nothing more: the namespace's active store,
/// its control store where the fleet shares one (Redis), and this run's counters.
#[derive(Clone)]
// Read by the command line's observers (`--metrics-listen`, the progress bar) only.
#[cfg_attr(not(feature = "cli"), allow(dead_code))]
pub(crate) struct Watched {
    /// The namespace's partitions, pause flag and workers.
    pub(crate) active: Arc<dyn ActiveStore>,
    /// The control record; `None` embedded, where nothing throttles by hand.
    pub(crate) control: Option<Arc<dyn ControlStore>>,
    /// This run's counters.
    pub(crate) counters: Counters,
}

/// This run's counters, to be read at one instant ([`Counters::snapshot`]) and never
/// written from outside the run loop.
#[derive(Clone)]
#[cfg_attr(not(feature = "cli"), allow(dead_code))]
pub(crate) struct Counters(Arc<Shared>);

#[cfg_attr(not(feature = "cli"), allow(dead_code))]
impl Counters {
    /// The counters now.
    pub(crate) fn snapshot(&self) -> SharedSnapshot {
        self.0.snapshot()
    }
}

impl std::fmt::Debug for dyn Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Observer")
    }
}

/// What this process did, for the summary.
#[derive(Debug)]
// `broken` and `stalls` are the command line's to print.
#[cfg_attr(not(feature = "cli"), allow(dead_code))]
pub(crate) struct Report {
    pub(crate) completed: u64,
    pub(crate) failed_attempts: u64,
    pub(crate) released: u64,
    pub(crate) lost: u64,
    pub(crate) elapsed: Duration,
    pub(crate) durations_ms: Histogram<u64>,
    /// The namespace's counts when the run ended.
    pub(crate) counts: StatusCounts,
    /// Whether a signal ended the run.
    pub(crate) interrupted: bool,
    /// Why the command cannot run, if a chunk showed it (the run stopped at once).
    pub(crate) broken: Option<String>,
    /// Partitions that ended failed here.
    pub(crate) failed_pids: Vec<u64>,
    /// Rows the chunks run here affected, if the handler counts them
    /// ([`crate::Handler::process_counted`]).
    pub(crate) rows: Option<u64>,
    /// The shards whose archive stalled in the final drain, their entries left in the
    /// inbox until repaired (empty when the drain archived everything or did not run).
    pub(crate) stalls: Vec<tranche_archive_store::Stall>,
}

/// [`Shared`]'s counters at one instant.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(feature = "cli"), allow(dead_code))]
pub(crate) struct SharedSnapshot {
    pub(crate) in_flight: u64,
    pub(crate) claimed: u64,
    pub(crate) chunks_in_flight: u64,
    pub(crate) completed: u64,
    pub(crate) failed_attempts: u64,
    pub(crate) released: u64,
    pub(crate) lost: u64,
    /// Rows the chunks affected (0 when the handler does not count them).
    pub(crate) rows: u64,
    /// Failed calls to the store, by what the run was doing.
    pub(crate) store_errors: [(StoreOp, u64); StoreOp::ALL.len()],
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
}

/// Counters shared by the partition tasks and the worker heartbeat.
pub(crate) struct Shared {
    completed: AtomicU64,
    failed_attempts: AtomicU64,
    released: AtomicU64,
    lost: AtomicU64,
    in_flight: AtomicU64,
    /// Leases this process claimed.
    claimed: AtomicU64,
    /// Chunks running now.
    chunks_in_flight: AtomicU64,
    /// Partitions whose chunks still run ([`Working`]): what `--concurrency` bounds. A
    /// partition whose chunks are done and whose outcome is on its way to the store
    /// holds no slot.
    working: AtomicUsize,
    /// Told each time a partition's chunks end (a slot frees before its task does).
    slot_freed: tokio::sync::Notify,
    /// Told of every chunk's duration, if anything watches the run.
    observer: Option<Arc<dyn Observer>>,
    /// Partition durations, ms.
    durations_ms: Mutex<Histogram<u64>>,
    /// Latency of this worker's store updates (heartbeat, complete, fail), µs, over
    /// recent updates only: the seed's "worker update latency" alert reads its p99,
    /// which an outage must not hold high once updates flow again.
    update_us: Mutex<recent::RecentLatency>,
    /// Why the command cannot run, once a chunk showed it: the run stops claiming.
    broken: Mutex<Option<String>>,
    /// Partitions that ended failed here, for the run's report.
    failed_pids: Mutex<Vec<u64>>,
    /// Rows the chunks affected, as the handler counted them; [`NOT_COUNTED`] until a
    /// chunk reports a figure (a command never does).
    rows: AtomicU64,
    /// Rows per lease (partition, token) while its chunks run, taken by the partition
    /// when they are over: the figure of its completion event.
    lease_rows: Mutex<HashMap<(u64, u64), u64>>,
    /// Puts the spans into distributed traces (`spans`), if anything does.
    traced: Option<spans::Traced>,
    /// Failed calls to the store, by [`StoreOp`] (in [`StoreOp::ALL`]'s order).
    store_errors: [AtomicU64; StoreOp::ALL.len()],
}

/// [`Shared::rows`] before any chunk reported rows: no handler count to show.
const NOT_COUNTED: u64 = u64::MAX;

impl Shared {
    pub(crate) fn new(observer: Option<Arc<dyn Observer>>, traced: Option<spans::Traced>) -> Self {
        let hist = || Histogram::new_with_bounds(1, 3_600_000_000, 2).expect("valid bounds");
        Self {
            completed: AtomicU64::new(0),
            failed_attempts: AtomicU64::new(0),
            released: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            claimed: AtomicU64::new(0),
            chunks_in_flight: AtomicU64::new(0),
            working: AtomicUsize::new(0),
            slot_freed: tokio::sync::Notify::new(),
            observer,
            durations_ms: Mutex::new(hist()),
            update_us: Mutex::new(recent::RecentLatency::new(Instant::now())),
            broken: Mutex::new(None),
            failed_pids: Mutex::new(Vec::new()),
            rows: AtomicU64::new(NOT_COUNTED),
            lease_rows: Mutex::new(HashMap::new()),
            traced,
            store_errors: Default::default(),
        }
    }

    /// Rows the chunks affected so far, if the handler counts them.
    pub(crate) fn rows(&self) -> Option<u64> {
        Some(self.rows.load(Relaxed)).filter(|&n| n != NOT_COUNTED)
    }

    /// Counts the rows one chunk of the lease (`pid`, `token`) affected.
    fn count_rows(&self, pid: u64, token: u64, rows: u64) {
        // From NOT_COUNTED to the first figure, then added to.
        let _ = self.rows.fetch_update(Relaxed, Relaxed, |n| {
            Some(if n == NOT_COUNTED {
                rows
            } else {
                n.saturating_add(rows)
            })
        });
        *self
            .lease_rows
            .lock()
            .expect("not poisoned")
            .entry((pid, token))
            .or_default() += rows;
    }

    /// The rows the chunks of the lease (`pid`, `token`) affected, once they are all
    /// over; `None` when none reported a figure.
    pub(crate) fn take_rows(&self, pid: u64, token: u64) -> Option<u64> {
        self.lease_rows
            .lock()
            .expect("not poisoned")
            .remove(&(pid, token))
    }

    /// Counts a failed call to the store and tells the observer ([`Event::StoreError`]).
    /// Logging it, in the words of what failed, is the caller's.
    pub(crate) fn store_error(&self, op: StoreOp, error: &dyn std::fmt::Display) {
        let i = StoreOp::ALL
            .iter()
            .position(|&o| o == op)
            .expect("every op is in ALL");
        self.store_errors[i].fetch_add(1, Relaxed);
        self.emit(|| Event::StoreError {
            op,
            error: error.to_string(),
        });
    }

    /// What the gate tells of a rate limiter it could not reach: a failed
    /// [`StoreOp::RateLimit`] call.
    pub(crate) fn rate_limit_failed(&self) -> impl Fn(&dyn std::fmt::Display) + '_ {
        |err| self.store_error(StoreOp::RateLimit, err)
    }

    /// Tells the observer, if any, of the event `f` makes (made only if one listens).
    pub(crate) fn emit(&self, f: impl FnOnce() -> Event) {
        if let Some(observer) = &self.observer {
            observer.event(&f());
        }
    }

    /// Records a partition that ended failed here.
    pub(crate) fn failed_for_good(&self, pid: u64) {
        self.failed_pids.lock().expect("not poisoned").push(pid);
    }

    /// This run's counters now, as [`Event::Progress`] carries them.
    pub(crate) fn progress(&self, elapsed: Duration) -> Progress {
        Progress {
            claimed: self.claimed.load(Relaxed),
            completed: self.completed.load(Relaxed),
            attempts_failed: self.failed_attempts.load(Relaxed),
            released: self.released.load(Relaxed),
            lost: self.lost.load(Relaxed),
            in_flight: self.in_flight.load(Relaxed),
            chunks_in_flight: self.chunks_in_flight.load(Relaxed),
            elapsed,
        }
    }

    /// The counters at one instant, for `--metrics-listen`.
    #[cfg_attr(not(feature = "cli"), allow(dead_code))]
    pub(crate) fn snapshot(&self) -> SharedSnapshot {
        let (p50_ms, p99_ms) = {
            let h = self.durations_ms.lock().expect("not poisoned");
            (
                h.value_at_quantile(0.5) as f64,
                h.value_at_quantile(0.99) as f64,
            )
        };
        SharedSnapshot {
            in_flight: self.in_flight.load(Relaxed),
            claimed: self.claimed.load(Relaxed),
            chunks_in_flight: self.chunks_in_flight.load(Relaxed),
            completed: self.completed.load(Relaxed),
            failed_attempts: self.failed_attempts.load(Relaxed),
            released: self.released.load(Relaxed),
            lost: self.lost.load(Relaxed),
            rows: self.rows().unwrap_or(0),
            store_errors: std::array::from_fn(|i| {
                (StoreOp::ALL[i], self.store_errors[i].load(Relaxed))
            }),
            p50_ms,
            p99_ms,
        }
    }

    /// Records that the command cannot run (the first reason is kept).
    fn broken(&self, reason: String) {
        let mut broken = self.broken.lock().expect("not poisoned");
        if broken.is_none() {
            tracing::error!(%reason, "the command cannot run; stopping");
            *broken = Some(reason);
        }
    }

    fn is_broken(&self) -> bool {
        self.broken.lock().expect("not poisoned").is_some()
    }

    /// Runs one chunk, counted in flight and timed for the observer; `fence` is its
    /// lease's ([`crate::held::Hold::fence`]), `span` its own ([`spans::chunk`], made
    /// where it was issued, under its partition's span), attached only when enabled.
    async fn chunk(
        &self,
        job: &Job,
        c: Chunk,
        abort: impl std::future::Future<Output = Duration>,
        fence: crate::job::Fence,
        span: tracing::Span,
    ) -> Result<(), ChunkError> {
        self.chunks_in_flight.fetch_add(1, Relaxed);
        let started = Instant::now();
        let result = if span.is_disabled() {
            match spans::unsampled(&c, self.traced.as_ref()) {
                None => job.run(c, abort, Some(fence)).await,
                // Unsampled: flags 00 for its command and handler. Boxed as below.
                Some(tp) => {
                    Box::pin(crate::trace::scoped(&c, tp, job.run(c, abort, Some(fence)))).await
                }
            }
        } else {
            // Boxed: the traced path's state stays out of every chunk's future.
            Box::pin(self.traced_chunk(job, c, abort, fence, &span, started)).await
        };
        let rows = result.as_ref().ok().copied().flatten();
        if let Some(rows) = rows {
            self.count_rows(c.pid, c.fence, rows);
        }
        self.emit(|| Event::ChunkDone {
            pid: c.pid,
            index: c.index,
            duration: started.elapsed(),
            ok: result.is_ok(),
            rows,
        });
        self.chunks_in_flight.fetch_sub(1, Relaxed);
        result.map(drop)
    }

    /// [`Shared::chunk`]'s run under an enabled span: the chunk's trace context handed
    /// to its command and handler, its outcome recorded.
    async fn traced_chunk(
        &self,
        job: &Job,
        c: Chunk,
        abort: impl std::future::Future<Output = Duration>,
        fence: crate::job::Fence,
        span: &tracing::Span,
        started: Instant,
    ) -> Result<crate::job::Rows, ChunkError> {
        use tracing::Instrument;
        let run = job.run(c, abort, Some(fence)).instrument(span.clone());
        let result = match spans::traceparent(span, self.traced.as_ref()) {
            Some(tp) => crate::trace::scoped(&c, tp, run).await,
            None => run.await,
        };
        spans::chunk_ended(span, started, &result);
        result
    }

    /// The mean partition duration so far, ms (`None` before the first).
    fn mean_ms(&self) -> Option<f64> {
        let h = self.durations_ms.lock().expect("not poisoned");
        (!h.is_empty()).then(|| h.mean())
    }

    /// The median partition duration so far (`None` before the first).
    fn median(&self) -> Option<Duration> {
        let h = self.durations_ms.lock().expect("not poisoned");
        (!h.is_empty()).then(|| Duration::from_millis(h.value_at_quantile(0.5)))
    }

    pub(crate) fn timed_update(&self, started: Instant) {
        let us = started.elapsed().as_micros().clamp(1, 3_600_000_000) as u64;
        self.update_us
            .lock()
            .expect("not poisoned")
            .record(us, Instant::now());
    }
}

/// Runs until the namespace has nothing outstanding (or, with `follow`, until a signal).
pub(crate) async fn run(
    backend: &Backend,
    settings: Settings,
    stop: watch::Receiver<Stop>,
) -> Result<Report, Error> {
    let started = Instant::now();
    let traced = settings.trace.clone().map(|ctx| spans::Traced {
        ctx,
        namespace: backend.namespace.clone(),
        plans: Mutex::new(Vec::new()),
    });
    let shared = Arc::new(Shared::new(settings.observer.clone(), traced));
    let beats = shared.clone();
    let book =
        LeaseBook::new(settings.lease, settings.split).on_failed_beat(Box::new(move |err| {
            beats.store_error(StoreOp::Heartbeat, err)
        }));
    let book = Arc::new(book);
    let (bg_tx, bg_rx) = watch::channel(false);
    let mut background = JoinSet::new();
    let timed = shared.clone();
    background.spawn(held::heartbeat(
        book.clone(),
        backend.active.clone(),
        Arc::new(move |at| timed.timed_update(at)),
        settings.lease,
        bg_rx.clone(),
    ));
    if settings.reaper {
        background.spawn(reaper(
            backend.active.clone(),
            settings.lease,
            shared.clone(),
            bg_rx.clone(),
        ));
    }
    if settings.heartbeat {
        background.spawn(worker_heartbeat(
            backend.active.clone(),
            settings.worker.clone(),
            shared.clone(),
            bg_rx.clone(),
        ));
    }
    if settings.archiver {
        let archive = backend.archive.clone();
        let snapshots = Snapshots {
            stats: backend.stats.clone(),
            policy: settings.snapshots,
        };
        let mut rx = bg_rx.clone();
        background.spawn(async move {
            tranche_archive_store::run(archive.as_ref(), Some(snapshots), async move {
                let _ = rx.wait_for(|done| *done).await;
            })
            .await;
        });
    }
    if let Some(observer) = &settings.observer {
        let watched = Watched {
            active: backend.active.clone(),
            control: (!backend.is_embedded()).then(|| crate::control::stores(backend).0),
            counters: Counters(shared.clone()),
        };
        observer
            .attach(watched, bg_rx.clone(), &mut background)
            .await?;
        let (shared, mut done) = (shared.clone(), bg_rx.clone());
        background.spawn(async move {
            loop {
                tokio::select! {
                    () = until(&mut done, |d| *d) => return,
                    () = tokio::time::sleep(PROGRESS_EVERY) => {}
                }
                shared.emit(|| Event::Progress(shared.progress(started.elapsed())));
            }
        });
    }

    let base = crate::control::Base {
        concurrency: settings.concurrency,
        parallel: settings.parallel,
        chunk: settings.chunk,
    };
    let gate = crate::control::Gate::start(backend, &settings.control, base, &settings.worker);
    let gate = Arc::new(gate.await?);
    let (s, closed) = (shared.clone(), gate.watch_closed());
    let emit = move |e: Event| s.emit(|| e);
    background.spawn(crate::event::announce_throttle(closed, emit, bg_rx.clone()));
    let outcome = claim_loop(backend, &settings, &shared, &book, &gate, stop.clone()).await;
    gate.retire().await;
    drop(gate);

    // Background work stops only after the partitions: a heartbeat or reap between
    // the last release and here is harmless, a missing one is not.
    let _ = bg_tx.send(true);
    while background.join_next().await.is_some() {}
    let interrupted = *stop.borrow() != Stop::Running;
    let mut stalls = Vec::new();
    if settings.archiver && *stop.borrow() != Stop::Abort {
        stalls = drain_archive(backend, Some(&shared), &stop).await;
        if !stalls.is_empty() {
            let shards: Vec<String> = stalls.iter().map(|s| s.shard.to_string()).collect();
            tracing::warn!(
                shards = %shards.join(", "),
                "archive stalled; its entries stay in the inbox until the shard is repaired (`tranche check --repair`)"
            );
        }
        if let Err(err) = backend.stats.publish_snapshot().await {
            tracing::warn!(%err, "statistics snapshot failed");
            shared.store_error(StoreOp::Archive, &err);
        }
    }
    if settings.heartbeat
        && let Err(err) = backend.active.deregister(&settings.worker).await
    {
        tracing::warn!(%err, "could not deregister the worker");
    }
    let counts = backend.active.counts().await?;
    if let Some(observer) = &settings.observer {
        observer.finish(&counts);
    }
    backend.save().await?;
    outcome?;
    let durations_ms = shared.durations_ms.lock().expect("not poisoned").clone();
    Ok(Report {
        completed: shared.completed.load(Relaxed),
        failed_attempts: shared.failed_attempts.load(Relaxed),
        released: shared.released.load(Relaxed),
        lost: shared.lost.load(Relaxed),
        elapsed: started.elapsed(),
        durations_ms,
        counts,
        interrupted,
        broken: shared.broken.lock().expect("not poisoned").take(),
        failed_pids: std::mem::take(&mut *shared.failed_pids.lock().expect("not poisoned")),
        rows: shared.rows(),
        stalls,
    })
}

/// How often a run with an observer sends [`Event::Progress`].
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// A partition's hold on one of the run's `--concurrency` slots, from its start until its
/// chunks end (dropped then, or with its task if that is dropped first). The slot frees
/// while the partition's outcome is still on its way to the store, so the next
/// partition starts during that round trip instead of after it: what the slots bound is
/// the work the job's handler does at once, and a partition waiting on a group commit
/// does none.
pub(super) struct Working(Arc<Shared>);

impl Working {
    fn new(shared: &Arc<Shared>) -> Self {
        shared.working.fetch_add(1, Relaxed);
        Self(shared.clone())
    }
}

impl Drop for Working {
    fn drop(&mut self) {
        self.0.working.fetch_sub(1, Relaxed);
        // A permit if the claim loop is not waiting now: it looks again at once.
        self.0.slot_freed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--metrics-listen`'s `store_errors_total{op}` reads these counts: each failed
    /// call under its own operation, every other at 0.
    #[test]
    fn failed_store_calls_are_counted_by_operation() {
        let shared = Shared::new(None, None);
        shared.store_error(StoreOp::Claim, &"connection reset");
        shared.store_error(StoreOp::Claim, &"connection reset");
        shared.store_error(StoreOp::Archive, &"timed out");
        let counts = shared.snapshot().store_errors;
        assert_eq!(counts.len(), StoreOp::ALL.len());
        for (op, n) in counts {
            let want = match op {
                StoreOp::Claim => 2,
                StoreOp::Archive => 1,
                _ => 0,
            };
            assert_eq!(n, want, "{op}");
        }
    }
}
