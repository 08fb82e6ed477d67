//! The soak's own TCP proxy between the workers and Redis, whose behaviour switches at
//! run time: pass bytes through, add latency, hold everything (a blackhole: nothing is
//! lost, TCP would retransmit it later), refuse (Redis unreachable), or reset every
//! connection once. One thread per direction of each connection pair.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use anyhow::{Context, Result};

/// What the proxy does to the traffic now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Bytes pass as they come.
    Pass,
    /// Each read is held this long before it is forwarded (each direction).
    Latency(Duration),
    /// Nothing moves and new connections wait; held bytes flow when it ends.
    Blackhole,
    /// Every connection is closed and new ones are dropped at once.
    Refuse,
}

/// A running proxy; dropping it leaves its threads to die with the process.
pub(crate) struct Proxy {
    /// The port the workers connect to.
    pub(crate) port: u16,
    shared: Arc<Shared>,
}

struct Shared {
    upstream: Mutex<u16>,
    mode: Mutex<Mode>,
    /// Live connection pairs by id, so that a reset can close them all.
    conns: Mutex<Vec<(u64, TcpStream, TcpStream)>>,
    next_id: AtomicU64,
}

impl Proxy {
    /// Listens on a free port of 127.0.0.1 and forwards to `upstream`.
    pub(crate) fn start(upstream: u16) -> Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").context("the proxy could not listen")?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared {
            upstream: Mutex::new(upstream),
            mode: Mutex::new(Mode::Pass),
            conns: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(0),
        });
        let accept = Arc::clone(&shared);
        thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let shared = Arc::clone(&accept);
                thread::spawn(move || connect(shared, client));
            }
        });
        Ok(Proxy { port, shared })
    }

    /// Switches the mode; `Refuse` closes every open connection too.
    pub(crate) fn set(&self, mode: Mode) {
        *self.shared.mode.lock().unwrap() = mode;
        if mode == Mode::Refuse {
            self.reset();
        }
    }

    /// Closes every open connection (both sides) once; new ones are served as usual.
    pub(crate) fn reset(&self) {
        for (_, a, b) in self.shared.conns.lock().unwrap().drain(..) {
            let _ = a.shutdown(Shutdown::Both);
            let _ = b.shutdown(Shutdown::Both);
        }
    }
}

fn mode(shared: &Shared) -> Mode {
    *shared.mode.lock().unwrap()
}

fn connect(shared: Arc<Shared>, client: TcpStream) {
    loop {
        match mode(&shared) {
            Mode::Refuse => return,
            Mode::Blackhole => thread::sleep(Duration::from_millis(50)),
            _ => break,
        }
    }
    let upstream = *shared.upstream.lock().unwrap();
    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let (Ok(c2), Ok(s2), Ok(c3), Ok(s3)) = (
        client.try_clone(),
        server.try_clone(),
        client.try_clone(),
        server.try_clone(),
    ) else {
        return;
    };
    shared.conns.lock().unwrap().push((id, c3, s3));
    let back = Arc::clone(&shared);
    let t = thread::spawn(move || pump(&back, s2, c2));
    pump(&shared, client, server);
    let _ = t.join();
    shared.conns.lock().unwrap().retain(|(i, _, _)| *i != id);
}

/// Copies `from` to `to` under the current mode until either side closes.
fn pump(shared: &Shared, mut from: TcpStream, mut to: TcpStream) {
    let _ = from.set_read_timeout(Some(Duration::from_millis(100)));
    let mut buf = vec![0; 64 * 1024];
    loop {
        match mode(shared) {
            Mode::Blackhole => {
                thread::sleep(Duration::from_millis(50));
                continue;
            }
            Mode::Refuse => break,
            _ => {}
        }
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(_) => break,
        };
        loop {
            match mode(shared) {
                Mode::Latency(d) => {
                    thread::sleep(d);
                    break;
                }
                Mode::Blackhole => thread::sleep(Duration::from_millis(50)),
                _ => break,
            }
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}
