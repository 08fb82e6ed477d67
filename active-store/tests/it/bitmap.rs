//! The completed index past 64 KB is grown by `complete.lua` to just under a jemalloc
//! size class, not doubled by Redis: its memory stays within a quarter of its bits.

use crate::support;

use support::TestRedis;
use tranche_active_store::{Config, Lease, Leases, Plan, Planner, RedisActiveStore};

/// Completes `lease` through the script with `bit` as its index offset (the store would
/// derive it from the pid; the script takes any), and returns the reply.
async fn complete_at(
    conn: &mut redis::aio::MultiplexedConnection,
    keys: &[String],
    lease: &Lease,
    bit: u64,
) -> redis::RedisResult<Vec<i64>> {
    let script = tranche_active_store::scripts()
        .into_iter()
        .find(|(name, _)| *name == "complete")
        .expect("the complete script")
        .1;
    let mut call = script.prepare_invoke();
    for key in keys {
        call.key(key);
    }
    call.arg(lease.pid)
        .arg(lease.token)
        .arg(bit)
        .arg(format!("{{\"pid\":{}}}", lease.pid));
    call.invoke_async(conn).await
}

#[tokio::test]
async fn a_large_completed_index_is_grown_to_a_size_class() {
    let server = TestRedis::start();
    let client = redis::Client::open(server.url()).unwrap();
    let store = RedisActiveStore::new(
        client.get_connection_manager().await.unwrap(),
        Config {
            namespace: "elk".into(),
            num_shards: 1,
            ..Config::default()
        },
    )
    .unwrap();
    store
        .plan(&Plan::Uniform {
            min: 1,
            max: 10_000,
            size: 1000,
        })
        .await
        .unwrap();
    let schema = tranche_codec::KeySchema::new("elk", 1).unwrap();
    let index = schema.completed_index(0);
    let keys = vec![
        schema.active(0),
        schema.leases(0),
        index.clone(),
        schema.inbox(0),
        schema.shard_key(0, "counts"),
        schema.shard_key(0, "splits"),
        schema.runs(0),
    ];
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let leases = store.claim("w", 6).await.unwrap();
    let strlen = || -> u64 { server.query(redis::cmd("STRLEN").arg(&index)) };

    // Below 64 KB Redis grows the index as it always did.
    assert_eq!(
        complete_at(&mut conn, &keys, &leases[0], 1000)
            .await
            .unwrap(),
        vec![1]
    );
    assert_eq!(strlen(), 1000 / 8 + 1);
    // 1,000,000 bits need 125,001 bytes: grown to the 128 KB class less its header and
    // NUL, where Redis would have doubled it to 250,002 (a 256 KB allocation).
    assert_eq!(
        complete_at(&mut conn, &keys, &leases[1], 1_000_000)
            .await
            .unwrap(),
        vec![1]
    );
    assert_eq!(strlen(), 131_072 - 10);
    let used: u64 = server.query(redis::cmd("MEMORY").arg("USAGE").arg(&index));
    assert!(used < 140_000, "{used} bytes");
    // Within the padding nothing grows; past it, the next class (160 KB).
    assert_eq!(
        complete_at(&mut conn, &keys, &leases[2], 1_040_000)
            .await
            .unwrap(),
        vec![1]
    );
    assert_eq!(strlen(), 131_072 - 10);
    assert_eq!(
        complete_at(&mut conn, &keys, &leases[3], 1_100_000)
            .await
            .unwrap(),
        vec![1]
    );
    assert_eq!(strlen(), 163_840 - 10);
    // The bits set are set, the padding reads as clear, and a completion again of a
    // bit set before the growth is still a duplicate.
    for (bit, set) in [
        (1000, 1),
        (1_000_000, 1),
        (1_040_000, 1),
        (1_100_000, 1),
        (1_100_001, 0),
    ] {
        let got: u8 = server.query(redis::cmd("GETBIT").arg(&index).arg(bit));
        assert_eq!(got, set, "bit {bit}");
    }
    assert_eq!(
        complete_at(&mut conn, &keys, &leases[1], 1_000_000)
            .await
            .unwrap(),
        vec![0],
        "a completion again is a duplicate"
    );
    // A lost lease (a wrong token) reads its bit and grows nothing.
    let mut stale = leases[4].clone();
    stale.token += 1_000_000;
    let before = server.dump_all();
    assert_eq!(
        complete_at(&mut conn, &keys, &stale, 2_000_000)
            .await
            .unwrap(),
        vec![-1]
    );
    assert!(server.dump_all() == before, "a lost completion wrote");
    // An offset BITFIELD refuses is refused before anything is written.
    let err = complete_at(&mut conn, &keys, &leases[5], 1 << 33)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("bit offset"), "{err}");
    assert!(server.dump_all() == before, "a refused completion wrote");
}

/// The last piece of a split partition sets the partition's bit through the same
/// growth as `complete.lua` (`grow_bitmap` of codec's `common.lua`), and a bit offset
/// past a bitmap's 2^32 bits is refused before anything is written.
#[tokio::test]
async fn the_last_piece_grows_the_index_as_a_completion_does() {
    let server = TestRedis::start();
    let schema = tranche_codec::KeySchema::new("elk", 1).unwrap();
    let index = schema.completed_index(0);
    let keys = [
        schema.active(0),
        index.clone(),
        schema.inbox(0),
        schema.shard_key(0, "counts"),
        schema.shard_key(0, "splits"),
        schema.shard_key(0, "pieces"),
        schema.shard_key(0, "piece_leases"),
    ];
    // Pid 2 running, its owner part done, its last piece 1700..=2000 leased under 99.
    let now = 1_700_000_000_000_u64;
    server.cli(&[
        "HSET",
        &keys[0],
        "2",
        &format!("r|1||||{now}|{now}|w|1001|2000||"),
    ]);
    let piece = format!(
        "c|1|99|{}|{now}|{now}|{now}|w2|1700|2000|1700|",
        now + 60_000
    );
    server.cli(&["HSET", &keys[5], "2:1700", &piece]);
    server.cli(&["ZADD", &keys[6], &(now + 60_000).to_string(), "2:1700"]);
    let entry = r#"|||||1|1|1|1001|2000|{"pid":2,"min_id":1001,"max_id":2000,"worker_id":"w""#;
    server.cli(&["HSET", &keys[4], "2", entry]);
    let script = tranche_active_store::scripts()
        .into_iter()
        .find(|(name, _)| *name == "piece_complete")
        .expect("the piece_complete script")
        .1;
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let call = |bit: u64| {
        let mut call = script.prepare_invoke();
        for key in &keys {
            call.key(key);
        }
        call.arg(now).arg("2:1700").arg(99).arg(bit);
        call
    };

    let before = server.dump_all();
    let refused: redis::RedisResult<Vec<i64>> = call(1 << 32).invoke_async(&mut conn).await;
    let err = refused.unwrap_err();
    assert!(err.to_string().contains("bit offset"), "{err}");
    assert!(server.dump_all() == before, "a refused completion wrote");

    let done: Vec<i64> = call(1_000_000).invoke_async(&mut conn).await.unwrap();
    assert_eq!(done, [2], "the partition completes");
    let strlen: u64 = server.query(redis::cmd("STRLEN").arg(&index));
    assert_eq!(
        strlen,
        131_072 - 10,
        "grown to the 128 KB class, not doubled"
    );
    let bit: u8 = server.query(redis::cmd("GETBIT").arg(&index).arg(1_000_000));
    assert_eq!(bit, 1);
}
