//! `--otlp-endpoint` and `--log-format json` through the real binary: an OTLP/HTTP
//! receiver of the test's own decodes what a run exports (the protobuf, with
//! `opentelemetry-proto`), and a run whose collector is down finishes and counts the
//! spans it dropped on `/metrics`. Head sampling keeps exactly the partitions whose
//! derived trace id passes the ratio rule, every attempt on every worker; an https
//! collector is reached with the CA of `OTEL_EXPORTER_OTLP_CERTIFICATE`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

use crate::common::{self, LoggedChild, output, scratch, tranche};
use crate::support::TestRedis;

/// An OTLP/HTTP receiver on a free port, keeping every span it is sent.
struct Receiver {
    addr: String,
    spans: Arc<Mutex<Vec<Span>>>,
    services: Arc<Mutex<Vec<String>>>,
    /// Each request's head, lower-cased.
    heads: Arc<Mutex<Vec<String>>>,
}

impl Receiver {
    fn start() -> Self {
        Self::listen("http", |tcp| tcp)
    }

    /// An https receiver with the certificate and key of these PEM files.
    fn start_tls(cert: &std::path::Path, key: &std::path::Path) -> Self {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs = CertificateDer::pem_file_iter(cert)
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(key).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
        let config = Arc::new(config);
        Self::listen("https", move |tcp| {
            let conn = rustls::ServerConnection::new(config.clone()).unwrap();
            rustls::StreamOwned::new(conn, tcp)
        })
    }

    fn listen<S: Read + Write + Send + 'static>(
        scheme: &'static str,
        wrap: impl Fn(TcpStream) -> S + Send + 'static,
    ) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = format!("{scheme}://{}", listener.local_addr().unwrap());
        let spans = Arc::new(Mutex::new(Vec::new()));
        let services = Arc::new(Mutex::new(Vec::new()));
        let heads = Arc::new(Mutex::new(Vec::new()));
        let (kept, named, seen) = (spans.clone(), services.clone(), heads.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                stream
                    .set_read_timeout(Some(Duration::from_secs(30)))
                    .unwrap();
                let stream = wrap(stream);
                let (kept, named, seen) = (kept.clone(), named.clone(), seen.clone());
                std::thread::spawn(move || serve(stream, &kept, &named, &seen));
            }
        });
        Self {
            addr,
            spans,
            services,
            heads,
        }
    }

    fn endpoint(&self) -> String {
        self.addr.clone()
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }
}

