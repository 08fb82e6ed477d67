//! One behaviour suite for the statistics stores, run against every backend: memory, a
//! private standalone Redis and a private one-node Redis Cluster (where a script
//! touching keys of two slots fails with CROSSSLOT), at 1 and 4 shards, and a cluster of
//! 3 masters at 16 shards.

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;

use rand::{Rng, SeedableRng};
use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use tranche_codec::{CompletedRecord, KeySchema, ManualClock};
use tranche_stats::{
    MemoryStats, PERCENTILE_RELATIVE_ERROR, RedisStats, SNAPSHOTS_KEPT, Stats, StatsDelta,
    StatsStore, StatsSummary, diff,
};

use support::{TestCluster, TestRedis};

/// 2024-06-24 13:46:45 UTC, the seed's example completion time.
const T0: u64 = 1_719_234_405_000;
/// When the tests say the deltas were applied.
const NOW: u64 = 1_719_240_000_123;

#[derive(Clone, Copy, Debug)]
enum Kind {
    Memory,
    Redis,
    Cluster,
    /// A private cluster of 3 masters without replicas.
    Masters,
}

const BACKENDS: [(Kind, u32); 6] = [
    (Kind::Memory, 1),
    (Kind::Memory, 4),
    (Kind::Redis, 1),
    (Kind::Redis, 4),
    (Kind::Cluster, 4),
    (Kind::Masters, 16),
];

enum Applier {
    Memory(Arc<MemoryStats>),
    Single(RedisStats<ConnectionManager>),
    Cluster(RedisStats<ClusterConnection>),
}

/// A store under test and the way the archive would feed it.
struct Harness {
    store: Arc<dyn StatsStore>,
    applier: Applier,
    schema: KeySchema,
    label: String,
    /// The private server, for the checks that read keys directly (not on 3 masters).
    server: Option<TestRedis>,
    /// The private 3-master cluster, kept running while the harness lives.
    _masters: Option<TestCluster>,
    /// How Redis deltas write the ranges they touch: 0 compact bodies, 1 packed bodies
    /// (archive format 3), 2 each layout in turn, delta by delta (a shard holding both).
    packed: u8,
    /// Deltas applied so far, for `packed` 2.
    applied: std::sync::atomic::AtomicUsize,
}

impl Harness {
    async fn new(kind: Kind, shards: u32) -> Self {
        let schema = KeySchema::new("elk", shards).unwrap();
        let label = format!("{kind:?}/{shards}");
        match kind {
            Kind::Memory => {
                let m = Arc::new(MemoryStats::new().with_clock(Arc::new(ManualClock::new(NOW))));
                Self {
                    store: m.clone(),
                    applier: Applier::Memory(m),
                    schema,
                    label,
                    server: None,
                    _masters: None,
                    packed: 0,
                    applied: Default::default(),
                }
            }
            Kind::Redis => {
                let server = TestRedis::start();
                let client = redis::Client::open(server.url()).unwrap();
                let conn = client.get_connection_manager().await.unwrap();
                let s = RedisStats::new(conn, schema.clone());
                Self {
                    store: Arc::new(s.clone()),
                    applier: Applier::Single(s),
                    schema,
                    label,
                    server: Some(server),
                    _masters: None,
                    packed: 0,
                    applied: Default::default(),
                }
            }
            Kind::Masters => {
                let masters = TestCluster::start_with(3, 0);
                let client = redis::cluster::ClusterClient::new(vec![masters.url()]).unwrap();
                let conn = client.get_async_connection().await.unwrap();
                let s = RedisStats::new(conn, schema.clone());
                Self {
                    store: Arc::new(s.clone()),
                    applier: Applier::Cluster(s),
                    schema,
                    label,
                    server: None,
                    _masters: Some(masters),
                    packed: 0,
                    applied: Default::default(),
                }
            }
            Kind::Cluster => {
                let server = TestRedis::start_cluster();
                let client = redis::cluster::ClusterClient::new(vec![server.url()]).unwrap();
                let conn = client.get_async_connection().await.unwrap();
                let s = RedisStats::new(conn, schema.clone());
                Self {
                    store: Arc::new(s.clone()),
                    applier: Applier::Cluster(s),
                    schema,
                    label,
                    server: Some(server),
                    _masters: None,
                    packed: 0,
                    applied: Default::default(),
                }
            }
        }
    }

