//! Run a worker from Rust: your own async [`Handler`] instead of `--exec`.
//!
//! Everything `tranche run` does comes along: batched claims with a local prefetch
//! queue, each partition's chunks through the resumable sliding window, checkpoints and
//! lease renewal by one heartbeat task, the reaper, the archiver, the worker registry,
//! retries with back-off up to `max_attempts`, and a graceful drain on shutdown that
//! checkpoints and releases what runs, giving the attempt back.
//!
//! ```
//! use tranche_worker::{Chunk, Handler, HandlerError, Plan, Runner};
//!
//! struct Reindex;
//!
//! #[async_trait::async_trait]
//! impl Handler for Reindex {
//!     async fn process(&self, chunk: Chunk) -> Result<(), HandlerError> {
//!         // Index rows chunk.from..=chunk.to. An Err fails this attempt (retried
//!         // with back-off up to max_attempts); HandlerError::permanent does not retry.
//!         let _ = (chunk.from, chunk.to);
//!         Ok(())
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tranche_worker::Error> {
//! # let dir = std::env::temp_dir().join(format!("tranche-doc-runner-{}", std::process::id()));
//! // Runner::redis("redis://127.0.0.1:6379") for a fleet; embedded needs no service.
//! let runner = Runner::embedded(dir.join("reindex.state"))
//!     .namespace("reindex")
//!     .concurrency(8)
//!     .chunk(500);
//! runner.plan(Plan::ids(1..=50_000).partition_size(5_000)).await?;
//! let report = runner.run(Reindex).await?;
//! assert_eq!(report.this_runner.completed, 10);
//! # std::fs::remove_dir_all(&dir).ok();
//! # Ok(())
//! # }
//! ```
//!
//! # Concepts
//!
//! A [`Plan`] cuts the row IDs into **partitions** (`partition_size` IDs each): the
//! unit a worker claims under a lease, retries, and completes. A partition is
//! processed in **chunks** of [`chunk`](Runner::chunk) IDs, one [`Handler::process`]
//! call each. Four settings say how much runs at once:
//!
//! - [`concurrency`](Runner::concurrency): partitions this runner processes at once.
//! - [`parallel`](Runner::parallel): chunks of one partition in flight at once, so at
//!   most `concurrency × parallel` handler calls run together.
//! - [`window`](Runner::window): how far past the partition's checkpoint (its first
//!   unfinished chunk) chunks may be issued. Chunks finish out of order; the
//!   checkpoint only moves over finished ones, so after a crash at most one window of
//!   chunks is processed again. A slow chunk holds the window: past it nothing new is
//!   issued.
//! - [`prefetch`](Runner::prefetch): partitions claimed ahead and queued beyond
//!   `concurrency`, so a finished partition is replaced without a round trip to the
//!   store. They are leased (renewed while they wait) and given back on shutdown.
//!
//! # Shutdown
//!
//! [`run`](Runner::run) runs to the end; [`run_until_cancelled`](Runner::run_until_cancelled)
//! drains on a [`CancellationToken`]: nothing more is claimed, running chunks get the
//! [`grace`](Runner::grace) period, what is unfinished is checkpointed and released.
//! A handler's future is dropped when the grace period is over: write it so that a
//! dropped future leaves nothing half done (a transaction that commits at its end, an
//! idempotent write). A chunk may be processed again after a crash or an expired
//! lease: at least once, never lost.
//!
//! # Runtime
//!
//! The runner works on whatever runtime calls it. Where the handler mostly waits (on a
//! database, a search cluster), a current-thread runtime is the cheapest: `tranche run`
//! uses one, as then no store reply or finished chunk is a wake-up handed to another
//! thread. A handler that computes much wants a multi-thread one.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tranche_control::ProbeOutcome;

mod report;
mod settings;

pub use report::{NamespaceReport, RunReport, RunnerReport};
use settings::{CliOnly, Control, Subscribed};

use crate::backend::{Backend, Location, Open, Tuning};
use crate::control::ControlHandle;
use crate::defaults::RunDefaults;
use crate::error::Error;
use crate::event::{Event, Subscribers};
use crate::handler::Handler;
use crate::job::Job as Work;
use crate::plan::Plan;
use crate::query::Job;
use crate::work::{self, Observer, Settings, Stop};

/// When [`Runner::run`] returns (besides a shutdown).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Until {
    /// Once the namespace has nothing outstanding: partitions other workers hold, and
    /// retries in back-off, are waited for (and claimed, should they come back).
    #[default]
    Drained,
    /// Once this runner has nothing running and a claim finds nothing: it leaves what
    /// others hold, and retries still in back-off, to them or a later run.
    NothingToClaim,
}

