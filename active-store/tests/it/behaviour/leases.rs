//! Claims and leases: order, fencing, expiry, release, checkpoints, batched calls
//! across shards.

use super::*;

pub(super) async fn claim_order(h: Harness) {
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
    // Ready now: the retry comes before the fresh pids of its shard, once the claims'
    // turn is back at that shard (the first shard moves on every CLAIM_TURN_MS).
    let mut next = Vec::new();
    for _ in 0..h.config.num_shards {
        next = s.claim("w1", 2).await.unwrap();
        if next.iter().any(|l| l.pid == first.pid) {
            break;
        }
        h.clock.advance(tranche_active_store::CLAIM_TURN_MS);
    }
    assert_eq!(next[0].pid, first.pid);
    assert_eq!(next[0].attempt, 2);
    assert_ne!(next[0].token, first.token, "every claim has a fresh token");
    assert_eq!(next[1].attempt, 1);
}

/// A retry ready in the shard a worker visits last is claimed within one turn
/// ([`tranche_active_store::CLAIM_TURN_MS`]) per shard while every shard still holds
/// fresh work: each turn a claim starts one shard further round the ring, and claims
/// within a turn start at the same shard. (Every claim starting at the worker's own
/// shard fed it that shard's fresh work, the retry waiting until the shards before its
/// own ran dry.)
pub(super) async fn a_retry_in_the_last_shard_waits_at_most_a_ring(h: Harness) {
    let s = &h.store;
    let n = u64::from(h.config.num_shards);
    let shard = |pid: u64| (pid / 100) % n;
    // A batch of pids per shard, all claimed: the first lease is of the shard this
    // worker's first claim visited first, its own.
    s.plan(&uniform(1, n * 1000, 10)).await.unwrap();
    let mut held = Vec::new();
    loop {
        let leases = s.claim("w", 1000).await.unwrap();
        if leases.is_empty() {
            break;
        }
        held.extend(leases);
    }
    assert_eq!(held.len() as u64, n * 100);
    let last = (shard(held[0].pid) + n - 1) % n;
    let victim = held.iter().find(|l| shard(l.pid) == last).unwrap();
    let FailOutcome::Retry { ready_at_ms } = s.fail(victim, "boom").await.unwrap() else {
        panic!("a first failure retries")
    };
    // Fresh work in every shard, two batches each.
    s.plan(&uniform(n * 1000 + 1, n * 3000, 10)).await.unwrap();
    h.clock.advance(ready_at_ms - h.clock_now());
    let mut fresh = 0;
    let retried = loop {
        assert!(
            fresh < n,
            "the retry in shard {last} was not claimed in {n} turns"
        );
        let lease = s.claim("w", 1).await.unwrap().remove(0);
        if lease.pid == victim.pid {
            break lease;
        }
        assert_eq!(lease.attempt, 1, "fresh work, ahead of the retry");
        fresh += 1;
        // Claims within one turn start at the same shard; the next turn one further.
        let again = s.claim("w", 1).await.unwrap().remove(0);
        assert_eq!(shard(again.pid), shard(lease.pid), "one shard a turn");
        h.clock.advance(tranche_active_store::CLAIM_TURN_MS);
    };
    assert_eq!(retried.attempt, 2);
    assert!(s.counts().await.unwrap().unissued > 0, "fresh work is left");
}

pub(super) async fn claims_hand_out_each_pid_once(h: Harness) {
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

pub(super) async fn lease_expiry_resumes_from_checkpoint(h: Harness) {
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

pub(super) async fn fencing(h: Harness) {
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

pub(super) async fn duplicate_completion(h: Harness) {
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

pub(super) async fn release_gives_the_attempt_back(h: Harness) {
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
pub(super) async fn expired_leases_end_failed_at_max_attempts(h: Harness) {
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
pub(super) async fn a_batch_claim_straddles_shards(h: Harness) {
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
pub(super) async fn a_batch_heartbeat_with_one_lease_lost(h: Harness) {
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
pub(super) async fn checkpoints_never_move_backwards(h: Harness) {
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
