//! Big replies read off a connection of our own, without redis-rs's per-element values.
//!
//! redis-rs parses every reply into a tree of `redis::Value`s through a general parser
//! combinator, one allocation per element: about 250 ns an element on a 2-core machine,
//! so the 20,000 elements of `HGETALL` over 10,000 active partitions cost some 5 ms
//! before the store sees a byte, twice what Redis itself takes to produce them.
//! [`BulkReader`] sends such reads on a second, plain connection that it keeps for them
//! and scans the RESP2 reply in place: a [`Frame`] is a range of one buffer, and the
//! same read costs a fraction of a millisecond on top of Redis's own time.
//!
//! The exchange runs on tokio's blocking pool over a blocking socket (see
//! [`BulkReader`] for why). It covers a standalone server over TCP or a Unix socket,
//! with the URL's AUTH and SELECT. TLS and clusters stay with redis-rs. The store falls
//! back to its ordinary read whenever there is no reader or a read through it fails, so
//! the reader only ever makes a read faster, never different.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::ops::Range;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use redis::{ConnectionAddr, ConnectionInfo, Pipeline};

/// How long one exchange (connecting included) may take: the main connection's
/// response timeout. A server that stops answering is given up on within it; one that
/// trickles bytes, within twice it (each read may wait what was left at the start).
const TIMEOUT: Duration = Duration::from_secs(10);
/// Frames nest at most this deep (our replies nest three deep: EXEC, HGETALL, field).
const MAX_DEPTH: usize = 8;
/// The largest bulk string or array accepted, as Redis's own `proto-max-bulk-len`.
const MAX_LEN: u64 = 512 << 20;
/// The name the connection carries in `CLIENT LIST`.
const CLIENT_NAME: &[u8] = b"tranche-bulk";

/// One RESP2 reply, its parts as ranges of the buffer it was read into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Frame {
    /// `+…`: a status reply.
    Simple(Range<usize>),
    /// `-…`: an error reply.
    Error(Range<usize>),
    /// `:…`: an integer.
    Int(i64),
    /// `$…`: a bulk string.
    Bulk(Range<usize>),
    /// `$-1` or `*-1`.
    Nil,
    /// `*…`: an array.
    Array(Vec<Frame>),
}

/// The replies to one [`BulkReader::query`], in order, over the bytes they arrived as.
#[derive(Debug)]
pub(crate) struct Replies {
    buf: Vec<u8>,
    frames: Vec<Frame>,
}

impl Replies {
    /// The replies, one per command sent.
    pub(crate) fn frames(&self) -> &[Frame] {
        &self.frames
    }

    /// The bytes of a range of a frame of these replies.
    pub(crate) fn bytes(&self, range: &Range<usize>) -> &[u8] {
        &self.buf[range.clone()]
    }
}

/// Where the reader connects.
#[derive(Debug, Clone)]
enum Addr {
    Tcp(String, u16),
    Unix(PathBuf),
}

/// A blocking socket, TCP or Unix, whose reads and writes can be given a time limit.
trait Wire: Read + Write + Send {
    fn limit(&self, time: Duration) -> io::Result<()>;
}

impl Wire for TcpStream {
    fn limit(&self, time: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(time))?;
        self.set_write_timeout(Some(time))
    }
}

impl Wire for UnixStream {
    fn limit(&self, time: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(time))?;
        self.set_write_timeout(Some(time))
    }
}

/// The time left before `deadline`, or a timeout error once it has passed.
fn left(deadline: Instant) -> io::Result<Duration> {
    match deadline.checked_duration_since(Instant::now()) {
        Some(d) if !d.is_zero() => Ok(d),
        _ => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "bulk read timed out",
        )),
    }
}

/// A connection of its own for big reads (see the module docs), opened on first use
/// and again after any failure. One read at a time; concurrent callers wait their turn.
///
/// The exchange runs on tokio's blocking pool over a blocking socket: the thread that
/// reads is the one the kernel wakes as the reply arrives. Read through the runtime's
/// reactor instead, each of the dozens of pieces a megabyte arrives in is a wake-up
/// handed from the I/O driver's thread to the task's, and on a 2-core machine shared
/// with Redis 3–8% of 10,000-partition reads took 4 ms longer (a scheduler tick),
/// against 0–2% this way (p99 6.9–8.2 ms against 2.8–4.9 ms, the router bench).
pub(crate) struct BulkReader {
    addr: Addr,
    username: Option<String>,
    password: Option<String>,
    db: i64,
    wire: Mutex<Option<Box<dyn Wire>>>,
    /// Whether a failure was logged as a warning already (later ones log at debug).
    warned: AtomicBool,
    /// The size of the last reply read, to size the next one's buffer.
    last_size: AtomicUsize,
}

