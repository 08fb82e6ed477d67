//! One behaviour suite for the active store, run against every backend: memory, a private
//! standalone Redis, and a private one-node Redis Cluster (where a script touching keys
//! of two slots fails with CROSSSLOT), each at 1 and 4 shards; and once more on a
//! cluster of 3 masters with 16 shards, every check in turn in a namespace of its own
//! on one cluster started for them all.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use redis::AsyncCommands;
use tranche_active_store::{
    ActiveStore, Completion, Config, Error, FailOutcome, FailPolicy, Lease, ManualClock,
    MemoryActiveStore, Plan, RedisActiveStore, RedisConnection, StatusCounts, WorkerInfo,
};
use tranche_codec::{CompletedRecord, Status, decode_json};

use support::{TestCluster, TestRedis};

const T0: u64 = 1_719_234_405_000;

/// A store under test, its clock, and a way to read its inbox.
struct Harness {
    store: Arc<dyn ActiveStore>,
    clock: Arc<ManualClock>,
    config: Config,
    backend: Backend,
    seen: std::sync::Mutex<Vec<CompletedRecord>>,
}

enum Backend {
    Memory(Arc<MemoryActiveStore>),
    /// The connection, and the private server when the harness owns one (a check on
    /// the shared 3-master cluster does not).
    Redis(#[allow(dead_code)] Option<TestRedis>, RedisConnection),
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Memory,
    Redis,
    Cluster,
}

impl Harness {
    async fn new(kind: Kind, shards: u32) -> Self {
        Self::with(kind, Self::new_config(shards)).await
    }

    /// The suite's settings with `shards` shards.
    fn new_config(shards: u32) -> Config {
        Config {
            num_shards: shards,
            lease: Duration::from_secs(30),
            max_attempts: 3,
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            ..Config::default()
        }
    }

    async fn with(kind: Kind, config: Config) -> Self {
        let clock = Arc::new(ManualClock::new(T0));
        let (store, backend): (Arc<dyn ActiveStore>, Backend) = match kind {
            Kind::Memory => {
                let store =
                    Arc::new(MemoryActiveStore::with_clock(config.clone(), clock.clone()).unwrap());
                (store.clone(), Backend::Memory(store))
            }
            Kind::Redis | Kind::Cluster => {
                let server = if matches!(kind, Kind::Cluster) {
                    TestRedis::start_cluster()
                } else {
                    TestRedis::start()
                };
                let conn = RedisConnection::connect(&server.url()).await.unwrap();
                assert_eq!(conn.is_cluster(), matches!(kind, Kind::Cluster));
                let store =
                    RedisActiveStore::with_clock(conn.clone(), config.clone(), clock.clone())
                        .unwrap();
                (Arc::new(store), Backend::Redis(Some(server), conn))
            }
        };
        Self {
            store,
            clock,
            config,
            backend,
            seen: Default::default(),
        }
    }

    /// A harness on `cluster` with 16 shards, in namespace `namespace` (one per check:
    /// the cluster is shared).
    async fn on_cluster(cluster: &TestCluster, namespace: &str) -> Self {
        let config = Config {
            namespace: namespace.to_owned(),
            ..Self::new_config(16)
        };
        let clock = Arc::new(ManualClock::new(T0));
        let conn = RedisConnection::connect(&cluster.url()).await.unwrap();
        assert!(conn.is_cluster());
        let store =
            RedisActiveStore::with_clock(conn.clone(), config.clone(), clock.clone()).unwrap();
        Self {
            store: Arc::new(store),
            clock,
            config,
            backend: Backend::Redis(None, conn),
            seen: Default::default(),
        }
    }

