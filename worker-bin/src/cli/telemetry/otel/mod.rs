//! The OTLP side: a tracer provider whose one processor is a bounded queue drained
//! by a thread of its own, which posts batches with the OTLP/HTTP exporter.
//!
//! Two choices that keep a span cheap for the run that makes it. The export thread
//! does not wait on the queue itself (a receiver parked on it is woken, a futex call
//! and a context switch, by every span sent): it is nudged once a batch is queued, and
//! otherwise wakes on its own after [`LINGER`]. And the spans carry their own fields
//! and their trace, nothing per span that `tracing-opentelemetry` would add by default:
//! no source location, thread or target attributes, no busy and idle times (a clock
//! read at every poll of the chunk's future), no OpenTelemetry context made current
//! on every entry (tranche reads a span's context from the span).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use crossbeam_channel::{Receiver, Sender, TrySendError};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter, SpanProcessor};
use tracing::Subscriber;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

use super::{SPANS_DROPPED, SPANS_EXPORTED};

/// Spans waiting for the export thread; beyond it, spans are dropped and counted.
const QUEUE: usize = 4096;
/// Spans posted in one request at most.
const BATCH: usize = 512;
/// How long a span waits for its batch to fill before it is posted anyway, and how
/// often the export thread looks at the queue when nothing nudges it.
const LINGER: Duration = Duration::from_secs(1);
/// How long the process waits at exit for the queue to drain.
const DRAIN: Duration = Duration::from_secs(5);
/// How long one post may take.
const POST: Duration = Duration::from_secs(10);

/// The running exporter, shut down by [`Telemetry`](super::Telemetry)'s drop.
pub(super) struct Export {
    provider: SdkTracerProvider,
}

impl Export {
    /// Flushes what is queued (bounded by [`DRAIN`]) and stops the thread; says how
    /// many spans went out and how many were dropped, in one line.
    pub(super) fn shutdown(self) {
        if let Err(e) = self.provider.shutdown_with_timeout(DRAIN) {
            tracing::debug!(error = %e, "span exporter shutdown");
        }
        tracing::info!(
            exported = SPANS_EXPORTED.load(Ordering::Relaxed),
            dropped = SPANS_DROPPED.load(Ordering::Relaxed),
            "span export ended"
        );
    }
}

/// The layer turning the process's spans into OpenTelemetry spans, and its exporter.
/// `ratio` is the partitions' share sampled ([`sampled_ratio`]).
pub(super) fn layer<S>(
    endpoint: &str,
    ratio: f64,
) -> anyhow::Result<(Box<dyn Layer<S> + Send + Sync + 'static>, Export)>
where
    S: Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
{
    let url = traces_url(endpoint)?;
    let mut builder = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(url.clone())
        .with_timeout(POST);
    if url.starts_with("https://") {
        builder = builder.with_http_client(tls::client(POST, |k| std::env::var_os(k))?);
    }
    let mut exporter = builder
        .build()
        .with_context(|| format!("cannot build the OTLP exporter for {url}"))?;
    let service = std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "tranche".to_owned());
    let resource = Resource::builder()
        .with_service_name(service)
        .with_attribute(opentelemetry::KeyValue::new(
            "service.version",
            env!("CARGO_PKG_VERSION"),
        ))
        .build();
    exporter.set_resource(&resource);
    // Given, not left to the SDK's reading of `OTEL_TRACES_SAMPLER` (which falls
    // back to always-on on a value it does not know). Parent-based: a partition's
    // spans, built only when `Propagate::sampled` kept it, follow their sampled
    // remote root; a root of its own (the `run` span) is kept at the same ratio.
    use opentelemetry_sdk::trace::Sampler;
    let sampler = if ratio >= 1.0 {
        Sampler::ParentBased(Box::new(Sampler::AlwaysOn))
    } else {
        Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(ratio)))
    };
    let provider = SdkTracerProvider::builder()
        .with_sampler(sampler)
        .with_resource(resource)
        .with_span_processor(Queue::start(exporter)?)
        .build();
    let tracer = provider.tracer("tranche");
    // Spans of tranche's own code down to debug (`partition` and `chunk` are);
    // events from info up, attached to their span, and the debug events meant for
    // spans alone (the gate's waits).
    let filter = tracing_subscriber::filter::filter_fn(|meta| {
        meta.target().starts_with("tranche")
            && if meta.is_span() {
                *meta.level() <= tracing::Level::DEBUG
            } else {
                *meta.level() <= tracing::Level::INFO
                    || (meta.target() == crate::trace::SPAN_EVENTS
                        && *meta.level() <= tracing::Level::DEBUG)
            }
    });
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        .with_target(false)
        .with_tracked_inactivity(false)
        .with_context_activation(false)
        .with_filter(filter)
        .boxed();
    Ok((layer, Export { provider }))
}