    /// The harness with its Redis deltas writing packed ranges (`packed` 1), or each
    /// layout in turn (2).
    fn packing(mut self, packed: u8) -> Self {
        self.packed = packed;
        self.label = format!("{} packed {packed}", self.label);
        self
    }

    async fn apply(&self, shard: u32, delta: &StatsDelta) {
        use std::sync::atomic::Ordering;
        use tranche_stats::testing::{apply_alone, apply_alone_packed};
        let n = self.applied.fetch_add(1, Ordering::Relaxed);
        let packed = self.packed == 1 || (self.packed == 2 && n % 2 == 1);
        match &self.applier {
            Applier::Memory(m) => m.apply(shard, delta).unwrap(),
            Applier::Single(s) if packed => apply_alone_packed(s, shard, delta, NOW).await.unwrap(),
            Applier::Single(s) => apply_alone(s, shard, delta, NOW).await.unwrap(),
            Applier::Cluster(s) if packed => {
                apply_alone_packed(s, shard, delta, NOW).await.unwrap()
            }
            Applier::Cluster(s) => apply_alone(s, shard, delta, NOW).await.unwrap(),
        }
    }

    /// Applies `records` as the archiver would: grouped by shard, in batches of `batch`.
    async fn feed(&self, records: &[CompletedRecord], batch: usize) {
        for (shard, recs) in by_shard(&self.schema, records) {
            for chunk in recs.chunks(batch) {
                self.apply(shard, &StatsDelta::from_records(chunk)).await;
            }
        }
    }
}

fn by_shard(
    schema: &KeySchema,
    records: &[CompletedRecord],
) -> BTreeMap<u32, Vec<CompletedRecord>> {
    let mut out: BTreeMap<u32, Vec<CompletedRecord>> = BTreeMap::new();
    for r in records {
        out.entry(schema.shard_of(r.pid))
            .or_default()
            .push(r.clone());
    }
    out
}

fn rec(pid: u64, worker: &str, completed_at_ms: u64, duration_ms: u64) -> CompletedRecord {
    CompletedRecord {
        pid,
        min_id: (pid - 1) * 1000 + 1,
        max_id: pid * 1000,
        worker: Arc::from(worker),
        completed_at_ms,
        duration_ms,
    }
}

/// A small fixed workload over three workers, two ranges and a few hours.
fn small_workload() -> Vec<CompletedRecord> {
    let workers = ["worker1", "worker2", "worker3"];
    (0..40u64)
        .map(|i| {
            let pid = if i < 25 { 4970 + i } else { 4990 + i * 3 };
            rec(
                pid,
                workers[(i % 3) as usize],
                T0 + i * 997_531,
                280_000 + (i * 7919) % 40_000 + i % 2 * 500,
            )
        })
        .collect()
}

/// What the kept statistics must be: recomputed from the records, stamped NOW.
fn expected(records: &[CompletedRecord]) -> Stats {
    let mut s = Stats::from_records(records);
    s.global_stats.last_updated = NOW as f64 / 1000.0;
    s
}

