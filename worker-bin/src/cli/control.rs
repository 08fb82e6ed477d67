//! Production control on the command line: `run`'s rate-limit, probe and active-hours
//! options, `tranche set`, `tranche throttle on|off`, `tranche control log`, and the
//! control lines of `status`. The run loop's side is `crate::control`.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use serde_json::{Value, json};
use tranche_control::{
    ActiveHours, Change, ControlRecord, ExecProbe, HttpProbe, LogEntry, Probe, ProbeStale,
    ProberConfig, Rate,
};

use crate::backend::{Backend, Open, Tuning};
use crate::cli::common::Outcome;
use crate::cli::common::{Global, parse_duration};
use crate::control::{self, Options, time};

/// `run`'s production-control options.
#[derive(Debug, Clone, Args)]
pub(crate) struct RunControlArgs {
    /// Fleet-wide limit of row IDs per second (N, N/s, N/m or N/h), shared by every
    /// worker of the namespace (through Redis, or in this process embedded).
    #[arg(long, value_name = "RATE", value_parser = parse_rate)]
    pub(crate) max_rate: Option<Rate>,
    /// Fleet-wide limit of partitions claimed per second (N, N/s, N/m or N/h).
    #[arg(long, value_name = "RATE", value_parser = parse_rate)]
    pub(crate) max_partitions_rate: Option<Rate>,
    /// Throttle probe: a shell command run every --throttle-interval by one worker of
    /// the namespace. Exit 0 is go (a number on its first stdout line is the metric of
    /// --keep-below), exit 1 throttles with the first stdout line as the reason, any
    /// other exit throttles and is reported.
    #[arg(
        long,
        value_name = "CMD",
        conflicts_with = "throttle_http",
        group = "keep_below_metric"
    )]
    pub(crate) throttle_exec: Option<String>,
    /// Throttle probe: an http:// or https:// URL; 2xx is go, 429 or 503 throttles,
    /// anything else (or no answer) throttles and is reported.
    #[arg(long, value_name = "URL")]
    pub(crate) throttle_http: Option<String>,
    /// A PEM file of the CA that signs --throttle-http's certificate (default: the
    /// system's roots).
    #[arg(long, value_name = "FILE", requires = "throttle_http")]
    pub(crate) throttle_ca: Option<std::path::PathBuf>,
    /// How often the probe runs (100ms to 20m).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_interval)]
    pub(crate) throttle_interval: Duration,
    /// What a probe finding nobody renews (its prober died or stalled) means: throttle
    /// the fleet until a prober reports again, or go as if no probe were set.
    #[arg(long, value_name = "throttle|go", default_value = "throttle", value_parser = parse_probe_stale)]
    pub(crate) probe_stale: ProbeStale,
    /// Throttle probe: a query on --database-url (its own connection). A true or a
    /// non-empty text in the first column throttles with that text as the reason;
    /// no row, NULL, false or empty is go; an error or no answer throttles.
    #[arg(long, value_name = "QUERY", requires = "database_url", conflicts_with_all = ["throttle_exec", "throttle_http"])]
    pub(crate) throttle_sql: Option<String>,
    /// PostgreSQL's throttle indicators on --database-url, comma-separated: lag=5s
    /// (replication lag), autovacuum (on table=NAME), wal=64MB/s (WAL rate), xact=10m
    /// (the oldest open transaction). Each throttles with its reading as the reason.
    #[arg(long, value_name = "LIST", requires = "database_url", conflicts_with_all = ["throttle_exec", "throttle_http"])]
    pub(crate) throttle_pg: Option<String>,
    /// The metric of --keep-below as a query on --database-url: a number in the first
    /// column (e.g. replica lag in seconds); no row, NULL or an error throttles.
    #[arg(long, value_name = "QUERY", requires_all = ["database_url", "keep_below"], conflicts_with = "throttle_http", group = "keep_below_metric")]
    pub(crate) keep_below_sql: Option<String>,
    /// Adjust the fleet's ID rate (additive increase, multiplicative decrease, at most
    /// --max-rate) so that the number --throttle-exec prints (or --keep-below-sql
    /// answers) stays below N.
    #[arg(long, value_name = "N", requires = "keep_below_metric")]
    pub(crate) keep_below: Option<f64>,
    /// Claim and start work only within HH:MM-HH:MM (wrapping midnight, e.g.
    /// 22:00-06:00); outside it the worker waits and says until when.
    #[arg(long, value_name = "HH:MM-HH:MM")]
    pub(crate) active_hours: Option<String>,
    /// The time zone of --active-hours (an IANA name such as Europe/Paris; default the
    /// system's).
    #[arg(long, value_name = "ZONE", requires = "active_hours")]
    pub(crate) tz: Option<String>,
    /// Size each partition's chunks so each takes about this long (from --chunk, between
    /// --chunk-min and --chunk-max), keeping the window's checkpoint exact.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) chunk_time: Option<Duration>,
    /// The smallest chunk --chunk-time makes.
    #[arg(long, value_name = "N", default_value_t = 1, requires = "chunk_time", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) chunk_min: u64,
    /// The largest chunk --chunk-time makes.
    #[arg(long, value_name = "N", default_value_t = 1_000_000, requires = "chunk_time", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) chunk_max: u64,
}

