//! The router over both backends (memory, and a private redis-server, a one-node cluster
//! and a cluster of 3 masters at 16 shards): a small job planned, partly claimed,
//! completed and archived, then every kind of answer checked.

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;
use redis::AsyncCommands;
use tranche_active_store::{
    ActiveStore, Completion, FailOutcome, Lease, Leases, ManualClock, MemoryActiveStore, Plan,
    Planner, RedisActiveStore, RedisConnection, StatusCounts,
};
use tranche_archive_store::{ArchiveQuery, Archiver, MemoryArchive, RedisArchive, Tier};
use tranche_codec::{KeySchema, Status};
use tranche_router::{Error, Fallback, PartitionView, Router};
use tranche_stats::{
    MemoryStats, RangeStats, RedisStats, Snapshot, Stats, StatsDelta, StatsStore, StatsSummary,
};

use support::{TestCluster, TestRedis};

mod answers;
mod stats;
mod workload;

use self::{answers::*, stats::*, workload::*};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Memory,
    Redis,
    /// A one-node Redis Cluster: any script touching two slots fails with CROSSSLOT.
    Cluster,
    /// A cluster of 3 masters without replicas, the job at 16 shards whatever it asks.
    Masters,
}

/// The servers a Redis job runs on, kept running while it lives.
enum Servers {
    One(#[allow(dead_code)] TestRedis),
    Masters(#[allow(dead_code)] TestCluster),
}

/// IDs `1..=30_000` in partitions of 100: pids 1..=300.
const PLAN: Plan = Plan::Uniform {
    min: 1,
    max: 30_000,
    size: 100,
};

/// What only one backend can do (corrupt a batch); the server lives as long as this.
enum Backend {
    Memory(Arc<MemoryArchive>),
    Redis(#[allow(dead_code)] Servers, RedisConnection, KeySchema),
}

/// One job: the three layers of one backend and a router over them.
struct Job {
    active: Arc<dyn ActiveStore>,
    archiver: Arc<dyn Archiver>,
    query: Arc<dyn ArchiveQuery>,
    stats: Arc<dyn StatsStore>,
    router: Router,
    backend: Backend,
    /// Every lease claimed, by pid.
    leases: BTreeMap<u64, Lease>,
}

/// Archive settings: `tier` from the first record on, summary batches living `ttl`.
fn archive_config(shards: u32, tier: Tier, ttl: Duration) -> tranche_archive_store::Config {
    let (compressed_at, summary_at) = match tier {
        Tier::Simple => (u64::MAX, u64::MAX),
        Tier::Compressed => (0, u64::MAX),
        _ => (0, 0),
    };
    tranche_archive_store::Config {
        num_shards: shards,
        compressed_at,
        summary_at,
        summary_ttl: ttl,
        consumer: "router-test".into(),
        ..Default::default()
    }
}

/// The three layers of one backend, and the backend.
type Layers = (
    Arc<dyn ActiveStore>,
    Arc<dyn Archiver>,
    Arc<dyn ArchiveQuery>,
    Arc<dyn StatsStore>,
    Backend,
);

impl Job {
    /// Plans [`PLAN`] over `shards` shards and claims `claimed` partitions; the archive
    /// is in `tier` from the first record on.
    async fn new(kind: Kind, shards: u32, claimed: usize, tier: Tier) -> Self {
        Self::with_ttl(kind, shards, claimed, tier, Duration::from_secs(3600)).await
    }

    async fn with_ttl(kind: Kind, shards: u32, claimed: usize, tier: Tier, ttl: Duration) -> Self {
        let shards = if kind == Kind::Masters { 16 } else { shards };
        let active_config = tranche_active_store::Config {
            num_shards: shards,
            // Two claims, so a random workload reaches failed partitions: a failure is
            // claimable again at once (no backoff), as a release gives its attempt back.
            max_attempts: 2,
            backoff_base: Duration::ZERO,
            ..Default::default()
        };
        let archive_config = archive_config(shards, tier, ttl);
        // The active layer's time stands still, so a workload takes the same course on
        // every run.
        let clock = Arc::new(ManualClock::new(1_719_234_405_000));
        let (active, archiver, query, stats, backend): Layers = match kind {
            Kind::Memory => {
                let active = Arc::new(MemoryActiveStore::with_clock(active_config, clock).unwrap());
                let stats = Arc::new(MemoryStats::new());
                let inboxes = (0..shards).map(|s| active.inbox(s).unwrap()).collect();
                let archive =
                    Arc::new(MemoryArchive::new(archive_config, inboxes, stats.clone()).unwrap());
                (
                    active,
                    archive.clone(),
                    archive.clone(),
                    stats,
                    Backend::Memory(archive),
                )
            }
            Kind::Redis | Kind::Cluster | Kind::Masters => {
                let (server, url) = match kind {
                    Kind::Masters => {
                        let masters = TestCluster::start_with(3, 0);
                        let url = masters.url();
                        (Servers::Masters(masters), url)
                    }
                    Kind::Cluster => {
                        let server = TestRedis::start_cluster();
                        let url = server.url();
                        (Servers::One(server), url)
                    }
                    _ => {
                        let server = TestRedis::start();
                        let url = server.url();
                        (Servers::One(server), url)
                    }
                };
                let conn = RedisConnection::connect(&url).await.unwrap();
                assert_eq!(conn.is_cluster(), kind != Kind::Redis);
                let schema = KeySchema::new("elk", shards).unwrap();
                let active = Arc::new(
                    RedisActiveStore::with_clock(conn.clone(), active_config, clock).unwrap(),
                );
                let archive = Arc::new(RedisArchive::new(conn.clone(), archive_config).unwrap());
                let stats = Arc::new(RedisStats::new(conn.clone(), schema.clone()));
                (
                    active,
                    archive.clone(),
                    archive,
                    stats,
                    Backend::Redis(server, conn, schema),
                )
            }
        };
        let outcome = active.plan(&PLAN).await.unwrap();
        assert_eq!(outcome.entries[0].plan.pids(), 1..=300);
        let router = Router::new(active.clone(), query.clone(), stats.clone());
        let mut leases = BTreeMap::new();
        while leases.len() < claimed {
            let got = active
                .claim("w1", (claimed - leases.len()).min(64))
                .await
                .unwrap();
            assert!(!got.is_empty(), "ran out of work");
            leases.extend(got.into_iter().map(|l| (l.pid, l)));
        }
        Self {
            active,
            archiver,
            query,
            stats,
            router,
            backend,
            leases,
        }
    }

    /// A router over this job's active layer and archive, and `stats`.
    fn router_with(&self, stats: Arc<dyn StatsStore>) -> Router {
        Router::new(self.active.clone(), self.query.clone(), stats)
    }

    /// Completes the leased pids of `pids`, each after `pid` ms.
    async fn complete(&self, pids: impl IntoIterator<Item = u64>) {
        let done: Vec<_> = pids
            .into_iter()
            .map(|pid| (self.leases[&pid].clone(), pid))
            .collect();
        for outcome in self.active.complete_many(&done).await.unwrap() {
            outcome.unwrap();
        }
    }

    /// Drains every inbox into the archive; fails rather than spinning for ever.
    async fn archive(&self) {
        for _ in 0..10_000 {
            if self.archiver.archive_once().await.unwrap().entries == 0 {
                return;
            }
        }
        panic!("the inboxes never drained");
    }

    /// Expires sealed batch `batch` now (PEXPIRE 0 on Redis: no test waits on a TTL)
    /// and returns what its keys had left, in ms.
    async fn expire(&self, batch: u64, ttl: Duration) -> Vec<i64> {
        match &self.backend {
            Backend::Memory(archive) => archive.expire_batch(batch),
            Backend::Redis(_, conn, schema) => {
                let config = archive_config(schema.num_shards(), Tier::Summary, ttl);
                RedisArchive::new(conn.clone(), config)
                    .unwrap()
                    .expire_batch(batch)
                    .await
                    .unwrap()
            }
        }
    }

    /// Overwrites sealed batch `batch` with `bytes`.
    async fn corrupt(&self, batch: u64, bytes: Vec<u8>) {
        match &self.backend {
            Backend::Memory(archive) => assert!(archive.corrupt_batch(batch, bytes)),
            Backend::Redis(_, conn, schema) => {
                let key = schema.completed_batch(batch);
                let mut c = conn.clone();
                assert!(c.exists::<_, bool>(&key).await.unwrap(), "{key} not sealed");
                let _: () = c.set(key, bytes).await.unwrap();
            }
        }
    }
}

/// One `#[tokio::test]` per backend for each check.
macro_rules! both {
    ($($check:ident),* $(,)?) => {
        mod in_memory {
            $(#[tokio::test]
            async fn $check() {
                super::$check(super::Kind::Memory).await;
            })*
        }
        mod on_redis {
            $(#[tokio::test]
            async fn $check() {
                super::$check(super::Kind::Redis).await;
            })*
        }
        mod on_a_cluster_node {
            $(#[tokio::test]
            async fn $check() {
                super::$check(super::Kind::Cluster).await;
            })*
        }
        mod on_three_masters {
            $(#[tokio::test]
            async fn $check() {
                super::$check(super::Kind::Masters).await;
            })*
        }
    };
}

both!(
    get_answers_from_each_layer_in_turn,
    locate_finds_the_partition_at_range_edges,
    a_plan_added_after_the_first_lookup_is_found,
    range_streams_every_pid_once_in_order_on_one_shard,
    range_streams_every_pid_once_in_order_on_four_shards,
    stats_merge_active_counts_with_completed_statistics,
    stats_fall_back_to_the_active_counts_when_the_statistics_layer_fails,
    an_expired_batch_is_answered_from_the_range_summary,
    a_corrupted_batch_is_answered_from_the_range_summary_and_counted,
    a_fallback_with_the_statistics_layer_down_is_an_error,
    a_random_workload_matches_a_model,
);
