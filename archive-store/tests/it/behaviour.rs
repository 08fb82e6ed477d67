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

/// Issue 22: one corrupt byte in a shard's statistics. Archiving that shard is refused,
/// so it stalls alone, its records left in the inbox and the stall recorded with its
/// reason; the other shards drain. A repair sets the bad value aside and rebuilds the
/// shard from its archived records; the next pass drains it and clears the stall, and
/// the statistics count every record once.
async fn damaged_statistics_stall_one_shard_until_repaired(kind: Kind, shards: u32) {
    if shards < 2 {
        return;
    }
    let h = Harness::new(kind, shards).await;
    // Shard 0 holds batches 0, s, 2s, ...; shard 1 batches 1, s + 1, ...
    let of = |shard: u32, n: u64| -> Vec<CompletedRecord> {
        records(
            (1..)
                .filter(|&p| h.schema.shard_of(p) == shard)
                .take(n as usize),
        )
    };
    let (first0, first1) = (of(0, 50), of(1, 50));
    h.complete(&first0).await;
    h.complete(&first1).await;
    h.drain().await;
    assert!(h.query.stalled().await.unwrap().is_empty());

    h.corrupt_stats(0, "ranges", "0", b"\x80").await;
    let (more0, more1) = (of(0, 75)[50..].to_vec(), of(1, 75)[50..].to_vec());
    h.complete(&more0).await;
    h.complete(&more1).await;
    let pass = h.drain().await;
    assert_eq!(pass.archived, 25, "the healthy shard drained: {pass:?}");
    assert!(pass.stalled > 0, "{pass:?}");
    for found in h.get_all(pids(&more1)).await {
        assert!(matches!(found, Lookup::Archived { .. }));
    }
    // Nothing of shard 0's records is lost: completed, not archived, still waiting.
    for (r, found) in more0.iter().zip(h.get_all(pids(&more0)).await) {
        assert_eq!(found, Lookup::Archiving, "pid {}", r.pid);
    }
    let stalled = h.query.stalled().await.unwrap();
    assert_eq!(stalled.len(), 1, "{stalled:?}");
    assert_eq!(stalled[0].shard, 0);
    assert!(stalled[0].stats_damaged(), "{stalled:?}");
    assert!(stalled[0].since_ms > 0);
    // Another pass changes nothing and says the same.
    let again = h.archiver.archive_once().await.unwrap();
    assert_eq!((again.entries, again.archived), (0, 0), "{again:?}");
    assert!(again.stalled > 0);
    assert_eq!(
        h.query.stalled().await.unwrap()[0].since_ms,
        stalled[0].since_ms
    );

    let damage = h.stats.damage(0).await.unwrap();
    assert_eq!(damage.len(), 1, "{damage:?}");
    let repaired = h.archiver.repair_stats(0).await.unwrap();
    assert!(repaired.whole, "{repaired:?}");
    assert_eq!(repaired.unreadable, 0);
    assert_eq!(repaired.quarantined, damage);
    assert!(h.stats.damage(0).await.unwrap().is_empty());

    let pass = h.drain().await;
    assert_eq!(pass.archived, 25, "{pass:?}");
    assert_eq!(pass.stalled, 0, "{pass:?}");
    assert!(h.query.stalled().await.unwrap().is_empty());
    let all: Vec<CompletedRecord> = [first0, first1, more0, more1].concat();
    h.assert_stats(&all).await;
}

/// Every pid of segment 0 of every shard (batches `0..10 * shards`), and a few beyond.
fn segment_records(shards: u32) -> Vec<CompletedRecord> {
    records(1..=SEGMENT_BATCHES * 100 * u64::from(shards) + 30)
}

async fn full_segments_are_joined_and_read(kind: Kind, shards: u32) {
    use rand::SeedableRng;
    use rand::seq::SliceRandom;
    let h = Harness::with(kind, compressed_config(shards, u64::MAX, Duration::ZERO)).await;
    let recs = segment_records(shards);
    // Out of order, in several entries and passes, with a replay.
    let mut shuffled = recs.clone();
    shuffled.shuffle(&mut rand::rngs::StdRng::seed_from_u64(5));
    for part in shuffled.chunks(370) {
        h.complete(part).await;
        h.drain().await;
    }
    h.complete(&shuffled[..50]).await;
    assert_eq!(h.drain().await.archived, 0);
    for (r, found) in recs.iter().zip(h.get_all(pids(&recs)).await) {
        assert_eq!(found, archived(r, Tier::Compressed), "pid {}", r.pid);
    }
    h.assert_stats(&recs).await;
    // Joined: one key per segment, no batch keys; the last batch stays on its own.
    assert_joined(&h, shards).await;
    // In order, each batch arrives whole and is sealed before its archive call, whose
    // joins ride behind it: joined as well, without any compaction.
    let in_order = h
        .beside(compressed_config(shards, u64::MAX, Duration::ZERO))
        .await;
    in_order.complete(&recs).await;
    in_order.drain().await;
    assert_joined(&in_order, shards).await;
    // The dump holds every record, and comes back whole elsewhere.
    let dump = h.export.export(T0).await.unwrap();
    assert_eq!(dump.entries(), recs.len() as u64);
    let other = h
        .beside(compressed_config(shards, u64::MAX, Duration::ZERO))
        .await;
    assert_eq!(other.import.import(&dump).await.unwrap(), recs.len() as u64);
    let again = other.export.export(T0).await.unwrap();
    assert_eq!(again.to_json_lines(), dump.to_json_lines());
    // A corrupted batch of a joined segment fails alone, and is counted.
    h.corrupt(3).await;
    assert!(matches!(h.get(350).await, Lookup::Undecodable { .. }));
    assert_eq!(h.query.decode_failures().await.unwrap(), 1);
    assert_eq!(h.get(250).await, archived(&recs[249], Tier::Compressed));
    assert_eq!(h.get(450).await, archived(&recs[449], Tier::Compressed));
}

/// Asserts (on Redis) that segment 0 of every shard is joined: its key is there and
/// none of its batches keeps its own.
async fn assert_joined(h: &Harness, shards: u32) {
    if let Backend::Redis(_, conn) = &h.backend {
        let mut c = conn.clone();
        for shard in h.schema.shards() {
            let seg = h.schema.shard_key(shard, "completed:seg:0");
            assert!(c.exists::<_, bool>(&seg).await.unwrap(), "{seg}");
        }
        for b in 0..SEGMENT_BATCHES * u64::from(shards) {
            let key = h.schema.completed_batch(b);
            assert!(!c.exists::<_, bool>(&key).await.unwrap(), "{key}");
        }
    }
}