/// The traces URL of an OTLP/HTTP base endpoint, as the OpenTelemetry
/// specification builds it from `OTEL_EXPORTER_OTLP_ENDPOINT`.
fn traces_url(endpoint: &str) -> anyhow::Result<String> {
    let endpoint = endpoint.trim_end_matches('/');
    if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
        anyhow::bail!(
            "--otlp-endpoint {endpoint:?} is not an http:// or https:// URL (an OTLP/HTTP collector, e.g. http://localhost:4318)"
        );
    }
    Ok(if endpoint.ends_with("/v1/traces") {
        endpoint.to_owned()
    } else {
        format!("{endpoint}/v1/traces")
    })
}

/// The share of partitions traced: `--trace-sample` when given, else the standard
/// `OTEL_TRACES_SAMPLER` (`always_on` by default, `always_off`, `traceidratio`,
/// and their `parentbased_` forms, the same here: a partition has no remote
/// parent) with `OTEL_TRACES_SAMPLER_ARG` (the ratio; 1 when unset), read through
/// `var`.
///
/// # Errors
/// A sampler tranche does not implement, or a ratio not from 0 to 1, in one line.
pub(super) fn sampled_ratio(
    flag: Option<f64>,
    var: impl Fn(&str) -> Option<String>,
) -> anyhow::Result<f64> {
    if let Some(ratio) = flag {
        return Ok(ratio);
    }
    let sampler = var("OTEL_TRACES_SAMPLER").unwrap_or_default();
    match sampler.trim() {
        "" | "always_on" | "parentbased_always_on" => Ok(1.0),
        "always_off" | "parentbased_always_off" => Ok(0.0),
        "traceidratio" | "parentbased_traceidratio" => {
            match var("OTEL_TRACES_SAMPLER_ARG").filter(|a| !a.trim().is_empty()) {
                None => Ok(1.0),
                Some(arg) => {
                    super::ratio(&arg).map_err(|e| anyhow::anyhow!("OTEL_TRACES_SAMPLER_ARG {e}"))
                }
            }
        }
        other => anyhow::bail!(
            "OTEL_TRACES_SAMPLER {other:?} is not one tranche takes: always_on, always_off, traceidratio or parentbased_traceidratio"
        ),
    }
}

/// The binary's [`TraceContext`](crate::trace::TraceContext) over
/// `tracing-opentelemetry`, keeping `ratio` of the partitions.
pub(super) struct Propagate {
    /// The share of partitions whose attempts get spans, 0 to 1.
    pub(super) ratio: f64,
}

impl crate::trace::TraceContext for Propagate {
    fn sampled(&self, partition: &crate::trace::PartitionTrace) -> bool {
        partition.in_sample(self.ratio)
    }

    fn partition(&self, span: &tracing::Span, partition: &crate::trace::PartitionTrace) {
        use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
        let root = SpanContext::new(
            TraceId::from_bytes(partition.trace_id),
            SpanId::from_bytes(partition.root_span_id),
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        );
        // The current span is the run's: linked, no longer the parent.
        let run = tracing::Span::current()
            .context()
            .span()
            .span_context()
            .clone();
        if let Err(e) =
            span.set_parent(opentelemetry::Context::new().with_remote_span_context(root))
        {
            tracing::debug!(error = %e, "a partition span not put in its trace");
        }
        span.add_link(run);
    }

    fn traceparent(&self, span: &tracing::Span) -> Option<crate::trace::TraceParent> {
        let cx = span.context();
        let sc = cx.span().span_context().clone();
        if !sc.is_valid() {
            return None;
        }
        crate::trace::TraceParent::new(
            sc.trace_id().to_bytes(),
            sc.span_id().to_bytes(),
            sc.is_sampled(),
        )
    }
}