impl std::fmt::Debug for BulkReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BulkReader")
            .field("addr", &self.addr)
            .field("db", &self.db)
            .finish_non_exhaustive()
    }
}

impl BulkReader {
    /// A reader for the server `info` names, if it is one this reader can speak to
    /// (plain TCP or a Unix socket; not TLS).
    pub(crate) fn for_server(info: &ConnectionInfo) -> Option<Self> {
        let addr = match info.addr() {
            ConnectionAddr::Tcp(host, port) => Addr::Tcp(host.clone(), *port),
            ConnectionAddr::Unix(path) => Addr::Unix(path.clone()),
            _ => return None,
        };
        let redis = info.redis_settings();
        Some(Self {
            addr,
            username: redis.username().map(str::to_owned),
            password: redis.password().map(str::to_owned),
            db: redis.db(),
            wire: Mutex::new(None),
            warned: AtomicBool::new(false),
            last_size: AtomicUsize::new(0),
        })
    }

    /// Sends `pipelines` in one write and reads their replies (a transaction's MULTI and
    /// EXEC included). A connection that failed (or that the server closed while idle)
    /// is replaced once before giving up.
    ///
    /// The exchange runs on the blocking pool (see the type's docs). A caller that
    /// gives up (drops this future) leaves it to finish there, so the connection is
    /// never left holding a reply that the next exchange would read as its own.
    pub(crate) async fn query(self: &Arc<Self>, pipelines: &[Pipeline]) -> io::Result<Replies> {
        let (out, replies) = pack(pipelines);
        let (this, span) = (self.clone(), tracing::Span::current());
        let result = tokio::task::spawn_blocking(move || {
            span.in_scope(|| this.query_once_reconnecting(&out, replies))
        })
        .await
        .unwrap_or_else(|err| Err(io::Error::other(err)));
        if let Err(err) = &result {
            if self.warned.swap(true, Ordering::Relaxed) {
                tracing::debug!(%err, addr = ?self.addr, "bulk read failed; reading through redis-rs");
            } else {
                tracing::warn!(%err, addr = ?self.addr, "bulk read failed; reading through redis-rs (slower) instead");
            }
        }
        result
    }

    fn query_once_reconnecting(&self, out: &[u8], replies: usize) -> io::Result<Replies> {
        let mut wire = self.wire.lock().unwrap_or_else(PoisonError::into_inner);
        let reused = wire.is_some();
        match self.exchange(&mut wire, out, replies) {
            Err(err) if reused => {
                tracing::debug!(%err, "bulk connection failed; reconnecting once");
                self.exchange(&mut wire, out, replies)
            }
            other => other,
        }
    }

    /// One exchange on the kept connection (opened first if there is none), within
    /// [`TIMEOUT`]. The connection is taken out of `wire` for the exchange and put back
    /// only once the whole reply is read: after an error or a timeout it is closed.
    fn exchange(
        &self,
        wire: &mut Option<Box<dyn Wire>>,
        out: &[u8],
        replies: usize,
    ) -> io::Result<Replies> {
        let deadline = Instant::now() + TIMEOUT;
        let mut io = match wire.take() {
            Some(io) => io,
            None => self.connect(deadline)?,
        };
        let hint = self.last_size.load(Ordering::Relaxed);
        let read = round_trip(&mut *io, out, replies, hint, deadline)?;
        self.last_size.store(read.buf.len(), Ordering::Relaxed);
        *wire = Some(io);
        Ok(read)
    }

    /// Opens the connection: AUTH and SELECT as the URL says, and a client name.
    fn connect(&self, deadline: Instant) -> io::Result<Box<dyn Wire>> {
        let mut io: Box<dyn Wire> = match &self.addr {
            Addr::Tcp(host, port) => {
                let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
                let mut connected = None;
                for addr in (host.as_str(), *port).to_socket_addrs()? {
                    match TcpStream::connect_timeout(&addr, left(deadline)?) {
                        Ok(stream) => {
                            connected = Some(stream);
                            break;
                        }
                        Err(err) => last = err,
                    }
                }
                let stream = connected.ok_or(last)?;
                stream.set_nodelay(true)?;
                Box::new(stream)
            }
            Addr::Unix(path) => Box::new(UnixStream::connect(path)?),
        };
        let mut setup = redis::pipe();
        match (&self.username, &self.password) {
            (Some(user), Some(pass)) => setup.cmd("AUTH").arg(user).arg(pass),
            (None, Some(pass)) => setup.cmd("AUTH").arg(pass),
            _ => &mut setup,
        };
        if self.db != 0 {
            setup.cmd("SELECT").arg(self.db);
        }
        setup.cmd("CLIENT").arg("SETNAME").arg(CLIENT_NAME);
        let (out, count) = pack(std::slice::from_ref(&setup));
        let replies = round_trip(&mut *io, &out, count, 0, deadline)?;
        // AUTH and SELECT must succeed; the name is a courtesy (an ACL may forbid it).
        for frame in &replies.frames()[..count - 1] {
            if let Frame::Error(e) = frame {
                let e = String::from_utf8_lossy(replies.bytes(e)).into_owned();
                return Err(io::Error::new(io::ErrorKind::PermissionDenied, e));
            }
        }
        Ok(io)
    }
}