#[tokio::test]
async fn a_fixed_workload_reads_back_exactly() {
    let records = small_workload();
    for (kind, shards) in BACKENDS {
        let h = Harness::new(kind, shards).await;
        assert_eq!(
            h.store.stats().await.unwrap(),
            Stats::default(),
            "{}",
            h.label
        );
        h.feed(&records, 7).await;
        let got = h.store.stats().await.unwrap();
        assert_eq!(
            got,
            expected(&records),
            "{}: {:#?}",
            h.label,
            diff(&expected(&records), &got)
        );
        let g = &got.global_stats;
        assert_eq!(g.total_completed, 40);
        assert_eq!(g.total_processed_data, 40_000);
        assert_eq!(got.worker_stats["worker1"].completed_count, 14);
        assert_eq!(got.range_stats["4900000_5000000"].completed_count, 25);
        insta::assert_json_snapshot!("small_workload", got);
    }
}

#[tokio::test]
async fn shards_merge_on_read_whatever_the_batching() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let records: Vec<CompletedRecord> = (1..=500u64)
        .map(|pid| {
            let w = format!("w{}", rng.random_range(0..6));
            rec(
                pid * 37,
                &w,
                T0 + rng.random_range(0..200_000_000),
                rng.random_range(1..900_000),
            )
        })
        .collect();
    for (kind, shards) in BACKENDS {
        let h = Harness::new(kind, shards).await;
        h.feed(&records[..200], 1).await;
        h.feed(&records[200..], 64).await;
        let got = h.store.stats().await.unwrap();
        let want = expected(&records);
        assert!(
            diff(&want, &got).is_empty(),
            "{}: {:#?}",
            h.label,
            diff(&want, &got)
        );
        assert_eq!(got, want, "{}", h.label);
    }
}

#[tokio::test]
async fn huge_ids_keep_exact_bounds() {
    let top = CompletedRecord {
        pid: u64::MAX / 1000,
        min_id: u64::MAX - 999,
        max_id: u64::MAX,
        worker: Arc::from("w1"),
        completed_at_ms: T0,
        duration_ms: 1,
    };
    // 2^53 + 1 is where a double would round.
    let odd = CompletedRecord {
        pid: 9_007_199_254_740,
        min_id: 9_007_199_254_740_993,
        max_id: 9_007_199_254_740_993,
        worker: Arc::from("w2"),
        completed_at_ms: T0 + 1,
        duration_ms: 2,
    };
    let mut near_top = top.clone();
    near_top.pid -= 1;
    near_top.min_id -= 1000;
    near_top.max_id -= 1000;
    let records = vec![near_top, top, odd];
    for (kind, shards) in BACKENDS {
        let h = Harness::new(kind, shards).await;
        h.feed(&records, 1).await;
        let got = h.store.stats().await.unwrap();
        assert_eq!(got, expected(&records), "{}", h.label);
        let r = &got.range_stats["18446744073709500000_18446744073709600000"];
        assert_eq!(
            (r.data_range.min, r.data_range.max),
            (u64::MAX - 1999, u64::MAX),
            "{}",
            h.label
        );
        assert_eq!(r.completed_count, 2);
        let r = &got.range_stats["9007199254700000_9007199254800000"];
        assert_eq!(r.data_range.min, 9_007_199_254_740_993, "{}", h.label);
        assert_eq!(got.global_stats.total_processed_data, 2001);
        let summary = h.store.range_summary(u64::MAX).await.unwrap().unwrap();
        assert_eq!(summary.data_range.max, u64::MAX, "{}", h.label);
    }
}

#[tokio::test]
async fn hourly_buckets_split_at_midnight_utc() {
    // 2024-06-24 23:59:59.999 and 2024-06-25 00:00:00.000 UTC.
    let midnight = 1_719_273_600_000;
    let records = vec![
        rec(1, "w", midnight - 1, 10),
        rec(2, "w", midnight, 10),
        rec(3, "w", midnight + 3_599_999, 10),
        rec(4, "w", midnight + 3_600_000, 10),
    ];
    for (kind, shards) in BACKENDS {
        let h = Harness::new(kind, shards).await;
        h.feed(&records, 2).await;
        let ts = h.store.stats().await.unwrap().time_series_stats;
        let mut day1 = [0; 24];
        day1[23] = 1;
        let mut day2 = [0; 24];
        day2[0] = 2;
        day2[1] = 1;
        assert_eq!(ts.len(), 2, "{}", h.label);
        assert_eq!(ts["2024-06-24"].hourly_completion, day1, "{}", h.label);
        assert_eq!(ts["2024-06-25"].hourly_completion, day2, "{}", h.label);
    }
}

