//! One behaviour suite for the archive, run against every backend: memory, a private
//! standalone Redis, and a private one-node Redis Cluster (where a script touching keys
//! of two slots fails with CROSSSLOT), each at 1 and 4 shards; and once more on a
//! cluster of 3 masters with 16 shards, in three groups of checks, each group a test
//! running its checks in turn on one cluster started for them and flushed between them.

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::Sender;
use redis::AsyncCommands;
use tranche_active_store::RedisConnection;
use tranche_archive_store::{
    ARCHIVE_DAMAGED, ArchivePass, ArchiveQuery, Archiver, Compaction, Config, Dump, Export, Import,
    Lookup, MemoryArchive, RedisArchive, SEGMENT_BATCHES, SnapshotPolicy, Snapshots, Tier,
};
use tranche_codec::{CompletedRecord, KeySchema, encode_json};
use tranche_stats::{MemoryStats, RedisStats, Stats, StatsStore, diff};

use support::{TestCluster, TestRedis};

mod damage;
mod reading;
mod run;
mod tiers;

use self::{damage::*, reading::*, run::*, tiers::*};

const T0: u64 = 1_719_234_405_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Memory,
    Redis,
    Cluster,
    /// The 3-master cluster with a node on this port, which a group of checks shares.
    Masters(u16),
}

enum Backend {
    Memory(
        Vec<Sender<CompletedRecord>>,
        Arc<MemoryArchive>,
        Arc<MemoryStats>,
    ),
    /// The connection, and the private server when the harness owns one.
    Redis(#[allow(dead_code)] Option<TestRedis>, RedisConnection),
}

/// An archive under test and a way to fill its inboxes as the active store would.
struct Harness {
    config: Config,
    schema: KeySchema,
    archiver: Arc<dyn Archiver>,
    query: Arc<dyn ArchiveQuery>,
    stats: Arc<dyn StatsStore>,
    compaction: Arc<dyn Compaction>,
    export: Arc<dyn Export>,
    import: Arc<dyn Import>,
    backend: Backend,
    kind: Kind,
    /// Harnesses made [`beside`](Self::beside) this one so far.
    siblings: std::sync::atomic::AtomicU32,
}

impl Harness {
    async fn new(kind: Kind, shards: u32) -> Self {
        Self::with(
            kind,
            Config {
                num_shards: shards,
                consumer: "a1".into(),
                ..Config::default()
            },
        )
        .await
    }

    async fn with(kind: Kind, config: Config) -> Self {
        let schema = config.schema().unwrap();
        match kind {
            Kind::Memory => {
                let (txs, rxs): (Vec<_>, Vec<_>) = schema
                    .shards()
                    .map(|_| crossbeam_channel::unbounded())
                    .unzip();
                let stats = Arc::new(MemoryStats::new());
                let stats_handle = stats.clone();
                let archive =
                    Arc::new(MemoryArchive::new(config.clone(), rxs, stats.clone()).unwrap());
                Self {
                    stats,
                    schema,
                    archiver: archive.clone(),
                    query: archive.clone(),
                    compaction: archive.clone(),
                    export: archive.clone(),
                    import: archive.clone(),
                    backend: Backend::Memory(txs, archive, stats_handle),
                    config,
                    kind,
                    siblings: Default::default(),
                }
            }
            Kind::Redis | Kind::Cluster | Kind::Masters(_) => {
                let (server, url) = match kind {
                    Kind::Masters(port) => (None, format!("redis://127.0.0.1:{port}")),
                    Kind::Cluster => {
                        let server = TestRedis::start_cluster();
                        let url = server.url();
                        (Some(server), url)
                    }
                    _ => {
                        let server = TestRedis::start();
                        let url = server.url();
                        (Some(server), url)
                    }
                };
                let conn = RedisConnection::connect(&url).await.unwrap();
                assert_eq!(conn.is_cluster(), kind != Kind::Redis);
                Self::on(kind, server, conn, config)
            }
        }
    }

