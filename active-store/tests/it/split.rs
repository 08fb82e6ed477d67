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

const T0: u64 = 1_719_234_405_000;
const LEASE: Duration = Duration::from_secs(30);

struct Harness {
    store: Arc<dyn ActiveStore>,
    clock: Arc<ManualClock>,
    config: Config,
    backend: Backend,
    seen: std::sync::Mutex<Vec<CompletedRecord>>,
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

    /// Claims one partition for `worker` and beats it once (running, checkpoint at
    /// its first ID).
    async fn running(&self, worker: &str) -> Lease {
        let lease = self.store.claim(worker, 1).await.unwrap().remove(0);
        self.beat(&lease, false, lease.min_id, None).await.unwrap();
        lease
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
);

/// Not running, then busy, then too small, on every backend, and a refused request
/// leaves nothing a later one would trip on.
async fn every_backend_refuses_in_one_order(h: Harness) {
    let s = &h.store;
    let lease = s.claim("a", 1).await.unwrap().remove(0);
    h.beat(&lease, false, lease.min_id + 100, None)
        .await
        .unwrap();
    let part = h.candidate(lease.pid, Part::Owner).await;
    let past_the_end = [(lease.max_id - 10, lease.max_id + 5)];
    assert_eq!(
        s.request_pieces(&part, "b", &past_the_end).await.unwrap(),
        SplitAnswer::TooSmall,
        "nothing waiting: too small"
    );
    assert!(matches!(
        s.request_pieces(&part, "b", &part.cuts(100, 1, 30))
            .await
            .unwrap(),
        SplitAnswer::Requested { .. }
    ));
    assert_eq!(
        s.request_pieces(&part, "c", &past_the_end).await.unwrap(),
        SplitAnswer::Busy,
        "a request waiting: busy before too small"
    );
    let mut stale = part.clone();
    stale.token += 1;
    assert_eq!(
        s.request_pieces(&stale, "c", &past_the_end).await.unwrap(),
        SplitAnswer::NotRunning,
        "another token: not running before busy"
    );
}

/// A request for the second of two pieces of a partition beaten in one call is
/// served; a request for a piece that completes before its holder beats goes with it:
/// the partition's other parts can be asked at once, not once it went stale.
async fn a_request_never_outlives_its_piece(h: Harness) {
    let s = &h.store;
    let lease = h.running("a").await;
    let (pid, min) = (lease.pid, lease.min_id);
    let owner = h.candidate(pid, Part::Owner).await;
    let cuts = [(min + 500, min + 600), (min + 750, min + 850)];
    s.request_pieces(&owner, "b", &cuts).await.unwrap();
    assert_eq!(
        h.beat(&lease, false, min, Some(min + 1)).await.unwrap(),
        Beat::Cut { last: min + 499 }
    );
    let pieces = s.claim_pieces("b", 2).await.unwrap();
    assert_eq!(pieces.len(), 2);
    let (first, second) = if pieces[0].min_id < pieces[1].min_id {
        (&pieces[0], &pieces[1])
    } else {
        (&pieces[1], &pieces[0])
    };
    for p in [first, second] {
        h.beat(p, true, p.min_id, None).await.unwrap();
    }
    let part = h.candidate(pid, Part::Piece(min + 750)).await;
    assert_eq!(
        s.request_pieces(&part, "c", &[(min + 900, min + 950)])
            .await
            .unwrap(),
        SplitAnswer::Requested { point: min + 900 }
    );
    let beat = |p: &Lease, next: u64| PartBeat {
        lease: p.clone(),
        piece: true,
        progress: p.min_id,
        next: Some(next),
    };
    let out = s
        .beat_parts(&[beat(first, min + 510), beat(second, min + 760)])
        .await
        .unwrap();
    assert_eq!(out[0].as_ref().unwrap(), &Beat::Renewed);
    assert_eq!(out[1].as_ref().unwrap(), &Beat::Cut { last: min + 899 });
    let third = s.claim_pieces("c", 1).await.unwrap().remove(0);
    assert_eq!((third.min_id, third.max_id), (min + 900, min + 999));
    h.beat(&third, true, min + 900, None).await.unwrap();
    let part = h.candidate(pid, Part::Piece(min + 900)).await;
    assert_eq!(
        s.request_pieces(&part, "d", &[(min + 950, min + 950)])
            .await
            .unwrap(),
        SplitAnswer::Requested { point: min + 950 }
    );
    assert_eq!(s.complete_piece(&third).await.unwrap(), PieceDone::Done);
    let owner = h.candidate(pid, Part::Owner).await;
    assert_eq!(
        s.request_pieces(&owner, "d", &[(min + 300, min + 400)])
            .await
            .unwrap(),
        SplitAnswer::Requested { point: min + 300 }
    );
}

/// A request for three pieces is served in one beat: the remainder in four shares of
/// whole chunks (grain 30), the holder keeping the first. A request for fewer pieces
/// on the same part is busy, one for more replaces it; a holder past the first
/// piece's limit keeps that piece and cuts the rest.
async fn one_beat_cuts_as_many_pieces_as_asked(h: Harness) {
    let s = &h.store;
    let lease = h.running("a").await;
    let (pid, min) = (lease.pid, lease.min_id);
    let part = h.candidate(pid, Part::Owner).await;
    let cuts = part.cuts(100, 3, 30);
    assert_eq!(
        cuts,
        vec![
            (min + 240, min + 380),
            (min + 480, min + 620),
            (min + 720, min + 900)
        ]
    );
    assert_eq!(
        s.request_pieces(&part, "b", &part.cuts(100, 2, 30))
            .await
            .unwrap(),
        SplitAnswer::Requested { point: min + 330 }
    );
    assert_eq!(
        s.request_pieces(&part, "c", &part.cuts(100, 1, 30))
            .await
            .unwrap(),
        SplitAnswer::Busy,
        "fewer pieces than the waiting request"
    );
    assert_eq!(
        s.request_pieces(&part, "c", &cuts).await.unwrap(),
        SplitAnswer::Requested { point: min + 240 },
        "more pieces replace it"
    );
    // Handed out up to min + 399: the first piece's limit (min + 380) is passed, so the
    // holder keeps it; the others start at their points.
    assert_eq!(
        h.beat(&lease, false, min + 100, Some(min + 400))
            .await
            .unwrap(),
        Beat::Cut { last: min + 479 }
    );
    let pieces: Vec<(u64, u64)> = s
        .pieces(pid)
        .await
        .unwrap()
        .iter()
        .map(|p| (p.start, p.max_id))
        .collect();
    assert_eq!(pieces, vec![(min + 480, min + 719), (min + 720, min + 999)]);
    let mut claimed = s.claim_pieces("b", 5).await.unwrap();
    claimed.sort_by_key(|l| l.min_id);
    assert_eq!(claimed.len(), 2);
    for piece in &claimed {
        assert_eq!(s.complete_piece(piece).await.unwrap(), PieceDone::Done);
    }
    assert_eq!(
        s.complete(&lease, 1).await.unwrap(),
        Completion::Completed,
        "the owner's part is the last"
    );
    let inbox = h.inbox().await;
    assert_eq!(inbox.len(), 1);
    assert_eq!((inbox[0].min_id, inbox[0].max_id), (min, min + 999));
}

/// Refused while claimed (not running), granted once running, refused again while the
/// request waits, and refused when too little is left.
async fn a_request_needs_a_running_part_and_room(h: Harness) {
    let s = &h.store;
    let lease = s.claim("a", 1).await.unwrap().remove(0);
    let claimed = Running {
        pid: lease.pid,
        part: Part::Owner,
        token: lease.token,
        worker: "a".into(),
        max_id: lease.max_id,
        progress: lease.min_id,
        partition_min: lease.min_id,
        partition_max: lease.max_id,
        owner: "a".into(),
        claimed_ms: None,
    };
    assert!(
        s.split_candidates().await.unwrap().is_empty(),
        "claimed is not running"
    );
    assert_eq!(
        s.request_split(&claimed, "b", 100).await.unwrap(),
        SplitAnswer::NotRunning
    );
    h.beat(&lease, false, lease.min_id + 100, None)
        .await
        .unwrap();
    let part = h.candidate(lease.pid, Part::Owner).await;
    assert_eq!(
        (part.progress, part.max_id),
        (lease.min_id + 100, lease.max_id)
    );
    assert_eq!(part.remaining(), 900);
    assert_eq!(
        s.request_split(&part, "b", 100).await.unwrap(),
        SplitAnswer::Requested {
            point: lease.min_id + 100 + 450
        }
    );
    assert_eq!(
        s.request_split(&part, "c", 100).await.unwrap(),
        SplitAnswer::Busy
    );
    assert_eq!(
        s.request_split(&part, "c", 500).await.unwrap(),
        SplitAnswer::TooSmall,
        "900 left: no two pieces of 500"
    );
    let mut stale = part.clone();
    stale.token += 1;
    assert_eq!(
        s.request_split(&stale, "c", 100).await.unwrap(),
        SplitAnswer::NotRunning,
        "another token"
    );
    // A request its holder never serves gives way after a lease.
    h.clock.advance(LEASE.as_millis() as u64);
    h.beat(&lease, false, lease.min_id + 100, None)
        .await
        .unwrap();
    assert!(matches!(
        s.request_split(&h.candidate(lease.pid, Part::Owner).await, "c", 100)
            .await
            .unwrap(),
        SplitAnswer::Requested { .. }
    ));
}

/// The cut point is the later of the requested point and the holder's `next`; the
/// holder's range ends before it, the rest is a pending piece of its own, and the
/// partition is still one running partition.
async fn the_owner_cuts_past_its_frontier_in_its_own_beat(h: Harness) {
    let s = &h.store;
    let lease = h.running("a").await;
    let (pid, min) = (lease.pid, lease.min_id);
    let part = h.candidate(pid, Part::Owner).await;
    let answer = s.request_split(&part, "b", 100).await.unwrap();
    assert_eq!(answer, SplitAnswer::Requested { point: min + 500 });
    // A beat without `next` does not cut: the holder does not split.
    assert_eq!(
        h.beat(&lease, false, min + 50, None).await.unwrap(),
        Beat::Renewed
    );
    assert!(s.pieces(pid).await.unwrap().is_empty());
    // The owner has handed out up to min + 699: the cut is at min + 700.
    assert_eq!(
        h.beat(&lease, false, min + 100, Some(min + 700))
            .await
            .unwrap(),
        Beat::Cut { last: min + 699 }
    );
    let p = s.get(pid).await.unwrap().unwrap();
    assert_eq!(
        (p.min_id, p.max_id, p.status),
        (min, min + 699, Status::Running)
    );
    let pieces = s.pieces(pid).await.unwrap();
    assert_eq!(pieces.len(), 1);
    assert_eq!(
        (
            pieces[0].start,
            pieces[0].max_id,
            pieces[0].status,
            pieces[0].progress
        ),
        (min + 700, min + 999, Status::Pending, min + 700)
    );
    let counts = s.counts().await.unwrap();
    assert_eq!(
        (counts.running, counts.pending),
        (1, 0),
        "a split partition is one"
    );
    // The next beat renews only.
    assert_eq!(
        h.beat(&lease, false, min + 200, Some(min + 710))
            .await
            .unwrap(),
        Beat::Renewed
    );
    let got = s.claim_pieces("b", 5).await.unwrap();
    assert_eq!(got.len(), 1);
    let piece = &got[0];
    assert_eq!(
        (
            piece.pid,
            piece.min_id,
            piece.max_id,
            piece.progress,
            piece.attempt
        ),
        (pid, min + 700, min + 999, min + 700, 1)
    );
    assert!(piece.token > lease.token, "a token of its own");
    assert!(
        s.claim_pieces("c", 5).await.unwrap().is_empty(),
        "claimed once"
    );
    let pieces = s.pieces(pid).await.unwrap();
    assert_eq!(
        (pieces[0].status, pieces[0].worker.as_deref()),
        (Status::Claimed, Some("b"))
    );
    h.beat(piece, true, min + 800, None).await.unwrap();
    let listed = s.split_candidates().await.unwrap();
    let parts: Vec<(u64, Part, u64, u64)> = listed
        .iter()
        .filter(|r| r.pid == pid)
        .map(|r| (r.pid, r.part, r.progress, r.max_id))
        .collect();
    assert_eq!(
        parts,
        vec![
            (pid, Part::Owner, min + 200, min + 699),
            (pid, Part::Piece(min + 700), min + 800, min + 999)
        ]
    );
    assert!(
        listed
            .iter()
            .all(|r| r.owner == "a" && r.partition_max == min + 999)
    );
}

/// An owner already past the limit (the piece would be under the minimum) drops the
/// request: no cut, and the partition may be asked again.
async fn an_owner_past_the_limit_drops_the_request(h: Harness) {
    let s = &h.store;
    let lease = h.running("a").await;
    let min = lease.min_id;
    let part = h.candidate(lease.pid, Part::Owner).await;
    s.request_split(&part, "b", 100).await.unwrap();
    // Limit: min + 900 (the piece keeps 100 IDs); the owner handed out up to min + 950.
    assert_eq!(
        h.beat(&lease, false, min + 10, Some(min + 951))
            .await
            .unwrap(),
        Beat::Renewed
    );
    assert!(s.pieces(lease.pid).await.unwrap().is_empty());
    assert_eq!(s.get(lease.pid).await.unwrap().unwrap().max_id, min + 999);
    let part = h.candidate(lease.pid, Part::Owner).await;
    assert!(matches!(
        s.request_split(&part, "b", 100).await.unwrap(),
        SplitAnswer::Requested { .. }
    ));
    // Its completion is the ordinary one.
    assert_eq!(s.complete(&lease, 5).await.unwrap(), Completion::Completed);
    let inbox = h.inbox().await;
    assert_eq!(inbox.len(), 1);
    assert_eq!((inbox[0].min_id, inbox[0].max_id), (min, min + 999));
}

/// The owner finishes first: its completion only ends its lease (the partition stays
/// running, nothing in the inbox); the last piece completes the partition with one
/// record of its whole range, its owner, from its first claim; a second completion is
/// refused.
async fn the_last_piece_completes_the_partition_once(h: Harness) {
    let s = &h.store;
    let lease = h.running("a").await;
    let (pid, min) = (lease.pid, lease.min_id);
    s.request_split(&h.candidate(pid, Part::Owner).await, "b", 100)
        .await
        .unwrap();
    h.beat(&lease, false, min + 100, Some(min + 200))
        .await
        .unwrap();
    let piece = s.claim_pieces("b", 1).await.unwrap().remove(0);
    assert_eq!(piece.min_id, min + 500);
    h.clock.advance(2_000);
    assert_eq!(
        s.complete(&lease, 2_000).await.unwrap(),
        Completion::PartDone
    );
    assert!(h.inbox().await.is_empty(), "a piece is outstanding");
    let p = s.get(pid).await.unwrap().unwrap();
    assert_eq!((p.status, p.lease_token), (Status::Running, None));
    let counts = s.counts().await.unwrap();
    assert_eq!((counts.running, counts.outstanding()), (1, 8));
    assert!(
        lost(h.beat(&lease, false, min + 500, None).await),
        "its lease ended"
    );
    assert!(
        s.split_candidates()
            .await
            .unwrap()
            .iter()
            .all(|r| r.part != Part::Owner || r.pid != pid),
        "the done owner part is no candidate"
    );
    h.clock.advance(3_000);
    assert_eq!(
        s.complete_piece(&piece).await.unwrap(),
        PieceDone::Completed
    );
    let inbox = h.inbox().await;
    assert_eq!(inbox.len(), 1, "counted once");
    let r = &inbox[0];
    assert_eq!(
        (r.pid, r.min_id, r.max_id, &*r.worker),
        (pid, min, min + 999, "a")
    );
    assert_eq!(r.completed_at_ms, T0 + 5_000);
    assert_eq!(r.duration_ms, 5_000, "from the first claim to the last end");
    assert!(s.get(pid).await.unwrap().is_none());
    assert!(s.pieces(pid).await.unwrap().is_empty());
    assert_eq!(s.counts().await.unwrap().running, 0);
    assert!(lost(s.complete_piece(&piece).await));
    assert_eq!(s.complete(&lease, 1).await.unwrap(), Completion::Duplicate);
    assert_eq!(h.inbox().await.len(), 1);
}

/// The pieces finish first: the owner's completion is then the last, and its record
/// spans the whole partition.
async fn an_owner_done_last_completes_the_whole_range(h: Harness) {
    let s = &h.store;
    let lease = h.running("a").await;
    let (pid, min) = (lease.pid, lease.min_id);
    s.request_split(&h.candidate(pid, Part::Owner).await, "b", 100)
        .await
        .unwrap();
    h.beat(&lease, false, min, Some(min + 1)).await.unwrap();
    let piece = s.claim_pieces("b", 1).await.unwrap().remove(0);
    assert_eq!(s.complete_piece(&piece).await.unwrap(), PieceDone::Done);
    assert!(h.inbox().await.is_empty());
    assert_eq!(s.counts().await.unwrap().running, 1);
    h.clock.advance(1_500);
    assert_eq!(
        s.complete(&lease, 1_500).await.unwrap(),
        Completion::Completed
    );
    let inbox = h.inbox().await;
    assert_eq!(inbox.len(), 1);
    let r = &inbox[0];
    assert_eq!(
        (r.min_id, r.max_id, &*r.worker, r.duration_ms),
        (min, min + 999, "a", 1_500)
    );
    assert_eq!(s.counts().await.unwrap().outstanding(), 7);
}

/// A piece whose holder stops beating is pending again after its lease, from its
/// checkpoint; the next holder gets a new token and the old one is refused.
async fn an_expired_piece_is_reclaimed_from_its_checkpoint(h: Harness) {
    let s = &h.store;
    let lease = h.running("a").await;
    let (pid, min) = (lease.pid, lease.min_id);
    s.request_split(&h.candidate(pid, Part::Owner).await, "b", 100)
        .await
        .unwrap();
    h.beat(&lease, false, min, Some(min + 1)).await.unwrap();
    let piece = s.claim_pieces("b", 1).await.unwrap().remove(0);
    h.beat(&piece, true, min + 600, None).await.unwrap();
    h.clock.advance(LEASE.as_millis() as u64 / 2);
    h.beat(&lease, false, min + 10, None).await.unwrap();
    h.clock.advance(LEASE.as_millis() as u64 / 2 + 1);
    let reaped = s.reap(h.clock.now_ms()).await.unwrap();
    assert!(reaped.is_empty(), "the owner renewed: {reaped:?}");
    let pieces = s.pieces(pid).await.unwrap();
    assert_eq!(
        (pieces[0].status, pieces[0].progress),
        (Status::Pending, min + 600)
    );
    let again = s.claim_pieces("c", 1).await.unwrap().remove(0);
    assert_eq!(
        (again.min_id, again.progress, again.attempt),
        (min + 500, min + 600, 2)
    );
    assert!(lost(h.beat(&piece, true, min + 700, None).await));
    assert!(lost(s.complete_piece(&piece).await));
    assert!(lost(s.release_piece(&piece, min + 700).await));
    // Released by its holder: pending at once, checkpoint kept, attempt given back.
    s.release_piece(&again, min + 650).await.unwrap();
    let third = s.claim_pieces("d", 1).await.unwrap().remove(0);
    assert_eq!((third.progress, third.attempt), (min + 650, 2));
    assert_eq!(s.complete_piece(&third).await.unwrap(), PieceDone::Done);
    assert_eq!(s.complete(&lease, 1).await.unwrap(), Completion::Completed);
    assert_eq!(h.inbox().await.len(), 1);
}

/// The owner dies with a request waiting: nothing is cut, its lease expires and is
/// reaped, and the next owner, resuming from the checkpoint, serves the request in its
/// first beat. The dead owner's late beat is refused and cuts nothing.
async fn a_split_racing_an_expiry_is_served_by_the_next_owner(h: Harness) {
    let s = &h.store;
    let lease = h.running("a").await;
    let (pid, min) = (lease.pid, lease.min_id);
    h.beat(&lease, false, min + 300, None).await.unwrap();
    s.request_split(&h.candidate(pid, Part::Owner).await, "b", 100)
        .await
        .unwrap();
    h.clock.advance(LEASE.as_millis() as u64 + 1);
    assert_eq!(s.reap(h.clock.now_ms()).await.unwrap(), vec![pid]);
    assert!(lost(
        h.beat(&lease, false, min + 400, Some(min + 400)).await
    ));
    assert!(
        s.pieces(pid).await.unwrap().is_empty(),
        "a lost beat cuts nothing"
    );
    let next = s.claim("c", 1).await.unwrap().remove(0);
    assert_eq!(
        (next.pid, next.progress, next.max_id),
        (pid, min + 300, min + 999)
    );
    // The request waited less than a lease ago? It was made before the expiry: it
    // stands until served or replaced.
    assert_eq!(
        h.beat(&next, false, min + 300, Some(min + 320))
            .await
            .unwrap(),
        Beat::Cut { last: min + 649 },
        "cut at the requested point"
    );
    let piece = s.claim_pieces("b", 1).await.unwrap().remove(0);
    assert_eq!(piece.min_id, min + 650);
    assert_eq!(s.complete_piece(&piece).await.unwrap(), PieceDone::Done);
    assert_eq!(s.complete(&next, 1).await.unwrap(), Completion::Completed);
    let inbox = h.inbox().await;
    assert_eq!(inbox.len(), 1);
    assert_eq!(
        (inbox[0].min_id, inbox[0].max_id, &*inbox[0].worker),
        (min, min + 999, "a")
    );
    assert_eq!(
        s.complete(&lease, 1).await.unwrap(),
        Completion::Duplicate,
        "the dead owner's late completion changes nothing"
    );
    assert_eq!(h.inbox().await.len(), 1);
}

/// A piece is split by the same protocol: its holder cuts in its own beat, and the
/// partition completes once all three parts are done, whatever the order.
async fn a_piece_splits_in_turn(h: Harness) {
    let s = &h.store;
    let lease = h.running("a").await;
    let (pid, min) = (lease.pid, lease.min_id);
    s.request_split(&h.candidate(pid, Part::Owner).await, "b", 100)
        .await
        .unwrap();
    h.beat(&lease, false, min, Some(min + 1)).await.unwrap();
    let piece = s.claim_pieces("b", 1).await.unwrap().remove(0);
    assert_eq!((piece.min_id, piece.max_id), (min + 500, min + 999));
    h.beat(&piece, true, min + 500, None).await.unwrap();
    let part = h.candidate(pid, Part::Piece(min + 500)).await;
    assert_eq!(
        s.request_split(&part, "c", 100).await.unwrap(),
        SplitAnswer::Requested { point: min + 750 }
    );
    // Only the piece's holder serves it: the owner's beat cuts nothing.
    assert_eq!(
        h.beat(&lease, false, min, Some(min + 2)).await.unwrap(),
        Beat::Renewed
    );
    assert_eq!(
        h.beat(&piece, true, min + 520, Some(min + 540))
            .await
            .unwrap(),
        Beat::Cut { last: min + 749 }
    );
    let second = s.claim_pieces("c", 1).await.unwrap().remove(0);
    assert_eq!((second.min_id, second.max_id), (min + 750, min + 999));
    assert_eq!(s.pieces(pid).await.unwrap().len(), 2);
    assert_eq!(s.complete_piece(&second).await.unwrap(), PieceDone::Done);
    assert_eq!(s.complete(&lease, 1).await.unwrap(), Completion::PartDone);
    assert!(h.inbox().await.is_empty());
    assert_eq!(
        s.complete_piece(&piece).await.unwrap(),
        PieceDone::Completed
    );
    let inbox = h.inbox().await;
    assert_eq!(inbox.len(), 1);
    assert_eq!((inbox[0].min_id, inbox[0].max_id), (min, min + 999));
    assert_eq!(s.counts().await.unwrap().outstanding(), 7);
}

/// Cuts `lease`'s partition at its midpoint (its owner at its first ID) and claims the
/// piece for `worker`: the piece is `min + 500..=min + 999`.
async fn split_off(h: &Harness, lease: &Lease, worker: &str) -> Lease {
    h.store
        .request_split(&h.candidate(lease.pid, Part::Owner).await, worker, 100)
        .await
        .unwrap();
    h.beat(lease, false, lease.min_id, Some(lease.min_id + 1))
        .await
        .unwrap();
    let piece = h.store.claim_pieces(worker, 1).await.unwrap().remove(0);
    assert_eq!(
        (piece.min_id, piece.max_id),
        (lease.min_id + 500, lease.min_id + 999)
    );
    piece
}

/// A failed piece is pending again from its checkpoint once the partition's backoff
/// (or the handler's delay) is over, its attempt spent; on its last attempt the
/// partition fails: whole again, from its lowest unfinished ID (here the owner's),
/// every other lease on it lost, counted failed once. A retry then redoes it whole,
/// and it completes once.
async fn a_failed_piece_spends_attempts_then_fails_its_partition(h: Harness) {
    let s = &h.store;
    let lease = h.running("a").await;
    let (pid, min) = (lease.pid, lease.min_id);
    let piece = split_off(&h, &lease, "b").await;
    h.beat(&piece, true, min + 600, None).await.unwrap();
    let backoff = h.config.backoff(1).as_millis() as u64;
    assert_eq!(
        s.fail_piece(&piece, min + 620, "boom", FailPolicy::default())
            .await
            .unwrap(),
        FailOutcome::Retry {
            ready_at_ms: T0 + backoff
        }
    );
    let listed = s.pieces(pid).await.unwrap();
    assert_eq!(
        (listed[0].status, listed[0].progress, listed[0].attempts),
        (Status::Pending, min + 620, 1),
        "the attempt is spent"
    );
    assert!(lost(
        s.fail_piece(&piece, min + 620, "again", FailPolicy::default())
            .await
    ));
    assert!(
        s.claim_pieces("c", 1).await.unwrap().is_empty(),
        "in its backoff"
    );
    h.clock.advance(backoff);
    let second = s.claim_pieces("c", 1).await.unwrap().remove(0);
    assert_eq!((second.progress, second.attempt), (min + 620, 2));
    // The handler's own delay replaces the backoff.
    let delay = FailPolicy {
        retry_after: Some(Duration::from_millis(70)),
        ..FailPolicy::default()
    };
    assert_eq!(
        s.fail_piece(&second, min + 610, "slow down", delay)
            .await
            .unwrap(),
        FailOutcome::Retry {
            ready_at_ms: h.clock.now_ms() + 70
        }
    );
    h.clock.advance(70);
    let third = s.claim_pieces("c", 1).await.unwrap().remove(0);
    assert_eq!(
        (third.progress, third.attempt),
        (min + 620, 3),
        "a checkpoint never moves back"
    );
    h.beat(&lease, false, min + 300, None).await.unwrap();
    assert_eq!(s.counts().await.unwrap().running, 1);

    assert_eq!(
        s.fail_piece(&third, min + 640, "boom 3", FailPolicy::default())
            .await
            .unwrap(),
        FailOutcome::Failed
    );
    let p = s.get(pid).await.unwrap().unwrap();
    assert_eq!(
        (p.status, p.min_id, p.max_id, p.progress),
        (Status::Failed, min, min + 999, min + 300),
        "whole again, from the owner's checkpoint"
    );
    assert_eq!(p.last_error.as_deref(), Some("boom 3"));
    assert!(s.pieces(pid).await.unwrap().is_empty());
    let counts = s.counts().await.unwrap();
    assert_eq!(
        (counts.failed, counts.running, counts.outstanding()),
        (1, 0, 7)
    );
    assert!(
        s.split_candidates().await.unwrap().is_empty(),
        "nothing of it runs"
    );
    assert!(
        lost(h.beat(&lease, false, min + 400, Some(min + 401)).await),
        "the owner's lease is lost"
    );
    assert!(lost(s.complete(&lease, 1).await));
    assert!(lost(s.complete_piece(&third).await));
    assert!(h.inbox().await.is_empty());

    assert_eq!(s.retry_failed(Some(pid)).await.unwrap(), vec![pid]);
    let again = s
        .claim("d", 8)
        .await
        .unwrap()
        .into_iter()
        .find(|l| l.pid == pid)
        .expect("the retried partition is claimed");
    assert_eq!(
        (again.min_id, again.max_id, again.progress, again.attempt),
        (min, min + 999, min + 300, 1)
    );
    assert_eq!(s.complete(&again, 1).await.unwrap(), Completion::Completed);
    let inbox = h.inbox().await;
    assert_eq!(inbox.len(), 1);
    assert_eq!(
        (inbox[0].pid, inbox[0].min_id, inbox[0].max_id),
        (pid, min, min + 999)
    );
}

/// A permanent failure fails the partition on the piece's first attempt. Its owner part
/// is done and another piece runs: the partition is failed from the lowest of the
/// pieces' checkpoints, and the other piece's holder has lost its lease.
async fn a_permanent_piece_failure_fails_the_partition_at_once(h: Harness) {
    let s = &h.store;
    let lease = h.running("a").await;
    let (pid, min) = (lease.pid, lease.min_id);
    let piece = split_off(&h, &lease, "b").await;
    h.beat(&piece, true, min + 500, None).await.unwrap();
    s.request_split(&h.candidate(pid, Part::Piece(min + 500)).await, "c", 100)
        .await
        .unwrap();
    assert_eq!(
        h.beat(&piece, true, min + 560, Some(min + 570))
            .await
            .unwrap(),
        Beat::Cut { last: min + 749 }
    );
    let second = s.claim_pieces("c", 1).await.unwrap().remove(0);
    assert_eq!(second.min_id, min + 750);
    assert_eq!(s.complete(&lease, 1).await.unwrap(), Completion::PartDone);
    let permanent = FailPolicy {
        permanent: true,
        ..FailPolicy::default()
    };
    assert_eq!(
        s.fail_piece(&second, min + 800, "no such index", permanent)
            .await
            .unwrap(),
        FailOutcome::Failed
    );
    let p = s.get(pid).await.unwrap().unwrap();
    assert_eq!(
        (p.status, p.min_id, p.max_id, p.progress),
        (Status::Failed, min, min + 999, min + 560)
    );
    assert_eq!(p.last_error.as_deref(), Some("no such index"));
    assert!(s.pieces(pid).await.unwrap().is_empty());
    assert!(lost(h.beat(&piece, true, min + 600, None).await));
    assert!(lost(s.complete_piece(&piece).await));
    assert!(lost(
        s.fail_piece(&piece, min + 600, "late", FailPolicy::default())
            .await
    ));
    let counts = s.counts().await.unwrap();
    assert_eq!((counts.failed, counts.running), (1, 0));
    assert!(h.inbox().await.is_empty());
}

/// A piece whose worker is gone (`release_worker`) or whose lease expired (`reap`) is
/// pending again with its attempt counted, the owner's lease untouched; expiring on its
/// last attempt it fails its partition, as a partition's lease would.
async fn a_piece_expiring_on_its_last_attempt_fails_its_partition(h: Harness) {
    let s = &h.store;
    let lease = h.running("a").await;
    let (pid, min) = (lease.pid, lease.min_id);
    let piece = split_off(&h, &lease, "b").await;
    h.beat(&piece, true, min + 600, None).await.unwrap();
    assert_eq!(s.release_worker("b").await.unwrap(), vec![pid]);
    assert!(lost(h.beat(&piece, true, min + 650, None).await));
    h.beat(&lease, false, min + 100, None).await.unwrap();
    let listed = s.pieces(pid).await.unwrap();
    assert_eq!(
        (listed[0].status, listed[0].progress, listed[0].attempts),
        (Status::Pending, min + 600, 1)
    );
    let second = s.claim_pieces("b", 1).await.unwrap().remove(0);
    assert_eq!(second.attempt, 2);
    let half = LEASE.as_millis() as u64 / 2;
    h.clock.advance(half);
    h.beat(&lease, false, min + 200, None).await.unwrap();
    h.clock.advance(half + 1);
    assert!(s.reap(h.clock.now_ms()).await.unwrap().is_empty());
    let third = s.claim_pieces("c", 1).await.unwrap().remove(0);
    assert_eq!((third.attempt, third.progress), (3, min + 600));
    h.clock.advance(half);
    h.beat(&lease, false, min + 300, None).await.unwrap();
    h.clock.advance(half + 1);
    assert!(s.reap(h.clock.now_ms()).await.unwrap().is_empty());
    let p = s.get(pid).await.unwrap().unwrap();
    assert_eq!(
        (p.status, p.min_id, p.max_id, p.progress),
        (Status::Failed, min, min + 999, min + 300)
    );
    let why = p.last_error.unwrap();
    assert!(
        why.contains(&format!("piece from {}", min + 500)) && why.contains("attempt 3 of 3"),
        "{why}"
    );
    assert!(s.pieces(pid).await.unwrap().is_empty());
    assert!(lost(h.beat(&lease, false, min + 300, None).await));
    let counts = s.counts().await.unwrap();
    assert_eq!((counts.failed, counts.running), (1, 0));
}

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
