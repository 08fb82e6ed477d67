//! Every Lua script is an atomic unit on one Redis Cluster slot.
//!
//! Three checks together prove it: scripts name keys only through `KEYS[]` (Redis 7 does
//! not stop a script on a one-node cluster from reaching an undeclared key, so this is
//! checked on the source); the store passes only one shard's keys (the behaviour suite
//! runs every script against a cluster node, which refuses cross-slot `KEYS` with
//! CROSSSLOT); and that node does refuse them, which the negative control below shows.
//! Every script also checks its whole input before its first write: the refusal table
//! in refusal.rs, run with bad arguments, corrupt values and keys of the wrong type
//! (refusal/wrong_type.rs).

use crate::support;

use support::TestRedis;

mod refusal;

use refusal::{call, refusal_state};

fn lua_sources() -> Vec<(String, String)> {
    support::lua_sources(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn scripts_name_keys_only_through_keys() {
    let offenders = support::keys_not_from_keys(
        &lua_sources(),
        &[
            ("variadic", 1),
            ("count", 0),
            ("start_counting", 0),
            ("read_counts", 0),
            ("read_plans", 0),
            ("read_cursors", 0),
            ("runs_store", 0),
            ("grow_bitmap", 0),
            ("reserve_tokens", 0),
            ("expect_type", 0),
        ],
    );
    assert!(offenders.is_empty(), "key not from KEYS[]: {offenders:#?}");
}

#[test]
fn every_script_opens_with_its_keys_and_argv() {
    for (name, source) in lua_sources() {
        let head: String = source
            .lines()
            .take_while(|l| l.starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n");
        if name == "record.lua" || name == "split.lua" || name == "runs.lua" {
            assert!(head.contains("prelude"), "{name}");
            continue;
        }
        assert!(
            head.contains("KEYS[1]") && head.contains("ARGV"),
            "{name} must document KEYS and ARGV:\n{head}"
        );
        let used = source.matches("KEYS[").count();
        assert!(used > 0, "{name} touches no key");
    }
}

#[test]
fn every_script_is_loaded_by_the_store() {
    let loaded: Vec<String> = tranche_active_store::scripts()
        .iter()
        .map(|(n, _)| format!("{n}.lua"))
        .collect();
    for (name, _) in lua_sources() {
        assert!(
            name == "record.lua"
                || name == "split.lua"
                || name == "runs.lua"
                || loaded.contains(&name),
            "{name} is not loaded by the store"
        );
    }
}

#[tokio::test]
async fn the_cluster_harness_refuses_cross_slot_scripts() {
    let server = TestRedis::start_cluster();
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let schema = tranche_codec::KeySchema::new("elk", 4).unwrap();
    let err = redis::Script::new("return 1")
        .key(schema.active(0))
        .key(schema.active(1))
        .invoke_async::<i64>(&mut conn)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("CROSSSLOT"), "{err}");
    let ok: i64 = redis::Script::new("return 1")
        .key(schema.active(1))
        .key(schema.inbox(1))
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(ok, 1);
}

/// A corrupt record met by `claim.lua` is refused by key and pid before the first write:
/// Redis keeps what a failing script wrote, so checking late would orphan the pending
/// entry of every record it had already taken off the queue.
#[tokio::test]
async fn a_claim_that_meets_a_corrupt_record_writes_nothing() {
    use tranche_active_store::Leases;
    let server = TestRedis::start();
    let store = one_shard(&server).await;
    let leases = store.claim("w", 3).await.unwrap();
    for lease in &leases {
        store.release(lease, 0).await.unwrap();
    }
    let schema = tranche_codec::KeySchema::new("elk", 1).unwrap();
    let active = schema.active(0);
    let record: String = server.query(redis::cmd("HGET").arg(&active).arg(2));
    let mut fields: Vec<&str> = record.split('|').collect();
    fields[1] = "x";
    server.cli(&["HSET", &active, "2", &fields.join("|")]);

    let before = server.dump_all();
    let err = store.claim("w", 3).await.unwrap_err().to_string();
    assert!(
        err.contains("corrupt record") && err.contains(&active) && err.contains(" 2:"),
        "{err}"
    );
    assert_eq!(server.dump_all(), before, "the refused claim wrote");
}

/// One record that does not decode costs its own lease only: `all_active` leaves it out
/// and lists its pid, and a batched heartbeat and a group commit that meet it answer
/// that lease with the corruption, named by key and pid, leave the record as it is, and
/// renew or complete the other leases of the call.
/// (Refusing the call would leave every lease of the shard in it unrenewed, or every
/// completion unreported and its partition to run again.)
#[tokio::test]
async fn a_corrupt_record_costs_its_own_lease_only() {
    use tranche_active_store::{ActiveQuery, Completion, Error, Leases};
    let server = TestRedis::start();
    let store = one_shard(&server).await;
    let leases = store.claim("w", 3).await.unwrap();
    // A beat moves each pid out of its run into a record of its own.
    for lease in &leases {
        store.heartbeat(lease, lease.min_id).await.unwrap();
    }
    let active = tranche_codec::KeySchema::new("elk", 1).unwrap().active(0);
    // Not even UTF-8 (a flipped high bit): the beat's reply quotes it.
    let garbage = b"r|\xff\xfegarbage".to_vec();
    let _: () = server.query(redis::cmd("HSET").arg(&active).arg(2).arg(&garbage));
    let named = |err: &Error| {
        let text = err.to_string();
        assert!(
            matches!(err, Error::Corrupt { .. }) && text.contains(&format!("{active} 2")),
            "{text}"
        );
    };

    // A read of the whole active set leaves it out and names it.
    let snapshot = store.all_active().await.unwrap();
    let pids: Vec<u64> = snapshot.partitions.iter().map(|p| p.pid).collect();
    assert_eq!((pids, snapshot.corrupt), (vec![1, 3], vec![2]));

    let beats: Vec<(_, u64)> = leases.iter().map(|l| (l.clone(), l.min_id + 100)).collect();
    let beaten = store.heartbeat_many(&beats).await.unwrap();
    assert!(beaten[0].is_ok() && beaten[2].is_ok(), "{beaten:?}");
    named(beaten[1].as_ref().unwrap_err());
    for pid in [1, 3] {
        let p = store.get(pid).await.unwrap().unwrap();
        assert_eq!(p.progress, p.min_id + 100, "pid {pid} renewed");
    }

    let done: Vec<(_, u64)> = leases.iter().map(|l| (l.clone(), 10)).collect();
    let completed = store.complete_many(&done).await.unwrap();
    assert!(
        matches!(completed[0], Ok(Completion::Completed))
            && matches!(completed[2], Ok(Completion::Completed)),
        "{completed:?}"
    );
    named(completed[1].as_ref().unwrap_err());
    assert_eq!(store.get(1).await.unwrap(), None);
    assert_eq!(store.get(3).await.unwrap(), None);
    let left: Vec<u8> = server.query(redis::cmd("HGET").arg(&active).arg(2));
    assert_eq!(left, garbage);
}

/// One run that does not decode costs its own leases only, as a corrupt record does:
/// `all_active` leaves it out and lists the pids it still names, and a batched heartbeat
/// and a group commit answer the leases it holds with the corruption, named by runs key
/// and token, renew or complete every other lease of the call (another run's, and a
/// pid that left the broken run for a record of its own before the damage), and never
/// write the run.
#[tokio::test]
async fn a_corrupt_run_costs_its_own_leases_only() {
    use tranche_active_store::{ActiveQuery, Completion, Error, Leases};
    let server = TestRedis::start();
    let store = one_shard(&server).await;
    // Two claims, two runs on the one shard: pids 1..=3, and 4..=6.
    let good = store.claim("w", 3).await.unwrap();
    let bad = store.claim("v", 3).await.unwrap();
    let pids = |leases: &[tranche_active_store::Lease]| -> Vec<u64> {
        leases.iter().map(|l| l.pid).collect()
    };
    assert_eq!((pids(&good), pids(&bad)), (vec![1, 2, 3], vec![4, 5, 6]));
    let token = bad[0].token;
    assert!(bad.iter().all(|l| l.token == token) && good[0].token != token);
    // Pid 4 leaves its run for a record of its own before the damage.
    store.heartbeat(&bad[0], bad[0].min_id).await.unwrap();
    let schema = tranche_codec::KeySchema::new("elk", 1).unwrap();
    let runs = schema.runs(0);
    // Its first and last fields still read; the rest is not even UTF-8.
    let garbage = b"4|6|\xff\xfe|garbage".to_vec();
    let _: () = server.query(redis::cmd("HSET").arg(&runs).arg(token).arg(&garbage));
    let named = |err: &Error| {
        let text = err.to_string();
        assert!(
            matches!(err, Error::Corrupt { .. }) && text.contains(&format!("{runs} {token}")),
            "{text}"
        );
    };
    let leases: Vec<_> = good.iter().chain(&bad).cloned().collect();

    // A read of the whole active set leaves the run out and names the pids it holds,
    // read the ordinary way or on a bulk connection.
    let snapshot = store.all_active().await.unwrap();
    let active: Vec<u64> = snapshot.partitions.iter().map(|p| p.pid).collect();
    assert_eq!((active, &snapshot.corrupt), (vec![1, 2, 3, 4], &vec![5, 6]));
    let conn = tranche_active_store::RedisConnection::connect(&server.url())
        .await
        .unwrap();
    let config = tranche_active_store::Config {
        namespace: "elk".into(),
        num_shards: 1,
        ..tranche_active_store::Config::default()
    };
    let bulk = tranche_active_store::RedisActiveStore::new(conn, config).unwrap();
    assert_eq!(bulk.all_active().await.unwrap(), snapshot);
    named(&store.get(5).await.unwrap_err());

    let beats: Vec<(_, u64)> = leases.iter().map(|l| (l.clone(), l.min_id + 100)).collect();
    let beaten = store.heartbeat_many(&beats).await.unwrap();
    assert!(beaten[..4].iter().all(Result::is_ok), "{beaten:?}");
    named(beaten[4].as_ref().unwrap_err());
    named(beaten[5].as_ref().unwrap_err());
    for pid in 1..=4 {
        let p = store.get(pid).await.unwrap().unwrap();
        assert_eq!(p.progress, p.min_id + 100, "pid {pid} renewed");
    }

    let done: Vec<(_, u64)> = leases.iter().map(|l| (l.clone(), 10)).collect();
    let completed = store.complete_many(&done).await.unwrap();
    assert!(
        completed[..4]
            .iter()
            .all(|c| matches!(c, Ok(Completion::Completed))),
        "{completed:?}"
    );
    named(completed[4].as_ref().unwrap_err());
    named(completed[5].as_ref().unwrap_err());
    for pid in 1..=3 {
        assert_eq!(store.get(pid).await.unwrap(), None, "pid {pid} completed");
    }
    // Pid 4 completed too, by its record: `get` cannot tell it from a pid the run holds
    // (the run still names it), its completed bit can. The run's pids are not completed,
    // still counted claimed, and the run is as it was.
    let index = schema.completed_index(0);
    let bits: Vec<u8> = (1..=6)
        .map(|pid| server.query(redis::cmd("GETBIT").arg(&index).arg(schema.bit_offset(pid))))
        .collect();
    assert_eq!(bits, [1, 1, 1, 1, 0, 0]);
    let counts = store.counts().await.unwrap();
    assert_eq!((counts.claimed, counts.running), (2, 0));
    let left: Vec<u8> = server.query(redis::cmd("HGET").arg(&runs).arg(token));
    assert_eq!(left, garbage);
    let entry: Option<f64> = server.query(
        redis::cmd("ZSCORE")
            .arg(schema.leases(0))
            .arg(format!("r{token}")),
    );
    assert!(entry.is_some(), "the run's lease entry went");
}

/// The lease index stays a skiplist however few leases it holds: a listpack inserts in
/// O(entries), which made ZADD the largest single cost of a claim.
#[tokio::test]
async fn the_lease_index_is_a_skiplist() {
    use tranche_active_store::{Leases, Maintenance};
    let server = TestRedis::start();
    let store = one_shard(&server).await;
    let leases = store.claim("w", 3).await.unwrap();
    let key = tranche_codec::KeySchema::new("elk", 1).unwrap().leases(0);
    assert_eq!(server.cli(&["OBJECT", "ENCODING", &key]), "skiplist");
    // Not a lease: a worker's release and the reaper pass it by.
    assert_eq!(store.release_worker("w").await.unwrap().len(), 3);
    assert_eq!(server.cli(&["ZCARD", &key]), "1");
    // The same member as every earlier version wrote, so an existing index keeps one.
    let keeper = format!("tranche:skiplist-keeper:{}", "~".repeat(232));
    assert_eq!(server.cli(&["ZSCORE", &key, &keeper]), "inf");
    drop(leases);
}

/// A corrupt active record is found by `corrupt_records`, passed by the reaper, and
/// `repair_corrupt` sets it aside in the shard's quarantine: a pending or claimed pid is
/// pending again from its min id with no attempt spent, a completed one is removed, and
/// the counters are derived again. A record that decodes has nothing to repair.
#[tokio::test]
async fn a_corrupt_record_is_found_passed_by_and_repaired() {
    use tranche_active_store::{ActiveQuery, Leases, Maintenance, Repair};
    use tranche_codec::Status;
    let server = TestRedis::start();
    let store = one_shard(&server).await;
    let leases = store.claim("w", 4).await.unwrap();
    store.heartbeat(&leases[1], 1500).await.unwrap();
    store.complete(&leases[3], 10).await.unwrap();
    let active = tranche_codec::KeySchema::new("elk", 1).unwrap().active(0);
    let quarantine = format!("{active}:quarantine");
    // Pid 2 (claimed, checkpoint 1500) is garbage; pid 4 (completed) has a record again.
    server.cli(&["HSET", &active, "2", "garbage"]);
    server.cli(&["HSET", &active, "4", "p|x"]);
    let found = store.corrupt_records().await.unwrap();
    let pids: Vec<Option<u64>> = found.iter().map(|c| c.pid).collect();
    assert_eq!(pids, [Some(2), Some(4)]);
    assert_eq!(found[0].raw, b"garbage".to_vec());
    assert_eq!(found[0].key, active);

    // The reaper passes the corrupt lease by and reaps the others.
    let mut reaped = store.reap(99_999_999_999_999).await.unwrap();
    reaped.sort_unstable();
    assert_eq!(reaped, [1, 3]);

    assert_eq!(store.repair_corrupt(2).await.unwrap(), Repair::Rebuilt);
    assert_eq!(store.repair_corrupt(4).await.unwrap(), Repair::Removed);
    assert_eq!(store.repair_corrupt(2).await.unwrap(), Repair::Nothing);
    assert!(store.corrupt_records().await.unwrap().is_empty());
    let two = store.get(2).await.unwrap().unwrap();
    assert_eq!(
        (
            two.status,
            two.attempts,
            two.progress,
            two.min_id,
            two.max_id
        ),
        (Status::Pending, 0, 1001, 1001, 2000)
    );
    assert!(two.last_error.unwrap().contains("corrupt record"));
    assert_eq!(store.get(4).await.unwrap(), None);
    let set_aside: Vec<String> = server.query(redis::cmd("HVALS").arg(&quarantine));
    assert_eq!(set_aside.len(), 2);
    assert!(set_aside.contains(&"garbage".to_owned()), "{set_aside:?}");
    let counts = store.counts().await.unwrap();
    assert_eq!((counts.pending, counts.claimed), (3, 0));
    assert_eq!(store.all_active().await.unwrap().partitions.len(), 3);
    // The rebuilt pid is claimed again, from its min id.
    let again = store.claim("w", 3).await.unwrap();
    assert!(again.iter().any(|l| l.pid == 2 && l.progress == 1001));
}

/// A claim whose walk meets a failing shard after others handed out leases returns
/// those leases: none is left claimed without a worker knowing it holds it (it would
/// sit out its lease). Only a claim that took nothing is an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_shard_keeps_the_leases_taken_before_it() {
    use std::collections::BTreeSet;
    use tranche_active_store::{ActiveQuery, Leases};
    use tranche_codec::{KeySchema, Status};
    let server = TestRedis::start();
    let client = redis::Client::open(server.url()).unwrap();
    let conn = client.get_connection_manager().await.unwrap();
    // 800 pids: eight batches of 100, two on each shard.
    let store = crate::planned(conn, "fs", 4, (1, 40_000, 50)).await;
    // The pending counter of the shard of pid 1 is garbage: every claim that reaches
    // that shard fails there, before its script writes anything.
    let schema = KeySchema::new("fs", 4).unwrap();
    let failing = schema.shard_of(1);
    server.cli(&["HSET", &schema.shard_key(failing, "counts"), "p", "garbage"]);
    let (mut returned, mut failed) = (BTreeSet::new(), 0);
    // Workers whose walks start at different shards, each asking for everything.
    for w in 0..8 {
        match store.claim(&format!("w{w}"), 1_000).await {
            Ok(leases) => returned.extend(leases.iter().map(|l| l.pid)),
            Err(_) => failed += 1,
        }
    }
    let mut claimed = BTreeSet::new();
    for pid in 1..=800 {
        if store.get(pid).await.unwrap().unwrap().status == Status::Claimed {
            claimed.insert(pid);
        }
    }
    assert!(
        !claimed.is_empty() && claimed.iter().all(|&pid| schema.shard_of(pid) != failing),
        "the healthy shards' pids, none of the failing one's: {claimed:?}"
    );
    assert_eq!(claimed, returned, "claimed pids no claim returned");
    assert!(failed > 0, "no claim reached the failing shard");
}

/// A store of namespace `elk` on one shard of `server`, with pids 1..=10 planned.
async fn one_shard(
    server: &TestRedis,
) -> tranche_active_store::RedisActiveStore<redis::aio::ConnectionManager> {
    let client = redis::Client::open(server.url()).unwrap();
    let conn = client.get_connection_manager().await.unwrap();
    crate::planned(conn, "elk", 1, (1, 10_000, 1000)).await
}

/// Fencing survives a counter that rolls back (a failover to a replica that had not
/// seen the last claims): tokens follow the server's clock, so a token handed out after
/// the rollback is above every one before it.
#[tokio::test]
async fn tokens_stay_unique_when_the_sequence_rolls_back() {
    use tranche_active_store::Leases;
    let server = TestRedis::start();
    let store = one_shard(&server).await;
    let first = store.claim("w", 3).await.unwrap();
    let highest = first.iter().map(|l| l.token).max().unwrap();
    let seq = tranche_codec::KeySchema::new("elk", 1)
        .unwrap()
        .shard_key(0, "seq");
    // The rollback: the counter as it was before those claims.
    server.cli(&["SET", &seq, "0"]);
    // The token floor follows the server's clock in ms: wait until it has moved on.
    server.wait_for_time_past(server.time_ms());
    let after = store.claim("w", 3).await.unwrap();
    assert!(
        after.iter().all(|l| l.token > highest),
        "{highest} then {:?}",
        after.iter().map(|l| l.token).collect::<Vec<_>>()
    );
}

/// `carry` (Redis only, so outside the behaviour suite) on a cluster node: its keys are
/// one shard's, in one slot, and it changes only pending records, once.
#[tokio::test]
async fn carry_runs_on_a_cluster_node_and_changes_pending_records_once() {
    use tranche_active_store::{
        ActiveQuery, Carried, Config, Leases, Plan, Planner, RedisActiveStore, RedisConnection,
    };
    use tranche_codec::Status;
    let node = TestRedis::start_cluster();
    let conn = RedisConnection::connect(&node.url()).await.unwrap();
    let store = RedisActiveStore::new(
        conn,
        Config {
            num_shards: 4,
            ..Config::default()
        },
    )
    .unwrap();
    store
        .plan(&Plan::Uniform {
            min: 1,
            max: 8000,
            size: 1000,
        })
        .await
        .unwrap();
    // Pending records exist once claimed partitions are released.
    for lease in store.claim("w", 8).await.unwrap() {
        store.release(&lease, lease.min_id).await.unwrap();
    }
    let carried = [
        Carried {
            pid: 2,
            attempts: 2,
            failed: false,
            worker: String::new(),
        },
        Carried {
            pid: 7,
            attempts: 3,
            failed: true,
            worker: "old-worker".into(),
        },
    ];
    assert_eq!(store.carry(&carried).await.unwrap(), 2);
    let two = store.get(2).await.unwrap().unwrap();
    assert_eq!((two.status, two.attempts), (Status::Pending, 2));
    let seven = store.get(7).await.unwrap().unwrap();
    assert_eq!(
        (seven.status, seven.attempts, seven.worker.as_deref()),
        (Status::Failed, 3, Some("old-worker"))
    );
    assert_eq!(store.counts().await.unwrap().failed, 1);
    // Again: nothing more changes.
    assert_eq!(store.carry(&carried).await.unwrap(), 0);
}

/// `{ns}:meta` records a namespace's shard count and key layout once, on a cluster
/// node too (`register.lua` touches `{ns}:meta` only): a second registration with the
/// same settings is a no-op, one with others is refused and changes nothing, and a
/// namespace recorded before layouts (no `layout` field) reads as the plain layout and
/// never gets the spread one added.
#[tokio::test]
async fn the_keys_meta_is_recorded_once() {
    use tranche_active_store::{Error, KeysMeta};
    use tranche_codec::KeyLayout;
    let server = TestRedis::start_cluster();
    let conn = tranche_active_store::RedisConnection::connect(&server.url())
        .await
        .unwrap();
    assert_eq!(KeysMeta::read(&conn, "new").await.unwrap(), None);
    let new = KeysMeta::new_namespace(16);
    assert_eq!(new.layout, KeyLayout::Spread);
    new.register(&conn, "new").await.unwrap();
    new.register(&conn, "new").await.unwrap();
    assert_eq!(KeysMeta::read(&conn, "new").await.unwrap(), Some(new));
    let other = KeysMeta::new_namespace(8);
    let err = other.register(&conn, "new").await.unwrap_err();
    assert!(matches!(err, Error::NamespaceMismatch { .. }), "{err}");
    assert!(err.is_permanent());

    server.cli(&["HSET", "{old}:meta", "shards", "16"]);
    let old = KeysMeta::read(&conn, "old").await.unwrap().unwrap();
    assert_eq!((old.shards, old.layout), (16, KeyLayout::Plain));
    let err = new.register(&conn, "old").await.unwrap_err();
    assert!(err.to_string().contains("key layout 1"), "{err}");
    old.register(&conn, "old").await.unwrap();
    assert_eq!(server.cli(&["HEXISTS", "{old}:meta", "layout"]), "0");

    server.cli(&["HSET", "{future}:meta", "shards", "4", "layout", "3"]);
    let err = KeysMeta::read(&conn, "future").await.unwrap_err();
    assert!(matches!(err, Error::Corrupt { .. }), "{err}");
}

/// `carry.lua` and `register.lua` check every argument before their first write: a
/// malformed entry late in a carry, or a register with a bad shard count or layout, is
/// refused and no key changes.
#[tokio::test]
async fn carry_and_register_refuse_malformed_arguments_before_writing() {
    use tranche_active_store::{Leases, scripts};
    let server = TestRedis::start();
    let store = one_shard(&server).await;
    for lease in store.claim("w", 3).await.unwrap() {
        store.release(&lease, lease.min_id).await.unwrap();
    }
    let script = |name: &str| {
        scripts()
            .into_iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("no script {name}"))
            .1
    };
    let schema = tranche_codec::KeySchema::new("elk", 1).unwrap();
    let conn = redis::Client::open(server.url()).unwrap();
    let mut conn = conn.get_multiplexed_async_connection().await.unwrap();
    let before = server.dump_all();
    // The first entry is good (pid 1 is pending); the second is not.
    for bad in [
        ["x", "1", "p", "w"],
        ["2", "-1", "p", "w"],
        ["2", "1", "r", "w"],
        ["2", "1", "p", "a|b"],
    ] {
        let mut call = script("carry").prepare_invoke();
        call.key(schema.active(0))
            .key(schema.pending(0))
            .key(schema.shard_key(0, "counts"));
        call.arg("1700000000000")
            .arg(&["1", "5", "p", "w"][..])
            .arg(&bad[..]);
        let err = call.invoke_async::<i64>(&mut conn).await.unwrap_err();
        assert!(err.to_string().contains("malformed"), "{bad:?}: {err}");
        assert_eq!(server.dump_all(), before, "a refused carry wrote ({bad:?})");
    }
    for (shards, layout) in [("0", "2"), ("x", "2"), ("16", ""), ("16", "-1")] {
        let mut call = script("register").prepare_invoke();
        call.key(schema.meta()).arg(shards).arg(layout);
        let err = call
            .invoke_async::<redis::Value>(&mut conn)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("positive integers"), "{err}");
        assert_eq!(server.dump_all(), before, "a refused register wrote");
    }
}