    /// Every record in every shard's inbox, oldest first per shard.
    async fn inbox(&self) -> Vec<CompletedRecord> {
        let mut out = Vec::new();
        match &self.backend {
            Backend::Memory(store) => {
                // Reading a channel consumes it, so the harness keeps what it read.
                let mut seen = self.seen.lock().unwrap();
                for shard in 0..self.config.num_shards {
                    seen.extend(store.inbox(shard).unwrap().try_iter());
                }
                out = seen.clone();
            }
            Backend::Redis(_, conn) => {
                let schema =
                    tranche_codec::KeySchema::new(&self.config.namespace, self.config.num_shards)
                        .unwrap();
                let mut conn = conn.clone();
                for shard in schema.shards() {
                    let reply: redis::streams::StreamRangeReply =
                        conn.xrange_all(schema.inbox(shard)).await.unwrap();
                    for entry in reply.ids {
                        let lines: String = entry.get("r").unwrap();
                        out.extend(lines.lines().map(|json| decode_json(json).unwrap()));
                    }
                }
            }
        }
        out
    }
}

fn uniform(min: u64, max: u64, size: u64) -> Plan {
    Plan::Uniform { min, max, size }
}

fn lost(err: Error) -> bool {
    matches!(err, Error::LeaseLost { .. })
}

/// Generates one `#[tokio::test]` per backend and shard count for each check.
macro_rules! suite {
    ($($check:ident),* $(,)?) => {
        mod memory_1 { $( #[tokio::test(flavor = "current_thread")] async fn $check() { super::$check(super::Harness::new(super::Kind::Memory, 1).await).await } )* }
        mod memory_4 { $( #[tokio::test(flavor = "current_thread")] async fn $check() { super::$check(super::Harness::new(super::Kind::Memory, 4).await).await } )* }
        mod redis_1 { $( #[tokio::test] async fn $check() { super::$check(super::Harness::new(super::Kind::Redis, 1).await).await } )* }
        mod redis_4 { $( #[tokio::test] async fn $check() { super::$check(super::Harness::new(super::Kind::Redis, 4).await).await } )* }
        mod cluster_4 { $( #[tokio::test] async fn $check() { super::$check(super::Harness::new(super::Kind::Cluster, 4).await).await } )* }
        #[tokio::test]
        async fn every_check_on_three_masters_with_16_shards() {
            let cluster = TestCluster::start_with(3, 0);
            $( $check(Harness::on_cluster(&cluster, stringify!($check)).await).await; )*
        }
    };
}

suite!(
    plan_validation,
    plans_are_generators,
    explicit_ranges,
    claim_order,
    claims_hand_out_each_pid_once,
    lease_expiry_resumes_from_checkpoint,
    fencing,
    duplicate_completion,
    retry_backoff_and_dead,
    retry_failed_and_discard,
    worker_registry,
    workers_are_pruned_after_retention,
    pause_is_a_namespace_flag,
    reaper_is_idempotent,
    queries,
    adopt_restores_exported_plans,
    counts_follow_a_random_workload,
    counts_of_a_namespace_without_counters,
    release_gives_the_attempt_back,
    a_batch_claim_straddles_shards,
    a_batch_heartbeat_with_one_lease_lost,
    expired_leases_end_failed_at_max_attempts,
    a_plan_past_the_bitmap_limit_is_refused,
    checkpoints_never_move_backwards,
    a_pid_not_issued_yet_is_discarded_like_a_pending_one,
    fail_with_a_policy,
    a_sound_active_set_has_nothing_to_repair,
);

async fn plan_validation(h: Harness) {
    let s = &h.store;
    for bad in [
        uniform(10, 9, 1),
        uniform(1, 10, 0),
        Plan::Ranges(vec![]),
        Plan::Ranges(vec![1..=5, 5..=9]),
    ] {
        let err = s.plan(&bad).await.unwrap_err();
        assert!(matches!(err, Error::InvalidPlan(_)), "{bad:?}: {err}");
    }
    assert!(
        s.plans().await.unwrap().is_empty(),
        "a rejected plan writes nothing"
    );
    assert_eq!(s.counts().await.unwrap().outstanding(), 0);

    let first = s.plan(&uniform(1, 5_000_000, 1000)).await.unwrap();
    assert!(first.created);
    assert_eq!(
        (
            first.entries[0].plan.first_pid(),
            first.entries[0].plan.last_pid()
        ),
        (1, 5000)
    );
    assert_eq!(
        first.entries[0].plan.range_of(4970),
        Some(4_969_001..=4_970_000),
        "the seed's numbering"
    );

    let again = s.plan(&uniform(1, 5_000_000, 1000)).await.unwrap();
    assert!(!again.created, "the same plan twice is a no-op");
    assert_eq!(again.entries, first.entries);

    for overlap in [
        uniform(5_000_000, 6_000_000, 1000),
        uniform(1, 5_000_000, 500),
        Plan::Ranges(vec![10..=20]),
    ] {
        let err = s.plan(&overlap).await.unwrap_err();
        assert!(
            matches!(err, Error::InvalidPlan(ref m) if m.contains("overlap")),
            "{overlap:?}: {err}"
        );
    }
    assert_eq!(
        s.plans().await.unwrap().len(),
        1,
        "rejected plans left the registry alone"
    );

    let second = s.plan(&uniform(5_000_001, 5_000_500, 100)).await.unwrap();
    assert_eq!(
        second.entries[0].plan.first_pid(),
        5001,
        "pids continue after the last plan"
    );
    assert_eq!(s.counts().await.unwrap().unissued, 5005);
}

async fn plans_are_generators(h: Harness) {
    let s = &h.store;
    s.plan(&uniform(1, 5_000_000_000, 1000)).await.unwrap();
    let counts = s.counts().await.unwrap();
    assert_eq!(counts.unissued, 5_000_000);
    assert_eq!(
        s.all_active().await.unwrap().partitions.len(),
        0,
        "nothing materialised"
    );
    let leases = s.claim("w1", 3).await.unwrap();
    assert_eq!(leases.len(), 3);
    assert_eq!(s.all_active().await.unwrap().partitions.len(), 3);
    assert_eq!(s.counts().await.unwrap().unissued, 5_000_000 - 3);
}

async fn explicit_ranges(h: Harness) {
    let s = &h.store;
    let ranges = vec![1..=10, 11..=500, 501..=501, 10_000..=u64::MAX - 1];
    let out = s.plan(&Plan::Ranges(ranges.clone())).await.unwrap();
    assert_eq!(out.entries.len(), 4);
    let counts = s.counts().await.unwrap();
    assert_eq!(
        (counts.pending, counts.unissued),
        (4, 0),
        "explicit ranges are materialised"
    );
    let mut leases = s.claim("w1", 10).await.unwrap();
    leases.sort_by_key(|l| l.min_id);
    let got: Vec<_> = leases.iter().map(|l| l.min_id..=l.max_id).collect();
    assert_eq!(
        got, ranges,
        "each range is one partition with its own bounds"
    );
    assert_eq!(leases[3].progress, 10_000);
    for l in &leases {
        assert_eq!(s.complete(l, 5).await.unwrap(), Completion::Completed);
    }
    let again = s.plan(&Plan::Ranges(ranges)).await.unwrap();
    assert!(!again.created);
    assert_eq!(
        s.counts().await.unwrap().outstanding(),
        0,
        "completed ranges are not planned again"
    );
    let inbox = h.inbox().await;
    assert!(
        inbox.iter().any(|r| r.max_id == u64::MAX - 1),
        "huge IDs survive the Lua round trip"
    );
}

async fn claim_order(h: Harness) {
    let s = &h.store;
    s.plan(&uniform(1, 100_000, 10)).await.unwrap();
    let first = s.claim("w1", 1).await.unwrap().remove(0);
    let FailOutcome::Retry { ready_at_ms } = s.fail(&first, "boom").await.unwrap() else {
        panic!("first failure retries")
    };
    assert_eq!(ready_at_ms, T0 + 1000);
    // Still backing off: fresh work comes out instead.
    let fresh = s.claim("w1", 1).await.unwrap().remove(0);
    assert_ne!(fresh.pid, first.pid);
    h.clock.advance(1000);
    // Ready now: the retry comes before fresh pids.
    let next = s.claim("w1", 2).await.unwrap();
    assert_eq!(next[0].pid, first.pid);
    assert_eq!(next[0].attempt, 2);
    assert_ne!(next[0].token, first.token, "every claim has a fresh token");
    assert_eq!(next[1].attempt, 1);
}

async fn claims_hand_out_each_pid_once(h: Harness) {
    let s = &h.store;
    s.plan(&uniform(1, 25_000, 10)).await.unwrap(); // 2500 pids over 25 batches
    s.plan(&Plan::Ranges(vec![30_000..=30_004, 40_000..=49_999]))
        .await
        .unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for round in 0.. {
        // Every wait has an end: 2,505 pids at 37 a claim take 68 rounds.
        assert!(round < 1000, "claims never ran dry");
        let worker = format!("w{}", round % 7);
        let leases = s.claim(&worker, 37).await.unwrap();
        if leases.is_empty() {
            break;
        }
        for l in leases {
            assert!(seen.insert(l.pid), "pid {} handed out twice", l.pid);
            let expect = if l.pid <= 2500 {
                ((l.pid - 1) * 10 + 1, l.pid * 10)
            } else {
                (l.min_id, l.max_id)
            };
            assert_eq!((l.min_id, l.max_id), expect);
        }
    }
    assert_eq!(seen.len(), 2502);
    assert_eq!(
        seen.iter().copied().collect::<Vec<_>>(),
        (1..=2502).collect::<Vec<_>>()
    );
    assert_eq!(s.counts().await.unwrap().claimed, 2502);
}

async fn lease_expiry_resumes_from_checkpoint(h: Harness) {
    let s = &h.store;
    s.plan(&uniform(1, 10_000, 1000)).await.unwrap();
    let a = s.claim("a", 1).await.unwrap().remove(0);
    assert_eq!(a.progress, a.min_id);
    s.heartbeat(&a, a.min_id + 500).await.unwrap();
    assert_eq!(s.get(a.pid).await.unwrap().unwrap().status, Status::Running);
    h.clock.advance(29_999);
    assert!(
        s.reap(h.clock_now()).await.unwrap().is_empty(),
        "the heartbeat renewed the lease"
    );
    h.clock.advance(1);
    assert_eq!(s.reap(h.clock_now()).await.unwrap(), vec![a.pid]);
    let p = s.get(a.pid).await.unwrap().unwrap();
    assert_eq!((p.status, p.progress), (Status::Pending, a.min_id + 500));
    let b = s.claim("b", 1).await.unwrap().remove(0);
    assert_eq!(b.pid, a.pid, "the reaped partition comes back first");
    assert_eq!(
        (b.progress, b.attempt, b.worker.as_str()),
        (a.min_id + 500, 2, "b")
    );
}

async fn fencing(h: Harness) {
    let s = &h.store;
    s.plan(&uniform(1, 10_000, 1000)).await.unwrap();
    let a = s.claim("a", 1).await.unwrap().remove(0);
    h.clock.advance(30_000);
    s.reap(h.clock_now()).await.unwrap();
    // Reaped but not yet reclaimed: the old token is already dead.
    assert!(lost(s.heartbeat(&a, a.min_id + 1).await.unwrap_err()));
    let b = s.claim("b", 1).await.unwrap().remove(0);
    assert_eq!(b.pid, a.pid);
    assert!(lost(s.heartbeat(&a, a.min_id + 7).await.unwrap_err()));
    assert!(lost(s.complete(&a, 10).await.unwrap_err()));
    assert!(lost(s.fail(&a, "late").await.unwrap_err()));
    assert!(lost(s.release(&a, a.min_id + 9).await.unwrap_err()));
    let p = s.get(b.pid).await.unwrap().unwrap();
    assert_eq!(p.worker.as_deref(), Some("b"));
    assert_eq!(
        (p.lease_token, p.progress, p.status),
        (Some(b.token), b.min_id, Status::Claimed)
    );
    assert!(p.last_error.is_none(), "the stale failure changed nothing");
    let forged = Lease {
        token: b.token + 1000,
        ..b.clone()
    };
    assert!(lost(s.complete(&forged, 1).await.unwrap_err()));
    assert_eq!(s.complete(&b, 10).await.unwrap(), Completion::Completed);
}

async fn duplicate_completion(h: Harness) {
    let s = &h.store;
    s.plan(&uniform(1, 10_000, 1000)).await.unwrap();
    let l = s.claim("worker1", 1).await.unwrap().remove(0);
    h.clock.advance(1234);
    assert_eq!(
        s.complete(&l, 295_123).await.unwrap(),
        Completion::Completed
    );
    assert_eq!(
        s.complete(&l, 295_123).await.unwrap(),
        Completion::Duplicate
    );
    let batch = s
        .complete_many(&[(l.clone(), 1), (l.clone(), 2)])
        .await
        .unwrap();
    assert!(batch.iter().all(|r| matches!(r, Ok(Completion::Duplicate))));
    assert_eq!(
        s.get(l.pid).await.unwrap(),
        None,
        "completed partitions leave the active set"
    );
    let inbox = h.inbox().await;
    assert_eq!(
        inbox,
        vec![CompletedRecord {
            pid: l.pid,
            min_id: l.min_id,
            max_id: l.max_id,
            worker: "worker1".into(),
            completed_at_ms: T0 + 1234,
            duration_ms: 295_123,
        }],
        "exactly one record, with millisecond precision"
    );
}

async fn retry_backoff_and_dead(h: Harness) {
    let s = &h.store;
    s.plan(&uniform(1, 1000, 1000)).await.unwrap();
    let mut expected_backoff = 1000;
    for attempt in 1..=3 {
        let l = s.claim("w", 1).await.unwrap().remove(0);
        assert_eq!(l.attempt, attempt);
        let outcome = s
            .fail(&l, &format!("exit 1: try {attempt} | stderr tail"))
            .await
            .unwrap();
        if attempt < 3 {
            assert_eq!(
                outcome,
                FailOutcome::Retry {
                    ready_at_ms: h.clock_now() + expected_backoff
                }
            );
            assert!(s.claim("w", 1).await.unwrap().is_empty(), "backing off");
            h.clock.advance(expected_backoff);
            expected_backoff *= 2;
        } else {
            assert_eq!(outcome, FailOutcome::Failed);
        }
    }
    let p = s.get(1).await.unwrap().unwrap();
    assert_eq!(p.status, Status::Failed);
    assert_eq!(p.last_error.as_deref(), Some("exit 1: try 3 | stderr tail"));
    h.clock.advance(1_000_000);
    assert!(
        s.claim("w", 1).await.unwrap().is_empty(),
        "failed partitions are not retried by themselves"
    );
    let c = s.counts().await.unwrap();
    assert_eq!((c.failed, c.outstanding()), (1, 0));
}

async fn retry_failed_and_discard(h: Harness) {
    let s = &h.store;
    s.plan(&uniform(1, 2000, 1000)).await.unwrap();
    for _ in 0..3 {
        for l in s.claim("w", 2).await.unwrap() {
            s.fail(&l, "no").await.unwrap();
        }
        h.clock.advance(10_000);
    }
    assert_eq!(s.counts().await.unwrap().failed, 2);
    assert_eq!(s.retry_failed(Some(1)).await.unwrap(), vec![1]);
    let l = s.claim("w", 5).await.unwrap();
    assert_eq!(l.len(), 1);
    assert_eq!((l[0].pid, l[0].attempt), (1, 1), "a fresh attempt budget");
    assert!(matches!(s.discard(1).await.unwrap_err(), Error::Leased(1)));
    assert!(s.discard(2).await.unwrap());
    assert!(!s.discard(2).await.unwrap());
    // Discarded for good, and says so: never claimed, retried or counted as work.
    let p = s.get(2).await.unwrap().expect("a discarded pid answers");
    assert_eq!((p.status, p.deadline_ms), (Status::Discarded, None));
    assert_eq!(s.retry_failed(None).await.unwrap(), Vec::<u64>::new());
    let c = s.counts().await.unwrap();
    assert_eq!((c.discarded, c.failed, c.pending), (1, 0, 0));
    assert!(
        s.all_active()
            .await
            .unwrap()
            .partitions
            .iter()
            .any(|p| p.pid == 2 && p.status == Status::Discarded)
    );
    s.complete(&l[0], 1).await.unwrap();
    h.clock.advance(100_000);
    assert_eq!(s.reap(h.clock_now()).await.unwrap(), Vec::<u64>::new());
    assert!(s.claim("w", 5).await.unwrap().is_empty());
    assert_eq!(
        h.inbox().await.len(),
        1,
        "only the completed pid reaches the inbox"
    );
}

async fn worker_registry(h: Harness) {
    let s = &h.store;
    let info = |id: &str| WorkerInfo {
        id: id.into(),
        host: "host-1".into(),
        process_id: 42,
        started_ms: T0,
        last_beat_ms: 0,
        in_flight: 3,
        completed: 1000,
        rate_per_s: 12.5,
        latency_p50_ms: 280.0,
        latency_p99_ms: 390.0,
        version: "0.1.0".into(),
    };
    s.worker_heartbeat(info("worker-1")).await.unwrap();
    s.worker_heartbeat(info("worker-2")).await.unwrap();
    assert!(s.worker_heartbeat(info("bad|id")).await.is_err());
    h.clock.advance(25_000);
    s.worker_heartbeat(info("worker-2")).await.unwrap();
    h.clock.advance(5_001);
    let workers = s.workers().await.unwrap();
    assert_eq!(workers.len(), 2);
    assert_eq!(
        (workers[0].info.id.as_str(), workers[0].active),
        ("worker-1", false),
        "3 missed beats"
    );
    assert_eq!(
        (workers[1].info.id.as_str(), workers[1].active),
        ("worker-2", true)
    );
    assert_eq!(workers[1].info.last_beat_ms, T0 + 25_000);
    assert_eq!(
        workers[1].info,
        WorkerInfo {
            last_beat_ms: T0 + 25_000,
            ..info("worker-2")
        }
    );

    // The inactive worker's leases go back early, long before their deadline.
    s.plan(&uniform(1, 10_000, 100)).await.unwrap();
    let held = s.claim("worker-1", 3).await.unwrap();
    let other = s.claim("worker-2", 2).await.unwrap();
    let mut released = s.release_worker("worker-1").await.unwrap();
    released.sort_unstable();
    let mut expect: Vec<u64> = held.iter().map(|l| l.pid).collect();
    expect.sort_unstable();
    assert_eq!(released, expect);
    assert!(lost(s.heartbeat(&held[0], 5).await.unwrap_err()));
    s.heartbeat(&other[0], other[0].min_id).await.unwrap();
    s.deregister("worker-1").await.unwrap();
    assert_eq!(s.workers().await.unwrap().len(), 1);
}

/// The registry keeps the recent past: a worker silent for longer than the retention is
/// forgotten, a live one stays, a pruned one that beats again is back; on Redis an
/// entry that does not decode is left out of every read and pruned.
async fn workers_are_pruned_after_retention(h: Harness) {
    let s = &h.store;
    let info = |id: &str| WorkerInfo {
        id: id.into(),
        host: "host-1".into(),
        process_id: 7,
        started_ms: T0,
        last_beat_ms: 0,
        in_flight: 0,
        completed: 0,
        rate_per_s: 0.0,
        latency_p50_ms: 0.0,
        latency_p99_ms: 0.0,
        version: "0.1.0".into(),
    };
    s.worker_heartbeat(info("old")).await.unwrap();
    h.clock.advance(60_000);
    s.worker_heartbeat(info("recent")).await.unwrap();
    if let Backend::Redis(_, conn) = &h.backend {
        let key = tranche_codec::KeySchema::new(&h.config.namespace, h.config.num_shards)
            .unwrap()
            .workers();
        let mut conn = conn.clone();
        let _: () = conn.hset(&key, "broken", "{not json").await.unwrap();
        let ids: Vec<String> = s
            .workers()
            .await
            .unwrap()
            .into_iter()
            .map(|w| w.info.id)
            .collect();
        assert_eq!(
            ids,
            ["old", "recent"],
            "a corrupt entry blinds the registry"
        );
    }
    let retention = std::time::Duration::from_secs(30);
    let mut gone = s.prune_workers(retention).await.unwrap();
    gone.retain(|id| id != "broken");
    assert_eq!(gone, ["old"]);
    let ids: Vec<String> = s
        .workers()
        .await
        .unwrap()
        .into_iter()
        .map(|w| w.info.id)
        .collect();
    assert_eq!(ids, ["recent"]);
    assert_eq!(
        s.prune_workers(retention).await.unwrap(),
        Vec::<String>::new()
    );
    if let Backend::Redis(_, conn) = &h.backend {
        let key = tranche_codec::KeySchema::new(&h.config.namespace, h.config.num_shards)
            .unwrap()
            .workers();
        let n: u64 = conn.clone().hlen(&key).await.unwrap();
        assert_eq!(n, 1, "the corrupt entry was not pruned");
    }
    s.worker_heartbeat(info("old")).await.unwrap();
    assert_eq!(s.workers().await.unwrap().len(), 2);
}

/// The pause flag is set, read and cleared; claims themselves do not check it (the
/// workers do), so nothing else changes.
async fn pause_is_a_namespace_flag(h: Harness) {
    let s = &h.store;
    assert!(!s.is_paused().await.unwrap());
    s.set_paused(true).await.unwrap();
    s.set_paused(true).await.unwrap();
    assert!(s.is_paused().await.unwrap());
    s.plan(&uniform(1, 10_000, 1000)).await.unwrap();
    assert_eq!(s.claim("w", 2).await.unwrap().len(), 2);
    s.set_paused(false).await.unwrap();
    assert!(!s.is_paused().await.unwrap());
}

/// Records that all decode: `corrupt_records` finds none, and `repair_corrupt` of a
/// claimed, a pending and a completed pid changes nothing (the Redis store's repair of
/// a corrupt record is in `tests/it/scripts/mod.rs`).
async fn a_sound_active_set_has_nothing_to_repair(h: Harness) {
    use tranche_active_store::Repair;
    let s = &h.store;
    s.plan(&uniform(1, 10_000, 1000)).await.unwrap();
    let leases = s.claim("a", 3).await.unwrap();
    s.release(&leases[1], leases[1].min_id + 5).await.unwrap();
    s.complete(&leases[2], 10).await.unwrap();
    let before = (s.counts().await.unwrap(), s.all_active().await.unwrap());
    assert!(s.corrupt_records().await.unwrap().is_empty());
    for l in &leases {
        assert_eq!(s.repair_corrupt(l.pid).await.unwrap(), Repair::Nothing);
    }
    let after = (s.counts().await.unwrap(), s.all_active().await.unwrap());
    assert_eq!(format!("{before:?}"), format!("{after:?}"));
}

async fn reaper_is_idempotent(h: Harness) {
    let s = &h.store;
    s.plan(&uniform(1, 1_000_000, 1000)).await.unwrap();
    let early = s.claim("a", 150).await.unwrap();
    h.clock.advance(10_000);
    let late = s.claim("b", 5).await.unwrap();
    h.clock.advance(20_000);
    let mut reaped = s.reap(h.clock_now()).await.unwrap();
    reaped.sort_unstable();
    let mut expect: Vec<u64> = early.iter().map(|l| l.pid).collect();
    expect.sort_unstable();
    assert_eq!(reaped, expect, "only leases whose deadline passed");
    assert!(
        s.reap(h.clock_now()).await.unwrap().is_empty(),
        "a second reaper finds nothing"
    );
    for l in &late {
        s.heartbeat(l, l.min_id + 1).await.unwrap();
    }
    let c = s.counts().await.unwrap();
    assert_eq!((c.pending, c.running, c.claimed), (150, 5, 0));
}

async fn queries(h: Harness) {
    let s = &h.store;
    assert_eq!(s.get(1).await.unwrap(), None, "never planned");
    s.plan(&uniform(1, 1_000_000, 1000)).await.unwrap();
    let p = s.get(777).await.unwrap().unwrap();
    assert_eq!(
        (p.status, p.attempts, p.min_id, p.max_id),
        (Status::Pending, 0, 776_001, 777_000),
        "unissued"
    );
    let leases = s.claim("w", 10).await.unwrap();
    let l = &leases[0];
    let p = s.get(l.pid).await.unwrap().unwrap();
    assert_eq!(
        (p.status, p.worker.as_deref(), p.lease_token),
        (Status::Claimed, Some("w"), Some(l.token))
    );
    assert_eq!(p.deadline_ms, Some(T0 + 30_000));
    s.complete(l, 1).await.unwrap();
    assert_eq!(s.get(l.pid).await.unwrap(), None);
    let snap = s.all_active().await.unwrap();
    assert_eq!(snap.partitions.len(), 9);
    assert!(
        snap.partitions.windows(2).all(|w| w[0].pid < w[1].pid),
        "sorted by pid"
    );
    let unissued: u64 = snap.unissued.iter().map(|u| u.count).sum();
    assert_eq!(unissued, 1000 - 10);
    let c = s.counts().await.unwrap();
    assert_eq!((c.unissued, c.claimed, c.outstanding()), (990, 9, 999));
}

/// `tranche import`: an exported registry adopted into an empty namespace keeps its
/// pids; completed pids are never issued again, every other pid is pending.
async fn adopt_restores_exported_plans(h: Harness) {
    use tranche_active_store::PlanEntry;
    let s = &h.store;
    let entry = |first, min, max, size, explicit| PlanEntry {
        plan: tranche_codec::PlanGeometry::new(first, min, max, size).unwrap(),
        explicit,
    };
    // Pids 1..=100, then one explicit range (101), then 102..=112.
    let entries = [
        entry(1, 1, 10_000, 100, false),
        entry(101, 20_000, 20_499, 500, true),
        entry(102, 30_000, 31_000, 100, false),
    ];
    let completed: Vec<u64> = (1..=112).filter(|p| p % 3 == 0 || *p == 101).collect();
    let missing: Vec<u64> = (1..=112).filter(|p| !completed.contains(p)).collect();

    // Refused before anything is written.
    let gap = [entry(2, 1, 10_000, 100, false)];
    assert!(matches!(
        s.adopt(&gap, &[]).await,
        Err(Error::InvalidPlan(_))
    ));
    let unsorted = [5, 3];
    assert!(matches!(
        s.adopt(&entries, &unsorted).await,
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        s.adopt(&entries, &[113]).await,
        Err(Error::InvalidArgument(_))
    ));
    assert!(s.plans().await.unwrap().is_empty());
    assert_eq!(s.counts().await.unwrap().outstanding(), 0);

    let pending = s.adopt(&entries, &completed).await.unwrap();
    assert_eq!(pending, missing.len() as u64);
    assert_eq!(s.plans().await.unwrap(), entries);
    assert_eq!(s.get(3).await.unwrap(), None, "completed: not active");
    assert_eq!(
        s.get(101).await.unwrap(),
        None,
        "a completed explicit range"
    );
    let p = s.get(104).await.unwrap().unwrap();
    assert_eq!(
        (p.status, p.attempts, p.min_id, p.max_id),
        (Status::Pending, 0, 30_200, 30_299)
    );
    let p = s.get(112).await.unwrap().unwrap();
    assert_eq!(
        (p.min_id, p.max_id),
        (31_000, 31_000),
        "the short last partition"
    );
    let snap = s.all_active().await.unwrap();
    let pids: Vec<u64> = snap.partitions.iter().map(|p| p.pid).collect();
    assert_eq!(pids, missing);
    assert!(
        snap.unissued.iter().all(|u| u.count == 0),
        "{:?}",
        snap.unissued
    );
    let c = s.counts().await.unwrap();
    assert_eq!((c.unissued, c.pending), (0, missing.len() as u64));

    // Claims hand out exactly the missing pids, each once.
    let mut claimed = Vec::new();
    for round in 0.. {
        assert!(round <= missing.len(), "claims never ran dry: {claimed:?}");
        let leases = s.claim("w", 7).await.unwrap();
        if leases.is_empty() {
            break;
        }
        claimed.extend(leases.iter().map(|l| l.pid));
    }
    claimed.sort_unstable();
    assert_eq!(claimed, missing);

    // Only into a namespace without plans.
    assert!(matches!(
        s.adopt(&entries, &completed).await,
        Err(Error::InvalidPlan(_))
    ));
}

/// The counts recomputed from every record, as `counts()` must answer them.
async fn recounted(s: &dyn ActiveStore) -> StatusCounts {
    let snapshot = s.all_active().await.unwrap();
    let mut c = StatusCounts {
        unissued: snapshot.unissued.iter().map(|u| u.count).sum(),
        ..StatusCounts::default()
    };
    for p in &snapshot.partitions {
        match p.status {
            Status::Pending => c.pending += 1,
            Status::Claimed => c.claimed += 1,
            Status::Running => c.running += 1,
            Status::Failed => c.failed += 1,
            Status::Discarded => c.discarded += 1,
            Status::Completed => panic!("pid {} completed but active", p.pid),
        }
    }
    c
}

/// `steps` random operations of every kind that changes a status (claims, heartbeats,
/// completions, failures, releases, reaps, released workers, retries, discards, new
/// plans), seeded; after each, `counts()` equals the counts recomputed from the records.
async fn random_workload(h: &Harness, seed: u64, steps: usize) {
    let s = &*h.store;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut held: Vec<Lease> = Vec::new();
    let mut next_range = 20_000_000u64;
    for step in 0..steps {
        match rng.random_range(0..100) {
            0..=19 => {
                let worker = format!("w{}", rng.random_range(0..4));
                held.extend(s.claim(&worker, rng.random_range(1..6)).await.unwrap());
            }
            20..=34 if !held.is_empty() => {
                let l = &held[rng.random_range(0..held.len())];
                let _ = s.heartbeat(l, l.min_id + 1).await;
            }
            35..=49 if !held.is_empty() => {
                let n = rng.random_range(1..=held.len().min(4));
                let done: Vec<(Lease, u64)> = held.drain(..n).map(|l| (l, 10)).collect();
                for outcome in s.complete_many(&done).await.unwrap() {
                    let _ = outcome;
                }
            }
            50..=59 if !held.is_empty() => {
                let l = held.swap_remove(rng.random_range(0..held.len()));
                let _ = s.fail(&l, "boom").await;
            }
            60..=67 if !held.is_empty() => {
                let l = held.swap_remove(rng.random_range(0..held.len()));
                let _ = s.release(&l, l.min_id + 2).await;
            }
            68..=75 => {
                h.clock.advance(rng.random_range(0..40_000));
                s.reap(h.clock_now()).await.unwrap();
            }
            76..=79 => {
                let worker = format!("w{}", rng.random_range(0..4));
                s.release_worker(&worker).await.unwrap();
            }
            80..=85 => {
                let only = rng.random_bool(0.5).then(|| rng.random_range(1..60));
                s.retry_failed(only).await.unwrap();
            }
            86..=91 => {
                let _ = s.discard(rng.random_range(1..60)).await;
            }
            92..=95 => {
                let n = rng.random_range(1..4);
                let ranges: Vec<_> = (0..n)
                    .map(|i| next_range + i * 100..=next_range + i * 100 + 99)
                    .collect();
                next_range += 1000;
                s.plan(&Plan::Ranges(ranges)).await.unwrap();
            }
            _ => {
                h.clock.advance(rng.random_range(0..5_000));
            }
        }
        assert_eq!(
            s.counts().await.unwrap(),
            recounted(s).await,
            "seed {seed}, after step {step}"
        );
    }
}

async fn counts_follow_a_random_workload(h: Harness) {
    h.store.plan(&uniform(1, 10_000_000, 10_000)).await.unwrap();
    for seed in 0..3 {
        random_workload(&h, seed, 150).await;
    }
    let c = h.store.counts().await.unwrap();
    assert!(
        c.pending > 0 && c.claimed + c.running > 0 && c.unissued > 0,
        "the workload reached several statuses: {c:?}"
    );
}

/// A namespace written before the counters existed: on Redis, its counters are dropped
/// mid-workload (the scripts then count from nothing, unmarked); `counts()` derives
/// them from the records once and stays right after.
async fn counts_of_a_namespace_without_counters(h: Harness) {
    h.store.plan(&uniform(1, 10_000_000, 10_000)).await.unwrap();
    random_workload(&h, 7, 60).await;
    if let Backend::Redis(_, conn) = &h.backend {
        let schema =
            tranche_codec::KeySchema::new(&h.config.namespace, h.config.num_shards).unwrap();
        let mut conn = conn.clone();
        for shard in schema.shards() {
            let _: () = conn.del(schema.shard_key(shard, "counts")).await.unwrap();
        }
    }
    let l = h.store.claim("w9", 3).await.unwrap();
    h.store.heartbeat(&l[0], l[0].min_id).await.unwrap();
    h.store.fail(&l[1], "boom").await.unwrap();
    let unmarked = || async {
        let Backend::Redis(_, conn) = &h.backend else {
            return 0;
        };
        let schema =
            tranche_codec::KeySchema::new(&h.config.namespace, h.config.num_shards).unwrap();
        let mut conn = conn.clone();
        let mut n = 0;
        for shard in schema.shards() {
            let records: u64 = conn.hlen(schema.active(shard)).await.unwrap();
            let marked: bool = conn
                .hexists(schema.shard_key(shard, "counts"), "v")
                .await
                .unwrap();
            n += u32::from(records > 0 && !marked);
        }
        n
    };
    if matches!(h.backend, Backend::Redis(..)) {
        assert!(unmarked().await > 0, "the scripts counted without the mark");
    }
    assert_eq!(h.store.counts().await.unwrap(), recounted(&*h.store).await);
    assert_eq!(unmarked().await, 0, "derived once, marked from then on");
    random_workload(&h, 8, 60).await;
}

async fn release_gives_the_attempt_back(h: Harness) {
    let s = &h.store;
    assert_eq!(h.config.max_attempts, 3);
    s.plan(&uniform(1, 1000, 1000)).await.unwrap();
    // Five graceful stops (Ctrl-C) on one partition: none of them is an attempt spent.
    for _ in 0..5 {
        let l = s.claim("w", 1).await.unwrap().remove(0);
        assert_eq!(l.attempt, 1);
        s.heartbeat(&l, l.min_id + 7).await.unwrap();
        s.release(&l, l.min_id + 7).await.unwrap();
        assert_eq!(s.get(1).await.unwrap().unwrap().attempts, 0);
    }
    let l = s.claim("w", 1).await.unwrap().remove(0);
    assert_eq!((l.attempt, l.progress), (1, l.min_id + 7));
    assert!(
        matches!(s.fail(&l, "boom").await.unwrap(), FailOutcome::Retry { .. }),
        "one real failure after five interruptions is a retry, not the end"
    );
    // An expired lease, reaped, keeps its attempt: it may be a crash loop.
    h.clock.advance(1_000);
    let l = s.claim("w", 1).await.unwrap().remove(0);
    assert_eq!(l.attempt, 2);
    h.clock.advance(30_000);
    assert_eq!(s.reap(h.clock_now()).await.unwrap(), vec![1]);
    let l = s.claim("w", 1).await.unwrap().remove(0);
    assert_eq!(l.attempt, 3);
    // So does a lease of a worker found inactive; this one was the last attempt, so
    // the partition (a crash loop, maybe) ends failed rather than retried for ever.
    assert_eq!(s.release_worker("w").await.unwrap(), Vec::<u64>::new());
    let p = s.get(1).await.unwrap().unwrap();
    assert_eq!((p.status, p.attempts), (Status::Failed, 3));
    assert!(
        p.last_error
            .unwrap()
            .contains("lease expired on attempt 3 of 3")
    );
    let c = s.counts().await.unwrap();
    assert_eq!((c.failed, c.outstanding()), (1, 0));
}

/// A partition whose lease keeps expiring (it crashes its worker every time) ends
/// failed at `max_attempts`, like one that fails; reaping counts its attempts.
async fn expired_leases_end_failed_at_max_attempts(h: Harness) {
    let s = &h.store;
    s.plan(&uniform(1, 1000, 1000)).await.unwrap();
    for attempt in 1..=3 {
        let l = s.claim("w", 1).await.unwrap().remove(0);
        assert_eq!(l.attempt, attempt);
        h.clock.advance(30_000);
        let requeued = s.reap(h.clock_now()).await.unwrap();
        assert_eq!(requeued.is_empty(), attempt == 3, "attempt {attempt}");
    }
    assert!(s.claim("w", 1).await.unwrap().is_empty());
    let p = s.get(1).await.unwrap().unwrap();
    assert_eq!((p.status, p.attempts), (Status::Failed, 3));
    let c = s.counts().await.unwrap();
    assert_eq!((c.failed, c.outstanding(), c.claimed), (1, 0, 0));
    // An operator's retry gives it a fresh budget.
    assert_eq!(s.retry_failed(Some(1)).await.unwrap(), vec![1]);
    assert_eq!(s.claim("w", 1).await.unwrap().len(), 1);
}

/// A claim larger than any one shard's work takes what each shard has, in the worker's
/// order, and the next claims take the rest.
async fn a_batch_claim_straddles_shards(h: Harness) {
    let s = &h.store;
    // 200 pids: batches of 100, so with 4 shards shard 0 holds pids 1..=99, shard 1
    // 100..=199 and shard 2 pid 200.
    s.plan(&uniform(1, 200_000, 1000)).await.unwrap();
    let first = s.claim("w", 150).await.unwrap();
    assert_eq!(first.len(), 150);
    let shards: std::collections::BTreeSet<u64> = first
        .iter()
        .map(|l| (l.pid / 100) % u64::from(h.config.num_shards))
        .collect();
    if h.config.num_shards > 1 {
        assert!(shards.len() >= 2, "no shard holds 150: {shards:?}");
    }
    let rest = s.claim("w", 150).await.unwrap();
    assert_eq!(rest.len(), 50, "the rest, from whichever shards hold it");
    let mut pids: Vec<u64> = first.iter().chain(&rest).map(|l| l.pid).collect();
    pids.sort_unstable();
    assert_eq!(pids, (1..=200).collect::<Vec<_>>());
    assert!(s.claim("w", 150).await.unwrap().is_empty());
    for l in first.iter().chain(&rest) {
        assert_eq!((l.min_id, l.max_id), ((l.pid - 1) * 1000 + 1, l.pid * 1000));
    }
    assert_eq!(s.counts().await.unwrap().claimed, 200);
}

/// One heartbeat call for leases on several shards, one of them lost: the others are
/// renewed with their checkpoints, the lost one is refused and changes nothing.
async fn a_batch_heartbeat_with_one_lease_lost(h: Harness) {
    let s = &h.store;
    s.plan(&uniform(1, 200_000, 1000)).await.unwrap();
    let all = s.claim("w", 200).await.unwrap();
    // The first, a middle and the last lease: on shards 0, 1 and 2 of 4.
    let picked = [all[0].clone(), all[120].clone(), all[199].clone()];
    h.clock.advance(20_000);
    let beats: Vec<(Lease, u64)> = [&picked[0], &picked[2]]
        .into_iter()
        .map(|l| (l.clone(), l.min_id + 100))
        .collect();
    for outcome in s.heartbeat_many(&beats).await.unwrap() {
        outcome.unwrap();
    }
    // Every other lease expires; the middle one goes to another worker.
    h.clock.advance(10_000);
    let reaped = s.reap(h.clock_now()).await.unwrap();
    assert_eq!(reaped.len(), 198);
    assert!(reaped.contains(&picked[1].pid));
    let mut tries = 0..=reaped.len();
    let taken = loop {
        assert!(
            tries.next().is_some(),
            "the reaped lease was never claimed again"
        );
        let got = s.claim("other", 1).await.unwrap().remove(0);
        if got.pid == picked[1].pid {
            break got;
        }
    };
    let beats: Vec<(Lease, u64)> = picked.iter().map(|l| (l.clone(), l.min_id + 500)).collect();
    let outcomes = s.heartbeat_many(&beats).await.unwrap();
    assert!(outcomes[0].is_ok() && outcomes[2].is_ok(), "{outcomes:?}");
    assert!(matches!(outcomes[1], Err(Error::LeaseLost { pid, .. }) if pid == picked[1].pid));
    for l in [&picked[0], &picked[2]] {
        let p = s.get(l.pid).await.unwrap().unwrap();
        assert_eq!((p.status, p.progress), (Status::Running, l.min_id + 500));
        assert_eq!(p.deadline_ms, Some(h.clock_now() + 30_000));
    }
    let p = s.get(picked[1].pid).await.unwrap().unwrap();
    assert_eq!(
        (p.worker.as_deref(), p.lease_token, p.progress),
        (Some("other"), Some(taken.token), taken.min_id),
        "the lost lease's beat changed nothing"
    );
}

/// A claim passes by the shards it found without work a moment ago: on a namespace of
/// 64 shards whose work is gone, claiming costs no round trip until the back-off ends,
/// a plan made through this store wakes them at once, and one made by another process
/// is found once the back-off is over.
#[tokio::test]
async fn empty_shards_are_passed_by() {
    use tranche_active_store::{Leases, Planner};
    let server = TestRedis::start();
    let conn = RedisConnection::connect(&server.url()).await.unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let config = Config {
        num_shards: 64,
        ..Config::default()
    };
    let store = RedisActiveStore::with_clock(conn.clone(), config.clone(), clock.clone()).unwrap();
    let scripts = || -> u64 {
        let stats = server.cli(&["INFO", "commandstats"]);
        stats
            .lines()
            .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
            .and_then(|l| l.split(',').next())
            .map_or(0, |n| n.parse().unwrap())
    };
    // Pids 1..=100: shards 0 and 1 of 64. A claim of more visits every shard.
    store.plan(&uniform(1, 100_000, 1000)).await.unwrap();
    assert_eq!(store.claim("w", 2000).await.unwrap().len(), 100);
    let before = scripts();
    assert!(store.claim("w", 10).await.unwrap().is_empty());
    assert_eq!(
        scripts() - before,
        0,
        "every shard was found empty a moment ago"
    );
    // A plan through this store wakes every shard.
    store.plan(&uniform(100_001, 200_000, 1000)).await.unwrap();
    let woken = store.claim("w", 1000).await.unwrap();
    assert_eq!(woken.len(), 100);
    // Another process's plan is found once the back-off is over.
    let other = RedisActiveStore::with_clock(conn, config, clock.clone()).unwrap();
    other.plan(&uniform(200_001, 300_000, 1000)).await.unwrap();
    let before = scripts();
    assert!(store.claim("w", 1000).await.unwrap().is_empty());
    assert_eq!(scripts() - before, 0);
    clock.advance(1_000);
    assert_eq!(store.claim("w", 1000).await.unwrap().len(), 100);
}

/// A shard's completed index is a Redis bitmap of at most 2^32 bits: a plan with a pid
/// past it is refused before anything is written, and the error says the way out.
async fn a_plan_past_the_bitmap_limit_is_refused(h: Harness) {
    let s = &h.store;
    let shards = u64::from(h.config.num_shards);
    let too_many = (1u64 << 32) * shards + 100;
    let err = s.plan(&uniform(1, too_many, 1)).await.unwrap_err();
    assert!(
        matches!(&err, Error::InvalidPlan(m) if m.contains("more shards or bigger partitions")),
        "{err}"
    );
    assert!(s.plans().await.unwrap().is_empty(), "nothing was written");
    assert_eq!(s.counts().await.unwrap().unissued, 0);
    // Just below the bound, per shard: accepted.
    let fits = ((1u64 << 32) - 200) * shards;
    let outcome = s.plan(&uniform(1, fits, 1)).await.unwrap();
    assert_eq!(outcome.entries[0].plan.partitions(), fits);
    // A later plan past it is refused too, the first one kept.
    let err = s
        .plan(&uniform(fits + 1, fits + 300 * shards, 1))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidPlan(_)), "{err}");
    assert_eq!(s.plans().await.unwrap().len(), 1);
}

/// `recount` puts counters that a writer without them got wrong (a rolling upgrade)
/// right again.
#[tokio::test]
async fn recount_repairs_counters() {
    use tranche_active_store::{ActiveQuery, Leases, Planner};
    let server = TestRedis::start();
    let conn = RedisConnection::connect(&server.url()).await.unwrap();
    let config = Config {
        num_shards: 2,
        ..Config::default()
    };
    let store = RedisActiveStore::new(conn.clone(), config).unwrap();
    store.plan(&uniform(1, 1_000_000, 1000)).await.unwrap();
    let leases = store.claim("w", 10).await.unwrap();
    store.heartbeat(&leases[0], leases[0].min_id).await.unwrap();
    let before = store.counts().await.unwrap();
    assert_eq!((before.claimed, before.running), (9, 1));
    let mut c = conn.clone();
    let schema = tranche_codec::KeySchema::new("elk", 2).unwrap();
    let _: () = c
        .hset(schema.shard_key(0, "counts"), "c", 1000)
        .await
        .unwrap();
    let _: () = c
        .hset(schema.shard_key(1, "counts"), "p", -3)
        .await
        .unwrap();
    assert_ne!(store.counts().await.unwrap(), before);
    assert_eq!(store.recount().await.unwrap(), before);
    assert_eq!(store.counts().await.unwrap(), before);
}

impl Harness {
    fn clock_now(&self) -> u64 {
        use tranche_active_store::Clock;
        self.clock.now_ms()
    }
}

/// A record read back from Redis is checked like input: one whose range runs
/// backwards is an error naming its key, never a lease a worker would underflow on.
#[tokio::test]
async fn a_backwards_range_read_back_is_an_error() {
    use tranche_active_store::{Leases, Planner};
    let server = TestRedis::start();
    let conn = RedisConnection::connect(&server.url()).await.unwrap();
    let store = RedisActiveStore::new(conn.clone(), Config::default()).unwrap();
    store.plan(&Plan::Ranges(vec![1000..=2000])).await.unwrap();
    let record: String = server.query(redis::cmd("HGET").arg("{elk:0}:active").arg(1));
    let fields: Vec<&str> = record.split('|').collect();
    assert_eq!((fields[8], fields[9]), ("1000", "2000"), "{record}");
    let mut bad: Vec<&str> = fields.clone();
    (bad[8], bad[9]) = ("2000", "1000");
    let _: () = server.query(
        redis::cmd("HSET")
            .arg("{elk:0}:active")
            .arg(1)
            .arg(bad.join("|")),
    );
    let err = store.claim("w", 1).await.unwrap_err();
    assert!(
        matches!(&err, Error::Corrupt { key, .. } if key.contains("{elk:0}:active")),
        "{err}"
    );
}

/// A checkpoint never moves backwards: a heartbeat (single or batched) or a release
/// carrying an older checkpoint than one recorded (beats reordered or retried) keeps the
/// newer one; the beat still renews the lease, and the next claimant resumes from the
/// newer checkpoint.
async fn checkpoints_never_move_backwards(h: Harness) {
    let s = &h.store;
    s.plan(&uniform(1, 10_000, 1000)).await.unwrap();
    let lease = s.claim("w", 1).await.unwrap().remove(0);
    let newer = lease.min_id + 500;
    s.heartbeat(&lease, newer).await.unwrap();
    h.clock.advance(10_000);
    s.heartbeat(&lease, lease.min_id + 200).await.unwrap();
    let p = s.get(lease.pid).await.unwrap().unwrap();
    assert_eq!((p.status, p.progress), (Status::Running, newer));
    assert_eq!(p.deadline_ms, Some(h.clock_now() + 30_000), "renewed");
    let beats = s
        .heartbeat_many(&[(lease.clone(), lease.min_id + 100)])
        .await
        .unwrap();
    assert!(beats[0].is_ok(), "{beats:?}");
    assert_eq!(s.get(lease.pid).await.unwrap().unwrap().progress, newer);
    s.release(&lease, lease.min_id + 300).await.unwrap();
    let p = s.get(lease.pid).await.unwrap().unwrap();
    assert_eq!((p.status, p.progress), (Status::Pending, newer));
    let again = s.claim("w", 1).await.unwrap().remove(0);
    assert_eq!((again.pid, again.progress), (lease.pid, newer));
    // A newer checkpoint still moves it on.
    s.heartbeat(&again, newer + 1).await.unwrap();
    assert_eq!(s.get(lease.pid).await.unwrap().unwrap().progress, newer + 1);
}

/// A planned pid that no cursor has issued yet reads as pending, and `discard` drops it
/// like any pending partition ("Drop one pending or failed partition"): it ends
/// discarded, is never issued, a replay of its plan does not bring it back, and the
/// counts stay exact throughout (the pid leaves the unissued count for the discarded).
async fn a_pid_not_issued_yet_is_discarded_like_a_pending_one(h: Harness) {
    let s = &h.store;
    s.plan(&uniform(1, 20_000, 1000)).await.unwrap();
    assert_eq!(s.get(7).await.unwrap().unwrap().status, Status::Pending);
    assert!(s.discard(7).await.unwrap());
    assert!(!s.discard(7).await.unwrap(), "already discarded");
    let p = s.get(7).await.unwrap().unwrap();
    assert_eq!(
        (p.status, p.min_id, p.max_id),
        (Status::Discarded, 6001, 7000)
    );
    let c = s.counts().await.unwrap();
    assert_eq!((c.unissued, c.discarded), (19, 1));
    assert_eq!(c, recounted(s.as_ref()).await);
    // The ends of a plan, and a pid next to one discarded.
    for pid in [1, 20, 8] {
        assert!(s.discard(pid).await.unwrap(), "pid {pid}");
        assert_eq!(s.counts().await.unwrap(), recounted(s.as_ref()).await);
    }
    let mut claimed = Vec::new();
    for round in 0.. {
        assert!(round < 100, "claims never ran dry: {claimed:?}");
        let leases = s.claim("w", 3).await.unwrap();
        if leases.is_empty() {
            break;
        }
        claimed.extend(leases.iter().map(|l| l.pid));
    }
    claimed.sort_unstable();
    let expected: Vec<u64> = (1..=20).filter(|p| ![1, 7, 8, 20].contains(p)).collect();
    assert_eq!(claimed, expected);
    let c = s.counts().await.unwrap();
    assert_eq!((c.unissued, c.claimed, c.discarded), (0, 16, 4));
    assert_eq!(c, recounted(s.as_ref()).await);
    // Planning the same again is a no-op, and issues nothing discarded.
    assert!(!s.plan(&uniform(1, 20_000, 1000)).await.unwrap().created);
    assert!(s.claim("w", 3).await.unwrap().is_empty());
    assert_eq!(s.get(8).await.unwrap().unwrap().status, Status::Discarded);
}

/// A permanent failure fails the partition on its first attempt; `retry_after` replaces
/// the backoff; the ordinary policy is `fail`.
async fn fail_with_a_policy(h: Harness) {
    let s = &h.store;
    s.plan(&uniform(1, 3000, 1000)).await.unwrap();
    let leases = s.claim("w", 3).await.unwrap();
    let permanent = FailPolicy {
        permanent: true,
        retry_after: Some(Duration::from_millis(5)),
    };
    assert_eq!(
        s.fail_with(&leases[0], "no such table", permanent)
            .await
            .unwrap(),
        FailOutcome::Failed,
        "permanent on attempt 1 of 3"
    );
    let p = s.get(leases[0].pid).await.unwrap().unwrap();
    assert_eq!(
        (p.status, p.last_error.as_deref()),
        (Status::Failed, Some("no such table"))
    );
    let later = FailPolicy {
        retry_after: Some(Duration::from_millis(250)),
        ..FailPolicy::default()
    };
    assert_eq!(
        s.fail_with(&leases[1], "throttled", later).await.unwrap(),
        FailOutcome::Retry {
            ready_at_ms: h.clock_now() + 250
        },
        "the asked-for delay, not the 1 s backoff"
    );
    assert_eq!(
        s.fail_with(&leases[2], "boom", FailPolicy::default())
            .await
            .unwrap(),
        FailOutcome::Retry {
            ready_at_ms: h.clock_now() + 1000
        },
        "the ordinary policy backs off"
    );
    assert!(lost(
        s.fail_with(&leases[0], "again", permanent)
            .await
            .unwrap_err()
    ));
    h.clock.advance(250);
    let retried = s.claim("w", 3).await.unwrap();
    assert_eq!(
        retried
            .iter()
            .map(|l| (l.pid, l.attempt))
            .collect::<Vec<_>>(),
        vec![(leases[1].pid, 2)],
        "the failed partition is not retried"
    );
    let c = s.counts().await.unwrap();
    assert_eq!((c.failed, c.pending, c.claimed), (1, 1, 1));
}
