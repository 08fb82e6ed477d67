//! The control store of an embedded run.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tranche_codec::Clock;

use super::{
    ControlStore, LOG_CAP, Lead, Repaired, SetOutcome, check_term, check_worker, fit_report,
    unreadable,
};
use crate::checked::MAX_PROBERS;
use crate::record::{apply_change, change_json};
use crate::{Change, ControlRecord, LogEntry, ProbeReport, ProbeState, Result, Throttled};

/// The control store of an embedded run: the same JSON bytes and rules as Redis.
#[derive(Debug)]
pub struct MemoryControlStore {
    clock: Arc<dyn Clock>,
    state: Mutex<MemoryState>,
}

#[derive(Debug, Default)]
struct MemoryState {
    /// The record as stored (what `{ns}:control` would hold).
    raw: Option<Vec<u8>>,
    /// What a repair or a `set` replaced.
    quarantine: Option<Vec<u8>>,
    log: VecDeque<LogEntry>,
    next_id: u64,
    /// The leading prober and when its term ends (clock ms).
    prober: Option<(String, u64)>,
}

impl MemoryState {
    fn record(&self) -> ControlRecord {
        self.raw
            .as_deref()
            .map_or_else(ControlRecord::default, ControlRecord::decode)
    }

    fn push_log(&mut self, at_ms: u64, origin: &str, change: String, version: u64) {
        self.next_id += 1;
        self.log.push_back(LogEntry {
            id: self.next_id.to_string(),
            at_ms,
            origin: origin.to_owned(),
            change,
            version,
        });
        while self.log.len() > LOG_CAP {
            self.log.pop_front();
        }
    }

    /// Whether the log shows `name` changed after `since_ms` (or no longer reaches
    /// back to it): `set.lua`'s rule.
    fn changed_since(&self, name: &str, since_ms: u64) -> bool {
        let reaches =
            self.log.len() < LOG_CAP || self.log.front().is_some_and(|e| e.at_ms <= since_ms);
        !reaches
            || self.log.iter().any(|e| {
                e.at_ms > since_ms
                    && serde_json::from_str::<serde_json::Value>(&e.change)
                        .ok()
                        .is_some_and(|v| v.get(name).is_some())
            })
    }
}

impl MemoryControlStore {
    /// An empty store on `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            state: Mutex::default(),
        }
    }

    /// Test hook: stores `bytes` as the record, as a foreign writer (or a flipped
    /// byte) would.
    #[cfg(feature = "testing")]
    pub fn put_raw(&self, bytes: &[u8]) {
        self.state.lock().expect("control lock").raw = Some(bytes.to_vec());
    }

    /// Test hook: what a repair or a `set` quarantined.
    #[cfg(feature = "testing")]
    pub fn quarantined(&self) -> Option<Vec<u8>> {
        self.state.lock().expect("control lock").quarantine.clone()
    }

    fn change(&self, change: String, origin: &str, since_ms: Option<u64>) -> Result<SetOutcome> {
        let now = self.clock.now_ms();
        let mut state = self.state.lock().expect("control lock");
        let current = state.record();
        let whole = current.rejected.iter().any(|r| r.key == "record");
        let base = if whole {
            ControlRecord::default()
        } else {
            current.clone()
        };
        let mut skipped = Vec::new();
        let mut effective = change.clone();
        if let Some(since) = since_ms {
            let mut fields: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str(&change).unwrap_or_default();
            let names: Vec<String> = fields.keys().filter(|k| *k != "manual").cloned().collect();
            for name in names {
                if state.changed_since(&name, since) {
                    fields.remove(&name);
                    skipped.push(name);
                }
            }
            if !skipped.is_empty() {
                // Checked first as a whole, like the script: a bad value is refused
                // even when it would be skipped.
                apply_change(&base, &change, origin, now)?;
                if fields.is_empty() {
                    return Ok(SetOutcome {
                        record: current,
                        skipped,
                    });
                }
                effective = serde_json::Value::Object(fields).to_string();
            }
        }
        let mut next = apply_change(&base, &effective, origin, now)?;
        next.rejected.clear();
        if whole {
            state.quarantine = state.raw.take();
        }
        state.raw = Some(next.encode().into_bytes());
        state.push_log(now, origin, effective, next.version);
        Ok(SetOutcome {
            record: state.record(),
            skipped,
        })
    }
}

#[async_trait]
impl ControlStore for MemoryControlStore {
    async fn read(&self) -> Result<ControlRecord> {
        Ok(self.state.lock().expect("control lock").record())
    }

    async fn set_if(
        &self,
        changes: &[Change],
        origin: &str,
        since_ms: Option<u64>,
    ) -> Result<SetOutcome> {
        self.change(change_json(changes, None)?, origin, since_ms)
    }

    async fn throttle(&self, on: bool, reason: &str, origin: &str) -> Result<ControlRecord> {
        Ok(self
            .change(change_json(&[], Some((on, reason)))?, origin, None)?
            .record)
    }

