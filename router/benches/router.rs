//! Router latency benchmark: p50/p99 of `Router::get` in each tier, of `all_active()`
//! with 10,000 active partitions, of `stats()` (the summary) and of
//! `stats_with_ranges()`, on a private `redis-server`, beside the seed's query table
//! (000, "查询性能对比").
//!
//! One namespace goes through the tiers the way the seed describes, with the default
//! thresholds: partitions are claimed and completed through the active store (1000 IDs
//! each, eight workers) and drained by the archiver every 10,000 completions, so pids
//! `1..=100,000` are in the simple tier, up to 500,000 in the compressed tier and the
//! rest in the summary tier. Then 10,000 more are claimed and stay active. Every `get`
//! goes through the router's trait objects, exactly as the worker binary will call it,
//! and every answer is checked (right pid, right tier).
//!
//! `TRANCHE_BENCH_SMOKE=1` runs everything at a hundredth of the size (thresholds 1,000
//! and 5,000, 6,000 completed): a few seconds, figures not judged, asserts checked.
//! `TRANCHE_BENCH_MAX` sets the number of completed partitions (default 600,000; at
//! least 500,001 for the summary tier to exist). Output: a table on stdout, and the
//! fields `get_p99_ms`, `all_active_p99_ms`, `stats_p99_ms` and
//! `stats_with_ranges_p99_ms` merged into the JSON at
//! `$TRANCHE_BENCH_OUT` (default `target/tranche-bench/archive.json`), which the archive
//! bench writes first under `cargo xtask bench archive`. The archive bench's own `get`
//! figures (`ArchiveQuery::get`, below the router) move to `archive_get_p99_ms`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use tranche_active_store::{Leases, Plan, Planner, RedisActiveStore, RedisConnection};
use tranche_archive_store::{Archiver, RedisArchive, Tier};
use tranche_codec::Status;
use tranche_router::{PartitionView, Router};
use tranche_stats::{RedisStats, StatsStore};

use tranche_testkit::TestRedis;

/// The sizes of a run: the full one, or with `TRANCHE_BENCH_SMOKE=1` a hundredth of it
/// (tier thresholds 1,000 and 5,000, 6,000 completed, 100 active, few samples): a few
/// seconds, figures not judged, every path and assert still run.
struct Scale {
    /// Partitions that stay active (claimed) while `all_active` is measured.
    active: u64,
    /// Completions between two archiver drains: small next to the tier thresholds, so
    /// each tier starts within this many records of its threshold.
    drain_every: u64,
    /// The archive's tier thresholds.
    compressed_at: u64,
    summary_at: u64,
    /// Completed partitions when `TRANCHE_BENCH_MAX` is not set.
    completed: u64,
    /// Timed calls per `get` tier.
    get_samples: usize,
    /// Enough for a p99 that is not one unlucky call: a 99th percentile of 100 samples
    /// is the second-slowest (a read takes a few milliseconds, so 500 take a few
    /// seconds).
    all_active_samples: usize,
    /// `stats()` reads the summary only (global, workers, days): well under a
    /// millisecond.
    stats_samples: usize,
    /// Few: with 600,000 completed, one `stats_with_ranges()` reads every 100,000-ID
    /// range (tens of milliseconds).
    stats_with_ranges_samples: usize,
}

static SCALE: std::sync::LazyLock<Scale> = std::sync::LazyLock::new(|| {
    if std::env::var("TRANCHE_BENCH_SMOKE").is_ok_and(|v| v == "1") {
        Scale {
            active: 100,
            drain_every: 100,
            compressed_at: 1_000,
            summary_at: 5_000,
            completed: 6_000,
            get_samples: 200,
            all_active_samples: 20,
            stats_samples: 20,
            stats_with_ranges_samples: 5,
        }
    } else {
        Scale {
            active: 10_000,
            drain_every: 10_000,
            compressed_at: 100_000,
            summary_at: 500_000,
            completed: 600_000,
            get_samples: 5_000,
            all_active_samples: 500,
            stats_samples: 1_000,
            stats_with_ranges_samples: 50,
        }
    }
});

