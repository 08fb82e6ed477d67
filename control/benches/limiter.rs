//! `cargo bench -p tranche-control --bench limiter`: the fleet-wide rate limit on a
//! private Redis. For each pacer count (`TRANCHE_BENCH_PACERS`, default `1,4,16`) it
//! runs that many pacers, each on its own connection as separate worker processes
//! would be, acquiring chunks of `TRANCHE_BENCH_CHUNK` IDs (default 100) at
//! `TRANCHE_BENCH_RATE` IDs/s (default 20000) for `TRANCHE_BENCH_SECS` seconds (default
//! 60), and prints the rate achieved against the limit, the busiest 1-second window of
//! the instants the pacers allowed (and its excess in chunks per pacer; the same at the
//! instants the tasks woke, which a loaded runtime bunches), the limiter's Redis calls per chunk and its
//! Redis CPU per call (`INFO commandstats`).
//!
//! `TRANCHE_BENCH_SMOKE=1` runs 3 s with 1 and 4 pacers. Writes
//! `target/tranche-bench/limiter.json` (or `$TRANCHE_BENCH_OUT`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tranche_codec::KeySchema;
use tranche_control::{Limit, Pacer, Rate, RateLimiter, RedisRateLimiter};

use tranche_testkit::TestRedis;

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The busiest window of `window` over sorted acquisition times, in units.
fn worst_window(got: &[(Duration, u64)], window: Duration) -> u64 {
    let (mut worst, mut sum, mut j) = (0, 0, 0);
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

/// `(calls, usec)` of EVALSHA and EVAL so far.
fn script_stats(server: &TestRedis) -> (u64, u64) {
    let info: String = server.query(redis::cmd("INFO").arg("commandstats"));
    let mut calls = 0;
    let mut usec = 0;
    for line in info.lines() {
        if line.starts_with("cmdstat_evalsha:") || line.starts_with("cmdstat_eval:") {
            for field in line.split(':').nth(1).unwrap_or("").split(',') {
                match field.split_once('=') {
                    Some(("calls", v)) => calls += v.parse::<u64>().unwrap_or(0),
                    Some(("usec", v)) => usec += v.parse::<u64>().unwrap_or(0),
                    _ => {}
                }
            }
        }
    }
    (calls, usec)
}

fn main() {
    let smoke = std::env::var_os("TRANCHE_BENCH_SMOKE").is_some();
    let secs: f64 = env("TRANCHE_BENCH_SECS", if smoke { 3.0 } else { 60.0 });
    let rate: f64 = env("TRANCHE_BENCH_RATE", 20_000.0);
    let chunk: u64 = env("TRANCHE_BENCH_CHUNK", 100);
    let pacers: Vec<usize> = std::env::var("TRANCHE_BENCH_PACERS")
        .unwrap_or_else(|_| if smoke { "1,4".into() } else { "1,4,16".into() })
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    let span = Duration::from_secs_f64(secs);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = TestRedis::start();
    println!(
        "limiter: {rate} IDs/s, chunks of {chunk}, {secs} s per cell, private Redis on :{}",
        server.port()
    );
    println!(
        "{:>7} {:>11} {:>8} {:>12} {:>15} {:>12} {:>13} {:>12}",
        "pacers",
        "IDs/s",
        "error",
        "worst 1 s",
        "excess/pacer",
        "(at wake)",
        "calls/chunk",
        "µs/call"
    );
    let mut cells = Vec::new();
    for (cell, &n) in pacers.iter().enumerate() {
        // A namespace per cell, so no cell inherits another's reservations.
        let schema = KeySchema::new(&format!("bench{cell}"), 1).unwrap();
        let (calls0, usec0) = script_stats(&server);
        let got = runtime.block_on(async {
            let t0 = Instant::now();
            let mut tasks = Vec::new();
            for _ in 0..n {
                let conn = redis::Client::open(server.url())
                    .unwrap()
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap();
                let limiter: Arc<dyn RateLimiter> = Arc::new(RedisRateLimiter::new(conn, &schema));
                let pacer = Pacer::new(limiter, Limit::Ids, chunk * 100);
                pacer.set_rate(Some(Rate::per_second(rate).unwrap()));
                tasks.push(tokio::spawn(async move {
                    let mut got = Vec::new();
                    loop {
                        let at = pacer.acquire(chunk).await.unwrap().into_std() - t0;
                        let woke = t0.elapsed();
                        if at >= span {
                            return got;
                        }
                        got.push((at, woke, chunk));
                    }
                }));
            }
            let mut all = Vec::new();
            for t in tasks {
                all.extend(t.await.unwrap());
            }
            all.sort();
            all
        });
        let (calls1, usec1) = script_stats(&server);
        let allowed: Vec<(Duration, u64)> = got.iter().map(|g| (g.0, g.2)).collect();
        let mut woke: Vec<(Duration, u64)> = got.iter().map(|g| (g.1, g.2)).collect();
        woke.sort();
        let total: u64 = allowed.iter().map(|g| g.1).sum();
        let achieved = total as f64 / secs;
        let error = achieved / rate - 1.0;
        let worst = worst_window(&allowed, Duration::from_secs(1));
        let worst_woke = worst_window(&woke, Duration::from_secs(1));
        let excess = (worst as f64 - rate).max(0.0) / chunk as f64 / n as f64;
        let calls = calls1 - calls0;
        let chunks = got.len() as u64;
        let calls_per_chunk = calls as f64 / chunks.max(1) as f64;
        let usec_per_call = (usec1 - usec0) as f64 / calls.max(1) as f64;
        println!(
            "{n:>7} {achieved:>11.1} {:>7.2}% {worst:>12} {excess:>15.2} {worst_woke:>12} {calls_per_chunk:>13.4} {usec_per_call:>12.2}",
            error * 100.0
        );
        cells.push(serde_json::json!({
            "pacers": n,
            "limit_ids_per_s": rate,
            "chunk": chunk,
            "secs": secs,
            "achieved_ids_per_s": achieved,
            "error": error,
            "worst_1s_window_ids": worst,
            "worst_1s_window_ids_at_wake": worst_woke,
            "excess_chunks_per_pacer": excess,
            "limiter_calls": calls,
            "chunks": chunks,
            "calls_per_chunk": calls_per_chunk,
            "redis_usec_per_call": usec_per_call,
        }));
    }
    let out = std::env::var_os("TRANCHE_BENCH_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/tranche-bench/limiter.json")
        });
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    std::fs::write(&out, serde_json::to_string_pretty(&cells).unwrap()).unwrap();
    println!("wrote {}", out.display());
}
