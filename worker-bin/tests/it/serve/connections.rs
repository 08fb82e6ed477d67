//! How `serve` treats its connections: silent and half-open clients, the cap and the
//! timeouts, and one Redis connection reused across namespaces.

use super::*;

/// Connects and sends half a request head: a client that went silent. The write may
/// fail when the server already closed the connection (one beyond the cap).
fn half_open(addr: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    let _ = write!(s, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\n");
    s
}

/// Whether the server closed `s` (end of file or a reset) within `limit`.
fn closed_within(s: &mut TcpStream, limit: Duration) -> bool {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 512];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            // The server may answer an error (408, 503) before it closes.
            Ok(_) => continue,
            Err(e) => {
                return !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                );
            }
        }
    }
}

/// A silent client neither keeps a finished `run --metrics-listen` alive nor keeps
/// `serve` from stopping at SIGINT: shutdown waits for connections a short while only.
#[test]
fn a_silent_client_holds_no_process_open() {
    let dir = scratch("serve-silent");
    ok(tranche(
        &dir,
        &["plan", "--min", "1", "--max", "2", "--size", "1"],
    ));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut run = tranche(
        &dir,
        &[
            "run",
            "--exec",
            "sleep 2",
            "--chunk",
            "1",
            "--metrics-listen",
            &addr,
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    common::eventually(Duration::from_secs(20), "the metrics port", || {
        TcpStream::connect(&addr).is_ok()
    });
    let _silent = half_open(&addr);
    let connected = std::time::Instant::now();
    let exit = common::wait(&mut run, Duration::from_secs(60));
    assert!(exit.success(), "{exit:?}");
    assert!(
        connected.elapsed() < Duration::from_secs(10),
        "a half-open scrape kept the finished run alive {:?}",
        connected.elapsed()
    );

    let mut server = Server::start(&dir, None, None);
    let _silent = half_open(&server.addr);
    std::thread::sleep(Duration::from_millis(200));
    let signalled = std::time::Instant::now();
    common::signal(&server.child, "INT");
    common::wait(&mut server.child, Duration::from_secs(30));
    assert!(
        signalled.elapsed() < Duration::from_secs(5),
        "serve took {:?} to stop at SIGINT",
        signalled.elapsed()
    );
}

/// Connections beyond the cap are closed at once and the server lives on; a silent
/// one is closed once the header-read timeout is over.
#[test]
fn connections_are_capped_and_timed_out() {
    let dir = scratch("serve-cap");
    ok(tranche(&dir, &["plan", "--min", "1", "--max", "3000"]));
    let server = Server::start(&dir, None, None);
    let mut silent: Vec<TcpStream> = (0..64).map(|_| half_open(&server.addr)).collect();
    // The 65th is closed without an answer, quickly.
    let mut over = half_open(&server.addr);
    assert!(
        closed_within(&mut over, Duration::from_secs(3)),
        "the connection beyond the cap stayed open"
    );
    // One silent client leaves: its place is free for a real request.
    drop(silent.pop());
    common::eventually(Duration::from_secs(5), "a freed place", || {
        let mut s = TcpStream::connect(&server.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        // Refused while no place is free yet: the write may fail, the read be empty.
        let _ = write!(
            s,
            "GET /api/v1/config HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        );
        let mut raw = String::new();
        let _ = s.read_to_string(&mut raw);
        raw.starts_with("HTTP/1.1 200")
    });
    // Every silent client is cut off by the header-read timeout.
    let started = std::time::Instant::now();
    for s in &mut silent {
        assert!(
            closed_within(s, Duration::from_secs(15)),
            "a silent client stayed"
        );
    }
    assert!(started.elapsed() < Duration::from_secs(15));
    assert_eq!(server.json("/api/v1/config")["actions"], false);
}

/// `/api/v1/namespaces` reuses its Redis connection: 100 requests over 6 namespaces
/// open a bounded number of connections, not some per namespace per request.
#[test]
fn the_namespaces_endpoint_reuses_its_connection() {
    let redis = TestRedis::start();
    let dir = scratch("serve-namespaces");
    let url = redis.url();
    for ns in ["a", "b", "c", "d", "e", "tranche"] {
        ok(tranche(
            &dir,
            &[
                "--redis",
                &url,
                "--namespace",
                ns,
                "plan",
                "--min",
                "1",
                "--max",
                "3000",
            ],
        ));
    }
    let received = || -> u64 {
        let info = redis.cli(&["INFO", "stats"]);
        info.lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let server = Server::start(&dir, Some(&url), None);
    assert_eq!(
        server.json("/api/v1/namespaces").as_array().unwrap().len(),
        6
    );
    let before = received();
    for _ in 0..100 {
        assert_eq!(
            server.json("/api/v1/namespaces").as_array().unwrap().len(),
            6
        );
    }
    // `received` itself opens one per call.
    let opened = received() - before - 1;
    assert!(
        opened <= 10,
        "100 requests opened {opened} Redis connections"
    );
}
