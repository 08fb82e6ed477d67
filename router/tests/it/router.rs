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

fn archived(view: &PartitionView) -> (u64, Tier) {
    match view {
        PartitionView::Archived { record, tier } => (record.pid, *tier),
        other => panic!("expected an archived record, got {other:?}"),
    }
}

async fn get_answers_from_each_layer_in_turn(kind: Kind) {
    // One shard: claims come in pid order, so pids 1..=200 are claimed.
    let job = Job::new(kind, 1, 200, Tier::Simple).await;
    job.complete(1..=150).await;
    job.archive().await;
    job.complete(151..=160).await; // Completed, archiver not run yet.

    // Unissued: planned, never claimed, pending with no attempts.
    match job.router.get(250).await.unwrap() {
        PartitionView::Active(p) => {
            assert_eq!((p.pid, p.min_id, p.max_id), (250, 24_901, 25_000));
            assert_eq!((p.status, p.attempts), (Status::Pending, 0));
        }
        other => panic!("{other:?}"),
    }
    // Claimed.
    match job.router.get(200).await.unwrap() {
        PartitionView::Active(p) => {
            assert_eq!(p.status, Status::Claimed);
            assert_eq!(p.worker.as_deref(), Some("w1"));
        }
        other => panic!("{other:?}"),
    }
    // Archived: the record exactly as completed.
    match job.router.get(42).await.unwrap() {
        PartitionView::Archived { record, tier } => {
            assert_eq!(tier, Tier::Simple);
            let lease = &job.leases[&42];
            let expected = lease.completed(record.completed_at_ms, 42);
            assert_eq!(record, expected);
            assert_eq!((record.min_id, record.max_id), (4101, 4200));
        }
        other => panic!("{other:?}"),
    }
    // Completed, not archived yet: archiving, never unknown.
    for pid in 151..=160 {
        let view = job.router.get(pid).await.unwrap();
        let range = (pid - 1) * 100 + 1..=pid * 100;
        assert_eq!(view, PartitionView::Archiving { pid, range }, "pid {pid}");
        assert!(view.is_completed());
    }
    // Not planned.
    for pid in [0, 301, u64::MAX] {
        assert_eq!(job.router.get(pid).await.unwrap(), PartitionView::Unknown);
    }

    // Once the archiver runs, archiving turns into archived.
    job.archive().await;
    assert_eq!(
        archived(&job.router.get(155).await.unwrap()),
        (155, Tier::Simple)
    );
}

async fn locate_finds_the_partition_at_range_edges(kind: Kind) {
    let job = Job::new(kind, 1, 10, Tier::Simple).await;
    job.complete([1, 2]).await;
    job.archive().await;
    let cases = [
        (1, 1),
        (100, 1),
        (101, 2),
        (200, 2),
        (201, 3),
        (30_000, 300),
    ];
    for (id, pid) in cases {
        let located = job.router.locate(id).await.unwrap().unwrap();
        assert_eq!(located.id, id);
        assert_eq!(located.pid, pid, "id {id}");
        assert_eq!(located.range, (pid - 1) * 100 + 1..=pid * 100);
        match (pid, &located.view) {
            (1 | 2, v) => assert_eq!(archived(v), (pid, Tier::Simple)),
            (3, PartitionView::Active(p)) => assert_eq!(p.status, Status::Claimed),
            (300, PartitionView::Active(p)) => assert_eq!(p.status, Status::Pending),
            (_, v) => panic!("id {id}: {v:?}"),
        }
    }
    for id in [0, 30_001, u64::MAX] {
        assert_eq!(job.router.locate(id).await.unwrap(), None, "id {id}");
    }
}

async fn a_plan_added_after_the_first_lookup_is_found(kind: Kind) {
    let job = Job::new(kind, 1, 0, Tier::Simple).await;
    // Fill the cache with the first plan only.
    assert_eq!(job.router.locate(50).await.unwrap().unwrap().pid, 1);
    assert_eq!(job.router.locate(1_000_000).await.unwrap(), None);
    let second = Plan::Ranges(vec![1_000_000..=1_000_499]);
    let outcome = job.active.plan(&second).await.unwrap();
    let pid = outcome.entries[0].plan.first_pid();
    let located = job.router.locate(1_000_250).await.unwrap().unwrap();
    assert_eq!((located.pid, located.range), (pid, 1_000_000..=1_000_499));
    assert!(matches!(located.view, PartitionView::Active(_)));
    assert!(matches!(
        job.router.get(pid).await.unwrap(),
        PartitionView::Active(_)
    ));
}

