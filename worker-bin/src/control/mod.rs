//! The run loop's admission gate: the namespace's control record (`tranche set`,
//! `tranche throttle`, the probes) and the worker's own options turned into "may a
//! claim be made / a chunk start now, and with what settings".
//!
//! One [`Gate`] per run. It polls the record once a second through a
//! [`ControlWatcher`] (the only cost when no limit or probe is set: no call per claim
//! or chunk), and an applier task turns each record change into the pacers' rates, the
//! live concurrency, chunk and parallelism, and one "closed" reason (a throttle, or
//! outside the active hours) that it logs once per change. Claims and chunk starts
//! wait while it is closed; heartbeats and chunks in flight never do, so a throttled
//! partition is never reaped.
//!
//! It fails closed: with a probe configured, the gate stays closed until this worker's
//! own prober has a fresh go in force (from before the first claim), while its probe
//! errs or cannot report, and while any live prober of the fleet throttles; a finding
//! nobody renews throttles too unless `--probe-stale go`. Values of the record that
//! break the write rules are ignored one by one, each logged once with a WARN naming
//! its key and value, and the worker's own option applies in their place.

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tranche_codec::{Clock, SystemClock};
use tranche_control::{
    ActiveHours, Change, ControlRecord, ControlStore, ControlWatcher, Limit, MemoryControlStore,
    MemoryRateLimiter, OwnProbe, Pacer, Probe, ProbeStale, Prober, ProberConfig, Rate, RateLimiter,
    RedisControlStore, RedisRateLimiter, Rejected,
};

use crate::backend::Backend;
use crate::error::Error;

pub(crate) mod policy;

use policy::{aimd_step, first_size};
pub(crate) use policy::{closed_reason, ids_rate_as_of};

type Result<T, E = Error> = std::result::Result<T, E>;

/// The worker's own control options (`run`'s flags, the runner's builder): in force
/// for every setting the namespace's control record leaves unset.
#[derive(Debug, Clone, Default)]
pub(crate) struct Options {
    /// `--max-rate`, IDs per second fleet-wide.
    pub(crate) max_rate: Option<Rate>,
    /// `--max-partitions-rate`, partitions claimed per second fleet-wide.
    pub(crate) max_partitions_rate: Option<Rate>,
    /// `--throttle-exec`, `--throttle-http` or the runner's closure.
    pub(crate) probe: Option<Arc<dyn Probe>>,
    /// `--throttle-interval` (zero: [`DEFAULT_INTERVAL`]).
    pub(crate) throttle_interval: Duration,
    /// `--probe-stale`: what a probe finding nobody renews means (default: throttle).
    pub(crate) probe_stale: ProbeStale,
    /// `--keep-below`: written into the record, where the leading prober reads it.
    pub(crate) keep_below: Option<f64>,
    /// `--active-hours` with `--tz`.
    pub(crate) active_hours: Option<ActiveHours>,
    /// `--chunk-time` with `--chunk-min` and `--chunk-max`: chunks sized by time.
    pub(crate) chunk_time: Option<ChunkTime>,
    /// The library's live handle, if one was taken.
    pub(crate) handle: Option<ControlHandle>,
}

/// Chunks sized to take `target` each, within `min..=max` IDs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ChunkTime {
    pub(crate) target: Duration,
    pub(crate) min: u64,
    pub(crate) max: u64,
}

/// How often probes run when `--throttle-interval` is not given.
pub(crate) const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);

/// A live handle on one worker's control, from
/// [`Runner::control`](crate::Runner::control): it changes this runner's own
/// rate limit, concurrency, parallelism and chunk size while it runs (applied at once),
/// not the other workers of the job. What the namespace's control record sets
/// (`tranche set`, which every worker applies) still takes precedence.
#[derive(Debug, Clone, Default)]
pub struct ControlHandle {
    own: Arc<watch::Sender<Own>>,
}

/// The handle's overrides of the worker's own options (`None`: unchanged).
#[derive(Debug, Clone, Default, PartialEq)]
struct Own {
    max_rate: Option<Option<Rate>>,
    concurrency: Option<usize>,
    parallel: Option<usize>,
    chunk: Option<u64>,
}

