//! The Lua side: the `apply_stats` fragment's contract when embedded in another script,
//! one slot per script, the ARGV format, and work per field rather than per record.

use crate::support;

use std::sync::Arc;

use tranche_codec::lua::{self, Fragment};
use tranche_codec::{CompletedRecord, KeySchema};
use tranche_stats::archive_protocol::{APPLY_DELTA_LUA, delta_args, stats_keys};
use tranche_stats::{RedisStats, Stats, StatsDelta, StatsStore};

use support::TestRedis;

pub(crate) const T0: u64 = 1_719_234_405_000;

pub(crate) fn rec(pid: u64, worker: &str, at: u64, dur: u64) -> CompletedRecord {
    CompletedRecord {
        pid,
        min_id: (pid - 1) * 1000 + 1,
        max_id: pid * 1000,
        worker: Arc::from(worker),
        completed_at_ms: at,
        duration_ms: dur,
    }
}

fn lua_sources() -> Vec<(String, String)> {
    let out = support::lua_sources(env!("CARGO_MANIFEST_DIR"));
    assert_eq!(
        out.len(),
        5,
        "{:?}",
        out.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    out
}

#[test]
fn scripts_name_keys_only_through_keys() {
    let offenders =
        support::keys_not_from_keys(&lua_sources(), &[("stats_hmget", 0), ("later", 1)]);
    assert!(offenders.is_empty(), "keys not from KEYS[]: {offenders:#?}");
}

#[test]
fn every_script_opens_with_its_keys_and_argv() {
    for (name, source) in lua_sources() {
        let header: String = source
            .lines()
            .take_while(|l| l.starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n");
        assert!(
            header.contains("KEYS[") && header.contains("ARGV["),
            "{name}: {header}"
        );
    }
}

#[test]
fn delta_args_follow_the_documented_format() {
    let d = StatsDelta::from_records(&[
        rec(4970, "worker1", T0, 295_000),
        rec(4971, "worker2", T0 + 3_600_000, 10),
    ]);
    let args = delta_args(&d, 1_719_240_000_000);
    // Histogram buckets: 10 ms is exact; 295,000 ms is 2^18 + 4 * 2^13 + ..., bucket
    // 64 + (18 - 6) * 32 + 4.
    let expected: Vec<String> = [
        "1719240000000",
        "2",
        "2000",
        "295010",
        "1719234405000",
        "1719238005000",
        "2",
        "worker1",
        "1",
        "1000",
        "295000",
        "worker2",
        "1",
        "1000",
        "10",
        "1",
        "0",
        "1",
        "49",
        "69001",
        "71000",
        "1719234405000",
        "1719238005000",
        "2",
        "1",
        "1",
        "295000",
        "1000",
        "2",
        "1",
        "10",
        "1000",
        "1",
        "2024-06-24",
        "2",
        "13",
        "1",
        "14",
        "1",
        "4",
        "*|10",
        "1",
        "*|452",
        "1",
        "worker1|452",
        "1",
        "worker2|10",
        "1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(args[0], (expected.len()).to_string());
    assert_eq!(args[1..], expected[..]);
    assert_eq!(delta_args(&StatsDelta::default(), 5), ["0"]);
}

/// A script of another crate that embeds the fragment after its own keys and args.
fn host_script() -> redis::Script {
    const HOST: Fragment = Fragment::new(
        "redis.call('SET', KEYS[1], ARGV[1])\n\
         local after = apply_stats(2, 3)\n\
         return {after, ARGV[after]}\n",
    );
    redis::Script::new(&lua::compose(&[&APPLY_DELTA_LUA, &HOST]))
}

async fn cluster_conn(server: &TestRedis) -> redis::cluster_async::ClusterConnection {
    let client = redis::cluster::ClusterClient::new(vec![server.url()]).unwrap();
    client.get_async_connection().await.unwrap()
}

#[tokio::test]
async fn the_fragment_runs_inside_another_script_on_one_slot() {
    let server = TestRedis::start_cluster();
    let mut conn = cluster_conn(&server).await;
    let schema = KeySchema::new("elk", 4).unwrap();
    let records: Vec<CompletedRecord> = (0..50u64)
        .map(|i| {
            rec(
                4970 + i * 4,
                ["a", "b"][i as usize % 2],
                T0 + i * 60_000,
                1000 + i,
            )
        })
        .filter(|r| schema.shard_of(r.pid) == 2)
        .collect();
    assert!(records.len() > 10);
    let delta = StatsDelta::from_records(&records);
    let args = delta_args(&delta, T0);

    let script = host_script();
    let mut call = script.prepare_invoke();
    call.key(schema.shard_key(2, "archive-marker"));
    for k in stats_keys(&schema, 2) {
        call.key(k);
    }
    call.arg("marker").arg("host-arg");
    for a in &args {
        call.arg(a);
    }
    call.arg("after-the-delta");
    let (after, tail): (usize, String) = call.invoke_async(&mut conn).await.unwrap();
    assert_eq!(after, 3 + args.len());
    assert_eq!(tail, "after-the-delta");

    let store = RedisStats::new(conn.clone(), schema.clone());
    let mut want = Stats::from_records(&records);
    want.global_stats.last_updated = T0 as f64 / 1000.0;
    assert_eq!(store.stats().await.unwrap(), want);
}

#[tokio::test]
async fn keys_of_two_shards_are_refused_with_crossslot() {
    let server = TestRedis::start_cluster();
    let schema = KeySchema::new("elk", 4).unwrap();
    let mut keys = stats_keys(&schema, 0);
    keys[4] = stats_keys(&schema, 1)[4].clone();
    let delta = StatsDelta::from_records(&[rec(1, "w", T0, 5)]);
    let script = host_script();
    let mut call = script.prepare_invoke();
    call.key(schema.shard_key(0, "archive-marker"));
    for k in &keys {
        call.key(k.as_str());
    }
    call.arg("m").arg("x");
    for a in delta_args(&delta, T0) {
        call.arg(a);
    }
    // The cluster client refuses before sending; a plain connection to the node shows
    // that the server refuses too.
    let mut cluster = cluster_conn(&server).await;
    let err = call
        .invoke_async::<redis::Value>(&mut cluster)
        .await
        .unwrap_err();
    assert!(
        err.to_string().to_uppercase().contains("CROSSSLOT"),
        "{err}"
    );
    let plain = redis::Client::open(server.url()).unwrap();
    let mut plain = plain.get_multiplexed_async_connection().await.unwrap();
    let err = call
        .invoke_async::<redis::Value>(&mut plain)
        .await
        .unwrap_err();
    assert!(
        err.to_string().to_uppercase().contains("CROSSSLOT"),
        "{err}"
    );
}

fn calls(server: &TestRedis, command: &str) -> u64 {
    let info = server.cli(&["INFO", "commandstats"]);
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

#[tokio::test]
async fn work_grows_with_fields_not_records() {
    let server = TestRedis::start();
    let client = redis::Client::open(server.url()).unwrap();
    let conn = client.get_connection_manager().await.unwrap();
    let schema = KeySchema::new("elk", 1).unwrap();
    let store = RedisStats::new(conn, schema);
    // One worker, one range, one hour, one histogram bucket.
    let one = vec![rec(4970, "w", T0 + 50, 300_000)];
    let hundred: Vec<CompletedRecord> = (0..50u64)
        .map(|i| rec(4901 + i, "w", T0 + i, 300_000))
        .collect();

    // The worker's first completion allocates its palette index (one more HINCRBY),
    // and the shard's time bounds are set here once, so that they do not move below.
    let warm = [
        rec(4970, "w", T0, 300_000),
        rec(4970, "w", T0 + 100, 300_000),
    ];
    tranche_stats::testing::apply_alone(&store, 0, &StatsDelta::from_records(&warm), T0)
        .await
        .unwrap();
    let commands = ["hincrby", "hget", "hset", "hmget"];
    let counts = || commands.map(|c| calls(&server, c));
    let before = counts();
    tranche_stats::testing::apply_alone(&store, 0, &StatsDelta::from_records(&one), T0)
        .await
        .unwrap();
    let middle = counts();
    tranche_stats::testing::apply_alone(&store, 0, &StatsDelta::from_records(&hundred), T0)
        .await
        .unwrap();
    let after = counts();
    for (i, command) in commands.iter().enumerate() {
        let for_one = middle[i] - before[i];
        let for_many = after[i] - middle[i];
        assert_eq!(for_one, for_many, "{command}");
    }
    let for_one: u64 = (0..commands.len()).map(|i| middle[i] - before[i]).sum();
    assert!(for_one <= 16, "{for_one} hash commands for one record");
    assert_eq!(
        store.stats().await.unwrap().global_stats.total_completed,
        53
    );

    // An empty delta writes nothing at all.
    let empty = redis::Client::open(server.url()).unwrap();
    let mut c = empty.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("FLUSHALL").query_async(&mut c).await.unwrap();
    tranche_stats::testing::apply_alone(&store, 0, &StatsDelta::default(), T0)
        .await
        .unwrap();
    let keys: Vec<String> = server.query(redis::cmd("KEYS").arg("*"));
    assert!(keys.is_empty(), "{keys:?}");
}

#[tokio::test]
async fn thousands_of_ranges_in_one_delta_fit_lua_limits() {
    let server = TestRedis::start();
    let client = redis::Client::open(server.url()).unwrap();
    let conn = client.get_connection_manager().await.unwrap();
    let store = RedisStats::new(conn, KeySchema::new("elk", 1).unwrap());
    // 3000 ranges: 12,000 bound fields, more than one unpack can take at once.
    let records: Vec<CompletedRecord> = (0..3000u64)
        .map(|i| rec(1 + i * 100, "w", T0 + i, 1 + i))
        .collect();
    store
        .replace(0, &StatsDelta::from_records(&records))
        .await
        .unwrap();
    let got = store.stats().await.unwrap();
    assert_eq!(got.range_stats.len(), 3000);
    assert!(tranche_stats::diff(&Stats::from_records(&records), &got).is_empty());
}

#[tokio::test]
async fn a_counter_near_int64_is_refused_before_any_write() {
    let server = TestRedis::start();
    let client = redis::Client::open(server.url()).unwrap();
    let conn = client.get_connection_manager().await.unwrap();
    let schema = KeySchema::new("elk", 1).unwrap();
    let store = RedisStats::new(conn, schema.clone());
    // One partition covering 10^18 IDs: the delta itself is refused.
    let huge = CompletedRecord {
        pid: 1,
        min_id: 1,
        max_id: 1_000_000_000_000_000_000,
        worker: Arc::from("w"),
        completed_at_ms: T0,
        duration_ms: 1,
    };
    let err = tranche_stats::testing::apply_alone(
        &store,
        0,
        &StatsDelta::from_records(std::slice::from_ref(&huge)),
        T0,
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("nothing was applied"), "{err}");
    let keys: Vec<String> = server.query(redis::cmd("KEYS").arg("*"));
    assert!(keys.is_empty(), "{keys:?}");

    // Half of it twice: the first is applied, the second would pass 10^18 only once
    // the counter already holds more than 18 digits, so it is refused then.
    let mut half = huge.clone();
    half.max_id = 999_999_999_999_999_999;
    tranche_stats::testing::apply_alone(&store, 0, &StatsDelta::from_records(&[half.clone()]), T0)
        .await
        .unwrap();
    tranche_stats::testing::apply_alone(&store, 0, &StatsDelta::from_records(&[half.clone()]), T0)
        .await
        .unwrap();
    let before: Vec<(String, String)> =
        server.query(redis::cmd("HGETALL").arg(&stats_keys(&schema, 0)[1]));
    let err =
        tranche_stats::testing::apply_alone(&store, 0, &StatsDelta::from_records(&[half]), T0)
            .await
            .unwrap_err();
    assert!(err.to_string().contains("reached 10^18"), "{err}");
    let after: Vec<(String, String)> =
        server.query(redis::cmd("HGETALL").arg(&stats_keys(&schema, 0)[1]));
    assert_eq!(before, after);
    assert_eq!(store.stats().await.unwrap().global_stats.total_completed, 2);

    // A repair with such a delta keeps the old statistics rather than none.
    let err = store
        .replace(0, &StatsDelta::from_records(std::slice::from_ref(&huge)))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("nothing was applied"), "{err}");
    assert_eq!(store.stats().await.unwrap().global_stats.total_completed, 2);
}

#[tokio::test]
async fn a_range_of_a_hundred_partitions_costs_under_half_a_byte_per_partition() {
    let compact = ranges_bytes_per_partition(false).await;
    assert!(compact < 0.5, "ranges: {compact:.3} bytes per partition");
    // Packed bodies (archive format 3) land each block of 64 ranges in a smaller
    // allocation.
    let packed = ranges_bytes_per_partition(true).await;
    assert!(
        packed < 0.35 && packed < compact,
        "packed ranges: {packed:.3} bytes per partition, compact {compact:.3}"
    );
}

/// Feeds the benchmark's set S through the standalone apply and returns the ranges
/// hash's bytes per partition (after checking that the statistics read back exactly).
async fn ranges_bytes_per_partition(packed: bool) -> f64 {
    let server = TestRedis::start();
    let client = redis::Client::open(server.url()).unwrap();
    let conn = client.get_connection_manager().await.unwrap();
    let schema = KeySchema::new("elk", 1).unwrap();
    let store = RedisStats::new(conn, schema.clone());
    // The benchmark's set S: 8 workers taking turns, whole-second times and durations,
    // 1000-ID partitions, so 100 partitions per range; 640 ranges, 10 blocks.
    let n = 64_000u64;
    let records: Vec<CompletedRecord> = (1..=n)
        .map(|pid| {
            let w = format!("worker{}", pid % 8 + 1);
            rec(
                pid,
                &w,
                T0 + pid / 8 * 300_000,
                (200 + pid * 7919 % 200) * 1000,
            )
        })
        .collect();
    for chunk in records.chunks(1000) {
        let delta = StatsDelta::from_records(chunk);
        if packed {
            tranche_stats::testing::apply_alone_packed(&store, 0, &delta, T0).await
        } else {
            tranche_stats::testing::apply_alone(&store, 0, &delta, T0).await
        }
        .unwrap();
    }
    let got = store.stats().await.unwrap();
    assert!(tranche_stats::diff(&Stats::from_records(&records), &got).is_empty());
    let keys = stats_keys(&schema, 0);
    let per_partition = |key: &str| server.bytes_of(&[key]) as f64 / n as f64;
    let hourly = per_partition(&keys[3]);
    assert!(hourly < 0.05, "hourly: {hourly:.4} bytes per partition");
    per_partition(&keys[2])
}

/// Redis does not undo a script's writes when a later step fails, so a delta that
/// meets a corrupt value anywhere (a packed range block, a day of hourly counts, a
/// counter that is not an integer) must fail before its first write: not one key
/// changes, and applying it again cannot count anything twice.
#[tokio::test]
async fn a_delta_that_meets_a_corrupt_value_writes_nothing() {
    let server = TestRedis::start();
    let client = redis::Client::open(server.url()).unwrap();
    let conn = client.get_connection_manager().await.unwrap();
    let schema = KeySchema::new("elk", 1).unwrap();
    let store = RedisStats::new(conn, schema.clone());
    let keys = stats_keys(&schema, 0);
    let batch = |pids: std::ops::RangeInclusive<u64>| {
        let recs: Vec<CompletedRecord> = pids.map(|p| rec(p, "worker1", T0 + p, 1000)).collect();
        StatsDelta::from_records(&recs)
    };
    tranche_stats::testing::apply_alone(&store, 0, &batch(1..=1), T0)
        .await
        .unwrap();
    let first_field = |key: &str| -> String {
        let fields: Vec<String> = server.query(redis::cmd("HKEYS").arg(key));
        fields.into_iter().min().unwrap()
    };
    // Each corruption: the key, the field (one the next delta touches), the bad value.
    let corruptions: [(&str, String, &[u8]); 5] = [
        (&keys[2], first_field(&keys[2]), b"\x80"),
        (&keys[3], first_field(&keys[3]), b"\x00\x80"),
        (&keys[1], "worker1|count".into(), b"many"),
        (&keys[4], first_field(&keys[4]), b"1.5"),
        (&keys[0], "ids".into(), b"x"),
    ];
    for (key, field, bad) in corruptions {
        let field = field.as_str();
        let good: Vec<u8> = server.query(redis::cmd("HGET").arg(key).arg(field));
        let _: () = server.query(redis::cmd("HSET").arg(key).arg(field).arg(bad));
        let before = server.dump_all();
        for _ in 0..2 {
            let Err(err) =
                tranche_stats::testing::apply_alone(&store, 0, &batch(2..=100), T0).await
            else {
                panic!("{key} {field}: applied over a corrupt value")
            };
            assert!(
                err.to_string().contains("nothing was applied")
                    || err.to_string().contains("corrupt"),
                "{key} {field}: {err}"
            );
            assert_eq!(server.dump_all(), before, "{key} {field}: a key changed");
        }
        let _: () = server.query(redis::cmd("HSET").arg(key).arg(field).arg(good));
    }
    // Repaired, the same delta applies once.
    tranche_stats::testing::apply_alone(&store, 0, &batch(2..=100), T0)
        .await
        .unwrap();
    assert_eq!(
        store.stats().await.unwrap().global_stats.total_completed,
        100
    );
}