/// Answers the requests of one connection: each body an `ExportTraceServiceRequest`.
fn serve(
    mut stream: impl Read + Write,
    kept: &Mutex<Vec<Span>>,
    named: &Mutex<Vec<String>>,
    heads: &Mutex<Vec<String>>,
) {
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
        heads.lock().unwrap().push(head.clone());
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

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An integer attribute (a u64 that does not fit an i64 is sent as text).
fn int(span: &Span, key: &str) -> Option<i64> {
    match attribute(span, key)? {
        Any::IntValue(v) => Some(v),
        Any::StringValue(v) => v.parse().ok(),
        _ => None,
    }
}

fn text(span: &Span, key: &str) -> Option<String> {
    match attribute(span, key)? {
        Any::StringValue(v) => Some(v),
        _ => None,
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
            "--chunk",
            "100",
            // 10,000 IDs at 20,000 a second: chunks wait at the gate.
            "--max-rate",
            "20000",
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
        .map(|s| int(s, "pid").expect("a partition span with its pid"))
        .collect();
    pids.sort_unstable();
    pids.dedup();
    assert_eq!(
        pids.len(),
        10,
        "a span for each of the 10 partitions: {pids:?}"
    );
    // Each partition its own trace, linked to the run that ran it.
    let mut traces: Vec<&[u8]> = Vec::new();
    for p in &partitions {
        assert_ne!(p.trace_id, run.trace_id, "a partition's trace is its own");
        assert!(
            p.links
                .iter()
                .any(|l| l.trace_id == run.trace_id && l.span_id == run.span_id),
            "every lease linked to its run: {p:#?}"
        );
        traces.push(&p.trace_id);
    }
    traces.sort_unstable();
    traces.dedup();
    assert_eq!(traces.len(), 10, "one trace per partition");
    // The rate limit's waits are events on the partitions' spans.
    let waits = partitions
        .iter()
        .flat_map(|p| &p.events)
        .filter(|e| e.name.starts_with("waited at the gate"))
        .count();
    assert!(waits > 0, "no wait at the gate recorded");
    // Every chunk under its partition's span, in its trace.
    let chunks: Vec<&Span> = spans.iter().filter(|s| s.name == "chunk").collect();
    assert_eq!(
        chunks.len(),
        10 * 1000 / 100,
        "one span per chunk (100 IDs each)"
    );
    for c in &chunks {
        let parent = partitions
            .iter()
            .find(|p| p.span_id == c.parent_span_id)
            .expect("a chunk under a partition span");
        assert_eq!(c.trace_id, parent.trace_id);
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
    let ids: Vec<String> = spans.iter().map(|s| hex(&s.trace_id)).collect();
    let mut traced = 0;
    for line in stderr.lines().filter(|l| l.starts_with('{')) {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        for key in ["timestamp", "level", "target", "message"] {
            assert!(v.get(key).is_some(), "{key} missing: {line}");
        }
        if let Some(id) = v["trace_id"].as_str() {
            assert!(ids.iter().any(|t| t == id), "an unknown trace: {line}");
            traced += 1;
        }
    }
    assert!(traced > 0, "no log line carries a trace id:\n{stderr}");
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
    let mut run = LoggedChild::spawn(
        &mut tranche(
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
        ),
        &dir,
        "run",
    );
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
    common::signal(&run.child, "TERM");
    let status = run.wait(Duration::from_secs(30));
    let stderr = run.stderr();
    assert_eq!(completed, 30.0, "every partition done:\n{stderr}");
    assert!(dropped > 0.0, "dropped spans counted:\n{stderr}");
    assert!(
        status.success() || status.code() == Some(130),
        "{status:?}\n{stderr}"
    );
    assert!(stderr.contains("spans not exported"), "{stderr}");
}

/// The trace of a partition across the fleet: two workers on one Redis, a chunk
/// command that writes the `TRACEPARENT` it was given, one worker SIGKILLed mid-run and
/// one failed attempt. Every partition has one trace, whichever worker ran which
/// attempt; each chunk's `TRACEPARENT` names its own `chunk` span; the failed attempt
/// carries its error; the surviving worker dropped no span.
#[test]
fn a_partition_keeps_one_trace_across_workers_and_attempts() {
    let redis = TestRedis::start();
    let receiver = Receiver::start();
    let dir = scratch("otel-fleet");
    let url = redis.url();
    let endpoint = receiver.endpoint();
    let lines = dir.join("traceparents");
    common::ok(tranche(
        &dir,
        &[
            "--redis", &url, "plan", "--min", "1", "--max", "16000", "--size", "1000",
        ],
    ));
    // The first chunk worker b runs fails once (`mkdir` is the once); every chunk
    // writes `worker pid chunk attempt traceparent` when it is done.
    let exec = format!(
        "if [ \"$W\" = b ] && mkdir {failed} 2>/dev/null; then echo boom >&2; exit 3; fi; \
         sleep 0.2; echo \"$W $TRANCHE_PID $TRANCHE_CHUNK $TRANCHE_ATTEMPT $TRACEPARENT\" >> {lines}",
        failed = dir.join("failed").display(),
        lines = lines.display(),
    );
    let worker = |name: &str| {
        let mut cmd = tranche(
            &dir,
            &[
                "--redis",
                &url,
                "--otlp-endpoint",
                &endpoint,
                "run",
                "--exec",
                &exec,
                "--worker-id",
                name,
                "--concurrency",
                "2",
                "--chunk",
                "250",
                "--parallel",
                "1",
                "--lease",
                "2s",
                "--backoff",
                "100ms",
                "--no-split",
            ],
        );
        cmd.env("W", name).stdin(Stdio::null());
        LoggedChild::spawn(&mut cmd, &dir, name)
    };
    let mut a = worker("a");
    let mut b = worker("b");
    // Kill `a` once it has exported a whole partition and is half way through another
    // (chunk 0 or 1 of 4 written, no span for it yet): that one is b's to finish.
    common::eventually(Duration::from_secs(60), "a half way through", || {
        let spans = receiver.spans();
        let exported = |pid: &str| {
            spans.iter().any(|s| {
                s.name == "partition"
                    && text(s, "worker").as_deref() == Some("a")
                    && int(s, "pid").map(|p| p.to_string()).as_deref() == Some(pid)
            })
        };
        let written = std::fs::read_to_string(&lines).unwrap_or_default();
        spans.iter().any(|s| s.name == "partition")
            && written.lines().any(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                w.len() == 5 && w[0] == "a" && (w[2] == "0" || w[2] == "1") && !exported(w[1])
            })
            && spans
                .iter()
                .any(|s| s.name == "partition" && text(s, "worker").as_deref() == Some("a"))
    });
    common::signal(&a.child, "KILL");
    a.wait(Duration::from_secs(10));
    let status = b.wait(common::OUTPUT_LIMIT);
    let stderr = b.stderr();
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.contains("span export ended") && stderr.contains("dropped=0"),
        "b dropped no span:\n{stderr}"
    );

    let spans = receiver.spans();
    let partitions: Vec<&Span> = spans.iter().filter(|s| s.name == "partition").collect();
    // One trace per partition, the same for every attempt on any worker, each attempt
    // under the partition's one (unexported) root.
    let mut trace_of = std::collections::BTreeMap::new();
    for p in &partitions {
        let pid = int(p, "pid").unwrap();
        let (trace, root) = trace_of
            .entry(pid)
            .or_insert((p.trace_id.clone(), p.parent_span_id.clone()));
        assert_eq!(
            (&p.trace_id, &p.parent_span_id),
            (&*trace, &*root),
            "pid {pid}"
        );
        assert!(text(p, "worker").is_some(), "each attempt names its worker");
    }
    let mut traces: Vec<_> = trace_of.values().map(|(t, _)| t.clone()).collect();
    traces.sort_unstable();
    traces.dedup();
    assert_eq!(
        traces.len(),
        trace_of.len(),
        "no two partitions share a trace"
    );

    // The failed attempt: its error on its span, and the retry's span in its trace.
    let failed: Vec<&&Span> = partitions
        .iter()
        .filter(|p| text(p, "outcome").as_deref() == Some("failed"))
        .collect();
    assert_eq!(failed.len(), 1, "{failed:#?}");
    let failed = failed[0];
    let error = text(failed, "error").unwrap_or_default();
    assert!(error.contains("exit status 3: boom"), "{error}");
    assert_eq!(
        failed.status.as_ref().map(|s| s.code),
        Some(2),
        "the span's status is an error"
    );
    let pid = int(failed, "pid").unwrap();
    assert!(
        partitions.iter().any(|p| int(p, "pid") == Some(pid)
            && text(p, "outcome").as_deref() == Some("done")
            && p.trace_id == failed.trace_id
            && int(p, "attempt") > int(failed, "attempt")),
        "the retry of pid {pid} is in the failed attempt's trace"
    );
    let failed_chunk = spans
        .iter()
        .find(|s| s.name == "chunk" && s.parent_span_id == failed.span_id)
        .expect("the failed chunk's span");
    assert_eq!(int(failed_chunk, "exit_status"), Some(3));
    assert!(int(failed_chunk, "stderr_bytes").unwrap() >= 4);

    // Each TRACEPARENT names its chunk's span; b's all exported.
    let text_lines = std::fs::read_to_string(&lines).unwrap();
    let mut by_pid: std::collections::BTreeMap<i64, Vec<(String, String)>> = Default::default();
    let mut matched_a = 0;
    for line in text_lines.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        let [who, pid, _chunk, _attempt, tp] = w[..] else {
            panic!("{line}")
        };
        let pid: i64 = pid.parse().unwrap();
        let parts: Vec<&str> = tp.split('-').collect();
        assert_eq!((parts.len(), parts[0], parts[3]), (4, "00", "01"), "{tp}");
        let (trace, span) = (parts[1], parts[2]);
        by_pid
            .entry(pid)
            .or_default()
            .push((who.to_owned(), trace.to_owned()));
        let chunk = spans
            .iter()
            .find(|s| s.name == "chunk" && hex(&s.span_id) == span);
        match (who, chunk) {
            (_, Some(c)) => {
                assert_eq!(hex(&c.trace_id), trace, "{line}");
                match partitions.iter().find(|p| p.span_id == c.parent_span_id) {
                    Some(parent) => assert_eq!(int(parent, "pid"), Some(pid), "{line}"),
                    // The attempt a was running when it was killed: its span never
                    // ended, so never went out; its chunks' did.
                    None => assert_eq!(who, "a", "no partition span over {line}"),
                }
                matched_a += usize::from(who == "a");
            }
            ("b", None) => panic!("b's chunk span not exported: {line}"),
            // Killed before its span was sent.
            (_, None) => {}
        }
        assert_eq!(
            hex(&trace_of[&pid].0),
            trace,
            "pid {pid}'s chunks in its trace: {line}"
        );
    }
    assert!(
        matched_a > 0,
        "some of a's chunk spans went out before the kill"
    );
    // A partition a held when it died was finished by b, in the same trace.
    assert!(
        by_pid.values().any(|ws| {
            ws.iter().any(|(w, _)| w == "a")
                && ws.iter().any(|(w, _)| w == "b")
                && ws.iter().all(|(_, t)| *t == ws[0].1)
        }),
        "a partition run on both workers: {by_pid:#?}"
    );
}