impl ControlHandle {
    /// Limits this worker's fleet-wide ID rate to `ids_per_second` (`None`: no limit of
    /// its own). Errs on a rate that is not positive and finite.
    pub fn set_max_rate(&self, ids_per_second: Option<f64>) -> Result<(), crate::error::Error> {
        let rate = ids_per_second
            .map(Rate::per_second)
            .transpose()
            .map_err(|e| Error::Config(format!("invalid rate: {e}")))?;
        self.own.send_modify(|o| o.max_rate = Some(rate));
        Ok(())
    }

    /// Partitions processed at once: more start at once, fewer as running ones finish.
    pub fn set_concurrency(&self, n: usize) {
        self.own.send_modify(|o| o.concurrency = Some(n.max(1)));
    }

    /// Chunks of one partition in flight at once, applied in flight up to each
    /// partition's window (see [`Runner::window`](crate::Runner::window)).
    pub fn set_parallel(&self, n: usize) {
        self.own.send_modify(|o| o.parallel = Some(n.max(1)));
    }

    /// Row IDs per chunk, for partitions started from now on.
    pub fn set_chunk(&self, ids: u64) {
        self.own.send_modify(|o| o.chunk = Some(ids.max(1)));
    }
}

/// The settings in force, shared by the applier and the run loop.
#[derive(Debug)]
struct Live {
    ids: Pacer,
    parts: Pacer,
    concurrency: AtomicUsize,
    parallel: AtomicUsize,
    chunk: AtomicU64,
    chunk_time: Mutex<Option<ChunkTime>>,
    /// The size this worker's last partition sized by time ended on, and the
    /// `chunk_time` it was learned under: where the next such partition (a split piece
    /// too) starts, rather than at `chunk`.
    learned: Mutex<Option<(ChunkTime, u64)>>,
}

/// The admission gate of one run (see the module docs).
#[derive(Debug)]
pub(crate) struct Gate {
    live: Arc<Live>,
    /// Why nothing may be claimed or started now (`None`: open).
    closed: watch::Receiver<Option<String>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// The store and this worker's id, when it probes: a clean stop retires its finding.
    prober: Option<(Arc<dyn ControlStore>, String)>,
}

/// A control store error as the library's.
fn store_error(err: tranche_control::Error) -> Error {
    Error::Other(Box::new(err))
}

/// What a worker writes into the log as the origin of its start-up `--keep-below`: the
/// next start of a worker finds the time of that write by it.
fn start_origin() -> String {
    format!("run:{}", origin())
}

/// The namespace's control store and rate limiter: Redis, or memory embedded.
pub(crate) fn stores(backend: &Backend) -> (Arc<dyn ControlStore>, Arc<dyn RateLimiter>) {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    match backend.redis_parts() {
        Some((conn, schema)) => (
            Arc::new(RedisControlStore::new(conn.clone(), &schema, clock)),
            Arc::new(RedisRateLimiter::new(conn, &schema)),
        ),
        None => (
            Arc::new(MemoryControlStore::new(clock)),
            Arc::new(MemoryRateLimiter::new()),
        ),
    }
}

/// The namespace's control record, once anything was ever set (`None` embedded: a
/// running worker's record lives in its process).
pub(crate) async fn record_of(backend: &Backend) -> Result<Option<ControlRecord>> {
    if backend.is_embedded() {
        return Ok(None);
    }
    let (store, _) = stores(backend);
    let record = store.read().await.map_err(store_error)?;
    Ok((record != ControlRecord::default()).then_some(record))
}

/// Who made a change, for the control log: `user@host/pid`.
pub(crate) fn origin() -> String {
    let user = std::env::var("USER").unwrap_or_else(|_| "?".to_owned());
    format!("{user}@{}/{}", crate::slot::hostname(), std::process::id())
}

/// The worker's own values the gate starts from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Base {
    pub(crate) concurrency: usize,
    pub(crate) parallel: usize,
    pub(crate) chunk: u64,
}

