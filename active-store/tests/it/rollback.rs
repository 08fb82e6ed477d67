//! Fencing survives a rollback: a server that reloads an older snapshot (what a replica
//! that lagged brings when it is promoted, or a restore from an older RDB) rolls every
//! shard's token counter back, yet no token issued afterwards equals one issued before,
//! so a worker still holding a lease from the lost timeline cannot act on the lease its
//! partition has been given again.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tranche_active_store::{
    Completion, Config, Error, Lease, Leases, Plan, Planner, RedisActiveStore, RedisConnection,
};
use tranche_codec::KeySchema;

use support::TestRedis;

const SHARDS: u32 = 2;

/// The tokens of `leases`, by shard. A token is one lease's within its shard: the pids of
/// a run of fresh partitions share theirs (one claim, consecutive pids), no two leases
/// do.
fn tokens(schema: &KeySchema, leases: &[Lease]) -> BTreeMap<u32, BTreeSet<u64>> {
    let mut out: BTreeMap<u32, BTreeSet<u64>> = BTreeMap::new();
    let mut last_of: BTreeMap<(u32, u64), u64> = BTreeMap::new();
    for l in leases {
        if let Some(last) = last_of.insert((schema.shard_of(l.pid), l.token), l.pid) {
            assert_eq!(
                l.pid,
                last + 1,
                "token {} issued twice in one timeline",
                l.token
            );
        }
        out.entry(schema.shard_of(l.pid))
            .or_default()
            .insert(l.token);
    }
    out
}

/// Claims `n` partitions for `worker`, asking again while shards are in back-off.
async fn claim(store: &RedisActiveStore<RedisConnection>, worker: &str, n: usize) -> Vec<Lease> {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while got.len() < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{worker} got {got:?}"
        );
        let leases = store.claim(worker, n - got.len()).await.unwrap();
        if leases.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        got.extend(leases);
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_stay_unique_after_the_server_reloads_an_older_snapshot() {
    // DEBUG RELOAD NOSAVE empties the dataset and loads dump.rdb again, on the same
    // port, under connected clients: a restore of an older RDB without a restart.
    let server = TestRedis::start_with_args(&["--enable-debug-command", "local"]);
    let conn = RedisConnection::connect(&server.url()).await.unwrap();
    let config = Config {
        namespace: "rb".to_owned(),
        num_shards: SHARDS,
        lease: Duration::from_secs(300),
        ..Config::default()
    };
    let schema = KeySchema::new("rb", SHARDS).unwrap();
    let store = RedisActiveStore::new(conn, config).unwrap();
    // 1,000 partitions: pids 1..=99 and 200..=299 ... are shard 0, 100..=199 ... shard 1.
    store
        .plan(&Plan::Uniform {
            min: 1,
            max: 100_000,
            size: 100,
        })
        .await
        .unwrap();

    // The fleet works; one lease is completed, so the snapshot holds finished work too.
    let mut before = claim(&store, "a", 8).await;
    before.extend(claim(&store, "b", 8).await);
    assert_eq!(
        store.complete(&before[0], 5).await.unwrap(),
        Completion::Completed
    );
    assert_eq!(server.cli(&["SAVE"]), "OK");
    let saved_seq: Vec<String> = schema
        .shards()
        .map(|s| server.cli(&["GET", &schema.shard_key(s, "seq")]))
        .collect();

    // It goes on after the snapshot: these claims are the timeline the rollback loses.
    let mut lost = claim(&store, "c", 12).await;
    lost.extend(claim(&store, "d", 12).await);
    for l in &lost[..4] {
        store.heartbeat(l, l.min_id + 10).await.unwrap();
    }
    let mut issued = before.clone();
    issued.extend(lost.iter().cloned());
    let issued_tokens = tokens(&schema, &issued);

    // A failover or a restore takes far longer than the millisecond the token floor
    // needs to move past what was issued; make sure of one here.
    server.wait_for_time_past(server.time_ms());
    assert_eq!(server.cli(&["DEBUG", "RELOAD", "NOSAVE"]), "OK");
    for (s, lost_tokens) in tokens(&schema, &lost) {
        let now = server.cli(&["GET", &schema.shard_key(s, "seq")]);
        assert_eq!(
            now, saved_seq[s as usize],
            "shard {s}'s counter is the saved one"
        );
        let highest = lost_tokens.last().unwrap();
        assert!(
            now.parse::<u64>().unwrap_or(0) < *highest,
            "shard {s}: counter {now} rolled back behind token {highest} it had issued"
        );
    }

    // The fleet claims again, until every pid of the lost timeline is issued again
    // (its claims are gone with the timeline): under tokens never seen in its shard.
    let lost_pids: BTreeSet<u64> = lost.iter().map(|l| l.pid).collect();
    let mut after: Vec<Lease> = Vec::new();
    for n in 0.. {
        if lost_pids.iter().all(|p| after.iter().any(|l| l.pid == *p)) {
            break;
        }
        assert!(after.len() < 1000, "lost pids never reissued: {after:?}");
        after.extend(claim(&store, &format!("e{n}"), 25).await);
    }
    let after_tokens = tokens(&schema, &after);
    for (s, new) in &after_tokens {
        let old = issued_tokens.get(s).cloned().unwrap_or_default();
        let reused: Vec<_> = new.intersection(&old).collect();
        assert!(reused.is_empty(), "shard {s} reissued tokens {reused:?}");
    }
    let reissued: Vec<(&Lease, &Lease)> = lost
        .iter()
        .map(|old| (old, after.iter().find(|new| new.pid == old.pid).unwrap()))
        .collect();

    // The holders from the lost timeline are fenced off; the new holders are not.
    for (old, new) in reissued {
        match store.heartbeat(old, old.min_id + 20).await {
            Err(Error::LeaseLost { pid, token }) => assert_eq!((pid, token), (old.pid, old.token)),
            other => panic!("stale lease {} of pid {}: {other:?}", old.token, old.pid),
        }
        match store.complete(old, 5).await {
            Err(Error::LeaseLost { .. }) => {}
            other => panic!("stale completion of pid {}: {other:?}", old.pid),
        }
        store.heartbeat(new, new.min_id + 20).await.unwrap();
        assert_eq!(store.complete(new, 5).await.unwrap(), Completion::Completed);
    }
}
