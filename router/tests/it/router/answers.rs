//! What `get`, `locate` and `range` answer: each layer in turn, range edges, a plan
//! added late, every pid once and in order.

use super::*;

pub(super) fn archived(view: &PartitionView) -> (u64, Tier) {
    match view {
        PartitionView::Archived { record, tier } => (record.pid, *tier),
        other => panic!("expected an archived record, got {other:?}"),
    }
}

pub(super) async fn get_answers_from_each_layer_in_turn(kind: Kind) {
    // One shard: claims come in pid order, so pids 1..=200 are claimed.
    let job = Job::new(kind, 1, 200, Tier::Simple).await;
    job.complete(1..=150).await;
    job.archive().await;
    job.complete(151..=160).await; // Completed, archiver not run yet.

    // Unissued: planned, never claimed, pending with no attempts.
    match job.router.get(250).await.unwrap() {
        PartitionView::Active(p) => {
            assert_eq!((p.pid, p.min_id, p.max_id), (250, 24_901, 25_000));
            assert_eq!((p.status, p.attempts), (Status::Pending, 0));
        }
        other => panic!("{other:?}"),
    }
    // Claimed.
    match job.router.get(200).await.unwrap() {
        PartitionView::Active(p) => {
            assert_eq!(p.status, Status::Claimed);
            assert_eq!(p.worker.as_deref(), Some("w1"));
        }
        other => panic!("{other:?}"),
    }
    // Archived: the record exactly as completed.
    match job.router.get(42).await.unwrap() {
        PartitionView::Archived { record, tier } => {
            assert_eq!(tier, Tier::Simple);
            let lease = &job.leases[&42];
            let expected = lease.completed(record.completed_at_ms, 42);
            assert_eq!(record, expected);
            assert_eq!((record.min_id, record.max_id), (4101, 4200));
        }
        other => panic!("{other:?}"),
    }
    // Completed, not archived yet: archiving, never unknown.
    for pid in 151..=160 {
        let view = job.router.get(pid).await.unwrap();
        let range = (pid - 1) * 100 + 1..=pid * 100;
        assert_eq!(view, PartitionView::Archiving { pid, range }, "pid {pid}");
        assert!(view.is_completed());
    }
    // Not planned.
    for pid in [0, 301, u64::MAX] {
        assert_eq!(job.router.get(pid).await.unwrap(), PartitionView::Unknown);
    }

    // Once the archiver runs, archiving turns into archived.
    job.archive().await;
    assert_eq!(
        archived(&job.router.get(155).await.unwrap()),
        (155, Tier::Simple)
    );
}

pub(super) async fn locate_finds_the_partition_at_range_edges(kind: Kind) {
    let job = Job::new(kind, 1, 10, Tier::Simple).await;
    job.complete([1, 2]).await;
    job.archive().await;
    let cases = [
        (1, 1),
        (100, 1),
        (101, 2),
        (200, 2),
        (201, 3),
        (30_000, 300),
    ];
    for (id, pid) in cases {
        let located = job.router.locate(id).await.unwrap().unwrap();
        assert_eq!(located.id, id);
        assert_eq!(located.pid, pid, "id {id}");
        assert_eq!(located.range, (pid - 1) * 100 + 1..=pid * 100);
        match (pid, &located.view) {
            (1 | 2, v) => assert_eq!(archived(v), (pid, Tier::Simple)),
            (3, PartitionView::Active(p)) => assert_eq!(p.status, Status::Claimed),
            (300, PartitionView::Active(p)) => assert_eq!(p.status, Status::Pending),
            (_, v) => panic!("id {id}: {v:?}"),
        }
    }
    for id in [0, 30_001, u64::MAX] {
        assert_eq!(job.router.locate(id).await.unwrap(), None, "id {id}");
    }
}

pub(super) async fn a_plan_added_after_the_first_lookup_is_found(kind: Kind) {
    let job = Job::new(kind, 1, 0, Tier::Simple).await;
    // Fill the cache with the first plan only.
    assert_eq!(job.router.locate(50).await.unwrap().unwrap().pid, 1);
    assert_eq!(job.router.locate(1_000_000).await.unwrap(), None);
    let second = Plan::Ranges(vec![1_000_000..=1_000_499]);
    let outcome = job.active.plan(&second).await.unwrap();
    let pid = outcome.entries[0].plan.first_pid();
    let located = job.router.locate(1_000_250).await.unwrap().unwrap();
    assert_eq!((located.pid, located.range), (pid, 1_000_000..=1_000_499));
    assert!(matches!(located.view, PartitionView::Active(_)));
    assert!(matches!(
        job.router.get(pid).await.unwrap(),
        PartitionView::Active(_)
    ));
}

/// The range stream on `shards` shards: every pid once, in order, each answered by the
/// layer that holds it.
pub(super) async fn check_range(kind: Kind, shards: u32) {
    let job = Job::new(kind, shards, 200, Tier::Compressed).await;
    let claimed: Vec<u64> = job.leases.keys().copied().collect();
    job.complete(claimed[..150].iter().copied()).await;
    job.archive().await;
    job.complete(claimed[150..160].iter().copied()).await;

    let router = job.router_with(job.stats.clone()).with_range_concurrency(7);
    let views: Vec<PartitionView> = router.range(0..=301).map(Result::unwrap).collect().await;
    assert_eq!(views.len(), 302);
    assert_eq!(views[0], PartitionView::Unknown);
    assert_eq!(views[301], PartitionView::Unknown);
    let (mut archived_n, mut archiving_n, mut active_n) = (0, 0, 0);
    for (pid, view) in (0..=301u64).zip(&views).skip(1).take(300) {
        let i = claimed.iter().position(|&c| c == pid);
        match view {
            PartitionView::Archived { record, .. } => {
                assert!(i.is_some_and(|i| i < 150), "pid {pid}");
                assert_eq!(record.pid, pid);
                archived_n += 1;
            }
            PartitionView::Archiving { pid: p, .. } => {
                assert!(i.is_some_and(|i| (150..160).contains(&i)), "pid {pid}");
                assert_eq!(*p, pid);
                archiving_n += 1;
            }
            PartitionView::Active(p) => {
                assert_eq!(p.pid, pid);
                let expected = if i.is_some() {
                    Status::Claimed
                } else {
                    Status::Pending
                };
                assert_eq!(p.status, expected, "pid {pid}");
                active_n += 1;
            }
            other => panic!("pid {pid}: {other:?}"),
        }
    }
    assert_eq!((archived_n, archiving_n, active_n), (150, 10, 140));

    // An empty range and a range past the plan.
    #[allow(clippy::reversed_empty_ranges)]
    let empty = 5..=4;
    assert_eq!(router.range(empty).count().await, 0);
    let tail: Vec<_> = router.range(u64::MAX - 1..=u64::MAX).collect().await;
    assert!(tail.iter().all(|v| matches!(v, Ok(PartitionView::Unknown))));
}

pub(super) async fn range_streams_every_pid_once_in_order_on_one_shard(kind: Kind) {
    check_range(kind, 1).await;
}

pub(super) async fn range_streams_every_pid_once_in_order_on_four_shards(kind: Kind) {
    check_range(kind, 4).await;
}