/// The range stream on `shards` shards: every pid once, in order, each answered by the
/// layer that holds it.
async fn check_range(kind: Kind, shards: u32) {
    let job = Job::new(kind, shards, 200, Tier::Compressed).await;
    let claimed: Vec<u64> = job.leases.keys().copied().collect();
    job.complete(claimed[..150].iter().copied()).await;
    job.archive().await;
    job.complete(claimed[150..160].iter().copied()).await;

    let router = job.router_with(job.stats.clone()).with_range_concurrency(7);
    let views: Vec<PartitionView> = router.range(0..=301).map(Result::unwrap).collect().await;
    assert_eq!(views.len(), 302);
    assert_eq!(views[0], PartitionView::Unknown);
    assert_eq!(views[301], PartitionView::Unknown);
    let (mut archived_n, mut archiving_n, mut active_n) = (0, 0, 0);
    for (pid, view) in (0..=301u64).zip(&views).skip(1).take(300) {
        let i = claimed.iter().position(|&c| c == pid);
        match view {
            PartitionView::Archived { record, .. } => {
                assert!(i.is_some_and(|i| i < 150), "pid {pid}");
                assert_eq!(record.pid, pid);
                archived_n += 1;
            }
            PartitionView::Archiving { pid: p, .. } => {
                assert!(i.is_some_and(|i| (150..160).contains(&i)), "pid {pid}");
                assert_eq!(*p, pid);
                archiving_n += 1;
            }
            PartitionView::Active(p) => {
                assert_eq!(p.pid, pid);
                let expected = if i.is_some() {
                    Status::Claimed
                } else {
                    Status::Pending
                };
                assert_eq!(p.status, expected, "pid {pid}");
                active_n += 1;
            }
            other => panic!("pid {pid}: {other:?}"),
        }
    }
    assert_eq!((archived_n, archiving_n, active_n), (150, 10, 140));

    // An empty range and a range past the plan.
    #[allow(clippy::reversed_empty_ranges)]
    let empty = 5..=4;
    assert_eq!(router.range(empty).count().await, 0);
    let tail: Vec<_> = router.range(u64::MAX - 1..=u64::MAX).collect().await;
    assert!(tail.iter().all(|v| matches!(v, Ok(PartitionView::Unknown))));
}

async fn range_streams_every_pid_once_in_order_on_one_shard(kind: Kind) {
    check_range(kind, 1).await;
}

async fn range_streams_every_pid_once_in_order_on_four_shards(kind: Kind) {
    check_range(kind, 4).await;
}

async fn stats_merge_active_counts_with_completed_statistics(kind: Kind) {
    let job = Job::new(kind, 4, 200, Tier::Simple).await;
    let claimed: Vec<u64> = job.leases.keys().copied().collect();
    job.complete(claimed[..150].iter().copied()).await;
    job.archive().await;
    job.complete(claimed[150..160].iter().copied()).await;

    let merged = job.router.stats().await.unwrap();
    assert_eq!(
        merged.active,
        StatusCounts {
            unissued: 100,
            claimed: 40,
            ..Default::default()
        }
    );
    let completed = merged.completed.as_ref().unwrap();
    let full = job.stats.stats().await.unwrap();
    assert_eq!(completed, &full.summary());
    assert!(merged.ranges.is_none(), "the summary leaves the ranges out");
    assert_eq!(merged.full_stats(), None);
    assert_eq!(completed.global_stats.total_completed, 150);
    assert_eq!(completed.global_stats.total_processed_data, 150 * 100);
    assert_eq!(completed.worker_stats["w1"].completed_count, 150);
    assert_eq!(merged.completed_count(), Some(150));
    // The ten in the inbox are counted by neither side until archived.
    assert_eq!(merged.total(), 290);
    assert_eq!(merged.completed_ratio(), Some(150.0 / 290.0));

    // With the ranges: the same summary, and the ranges of the same read.
    let with_ranges = job.router.stats_with_ranges().await.unwrap();
    assert_eq!(with_ranges.active, merged.active);
    assert_eq!(with_ranges.completed.as_ref().unwrap(), completed);
    assert_eq!(with_ranges.ranges.as_ref(), Some(&full.range_stats));
    assert_eq!(with_ranges.full_stats(), Some(full));

    job.archive().await;
    let merged = job.router.stats().await.unwrap();
    assert_eq!(merged.completed_count(), Some(160));
    assert_eq!(merged.total(), 300);
}

