//! Every script refuses a key of the wrong type before its first write: for each row of
//! the refusal table and each key of its call, the key is replaced (or, absent from the
//! row's state, created) with a value of three other types in turn. Redis answers a
//! command on a key of another type with WRONGTYPE but keeps what the script wrote
//! before it, so a script that writes first and meets the wrong type later is left half
//! applied.
//!
//! A call either is refused, with DUMP of every key, the wrong-typed one too, unchanged;
//! or never looks at the key (its path does not need it: a beat that cuts nothing reads
//! no piece), which the key's access count shows, and then the key is unchanged and the
//! call did what it does without it. Refusing those too would cost a TYPE call per key
//! on the hot path (claim, heartbeat, complete) for a key the call does not touch.
//! The access count is Redis's LFU counter made exact: `allkeys-lfu` with a log factor
//! of 0 (every access counts) and no decay; `OBJECT FREQ` and `TYPE` do not count as
//! accesses, DUMP does.

use crate::support;

use support::{Dump, TestRedis};

use super::{call, refusal_rows, refusal_state};

/// The type a key of the active store holds, by its name's last part: every key a row
/// passes must be named here, so a new key cannot go untested.
fn expected_type(key: &str) -> &'static str {
    const TYPES: &[(&str, &str)] = &[
        (":active", "hash"),
        (":active:quarantine", "hash"),
        (":pending", "zset"),
        (":leases", "zset"),
        (":runs", "hash"),
        (":plans", "list"),
        (":cursor", "hash"),
        (":seq", "string"),
        (":counts", "hash"),
        (":completed:index", "string"),
        (":inbox", "stream"),
        (":splits", "hash"),
        (":pieces", "hash"),
        (":piece_pending", "zset"),
        (":piece_leases", "zset"),
        (":meta", "hash"),
    ];
    TYPES
        .iter()
        .filter(|(suffix, _)| key.ends_with(suffix))
        .max_by_key(|(suffix, _)| suffix.len())
        .map(|(_, kind)| *kind)
        .unwrap_or_else(|| panic!("no expected type for key {key}"))
}

/// The wrong types tried in place of a key of type `kind`: the first three of string,
/// hash, zset, list and set that it is not, so each command family meets a string and
/// two containers of other families.
fn wrong_types(kind: &str) -> Vec<&'static str> {
    ["string", "hash", "zset", "list", "set"]
        .into_iter()
        .filter(|t| *t != kind)
        .take(3)
        .collect()
}

/// Puts a value of type `kind` at `key`, in place of whatever was there.
fn put(server: &TestRedis, key: &str, kind: &str) {
    server.cli(&["DEL", key]);
    let args: &[&str] = match kind {
        "string" => &["SET", key, "wrong-type"],
        "hash" => &["HSET", key, "wrong", "type"],
        "zset" => &["ZADD", key, "1", "wrong-type"],
        "list" => &["RPUSH", key, "wrong-type"],
        "set" => &["SADD", key, "wrong-type"],
        _ => unreachable!("no way to write a {kind}"),
    };
    server.cli(args);
    assert_eq!(server.cli(&["TYPE", key]), kind, "{key} made a {kind}");
}

/// Puts every key of `dumps` back as it was, and nothing else.
fn restore(server: &TestRedis, dumps: &[(String, Option<Dump>)]) {
    server.cli(&["FLUSHALL"]);
    for (key, dump) in dumps {
        let dump = dump.as_ref().expect("a listed key dumps");
        let _: () = server.query(redis::cmd("RESTORE").arg(key).arg(0).arg(dump.bytes()));
    }
}

/// How many times `key` was looked up since it was written (see the module docs).
fn accesses(server: &TestRedis, key: &str) -> Option<i64> {
    server.query(redis::cmd("OBJECT").arg("FREQ").arg(key))
}

