//! A finished span as tranche keeps it, and OTLP's protobuf encoding of a batch of them
//! (`ExportTraceServiceRequest`, `opentelemetry/proto/collector/trace/v1`), written
//! straight from the span's own fields: no intermediate message per span, no string
//! allocated per attribute key (keys are the callsites' `&'static str`).
//!
//! Field numbers are the proto's; a test decodes the output with `opentelemetry-proto`.

/// An attribute's value, as OTLP's `AnyValue` carries it.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Value {
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
}

/// A key and its value; keys are field names, static.
pub(super) type Attribute = (&'static str, Value);

/// Sets `key` to `value`, in place when it is already there.
pub(super) fn set(attributes: &mut Vec<Attribute>, key: &'static str, value: Value) {
    match attributes.iter_mut().find(|(k, _)| *k == key) {
        Some((_, v)) => *v = value,
        None => attributes.push((key, value)),
    }
}

/// An event recorded on a span: its message as the name.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct SpanEvent {
    pub(super) time: u64,
    pub(super) name: String,
    pub(super) attributes: Vec<Attribute>,
}

/// A span that has ended, ready to be encoded. Times are nanoseconds since the Unix
/// epoch.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Finished {
    pub(super) trace_id: [u8; 16],
    pub(super) span_id: [u8; 8],
    /// `None` for a root.
    pub(super) parent_span_id: Option<[u8; 8]>,
    pub(super) name: &'static str,
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) attributes: Vec<Attribute>,
    pub(super) events: Vec<SpanEvent>,
    /// Other spans this one links to: (trace id, span id).
    pub(super) links: Vec<([u8; 16], [u8; 8])>,
    /// The span's status is an error with this description.
    pub(super) error: Option<String>,
}

const VARINT: u32 = 0;
const FIXED64: u32 = 1;
const LEN: u32 = 2;

/// `Span.SpanKind.SPAN_KIND_INTERNAL`.
const KIND_INTERNAL: u64 = 1;
/// `Status.StatusCode.STATUS_CODE_ERROR`.
const STATUS_ERROR: u64 = 2;

/// Appends `span` as a `ScopeSpans.spans` field (2), for [`request`] to frame.
pub(super) fn span(buf: &mut Vec<u8>, span: &Finished) {
    nested(buf, 2, |b| encode_span(b, span));
}

/// Encodes one `ExportTraceServiceRequest`: one resource (`resource`, already encoded
/// by [`resource`]), one instrumentation scope (`tranche`), and `spans`, the fields
/// [`span`] wrote.
pub(super) fn request(resource: &[u8], spans: &[u8]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(256 + resource.len() + spans.len());
    // ExportTraceServiceRequest.resource_spans = 1
    nested(&mut buf, 1, |b| {
        // ResourceSpans.resource = 1
        bytes(b, 1, resource);
        // ResourceSpans.scope_spans = 2
        nested(b, 2, |b| {
            // ScopeSpans.scope = 1: InstrumentationScope { name = 1, version = 2 }
            nested(b, 1, |b| {
                bytes(b, 1, b"tranche");
                bytes(b, 2, env!("CARGO_PKG_VERSION").as_bytes());
            });
            b.extend_from_slice(spans);
        });
    });
    buf
}

/// Encodes a `Resource`'s body (its attributes), once for the process.
pub(super) fn resource(attributes: &[(String, String)]) -> Vec<u8> {
    let mut buf = Vec::new();
    for (key, value) in attributes {
        // Resource.attributes = 1
        nested(&mut buf, 1, |b| {
            bytes(b, 1, key.as_bytes());
            nested(b, 2, |b| bytes(b, 1, value.as_bytes()));
        });
    }
    buf
}