/// A statistics layer that is down.
struct FailingStats;

fn down() -> tranche_stats::Error {
    tranche_stats::Error::Corrupt {
        key: "{elk:0}:stats:global".into(),
        detail: "down for the test".into(),
    }
}

#[async_trait]
impl StatsStore for FailingStats {
    async fn stats(&self) -> tranche_stats::Result<Stats> {
        Err(down())
    }
    async fn summary(&self) -> tranche_stats::Result<StatsSummary> {
        Err(down())
    }
    async fn range_summary(&self, _id: u64) -> tranche_stats::Result<Option<RangeStats>> {
        Err(down())
    }
    async fn replace(&self, _shard: u32, _delta: &StatsDelta) -> tranche_stats::Result<()> {
        Err(down())
    }
    async fn damage(&self, _shard: u32) -> tranche_stats::Result<Vec<tranche_stats::Damage>> {
        Err(down())
    }
    async fn repair(
        &self,
        _shard: u32,
        _rebuilt: &StatsDelta,
        _unreadable: u64,
    ) -> tranche_stats::Result<tranche_stats::Repaired> {
        Err(down())
    }
    async fn publish_snapshot(&self) -> tranche_stats::Result<u64> {
        Err(down())
    }

    async fn latest_snapshot(&self) -> tranche_stats::Result<Option<Snapshot>> {
        Err(down())
    }
    async fn snapshot(&self, _version: u64) -> tranche_stats::Result<Option<Snapshot>> {
        Err(down())
    }
}

async fn stats_fall_back_to_the_active_counts_when_the_statistics_layer_fails(kind: Kind) {
    let job = Job::new(kind, 1, 20, Tier::Simple).await;
    job.complete(1..=5).await;
    job.archive().await;
    let router = job.router_with(Arc::new(FailingStats));

    let merged = router.stats().await.unwrap();
    assert_eq!(
        merged.active,
        StatusCounts {
            unissued: 280,
            claimed: 15,
            ..Default::default()
        }
    );
    let err = merged.completed.as_ref().unwrap_err();
    assert!(err.to_string().contains("down for the test"), "{err}");
    assert_eq!(merged.completed_count(), None);
    assert_eq!(merged.completed_ratio(), None);
    assert_eq!(merged.total(), 295);
    let with_ranges = router.stats_with_ranges().await.unwrap();
    assert_eq!(with_ranges.active, merged.active);
    assert!(with_ranges.completed.is_err() && with_ranges.ranges.is_none());

    // Reads that do not need the statistics layer are unaffected.
    assert_eq!(archived(&router.get(3).await.unwrap()), (3, Tier::Simple));
}

/// Completes pids 100..=199 (batch 1, full) into the summary tier, whose batches live
/// `ttl`; the router reads statistics from `stats`, or the job's own.
async fn summary_job(
    kind: Kind,
    ttl: Duration,
    stats: Option<Arc<dyn StatsStore>>,
) -> (Job, Router) {
    let job = Job::with_ttl(kind, 1, 200, Tier::Summary, ttl).await;
    job.complete(100..=199).await;
    job.archive().await;
    let router = job.router_with(stats.unwrap_or_else(|| job.stats.clone()));
    (job, router)
}

/// Long enough never to expire during a test.
const HOUR: Duration = Duration::from_secs(3600);

async fn an_expired_batch_is_answered_from_the_range_summary(kind: Kind) {
    // The batch is expired by force once its TTL has been read: nothing races a clock.
    let (job, router) = summary_job(kind, HOUR, None).await;
    assert_eq!(
        archived(&router.get(150).await.unwrap()),
        (150, Tier::Summary)
    );
    let left = job.expire(1, HOUR).await;
    assert!(
        !left.is_empty() && left.iter().all(|&ms| ms <= 3_600_000 && ms > 3_540_000),
        "{left:?}"
    );
    let expected_summary = job.stats.range_summary(14_901).await.unwrap().unwrap();
    assert_eq!(expected_summary.completed_count, 100);
    for pid in [100, 150, 199] {
        let view = router.get(pid).await.unwrap();
        assert_eq!(
            view,
            PartitionView::Summarised {
                pid,
                range: (pid - 1) * 100 + 1..=pid * 100,
                cause: Fallback::Expired,
                summary: Some(expected_summary.clone()),
            }
        );
        assert!(view.is_completed());
    }
    let located = router.locate(15_000).await.unwrap().unwrap();
    assert!(matches!(
        located.view,
        PartitionView::Summarised {
            pid: 150,
            cause: Fallback::Expired,
            ..
        }
    ));
    assert_eq!(router.decode_failures().await.unwrap(), 0);
}

