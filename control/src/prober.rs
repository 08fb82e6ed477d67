//! Each worker's probe, reported under its own name; one elected worker drives the AIMD
//! rate.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tranche_codec::Clock;

use crate::{Aimd, ControlStore, Probe, ProbeOutcome, ProbeReport, Rate, Result};

/// How a worker takes part in probing.
#[derive(Debug, Clone)]
pub struct ProberConfig {
    /// This worker's id (the leader's name in `{ns}:control:prober`).
    pub worker: String,
    /// `--throttle-interval`: how often this worker probes, in
    /// [[`ProberConfig::MIN_INTERVAL`], [`ProberConfig::MAX_INTERVAL`]] (a step clamps
    /// a value outside, [`ProberConfig::check`] refuses it); a finding and the lead's
    /// term last three of them.
    pub interval: Duration,
    /// The worker's own `--max-rate`, the AIMD ceiling unless `tranche set` gave one.
    pub max_rate: Option<Rate>,
    /// The lowest rate AIMD sets, IDs per second.
    pub floor: f64,
}

impl ProberConfig {
    /// The shortest probe interval.
    pub const MIN_INTERVAL: Duration = Duration::from_millis(100);
    /// The longest probe interval: three of them are the lead's term, which the scripts
    /// cap at an hour (a longer interval used to be accepted and then never probed).
    pub const MAX_INTERVAL: Duration = Duration::from_secs(20 * 60);

    /// Refuses an interval out of [[`Self::MIN_INTERVAL`], [`Self::MAX_INTERVAL`]] and
    /// a worker id that is empty or over 256 bytes, by name.
    pub fn check(&self) -> Result<()> {
        if !(Self::MIN_INTERVAL..=Self::MAX_INTERVAL).contains(&self.interval) {
            return Err(crate::Error::invalid(
                "throttle interval",
                format!("{:?} is not in [100ms, 20m]", self.interval),
            ));
        }
        if self.worker.is_empty() || self.worker.len() > crate::MAX_WORKER_BYTES {
            return Err(crate::Error::invalid("worker", "must be 1 to 256 bytes"));
        }
        Ok(())
    }

    /// The interval clamped into its bounds.
    fn interval(&self) -> Duration {
        self.interval.clamp(Self::MIN_INTERVAL, Self::MAX_INTERVAL)
    }

    /// How long a finding stays live: three intervals and two seconds, so one late or
    /// lost report does not make it stale.
    pub fn finding_ttl(&self) -> Duration {
        self.interval() * 3 + Duration::from_secs(2)
    }
}

/// Runs a [`Probe`] on every worker that has one and reports each outcome under the
/// worker's name to the [`ControlStore`], where every worker's
/// [`crate::ControlWatcher`] picks it up: a throttle from any live prober holds the
/// fleet, so workers with different probes each hold it for their own reason.
///
/// One worker is elected (a term of three intervals) to drive the [`Aimd`] rate for
/// `keep_below`; when it dies its term runs out and another takes over, continuing from
/// the rate the last leader reported.
#[derive(Debug)]
pub struct Prober {
    store: Arc<dyn ControlStore>,
    probe: Arc<dyn Probe>,
    clock: Arc<dyn Clock>,
    config: ProberConfig,
    /// The controller, made when `keep_below` is first seen and rebuilt when the
    /// ceiling changes.
    aimd: Option<Aimd>,
}

impl Prober {
    /// A prober of `probe` for the namespace of `store`.
    pub fn new(
        store: Arc<dyn ControlStore>,
        probe: Arc<dyn Probe>,
        clock: Arc<dyn Clock>,
        config: ProberConfig,
    ) -> Self {
        Self {
            store,
            probe,
            clock,
            config,
            aimd: None,
        }
    }

