//! The binary's logs and traces: the log lines on stderr (`--log-format text|json`) and,
//! with `--otlp-endpoint` (feature `otel`), the run's spans exported over OTLP/HTTP.
//!
//! The exporter never sits on the run's path: a finished span is handed to a bounded
//! queue with a non-blocking send, and a thread of its own batches the queue and posts
//! it. A full queue, or a collector that refuses or cannot be reached, drops spans and
//! counts them ([`SPANS_DROPPED`], `tranche_worker_otel_spans_dropped` on
//! `--metrics-listen`); the job goes on at full speed either way.
//!
//! With the exporter on, [`trace_context`] is the run's [`TraceContext`]: each attempt's
//! `partition` span goes into its partition's trace (a remote parent derived from the
//! namespace, the plan and the pid, `crate::trace`) with a link to the process's `run`
//! span, and each `chunk` span's context becomes its command's `TRACEPARENT`. Without
//! it, none is given and nothing of that runs.
//!
//! Head sampling (`--trace-sample`, or `OTEL_TRACES_SAMPLER` and
//! `OTEL_TRACES_SAMPLER_ARG`) is that trace context's: a partition is kept when its
//! derived trace id passes OpenTelemetry's `TraceIdRatioBased` rule
//! (`PartitionTrace::in_sample`), decided in the library floor before any of its spans
//! is built; the exporter's layer then keeps what was built, and samples the process's
//! `run` span (a root of its own) by the same ratio. A value tranche cannot honour is an
//! error at start, never a silent default.
//!
//! An `https://` endpoint is verified against the system's roots, or against the PEM
//! file in `OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE` or `OTEL_EXPORTER_OTLP_CERTIFICATE`
//! alone, over rustls (the tree's one TLS stack).

use std::fmt;

use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer as _;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

/// How log lines are written on stderr.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable lines (colours on a terminal).
    Text,
    /// One JSON object a line: timestamp, level, target, message, fields, the current
    /// span and, with `--otlp-endpoint`, its trace and span ids.
    Json,
}

/// Keeps the exporter alive for the process; dropping it flushes what is queued (with a
/// bound) and stops the export thread.
#[must_use = "dropping the guard stops the span export"]
pub(crate) struct Telemetry {
    #[cfg(feature = "otel")]
    otel: Option<otel::Export>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        #[cfg(feature = "otel")]
        if let Some(export) = self.otel.take() {
            export.shutdown();
        }
    }
}

/// Where spans go: the base URL of an OTLP/HTTP collector (`/v1/traces` is appended
/// unless given), or none.
pub(crate) struct Traces {
    /// `--otlp-endpoint` or `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub(crate) endpoint: Option<String>,
    /// `--trace-sample`: the ratio of partitions traced, over `OTEL_TRACES_SAMPLER`.
    pub(crate) sample: Option<f64>,
}

/// A ratio from 0 to 1 (`--trace-sample`, `OTEL_TRACES_SAMPLER_ARG`).
///
/// # Errors
/// Anything else, NaN included, in one line.
pub(crate) fn ratio(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(format!("{s:?} is not a ratio from 0 to 1 (e.g. 0.1)")),
    }
}

/// Installs the process's subscriber: the log lines on stderr filtered by `RUST_LOG`
/// (default `warn,tranche=info`), and the span exporter when `traces` names a collector.
///
/// # Errors
/// A malformed endpoint, or an exporter that cannot be built, in one line.
pub(crate) fn init(format: LogFormat, traces: &Traces) -> anyhow::Result<Telemetry> {
    let filter = || {
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn,tranche=info"))
    };
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let logs = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_target(false)
            .with_ansi(ansi)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .event_format(JsonLines)
            .boxed(),
    };
    let logs = tracing_subscriber::Layer::with_filter(logs, filter());
    #[cfg(feature = "otel")]
    {
        let (layer, otel) = match traces.endpoint.as_deref() {
            Some(endpoint) => {
                let ratio = otel::sampled_ratio(traces.sample, |k| std::env::var(k).ok())?;
                let (layer, export) = otel::layer(endpoint, ratio)?;
                (Some(layer), Some((export, ratio)))
            }
            None => (None, None),
        };
        tracing_subscriber::registry()
            .with(logs)
            .with(layer)
            .try_init()?;
        let otel = otel.map(|(export, ratio)| {
            let _ = TRACE_CONTEXT.set(std::sync::Arc::new(otel::Propagate { ratio }));
            export
        });
        Ok(Telemetry { otel })
    }
    #[cfg(not(feature = "otel"))]
    {
        if traces.endpoint.is_some() {
            anyhow::bail!("--otlp-endpoint needs a tranche built with the `otel` feature");
        }
        // Nothing is exported, so nothing is sampled.
        let _ = traces.sample;
        tracing_subscriber::registry().with(logs).try_init()?;
        Ok(Telemetry {})
    }
}

