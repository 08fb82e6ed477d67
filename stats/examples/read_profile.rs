//! Where the time of one statistics read goes, at the router benchmark's size.
//!
//! Fills a private `redis-server` with the statistics of `TRANCHE_PROFILE_RECORDS`
//! completed partitions (default 600,000: 1000 IDs each, eight workers, durations of
//! 200 to 400 s, one shard, as `router/benches/router.rs` builds them through the
//! archive), then times `TRANCHE_PROFILE_SAMPLES` (default 50) calls of each read:
//! the raw `HGETALL` pipelines alone (Redis and the transfer, no decoding),
//! [`StatsStore::summary`] and the full [`StatsStore::stats`]. The difference between a
//! read and its raw pipeline is the decoding and rendering in this process; run it
//! under `perf record -g` to split that further.
//!
//! ```text
//! cargo run --release -p tranche-stats --example read_profile
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use tranche_codec::{CompletedRecord, KeySchema};
use tranche_stats::archive_protocol::stats_keys;
use tranche_stats::{RedisStats, StatsDelta, StatsStore};

/// Records per applied delta, as the router bench drains the inbox every 10,000.
const DELTA: u64 = 10_000;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// p50 and p99 in milliseconds.
fn percentiles(mut xs: Vec<Duration>) -> (f64, f64) {
    xs.sort();
    let at = |q: usize| xs[(xs.len() * q / 100).min(xs.len() - 1)].as_secs_f64() * 1000.0;
    (at(50), at(99))
}

async fn time<F, Fut>(samples: u64, mut f: F) -> (f64, f64)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    f().await;
    let mut times = Vec::new();
    for _ in 0..samples {
        let t = Instant::now();
        f().await;
        times.push(t.elapsed());
    }
    percentiles(times)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let records = env("TRANCHE_PROFILE_RECORDS", 600_000);
    let samples = env("TRANCHE_PROFILE_SAMPLES", 50);
    let server = tranche_testkit::TestRedis::start();
    let client = redis::Client::open(server.url()).expect("redis url");
    let conn = client
        .get_connection_manager()
        .await
        .expect("connect to the private redis-server");
    let schema = KeySchema::new("elk", 1).expect("schema");
    let stats = Arc::new(RedisStats::new(conn.clone(), schema.clone()));

    let t = Instant::now();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let start_ms = 1_719_234_405_000;
    let mut pid = 1;
    while pid <= records {
        let end = (pid + DELTA).min(records + 1);
        let batch: Vec<CompletedRecord> = (pid..end)
            .map(|p| CompletedRecord {
                pid: p,
                min_id: (p - 1) * 1000 + 1,
                max_id: p * 1000,
                worker: Arc::from(format!("worker{}", 1 + rng.random_range(0..8))),
                completed_at_ms: start_ms + p * 6,
                duration_ms: 200_000 + rng.random_range(0..200_000),
            })
            .collect();
        tranche_stats::testing::apply_alone(
            &stats,
            0,
            &StatsDelta::from_records(&batch),
            start_ms + end * 6,
        )
        .await
        .expect("apply");
        pid = end;
    }
    eprintln!(
        "applied the statistics of {records} partitions in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    let keys = stats_keys(&schema, 0);
    let raw = |which: &'static [usize]| {
        let keys = keys.clone();
        let conn = conn.clone();
        move || {
            let mut pipe = redis::pipe();
            for &i in which {
                pipe.hgetall(&keys[i]);
            }
            let mut conn = conn.clone();
            async move {
                let _: Vec<Vec<(String, Vec<u8>)>> =
                    pipe.query_async(&mut conn).await.expect("HGETALL");
            }
        }
    };
    let mut rows = vec![
        (
            "raw HGETALL, all five hashes",
            time(samples, raw(&[0, 1, 2, 3, 4])).await,
        ),
        (
            "raw HGETALL, without ranges",
            time(samples, raw(&[0, 1, 3, 4])).await,
        ),
    ];
    let full = stats.stats().await.expect("stats");
    rows.push((
        "summary()",
        time(samples, || async {
            stats.summary().await.expect("summary");
        })
        .await,
    ));
    rows.push((
        "stats() (every range)",
        time(samples, || async {
            stats.stats().await.expect("stats");
        })
        .await,
    ));
    let bytes = |i: usize| {
        let key = keys[i].clone();
        server
            .cli(&["MEMORY", "USAGE", &key])
            .trim()
            .parse::<u64>()
            .unwrap_or(0)
    };
    println!(
        "{records} partitions: {} ranges, {} workers; hashes (MEMORY USAGE bytes): \
         global {}, workers {}, ranges {}, hourly {}, hist {}",
        full.range_stats.len(),
        full.worker_stats.len(),
        bytes(0),
        bytes(1),
        bytes(2),
        bytes(3),
        bytes(4),
    );
    println!("{:<32} {:>9} {:>9}", "read", "p50 ms", "p99 ms");
    for (name, (p50, p99)) in rows {
        println!("{name:<32} {p50:>9.3} {p99:>9.3}");
    }
}
