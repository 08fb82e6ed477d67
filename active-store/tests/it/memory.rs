//! Redis memory of the active layer: a plan costs bytes, and the hot set stays flat
//! however much completes.

use crate::support;

use redis::AsyncCommands;
use tranche_active_store::{
    ActiveQuery, Config, Leases, Plan, Planner, RedisActiveStore, RedisConnection,
};

use support::TestRedis;

#[tokio::test]
async fn a_five_billion_id_plan_costs_under_a_kilobyte() {
    for shards in [1, 4] {
        let server = TestRedis::start();
        let conn = RedisConnection::connect(&server.url()).await.unwrap();
        let store = RedisActiveStore::new(
            conn.clone(),
            Config {
                num_shards: shards,
                ..Config::default()
            },
        )
        .unwrap();
        store
            .plan(&Plan::Uniform {
                min: 1,
                max: 5_000_000_000,
                size: 1000,
            })
            .await
            .unwrap();
        let bytes = server.bytes_of_all_keys();
        assert!(
            bytes > 0 && bytes < 1024,
            "{shards} shards: 5e9 IDs planned in {bytes} bytes"
        );
    }
}

#[tokio::test]
async fn the_active_set_stays_flat_while_100k_partitions_complete() {
    let server = TestRedis::start();
    let mut conn = RedisConnection::connect(&server.url()).await.unwrap();
    let store = RedisActiveStore::new(conn.clone(), Config::default()).unwrap();
    store
        .plan(&Plan::Uniform {
            min: 1,
            max: 100_000_000,
            size: 1000,
        })
        .await
        .unwrap();
    let active_keys = [
        "{elk:0}:active",
        "{elk:0}:runs",
        "{elk:0}:leases",
        "{elk:0}:pending",
        "{elk:0}:cursor",
    ];
    let mut samples = Vec::new();
    for round in 1..=1000 {
        let leases = store.claim("w", 100).await.unwrap();
        assert_eq!(leases.len(), 100);
        if round % 250 == 0 {
            // Peak: 100 partitions in flight.
            let bytes = server.bytes_of(&active_keys);
            let len = store.counts().await.unwrap().claimed;
            samples.push((round * 100, len, bytes));
        }
        let done: Vec<_> = leases.into_iter().map(|l| (l, 1000)).collect();
        for outcome in store.complete_many(&done).await.unwrap() {
            outcome.unwrap();
        }
        // The archiver's part: the inbox is drained as it fills.
        let _: () = redis::cmd("XTRIM")
            .arg("{elk:0}:inbox")
            .arg("MAXLEN")
            .arg(0)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let (first, last) = (samples[0], samples[samples.len() - 1]);
    assert!(samples.iter().all(|&(_, len, _)| len == 100), "{samples:?}");
    assert!(
        last.2 <= first.2 + first.2 / 10,
        "active keys grew from {} to {} bytes: {samples:?}",
        first.2,
        last.2
    );
    for key in ["{elk:0}:active", "{elk:0}:runs"] {
        let hlen: u64 = conn.hlen(key).await.unwrap();
        assert_eq!(hlen, 0, "nothing left in {key} once everything completed");
    }
}
