//! Checked reads of the control record: the one place `{ns}:control` is decoded.
//!
//! Every reader (workers, `status`, `serve`, `/metrics`, the stores themselves) goes
//! through [`decode`], which applies the rules `lua/set.lua` applies on a write. Decoding
//! never fails as a whole: each value that is out of range, of the wrong JSON type or
//! undecodable is dropped by itself and listed as a [`Rejected`] field on the record,
//! so the reader's own option applies in its place and the caller can warn and raise a
//! health rule. Nothing in the stored bytes can make a reader panic or allocate by a
//! stored number: sizes are capped before anything is parsed, and every number is
//! checked against the range its use allows.
//!
//! Throttles fail closed: a manual throttle or probe finding that is present but
//! unreadable still throttles (with a reason saying so), and a record that is not JSON
//! at all reads as a manual throttle until `tranche check --repair` or a `set` replaces
//! it.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::{Map, Value};

use crate::{ControlRecord, ManualThrottle, ProbeState, Rate, Settings, Throttled};

/// The largest stored record a reader decodes; a larger one reads as unreadable.
pub const MAX_RECORD_BYTES: usize = 256 * 1024;
/// The longest reason or error a record keeps, in bytes; a longer one is truncated and
/// marked with [`TRUNCATED`].
pub const MAX_REASON_BYTES: usize = 512;
/// The longest worker id, in bytes.
pub const MAX_WORKER_BYTES: usize = 256;
/// The most probers whose findings a record keeps (the oldest beyond it are dropped).
pub const MAX_PROBERS: usize = 64;
/// The end of a reason or error that was cut to [`MAX_REASON_BYTES`].
pub const TRUNCATED: &str = "…(truncated)";
/// The largest time stamp (ms since the epoch) the scripts accept: year 5138.
pub(crate) const MAX_MS: u64 = 100_000_000_000_000;
/// The reason of a throttle that is present in the record but cannot be read.
pub const UNREADABLE_THROTTLE: &str =
    "the control record's throttle is unreadable (tranche check --repair)";

/// One value of a stored control record that a reader ignored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    /// Where it was: `settings.chunk`, `manual.reason`, `probes.w1.at_ms`, or `record`
    /// for the whole record.
    pub key: String,
    /// The value as stored (JSON), cut to 80 bytes.
    pub value: String,
    /// Why it was ignored.
    pub why: String,
}

impl fmt::Display for Rejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} = {}: {}", self.key, self.value, self.why)
    }
}

/// `text` cut to at most `max` bytes on a character boundary, ending in [`TRUNCATED`]
/// when it was cut: a long probe reason is kept, marked, never refused.
pub fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max.saturating_sub(TRUNCATED.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{TRUNCATED}", &text[..end])
}

/// Decodes a stored record by the write rules, dropping each bad value by itself (see
/// the module docs). The result's `rejected` lists what was dropped.
pub(crate) fn decode(bytes: &[u8]) -> ControlRecord {
    let mut d = Decoder::default();
    let record = d.record(bytes);
    ControlRecord {
        rejected: d.rejected,
        ..record
    }
}

/// Whether `value` is allowed for the setting `name`; `None` for an unknown setting.
/// The table of `lua/set.lua`, in Rust.
pub(crate) fn valid_setting(name: &str, value: &Value) -> Option<bool> {
    Some(match name {
        "max_rate" | "max_partitions_rate" => value.as_f64().is_some_and(Rate::allowed),
        "keep_below" => value.as_f64().is_some_and(|v| v.abs() <= 1e15),
        "concurrency" | "parallel" => integer_in(value, 1, 65_536).is_some(),
        "chunk" | "chunk_min" | "chunk_max" => integer_in(value, 1, 1_000_000_000_000).is_some(),
        "chunk_time_ms" => integer_in(value, 1, 86_400_000).is_some(),
        "active_hours" => value.as_str().is_some_and(hours),
        "tz" => value.as_str().is_some_and(zone),
        _ => return None,
    })
}

/// An integer in `[lo, hi]`, written as an integer or as a float with no fraction (Lua
/// numbers are floats).
fn integer_in(value: &Value, lo: u64, hi: u64) -> Option<u64> {
    let v = match value.as_u64() {
        Some(v) => v,
        None => {
            let f = value.as_f64()?;
            if !(f.fract() == 0.0 && (0.0..=1e15).contains(&f)) {
                return None;
            }
            f as u64
        }
    };
    (lo..=hi).contains(&v).then_some(v)
}

/// `HH:MM-HH:MM` with two digits each, as `set.lua`'s pattern has it.
fn hours(v: &str) -> bool {
    let b = v.as_bytes();
    let digits = |i: usize| b[i].is_ascii_digit() && b[i + 1].is_ascii_digit();
    let shape = b.len() == 11
        && digits(0)
        && b[2] == b':'
        && digits(3)
        && b[5] == b'-'
        && digits(6)
        && b[8] == b':'
        && digits(9);
    shape && crate::ActiveHours::parse(v, Some("UTC")).is_ok()
}

fn zone(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 64
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_/+-".contains(c))
}

