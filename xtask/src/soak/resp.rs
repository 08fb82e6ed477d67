//! The few Redis commands the soak sends itself (INFO, SCAN, reading and corrupting a
//! value, CLUSTER FAILOVER), spoken in RESP over a plain `TcpStream`.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{Context, Result, bail};

/// A RESP reply.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Reply {
    Nil,
    Int(i64),
    Bytes(Vec<u8>),
    Error(String),
    Array(Vec<Reply>),
}

impl Reply {
    /// The reply as text (simple and bulk strings).
    pub(crate) fn text(&self) -> String {
        match self {
            Reply::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
            Reply::Int(n) => n.to_string(),
            Reply::Error(e) => e.clone(),
            _ => String::new(),
        }
    }
}

/// One command to the server on `port` of 127.0.0.1, on a fresh connection (the soak
/// sends a handful a second at most).
pub(crate) fn call(port: u16, args: &[&[u8]]) -> Result<Reply> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))
        .with_context(|| format!("could not connect to Redis on port {port}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.set_write_timeout(Some(Duration::from_secs(10)))?;
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    stream.write_all(&out)?;
    let mut reader = BufReader::new(stream);
    read(&mut reader)
}

/// [`call`] with string arguments; a RESP error is an `Err`.
pub(crate) fn cmd(port: u16, args: &[&str]) -> Result<Reply> {
    let bytes: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    match call(port, &bytes)? {
        Reply::Error(e) => bail!("redis {}: {e}", args.join(" ")),
        reply => Ok(reply),
    }
}

/// One field of `INFO section` as a number.
pub(crate) fn info_field(port: u16, section: &str, field: &str) -> Result<u64> {
    let text = cmd(port, &["INFO", section])?.text();
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("INFO {section} has no {field}"))
}

/// Every key matching `pattern` (SCAN, so the server never blocks on it).
pub(crate) fn scan(port: u16, pattern: &str) -> Result<Vec<Vec<u8>>> {
    let mut keys = Vec::new();
    let mut cursor = "0".to_owned();
    loop {
        let reply = cmd(port, &["SCAN", &cursor, "MATCH", pattern, "COUNT", "1000"])?;
        let Reply::Array(parts) = reply else {
            bail!("SCAN replied {reply:?}");
        };
        let [next, Reply::Array(found)] = parts.as_slice() else {
            bail!("SCAN replied {parts:?}");
        };
        for key in found {
            if let Reply::Bytes(k) = key {
                keys.push(k.clone());
            }
        }
        cursor = next.text();
        if cursor == "0" {
            return Ok(keys);
        }
    }
}

fn read(r: &mut impl BufRead) -> Result<Reply> {
    let mut line = Vec::new();
    r.read_until(b'\n', &mut line)?;
    if line.len() < 3 || !line.ends_with(b"\r\n") {
        bail!("Redis closed the connection or sent a short line");
    }
    let body = String::from_utf8_lossy(&line[1..line.len() - 2]).into_owned();
    let number = || -> Result<i64> { body.parse().context("a bad RESP length") };
    Ok(match line[0] {
        b'+' => Reply::Bytes(body.into_bytes()),
        b'-' => Reply::Error(body),
        b':' => Reply::Int(number()?),
        b'$' => {
            let n = number()?;
            if n < 0 {
                return Ok(Reply::Nil);
            }
            let mut buf = vec![0; n as usize + 2];
            r.read_exact(&mut buf)?;
            buf.truncate(n as usize);
            Reply::Bytes(buf)
        }
        b'*' => {
            let n = number()?;
            if n < 0 {
                return Ok(Reply::Nil);
            }
            let mut items = Vec::with_capacity(n as usize);
            for _ in 0..n {
                items.push(read(r)?);
            }
            Reply::Array(items)
        }
        other => bail!("an unknown RESP type byte {other}"),
    })
}
