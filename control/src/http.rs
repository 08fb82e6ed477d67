//! The HTTP probe's GET: HTTP/1.1 over a plain TCP stream, the status line only. Enough
//! for health endpoints; no TLS, no redirects, no HTTP client dependency.

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::Error;

/// An `http://` URL taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HttpUrl {
    host: String,
    port: u16,
    path: String,
}

impl HttpUrl {
    pub(crate) fn parse(url: &str) -> Result<Self, Error> {
        let bad = |why: &str| Error::invalid("url", format!("{url:?}: {why}"));
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| bad("only http:// URLs are supported"))?;
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
            _ => (authority, 80),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() || path.contains(['\r', '\n', ' ']) {
            return Err(bad("no host, or a path with spaces or line breaks"));
        }
        Ok(Self {
            host: host.to_owned(),
            port,
            path: path.to_owned(),
        })
    }
}

/// GETs `url` and returns the status code and the status line.
pub(crate) async fn get_status(url: &HttpUrl) -> Result<(u16, String), String> {
    let mut stream = TcpStream::connect((url.host.as_str(), url.port))
        .await
        .map_err(|e| format!("cannot connect to {}:{}: {e}", url.host, url.port))?;
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
        for bad in [
            "https://db/",
            "http://",
            "http://u:p@db/",
            "http://db:x/",
            "http://db/a b",
        ] {
            assert!(HttpUrl::parse(bad).is_err(), "{bad}");
        }
    }
}