async fn a_corrupted_batch_is_answered_from_the_range_summary_and_counted(kind: Kind) {
    let (job, router) = summary_job(kind, HOUR, None).await;
    job.corrupt(1, vec![0xde, 0xad, 0xbe, 0xef]).await;
    let view = router.get(123).await.unwrap();
    match &view {
        PartitionView::Summarised {
            pid: 123,
            range,
            cause: Fallback::Undecodable { .. },
            summary: Some(summary),
        } => {
            assert_eq!(range, &(12_201..=12_300));
            assert_eq!(summary.completed_count, 100);
            assert_eq!(summary.workers, ["w1"]);
        }
        other => panic!("{other:?}"),
    }
    assert!(router.decode_failures().await.unwrap() >= 1);
    // Other layers still answer for their pids.
    assert!(matches!(
        router.get(200).await.unwrap(),
        PartitionView::Active(_)
    ));
}

async fn a_fallback_with_the_statistics_layer_down_is_an_error(kind: Kind) {
    let (job, router) = summary_job(kind, HOUR, Some(Arc::new(FailingStats))).await;
    job.corrupt(1, b"not a batch".to_vec()).await;
    match router.get(150).await {
        Err(Error::Stats(err)) => assert!(err.to_string().contains("down for the test")),
        other => panic!("{other:?}"),
    }
}

/// A tiny deterministic generator (xorshift64*), so a failure replays.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// What the test believes of one pid.
#[derive(Debug, Clone)]
enum Model {
    Unissued,
    Held(Lease),
    /// Waiting for another claim, after this many attempts.
    Pending(u32),
    Failed,
    Completed {
        worker: String,
        duration_ms: u64,
        archived: bool,
    },
}

/// Checks every router answer, the range stream and the merged statistics against
/// `model`.
async fn check_model(job: &Job, model: &BTreeMap<u64, Model>) {
    let views: Vec<PartitionView> = job
        .router
        .range(0..=301)
        .map(Result::unwrap)
        .collect()
        .await;
    assert_eq!(views.len(), 302);
    assert_eq!(views[0], PartitionView::Unknown);
    assert_eq!(views[301], PartitionView::Unknown);
    let mut counts = StatusCounts::default();
    let mut archived_n = 0;
    for (pid, state) in model {
        let view = &views[*pid as usize];
        assert_eq!(view, &job.router.get(*pid).await.unwrap(), "pid {pid}");
        let range = (pid - 1) * 100 + 1..=pid * 100;
        match (state, view) {
            (Model::Unissued, PartitionView::Active(p)) => {
                assert_eq!((p.status, p.attempts), (Status::Pending, 0), "pid {pid}");
                counts.unissued += 1;
            }
            (Model::Pending(attempts), PartitionView::Active(p)) => {
                assert_eq!(
                    (p.status, p.attempts),
                    (Status::Pending, *attempts),
                    "pid {pid}"
                );
                counts.pending += 1;
            }
            (Model::Held(lease), PartitionView::Active(p)) => {
                assert_eq!(p.status, Status::Claimed, "pid {pid}");
                assert_eq!(p.worker.as_deref(), Some(lease.worker.as_str()));
                assert_eq!(p.lease_token, Some(lease.token));
                counts.claimed += 1;
            }
            (Model::Failed, PartitionView::Active(p)) => {
                assert_eq!(p.status, Status::Failed, "pid {pid}");
                counts.failed += 1;
            }
            (
                Model::Completed {
                    archived: false, ..
                },
                PartitionView::Archiving { pid: p, range: r },
            ) => assert_eq!((*p, r), (*pid, &range)),
            (
                Model::Completed {
                    worker,
                    duration_ms,
                    archived: true,
                },
                PartitionView::Archived { record, .. },
            ) => {
                assert_eq!(record.pid, *pid);
                assert_eq!(record.min_id..=record.max_id, range);
                assert_eq!(&*record.worker, worker.as_str(), "pid {pid}");
                assert_eq!(record.duration_ms, *duration_ms, "pid {pid}");
                archived_n += 1;
            }
            (state, view) => panic!("pid {pid}: model {state:?}, router {view:?}"),
        }
    }
    let merged = job.router.stats().await.unwrap();
    assert_eq!(merged.active, counts);
    assert_eq!(merged.completed_count(), Some(archived_n));
    let completed = merged.completed.as_ref().unwrap();
    assert_eq!(
        completed.global_stats.total_processed_data,
        archived_n * 100
    );
    let by_worker: u64 = completed
        .worker_stats
        .values()
        .map(|w| w.completed_count)
        .sum();
    assert_eq!(by_worker, archived_n);
}

