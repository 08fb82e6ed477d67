//! How the parts of a split partition end: completed once by its last part, reclaimed
//! from a checkpoint on expiry, split again, and failed for good by a piece's last
//! attempt.

use super::*;

/// The owner finishes first: its completion only ends its lease (the partition stays
/// running, nothing in the inbox); the last piece completes the partition with one
/// record of its whole range, its owner, from its first claim; a second completion is
/// refused.
pub(super) async fn the_last_piece_completes_the_partition_once(h: Harness) {
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
pub(super) async fn an_owner_done_last_completes_the_whole_range(h: Harness) {
    let s = &h.store;
    let (lease, piece) = h.split_at_once().await;
    let min = lease.min_id;
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
pub(super) async fn an_expired_piece_is_reclaimed_from_its_checkpoint(h: Harness) {
    let s = &h.store;
    let (lease, piece) = h.split_at_once().await;
    let (pid, min) = (lease.pid, lease.min_id);
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
pub(super) async fn a_split_racing_an_expiry_is_served_by_the_next_owner(h: Harness) {
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
pub(super) async fn a_piece_splits_in_turn(h: Harness) {
    let s = &h.store;
    let (lease, piece) = h.split_at_once().await;
    let (pid, min) = (lease.pid, lease.min_id);
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
        Beat::Renewed { last: min + 499 }
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
pub(super) async fn split_off(h: &Harness, lease: &Lease, worker: &str) -> Lease {
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
pub(super) async fn a_failed_piece_spends_attempts_then_fails_its_partition(h: Harness) {
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
pub(super) async fn a_permanent_piece_failure_fails_the_partition_at_once(h: Harness) {
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
pub(super) async fn a_piece_expiring_on_its_last_attempt_fails_its_partition(h: Harness) {
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

/// A cut its owner was told of, then lost (a failover to a replica that had not seen
/// it): the owner stops at the cut and completes, while the store holds the partition
/// whole and no piece holds its tail. The completion must not count the partition
/// done: it is pending again past the cut, and whoever claims it finishes the tail; its
/// one record spans the whole range.
pub(super) async fn a_cut_lost_in_a_failover_cannot_skip_the_tail(mut h: Harness) {
    let lease = h.running("a").await;
    let (pid, min) = (lease.pid, lease.min_id);
    let saved = h.save().await;
    h.store
        .request_split(&h.candidate(pid, Part::Owner).await, "b", 100)
        .await
        .unwrap();
    let beat = h.beat(&lease, false, min + 100, Some(min + 200)).await;
    let Ok(Beat::Cut { last }) = beat else {
        panic!("not cut: {beat:?}")
    };
    h.failover(saved).await;
    let s = &h.store;
    assert!(s.pieces(pid).await.unwrap().is_empty(), "the cut is lost");
    let told = Lease {
        max_id: last,
        ..lease.clone()
    };
    h.clock.advance(1_000);
    assert_eq!(
        s.complete(&told, 1_000).await.unwrap(),
        Completion::PartDone,
        "the tail is not done"
    );
    assert!(h.inbox().await.is_empty(), "not completed");
    let p = s.get(pid).await.unwrap().unwrap();
    assert_eq!(
        (p.status, p.progress, p.max_id),
        (Status::Pending, last + 1, min + 999)
    );
    let counts = s.counts().await.unwrap();
    assert_eq!(
        (counts.claimed, counts.running, counts.outstanding()),
        (0, 0, 8)
    );
    let again = s.claim("c", 8).await.unwrap();
    let tail = again.iter().find(|l| l.pid == pid).expect("claimable");
    assert_eq!(
        (tail.progress, tail.max_id, tail.attempt),
        (last + 1, min + 999, 1)
    );
    assert_eq!(s.complete(tail, 500).await.unwrap(), Completion::Completed);
    let inbox = h.inbox().await;
    assert_eq!(inbox.len(), 1);
    assert_eq!((inbox[0].min_id, inbox[0].max_id), (min, min + 999));
}