/// Whether a trace id (hex) passes OpenTelemetry's `TraceIdRatioBased` rule at `ratio`,
/// written again here from the rule's definition: the low 8 bytes, shifted right once,
/// below `ratio * 2^63`.
fn passes(trace: &str, ratio: f64) -> bool {
    let low = u64::from_str_radix(&trace[16..], 16).unwrap();
    ratio >= 1.0 || (low >> 1) < (ratio * (1u64 << 63) as f64) as u64
}

/// The lines a chunk command writes: `worker pid attempt traceparent`, split, with the
/// traceparent's trace, span and flags.
struct Written {
    worker: String,
    pid: i64,
    attempt: i64,
    trace: String,
    span: String,
    flags: String,
}

fn written(path: &std::path::Path) -> Vec<Written> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|line| {
            let w: Vec<&str> = line.split_whitespace().collect();
            let [worker, pid, attempt, tp] = w[..] else {
                panic!("{line}")
            };
            let parts: Vec<&str> = tp.split('-').collect();
            assert_eq!((parts.len(), parts[0]), (4, "00"), "{line}");
            assert_eq!((parts[1].len(), parts[2].len()), (32, 16), "{line}");
            Written {
                worker: worker.to_owned(),
                pid: pid.parse().unwrap(),
                attempt: attempt.parse().unwrap(),
                trace: parts[1].to_owned(),
                span: parts[2].to_owned(),
                flags: parts[3].to_owned(),
            }
        })
        .collect()
}