fn parse_rate(s: &str) -> Result<Rate, String> {
    s.parse::<Rate>().map_err(|e| e.to_string())
}

/// A probe interval, bounded as [`ProberConfig::check`] bounds it.
fn parse_interval(s: &str) -> Result<Duration, String> {
    let interval = parse_duration(s).map_err(|e| e.to_string())?;
    ProberConfig {
        worker: "-".to_owned(),
        interval,
        max_rate: None,
        floor: 1.0,
    }
    .check()
    .map_err(|e| e.to_string())?;
    Ok(interval)
}

fn parse_probe_stale(s: &str) -> Result<ProbeStale, String> {
    s.parse::<ProbeStale>().map_err(|e| e.to_string())
}

/// The environment a probe command runs with: the chunks' (the worker's without the
/// variables that carry a secret).
fn probe_env() -> Vec<(String, String)> {
    crate::job::scrubbed_env()
}

/// The run loop's control options from `run`'s flags; bad combinations are refused
/// before anything runs.
pub(crate) fn options(a: &RunControlArgs, database_url: Option<&str>) -> Result<Options> {
    if a.keep_below.is_some() && a.max_rate.is_none() {
        bail!("--keep-below needs a --max-rate as the ceiling of the rate it adjusts");
    }
    if a.keep_below.is_some_and(|v| !v.is_finite()) {
        bail!("--keep-below must be a finite number");
    }
    if a.chunk_time.is_some_and(|t| t < Duration::from_millis(1)) {
        bail!("--chunk-time must be at least 1ms");
    }
    let timeout = (a.throttle_interval * 2).max(Duration::from_secs(1));
    let probe: Option<Arc<dyn Probe>> = match (&a.throttle_exec, &a.throttle_http) {
        (Some(cmd), _) => Some(Arc::new(
            ExecProbe::new(cmd.clone(), timeout).with_env(probe_env()),
        )),
        (None, Some(url)) => Some(Arc::new(match &a.throttle_ca {
            Some(path) => {
                let pem = std::fs::read(path)
                    .with_context(|| format!("--throttle-ca {}", path.display()))?;
                HttpProbe::with_ca(url, timeout, &pem).context("--throttle-http")?
            }
            None => HttpProbe::new(url, timeout).context("--throttle-http")?,
        })),
        (None, None) => crate::cli::sql_probe::probe(a, database_url, timeout)?,
    };
    let active_hours = a
        .active_hours
        .as_deref()
        .map(|spec| ActiveHours::parse(spec, a.tz.as_deref()))
        .transpose()
        .context("--active-hours")?;
    Ok(Options {
        max_rate: a.max_rate,
        max_partitions_rate: a.max_partitions_rate,
        probe,
        throttle_interval: a.throttle_interval,
        probe_stale: a.probe_stale,
        keep_below: a.keep_below,
        active_hours,
        chunk_time: a.chunk_time.map(|target| control::ChunkTime {
            target,
            min: a.chunk_min,
            max: a.chunk_max.max(a.chunk_min),
        }),
        handle: None,
    })
}