async fn compaction_joins_segments_from_the_simple_tier(kind: Kind, shards: u32) {
    let recs = segment_records(shards);
    let config = Config {
        num_shards: shards,
        consumer: "a1".into(),
        compressed_at: recs.len() as u64,
        summary_at: u64::MAX,
        ..Config::default()
    };
    let h = Harness::with(kind, config).await;
    h.complete(&recs).await;
    h.drain().await;
    assert_eq!(h.get(5).await, archived(&recs[4], Tier::Simple));
    // Compaction moves them into batches, seals them and joins the full segments.
    h.compaction.compact().await.unwrap();
    assert_joined(&h, shards).await;
    for (r, found) in recs.iter().zip(h.get_all(pids(&recs)).await) {
        assert_eq!(found, archived(r, Tier::Compressed), "pid {}", r.pid);
    }
    assert_eq!(h.compaction.compact().await.unwrap(), 0);
    h.assert_stats(&recs).await;
}

async fn joined_segments_expire_together(kind: Kind, shards: u32) {
    let ttl = Duration::from_secs(3600);
    let h = Harness::with(kind, compressed_config(shards, 0, ttl)).await;
    let recs = segment_records(shards);
    h.complete(&recs).await;
    h.drain().await;
    let last = SEGMENT_BATCHES * 100 * u64::from(shards) - 1;
    for pid in [1, 150, 999, last] {
        assert_eq!(
            h.get(pid).await,
            archived(&recs[pid as usize - 1], Tier::Summary)
        );
    }
    h.expire(&[1, 150, 999, last], ttl).await;
    for pid in [1, 150, 999, last] {
        assert_eq!(h.get(pid).await, Lookup::Expired, "pid {pid}");
    }
    assert_eq!(h.query.decode_failures().await.unwrap(), 0);
    h.assert_stats(&recs).await;
}

async fn simple_tier_round_trip(kind: Kind, shards: u32) {
    let h = Harness::new(kind, shards).await;
    let recs = records(1..=250);
    h.complete(&recs[..100]).await;
    h.complete(&recs[100..]).await;
    let pass = h.drain().await;
    assert_eq!(pass.archived, 250);
    assert_eq!(pass.duplicates, 0);
    for (r, found) in recs.iter().zip(h.get_all(pids(&recs)).await) {
        assert_eq!(found, archived(r, Tier::Simple), "pid {}", r.pid);
    }
    // Nothing left to do.
    assert_eq!(h.drain().await, ArchivePass::default());
    h.assert_stats(&recs).await;
}

async fn duplicates_are_stored_once(kind: Kind, shards: u32) {
    let h = Harness::new(kind, shards).await;
    let recs = records(1..=120);
    h.complete(&recs).await;
    // The same pids again, in one pass with the originals and in a later pass.
    h.complete(&recs[..30]).await;
    let first = h.drain().await;
    h.complete(&recs[50..70]).await;
    let second = h.drain().await;
    assert_eq!(first.archived + second.archived, 120);
    assert_eq!(first.duplicates + second.duplicates, 50);
    for (r, found) in recs.iter().zip(h.get_all(pids(&recs)).await) {
        assert_eq!(found, archived(r, Tier::Simple));
    }
    h.assert_stats(&recs).await;
}

async fn unknown_and_archiving(kind: Kind, shards: u32) {
    let h = Harness::new(kind, shards).await;
    assert_eq!(h.get(7).await, Lookup::Unknown);
    h.complete(&records([7])).await;
    // Completed (index bit set, or received by the memory archive) but not archived.
    assert_eq!(h.get(7).await, Lookup::Archiving);
    h.drain().await;
    assert_eq!(h.get(7).await, archived(&record(7), Tier::Simple));
    assert_eq!(h.get(8).await, Lookup::Unknown);
    // Pids whose bit lies past Redis's 2^32-bit bitmap limit were never archived.
    assert_eq!(h.get(u64::MAX).await, Lookup::Unknown);
}

async fn tier_transitions(kind: Kind, shards: u32) {
    let config = Config {
        num_shards: shards,
        consumer: "a1".into(),
        compressed_at: 100,
        summary_at: 300,
        ..Config::default()
    };
    let h = Harness::with(kind, config).await;
    // Rounds of 50: the tier is read once per pass, so each round lands in one tier.
    let recs = records(1..=600);
    let mut tiers = Vec::new();
    for round in recs.chunks(50) {
        h.complete(round).await;
        h.drain().await;
        tiers.push(h.config.tier_for((tiers.len() as u64) * 50));
    }
    let found = h.get_all(pids(&recs)).await;
    for (i, (r, found)) in recs.iter().zip(found).enumerate() {
        let want = tiers[i / 50];
        match found {
            Lookup::Archived { record, tier } => {
                assert_eq!(&record, r, "pid {}", r.pid);
                // Batches are sealed with the tier of the pass that fills them, so the
                // batches straddling a threshold may report the later tier; open ones
                // (batch 1, missing simple pid 100, and batch 6) report compressed.
                match r.pid {
                    ..=100 => assert_eq!(tier, Tier::Simple, "pid {}", r.pid),
                    101..=299 => assert_eq!(tier, Tier::Compressed, "pid {}", r.pid),
                    400..=599 => assert_eq!(tier, Tier::Summary, "pid {}", r.pid),
                    _ => assert_ne!(tier, Tier::Simple, "pid {}", r.pid),
                }
                assert_eq!(want == Tier::Simple, tier == Tier::Simple);
            }
            other => panic!("pid {}: {other:?}", r.pid),
        }
    }
    h.assert_stats(&recs).await;
}

async fn range_pages(kind: Kind, shards: u32) {
    let h = Harness::new(kind, shards).await;
    let recs = records((1..=90).filter(|p| p % 3 != 0));
    h.complete(&recs).await;
    h.drain().await;
    let mut got = Vec::new();
    let mut from = Some(1);
    while let Some(start) = from {
        let page = h.query.range(start..=95, 7).await.unwrap();
        assert!(page.records.len() <= 7);
        got.extend(page.records);
        from = page.next;
    }
    assert_eq!(got, recs);
}