/// `complete.lua` checks the common pid, token and bit offset (nonzero, at most 19
/// digits) in one match and passes anything else to the full check: a zero and a
/// 20-digit ID up to 2^64 - 1 are still taken (here for leases not held: lost), one
/// above it, a leading zero or a sign still refused, and nothing is written.
#[tokio::test]
async fn complete_takes_every_id_the_full_check_takes() {
    let server = TestRedis::start();
    let tokens = refusal_state(&server).await;
    let schema = tranche_codec::KeySchema::new("elk", 1).unwrap();
    let keys = vec![
        schema.active(0),
        schema.leases(0),
        schema.completed_index(0),
        schema.inbox(0),
        schema.shard_key(0, "counts"),
        schema.shard_key(0, "splits"),
        schema.runs(0),
    ];
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let args = |pid: &str, token: &str, bit: &str| -> Vec<String> {
        vec![pid.into(), token.into(), bit.into(), "{}".into()]
    };
    let before = refusal::contents(&server);
    for (pid, token, bit) in [
        ("0", "1", "0"),
        ("9", "18446744073709551615", "0"),
        ("18446744073709551615", "0", "1"),
        ("3", &*(tokens[&3] + 1).to_string(), "3000"),
    ] {
        let reply = call(&mut conn, "complete", &keys, &args(pid, token, bit)).await;
        assert_eq!(
            reply,
            Ok(redis::Value::Array(vec![redis::Value::Int(-1)])),
            "{pid} {token} {bit}"
        );
    }
    for (pid, token, bit, what) in [
        ("9", "18446744073709551616", "1", "token"),
        ("09", "1", "1", "pid"),
        ("9", "1", "+1", "bit offset"),
        ("9", "1 ", "1", "token"),
        ("99999999999999999999", "1", "1", "pid"),
    ] {
        let err = call(&mut conn, "complete", &keys, &args(pid, token, bit))
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains(&format!("bad argument: {what}")),
            "{pid} {token} {bit}: {err}"
        );
    }
    // Compared by contents: a lookup may move a hash's incremental rehash on, which
    // changes its DUMP but not what it holds.
    assert!(
        refusal::contents(&server) == before,
        "a refused or lost completion wrote"
    );
}