/// The trace and span ids of the current span, hex, when it is sampled.
pub(super) fn current_ids() -> Option<(String, String)> {
    let span = tracing::Span::current();
    if span.is_none() {
        return None;
    }
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    sc.is_valid()
        .then(|| (sc.trace_id().to_string(), sc.span_id().to_string()))
}

/// What the processor sends its thread.
enum Control {
    /// Post everything queued, then answer.
    Flush(Sender<()>),
    /// Post everything queued, answer, and end.
    Stop(Sender<()>),
}

/// A span processor that never blocks: `on_end` tries the bounded queue and counts
/// a drop when it is full; it nudges the export thread once a batch is queued.
#[derive(Debug)]
struct Queue {
    spans: Sender<SpanData>,
    /// One pending nudge at most: "a batch is waiting".
    nudge: Sender<()>,
    control: Sender<Control>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Queue {
    fn start(exporter: opentelemetry_otlp::SpanExporter) -> anyhow::Result<Self> {
        let (spans, queued) = crossbeam_channel::bounded(QUEUE);
        let (nudge, nudged) = crossbeam_channel::bounded(1);
        let (control, orders) = crossbeam_channel::unbounded();
        let thread = std::thread::Builder::new()
            .name("tranche-otlp".into())
            .spawn(move || drain(exporter, queued, nudged, orders))
            .context("cannot start the span export thread")?;
        Ok(Self {
            spans,
            nudge,
            control,
            thread: Mutex::new(Some(thread)),
        })
    }

    fn ask(&self, order: fn(Sender<()>) -> Control, wait: Duration) -> OTelSdkResult {
        let (done, answered) = crossbeam_channel::bounded(1);
        if self.control.send(order(done)).is_err() {
            return Ok(());
        }
        answered
            .recv_timeout(wait)
            .map_err(|_| opentelemetry_sdk::error::OTelSdkError::Timeout(wait))
    }
}

impl SpanProcessor for Queue {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &opentelemetry::Context) {}

    fn on_end(&self, span: SpanData) {
        match self.spans.try_send(span) {
            Ok(()) => {
                if self.spans.len() >= BATCH {
                    let _ = self.nudge.try_send(());
                }
            }
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                SPANS_DROPPED.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.ask(Control::Flush, DRAIN)
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        let answer = self.ask(Control::Stop, timeout);
        if answer.is_ok()
            && let Some(thread) = self.thread.lock().ok().and_then(|mut t| t.take())
        {
            let _ = thread.join();
        }
        answer
    }
}

/// The export thread: batches the queue and posts each batch, on a runtime of its
/// own so that the run's runtime (one thread by default) never waits on a collector.
fn drain(
    exporter: opentelemetry_otlp::SpanExporter,
    queued: Receiver<SpanData>,
    nudged: Receiver<()>,
    orders: Receiver<Control>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::warn!(error = %e, "span export disabled: cannot start its runtime");
            return;
        }
    };
    let exporter = Arc::new(exporter);
    let mut batch = Vec::with_capacity(BATCH);
    let mut warned: Option<Instant> = None;
    let mut post = |batch: &mut Vec<SpanData>| {
        if batch.is_empty() {
            return;
        }
        let spans = std::mem::take(batch);
        let n = spans.len() as u64;
        match runtime.block_on(exporter.export(spans)) {
            Ok(()) => {
                SPANS_EXPORTED.fetch_add(n, Ordering::Relaxed);
            }
            Err(e) => {
                SPANS_DROPPED.fetch_add(n, Ordering::Relaxed);
                // One line a minute at most: a collector that is down must not
                // flood the log.
                if warned.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
                    warned = Some(Instant::now());
                    tracing::warn!(error = %e, dropped = n, "spans not exported; the run goes on");
                }
            }
        }
    };
    // Everything queued now, posted in batches.
    let mut take_all = |post: &mut dyn FnMut(&mut Vec<SpanData>)| {
        while let Ok(span) = queued.try_recv() {
            batch.push(span);
            if batch.len() >= BATCH {
                post(&mut batch);
            }
        }
        post(&mut batch);
    };
    loop {
        crossbeam_channel::select! {
            recv(nudged) -> nudge => {
                take_all(&mut post);
                // The processor is gone (dropped without a shutdown): nothing more comes.
                if nudge.is_err() {
                    return;
                }
            },
            recv(orders) -> order => {
                let (done, stop) = match order {
                    Ok(Control::Flush(done)) => (Some(done), false),
                    Ok(Control::Stop(done)) => (Some(done), true),
                    Err(_) => (None, true),
                };
                take_all(&mut post);
                if let Some(done) = done {
                    let _ = done.send(());
                }
                if stop {
                    return;
                }
            },
            default(LINGER) => take_all(&mut post),
        }
    }
}

