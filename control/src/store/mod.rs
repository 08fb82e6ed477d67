//! Where the control record lives: `{ns}:control` on Redis, or in memory.
//!
//! Both backends keep the record as the same JSON bytes and decode every read through
//! [`ControlRecord::decode`], so a corrupt record reads the same way on each: its bad
//! values dropped one by one, a throttle that cannot be read still throttling.

mod memory;
mod redis_store;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tranche_codec::KeySchema;

use crate::checked::{MAX_REASON_BYTES, MAX_WORKER_BYTES, truncate};
use crate::{Change, ControlRecord, Error, LogEntry, ProbeReport, Rate, Rejected, Result};

pub use memory::MemoryControlStore;
pub use redis_store::RedisControlStore;
#[cfg(feature = "testing")]
pub use redis_store::scripts;
pub(crate) use redis_store::take_lua;

/// The change log keeps this many entries.
pub const LOG_CAP: usize = 100;
/// How long a replaced record is kept under [`ControlKeys::quarantine`].
pub const QUARANTINE_TTL: Duration = Duration::from_secs(7 * 86_400);

/// The control keys of a namespace, all under its `{ns}` tag (one slot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlKeys {
    tag: String,
}

impl ControlKeys {
    /// The control keys of the namespace `schema` names.
    pub fn new(schema: &KeySchema) -> Self {
        Self {
            tag: schema.global_tag(),
        }
    }

    /// `{ns}:control`: the record, one JSON object.
    pub fn record(&self) -> String {
        format!("{}:control", self.tag)
    }

    /// `{ns}:control:log`: the last 100 changes, a stream.
    pub fn log(&self) -> String {
        format!("{}:control:log", self.tag)
    }

    /// `{ns}:control:prober`: the worker that leads the probes.
    pub fn prober(&self) -> String {
        format!("{}:control:prober", self.tag)
    }

    /// `{ns}:control:quarantine`: the last record a repair or a `set` replaced because
    /// it broke the rules, kept for [`QUARANTINE_TTL`].
    pub fn quarantine(&self) -> String {
        format!("{}:control:quarantine", self.tag)
    }

    /// `{ns}:control:rate:<limit>`: a rate limit's theoretical arrival time.
    pub fn rate(&self, limit: crate::Limit) -> String {
        format!("{}:control:rate:{}", self.tag, limit.name())
    }
}

/// The answer of [`ControlStore::lead_probes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lead {
    /// The asking worker leads (newly elected or renewed).
    pub leads: bool,
    /// The prober key had no TTL (written by hand or a foreign tool) and was given the
    /// term as one: without it a dead holder would keep the lead for ever.
    pub repaired_ttl: bool,
}

/// The answer of [`ControlStore::set_unless_changed`].
#[derive(Debug, Clone, PartialEq)]
pub struct SetOutcome {
    /// The record after the change (unchanged when every setting was skipped).
    pub record: ControlRecord,
    /// The settings left alone because the log shows a change since the given time
    /// (their names as in the record: `keep_below`, `max_rate`, …).
    pub skipped: Vec<String>,
}

/// What [`ControlStore::repair`] did to a record that broke the rules.
#[derive(Debug, Clone, PartialEq)]
pub struct Repaired {
    /// The values that were dropped.
    pub rejected: Vec<Rejected>,
    /// The record written in its place.
    pub record: ControlRecord,
    /// What was done, as logged (`repair: …`).
    pub note: String,
}

/// A namespace's control record, change log and probe leadership.
#[async_trait]
pub trait ControlStore: Send + Sync + std::fmt::Debug {
    /// The record (the default one when none was ever written), checked: values that
    /// break the write rules are dropped and listed in its `rejected`, never an error.
    async fn read(&self) -> Result<ControlRecord>;

    /// Applies `changes` (checked; a refused change writes nothing), bumps the version
    /// and logs the change under `origin`. Returns the new record. A stored record with
    /// bad values is no reason to refuse: they are dropped (the good ones kept), and one
    /// that is not JSON is quarantined and replaced.
    async fn set(&self, changes: &[Change], origin: &str) -> Result<ControlRecord> {
        Ok(self.set_if(changes, origin, None).await?.record)
    }

    /// [`ControlStore::set`], but a setting the log shows changed after `since_ms`
    /// (ms since the epoch, the writers' clocks) is left as it is: a worker's start-up
    /// option never overwrites a newer operator change. When the log (the last
    /// [`LOG_CAP`] changes) no longer reaches back to `since_ms`, every setting counts
    /// as changed.
    async fn set_unless_changed(
        &self,
        changes: &[Change],
        origin: &str,
        since_ms: u64,
    ) -> Result<SetOutcome> {
        self.set_if(changes, origin, Some(since_ms)).await
    }