fn encode_span(b: &mut Vec<u8>, span: &Finished) {
    bytes(b, 1, &span.trace_id);
    bytes(b, 2, &span.span_id);
    if let Some(parent) = &span.parent_span_id {
        bytes(b, 4, parent);
    }
    bytes(b, 5, span.name.as_bytes());
    varint_field(b, 6, KIND_INTERNAL);
    fixed64(b, 7, span.start);
    fixed64(b, 8, span.end);
    for attribute in &span.attributes {
        nested(b, 9, |b| key_value(b, attribute));
    }
    for event in &span.events {
        // Span.events = 11: Event { time_unix_nano = 1, name = 2, attributes = 3 }
        nested(b, 11, |b| {
            fixed64(b, 1, event.time);
            bytes(b, 2, event.name.as_bytes());
            for attribute in &event.attributes {
                nested(b, 3, |b| key_value(b, attribute));
            }
        });
    }
    for (trace_id, span_id) in &span.links {
        // Span.links = 13: Link { trace_id = 1, span_id = 2 }
        nested(b, 13, |b| {
            bytes(b, 1, trace_id);
            bytes(b, 2, span_id);
        });
    }
    if let Some(message) = &span.error {
        // Span.status = 15: Status { message = 2, code = 3 }
        nested(b, 15, |b| {
            bytes(b, 2, message.as_bytes());
            varint_field(b, 3, STATUS_ERROR);
        });
    }
}

/// `KeyValue { key = 1, value = 2 }`, the value an `AnyValue`.
fn key_value(b: &mut Vec<u8>, (key, value): &Attribute) {
    bytes(b, 1, key.as_bytes());
    nested(b, 2, |b| match value {
        Value::Str(s) => bytes(b, 1, s.as_bytes()),
        Value::Bool(v) => varint_field(b, 2, u64::from(*v)),
        // int64: two's complement, as a varint.
        Value::Int(v) => varint_field(b, 3, *v as u64),
        Value::Float(v) => fixed64(b, 4, v.to_bits()),
    });
}

fn tag(b: &mut Vec<u8>, field: u32, wire: u32) {
    varint(b, u64::from(field << 3 | wire));
}

fn varint(b: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        b.push(v as u8 | 0x80);
        v >>= 7;
    }
    b.push(v as u8);
}

fn varint_field(b: &mut Vec<u8>, field: u32, v: u64) {
    tag(b, field, VARINT);
    varint(b, v);
}

fn fixed64(b: &mut Vec<u8>, field: u32, v: u64) {
    tag(b, field, FIXED64);
    b.extend_from_slice(&v.to_le_bytes());
}

fn bytes(b: &mut Vec<u8>, field: u32, v: &[u8]) {
    tag(b, field, LEN);
    varint(b, v.len() as u64);
    b.extend_from_slice(v);
}