mod tls;

#[cfg(test)]
mod tests {
    use super::{sampled_ratio, traces_url};

    #[test]
    fn the_traces_path_is_appended_once() {
        assert_eq!(
            traces_url("http://localhost:4318").unwrap(),
            "http://localhost:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://c:4318/").unwrap(),
            "http://c:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://c:4318/v1/traces").unwrap(),
            "http://c:4318/v1/traces"
        );
        assert!(traces_url("localhost:4318").is_err());
        assert_eq!(
            traces_url("https://c:4318").unwrap(),
            "https://c:4318/v1/traces"
        );
    }

    fn ratio_of(flag: Option<f64>, vars: &[(&str, &str)]) -> Result<f64, String> {
        let var = |k: &str| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        };
        sampled_ratio(flag, var).map_err(|e| e.to_string())
    }

    #[test]
    fn the_standard_sampler_variables_are_read_and_checked() {
        const S: &str = "OTEL_TRACES_SAMPLER";
        const A: &str = "OTEL_TRACES_SAMPLER_ARG";
        assert_eq!(ratio_of(None, &[]), Ok(1.0));
        assert_eq!(ratio_of(None, &[(S, "always_on"), (A, "0.2")]), Ok(1.0));
        assert_eq!(ratio_of(None, &[(S, "parentbased_always_on")]), Ok(1.0));
        assert_eq!(ratio_of(None, &[(S, "always_off")]), Ok(0.0));
        assert_eq!(
            ratio_of(None, &[(S, "traceidratio"), (A, "0.25")]),
            Ok(0.25)
        );
        assert_eq!(
            ratio_of(None, &[(S, "parentbased_traceidratio"), (A, "0")]),
            Ok(0.0)
        );
        // The spec's default argument.
        assert_eq!(ratio_of(None, &[(S, "traceidratio")]), Ok(1.0));
        // The flag wins over the variables, even ones that are wrong.
        assert_eq!(ratio_of(Some(0.1), &[(S, "xray")]), Ok(0.1));
        for (vars, says) in [
            (
                &[(S, "xray")][..],
                "OTEL_TRACES_SAMPLER \"xray\" is not one",
            ),
            (&[(S, "Always_On")][..], "is not one tranche takes"),
            (
                &[(S, "traceidratio"), (A, "1.5")][..],
                "OTEL_TRACES_SAMPLER_ARG \"1.5\" is not a ratio",
            ),
            (&[(S, "traceidratio"), (A, "half")][..], "is not a ratio"),
            (&[(S, "traceidratio"), (A, "NaN")][..], "is not a ratio"),
        ] {
            let err = ratio_of(None, vars).unwrap_err();
            assert!(err.contains(says) && !err.contains('\n'), "{err}");
        }
    }

    /// The library's rule (`PartitionTrace::in_sample`) decides as the SDK's own
    /// `TraceIdRatioBased` sampler does, on the ids a run derives.
    #[test]
    fn the_partition_rule_agrees_with_the_sdks_sampler() {
        use opentelemetry::trace::{SpanKind, TraceId};
        use opentelemetry_sdk::trace::{Sampler, SamplingDecision, ShouldSample};
        let mut disagree = Vec::new();
        for ratio in [0.0, 0.001, 0.1, 0.5, 0.75, 0.999, 1.0] {
            let sampler = Sampler::TraceIdRatioBased(ratio);
            for pid in 1..=2000 {
                let plan = Some([1, 1, 2_000_000, 1000]);
                let t = crate::trace::PartitionTrace::new("ns", plan, pid, 1, None);
                let sdk = sampler.should_sample(
                    None,
                    TraceId::from_bytes(t.trace_id),
                    "partition",
                    &SpanKind::Internal,
                    &[],
                    &[],
                );
                let sdk = sdk.decision == SamplingDecision::RecordAndSample;
                if sdk != t.in_sample(ratio) {
                    disagree.push((ratio, pid));
                }
            }
        }
        assert!(disagree.is_empty(), "{disagree:?}");
    }
}
