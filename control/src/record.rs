//! The control record of a namespace: live settings and throttles, and their log.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::checked::{Rejected, valid_setting};
use crate::{ActiveHours, Error, Rate, Result};

/// The namespace's control record, `{ns}:control`: what every worker applies within a
/// poll interval, without restarting.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ControlRecord {
    /// Bumped by every write, so a watcher and a reader of `status` see a change.
    pub version: u64,
    /// Settings set with `tranche set`; `None` leaves the worker's own option in force.
    pub settings: Settings,
    /// The manual throttle (`tranche throttle on`), when on.
    pub manual: Option<ManualThrottle>,
    /// What the leading prober found last, with the AIMD rate it set (only the leader
    /// sets one).
    pub probe: Option<ProbeState>,
    /// The latest finding of each worker that probes, by worker id: a throttle from any
    /// live one holds the fleet (see [`ControlRecord::throttle_in_force`]).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub probes: BTreeMap<String, ProbeState>,
    /// The stored values a reader ignored because they broke the write rules (empty for
    /// a valid record). Not stored: [`crate::ControlStore::read`] fills it in, the caller
    /// warns for each and `health` raises `control_record_invalid`.
    #[serde(skip)]
    pub rejected: Vec<Rejected>,
}

/// Live settings; every field `None` unless set.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Settings {
    /// IDs per second, fleet-wide.
    pub max_rate: Option<f64>,
    /// Partitions claimed per second, fleet-wide.
    pub max_partitions_rate: Option<f64>,
    /// Partitions a worker runs at once.
    pub concurrency: Option<u32>,
    /// IDs per chunk.
    pub chunk: Option<u64>,
    /// Chunks of one partition in flight at once.
    pub parallel: Option<u32>,
    /// Target chunk duration in milliseconds (chunks sized by time).
    pub chunk_time_ms: Option<u64>,
    /// Smallest chunk when sized by time.
    pub chunk_min: Option<u64>,
    /// Largest chunk when sized by time.
    pub chunk_max: Option<u64>,
    /// The probe's value the fleet's rate is adjusted to stay under.
    pub keep_below: Option<f64>,
    /// `HH:MM-HH:MM`, outside which nothing is claimed.
    pub active_hours: Option<String>,
    /// The time zone of `active_hours` (IANA name); the system's when `None`.
    pub tz: Option<String>,
}

/// A manual throttle in force.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ManualThrottle {
    /// Why, as given.
    pub reason: String,
    /// Since when (ms since the epoch); kept when the throttle is turned on again.
    pub since_ms: u64,
    /// Who turned it on.
    pub origin: String,
}

/// What the namespace's probes found last.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ProbeState {
    /// The probe throttle, when on.
    pub throttled: Option<Throttled>,
    /// The number the probe printed, if any.
    pub value: Option<f64>,
    /// The probe's error, if it failed (a failed probe throttles).
    pub error: Option<String>,
    /// The rate the AIMD controller set for `keep_below`, IDs per second.
    pub rate: Option<f64>,
    /// When reported (ms since the epoch).
    pub at_ms: u64,
    /// Until when the finding is live (ms since the epoch): its prober renews it every
    /// interval, and one nobody renewed is stale. 0 in a record written before per-prober
    /// findings (then a caller's bound from `at_ms` applies).
    pub expires_ms: u64,
    /// The worker that reported it.
    pub worker: String,
}

impl ProbeState {
    /// Whether the finding is live at `now_ms`: unexpired, or for an old finding with no
    /// expiry, younger than `fallback`.
    pub fn live(&self, now_ms: u64, fallback: Duration) -> bool {
        if self.expires_ms > 0 {
            return now_ms < self.expires_ms;
        }
        u128::from(now_ms.saturating_sub(self.at_ms)) <= fallback.as_millis()
    }
}

/// What a probe finding nobody renews means (`--probe-stale`): by default the fleet
/// throttles until a prober reports again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ProbeStale {
    /// Throttle (fail closed).
    #[default]
    Throttle,
    /// Go on as if no probe were configured.
    Go,
}