/// Writes `out` and reads `replies` whole replies, by `deadline`.
fn round_trip(
    io: &mut dyn Wire,
    out: &[u8],
    replies: usize,
    size_hint: usize,
    deadline: Instant,
) -> io::Result<Replies> {
    // Set once: a `setsockopt` per read would cost more than the deadline check after it.
    io.limit(left(deadline)?)?;
    io.write_all(out)?;
    // Room for a reply as big as the last one and some: a megabyte grown by doubling
    // would be copied four times over. The buffer is zeroed once as it grows (a read
    // needs initialised bytes), and `filled` says how much of it holds the reply.
    let mut buf = vec![0; size_hint + size_hint / 8 + (64 << 10)];
    let mut filled = 0;
    let mut scan = Scan::default();
    while scan.done < replies {
        if buf.len() - filled < 16 << 10 {
            buf.resize(buf.len() * 2, 0);
        }
        let n = match io.read(&mut buf[filled..]) {
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            other => other?,
        };
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        left(deadline)?;
        filled += n;
        scan.advance(&buf[..filled]).map_err(malformed)?;
    }
    buf.truncate(filled);
    if scan.pos != buf.len() {
        return Err(malformed("bytes after the last reply"));
    }
    let mut frames = Vec::with_capacity(replies);
    let mut pos = 0;
    while pos < buf.len() {
        let (frame, next) = parse(&buf, pos, 0).map_err(malformed)?;
        frames.push(frame);
        pos = next;
    }
    Ok(Replies { buf, frames })
}

fn malformed(what: &'static str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("malformed reply: {what}"),
    )
}

/// `pipelines` encoded one after another by redis-rs, and how many replies they get.
fn pack(pipelines: &[Pipeline]) -> (Vec<u8>, usize) {
    let mut out = Vec::new();
    let mut replies = 0;
    for pipeline in pipelines {
        out.extend_from_slice(&pipeline.get_packed_pipeline());
        replies += pipeline.len() + if pipeline.is_transaction() { 2 } else { 0 };
    }
    (out, replies)
}

/// A reply's first line: its type byte, its text, and where the next line starts.
type Header<'a> = (u8, &'a [u8], usize);

/// The header line at `pos`; `None` while the line is not all in.
fn header(buf: &[u8], pos: usize) -> Result<Option<Header<'_>>, &'static str> {
    let Some(rest) = buf.get(pos..) else {
        return Ok(None);
    };
    let Some(nl) = rest.iter().position(|&b| b == b'\n') else {
        return Ok(None);
    };
    if nl < 2 || rest[nl - 1] != b'\r' {
        return Err("a line without its type or CR");
    }
    Ok(Some((rest[0], &rest[1..nl - 1], pos + nl + 1)))
}

/// A length or integer line: an optional '-' and decimal digits.
fn number(text: &[u8]) -> Result<i64, &'static str> {
    let (negative, digits) = match text.split_first() {
        Some((b'-', d)) => (true, d),
        _ => (false, text),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err("a bad number");
    }
    let n = digits
        .iter()
        .try_fold(0i64, |n, &d| {
            n.checked_mul(10)?.checked_add(i64::from(d - b'0'))
        })
        .ok_or("a number out of range")?;
    Ok(if negative { -n } else { n })
}

/// A length that is -1 (nil) or at most [`MAX_LEN`].
fn length(text: &[u8]) -> Result<Option<usize>, &'static str> {
    match number(text)? {
        -1 => Ok(None),
        n if (0..=MAX_LEN as i64).contains(&n) => Ok(Some(n as usize)),
        _ => Err("a length out of bounds"),
    }
}