/// The seed's table (000): GetPartition active 0.5 ms, completed 3 ms, GetAllPartitions
/// (active) 5 ms, statistics 50 ms; and this project's targets (p99).
/// "floor: raw HGETALL" is the active and runs hashes' HGETALL sent and read whole on a
/// plain socket, no client parsing: what Redis and the transfer alone cost for what
/// `all_active` returns, timed beside it. `stats_with_ranges()` has no target of its own
/// (the seed's 50 ms is for its whole statistics read); "of which summary" is
/// `StatsStore::summary` alone, the statistics layer's part of `stats()`.
const SEED_MS: [(&str, f64, f64); 9] = [
    ("get active", 0.5, 1.0),
    ("get simple", 3.0, 1.0),
    ("get compressed", 3.0, 1.0),
    ("get summary", 3.0, 1.0),
    ("all_active (10K)", 5.0, 5.0),
    ("  floor: raw HGETALL", 5.0, f64::INFINITY),
    ("stats()", 50.0, 2.0),
    ("  of which summary", 50.0, 2.0),
    ("stats_with_ranges()", 50.0, f64::INFINITY),
];

/// A tiny deterministic generator (xorshift64*), so runs sample the same pids.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// p50 and p99 in milliseconds.
fn percentiles(mut xs: Vec<Duration>) -> (f64, f64) {
    xs.sort();
    let at = |q: usize| xs[(xs.len() * q / 100).min(xs.len() - 1)].as_secs_f64() * 1000.0;
    (at(50), at(99))
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
    let completed: u64 = std::env::var("TRANCHE_BENCH_MAX")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(SCALE.completed);
    let server = TestRedis::start();
    let conn = RedisConnection::connect(&server.url()).await.unwrap();
    let active_config = tranche_active_store::Config {
        // Claims outlive the run: nothing is reaped while it is measured.
        lease: Duration::from_secs(3600),
        ..Default::default()
    };
    let archive_config = tranche_archive_store::Config {
        consumer: "router-bench".into(),
        compressed_at: SCALE.compressed_at,
        summary_at: SCALE.summary_at,
        ..Default::default()
    };
    let schema = archive_config.schema().unwrap();
    let active = Arc::new(RedisActiveStore::new(conn.clone(), active_config).unwrap());
    let archive = Arc::new(RedisArchive::new(conn.clone(), archive_config).unwrap());
    // What `all_active` reads of the shard: its records and its runs (claimed fresh pids).
    let active_keys = [schema.active(0), schema.shard_key(0, "runs")];
    let stats = Arc::new(RedisStats::new(conn.clone(), schema));

    let total = completed + SCALE.active + 1000;
    active
        .plan(&Plan::Uniform {
            min: 1,
            max: total * 1000,
            size: 1000,
        })
        .await
        .unwrap();

    let t = Instant::now();
    let mut rng = Rng(0x0074_7261_6e63_6865);
    let mut done = 0;
    while done < completed {
        let n = SCALE.drain_every.min(completed - done);
        let mut left = n;
        while left > 0 {
            let worker = format!("worker{}", 1 + rng.below(8));
            let leases = active
                .claim(&worker, left.min(1000) as usize)
                .await
                .unwrap();
            assert!(!leases.is_empty(), "ran out of work");
            left -= leases.len() as u64;
            let batch: Vec<_> = leases
                .into_iter()
                .map(|l| (l, 200_000 + rng.below(200_000)))
                .collect();
            for outcome in active.complete_many(&batch).await.unwrap() {
                outcome.unwrap();
            }
        }
        loop {
            let pass = archive.archive_once().await.unwrap();
            assert_eq!(pass.dead_lettered, 0, "records dead-lettered: {pass:?}");
            if pass.entries == 0 {
                break;
            }
        }
        done += n;
    }
    let mut claimed = Vec::with_capacity(SCALE.active as usize);
    while (claimed.len() as u64) < SCALE.active {
        let n = (SCALE.active - claimed.len() as u64).min(1000) as usize;
        claimed.extend(
            active
                .claim("worker1", n)
                .await
                .unwrap()
                .into_iter()
                .map(|l| l.pid),
        );
    }
    eprintln!(
        "set up {completed} completed and {} active partitions in {:.1} s",
        SCALE.active,
        t.elapsed().as_secs_f64()
    );

    let router = Router::new(active.clone(), archive.clone(), stats.clone());
    let mut rows: Vec<(&str, (f64, f64))> = Vec::new();

    let active_pids = move |rng: &mut Rng| claimed[rng.below(claimed.len() as u64) as usize];
    rows.push((
        "get active",
        time_gets(&router, active_pids, |v| match v {
            PartitionView::Active(p) => p.status == Status::Claimed,
            _ => false,
        })
        .await,
    ));
    // Sealed batches only: the batch straddling a threshold (pids 100,000..=100,099,
    // 500,000..=500,099) and the last, partial one stay open hashes.
    let tiers = [
        (
            "get simple",
            Tier::Simple,
            1,
            SCALE.compressed_at.min(completed),
        ),
        (
            "get compressed",
            Tier::Compressed,
            SCALE.compressed_at + 100,
            (SCALE.summary_at - 1).min(completed / 100 * 100 - 1),
        ),
        (
            "get summary",
            Tier::Summary,
            SCALE.summary_at + 100,
            completed / 100 * 100 - 1,
        ),
    ];
    for (name, tier, first, last) in tiers {
        if last < first {
            eprintln!("{name}: skipped, only {completed} completed");
            continue;
        }
        let pids = move |rng: &mut Rng| first + rng.below(last - first + 1);
        let check = move |v: &PartitionView| matches!(v, PartitionView::Archived { tier: t, .. } if *t == tier);
        rows.push((name, time_gets(&router, pids, check).await));
    }

    let mut times = Vec::with_capacity(SCALE.all_active_samples);
    for _ in 0..SCALE.all_active_samples {
        let t = Instant::now();
        let snapshot = router.all_active().await.unwrap();
        times.push(t.elapsed());
        assert_eq!(snapshot.partitions.len() as u64, SCALE.active);
    }
    rows.push(("all_active (10K)", percentiles(times)));
    rows.push((
        "  floor: raw HGETALL",
        raw_hgetall(server.port(), &active_keys),
    ));

    let mut times = Vec::with_capacity(SCALE.stats_samples);
    for _ in 0..SCALE.stats_samples {
        let t = Instant::now();
        let merged = router.stats().await.unwrap();
        times.push(t.elapsed());
        assert_eq!(merged.completed_count(), Some(completed));
        assert_eq!(merged.active.claimed, SCALE.active);
    }
    rows.push(("stats()", percentiles(times)));

    // The statistics layer's part of `stats()` alone (the rest is the active counts).
    let mut times = Vec::with_capacity(SCALE.stats_samples);
    for _ in 0..SCALE.stats_samples {
        let t = Instant::now();
        let summary = stats.summary().await.unwrap();
        times.push(t.elapsed());
        assert_eq!(summary.global_stats.total_completed, completed);
    }
    rows.push(("  of which summary", percentiles(times)));

    let mut times = Vec::with_capacity(SCALE.stats_with_ranges_samples);
    for _ in 0..SCALE.stats_with_ranges_samples {
        let t = Instant::now();
        let merged = router.stats_with_ranges().await.unwrap();
        times.push(t.elapsed());
        assert_eq!(merged.completed_count(), Some(completed));
        let ranges = merged.ranges.as_ref().unwrap();
        let counted: u64 = ranges.values().map(|r| r.completed_count).sum();
        assert_eq!(counted, completed);
    }
    rows.push(("stats_with_ranges()", percentiles(times)));

    println!(
        "{:<20} {:>9} {:>9} {:>11} {:>11}",
        "router", "p50 ms", "p99 ms", "seed ms", "target p99"
    );
    for (name, (p50, p99)) in &rows {
        let (_, seed, target) = SEED_MS.iter().find(|(n, ..)| n == name).unwrap();
        let mark = if p99 < target { "" } else { "  MISSED" };
        let target = if target.is_finite() {
            format!("{target:.1}")
        } else {
            "-".to_owned()
        };
        println!("{name:<20} {p50:>9.3} {p99:>9.3} {seed:>11.1} {target:>11}{mark}");
    }
    println!(
        "({completed} completed, {} active; one shard; tier thresholds {} and {})",
        SCALE.active, SCALE.compressed_at, SCALE.summary_at
    );
    write_json(&rows, completed);
}

