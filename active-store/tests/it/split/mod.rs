//! The split protocol (`src/split.rs`), one behaviour suite run against every backend:
//! memory, a private standalone Redis and a private one-node Redis Cluster (where a
//! script touching keys of two slots fails with CROSSSLOT), each at 1 and 4 shards.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use redis::AsyncCommands;
use tranche_active_store::{
    ActiveStore, Beat, Clock, Completion, Config, Error, FailOutcome, FailPolicy, Lease,
    ManualClock, MemoryActiveStore, Part, PartBeat, PieceDone, Plan, RedisActiveStore,
    RedisConnection, Running, SplitAnswer,
};
use tranche_codec::{CompletedRecord, Status, decode_json};

use support::TestRedis;

mod ends;
mod requests;
mod whole;

use ends::*;
use requests::*;
use whole::*;

const T0: u64 = 1_719_234_405_000;
const LEASE: Duration = Duration::from_secs(30);

struct Harness {
    store: Arc<dyn ActiveStore>,
    clock: Arc<ManualClock>,
    config: Config,
    backend: Backend,
    seen: std::sync::Mutex<Vec<CompletedRecord>>,
}

/// What a backend held at one moment, for [`Harness::failover`].
enum Saved {
    Memory(tranche_active_store::ActiveState),
    /// Every key and its DUMP.
    Redis(Vec<(String, Vec<u8>)>),
}

enum Backend {
    Memory(Arc<MemoryActiveStore>),
    Redis(#[allow(dead_code)] TestRedis, RedisConnection),
}

#[derive(Clone, Copy)]
enum Kind {
    Memory,
    Redis,
    Cluster,
}

impl Harness {
    async fn new(kind: Kind, shards: u32) -> Self {
        let config = Config {
            num_shards: shards,
            lease: LEASE,
            max_attempts: 3,
            ..Config::default()
        };
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
                let store =
                    RedisActiveStore::with_clock(conn.clone(), config.clone(), clock.clone())
                        .unwrap();
                (Arc::new(store), Backend::Redis(server, conn))
            }
        };
        let h = Self {
            store,
            clock,
            config,
            backend,
            seen: Default::default(),
        };
        h.store
            .plan(&Plan::Uniform {
                min: 1,
                max: 8000,
                size: 1000,
            })
            .await
            .unwrap();
        h
    }

    /// Every record in every shard's inbox so far.
    async fn inbox(&self) -> Vec<CompletedRecord> {
        match &self.backend {
            Backend::Memory(store) => {
                let mut seen = self.seen.lock().unwrap();
                for shard in 0..self.config.num_shards {
                    seen.extend(store.inbox(shard).unwrap().try_iter());
                }
                seen.clone()
            }
            Backend::Redis(_, conn) => {
                let schema =
                    tranche_codec::KeySchema::new(&self.config.namespace, self.config.num_shards)
                        .unwrap();
                let mut conn = conn.clone();
                let mut out = Vec::new();
                for shard in schema.shards() {
                    let reply: redis::streams::StreamRangeReply =
                        conn.xrange_all(schema.inbox(shard)).await.unwrap();
                    for entry in reply.ids {
                        let lines: String = entry.get("r").unwrap();
                        out.extend(lines.lines().map(|json| decode_json(json).unwrap()));
                    }
                }
                out
            }
        }
    }

    /// Everything the backend holds now, for a [`failover`](Self::failover) to bring
    /// back.
    async fn save(&self) -> Saved {
        match &self.backend {
            Backend::Memory(store) => Saved::Memory(store.state()),
            Backend::Redis(_, conn) => {
                let mut conn = conn.clone();
                let keys: Vec<String> = redis::cmd("KEYS")
                    .arg("*")
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                let mut out = Vec::new();
                for key in keys {
                    let dump: Vec<u8> = redis::cmd("DUMP")
                        .arg(&key)
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    out.push((key, dump));
                }
                Saved::Redis(out)
            }
        }
    }

    /// A failover to a replica that had seen nothing after `saved`: every write since
    /// is lost (Redis: every key flushed and restored; memory: the store restored from
    /// its state then, leases kept).
    async fn failover(&mut self, saved: Saved) {
        match (saved, &self.backend) {
            (Saved::Memory(state), Backend::Memory(_)) => {
                let store = Arc::new(
                    MemoryActiveStore::restore(
                        self.config.clone(),
                        self.clock.clone(),
                        state,
                        tranche_active_store::RestoredLeases::Keep,
                    )
                    .unwrap(),
                );
                self.seen.lock().unwrap().clear();
                self.store = store.clone();
                self.backend = Backend::Memory(store);
            }
            (Saved::Redis(keys), Backend::Redis(_, conn)) => {
                let mut conn = conn.clone();
                let () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
                for (key, dump) in keys {
                    let () = redis::cmd("RESTORE")
                        .arg(&key)
                        .arg(0)
                        .arg(dump)
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                }
            }
            _ => unreachable!("saved by this harness"),
        }
    }

    /// Claims one partition for `worker` and beats it once (running, checkpoint at
    /// its first ID).
    async fn running(&self, worker: &str) -> Lease {
        let lease = self.store.claim(worker, 1).await.unwrap().remove(0);
        self.beat(&lease, false, lease.min_id, None).await.unwrap();
        lease
    }

    /// `a`'s running partition split at once: `b` asks for one piece (at least 100
    /// IDs), `a`'s beat cuts it right past its first ID, and `b` claims it. The owner's
    /// lease and the piece's.
    async fn split_at_once(&self) -> (Lease, Lease) {
        let lease = self.running("a").await;
        let (pid, min) = (lease.pid, lease.min_id);
        self.store
            .request_split(&self.candidate(pid, Part::Owner).await, "b", 100)
            .await
            .unwrap();
        self.beat(&lease, false, min, Some(min + 1)).await.unwrap();
        let piece = self.store.claim_pieces("b", 1).await.unwrap().remove(0);
        (lease, piece)
    }

    async fn beat(
        &self,
        lease: &Lease,
        piece: bool,
        progress: u64,
        next: Option<u64>,
    ) -> Result<Beat, Error> {
        let beat = PartBeat {
            lease: lease.clone(),
            piece,
            progress,
            next,
        };
        self.store.beat_parts(&[beat]).await.unwrap().remove(0)
    }

    /// The running part of `pid` the candidates list for `part`.
    async fn candidate(&self, pid: u64, part: Part) -> Running {
        self.store
            .split_candidates()
            .await
            .unwrap()
            .into_iter()
            .find(|r| r.pid == pid && r.part == part)
            .unwrap_or_else(|| panic!("{pid} {part:?} is not a candidate"))
    }
}