/// The smallest piece a split cuts off by default, in chunks ([`Runner::split_min`]).
pub const DEFAULT_SPLIT_MIN: u64 = RunDefaults::RUN.split_min;

/// A worker for one namespace: where it is, and how it runs. Build it with
/// [`Runner::redis`] or [`Runner::embedded`], then [`plan`](Runner::plan) and
/// [`run`](Runner::run).
#[derive(Debug, Clone)]
pub struct Runner {
    /// Where the namespace lives: the builder sets the URL or the state file, the
    /// namespace and shards; `tranche run` its whole `Global::location` (TLS files, a
    /// URL file).
    location: Location,
    worker: Option<String>,
    concurrency: usize,
    prefetch: Option<usize>,
    split: bool,
    split_min: u64,
    chunk: u64,
    parallel: usize,
    window: Option<usize>,
    lease: Duration,
    max_attempts: u32,
    backoff: Duration,
    grace: Duration,
    follow: bool,
    until: Until,
    subscribers: Subscribers,
    control: Control,
    /// Puts the run's spans into distributed traces ([`Runner::trace_context`]).
    trace: Option<Arc<dyn crate::trace::TraceContext>>,
    /// What only `tranche run`'s flags set.
    cli: CliOnly,
}

impl Runner {
    /// A runner for the namespace at `location`, every other setting its default
    /// ([`RunDefaults::RUN`]). `tranche run` starts here with its `Global::location`.
    pub(crate) fn at(location: Location) -> Self {
        let d = RunDefaults::RUN;
        Self {
            location,
            worker: None,
            concurrency: d.concurrency as usize,
            prefetch: None,
            split: true,
            split_min: d.split_min,
            chunk: d.chunk,
            parallel: d.parallel as usize,
            window: None,
            lease: RunDefaults::duration(d.lease),
            max_attempts: d.max_attempts,
            backoff: RunDefaults::duration(d.backoff),
            grace: RunDefaults::duration(d.grace),
            follow: false,
            until: Until::Drained,
            subscribers: Subscribers::default(),
            control: Control::default(),
            trace: None,
            cli: CliOnly::default(),
        }
    }

    fn new(redis: Option<String>, state: Option<PathBuf>) -> Self {
        Self::at(Location {
            namespace: "tranche".to_owned(),
            redis,
            state,
            ..Location::default()
        })
    }

    /// A runner coordinating through the Redis (or Redis Cluster) at `url`.
    pub fn redis(url: impl Into<String>) -> Self {
        Self::new(Some(url.into()), None)
    }

    /// A runner embedded in this process, its state in the file `state` (one process
    /// per file at a time).
    pub fn embedded(state: impl Into<PathBuf>) -> Self {
        Self::new(None, Some(state.into()))
    }