    /// A harness on `conn` (and `server`, when it owns one) with `config`.
    fn on(kind: Kind, server: Option<TestRedis>, conn: RedisConnection, config: Config) -> Self {
        let schema = config.schema().unwrap();
        let archive = Arc::new(RedisArchive::new(conn.clone(), config.clone()).unwrap());
        Self {
            stats: Arc::new(RedisStats::new(conn.clone(), schema.clone())),
            schema,
            archiver: archive.clone(),
            query: archive.clone(),
            compaction: archive.clone(),
            export: archive.clone(),
            import: archive,
            backend: Backend::Redis(server, conn),
            config,
            kind,
            siblings: Default::default(),
        }
    }

    /// A check's second archive, with `config` but a namespace of its own: on the same
    /// server or cluster as this one (a private server of its own would cost a cluster
    /// check another two seconds before it may write), or in memory a new one.
    async fn beside(&self, mut config: Config) -> Self {
        let n = 1 + self
            .siblings
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        config.namespace = format!("{}{n}", config.namespace);
        match &self.backend {
            Backend::Memory(..) => Self::with(Kind::Memory, config).await,
            Backend::Redis(_, conn) => Self::on(self.kind, None, conn.clone(), config),
        }
    }

    /// A second archiver on the same inboxes (Redis) under another consumer name.
    fn another(&self, consumer: &str, claim_idle: Duration) -> Option<Arc<dyn Archiver>> {
        match &self.backend {
            Backend::Memory(..) => None,
            Backend::Redis(_, conn) => {
                let config = Config {
                    consumer: consumer.into(),
                    claim_idle,
                    ..self.config.clone()
                };
                Some(Arc::new(RedisArchive::new(conn.clone(), config).unwrap()))
            }
        }
    }

    /// Completes `records` as the active store does: index bit, then one inbox entry per
    /// shard holding that shard's records as JSON lines, then the shard's dirty mark.
    /// A shard's bits and its entry are one pipeline (one slot, so one node, run in the
    /// order sent): a completion of thousands of records costs a round trip per shard,
    /// not per record.
    async fn complete(&self, records: &[CompletedRecord]) {
        match &self.backend {
            Backend::Memory(txs, ..) => {
                for r in records {
                    txs[self.schema.shard_of(r.pid) as usize]
                        .send(r.clone())
                        .unwrap();
                }
            }
            Backend::Redis(_, conn) => {
                let mut by_shard: BTreeMap<u32, Vec<&CompletedRecord>> = BTreeMap::new();
                for r in records {
                    by_shard
                        .entry(self.schema.shard_of(r.pid))
                        .or_default()
                        .push(r);
                }
                let mut conn = conn.clone();
                for (shard, recs) in by_shard {
                    let mut pipe = redis::pipe();
                    for r in &recs {
                        pipe.setbit(
                            self.schema.completed_index(shard),
                            self.schema.bit_offset(r.pid) as usize,
                            true,
                        )
                        .ignore();
                    }
                    let lines: Vec<String> = recs.iter().map(|r| encode_json(r)).collect();
                    pipe.xadd(self.schema.inbox(shard), "*", &[("r", lines.join("\n"))])
                        .ignore();
                    let () = pipe.query_async(&mut conn).await.unwrap();
                    let _: i64 = conn.sadd(self.schema.dirty(), shard).await.unwrap();
                }
            }
        }
    }

    /// Passes until the inboxes are empty; the sum of what they did.
    async fn drain(&self) -> ArchivePass {
        drain(&*self.archiver).await
    }

    /// The statistics count exactly `records` (each pid once), whatever was replayed.
    async fn assert_stats(&self, records: &[CompletedRecord]) {
        let found = self.stats.stats().await.unwrap();
        let expected = Stats::from_records(records);
        assert_eq!(found.global_stats.total_completed, records.len() as u64);
        let differences = diff(&expected, &found);
        assert!(differences.is_empty(), "{differences:#?}");
    }