impl Gate {
    /// Starts the gate of a run: the watcher, the applier and, with a probe, the
    /// prober. Errs when the record cannot be read, `--keep-below` has no ceiling or
    /// the probe's settings are out of bounds.
    pub(crate) async fn start(
        backend: &Backend,
        options: &Options,
        base: Base,
        worker: &str,
    ) -> Result<Self> {
        let (store, limiter) = stores(backend);
        let interval = if options.throttle_interval.is_zero() {
            DEFAULT_INTERVAL
        } else {
            options.throttle_interval
        };
        let config = ProberConfig {
            worker: worker.to_owned(),
            interval,
            max_rate: options.max_rate,
            floor: options.max_rate.map_or(1.0, |r| (r.get() / 100.0).max(1.0)),
        };
        if options.probe.is_some() {
            config
                .check()
                .map_err(|e| Error::Config(format!("--throttle-interval: {e}")))?;
        }
        if let Some(target) = options.keep_below {
            if options.max_rate.is_none() {
                return Err(Error::Config(
                    "--keep-below needs a --max-rate as the ceiling of the rate it adjusts"
                        .to_owned(),
                ));
            }
            keep_below_at_start(store.as_ref(), target).await?;
        }
        let watcher = ControlWatcher::start(store.clone(), ControlWatcher::INTERVAL)
            .await
            .map_err(store_error)?;
        let live = Arc::new(Live {
            ids: Pacer::new(limiter.clone(), Limit::Ids, base.chunk.saturating_mul(100)),
            parts: Pacer::new(limiter, Limit::Partitions, 100),
            concurrency: AtomicUsize::new(base.concurrency),
            parallel: AtomicUsize::new(base.parallel),
            chunk: AtomicU64::new(base.chunk),
            chunk_time: Mutex::new(options.chunk_time),
            learned: Mutex::new(None),
        });
        let (closed_tx, closed) = watch::channel(None);
        let mut tasks = Vec::new();
        // An AIMD rate nobody renewed for this long is stale (its prober died), and so
        // is this worker's own last probe result.
        let stale = config.finding_ttl().max(Duration::from_secs(30));
        // This worker's own probe result holds for a finding's life.
        let own_stale = config.finding_ttl();
        let mut prober = None;
        let own_probe = options.probe.as_ref().map(|probe| {
            let (task, own_probe) =
                Prober::new(store.clone(), probe.clone(), Arc::new(SystemClock), config)
                    .spawn_watched();
            tasks.push(task);
            prober = Some((store.clone(), worker.to_owned()));
            (own_probe, own_stale)
        });
        let own = options.handle.clone().unwrap_or_default().own.subscribe();
        tasks.push(tokio::spawn(apply(
            live.clone(),
            watcher,
            own,
            own_probe,
            options.clone(),
            base,
            stale,
            closed_tx,
        )));
        let gate = Self {
            live,
            closed,
            tasks: Mutex::new(tasks),
            prober,
        };
        // The first record is applied before the first claim.
        let mut closed = gate.closed.clone();
        let _ = tokio::time::timeout(Duration::from_secs(1), closed.changed()).await;
        Ok(gate)
    }

    /// Stops the gate's tasks and, when this worker probes, removes its finding from
    /// the record (a clean stop: a finding nobody renews would throttle the fleet).
    pub(crate) async fn retire(&self) {
        for task in self.tasks.lock().expect("not poisoned").drain(..) {
            task.abort();
        }
        if let Some((store, worker)) = &self.prober
            && let Err(err) = store.retire_probe(worker).await
        {
            tracing::warn!(%err, "could not retire this worker's probe finding; it goes stale");
        }
    }

    /// Partitions to run at once now.
    pub(crate) fn concurrency(&self) -> usize {
        self.live.concurrency.load(Relaxed)
    }

    /// Chunks of one partition in flight at once, for a partition starting now.
    pub(crate) fn parallel(&self) -> usize {
        self.live.parallel.load(Relaxed)
    }

    /// IDs per chunk, for a partition starting now.
    pub(crate) fn chunk(&self) -> u64 {
        self.live.chunk.load(Relaxed)
    }

    /// A sizer for a partition starting now, when chunks are sized by time: at the
    /// size the last one learned under the same `chunk_time`, else at `chunk`.
    pub(crate) fn sizer(&self) -> Option<tranche_control::ChunkSizer> {
        let t = (*self.live.chunk_time.lock().expect("not poisoned"))?;
        let learned = *self.live.learned.lock().expect("not poisoned");
        Some(tranche_control::ChunkSizer::new(
            t.target,
            t.min,
            t.max,
            first_size(t, learned, self.chunk()),
        ))
    }

    /// Keeps the size a partition sized by time ended on, for the next one.
    pub(crate) fn learned(&self, size: u64) {
        let Some(t) = *self.live.chunk_time.lock().expect("not poisoned") else {
            return;
        };
        *self.live.learned.lock().expect("not poisoned") = Some((t, size));
    }

    /// Why the gate is closed, as it changes (`None` while open): for the
    /// `Throttled`/`Resumed` events.
    pub(crate) fn watch_closed(&self) -> watch::Receiver<Option<String>> {
        self.closed.clone()
    }

