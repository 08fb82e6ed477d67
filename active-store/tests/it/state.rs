//! The memory store's saved state: a restored store answers every query as the saved
//! one did, and goes on claiming where it stopped, with larger fencing tokens.

use std::sync::Arc;
use std::time::Duration;

use tranche_active_store::{
    ActiveQuery, ActiveState, Clock, Completion, Config, Error, FailOutcome, Lease, Leases,
    Maintenance, ManualClock, MemoryActiveStore, Plan, Planner, RestoredLeases, WorkerInfo,
    WorkerRegistry,
};
use tranche_codec::Status;

const T0: u64 = 1_719_234_405_000;

fn config(shards: u32) -> Config {
    Config {
        num_shards: shards,
        lease: Duration::from_secs(30),
        max_attempts: 2,
        backoff_base: Duration::from_secs(1),
        backoff_max: Duration::from_secs(60),
        ..Config::default()
    }
}

fn worker(id: &str) -> WorkerInfo {
    WorkerInfo {
        id: id.into(),
        host: "h".into(),
        process_id: 7,
        started_ms: T0,
        last_beat_ms: 0,
        in_flight: 3,
        completed: 9,
        rate_per_s: 1.5,
        latency_p50_ms: 20.0,
        latency_p99_ms: 90.0,
        version: "0.1.0".into(),
    }
}

/// A worker id whose claim at `now_ms` starts at `shard` (the store's FNV-1a of the id,
/// one shard further on per `CLAIM_TURN_MS`).
fn worker_starting_at(shard: u32, shards: u32, now_ms: u64) -> String {
    let turn = now_ms / tranche_active_store::CLAIM_TURN_MS;
    (0..)
        .map(|i| format!("r{i}"))
        .find(|id| {
            let hash = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            });
            (hash % u64::from(shards) + turn) % u64::from(shards) == u64::from(shard)
        })
        .expect("some id starts there")
}

/// A store with every kind of state: two plans, completed pids, leases with and
/// without checkpoints, a retry in backoff, a failed partition, a released one,
/// explicit ranges and two workers. Returns the leases still held and every lease
/// ever handed out.
async fn busy_store(
    shards: u32,
    clock: Arc<ManualClock>,
) -> (MemoryActiveStore, Vec<Lease>, Vec<Lease>) {
    let store = MemoryActiveStore::with_clock(config(shards), clock.clone()).unwrap();
    store
        .plan(&Plan::Uniform {
            min: 1,
            max: 250_000,
            size: 1000,
        })
        .await
        .unwrap();
    store
        .plan(&Plan::Ranges(vec![300_001..=300_500, 400_000..=400_010]))
        .await
        .unwrap();
    store.worker_heartbeat(worker("w1")).await.unwrap();
    store.worker_heartbeat(worker("w2")).await.unwrap();
    let mut held = store.claim("w1", 40).await.unwrap();
    held.extend(store.claim("w2", 30).await.unwrap());
    let mut all = held.clone();
    let done: Vec<(Lease, u64)> = held.drain(..25).map(|l| (l, 1234)).collect();
    for outcome in store.complete_many(&done).await.unwrap() {
        assert_eq!(outcome.unwrap(), Completion::Completed);
    }
    clock.advance(1000);
    for (i, lease) in held.iter().take(10).enumerate() {
        store
            .heartbeat(lease, lease.min_id + 100 * i as u64)
            .await
            .unwrap();
    }
    // A retry in backoff, a partition failed for good, a released one.
    let retry = held.remove(10);
    assert!(matches!(
        store.fail(&retry, "boom").await.unwrap(),
        FailOutcome::Retry { .. }
    ));
    let failing = held.remove(10);
    store.fail(&failing, "once").await.unwrap();
    clock.advance(2000);
    let schema = tranche_codec::KeySchema::new("elk", shards).unwrap();
    let claimant = worker_starting_at(schema.shard_of(failing.pid), shards, clock.now_ms());
    let again = store.claim(&claimant, 1).await.unwrap().remove(0);
    assert!([failing.pid, retry.pid].contains(&again.pid), "{again:?}");
    all.push(again.clone());
    assert_eq!(
        store.fail(&again, "twice").await.unwrap(),
        FailOutcome::Failed
    );
    let released = held.remove(10);
    store
        .release(&released, released.min_id + 500)
        .await
        .unwrap();
    clock.advance(500);
    (store, held, all)
}