/// A length-delimited field whose body `body` writes in place: one byte is kept for
/// the length, and the body moved up only when its length needs more (128 bytes or
/// over), once per large message.
fn nested(b: &mut Vec<u8>, field: u32, body: impl FnOnce(&mut Vec<u8>)) {
    tag(b, field, LEN);
    let at = b.len();
    b.push(0);
    body(b);
    let len = b.len() - at - 1;
    if len < 0x80 {
        b[at] = len as u8;
        return;
    }
    let mut prefix = [0; 10];
    let mut n = 0;
    let mut v = len as u64;
    while v >= 0x80 {
        prefix[n] = v as u8 | 0x80;
        v >>= 7;
        n += 1;
    }
    prefix[n] = v as u8;
    b.splice(at..=at, prefix[..=n].iter().copied());
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
    use prost::Message as _;

    fn finished(attributes: usize) -> Finished {
        Finished {
            trace_id: [7; 16],
            span_id: [8; 8],
            parent_span_id: Some([9; 8]),
            name: "partition",
            start: 1_700_000_000_000_000_001,
            end: 1_700_000_000_123_456_789,
            attributes: (0..attributes)
                .map(|i| {
                    let value = match i % 4 {
                        0 => Value::Str("w".repeat(i * 7)),
                        1 => Value::Int(-(i as i64) * 1_000_000_007),
                        2 => Value::Float(i as f64 / 3.0),
                        _ => Value::Bool(i % 8 == 3),
                    };
                    (["pid", "worker", "ratio", "piece"][i % 4], value)
                })
                .collect(),
            events: vec![SpanEvent {
                time: 1_700_000_000_050_000_000,
                name: "waited at the gate".into(),
                attributes: vec![("waited_ms", Value::Float(2.5)), ("ids", Value::Int(100))],
            }],
            links: vec![([1; 16], [2; 8])],
            error: Some("exit status 3: boom".into()),
        }
    }

    /// Every field decodes, through the OpenTelemetry project's own generated types, to
    /// what was encoded: short and long messages (a length of one byte and of several).
    #[test]
    fn a_batch_decodes_as_otlp() {
        let resource = resource(&[
            ("service.name".into(), "tranche".into()),
            ("deployment.environment".into(), "x".repeat(300)),
        ]);
        let spans = vec![
            finished(3),
            finished(40),
            Finished {
                parent_span_id: None,
                error: None,
                events: Vec::new(),
                links: Vec::new(),
                ..finished(0)
            },
        ];
        let mut encoded = Vec::new();
        for s in &spans {
            span(&mut encoded, s);
        }
        let body = request(&resource, &encoded);
        let decoded = ExportTraceServiceRequest::decode(body.as_slice()).expect("protobuf");
        assert_eq!(decoded.resource_spans.len(), 1);
        let rs = &decoded.resource_spans[0];
        let attributes = &rs.resource.as_ref().unwrap().attributes;
        assert_eq!(attributes.len(), 2);
        assert_eq!(attributes[1].key, "deployment.environment");
        assert_eq!(
            attributes[1].value.as_ref().unwrap().value,
            Some(Any::StringValue("x".repeat(300)))
        );
        assert_eq!(rs.scope_spans.len(), 1);
        let scope = &rs.scope_spans[0];
        assert_eq!(scope.scope.as_ref().unwrap().name, "tranche");
        assert_eq!(scope.spans.len(), spans.len());
        for (got, want) in scope.spans.iter().zip(&spans) {
            assert_eq!(got.trace_id, want.trace_id);
            assert_eq!(got.span_id, want.span_id);
            assert_eq!(
                got.parent_span_id,
                want.parent_span_id.map(Vec::from).unwrap_or_default()
            );
            assert_eq!(got.name, want.name);
            assert_eq!(got.kind, 1, "internal");
            assert_eq!(
                (got.start_time_unix_nano, got.end_time_unix_nano),
                (want.start, want.end)
            );
            assert_eq!(got.attributes.len(), want.attributes.len());
            for (kv, (key, value)) in got.attributes.iter().zip(&want.attributes) {
                assert_eq!(kv.key, *key);
                let expected = match value {
                    Value::Str(s) => Any::StringValue(s.clone()),
                    Value::Int(i) => Any::IntValue(*i),
                    Value::Float(f) => Any::DoubleValue(*f),
                    Value::Bool(v) => Any::BoolValue(*v),
                };
                assert_eq!(kv.value.as_ref().unwrap().value, Some(expected));
            }
            assert_eq!(got.events.len(), want.events.len());
            for (e, w) in got.events.iter().zip(&want.events) {
                assert_eq!((e.time_unix_nano, e.name.as_str()), (w.time, &*w.name));
                assert_eq!(e.attributes.len(), w.attributes.len());
            }
            let links: Vec<_> = got
                .links
                .iter()
                .map(|l| (l.trace_id.clone(), l.span_id.clone()))
                .collect();
            let wanted: Vec<_> = want
                .links
                .iter()
                .map(|(t, s)| (t.to_vec(), s.to_vec()))
                .collect();
            assert_eq!(links, wanted);
            match &want.error {
                Some(message) => {
                    let status = got.status.as_ref().expect("a status");
                    assert_eq!((status.code, &status.message), (2, message));
                }
                None => assert!(got.status.is_none()),
            }
        }
    }

    #[test]
    fn a_set_attribute_is_replaced_in_place() {
        let mut attributes = vec![("outcome", Value::Str("a".into()))];
        set(&mut attributes, "outcome", Value::Str("done".into()));
        set(&mut attributes, "checkpoint", Value::Int(3));
        assert_eq!(
            attributes,
            vec![
                ("outcome", Value::Str("done".into())),
                ("checkpoint", Value::Int(3))
            ]
        );
    }
}