/// Head sampling over a fleet: 40 one-chunk partitions, two workers (one sampling by
/// `--trace-sample 0.5`, the other by `OTEL_TRACES_SAMPLER=traceidratio` and
/// `OTEL_TRACES_SAMPLER_ARG=0.5`), the first attempt of every even pid failing. Exactly
/// the partitions whose derived trace id passes the rule are exported, every attempt of
/// each with its chunk; the others build no span, and their chunks get the partition's
/// trace with flags `00`.
#[test]
fn sampling_keeps_exactly_the_partitions_whose_trace_passes() {
    let redis = TestRedis::start();
    let receiver = Receiver::start();
    let dir = scratch("otel-sample");
    let url = redis.url();
    let endpoint = receiver.endpoint();
    let lines = dir.join("traceparents");
    common::ok(tranche(
        &dir,
        &[
            "--redis", &url, "plan", "--min", "1", "--max", "4000", "--size", "100",
        ],
    ));
    let exec = format!(
        "echo \"$W $TRANCHE_PID $TRANCHE_ATTEMPT $TRACEPARENT\" >> {lines}; sleep 0.05; \
         if [ \"$TRANCHE_ATTEMPT\" = 1 ] && [ $((TRANCHE_PID % 2)) = 0 ]; then exit 3; fi",
        lines = lines.display(),
    );
    let worker = |name: &str, by_flag: bool| {
        let mut args = vec!["--redis", &url, "--otlp-endpoint", &endpoint];
        if by_flag {
            args.extend(["--trace-sample", "0.5"]);
        }
        args.extend([
            "run",
            "--exec",
            &exec,
            "--worker-id",
            name,
            "--concurrency",
            "2",
            "--backoff",
            "100ms",
            "--no-split",
        ]);
        let mut cmd = tranche(&dir, &args);
        if !by_flag {
            cmd.env("OTEL_TRACES_SAMPLER", "traceidratio")
                .env("OTEL_TRACES_SAMPLER_ARG", "0.5");
        }
        cmd.env("W", name).stdin(Stdio::null());
        LoggedChild::spawn(&mut cmd, &dir, name)
    };
    for mut w in [worker("a", false), worker("b", true)] {
        let status = w.wait(common::OUTPUT_LIMIT);
        let stderr = w.stderr();
        assert!(status.success(), "{stderr}");
        assert!(stderr.contains("dropped=0"), "no span dropped:\n{stderr}");
    }

    let written = written(&lines);
    let spans = receiver.spans();
    let mut pids: Vec<i64> = written.iter().map(|w| w.pid).collect();
    pids.sort_unstable();
    pids.dedup();
    assert_eq!(pids.len(), 40, "every partition ran");
    for worker in ["a", "b"] {
        assert!(
            written.iter().any(|w| w.worker == worker),
            "{worker} ran none"
        );
    }
    // What each attempt was told, against what was exported.
    let mut expected = std::collections::BTreeSet::new();
    let mut trace_of = std::collections::BTreeMap::new();
    for w in &written {
        let kept = passes(&w.trace, 0.5);
        let first = trace_of
            .entry(w.pid)
            .or_insert((w.trace.clone(), w.span.clone()));
        assert_eq!(
            first.0, w.trace,
            "pid {}: one trace for every attempt",
            w.pid
        );
        if kept {
            assert_eq!(w.flags, "01", "pid {} is sampled", w.pid);
            expected.insert((w.pid, w.attempt));
            let chunk = spans
                .iter()
                .find(|s| s.name == "chunk" && hex(&s.span_id) == w.span)
                .unwrap_or_else(|| panic!("pid {} attempt {}: its chunk span", w.pid, w.attempt));
            assert_eq!(hex(&chunk.trace_id), w.trace);
        } else {
            // The partition's trace under its unexported root, the same for every
            // attempt: a chunk that records anyway lands in the partition's trace.
            assert_eq!(w.flags, "00", "pid {} is not sampled", w.pid);
            assert_eq!(first.1, w.span, "pid {}: its root, every attempt", w.pid);
        }
    }
    let exported: std::collections::BTreeSet<(i64, i64)> = spans
        .iter()
        .filter(|s| s.name == "partition")
        .map(|s| (int(s, "pid").unwrap(), int(s, "attempt").unwrap()))
        .collect();
    assert_eq!(
        exported, expected,
        "exactly the sampled partitions' attempts"
    );
    let kept = trace_of.values().filter(|(t, _)| passes(t, 0.5)).count();
    assert!(
        (5..=35).contains(&kept),
        "both kinds among the 40: {kept} kept"
    );
    assert!(
        expected
            .iter()
            .any(|&(pid, attempt)| pid % 2 == 0 && attempt == 2),
        "a sampled partition's retry is exported beside its failed attempt"
    );
    // No span of any kind in a dropped partition's trace.
    for s in &spans {
        let trace = hex(&s.trace_id);
        let dropped = trace_of
            .values()
            .any(|(t, _)| *t == trace && !passes(t, 0.5));
        assert!(!dropped, "{} span in a dropped trace", s.name);
    }
}

