//! `Event::StoreError`: a runner whose Redis goes away for a while says so to its
//! subscribers, once per failed call and never while calls succeed, and still finishes
//! the job once Redis is back; `Runner::metrics` counts them by operation. The rate
//! limiter it cannot reach is among them.

use crate::support;

use std::io::Write as _;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::TestRedis;
use tranche_worker::{Chunk, Event, Handler, HandlerError, Runner, StoreOp};

/// A TCP proxy to a Redis that can be cut: every open connection closed, new ones
/// dropped at once (Redis unreachable), until it is mended.
struct Proxy {
    port: u16,
    cut: Arc<AtomicBool>,
    /// Both sides of every connection, so that a cut can close them.
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (c, k) = (cut.clone(), conns.clone());
        // Its threads end with the test process.
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if c.load(SeqCst) {
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let pair = (client.try_clone(), server.try_clone());
                let (Ok(client2), Ok(server2)) = pair else {
                    continue;
                };
                let mut held = k.lock().unwrap();
                held.push(client.try_clone().unwrap());
                held.push(server.try_clone().unwrap());
                drop(held);
                std::thread::spawn(move || pump(client, server));
                std::thread::spawn(move || pump(server2, client2));
            }
        });
        Proxy { port, cut, conns }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Cuts (`true`) or mends the proxy.
    fn set_cut(&self, cut: bool) {
        self.cut.store(cut, SeqCst);
        if cut {
            for conn in self.conns.lock().unwrap().drain(..) {
                let _ = conn.shutdown(Shutdown::Both);
            }
        }
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.flush();
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

/// A short sleep per chunk.
struct Slow;

#[async_trait::async_trait]
impl Handler for Slow {
    async fn process(&self, _chunk: Chunk) -> Result<(), HandlerError> {
        tokio::time::sleep(Duration::from_millis(40)).await;
        Ok(())
    }
}

/// Redis unreachable for 6 s in the middle of a run, longer than the store's own
/// retries and the connection manager's reconnects (a 2 s cut is ridden out without a
/// failed call): the failed calls reach the subscribers as `StoreError`s, none before
/// the cut, and the run finishes every partition once Redis is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_is_told_and_the_run_finishes() {
    let redis = TestRedis::start();
    let proxy = Proxy::start(redis.port());
    let cut = Arc::new(AtomicBool::new(false));
    // Each event with whether the cut had begun when it came.
    let events: Arc<Mutex<Vec<(bool, Event)>>> = Arc::default();
    #[cfg(feature = "metrics")]
    let mut registry = prometheus_client::registry::Registry::default();
    let runner = Runner::redis(proxy.url())
        .namespace("outage")
        .worker_id("outage-1")
        .lease(Duration::from_secs(3))
        .chunk(250)
        .concurrency(2)
        // 5,000 IDs a second: the chunks reserve IDs from Redis's limiter a second's worth
        // at most at a time, and the two partitions in flight at the cut hold two
        // seconds of work, so they ask during it.
        .max_rate(5_000.0)
        .on_event({
            let (events, cut) = (events.clone(), cut.clone());
            move |e| {
                if !matches!(e, Event::Progress(_) | Event::ChunkDone { .. }) {
                    events.lock().unwrap().push((cut.load(SeqCst), e.clone()));
                }
            }
        });
    #[cfg(feature = "metrics")]
    let runner = runner.metrics(&mut registry);
    runner
        .plan(tranche_worker::Plan::ids(1..=30_000).partition_size(5000))
        .await
        .unwrap();
    let run = tokio::spawn(async move { runner.run(Slow).await });
    tokio::time::sleep(Duration::from_millis(600)).await;
    cut.store(true, SeqCst);
    proxy.set_cut(true);
    tokio::time::sleep(Duration::from_secs(6)).await;
    proxy.set_cut(false);
    let report = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the run finishes once Redis is back")
        .unwrap()
        .unwrap();
    assert_eq!(
        (report.namespace.outstanding, report.namespace.failed),
        (0, 0),
        "{report:?}"
    );
    let events = events.lock().unwrap().clone();
    let errors: Vec<&(bool, Event)> = events
        .iter()
        .filter(|(_, e)| matches!(e, Event::StoreError { .. }))
        .collect();
    assert!(!errors.is_empty(), "no StoreError: {events:?}");
    assert!(
        errors.iter().all(|(after_cut, _)| *after_cut),
        "a StoreError before the cut: {errors:?}"
    );
    for (_, e) in &errors {
        let Event::StoreError { op, error } = e else {
            unreachable!()
        };
        assert!(!error.is_empty() && !op.as_str().is_empty(), "{e:?}");
    }
    // The claim loop was among those that went on without their call.
    assert!(
        errors.iter().any(|(_, e)| matches!(
            e,
            Event::StoreError {
                op: StoreOp::Claim | StoreOp::Report | StoreOp::Heartbeat,
                ..
            }
        )),
        "{errors:?}"
    );
    // So were the chunks waiting on the rate limiter: none started without it.
    assert!(
        errors.iter().any(|(_, e)| matches!(
            e,
            Event::StoreError {
                op: StoreOp::RateLimit,
                ..
            }
        )),
        "{errors:?}"
    );
    // `tranche_worker_store_errors_total{op}` counts each operation's failed calls,
    // as many as its events.
    #[cfg(feature = "metrics")]
    {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for op in StoreOp::ALL {
            let told = errors
                .iter()
                .filter(|(_, e)| matches!(e, Event::StoreError { op: o, .. } if *o == op))
                .count();
            let line = format!("tranche_worker_store_errors_total{{op=\"{op}\"}} {told}");
            assert!(
                told == 0 || text.lines().any(|l| l == line),
                "{line} in\n{text}"
            );
        }
    }
}