fn exact_percentile(sorted: &[u64], p: u64) -> f64 {
    let rank = (sorted.len() as u64 * p).div_ceil(100).max(1);
    sorted[rank as usize - 1] as f64 / 1000.0
}

fn assert_close(got: f64, want: f64, what: &str) {
    // Seconds with millisecond precision: allow the bound plus the rounding to 1 ms.
    let err = (got - want).abs();
    assert!(
        err <= want * PERCENTILE_RELATIVE_ERROR + 0.0005,
        "{what}: exact {want}, reported {got}"
    );
}

#[tokio::test]
async fn percentiles_are_within_the_stated_bound() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let records: Vec<CompletedRecord> = (1..=3000u64)
        .map(|pid| {
            let w = ["a", "b", "c"][rng.random_range(0..3)];
            // Mostly around five minutes, with a long tail and some tiny ones.
            let d = match rng.random_range(0..10) {
                0 => rng.random_range(0..64),
                1 => rng.random_range(0..10_000_000),
                _ => rng.random_range(200_000..400_000),
            };
            rec(pid, w, T0 + pid, d)
        })
        .collect();
    let mut all: Vec<u64> = records.iter().map(|r| r.duration_ms).collect();
    all.sort_unstable();
    for (kind, shards) in BACKENDS {
        let h = Harness::new(kind, shards).await;
        h.feed(&records, 100).await;
        let got = h.store.stats().await.unwrap();
        for (p, v) in [
            (50, got.global_stats.p50),
            (95, got.global_stats.p95),
            (99, got.global_stats.p99),
        ] {
            assert_close(
                v,
                exact_percentile(&all, p),
                &format!("{} global p{p}", h.label),
            );
        }
        for w in ["a", "b", "c"] {
            let mut mine: Vec<u64> = records
                .iter()
                .filter(|r| &*r.worker == w)
                .map(|r| r.duration_ms)
                .collect();
            mine.sort_unstable();
            let ws = &got.worker_stats[w];
            for (p, v) in [(50, ws.p50), (95, ws.p95), (99, ws.p99)] {
                assert_close(
                    v,
                    exact_percentile(&mine, p),
                    &format!("{} {w} p{p}", h.label),
                );
            }
        }
    }
}

#[tokio::test]
async fn range_summaries_merge_the_range_across_shards() {
    let records = small_workload();
    for (kind, shards) in BACKENDS {
        let h = Harness::new(kind, shards).await;
        h.feed(&records, 5).await;
        let stats = h.store.stats().await.unwrap();
        let summary = h.store.range_summary(4_969_001).await.unwrap();
        assert_eq!(
            summary.as_ref(),
            Some(&stats.range_stats["4900000_5000000"]),
            "{}",
            h.label
        );
        let summary = h.store.range_summary(5_099_999).await.unwrap();
        assert_eq!(
            summary.as_ref(),
            Some(&stats.range_stats["5000000_5100000"]),
            "{}",
            h.label
        );
        assert_eq!(h.store.range_summary(1).await.unwrap(), None, "{}", h.label);
    }
}

