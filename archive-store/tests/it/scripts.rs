//! Every Lua script is an atomic unit on one Redis Cluster slot: scripts name keys only
//! through `KEYS[]` (checked on the source, since a one-node cluster does not stop an
//! undeclared key), and the behaviour suite runs every script against a cluster node.

use crate::support;

fn lua_sources() -> Vec<(String, String)> {
    support::lua_sources(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn scripts_name_keys_only_through_keys() {
    let offenders = support::keys_not_from_keys(
        &lua_sources(),
        &[("variadic", 1), ("expect_type", 0), ("grow_bitmap", 0)],
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
        if name == "prelude.lua" {
            assert!(head.contains("prelude"), "{name}");
            continue;
        }
        assert!(
            head.contains("KEYS[1]") && head.contains("ARGV"),
            "{name} must document KEYS and ARGV:\n{head}"
        );
        assert!(source.matches("KEYS[").count() > 0, "{name} touches no key");
    }
}

#[test]
fn every_script_is_loaded_by_the_store() {
    let loaded: Vec<String> = tranche_archive_store::scripts()
        .iter()
        .map(|(n, _)| format!("{n}.lua"))
        .collect();
    for (name, _) in lua_sources() {
        assert!(
            name == "prelude.lua" || loaded.contains(&name),
            "{name} is not loaded by the store"
        );
    }
}

/// `archive.lua` checks every argument before its first write: a bad target or time to
/// live after a good record leaves the keyspace as it was, and the same call with
/// good arguments goes through (so the refusals are the checks', not the harness's).
#[tokio::test]
async fn archive_refuses_malformed_arguments_before_writing() {
    let server = support::TestRedis::start();
    let script = tranche_archive_store::scripts()
        .into_iter()
        .find(|(name, _)| *name == "archive")
        .expect("the archive script")
        .1;
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let keys = [
        "{t:0}:archived",
        "{t:0}:completed",
        "{t:0}:archive",
        "{t:0}:stats:global",
        "{t:0}:stats:workers",
        "{t:0}:stats:ranges",
        "{t:0}:stats:hourly",
        "{t:0}:stats:hist",
        "{t:0}:archive:open",
    ];
    let call = |second_bit: &str, second_target: &str, ttl: &str, layout: &[&str]| {
        let mut call = script.prepare_invoke();
        for key in keys {
            call.key(key);
        }
        // Two records one by one, no open or sealed batch, an empty statistics delta.
        call.arg("2")
            .arg(&["1", "1", "a", "0"][..])
            .arg(&["2", second_bit, "b", second_target][..])
            .arg("0")
            .arg("0")
            .arg(ttl)
            .arg("0")
            .arg(layout);
        call
    };
    let before = server.dump_all();
    for (bit, target, ttl, layout, says) in [
        ("2", "1", "0", &[][..], "target"),
        ("2", "x", "0", &[], "target"),
        ("2", "0", "x", &[], "time to live"),
        ("2", "0", "0", &["3"], "ranges layout"),
        ("2", "0", "0", &["2", "2"], "ranges layout"),
        ("x", "0", "0", &[], "bit offset"),
        ("-1", "0", "0", &[], "bit offset"),
        ("1.5", "0", "0", &[], "bit offset"),
        ("0x2", "0", "0", &[], "bit offset"),
        ("02", "0", "0", &[], "bit offset"),
        ("4294967296", "0", "0", &[], "bit offset"),
    ] {
        let err = call(bit, target, ttl, layout)
            .invoke_async::<redis::Value>(&mut conn)
            .await
            .unwrap_err();
        assert!(err.to_string().contains(says), "{target} {ttl}: {err}");
        assert_eq!(server.dump_all(), before, "a refused archive call wrote");
    }
    let written: Vec<i64> = call("2", "0", "0", &["2"])
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(written, vec![1, 2]);
    assert_ne!(server.dump_all(), before);
}

/// The one-by-one records' bits are set in fields of consecutive offsets: a record
/// archived before, or one bit twice in a call, is still named alone, and the refused
/// call puts back every bit it changed.
#[tokio::test]
async fn archive_names_each_duplicate_inside_a_run_of_bits() {
    let server = support::TestRedis::start();
    let script = tranche_archive_store::scripts()
        .into_iter()
        .find(|(name, _)| *name == "archive")
        .expect("the archive script")
        .1;
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let call = |bits: &[&str]| {
        let mut call = script.prepare_invoke();
        for key in archive_keys() {
            call.key(key);
        }
        call.arg(bits.len().to_string());
        for bit in bits {
            call.arg(&[*bit, *bit, "x", "0"][..]);
        }
        call.arg("0").arg("0").arg("0").arg("0");
        call
    };
    // Bit 37 archived before: its record is the 35th of a call over 3..=42, in the
    // second field of that run.
    let _: i64 = redis::cmd("SETBIT")
        .arg("{t:0}:archived")
        .arg(37)
        .arg(1)
        .query_async(&mut conn)
        .await
        .unwrap();
    // What a refused call must leave: bit 37 alone (the bitmap may grow, with zeros),
    // and no other key.
    let unchanged = |server: &support::TestRedis| {
        let all = server.dump_all();
        assert_eq!(all.len(), 1, "a refused archive call wrote: {all:?}");
        assert_eq!(server.cli(&["BITCOUNT", "{t:0}:archived"]).trim(), "1");
        assert_eq!(server.cli(&["BITPOS", "{t:0}:archived", "1"]).trim(), "37");
    };
    let run: Vec<String> = (3..=42).map(|b: u32| b.to_string()).collect();
    let run: Vec<&str> = run.iter().map(String::as_str).collect();
    let reply: Vec<i64> = call(&run).invoke_async(&mut conn).await.unwrap();
    assert_eq!(reply, vec![0, 35]);
    unchanged(&server);
    // One bit twice in a call: the second is the duplicate.
    let reply: Vec<i64> = call(&["5", "6", "6", "7"])
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(reply, vec![0, 3]);
    unchanged(&server);
    // Without them, all are written.
    let reply: Vec<i64> = call(&["5", "6", "7", "9"])
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(reply, vec![1, 4]);
    let set: i64 = redis::cmd("BITCOUNT")
        .arg("{t:0}:archived")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(set, 5);
}

/// One script's row of the DUMP harness: a good call on the state [`setup`] leaves,
/// calls with bad arguments, and corrupt values in the keys it reads; every bad call is
/// refused and leaves every key's DUMP as it was.
struct Row {
    script: &'static str,
    keys: Vec<String>,
    good: Vec<Vec<u8>>,
    bad_args: Vec<(&'static str, Vec<Vec<u8>>)>,
    /// A key, a field (`None`: the key becomes a value of another type, `bad` naming
    /// it: `hash`, `set` or `string`), the bad value.
    corrupt: Vec<(String, Option<&'static str>, Vec<u8>)>,
}

fn args(xs: &[&str]) -> Vec<Vec<u8>> {
    xs.iter().map(|x| x.as_bytes().to_vec()).collect()
}

const T0: u64 = 1_719_234_405_000;

fn record(pid: u64) -> tranche_codec::CompletedRecord {
    tranche_codec::CompletedRecord {
        pid,
        min_id: (pid - 1) * 1000 + 1,
        max_id: pid * 1000,
        worker: std::sync::Arc::from("w1"),
        completed_at_ms: T0 + pid,
        duration_ms: 1000,
    }
}

const STATS: [&str; 5] = [
    "{t:0}:stats:global",
    "{t:0}:stats:workers",
    "{t:0}:stats:ranges",
    "{t:0}:stats:hourly",
    "{t:0}:stats:hist",
];

fn archive_keys() -> Vec<String> {
    let mut keys = vec![
        "{t:0}:archived".to_owned(),
        "{t:0}:completed".to_owned(),
        "{t:0}:archive".to_owned(),
    ];
    keys.extend(STATS.iter().map(|k| (*k).to_owned()));
    keys.push("{t:0}:archive:open".to_owned());
    keys
}

/// `archive.lua`'s arguments for record `pid` alone, one by one into the simple hash,
/// with its statistics delta.
fn archive_args(pid: u64) -> Vec<Vec<u8>> {
    let r = record(pid);
    let mut a = args(&["1", &pid.to_string(), &pid.to_string()]);
    a.push(tranche_codec::encode_json(&r).into_bytes());
    a.extend(args(&["0", "0", "0", "0"]));
    let delta = tranche_stats::StatsDelta::from_records(&[r]);
    a.extend(
        tranche_stats::archive_protocol::delta_args(&delta, T0)
            .into_iter()
            .map(String::into_bytes),
    );
    a
}

async fn invoke(
    conn: &mut redis::aio::MultiplexedConnection,
    script: &redis::Script,
    keys: &[String],
    args: &[Vec<u8>],
) -> redis::RedisResult<redis::Value> {
    let mut call = script.prepare_invoke();
    for k in keys {
        call.key(k);
    }
    for a in args {
        call.arg(a);
    }
    call.invoke_async(conn).await
}

/// Pid 5 archived (statistics, bitmap, simple hash, count), an open batch 0 of two
/// records, and a sealed batch 1.
async fn setup(server: &support::TestRedis, conn: &mut redis::aio::MultiplexedConnection) {
    let _: () = server.query(&redis::cmd("FLUSHALL"));
    let archive = script("archive");
    invoke(conn, archive, &archive_keys(), &archive_args(5))
        .await
        .unwrap();
    let _: () = server.query(
        redis::cmd("HSET")
            .arg("{t:0}:completed:batch:0:open")
            .arg("1")
            .arg("a")
            .arg("2")
            .arg("b"),
    );
    let _: () = server.query(redis::cmd("SADD").arg("{t:0}:archive:open").arg("0"));
    let _: () = server.query(
        redis::cmd("SET")
            .arg("{t:0}:completed:batch:1")
            .arg("SEALED"),
    );
}

fn script(name: &str) -> &'static redis::Script {
    tranche_archive_store::scripts()
        .into_iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no script {name}"))
        .1
}

fn rows() -> Vec<Row> {
    let open = "{t:0}:completed:batch:0:open".to_owned();
    let sealed = "{t:0}:completed:batch:0".to_owned();
    let counters = "{t:0}:archive".to_owned();
    let open_set = "{t:0}:archive:open".to_owned();
    let good_archive = archive_args(1);
    let mut bad_delta = good_archive.clone();
    let at = bad_delta.len() - 3;
    bad_delta[at] = b"x".to_vec();
    let mut short_delta = good_archive.clone();
    short_delta.pop();
    let seal = |xs: [&str; 7]| args(&xs);
    vec![
        Row {
            script: "archive",
            keys: archive_keys(),
            good: good_archive.clone(),
            bad_args: vec![
                ("no arguments", vec![]),
                ("a record count", args(&["x"])),
                ("a target past the open batches", {
                    let mut a = good_archive.clone();
                    a[4] = b"1".to_vec();
                    a
                }),
                ("a target not a number", {
                    let mut a = good_archive.clone();
                    a[4] = b"x".to_vec();
                    a
                }),
                ("a time to live", {
                    let mut a = good_archive.clone();
                    a[7] = b"soon".to_vec();
                    a
                }),
                ("a malformed delta", bad_delta),
                ("a delta short of its count", short_delta),
            ],
            corrupt: vec![
                (STATS[0].into(), Some("count"), b"x".to_vec()),
                (STATS[1].into(), Some("w1|count"), b"many".to_vec()),
                (STATS[2].into(), Some("0"), b"\x80".to_vec()),
                (STATS[3].into(), Some("2024-06-24"), b"\x00\x80".to_vec()),
                (counters.clone(), Some("count"), b"lots".to_vec()),
                ("{t:0}:archived".into(), None, b"hash".to_vec()),
                ("{t:0}:completed".into(), None, b"string".to_vec()),
                (counters.clone(), None, b"string".to_vec()),
                (open_set.clone(), None, b"string".to_vec()),
            ],
        },
        Row {
            script: "get",
            keys: vec![
                "{t:0}:completed:index".into(),
                "{t:0}:archived".into(),
                "{t:0}:completed".into(),
                sealed.clone(),
                open.clone(),
                "{t:0}:completed:seg:0".into(),
            ],
            good: args(&["5", "5"]),
            bad_args: vec![
                ("no arguments", vec![]),
                ("a pid", args(&["five", "5"])),
                ("an offset", args(&["5", "-5"])),
            ],
            corrupt: vec![
                ("{t:0}:archived".into(), None, b"hash".to_vec()),
                ("{t:0}:completed".into(), None, b"string".to_vec()),
            ],
        },
        Row {
            script: "seal",
            keys: vec![
                open.clone(),
                sealed.clone(),
                open_set.clone(),
                counters.clone(),
            ],
            good: seal(["2", "", "NEW", "0", "0", "2", "99"]),
            bad_args: vec![
                ("no arguments", vec![]),
                ("a length", seal(["two", "", "NEW", "0", "0", "2", "99"])),
                ("no new string", seal(["2", "", "", "0", "0", "2", "99"])),
                (
                    "a time to live",
                    seal(["2", "", "NEW", "x", "0", "2", "99"]),
                ),
                ("a batch id", seal(["2", "", "NEW", "0", "-1", "2", "99"])),
                (
                    "a record count",
                    seal(["2", "", "NEW", "0", "0", "2.5", "99"]),
                ),
                (
                    "a planned count",
                    seal(["2", "", "NEW", "0", "0", "2", "x"]),
                ),
            ],
            corrupt: vec![
                (open.clone(), None, b"string".to_vec()),
                (sealed.clone(), None, b"hash".to_vec()),
                (open_set.clone(), None, b"string".to_vec()),
                (counters.clone(), None, b"string".to_vec()),
            ],
        },
        Row {
            script: "dict",
            keys: vec!["{t}:dict".into()],
            good: args(&["", "DICT"]),
            bad_args: vec![
                ("no arguments", vec![]),
                ("an empty dictionary", args(&["", ""])),
                ("an extra argument", args(&["", "DICT", "x"])),
            ],
            corrupt: vec![("{t}:dict".into(), None, b"hash".to_vec())],
        },
        Row {
            script: "move",
            keys: vec!["{t:0}:completed".into(), open_set.clone(), open.clone()],
            good: args(&["1", "0", "5", "1"]),
            bad_args: vec![
                ("no arguments", vec![]),
                ("a batch count", args(&["x", "0", "5", "1"])),
                ("a batch past the keys", args(&["1", "0", "5", "2"])),
                ("a batch not a number", args(&["1", "0", "5", "x"])),
                ("a pid without its batch", args(&["1", "0", "5"])),
                ("a batch id", args(&["1", "-0", "5", "1"])),
            ],
            corrupt: vec![
                ("{t:0}:completed".into(), None, b"string".to_vec()),
                (open_set.clone(), None, b"string".to_vec()),
                (open.clone(), None, b"string".to_vec()),
            ],
        },
        Row {
            script: "join",
            keys: vec![
                counters.clone(),
                "{t:0}:completed:seg:0".into(),
                "{t:0}:completed:batch:1".into(),
            ],
            good: args(&["1", "1", "1", "2", "100"]),
            bad_args: vec![
                ("no arguments", vec![]),
                ("a batch count", args(&["x", "1", "1", "2", "100"])),
                ("no batch", args(&["0"])),
                ("a batch id", args(&["1", "one", "1", "2", "100"])),
                ("a planned flag", args(&["1", "1", "2", "2", "100"])),
                ("a layout", args(&["1", "1", "1", "3", "100"])),
                ("a batch size", args(&["1", "1", "1", "2", "0"])),
                ("no layout", args(&["1", "1", "1"])),
                (
                    "too many arguments",
                    args(&["1", "1", "1", "2", "100", "1"]),
                ),
            ],
            corrupt: vec![
                (counters.clone(), None, b"string".to_vec()),
                ("{t:0}:completed:seg:0".into(), None, b"hash".to_vec()),
                ("{t:0}:completed:batch:1".into(), None, b"hash".to_vec()),
            ],
        },
        Row {
            script: "format",
            keys: vec!["{t}:meta".into()],
            good: args(&["2"]),
            bad_args: vec![
                ("no arguments", vec![]),
                ("a version", args(&["two"])),
                ("version 0", args(&["0"])),
                ("an extra argument", args(&["2", "2"])),
            ],
            corrupt: vec![
                ("{t}:meta".into(), Some("archive_format"), b"two".to_vec()),
                ("{t}:meta".into(), None, b"string".to_vec()),
            ],
        },
        Row {
            script: "quarantine",
            keys: vec![
                open.clone(),
                "{t:0}:archive:quarantine".into(),
                counters.clone(),
                open_set.clone(),
            ],
            good: args(&["1", "a", "1", "1", "5", "0"]),
            bad_args: vec![
                ("no arguments", vec![]),
                ("no quarantine field", args(&["1", "a", "", "1", "5", "0"])),
                ("a lost count", args(&["1", "a", "1", "one", "5", "0"])),
                ("a time", args(&["1", "a", "1", "1", "-5", "0"])),
                ("an open batch id", args(&["1", "a", "1", "1", "5", "x"])),
            ],
            corrupt: vec![
                (counters.clone(), Some("lost"), b"many".to_vec()),
                (open.clone(), None, b"string".to_vec()),
                ("{t:0}:archive:quarantine".into(), None, b"string".to_vec()),
                (counters, None, b"string".to_vec()),
                (open_set, None, b"string".to_vec()),
            ],
        },
    ]
}

/// Every script of the store, run with bad arguments and over corrupt values in the
/// keys it reads: each call is refused and no key's DUMP changes. Each row's good call
/// succeeds on the same state first, so the refusals are the bad input's doing.
#[tokio::test]
async fn every_script_refuses_bad_input_without_writing() {
    let server = support::TestRedis::start();
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let rows = rows();
    let mut names: Vec<&str> = tranche_archive_store::scripts()
        .iter()
        .map(|(n, _)| *n)
        .collect();
    let mut covered: Vec<&str> = rows.iter().map(|r| r.script).collect();
    names.sort_unstable();
    covered.sort_unstable();
    assert_eq!(names, covered, "every script has exactly one row");

    for row in &rows {
        let s = script(row.script);
        setup(&server, &mut conn).await;
        invoke(&mut conn, s, &row.keys, &row.good)
            .await
            .unwrap_or_else(|e| panic!("{}: the good call failed: {e}", row.script));
        for (what, bad) in &row.bad_args {
            setup(&server, &mut conn).await;
            let before = server.dump_all();
            let result = invoke(&mut conn, s, &row.keys, bad).await;
            assert!(
                result.is_err(),
                "{} {what}: accepted: {result:?}",
                row.script
            );
            assert_eq!(
                server.dump_all(),
                before,
                "{} {what}: a key changed",
                row.script
            );
        }
        for (key, field, bad) in &row.corrupt {
            setup(&server, &mut conn).await;
            match field {
                Some(f) => {
                    let _: () = server.query(redis::cmd("HSET").arg(key).arg(f).arg(bad));
                }
                None => {
                    let _: () = server.query(redis::cmd("DEL").arg(key));
                    let cmd = match &bad[..] {
                        b"hash" => redis::cmd("HSET").arg(key).arg("f").arg("v").clone(),
                        b"set" => redis::cmd("SADD").arg(key).arg("m").clone(),
                        _ => redis::cmd("SET").arg(key).arg("v").clone(),
                    };
                    let _: redis::Value = server.query(&cmd);
                }
            }
            let before = server.dump_all();
            let result = invoke(&mut conn, s, &row.keys, &row.good).await;
            assert!(
                result.is_err(),
                "{}: accepted over {key} {field:?} = {:?}: {result:?}",
                row.script,
                String::from_utf8_lossy(bad)
            );
            assert_eq!(
                server.dump_all(),
                before,
                "{}: {key} {field:?}: a key changed",
                row.script
            );
        }
    }
}