/// `value` as an object, an empty array reading as an empty object: `lua/set.lua`
/// writes the record through cjson, which cannot tell the two apart and writes `{}`
/// for either, so the readers treat them alike.
fn object(value: &Value) -> Option<&Map<String, Value>> {
    static EMPTY: std::sync::LazyLock<Map<String, Value>> = std::sync::LazyLock::new(Map::new);
    match value {
        Value::Object(map) => Some(map),
        Value::Array(items) if items.is_empty() => Some(&EMPTY),
        _ => None,
    }
}

#[derive(Default)]
struct Decoder {
    rejected: Vec<Rejected>,
}

impl Decoder {
    fn reject(&mut self, key: impl Into<String>, value: &Value, why: impl Into<String>) {
        let text = value.to_string();
        self.rejected.push(Rejected {
            key: key.into(),
            value: truncate(&text, 80),
            why: why.into(),
        });
    }

    fn record(&mut self, bytes: &[u8]) -> ControlRecord {
        if bytes.len() > MAX_RECORD_BYTES {
            return self.unreadable(
                &Value::String(format!("{} bytes", bytes.len())),
                format!("over {MAX_RECORD_BYTES} bytes"),
            );
        }
        // Invalid UTF-8 inside a string becomes U+FFFD, and that string is then judged
        // by its field's rules (a reason keeps it, a zone refuses it).
        let text = String::from_utf8_lossy(bytes);
        let map = match serde_json::from_str::<Value>(&text) {
            Ok(value) => match object(&value) {
                Some(map) => map.clone(),
                None => return self.unreadable(&value, "not a JSON object"),
            },
            Err(err) => {
                let excerpt = Value::String(truncate(&text, 80));
                return self.unreadable(&excerpt, format!("not JSON: {err}"));
            }
        };
        let mut record = ControlRecord::default();
        for (key, value) in &map {
            match key.as_str() {
                "version" => match integer_in(value, 0, MAX_MS) {
                    Some(v) => record.version = v,
                    None => self.reject("version", value, "not an integer in [0, 1e14]"),
                },
                "settings" => record.settings = self.settings(value),
                "manual" => record.manual = self.manual(value),
                "probe" => record.probe = self.probe_state("probe", value),
                "probes" => record.probes = self.probes(value),
                other => self.reject(other.to_owned(), value, "unknown field"),
            }
        }
        record
    }

    /// A record that is not JSON: the default settings, and a manual throttle so the
    /// fleet waits for someone to repair or overwrite it (fail closed).
    fn unreadable(&mut self, value: &Value, why: impl Into<String>) -> ControlRecord {
        self.reject("record", value, why);
        ControlRecord {
            manual: Some(ManualThrottle {
                reason: UNREADABLE_THROTTLE.to_owned(),
                since_ms: 0,
                origin: String::new(),
            }),
            ..ControlRecord::default()
        }
    }

    fn settings(&mut self, value: &Value) -> Settings {
        let mut s = Settings::default();
        let Some(map) = object(value) else {
            self.reject("settings", value, "not an object");
            return s;
        };
        for (name, v) in map {
            let key = format!("settings.{name}");
            if v.is_null() {
                continue;
            }
            match valid_setting(name, v) {
                None => {
                    self.reject(key, v, "unknown setting");
                    continue;
                }
                Some(false) => {
                    self.reject(key, v, "out of range");
                    continue;
                }
                Some(true) => {}
            }
            let int = || integer_in(v, 0, u64::MAX);
            let small = || int().and_then(|n| u32::try_from(n).ok());
            match name.as_str() {
                "max_rate" => s.max_rate = v.as_f64(),
                "max_partitions_rate" => s.max_partitions_rate = v.as_f64(),
                "keep_below" => s.keep_below = v.as_f64(),
                "concurrency" => s.concurrency = small(),
                "parallel" => s.parallel = small(),
                "chunk" => s.chunk = int(),
                "chunk_min" => s.chunk_min = int(),
                "chunk_max" => s.chunk_max = int(),
                "chunk_time_ms" => s.chunk_time_ms = int(),
                "active_hours" => s.active_hours = v.as_str().map(str::to_owned),
                "tz" => s.tz = v.as_str().map(str::to_owned),
                _ => unreachable!("valid_setting knows only these names"),
            }
        }
        if let (Some(lo), Some(hi)) = (s.chunk_min, s.chunk_max)
            && lo > hi
        {
            self.reject("settings.chunk_min", &lo.into(), "above chunk_max");
            self.reject("settings.chunk_max", &hi.into(), "below chunk_min");
            (s.chunk_min, s.chunk_max) = (None, None);
        }
        if let (Some(spec), Some(tz)) = (&s.active_hours, &s.tz)
            && let Err(err) = crate::ActiveHours::parse(spec, Some(tz))
        {
            self.reject("settings.tz", &Value::String(tz.clone()), err.to_string());
            s.tz = None;
        }
        s
    }