/// `always_off` (and a ratio of 0): no span is exported, the job finishes, and every
/// chunk is told its partition's trace is not sampled.
#[test]
fn sampling_nothing_exports_nothing_and_the_job_finishes() {
    let redis = TestRedis::start();
    let receiver = Receiver::start();
    let dir = scratch("otel-off");
    let url = redis.url();
    let lines = dir.join("traceparents");
    let exec = format!(
        "echo \"w $TRANCHE_PID $TRANCHE_ATTEMPT $TRACEPARENT\" >> {}",
        lines.display()
    );
    let endpoint = receiver.endpoint();
    for (ns, sampler, arg) in [
        ("off", "always_off", ""),
        ("zero", "parentbased_traceidratio", "0"),
    ] {
        let mut cmd = tranche(
            &dir,
            &[
                "--redis",
                &url,
                "--namespace",
                ns,
                "--otlp-endpoint",
                &endpoint,
                "run",
                "--min",
                "1",
                "--max",
                "2000",
                "--size",
                "100",
                "--exec",
                &exec,
            ],
        );
        cmd.env("OTEL_TRACES_SAMPLER", sampler)
            .env("OTEL_TRACES_SAMPLER_ARG", arg);
        let out = output(cmd);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{ns}: {stderr}");
        assert!(
            stderr.contains("exported=0") && stderr.contains("dropped=0"),
            "{ns}: {stderr}"
        );
    }
    let written = written(&lines);
    assert_eq!(written.len(), 40, "every chunk of both runs ran");
    assert!(written.iter().all(|w| w.flags == "00"));
    assert_eq!(receiver.spans().len(), 0, "{:#?}", receiver.spans());
}