/// Makes `OBJECT FREQ` an exact access count, and shows it is one: a script's read of a
/// key counts once, its TYPE of the key not at all.
fn count_accesses(server: &TestRedis) {
    for (name, value) in [
        ("maxmemory-policy", "allkeys-lfu"),
        ("lfu-log-factor", "0"),
        ("lfu-decay-time", "0"),
    ] {
        assert_eq!(server.cli(&["CONFIG", "SET", name, value]), "OK");
    }
    server.cli(&["HSET", "control", "f", "v"]);
    let before = accesses(server, "control").expect("the control key");
    let script = "redis.call('TYPE', KEYS[1]) return redis.call('HGET', KEYS[1], 'f')";
    let read: String = server.query(redis::cmd("EVAL").arg(script).arg(1).arg("control"));
    assert_eq!(read, "v");
    assert_eq!(accesses(server, "control"), Some(before + 1));
    server.cli(&["DEL", "control"]);
}

/// Each row's good call, with one of its keys of a wrong type (three other types in
/// turn), is refused with an error reply and writes nothing: DUMP of every key is the
/// same before and after. Or it succeeds without once looking the key up (its path does
/// not need it), leaving it as it was. Each case is judged on its own (the state is put
/// back after every one), and every row has cases refused.
#[tokio::test]
async fn every_script_refuses_a_key_of_the_wrong_type_before_writing() {
    let probe = TestRedis::start();
    let tokens = refusal_state(&probe).await;
    let n = refusal_rows(&probe, &tokens).len();
    drop(probe);

    let (mut failures, mut cases, mut untouched) = (Vec::new(), 0usize, Vec::new());
    for i in 0..n {
        let server = TestRedis::start();
        count_accesses(&server);
        let tokens = refusal_state(&server).await;
        let row = &refusal_rows(&server, &tokens)[i];
        for c in &row.setup {
            c.apply(&server);
        }
        let client = redis::Client::open(server.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let good: Vec<String> = row.args.iter().map(|(v, _)| v.clone()).collect();
        let state = server.dump_all();
        let mut keys = row.keys.clone();
        keys.dedup();
        let mut refused = 0;
        for key in &keys {
            let kind = expected_type(key);
            let now = server.cli(&["TYPE", key]);
            assert!(
                now == "none" || now == kind,
                "row {i} {}: {key} is a {now}, expected a {kind}",
                row.script
            );
            for wrong in wrong_types(kind) {
                put(&server, key, wrong);
                let before = server.dump_all();
                let seen = accesses(&server, key);
                let reply = call(&mut conn, row.script, &row.keys, &good).await;
                let looked = accesses(&server, key) != seen;
                let after = server.dump_all();
                cases += 1;
                let changed: Vec<&str> = keys_changed(&before, &after);
                if reply.is_ok() && !looked && !changed.contains(&key.as_str()) {
                    untouched.push(format!("row {i} {} {key}", row.script));
                } else if reply.is_ok() || !changed.is_empty() {
                    let reply = match &reply {
                        Ok(v) => format!("ok {v:?}"),
                        Err(e) => format!("refused ({e})"),
                    };
                    failures.push(format!(
                        "row {i} {}: {key} a {wrong}: {reply}{}",
                        row.script,
                        if changed.is_empty() {
                            String::new()
                        } else {
                            format!(", and it wrote {}", changed.join(" "))
                        }
                    ));
                } else {
                    refused += 1;
                }
                restore(&server, &state);
            }
        }
        if refused == 0 {
            failures.push(format!("row {i} {}: no case refused", row.script));
        }
    }
    assert!(cases > n, "{cases} cases for {n} rows");
    assert!(
        failures.is_empty(),
        "{} of {cases} wrong-type cases not refused before the first write \
         ({} passed untouched: {untouched:?}):\n{}",
        failures.len(),
        untouched.len(),
        failures.join("\n")
    );
}

/// The keys whose DUMP differs between `before` and `after`, or that only one holds.
fn keys_changed<'a>(
    before: &'a [(String, Option<Dump>)],
    after: &'a [(String, Option<Dump>)],
) -> Vec<&'a str> {
    let mut changed: Vec<&str> = before
        .iter()
        .filter(|b| !after.contains(b))
        .chain(after.iter().filter(|a| !before.contains(a)))
        .map(|(k, _)| k.as_str())
        .collect();
    changed.sort_unstable();
    changed.dedup();
    changed
}
