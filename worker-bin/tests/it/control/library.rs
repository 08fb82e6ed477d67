//! Production control from the library: a `Runner`'s probe closure and its live
//! `ControlHandle`, on Redis and embedded.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tranche_worker::{Chunk, Handler, HandlerError, ProbeOutcome, Runner};

/// Records when each chunk started.
#[derive(Clone, Default)]
struct Starts(Arc<Mutex<Vec<(Instant, u64)>>>);

#[async_trait::async_trait]
impl Handler for Starts {
    async fn process(&self, chunk: Chunk) -> Result<(), HandlerError> {
        self.0
            .lock()
            .unwrap()
            .push((Instant::now(), chunk.to - chunk.from + 1));
        tokio::time::sleep(Duration::from_millis(5)).await;
        Ok(())
    }
}

impl Starts {
    fn since(&self, t: Instant) -> Vec<(Instant, u64)> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(at, _)| *at > t)
            .copied()
            .collect()
    }
}

/// IDs per second started after `t` (the last chunk not counted).
fn rate_since(starts: &[(Instant, u64)]) -> f64 {
    let first = starts.iter().map(|s| s.0).min().unwrap();
    let last = starts.iter().max_by_key(|s| s.0).unwrap();
    let ids: u64 = starts.iter().map(|s| s.1).sum::<u64>() - last.1;
    ids as f64 / (last.0 - first).as_secs_f64()
}

async fn probe_and_handle(runner: Runner) {
    runner
        .plan(tranche_worker::Plan::ids(1..=1_000_000).partition_size(1000))
        .await
        .unwrap();
    let hold = Arc::new(AtomicBool::new(false));
    let probe_hold = hold.clone();
    let runner = runner
        .concurrency(4)
        .chunk(100)
        .max_rate(4000.0)
        .throttle_interval(Duration::from_millis(200))
        .throttle_probe(move || {
            let hold = probe_hold.load(Ordering::Relaxed);
            async move {
                if hold {
                    ProbeOutcome::Throttle {
                        reason: "the closure says wait".into(),
                    }
                } else {
                    ProbeOutcome::Go
                }
            }
        });
    let handle = runner.control();
    let starts = Starts::default();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn({
        let starts = starts.clone();
        async move {
            runner
                .run_with_shutdown(starts, async move {
                    let _ = stop_rx.await;
                })
                .await
        }
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    let t = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let r = rate_since(&starts.since(t));
    assert!((3400.0..=4400.0).contains(&r), "{r:.0} IDs/s at 4000/s");

    // The handle lowers the rate live.
    handle.set_max_rate(Some(1000.0)).unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let t = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let r = rate_since(&starts.since(t));
    assert!(r <= 1100.0, "{r:.0} IDs/s after the handle set 1000/s");

    // The probe closure throttles: nothing starts from 2 s on.
    hold.store(true, Ordering::Relaxed);
    let on = Instant::now();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let late = starts.since(on + Duration::from_secs(2));
    assert!(
        late.is_empty(),
        "{} chunks started while throttled",
        late.len()
    );
    hold.store(false, Ordering::Relaxed);
    let off = Instant::now();
    let deadline = off + Duration::from_secs(10);
    while starts.since(off).is_empty() {
        assert!(Instant::now() < deadline, "work never resumed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first = starts.since(off).iter().map(|s| s.0).min().unwrap();
    assert!(
        first - off <= Duration::from_secs(2),
        "resumed after {:?}",
        first - off
    );
    let _ = stop_tx.send(());
    let report = task.await.unwrap().unwrap();
    assert!(report.interrupted);
}

#[tokio::test]
async fn runner_probe_closure_and_live_handle_on_redis() {
    let redis = super::TestRedis::start();
    probe_and_handle(Runner::redis(redis.url()).namespace("lib")).await;
}

#[tokio::test]
async fn runner_probe_closure_and_live_handle_embedded() {
    let dir = super::scratch("lib-embedded");
    probe_and_handle(Runner::embedded(dir.join("state")).namespace("lib")).await;
}
