//! The `tracing` layer that keeps what an OTLP span needs and nothing more: in each
//! span's extensions an [`Open`] record (its ids, start, attributes, events, links),
//! handed to the export queue as a [`Finished`] span when the span closes.
//!
//! Why a layer of tranche's own rather than `tracing-opentelemetry` over the
//! OpenTelemetry SDK: on the short partitions a run is made of, that pipeline built
//! each span three times (the layer's builder, the SDK's span data, the exporter's
//! protobuf message), with a string allocated per attribute key and value at each
//! step, and cost the run several times the CPU of the spans' own bookkeeping. Here a
//! field is encoded once, as it is recorded, into the bytes the request carries
//! ([`SpanAttributes`]), and the span's end copies them into the export queue's batch
//! (`super::otlp`).
//!
//! Trace ids follow OpenTelemetry's rules: a span with a parent that this layer
//! records is in its parent's trace and shares its sampling decision; a root gets a
//! random trace id, kept by the `TraceIdRatioBased` rule at the run's ratio. A
//! partition's span is then moved into its partition's derived trace
//! ([`Propagate`](super::Propagate), through [`with_open`]).

use std::cell::Cell;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

use super::otlp::{EventAttributes, Finished, SpanAttributes, SpanEvent, Value};

/// A span being recorded, kept in its extensions until it closes.
#[derive(Debug)]
pub(super) struct Open {
    pub(super) trace_id: [u8; 16],
    pub(super) span_id: [u8; 8],
    pub(super) parent_span_id: Option<[u8; 8]>,
    /// Whether the span is exported; an unsampled span still carries its ids, for its
    /// children and its chunk's `TRACEPARENT` (flags `00`).
    pub(super) sampled: bool,
    start: u64,
    attributes: SpanAttributes,
    /// The fields recorded so far, by their index in the callsite's field set: one
    /// recorded again is replaced, the others appended.
    recorded: u64,
    events: Vec<SpanEvent>,
    pub(super) links: Vec<([u8; 16], [u8; 8])>,
    error: Option<String>,
}

/// Where a finished span goes: the export queue (which never blocks).
pub(super) trait Sink: Send + Sync + 'static {
    /// Takes a finished, sampled span.
    fn send(&self, span: Finished);
}

/// The layer: records spans into [`Open`] and sends them to `sink` as they close.
pub(super) struct Spans<K> {
    /// The share of root traces kept, 0 to 1.
    pub(super) ratio: f64,
    pub(super) sink: K,
}

impl<S, K> tracing_subscriber::Layer<S> for Spans<K>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    K: Sink,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let parent = span.parent().and_then(|parent| {
            parent
                .extensions()
                .get::<Open>()
                .map(|p| (p.trace_id, p.span_id, p.sampled))
        });
        let (trace_id, parent_span_id, sampled) = match parent {
            Some((trace_id, span_id, sampled)) => (trace_id, Some(span_id), sampled),
            None => {
                let trace_id = random_trace_id();
                let sampled = crate::trace::trace_id_ratio(trace_id, self.ratio);
                (trace_id, None, sampled)
            }
        };
        let mut open = Open {
            trace_id,
            span_id: random_span_id(),
            parent_span_id,
            sampled,
            start: now(),
            attributes: SpanAttributes::with_capacity(attrs.fields().len()),
            recorded: 0,
            events: Vec::new(),
            links: Vec::new(),
            error: None,
        };
        // Recorded even when not sampled: a partition's span, under a `run` span that
        // was not, is kept by its own trace's rule ([`super::Propagate`]).
        attrs.record(&mut Fields(&mut open));
        span.extensions_mut().insert(open);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut extensions = span.extensions_mut();
        if let Some(open) = extensions.get_mut::<Open>() {
            values.record(&mut Fields(open));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.event_span(event) else {
            return;
        };
        let mut extensions = span.extensions_mut();
        let Some(open) = extensions.get_mut::<Open>().filter(|o| o.sampled) else {
            return;
        };
        let mut recorded = SpanEvent {
            time: now(),
            name: String::new(),
            attributes: EventAttributes::with_capacity(event.metadata().fields().len() + 1),
        };
        recorded
            .attributes
            .push("level", Value::Str(event.metadata().level().as_str()));
        event.record(&mut Fields(&mut recorded));
        open.events.push(recorded);
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let Some(open) = span.extensions_mut().remove::<Open>() else {
            return;
        };
        if !open.sampled {
            return;
        }
        self.sink.send(Finished {
            trace_id: open.trace_id,
            span_id: open.span_id,
            parent_span_id: open.parent_span_id,
            name: span.name(),
            start: open.start,
            end: now(),
            attributes: open.attributes,
            events: open.events,
            links: open.links,
            error: open.error,
        });
    }
}

