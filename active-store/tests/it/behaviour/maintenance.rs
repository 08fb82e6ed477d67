//! Maintenance and queries: retries, failures, discards, the worker registry, pause,
//! the reaper, repair of a sound set.

use super::*;

pub(super) async fn retry_backoff_and_dead(h: Harness) {
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

pub(super) async fn retry_failed_and_discard(h: Harness) {
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

pub(super) async fn worker_registry(h: Harness) {
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
pub(super) async fn workers_are_pruned_after_retention(h: Harness) {
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
pub(super) async fn pause_is_a_namespace_flag(h: Harness) {
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
pub(super) async fn a_sound_active_set_has_nothing_to_repair(h: Harness) {
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

pub(super) async fn reaper_is_idempotent(h: Harness) {
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

pub(super) async fn queries(h: Harness) {
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

/// A planned pid that no cursor has issued yet reads as pending, and `discard` drops it
/// like any pending partition ("Drop one pending or failed partition"): it ends
/// discarded, is never issued, a replay of its plan does not bring it back, and the
/// counts stay exact throughout (the pid leaves the unissued count for the discarded).
pub(super) async fn a_pid_not_issued_yet_is_discarded_like_a_pending_one(h: Harness) {
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
pub(super) async fn fail_with_a_policy(h: Harness) {
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
