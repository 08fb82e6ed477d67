//! The control record of a namespace: live settings and throttles, and their log.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

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
    /// What the probes found last, as the leading prober reported it.
    pub probe: Option<ProbeState>,
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
    /// The worker that leads the probes.
    pub worker: String,
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
    /// The throttle in force, manual first: no new chunk starts while there is one.
    pub fn throttled(&self) -> Option<Throttled> {
        if let Some(m) = &self.manual {
            return Some(Throttled {
                reason: m.reason.clone(),
                since_ms: m.since_ms,
            });
        }
        self.probe.as_ref().and_then(|p| p.throttled.clone())
    }

    /// [`ControlRecord::throttled`] as of `now_ms`, ignoring a probe finding older than
    /// `stale_after` (its prober died and no other worker probes: a run loop should not
    /// stay throttled forever by a finding nobody renews; three probe intervals plus a
    /// margin is a sensible bound). The manual throttle never goes stale.
    pub fn throttled_as_of(
        &self,
        now_ms: u64,
        stale_after: std::time::Duration,
    ) -> Option<Throttled> {
        if self.manual.is_some() {
            return self.throttled();
        }
        let probe = self.probe.as_ref()?;
        let age = now_ms.saturating_sub(probe.at_ms);
        if u128::from(age) > stale_after.as_millis() {
            return None;
        }
        probe.throttled.clone()
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

    pub(crate) fn from_json(text: &str) -> Result<Self> {
        serde_json::from_str(text).map_err(|e| Error::Corrupt(format!("{{ns}}:control: {e}")))
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

/// Applies a change (the set script's JSON) to `record` with the script's checks: the
/// memory store's half of the one contract. `Err` leaves `record` as it was.
pub(crate) fn apply_change(
    record: &ControlRecord,
    change: &str,
    origin: &str,
    now_ms: u64,
) -> Result<ControlRecord> {
    if origin.is_empty() || origin.len() > 512 {
        return Err(Error::invalid("origin", "must be 1 to 512 bytes"));
    }
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
        if !value.is_null() && !valid_setting(&name, &value)? {
            return Err(Error::invalid(
                "setting",
                format!("invalid value for {name}"),
            ));
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
    next.version += 1;
    Ok(next)
}

/// Whether `value` is allowed for the setting `name` (the set script's table of checks).
fn valid_setting(name: &str, value: &Value) -> Result<bool> {
    let int_in = |lo: u64, hi: u64| value.as_u64().is_some_and(|v| (lo..=hi).contains(&v));
    let positive = value.as_f64().is_some_and(|v| v > 0.0 && v <= Rate::MAX);
    Ok(match name {
        "max_rate" | "max_partitions_rate" => positive,
        "keep_below" => value.as_f64().is_some_and(|v| v.abs() <= 1e15),
        "concurrency" | "parallel" => int_in(1, 65_536),
        "chunk" | "chunk_min" | "chunk_max" => int_in(1, 1_000_000_000_000),
        "chunk_time_ms" => int_in(1, 86_400_000),
        "active_hours" => value
            .as_str()
            .is_some_and(|s| ActiveHours::parse(s, None).is_ok()),
        "tz" => value.as_str().is_some_and(|s| {
            !s.is_empty()
                && s.len() <= 64
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_/+-".contains(c))
        }),
        other => {
            return Err(Error::invalid(
                "setting",
                format!("unknown setting {other}"),
            ));
        }
    })
}

/// What the leading prober reports each interval.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ProbeReport {
    /// Throttle, with this reason.
    pub throttle: Option<String>,
    /// The probe's number.
    pub value: Option<f64>,
    /// The probe's error (it throttles too: `throttle` says so).
    pub error: Option<String>,
    /// The AIMD rate for `keep_below`.
    pub rate: Option<f64>,
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