/// Pages of a range over sparse archived batches in every tier, starting and ending
/// mid-batch: each archived pid of the range once, in order, nothing outside it, and
/// the empty stretches between batches skipped.
async fn range_pages_through_sparse_batches(kind: Kind, shards: u32) {
    let h = Harness::with(kind, compressed_config(shards, 2, Duration::ZERO)).await;
    // Batches 0, 1, 3, 4 and 19 (of 100 pids), with gaps inside them.
    let held = |p: u64| matches!(p / 100, 0 | 1 | 3 | 4 | 19) && !p.is_multiple_of(7);
    let recs = records((1..=1999).filter(|&p| held(p)));
    h.complete(&recs).await;
    h.drain().await;
    let want: Vec<_> = recs
        .iter()
        .filter(|r| (150..=1950).contains(&r.pid))
        .cloned()
        .collect();
    for limit in [13, 1, 1000] {
        let mut got = Vec::new();
        let mut from = Some(150);
        while let Some(start) = from {
            let page = h.query.range(start..=1950, limit).await.unwrap();
            assert!(page.records.len() <= limit);
            got.extend(page.records);
            from = page.next;
        }
        assert_eq!(got, want, "limit {limit}");
    }
    let empty = h.query.range(500..=1899, 10).await.unwrap();
    assert!(empty.records.is_empty(), "{empty:?}");
}

fn compressed_config(shards: u32, summary_at: u64, ttl: Duration) -> Config {
    Config {
        num_shards: shards,
        consumer: "a1".into(),
        compressed_at: 0,
        summary_at,
        summary_ttl: ttl,
        ..Config::default()
    }
}

async fn summary_batches_expire(kind: Kind, shards: u32) {
    let ttl = Duration::from_secs(3600);
    let h = Harness::with(kind, compressed_config(shards, 0, ttl)).await;
    // Batch 0 holds pids 1..=99 (pid 0 is never planned), batch 1 pids 100..=199.
    let recs = records(1..=199);
    h.complete(&recs).await;
    h.drain().await;
    for (r, found) in recs.iter().zip(h.get_all(pids(&recs)).await) {
        assert_eq!(found, archived(r, Tier::Summary));
    }
    h.expire(&[1, 150], ttl).await;
    assert_eq!(h.get(1).await, Lookup::Expired);
    assert_eq!(h.get(150).await, Lookup::Expired);
    assert_eq!(h.query.decode_failures().await.unwrap(), 0);
    // The statistics outlive the batches.
    h.assert_stats(&recs).await;
}

async fn a_corrupted_batch_is_reported_and_counted(kind: Kind, shards: u32) {
    let h = Harness::with(kind, compressed_config(shards, u64::MAX, Duration::ZERO)).await;
    let recs = records(1..=199);
    h.complete(&recs).await;
    h.drain().await;
    assert_eq!(h.get(5).await, archived(&recs[4], Tier::Compressed));
    h.corrupt(0).await;
    assert!(matches!(h.get(5).await, Lookup::Undecodable { .. }));
    assert!(matches!(h.get(6).await, Lookup::Undecodable { .. }));
    assert_eq!(h.query.decode_failures().await.unwrap(), 2);
    // The other batch is untouched.
    assert_eq!(h.get(150).await, archived(&recs[149], Tier::Compressed));
}

async fn compaction_seals_partial_batches(kind: Kind, shards: u32) {
    let h = Harness::with(kind, compressed_config(shards, u64::MAX, Duration::ZERO)).await;
    let recs = records(1..=250);
    h.complete(&recs[..150]).await;
    h.drain().await;
    // Batch 0 is full and sealed; batch 1 is half open.
    assert_eq!(h.compaction.compact().await.unwrap(), 1);
    assert_eq!(h.compaction.compact().await.unwrap(), 0);
    // The rest arrives out of order; batch 1 fills and is sealed over its partial seal.
    let mut rest = recs[150..].to_vec();
    rest.reverse();
    h.complete(&rest).await;
    h.drain().await;
    assert_eq!(h.compaction.compact().await.unwrap(), 1); // batch 2, half full
    for (r, found) in recs.iter().zip(h.get_all(pids(&recs)).await) {
        assert_eq!(found, archived(r, Tier::Compressed), "pid {}", r.pid);
    }
    h.assert_stats(&recs).await;
}

async fn export_import_round_trip(kind: Kind, shards: u32) {
    let config = Config {
        num_shards: shards,
        consumer: "a1".into(),
        compressed_at: 100,
        summary_at: 300,
        ..Config::default()
    };
    let h = Harness::with(kind, config.clone()).await;
    let recs = records(1..=450);
    for round in recs.chunks(50) {
        h.complete(round).await;
        h.drain().await;
    }
    let dump = h.export.export(T0).await.unwrap();
    assert_eq!(dump.entries(), 450);
    let bytes = dump.to_bytes().unwrap();
    assert_eq!(Dump::from_bytes(&bytes).unwrap(), dump);
    // Every corruption is caught, none panics.
    for at in (0..bytes.len()).step_by(97) {
        let mut bad = bytes.clone();
        bad[at] ^= 0x41;
        assert!(Dump::from_bytes(&bad).is_err(), "flip at {at}");
    }
    assert!(Dump::from_bytes(&bytes[..bytes.len() - 1]).is_err());
    let lines = dump.to_json_lines();
    assert_eq!(lines.lines().count(), 450);
    assert_eq!(lines.lines().next().unwrap(), encode_json(&recs[0]));

    // Into an empty namespace with another shard count, then not again.
    let other = h
        .beside(Config {
            num_shards: if shards == 1 { 4 } else { 1 },
            ..config
        })
        .await;
    assert_eq!(other.import.import(&dump).await.unwrap(), 450);
    assert!(other.import.import(&dump).await.is_err());
    for (r, found) in recs.iter().zip(other.get_all(pids(&recs)).await) {
        match found {
            Lookup::Archived { record, tier } => {
                assert_eq!(&record, r);
                // A batch goes back whole to the highest tier it held: batch 1 held
                // simple pid 100 and compressed 101..=199, and comes back compressed.
                assert_eq!(tier == Tier::Simple, r.pid < 100, "pid {}", r.pid);
            }
            found => panic!("pid {}: {found:?}", r.pid),
        }
    }
    other.assert_stats(&recs).await;
    assert_eq!(
        other.export.export(T0).await.unwrap().to_json_lines(),
        lines
    );
}