    /// One step: lead or renew, probe, and report. Returns the report written (its
    /// rate set only while this worker leads).
    pub async fn step(&mut self) -> Result<ProbeReport> {
        let term = self.config.interval() * 3;
        let lead = self.store.lead_probes(&self.config.worker, term).await?;
        if lead.repaired_ttl {
            tracing::warn!("the prober key had no TTL (stuck lead); repaired");
        }
        if !lead.leads {
            self.aimd = None;
        }
        let outcome = self.probe.check().await;
        let mut report = ProbeReport {
            ttl_ms: Some(self.config.finding_ttl().as_millis() as u64),
            ..ProbeReport::default()
        };
        match outcome {
            ProbeOutcome::Go => {}
            ProbeOutcome::Throttle { reason } => report.throttle = Some(reason),
            ProbeOutcome::Error(msg) => {
                tracing::warn!(error = %msg, "throttle probe failed; throttling");
                report.throttle = Some(format!("probe error: {msg}"));
                report.error = Some(msg);
            }
            ProbeOutcome::Value(v) => report.value = Some(v),
        }
        if lead.leads {
            let record = self.store.read().await?;
            if let (Some(value), Some(target)) = (report.value, record.settings.keep_below) {
                let ceiling = record
                    .settings
                    .max_rate
                    .and_then(|r| Rate::per_second(r).ok())
                    .or(self.config.max_rate);
                match ceiling {
                    Some(ceiling) => {
                        let aimd = match &mut self.aimd {
                            Some(a) if a.ceiling == ceiling.get() => a,
                            slot => slot.insert(Aimd::new(self.config.floor, ceiling.get())),
                        };
                        let rate = record
                            .probe
                            .as_ref()
                            .and_then(|p| p.rate)
                            .unwrap_or(ceiling.get());
                        report.rate = Some(aimd.next(rate, value, target, self.clock.now_ms()));
                    }
                    None => tracing::warn!("--keep-below needs a --max-rate as its ceiling"),
                }
            }
        }
        self.store
            .report_probe(&self.config.worker, &report)
            .await?;
        Ok(report)
    }

    /// Steps every interval until the handle is aborted (the run loop owns it and aborts
    /// it at shutdown). A failed step is logged and the next one tried.
    pub fn spawn(self) -> JoinHandle<()> {
        self.spawn_watched().0
    }

    /// [`Prober::spawn`], with a receiver of what this worker's own prober last did:
    /// the worker's gate reads it so that no chunk starts before its first result is
    /// in force, nor while its probe cannot report ([`OwnProbe::holds`]).
    pub fn spawn_watched(mut self) -> (JoinHandle<()>, watch::Receiver<OwnProbe>) {
        let (sender, receiver) = watch::channel(OwnProbe::Pending);
        let task = tokio::spawn(async move {
            let mut ticker = tokio::time::interval(self.config.interval());
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                let step = self.step().await;
                let at_ms = self.clock.now_ms();
                let state = match step {
                    Ok(report) => OwnProbe::Reported { report, at_ms },
                    Err(err) => {
                        tracing::warn!(%err, "throttle probe step failed; throttling");
                        OwnProbe::Failed {
                            error: err.to_string(),
                            at_ms,
                        }
                    }
                };
                sender.send_replace(state);
            }
        });
        (task, receiver)
    }
}

/// What a worker's own prober last did ([`Prober::spawn_watched`]).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum OwnProbe {
    /// No step has finished yet.
    Pending,
    /// The last step reported `report` at `at_ms`.
    Reported {
        /// What was reported.
        report: ProbeReport,
        /// When (ms since the epoch).
        at_ms: u64,
    },
    /// The last step failed at `at_ms`: its finding could not be reported (Redis, or a
    /// record a reporter must not overwrite).
    Failed {
        /// Why.
        error: String,
        /// When (ms since the epoch).
        at_ms: u64,
    },
}

impl OwnProbe {
    /// Why this worker must start no chunk at `now_ms`, if it must not: no result yet,
    /// a step that failed, a last report older than `stale` (the prober stalled), or a
    /// report that throttles. Fails closed: only a fresh go lets a chunk start.
    pub fn holds(&self, now_ms: u64, stale: Duration) -> Option<String> {
        let old = |at_ms: u64| u128::from(now_ms.saturating_sub(at_ms)) > stale.as_millis();
        match self {
            OwnProbe::Pending => Some("waiting for the first probe result".to_owned()),
            OwnProbe::Failed { error, .. } => Some(format!("the probe cannot report: {error}")),
            OwnProbe::Reported { at_ms, .. } if old(*at_ms) => {
                Some("the probe has not reported for too long".to_owned())
            }
            OwnProbe::Reported { report, .. } => report.throttle.clone(),
        }
    }
}