/// p50/p99 of `HGETALL` of each of `keys`, pipelined, written to a plain socket and
/// read until the whole reply is in: the server's and the transfer's share of reading
/// every active record and run.
fn raw_hgetall(port: u16, keys: &[String]) -> (f64, f64) {
    use std::io::{Read, Write};
    let mut socket = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    socket.set_nodelay(true).unwrap();
    let command: String = keys
        .iter()
        .map(|key| format!("*2\r\n$7\r\nHGETALL\r\n${}\r\n{key}\r\n", key.len()))
        .collect();
    let mut buf = vec![0u8; 8 << 20];
    // The reply's size, from one untimed read: wait for the first bytes, then read
    // until the socket has stayed quiet for a moment.
    socket.write_all(command.as_bytes()).unwrap();
    let mut size = socket.read(&mut buf).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    while let Ok(n @ 1..) = socket.read(&mut buf[size..]) {
        size += n;
    }
    socket.set_read_timeout(None).unwrap();
    let mut times = Vec::with_capacity(SCALE.all_active_samples);
    for _ in 0..SCALE.all_active_samples {
        let t = Instant::now();
        socket.write_all(command.as_bytes()).unwrap();
        let mut got = 0;
        while got < size {
            got += socket.read(&mut buf[got..size]).unwrap();
        }
        times.push(t.elapsed());
    }
    percentiles(times)
}

