//! Damaged statistics, on both backends: a value that does not decode is found
//! (`damage`), refuses deltas, and `repair` sets it aside in the quarantine and
//! rebuilds the shard (whole when every record could be read, only the damaged values
//! when some could not).

use crate::support;

use std::sync::Arc;

use tranche_codec::{CompletedRecord, KeySchema, ManualClock};
use tranche_stats::{MemoryStats, RedisStats, Stats, StatsDelta, StatsStore, diff};

use support::TestRedis;

/// 2024-06-24 13:46:45 UTC.
const T0: u64 = 1_719_234_405_000;
const NOW: u64 = 1_719_240_000_123;

enum Backend {
    Memory(Arc<MemoryStats>),
    Redis(RedisStats<redis::aio::ConnectionManager>, TestRedis),
}

impl Backend {
    async fn all() -> Vec<Backend> {
        let server = TestRedis::start();
        let client = redis::Client::open(server.url()).unwrap();
        let conn = client.get_connection_manager().await.unwrap();
        let schema = KeySchema::new("elk", 2).unwrap();
        let clock = Arc::new(ManualClock::new(NOW));
        vec![
            Backend::Memory(Arc::new(MemoryStats::new().with_clock(clock.clone()))),
            Backend::Redis(RedisStats::new(conn, schema).with_clock(clock), server),
        ]
    }

    fn store(&self) -> &dyn StatsStore {
        match self {
            Backend::Memory(m) => m.as_ref(),
            Backend::Redis(r, _) => r,
        }
    }

    fn label(&self) -> &'static str {
        match self {
            Backend::Memory(_) => "memory",
            Backend::Redis(..) => "redis",
        }
    }

    async fn apply(&self, shard: u32, records: &[CompletedRecord]) -> Result<(), String> {
        let delta = StatsDelta::from_records(records);
        match self {
            Backend::Memory(m) => m.apply(shard, &delta).map_err(|e| e.to_string()),
            Backend::Redis(r, _) => tranche_stats::testing::apply_alone(r, shard, &delta, NOW)
                .await
                .map_err(|e| e.to_string()),
        }
    }

    /// Writes `bytes` into `field` of shard `shard`'s statistics hash `hash`.
    fn corrupt(&self, shard: u32, hash: &str, field: &str, bytes: &[u8]) {
        match self {
            Backend::Memory(m) => m.corrupt(shard, hash, field, bytes.to_vec()),
            Backend::Redis(r, server) => {
                let r_key = |shard, hash: &str| r.schema().stats(shard, hash);
                let key = r_key(shard, hash);
                let _: i64 = server.query(redis::cmd("HSET").arg(key).arg(field).arg(bytes));
            }
        }
    }

    async fn quarantined(&self, shard: u32) -> Vec<(String, Vec<u8>)> {
        match self {
            Backend::Memory(m) => m.quarantined(shard),
            Backend::Redis(r, _) => r.quarantined(shard).await.unwrap(),
        }
    }
}

/// Records of shard 0 of 2 (batches 0, 2, 4, ...: pids 1..=99, 200..=299, ...), over
/// two days and two workers.
fn records(n: u64) -> Vec<CompletedRecord> {
    let schema = KeySchema::new("elk", 2).unwrap();
    (1..)
        .filter(|&p| schema.shard_of(p) == 0)
        .take(n as usize)
        .map(|pid| CompletedRecord {
            pid,
            min_id: (pid - 1) * 1000 + 1,
            max_id: pid * 1000,
            worker: Arc::from(if pid % 3 == 0 { "w1" } else { "w2" }),
            completed_at_ms: T0 + pid * 1_800_000,
            duration_ms: 1000 + pid,
        })
        .collect()
}

