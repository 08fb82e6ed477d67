//! A finished span as tranche keeps it, and OTLP's protobuf encoding of a batch of them
//! (`ExportTraceServiceRequest`, `opentelemetry/proto/collector/trace/v1`), written
//! straight from the span's own fields: no intermediate message per span, no string
//! allocated per attribute key or value.
//!
//! A span's attributes are encoded as they are recorded ([`Attributes`]), into the
//! bytes that go on the wire, so that a span's end is a copy; a field recorded again
//! replaces its earlier value there.
//!
//! Field numbers are the proto's; a test decodes the output with `opentelemetry-proto`.

use std::fmt;

/// An attribute's value as a field hands it over, borrowed: OTLP's `AnyValue`.
#[derive(Clone, Copy)]
pub(super) enum Value<'a> {
    Str(&'a str),
    /// Text written by the value's `Debug` (a `%` field's `Display`, a `u64` beyond
    /// `i64::MAX`, an error's message).
    Text(&'a dyn fmt::Debug),
    Int(i64),
    Float(f64),
    Bool(bool),
}

/// The value as the text OTLP would show for it: a string unquoted.
impl fmt::Debug for Value<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Str(s) => f.write_str(s),
            Self::Text(d) => d.fmt(f),
            Self::Int(v) => v.fmt(f),
            Self::Float(v) => v.fmt(f),
            Self::Bool(v) => v.fmt(f),
        }
    }
}

/// Attributes as encoded `KeyValue` fields, numbered `FIELD` (9 in a `Span`, 3 in an
/// `Event`), ready to be copied into a span's message.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Attributes<const FIELD: u32> {
    encoded: Vec<u8>,
}

/// A span's attributes (`Span.attributes`).
pub(super) type SpanAttributes = Attributes<9>;
/// An event's attributes (`Span.Event.attributes`).
pub(super) type EventAttributes = Attributes<3>;

impl<const FIELD: u32> Attributes<FIELD> {
    /// Room for about `n` attributes without growing.
    pub(super) fn with_capacity(n: usize) -> Self {
        Self {
            encoded: Vec::with_capacity(n * 28),
        }
    }

    /// Appends `key`, known not to be there yet.
    pub(super) fn push(&mut self, key: &str, value: Value<'_>) {
        let b = &mut self.encoded;
        nested(b, FIELD, |b| key_value(b, key, value));
    }

    /// Sets `key` to `value`: in place of its earlier value when it is there.
    pub(super) fn set(&mut self, key: &str, value: Value<'_>) {
        match self.find(key) {
            None => self.push(key, value),
            Some(at) => {
                let mut one = Vec::new();
                nested(&mut one, FIELD, |b| key_value(b, key, value));
                self.encoded.splice(at, one);
            }
        }
    }

    /// Where `key`'s field is in the encoded bytes, if there.
    fn find(&self, key: &str) -> Option<std::ops::Range<usize>> {
        let b = &self.encoded;
        let mut at = 0;
        while at < b.len() {
            let (_tag, body) = read_varint(b, at);
            let (len, body) = read_varint(b, body);
            let end = body + len as usize;
            // KeyValue.key = 1, a length-delimited field first.
            let (_tag, k) = read_varint(b, body);
            let (klen, k) = read_varint(b, k);
            if &b[k..k + klen as usize] == key.as_bytes() {
                return Some(at..end);
            }
            at = end;
        }
        None
    }

    /// The encoded fields.
    pub(super) fn as_bytes(&self) -> &[u8] {
        &self.encoded
    }
}