/// The same fixed workload gives the same dump bytes on every backend and shard count.
async fn a_small_export_snapshot(kind: Kind, shards: u32) {
    let h = Harness::new(kind, shards).await;
    h.complete(&records([1, 2, 3, 99, 100, 101, 250, 4970, 4971]))
        .await;
    h.drain().await;
    let dump = h.export.export(T0).await.unwrap();
    let bytes = dump.to_bytes().unwrap();
    let mut text = format!(
        "namespace {} shards {} batch_size {} entries {} created {} updated {} workers {:?}\n",
        dump.namespace,
        dump.num_shards,
        dump.batch_size,
        dump.entries(),
        dump.created_ms,
        dump.updated_ms,
        dump.dict
            .entries()
            .iter()
            .map(|e| format!("{}={}", e.code, e.id))
            .collect::<Vec<_>>(),
    );
    for b in &dump.batches {
        text += &format!(
            "batch {} tier {} records {}\n",
            b.id,
            b.tier.as_str(),
            b.records.len()
        );
    }
    text += &dump.to_json_lines();
    // The shard count is in the header (and its checksum): hash what follows it, which
    // is identical for every backend and shard count.
    let header_len = 8 + 2 + 4 + 5 * 8 + 2 + dump.namespace.len() + 4;
    text += &format!(
        "{} bytes, crc32 after the header {:08x}\n",
        bytes.len(),
        crc32fast::hash(&bytes[header_len..])
    );
    let text = text.replace(&format!("shards {shards} "), "shards N ");
    insta::assert_snapshot!("small_export", text);
}

async fn compaction_moves_older_records_to_the_current_tier(kind: Kind, shards: u32) {
    let config = Config {
        num_shards: shards,
        consumer: "a1".into(),
        compressed_at: 100,
        summary_at: 300,
        ..Config::default()
    };
    let h = Harness::with(kind, config).await;
    let recs = records(1..=450);
    for round in recs.chunks(50) {
        h.complete(round).await;
        h.drain().await;
    }
    assert_eq!(h.get(5).await, archived(&recs[4], Tier::Simple));
    h.compaction.compact().await.unwrap();
    for (r, found) in recs.iter().zip(h.get_all(pids(&recs)).await) {
        assert_eq!(found, archived(r, Tier::Summary), "pid {}", r.pid);
    }
    assert_eq!(h.compaction.compact().await.unwrap(), 0);
    h.assert_stats(&recs).await;
    assert_eq!(h.query.decode_failures().await.unwrap(), 0);
}

/// Completions, duplicate completions, archive passes, archivers dying with entries
/// pending and others taking over, compactions across tier thresholds: every answer and
/// the statistics equal a map of first completions.
async fn a_random_workload_matches_a_model(kind: Kind, shards: u32) {
    use rand::{Rng, SeedableRng};
    let config = Config {
        num_shards: shards,
        consumer: "a0".into(),
        compressed_at: 150,
        summary_at: 400,
        claim_idle: Duration::from_millis(1),
        ..Config::default()
    };
    let h = Harness::with(kind, config).await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(u64::from(shards) * 7 + 1);
    let mut model: BTreeMap<u64, CompletedRecord> = BTreeMap::new();
    let mut archiver = h.archiver.clone();
    for step in 0..120 {
        match rng.random_range(0..10) {
            0..=4 => {
                let n = rng.random_range(1..30);
                let batch: Vec<CompletedRecord> =
                    (0..n).map(|_| record(rng.random_range(1..=700))).collect();
                for r in &batch {
                    model.entry(r.pid).or_insert_with(|| r.clone());
                }
                h.complete(&batch).await;
            }
            5..=6 => {
                archiver.archive_once().await.unwrap();
            }
            7 => {
                // An archiver dies holding entries; a new one (another consumer) starts.
                if kind != Kind::Memory {
                    read_as(&h, &format!("dead{step}")).await;
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    archiver = h
                        .another(&format!("a{step}"), Duration::from_millis(1))
                        .unwrap();
                }
            }
            8 => {
                h.compaction.compact().await.unwrap();
            }
            _ => {
                let pid = rng.random_range(1..=700);
                match h.get(pid).await {
                    Lookup::Archived { record, .. } => assert_eq!(Some(&record), model.get(&pid)),
                    Lookup::Archiving | Lookup::Unknown => {}
                    other => panic!("pid {pid}: {other:?}"),
                }
            }
        }
    }
    tokio::time::sleep(Duration::from_millis(3)).await;
    drain(&*archiver).await;
    for (pid, found) in (1..=700).zip(h.get_all(1..=700).await) {
        match (found, model.get(&pid)) {
            (Lookup::Archived { record, .. }, Some(want)) => assert_eq!(&record, want),
            (Lookup::Unknown, None) => {}
            (found, want) => panic!("pid {pid}: {found:?}, model {want:?}"),
        }
    }
    let all: Vec<CompletedRecord> = model.into_values().collect();
    h.assert_stats(&all).await;
}

async fn records_in_the_wrong_inbox_are_dropped(kind: Kind, shards: u32) {
    let h = Harness::new(kind, shards).await;
    // Batch 1 lives in shard 1 of 4 (and in shard 0 of 1).
    let r = record(150);
    h.push_into(0, &r).await;
    let pass = h.drain().await;
    if shards == 1 {
        assert_eq!((pass.archived, pass.malformed), (1, 0));
        assert_eq!(h.get(150).await, archived(&r, Tier::Simple));
    } else {
        assert_eq!((pass.archived, pass.malformed), (0, 1));
        assert_eq!(h.get(150).await, Lookup::Unknown);
        h.assert_stats(&[]).await;
    }
}

async fn open_batches_answer_compressed_until_sealed(kind: Kind, shards: u32) {
    let h = Harness::with(
        kind,
        compressed_config(shards, 0, Duration::from_secs(3600)),
    )
    .await;
    // The summary tier from the start. Batch 0 (pids 1..=99) is complete and sealed at
    // once; batch 1 gets half its pids and stays open.
    let recs = records(1..=150);
    h.complete(&recs).await;
    h.drain().await;
    assert_eq!(h.get(5).await, archived(&recs[4], Tier::Summary));
    // An open batch has no expiry: it answers as compressed, whatever tier is in force.
    assert_eq!(h.get(120).await, archived(&recs[119], Tier::Compressed));
    // Sealed (here by compaction) under the summary tier, it expires and says so.
    assert_eq!(h.compaction.compact().await.unwrap(), 1);
    assert_eq!(h.get(120).await, archived(&recs[119], Tier::Summary));
    h.assert_stats(&recs).await;
}

async fn duplicates_in_a_complete_batch_are_found(kind: Kind, shards: u32) {
    let h = Harness::with(kind, compressed_config(shards, u64::MAX, Duration::ZERO)).await;
    // Some pids of batches 0 and 1 first (at both ends of the script's 32-bit fields
    // and inside them), then both batches whole: those arrive complete in one call,
    // and the archived ones must be found and dropped, the rest written once.
    let recs = records(1..=199);
    let early: Vec<CompletedRecord> = [1, 32, 33, 64, 70, 99, 100, 131, 150, 199]
        .iter()
        .map(|&p| record(p))
        .collect();
    h.complete(&early).await;
    assert_eq!(h.drain().await.archived, early.len());
    h.complete(&recs).await;
    let pass = h.drain().await;
    assert_eq!(
        (pass.archived, pass.duplicates),
        (recs.len() - early.len(), early.len())
    );
    for (r, found) in recs.iter().zip(h.get_all(pids(&recs)).await) {
        assert_eq!(found, archived(r, Tier::Compressed), "pid {}", r.pid);
    }
    h.assert_stats(&recs).await;
}

