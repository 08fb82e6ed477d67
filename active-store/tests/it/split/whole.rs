//! Issue 37's holes in the protocol: a cut whose reply is lost, and an owner part that
//! fails for good (or is discarded) with pieces out.

use super::*;

/// The beat that cut the owner's range gets no answer (a response timeout, a dropped
/// connection): the same beat sent again finds no request left, renews, and still
/// answers where the range now ends, as does every later beat, with or without a
/// frontier. The cut is made once.
pub(super) async fn a_retried_beat_after_a_lost_reply_answers_the_cut_end(h: Harness) {
    let s = &h.store;
    let lease = h.running("a").await;
    let (pid, min) = (lease.pid, lease.min_id);
    s.request_split(&h.candidate(pid, Part::Owner).await, "b", 100)
        .await
        .unwrap();
    // This reply is lost on its way back.
    let lost_reply = h.beat(&lease, false, min + 100, Some(min + 200)).await;
    assert_eq!(lost_reply.unwrap(), Beat::Cut { last: min + 499 });
    // The retry, as `invoke` sends it: the same beat.
    assert_eq!(
        h.beat(&lease, false, min + 100, Some(min + 200))
            .await
            .unwrap(),
        Beat::Renewed { last: min + 499 },
        "the retried beat tells the owner where its range now ends"
    );
    assert_eq!(s.pieces(pid).await.unwrap().len(), 1, "cut once");
    h.clock.advance(1_000);
    let later = h.beat(&lease, false, min + 150, None).await.unwrap();
    assert_eq!(later, Beat::Renewed { last: min + 499 });
    assert_eq!(later.last(), min + 499);
    // An uncut lease answers its own end.
    let other = h.running("c").await;
    assert_eq!(
        h.beat(&other, false, other.min_id + 10, Some(other.min_id + 20))
            .await
            .unwrap(),
        Beat::Renewed { last: other.max_id }
    );
    // A piece's beats answer its end too, before and after it is cut in turn.
    let piece = s.claim_pieces("b", 1).await.unwrap().remove(0);
    assert_eq!(
        h.beat(&piece, true, min + 500, None).await.unwrap(),
        Beat::Renewed { last: min + 999 }
    );
    s.request_split(&h.candidate(pid, Part::Piece(min + 500)).await, "d", 100)
        .await
        .unwrap();
    assert_eq!(
        h.beat(&piece, true, min + 520, Some(min + 540))
            .await
            .unwrap(),
        Beat::Cut { last: min + 749 }
    );
    assert_eq!(
        h.beat(&piece, true, min + 520, Some(min + 540))
            .await
            .unwrap(),
        Beat::Renewed { last: min + 749 },
        "the piece's retried beat too"
    );
    assert_eq!(s.pieces(pid).await.unwrap().len(), 2, "cut once");
}

/// Asserts `pid` is whole again after its owner part failed for good or was discarded:
/// its record spans `min..=min + 999` from `from`, in `status`, no piece left or
/// claimable, no part of it a candidate, every piece lease in `held` lost.
async fn whole_again(h: &Harness, pid: u64, min: u64, from: u64, status: Status, held: &[Lease]) {
    let s = &h.store;
    let p = s.get(pid).await.unwrap().unwrap();
    assert_eq!(
        (p.status, p.min_id, p.max_id, p.progress),
        (status, min, min + 999, from),
        "whole again"
    );
    assert!(s.pieces(pid).await.unwrap().is_empty(), "its pieces went");
    assert!(
        s.claim_pieces("z", 8).await.unwrap().is_empty(),
        "no piece of it is claimable"
    );
    assert!(
        s.split_candidates()
            .await
            .unwrap()
            .iter()
            .all(|r| r.pid != pid),
        "nothing of it runs"
    );
    for piece in held {
        assert!(lost(h.beat(piece, true, piece.min_id + 5, None).await));
        assert!(lost(s.complete_piece(piece).await), "a fenced piece");
        assert!(lost(
            s.fail_piece(piece, piece.min_id + 5, "late", FailPolicy::default())
                .await
        ));
    }
    assert!(h.inbox().await.is_empty(), "never completed");
}

/// Cuts `lease`'s partition into three (its owner keeps `min..=min + 239`) and claims
/// and beats the middle piece for `worker`: the last piece stays pending.
async fn three_parts(h: &Harness, lease: &Lease, worker: &str) -> Lease {
    let (pid, min) = (lease.pid, lease.min_id);
    let owner = h.candidate(pid, Part::Owner).await;
    let cuts = [(min + 240, min + 380), (min + 480, min + 620)];
    h.store.request_pieces(&owner, worker, &cuts).await.unwrap();
    assert_eq!(
        h.beat(lease, false, min + 100, Some(min + 120))
            .await
            .unwrap(),
        Beat::Cut { last: min + 239 }
    );
    let piece = h.store.claim_pieces(worker, 1).await.unwrap().remove(0);
    assert_eq!((piece.min_id, piece.max_id), (min + 240, min + 479));
    h.beat(&piece, true, min + 300, None).await.unwrap();
    assert_eq!(h.store.pieces(pid).await.unwrap().len(), 2);
    piece
}

