//! What every command shares, below all of them: the global options ([`Global`]),
//! how a command ends ([`Outcome`]) and says so ([`say`], [`one_line`]), the signal
//! handling ([`signals`]) and the duration parser of their options.

use std::path::PathBuf;

use crate::backend::{Backend, Open, Tuning};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

use crate::work::Stop;

pub(crate) use crate::duration::parse as parse_duration;

/// Options every subcommand takes.
#[derive(Debug, Clone, Args)]
pub(crate) struct Global {
    /// Redis to coordinate through (redis://, rediss://, passwords in the URL; a cluster
    /// is detected). Without it everything runs embedded in this process.
    #[arg(
        long,
        global = true,
        env = "TRANCHE_REDIS_URL",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub(crate) redis: Option<String>,
    /// Read the Redis URL from this file's first line instead (keeps a password out of
    /// `ps` and of the environment).
    #[arg(
        long,
        global = true,
        env = "TRANCHE_REDIS_FILE",
        value_name = "FILE",
        conflicts_with = "redis"
    )]
    pub(crate) redis_file: Option<PathBuf>,
    /// PEM file of CA certificates to verify a rediss:// server against, instead of the
    /// system's roots.
    #[arg(long, global = true, env = "TRANCHE_TLS_CA", value_name = "FILE")]
    pub(crate) tls_ca: Option<PathBuf>,
    /// PEM client certificate for servers that authenticate clients (with --tls-key).
    #[arg(
        long,
        global = true,
        env = "TRANCHE_TLS_CERT",
        value_name = "FILE",
        requires = "tls_key"
    )]
    pub(crate) tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(
        long,
        global = true,
        env = "TRANCHE_TLS_KEY",
        value_name = "FILE",
        requires = "tls_cert"
    )]
    pub(crate) tls_key: Option<PathBuf>,
    /// Namespace of the job; every key (or the state file's content) lives under it.
    #[arg(
        long,
        global = true,
        env = "TRANCHE_NAMESPACE",
        default_value = "tranche"
    )]
    pub(crate) namespace: String,
    /// Shards of a new namespace (1..=1024). An existing namespace keeps its own; a
    /// different value is refused.
    #[arg(long, global = true, value_name = "N")]
    pub(crate) shards: Option<u32>,
    /// State file of the embedded mode (ignored with --redis).
    #[arg(long, global = true, env = "TRANCHE_STATE", value_name = "FILE")]
    pub(crate) state: Option<PathBuf>,
    /// Print JSON instead of text: one object per command (one line per refresh with
    /// `status --watch`), and failures as {"error": {"kind", "message"}} on stderr.
    #[arg(long, global = true)]
    pub(crate) json: bool,
    /// How log lines on stderr are written: `text` for people, `json` (one object a
    /// line, with the span's trace and span ids when traces are exported) for a log
    /// shipper. `RUST_LOG` filters both.
    #[arg(
        long,
        global = true,
        env = "TRANCHE_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub(crate) log_format: crate::cli::telemetry::LogFormat,
    /// Export this process's spans (the run, each partition's lease) to an OpenTelemetry
    /// collector over OTLP/HTTP, e.g. http://localhost:4318 (`/v1/traces` is appended).
    /// Spans are batched off the run's path; when the collector is slow or down they
    /// are dropped and counted, never waited for. `OTEL_SERVICE_NAME` names the service
    /// (default `tranche`).
    #[arg(
        long,
        global = true,
        env = "OTEL_EXPORTER_OTLP_ENDPOINT",
        value_name = "URL"
    )]
    pub(crate) otlp_endpoint: Option<String>,
    /// Export the traces of only this fraction of partitions (0 to 1), chosen by each
    /// partition's trace id: every worker keeps the same ones, every attempt of one is
    /// kept or dropped with the others, and the rest build no span. Overrides
    /// OTEL_TRACES_SAMPLER (always_on, always_off, traceidratio,
    /// parentbased_traceidratio) and OTEL_TRACES_SAMPLER_ARG (the ratio). Default: all.
    #[arg(
        long,
        global = true,
        value_name = "RATIO",
        value_parser = crate::cli::telemetry::ratio
    )]
    pub(crate) trace_sample: Option<f64>,
    /// Keep the start-up warnings about the Redis (eviction, no persistence) that
    /// `run`, `plan` and `serve` print out of the terminal: they go to the debug log.
    #[arg(
        long,
        global = true,
        env = "TRANCHE_QUIET",
        hide_env_values = true,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub(crate) quiet: bool,
    /// Threads this process works on (1..=1024). `run` defaults to 1: its partitions'
    /// work happens in child processes (or is simulated) and its own is waiting on
    /// Redis, where a second thread only adds a cross-thread wake-up to each reply.
    /// Other commands default to one per core.
    #[arg(
        long,
        global = true,
        env = "TRANCHE_THREADS",
        value_name = "N",
        value_parser = clap::value_parser!(u16).range(1..=1024)
    )]
    pub(crate) threads: Option<u16>,
}

