//! The control record and log as the commands print them: `control log`, the control
//! lines and JSON of `status` and `serve`, and the control families of `/metrics`.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{Value, json};
use tranche_control::{ControlRecord, LogEntry, ProbeStale, Rate};

use crate::control::policy::time;

/// One control-log entry as `tranche control log --json` prints it.
pub(crate) fn entry_json(e: &LogEntry) -> Value {
    json!({"id": e.id, "at_ms": e.at_ms, "at": time(e.at_ms), "origin": e.origin,
        "change": serde_json::from_str::<Value>(&e.change).unwrap_or_else(|_| json!(e.change)),
        "version": e.version})
}

/// The control log as `tranche control log` prints it, oldest first.
pub(crate) fn log_text(entries: &[LogEntry]) -> String {
    let mut out = String::new();
    if entries.is_empty() {
        out.push_str("no control changes yet\n");
    }
    for e in entries {
        let _ = writeln!(
            out,
            "{}  v{:<4} {:<24} {}",
            time(e.at_ms),
            e.version,
            e.origin,
            e.change
        );
    }
    out
}

/// The throttle a run loop would see now: the manual one, any live prober's, or a
/// finding nobody renewed (the workers' default, `--probe-stale throttle`).
fn throttled_now(r: &ControlRecord, now_ms: u64) -> Option<tranche_control::Throttled> {
    r.throttle_in_force(now_ms, ProbeStale::Throttle)
}

/// The values of the record a reader ignores, as `status --json`, `serve` and `check`
/// show them.
pub(crate) fn rejected_json(r: &ControlRecord) -> Value {
    Value::Array(
        r.rejected
            .iter()
            .map(|x| json!({"key": x.key, "value": x.value, "why": x.why}))
            .collect(),
    )
}

/// The record as `status --json`, `serve` and `set --json` show it: the settings in
/// force (unset ones are the workers' own), the throttle, the probe's last finding.
pub(crate) fn record_json(r: &ControlRecord, now_ms: u64) -> Value {
    let throttled = throttled_now(r, now_ms);
    let outside = crate::control::closed_reason(
        &ControlRecord {
            manual: None,
            probe: None,
            probes: Default::default(),
            ..r.clone()
        },
        None,
        now_ms,
        ProbeStale::Go,
    );
    json!({
        "version": r.version,
        "settings": r.settings,
        "ids_rate": crate::control::ids_rate_as_of(r, None, now_ms, Duration::from_secs(30)).map(Rate::get),
        "throttled": throttled.as_ref().map(|t| json!({
            "since_ms": t.since_ms, "since": time(t.since_ms), "reason": t.reason,
        })),
        "outside_active_hours": outside,
        "manual": r.manual,
        "probe": r.probe,
        "probes": r.probes,
        "rejected": rejected_json(r),
    })
}