fn lost<T: std::fmt::Debug>(r: Result<T, Error>) -> bool {
    matches!(r, Err(Error::LeaseLost { .. }))
}

macro_rules! suite {
    ($($check:ident),* $(,)?) => {
        mod memory_1 { $( #[tokio::test(flavor = "current_thread")] async fn $check() { super::$check(super::Harness::new(super::Kind::Memory, 1).await).await } )* }
        mod memory_4 { $( #[tokio::test(flavor = "current_thread")] async fn $check() { super::$check(super::Harness::new(super::Kind::Memory, 4).await).await } )* }
        mod redis_1 { $( #[tokio::test] async fn $check() { super::$check(super::Harness::new(super::Kind::Redis, 1).await).await } )* }
        mod redis_4 { $( #[tokio::test] async fn $check() { super::$check(super::Harness::new(super::Kind::Redis, 4).await).await } )* }
        mod cluster_4 { $( #[tokio::test] async fn $check() { super::$check(super::Harness::new(super::Kind::Cluster, 4).await).await } )* }
    };
}

suite!(
    a_request_needs_a_running_part_and_room,
    the_owner_cuts_past_its_frontier_in_its_own_beat,
    an_owner_past_the_limit_drops_the_request,
    the_last_piece_completes_the_partition_once,
    an_owner_done_last_completes_the_whole_range,
    an_expired_piece_is_reclaimed_from_its_checkpoint,
    a_split_racing_an_expiry_is_served_by_the_next_owner,
    a_piece_splits_in_turn,
    a_failed_piece_spends_attempts_then_fails_its_partition,
    a_permanent_piece_failure_fails_the_partition_at_once,
    a_piece_expiring_on_its_last_attempt_fails_its_partition,
    one_beat_cuts_as_many_pieces_as_asked,
    every_backend_refuses_in_one_order,
    a_request_never_outlives_its_piece,
    a_retried_beat_after_a_lost_reply_answers_the_cut_end,
    an_owner_failing_for_good_makes_its_partition_whole,
    an_owner_expiring_on_its_last_attempt_makes_its_partition_whole,
    a_discard_with_pieces_out_makes_the_partition_whole,
    a_cut_lost_in_a_failover_cannot_skip_the_tail,
);

/// The embedded state file holds no pieces: a split partition is saved whole, from its
/// lowest unfinished ID, its owner's lease kept while it runs (so a restore expires it
/// and counts the attempt), pending once its owner part is done. Nothing is lost; the
/// pieces' chunks are done again.
#[tokio::test(flavor = "current_thread")]
async fn a_saved_split_partition_is_whole_again() {
    use tranche_active_store::{ActiveQuery, Leases, Planner, RestoredLeases, Splits};
    let config = Config {
        num_shards: 1,
        lease: LEASE,
        max_attempts: 3,
        ..Config::default()
    };
    let clock = Arc::new(ManualClock::new(T0));
    let store = MemoryActiveStore::with_clock(config.clone(), clock.clone()).unwrap();
    store
        .plan(&Plan::Uniform {
            min: 1,
            max: 1000,
            size: 1000,
        })
        .await
        .unwrap();
    let owner = store.claim("a", 1).await.unwrap().remove(0);
    let beat = |lease: &Lease, piece: bool, progress: u64, next: Option<u64>| PartBeat {
        lease: lease.clone(),
        piece,
        progress,
        next,
    };
    store
        .beat_parts(&[beat(&owner, false, 1, None)])
        .await
        .unwrap();
    let part = store.split_candidates().await.unwrap().remove(0);
    store.request_split(&part, "b", 100).await.unwrap();
    store
        .beat_parts(&[beat(&owner, false, 201, Some(301))])
        .await
        .unwrap();
    let piece = store.claim_pieces("b", 1).await.unwrap().remove(0);
    assert_eq!(piece.min_id, 501);
    store
        .beat_parts(&[beat(&piece, true, 601, None)])
        .await
        .unwrap();

    let saved = |store: &MemoryActiveStore| {
        MemoryActiveStore::restore(
            config.clone(),
            clock.clone(),
            store.state(),
            RestoredLeases::Release,
        )
        .unwrap()
    };
    // Owner running: saved leased over 1..=1000 from 201; restored, the lease expired.
    assert_eq!(store.state().leased(), vec![1]);
    let restored = saved(&store);
    let p = restored.get(1).await.unwrap().unwrap();
    assert_eq!(
        (p.min_id, p.max_id, p.progress, p.status),
        (1, 1000, 201, Status::Pending)
    );
    assert!(restored.pieces(1).await.unwrap().is_empty());
    let again = restored.claim("c", 1).await.unwrap().remove(0);
    assert_eq!(
        (again.min_id, again.max_id, again.progress, again.attempt),
        (1, 1000, 201, 2)
    );

    // Owner part done, the piece at 601: saved pending over 1..=1000 from 601.
    assert_eq!(
        store.complete(&owner, 1).await.unwrap(),
        Completion::PartDone
    );
    assert!(store.state().leased().is_empty());
    let restored = saved(&store);
    let p = restored.get(1).await.unwrap().unwrap();
    assert_eq!(
        (p.min_id, p.max_id, p.progress, p.status),
        (1, 1000, 601, Status::Pending)
    );
    let again = restored.claim("c", 1).await.unwrap().remove(0);
    assert_eq!((again.min_id, again.max_id, again.progress), (1, 1000, 601));
}
