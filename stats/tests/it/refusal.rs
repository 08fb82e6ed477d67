//! The scripts called directly over a known state: each refuses bad arguments and
//! corrupt values with every key's DUMP unchanged, `publish` never moves `latest`
//! back, and `replace` rebuilds over corrupt values.

use crate::scripts::{T0, rec};
use crate::support;

use tranche_codec::{CompletedRecord, KeySchema};
use tranche_stats::archive_protocol::{delta_args, stats_keys};
use tranche_stats::{RedisStats, Stats, StatsDelta, StatsStore};

use support::TestRedis;

/// One script's row of the DUMP harness: how to call it well on the state `setup`
/// leaves, calls with bad arguments, and corrupt values in the keys it reads; each bad
/// call must be refused with every key's DUMP unchanged.
struct Row {
    script: &'static str,
    keys: Vec<String>,
    good: Vec<String>,
    /// Bad argument lists, each with what it breaks.
    bad_args: Vec<(&'static str, Vec<String>)>,
    /// Corruptions: a key, a field (`None`: the key becomes a string of that value)
    /// and the bad value; `good` must then be refused.
    corrupt: Vec<(String, Option<String>, Vec<u8>)>,
}

fn strings(xs: &[&str]) -> Vec<String> {
    xs.iter().map(|x| (*x).to_owned()).collect()
}

/// Shard 0 with statistics of pids 1..=50 and snapshot version 1 published.
async fn setup(server: &TestRedis, store: &RedisStats<redis::aio::ConnectionManager>) {
    let _: () = server.query(&redis::cmd("FLUSHALL"));
    let recs: Vec<CompletedRecord> = (1..=50).map(|p| rec(p, "w1", T0 + p, 1000)).collect();
    tranche_stats::testing::apply_alone(store, 0, &StatsDelta::from_records(&recs), T0)
        .await
        .unwrap();
    assert_eq!(store.publish_snapshot().await.unwrap(), 1);
}

fn rows(schema: &KeySchema, server: &TestRedis) -> Vec<Row> {
    let keys = stats_keys(schema, 0).to_vec();
    let more: Vec<CompletedRecord> = (51..=60).map(|p| rec(p, "w1", T0 + p, 1000)).collect();
    let delta = delta_args(&StatsDelta::from_records(&more), T0);
    let hist_field: String = {
        let fields: Vec<String> = server.query(redis::cmd("HKEYS").arg(&keys[4]));
        fields.into_iter().min().unwrap()
    };
    let day: String = {
        let fields: Vec<String> = server.query(redis::cmd("HKEYS").arg(&keys[3]));
        fields.into_iter().min().unwrap()
    };
    // Delta arguments broken in each way `stats_plan` must refuse before writing.
    let mut short = delta.clone();
    short[0] = (delta.len()).to_string();
    let mut long = delta.clone();
    long[0] = (delta.len() - 2).to_string();
    let mut not_count = delta.clone();
    not_count[2] = "ten".into();
    let mut too_big = delta.clone();
    too_big[2] = "1000000000000000000".into();
    let bad_deltas = vec![
        ("no arguments", vec![]),
        ("count not a number", strings(&["x"])),
        ("fewer arguments than said", short),
        ("more arguments than said", long),
        ("a count not decimal", not_count),
        ("a count past the guard", too_big),
    ];
    let reads = vec![
        (keys[0].clone(), Some("count".to_owned()), b"x".to_vec()),
        (keys[0].clone(), Some("palette".to_owned()), b"1.5".to_vec()),
        (
            keys[1].clone(),
            Some("w1|count".to_owned()),
            b"many".to_vec(),
        ),
        (keys[1].clone(), Some("w1|idx".to_owned()), b"one".to_vec()),
        (keys[2].clone(), Some("0".to_owned()), b"\x80".to_vec()),
        (keys[3].clone(), Some(day), b"\x00\x80".to_vec()),
        (keys[4].clone(), Some(hist_field), b"1.5".to_vec()),
        (keys[0].clone(), None, b"a string".to_vec()),
    ];
    let quarantine = schema.stats(0, "quarantine");
    let mut repair_keys = keys.clone();
    repair_keys.push(quarantine.clone());
    let repair = |mode: &str, now: &str, damaged: &[&str], delta: &[String]| {
        let mut a = strings(&[mode, now, &(damaged.len() / 2).to_string()]);
        a.extend(strings(damaged));
        a.extend(delta.iter().cloned());
        a
    };
    let mut repair_bad: Vec<(&'static str, Vec<String>)> = vec![
        ("mode", repair("half", "1", &[], &delta)),
        ("time", repair("whole", "soon", &[], &delta)),
        ("damage count", strings(&["whole", "1", "x"])),
        (
            "damage count past the arguments",
            strings(&["whole", "1", "9", "3", "0"]),
        ),
        ("damaged key", repair("patch", "1", &["6", "0"], &delta)),
        ("trailing arguments", {
            let mut a = repair("whole", "1", &[], &delta);
            a.push("extra".into());
            a
        }),
    ];
    for (what, d) in &bad_deltas {
        repair_bad.push((what, repair("whole", "1", &[], d)));
    }
    let version = |v: &str| strings(&[v, "{}", "{}"]);
    let latest = format!("{}:stats:latest", schema.global_tag());
    vec![
        Row {
            script: "apply",
            keys: keys.clone(),
            good: delta.clone(),
            bad_args: {
                // The ranges layout after the delta: 1 or 2, and nothing after it.
                let mut bad = bad_deltas.clone();
                for (what, tail) in [
                    ("layout 3", &["3"][..]),
                    ("layout x", &["x"]),
                    ("after the layout", &["2", "2"]),
                ] {
                    let mut args = delta.clone();
                    args.extend(tail.iter().map(|t| t.to_string()));
                    bad.push((what, args));
                }
                bad
            },
            corrupt: reads.clone(),
        },
        Row {
            script: "replace",
            keys: keys.clone(),
            good: delta.clone(),
            bad_args: bad_deltas.clone(),
            // It plans against an empty shard and reads no stored value: a corrupt
            // one is what it replaces (tested apart).
            corrupt: vec![],
        },
        Row {
            script: "repair",
            keys: repair_keys,
            good: repair("patch", "1", &["3", "0"], &delta),
            bad_args: repair_bad,
            // Patching reads every value but the damaged ones; its quarantine must be
            // a hash.
            corrupt: {
                let mut c: Vec<_> = reads
                    .iter()
                    .filter(|(k, f, _)| !(k == &keys[2] && f.as_deref() == Some("0")))
                    .cloned()
                    .collect();
                c.push((quarantine, None, b"a string".to_vec()));
                c
            },
        },
        Row {
            script: "publish",
            keys: vec![
                format!("{}:stats:snapshot:v2", schema.global_tag()),
                latest.clone(),
                format!("{}:stats:config", schema.global_tag()),
            ],
            good: version("2"),
            bad_args: vec![
                ("no version", vec![]),
                ("version not a number", version("two")),
                ("version zero", version("0")),
                ("version negative", version("-2")),
                ("empty snapshot", strings(&["2", "", "{}"])),
                ("empty config", strings(&["2", "{}", ""])),
                ("an extra argument", strings(&["2", "{}", "{}", "x"])),
            ],
            corrupt: vec![
                (latest.clone(), None, b"latest".to_vec()),
                (latest, None, b"1.5".to_vec()),
            ],
        },
    ]
}

async fn invoke(
    server: &TestRedis,
    script: &redis::Script,
    keys: &[String],
    args: &[String],
) -> redis::RedisResult<redis::Value> {
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut call = script.prepare_invoke();
    for k in keys {
        call.key(k);
    }
    for a in args {
        call.arg(a);
    }
    call.invoke_async(&mut conn).await
}

/// Every script of the crate, run with bad arguments and over corrupt values in every
/// key it reads: each call is refused and no key's DUMP changes. The good call of each
/// row succeeds on the same state, so the harness proves the refusals are the bad
/// input's doing.
#[tokio::test]
async fn every_script_refuses_bad_input_without_writing() {
    let server = TestRedis::start();
    let client = redis::Client::open(server.url()).unwrap();
    let conn = client.get_connection_manager().await.unwrap();
    let schema = KeySchema::new("elk", 1).unwrap();
    let store = RedisStats::new(conn, schema.clone());
    setup(&server, &store).await;
    let rows = rows(&schema, &server);
    let scripts = tranche_stats::testing::scripts();
    let mut names: Vec<&str> = scripts.iter().map(|(n, _)| *n).collect();
    let mut covered: Vec<&str> = rows.iter().map(|r| r.script).collect();
    names.sort_unstable();
    covered.sort_unstable();
    assert_eq!(names, covered, "every script has exactly one row");

    for row in &rows {
        let script = scripts.iter().find(|(n, _)| *n == row.script).unwrap().1;
        setup(&server, &store).await;
        invoke(&server, script, &row.keys, &row.good)
            .await
            .unwrap_or_else(|e| panic!("{}: the good call failed: {e}", row.script));
        for (what, args) in &row.bad_args {
            setup(&server, &store).await;
            let before = server.dump_all();
            let result = invoke(&server, script, &row.keys, args).await;
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
            setup(&server, &store).await;
            match field {
                Some(f) => {
                    let _: () = server.query(redis::cmd("HSET").arg(key).arg(f).arg(bad));
                }
                None => {
                    let _: () = server.query(redis::cmd("DEL").arg(key));
                    let _: () = server.query(redis::cmd("SET").arg(key).arg(bad));
                }
            }
            let before = server.dump_all();
            let result = invoke(&server, script, &row.keys, &row.good).await;
            assert!(
                result.is_err(),
                "{}: accepted over {key} {field:?} = {bad:?}: {result:?}",
                row.script
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

/// `latest` only moves forward: a slow publisher of an older version stores its
/// snapshot but neither `latest` nor `config` goes back; a newer one moves both.
#[tokio::test]
async fn publish_never_moves_latest_back() {
    let server = TestRedis::start();
    let client = redis::Client::open(server.url()).unwrap();
    let conn = client.get_connection_manager().await.unwrap();
    let schema = KeySchema::new("elk", 1).unwrap();
    let store = RedisStats::new(conn, schema.clone());
    let script = tranche_stats::testing::scripts()
        .into_iter()
        .find(|(n, _)| *n == "publish")
        .unwrap()
        .1;
    let tag = schema.global_tag();
    let keys = |v: u64| {
        vec![
            format!("{tag}:stats:snapshot:v{v}"),
            format!("{tag}:stats:latest"),
            format!("{tag}:stats:config"),
        ]
    };
    let args = |v: u64| {
        strings(&[
            &v.to_string(),
            &format!("snapshot {v}"),
            &format!("config {v}"),
        ])
    };
    invoke(&server, script, &keys(5), &args(5)).await.unwrap();
    invoke(&server, script, &keys(3), &args(3)).await.unwrap();
    let get = |k: String| -> Option<String> { server.query(redis::cmd("GET").arg(k)) };
    assert_eq!(get(format!("{tag}:stats:latest")).as_deref(), Some("5"));
    assert_eq!(
        get(format!("{tag}:stats:config")).as_deref(),
        Some("config 5")
    );
    assert_eq!(get(keys(3)[0].clone()).as_deref(), Some("snapshot 3"));
    // A newer version moves both.
    invoke(&server, script, &keys(6), &args(6)).await.unwrap();
    assert_eq!(get(format!("{tag}:stats:latest")).as_deref(), Some("6"));
    assert_eq!(
        get(format!("{tag}:stats:config")).as_deref(),
        Some("config 6")
    );
    // Through the store: versions 1 and 2 come from INCR; latest is still the 6 above.
    store.publish_snapshot().await.unwrap();
    assert_eq!(get(format!("{tag}:stats:latest")).as_deref(), Some("6"));
}

/// `replace` plans against an empty shard: it repairs a shard whose stored values do
/// not decode, where planning over them would refuse.
#[tokio::test]
async fn replace_rebuilds_over_corrupt_values() {
    let server = TestRedis::start();
    let client = redis::Client::open(server.url()).unwrap();
    let conn = client.get_connection_manager().await.unwrap();
    let schema = KeySchema::new("elk", 1).unwrap();
    let store = RedisStats::new(conn, schema.clone());
    setup(&server, &store).await;
    let keys = stats_keys(&schema, 0);
    let _: () = server.query(redis::cmd("HSET").arg(&keys[2]).arg("0").arg(b"\x80"));
    assert!(store.stats().await.is_err());
    let recs: Vec<CompletedRecord> = (1..=50).map(|p| rec(p, "w1", T0 + p, 1000)).collect();
    store
        .replace(0, &StatsDelta::from_records(&recs))
        .await
        .unwrap();
    let found = store.stats().await.unwrap();
    assert!(tranche_stats::diff(&Stats::from_records(&recs), &found).is_empty());
}
