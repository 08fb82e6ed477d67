//! Run a worker from Rust: your own async handler instead of `--exec`.
//!
//! Everything `tranche run` does comes along: batched claims with a local prefetch
//! queue, each partition's chunks through the resumable sliding window, checkpoints and
//! lease renewal by one heartbeat task, the reaper, the archiver, the worker registry,
//! retries with back-off up to `max_attempts`, and a graceful drain on shutdown that
//! checkpoints and releases what runs, giving the attempt back.
//!
//! ```no_run
//! use tranche_worker::runner::{Chunk, Handler, HandlerError, Runner};
//!
//! struct Reindex;
//!
//! #[async_trait::async_trait]
//! impl Handler for Reindex {
//!     async fn process(&self, chunk: Chunk) -> Result<(), HandlerError> {
//!         // Index rows chunk.from..=chunk.to; an Err fails this attempt (it is
//!         // retried with back-off up to max_attempts).
//!         let _ = (chunk.from, chunk.to);
//!         Ok(())
//!     }
//! }
//!
//! # async fn demo() -> Result<(), tranche_worker::runner::Error> {
//! let runner = Runner::redis("redis://127.0.0.1:6379")
//!     .namespace("reindex")
//!     .concurrency(8)
//!     .chunk(500);
//! runner.plan(1, 5_000_000, 10_000).await?;
//! let report = runner
//!     .run(Reindex, async { let _ = tokio::signal::ctrl_c().await; })
//!     .await?;
//! println!("{} partitions completed here", report.completed);
//! # Ok(())
//! # }
//! ```
//!
//! A handler's future is dropped when the drain's grace period is over (or at once,
//! for a second shutdown): write it so that a dropped future leaves nothing half done
//! (a transaction that commits at its end, an idempotent write). A chunk may be
//! processed again after a crash or an expired lease: at least once, never lost.
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

use crate::backend::{Backend, Location, Open, Tuning};
use crate::job::Job;
use crate::work::{self, Settings, Stop};

pub use crate::control::ControlHandle;
pub use crate::job::Chunk;
/// What a throttle probe found ([`Runner::throttle_probe`]).
pub use tranche_control::ProbeOutcome;

/// The error a handler returns for a failed chunk: any error, shown as its message.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync>;

/// What processes each chunk of a partition.
#[async_trait::async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Processes the row IDs `chunk.from..=chunk.to` of partition `chunk.pid`. `Ok`
    /// acknowledges the chunk (the checkpoint moves past it once every earlier chunk
    /// is done); `Err` fails the partition's attempt.
    async fn process(&self, chunk: Chunk) -> Result<(), HandlerError>;
}

/// A failure of the runner itself (the store, bad settings), not of a chunk.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct Error(#[from] anyhow::Error);

/// What a run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunReport {
    /// Partitions this runner completed.
    pub completed: u64,
    /// Attempts of this runner that failed (each retried, or ending failed).
    pub failed_attempts: u64,
    /// Partitions this runner gave back unfinished (a drain).
    pub released: u64,
    /// Partitions of the namespace that ended failed, when the run ended.
    pub failed: u64,
    /// Partitions of the namespace still outstanding, when the run ended.
    pub outstanding: u64,
    /// Whether the shutdown future ended the run.
    pub interrupted: bool,
}

/// A worker for one namespace: where it is, and how it runs. Build it with
/// [`Runner::redis`] or [`Runner::embedded`], then [`plan`](Runner::plan) and
/// [`run`](Runner::run).
#[derive(Debug, Clone)]
pub struct Runner {
    redis: Option<String>,
    state: Option<PathBuf>,
    namespace: String,
    shards: Option<u32>,
    worker: Option<String>,
    concurrency: usize,
    prefetch: Option<usize>,
    chunk: u64,
    parallel: usize,
    window: Option<usize>,
    lease: Duration,
    max_attempts: u32,
    backoff: Duration,
    grace: Duration,
    follow: bool,
    control: Control,
}

/// The runner's production-control settings (`crate::control::Options` before parsing).
#[derive(Debug, Clone, Default)]
struct Control {
    max_rate: Option<f64>,
    max_partitions_rate: Option<f64>,
    probe: Option<Arc<dyn tranche_control::Probe>>,
    throttle_interval: Option<Duration>,
    keep_below: Option<f64>,
    active_hours: Option<(String, Option<String>)>,
    chunk_time: Option<crate::control::ChunkTime>,
    handle: ControlHandle,
}