/// Runs `f` on `span`'s record, if this layer records it (the process's subscriber is
/// built on a `Registry`, where the layer keeps it).
pub(super) fn with_open<R>(span: &tracing::Span, f: impl FnOnce(&mut Open) -> R) -> Option<R> {
    span.with_subscriber(|(id, dispatch)| {
        let registry = dispatch.downcast_ref::<tracing_subscriber::Registry>()?;
        let data = registry.span(id)?;
        let mut extensions = data.extensions_mut();
        extensions.get_mut::<Open>().map(f)
    })
    .flatten()
}

/// Where a visited field goes: a span's record or an event's.
trait Put {
    fn put(&mut self, field: &Field, value: Value<'_>);
}

/// A span's fields are its attributes; `otel.status_description` is its error status,
/// other `otel.` fields are directions to `tracing-opentelemetry` and left out.
impl Put for Open {
    fn put(&mut self, field: &Field, value: Value<'_>) {
        let name = field.name();
        if name == "otel.status_description" {
            self.error = Some(match value {
                Value::Str(s) => s.to_owned(),
                other => format!("{other:?}"),
            });
        } else if !name.starts_with("otel.") {
            // A callsite has at most 32 fields (`tracing`'s bound).
            let bit = 1u64 << (field.index() % 64);
            if self.recorded & bit == 0 {
                self.recorded |= bit;
                self.attributes.push(name, value);
            } else {
                self.attributes.set(name, value);
            }
        }
    }
}

/// An event's `message` is its name, the rest of its fields its attributes.
impl Put for SpanEvent {
    fn put(&mut self, field: &Field, value: Value<'_>) {
        match field.name() {
            "message" => self.name = format!("{value:?}"),
            name => self.attributes.push(name, value),
        }
    }
}

/// Visits fields into a span's record or an event, typed.
struct Fields<'a, T>(&'a mut T);

impl<T: Put> Visit for Fields<'_, T> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.put(field, Value::Text(value));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.put(field, Value::Str(value));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.put(field, Value::Int(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        // OTLP's integers are signed: beyond `i64::MAX`, the decimal text.
        match i64::try_from(value) {
            Ok(v) => self.0.put(field, Value::Int(v)),
            Err(_) => self.0.put(field, Value::Text(&value)),
        }
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.put(field, Value::Float(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.put(field, Value::Bool(value));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0.put(field, Value::Text(&format_args!("{value}")));
    }
}

/// Nanoseconds since the Unix epoch.
fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

thread_local! {
    /// A xorshift64* state per thread, seeded from the process's random hasher keys.
    static RNG: Cell<u64> = Cell::new({
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(now());
        h.finish() | 1
    });
}

/// 64 random bits, never 0 (ids of 0 are invalid).
fn random_u64() -> u64 {
    RNG.with(|state| {
        loop {
            let mut x = state.get();
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            state.set(x);
            let out = x.wrapping_mul(0x2545_f491_4f6c_dd1d);
            if out != 0 {
                return out;
            }
        }
    })
}

fn random_span_id() -> [u8; 8] {
    random_u64().to_be_bytes()
}