/// The owner's last attempt fails (here a permanent failure on its first) with one
/// piece running and one pending: the partition fails whole again from the owner's
/// checkpoint, its pieces cancelled and the running one fenced; a retry redoes the
/// whole range and completes it once.
pub(super) async fn an_owner_failing_for_good_makes_its_partition_whole(h: Harness) {
    let s = &h.store;
    let lease = h.running("a").await;
    let (pid, min) = (lease.pid, lease.min_id);
    let piece = three_parts(&h, &lease, "b").await;
    h.beat(&lease, false, min + 150, None).await.unwrap();
    let permanent = FailPolicy {
        permanent: true,
        ..FailPolicy::default()
    };
    assert_eq!(
        s.fail_with(&lease, "no such table", permanent)
            .await
            .unwrap(),
        FailOutcome::Failed
    );
    whole_again(&h, pid, min, min + 150, Status::Failed, &[piece]).await;
    let p = s.get(pid).await.unwrap().unwrap();
    assert_eq!(p.last_error.as_deref(), Some("no such table"));
    let counts = s.counts().await.unwrap();
    assert_eq!(
        (counts.failed, counts.running, counts.outstanding()),
        (1, 0, 7)
    );

    assert_eq!(s.retry_failed(Some(pid)).await.unwrap(), vec![pid]);
    let again = s
        .claim("d", 8)
        .await
        .unwrap()
        .into_iter()
        .find(|l| l.pid == pid)
        .expect("the retried partition is claimed");
    assert_eq!(
        (again.min_id, again.max_id, again.progress),
        (min, min + 999, min + 150)
    );
    assert_eq!(s.complete(&again, 1).await.unwrap(), Completion::Completed);
    let inbox = h.inbox().await;
    assert_eq!(inbox.len(), 1);
    assert_eq!((inbox[0].min_id, inbox[0].max_id), (min, min + 999));
}

/// The owner's lease expires on its last attempt with pieces out: the reaper fails the
/// partition whole again, as a failed chunk would.
pub(super) async fn an_owner_expiring_on_its_last_attempt_makes_its_partition_whole(h: Harness) {
    let s = &h.store;
    let lease = h.running("a").await;
    let (pid, min) = (lease.pid, lease.min_id);
    let piece = three_parts(&h, &lease, "b").await;
    let lease_ms = LEASE.as_millis() as u64;
    let mut owner = lease;
    for attempt in 2..=3 {
        // The piece's holder beats on; the owner's does not.
        h.clock.advance(lease_ms / 2);
        h.beat(&piece, true, min + 300, None).await.unwrap();
        h.clock.advance(lease_ms / 2 + 1);
        assert_eq!(s.reap(h.clock.now_ms()).await.unwrap(), vec![pid]);
        owner = s.claim("a", 1).await.unwrap().remove(0);
        assert_eq!(
            (owner.pid, owner.attempt, owner.max_id),
            (pid, attempt, min + 239)
        );
        h.beat(&owner, false, min + 100 + u64::from(attempt), None)
            .await
            .unwrap();
    }
    h.clock.advance(lease_ms / 2);
    h.beat(&piece, true, min + 300, None).await.unwrap();
    h.clock.advance(lease_ms / 2 + 1);
    assert!(s.reap(h.clock.now_ms()).await.unwrap().is_empty());
    whole_again(&h, pid, min, min + 103, Status::Failed, &[piece]).await;
    let why = s.get(pid).await.unwrap().unwrap().last_error.unwrap();
    assert!(why.contains("attempt 3 of 3"), "{why}");
    assert!(lost(h.beat(&owner, false, min + 200, None).await));
    let counts = s.counts().await.unwrap();
    assert_eq!((counts.failed, counts.running, counts.pending), (1, 0, 0));
}

/// An operator discards a partition whose owner part is pending again (released) while
/// one piece runs and another waits: discarded whole, its pieces cancelled and the
/// running one fenced, so nothing of it is ever claimed or completed.
pub(super) async fn a_discard_with_pieces_out_makes_the_partition_whole(h: Harness) {
    let s = &h.store;
    let lease = h.running("a").await;
    let (pid, min) = (lease.pid, lease.min_id);
    let piece = three_parts(&h, &lease, "b").await;
    s.release(&lease, min + 130).await.unwrap();
    assert!(s.discard(pid).await.unwrap());
    whole_again(&h, pid, min, min + 130, Status::Discarded, &[piece]).await;
    assert!(
        s.claim("c", 8).await.unwrap().iter().all(|l| l.pid != pid),
        "the discarded owner part is never claimed"
    );
    let counts = s.counts().await.unwrap();
    assert_eq!(
        (counts.discarded, counts.pending, counts.running),
        (1, 0, 0)
    );
    assert!(!s.discard(pid).await.unwrap(), "discarded once");
}

/// Deadlines stay on the callers' clocks (`src/split.rs`, "Clocks"), so a process can
/// tell how far off its clock is from the server's, the reading every process shares:
/// ahead, behind or level, within a round trip.
#[tokio::test]
async fn a_store_measures_its_clock_against_the_servers() {
    let server = TestRedis::start();
    let conn = RedisConnection::connect(&server.url()).await.unwrap();
    for offset in [-10_000i64, 0, 10_000] {
        let at = server.time_ms().checked_add_signed(offset).unwrap();
        let clock = Arc::new(ManualClock::new(at));
        let store = RedisActiveStore::with_clock(conn.clone(), Config::default(), clock).unwrap();
        let skew = store.clock_skew_ms().await.unwrap();
        assert!((skew - offset).abs() < 1_000, "{offset} ms off: {skew}");
    }
}