    /// The namespace (default `tranche`).
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.location.namespace = namespace.into();
        self
    }

    /// Shards of a new namespace (an existing one keeps its own).
    pub fn shards(mut self, shards: u32) -> Self {
        self.location.shards = Some(shards);
        self
    }

    /// Puts the run's `partition` and `chunk` spans (debug level) into distributed
    /// traces: each attempt in its partition's trace, each chunk's context passed to
    /// its command (`TRACEPARENT`) and handler ([`Chunk::traceparent`](crate::Chunk::traceparent)).
    /// See [`TraceContext`](crate::TraceContext).
    pub fn trace_context(mut self, trace: Arc<dyn crate::trace::TraceContext>) -> Self {
        self.trace = Some(trace);
        self
    }

    /// This worker's id (default: `host-N`, stable across restarts).
    pub fn worker_id(mut self, id: impl Into<String>) -> Self {
        self.worker = Some(id.into());
        self
    }

    /// Partitions processed at once (default 2). A slot frees when a partition's chunks
    /// end; its outcome goes to the store while the next one starts.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// Partitions claimed ahead beyond `concurrency` (default: chosen from how long
    /// partitions take).
    pub fn prefetch(mut self, n: usize) -> Self {
        self.prefetch = Some(n);
        self
    }

    /// Whether idle slots split other workers' running partitions, and this runner's
    /// may be cut for others (default true): a job's end is then not set by its
    /// slowest partitions. See `tranche_active_store::Splits`.
    pub fn split(mut self, on: bool) -> Self {
        self.split = on;
        self
    }

    /// The smallest piece a split cuts off, in chunks (default 4; fewer when a part's
    /// chunks are slow: two seconds of work at its pace is enough).
    pub fn split_min(mut self, chunks: u64) -> Self {
        self.split_min = chunks.max(1);
        self
    }

    /// Row IDs per chunk (default 100).
    pub fn chunk(mut self, ids: u64) -> Self {
        self.chunk = ids.max(1);
        self
    }

    /// Chunks of one partition in flight at once (default 4).
    pub fn parallel(mut self, n: usize) -> Self {
        self.parallel = n.max(1);
        self
    }

    /// The sliding window per partition, in chunks (default twice `parallel`).
    pub fn window(mut self, chunks: usize) -> Self {
        self.window = Some(chunks.max(1));
        self
    }

    /// Lease length (default 30 s; at least 300 ms).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease.max(Duration::from_millis(300));
        self
    }

    /// Attempts before a partition ends failed (default 5).
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n.max(1);
        self
    }

    /// Back-off before the first retry, doubling after (default 1 s).
    pub fn backoff(mut self, backoff: Duration) -> Self {
        self.backoff = backoff;
        self
    }

    /// How long a shutdown lets running chunks finish before dropping them (default
    /// 10 s).
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Keep waiting for new plans when nothing is left, until shutdown.
    pub fn follow(mut self, follow: bool) -> Self {
        self.follow = follow;
        self
    }

    /// When `run` returns (default [`Until::Drained`]).
    pub fn until(mut self, until: Until) -> Self {
        self.until = until;
        self
    }

    /// Calls `callback` with every [`Event`] of a run, inline on the task where it
    /// happened: it must return quickly (count, or send into a channel). Callbacks
    /// add up, called in the order given.
    pub fn on_event(mut self, callback: impl Fn(&Event) + Send + Sync + 'static) -> Self {
        self.subscribers.0.push(Arc::new(callback));
        self
    }

    /// Opens the namespace to ask what its job has done ([`Job`]). Embedded, an open
    /// `Job` holds the state file while it lives, as a run does (unless a run holds it
    /// already: then it reads the last save): drop it before starting a run.
    pub async fn job(&self) -> Result<Job, Error> {
        Job::at(&self.location).await
    }

    /// Registers this runner's metrics in `registry` (prefix `tranche_worker`, the
    /// names `tranche run --metrics-listen` uses: partitions claimed, completed,
    /// failed, released; attempts failed; leases lost; partitions and chunks in
    /// flight; chunk and partition durations), built from its events. The application serves the registry where it likes. Feature
    /// `metrics`.
    #[cfg(feature = "metrics")]
    pub fn metrics(self, registry: &mut crate::metrics::Registry) -> Self {
        let metrics = crate::metrics::RunMetrics::register(registry);
        self.on_event(move |event| metrics.observe(event))
    }

    /// A fleet-wide limit of row IDs per second, shared by every worker of the
    /// namespace (through Redis, or in this process embedded).
    pub fn max_rate(mut self, ids_per_second: f64) -> Self {
        self.control.max_rate = Some(ids_per_second);
        self
    }

    /// A fleet-wide limit of partitions claimed per second.
    pub fn max_partitions_rate(mut self, per_second: f64) -> Self {
        self.control.max_partitions_rate = Some(per_second);
        self
    }

    /// A throttle probe: an async closure run every
    /// [`throttle_interval`](Runner::throttle_interval) by one worker of the
    /// namespace. [`ProbeOutcome::Throttle`] (or an [`ProbeOutcome::Error`]) stops
    /// every worker from starting chunks until a later check says go;
    /// [`ProbeOutcome::Value`] feeds [`keep_below`](Runner::keep_below).
    pub fn throttle_probe<F, Fut>(mut self, probe: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ProbeOutcome> + Send + 'static,
    {
        self.control.probe = Some(Arc::new(tranche_control::FnProbe::new(probe)));
        self
    }

    /// How often the throttle probe runs (default 1 s).
    pub fn throttle_interval(mut self, every: Duration) -> Self {
        self.control.throttle_interval = Some(every);
        self
    }

    /// Adjust the fleet's ID rate (AIMD, at most [`max_rate`](Runner::max_rate),
    /// which it needs) so that the probe's [`ProbeOutcome::Value`] stays below
    /// `target`.
    pub fn keep_below(mut self, target: f64) -> Self {
        self.control.keep_below = Some(target);
        self
    }

    /// Claim and start work only within `HH:MM-HH:MM` (wrapping midnight) in the zone
    /// `tz` (an IANA name; the system's when `None`). Checked when the run starts.
    pub fn active_hours(mut self, spec: impl Into<String>, tz: Option<&str>) -> Self {
        self.control.active_hours = Some((spec.into(), tz.map(str::to_owned)));
        self
    }

    /// Size each partition's chunks so each takes about `target` (starting from
    /// [`chunk`](Runner::chunk), within `min..=max` IDs); the checkpoint stays exact.
    pub fn chunk_time(mut self, target: Duration, min: u64, max: u64) -> Self {
        self.control.chunk_time = Some(crate::control::ChunkTime {
            target: target.max(Duration::from_millis(1)),
            min: min.max(1),
            max: max.max(min.max(1)),
        });
        self
    }

    /// A handle that changes this runner's rate limit, concurrency, parallelism and
    /// chunk size while it runs (clones of the runner share it).
    pub fn control(&self) -> ControlHandle {
        self.control.handle.clone()
    }

    /// This run's worker name: the one given, or `host-N` from a slot that `slot`
    /// holds for as long as the run (a restart takes the same name back).
    pub(crate) fn worker_name(&self, slot: &mut Option<crate::slot::Slot>) -> String {
        self.worker
            .clone()
            .unwrap_or_else(|| crate::slot::default_name("worker", slot))
    }

    /// How a run's backend opens for the worker `worker`.
    pub(crate) fn tuning(&self, worker: &str) -> Tuning {
        Tuning {
            active: tranche_active_store::Config {
                lease: self.lease,
                max_attempts: self.max_attempts,
                backoff_base: self.backoff,
                ..tranche_active_store::Config::default()
            },
            tiers: self.cli.tiers,
            consumer: worker.to_owned(),
            claim_idle: crate::duration::claim_idle(),
        }
    }

    /// The run loop's settings: the one place a run is assembled, whether `tranche
    /// run` or a library's handler asks.
    fn settings(&self, job: Work, worker: String) -> Result<Settings, Error> {
        let subscribed = (!self.subscribers.is_empty() || self.cli.observer.is_some()).then(|| {
            Arc::new(Subscribed {
                subscribers: self.subscribers.clone(),
                observer: self.cli.observer.clone(),
            }) as Arc<dyn Observer>
        });
        Ok(Settings {
            job,
            chunk: self.chunk,
            parallel: self.parallel,
            window: self.window.unwrap_or(2 * self.parallel),
            concurrency: self.concurrency,
            prefetch: self.prefetch,
            split: self.split,
            split_min: self.split_min,
            worker,
            lease: self.lease,
            max_attempts: self.max_attempts,
            follow: self.follow,
            until_idle: self.until == Until::NothingToClaim,
            reaper: self.cli.reaper,
            archiver: self.cli.archiver,
            heartbeat: self.cli.heartbeat,
            snapshots: self.cli.snapshots,
            save_every: Duration::from_secs(2),
            observer: subscribed,
            control: self.control.options()?,
            trace: self.trace.clone(),
        })
    }

    /// Opens the namespace with typed errors ([`Backend::open_checked`]).
    pub(crate) async fn open(&self, open: Open, tuning: Tuning) -> Result<Backend, Error> {
        Backend::open_checked(&self.location, open, tuning).await
    }

    /// Refuses when another process holds the embedded state file.
    pub(crate) fn writable(&self, backend: &Backend) -> Result<(), Error> {
        backend.ensure_writable().map_err(|_| {
            let path = self.location.state.clone().unwrap_or_default();
            let mut lock = path.as_os_str().to_owned();
            lock.push(".lock");
            let holder = std::fs::read_to_string(lock)
                .ok()
                .and_then(|s| s.trim().parse().ok());
            Error::StateLocked { path, holder }
        })
    }

    /// Adds `plan` to the namespace, creating it if need be (the same plan again is a
    /// no-op; one overlapping another is [`Error::InvalidPlan`], and writes nothing).
    pub async fn plan(&self, plan: Plan) -> Result<(), Error> {
        let backend = self.open(Open::Create, Tuning::default()).await?;
        self.writable(&backend)?;
        backend.active.plan(&plan.to_store()).await?;
        backend.register_namespace().await?;
        backend.save().await?;
        Ok(())
    }

    /// Runs `handler` over the namespace's partitions until none is left (see
    /// [`until`](Runner::until)), with no way to stop it early: for a job that runs to
    /// its end. [`run_until_cancelled`](Runner::run_until_cancelled) takes a token that
    /// drains it.
    pub async fn run<H: Handler>(&self, handler: H) -> Result<RunReport, Error> {
        self.run_with_shutdown(handler, std::future::pending())
            .await
    }

    /// Runs `handler` like [`run`](Runner::run) until `token` is cancelled, then
    /// drains: nothing more is claimed, running chunks get the [grace
    /// period](Runner::grace), then what is unfinished is checkpointed and released
    /// (its attempt given back). With [`follow`](Runner::follow) the token is the only
    /// way the run ends. A token cancelled before the call drains at once: nothing is
    /// claimed.
    ///
    /// ```no_run
    /// # async fn demo(runner: tranche_worker::Runner, handler: impl tranche_worker::Handler) {
    /// let token = tranche_worker::CancellationToken::new();
    /// let on_ctrl_c = token.clone();
    /// tokio::spawn(async move {
    ///     let _ = tokio::signal::ctrl_c().await;
    ///     on_ctrl_c.cancel();
    /// });
    /// let report = runner.run_until_cancelled(handler, token).await;
    /// # }
    /// ```
    pub async fn run_until_cancelled<H: Handler>(
        &self,
        handler: H,
        token: CancellationToken,
    ) -> Result<RunReport, Error> {
        self.run_with_shutdown(handler, token.cancelled_owned())
            .await
    }

    /// Runs `handler` like [`run`](Runner::run) until the future `shutdown` resolves,
    /// then drains as [`run_until_cancelled`](Runner::run_until_cancelled) does.
    ///
    /// The future is the signal, not the work: **a future that is already complete
    /// (`async {}`) drains at once**, so the run claims nothing and returns
    /// `interrupted: true`. For a run without a shutdown use [`run`](Runner::run) (or
    /// pass `std::future::pending()`).
    pub async fn run_with_shutdown<H: Handler>(
        &self,
        handler: H,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<RunReport, Error> {
        let mut slot = None;
        let worker = self.worker_name(&mut slot);
        let tuning = self.tuning(&worker);
        // Another process's short hold on the state file (a `status` that started first)
        // is waited out, as `tranche run` does.
        let start = std::time::Instant::now();
        let backend = loop {
            let backend = self.open(Open::Existing, tuning.clone()).await?;
            if backend.ensure_writable().is_ok() || start.elapsed() >= crate::backend::LOCK_GRACE {
                break backend;
            }
            drop(backend);
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        self.writable(&backend)?;
        let settings = self.settings(Work::of_handler(handler), worker)?;
        tracing::info!(
            namespace = %self.location.namespace,
            worker = %settings.worker,
            concurrency = self.concurrency,
            "runner started"
        );
        // A shutdown already over drains from the start, before the first claim (the
        // task below might otherwise run only after it).
        let mut shutdown = Box::pin(shutdown);
        let over = futures_util::FutureExt::now_or_never(&mut shutdown).is_some();
        let (tx, rx) = watch::channel(if over { Stop::Draining } else { Stop::Running });
        let grace = self.grace;
        let stopper = tokio::spawn(async move {
            if !over {
                shutdown.await;
            }
            let _ = tx.send(Stop::Draining);
            tokio::time::sleep(grace).await;
            let _ = tx.send(Stop::Abort);
        });
        let report = work::run(&backend, settings, rx).await;
        stopper.abort();
        let report = report?;
        let report = RunReport::of(report);
        tracing::info!(
            namespace = %self.location.namespace,
            completed = report.this_runner.completed,
            failed = report.this_runner.failed_pids.len(),
            outstanding = report.namespace.outstanding,
            interrupted = report.interrupted,
            "runner finished in {}",
            crate::duration::ms(report.elapsed.as_secs_f64() * 1000.0)
        );
        Ok(report)
    }
}