/// A snapshot holds every statistic, but of the ranges only the SNAPSHOT_RANGES
/// completed most recently: its size does not grow with the ID space.
#[tokio::test]
async fn snapshots_hold_the_most_recent_ranges_only() {
    use tranche_stats::SNAPSHOT_RANGES;
    let n = SNAPSHOT_RANGES as u64 + 50;
    // One partition in each of n ranges of 100,000 IDs, completed one second apart.
    let records: Vec<CompletedRecord> = (0..n)
        .map(|i| rec(1 + 100 * i, "worker1", 1_719_234_405_000 + i * 1000, 250))
        .collect();
    for (kind, shards) in BACKENDS {
        let h = Harness::new(kind, shards).await;
        h.feed(&records, 7).await;
        let full = h.store.stats().await.unwrap();
        assert_eq!(full.range_stats.len() as u64, n, "{}", h.label);
        h.store.publish_snapshot().await.unwrap();
        let snap = h.store.latest_snapshot().await.unwrap().unwrap().stats;
        assert_eq!(snap.range_stats.len(), SNAPSHOT_RANGES, "{}", h.label);
        // The newest ranges, exactly as in the full statistics.
        for i in (n - SNAPSHOT_RANGES as u64)..n {
            let label = format!("{}_{}", i * 100_000, (i + 1) * 100_000);
            assert_eq!(
                snap.range_stats.get(&label),
                full.range_stats.get(&label),
                "{}: {label}",
                h.label
            );
        }
        // Everything else is whole.
        assert_eq!(snap.global_stats, full.global_stats, "{}", h.label);
        assert_eq!(snap.worker_stats, full.worker_stats, "{}", h.label);
        assert_eq!(
            snap.time_series_stats, full.time_series_stats,
            "{}",
            h.label
        );
    }
}

#[tokio::test]
async fn snapshots_keep_the_last_ten_versions() {
    let records = small_workload();
    for (kind, shards) in BACKENDS {
        let h = Harness::new(kind, shards).await;
        assert_eq!(
            h.store.latest_snapshot().await.unwrap(),
            None,
            "{}",
            h.label
        );
        for (i, r) in records.iter().take(11).enumerate() {
            h.feed(std::slice::from_ref(r), 1).await;
            assert_eq!(
                h.store.publish_snapshot().await.unwrap(),
                i as u64 + 1,
                "{}",
                h.label
            );
        }
        let latest = h.store.latest_snapshot().await.unwrap().unwrap();
        assert_eq!(latest.version, 11, "{}", h.label);
        assert_eq!(latest.stats, h.store.stats().await.unwrap(), "{}", h.label);
        assert!(latest.timestamp_ms > 0);
        assert_eq!(h.store.snapshot(1).await.unwrap(), None, "{}", h.label);
        for v in 2..=11 {
            let s = h.store.snapshot(v).await.unwrap().unwrap();
            assert_eq!(s.version, v);
            assert_eq!(s.stats.global_stats.total_completed, v, "{}", h.label);
        }
        let config = match &h.applier {
            Applier::Memory(m) => m.snapshot_config(),
            Applier::Single(s) => s.snapshot_config().await.unwrap(),
            Applier::Cluster(s) => s.snapshot_config().await.unwrap(),
        }
        .unwrap();
        assert_eq!((config.version, config.count), (11, 11), "{}", h.label);
        assert_eq!(config.timestamp_ms, latest.timestamp_ms, "{}", h.label);
        if let Some(server) = &h.server {
            let kept: Vec<String> = server.query(redis::cmd("KEYS").arg("{elk}:stats:snapshot:*"));
            assert_eq!(kept.len() as u64, SNAPSHOTS_KEPT, "{}: {kept:?}", h.label);
            let config: String = server.query(redis::cmd("GET").arg("{elk}:stats:config"));
            let config: serde_json::Value = serde_json::from_str(&config).unwrap();
            assert_eq!(config["version"], 11);
            assert_eq!(config["count"], 11);
            let latest: String = server.query(redis::cmd("GET").arg("{elk}:stats:latest"));
            assert_eq!(latest, "11");
        }
    }
}

