//! The probes: a command's exit code and first line, an HTTP status, a closure.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tranche_control::{ExecProbe, FnProbe, HttpProbe, Probe, ProbeOutcome};

async fn exec(cmd: &str) -> ProbeOutcome {
    ExecProbe::new(cmd, Duration::from_secs(5)).check().await
}

#[tokio::test]
async fn a_command_says_go_throttle_value_or_error() {
    let throttle = |r: &str| ProbeOutcome::Throttle { reason: r.into() };
    let cases = [
        ("true", ProbeOutcome::Go),
        ("echo fine", ProbeOutcome::Go),
        ("echo 1234.5", ProbeOutcome::Value(1234.5)),
        ("printf 'lag 9s\\nmore\\n'; exit 1", throttle("lag 9s")),
        ("exit 1", throttle("probe said throttle")),
        (
            "echo broken; exit 2",
            ProbeOutcome::Error("probe exited 2: broken".into()),
        ),
        (
            "kill -9 $$",
            ProbeOutcome::Error("probe killed by a signal".into()),
        ),
    ];
    for (cmd, want) in cases {
        assert_eq!(exec(cmd).await, want, "{cmd}");
    }
}

#[tokio::test]
async fn a_command_that_hangs_is_an_error() {
    let dir = std::env::temp_dir().join(format!("tranche-probe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let marker = dir.join("late");
    let cmd = format!("sleep 0.5; touch {}; true", marker.display());
    let got = ExecProbe::new(cmd, Duration::from_millis(100))
        .check()
        .await;
    assert!(
        matches!(&got, ProbeOutcome::Error(m) if m.contains("timed out")),
        "{got:?}"
    );
    // What the shell started was killed with it: the marker never appears.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(!marker.exists(), "the probe's child outlived the timeout");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A one-shot HTTP server answering `status_line`; returns its URL and the request it
/// read.
async fn serve(status_line: &'static str) -> (String, tokio::task::JoinHandle<String>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/health", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut buf = vec![0; 4096];
        let n = sock.read(&mut buf).await.unwrap();
        let answer = format!("{status_line}\r\nContent-Length: 0\r\n\r\n");
        sock.write_all(answer.as_bytes()).await.unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    });
    (url, task)
}

#[tokio::test]
async fn an_http_status_says_go_throttle_or_error() {
    let cases = [
        ("HTTP/1.1 200 OK", ProbeOutcome::Go),
        ("HTTP/1.1 204 No Content", ProbeOutcome::Go),
        (
            "HTTP/1.1 503 Service Unavailable",
            ProbeOutcome::Throttle {
                reason: "HTTP/1.1 503 Service Unavailable".into(),
            },
        ),
        (
            "HTTP/1.0 429 Too Many Requests",
            ProbeOutcome::Throttle {
                reason: "HTTP/1.0 429 Too Many Requests".into(),
            },
        ),
        (
            "HTTP/1.1 500 Oops",
            ProbeOutcome::Error("HTTP/1.1 500 Oops".into()),
        ),
        (
            "SSH-2.0-OpenSSH",
            ProbeOutcome::Error("not an HTTP/1.x status line: \"SSH-2.0-OpenSSH\"".into()),
        ),
    ];
    for (line, want) in cases {
        let (url, server) = serve(line).await;
        let got = HttpProbe::new(&url, Duration::from_secs(5))
            .unwrap()
            .check()
            .await;
        assert_eq!(got, want, "{line}");
        let request = server.await.unwrap();
        assert!(request.starts_with("GET /health HTTP/1.1\r\n"), "{request}");
        assert!(request.contains("Connection: close\r\n"), "{request}");
    }
}

#[tokio::test]
async fn an_http_endpoint_that_is_down_or_silent_is_an_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = format!("http://{}/", listener.local_addr().unwrap());
    drop(listener);
    let got = HttpProbe::new(&closed, Duration::from_secs(5))
        .unwrap()
        .check()
        .await;
    assert!(
        matches!(&got, ProbeOutcome::Error(m) if m.contains("cannot connect")),
        "{got:?}"
    );

    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", silent.local_addr().unwrap());
    let got = HttpProbe::new(&url, Duration::from_millis(100))
        .unwrap()
        .check()
        .await;
    assert!(
        matches!(&got, ProbeOutcome::Error(m) if m.contains("no answer")),
        "{got:?}"
    );
    assert!(HttpProbe::new("ftp://db/", Duration::from_secs(1)).is_err());
}

