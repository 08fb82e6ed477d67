//! `cargo xtask bench active`: the claim -> complete lifecycle through the Redis backend
//! on a private server, beside raw Redis figures (`redis-benchmark -t set`) measured on
//! the same server in the same run, so the result reads as a ratio.
//!
//! Writes `target/tranche-bench/active.json` (or `$TRANCHE_BENCH_OUT`). With
//! `TRANCHE_BENCH_STATS=1` it also prints Redis's `INFO commandstats` and CPU after each
//! lifecycle cell. Every cell reports Redis CPU per partition (the server's user + system
//! CPU over the cell, from `INFO cpu`, divided by the partitions done): the figure to
//! drive down, and on a machine shared with the client a better guide than the rate.
//!
//! With `TRANCHE_BENCH_SMOKE=1` each cell runs 1 s and `redis-benchmark` sends 10,000
//! SETs: a few seconds, figures not judged, every path still run, JSON still written.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use tranche_active_store::{Config, Leases, Plan, Planner, RedisActiveStore, RedisConnection};

use tranche_testkit::TestRedis;

/// Partitions per claim, as the issue sets it.
const CLAIM_BATCH: usize = 10;
/// Whether `TRANCHE_BENCH_SMOKE=1` asks for the small run.
static SMOKE: std::sync::LazyLock<bool> =
    std::sync::LazyLock::new(|| std::env::var("TRANCHE_BENCH_SMOKE").is_ok_and(|v| v == "1"));

/// How long each lifecycle cell runs: 4 s, 1 s in smoke mode.
fn cell() -> Duration {
    Duration::from_secs(if *SMOKE { 1 } else { 4 })
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(run());
}

async fn run() {
    let server = TestRedis::start();
    let set_per_s = redis_benchmark_set(server.port());
    println!("redis-benchmark -t set -c 50 on the same server: {set_per_s:.0} SET/s");

    let mut lifecycle = Vec::new();
    let mut latency = (0.0, 0.0);
    for workers in [1usize, 8, 32] {
        let cell = lifecycle_cell(&server, workers).await;
        println!(
            "lifecycle, {workers:>2} workers: {:>9.0} partitions/s  ({:.2}x of SET)  complete p50 {:.3} ms  p99 {:.3} ms  Redis CPU {:.1} us/partition",
            cell.rate,
            cell.rate / set_per_s,
            cell.p50_ms,
            cell.p99_ms,
            cell.redis_cpu_us
        );
        if workers == 8 {
            latency = (cell.p50_ms, cell.p99_ms);
        }
        lifecycle.push((workers, cell));
    }
    let heartbeat_per_s = heartbeat_cell(&server).await;
    println!(
        "heartbeats on their own, 32 tasks: {heartbeat_per_s:.0}/s ({:.2}x of SET)",
        heartbeat_per_s / set_per_s
    );
    let plan_bytes = plan_cost(&server).await;
    println!("plan of 5e9 IDs (size 1000): {plan_bytes} bytes of Redis memory");

    let json = serde_json::json!({
        "lifecycle_per_s": lifecycle.iter().map(|(w, c)| (w.to_string(), serde_json::json!(c.rate))).collect::<serde_json::Map<_, _>>(),
        "redis_cpu_us_per_partition": lifecycle.iter().map(|(w, c)| (w.to_string(), serde_json::json!(c.redis_cpu_us))).collect::<serde_json::Map<_, _>>(),
        "heartbeat_per_s": heartbeat_per_s,
        "complete_p50_ms": latency.0,
        "complete_p99_ms": latency.1,
        "redis_set_per_s": set_per_s,
        "plan_5e9_bytes": plan_bytes,
    });
    let out = std::env::var_os("TRANCHE_BENCH_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/tranche-bench/active.json")
        });
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    std::fs::write(&out, serde_json::to_string_pretty(&json).unwrap()).unwrap();
    println!("written to {}", out.display());
}

fn redis_benchmark_set(port: u16) -> f64 {
    // Beside the server the tests use (`TRANCHE_REDIS_SERVER`) when it is there, as xtask
    // may have installed both off PATH; otherwise from PATH.
    let beside = std::env::var_os("TRANCHE_REDIS_SERVER")
        .map(|server| PathBuf::from(server).with_file_name("redis-benchmark"))
        .filter(|path| path.is_file());
    let out = Command::new(beside.unwrap_or_else(|| "redis-benchmark".into()))
        .args([
            "-p",
            &port.to_string(),
            "-t",
            "set",
            "-c",
            "50",
            "-n",
            if *SMOKE { "10000" } else { "300000" },
            "-q",
        ])
        .output()
        .expect("redis-benchmark (it ships with redis-server) must be on PATH");
    let text = String::from_utf8_lossy(&out.stdout);
    // "SET: 154320.98 requests per second, p50=0.159 msec" (progress lines end in \r).
    text.split(['\r', '\n'])
        .filter_map(|line| line.strip_prefix("SET: "))
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .next_back()
        .unwrap_or_else(|| panic!("unexpected redis-benchmark output: {text}"))
}

