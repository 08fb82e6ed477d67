//! The rate limit as pacers see it: accuracy, the per-window bound, the cost in calls,
//! live rate changes; in memory on tokio's paused clock and on a real Redis.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;
use tranche_codec::KeySchema;
use tranche_control::{
    Limit, MemoryRateLimiter, Pacer, Rate, RateLimiter, RedisRateLimiter, Reservation,
};

use support::TestRedis;

/// A limiter that counts its calls.
#[derive(Debug)]
struct Counting<L> {
    inner: L,
    calls: AtomicU64,
}

#[async_trait]
impl<L: RateLimiter> RateLimiter for Counting<L> {
    async fn reserve(
        &self,
        limit: Limit,
        rate: Rate,
        units: u64,
        burst: Duration,
    ) -> tranche_control::Result<Reservation> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.reserve(limit, rate, units, burst).await
    }
}

/// Runs `workers` pacers of `chunk`-unit acquisitions at `rate` for `span`, returns
/// every acquisition's time (relative to the start) and units.
async fn run(
    limiter: Arc<dyn RateLimiter>,
    workers: usize,
    rate: f64,
    chunk: u64,
    span: Duration,
) -> Vec<(Duration, u64)> {
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let pacer = Pacer::new(limiter.clone(), Limit::Ids, chunk * 100);
            pacer.set_rate(Some(Rate::per_second(rate).unwrap()));
            tokio::spawn(async move {
                let mut got = Vec::new();
                loop {
                    // The allowed instant, not the wake: a loaded runtime wakes late
                    // and bunches starts, which is the scheduler's doing, not the limit's.
                    let at = pacer.acquire(chunk).await.unwrap() - t0;
                    if at >= span {
                        return got;
                    }
                    got.push((at, chunk));
                }
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort();
    all
}

/// The units acquired in the busiest window of `window` (windows start at every
/// acquisition).
fn worst_window(got: &[(Duration, u64)], window: Duration) -> u64 {
    let mut worst = 0;
    let mut sum = 0;
    let mut j = 0;
    for i in 0..got.len() {
        sum += got[i].1;
        while got[i].0 - got[j].0 >= window {
            sum -= got[j].1;
            j += 1;
        }
        worst = worst.max(sum);
    }
    worst
}

fn check_accuracy(got: &[(Duration, u64)], rate: f64, span: Duration, workers: u64, chunk: u64) {
    let total: u64 = got.iter().map(|g| g.1).sum();
    let want = rate * span.as_secs_f64();
    let error = (total as f64 - want) / want;
    assert!(
        error.abs() <= 0.05,
        "{total} units in {span:?}, {want} wanted ({error:+.3})"
    );
    let worst = worst_window(got, Duration::from_secs(1));
    assert!(
        worst <= rate as u64 + workers * chunk,
        "a 1 s window took {worst} units at {rate}/s with {workers} workers"
    );
}

#[tokio::test(start_paused = true)]
async fn memory_pacers_share_the_rate_in_every_window() {
    for workers in [1, 4, 16] {
        let limiter: Arc<dyn RateLimiter> = Arc::new(MemoryRateLimiter::new());
        let span = Duration::from_secs(20);
        let got = run(limiter, workers, 1_000.0, 10, span).await;
        check_accuracy(&got, 1_000.0, span, workers as u64, 10);
    }
}

#[tokio::test(start_paused = true)]
async fn chunks_of_varying_size_waste_nothing() {
    let limiter: Arc<dyn RateLimiter> = Arc::new(MemoryRateLimiter::new());
    let pacer = Pacer::new(limiter, Limit::Ids, 1_000);
    pacer.set_rate(Some(Rate::per_second(1_000.0).unwrap()));
    let t0 = Instant::now();
    let span = Duration::from_secs(30);
    let mut got = Vec::new();
    for size in [7u64, 13, 10, 31, 3].into_iter().cycle() {
        let at = pacer.acquire(size).await.unwrap() - t0;
        if at >= span {
            break;
        }
        got.push((at, size));
    }
    check_accuracy(&got, 1_000.0, span, 1, 31);
    let total: u64 = got.iter().map(|g| g.1).sum();
    assert!((29_900..=30_100).contains(&total), "{total}");
}

#[tokio::test(start_paused = true)]
async fn at_full_speed_one_call_serves_a_hundred_chunks() {
    let counting = Arc::new(Counting {
        inner: MemoryRateLimiter::new(),
        calls: AtomicU64::new(0),
    });
    let span = Duration::from_secs(5);
    let got = run(counting.clone(), 4, 100_000.0, 10, span).await;
    check_accuracy(&got, 100_000.0, span, 4, 10);
    let calls = counting.calls.load(Ordering::Relaxed);
    let chunks = got.len() as u64;
    // Every pacer's first batches cover less than a hundred chunks while they grow.
    assert!(
        calls <= chunks / 100 + 4 * 4,
        "{calls} calls for {chunks} chunks"
    );
}

#[tokio::test(start_paused = true)]
async fn no_limit_makes_no_call_and_a_new_rate_applies_at_once() {
    let counting = Arc::new(Counting {
        inner: MemoryRateLimiter::new(),
        calls: AtomicU64::new(0),
    });
    let pacer = Pacer::new(counting.clone(), Limit::Partitions, 100);
    let t0 = Instant::now();
    for _ in 0..10_000 {
        pacer.acquire(1).await.unwrap();
    }
    assert_eq!(counting.calls.load(Ordering::Relaxed), 0);
    assert_eq!(t0.elapsed(), Duration::ZERO);

    pacer.set_rate(Some(Rate::per_second(100.0).unwrap()));
    let t1 = Instant::now();
    for _ in 0..200 {
        pacer.acquire(1).await.unwrap();
    }
    let fast = t1.elapsed();
    pacer.set_rate(Some(Rate::per_second(10.0).unwrap()));
    let t2 = Instant::now();
    for _ in 0..20 {
        pacer.acquire(1).await.unwrap();
    }
    let slow = t2.elapsed();
    // 200 at 100/s: the 200th starts at 1.99 s; 20 at 10/s: the 20th at 1.9 s, plus
    // what remains of the fast reservation's time.
    assert!((1.9..=2.1).contains(&fast.as_secs_f64()), "{fast:?}");
    assert!((1.8..=3.1).contains(&slow.as_secs_f64()), "{slow:?}");
    assert!(counting.calls.load(Ordering::Relaxed) >= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_pacers_share_the_rate_in_every_window() {
    let server = TestRedis::start();
    let conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let schema = KeySchema::new("elk", 4).unwrap();
    let limiter: Arc<dyn RateLimiter> = Arc::new(RedisRateLimiter::new(conn, &schema));
    let span = Duration::from_secs(3);
    let got = run(limiter, 4, 2_000.0, 20, span).await;
    check_accuracy(&got, 2_000.0, span, 4, 20);
}

/// The smallest rate with the largest reservation neither panics nor lets a unit
/// through early, in memory and on Redis; a rate below it is refused by name.
#[tokio::test(start_paused = true)]
async fn the_extreme_rates_are_safe_or_refused() {
    let err = "1e-300".parse::<Rate>().unwrap_err().to_string();
    assert!(err.contains("smallest rate"), "{err}");
    let slow = Rate::per_second(Rate::MIN).unwrap();
    let memory = MemoryRateLimiter::new();
    for _ in 0..3 {
        let r = memory
            .reserve(Limit::Ids, slow, 1_000_000_000_000, Duration::ZERO)
            .await
            .unwrap();
        assert!(r.start_offset_us >= 0);
    }
    let pacer = Pacer::new(
        Arc::new(MemoryRateLimiter::new()),
        Limit::Ids,
        1_000_000_000_000,
    );
    pacer.set_rate(Some(slow));
    pacer.acquire(1).await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(3_600), pacer.acquire(1)).await;
    assert!(second.is_err(), "a second unit at 1e-4/s waits for hours");
}

#[tokio::test]
async fn redis_takes_the_extreme_rates() {
    let server = TestRedis::start();
    let conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let limiter = RedisRateLimiter::new(conn, &KeySchema::new("elk", 4).unwrap());
    for rate in [Rate::MAX, Rate::MIN] {
        let rate = Rate::per_second(rate).unwrap();
        for _ in 0..2 {
            limiter
                .reserve(Limit::Ids, rate, 1_000_000_000_000, Duration::ZERO)
                .await
                .unwrap();
        }
    }
    // Past the smallest rate's reservations, the next start is far ahead, never wrapped
    // into the past.
    let next = limiter
        .reserve(
            Limit::Ids,
            Rate::per_second(1.0).unwrap(),
            1,
            Duration::ZERO,
        )
        .await
        .unwrap();
    assert!(next.start_offset_us > 1_000_000_000_000, "{next:?}");
}