/// The run's trace context, set once the exporter is installed.
static TRACE_CONTEXT: std::sync::OnceLock<std::sync::Arc<dyn crate::trace::TraceContext>> =
    std::sync::OnceLock::new();

/// What puts a run's spans into traces, when spans are exported (`--otlp-endpoint`);
/// `None` otherwise, and the run then derives no trace and passes no `TRACEPARENT`.
pub(crate) fn trace_context() -> Option<std::sync::Arc<dyn crate::trace::TraceContext>> {
    TRACE_CONTEXT.get().cloned()
}

/// `--log-format json`: one object a line, as log shippers (Loki, Elasticsearch,
/// Datadog) read them.
struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut fields = serde_json::Map::new();
        event.record(&mut Fields(&mut fields));
        let message = fields
            .remove("message")
            .unwrap_or(serde_json::Value::String(String::new()));
        let mut timestamp = String::new();
        SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
        let meta = event.metadata();
        let mut line = serde_json::json!({
            "timestamp": timestamp,
            "level": meta.level().as_str(),
            "target": meta.target(),
            "message": message,
        });
        if !fields.is_empty() {
            line["fields"] = serde_json::Value::Object(fields);
        }
        if let Some(scope) = ctx.event_scope() {
            let spans: Vec<serde_json::Value> = scope
                .from_root()
                .map(|span| serde_json::Value::String(span.name().to_owned()))
                .collect();
            if let Some(current) = spans.last() {
                line["span"] = current.clone();
            }
            line["spans"] = serde_json::Value::Array(spans);
        }
        #[cfg(feature = "otel")]
        if let Some((trace_id, span_id)) = otel::current_ids() {
            line["trace_id"] = serde_json::Value::String(trace_id);
            line["span_id"] = serde_json::Value::String(span_id);
        }
        writeln!(writer, "{line}")
    }
}

/// Collects an event's fields as JSON values (numbers and booleans stay typed).
struct Fields<'a>(&'a mut serde_json::Map<String, serde_json::Value>);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
        self.0.insert(
            field.name().to_owned(),
            serde_json::Value::String(format!("{value:?}")),
        );
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(
            field.name().to_owned(),
            serde_json::Value::String(value.to_owned()),
        );
    }
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        self.0.insert(field.name().to_owned(), value.into());
    }
    fn record_i64(&mut self, field: &tracing::field::Field, value: i64) {
        self.0.insert(field.name().to_owned(), value.into());
    }
    fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
        self.0.insert(field.name().to_owned(), value.into());
    }
    fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
        self.0.insert(field.name().to_owned(), value.into());
    }
}

/// Spans the exporter gave up on: the queue was full, or the collector refused or could
/// not be reached.
pub(crate) static SPANS_DROPPED: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);
/// Spans the collector accepted.
pub(crate) static SPANS_EXPORTED: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);

/// Adds the exporter's counters to a worker's `/metrics` (`--metrics-listen`).
pub(crate) fn register(registry: &mut prometheus_client::registry::Registry) {
    use std::sync::atomic::Ordering;
    for (name, help, value) in [
        (
            "otel_spans_dropped",
            "Spans not exported: the queue was full or the collector refused or was unreachable",
            SPANS_DROPPED.load(Ordering::Relaxed),
        ),
        (
            "otel_spans_exported",
            "Spans the OTLP collector accepted",
            SPANS_EXPORTED.load(Ordering::Relaxed),
        ),
    ] {
        let c: prometheus_client::metrics::counter::Counter = Default::default();
        c.inc_by(value);
        registry.register(name, help, c);
    }
}

#[cfg(feature = "otel")]
mod otel;