impl FromStr for ProbeStale {
    type Err = Error;

    /// `throttle` or `go`.
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "throttle" => Ok(ProbeStale::Throttle),
            "go" => Ok(ProbeStale::Go),
            other => Err(Error::invalid(
                "probe-stale",
                format!("{other:?} is not throttle or go"),
            )),
        }
    }
}

/// A throttle's reason and start.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Throttled {
    /// Why.
    pub reason: String,
    /// Since when (ms since the epoch).
    pub since_ms: u64,
}

impl ControlRecord {
    /// How long a finding with no expiry of its own (written before per-prober
    /// findings) stays live in [`ControlRecord::throttle_in_force`].
    pub const LEGACY_STALE: Duration = Duration::from_secs(30);

    /// The throttle recorded, manual first, ignoring time: a manual throttle, or any
    /// prober's finding that says throttle.
    pub fn throttled(&self) -> Option<Throttled> {
        if let Some(m) = &self.manual {
            return Some(Throttled {
                reason: m.reason.clone(),
                since_ms: m.since_ms,
            });
        }
        self.findings()
            .filter_map(|p| p.throttled.clone())
            .min_by_key(|t| t.since_ms)
    }

    /// Every prober's finding: the per-prober ones, or the lead's alone in a record
    /// written before there were per-prober findings.
    pub fn findings(&self) -> impl Iterator<Item = &ProbeState> {
        let legacy = self
            .probes
            .is_empty()
            .then_some(self.probe.as_ref())
            .flatten();
        self.probes.values().chain(legacy)
    }

    /// The throttle in force at `now_ms`, manual first: the earliest throttle among the
    /// live probe findings (any live prober holds the fleet); with no live finding but
    /// stale ones, a throttle saying so unless `stale` is [`ProbeStale::Go`]. A manual
    /// throttle never goes stale.
    pub fn throttle_in_force(&self, now_ms: u64, stale: ProbeStale) -> Option<Throttled> {
        self.probe_throttle(now_ms, Self::LEGACY_STALE, stale)
    }

    /// [`ControlRecord::throttled`] as of `now_ms` with stale findings ignored
    /// ([`ProbeStale::Go`]), a finding with no expiry being live for `stale_after`. Kept
    /// for callers that predate [`ControlRecord::throttle_in_force`], which fails closed.
    pub fn throttled_as_of(&self, now_ms: u64, stale_after: Duration) -> Option<Throttled> {
        self.probe_throttle(now_ms, stale_after, ProbeStale::Go)
    }

    fn probe_throttle(
        &self,
        now_ms: u64,
        fallback: Duration,
        stale: ProbeStale,
    ) -> Option<Throttled> {
        if self.manual.is_some() {
            return self.throttled();
        }
        let (live, dead): (Vec<&ProbeState>, Vec<&ProbeState>) =
            self.findings().partition(|p| p.live(now_ms, fallback));
        if !live.is_empty() {
            return live
                .iter()
                .filter_map(|p| p.throttled.clone())
                .min_by_key(|t| t.since_ms);
        }
        let newest = dead.iter().max_by_key(|p| p.at_ms)?;
        match stale {
            ProbeStale::Go => None,
            ProbeStale::Throttle => Some(Throttled {
                reason: format!(
                    "no prober renewed its finding (last from {:?})",
                    newest.worker
                ),
                since_ms: if newest.expires_ms > 0 {
                    newest.expires_ms
                } else {
                    newest.at_ms
                },
            }),
        }
    }

    /// The ID rate in force: the set `max_rate` (or `fallback`, the worker's own
    /// option), lowered to the AIMD rate while `keep_below` is set.
    pub fn ids_rate(&self, fallback: Option<Rate>) -> Option<Rate> {
        let base = self
            .settings
            .max_rate
            .and_then(|r| Rate::per_second(r).ok())
            .or(fallback);
        let aimd = self
            .settings
            .keep_below
            .and(self.probe.as_ref().and_then(|p| p.rate))
            .and_then(|r| Rate::per_second(r).ok());
        match (base, aimd) {
            (Some(b), Some(a)) => Some(if a < b { a } else { b }),
            (b, a) => b.or(a),
        }
    }

