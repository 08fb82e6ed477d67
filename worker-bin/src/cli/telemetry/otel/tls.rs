//! https to the collector: the exporter's hyper client over a connector of ours,
//! TCP then rustls.

use std::ffi::OsString;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::Context as _;
use hyper::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioIo;
use opentelemetry_http::hyper::HyperClient;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// The exporter's HTTP client for an `https://` collector, verifying it against
/// the PEM file `var` names (`OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE`, then
/// `OTEL_EXPORTER_OTLP_CERTIFICATE`; that file's certificates alone, as the
/// OpenTelemetry SDKs take it), or else the system's roots; each post bounded
/// by `timeout`.
///
/// # Errors
/// A certificate file that cannot be read or holds none, or no system root.
pub(super) fn client(
    timeout: Duration,
    var: impl Fn(&str) -> Option<OsString>,
) -> anyhow::Result<HyperClient<Https>> {
    let roots = roots(var)?;
    // Given here rather than installed process-wide, as the SQL handler's.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS to the OTLP collector")?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut http = HttpConnector::new();
    // The scheme is https; this connector only opens the TCP connection.
    http.enforce_http(false);
    let connector = Https {
        http,
        tls: tokio_rustls::TlsConnector::from(Arc::new(config)),
    };
    Ok(HyperClient::new(connector, timeout, None))
}

fn roots(var: impl Fn(&str) -> Option<OsString>) -> anyhow::Result<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    let file = [
        "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
        "OTEL_EXPORTER_OTLP_CERTIFICATE",
    ]
    .into_iter()
    .find_map(|k| var(k).filter(|f| !f.is_empty()));
    if let Some(file) = file {
        let path = std::path::PathBuf::from(file);
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&path)
            .and_then(|certs| certs.collect())
            .map_err(|e| {
                anyhow::anyhow!("cannot read the collector's CA {}: {e}", path.display())
            })?;
        let (added, _) = roots.add_parsable_certificates(certs);
        if added == 0 {
            anyhow::bail!(
                "{}: no certificate to trust the collector by",
                path.display()
            );
        }
    } else {
        let found = rustls_native_certs::load_native_certs();
        // A system store may hold certificates rustls cannot parse; the rest stand.
        roots.add_parsable_certificates(found.certs);
        if roots.is_empty() {
            anyhow::bail!(
                "an https collector, but no trusted root certificate could be read ({:?}); name its CA with OTEL_EXPORTER_OTLP_CERTIFICATE",
                found.errors
            );
        }
    }
    Ok(roots)
}

/// Opens a TCP connection to the collector, then TLS over it for the URL's host.
#[derive(Clone)]
pub(super) struct Https {
    http: HttpConnector,
    tls: tokio_rustls::TlsConnector,
}

impl std::fmt::Debug for Https {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Https")
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower_service::Service<Uri> for Https {
    type Response = Stream;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Stream, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let (mut http, tls) = (self.http.clone(), self.tls.clone());
        Box::pin(async move {
            if uri.scheme_str() != Some("https") {
                return Err(format!("{uri}: not https").into());
            }
            let host = uri.host().ok_or("no host in the collector's URL")?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let name = ServerName::try_from(host.to_owned())?;
            let tcp = http.call(uri).await?.into_inner();
            let tls = tls.connect(name, tcp).await?;
            Ok(Stream(TokioIo::new(tls)))
        })
    }
}

/// A TLS connection, as hyper reads and writes it.
pub(super) struct Stream(TokioIo<TlsStream<TcpStream>>);

impl Connection for Stream {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl hyper::rt::Read for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}
