//! The archive behind a real active store: plan, claim, complete, archive, look up. The
//! active store is a dev-dependency only; the archive knows nothing of it.

use crate::support;

use std::sync::Arc;

use tranche_active_store::{
    ActiveStore, Config as ActiveConfig, MemoryActiveStore, Plan, RedisActiveStore, RedisConnection,
};
use tranche_archive_store::{
    ArchiveQuery, Archiver, Config, Lookup, MemoryArchive, RedisArchive, Tier,
};
use tranche_stats::{MemoryStats, RedisStats, StatsStore};

use support::TestRedis;

const PLAN: Plan = Plan::Uniform {
    min: 1,
    max: 300_000,
    size: 1000,
};

/// Completes every partition of the plan (300 of them) with two workers.
async fn complete_all(active: &dyn ActiveStore) {
    active.plan(&PLAN).await.unwrap();
    let mut done = 0;
    while done < 300 {
        for worker in ["worker1", "worker2"] {
            for lease in active.claim(worker, 25).await.unwrap() {
                active.complete(&lease, 295_000).await.unwrap();
                done += 1;
            }
        }
    }
}

async fn check(
    active: &dyn ActiveStore,
    archiver: &dyn Archiver,
    query: &dyn ArchiveQuery,
    stats: &dyn StatsStore,
) {
    complete_all(active).await;
    // Completed, not archived yet: both backends see it (the memory archive in the
    // records it received from the inbox).
    assert_eq!(query.get(5).await.unwrap(), Lookup::Archiving);
    let mut archived = 0;
    loop {
        let pass = archiver.archive_once().await.unwrap();
        archived += pass.archived;
        if pass.entries == 0 {
            break;
        }
    }
    assert_eq!(archived, 300);
    let mut tiers = [0; 2];
    for pid in 1..=300 {
        match query.get(pid).await.unwrap() {
            Lookup::Archived { record, tier } => {
                assert_eq!(record.pid, pid);
                assert_eq!(record.min_id, (pid - 1) * 1000 + 1);
                assert_eq!(record.max_id, pid * 1000);
                assert_eq!(record.duration_ms, 295_000);
                tiers[usize::from(tier != Tier::Simple)] += 1;
            }
            other => panic!("pid {pid}: {other:?}"),
        }
    }
    // The tier is read once per pass: the pass that crosses 50 still writes simple.
    assert!((50..100).contains(&tiers[0]), "{tiers:?}");
    assert_eq!(tiers[0] + tiers[1], 300);
    let s = stats.stats().await.unwrap();
    assert_eq!(s.global_stats.total_completed, 300);
    assert_eq!(s.global_stats.total_processed_data, 300_000);
}

fn config(shards: u32) -> Config {
    Config {
        num_shards: shards,
        // Small enough that the run crosses into the compressed tier.
        compressed_at: 50,
        batch: 7,
        ..Config::default()
    }
}

#[tokio::test]
async fn memory_end_to_end() {
    for shards in [1, 4] {
        let active = MemoryActiveStore::new(ActiveConfig {
            num_shards: shards,
            ..ActiveConfig::default()
        })
        .unwrap();
        let inboxes = (0..shards).map(|s| active.inbox(s).unwrap()).collect();
        let stats = Arc::new(MemoryStats::new());
        let archive = MemoryArchive::new(config(shards), inboxes, stats.clone()).unwrap();
        check(&active, &archive, &archive, &*stats).await;
    }
}

#[tokio::test]
async fn redis_end_to_end() {
    for shards in [1, 4] {
        let server = TestRedis::start();
        let conn = RedisConnection::connect(&server.url()).await.unwrap();
        let active = RedisActiveStore::new(
            conn.clone(),
            ActiveConfig {
                num_shards: shards,
                ..ActiveConfig::default()
            },
        )
        .unwrap();
        let archive = RedisArchive::new(conn.clone(), config(shards)).unwrap();
        let schema = config(shards).schema().unwrap();
        let stats = RedisStats::new(conn, schema);
        check(&active, &archive, &archive, &stats).await;
    }
}