// ---- Redis only: consumer groups.

#[tokio::test]
async fn a_dead_archivers_entries_are_taken_over() {
    for shards in [1, 4] {
        let h = Harness::new(Kind::Redis, shards).await;
        let Backend::Redis(_, conn) = &h.backend else {
            unreachable!()
        };
        let mut c = conn.clone();
        let recs = records(1..=400);
        h.complete(&recs[..200]).await;
        // The dead archiver read (so its entries are pending) but never wrote or acked:
        // simulated with a bare XREADGROUP under its consumer name.
        read_as(&h, "dead").await;
        // A live colleague with a long idle time takes nothing of the dead one's.
        h.complete(&recs[200..]).await;
        let patient = h.another("patient", Duration::from_secs(3600)).unwrap();
        let pass = drain(&*patient).await;
        assert_eq!((pass.claimed, pass.archived), (0, 200), "{pass:?}");
        // Replayed completions of archived pids, read by a second archiver that dies.
        h.complete(&recs[200..300]).await;
        read_as(&h, "dead2").await;
        assert_eq!(drain(&*patient).await, ArchivePass::default());
        // The taker, with a short idle time, finishes both dead archivers' work: the
        // fresh records once, the replayed ones not at all.
        tokio::time::sleep(Duration::from_millis(30)).await;
        let taker = h.another("taker", Duration::from_millis(10)).unwrap();
        let pass = drain(&*taker).await;
        assert!(pass.claimed >= 1, "{pass:?}");
        assert_eq!((pass.archived, pass.duplicates), (200, 100), "{pass:?}");
        for (r, found) in recs.iter().zip(h.get_all(pids(&recs)).await) {
            assert_eq!(found, archived(r, Tier::Simple));
        }
        h.assert_stats(&recs).await;
        // Nothing pending anywhere.
        for shard in h.schema.shards() {
            let len: usize = c.xlen(h.schema.inbox(shard)).await.unwrap();
            assert_eq!(len, 0, "shard {shard}");
        }
    }
}

#[tokio::test]
async fn a_final_drain_takes_over_after_its_own_idle_time() {
    for shards in [1, 4] {
        let h = Harness::new(Kind::Redis, shards).await;
        let Backend::Redis(_, conn) = &h.backend else {
            unreachable!()
        };
        let mut c = conn.clone();
        let recs = records(1..=200);
        h.complete(&recs).await;
        read_as(&h, "dead").await;
        // An archiver whose sweeps wait an hour for a dead colleague's entries...
        let patient = h.another("patient", Duration::from_secs(3600)).unwrap();
        assert_eq!(drain(&*patient).await, ArchivePass::default());
        assert_eq!(
            patient
                .archive_taking_over(Duration::from_secs(3600))
                .await
                .unwrap(),
            ArchivePass::default()
        );
        // ...takes them over at the end of a job once they sat the drain's idle time.
        tokio::time::sleep(Duration::from_millis(30)).await;
        let mut total = ArchivePass::default();
        loop {
            let pass = patient
                .archive_taking_over(Duration::from_millis(10))
                .await
                .unwrap();
            total.add(pass);
            if pass.entries == 0 {
                break;
            }
        }
        assert!(total.claimed >= 1, "{total:?}");
        assert_eq!((total.archived, total.duplicates), (200, 0), "{total:?}");
        h.assert_stats(&recs).await;
        for shard in h.schema.shards() {
            let len: usize = c.xlen(h.schema.inbox(shard)).await.unwrap();
            assert_eq!(len, 0, "shard {shard}");
        }
    }
}

#[tokio::test]
async fn a_batch_the_statistics_refuse_writes_nothing() {
    let h = Harness::new(Kind::Redis, 1).await;
    let Backend::Redis(_, conn) = &h.backend else {
        unreachable!()
    };
    let mut c = conn.clone();
    // The shard's count has reached 10^18: the statistics refuse any further delta.
    let global = tranche_stats::archive_protocol::stats_keys(&h.schema, 0)[0].clone();
    let _: () = c
        .hset(&global, "count", "1000000000000000000")
        .await
        .unwrap();
    h.complete(&records(1..=10)).await;
    let pass = h.archiver.archive_once().await.unwrap();
    assert_eq!(
        (pass.entries, pass.archived, pass.stalled),
        (0, 0, 1),
        "{pass:?}"
    );
    let stalled = h.query.stalled().await.unwrap();
    assert_eq!(stalled.len(), 1);
    assert!(stalled[0].reason.contains("10^18"), "{stalled:?}");
    // A counter at the guard is not damage: no repair changes it.
    assert!(!stalled[0].stats_damaged(), "{stalled:?}");
    // Nothing of the batch was written: no archived bit, no record, no count, and the
    // entry is still pending for a later pass.
    let archived: Option<Vec<u8>> = c.get(h.schema.shard_key(0, "archived")).await.unwrap();
    assert_eq!(archived, None);
    let simple: usize = c.hlen(h.schema.completed(0)).await.unwrap();
    assert_eq!(simple, 0);
    let count: Option<u64> = c
        .hget(h.schema.shard_key(0, "archive"), "count")
        .await
        .unwrap();
    assert_eq!(count, None);
    assert_eq!(h.get(3).await, Lookup::Archiving);
    let pending: redis::Value = c.xpending(h.schema.inbox(0), "archivers").await.unwrap();
    assert!(
        matches!(pending, redis::Value::Array(ref v) if v.first() == Some(&redis::Value::Int(1))),
        "{pending:?}"
    );
}

/// Reads every inbox entry as consumer `name` of the archivers' group, and dies.
async fn read_as(h: &Harness, name: &str) {
    let Backend::Redis(_, conn) = &h.backend else {
        unreachable!()
    };
    let mut c = conn.clone();
    for shard in h.schema.shards() {
        let created: redis::RedisResult<redis::Value> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(h.schema.inbox(shard))
            .arg("archivers")
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut c)
            .await;
        assert!(created.is_ok() || created.unwrap_err().code() == Some("BUSYGROUP"));
        let _: redis::Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg("archivers")
            .arg(name)
            .arg("COUNT")
            .arg(1000)
            .arg("STREAMS")
            .arg(h.schema.inbox(shard))
            .arg(">")
            .query_async(&mut c)
            .await
            .unwrap();
    }
}