/// `always_on` is the run without a sampler: every partition and chunk exported, every
/// `TRACEPARENT` sampled and naming its chunk's span. A sampler tranche does not take,
/// or a ratio out of range, is a one-line error at start (exit 2).
#[test]
fn always_on_keeps_everything_and_a_bad_sampler_is_refused() {
    let redis = TestRedis::start();
    let receiver = Receiver::start();
    let dir = scratch("otel-on");
    let url = redis.url();
    let lines = dir.join("traceparents");
    let exec = format!(
        "echo \"w $TRANCHE_PID $TRANCHE_ATTEMPT $TRACEPARENT\" >> {}",
        lines.display()
    );
    let endpoint = receiver.endpoint();
    let run = |sampler: Option<(&str, &str)>, ns: &str| {
        let mut cmd = tranche(
            &dir,
            &[
                "--redis",
                &url,
                "--namespace",
                ns,
                "--otlp-endpoint",
                &endpoint,
                "run",
                "--min",
                "1",
                "--max",
                "1000",
                "--size",
                "100",
                "--exec",
                &exec,
            ],
        );
        if let Some((s, arg)) = sampler {
            cmd.env("OTEL_TRACES_SAMPLER", s)
                .env("OTEL_TRACES_SAMPLER_ARG", arg);
        }
        // The standard variables for a hosted collector's key and the resource.
        cmd.env("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=k%3D1")
            .env(
                "OTEL_RESOURCE_ATTRIBUTES",
                "service.name=backfill,team=data",
            )
            .env_remove("OTEL_SERVICE_NAME");
        output(cmd)
    };
    // The argument of always_on is ignored, as the spec says.
    let out = run(Some(("always_on", "0")), "on");
    assert!(out.status.success(), "{out:?}");
    let spans = receiver.spans();
    let count = |name: &str| spans.iter().filter(|s| s.name == name).count();
    assert_eq!(
        (count("run"), count("partition"), count("chunk")),
        (1, 10, 10)
    );
    let heads = receiver.heads.lock().unwrap().clone();
    assert!(
        !heads.is_empty() && heads.iter().all(|h| h.contains("\r\nx-api-key: k=1\r\n")),
        "{heads:?}"
    );
    assert!(
        receiver
            .services
            .lock()
            .unwrap()
            .iter()
            .all(|s| s == "backfill"),
        "OTEL_RESOURCE_ATTRIBUTES's service.name"
    );
    for w in written(&lines) {
        assert_eq!(w.flags, "01");
        assert!(
            spans
                .iter()
                .any(|s| s.name == "chunk" && hex(&s.span_id) == w.span),
            "pid {}: its chunk span",
            w.pid
        );
    }

    for (sampler, arg, says) in [
        (
            "xray",
            "",
            "OTEL_TRACES_SAMPLER \"xray\" is not one tranche takes",
        ),
        (
            "traceidratio",
            "1.5",
            "OTEL_TRACES_SAMPLER_ARG \"1.5\" is not a ratio",
        ),
        ("traceidratio", "a tenth", "is not a ratio from 0 to 1"),
    ] {
        let out = run(Some((sampler, arg)), "bad");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{sampler} {arg}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
        assert!(stderr.contains(says), "{stderr}");
    }
    // The flag's own check, by clap.
    let out = output(tranche(&dir, &["--trace-sample", "2", "status"]));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

/// An https collector: with its CA in `OTEL_EXPORTER_OTLP_CERTIFICATE` the spans
/// arrive; without it (the system's roots, here a stand-in store of another CA through
/// `SSL_CERT_FILE`) every post fails, the spans are counted as dropped, and the job
/// still finishes.
#[test]
fn an_https_collector_is_trusted_by_its_ca_only() {
    let redis = TestRedis::start();
    let dir = scratch("otel-https");
    let pki = dir.join("pki");
    let other = dir.join("other");
    std::fs::create_dir_all(&pki).unwrap();
    std::fs::create_dir_all(&other).unwrap();
    let [ca, cert, key, ..] = crate::support::pki::write(&pki);
    let [other_ca, ..] = crate::support::pki::write(&other);
    let receiver = Receiver::start_tls(&cert, &key);
    let endpoint = receiver.endpoint();
    assert!(endpoint.starts_with("https://127.0.0.1:"));
    let url = redis.url();
    let run = |ns: &str, ca: Option<&std::path::Path>| {
        let mut cmd = tranche(
            &dir,
            &[
                "--redis",
                &url,
                "--namespace",
                ns,
                "--otlp-endpoint",
                &endpoint,
                "run",
                "--min",
                "1",
                "--max",
                "1000",
                "--size",
                "100",
                "--simulate",
                "--sim-latency",
                "1..1",
                "--sim-fail",
                "0",
            ],
        );
        cmd.env("SSL_CERT_FILE", &other_ca)
            .env_remove("OTEL_EXPORTER_OTLP_CERTIFICATE");
        if let Some(ca) = ca {
            cmd.env("OTEL_EXPORTER_OTLP_CERTIFICATE", ca);
        }
        let out = output(cmd);
        assert!(out.status.success(), "{ns}: {out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let stderr = run("trusted", Some(&ca));
    let spans = receiver.spans();
    let partitions = spans.iter().filter(|s| s.name == "partition").count();
    assert_eq!(partitions, 10, "{stderr}");
    assert!(stderr.contains("dropped=0"), "{stderr}");

    let stderr = run("untrusted", None);
    assert_eq!(receiver.spans().len(), spans.len(), "nothing more arrived");
    assert!(stderr.contains("spans not exported"), "{stderr}");
    assert!(stderr.contains("exported=0"), "{stderr}");
    assert!(
        !stderr.contains("dropped=0"),
        "the spans counted dropped: {stderr}"
    );
}
