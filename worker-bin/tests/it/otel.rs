//! `--otlp-endpoint` and `--log-format json` through the real binary: an OTLP/HTTP
//! receiver of the test's own decodes what a run exports (the protobuf, with
//! `opentelemetry-proto`), and a run whose collector is down finishes and counts the
//! spans it dropped on `/metrics`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

use crate::common::{self, output, scratch, tranche};
use crate::support::TestRedis;

/// An OTLP/HTTP receiver on a free port, keeping every span it is sent.
struct Receiver {
    addr: String,
    spans: Arc<Mutex<Vec<Span>>>,
    services: Arc<Mutex<Vec<String>>>,
}

impl Receiver {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let spans = Arc::new(Mutex::new(Vec::new()));
        let services = Arc::new(Mutex::new(Vec::new()));
        let (kept, named) = (spans.clone(), services.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (kept, named) = (kept.clone(), named.clone());
                std::thread::spawn(move || serve(stream, &kept, &named));
            }
        });
        Self {
            addr,
            spans,
            services,
        }
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }
}

/// Answers the requests of one connection: each body an `ExportTraceServiceRequest`.
fn serve(mut stream: TcpStream, kept: &Mutex<Vec<Span>>, named: &Mutex<Vec<String>>) {
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut buf = Vec::new();
    loop {
        // The head, up to the blank line.
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 8192];
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        assert!(head.starts_with("post /v1/traces "), "{head}");
        assert!(
            head.contains("content-type: application/x-protobuf"),
            "{head}"
        );
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map(|v| v.trim().parse().unwrap())
            .expect("a content-length");
        while buf.len() < head_end + length {
            let mut chunk = [0u8; 8192];
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let body: Vec<u8> = buf.drain(..head_end + length).skip(head_end).collect();
        let request = ExportTraceServiceRequest::decode(body.as_slice()).expect("OTLP protobuf");
        for resource in request.resource_spans {
            if let Some(r) = &resource.resource {
                for kv in &r.attributes {
                    if kv.key == "service.name"
                        && let Some(Any::StringValue(s)) =
                            kv.value.as_ref().and_then(|v| v.value.clone())
                    {
                        named.lock().unwrap().push(s);
                    }
                }
            }
            for scope in resource.scope_spans {
                kept.lock().unwrap().extend(scope.spans);
            }
        }
        let _ = stream.write_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n",
        );
    }
}

fn attribute(span: &Span, key: &str) -> Option<Any> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.clone())
}

/// A run exports one `run` span and a `partition` span per lease under it, in one
/// trace; `--log-format json` lines carry that trace's id.
#[test]
fn a_run_exports_its_spans_and_logs_carry_their_ids() {
    let redis = TestRedis::start();
    let receiver = Receiver::start();
    let dir = scratch("otel-spans");
    let url = redis.url();
    let out = output(tranche(
        &dir,
        &[
            "--redis",
            &url,
            "--log-format",
            "json",
            "--otlp-endpoint",
            &receiver.endpoint(),
            "run",
            "--min",
            "1",
            "--max",
            "10000",
            "--size",
            "1000",
            "--simulate",
            "--sim-latency",
            "1..1",
            "--sim-fail",
            "0",
        ],
    ));
    assert!(out.status.success(), "{out:?}");
    // Shutdown flushed the queue before the process exited: everything is here now.
    let spans = receiver.spans();
    let runs: Vec<&Span> = spans.iter().filter(|s| s.name == "run").collect();
    assert_eq!(runs.len(), 1, "one run span: {spans:#?}");
    let run = runs[0];
    let partitions: Vec<&Span> = spans.iter().filter(|s| s.name == "partition").collect();
    let mut pids: Vec<i64> = partitions
        .iter()
        .map(|s| match attribute(s, "pid") {
            Some(Any::IntValue(p)) => p,
            // tracing-opentelemetry sends a u64 that may not fit an i64 as text.
            Some(Any::StringValue(p)) => p.parse().expect("a decimal pid"),
            other => panic!("a partition span without its pid: {other:?}"),
        })
        .collect();
    pids.sort_unstable();
    pids.dedup();
    assert_eq!(
        pids.len(),
        10,
        "a span for each of the 10 partitions: {pids:?}"
    );
    for p in &partitions {
        assert_eq!(p.trace_id, run.trace_id, "every lease in the run's trace");
        assert_eq!(
            p.parent_span_id, run.span_id,
            "every lease under the run span"
        );
    }
    assert_eq!(
        receiver
            .services
            .lock()
            .unwrap()
            .first()
            .map(String::as_str),
        Some("tranche")
    );
    // JSON logs: every stderr line an object; those inside the run name its trace.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let trace_id: String = run.trace_id.iter().map(|b| format!("{b:02x}")).collect();
    let mut traced = 0;
    for line in stderr.lines().filter(|l| l.starts_with('{')) {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        for key in ["timestamp", "level", "target", "message"] {
            assert!(v.get(key).is_some(), "{key} missing: {line}");
        }
        if v["trace_id"] == trace_id.as_str() {
            traced += 1;
        }
    }
    assert!(
        traced > 0,
        "no log line carries the run's trace id {trace_id}:\n{stderr}"
    );
}