#[tokio::test]
async fn a_corrupt_value_is_found_refuses_deltas_and_a_repair_rebuilds_the_shard() {
    for b in Backend::all().await {
        let label = b.label();
        let recs = records(120);
        b.apply(0, &recs[..100]).await.unwrap();
        assert!(b.store().damage(0).await.unwrap().is_empty(), "{label}");

        b.corrupt(0, "ranges", "0", b"\x80");
        let damage = b.store().damage(0).await.unwrap();
        assert_eq!(damage.len(), 1, "{label}: {damage:?}");
        assert_eq!(
            (
                damage[0].shard,
                damage[0].hash.as_str(),
                damage[0].field.as_str()
            ),
            (0, "ranges", "0"),
            "{label}"
        );
        // The other shard is not damaged, and the damaged one refuses deltas.
        assert!(b.store().damage(1).await.unwrap().is_empty(), "{label}");
        let refused = b.apply(0, &recs[100..]).await.unwrap_err();
        assert!(refused.contains("corrupt"), "{label}: {refused}");

        let repaired = b
            .store()
            .repair(0, &StatsDelta::from_records(&recs[..100]), 0)
            .await
            .unwrap();
        assert!(repaired.whole, "{label}");
        assert_eq!(repaired.quarantined, damage, "{label}");
        assert_eq!(repaired.unreadable, 0, "{label}");
        assert!(b.store().damage(0).await.unwrap().is_empty(), "{label}");
        assert_eq!(
            b.quarantined(0).await,
            vec![(format!("ranges:0@{NOW}"), b"\x80".to_vec())],
            "{label}"
        );
        let found = b.store().stats().await.unwrap();
        assert!(
            diff(&Stats::from_records(&recs[..100]), &found).is_empty(),
            "{label}: {:?}",
            diff(&Stats::from_records(&recs[..100]), &found)
        );
        // Repaired, it takes deltas again.
        b.apply(0, &recs[100..]).await.unwrap();
        let found = b.store().stats().await.unwrap();
        assert!(
            diff(&Stats::from_records(&recs), &found).is_empty(),
            "{label}"
        );
    }
}

#[tokio::test]
async fn with_unreadable_records_only_the_damaged_values_are_rebuilt() {
    for b in Backend::all().await {
        let label = b.label();
        let recs = records(100);
        b.apply(0, &recs).await.unwrap();
        let day = "2024-06-25";
        assert!(
            Stats::from_records(&recs)
                .time_series_stats
                .contains_key(day),
            "the records cover {day}"
        );
        b.corrupt(0, "ranges", "0", b"\x80\x80");
        b.corrupt(0, "hourly", day, b"\x07");
        b.corrupt(0, "global", "count", b"many");
        // The first 30 records' batch expired: the rebuild has the other 70.
        let readable = &recs[30..];
        let repaired = b
            .store()
            .repair(0, &StatsDelta::from_records(readable), 30)
            .await
            .unwrap();
        assert!(!repaired.whole, "{label}");
        assert_eq!(repaired.quarantined.len(), 3, "{label}");
        assert_eq!(repaired.unreadable, 30, "{label}");
        assert!(b.store().damage(0).await.unwrap().is_empty(), "{label}");
        assert_eq!(b.quarantined(0).await.len(), 3, "{label}");

        let found = b.store().stats().await.unwrap();
        let all = Stats::from_records(&recs);
        let part = Stats::from_records(readable);
        // Rebuilt from what could be read: the ranges, the damaged day, the count.
        assert_eq!(found.range_stats, part.range_stats, "{label}");
        assert_eq!(
            found.time_series_stats[day], part.time_series_stats[day],
            "{label}"
        );
        assert_eq!(found.global_stats.total_completed, 70, "{label}");
        // Kept: every value that was not damaged still counts all 100.
        assert_eq!(found.worker_stats, all.worker_stats, "{label}");
        for (d, stats) in &all.time_series_stats {
            if d != day {
                assert_eq!(&found.time_series_stats[d], stats, "{label} {d}");
            }
        }
        assert_eq!(
            found.global_stats.total_processed_data, all.global_stats.total_processed_data,
            "{label}"
        );
    }
}

#[tokio::test]
async fn palette_damage_rebuilds_the_shard_whole_and_no_damage_with_unreadable_keeps_it() {
    for b in Backend::all().await {
        let label = b.label();
        let recs = records(50);
        b.apply(0, &recs).await.unwrap();
        // Nothing damaged and records unreadable: nothing to rebuild from, nothing done.
        let repaired = b
            .store()
            .repair(0, &StatsDelta::from_records(&recs[..10]), 40)
            .await
            .unwrap();
        assert!(
            !repaired.whole && repaired.quarantined.is_empty(),
            "{label}"
        );
        let found = b.store().stats().await.unwrap();
        assert!(
            diff(&Stats::from_records(&recs), &found).is_empty(),
            "{label}"
        );

        b.corrupt(0, "workers", "w1|idx", b"x");
        let repaired = b
            .store()
            .repair(0, &StatsDelta::from_records(&recs[10..]), 10)
            .await
            .unwrap();
        assert!(repaired.whole, "{label}");
        let found = b.store().stats().await.unwrap();
        assert!(
            diff(&Stats::from_records(&recs[10..]), &found).is_empty(),
            "{label}"
        );
    }
}