    /// The partition rate in force: the set one, or `fallback`.
    pub fn partitions_rate(&self, fallback: Option<Rate>) -> Option<Rate> {
        self.settings
            .max_partitions_rate
            .and_then(|r| Rate::per_second(r).ok())
            .or(fallback)
    }

    /// The active hours in force, if set (and valid: the store checks them on write).
    pub fn active_hours(&self) -> Option<ActiveHours> {
        let spec = self.settings.active_hours.as_deref()?;
        ActiveHours::parse(spec, self.settings.tz.as_deref()).ok()
    }

    /// Decodes a stored record by the write rules, never failing as a whole: each bad
    /// value is dropped and listed in `rejected`, a throttle that cannot be read still
    /// throttles.
    pub fn decode(bytes: &[u8]) -> Self {
        crate::checked::decode(bytes)
    }

    /// The record as stored (JSON; `rejected` is not stored).
    pub(crate) fn encode(&self) -> String {
        serde_json::to_string(self).expect("a record serializes")
    }
}

/// One change of a setting for [`crate::ControlStore::set`]: `Some` sets, `None`
/// clears (the worker's own option is in force again).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Change {
    /// `--max-rate`.
    MaxRate(Option<Rate>),
    /// `--max-partitions-rate`.
    MaxPartitionsRate(Option<Rate>),
    /// `--concurrency`, 1 to 65536.
    Concurrency(Option<u32>),
    /// `--chunk`, 1 to 10¹².
    Chunk(Option<u64>),
    /// `--parallel`, 1 to 65536.
    Parallel(Option<u32>),
    /// `--chunk-time`, in milliseconds, 1 to 86 400 000.
    ChunkTimeMs(Option<u64>),
    /// `--chunk-min`.
    ChunkMin(Option<u64>),
    /// `--chunk-max`.
    ChunkMax(Option<u64>),
    /// `--keep-below`.
    KeepBelow(Option<f64>),
    /// `--active-hours` with `--tz` (one change: the zone belongs to the hours).
    ActiveHours(Option<ActiveHours>),
}

impl Change {
    /// The change as the set script's JSON fields.
    fn fields(&self, out: &mut Map<String, Value>) {
        fn put<T: Serialize>(out: &mut Map<String, Value>, name: &str, v: Option<T>) {
            out.insert(name.to_owned(), serde_json::to_value(v).expect("json"));
        }
        match self {
            Change::MaxRate(r) => put(out, "max_rate", r.map(Rate::get)),
            Change::MaxPartitionsRate(r) => put(out, "max_partitions_rate", r.map(Rate::get)),
            Change::Concurrency(v) => put(out, "concurrency", *v),
            Change::Chunk(v) => put(out, "chunk", *v),
            Change::Parallel(v) => put(out, "parallel", *v),
            Change::ChunkTimeMs(v) => put(out, "chunk_time_ms", *v),
            Change::ChunkMin(v) => put(out, "chunk_min", *v),
            Change::ChunkMax(v) => put(out, "chunk_max", *v),
            Change::KeepBelow(v) => put(out, "keep_below", *v),
            Change::ActiveHours(h) => {
                put(out, "active_hours", h.as_ref().map(ActiveHours::spec));
                put(
                    out,
                    "tz",
                    h.as_ref().and_then(|h| h.tz().map(str::to_owned)),
                );
            }
        }
    }
}

/// The set script's change argument for `changes` (and a manual throttle switch).
pub(crate) fn change_json(changes: &[Change], manual: Option<(bool, &str)>) -> Result<String> {
    let mut out = Map::new();
    for c in changes {
        // JSON has no NaN or infinity (serde_json would write null, which clears).
        if let Change::KeepBelow(Some(v)) = c
            && !v.is_finite()
        {
            return Err(Error::invalid("keep_below", format!("{v} is not finite")));
        }
        c.fields(&mut out);
    }
    if let Some((on, reason)) = manual {
        out.insert(
            "manual".to_owned(),
            serde_json::json!({ "on": on, "reason": reason }),
        );
    }
    Ok(Value::Object(out).to_string())
}