/// A claim skips the look for ready work only when exact (marked) counters count no
/// pending record: with the mark gone, a released partition is still found and
/// reclaimed first.
#[tokio::test]
async fn a_claim_looks_for_ready_work_unless_marked_counters_say_none() {
    use tranche_active_store::Leases;
    let server = TestRedis::start();
    refusal_state(&server).await;
    let counts = tranche_codec::KeySchema::new("elk", 1)
        .unwrap()
        .shard_key(0, "counts");
    // Pid 5 is pending (released). Unmarked counters that say no partition is pending
    // are not believed.
    server.cli(&["HDEL", &counts, "v"]);
    server.cli(&["HSET", &counts, "p", "0"]);
    let store = one_shard(&server).await;
    let leases = store.claim("w2", 1).await.unwrap();
    assert_eq!(leases.iter().map(|l| l.pid).collect::<Vec<_>>(), [5]);
    assert_eq!(leases[0].progress, 4000, "reclaimed from its checkpoint");
}

/// When `complete` returns, the shard of a completed partition is marked in
/// `{ns}:dirty` for the archivers: on one server the mark rides behind the script in
/// the same round trip (also when the server has lost the script and it is loaded
/// again), on a cluster it follows the reply. A refused completion is an error.
#[tokio::test]
async fn a_completion_has_marked_its_shard_dirty_when_it_returns() {
    use tranche_active_store::{
        Completion, Config, Leases, Plan, Planner, RedisActiveStore, RedisConnection,
    };
    let single = TestRedis::start();
    let cluster = TestRedis::start_cluster();
    for (server, flush) in [(&single, false), (&single, true), (&cluster, false)] {
        let conn = RedisConnection::connect(&server.url()).await.unwrap();
        let namespace = format!("dirt{}", u8::from(flush));
        let store = RedisActiveStore::new(
            conn,
            Config {
                namespace: namespace.clone(),
                num_shards: 4,
                ..Config::default()
            },
        )
        .unwrap();
        store
            .plan(&Plan::Uniform {
                min: 1,
                max: 9000,
                size: 1000,
            })
            .await
            .unwrap();
        let schema = tranche_codec::KeySchema::new(&namespace, 4)
            .unwrap()
            .with_layout(store.config().layout);
        let leases = store.claim("w", 8).await.unwrap();
        if flush {
            server.cli(&["SCRIPT", "FLUSH"]);
        }
        for lease in &leases {
            let shard = schema.shard_of(lease.pid).to_string();
            server.cli(&["SREM", &schema.dirty(), &shard]);
            assert_eq!(
                store.complete(lease, 5).await.unwrap(),
                Completion::Completed
            );
            assert_eq!(
                server.cli(&["SISMEMBER", &schema.dirty(), &shard]),
                "1",
                "pid {} on {}",
                lease.pid,
                server.url()
            );
        }
        // A corrupt counter refuses the completion, and says so.
        let more = store.claim("w", 1).await.unwrap();
        let counts = schema.shard_key(schema.shard_of(more[0].pid), "counts");
        server.cli(&["HSET", &counts, "c", "x"]);
        let err = store.complete(&more[0], 5).await.unwrap_err();
        assert!(err.to_string().contains("counter"), "{err}");
    }
}