/// The archiver loop ([`tranche_archive_store::run`]) with `policy`, on a task of its
/// own; dropping or firing the sender stops it.
fn start_run(
    h: &Harness,
    policy: SnapshotPolicy,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let archiver = h.archiver.clone();
    let snapshots = Snapshots {
        stats: h.stats.clone(),
        policy,
    };
    let task = tokio::spawn(async move {
        tranche_archive_store::run(&*archiver, Some(snapshots), async {
            let _ = stopped.await;
        })
        .await;
    });
    (stop, task)
}

/// Polls `check` until it returns `Some`, for at most ten seconds.
async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The latest snapshot's version and completed count (0, 0 before the first).
async fn latest(h: &Harness) -> (u64, u64) {
    h.stats
        .latest_snapshot()
        .await
        .unwrap()
        .map_or((0, 0), |s| {
            (s.version, s.stats.global_stats.total_completed)
        })
}

/// Completes `pid` alone (one inbox entry, so one archive batch) and waits until the
/// running archiver has archived it.
async fn archive_alone(h: &Harness, pid: u64) {
    let r = record(pid);
    h.complete(std::slice::from_ref(&r)).await;
    eventually(&format!("pid {pid} archived"), || async {
        matches!(h.get(pid).await, Lookup::Archived { .. }).then_some(())
    })
    .await;
}