/// `--log-format json` without a collector: still one object a line, with no ids.
#[test]
fn json_logs_without_traces_are_objects() {
    let dir = scratch("otel-json");
    let state = dir.join("state.bin");
    let state = state.to_str().unwrap();
    let out = output(tranche(
        &dir,
        &[
            "--state",
            state,
            "--log-format",
            "json",
            "run",
            "--min",
            "1",
            "--max",
            "100",
            "--size",
            "10",
            "--simulate",
            "--sim-latency",
            "1..1",
            "--sim-fail",
            "0",
        ],
    ));
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("\"level\"")).collect();
    assert!(!lines.is_empty(), "no log line at all:\n{stderr}");
    for line in lines {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(v.get("trace_id").is_none(), "{line}");
    }
}

/// A collector that is down costs the run nothing: it finishes every partition, and
/// the spans it could not send are counted on `/metrics`.
#[test]
fn a_collector_that_is_down_drops_and_counts_spans() {
    let redis = TestRedis::start();
    let dir = scratch("otel-down");
    let url = redis.url();
    // A port nothing listens on.
    let down = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let metrics = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let metrics = metrics.to_string();
    common::ok(tranche(
        &dir,
        &[
            "--redis", &url, "plan", "--min", "1", "--max", "30000", "--size", "1000",
        ],
    ));
    let mut run = tranche(
        &dir,
        &[
            "--redis",
            &url,
            "--otlp-endpoint",
            &format!("http://{down}"),
            "run",
            "--simulate",
            "--sim-latency",
            "1..1",
            "--sim-fail",
            "0",
            "--follow",
            "--metrics-listen",
            &metrics,
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut dropped, mut completed) = (0.0, 0.0);
    while Instant::now() < deadline && (dropped == 0.0 || completed < 30.0) {
        std::thread::sleep(Duration::from_millis(200));
        let Ok(mut s) = TcpStream::connect(&metrics) else {
            continue;
        };
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut text = String::new();
        let _ = s.read_to_string(&mut text);
        let value = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        dropped = value("tranche_worker_otel_spans_dropped_total ");
        completed = value("tranche_worker_completed_total ");
        assert_eq!(value("tranche_worker_otel_spans_exported_total "), 0.0);
    }
    common::signal(&run, "TERM");
    let status = common::wait(&mut run, Duration::from_secs(30));
    let mut stderr = String::new();
    run.stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert_eq!(completed, 30.0, "every partition done:\n{stderr}");
    assert!(dropped > 0.0, "dropped spans counted:\n{stderr}");
    assert!(
        status.success() || status.code() == Some(130),
        "{status:?}\n{stderr}"
    );
    assert!(stderr.contains("spans not exported"), "{stderr}");
}
