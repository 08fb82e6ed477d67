//! How many round trips a router call costs, counted on the wire, and what the router
//! answers while partitions are being claimed, completed and archived under it.
//!
//! The stores run over [`Counting`], a connection that records every request and how
//! they overlap: a request sent before any earlier one of the same call has answered
//! travels in the same round trip (pipelined on the multiplexed connection), one sent
//! after an answer starts the next. Redis's `INFO commandstats` confirms the count on
//! the server side.

use crate::support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Arg, Cmd, Pipeline, RedisFuture, Value};
use tranche_active_store::{
    ActiveStore, Leases, MemoryActiveStore, Plan, Planner, RedisActiveStore, RedisConnection,
};
use tranche_archive_store::{ArchiveQuery, Archiver, MemoryArchive, RedisArchive, Tier};
use tranche_codec::{KeySchema, Status};
use tranche_router::{PartitionView, Router};
use tranche_stats::{MemoryStats, RedisStats, StatsStore};

use support::TestRedis;

/// What [`Counting`] saw since the last [`Counting::take`].
#[derive(Debug, Default)]
struct Log {
    /// Each request: its commands joined by `+` (`EVALSHA`, `HGET+HGETALL+LRANGE+HGETALL`).
    requests: Vec<String>,
    /// The deepest round trip of the requests answered so far: a request sent now
    /// travels in the round trip after it.
    answered: usize,
    /// Round trips so far: the deepest of any request.
    trips: usize,
}

/// A connection that logs requests and counts round trips, over a real one.
#[derive(Clone)]
struct Counting {
    inner: RedisConnection,
    log: Arc<Mutex<Log>>,
}

impl Counting {
    fn start(&self, what: String) -> usize {
        let mut log = self.log.lock().unwrap();
        let depth = log.answered + 1;
        log.trips = log.trips.max(depth);
        log.requests.push(what);
        depth
    }

    fn finish(log: &Mutex<Log>, depth: usize) {
        let mut log = log.lock().unwrap();
        log.answered = log.answered.max(depth);
    }

    /// The requests and round trips since the last call, and starts counting afresh.
    fn take(&self) -> (Vec<String>, usize) {
        let log = std::mem::take(&mut *self.log.lock().unwrap());
        (log.requests, log.trips)
    }
}

fn name(cmd: &Cmd) -> String {
    match cmd.args_iter().next() {
        Some(Arg::Simple(bytes)) => String::from_utf8_lossy(bytes).to_uppercase(),
        _ => "?".into(),
    }
}