/// `set`: the namespace's live settings, applied by every worker within 2 s. Each
/// option takes `none` to clear it (the workers' own options are in force again).
#[derive(Debug, Args)]
pub(crate) struct SetArgs {
    /// Row IDs per second, fleet-wide (N, N/s, N/m, N/h, or none).
    #[arg(long, value_name = "RATE")]
    max_rate: Option<String>,
    /// Partitions claimed per second, fleet-wide (or none).
    #[arg(long, value_name = "RATE")]
    max_partitions_rate: Option<String>,
    /// Partitions each worker runs at once (or none).
    #[arg(long, value_name = "N")]
    concurrency: Option<String>,
    /// Row IDs per chunk, for partitions started from now on (or none).
    #[arg(long, value_name = "N")]
    chunk: Option<String>,
    /// Chunks of one partition in flight, applied in flight up to each partition's
    /// window (or none).
    #[arg(long, value_name = "N")]
    parallel: Option<String>,
    /// Size chunks to take this long (a duration, or none).
    #[arg(long, value_name = "DURATION")]
    chunk_time: Option<String>,
    /// The smallest chunk of --chunk-time (or none).
    #[arg(long, value_name = "N")]
    chunk_min: Option<String>,
    /// The largest chunk of --chunk-time (or none).
    #[arg(long, value_name = "N")]
    chunk_max: Option<String>,
    /// The probe metric the fleet's rate is adjusted to stay below (or none).
    #[arg(long, value_name = "N")]
    keep_below: Option<String>,
    /// HH:MM-HH:MM outside which nothing is claimed or started (or none).
    #[arg(long, value_name = "HH:MM-HH:MM")]
    active_hours: Option<String>,
    /// The time zone of --active-hours.
    #[arg(long, value_name = "ZONE", requires = "active_hours")]
    tz: Option<String>,
}

/// `throttle`.
#[derive(Debug, Subcommand)]
pub(crate) enum ThrottleCommand {
    /// Start no new chunk on any worker of the namespace until `throttle off`
    /// (chunks in flight finish; leases are kept).
    On {
        /// Why, shown by `status` as "throttled since T: REASON".
        #[arg(long, default_value = "manual throttle")]
        reason: String,
    },
    /// Lift the manual throttle.
    Off,
}

/// `control`.
#[derive(Debug, Subcommand)]
pub(crate) enum ControlCommand {
    /// The last changes of the namespace's control record (time, origin, change).
    Log {
        /// At most this many (the log keeps the last 100).
        #[arg(long, value_name = "N", default_value_t = 100)]
        limit: usize,
    },
    /// The control record in force: settings, throttles, the probe's last finding.
    Show,
}

/// `Some(None)` for `none`, `Some(Some(v))` for a value.
fn setting<T>(
    name: &str,
    value: Option<&str>,
    parse: impl Fn(&str) -> Option<T>,
) -> Result<Option<Option<T>>> {
    match value {
        None => Ok(None),
        Some("none") => Ok(Some(None)),
        Some(v) => match parse(v) {
            Some(t) => Ok(Some(Some(t))),
            None => bail!("--{name}: `{v}` is not valid (give a value or `none`)"),
        },
    }
}

fn changes(a: &SetArgs) -> Result<Vec<Change>> {
    let rate = |s: &str| s.parse::<Rate>().ok();
    let count = |s: &str| s.parse::<u32>().ok().filter(|n| (1..=65536).contains(n));
    let mut out = Vec::new();
    if let Some(v) = setting("max-rate", a.max_rate.as_deref(), rate)? {
        out.push(Change::MaxRate(v));
    }
    if let Some(v) = setting(
        "max-partitions-rate",
        a.max_partitions_rate.as_deref(),
        rate,
    )? {
        out.push(Change::MaxPartitionsRate(v));
    }
    if let Some(v) = setting("concurrency", a.concurrency.as_deref(), count)? {
        out.push(Change::Concurrency(v));
    }
    if let Some(v) = setting("chunk", a.chunk.as_deref(), |s| {
        s.parse::<u64>().ok().filter(|n| *n >= 1)
    })? {
        out.push(Change::Chunk(v));
    }
    if let Some(v) = setting("parallel", a.parallel.as_deref(), count)? {
        out.push(Change::Parallel(v));
    }
    if let Some(v) = setting("chunk-time", a.chunk_time.as_deref(), |s| {
        parse_duration(s)
            .ok()
            .map(|d| d.as_millis() as u64)
            .filter(|ms| *ms >= 1)
    })? {
        out.push(Change::ChunkTimeMs(v));
    }
    let ids = |s: &str| s.parse::<u64>().ok().filter(|n| *n >= 1);
    if let Some(v) = setting("chunk-min", a.chunk_min.as_deref(), ids)? {
        out.push(Change::ChunkMin(v));
    }
    if let Some(v) = setting("chunk-max", a.chunk_max.as_deref(), ids)? {
        out.push(Change::ChunkMax(v));
    }
    if let Some(v) = setting("keep-below", a.keep_below.as_deref(), |s| {
        s.parse::<f64>().ok().filter(|v| v.is_finite())
    })? {
        out.push(Change::KeepBelow(v));
    }
    match a.active_hours.as_deref() {
        None => {}
        Some("none") => out.push(Change::ActiveHours(None)),
        Some(spec) => out.push(Change::ActiveHours(Some(
            ActiveHours::parse(spec, a.tz.as_deref()).context("--active-hours")?,
        ))),
    }
    if out.is_empty() {
        bail!(
            "nothing to set: give at least one of --max-rate, --max-partitions-rate, --concurrency, --chunk, --parallel, --keep-below, --active-hours"
        );
    }
    Ok(out)
}