#[tokio::test]
async fn check_finds_damage_and_replace_repairs_it() {
    let records = small_workload();
    for (kind, shards) in BACKENDS {
        let h = Harness::new(kind, shards).await;
        h.feed(&records, 9).await;
        let want = Stats::from_records(&records);
        assert!(
            diff(&want, &h.store.stats().await.unwrap()).is_empty(),
            "{}",
            h.label
        );

        // A shard that lost its statistics and counted one record twice.
        let groups = by_shard(&h.schema, &records);
        let (&shard, recs) = groups.iter().next().unwrap();
        let mut wrong = recs[1..].to_vec();
        wrong.push(recs[1].clone());
        h.store
            .replace(shard, &StatsDelta::from_records(&wrong))
            .await
            .unwrap();
        let damaged = h.store.stats().await.unwrap();
        assert_eq!(h.store.summary().await.unwrap(), damaged.summary());
        let damage = diff(&want, &damaged);
        let paths: Vec<&str> = damage.iter().map(|d| d.path.as_str()).collect();
        assert!(
            paths.contains(&"global_stats.avg_duration"),
            "{}: {paths:?}",
            h.label
        );
        assert!(!damage.is_empty());

        // Repair: every shard recomputed from its records.
        for (shard, recs) in &groups {
            h.store
                .replace(*shard, &StatsDelta::from_records(recs))
                .await
                .unwrap();
        }
        let repaired = h.store.stats().await.unwrap();
        assert!(
            diff(&want, &repaired).is_empty(),
            "{}: {:#?}",
            h.label,
            diff(&want, &repaired)
        );

        // Replacing with an empty delta clears a shard.
        for shard in h.schema.shards() {
            h.store
                .replace(shard, &StatsDelta::default())
                .await
                .unwrap();
        }
        assert_eq!(
            h.store.stats().await.unwrap(),
            Stats::default(),
            "{}",
            h.label
        );
        assert_eq!(
            h.store.summary().await.unwrap(),
            StatsSummary::default(),
            "{}",
            h.label
        );
    }
}

#[tokio::test]
async fn the_summary_is_the_statistics_without_their_ranges() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    // Many ranges (a few hundred), few workers: the shape where ranges dominate.
    let records: Vec<CompletedRecord> = (0..600u64)
        .map(|i| {
            let pid = 1 + i * 97 + rng.random_range(0..50);
            let w = format!("w{}", rng.random_range(0..5));
            rec(pid, &w, T0 + i * 61_000, rng.random_range(1..400_000))
        })
        .collect();
    for (kind, shards) in BACKENDS {
        let h = Harness::new(kind, shards).await;
        assert_eq!(
            h.store.summary().await.unwrap(),
            StatsSummary::default(),
            "{}",
            h.label
        );
        h.feed(&records, 50).await;
        let full = h.store.stats().await.unwrap();
        assert!(full.range_stats.len() > 500, "{}", h.label);
        let summary = h.store.summary().await.unwrap();
        assert_eq!(summary, full.summary(), "{}", h.label);
        assert_eq!(summary, expected(&records).summary(), "{}", h.label);
        // The parts put back together are the full statistics.
        let (parts, ranges) = full.clone().into_parts();
        assert_eq!(parts, summary);
        assert_eq!(Stats::from_parts(parts, ranges), full);

        // On Redis the summary never reads the ranges hash: with every block of it
        // damaged, the full read fails and the summary still answers, unchanged.
        if let Some(server) = &h.server {
            for shard in h.schema.shards() {
                let key = h.schema.stats(shard, "ranges");
                let blocks: Vec<String> = server.query(redis::cmd("HKEYS").arg(&key));
                for block in blocks {
                    let () = server.query(redis::cmd("HSET").arg(&key).arg(block).arg("\u{ff}"));
                }
            }
            assert!(h.store.stats().await.is_err(), "{}", h.label);
            assert_eq!(h.store.summary().await.unwrap(), summary, "{}", h.label);
        }
    }
}