impl ConnectionLike for Counting {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let depth = self.start(name(cmd));
        let log = self.log.clone();
        let reply = self.inner.req_packed_command(cmd);
        Box::pin(async move {
            let out = reply.await;
            Counting::finish(&log, depth);
            out
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let what: Vec<String> = pipeline.cmd_iter().map(name).collect();
        let depth = self.start(what.join("+"));
        let log = self.log.clone();
        let reply = self.inner.req_packed_commands(pipeline, offset, count);
        Box::pin(async move {
            let out = reply.await;
            Counting::finish(&log, depth);
            out
        })
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}

/// IDs `1..=30_000` in partitions of 100: pids 1..=300.
const PLAN: Plan = Plan::Uniform {
    min: 1,
    max: 30_000,
    size: 100,
};

/// One namespace on `server` whose archive writes `tier` from the first record on:
/// pids 1..=150 archived, 151..=160 completed and in the inbox, 161..=200 claimed,
/// 201..=300 unissued. Returns the router and the counting connection under it.
async fn job(server: &TestRedis, namespace: &str, tier: Tier) -> (Router, Counting) {
    let counting = Counting {
        inner: RedisConnection::connect(&server.url()).await.unwrap(),
        log: Arc::default(),
    };
    let active_config = tranche_active_store::Config {
        namespace: namespace.into(),
        lease: Duration::from_secs(3600),
        ..Default::default()
    };
    let (compressed_at, summary_at) = match tier {
        Tier::Simple => (u64::MAX, u64::MAX),
        Tier::Compressed => (0, u64::MAX),
        _ => (0, 0),
    };
    let archive_config = tranche_archive_store::Config {
        namespace: namespace.into(),
        compressed_at,
        summary_at,
        consumer: "round-trips".into(),
        ..Default::default()
    };
    let schema = KeySchema::new(namespace, 1).unwrap();
    let active = Arc::new(RedisActiveStore::new(counting.clone(), active_config).unwrap());
    let archive = Arc::new(RedisArchive::new(counting.clone(), archive_config).unwrap());
    let stats = Arc::new(RedisStats::new(counting.clone(), schema));
    active.plan(&PLAN).await.unwrap();
    let leases = active.claim("w1", 200).await.unwrap();
    assert_eq!(leases.len(), 200);
    let done: Vec<_> = leases[..160].iter().map(|l| (l.clone(), 1000)).collect();
    for outcome in active.complete_many(&done[..150]).await.unwrap() {
        outcome.unwrap();
    }
    drain(&*archive).await;
    for outcome in active.complete_many(&done[150..]).await.unwrap() {
        outcome.unwrap();
    }
    // Load the scripts and the worker dictionary through a router of its own, so the
    // one returned starts with a cold plan cache but nothing else to load.
    Router::new(active.clone(), archive.clone(), stats.clone())
        .get(1)
        .await
        .unwrap();
    counting.take();
    (Router::new(active, archive, stats), counting)
}

/// The calls counted for each command in `INFO commandstats`.
fn commandstats(server: &TestRedis) -> BTreeMap<String, u64> {
    server
        .cli(&["INFO", "commandstats"])
        .lines()
        .filter_map(|l| {
            let (cmd, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.strip_prefix("calls=")?.split(',').next()?;
            Some((cmd.to_owned(), calls.parse().ok()?))
        })
        .collect()
}

/// The view's kind and tier, for compact expectations.
fn kind(view: &PartitionView) -> String {
    match view {
        PartitionView::Active(p) => format!("active {:?}", p.status),
        PartitionView::Archived { tier, .. } => format!("archived {tier:?}"),
        PartitionView::Archiving { .. } => "archiving".into(),
        PartitionView::Summarised { .. } => "summarised".into(),
        PartitionView::Unknown => "unknown".into(),
    }
}

#[tokio::test]
async fn get_is_one_round_trip_in_every_tier() {
    let server = TestRedis::start();
    for (namespace, tier) in [
        ("simple", Tier::Simple),
        ("compressed", Tier::Compressed),
        ("summary", Tier::Summary),
    ] {
        let (router, counting) = job(&server, namespace, tier).await;

        // Cold: the router has never read the plans. The plan read joins the same
        // round trip as the two layers' reads.
        let view = router.get(42).await.unwrap();
        assert_eq!(kind(&view), format!("archived {tier:?}"));
        let (requests, trips) = counting.take();
        assert_eq!(trips, 1, "{namespace} cold: {requests:?}");
        assert_eq!(requests.len(), 3, "{namespace} cold: {requests:?}");

        // Warm up the scripts and the archive's worker dictionary.
        for pid in 1..=300 {
            router.get(pid).await.unwrap();
        }
        counting.take();

        let cases = [
            (42, format!("archived {tier:?}")),
            (99, format!("archived {tier:?}")),
            (155, "archiving".into()),
            (180, "active Claimed".into()),
            (250, "active Pending".into()),
        ];
        for (pid, expected) in cases {
            let view = router.get(pid).await.unwrap();
            assert_eq!(kind(&view), expected, "{namespace} pid {pid}");
            let (requests, trips) = counting.take();
            assert_eq!(trips, 1, "{namespace} pid {pid}: {requests:?}");
            // The active layer's read goes out first, the archive's behind it.
            assert_eq!(
                requests,
                ["HGET+HGETALL+LRANGE+HGETALL", "EVALSHA_RO"],
                "{namespace} pid {pid}"
            );
        }
        // An unplanned pid: the cache misses, so the plans are read again, in the
        // same round trip as the (then discarded) reads of the layers.
        assert_eq!(router.get(301).await.unwrap(), PartitionView::Unknown);
        let (requests, trips) = counting.take();
        assert_eq!((requests.len(), trips), (3, 1), "{requests:?}");

        // The server agrees: 99 gets, one transaction and one read-only script call each, and
        // the plans never read again. (Pids 1..=99 are batch 0, sealed in the
        // compressed and summary tiers; batch 1 is still open.)
        let before = commandstats(&server);
        for pid in 1..=99 {
            assert_eq!(
                kind(&router.get(pid).await.unwrap()),
                format!("archived {tier:?}")
            );
        }
        let after = commandstats(&server);
        let delta = |cmd: &str| after.get(cmd).unwrap_or(&0) - before.get(cmd).unwrap_or(&0);
        assert_eq!(
            (delta("exec"), delta("evalsha_ro"), delta("lrange")),
            (99, 99, 99),
            "{after:?}"
        );
        let (requests, trips) = counting.take();
        assert_eq!(requests.len(), 198);
        // Sequential gets: one round trip each.
        assert_eq!(trips, 99);
    }
}

#[tokio::test]
async fn all_active_and_stats_are_one_round_trip() {
    let server = TestRedis::start();
    let (router, counting) = job(&server, "elk", Tier::Simple).await;
    router.get(1).await.unwrap();
    counting.take();

    let snapshot = router.all_active().await.unwrap();
    assert_eq!(snapshot.partitions.len(), 40);
    let (requests, trips) = counting.take();
    assert_eq!(trips, 1, "{requests:?}");

    let merged = router.stats().await.unwrap();
    assert_eq!(merged.completed_count(), Some(150));
    assert_eq!(merged.active.claimed, 40);
    let (requests, trips) = counting.take();
    assert_eq!(trips, 1, "{requests:?}");

    let merged = router.stats_with_ranges().await.unwrap();
    assert_eq!(merged.completed_count(), Some(150));
    assert!(merged.ranges.is_some_and(|r| !r.is_empty()));
    let (requests, trips) = counting.take();
    assert_eq!(trips, 1, "{requests:?}");
}

/// Where a pid is, as the workload last made sure of (a lower bound: the truth may be
/// ahead of it, never behind).
const UNISSUED: u8 = 0;
const CLAIMED: u8 = 1;
const COMPLETED: u8 = 2;

/// How far an answer is along the one-way path of a partition.
fn stage(view: &PartitionView) -> u8 {
    match view {
        PartitionView::Active(p) if p.status == Status::Pending => 0,
        PartitionView::Active(_) => 1,
        PartitionView::Archiving { .. } => 2,
        _ => 3,
    }
}

async fn answers_stay_legal_while_partitions_move(
    active: Arc<dyn ActiveStore>,
    archiver: Arc<dyn Archiver>,
    query: Arc<dyn ArchiveQuery>,
    stats: Arc<dyn StatsStore>,
) {
    active.plan(&PLAN).await.unwrap();
    let router = Arc::new(Router::new(active.clone(), query, stats));
    // What the workload has finished doing to each pid, set once its call returned.
    let known: Arc<Vec<AtomicU8>> = Arc::new((0..=300).map(|_| AtomicU8::new(UNISSUED)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    // Answers given by all readers so far. The workload waits for a few before each
    // round: spawned first, it could otherwise finish before a reader got a thread
    // (seen on a loaded CI machine, with no answer at all).
    let answered = Arc::new(AtomicU64::new(0));

    // The workload: claim a few, complete them, now and then drain the inbox.
    let workload = {
        let (known, stop, answered) = (known.clone(), stop.clone(), answered.clone());
        tokio::spawn(async move {
            let mut leases = Vec::new();
            for round in 0.. {
                let due = answered.load(Ordering::SeqCst) + 8;
                tokio::time::timeout(Duration::from_secs(30), async {
                    while answered.load(Ordering::SeqCst) < due {
                        tokio::task::yield_now().await;
                    }
                })
                .await
                .expect("the readers stopped answering");
                let got = active.claim("w1", 3).await.unwrap();
                if got.is_empty() && leases.is_empty() {
                    break;
                }
                for l in &got {
                    known[l.pid as usize].store(CLAIMED, Ordering::SeqCst);
                }
                leases.extend(got);
                let done: Vec<_> = leases
                    .drain(..leases.len().min(2))
                    .map(|l| (l, 7))
                    .collect();
                for ((lease, _), outcome) in
                    done.iter().zip(active.complete_many(&done).await.unwrap())
                {
                    outcome.unwrap();
                    known[lease.pid as usize].store(COMPLETED, Ordering::SeqCst);
                }
                if round % 5 == 4 {
                    archiver.archive_once().await.unwrap();
                }
                tokio::task::yield_now().await;
            }
            drain(&*archiver).await;
            stop.store(true, Ordering::SeqCst);
        })
    };

    // Readers: each asks about pids over and over; every answer must be legal, and one
    // reader must never see a pid go backwards.
    let readers: Vec<_> = (0..4u64)
        .map(|r| {
            let (router, known, stop, answered) = (
                router.clone(),
                known.clone(),
                stop.clone(),
                answered.clone(),
            );
            tokio::spawn(async move {
                let mut seen = vec![0u8; 301];
                let mut answers = [0u64; 4];
                let mut pid = 1 + r * 7;
                let deadline = std::time::Instant::now() + Duration::from_secs(120);
                while !stop.load(Ordering::SeqCst) {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "the workload never finished"
                    );
                    pid = 1 + (pid * 31 + r) % 300;
                    let floor = known[pid as usize].load(Ordering::SeqCst);
                    let view = router.get(pid).await.unwrap();
                    let range = (pid - 1) * 100 + 1..=pid * 100;
                    match &view {
                        PartitionView::Active(p) => {
                            assert_eq!((p.pid, p.min_id..=p.max_id), (pid, range));
                            assert!(
                                matches!(p.status, Status::Pending | Status::Claimed),
                                "{view:?}"
                            );
                        }
                        PartitionView::Archiving { pid: p, range: r } => {
                            assert_eq!((*p, r), (pid, &range));
                        }
                        PartitionView::Archived { record, tier } => {
                            assert_eq!((record.pid, record.min_id..=record.max_id), (pid, range));
                            assert_eq!(
                                (&*record.worker, record.duration_ms, *tier),
                                ("w1", 7, Tier::Simple)
                            );
                        }
                        other => panic!("pid {pid}: {other:?}"),
                    }
                    let now = stage(&view);
                    // Never behind what the workload had already done when the call began.
                    assert!(
                        now >= floor,
                        "pid {pid}: {view:?}, but it was at stage {floor}"
                    );
                    // Never behind what this reader saw before.
                    assert!(now >= seen[pid as usize], "pid {pid} went back to {view:?}");
                    seen[pid as usize] = now;
                    answers[now as usize] += 1;
                    answered.fetch_add(1, Ordering::SeqCst);
                    // The memory backends never wait: let the workload run.
                    tokio::task::yield_now().await;
                }
                answers
            })
        })
        .collect();

    workload.await.unwrap();
    let mut stages = [0u64; 4];
    for reader in readers {
        for (total, n) in stages.iter_mut().zip(reader.await.unwrap()) {
            *total += n;
        }
    }
    // The readers caught partitions in every stage.
    assert!(stages.iter().all(|&n| n > 0), "{stages:?}");
    for pid in 1..=300 {
        assert_eq!(kind(&router.get(pid).await.unwrap()), "archived Simple");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_stay_legal_while_partitions_move_on_redis() {
    for cluster in [false, true] {
        let server = if cluster {
            TestRedis::start_cluster()
        } else {
            TestRedis::start()
        };
        let conn = RedisConnection::connect(&server.url()).await.unwrap();
        let active = Arc::new(RedisActiveStore::new(conn.clone(), Default::default()).unwrap());
        let config = tranche_archive_store::Config {
            consumer: "legal".into(),
            block: Duration::from_millis(1),
            ..Default::default()
        };
        let schema = config.schema().unwrap();
        let archive = Arc::new(RedisArchive::new(conn.clone(), config).unwrap());
        let stats = Arc::new(RedisStats::new(conn, schema));
        answers_stay_legal_while_partitions_move(active, archive.clone(), archive, stats).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_stay_legal_while_partitions_move_in_memory() {
    let active = Arc::new(MemoryActiveStore::new(Default::default()).unwrap());
    let stats = Arc::new(MemoryStats::new());
    let inbox = vec![active.inbox(0).unwrap()];
    let config = tranche_archive_store::Config {
        block: Duration::from_millis(1),
        ..Default::default()
    };
    let archive = Arc::new(MemoryArchive::new(config, inbox, stats.clone()).unwrap());
    answers_stay_legal_while_partitions_move(active, archive.clone(), archive, stats).await;
}

/// Passes until one reads nothing; fails after 10,000 passes rather than spinning.
async fn drain<A: tranche_archive_store::Archiver + ?Sized>(archiver: &A) {
    for _ in 0..10_000 {
        if archiver.archive_once().await.unwrap().entries == 0 {
            return;
        }
    }
    panic!("the inboxes never drained");
}