/// An event recorded on a span: its message as the name.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct SpanEvent {
    pub(super) time: u64,
    pub(super) name: String,
    pub(super) attributes: EventAttributes,
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
    pub(super) attributes: SpanAttributes,
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
    b.extend_from_slice(span.attributes.as_bytes());
    for event in &span.events {
        // Span.events = 11: Event { time_unix_nano = 1, name = 2, attributes = 3 }
        nested(b, 11, |b| {
            fixed64(b, 1, event.time);
            bytes(b, 2, event.name.as_bytes());
            b.extend_from_slice(event.attributes.as_bytes());
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
fn key_value(b: &mut Vec<u8>, key: &str, value: Value<'_>) {
    bytes(b, 1, key.as_bytes());
    nested(b, 2, |b| match value {
        Value::Str(s) => bytes(b, 1, s.as_bytes()),
        Value::Text(d) => nested(b, 1, |b| {
            use std::io::Write as _;
            // Writing to a Vec fails only where a `Debug` does; what it wrote stays.
            let _ = write!(b, "{d:?}");
        }),
        Value::Bool(v) => varint_field(b, 2, u64::from(v)),
        // int64: two's complement, as a varint.
        Value::Int(v) => varint_field(b, 3, v as u64),
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

/// The varint at `at` in `b` (bytes this module wrote), and where what follows starts.
fn read_varint(b: &[u8], mut at: usize) -> (u64, usize) {
    let mut v = 0;
    let mut shift = 0;
    loop {
        let byte = b[at];
        at += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return (v, at);
        }
        shift += 7;
    }
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
pub(super) mod tests {
    use super::*;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
    use opentelemetry_proto::tonic::trace::v1::{Span, span};
    use prost::Message as _;

    /// The attributes as OpenTelemetry's own types decode them: encoded attributes are
    /// a `Span` (field 9) or an `Event` (field 3) with nothing else set.
    pub(in super::super) fn attributes_of<const FIELD: u32>(
        attributes: &Attributes<FIELD>,
    ) -> Vec<(String, Any)> {
        let bytes = attributes.as_bytes();
        let kvs = match FIELD {
            9 => Span::decode(bytes).expect("protobuf").attributes,
            3 => span::Event::decode(bytes).expect("protobuf").attributes,
            other => panic!("attributes of field {other}"),
        };
        kvs.into_iter()
            .map(|kv| (kv.key, kv.value.and_then(|v| v.value).expect("a value")))
            .collect()
    }

    /// The value of `key` in `attributes`, decoded.
    pub(in super::super) fn attribute(attributes: &SpanAttributes, key: &str) -> Option<Any> {
        attributes_of(attributes)
            .into_iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }

    /// What `value` decodes to.
    fn any(value: Value<'_>) -> Any {
        match value {
            Value::Str(s) => Any::StringValue(s.to_owned()),
            Value::Text(d) => Any::StringValue(format!("{d:?}")),
            Value::Int(i) => Any::IntValue(i),
            Value::Float(f) => Any::DoubleValue(f),
            Value::Bool(v) => Any::BoolValue(v),
        }
    }

    fn values(i: usize, long: &str) -> (&'static str, Value<'_>) {
        let value = match i % 5 {
            0 => Value::Str(&long[..i * 7]),
            1 => Value::Int(-(i as i64) * 1_000_000_007),
            2 => Value::Float(i as f64 / 3.0),
            3 => Value::Bool(i % 8 == 3),
            _ => Value::Text(&u64::MAX),
        };
        (["pid", "worker", "ratio", "piece", "big"][i % 5], value)
    }

    fn finished(attributes: usize) -> Finished {
        Finished {
            trace_id: [7; 16],
            span_id: [8; 8],
            parent_span_id: Some([9; 8]),
            name: "partition",
            start: 1_700_000_000_000_000_001,
            end: 1_700_000_000_123_456_789,
            attributes: {
                let long = "w".repeat(attributes * 7);
                let mut a = SpanAttributes::with_capacity(attributes);
                for i in 0..attributes {
                    let (key, value) = values(i, &long);
                    a.push(key, value);
                }
                a
            },
            events: vec![SpanEvent {
                time: 1_700_000_000_050_000_000,
                name: "waited at the gate".into(),
                attributes: {
                    let mut a = EventAttributes::default();
                    a.push("waited_ms", Value::Float(2.5));
                    a.push("ids", Value::Int(100));
                    a
                },
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
            let n = attributes_of(&want.attributes).len();
            assert_eq!(got.attributes.len(), n);
            let long = "w".repeat(n * 7);
            for (i, kv) in got.attributes.iter().enumerate() {
                let (key, value) = values(i, &long);
                assert_eq!(kv.key, key);
                assert_eq!(kv.value.as_ref().unwrap().value, Some(any(value)));
            }
            assert_eq!(got.events.len(), want.events.len());
            for (e, w) in got.events.iter().zip(&want.events) {
                assert_eq!((e.time_unix_nano, e.name.as_str()), (w.time, &*w.name));
                let kept: Vec<_> = e
                    .attributes
                    .iter()
                    .map(|kv| (kv.key.as_str(), kv.value.as_ref().unwrap().value.clone()))
                    .collect();
                assert_eq!(
                    kept,
                    [
                        ("waited_ms", Some(Any::DoubleValue(2.5))),
                        ("ids", Some(Any::IntValue(100)))
                    ]
                );
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

    /// A field recorded again replaces its value where it was, short or long, and the
    /// others stay as they were.
    #[test]
    fn a_set_attribute_is_replaced_in_place() {
        let mut a = SpanAttributes::default();
        a.set("outcome", Value::Str("a"));
        a.set("pid", Value::Int(7));
        let long = "x".repeat(200);
        a.set("outcome", Value::Str(&long));
        a.set("checkpoint", Value::Int(3));
        a.set("pid", Value::Text(&u64::MAX));
        a.set("outcome", Value::Str("done"));
        assert_eq!(
            attributes_of(&a),
            [
                ("outcome".to_owned(), Any::StringValue("done".into())),
                ("pid".to_owned(), Any::StringValue(u64::MAX.to_string())),
                ("checkpoint".to_owned(), Any::IntValue(3)),
            ]
        );
    }
}