impl Global {
    /// Where the namespace these options name lives, as the backend takes it.
    pub(crate) fn location(&self) -> crate::layers::Location {
        crate::layers::Location {
            namespace: self.namespace.clone(),
            shards: self.shards,
            redis: self.redis.clone(),
            redis_file: self.redis_file.clone(),
            tls_ca: self.tls_ca.clone(),
            tls_cert: self.tls_cert.clone(),
            tls_key: self.tls_key.clone(),
            state: self.state.clone(),
        }
    }
}

/// How a command ended, when it did not fail outright.
#[derive(Debug)]
pub(crate) enum Outcome {
    Success,
    /// It ran, and what it found is a failure (failed partitions, a firing alert).
    Failed(String),
    /// A signal stopped it; state was checkpointed.
    Interrupted,
}

/// Prints a command's outcome: `text` for a person, or with `--json` the one object
/// `value` (a script reads JSON on both streams: errors are JSON too).
pub(crate) fn say(json: bool, text: impl std::fmt::Display, value: serde_json::Value) {
    if json {
        println!("{value}");
    } else {
        println!("{text}");
    }
}

/// SIGINT/SIGTERM: the first asks to drain (and, after `grace`, to abort: in-flight
/// chunks' process groups are stopped and their partitions released); a second aborts
/// at once, through the same path, so leases are released and locks dropped before
/// the exit; one more exits on the spot.
pub(crate) fn signals(grace: Duration) -> Result<watch::Receiver<Stop>> {
    let (tx, rx) = watch::channel(Stop::Running);
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    tokio::spawn(async move {
        let mut next = async || {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        };
        next().await;
        tracing::warn!(
            grace = ?grace,
            "stopping: no new claims; in-flight chunks may finish, then partitions are checkpointed and released (signal again to stop them now)"
        );
        let _ = tx.send(Stop::Draining);
        tokio::select! {
            () = next() => {
                tracing::warn!("second signal: stopping in-flight chunks now (a third exits at once)");
            }
            () = tokio::time::sleep(grace) => {
                tracing::warn!("grace period over: stopping in-flight chunks");
            }
        }
        let _ = tx.send(Stop::Abort);
        next().await;
        eprintln!("tranche: signalled again, exiting now");
        std::process::exit(130);
    });
    Ok(rx)
}

/// An error as one line: the outermost context, then each cause it does not already
/// say.
pub(crate) fn one_line(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain().map(|e| e.to_string()) {
        if !line.contains(&cause) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&cause);
        }
    }
    line
}

/// The namespace the global options name, which must exist (have a plan).
pub(crate) async fn existing(g: &Global) -> Result<Backend> {
    Ok(Backend::open(&g.location(), Open::Existing, Tuning::default()).await?)
}
