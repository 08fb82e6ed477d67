//! The OTLP side: tranche's own span layer ([`layer::Spans`]) encodes each span as it
//! ends ([`otlp`]) into a bounded buffer, which a thread of its own takes and posts
//! over HTTP.
//!
//! Three choices that keep a span cheap for the run that makes it. The layer encodes a
//! span's fields as they are recorded, typed, under their static names (`layer` says
//! why this is not `tracing-opentelemetry` over the OpenTelemetry SDK). The span is
//! framed where it ended, so its record is freed by the thread that allocated it and
//! the export thread is handed bytes, not records (a buffer it gives back once posted). And the export
//! thread does not wait on the queue itself (a receiver parked on it is woken, a futex
//! call and a context switch, by every span sent): it is nudged once a batch is queued,
//! and otherwise wakes on its own after [`LINGER`].
//!
//! The standard variables an OTLP exporter reads are read here too:
//! `OTEL_EXPORTER_OTLP_TRACES_HEADERS` (else `OTEL_EXPORTER_OTLP_HEADERS`), and
//! `OTEL_RESOURCE_ATTRIBUTES` beside `OTEL_SERVICE_NAME`. A value that cannot be sent
//! is an error at start.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use crossbeam_channel::{Receiver, Sender};
use opentelemetry_http::HttpClient;
use tracing::Subscriber;
use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

use self::otlp::Finished;
use super::{SPANS_DROPPED, SPANS_EXPORTED};

/// Spans waiting for the export thread; beyond it, spans are dropped and counted.
const QUEUE: usize = 4096;
/// Spans queued before the export thread is nudged to post them (it posts all that
/// are queued then).
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
    queue: Queue,
    thread: JoinHandle<()>,
}

impl Export {
    /// Flushes what is queued (bounded by [`DRAIN`]) and stops the thread; says how
    /// many spans went out and how many were dropped, in one line.
    pub(super) fn shutdown(self) {
        let (done, answered) = crossbeam_channel::bounded(1);
        if self.queue.control.send(Control::Stop(done)).is_ok() {
            match answered.recv_timeout(DRAIN) {
                Ok(()) => {
                    let _ = self.thread.join();
                }
                Err(_) => tracing::debug!("span export did not drain within {DRAIN:?}"),
            }
        }
        tracing::info!(
            exported = SPANS_EXPORTED.load(Ordering::Relaxed),
            dropped = SPANS_DROPPED.load(Ordering::Relaxed),
            "span export ended"
        );
    }
}

/// The layer turning the process's spans into OTLP spans, and its exporter.
/// `ratio` is the partitions' share sampled ([`sampled_ratio`]), and the `run`
/// span's (a root of its own).
pub(super) fn layer<S>(
    endpoint: &str,
    ratio: f64,
) -> anyhow::Result<(Box<dyn Layer<S> + Send + Sync + 'static>, Export)>
where
    S: Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
{
    let var = |k: &str| std::env::var(k).ok();
    let url = traces_url(endpoint)?;
    let uri: http::Uri = url
        .parse()
        .map_err(|e| anyhow::anyhow!("--otlp-endpoint {endpoint:?}: {e}"))?;
    let client: Box<dyn HttpClient> = if url.starts_with("https://") {
        Box::new(tls::client(POST, |k| std::env::var_os(k))?)
    } else {
        Box::new(opentelemetry_http::hyper::HyperClient::with_default_connector(POST, None))
    };
    let post = Post {
        uri,
        headers: headers(var)?,
        resource: otlp::resource(&resource(var)?),
        client,
    };
    let (queue, thread) = Queue::start(post)?;
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
    let layer = layer::Spans {
        ratio,
        sink: queue.clone(),
    }
    .with_filter(filter)
    .boxed();
    Ok((layer, Export { queue, thread }))
}

/// `key=value` pairs, comma-separated, values percent-decoded: the form of
/// `OTEL_EXPORTER_OTLP_HEADERS` and `OTEL_RESOURCE_ATTRIBUTES`. `name` says which, in
/// the error.
fn pairs(name: &str, list: &str) -> anyhow::Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let Some((key, value)) = item.split_once('=') else {
            anyhow::bail!("{name}: {item:?} is not key=value");
        };
        let key = key.trim();
        if key.is_empty() {
            anyhow::bail!("{name}: {item:?} has no key");
        }
        let value = crate::sql::percent_decoded(value.trim())
            .map_err(|why| anyhow::anyhow!("{name}: {item:?}: {why}"))?;
        out.push((key.to_owned(), value));
    }
    Ok(out)
}