/// Walks the replies in a growing buffer, resumably: each call goes on from where the
/// last one stopped, so reading a big reply in many pieces costs one pass over it.
#[derive(Debug, Default)]
struct Scan {
    /// Where the next unread header starts.
    pos: usize,
    /// Elements still to come in each open array, outermost first.
    open: Vec<u64>,
    /// Whole replies seen.
    done: usize,
}

impl Scan {
    fn advance(&mut self, buf: &[u8]) -> Result<(), &'static str> {
        while let Some((kind, text, mut next)) = header(buf, self.pos)? {
            match kind {
                b'+' | b'-' => {}
                b':' => {
                    number(text)?;
                }
                b'$' => {
                    if let Some(n) = length(text)? {
                        let end = next + n;
                        if buf.len() < end + 2 {
                            return Ok(());
                        }
                        if &buf[end..end + 2] != b"\r\n" {
                            return Err("a bulk string without its CRLF");
                        }
                        next = end + 2;
                    }
                }
                b'*' => {
                    if let Some(n @ 1..) = length(text)? {
                        if self.open.len() == MAX_DEPTH {
                            return Err("arrays nested too deep");
                        }
                        self.open.push(n as u64);
                        self.pos = next;
                        continue;
                    }
                }
                _ => return Err("an unknown reply type"),
            }
            self.pos = next;
            // An element is done: close every array it completes.
            loop {
                match self.open.last_mut() {
                    Some(left) => {
                        *left -= 1;
                        if *left > 0 {
                            break;
                        }
                        self.open.pop();
                    }
                    None => {
                        self.done += 1;
                        break;
                    }
                }
            }
        }
        Ok(())
    }
}

/// The frame at `pos` of a buffer holding it whole, and where it ends.
fn parse(buf: &[u8], pos: usize, depth: usize) -> Result<(Frame, usize), &'static str> {
    let (kind, text, next) = header(buf, pos)?.ok_or("a reply cut short")?;
    let text_range = pos + 1..pos + 1 + text.len();
    match kind {
        b'+' => Ok((Frame::Simple(text_range), next)),
        b'-' => Ok((Frame::Error(text_range), next)),
        b':' => Ok((Frame::Int(number(text)?), next)),
        b'$' => match length(text)? {
            None => Ok((Frame::Nil, next)),
            Some(n) => {
                let end = next.checked_add(n).ok_or("a length out of bounds")?;
                if buf.get(end..end + 2) != Some(b"\r\n".as_slice()) {
                    return Err("a bulk string cut short");
                }
                Ok((Frame::Bulk(next..end), end + 2))
            }
        },
        b'*' => match length(text)? {
            None => Ok((Frame::Nil, next)),
            Some(n) => {
                if depth == MAX_DEPTH && n > 0 {
                    return Err("arrays nested too deep");
                }
                // Every element takes at least 3 bytes: no allocation beyond the input.
                let mut items = Vec::with_capacity(n.min((buf.len() - next) / 3));
                let mut at = next;
                for _ in 0..n {
                    let (item, end) = parse(buf, at, depth + 1)?;
                    items.push(item);
                    at = end;
                }
                Ok((Frame::Array(items), at))
            }
        },
        _ => Err("an unknown reply type"),
    }
}

