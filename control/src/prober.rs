//! The one worker per namespace that runs the probes and shares what they find.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tranche_codec::Clock;

use crate::{Aimd, ControlStore, Probe, ProbeOutcome, ProbeReport, Rate, Result};

/// How a worker takes part in probing.
#[derive(Debug, Clone)]
pub struct ProberConfig {
    /// This worker's id (the leader's name in `{ns}:control:prober`).
    pub worker: String,
    /// `--throttle-interval`: how often the leader probes; a term is three of them.
    pub interval: Duration,
    /// The worker's own `--max-rate`, the AIMD ceiling unless `tranche set` gave one.
    pub max_rate: Option<Rate>,
    /// The lowest rate AIMD sets, IDs per second.
    pub floor: f64,
}

/// Runs a [`Probe`] on the worker that leads the namespace's probes, and reports its
/// outcome (and, with `keep_below` set, the AIMD rate) to the [`ControlStore`], where
/// every worker's [`crate::ControlWatcher`] picks it up.
///
/// Every worker runs a prober; each step it asks to lead (or renew its term of three
/// intervals), and only the leader probes. When the leader dies its term runs out and
/// another worker takes over, continuing from the rate the last leader reported.
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

    /// One step: lead or renew, and if leading, probe and report. Returns the report
    /// written, or `None` when another worker leads (or lost the lead meanwhile).
    pub async fn step(&mut self) -> Result<Option<ProbeReport>> {
        let term = self.config.interval * 3;
        if !self.store.lead_probes(&self.config.worker, term).await? {
            self.aimd = None;
            return Ok(None);
        }
        let outcome = self.probe.check().await;
        let record = self.store.read().await?;
        let mut report = ProbeReport::default();
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
        let written = self
            .store
            .report_probe(&self.config.worker, &report)
            .await?;
        Ok(written.then_some(report))
    }

    /// Steps every interval until the handle is aborted (the run loop owns it and aborts
    /// it at shutdown). A failed step is logged and the next one tried.
    pub fn spawn(mut self) -> JoinHandle<()> {
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(self.config.interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                if let Err(err) = self.step().await {
                    tracing::warn!(%err, "throttle probe step failed");
                }
            }
        })
    }
}
