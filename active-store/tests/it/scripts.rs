//! Every Lua script is an atomic unit on one Redis Cluster slot.
//!
//! Three checks together prove it: scripts name keys only through `KEYS[]` (Redis 7 does
//! not stop a script on a one-node cluster from reaching an undeclared key, so this is
//! checked on the source); the store passes only one shard's keys (the behaviour suite
//! runs every script against a cluster node, which refuses cross-slot `KEYS` with
//! CROSSSLOT); and that node does refuse them, which the negative control below shows.

use crate::support;

use support::TestRedis;

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
        if name == "record.lua" || name == "split.lua" {
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
            name == "record.lua" || name == "split.lua" || loaded.contains(&name),
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
    let pids: Vec<u64> = found.iter().map(|c| c.pid).collect();
    assert_eq!(pids, [2, 4]);
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

/// A store of namespace `elk` on one shard of `server`, with pids 1..=10 planned.
async fn one_shard(
    server: &TestRedis,
) -> tranche_active_store::RedisActiveStore<redis::aio::ConnectionManager> {
    use tranche_active_store::{Config, Plan, Planner, RedisActiveStore};
    let client = redis::Client::open(server.url()).unwrap();
    let conn = client.get_connection_manager().await.unwrap();
    let config = Config {
        namespace: "elk".into(),
        num_shards: 1,
        ..Config::default()
    };
    let store = RedisActiveStore::new(conn, config).unwrap();
    store
        .plan(&Plan::Uniform {
            min: 1,
            max: 10_000,
            size: 1000,
        })
        .await
        .unwrap();
    store
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

/// What an argument of a script is, and so which values it must refuse.
#[derive(Clone, Copy, Debug)]
enum Arg {
    /// A time in ms or a count: digits, below 2^53.
    Num,
    /// A positive count (at least 1).
    Pos,
    /// How many partitions a claim wants: 1 to 100,000.
    Want,
    /// A pid, token, bit offset, row ID or checkpoint: a decimal u64.
    Id,
    /// An [`Arg::Id`] or empty (keep, or every one).
    OptId,
    /// 1 to 64 [`Arg::Id`]s, ','-separated.
    IdList,
    /// A worker id: no '|' (a record's separator), not empty.
    Worker,
    /// A worker id or empty (any worker).
    OptWorker,
    /// Free text (an error message): nothing to refuse.
    Text,
    /// A plan kind, `u` or `r`.
    Kind,
    /// A shard's plan range, `first|last`.
    Range,
    /// An encoded completed record: one JSON line.
    Record,
    /// A carried status, `p` or `f`.
    Status,
    /// A shard number below the shard count (1 here).
    Shard,
    /// A failure's policy: empty (the backoff), `permanent`, or a delay in ms.
    Policy,
    /// A piece's field, `pid:start`.
    PieceKey,
    /// `piece_fail`'s mode, `fail`, `reap` or `worker`.
    Mode,
}

impl Arg {
    fn bad(self) -> &'static [&'static str] {
        const HUGE: &str = "123456789012345678901234";
        match self {
            Arg::Num => &["x", "-1", "", "1.5", "1e3", " 1", HUGE],
            Arg::Pos => &["x", "-1", "", "1.5", "0", HUGE],
            Arg::Want => &["x", "-1", "", "1.5", "0", "100001", HUGE],
            Arg::Id => &["x", "-1", "", "1.5", "0x1", HUGE],
            Arg::OptId => &["x", "-1", "1.5", "0x1", HUGE],
            Arg::IdList => &["x", "", ",", "1600,", ",1600", "1600,,1750", "1600,x", HUGE],
            Arg::Worker => &["", "a|b"],
            Arg::OptWorker => &["a|b"],
            Arg::Text => &[],
            Arg::Kind => &["x", ""],
            Arg::Range => &["x", "", "5|", "|5", "20|11", "a|b", "1|2|3"],
            Arg::Record => &["", "{\"a\":1}\n{\"b\":2}"],
            Arg::Status => &["r", ""],
            Arg::Policy => &["soon", "-5", "1.5", "permanently", HUGE],
            Arg::Shard => &["x", "-1", "", "1"],
            Arg::PieceKey => &["x", "", "2", "2:", ":5", "a:b", "2:1.5", "2:5:6"],
            Arg::Mode => &["x", ""],
        }
    }
}

/// A corrupt value put into one key a script reads.
#[derive(Clone, Debug)]
enum Corrupt {
    /// `HSET key field value`.
    Field(String, String, String),
    /// `SET key value`.
    Set(String, &'static str),
    /// `RPUSH key value`.
    Push(String, &'static str),
    /// `ZADD key score member`.
    Zadd(String, String, String),
}

impl Corrupt {
    fn key(&self) -> &str {
        match self {
            Corrupt::Field(k, ..)
            | Corrupt::Set(k, _)
            | Corrupt::Push(k, _)
            | Corrupt::Zadd(k, ..) => k,
        }
    }

    fn apply(&self, server: &TestRedis) {
        match self {
            Corrupt::Field(k, f, v) => server.cli(&["HSET", k, f, v]),
            Corrupt::Set(k, v) => server.cli(&["SET", k, v]),
            Corrupt::Push(k, v) => server.cli(&["RPUSH", k, v]),
            Corrupt::Zadd(k, score, m) => server.cli(&["ZADD", k, score, m]),
        };
    }
}

/// One call of one script: a good call (which must succeed and write), each of whose
/// arguments is replaced in turn by every bad value of its kind, and corruptions of
/// the keys it reads, each of which must make the good call refuse. `setup` is applied
/// to the starting state first (what the good call works on); each of `skipped` is a
/// corrupt record the good call must pass by: it succeeds, and the record stays as it
/// was.
#[derive(Default)]
struct Row {
    script: &'static str,
    keys: Vec<String>,
    args: Vec<(String, Arg)>,
    corrupt: Vec<Corrupt>,
    setup: Vec<Corrupt>,
    skipped: Vec<Corrupt>,
}

/// The state every row starts from (namespace `elk`, one shard, pids 1..=10 of 1000
/// IDs): pids 1, 3, 4 claimed, 2 running, 5 pending (released), 6 failed, 7..=10 not
/// issued yet. Returns the store's tokens by pid.
async fn refusal_state(server: &TestRedis) -> std::collections::HashMap<u64, u64> {
    use tranche_active_store::{Carried, Leases};
    let store = one_shard(server).await;
    let leases = store.claim("w", 6).await.unwrap();
    store.heartbeat(&leases[1], 1500).await.unwrap();
    store.release(&leases[4], 4000).await.unwrap();
    store.release(&leases[5], 5000).await.unwrap();
    let carried = Carried {
        pid: 6,
        attempts: 3,
        failed: true,
        worker: "w".into(),
    };
    assert_eq!(store.carry(&[carried]).await.unwrap(), 1);
    leases.iter().map(|l| (l.pid, l.token)).collect()
}

/// The table: every script of `scripts()` has at least one row.
fn refusal_rows(server: &TestRedis, tokens: &std::collections::HashMap<u64, u64>) -> Vec<Row> {
    use Arg::*;
    let schema = tranche_codec::KeySchema::new("elk", 1).unwrap();
    let (active, pending, leases) = (schema.active(0), schema.pending(0), schema.leases(0));
    let (plans, cursor, seq) = (
        schema.shard_key(0, "plans"),
        schema.shard_key(0, "cursor"),
        schema.shard_key(0, "seq"),
    );
    let (index, inbox, counts) = (
        schema.completed_index(0),
        schema.inbox(0),
        schema.shard_key(0, "counts"),
    );
    let (splits, pieces, piece_pending, piece_leases) = (
        schema.shard_key(0, "splits"),
        schema.shard_key(0, "pieces"),
        schema.shard_key(0, "piece_pending"),
        schema.shard_key(0, "piece_leases"),
    );
    // After every time the state's records hold (the store wrote them on the system
    // clock), so the released partition is ready.
    let clock = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        + 60_000;
    let now = clock.to_string();
    let later = (clock + 30_000).to_string();
    let far = (clock + 1_000_000_000).to_string();
    let t = |pid: u64| tokens[&pid].to_string();
    let bit = |pid: u64| schema.bit_offset(pid).to_string();
    let a = |v: &str, kind: Arg| (v.to_owned(), kind);
    // A record of `pid` with field `n` (1-based, as in record.lua) replaced.
    let record = |pid: u64, n: usize, value: &str| {
        let rec: String = server.query(redis::cmd("HGET").arg(&active).arg(pid));
        let mut fields: Vec<&str> = rec.split('|').collect();
        fields[n - 1] = value;
        Corrupt::Field(active.clone(), pid.to_string(), fields.join("|"))
    };
    let garbage = |pid: u64| Corrupt::Field(active.clone(), pid.to_string(), "garbage".into());
    let counter = |status: &str| Corrupt::Field(counts.clone(), status.into(), "x".into());
    // Split entries' completed-record prefixes, and a piece of pid 2 (1700..=2000)
    // pending, or claimed by w2 under token 99.
    let prefix2 = r#"{"pid":2,"min_id":1001,"max_id":2000,"worker_id":"w""#.to_owned();
    let prefix3 = r#"{"pid":3,"min_id":2001,"max_id":3000,"worker_id":"w""#.to_owned();
    let pending_piece = format!("p|0||||{now}|{now}||1700|2000|1700|");
    let leased_piece = format!("c|1|99|{later}|{now}|{now}|{now}|w2|1700|2000|1700|");
    // Pid 2 split: a piece 1700..=2000 leased by w2, another 1900..=2000 pending (its
    // owner part running), for `piece_fail`; `expired_piece` with its lease run out.
    let piece_fail_keys = vec![
        pieces.clone(),
        piece_pending.clone(),
        piece_leases.clone(),
        splits.clone(),
        active.clone(),
        leases.clone(),
        pending.clone(),
        counts.clone(),
    ];
    let split_piece = vec![
        Corrupt::Field(pieces.clone(), "2:1700".into(), leased_piece.clone()),
        Corrupt::Zadd(piece_leases.clone(), later.clone(), "2:1700".into()),
        Corrupt::Field(
            pieces.clone(),
            "2:1900".into(),
            format!("p|0||||{now}|{now}||1900|2000|1900|"),
        ),
        Corrupt::Zadd(piece_pending.clone(), "0".into(), "2:1900".into()),
        Corrupt::Field(
            splits.clone(),
            "2".into(),
            format!("|||||2|0|1|1001|2000|{prefix2}"),
        ),
    ];
    let mut expired_piece = split_piece.clone();
    expired_piece[1] = Corrupt::Zadd(piece_leases.clone(), "1".into(), "2:1700".into());
    let piece_fail_corrupt = vec![
        Corrupt::Field(pieces.clone(), "2:1700".into(), "garbage".into()),
        Corrupt::Field(pieces.clone(), "2:1900".into(), "garbage".into()),
        Corrupt::Field(splits.clone(), "2".into(), "garbage".into()),
        garbage(2),
        record(2, 11, "x"),
        counter("r"),
        counter("f"),
    ];
    vec![
        Row {
            script: "claim",
            keys: vec![
                active.clone(),
                pending.clone(),
                leases.clone(),
                plans.clone(),
                cursor.clone(),
                seq.clone(),
                counts.clone(),
            ],
            args: vec![
                a("w2", Worker),
                a("2", Want),
                a(&now, Num),
                a(&later, Num),
                a("0", Shard),
                a("1", Pos),
                a("100", Pos),
            ],
            corrupt: vec![
                garbage(5),
                record(5, 2, "x"),
                record(5, 1, "z"),
                counter("c"),
                counter("p"),
                Corrupt::Push(plans.clone(), "garbage"),
                Corrupt::Field(cursor.clone(), "1".into(), "x".into()),
                Corrupt::Set(seq.clone(), "x"),
            ],
            ..Row::default()
        },
        Row {
            script: "heartbeat",
            keys: vec![
                active.clone(),
                leases.clone(),
                counts.clone(),
                splits.clone(),
                pieces.clone(),
                piece_pending.clone(),
            ],
            args: vec![
                a(&now, Num),
                a(&later, Num),
                a("1", Id),
                a(&t(1), Id),
                a("500", OptId),
                a("", OptId),
                a("3", Id),
                a(&t(3), Id),
                a("2500", OptId),
                a("2600", OptId),
            ],
            corrupt: vec![
                garbage(3),
                record(3, 11, "x"),
                record(3, 2, "x"),
                counter("c"),
                counter("r"),
            ],
            ..Row::default()
        },
        Row {
            script: "complete",
            keys: vec![
                active.clone(),
                leases.clone(),
                index.clone(),
                inbox.clone(),
                counts.clone(),
                splits.clone(),
            ],
            args: vec![
                a("1", Id),
                a(&t(1), Id),
                a(&bit(1), Id),
                a("{\"pid\":1}", Record),
                a("3", Id),
                a(&t(3), Id),
                a(&bit(3), Id),
                a("{\"pid\":3}", Record),
            ],
            corrupt: vec![garbage(3), counter("c")],
            ..Row::default()
        },
        // A running lease completes: the running counter is read and checked.
        Row {
            script: "complete",
            keys: vec![
                active.clone(),
                leases.clone(),
                index.clone(),
                inbox.clone(),
                counts.clone(),
                splits.clone(),
            ],
            args: vec![
                a("2", Id),
                a(&t(2), Id),
                a(&bit(2), Id),
                a("{\"pid\":2}", Record),
            ],
            corrupt: vec![counter("r")],
            ..Row::default()
        },
        Row {
            script: "fail",
            keys: vec![
                active.clone(),
                leases.clone(),
                pending.clone(),
                counts.clone(),
            ],
            args: vec![
                a("3", Id),
                a(&t(3), Id),
                a(&now, Num),
                a("boom", Text),
                a("5", Pos),
                a("1000", Num),
                a("60000", Num),
                a("", Policy),
            ],
            corrupt: vec![record(3, 2, "x"), record(3, 11, "x"), counter("c")],
            ..Row::default()
        },
        Row {
            script: "release",
            keys: vec![
                active.clone(),
                leases.clone(),
                pending.clone(),
                counts.clone(),
            ],
            args: vec![
                a(&now, Num),
                a("1", Id),
                a(&t(1), Id),
                a("100", OptId),
                a("3", Id),
                a(&t(3), Id),
                a("2100", OptId),
            ],
            corrupt: vec![
                garbage(3),
                record(3, 2, "x"),
                record(3, 11, "x"),
                counter("c"),
                counter("p"),
            ],
            ..Row::default()
        },
        Row {
            script: "reap",
            keys: vec![
                active.clone(),
                leases.clone(),
                pending.clone(),
                counts.clone(),
            ],
            args: vec![a(&far, Num), a("100", Num), a("", OptWorker), a("5", Pos)],
            corrupt: vec![counter("c"), counter("p")],
            skipped: vec![garbage(3), record(3, 2, "x")],
            ..Row::default()
        },
        Row {
            script: "retry_failed",
            keys: vec![active.clone(), pending.clone(), counts.clone()],
            args: vec![a(&now, Num), a("6", OptId)],
            corrupt: vec![record(6, 1, "z"), counter("f")],
            ..Row::default()
        },
        Row {
            script: "retry_failed",
            keys: vec![active.clone(), pending.clone(), counts.clone()],
            args: vec![a(&now, Num), a("", OptId)],
            corrupt: vec![garbage(3), counter("p")],
            ..Row::default()
        },
        Row {
            script: "discard",
            keys: vec![
                active.clone(),
                pending.clone(),
                counts.clone(),
                plans.clone(),
                cursor.clone(),
            ],
            args: vec![a("5", Id), a(&now, Num)],
            corrupt: vec![garbage(5), record(5, 1, "z"), counter("p"), counter("d")],
            ..Row::default()
        },
        Row {
            script: "discard",
            keys: vec![
                active.clone(),
                pending.clone(),
                counts.clone(),
                plans.clone(),
                cursor.clone(),
            ],
            args: vec![a("8", Id), a(&now, Num)],
            corrupt: vec![
                counter("d"),
                Corrupt::Push(plans.clone(), "garbage"),
                Corrupt::Field(cursor.clone(), "1".into(), "x".into()),
            ],
            ..Row::default()
        },
        Row {
            script: "plan",
            keys: vec![schema.plans()],
            args: vec![
                a("u", Kind),
                a("20001", Id),
                a("30000", Id),
                a("1000", Pos),
                a("10", Pos),
            ],
            corrupt: vec![Corrupt::Push(schema.plans(), "garbage")],
            ..Row::default()
        },
        Row {
            script: "plan",
            keys: vec![schema.plans()],
            args: vec![
                a("r", Kind),
                a("40001", Id),
                a("40500", Id),
                a("500", Pos),
                a("50001", Id),
                a("50100", Id),
                a("100", Pos),
            ],
            corrupt: vec![Corrupt::Push(schema.plans(), "r|x|12|1|2|2")],
            ..Row::default()
        },
        Row {
            script: "plan_cursor",
            keys: vec![plans.clone()],
            args: vec![a("11|20", Range)],
            corrupt: vec![Corrupt::Push(plans.clone(), "garbage")],
            ..Row::default()
        },
        Row {
            script: "plan_ranges",
            keys: vec![
                active.clone(),
                pending.clone(),
                index.clone(),
                counts.clone(),
            ],
            args: vec![
                a(&now, Num),
                a("11", Id),
                a("20001", Id),
                a("21000", Id),
                a(&bit(11), Id),
                a("12", Id),
                a("21001", Id),
                a("22000", Id),
                a(&bit(12), Id),
            ],
            corrupt: vec![counter("p")],
            ..Row::default()
        },
        Row {
            script: "recount",
            keys: vec![active.clone(), counts.clone()],
            args: vec![],
            skipped: vec![garbage(3), record(3, 1, "z")],
            ..Row::default()
        },
        Row {
            script: "repair",
            keys: vec![
                active.clone(),
                pending.clone(),
                leases.clone(),
                index.clone(),
                counts.clone(),
                format!("{active}:quarantine"),
            ],
            args: vec![
                a("3", Id),
                a(&now, Num),
                a(&bit(3), Id),
                a("2001", Id),
                a("3000", Id),
            ],
            corrupt: vec![counter("p")],
            setup: vec![garbage(3)],
            ..Row::default()
        },
        Row {
            script: "carry",
            keys: vec![active.clone(), pending.clone(), counts.clone()],
            args: vec![
                a(&now, Num),
                a("5", Id),
                a("2", Num),
                a("p", Status),
                a("", OptWorker),
                a("5", Id),
                a("3", Num),
                a("f", Status),
                a("w", OptWorker),
            ],
            corrupt: vec![garbage(5), record(5, 2, "x"), counter("p")],
            ..Row::default()
        },
        Row {
            script: "register",
            keys: vec!["{new}:meta".into()],
            args: vec![a("4", Pos), a("2", Pos)],
            corrupt: vec![Corrupt::Field(
                "{new}:meta".into(),
                "shards".into(),
                "x".into(),
            )],
            ..Row::default()
        },
        // Split partitions (`split.lua`): pid 2 runs (1001..=2000, checkpoint 1500).
        Row {
            script: "heartbeat",
            keys: vec![
                active.clone(),
                leases.clone(),
                counts.clone(),
                splits.clone(),
                pieces.clone(),
                piece_pending.clone(),
            ],
            args: vec![
                a(&now, Num),
                a(&later, Num),
                a("2", Id),
                a(&t(2), Id),
                a("1550", OptId),
                a("1700", OptId),
            ],
            setup: vec![Corrupt::Field(
                splits.clone(),
                "2".into(),
                format!("o|1600|1901|w2|{now}|0|0|1|1001|2000|{prefix2}"),
            )],
            corrupt: vec![
                Corrupt::Field(splits.clone(), "2".into(), "garbage".into()),
                Corrupt::Field(
                    splits.clone(),
                    "2".into(),
                    format!("o|1600|1901|w2|{now}|x|0|1|1001|2000|{prefix2}"),
                ),
                garbage(2),
            ],
            ..Row::default()
        },
        Row {
            script: "complete",
            keys: vec![
                active.clone(),
                leases.clone(),
                index.clone(),
                inbox.clone(),
                counts.clone(),
                splits.clone(),
            ],
            args: vec![
                a("3", Id),
                a(&t(3), Id),
                a(&bit(3), Id),
                a("{\"pid\":3}", Record),
            ],
            // A piece outstanding: the owner part ends, the bit stays clear. No status
            // moves, so the counters are not read (a corrupt one is found by the next
            // call that moves one).
            setup: vec![Corrupt::Field(
                splits.clone(),
                "3".into(),
                format!("|||||1|0|1|2001|3000|{prefix3}"),
            )],
            corrupt: vec![
                Corrupt::Field(splits.clone(), "3".into(), "garbage".into()),
                garbage(3),
            ],
            ..Row::default()
        },
        Row {
            script: "complete",
            keys: vec![
                active.clone(),
                leases.clone(),
                index.clone(),
                inbox.clone(),
                counts.clone(),
                splits.clone(),
            ],
            args: vec![
                a("3", Id),
                a(&t(3), Id),
                a(&bit(3), Id),
                a(
                    "{\"pid\":3,\"completed_at\":1719234405.5,\"duration\":1}",
                    Record,
                ),
            ],
            // Every piece done: the record spans the partition.
            setup: vec![Corrupt::Field(
                splits.clone(),
                "3".into(),
                format!("|||||0|0|1|2001|3000|{prefix3}"),
            )],
            corrupt: vec![Corrupt::Field(splits.clone(), "3".into(), "garbage".into())],
            ..Row::default()
        },
        Row {
            script: "split_request",
            keys: vec![active.clone(), splits.clone(), pieces.clone()],
            args: vec![
                a("2", Id),
                a("o", OptId),
                a(&t(2), Id),
                a("1600,1750", IdList),
                a("1650,1901", IdList),
                a("w2", Worker),
                a(&now, Num),
                a("30000", Num),
                a("1001", Id),
                a("2000", Id),
                a(&prefix2, Record),
            ],
            corrupt: vec![
                garbage(2),
                record(2, 11, "x"),
                Corrupt::Field(splits.clone(), "2".into(), "garbage".into()),
            ],
            ..Row::default()
        },
        Row {
            script: "piece_claim",
            keys: vec![
                pieces.clone(),
                piece_pending.clone(),
                piece_leases.clone(),
                seq.clone(),
            ],
            args: vec![a("w2", Worker), a("2", Want), a(&now, Num), a(&later, Num)],
            setup: vec![
                Corrupt::Field(pieces.clone(), "2:1700".into(), pending_piece.clone()),
                Corrupt::Zadd(piece_pending.clone(), "0".into(), "2:1700".into()),
            ],
            corrupt: vec![
                Corrupt::Field(pieces.clone(), "2:1700".into(), "garbage".into()),
                Corrupt::Set(seq.clone(), "x"),
            ],
            ..Row::default()
        },
        Row {
            script: "piece_beat",
            keys: vec![
                pieces.clone(),
                piece_pending.clone(),
                piece_leases.clone(),
                splits.clone(),
            ],
            args: vec![
                a(&now, Num),
                a(&later, Num),
                a("2:1700", PieceKey),
                a("99", Id),
                a("1750", OptId),
                a("1850", OptId),
            ],
            setup: vec![
                Corrupt::Field(pieces.clone(), "2:1700".into(), leased_piece.clone()),
                Corrupt::Zadd(piece_leases.clone(), later.clone(), "2:1700".into()),
                Corrupt::Field(
                    splits.clone(),
                    "2".into(),
                    format!("1700|1800|1901|w3|{now}|1|0|1|1001|2000|{prefix2}"),
                ),
            ],
            corrupt: vec![
                Corrupt::Field(pieces.clone(), "2:1700".into(), "garbage".into()),
                Corrupt::Field(splits.clone(), "2".into(), "garbage".into()),
            ],
            ..Row::default()
        },
        Row {
            script: "piece_complete",
            keys: vec![
                active.clone(),
                index.clone(),
                inbox.clone(),
                counts.clone(),
                splits.clone(),
                pieces.clone(),
                piece_leases.clone(),
            ],
            args: vec![
                a(&now, Num),
                a("2:1700", PieceKey),
                a("99", Id),
                a(&bit(2), Id),
            ],
            // The last piece, its owner part done: the partition completes.
            setup: vec![
                Corrupt::Field(pieces.clone(), "2:1700".into(), leased_piece.clone()),
                Corrupt::Zadd(piece_leases.clone(), later.clone(), "2:1700".into()),
                Corrupt::Field(
                    splits.clone(),
                    "2".into(),
                    format!("|||||1|1|1|1001|2000|{prefix2}"),
                ),
            ],
            corrupt: vec![
                Corrupt::Field(pieces.clone(), "2:1700".into(), "garbage".into()),
                Corrupt::Field(splits.clone(), "2".into(), "garbage".into()),
                garbage(2),
                counter("r"),
            ],
            ..Row::default()
        },
        Row {
            script: "piece_release",
            keys: vec![pieces.clone(), piece_pending.clone(), piece_leases.clone()],
            args: vec![
                a(&now, Num),
                a("2:1700", PieceKey),
                a("99", Id),
                a("1750", Id),
            ],
            setup: vec![
                Corrupt::Field(pieces.clone(), "2:1700".into(), leased_piece.clone()),
                Corrupt::Zadd(piece_leases.clone(), later.clone(), "2:1700".into()),
            ],
            corrupt: vec![Corrupt::Field(
                pieces.clone(),
                "2:1700".into(),
                "garbage".into(),
            )],
            ..Row::default()
        },
        // A failed chunk with attempts left: the piece waits out its backoff.
        Row {
            script: "piece_fail",
            keys: piece_fail_keys.clone(),
            args: vec![
                a(&now, Num),
                a("5", Pos),
                a("fail", Mode),
                a("2:1700", PieceKey),
                a("99", Id),
                a("1750", OptId),
                a("boom", Text),
                a("1000", Num),
                a("60000", Num),
                a("", Policy),
            ],
            setup: split_piece.clone(),
            corrupt: vec![Corrupt::Field(
                pieces.clone(),
                "2:1700".into(),
                "garbage".into(),
            )],
            ..Row::default()
        },
        // Its last attempt: the partition fails, whole again. Its record, its entry,
        // its other pieces and the counters are read and checked first.
        Row {
            script: "piece_fail",
            keys: piece_fail_keys.clone(),
            args: vec![
                a(&now, Num),
                a("1", Pos),
                a("fail", Mode),
                a("2:1700", PieceKey),
                a("99", Id),
                a("1750", OptId),
                a("boom", Text),
                a("1000", Num),
                a("60000", Num),
                a("5000", Policy),
            ],
            setup: split_piece.clone(),
            corrupt: piece_fail_corrupt.clone(),
            ..Row::default()
        },
        Row {
            script: "piece_fail",
            keys: piece_fail_keys.clone(),
            args: vec![a(&now, Num), a("5", Pos), a("reap", Mode)],
            setup: expired_piece.clone(),
            corrupt: vec![Corrupt::Field(
                pieces.clone(),
                "2:1700".into(),
                "garbage".into(),
            )],
            ..Row::default()
        },
        Row {
            script: "piece_fail",
            keys: piece_fail_keys.clone(),
            args: vec![a(&now, Num), a("1", Pos), a("reap", Mode)],
            setup: expired_piece.clone(),
            corrupt: piece_fail_corrupt.clone(),
            ..Row::default()
        },
        Row {
            script: "piece_fail",
            keys: piece_fail_keys.clone(),
            args: vec![
                a(&now, Num),
                a("1", Pos),
                a("worker", Mode),
                a("w2", Worker),
            ],
            setup: split_piece.clone(),
            corrupt: piece_fail_corrupt.clone(),
            ..Row::default()
        },
    ]
}

/// A key's type and contents, in an order that does not depend on its encoding.
fn logical(server: &TestRedis, key: &str) -> (String, Vec<String>) {
    let kind = server.cli(&["TYPE", key]);
    let mut items: Vec<String> = match kind.as_str() {
        "hash" => server.query(redis::cmd("HGETALL").arg(key)),
        "list" => server.query(redis::cmd("LRANGE").arg(key).arg(0).arg(-1)),
        "string" => vec![server.query(redis::cmd("GET").arg(key))],
        "zset" => server.query(
            redis::cmd("ZRANGE")
                .arg(key)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES"),
        ),
        _ => vec![],
    };
    if kind == "hash" {
        let mut pairs: Vec<String> = items.chunks(2).map(|p| p.join("=")).collect();
        pairs.sort();
        items = pairs;
    }
    (kind, items)
}

/// Invokes `script` with `keys` and `args`.
async fn call(
    conn: &mut redis::aio::MultiplexedConnection,
    script: &str,
    keys: &[String],
    args: &[String],
) -> redis::RedisResult<redis::Value> {
    let script = tranche_active_store::scripts()
        .into_iter()
        .find(|(n, _)| *n == script)
        .unwrap_or_else(|| panic!("no script {script}"))
        .1;
    let mut invocation = script.prepare_invoke();
    for k in keys {
        invocation.key(k);
    }
    for a in args {
        invocation.arg(a);
    }
    invocation.invoke_async(conn).await
}

/// `row`'s good call, on a fresh starting state with `skipped` (a corrupt record)
/// applied, succeeds and leaves that record as it was.
async fn passes_by(row: &Row, skipped: &Corrupt) -> Result<(), String> {
    let server = TestRedis::start();
    refusal_state(&server).await;
    for c in &row.setup {
        c.apply(&server);
    }
    skipped.apply(&server);
    let Corrupt::Field(key, field, value) = skipped else {
        return Err(format!("skipped {skipped:?} is not a record"));
    };
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let good: Vec<String> = row.args.iter().map(|(v, _)| v.clone()).collect();
    call(&mut conn, row.script, &row.keys, &good)
        .await
        .map_err(|err| format!("skipped {skipped:?}: refused: {err}"))?;
    let after: Option<String> = server.query(redis::cmd("HGET").arg(key).arg(field));
    if after.as_deref() != Some(value.as_str()) {
        return Err(format!("skipped {skipped:?}: it became {after:?}"));
    }
    Ok(())
}

/// Every script checks every argument and everything it reads before its first write:
/// each row's call with one argument replaced by a bad value (non-number, negative,
/// empty, fractional, huge), with one argument too few or too many, and with a corrupt
/// value in each key it reads (a record that does not decode or has a bad field, a
/// non-numeric counter, a bad plan entry or cursor) is refused, and DUMP of every key
/// is unchanged. The unchanged good call then succeeds and writes, so each refusal is
/// the bad value's doing.
#[tokio::test]
async fn every_script_refuses_bad_input_before_writing() {
    let probe = TestRedis::start();
    let tokens = refusal_state(&probe).await;
    let rows = refusal_rows(&probe, &tokens);
    let covered: std::collections::BTreeSet<&str> = rows.iter().map(|r| r.script).collect();
    for (name, _) in tranche_active_store::scripts() {
        assert!(covered.contains(name), "script {name} has no refusal row");
    }
    let n = rows.len();
    drop(probe);

    let mut failures = Vec::new();
    for i in 0..n {
        // A fresh server per row: each good call writes. Tokens follow the server's
        // clock, so the row is built from this server's state.
        let server = TestRedis::start();
        let tokens = refusal_state(&server).await;
        let row = &refusal_rows(&server, &tokens)[i];
        for c in &row.setup {
            c.apply(&server);
        }
        for skipped in &row.skipped {
            if let Err(failure) = passes_by(row, skipped).await {
                failures.push(format!("row {i} {}: {failure}", row.script));
            }
        }
        let client = redis::Client::open(server.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let good: Vec<String> = row.args.iter().map(|(v, _)| v.clone()).collect();
        let mut variants: Vec<(String, Vec<String>)> = Vec::new();
        for (at, (_, kind)) in row.args.iter().enumerate() {
            for bad in kind.bad() {
                let mut args = good.clone();
                args[at] = (*bad).to_owned();
                variants.push((format!("argument {} = {bad:?}", at + 1), args));
            }
        }
        if !good.is_empty() {
            variants.push((
                "one argument too few".into(),
                good[..good.len() - 1].to_vec(),
            ));
        }
        let mut more = good.clone();
        more.push("1".into());
        variants.push(("one argument too many".into(), more));
        let mut before = server.dump_all();
        for (what, args) in &variants {
            let reply = call(&mut conn, row.script, &row.keys, args).await;
            let wrote = server.dump_all() != before;
            if reply.is_ok() || wrote {
                failures.push(format!(
                    "row {i} {}: {what}: {reply:?}{}",
                    row.script,
                    if wrote { ", and it wrote" } else { "" }
                ));
            }
            if wrote {
                break;
            }
        }
        if server.dump_all() != before {
            continue;
        }
        for corrupt in &row.corrupt {
            let key = corrupt.key().to_owned();
            let saved: Option<Vec<u8>> = server.query(redis::cmd("DUMP").arg(&key));
            let contents = logical(&server, &key);
            corrupt.apply(&server);
            let corrupted = server.dump_all();
            let reply = call(&mut conn, row.script, &row.keys, &good).await;
            let wrote = server.dump_all() != corrupted;
            if reply.is_ok() || wrote {
                failures.push(format!(
                    "row {i} {}: corrupt {corrupt:?}: {reply:?}{}",
                    row.script,
                    if wrote { ", and it wrote" } else { "" }
                ));
            }
            if wrote {
                break;
            }
            server.cli(&["DEL", &key]);
            if let Some(dump) = saved {
                let mut restore = redis::cmd("RESTORE");
                restore.arg(&key).arg(0).arg(dump);
                let _: () = server.query(&restore);
            }
            // A hash in the hashtable encoding may DUMP in another order once
            // restored: compare its contents, then take the new DUMP as the baseline.
            assert_eq!(logical(&server, &key), contents, "restored {key}");
            before = server.dump_all();
        }
        if server.dump_all() != before {
            continue;
        }
        match call(&mut conn, row.script, &row.keys, &good).await {
            Ok(_) if server.dump_all() != before => {}
            Ok(reply) => failures.push(format!(
                "row {i} {}: the good call wrote nothing ({reply:?})",
                row.script
            )),
            Err(err) => failures.push(format!(
                "row {i} {}: the good call failed: {err}",
                row.script
            )),
        }
    }
    assert!(
        failures.is_empty(),
        "{} refusals missing:\n{}",
        failures.len(),
        failures.join("\n")
    );
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
    ];
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let args = |pid: &str, token: &str, bit: &str| -> Vec<String> {
        vec![pid.into(), token.into(), bit.into(), "{}".into()]
    };
    let before = server.dump_all();
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
    assert!(
        server.dump_all() == before,
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