/// The version after `version`: one more, restarting at 1 from 10¹⁴ (past it cjson,
/// which writes the record on Redis, no longer keeps every digit), as the scripts do.
pub(crate) fn next_version(version: u64) -> u64 {
    if version >= crate::checked::MAX_MS {
        1
    } else {
        version + 1
    }
}

/// Who made a change: 1 to 512 bytes, as the scripts require.
pub(crate) fn check_origin(origin: &str) -> Result<()> {
    if origin.is_empty() || origin.len() > 512 {
        return Err(Error::invalid("origin", "must be 1 to 512 bytes"));
    }
    Ok(())
}

/// Applies a change (the set script's JSON) to `record` with the script's checks: the
/// memory store's half of the one contract. `Err` leaves `record` as it was.
pub(crate) fn apply_change(
    record: &ControlRecord,
    change: &str,
    origin: &str,
    now_ms: u64,
) -> Result<ControlRecord> {
    check_origin(origin)?;
    let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(change) else {
        return Err(Error::invalid("change", "not a JSON object"));
    };
    if fields.is_empty() {
        return Err(Error::invalid("change", "nothing to change"));
    }
    let mut settings = serde_json::to_value(&record.settings).expect("json");
    let mut manual = None;
    for (name, value) in fields {
        if name == "manual" {
            let on = value.get("on").and_then(Value::as_bool);
            let reason = match value.get("reason") {
                None => Some(String::new()),
                Some(Value::String(s)) if s.len() <= 512 => Some(s.clone()),
                _ => None,
            };
            match (on, reason) {
                (Some(on), Some(reason)) => manual = Some((on, reason)),
                _ => {
                    return Err(Error::invalid(
                        "manual",
                        "must be {on: bool, reason: string}",
                    ));
                }
            }
            continue;
        }
        match valid_setting(&name, &value) {
            None => {
                return Err(Error::invalid("setting", format!("unknown setting {name}")));
            }
            Some(false) if !value.is_null() => {
                return Err(Error::invalid(
                    "setting",
                    format!("invalid value for {name}"),
                ));
            }
            _ => {}
        }
        settings[name.as_str()] = value;
    }
    let settings: Settings =
        serde_json::from_value(settings).map_err(|e| Error::invalid("setting", e.to_string()))?;
    if let (Some(lo), Some(hi)) = (settings.chunk_min, settings.chunk_max)
        && lo > hi
    {
        return Err(Error::invalid("setting", "chunk_min is above chunk_max"));
    }
    let mut next = record.clone();
    next.settings = settings;
    if let Some((on, reason)) = manual {
        next.manual = on.then(|| ManualThrottle {
            reason,
            since_ms: record.manual.as_ref().map_or(now_ms, |m| m.since_ms),
            origin: origin.to_owned(),
        });
    }
    next.version = next_version(record.version);
    Ok(next)
}

/// What a prober reports each interval.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ProbeReport {
    /// Throttle, with this reason.
    pub throttle: Option<String>,
    /// The probe's number.
    pub value: Option<f64>,
    /// The probe's error (it throttles too: `throttle` says so).
    pub error: Option<String>,
    /// The AIMD rate for `keep_below` (taken from the leading prober only).
    pub rate: Option<f64>,
    /// How long the finding stays live unless renewed, in ms (1 to 3 600 000); `None` is
    /// [`ControlRecord::LEGACY_STALE`].
    pub ttl_ms: Option<u64>,
}

/// One entry of the change log, `tranche control log`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogEntry {
    /// The stream entry id (memory: a sequence number).
    pub id: String,
    /// When (ms since the epoch, the writer's clock).
    pub at_ms: u64,
    /// Who: `host/pid/user` for a person, `probe@WORKER` for the prober.
    pub origin: String,
    /// What changed: the change JSON, or `probe throttle on: REASON` / `off`.
    pub change: String,
    /// The record's version after the change.
    pub version: u64,
}