/// Every answer the store gives, to compare two stores by.
async fn answers(store: &MemoryActiveStore) -> Vec<String> {
    let mut out = vec![
        format!("{:?}", store.plans().await.unwrap()),
        format!("{:?}", store.all_active().await.unwrap()),
        format!("{:?}", store.counts().await.unwrap()),
        format!("{:?}", store.workers().await.unwrap()),
    ];
    for pid in (0..=260).chain([300, 301, 302, 303]) {
        out.push(format!("{pid}: {:?}", store.get(pid).await.unwrap()));
    }
    out
}

#[tokio::test]
async fn a_restored_store_answers_and_claims_as_the_saved_one() {
    for shards in [1, 4] {
        let clock = Arc::new(ManualClock::new(T0));
        let (live, held, all) = busy_store(shards, clock.clone()).await;
        let schema = tranche_codec::KeySchema::new("elk", shards).unwrap();
        let state = live.state();
        assert_eq!(state.completed_count(), 25);
        assert_eq!(state.leased().len(), held.len());
        // Through text and back, as a state file would carry it.
        let json = serde_json::to_vec(&state).unwrap();
        let back: ActiveState = serde_json::from_slice(&json).unwrap();
        assert_eq!(back, state);
        let restored =
            MemoryActiveStore::restore(config(shards), clock.clone(), back, RestoredLeases::Keep)
                .unwrap();
        assert_eq!(answers(&restored).await, answers(&live).await);
        assert_eq!(restored.state(), state);

        // The old leases still work on the restored store (kept as they were).
        let finished = &held[0];
        assert_eq!(
            restored.complete(finished, 10).await.unwrap(),
            Completion::Completed
        );
        assert_eq!(
            live.complete(finished, 10).await.unwrap(),
            Completion::Completed
        );
        // Both go on identically: same pids, same fencing tokens.
        clock.advance(5000);
        let by_pid = |mut v: Vec<Lease>| {
            v.sort_by_key(|l| l.pid);
            v
        };
        let a = by_pid(live.claim("w3", 1000).await.unwrap());
        let b = by_pid(restored.claim("w3", 1000).await.unwrap());
        assert_eq!(a, b);
        assert!(!a.is_empty());
        // Tokens are per shard: each new one is above every earlier one of its shard.
        for lease in &b {
            let shard = schema.shard_of(lease.pid);
            assert!(
                all.iter()
                    .filter(|old| schema.shard_of(old.pid) == shard)
                    .all(|old| old.token < lease.token),
                "{lease:?}"
            );
        }
        // A completed pid stays completed: its old lease is a duplicate.
        assert_eq!(
            restored.complete(&held[0], 10).await.unwrap(),
            Completion::Duplicate
        );
        assert!(matches!(
            restored.heartbeat(finished, finished.max_id).await,
            Err(Error::LeaseLost { .. })
        ));
        assert_eq!(answers(&restored).await, answers(&live).await);
    }
}

#[tokio::test]
async fn release_on_restore_resumes_each_lease_from_its_checkpoint() {
    for shards in [1, 4] {
        let clock = Arc::new(ManualClock::new(T0));
        let (live, held, all) = busy_store(shards, clock.clone()).await;
        let schema = tranche_codec::KeySchema::new("elk", shards).unwrap();
        let state = live.state();
        let restored = MemoryActiveStore::restore(
            config(shards),
            clock.clone(),
            state,
            RestoredLeases::Release,
        )
        .unwrap();
        let counts = restored.counts().await.unwrap();
        assert_eq!((counts.claimed, counts.running), (0, 0));
        assert_eq!(counts.failed, 1);
        for old in &held {
            let p = restored.get(old.pid).await.unwrap().unwrap();
            assert_eq!(p.status, Status::Pending, "pid {}", old.pid);
            let live_p = live.get(old.pid).await.unwrap().unwrap();
            assert_eq!(p.progress, live_p.progress);
            // The old lease is dead.
            assert!(matches!(
                restored.heartbeat(old, old.min_id).await,
                Err(Error::LeaseLost { .. })
            ));
        }
        // Claiming takes the released partitions first, with their checkpoints and
        // tokens larger than any handed out before.
        let leases = restored.claim("w1", 1000).await.unwrap();
        for old in &held {
            let new = leases.iter().find(|l| l.pid == old.pid).unwrap();
            assert!(new.progress >= old.progress);
            assert_eq!(new.attempt, old.attempt + 1);
        }
        assert!(leases.iter().any(|l| l.progress > l.min_id));
        let claimed: std::collections::BTreeSet<u64> = leases.iter().map(|l| l.pid).collect();
        assert_eq!(claimed.len(), leases.len(), "a pid claimed twice");
        // Every planned pid not completed and not failed is claimed exactly once.
        assert_eq!(leases.len() as u64, 250 + 2 - 25 - 1);
        for lease in &leases {
            let shard = schema.shard_of(lease.pid);
            assert!(
                all.iter()
                    .filter(|old| schema.shard_of(old.pid) == shard)
                    .all(|old| old.token < lease.token),
                "{lease:?}"
            );
        }
        // Nothing completed is handed out again.
        assert_eq!(
            restored.counts().await.unwrap().outstanding(),
            leases.len() as u64
        );
        assert!(restored.release_all().len() == leases.len());
        assert_eq!(restored.reap(u64::MAX).await.unwrap(), Vec::<u64>::new());
    }
}

