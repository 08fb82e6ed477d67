//! The HTTP probe's GET: HTTP/1.1 over TCP, or over TLS (rustls, already in the tree
//! through the Redis client) for `https://`; the status line only, at most 8 KiB of it.
//! Enough for health endpoints; no redirects, no HTTP client dependency.

use std::sync::Arc;

use rustls::ClientConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::Error;

/// An `http://` or `https://` URL taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HttpUrl {
    /// `https://`: the GET goes over TLS, the server's certificate checked.
    pub(crate) tls: bool,
    host: String,
    port: u16,
    path: String,
}

/// The TLS client of an `https://` probe: the system's CA certificates, and `extra_pem`
/// (a private CA, PEM) trusted too. Errors when no root at all can be had.
pub(crate) fn tls_config(extra_pem: Option<&[u8]>) -> Result<Arc<ClientConfig>, Error> {
    let bad = |why: String| Error::invalid("https", why);
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    roots.add_parsable_certificates(native.certs);
    if let Some(pem) = extra_pem {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<_, _>>()
            .map_err(|e| bad(format!("the CA certificate is not PEM: {e}")))?;
        if certs.is_empty() {
            return Err(bad("no certificate in the CA PEM".to_owned()));
        }
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| bad(format!("the CA certificate is unusable: {e}")))?;
        }
    }
    if roots.is_empty() {
        return Err(bad(
            "no CA certificates: the system has none, and none was given".to_owned(),
        ));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

impl HttpUrl {
    pub(crate) fn parse(url: &str) -> Result<Self, Error> {
        let bad = |why: &str| Error::invalid("url", format!("{url:?}: {why}"));
        let (tls, rest) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
            (Some(rest), _) => (false, rest),
            (_, Some(rest)) => (true, rest),
            _ => return Err(bad("only http:// and https:// URLs are supported")),
        };
        let (authority, path) = match rest.find('/') {
            Some(at) => (&rest[..at], &rest[at..]),
            None => (rest, "/"),
        };
        if authority.contains('@') {
            return Err(bad("credentials in the URL are not supported"));
        }
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => {
                (h, p.parse().map_err(|_| bad("bad port"))?)
            }
            _ => (authority, if tls { 443 } else { 80 }),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() || path.contains(['\r', '\n', ' ']) {
            return Err(bad("no host, or a path with spaces or line breaks"));
        }
        Ok(Self {
            tls,
            host: host.to_owned(),
            port,
            path: path.to_owned(),
        })
    }
}

/// GETs `url` (over TLS with `tls` for an `https://` one) and returns the status code
/// and the status line.
pub(crate) async fn get_status(
    url: &HttpUrl,
    tls: Option<&Arc<ClientConfig>>,
) -> Result<(u16, String), String> {
    let stream = TcpStream::connect((url.host.as_str(), url.port))
        .await
        .map_err(|e| format!("cannot connect to {}:{}: {e}", url.host, url.port))?;
    match (url.tls, tls) {
        (false, _) => exchange(stream, url).await,
        (true, Some(config)) => {
            let name = ServerName::try_from(url.host.clone())
                .map_err(|e| format!("{:?} is not a TLS server name: {e}", url.host))?;
            let stream = tokio_rustls::TlsConnector::from(config.clone())
                .connect(name, stream)
                .await
                .map_err(|e| format!("TLS with {}:{} failed: {e}", url.host, url.port))?;
            exchange(stream, url).await
        }
        (true, None) => Err("an https:// URL without a TLS configuration".to_owned()),
    }
}

/// The request and the status line over an open stream.
async fn exchange<S>(mut stream: S, url: &HttpUrl) -> Result<(u16, String), String>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let request = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: tranche-probe\r\nAccept: */*\r\nConnection: close\r\n\r\n",
        url.path, url.host
    );
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("cannot send the request: {e}"))?;
    // The status line only, and at most 8 KiB of it: a hostile endpoint cannot make
    // the probe buffer without bound.
    let mut line = String::new();
    BufReader::new(stream.take(8192))
        .read_line(&mut line)
        .await
        .map_err(|e| format!("cannot read the answer: {e}"))?;
    let line = line.trim_end().to_owned();
    let mut parts = line.splitn(3, ' ');
    let version = parts.next().unwrap_or("");
    let code = parts.next().and_then(|c| c.parse::<u16>().ok());
    match code {
        Some(code) if version.starts_with("HTTP/1.") => Ok((code, line)),
        _ => Err(format!("not an HTTP/1.x status line: {line:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_into_host_port_and_path() {
        let u = HttpUrl::parse("http://db.local:8080/health?x=1").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str()),
            ("db.local", 8080, "/health?x=1")
        );
        let u = HttpUrl::parse("http://db").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.path.as_str()), ("db", 80, "/"));
        let u = HttpUrl::parse("https://db.local/health").unwrap();
        assert_eq!((u.tls, u.port), (true, 443));
        for bad in [
            "ftp://db/",
            "http://",
            "https://",
            "http://u:p@db/",
            "http://db:x/",
            "http://db/a b",
        ] {
            assert!(HttpUrl::parse(bad).is_err(), "{bad}");
        }
    }
}