    fn manual(&mut self, value: &Value) -> Option<ManualThrottle> {
        if value.is_null() {
            return None;
        }
        let Some(m) = object(value) else {
            self.reject("manual", value, "not an object (the throttle holds)");
            return Some(ManualThrottle {
                reason: UNREADABLE_THROTTLE.to_owned(),
                ..ManualThrottle::default()
            });
        };
        Some(ManualThrottle {
            reason: self
                .text(m, "manual", "reason", MAX_REASON_BYTES)
                .unwrap_or_default(),
            since_ms: self.ms(m, "manual", "since_ms"),
            origin: self.text(m, "manual", "origin", 512).unwrap_or_default(),
        })
    }

    fn probes(&mut self, value: &Value) -> BTreeMap<String, ProbeState> {
        let mut out = BTreeMap::new();
        if value.is_null() {
            return out;
        }
        let Some(map) = object(value) else {
            self.reject("probes", value, "not an object (read as one stale finding)");
            out.insert("?".to_owned(), unreadable_finding("?"));
            return out;
        };
        for (worker, v) in map {
            let key = format!("probes.{}", truncate(worker, 64));
            if worker.is_empty() || worker.len() > MAX_WORKER_BYTES {
                self.reject(key, v, "a worker id of 1 to 256 bytes");
                continue;
            }
            if out.len() == MAX_PROBERS {
                self.reject(key, v, format!("over {MAX_PROBERS} probers"));
                continue;
            }
            if let Some(mut state) = self.probe_state(&key, v) {
                state.worker = worker.clone();
                out.insert(worker.clone(), state);
            }
        }
        out
    }

    /// A probe finding; an unreadable one is an expired throttle (see [`decode`]).
    fn probe_state(&mut self, key: &str, value: &Value) -> Option<ProbeState> {
        if value.is_null() {
            return None;
        }
        let Some(m) = object(value) else {
            self.reject(
                key.to_owned(),
                value,
                "not an object (read as a stale finding)",
            );
            return Some(unreadable_finding(""));
        };
        let throttled = match m.get("throttled") {
            None | Some(Value::Null) => None,
            Some(v @ (Value::Object(_) | Value::Array(_))) if object(v).is_some() => {
                let t = object(v).expect("an object");
                let at = format!("{key}.throttled");
                Some(Throttled {
                    reason: self
                        .text(t, &at, "reason", MAX_REASON_BYTES)
                        .unwrap_or_default(),
                    since_ms: self.ms(t, &at, "since_ms"),
                })
            }
            Some(other) => {
                self.reject(format!("{key}.throttled"), other, "not an object");
                Some(Throttled {
                    reason: UNREADABLE_THROTTLE.to_owned(),
                    since_ms: 0,
                })
            }
        };
        let number = |d: &mut Self, name: &str, ok: fn(f64) -> bool| match m.get(name) {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_f64().filter(|f| ok(*f)) {
                Some(f) => Some(f),
                None => {
                    d.reject(format!("{key}.{name}"), v, "out of range");
                    None
                }
            },
        };
        let value = number(self, "value", f64::is_finite);
        let rate = number(self, "rate", Rate::allowed);
        let error = self.text(m, key, "error", MAX_REASON_BYTES);
        let at_ms = self.ms(m, key, "at_ms");
        let expires_ms = self.ms(m, key, "expires_ms");
        let worker = self
            .text(m, key, "worker", MAX_WORKER_BYTES)
            .unwrap_or_default();
        for name in m.keys() {
            let known = [
                "throttled",
                "value",
                "error",
                "rate",
                "at_ms",
                "expires_ms",
                "worker",
            ];
            if !known.contains(&name.as_str()) {
                self.reject(format!("{key}.{name}"), &m[name], "unknown field");
            }
        }
        Some(ProbeState {
            throttled,
            value,
            error,
            rate,
            at_ms,
            expires_ms,
            worker,
        })
    }

    /// A string field, truncated (and reported) when over `max` bytes.
    fn text(&mut self, m: &Map<String, Value>, at: &str, name: &str, max: usize) -> Option<String> {
        match m.get(name) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s.len() <= max => Some(s.clone()),
            Some(Value::String(s)) => {
                self.reject(
                    format!("{at}.{name}"),
                    &Value::String(s.clone()),
                    "too long (truncated)",
                );
                Some(truncate(s, max))
            }
            Some(other) => {
                self.reject(format!("{at}.{name}"), other, "not a string");
                Some("(unreadable)".to_owned())
            }
        }
    }

    /// A time stamp in ms; 0 (long ago) when missing or bad.
    fn ms(&mut self, m: &Map<String, Value>, at: &str, name: &str) -> u64 {
        match m.get(name) {
            None | Some(Value::Null) => 0,
            Some(v) => integer_in(v, 0, MAX_MS).unwrap_or_else(|| {
                self.reject(format!("{at}.{name}"), v, "not a time stamp in [0, 1e14]");
                0
            }),
        }
    }
}

fn unreadable_finding(worker: &str) -> ProbeState {
    ProbeState {
        throttled: Some(Throttled {
            reason: UNREADABLE_THROTTLE.to_owned(),
            since_ms: 0,
        }),
        worker: worker.to_owned(),
        ..ProbeState::default()
    }
}