/// The headers every post carries, from `OTEL_EXPORTER_OTLP_TRACES_HEADERS`, else
/// `OTEL_EXPORTER_OTLP_HEADERS` (an API key for a hosted collector, say).
fn headers(var: impl Fn(&str) -> Option<String>) -> anyhow::Result<http::HeaderMap> {
    let mut map = http::HeaderMap::new();
    let found = [
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
        "OTEL_EXPORTER_OTLP_HEADERS",
    ]
    .into_iter()
    .find_map(|k| var(k).filter(|v| !v.trim().is_empty()).map(|v| (k, v)));
    if let Some((name, list)) = found {
        for (key, value) in pairs(name, &list)? {
            let header = http::HeaderName::from_bytes(key.as_bytes())
                .map_err(|_| anyhow::anyhow!("{name}: {key:?} is not a header name"))?;
            let value = http::HeaderValue::from_str(&value).map_err(|_| {
                anyhow::anyhow!("{name}: the value of {key:?} is not a header value")
            })?;
            map.append(header, value);
        }
    }
    Ok(map)
}

/// The process's resource: `service.name` (`OTEL_SERVICE_NAME`, default `tranche`),
/// `service.version`, the SDK's name and language, and `OTEL_RESOURCE_ATTRIBUTES`
/// (whose `service.name` `OTEL_SERVICE_NAME` overrides, as the specification says).
fn resource(var: impl Fn(&str) -> Option<String>) -> anyhow::Result<Vec<(String, String)>> {
    let mut attributes: Vec<(String, String)> = vec![
        ("telemetry.sdk.name".into(), "tranche".into()),
        ("telemetry.sdk.language".into(), "rust".into()),
        (
            "telemetry.sdk.version".into(),
            env!("CARGO_PKG_VERSION").into(),
        ),
        ("service.version".into(), env!("CARGO_PKG_VERSION").into()),
    ];
    let mut put = |key: String, value: String| match attributes.iter_mut().find(|(k, _)| *k == key)
    {
        Some((_, v)) => *v = value,
        None => attributes.push((key, value)),
    };
    let given = var("OTEL_RESOURCE_ATTRIBUTES").unwrap_or_default();
    let mut service = None;
    for (key, value) in pairs("OTEL_RESOURCE_ATTRIBUTES", &given)? {
        if key == "service.name" {
            service = Some(value);
        } else {
            put(key, value);
        }
    }
    let service = var("OTEL_SERVICE_NAME")
        .filter(|s| !s.is_empty())
        .or(service)
        .unwrap_or_else(|| "tranche".to_owned());
    put("service.name".into(), service);
    Ok(attributes)
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

/// The binary's [`TraceContext`](crate::trace::TraceContext) over [`layer::Spans`],
/// keeping `ratio` of the partitions.
pub(super) struct Propagate {
    /// The share of partitions whose attempts get spans, 0 to 1.
    pub(super) ratio: f64,
}

impl crate::trace::TraceContext for Propagate {
    fn sampled(&self, partition: &crate::trace::PartitionTrace) -> bool {
        partition.in_sample(self.ratio)
    }

    fn partition(&self, span: &tracing::Span, partition: &crate::trace::PartitionTrace) {
        // The current span is the run's: linked, no longer the parent.
        let run = layer::with_open(&tracing::Span::current(), |o| (o.trace_id, o.span_id));
        let placed = layer::with_open(span, |o| {
            o.trace_id = partition.trace_id;
            o.parent_span_id = Some(partition.root_span_id);
            // Kept by the rule the library applied before building the span.
            o.sampled = true;
            o.links.extend(run);
        });
        if placed.is_none() {
            tracing::debug!("a partition span not put in its trace");
        }
    }

    fn traceparent(&self, span: &tracing::Span) -> Option<crate::trace::TraceParent> {
        layer::with_open(span, |o| {
            crate::trace::TraceParent::new(o.trace_id, o.span_id, o.sampled)
        })
        .flatten()
    }
}

/// The trace and span ids of the current span, hex, when this layer records it.
pub(super) fn current_ids() -> Option<(String, String)> {
    let span = tracing::Span::current();
    if span.is_none() {
        return None;
    }
    let hex = |b: &[u8]| b.iter().map(|b| format!("{b:02x}")).collect::<String>();
    layer::with_open(&span, |o| (hex(&o.trace_id), hex(&o.span_id)))
}

/// What the exporter's handle sends its thread.
enum Control {
    /// Post everything queued, answer, and end.
    Stop(Sender<()>),
}

/// Spans encoded and waiting for the export thread.
#[derive(Default)]
struct Pending {
    /// `ScopeSpans.spans` fields, ready to be framed into a request.
    spans: Vec<u8>,
    count: usize,
}

/// The layer's side of the export queue: a finished span is encoded into the pending
/// buffer, or dropped and counted when [`QUEUE`] spans are already waiting; the export
/// thread is nudged once a batch is queued. Encoding here, on the thread that ended
/// the span, frees the span's record where it was allocated and hands the export
/// thread bytes, not records.
#[derive(Clone)]
struct Queue {
    pending: Arc<Mutex<Pending>>,
    /// One pending nudge at most: "a batch is waiting".
    nudge: Sender<()>,
    control: Sender<Control>,
}

impl Queue {
    fn start(post: Post) -> anyhow::Result<(Self, JoinHandle<()>)> {
        let pending = Arc::new(Mutex::new(Pending::default()));
        let (nudge, nudged) = crossbeam_channel::bounded(1);
        let (control, orders) = crossbeam_channel::unbounded();
        let queued = pending.clone();
        let thread = std::thread::Builder::new()
            .name("tranche-otlp".into())
            .spawn(move || drain(post, &queued, nudged, orders))
            .context("cannot start the span export thread")?;
        Ok((
            Self {
                pending,
                nudge,
                control,
            },
            thread,
        ))
    }
}

impl layer::Sink for Queue {
    fn send(&self, span: Finished) {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        if pending.count >= QUEUE {
            drop(pending);
            SPANS_DROPPED.fetch_add(1, Ordering::Relaxed);
            return;
        }
        otlp::span(&mut pending.spans, &span);
        pending.count += 1;
        if pending.count == BATCH {
            let _ = self.nudge.try_send(());
        }
    }
}

/// Where and how a batch is posted.
struct Post {
    uri: http::Uri,
    headers: http::HeaderMap,
    /// The process's resource, encoded once.
    resource: Vec<u8>,
    client: Box<dyn HttpClient>,
}

impl Post {
    /// Posts `spans` (encoded by [`otlp::span`]) as one OTLP/HTTP protobuf request.
    async fn send(&self, spans: &[u8]) -> anyhow::Result<()> {
        let body = otlp::request(&self.resource, spans);
        let mut request = http::Request::builder()
            .method(http::Method::POST)
            .uri(self.uri.clone())
            .header(http::header::CONTENT_TYPE, "application/x-protobuf")
            .body(bytes::Bytes::from(body))?;
        request.headers_mut().extend(self.headers.clone());
        let response = self
            .client
            .send_bytes(request)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let status = response.status();
        if !status.is_success() {
            let body = String::from_utf8_lossy(response.body());
            anyhow::bail!("the collector answered {status}: {}", body.trim());
        }
        Ok(())
    }
}

/// The export thread: takes what is pending and posts it, on a runtime of its own so
/// that the run's runtime (one thread by default) never waits on a collector.
fn drain(post: Post, pending: &Mutex<Pending>, nudged: Receiver<()>, orders: Receiver<Control>) {
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
    let mut warned: Option<Instant> = None;
    // The buffer posted last, cleared, handed back to the layer for the next batch.
    let mut spare: Vec<u8> = Vec::new();
    let mut take_all = || {
        let (spans, n) = {
            let mut p = pending.lock().unwrap_or_else(PoisonError::into_inner);
            let n = std::mem::take(&mut p.count) as u64;
            (
                std::mem::replace(&mut p.spans, std::mem::take(&mut spare)),
                n,
            )
        };
        if n > 0 {
            match runtime.block_on(post.send(&spans)) {
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
        }
        spare = spans;
        spare.clear();
    };
    loop {
        crossbeam_channel::select! {
            recv(nudged) -> nudge => {
                take_all();
                // The queue is gone (dropped without a shutdown): nothing more comes.
                if nudge.is_err() {
                    return;
                }
            },
            recv(orders) -> order => {
                take_all();
                if let Ok(Control::Stop(done)) = order {
                    let _ = done.send(());
                }
                return;
            },
            default(LINGER) => take_all(),
        }
    }
}

mod layer;
mod otlp;
mod tls;

#[cfg(test)]
mod tests {
    use super::{headers, resource, sampled_ratio, traces_url};

    /// A full queue drops and counts, never blocks; the export thread is nudged once,
    /// when a batch is queued; what is queued decodes as OTLP spans.
    #[test]
    fn a_full_queue_drops_and_counts_and_nudges_once() {
        use super::layer::Sink as _;
        use super::otlp::{Finished, request};
        use super::{BATCH, Pending, QUEUE, Queue, SPANS_DROPPED};
        use std::sync::atomic::Ordering;
        use std::sync::{Arc, Mutex};
        let (nudge, nudged) = crossbeam_channel::bounded(1);
        let (control, _orders) = crossbeam_channel::unbounded();
        let queue = Queue {
            pending: Arc::new(Mutex::new(Pending::default())),
            nudge,
            control,
        };
        let span = |i: u8| Finished {
            trace_id: [i.max(1); 16],
            span_id: [i.max(1); 8],
            parent_span_id: None,
            name: "chunk",
            start: 1,
            end: 2,
            attributes: Default::default(),
            events: Vec::new(),
            links: Vec::new(),
            error: None,
        };
        let dropped = SPANS_DROPPED.load(Ordering::Relaxed);
        for i in 0..QUEUE + 3 {
            queue.send(span(i as u8));
            if i + 1 == BATCH - 1 {
                assert!(nudged.try_recv().is_err(), "nudged before a batch");
            }
        }
        assert_eq!(SPANS_DROPPED.load(Ordering::Relaxed) - dropped, 3);
        assert!(nudged.try_recv().is_ok(), "nudged at {BATCH}");
        let pending = queue.pending.lock().unwrap();
        assert_eq!(pending.count, QUEUE);
        let body = request(b"", &pending.spans);
        let decoded = <opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest as prost::Message>::decode(body.as_slice()).unwrap();
        assert_eq!(decoded.resource_spans[0].scope_spans[0].spans.len(), QUEUE);
    }

    fn vars(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
    }

    /// `OTEL_EXPORTER_OTLP_TRACES_HEADERS` over `OTEL_EXPORTER_OTLP_HEADERS`, values
    /// percent-decoded; anything that cannot be sent refused in one line.
    #[test]
    fn the_headers_variables_are_read_and_checked() {
        let h = headers(vars(&[
            ("OTEL_EXPORTER_OTLP_HEADERS", "x-ignored=1"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
                " api-key = s%3Dcr%2Ct ,x-team=data,",
            ),
        ]))
        .unwrap();
        assert_eq!(h.len(), 2, "{h:?}");
        assert_eq!(h["api-key"], "s=cr,t");
        assert_eq!(h["x-team"], "data");
        let h = headers(vars(&[(
            "OTEL_EXPORTER_OTLP_HEADERS",
            "authorization=Basic%20eA",
        )]))
        .unwrap();
        assert_eq!(h["authorization"], "Basic eA");
        assert!(headers(vars(&[])).unwrap().is_empty());
        for (bad, says) in [
            ("novalue", "is not key=value"),
            ("=v", "has no key"),
            ("k=%zz", "a bad % escape"),
            ("bad header=v", "is not a header name"),
            ("k=a%0Ab", "is not a header value"),
        ] {
            let err = headers(vars(&[("OTEL_EXPORTER_OTLP_HEADERS", bad)]))
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("OTEL_EXPORTER_OTLP_HEADERS")
                    && err.contains(says)
                    && !err.contains('\n'),
                "{bad}: {err}"
            );
        }
    }

    /// The resource: tranche's own attributes, `OTEL_RESOURCE_ATTRIBUTES`, and the
    /// service's name from `OTEL_SERVICE_NAME` over that list's, `tranche` by default.
    #[test]
    fn the_resource_takes_the_standard_variables() {
        let get = |r: &[(String, String)], k: &str| {
            r.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
        };
        let r = resource(vars(&[])).unwrap();
        assert_eq!(get(&r, "service.name").as_deref(), Some("tranche"));
        assert_eq!(
            get(&r, "service.version").as_deref(),
            Some(env!("CARGO_PKG_VERSION"))
        );
        let given = "service.name=from-list,deployment.environment=prod%20eu";
        let r = resource(vars(&[("OTEL_RESOURCE_ATTRIBUTES", given)])).unwrap();
        assert_eq!(get(&r, "service.name").as_deref(), Some("from-list"));
        assert_eq!(
            get(&r, "deployment.environment").as_deref(),
            Some("prod eu")
        );
        let r = resource(vars(&[
            ("OTEL_RESOURCE_ATTRIBUTES", given),
            ("OTEL_SERVICE_NAME", "backfill"),
        ]))
        .unwrap();
        assert_eq!(get(&r, "service.name").as_deref(), Some("backfill"));
        assert_eq!(r.iter().filter(|(k, _)| k == "service.name").count(), 1);
        let err = resource(vars(&[("OTEL_RESOURCE_ATTRIBUTES", "a=1,broken")]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("OTEL_RESOURCE_ATTRIBUTES: \"broken\" is not key=value"),
            "{err}"
        );
    }

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