fn random_trace_id() -> [u8; 16] {
    let mut id = [0; 16];
    id[..8].copy_from_slice(&random_u64().to_be_bytes());
    id[8..].copy_from_slice(&random_u64().to_be_bytes());
    id
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::layer::SubscriberExt as _;

    #[derive(Clone, Default)]
    struct Kept(Arc<Mutex<Vec<Finished>>>);

    impl Sink for Kept {
        fn send(&self, span: Finished) {
            self.0.lock().unwrap().push(span);
        }
    }

    fn attribute(span: &Finished, key: &str) -> Option<Any> {
        super::super::otlp::tests::attribute(&span.attributes, key)
    }

    /// A tree of spans: each child in its parent's trace under its parent's id, fields
    /// typed, fields recorded later kept, the error status taken from
    /// `otel.status_description`, events attached to their span.
    #[test]
    fn spans_are_recorded_as_otlp_wants_them() {
        let kept = Kept::default();
        let subscriber = tracing_subscriber::registry().with(Spans {
            ratio: 1.0,
            sink: kept.clone(),
        });
        tracing::subscriber::with_default(subscriber, || {
            let outer = tracing::info_span!("partition", pid = 7u64, worker = %"w-1", big = u64::MAX, outcome = tracing::field::Empty, otel.status_description = tracing::field::Empty);
            outer.in_scope(|| {
                let inner = tracing::info_span!("chunk", from = 1, to = 100, ok = true);
                inner.in_scope(|| tracing::info!(waited_ms = 2.5, "waited at the gate"));
            });
            outer.record("outcome", "released");
            outer.record("outcome", "failed");
            outer.record("otel.status_description", "exit status 3: boom");
        });
        let spans = kept.0.lock().unwrap();
        assert_eq!(spans.len(), 2);
        let (chunk, partition) = (&spans[0], &spans[1]);
        assert_eq!((chunk.name, partition.name), ("chunk", "partition"));
        assert_eq!(chunk.trace_id, partition.trace_id);
        assert_eq!(chunk.parent_span_id, Some(partition.span_id));
        assert_eq!(partition.parent_span_id, None);
        assert_ne!(chunk.span_id, partition.span_id);
        assert!(partition.start <= chunk.start && chunk.end <= partition.end);
        assert_eq!(attribute(partition, "pid"), Some(Any::IntValue(7)));
        assert_eq!(
            attribute(partition, "worker"),
            Some(Any::StringValue("w-1".into()))
        );
        assert_eq!(
            attribute(partition, "big"),
            Some(Any::StringValue(u64::MAX.to_string()))
        );
        assert_eq!(
            attribute(partition, "outcome"),
            Some(Any::StringValue("failed".into()))
        );
        assert_eq!(attribute(partition, "otel.status_description"), None);
        assert_eq!(partition.error.as_deref(), Some("exit status 3: boom"));
        assert_eq!(attribute(chunk, "ok"), Some(Any::BoolValue(true)));
        assert_eq!(chunk.events.len(), 1);
        assert_eq!(chunk.events[0].name, "waited at the gate");
        assert_eq!(
            super::super::otlp::tests::attributes_of(&chunk.events[0].attributes),
            [
                ("level".to_owned(), Any::StringValue("INFO".into())),
                ("waited_ms".to_owned(), Any::DoubleValue(2.5))
            ]
        );
        assert!(partition.events.is_empty());
    }

    /// A root is kept by the ratio rule on its random trace id: none at 0, and its
    /// children with it; an unsampled span still has ids, for its chunk's context.
    #[test]
    fn an_unsampled_root_exports_nothing_but_keeps_its_ids() {
        let kept = Kept::default();
        let subscriber = tracing_subscriber::registry().with(Spans {
            ratio: 0.0,
            sink: kept.clone(),
        });
        tracing::subscriber::with_default(subscriber, || {
            let root = tracing::info_span!("run");
            let ids = with_open(&root, |o| (o.trace_id, o.sampled));
            let (trace_id, sampled) = ids.expect("recorded");
            assert!(!sampled && trace_id != [0; 16]);
            root.in_scope(|| {
                let child = tracing::info_span!("chunk");
                assert_eq!(with_open(&child, |o| o.trace_id), Some(trace_id));
                // A partition's span is kept by its own trace's rule, whatever its
                // run's: its fields are there when it is.
                let partition = tracing::info_span!("partition", pid = 3u64);
                with_open(&partition, |o| o.sampled = true).expect("recorded");
            });
        });
        let kept = kept.0.lock().unwrap();
        assert_eq!(kept.len(), 1, "the partition alone: {kept:?}");
        assert_eq!(attribute(&kept[0], "pid"), Some(Any::IntValue(3)));
    }

    #[test]
    fn random_ids_are_never_zero_and_differ() {
        let ids: std::collections::HashSet<u64> = (0..10_000).map(|_| random_u64()).collect();
        assert_eq!(ids.len(), 10_000);
        assert!(!ids.contains(&0));
    }
}