    /// Puts `r` into shard `shard`'s inbox, whether or not it belongs there, with its
    /// completed-index bit set in that shard as a completion sets it.
    async fn push_into(&self, shard: u32, r: &CompletedRecord) {
        match &self.backend {
            Backend::Memory(txs, ..) => txs[shard as usize].send(r.clone()).unwrap(),
            Backend::Redis(_, conn) => {
                let mut conn = conn.clone();
                // A pid past a bitmap's 2^32 bits has no bit to set (the write path
                // sets such a record aside for that).
                let offset = self.schema.bit_offset(r.pid);
                if offset < 1 << 32 {
                    let _: i64 = conn
                        .setbit(self.schema.completed_index(shard), offset as usize, true)
                        .await
                        .unwrap();
                }
                let _: String = conn
                    .xadd(self.schema.inbox(shard), "*", &[("r", encode_json(r))])
                    .await
                    .unwrap();
            }
        }
    }

    /// Puts `r` into its shard's inbox without a completion: no completed-index bit.
    async fn forge(&self, r: &CompletedRecord) {
        let Backend::Redis(_, conn) = &self.backend else {
            unreachable!("Redis only")
        };
        let _: String = conn
            .clone()
            .xadd(
                self.schema.inbox(self.schema.shard_of(r.pid)),
                "*",
                &[("r", encode_json(r))],
            )
            .await
            .unwrap();
    }

    /// Overwrites sealed batch `batch` with garbage, in its own key or its segment.
    async fn corrupt(&self, batch: u64) {
        let garbage = b"TRB2 not a batch".to_vec();
        match &self.backend {
            Backend::Memory(_, archive, _) => assert!(archive.corrupt_batch(batch, garbage)),
            Backend::Redis(_, conn) => {
                let archive = RedisArchive::new(conn.clone(), self.config.clone()).unwrap();
                assert!(archive.corrupt_batch(batch, garbage).await.unwrap());
            }
        }
    }

    async fn get(&self, pid: u64) -> Lookup {
        self.query.get(pid).await.unwrap()
    }

    /// [`get`](Self::get) of every pid of `pids`, answers in their order, with up to 64
    /// calls in flight: reading back thousands of pids one round trip at a time is most
    /// of what a check on a cluster would cost.
    async fn get_all(&self, pids: impl IntoIterator<Item = u64>) -> Vec<Lookup> {
        use futures_util::StreamExt;
        futures_util::stream::iter(pids)
            .map(|pid| self.get(pid))
            .buffered(64)
            .collect()
            .await
    }

    /// Expires the summary batches holding `pids` now (PEXPIRE 0 on Redis), after
    /// checking each had at most `ttl` and more than `ttl` minus a minute left (PTTL):
    /// no test waits on a TTL.
    async fn expire(&self, pids: &[u64], ttl: Duration) {
        let mut left = Vec::new();
        for &pid in pids {
            let batch = self.schema.batch_of(pid);
            left.extend(match &self.backend {
                Backend::Memory(_, archive, _) => archive.expire_batch(batch),
                Backend::Redis(_, conn) => RedisArchive::new(conn.clone(), self.config.clone())
                    .unwrap()
                    .expire_batch(batch)
                    .await
                    .unwrap(),
            });
        }
        assert!(!left.is_empty(), "nothing of {pids:?} had a TTL");
        let ttl = ttl.as_millis() as i64;
        for ms in left {
            assert!(ms <= ttl && ms > ttl - 60_000, "{ms} ms left of {ttl}");
        }
    }