/// The reply reader fed `data` as a server would send it, for the fuzz target
/// (`active-store/fuzz`, `cargo xtask fuzz active`): the first byte is the size of the
/// pieces the bytes arrive in (a read returns at most that many), the second how many
/// replies are awaited (0 to 15), the rest the bytes. Whatever they are, the reader
/// answers or errs, never panics, and every reply it returns lies within its buffer.
#[cfg(feature = "fuzzing")]
pub fn fuzz_replies(data: &[u8]) {
    /// A connection that hands out `data` in pieces of `step` bytes and swallows writes.
    struct Pieces<'a> {
        data: &'a [u8],
        step: usize,
    }
    impl Read for Pieces<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.step.min(buf.len()).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }
    impl Write for Pieces<'_> {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    impl Wire for Pieces<'_> {
        fn limit(&self, _: Duration) -> io::Result<()> {
            Ok(())
        }
    }
    fn visit(replies: &Replies, frame: &Frame) {
        match frame {
            Frame::Simple(r) | Frame::Error(r) | Frame::Bulk(r) => {
                let _ = replies.bytes(r);
            }
            Frame::Array(items) => items.iter().for_each(|f| visit(replies, f)),
            Frame::Int(_) | Frame::Nil => {}
        }
    }
    let [step, awaited, input @ ..] = data else {
        return;
    };
    let mut wire = Pieces {
        data: input,
        step: usize::from(*step).max(1),
    };
    let awaited = usize::from(*awaited % 16);
    let deadline = Instant::now() + Duration::from_secs(3600);
    if let Ok(replies) = round_trip(&mut wire, b"", awaited, 0, deadline) {
        assert!(
            replies.frames().len() >= awaited,
            "fewer replies than awaited"
        );
        for frame in replies.frames() {
            visit(&replies, frame);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every complete reply of `input`, read in pieces of `step` bytes.
    fn scan_in_pieces(input: &[u8], step: usize) -> Result<(usize, Vec<Frame>), &'static str> {
        let mut scan = Scan::default();
        let mut end = 0;
        while end < input.len() {
            end = (end + step).min(input.len());
            scan.advance(&input[..end])?;
        }
        let mut frames = Vec::new();
        let mut pos = 0;
        while pos < scan.pos {
            let (f, next) = parse(input, pos, 0)?;
            frames.push(f);
            pos = next;
        }
        Ok((scan.done, frames))
    }

    const EXEC: &[u8] = b"+OK\r\n+QUEUED\r\n+QUEUED\r\n*3\r\n*4\r\n$2\r\n17\r\n$5\r\nc|1|2\r\n$1\r\n9\r\n$0\r\n\r\n*0\r\n*-1\r\n";

    #[test]
    fn replies_read_in_any_pieces_are_the_same() {
        let (done, whole) = scan_in_pieces(EXEC, EXEC.len()).unwrap();
        assert_eq!(done, 4);
        assert_eq!(whole.len(), 4);
        assert_eq!(whole[0], Frame::Simple(1..3));
        let Frame::Array(exec) = &whole[3] else {
            panic!("{:?}", whole[3])
        };
        let Frame::Array(hash) = &exec[0] else {
            panic!("{exec:?}")
        };
        let texts: Vec<&[u8]> = hash
            .iter()
            .map(|f| match f {
                Frame::Bulk(r) => &EXEC[r.clone()],
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(texts, [&b"17"[..], b"c|1|2", b"9", b""]);
        assert_eq!(exec[1..], [Frame::Array(vec![]), Frame::Nil]);
        for step in 1..EXEC.len() {
            assert_eq!(
                scan_in_pieces(EXEC, step).unwrap(),
                (4, whole.clone()),
                "{step}"
            );
        }
    }

    #[test]
    fn a_reply_cut_short_is_not_done() {
        for end in 0..EXEC.len() {
            let mut scan = Scan::default();
            scan.advance(&EXEC[..end]).unwrap();
            assert!(scan.done < 4, "{end}");
        }
    }

    #[test]
    fn integers_errors_and_nil_strings() {
        let input = b":-42\r\n-ERR no\r\n$-1\r\n";
        let (done, frames) = scan_in_pieces(input, 1).unwrap();
        assert_eq!(done, 3);
        assert_eq!(frames, [Frame::Int(-42), Frame::Error(7..13), Frame::Nil]);
    }

    #[test]
    fn garbage_is_an_error() {
        for bad in [
            &b"?what\r\n"[..],
            b"$3\r\nabcde\r\n",
            b"$x\r\n",
            b"*-2\r\n",
            b"$999999999999\r\n",
            b":1\n",
            b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n",
        ] {
            assert!(Scan::default().advance(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_transaction_gets_multi_and_exec_replies_too() {
        let mut read = redis::pipe();
        read.atomic()
            .hgetall("{elk:0}:active")
            .lrange("{elk:0}:plans", 0, -1);
        let mut plain = redis::pipe();
        plain.cmd("PING");
        let (out, replies) = pack(&[read.clone(), plain]);
        assert_eq!(replies, 4 + 1);
        assert!(out.starts_with(&read.get_packed_pipeline()));
        assert!(out.ends_with(b"*1\r\n$4\r\nPING\r\n"));
    }

    proptest::proptest! {
        /// Whatever the bytes, scanning and parsing return, never panic; and what the
        /// scan calls whole, the parser reads.
        #[test]
        fn any_bytes_are_an_answer_or_an_error(input in proptest::collection::vec(
            proptest::prop_oneof![
                proptest::sample::select(b"+-:$*\r\n0123-".to_vec()),
                proptest::num::u8::ANY,
            ],
            0..200,
        )) {
            let mut scan = Scan::default();
            if scan.advance(&input).is_ok() {
                let mut pos = 0;
                for _ in 0..scan.done {
                    let (_, next) = parse(&input, pos, 0).expect("a whole reply parses");
                    pos = next;
                }
            }
        }
    }
}