#[tokio::test]
async fn a_closure_is_a_probe() {
    let probe = FnProbe::new(|| async { ProbeOutcome::Value(7.0) });
    assert_eq!(probe.check().await, ProbeOutcome::Value(7.0));
}

/// Oversized: a probe that prints without bound is killed and throttles.
#[tokio::test]
async fn a_command_that_prints_too_much_is_an_error() {
    let got = exec("yes probe-output").await;
    assert!(
        matches!(&got, ProbeOutcome::Error(m) if m.contains("printed over 65536 bytes")),
        "{got:?}"
    );
    // Exactly the bound is fine.
    let got = exec("head -c 65536 /dev/zero | tr '\\0' 'a'; exit 1").await;
    assert!(matches!(got, ProbeOutcome::Throttle { .. }), "{got:?}");
}

/// A probe given an environment sees only it (the worker's secrets stay out).
#[tokio::test]
async fn a_command_sees_only_the_environment_it_is_given() {
    // Cargo sets CARGO_PKG_NAME in the test's environment: it stands in for a secret.
    assert!(std::env::var_os("CARGO_PKG_NAME").is_some());
    let probe = ExecProbe::new(
        "test -z \"$CARGO_PKG_NAME\" && test \"$ONLY\" = yes && echo 7",
        Duration::from_secs(5),
    )
    .with_env(vec![("ONLY".into(), "yes".into())]);
    assert_eq!(probe.check().await, ProbeOutcome::Value(7.0));
}

const CA: &[u8] = include_bytes!("tls/ca.pem");
const LEAF: &[u8] = include_bytes!("tls/leaf.pem");
const LEAF_KEY: &[u8] = include_bytes!("tls/leaf.key");

/// A one-shot HTTPS server on 127.0.0.1 with a certificate for `localhost` signed by the
/// test CA (`tls/`, valid for a century), answering `status_line`.
async fn serve_tls(status_line: &'static str) -> (u16, tokio::task::JoinHandle<()>) {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = vec![CertificateDer::from_pem_slice(LEAF).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(LEAF_KEY).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let (sock, _) = listener.accept().await.unwrap();
        // A client that refuses the certificate ends the handshake: nothing to answer.
        let Ok(mut tls) = acceptor.accept(sock).await else {
            return;
        };
        let mut buf = vec![0; 4096];
        let _ = tls.read(&mut buf).await.unwrap();
        let answer = format!("{status_line}\r\nContent-Length: 0\r\n\r\n");
        tls.write_all(answer.as_bytes()).await.unwrap();
        tls.shutdown().await.unwrap();
    });
    (port, task)
}

#[tokio::test]
async fn an_https_status_says_go_or_throttle() {
    for (line, want) in [
        ("HTTP/1.1 200 OK", ProbeOutcome::Go),
        (
            "HTTP/1.1 503 Busy",
            ProbeOutcome::Throttle {
                reason: "HTTP/1.1 503 Busy".into(),
            },
        ),
    ] {
        let (port, server) = serve_tls(line).await;
        let url = format!("https://localhost:{port}/health");
        let probe = HttpProbe::with_ca(&url, Duration::from_secs(5), CA).unwrap();
        assert_eq!(probe.check().await, want, "{line}");
        server.await.unwrap();
    }
}

/// A certificate the probe cannot check, or a server that does not speak TLS, is an
/// error: it throttles.
#[tokio::test]
async fn an_https_server_that_cannot_be_trusted_is_an_error() {
    let (port, server) = serve_tls("HTTP/1.1 200 OK").await;
    let url = format!("https://localhost:{port}/health");
    // The system's CAs do not know the test CA; a system with none refuses the URL.
    match HttpProbe::new(&url, Duration::from_secs(5)) {
        Ok(probe) => {
            let got = probe.check().await;
            assert!(
                matches!(&got, ProbeOutcome::Error(m) if m.contains("TLS")),
                "{got:?}"
            );
        }
        Err(err) => assert!(err.to_string().contains("no CA certificates"), "{err}"),
    }
    server.abort();

    let (plain, server) = serve("HTTP/1.1 200 OK").await;
    let url = plain.replace("http://127.0.0.1", "https://localhost");
    let got = HttpProbe::with_ca(&url, Duration::from_secs(5), CA)
        .unwrap()
        .check()
        .await;
    assert!(
        matches!(&got, ProbeOutcome::Error(m) if m.contains("TLS")),
        "{got:?}"
    );
    server.abort();
    assert!(HttpProbe::with_ca(&url, Duration::from_secs(5), b"not pem").is_err());
}