    /// Writes `bytes` into `field` of shard `shard`'s statistics hash `hash` (on Redis;
    /// in memory the statistics mark the value damaged).
    async fn corrupt_stats(&self, shard: u32, hash: &str, field: &str, bytes: &[u8]) {
        match &self.backend {
            Backend::Memory(_, _, stats) => stats.corrupt(shard, hash, field, bytes.to_vec()),
            Backend::Redis(_, conn) => {
                let _: i64 = conn
                    .clone()
                    .hset(self.schema.stats(shard, hash), field, bytes)
                    .await
                    .unwrap();
            }
        }
    }
}

/// Passes until one reads nothing; fails after 10,000 passes rather than spinning.
async fn drain(archiver: &dyn Archiver) -> ArchivePass {
    let mut total = ArchivePass::default();
    for _ in 0..10_000 {
        let pass = archiver.archive_once().await.unwrap();
        total.add(pass);
        if pass.entries == 0 {
            return total;
        }
    }
    panic!("the inboxes never drained: {total:?}");
}

/// A seed-shaped record; odd pids get a millisecond part, which must survive.
fn record(pid: u64) -> CompletedRecord {
    CompletedRecord {
        pid,
        min_id: (pid - 1) * 1000 + 1,
        max_id: pid * 1000,
        worker: Arc::from(format!("worker{}", pid % 5 + 1)),
        completed_at_ms: T0 + pid * 1000 + (pid % 2) * 17,
        duration_ms: 295_000 + (pid % 7) * 1000 + (pid % 3),
    }
}

fn records(pids: impl IntoIterator<Item = u64>) -> Vec<CompletedRecord> {
    pids.into_iter().map(record).collect()
}

/// The pids of `records`, in order.
fn pids(records: &[CompletedRecord]) -> impl Iterator<Item = u64> + '_ {
    records.iter().map(|r| r.pid)
}

fn archived(r: &CompletedRecord, tier: Tier) -> Lookup {
    Lookup::Archived {
        record: r.clone(),
        tier,
    }
}

/// Generates one `#[tokio::test]` per backend and shard count for each check, and one
/// per group on a cluster of 3 masters with 16 shards: a cluster costs a test 2 s before
/// it takes writes, so its checks share one, and the groups, of about equal length, let
/// nextest run them side by side.
macro_rules! suite {
    ($($group:ident: [$($check:ident),* $(,)?]),* $(,)?) => {
        mod memory_1 { $($( #[tokio::test(flavor = "current_thread")] async fn $check() { super::$check(super::Kind::Memory, 1).await } )*)* }
        mod memory_4 { $($( #[tokio::test(flavor = "current_thread")] async fn $check() { super::$check(super::Kind::Memory, 4).await } )*)* }
        mod redis_1 { $($( #[tokio::test] async fn $check() { super::$check(super::Kind::Redis, 1).await } )*)* }
        mod redis_4 { $($( #[tokio::test] async fn $check() { super::$check(super::Kind::Redis, 4).await } )*)* }
        mod cluster_4 { $($( #[tokio::test] async fn $check() { super::$check(super::Kind::Cluster, 4).await } )*)* }
        mod three_masters_16 {
            $(
                #[tokio::test]
                async fn $group() {
                    let cluster = super::TestCluster::start_with(3, 0);
                    let kind = super::Kind::Masters(cluster.nodes[0].port());
                    $(
                        for master in cluster.masters() {
                            master.cli(&["FLUSHALL"]);
                        }
                        super::$check(kind, 16).await;
                    )*
                }
            )*
        }
    };
}

suite!(
    // Every batch of a segment of every shard, read back pid by pid.
    segments: [full_segments_are_joined_and_read],
    tiers_and_compaction: [
        compaction_joins_segments_from_the_simple_tier,
        joined_segments_expire_together,
        tier_transitions,
        summary_batches_expire,
        a_corrupted_batch_is_reported_and_counted,
        compaction_seals_partial_batches,
        compaction_moves_older_records_to_the_current_tier,
        open_batches_answer_compressed_until_sealed,
        duplicates_in_a_complete_batch_are_found,
    ],
    archiving_reading_and_the_run_loop: [
        simple_tier_round_trip,
        duplicates_are_stored_once,
        unknown_and_archiving,
        range_pages,
        range_pages_through_sparse_batches,
        export_import_round_trip,
        a_small_export_snapshot,
        a_random_workload_matches_a_model,
        records_in_the_wrong_inbox_are_dropped,
        run_publishes_a_snapshot_every_n_archive_batches,
        run_publishes_after_the_interval_only_when_something_was_archived,
        a_woken_pass_archives_what_completions_marked,
        run_archives_what_arrives_while_it_idles,
        damaged_statistics_stall_one_shard_until_repaired,
    ],
);

// ---- Redis only: consumer groups.