impl Control {
    fn options(&self) -> anyhow::Result<crate::control::Options> {
        let rate = |r: Option<f64>, what: &str| {
            r.map(tranche_control::Rate::per_second)
                .transpose()
                .map_err(|e| anyhow::anyhow!("{what}: {e}"))
        };
        let max_rate = rate(self.max_rate, "max_rate")?;
        if self.keep_below.is_some() && max_rate.is_none() {
            anyhow::bail!("keep_below needs a max_rate as the ceiling of the rate it adjusts");
        }
        Ok(crate::control::Options {
            max_rate,
            max_partitions_rate: rate(self.max_partitions_rate, "max_partitions_rate")?,
            probe: self.probe.clone(),
            throttle_interval: self.throttle_interval.unwrap_or_default(),
            keep_below: self.keep_below,
            active_hours: self
                .active_hours
                .as_ref()
                .map(|(spec, tz)| tranche_control::ActiveHours::parse(spec, tz.as_deref()))
                .transpose()
                .map_err(|e| anyhow::anyhow!("active_hours: {e}"))?,
            chunk_time: self.chunk_time,
            handle: Some(self.handle.clone()),
        })
    }
}

impl Runner {
    fn new(redis: Option<String>, state: Option<PathBuf>) -> Self {
        Self {
            redis,
            state,
            namespace: "tranche".to_owned(),
            shards: None,
            worker: None,
            concurrency: 2,
            prefetch: None,
            chunk: 100,
            parallel: 4,
            window: None,
            lease: Duration::from_secs(30),
            max_attempts: 5,
            backoff: Duration::from_secs(1),
            grace: Duration::from_secs(10),
            follow: false,
            control: Control::default(),
        }
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
        self.namespace = namespace.into();
        self
    }

    /// Shards of a new namespace (an existing one keeps its own).
    pub fn shards(mut self, shards: u32) -> Self {
        self.shards = Some(shards);
        self
    }

    /// This worker's id (default: `host-N`, stable across restarts).
    pub fn worker_id(mut self, id: impl Into<String>) -> Self {
        self.worker = Some(id.into());
        self
    }

    /// Partitions processed at once (default 2).
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

    fn location(&self) -> Location {
        Location {
            namespace: self.namespace.clone(),
            shards: self.shards,
            redis: self.redis.clone(),
            state: self.state.clone(),
            ..Location::default()
        }
    }

    /// Plans the IDs `min..=max` in partitions of `size` IDs (a repeated plan is a
    /// no-op; an overlapping one is an error).
    pub async fn plan(&self, min: u64, max: u64, size: u64) -> Result<(), Error> {
        let backend = Backend::open(&self.location(), Open::Create, Tuning::default()).await?;
        backend.ensure_writable()?;
        backend
            .active
            .plan(&tranche_active_store::Plan::Uniform { min, max, size })
            .await
            .map_err(|e| anyhow::anyhow!("invalid plan: {e}"))?;
        backend.register_namespace().await?;
        backend.save().await?;
        Ok(())
    }

    /// Runs `handler` over the namespace's partitions until none is left (or, with
    /// [`follow`](Runner::follow), until `shutdown` resolves). When `shutdown`
    /// resolves it drains: nothing more is claimed, running chunks get the grace period,
    /// then what is unfinished is checkpointed and released.
    pub async fn run<H: Handler>(
        &self,
        handler: H,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<RunReport, Error> {
        let active = tranche_active_store::Config {
            lease: self.lease,
            max_attempts: self.max_attempts,
            backoff_base: self.backoff,
            ..tranche_active_store::Config::default()
        };
        let mut slot = None;
        let worker = self
            .worker
            .clone()
            .unwrap_or_else(|| crate::slot::default_name("worker", &mut slot));
        let tuning = Tuning {
            active,
            tiers: None,
            consumer: worker.clone(),
            claim_idle: crate::duration::claim_idle(),
        };
        let backend = Backend::open(&self.location(), Open::Existing, tuning).await?;
        backend.ensure_writable()?;
        let settings = Settings {
            job: Job::Handler(HandlerRef(Arc::new(handler))),
            chunk: self.chunk,
            parallel: self.parallel,
            window: self.window.unwrap_or(2 * self.parallel),
            concurrency: self.concurrency,
            prefetch: self.prefetch,
            worker,
            lease: self.lease,
            max_attempts: self.max_attempts,
            follow: self.follow,
            reaper: true,
            archiver: true,
            heartbeat: true,
            snapshots: tranche_archive_store::SnapshotPolicy::default(),
            save_every: Duration::from_secs(2),
            observer: None,
            control: self.control.options()?,
        };
        let (tx, rx) = watch::channel(Stop::Running);
        let grace = self.grace;
        let stopper = tokio::spawn(async move {
            shutdown.await;
            let _ = tx.send(Stop::Draining);
            tokio::time::sleep(grace).await;
            let _ = tx.send(Stop::Abort);
        });
        let report = work::run(&backend, settings, rx).await;
        stopper.abort();
        let report = report?;
        Ok(RunReport {
            completed: report.completed,
            failed_attempts: report.failed_attempts,
            released: report.released,
            failed: report.counts.failed,
            outstanding: report.counts.outstanding(),
            interrupted: report.interrupted,
        })
    }
}

/// A shared handler, as the run loop holds it.
#[derive(Clone)]
pub(crate) struct HandlerRef(pub(crate) Arc<dyn Handler>);

impl std::fmt::Debug for HandlerRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Handler")
    }
}
