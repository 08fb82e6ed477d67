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

mod counts;
mod leases;
mod maintenance;
mod plans;

use self::{counts::*, leases::*, maintenance::*, plans::*};

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
    a_retry_in_the_last_shard_waits_at_most_a_ring,
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

impl Harness {
    fn clock_now(&self) -> u64 {
        use tranche_active_store::Clock;
        self.clock.now_ms()
    }
}