async fn run_publishes_a_snapshot_every_n_archive_batches(kind: Kind, shards: u32) {
    let h = Harness::new(kind, shards).await;
    let policy = SnapshotPolicy {
        every: 2,
        interval: Duration::from_secs(3600),
        min_gap: Duration::ZERO,
    };
    let (stop, task) = start_run(&h, policy);
    // Every second batch publishes, off the archiving path: each snapshot holds what
    // was archived when it started, and no record is archived while one is awaited.
    for pid in 1..=6 {
        archive_alone(&h, pid).await;
        if pid % 2 == 0 {
            let want = (pid / 2, pid);
            eventually(&format!("snapshot {want:?}"), || async {
                (latest(&h).await == want).then_some(())
            })
            .await;
        } else {
            // One batch since the last snapshot: none is due. The archiver's passes go
            // on meanwhile (it polls the empty inboxes).
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert_eq!(
                latest(&h).await,
                ((pid - 1) / 2, pid - 1),
                "after pid {pid}"
            );
        }
    }
    // Passes that archive nothing (a replay of archived records) are no batches.
    h.complete(&records(1..=6)).await;
    h.complete(&records(1..=6)).await;
    eventually("the replays read", || async {
        (h.archiver.archive_once().await.unwrap().entries == 0).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(latest(&h).await, (3, 6));
    stop.send(()).unwrap();
    task.await.unwrap();
    h.assert_stats(&records(1..=6)).await;
}

async fn run_publishes_after_the_interval_only_when_something_was_archived(
    kind: Kind,
    shards: u32,
) {
    let h = Harness::with(
        kind,
        Config {
            num_shards: shards,
            consumer: "a1".into(),
            // Idle passes at most 50 ms apart, so the interval is noticed soon after.
            block: Duration::from_millis(50),
            ..Config::default()
        },
    )
    .await;
    let policy = SnapshotPolicy {
        every: 1000,
        interval: Duration::from_millis(300),
        min_gap: Duration::ZERO,
    };
    let (stop, task) = start_run(&h, policy);
    // Idle from the start: nothing archived, nothing published.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(latest(&h).await, (0, 0));
    // One batch, far below `every`: the interval publishes it.
    archive_alone(&h, 7).await;
    eventually("a snapshot after the interval", || async {
        (latest(&h).await == (1, 1)).then_some(())
    })
    .await;
    // Idle again: more intervals pass, and no snapshot repeats the last.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(latest(&h).await, (1, 1));
    stop.send(()).unwrap();
    task.await.unwrap();
}

/// A woken pass picks its tier from the namespace's count, which other archivers move:
/// an archiver that wrote a sixteenth of the way to the next threshold since it last
/// counted counts again, so records past the threshold go to the compressed tier even
/// when another archiver wrote most of the way there. (It kept the count of its last
/// sweep plus its own writes, and in a fleet of four sharing the work went on writing
/// the simple tier to about four times the threshold.)
#[tokio::test]
async fn a_woken_pass_counts_again_as_other_archivers_write() {
    let config = Config {
        consumer: "a".into(),
        gather: Duration::ZERO,
        compressed_at: 160,
        ..Config::default()
    };
    let h = Harness::with(Kind::Redis, config).await;
    let b = h.another("b", Duration::from_secs(60)).unwrap();
    let woken = |a: &Arc<dyn Archiver>| {
        let a = a.clone();
        async move { a.archive_woken().await.unwrap().archived }
    };
    let query = h.query.clone();
    let tier = |pid| {
        let query = query.clone();
        async move {
            match query.get(pid).await.unwrap() {
                Lookup::Archived { tier, .. } => tier,
                other => panic!("pid {pid}: {other:?}"),
            }
        }
    };
    // b counts (nothing yet) and writes 20 itself.
    h.complete(&records(1..=20)).await;
    assert_eq!(woken(&b).await, 20);
    // The other archiver writes 200 more: the namespace is past the threshold.
    h.complete(&records(21..=220)).await;
    assert_eq!(woken(&h.archiver).await, 200);
    // b has written 20 since its count, more than a sixteenth of the 140 it believes
    // are left: it counts again, and writes the next records compressed.
    h.complete(&records(221..=230)).await;
    assert_eq!(woken(&b).await, 10);
    assert_eq!(tier(20).await, Tier::Simple);
    assert_eq!(tier(220).await, Tier::Simple);
    assert_eq!(tier(225).await, Tier::Compressed);
}

/// Woken passes alone (no sweep) archive everything completions marked, exactly once.
async fn a_woken_pass_archives_what_completions_marked(kind: Kind, shards: u32) {
    let h = Harness::with(
        kind,
        Config {
            num_shards: shards,
            consumer: "a1".into(),
            batch: 3,
            gather: Duration::ZERO,
            ..Config::default()
        },
    )
    .await;
    let recs = records(1..=700);
    for part in recs.chunks(50) {
        h.complete(part).await;
    }
    let mut total = ArchivePass::default();
    loop {
        let pass = h.archiver.archive_woken().await.unwrap();
        if pass.entries == 0 {
            break;
        }
        total.add(pass);
    }
    assert_eq!(total.archived, 700);
    for r in [&recs[0], &recs[350], &recs[699]] {
        assert!(matches!(
            h.query.get(r.pid).await.unwrap(),
            Lookup::Archived { .. }
        ));
    }
    h.assert_stats(&recs).await;
}

/// `run` archives completions that arrive while it idles, through woken passes: the
/// sweep that would also find them is an hour away.
async fn run_archives_what_arrives_while_it_idles(kind: Kind, shards: u32) {
    let h = Harness::with(
        kind,
        Config {
            num_shards: shards,
            consumer: "a1".into(),
            block: Duration::from_secs(3600),
            gather: Duration::from_millis(20),
            ..Config::default()
        },
    )
    .await;
    let (stop, task) = start_run(&h, SnapshotPolicy::default());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let recs = records(1..=300);
    h.complete(&recs).await;
    for r in [&recs[0], &recs[299]] {
        eventually(&format!("pid {} archived", r.pid), || async {
            matches!(h.query.get(r.pid).await.unwrap(), Lookup::Archived { .. }).then_some(())
        })
        .await;
    }
    stop.send(()).unwrap();
    task.await.unwrap();
    h.assert_stats(&recs).await;
}

/// Calls of `command` the server ran so far (`INFO commandstats`).
fn calls(server: &TestRedis, command: &str) -> u64 {
    server
        .cli(&["INFO", "commandstats"])
        .lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|l| l.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// Of 64 shards with inbox entries, a woken pass reads only the one marked dirty: one
/// SPOP, no takeover, the other shards' inboxes untouched; the sweep then finds the
/// entries whose mark was lost.
async fn woken_for_one_dirty_shard_of_64(kind: Kind) {
    let h = Harness::with(
        kind,
        Config {
            num_shards: 64,
            consumer: "a1".into(),
            ..Config::default()
        },
    )
    .await;
    let Backend::Redis(Some(server), conn) = &h.backend else {
        unreachable!("Redis only")
    };
    // Pid 3700 is in batch 37, so shard 37; pid 500 in shard 5. Neither is marked.
    let (marked, lost) = (record(3700), record(500));
    assert_eq!(h.schema.shard_of(marked.pid), 37);
    h.push_into(37, &marked).await;
    h.push_into(5, &lost).await;
    let _: i64 = conn.clone().sadd(h.schema.dirty(), 37).await.unwrap();
    let before = ["spop", "xreadgroup", "xautoclaim", "xgroup|create"].map(|c| calls(server, c));
    let pass = h.archiver.archive_woken().await.unwrap();
    let after = ["spop", "xreadgroup", "xautoclaim", "xgroup|create"].map(|c| calls(server, c));
    assert_eq!(pass.archived, 1);
    assert_eq!(after[0] - before[0], 1, "one SPOP");
    // The first visit of a shard reads this consumer's own pending entries, then new ones.
    assert_eq!(after[1] - before[1], 2, "XREADGROUP on shard 37 only");
    assert_eq!(after[2] - before[2], 0, "no takeover outside a sweep");
    assert_eq!(
        after[3] - before[3],
        1,
        "one consumer group made: shard 37's"
    );
    assert!(matches!(
        h.query.get(3700).await.unwrap(),
        Lookup::Archived { .. }
    ));
    assert!(!matches!(
        h.query.get(500).await.unwrap(),
        Lookup::Archived { .. }
    ));
    assert_eq!(h.archiver.archive_woken().await.unwrap().entries, 0);
    // The lost mark: the sweep finds its entry.
    assert_eq!(h.archiver.archive_once().await.unwrap().archived, 1);
    assert!(matches!(
        h.query.get(500).await.unwrap(),
        Lookup::Archived { .. }
    ));
    h.assert_stats(&[lost, marked]).await;
}

#[tokio::test]
async fn redis_woken_for_one_dirty_shard_of_64() {
    woken_for_one_dirty_shard_of_64(Kind::Redis).await;
}

#[tokio::test]
async fn cluster_woken_for_one_dirty_shard_of_64() {
    woken_for_one_dirty_shard_of_64(Kind::Cluster).await;
}

/// A shard whose read came back full is read again by the next woken pass without a
/// new mark; one whose read was not full waits `gather` before its next woken read.
#[tokio::test]
async fn a_full_read_is_read_again_and_gather_spaces_reads() {
    let h = Harness::with(
        Kind::Redis,
        Config {
            num_shards: 4,
            consumer: "a1".into(),
            batch: 2,
            gather: Duration::from_secs(3600),
            ..Config::default()
        },
    )
    .await;
    let Backend::Redis(_, conn) = &h.backend else {
        unreachable!()
    };
    let mark = || async {
        conn.clone()
            .sadd::<_, _, i64>(h.schema.dirty(), 1)
            .await
            .unwrap()
    };
    // Pids 101..=105: batch 1, shard 1; five entries of one record each.
    for r in records(101..=105) {
        h.push_into(1, &r).await;
    }
    mark().await;
    let entries = |p: ArchivePass| p.entries;
    assert_eq!(entries(h.archiver.archive_woken().await.unwrap()), 2);
    assert_eq!(
        entries(h.archiver.archive_woken().await.unwrap()),
        2,
        "full: read again"
    );
    assert_eq!(entries(h.archiver.archive_woken().await.unwrap()), 1);
    assert_eq!(entries(h.archiver.archive_woken().await.unwrap()), 0);
    h.push_into(1, &record(106)).await;
    mark().await;
    assert_eq!(
        entries(h.archiver.archive_woken().await.unwrap()),
        0,
        "read less than gather ago, and not full"
    );
    assert_eq!(
        h.archiver.archive_once().await.unwrap().archived,
        1,
        "the sweep does not wait"
    );
    h.assert_stats(&records(101..=106)).await;
}

/// A record that can never be archived does not stall its shard: the others of the
/// same inbox entry and pass are archived and counted, it goes to the shard's
/// dead-letter stream with the reason, and the entry is acknowledged.
async fn poison_records_go_to_the_dead_letter_stream(kind: Kind) {
    let h = Harness::new(kind, 1).await;
    let Backend::Redis(Some(server), _) = &h.backend else {
        unreachable!("Redis only")
    };
    let good = records(1..=50);
    // Its duration passes the statistics' 10^18 guard: the script refuses it.
    let mut too_long = record(51);
    too_long.duration_ms = u64::MAX;
    let mut batch = good.clone();
    batch.push(too_long);
    h.complete(&batch).await;
    // Its bit offset is past the 2^32 bits of a Redis bitmap.
    h.push_into(0, &record(1 << 33)).await;
    let pass = h.drain().await;
    assert_eq!((pass.archived, pass.dead_lettered), (50, 2), "{pass:?}");
    h.assert_stats(&good).await;
    assert!(!matches!(
        h.query.get(51).await.unwrap(),
        Lookup::Archived { .. }
    ));
    let dead = h.schema.shard_key(0, "dead");
    assert_eq!(server.cli(&["XLEN", &dead]).trim(), "2");
    let entries = server.cli(&["XRANGE", &dead, "-", "+"]);
    assert!(entries.contains("10^18"), "{entries}");
    assert!(entries.contains("bit offset"), "{entries}");
    assert_eq!(server.cli(&["XLEN", &h.schema.inbox(0)]).trim(), "0");
    assert_eq!(h.drain().await.entries, 0, "nothing is retried");
    let listed = h.query.dead_letters(10).await.unwrap();
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(listed.iter().all(|d| d.shard == 0));
    let too_long_json = encode_json(&{
        let mut r = record(51);
        r.duration_ms = u64::MAX;
        r
    });
    assert!(
        listed
            .iter()
            .any(|d| d.record == too_long_json && d.reason.contains("10^18")),
        "{listed:?}"
    );
    assert_eq!(
        h.query.dead_letters(1).await.unwrap().len(),
        1,
        "limit per shard"
    );
    assert_eq!(h.query.dead_letter_count().await.unwrap(), 2);
}

/// An inbox line that no completion wrote (its completed-index bit is clear) is set
/// aside with the reason, never archived or counted: a forged pid cannot grow a bitmap
/// or push the statistics past the plan. The genuine records beside it are archived.
#[tokio::test]
async fn redis_an_inbox_line_never_completed_is_set_aside() {
    let h = Harness::new(Kind::Redis, 4).await;
    let genuine = records(1..=20);
    h.complete(&genuine).await;
    h.forge(&record(4_294_967_000)).await;
    h.forge(&record(7)).await;
    let pass = h.drain().await;
    assert_eq!((pass.archived, pass.dead_lettered), (20, 1), "{pass:?}");
    let dead = h.query.dead_letters(10).await.unwrap();
    assert!(
        dead.iter()
            .any(|d| d.reason.contains("never completed here")),
        "{dead:?}"
    );
    assert_eq!(h.get(4_294_967_000).await, Lookup::Unknown);
    h.assert_stats(&genuine).await;
}

#[tokio::test]
async fn redis_poison_records_go_to_the_dead_letter_stream() {
    poison_records_go_to_the_dead_letter_stream(Kind::Redis).await;
}

#[tokio::test]
async fn cluster_poison_records_go_to_the_dead_letter_stream() {
    poison_records_go_to_the_dead_letter_stream(Kind::Cluster).await;
}

/// Issue 22: one damaged sealed batch and one damaged record of an open batch. A range
/// read answers every other record and names both (and records them where `health`
/// reads); the scrub finds them too. A repair sets each aside as it was in its
/// shard's `archive:quarantine`, counting the records lost with it; lookups of those
/// pids then say so, the statistics still count every record once, and nothing is
/// left damaged. On Redis and on a cluster (every script on one slot).
async fn damaged_archived_values_are_found_and_set_aside(kind: Kind, shards: u32) {
    let h = Harness::with(kind, compressed_config(shards, u64::MAX, Duration::ZERO)).await;
    let Backend::Redis(_, conn) = &h.backend else {
        unreachable!()
    };
    let mut c = conn.clone();
    let recs = records(1..=250);
    h.complete(&recs).await;
    h.drain().await;
    h.corrupt(1).await;
    let open = format!("{}:open", h.schema.completed_batch(2));
    let _: i64 = c.hset(&open, "210", "not json").await.unwrap();

    let page = h.query.range(1..=250, 1000).await.unwrap();
    assert_eq!(page.records.len(), 250 - 100 - 1);
    let mut found = page.damaged.clone();
    found.sort_by_key(|d| d.batch);
    assert_eq!(found.len(), 2, "{found:?}");
    assert_eq!(
        (found[0].batch, found[0].field.as_deref()),
        (1, None),
        "{found:?}"
    );
    assert_eq!(found[0].key, h.schema.completed_batch(1));
    assert_eq!(
        (found[1].key.as_str(), found[1].field.as_deref()),
        (open.as_str(), Some("210"))
    );
    assert_eq!(h.query.damaged().await.unwrap().len(), 2);
    // The scrub finds the same, with nobody reading.
    let mut scrubbed = h.archiver.scrub().await.unwrap();
    scrubbed.sort_by_key(|d| d.batch);
    assert_eq!(scrubbed, found);

    // The repair sets each aside, once.
    assert_eq!(
        h.archiver.repair_damage(&found[0]).await.unwrap(),
        Some(100)
    );
    assert_eq!(h.archiver.repair_damage(&found[1]).await.unwrap(), Some(1));
    assert_eq!(h.archiver.repair_damage(&found[0]).await.unwrap(), Some(0));
    let q1: Vec<(String, Vec<u8>)> = c
        .hgetall(h.schema.shard_key(found[0].shard, "archive:quarantine"))
        .await
        .unwrap();
    assert!(
        q1.contains(&("batch:1".to_owned(), b"TRB2 not a batch".to_vec())),
        "{q1:?}"
    );
    let q2: Vec<(String, Vec<u8>)> = c
        .hgetall(h.schema.shard_key(found[1].shard, "archive:quarantine"))
        .await
        .unwrap();
    assert!(
        q2.contains(&("210".to_owned(), b"not json".to_vec())),
        "{q2:?}"
    );
    for pid in [150, 210] {
        match h.get(pid).await {
            Lookup::Undecodable { detail } => assert!(
                detail.starts_with(ARCHIVE_DAMAGED) && detail.contains("set aside"),
                "{detail}"
            ),
            other => panic!("{pid}: {other:?}"),
        }
    }
    assert_eq!(h.get(211).await, archived(&recs[210], Tier::Compressed));
    assert_eq!(h.query.damaged().await.unwrap(), Vec::new());
    assert_eq!(h.query.lost_records().await.unwrap(), 101);
    let page = h.query.range(1..=250, 1000).await.unwrap();
    assert_eq!((page.records.len(), page.damaged.len()), (149, 0));
    assert!(h.archiver.scrub().await.unwrap().is_empty());
    // Counted once, still.
    h.assert_stats(&recs).await;
}

#[tokio::test]
async fn redis_damaged_archived_values_are_found_and_set_aside() {
    damaged_archived_values_are_found_and_set_aside(Kind::Redis, 4).await;
}

#[tokio::test]
async fn cluster_damaged_archived_values_are_found_and_set_aside() {
    damaged_archived_values_are_found_and_set_aside(Kind::Cluster, 4).await;
}