/// Times `SCALE.get_samples` gets of pids drawn by `pick`, after a warm-up (scripts loaded,
/// plans and worker dictionary cached); every answer must pass `check`.
async fn time_gets(
    router: &Router,
    mut pick: impl FnMut(&mut Rng) -> u64,
    check: impl Fn(&PartitionView) -> bool,
) -> (f64, f64) {
    let mut rng = Rng(7);
    let mut times = Vec::with_capacity(SCALE.get_samples);
    for i in 0..SCALE.get_samples + 100 {
        let pid = pick(&mut rng);
        let t = Instant::now();
        let view = router.get(pid).await.unwrap();
        let took = t.elapsed();
        assert!(check(&view), "pid {pid}: {view:?}");
        if i >= 100 {
            times.push(took);
        }
    }
    percentiles(times)
}

fn ms(x: f64) -> Value {
    json!((x * 1000.0).round() / 1000.0)
}

/// Merges the router's figures into the archive bench's JSON (or starts it).
fn write_json(rows: &[(&str, (f64, f64))], completed: u64) {
    let path = std::env::var_os("TRANCHE_BENCH_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/tranche-bench/archive.json")
        });
    let mut out: Map<String, Value> = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    // The archive bench leaves `active` null in its `get_p99_ms`: those are its own
    // figures, one layer down, and stay beside the router's under another name.
    if let Some(own) = out.get("get_p99_ms")
        && own.get("active").is_some_and(Value::is_null)
    {
        let own = out.remove("get_p99_ms").unwrap();
        out.insert("archive_get_p99_ms".into(), own);
    }
    let field = |name: &str, p: fn(&(f64, f64)) -> f64| {
        rows.iter()
            .find(|(n, _)| *n == name)
            .map_or(Value::Null, |(_, x)| ms(p(x)))
    };
    let p99 = |x: &(f64, f64)| x.1;
    let p50 = |x: &(f64, f64)| x.0;
    let tiers = |p: fn(&(f64, f64)) -> f64| {
        json!({
            "active": field("get active", p),
            "simple": field("get simple", p),
            "compressed": field("get compressed", p),
            "summary": field("get summary", p),
        })
    };
    out.insert("get_p99_ms".into(), tiers(p99));
    out.insert("all_active_p99_ms".into(), field("all_active (10K)", p99));
    out.insert(
        "all_active_floor_p99_ms".into(),
        field("  floor: raw HGETALL", p99),
    );
    out.insert("stats_p99_ms".into(), field("stats()", p99));
    out.insert(
        "stats_summary_p99_ms".into(),
        field("  of which summary", p99),
    );
    out.insert(
        "stats_with_ranges_p99_ms".into(),
        field("stats_with_ranges()", p99),
    );
    out.insert(
        "router".into(),
        json!({
            "completed": completed,
            "active": SCALE.active,
            "get_p50_ms": tiers(p50),
            "all_active_p50_ms": field("all_active (10K)", p50),
            "all_active_floor_p50_ms": field("  floor: raw HGETALL", p50),
            "stats_p50_ms": field("stats()", p50),
            "stats_with_ranges_p50_ms": field("stats_with_ranges()", p50),
        }),
    );
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::write(&path, serde_json::to_string_pretty(&out).unwrap()).unwrap();
    println!("merged into {}", path.display());
}