async fn fresh_store(server: &TestRedis, namespace: &str) -> RedisActiveStore {
    let conn = RedisConnection::connect(&server.url()).await.unwrap();
    let config = Config {
        namespace: namespace.to_owned(),
        ..Config::default()
    };
    let store = RedisActiveStore::new(conn, config).unwrap();
    store
        .plan(&Plan::Uniform {
            min: 1,
            max: 1_000_000_000_000,
            size: 1000,
        })
        .await
        .unwrap();
    store
}

/// What one lifecycle cell measured.
struct Cell {
    /// Partitions claimed and completed per second.
    rate: f64,
    /// Completion latency, median and 99th percentile, in ms.
    p50_ms: f64,
    p99_ms: f64,
    /// Redis CPU (user + system) per partition over the cell, in µs.
    redis_cpu_us: f64,
}

/// The server's CPU so far (user + system), in seconds, from `INFO cpu`.
async fn redis_cpu(conn: &mut RedisConnection) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .filter_map(|line| {
            let (key, value) = line.split_once(':')?;
            matches!(key, "used_cpu_user" | "used_cpu_sys")
                .then(|| value.trim().parse::<f64>().ok())?
        })
        .sum()
}

/// `workers` tasks each claim 10 and complete them one by one, for [`cell()`].
async fn lifecycle_cell(server: &TestRedis, workers: usize) -> Cell {
    let store = Arc::new(fresh_store(server, &format!("life{workers}")).await);
    let mut conn = RedisConnection::connect(&server.url()).await.unwrap();
    let cpu_before = redis_cpu(&mut conn).await;
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..workers {
        let (store, done) = (store.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let worker = format!("worker-{w}");
            let mut hist = Histogram::<u64>::new(3).unwrap();
            while start.elapsed() < cell() {
                let leases = store.claim(&worker, CLAIM_BATCH).await.unwrap();
                for lease in &leases {
                    let t = Instant::now();
                    store.complete(lease, 300_000).await.unwrap();
                    hist.record(t.elapsed().as_micros() as u64).unwrap();
                }
                done.fetch_add(leases.len() as u64, Ordering::Relaxed);
            }
            hist
        }));
    }
    let mut hist = Histogram::<u64>::new(3).unwrap();
    for t in tasks {
        hist.add(t.await.unwrap()).unwrap();
    }
    let partitions = done.load(Ordering::Relaxed) as f64;
    let rate = partitions / start.elapsed().as_secs_f64();
    let redis_cpu_us = (redis_cpu(&mut conn).await - cpu_before) * 1e6 / partitions.max(1.0);
    // Leave the server as we found it for the next cell.
    if std::env::var_os("TRANCHE_BENCH_STATS").is_some() {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await
            .unwrap();
        let cpu: String = redis::cmd("INFO")
            .arg("cpu")
            .query_async(&mut conn)
            .await
            .unwrap();
        println!("{info}\n{cpu}");
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
    Cell {
        rate,
        p50_ms: hist.value_at_quantile(0.5) as f64 / 1000.0,
        p99_ms: hist.value_at_quantile(0.99) as f64 / 1000.0,
        redis_cpu_us,
    }
}

/// 32 tasks heartbeat 10 leases each, round and round, for [`cell()`].
async fn heartbeat_cell(server: &TestRedis) -> f64 {
    let store = Arc::new(fresh_store(server, "beat").await);
    let count = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..32 {
        let (store, count) = (store.clone(), count.clone());
        tasks.push(tokio::spawn(async move {
            let leases = store
                .claim(&format!("worker-{w}"), CLAIM_BATCH)
                .await
                .unwrap();
            let mut progress = 0;
            while start.elapsed() < cell() {
                for lease in &leases {
                    progress += 1;
                    store
                        .heartbeat(lease, lease.min_id + progress % 1000)
                        .await
                        .unwrap();
                }
                count.fetch_add(leases.len() as u64, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let rate = count.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();
    let mut conn = RedisConnection::connect(&server.url()).await.unwrap();
    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
    rate
}

/// Redis memory of a 5e9-ID plan: every key's `MEMORY USAGE`.
async fn plan_cost(server: &TestRedis) -> u64 {
    let mut conn = RedisConnection::connect(&server.url()).await.unwrap();
    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
    let store = RedisActiveStore::new(conn.clone(), Config::default()).unwrap();
    store
        .plan(&Plan::Uniform {
            min: 1,
            max: 5_000_000_000,
            size: 1000,
        })
        .await
        .unwrap();
    server.bytes_of_all_keys()
}
