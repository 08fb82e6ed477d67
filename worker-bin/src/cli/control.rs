//! Production control on the command line: `run`'s rate-limit, probe and active-hours
//! options, `tranche set`, `tranche throttle on|off`, `tranche control log`, and the
//! record `status` shows. How it all prints is `cli/render/control.rs`; the run loop's
//! side is `crate::control`.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;
use tranche_control::{ActiveHours, Change, ControlRecord, ExecProbe, HttpProbe, Probe, Rate};

use crate::backend::{Backend, Open, Tuning};
use crate::cli::args::{ControlCommand, RunControlArgs, SetArgs, ThrottleCommand};
use crate::cli::common::Outcome;
use crate::cli::common::{Global, parse_duration};
use crate::cli::render;
use crate::control::policy::time;
use crate::control::{self, Options};

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
            render::status_lines(&record, crate::duration::now_ms()).trim_end()
        ),
        render::record_json(&record, crate::duration::now_ms()),
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
        render::record_json(&record, crate::duration::now_ms()),
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
                println!(
                    "{}",
                    Value::Array(entries.iter().map(render::entry_json).collect())
                );
            } else {
                print!("{}", render::log_text(&entries));
            }
        }
        ControlCommand::Show => {
            let record = store.read().await?;
            if g.json {
                println!(
                    "{}",
                    render::record_json(&record, crate::duration::now_ms())
                );
            } else {
                print!(
                    "{}",
                    render::status_lines(&record, crate::duration::now_ms())
                );
            }
        }
    }
    Ok(Outcome::Success)
}

/// The namespace's control record for `status`, once anything was ever set (`None`
/// embedded: a running worker's record lives in its process).
pub(crate) async fn record_of(backend: &Backend) -> Result<Option<ControlRecord>> {
    Ok(control::record_of(backend).await?)
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