    /// Whether claims and chunk starts wait now.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.borrow().is_some()
    }

    /// Returns once the gate is open.
    pub(crate) async fn opened(&self) {
        if self.closed.borrow().is_none() {
            return;
        }
        let mut closed = self.closed.clone();
        let _ = closed.wait_for(Option::is_none).await;
    }

    /// How many partitions the next claim may take of `want`: all of them without a
    /// partition rate, else at most a second's worth, once the limit allows. A limiter
    /// that cannot be reached is told to `failed`, and the claim takes nothing for a
    /// second: without the limiter, claiming fails closed.
    pub(crate) async fn claim(&self, want: usize, failed: impl Fn(&dyn fmt::Display)) -> usize {
        let Some(rate) = self.live.parts.rate() else {
            return want;
        };
        let want = want.min(rate.get().ceil().max(1.0) as usize).max(1);
        match self.live.parts.acquire(want as u64).await {
            Ok(_) => want,
            Err(err) => {
                tracing::warn!(%err, "the partition rate limit is unreachable; claiming nothing for a second");
                failed(&err);
                tokio::time::sleep(Duration::from_secs(1)).await;
                0
            }
        }
    }

    /// Waits until a chunk of `ids` IDs may start: the gate open and the ID rate
    /// allowing it. A limiter that cannot be reached is told to `failed` and asked again
    /// a second later: no chunk starts without it.
    pub(crate) async fn chunk_start(&self, ids: u64, failed: impl Fn(&dyn fmt::Display)) {
        loop {
            self.opened().await;
            if self.live.ids.rate().is_none() {
                return;
            }
            match self.live.ids.acquire(ids).await {
                Ok(_) => return,
                Err(err) => {
                    tracing::warn!(%err, "the rate limit is unreachable; retrying in a second");
                    failed(&err);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }
}

/// A partition's chunk permits, resized to the gate's parallelism in flight: grown at
/// once, shrunk by taking the surplus out as running chunks finish. One task (the
/// partition's issuing loop) acquires.
#[derive(Debug)]
pub(crate) struct Permits {
    gate: Arc<Gate>,
    sem: Arc<tokio::sync::Semaphore>,
    size: usize,
}

impl Permits {
    /// Permits for as many chunks as the gate's parallelism now.
    pub(crate) fn new(gate: Arc<Gate>) -> Self {
        let size = gate.parallel();
        Self {
            gate,
            sem: Arc::new(tokio::sync::Semaphore::new(size)),
            size,
        }
    }

    /// The window of a partition starting now: `--window`, or twice the parallelism
    /// when `tranche set` raised it above `--parallel` (so it can grow in flight).
    /// `parallel` and `window` are the worker's own `--parallel` and `--window`.
    pub(crate) fn window(&self, parallel: usize, window: usize) -> usize {
        if self.size > parallel {
            window.max(2 * self.size)
        } else {
            window
        }
    }

    /// Waits for a chunk's permit under the parallelism in force now.
    pub(crate) async fn acquire(
        &mut self,
    ) -> Result<tokio::sync::OwnedSemaphorePermit, tokio::sync::AcquireError> {
        let want = self.gate.parallel().max(1);
        if want > self.size {
            self.sem.add_permits(want - self.size);
            self.size = want;
        } else if want < self.size {
            let surplus = (self.size - want) as u32;
            self.sem.clone().acquire_many_owned(surplus).await?.forget();
            self.size = want;
        }
        self.sem.clone().acquire_owned().await
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        for task in self.tasks.lock().expect("not poisoned").drain(..) {
            task.abort();
        }
    }
}

/// Applies every change of the record (and of the library's handle) to `live`, and
/// publishes why the gate is closed, logging each change of it once.
#[allow(clippy::too_many_arguments)]
async fn apply(
    live: Arc<Live>,
    watcher: ControlWatcher,
    mut own: watch::Receiver<Own>,
    mut own_probe: Option<(watch::Receiver<OwnProbe>, Duration)>,
    options: Options,
    base: Base,
    stale: Duration,
    closed: watch::Sender<Option<String>>,
) {
    let mut record = watcher.subscribe();
    let mut first = true;
    let mut warned: Vec<Rejected> = Vec::new();
    loop {
        let r = record.borrow_and_update().clone();
        if r.rejected != warned {
            warn_rejected(&r.rejected, &warned);
            warned = r.rejected.clone();
        }
        let o = own.borrow_and_update().clone();
        let own_rate = o.max_rate.unwrap_or(options.max_rate);
        let now = crate::duration::now_ms();
        let rate = ids_rate_as_of(&r, own_rate, now, stale);
        if !aimd_step(&r, live.ids.rate(), rate, own_rate) {
            live.ids.set_rate(rate);
        }
        live.parts
            .set_rate(r.partitions_rate(options.max_partitions_rate));
        let s = &r.settings;
        live.concurrency.store(
            s.concurrency
                .map(|c| c as usize)
                .or(o.concurrency)
                .unwrap_or(base.concurrency),
            Relaxed,
        );
        live.parallel.store(
            s.parallel
                .map(|c| c as usize)
                .or(o.parallel)
                .unwrap_or(base.parallel),
            Relaxed,
        );
        live.chunk
            .store(s.chunk.or(o.chunk).unwrap_or(base.chunk), Relaxed);
        let timed = s.chunk_time_ms.map(Duration::from_millis);
        let timed = match (timed, options.chunk_time) {
            (Some(target), own) => Some(ChunkTime {
                target,
                min: s.chunk_min.or(own.map(|o| o.min)).unwrap_or(1),
                max: s.chunk_max.or(own.map(|o| o.max)).unwrap_or(u64::MAX / 2),
            }),
            (None, Some(own)) => Some(ChunkTime {
                min: s.chunk_min.unwrap_or(own.min),
                max: s.chunk_max.unwrap_or(own.max),
                ..own
            }),
            (None, None) => None,
        };
        *live.chunk_time.lock().expect("not poisoned") = timed;
        let held = own_probe
            .as_mut()
            .and_then(|(p, own_stale)| p.borrow_and_update().holds(now, *own_stale))
            .map(|why| {
                let why = tranche_control::truncate(&why, tranche_control::MAX_REASON_BYTES);
                format!("held by this worker's probe: {why}")
            });
        let reason = held
            .or_else(|| closed_reason(&r, options.active_hours.as_ref(), now, options.probe_stale));
        let changed = closed.send_if_modified(|current| {
            let changed = *current != reason;
            *current = reason.clone();
            changed || first
        });
        if changed {
            match &reason {
                Some(why) => tracing::info!("{why}: no new chunk starts, nothing is claimed"),
                None if !first => tracing::info!("control gate open: work resumes"),
                None => {}
            }
        }
        first = false;
        // Without a handle its sender is gone: only the record and the clock change
        // things then.
        let own_changed = async {
            if own.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        let probed = async {
            let alive = match own_probe.as_mut() {
                Some((p, _)) => p.changed().await.is_ok(),
                None => false,
            };
            if !alive {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            r = record.changed() => if r.is_err() { return },
            () = own_changed => {}
            () = probed => {}
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// Logs each value of the record a reader ignored that was not ignored before, once.
fn warn_rejected(rejected: &[Rejected], before: &[Rejected]) {
    for r in rejected.iter().filter(|r| !before.contains(r)) {
        tracing::warn!(
            key = %r.key,
            value = %r.value,
            why = %r.why,
            "the control record's {} = {} is ignored ({}); this worker's own option applies (tranche check --repair)",
            r.key,
            r.value,
            r.why
        );
    }
}

/// Writes `--keep-below` into the record at a worker's start, unless the log shows a
/// change of `keep_below` after the last such write by a worker start (an operator's
/// `tranche set`, which a restarted worker must not overwrite).
async fn keep_below_at_start(store: &dyn ControlStore, target: f64) -> Result<()> {
    let record = store.read().await.map_err(store_error)?;
    if record.settings.keep_below == Some(target) {
        return Ok(());
    }
    let log = store
        .log(tranche_control::LOG_CAP)
        .await
        .map_err(store_error)?;
    let since = log
        .iter()
        .find(|e| e.origin.starts_with("run:") && e.change.contains("keep_below"))
        .map_or(0, |e| e.at_ms);
    let outcome = store
        .set_unless_changed(&[Change::KeepBelow(Some(target))], &start_origin(), since)
        .await
        .map_err(store_error)?;
    if !outcome.skipped.is_empty() {
        tracing::warn!(
            keep_below = ?outcome.record.settings.keep_below,
            "--keep-below {target} not written: `tranche set` changed keep_below since (see `tranche control log`); the operator's value stays"
        );
    }
    Ok(())
}