async fn a_random_workload_matches_a_model(kind: Kind) {
    for (seed, shards) in [(7, 1), (11, 4)] {
        let mut rng = Rng(seed);
        let job = Job::new(kind, shards, 0, Tier::Compressed).await;
        let mut model: BTreeMap<u64, Model> = (1..=300).map(|p| (p, Model::Unissued)).collect();
        for step in 0..400 {
            let held: Vec<u64> = model
                .iter()
                .filter(|(_, s)| matches!(s, Model::Held(_)))
                .map(|(p, _)| *p)
                .collect();
            let pick = |rng: &mut Rng| held[rng.below(held.len() as u64) as usize];
            match rng.below(10) {
                0..=2 => {
                    let worker = format!("w{}", rng.below(3));
                    let n = 1 + rng.below(8) as usize;
                    for lease in job.active.claim(&worker, n).await.unwrap() {
                        model.insert(lease.pid, Model::Held(lease));
                    }
                }
                3..=5 if !held.is_empty() => {
                    let pid = pick(&mut rng);
                    let Model::Held(lease) = model[&pid].clone() else {
                        unreachable!()
                    };
                    let duration_ms = 1 + rng.below(100_000);
                    let first = job.active.complete(&lease, duration_ms).await.unwrap();
                    assert_eq!(first, Completion::Completed);
                    // A retried completion changes nothing.
                    if rng.below(3) == 0 {
                        let again = job.active.complete(&lease, duration_ms).await;
                        assert!(
                            matches!(again, Ok(Completion::Duplicate) | Err(_)),
                            "{again:?}"
                        );
                    }
                    let worker = lease.worker.clone();
                    model.insert(
                        pid,
                        Model::Completed {
                            worker,
                            duration_ms,
                            archived: false,
                        },
                    );
                }
                6 if !held.is_empty() => {
                    let pid = pick(&mut rng);
                    let Model::Held(lease) = model[&pid].clone() else {
                        unreachable!()
                    };
                    let state = match job.active.fail(&lease, "boom").await.unwrap() {
                        FailOutcome::Retry { .. } => Model::Pending(lease.attempt),
                        FailOutcome::Failed => Model::Failed,
                    };
                    model.insert(pid, state);
                }
                7 if !held.is_empty() => {
                    let pid = pick(&mut rng);
                    let Model::Held(lease) = model[&pid].clone() else {
                        unreachable!()
                    };
                    job.active.release(&lease, lease.min_id).await.unwrap();
                    // A graceful release gives the attempt back.
                    model.insert(pid, Model::Pending(lease.attempt - 1));
                }
                _ => {
                    job.archive().await;
                    for state in model.values_mut() {
                        if let Model::Completed { archived, .. } = state {
                            *archived = true;
                        }
                    }
                }
            }
            if step % 100 == 99 {
                check_model(&job, &model).await;
            }
        }
        job.archive().await;
        for state in model.values_mut() {
            if let Model::Completed { archived, .. } = state {
                *archived = true;
            }
        }
        check_model(&job, &model).await;
        let mut seen = BTreeMap::<&str, u64>::new();
        for state in model.values() {
            let name = match state {
                Model::Unissued => "unissued",
                Model::Held(_) => "held",
                Model::Pending(_) => "pending",
                Model::Failed => "failed",
                Model::Completed { .. } => "completed",
            };
            *seen.entry(name).or_default() += 1;
        }
        // The workload reached every kind of state worth checking.
        for name in ["completed", "held", "pending", "failed"] {
            assert!(
                seen.get(name).is_some_and(|&n| n > 0),
                "seed {seed}: {seen:?}"
            );
        }
    }
}