    /// The one write of settings behind [`ControlStore::set`] and
    /// [`ControlStore::set_unless_changed`].
    async fn set_if(
        &self,
        changes: &[Change],
        origin: &str,
        since_ms: Option<u64>,
    ) -> Result<SetOutcome>;

    /// Turns the manual throttle on (with `reason`) or off, logged under `origin`.
    async fn throttle(&self, on: bool, reason: &str, origin: &str) -> Result<ControlRecord>;

    /// The last `n` changes, newest first.
    async fn log(&self, n: usize) -> Result<Vec<LogEntry>>;

    /// Records `worker`'s probe finding under its name (a reason or error over 512
    /// bytes is cut and marked, never refused); the AIMD rate is taken only from the
    /// leading prober. Returns whether `worker` leads.
    async fn report_probe(&self, worker: &str, report: &ProbeReport) -> Result<bool>;

    /// Elects `worker` to lead the probes for `term`, or renews its term.
    async fn lead_probes(&self, worker: &str, term: Duration) -> Result<Lead>;

    /// Removes `worker`'s probe finding and gives up its lead, when it stops on
    /// purpose: a finding nobody renews would otherwise go stale and throttle the
    /// fleet. Returns whether there was a finding.
    async fn retire_probe(&self, worker: &str) -> Result<bool>;

    /// `check --repair`: when the stored record breaks the rules, moves it to
    /// [`ControlKeys::quarantine`] and writes in its place its valid values, each bad
    /// setting (and a bad manual throttle) restored to its last valid value in the log.
    /// `None` when the record was valid (nothing written).
    async fn repair(&self, origin: &str) -> Result<Option<Repaired>>;
}

#[async_trait]
impl<S: ControlStore + ?Sized> ControlStore for Arc<S> {
    async fn read(&self) -> Result<ControlRecord> {
        (**self).read().await
    }
    async fn set_if(
        &self,
        changes: &[Change],
        origin: &str,
        since_ms: Option<u64>,
    ) -> Result<SetOutcome> {
        (**self).set_if(changes, origin, since_ms).await
    }
    async fn throttle(&self, on: bool, reason: &str, origin: &str) -> Result<ControlRecord> {
        (**self).throttle(on, reason, origin).await
    }
    async fn log(&self, n: usize) -> Result<Vec<LogEntry>> {
        (**self).log(n).await
    }
    async fn report_probe(&self, worker: &str, report: &ProbeReport) -> Result<bool> {
        (**self).report_probe(worker, report).await
    }
    async fn lead_probes(&self, worker: &str, term: Duration) -> Result<Lead> {
        (**self).lead_probes(worker, term).await
    }
    async fn retire_probe(&self, worker: &str) -> Result<bool> {
        (**self).retire_probe(worker).await
    }
    async fn repair(&self, origin: &str) -> Result<Option<Repaired>> {
        (**self).repair(origin).await
    }
}

fn check_worker(worker: &str) -> Result<()> {
    if worker.is_empty() || worker.len() > MAX_WORKER_BYTES {
        return Err(Error::invalid("worker", "must be 1 to 256 bytes"));
    }
    Ok(())
}

fn check_term(term: Duration) -> Result<u64> {
    let ms = u64::try_from(term.as_millis()).unwrap_or(u64::MAX);
    if !(1..=3_600_000).contains(&ms) {
        return Err(Error::invalid("term", "must be 1 ms to 1 h"));
    }
    Ok(ms)
}

/// The report as the scripts take it: never refused for what a probe printed. A reason
/// or error over 512 bytes is cut and marked; a value that is not finite throttles (the
/// probe is broken); a rate out of range is dropped (the ceiling applies); a TTL is
/// clamped to [1 ms, 1 h].
fn fit_report(report: &ProbeReport) -> ProbeReport {
    let mut out = ProbeReport {
        throttle: report
            .throttle
            .as_deref()
            .map(|r| truncate(r, MAX_REASON_BYTES)),
        value: report.value.filter(|v| v.is_finite() && v.abs() < 1e300),
        error: report
            .error
            .as_deref()
            .map(|e| truncate(e, MAX_REASON_BYTES)),
        rate: report.rate.filter(|r| Rate::allowed(*r)),
        ttl_ms: report.ttl_ms.map(|t| t.clamp(1, 3_600_000)),
    };
    if report.value.is_some() && out.value.is_none() && out.throttle.is_none() {
        out.throttle = Some("probe value is not a finite number".to_owned());
    }
    out
}

/// Wraps `what` as a store error about a stored record that is not JSON: a probe
/// report refuses it rather than erase a throttle it cannot read.
fn unreadable(record: &ControlRecord) -> Option<Error> {
    record
        .rejected
        .iter()
        .find(|r| r.key == "record")
        .map(|r| Error::Corrupt(format!("{{ns}}:control is unreadable: {r}")))
}