async fn open_redis(g: &Global, what: &str) -> Result<Backend> {
    let backend = Backend::open(&g.location(), Open::Existing, Tuning::default()).await?;
    if backend.is_embedded() {
        bail!(
            "{what} needs --redis: an embedded namespace has one process at a time (give `run` the option instead)"
        );
    }
    Ok(backend)
}

/// `set`.
pub(crate) async fn set(g: &Global, a: &SetArgs) -> Result<Outcome> {
    let changes = changes(a)?;
    let backend = open_redis(g, "set").await?;
    let (store, _) = control::stores(&backend);
    let record = store.set(&changes, &control::origin()).await?;
    crate::cli::common::say(
        g.json,
        format_args!(
            "namespace `{}`: settings in force from the next poll (within 2 s), version {}\n{}",
            backend.namespace,
            record.version,
            status_lines(&record, crate::duration::now_ms()).trim_end()
        ),
        record_json(&record, crate::duration::now_ms()),
    );
    Ok(Outcome::Success)
}

/// `throttle on|off`.
pub(crate) async fn throttle(g: &Global, c: &ThrottleCommand) -> Result<Outcome> {
    let backend = open_redis(g, "throttle").await?;
    let (store, _) = control::stores(&backend);
    let (on, reason) = match c {
        ThrottleCommand::On { reason } => (true, reason.as_str()),
        ThrottleCommand::Off => (false, ""),
    };
    let record = store.throttle(on, reason, &control::origin()).await?;
    let text = match record.throttled() {
        Some(t) if on => format!(
            "namespace `{}` throttled since {}: {} (no new chunk starts within 2 s)",
            backend.namespace,
            time(t.since_ms),
            t.reason
        ),
        Some(t) => format!(
            "manual throttle of `{}` off; still throttled by the probe: {}",
            backend.namespace, t.reason
        ),
        None => format!(
            "namespace `{}` not throttled: work resumes within 2 s",
            backend.namespace
        ),
    };
    crate::cli::common::say(
        g.json,
        format_args!("{text}"),
        record_json(&record, crate::duration::now_ms()),
    );
    Ok(Outcome::Success)
}

/// `control log|show`.
pub(crate) async fn control(g: &Global, c: &ControlCommand) -> Result<Outcome> {
    let backend = open_redis(g, "control").await?;
    let (store, _) = control::stores(&backend);
    match c {
        ControlCommand::Log { limit } => {
            let entries = store.log(*limit).await?;
            if g.json {
                println!("{}", Value::Array(entries.iter().map(entry_json).collect()));
            } else {
                print!("{}", log_text(&entries));
            }
        }
        ControlCommand::Show => {
            let record = store.read().await?;
            if g.json {
                println!("{}", record_json(&record, crate::duration::now_ms()));
            } else {
                print!("{}", status_lines(&record, crate::duration::now_ms()));
            }
        }
    }
    Ok(Outcome::Success)
}

fn entry_json(e: &LogEntry) -> Value {
    json!({"id": e.id, "at_ms": e.at_ms, "at": time(e.at_ms), "origin": e.origin,
        "change": serde_json::from_str::<Value>(&e.change).unwrap_or_else(|_| json!(e.change)),
        "version": e.version})
}

fn log_text(entries: &[LogEntry]) -> String {
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

/// The namespace's control record for `status`, once anything was ever set (`None`
/// embedded: a running worker's record lives in its process).
pub(crate) async fn record_of(backend: &Backend) -> Result<Option<ControlRecord>> {
    if backend.is_embedded() {
        return Ok(None);
    }
    let (store, _) = control::stores(backend);
    let record = store.read().await?;
    Ok((record != ControlRecord::default()).then_some(record))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn none_clears_and_bad_values_are_refused() {
        let parse = |s: &str| s.parse::<u32>().ok();
        assert_eq!(setting("x", None, parse).unwrap(), None);
        assert_eq!(setting("x", Some("none"), parse).unwrap(), Some(None));
        assert_eq!(setting("x", Some("8"), parse).unwrap(), Some(Some(8)));
        assert!(setting("x", Some("eight"), parse).is_err());
    }
}