/// The record as lines of `status` (nothing when nothing is set).
pub(crate) fn status_lines(r: &ControlRecord, now_ms: u64) -> String {
    let mut out = String::new();
    if let Some(t) = throttled_now(r, now_ms) {
        let _ = writeln!(
            out,
            "control    throttled since {}: {}",
            time(t.since_ms),
            t.reason
        );
    }
    if let Some(why) = crate::control::closed_reason(
        &ControlRecord {
            manual: None,
            probe: None,
            probes: Default::default(),
            ..r.clone()
        },
        None,
        now_ms,
        ProbeStale::Go,
    ) {
        let _ = writeln!(out, "control    {why}");
    }
    for x in &r.rejected {
        let _ = writeln!(
            out,
            "control    ignored (invalid): {x} (tranche check --repair)"
        );
    }
    let s = &r.settings;
    let mut set = Vec::new();
    if let Some(rate) = crate::control::ids_rate_as_of(r, None, now_ms, Duration::from_secs(30)) {
        set.push(format!("max-rate {:.0}/s", rate.get()));
    }
    if let Some(v) = s.max_partitions_rate {
        set.push(format!("max-partitions-rate {v}/s"));
    }
    if let Some(v) = s.concurrency {
        set.push(format!("concurrency {v}"));
    }
    if let Some(v) = s.chunk {
        set.push(format!("chunk {v}"));
    }
    if let Some(v) = s.parallel {
        set.push(format!("parallel {v}"));
    }
    if let Some(v) = s.chunk_time_ms {
        set.push(format!("chunk-time {v}ms"));
    }
    if let Some(v) = s.keep_below {
        set.push(format!("keep-below {v}"));
    }
    if let Some(v) = &s.active_hours {
        set.push(format!(
            "active-hours {v}{}",
            s.tz.as_deref()
                .map(|z| format!(" ({z})"))
                .unwrap_or_default()
        ));
    }
    if !set.is_empty() {
        let _ = writeln!(out, "control    {} (v{})", set.join(", "), r.version);
    }
    if let Some(p) = &r.probe {
        let _ = writeln!(
            out,
            "probe      by {} at {}{}{}",
            p.worker,
            time(p.at_ms),
            p.value.map(|v| format!(", value {v}")).unwrap_or_default(),
            p.error
                .as_deref()
                .map(|e| format!(", error: {e}"))
                .unwrap_or_default()
        );
    }
    out
}

/// The control record's families for `/metrics`: whether the namespace is throttled
/// (and since when, and why, as a label), and the settings in force.
pub(crate) fn register_metrics(
    registry: &mut prometheus_client::registry::Registry,
    r: &ControlRecord,
    now_ms: u64,
) {
    use prometheus_client::metrics::family::Family;
    use prometheus_client::metrics::gauge::Gauge;
    use std::sync::atomic::AtomicU64;
    type FloatGauge = Gauge<f64, AtomicU64>;
    let float =
        |registry: &mut prometheus_client::registry::Registry, name: &str, help: &str, v: f64| {
            let g = FloatGauge::default();
            g.set(v);
            registry.register(name, help, g);
        };
    let throttled = throttled_now(r, now_ms);
    let family: Family<Vec<(String, String)>, Gauge> = Family::default();
    family
        .get_or_create(&vec![(
            "reason".to_owned(),
            throttled
                .as_ref()
                .map(|t| t.reason.clone())
                .unwrap_or_default(),
        )])
        .set(i64::from(throttled.is_some()));
    registry.register(
        "throttled",
        "1 while a throttle is in force (no new chunk starts), its reason as a label",
        family,
    );
    if let Some(t) = &throttled {
        float(
            registry,
            "throttled_since_seconds",
            "When the throttle in force started, seconds since the epoch",
            t.since_ms as f64 / 1000.0,
        );
    }
    float(
        registry,
        "control_version",
        "The control record's version (bumped by every change)",
        r.version as f64,
    );
    if let Some(rate) = crate::control::ids_rate_as_of(r, None, now_ms, Duration::from_secs(30)) {
        float(
            registry,
            "control_max_rate_ids_per_second",
            "The fleet-wide ID rate limit in force (the AIMD rate under --keep-below)",
            rate.get(),
        );
    }
    let s = &r.settings;
    for (name, help, v) in [
        (
            "control_max_partitions_rate",
            "The fleet-wide partition rate limit set, per second",
            s.max_partitions_rate,
        ),
        (
            "control_concurrency",
            "The concurrency set for every worker",
            s.concurrency.map(f64::from),
        ),
        (
            "control_parallel",
            "The parallel chunks per partition set for every worker",
            s.parallel.map(f64::from),
        ),
        (
            "control_chunk",
            "The chunk size set for every worker",
            s.chunk.map(|c| c as f64),
        ),
        (
            "control_keep_below",
            "The probe metric the fleet's rate is adjusted to stay below",
            s.keep_below,
        ),
        (
            "probe_value",
            "The number the throttle probe printed last",
            r.probe.as_ref().and_then(|p| p.value),
        ),
    ] {
        if let Some(v) = v {
            float(registry, name, help, v);
        }
    }
}
