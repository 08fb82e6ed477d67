//! Split requests and cuts: who may ask, in which order a backend refuses, and where
//! the owner cuts its range.

use super::*;

/// Not running, then busy, then too small, on every backend, and a refused request
/// leaves nothing a later one would trip on.
pub(super) async fn every_backend_refuses_in_one_order(h: Harness) {
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
pub(super) async fn a_request_never_outlives_its_piece(h: Harness) {
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
    assert_eq!(out[0].as_ref().unwrap(), &Beat::Renewed { last: min + 749 });
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
pub(super) async fn one_beat_cuts_as_many_pieces_as_asked(h: Harness) {
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
pub(super) async fn a_request_needs_a_running_part_and_room(h: Harness) {
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
pub(super) async fn the_owner_cuts_past_its_frontier_in_its_own_beat(h: Harness) {
    let s = &h.store;
    let lease = h.running("a").await;
    let (pid, min) = (lease.pid, lease.min_id);
    let part = h.candidate(pid, Part::Owner).await;
    let answer = s.request_split(&part, "b", 100).await.unwrap();
    assert_eq!(answer, SplitAnswer::Requested { point: min + 500 });
    // A beat without `next` does not cut: the holder does not split.
    assert_eq!(
        h.beat(&lease, false, min + 50, None).await.unwrap(),
        Beat::Renewed { last: min + 999 }
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
    // The next beat renews only, and says where the range ends now.
    assert_eq!(
        h.beat(&lease, false, min + 200, Some(min + 710))
            .await
            .unwrap(),
        Beat::Renewed { last: min + 699 }
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
pub(super) async fn an_owner_past_the_limit_drops_the_request(h: Harness) {
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
        Beat::Renewed { last: min + 999 }
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