/// Records that push every packed form: whole seconds and milliseconds, uniform and
/// uneven partition sizes, many workers (palette indexes past one byte of bitmap and
/// past 128), ranges filled out of order across blocks, and numbers past 10^15 (times,
/// durations, partitions of 10^16 IDs) that Lua cannot hold as doubles.
fn awkward_workload(seed: u64) -> Vec<CompletedRecord> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let workers: Vec<String> = (0..150).map(|w| format!("w{w}")).collect();
    let mut out: Vec<CompletedRecord> = (0..400u64)
        .map(|i| {
            let pid = 1 + rng.random_range(0..20_000u64);
            let mut r = rec(
                pid,
                &workers[rng.random_range(0..if i % 2 == 0 { 4 } else { 150 })],
                T0 + rng.random_range(0..5_000_000) * 1000,
                rng.random_range(1..900) * 1000,
            );
            match rng.random_range(0..12) {
                0 => r.completed_at_ms += rng.random_range(1..1000),
                1 => r.duration_ms += 1,
                2 => r.max_id = r.min_id + rng.random_range(0..5000),
                3 => r.max_id = r.min_id + 10_000_000_000_000_000,
                4 => r.completed_at_ms = 2_000_000_000_000_000 + rng.random_range(0..1000),
                5 => r.duration_ms = 3_000_000_000_000_000 + 1,
                6 => r.completed_at_ms = rng.random_range(0..1000),
                _ => {}
            }
            r
        })
        .collect();
    // The same pid twice would be two completions; the archive never sends that, but
    // statistics do not care, so keep them.
    out.sort_by_key(|r| r.completed_at_ms % 7);
    out
}

#[tokio::test]
async fn packed_ranges_and_days_read_back_exactly_in_any_order() {
    // The Redis backends once more with packed ranges, and with both layouts in turn.
    let packings = BACKENDS.iter().map(|&b| (b, 0)).chain([
        ((Kind::Redis, 1), 1),
        ((Kind::Redis, 4), 2),
        ((Kind::Cluster, 4), 1),
    ]);
    let packings: Vec<_> = packings.collect();
    for seed in [1, 2] {
        let records = awkward_workload(seed);
        for &((kind, shards), packed) in &packings {
            let h = Harness::new(kind, shards).await.packing(packed);
            // Out of order, in uneven batches, so that blocks are rewritten many times
            // and ranges change form (seconds <-> ms, unit <-> explicit, compact <-> wide).
            let mut rest: &[CompletedRecord] = &records;
            let mut size = 1;
            while !rest.is_empty() {
                let (now, later) = rest.split_at(size.min(rest.len()));
                h.feed(now, 3).await;
                rest = later;
                size = size * 3 % 17 + 1;
            }
            let got = h.store.stats().await.unwrap();
            let want = expected(&records);
            assert!(
                diff(&want, &got).is_empty(),
                "{} seed {seed}: {:#?}",
                h.label,
                diff(&want, &got)
            );
            assert_eq!(got, want, "{} seed {seed}", h.label);
            assert_eq!(
                h.store.summary().await.unwrap(),
                want.summary(),
                "{} seed {seed}",
                h.label
            );
            for id in [1, 4_970_001, 19_999_999, 777_777] {
                let r = id / 100_000;
                let key = format!("{}_{}", r * 100_000, (r + 1) * 100_000);
                assert_eq!(
                    h.store.range_summary(id).await.unwrap().as_ref(),
                    want.range_stats.get(&key),
                    "{} seed {seed} id {id}",
                    h.label
                );
            }
            // A repair from the records writes the same statistics.
            for (shard, recs) in by_shard(&h.schema, &records) {
                h.store
                    .replace(shard, &StatsDelta::from_records(&recs))
                    .await
                    .unwrap();
            }
            let repaired = h.store.stats().await.unwrap();
            assert!(diff(&want, &repaired).is_empty(), "{}", h.label);
        }
    }
}
