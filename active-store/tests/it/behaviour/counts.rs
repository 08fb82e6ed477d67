//! Status counters: they follow a random workload, and a recount rebuilds them.

use super::*;

/// The counts recomputed from every record, as `counts()` must answer them.
pub(super) async fn recounted(s: &dyn ActiveStore) -> StatusCounts {
    let snapshot = s.all_active().await.unwrap();
    let mut c = StatusCounts {
        unissued: snapshot.unissued.iter().map(|u| u.count).sum(),
        ..StatusCounts::default()
    };
    for p in &snapshot.partitions {
        match p.status {
            Status::Pending => c.pending += 1,
            Status::Claimed => c.claimed += 1,
            Status::Running => c.running += 1,
            Status::Failed => c.failed += 1,
            Status::Discarded => c.discarded += 1,
            Status::Completed => panic!("pid {} completed but active", p.pid),
        }
    }
    c
}

/// `steps` random operations of every kind that changes a status (claims, heartbeats,
/// completions, failures, releases, reaps, released workers, retries, discards, new
/// plans), seeded; after each, `counts()` equals the counts recomputed from the records.
pub(super) async fn random_workload(h: &Harness, seed: u64, steps: usize) {
    let s = &*h.store;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut held: Vec<Lease> = Vec::new();
    let mut next_range = 20_000_000u64;
    for step in 0..steps {
        match rng.random_range(0..100) {
            0..=19 => {
                let worker = format!("w{}", rng.random_range(0..4));
                held.extend(s.claim(&worker, rng.random_range(1..6)).await.unwrap());
            }
            20..=34 if !held.is_empty() => {
                let l = &held[rng.random_range(0..held.len())];
                let _ = s.heartbeat(l, l.min_id + 1).await;
            }
            35..=49 if !held.is_empty() => {
                let n = rng.random_range(1..=held.len().min(4));
                let done: Vec<(Lease, u64)> = held.drain(..n).map(|l| (l, 10)).collect();
                for outcome in s.complete_many(&done).await.unwrap() {
                    let _ = outcome;
                }
            }
            50..=59 if !held.is_empty() => {
                let l = held.swap_remove(rng.random_range(0..held.len()));
                let _ = s.fail(&l, "boom").await;
            }
            60..=67 if !held.is_empty() => {
                let l = held.swap_remove(rng.random_range(0..held.len()));
                let _ = s.release(&l, l.min_id + 2).await;
            }
            68..=75 => {
                h.clock.advance(rng.random_range(0..40_000));
                s.reap(h.clock_now()).await.unwrap();
            }
            76..=79 => {
                let worker = format!("w{}", rng.random_range(0..4));
                s.release_worker(&worker).await.unwrap();
            }
            80..=85 => {
                let only = rng.random_bool(0.5).then(|| rng.random_range(1..60));
                s.retry_failed(only).await.unwrap();
            }
            86..=91 => {
                let _ = s.discard(rng.random_range(1..60)).await;
            }
            92..=95 => {
                let n = rng.random_range(1..4);
                let ranges: Vec<_> = (0..n)
                    .map(|i| next_range + i * 100..=next_range + i * 100 + 99)
                    .collect();
                next_range += 1000;
                s.plan(&Plan::Ranges(ranges)).await.unwrap();
            }
            _ => {
                h.clock.advance(rng.random_range(0..5_000));
            }
        }
        assert_eq!(
            s.counts().await.unwrap(),
            recounted(s).await,
            "seed {seed}, after step {step}"
        );
    }
}

pub(super) async fn counts_follow_a_random_workload(h: Harness) {
    h.store.plan(&uniform(1, 10_000_000, 10_000)).await.unwrap();
    for seed in 0..3 {
        random_workload(&h, seed, 150).await;
    }
    let c = h.store.counts().await.unwrap();
    assert!(
        c.pending > 0 && c.claimed + c.running > 0 && c.unissued > 0,
        "the workload reached several statuses: {c:?}"
    );
}

/// A namespace written before the counters existed: on Redis, its counters are dropped
/// mid-workload (the scripts then count from nothing, unmarked); `counts()` derives
/// them from the records once and stays right after.
pub(super) async fn counts_of_a_namespace_without_counters(h: Harness) {
    h.store.plan(&uniform(1, 10_000_000, 10_000)).await.unwrap();
    random_workload(&h, 7, 60).await;
    if let Backend::Redis(_, conn) = &h.backend {
        let schema =
            tranche_codec::KeySchema::new(&h.config.namespace, h.config.num_shards).unwrap();
        let mut conn = conn.clone();
        for shard in schema.shards() {
            let _: () = conn.del(schema.shard_key(shard, "counts")).await.unwrap();
        }
    }
    let l = h.store.claim("w9", 3).await.unwrap();
    h.store.heartbeat(&l[0], l[0].min_id).await.unwrap();
    h.store.fail(&l[1], "boom").await.unwrap();
    let unmarked = || async {
        let Backend::Redis(_, conn) = &h.backend else {
            return 0;
        };
        let schema =
            tranche_codec::KeySchema::new(&h.config.namespace, h.config.num_shards).unwrap();
        let mut conn = conn.clone();
        let mut n = 0;
        for shard in schema.shards() {
            let records: u64 = conn.hlen(schema.active(shard)).await.unwrap();
            let marked: bool = conn
                .hexists(schema.shard_key(shard, "counts"), "v")
                .await
                .unwrap();
            n += u32::from(records > 0 && !marked);
        }
        n
    };
    if matches!(h.backend, Backend::Redis(..)) {
        assert!(unmarked().await > 0, "the scripts counted without the mark");
    }
    assert_eq!(h.store.counts().await.unwrap(), recounted(&*h.store).await);
    assert_eq!(unmarked().await, 0, "derived once, marked from then on");
    random_workload(&h, 8, 60).await;
}

/// `recount` puts counters that a writer without them got wrong (a rolling upgrade)
/// right again.
#[tokio::test]
async fn recount_repairs_counters() {
    use tranche_active_store::{ActiveQuery, Leases, Planner};
    let server = TestRedis::start();
    let conn = RedisConnection::connect(&server.url()).await.unwrap();
    let config = Config {
        num_shards: 2,
        ..Config::default()
    };
    let store = RedisActiveStore::new(conn.clone(), config).unwrap();
    store.plan(&uniform(1, 1_000_000, 1000)).await.unwrap();
    let leases = store.claim("w", 10).await.unwrap();
    store.heartbeat(&leases[0], leases[0].min_id).await.unwrap();
    let before = store.counts().await.unwrap();
    assert_eq!((before.claimed, before.running), (9, 1));
    let mut c = conn.clone();
    let schema = tranche_codec::KeySchema::new("elk", 2).unwrap();
    // The shard the claims came from (which one depends on the clock's turn) and the
    // other one.
    let claimed_in = schema.shard_of(leases[0].pid);
    let _: () = c
        .hset(schema.shard_key(claimed_in, "counts"), "c", 1000)
        .await
        .unwrap();
    let _: () = c
        .hset(schema.shard_key(1 - claimed_in, "counts"), "p", -3)
        .await
        .unwrap();
    assert_ne!(store.counts().await.unwrap(), before);
    assert_eq!(store.recount().await.unwrap(), before);
    assert_eq!(store.counts().await.unwrap(), before);
}