    async fn log(&self, n: usize) -> Result<Vec<LogEntry>> {
        let state = self.state.lock().expect("control lock");
        Ok(state.log.iter().rev().take(n).cloned().collect())
    }

    async fn report_probe(&self, worker: &str, report: &ProbeReport) -> Result<bool> {
        check_worker(worker)?;
        let report = fit_report(report);
        let now = self.clock.now_ms();
        let mut state = self.state.lock().expect("control lock");
        let mut record = state.record();
        if let Some(err) = unreadable(&record) {
            return Err(err);
        }
        let leads = state
            .prober
            .as_ref()
            .is_some_and(|(w, until)| w == worker && *until > now);
        // `probes` that was not an object is replaced, as probe.lua replaces it.
        if record.rejected.iter().any(|r| r.key == "probes") {
            record.probes.clear();
        }
        // What probe.lua sees of this worker's last finding: nothing of an entry or a
        // throttle that is not an object, no start time that is not a number.
        let entry = format!("probes.{}", crate::truncate(worker, 64));
        let bad = |suffix: &str| {
            let key = format!("{entry}{suffix}");
            record.rejected.iter().any(|r| r.key == key)
        };
        let was = record
            .probes
            .get(worker)
            .and_then(|p| p.throttled.clone())
            .filter(|_| !bad("") && !bad(".throttled"));
        let since = was
            .as_ref()
            .filter(|_| !bad(".throttled.since_ms"))
            .map_or(now, |w| w.since_ms);
        let throttled = report.throttle.as_ref().map(|reason| Throttled {
            reason: reason.clone(),
            since_ms: since,
        });
        let ttl = report
            .ttl_ms
            .unwrap_or(ControlRecord::LEGACY_STALE.as_millis() as u64);
        let finding = ProbeState {
            throttled,
            value: report.value,
            error: report.error.clone(),
            rate: None,
            at_ms: now,
            expires_ms: now + ttl,
            worker: worker.to_owned(),
        };
        let is = finding.throttled.is_some();
        record.probes.insert(worker.to_owned(), finding.clone());
        while record.probes.len() > MAX_PROBERS {
            let oldest = record
                .probes
                .iter()
                .min_by_key(|(_, p)| p.at_ms)
                .map(|(w, _)| w.clone())
                .expect("not empty");
            record.probes.remove(&oldest);
        }
        if leads {
            record.probe = Some(ProbeState {
                rate: report.rate,
                ..finding
            });
        }
        record.version = crate::record::next_version(record.version);
        record.rejected.clear();
        state.raw = Some(record.encode().into_bytes());
        if was.is_some() != is {
            let change = match &report.throttle {
                Some(reason) => format!("probe throttle on: {reason}"),
                None => "probe throttle off".to_owned(),
            };
            state.push_log(now, &format!("probe@{worker}"), change, record.version);
        }
        Ok(leads)
    }

    async fn lead_probes(&self, worker: &str, term: Duration) -> Result<Lead> {
        check_worker(worker)?;
        let term = check_term(term)?;
        let now = self.clock.now_ms();
        let mut state = self.state.lock().expect("control lock");
        let leads = match &state.prober {
            Some((w, until)) if *until > now && w != worker => false,
            _ => {
                state.prober = Some((worker.to_owned(), now + term));
                true
            }
        };
        Ok(Lead {
            leads,
            repaired_ttl: false,
        })
    }

    async fn retire_probe(&self, worker: &str) -> Result<bool> {
        check_worker(worker)?;
        let now = self.clock.now_ms();
        let mut state = self.state.lock().expect("control lock");
        if state.prober.as_ref().is_some_and(|(w, _)| w == worker) {
            state.prober = None;
        }
        let mut record = state.record();
        if let Some(err) = unreadable(&record) {
            return Err(err);
        }
        let Some(finding) = record.probes.remove(worker) else {
            return Ok(false);
        };
        record.version = crate::record::next_version(record.version);
        record.rejected.clear();
        state.raw = Some(record.encode().into_bytes());
        if finding.throttled.is_some() {
            let origin = format!("probe@{worker}");
            let change = "probe throttle off: retired".to_owned();
            state.push_log(now, &origin, change, record.version);
        }
        Ok(true)
    }

    async fn repair(&self, origin: &str) -> Result<Option<Repaired>> {
        crate::record::check_origin(origin)?;
        let now = self.clock.now_ms();
        let mut state = self.state.lock().expect("control lock");
        let record = state.record();
        if record.rejected.is_empty() {
            return Ok(None);
        }
        let log: Vec<LogEntry> = state.log.iter().rev().cloned().collect();
        let (fixed, note) = crate::repair::rebuild(&record, &log);
        state.quarantine = state.raw.take();
        state.raw = Some(fixed.encode().into_bytes());
        state.push_log(now, origin, note.clone(), fixed.version);
        Ok(Some(Repaired {
            rejected: record.rejected,
            record: state.record(),
            note,
        }))
    }
}