/// A lease found at a restore is an expired lease: its process died holding it. The
/// attempt stays counted, so a partition that kills its process on every attempt is
/// retried `max_attempts` times and then failed, as the reaper does on Redis.
#[tokio::test]
async fn a_lease_found_at_restore_counts_its_attempt_and_fails_at_the_last() {
    let clock = Arc::new(ManualClock::new(T0));
    let mut store = MemoryActiveStore::with_clock(config(1), clock.clone()).unwrap();
    store
        .plan(&Plan::Uniform {
            min: 1,
            max: 1000,
            size: 1000,
        })
        .await
        .unwrap();
    // `max_attempts` is 2: two crashes mid-run, each followed by a restore.
    for attempt in 1..=2u32 {
        let leases = store.claim("w1", 1).await.unwrap();
        assert_eq!(leases.len(), 1, "attempt {attempt}: nothing to claim");
        assert_eq!(leases[0].attempt, attempt);
        store.heartbeat(&leases[0], 400).await.unwrap();
        store = MemoryActiveStore::restore(
            config(1),
            clock.clone(),
            store.state(),
            RestoredLeases::Release,
        )
        .unwrap();
        let p = store.get(1).await.unwrap().unwrap();
        assert_eq!(p.attempts, attempt, "the crashed attempt is counted");
        assert_eq!(p.progress, 400, "the checkpoint is kept");
        if attempt < 2 {
            assert_eq!(p.status, Status::Pending);
        } else {
            assert_eq!(p.status, Status::Failed);
            let error = p.last_error.unwrap_or_default();
            assert!(error.contains("attempt 2 of 2"), "{error}");
        }
    }
    assert!(store.claim("w1", 1).await.unwrap().is_empty());
    let counts = store.counts().await.unwrap();
    assert_eq!((counts.pending, counts.failed), (0, 1));
}

#[tokio::test]
async fn a_state_of_another_store_or_version_is_refused() {
    let clock = Arc::new(ManualClock::new(T0));
    let (live, _, _) = busy_store(4, clock.clone()).await;
    let state = live.state();
    let restore = |config: Config, state: ActiveState| {
        MemoryActiveStore::restore(config, clock.clone(), state, RestoredLeases::Keep)
    };
    let err = restore(config(2), state.clone()).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert!(err.to_string().contains("4 shards"), "{err}");
    let other_ns = Config {
        namespace: "other".into(),
        ..config(4)
    };
    assert!(matches!(
        restore(other_ns, state.clone()),
        Err(Error::InvalidArgument(_))
    ));
    let mut newer = state.clone();
    newer.version += 1;
    let err = restore(config(4), newer).unwrap_err();
    assert!(matches!(err, Error::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("version 2"), "{err}");
    // A state whose shards are mixed up breaks the store's invariants.
    let json = serde_json::to_value(&state).unwrap();
    let mut swapped = json.clone();
    let shards = swapped["shards"].as_array_mut().unwrap();
    shards.swap(0, 1);
    let swapped: ActiveState = serde_json::from_value(swapped).unwrap();
    assert!(matches!(
        restore(config(4), swapped),
        Err(Error::Corrupt { .. })
    ));
    // A token counter below a lease's token would hand that token out again.
    let mut rewound = json;
    for shard in rewound["shards"].as_array_mut().unwrap() {
        shard["token"] = 0.into();
    }
    let rewound: ActiveState = serde_json::from_value(rewound).unwrap();
    assert!(matches!(
        restore(config(4), rewound),
        Err(Error::Corrupt { .. })
    ));
}
