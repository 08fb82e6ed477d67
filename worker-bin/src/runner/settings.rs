//! A runner's settings beyond the builder's plain values: the production-control
//! options, the settings only `tranche run` maps its flags onto, and the one observer
//! the run loop gets (the subscribers and the command line's progress and metrics).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

#[cfg(feature = "cli")]
use super::Runner;
#[cfg(feature = "cli")]
use crate::backend::{Backend, Location};
use crate::control::ControlHandle;
use crate::error::Error;
use crate::event::{Event, Subscribers};
#[cfg(feature = "cli")]
use crate::job::Job as Work;
use crate::layers::Tiers;
#[cfg(feature = "cli")]
use crate::work::{self, Stop};
use crate::work::{Observer, Watched};

/// The settings only `tranche run` changes (crate-private on purpose: its flags map
/// onto them; a library user gets the defaults).
#[derive(Debug, Clone)]
pub(super) struct CliOnly {
    /// Archive tier thresholds (`--compressed-at`, …); the store's own when `None`.
    pub(super) tiers: Option<Tiers>,
    /// Whether this process runs the reaper, an archiver, and the worker heartbeat.
    pub(super) reaper: bool,
    pub(super) archiver: bool,
    pub(super) heartbeat: bool,
    /// When the archiver publishes statistics snapshots.
    pub(super) snapshots: tranche_archive_store::SnapshotPolicy,
    /// The command line's progress bar and `--metrics-listen`, fed by the run's events.
    pub(super) observer: Option<Arc<dyn Observer>>,
}

impl Default for CliOnly {
    fn default() -> Self {
        Self {
            tiers: None,
            reaper: true,
            archiver: true,
            heartbeat: true,
            snapshots: tranche_archive_store::SnapshotPolicy::default(),
            observer: None,
        }
    }
}

/// The runner's production-control settings (`crate::control::Options` before parsing).
#[derive(Debug, Clone, Default)]
pub(super) struct Control {
    pub(super) max_rate: Option<f64>,
    pub(super) max_partitions_rate: Option<f64>,
    pub(super) probe: Option<Arc<dyn tranche_control::Probe>>,
    pub(super) throttle_interval: Option<Duration>,
    pub(super) keep_below: Option<f64>,
    pub(super) active_hours: Option<(String, Option<String>)>,
    pub(super) chunk_time: Option<crate::control::ChunkTime>,
    pub(super) handle: ControlHandle,
    /// Options built whole by `tranche run` (its probes run commands and HTTP
    /// requests), in force instead of the fields above.
    pub(super) preset: Option<crate::control::Options>,
}

impl Control {
    pub(super) fn options(&self) -> Result<crate::control::Options, Error> {
        if let Some(preset) = &self.preset {
            return Ok(preset.clone());
        }
        let rate = |r: Option<f64>, what: &str| {
            r.map(tranche_control::Rate::per_second)
                .transpose()
                .map_err(|e| Error::Config(format!("{what}: {e}")))
        };
        let max_rate = rate(self.max_rate, "max_rate")?;
        if self.keep_below.is_some() && max_rate.is_none() {
            return Err(Error::Config(
                "keep_below needs a max_rate as the ceiling of the rate it adjusts".into(),
            ));
        }
        Ok(crate::control::Options {
            max_rate,
            max_partitions_rate: rate(self.max_partitions_rate, "max_partitions_rate")?,
            probe: self.probe.clone(),
            throttle_interval: self.throttle_interval.unwrap_or_default(),
            probe_stale: tranche_control::ProbeStale::default(),
            keep_below: self.keep_below,
            active_hours: self
                .active_hours
                .as_ref()
                .map(|(spec, tz)| tranche_control::ActiveHours::parse(spec, tz.as_deref()))
                .transpose()
                .map_err(|e| Error::Config(format!("active_hours: {e}")))?,
            chunk_time: self.chunk_time,
            handle: Some(self.handle.clone()),
        })
    }
}

/// What `tranche run` maps its flags onto: the command line's alone.
#[cfg(feature = "cli")]
impl Runner {
    /// Archive tier thresholds (`tranche run --compressed-at`, …).
    pub(crate) fn tiers(mut self, tiers: Tiers) -> Self {
        self.cli.tiers = Some(tiers);
        self
    }

    /// Which of the reaper, the archiver and the worker heartbeat this process runs
    /// (`--no-reaper`, `--no-archiver`, `--no-heartbeat`).
    pub(crate) fn background(mut self, reaper: bool, archiver: bool, heartbeat: bool) -> Self {
        (self.cli.reaper, self.cli.archiver, self.cli.heartbeat) = (reaper, archiver, heartbeat);
        self
    }

    /// When the archiver publishes statistics snapshots (`--snapshot-*`).
    pub(crate) fn snapshots(mut self, policy: tranche_archive_store::SnapshotPolicy) -> Self {
        self.cli.snapshots = policy;
        self
    }

    /// What watches the run from outside: the command line's progress bar and
    /// `--metrics-listen`, fed by the run's events as a subscriber is.
    pub(crate) fn observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.cli.observer = Some(observer);
        self
    }

    /// The control options whole, as `tranche run`'s flags build them.
    pub(crate) fn control_options(mut self, options: crate::control::Options) -> Self {
        self.control.preset = Some(options);
        self
    }

    /// Where the namespace lives.
    pub(crate) fn location(&self) -> &Location {
        &self.location
    }

    /// Runs `job` on `backend` (opened with [`tuning`](Runner::tuning) for `worker`)
    /// until `stop` says otherwise: `tranche run`'s run loop, its settings assembled
    /// as [`run_with_shutdown`](Runner::run_with_shutdown) assembles them.
    pub(crate) async fn run_on(
        &self,
        backend: &Backend,
        job: Work,
        worker: String,
        stop: watch::Receiver<Stop>,
    ) -> Result<work::Report, Error> {
        let settings = self.settings(job, worker)?;
        work::run(backend, settings, stop).await
    }
}

/// A runner's subscribers and the command line's observer, as the run loop's one
/// observer.
pub(super) struct Subscribed {
    pub(super) subscribers: Subscribers,
    pub(super) observer: Option<Arc<dyn Observer>>,
}

#[async_trait::async_trait]
impl Observer for Subscribed {
    async fn attach(
        &self,
        watched: Watched,
        done: watch::Receiver<bool>,
        background: &mut tokio::task::JoinSet<()>,
    ) -> Result<(), Error> {
        match &self.observer {
            Some(observer) => observer.attach(watched, done, background).await,
            None => Ok(()),
        }
    }

    fn event(&self, event: &Event) {
        self.subscribers.emit(event);
        if let Some(observer) = &self.observer {
            observer.event(event);
        }
    }

    fn finish(&self, counts: &tranche_active_store::StatusCounts) {
        if let Some(observer) = &self.observer {
            observer.finish(counts);
        }
    }
}
