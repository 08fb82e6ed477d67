//! 32 workers race over 20,000 partitions while leases expire at random under them.
//! Afterwards every pid reached the inbox exactly once, none was lost, and no pid was
//! ever held by two live leases at once.

use crate::support;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use redis::AsyncCommands;
use tranche_active_store::{
    ActiveStore, Clock, Completion, Config, Error, ManualClock, MemoryActiveStore, Plan,
    RedisActiveStore, RedisConnection,
};
use tranche_codec::{KeySchema, decode_json};

use support::TestRedis;

const PARTITIONS: u64 = 20_000;
const WORKERS: usize = 32;
const LEASE_MS: u64 = 1000;

fn config() -> Config {
    Config {
        num_shards: 4,
        lease: Duration::from_millis(LEASE_MS),
        max_attempts: 1000,
        backoff_base: Duration::from_millis(1),
        backoff_max: Duration::from_millis(10),
        ..Config::default()
    }
}

/// What the workers saw: every grant (pid, token, deadline) and every lease that ended
/// by a successful `fail` (so the pid could be granted again before its deadline).
#[derive(Default)]
struct Log {
    grants: Vec<(u64, u64, u64)>,
    failed: HashSet<(u64, u64)>,
}

type Live = Arc<Mutex<Log>>;

async fn race(store: Arc<dyn ActiveStore>, clock: Arc<ManualClock>) {
    store
        .plan(&Plan::Uniform {
            min: 1,
            max: PARTITIONS * 100,
            size: 100,
        })
        .await
        .unwrap();
    let live: Live = Arc::default();
    let mut tasks = Vec::new();
    for w in 0..WORKERS {
        let (store, clock, live) = (store.clone(), clock.clone(), live.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(w as u64);
            let worker = format!("worker-{w}");
            let mut idle = 0;
            // The race ends when the work does; a store that never drains fails the
            // test instead of hanging it.
            let deadline = std::time::Instant::now() + Duration::from_secs(300);
            loop {
                assert!(
                    std::time::Instant::now() < deadline,
                    "{worker}: the work never drained"
                );
                let leases = store
                    .claim(&worker, rng.random_range(1..=10))
                    .await
                    .unwrap();
                if leases.is_empty() {
                    // Maybe everything is leased by stalled workers: let time pass and
                    // reap, as the reaper task of a real worker would.
                    idle += 1;
                    if store.counts().await.unwrap().outstanding() == 0 {
                        return;
                    }
                    clock.advance(LEASE_MS / 4);
                    store.reap(clock.now_ms()).await.unwrap();
                    if idle % 8 == 0 {
                        tokio::task::yield_now().await;
                    }
                    continue;
                }
                idle = 0;
                live.lock()
                    .unwrap()
                    .grants
                    .extend(leases.iter().map(|l| (l.pid, l.token, l.deadline_ms)));
                for l in leases {
                    let roll: f64 = rng.random();
                    if roll < 0.01 {
                        // Stall past the deadline: somebody reaps, and this lease is dead.
                        clock.advance(LEASE_MS + 1);
                        store.reap(clock.now_ms()).await.unwrap();
                    } else if roll < 0.03 {
                        match store.fail(&l, "flaky").await {
                            Ok(_) => {
                                live.lock().unwrap().failed.insert((l.pid, l.token));
                            }
                            Err(Error::LeaseLost { .. }) => {}
                            Err(e) => panic!("{e}"),
                        }
                        continue;
                    } else if roll < 0.3 {
                        match store.heartbeat(&l, l.min_id + 50).await {
                            Ok(()) | Err(Error::LeaseLost { .. }) => {}
                            Err(e) => panic!("{e}"),
                        }
                    }
                    match store.complete(&l, 10).await {
                        Ok(Completion::Completed | Completion::Duplicate)
                        | Err(Error::LeaseLost { .. }) => {}
                        Ok(Completion::PartDone) => panic!("no partition is split here"),
                        Err(e) => panic!("{e}"),
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(store.counts().await.unwrap().outstanding(), 0);
    assert!(
        store.all_active().await.unwrap().partitions.is_empty(),
        "nothing is left active"
    );

    // No pid was ever held by two live leases: each grant came after the previous lease
    // of that pid expired (granted at deadline - lease >= the previous deadline) or
    // ended by a failure. Tokens order the grants of a pid (one sequence per shard).
    let log = live.lock().unwrap();
    let mut by_pid: HashMap<u64, Vec<(u64, u64)>> = HashMap::new();
    for &(pid, token, deadline) in &log.grants {
        by_pid.entry(pid).or_default().push((token, deadline));
    }
    let mut regrants = 0;
    for (pid, mut grants) in by_pid {
        grants.sort_unstable();
        for pair in grants.windows(2) {
            let ((t1, d1), (t2, d2)) = (pair[0], pair[1]);
            let granted = d2 - LEASE_MS;
            assert!(
                granted >= d1 || log.failed.contains(&(pid, t1)),
                "pid {pid}: token {t2} granted at {granted} while token {t1} was live until {d1}"
            );
            regrants += 1;
        }
    }
    assert!(
        regrants > 500,
        "the race must actually reissue leases ({regrants})"
    );
}

fn assert_each_once(mut pids: Vec<u64>) {
    pids.sort_unstable();
    let dupes: Vec<_> = pids
        .windows(2)
        .filter(|w| w[0] == w[1])
        .map(|w| w[0])
        .collect();
    assert!(
        dupes.is_empty(),
        "completed twice: {:?}",
        &dupes[..dupes.len().min(10)]
    );
    assert_eq!(
        pids,
        (1..=PARTITIONS).collect::<Vec<_>>(),
        "every pid exactly once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_backend() {
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let store = Arc::new(MemoryActiveStore::with_clock(config(), clock.clone()).unwrap());
    race(store.clone(), clock).await;
    let pids = (0..4)
        .flat_map(|s| {
            store
                .inbox(s)
                .unwrap()
                .try_iter()
                .map(|r| r.pid)
                .collect::<Vec<_>>()
        })
        .collect();
    assert_each_once(pids);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_backend() {
    let server = TestRedis::start();
    let conn = RedisConnection::connect(&server.url()).await.unwrap();
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let store =
        Arc::new(RedisActiveStore::with_clock(conn.clone(), config(), clock.clone()).unwrap());
    race(store, clock).await;
    let schema = KeySchema::new("elk", 4).unwrap();
    let mut pids = Vec::new();
    let mut conn = conn;
    for shard in schema.shards() {
        let reply: redis::streams::StreamRangeReply =
            conn.xrange_all(schema.inbox(shard)).await.unwrap();
        for entry in reply.ids {
            let lines: String = entry.get("r").unwrap();
            pids.extend(lines.lines().map(|json| decode_json(json).unwrap().pid));
        }
    }
    assert_each_once(pids);
}
