//! The Lua side: every script keeps to one slot, names keys only through KEYS[], and a
//! refused call writes nothing (DUMP of every key before and after).

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use tranche_codec::{KeySchema, ManualClock, key_slot};
use tranche_control::{
    Change, ControlKeys, ControlStore, Limit, Rate, RateLimiter, RedisControlStore,
    RedisRateLimiter, scripts,
};

use support::TestRedis;

fn schema() -> KeySchema {
    KeySchema::new("elk", 8).unwrap()
}

#[test]
fn every_script_opens_with_its_keys_and_argv() {
    let sources = support::lua_sources(env!("CARGO_MANIFEST_DIR"));
    // Every file but the prelude (`control.lua`) is a script.
    assert_eq!(sources.len(), scripts(&schema()).len() + 1);
    for (name, source) in sources {
        if name == "control.lua" {
            continue;
        }
        let header: String = source
            .lines()
            .take_while(|l| l.starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n");
        assert!(
            header.contains("KEYS[") && header.contains("ARGV["),
            "{name}"
        );
    }
}

#[test]
fn scripts_name_keys_only_through_keys() {
    let sources = support::lua_sources(env!("CARGO_MANIFEST_DIR"));
    let offenders = support::keys_not_from_keys(&sources, &[]);
    assert!(offenders.is_empty(), "keys not from KEYS[]: {offenders:#?}");
}

#[test]
fn every_scripts_keys_share_one_slot() {
    for (name, _, keys) in scripts(&schema()) {
        let slots: Vec<u16> = keys.iter().map(key_slot).collect();
        assert!(slots.windows(2).all(|w| w[0] == w[1]), "{name}: {keys:?}");
        assert_eq!(
            slots[0],
            key_slot("{elk}:meta"),
            "{name} is off the {{ns}} slot"
        );
    }
}

/// On a one-node cluster every operation runs: a CROSSSLOT would fail it.
#[tokio::test]
async fn every_operation_runs_on_a_cluster() {
    let server = TestRedis::start_cluster();
    let conn = redis::cluster::ClusterClient::new(vec![server.url()])
        .unwrap()
        .get_async_connection()
        .await
        .unwrap();
    let clock = Arc::new(ManualClock::new(1_000));
    let store = RedisControlStore::new(conn.clone(), &schema(), clock);
    store.set(&[Change::Chunk(Some(5))], "o").await.unwrap();
    store.throttle(true, "r", "o").await.unwrap();
    assert!(
        store
            .lead_probes("w", Duration::from_secs(3))
            .await
            .unwrap()
            .leads
    );
    assert!(store.report_probe("w", &Default::default()).await.unwrap());
    store.set(&[Change::Chunk(Some(0))], "o").await.unwrap_err();
    server.cli(&["SET", "{elk}:control", "{not json"]);
    assert!(store.read().await.unwrap().throttled().is_some());
    assert!(store.repair("o").await.unwrap().is_some());
    let outcome = store
        .set_unless_changed(&[Change::KeepBelow(Some(5.0))], "w", 0)
        .await
        .unwrap();
    assert_eq!(outcome.skipped, Vec::<String>::new());
    assert_eq!(store.log(5).await.unwrap().len(), 4);
    store.report_probe("w", &Default::default()).await.unwrap();
    assert!(store.retire_probe("w").await.unwrap());
    let limiter = RedisRateLimiter::new(conn, &schema());
    let rate = Rate::per_second(10.0).unwrap();
    limiter
        .reserve(Limit::Ids, rate, 1, Duration::ZERO)
        .await
        .unwrap();
}

/// Runs `script` raw (bypassing the Rust checks) and says whether Redis refused it.
fn refused(server: &TestRedis, source: &str, keys: &[String], args: &[&str]) -> bool {
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_connection().unwrap();
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(source).arg(keys.len());
    for k in keys {
        cmd.arg(k);
    }
    for a in args {
        cmd.arg(*a);
    }
    cmd.query::<redis::Value>(&mut conn).is_err()
}

#[tokio::test]
async fn a_refused_call_writes_nothing() {
    let server = TestRedis::start();
    let conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let keys = ControlKeys::new(&schema());
    let store = RedisControlStore::new(conn.clone(), &schema(), Arc::new(ManualClock::new(1_000)));
    // Every key a script can touch exists, so a stray write shows in its DUMP.
    store
        .set(&[Change::ChunkMax(Some(100))], "o")
        .await
        .unwrap();
    assert!(
        store
            .lead_probes("w", Duration::from_secs(60))
            .await
            .unwrap()
            .leads
    );
    assert!(store.report_probe("w", &Default::default()).await.unwrap());
    let limiter = RedisRateLimiter::new(conn, &schema());
    limiter
        .reserve(
            Limit::Ids,
            Rate::per_second(1.0).unwrap(),
            100,
            Duration::ZERO,
        )
        .await
        .unwrap();
    let before = server.dump_all();
    assert_eq!(
        before.len(),
        4,
        "{:?}",
        before.iter().map(|k| &k.0).collect::<Vec<_>>()
    );

    let bad: Vec<(&str, Vec<Vec<&str>>)> = vec![
        (
            "take.lua",
            vec![
                vec!["0", "1", "0"],
                vec!["0.00001", "1", "0"],
                vec!["1e-300", "1", "0"],
                vec!["-5", "1", "0"],
                vec!["nan", "1", "0"],
                vec!["x", "1", "0"],
                vec!["10", "0", "0"],
                vec!["10", "1.5", "0"],
                vec!["10", "1", "-1"],
                vec!["10", "1"],
            ],
        ),
        (
            "set.lua",
            vec![
                vec!["x", "o", r#"{"chunk":5}"#],
                vec!["1000", "", r#"{"chunk":5}"#],
                vec!["1000", "o", "not json"],
                vec!["1000", "o", "{}"],
                vec!["1000", "o", "[1]"],
                vec!["1000", "o", r#"{"chunk":0}"#],
                vec!["1000", "o", r#"{"chunk":5,"concurrency":0}"#],
                vec!["1000", "o", r#"{"chunk_min":500}"#],
                vec!["1000", "o", r#"{"bogus":1}"#],
                vec!["1000", "o", r#"{"max_rate":"fast"}"#],
                vec!["1000", "o", r#"{"max_rate":0.00001}"#],
                vec!["1000", "o", r#"{"active_hours":"10:00-10:00"}"#],
                vec!["1000", "o", r#"{"active_hours":"25:00-10:00"}"#],
                vec!["1000", "o", r#"{"tz":"a b"}"#],
                vec!["1000", "o", r#"{"manual":{"on":"yes"}}"#],
                vec![
                    "1000",
                    "o",
                    r#"{"chunk":5,"manual":{"on":true,"reason":7}}"#,
                ],
            ],
        ),
        (
            "probe.lua",
            vec![
                vec!["x", "w", "{}"],
                vec!["1000", "", "{}"],
                vec!["1000", "w", "nope"],
                vec!["1000", "w", r#"{"rate":-1}"#],
                vec!["1000", "w", r#"{"rate":"fast"}"#],
                vec!["1000", "w", r#"{"throttle":5}"#],
                vec!["1000", "w", r#"{"ttl_ms":0}"#],
                vec!["1000", "w", r#"{"ttl_ms":3600001}"#],
                vec!["1000", "w", r#"{"ttl_ms":1.5}"#],
            ],
        ),
        (
            "repair.lua",
            vec![
                vec!["x", "o", "old", r#"{"version":1,"settings":{}}"#, "n"],
                vec!["1000", "", "old", r#"{"version":1,"settings":{}}"#, "n"],
                vec!["1000", "o", "old", "not json", "n"],
                vec!["1000", "o", "old", r#"{"version":-1,"settings":{}}"#, "n"],
                vec!["1000", "o", "old", r#"{"version":1}"#, "n"],
                vec!["1000", "o", "old", r#"{"version":1,"settings":{}}"#, ""],
                // Answered 0: the stored record is not "old".
                vec!["1000", "o", "old", r#"{"version":1,"settings":{}}"#, "n"],
            ],
        ),
        (
            "lead.lua",
            vec![
                vec!["", "1000"],
                vec!["w2", "0"],
                vec!["w2", "x"],
                vec!["w2", "1000"],
            ],
        ),
        (
            "retire.lua",
            vec![
                vec!["x", "w"],
                vec!["1000", ""],
                vec!["1000", "not-a-prober"],
            ],
        ),
        (
            "set.lua",
            vec![
                vec!["1000", "o", r#"{"chunk":5}"#, "x"],
                vec!["1000", "o", r#"{"chunk":5}"#, "-1"],
            ],
        ),
    ];
    let all = scripts(&schema());
    for (name, cases) in bad {
        let (_, source, script_keys) = all.iter().find(|(n, _, _)| *n == name).unwrap();
        for args in cases {
            // The last probe and lead cases are answered (0: not the leader), not refused.
            let _ = refused(&server, source, script_keys, &args);
            assert_eq!(server.dump_all(), before, "{name} {args:?} wrote");
        }
    }

    // A stored record that is not JSON is refused by a probe report (set.lua replaces
    // it, see the behaviour suite), a corrupt TAT by take.lua, with nothing written.
    for (key, junk) in [(keys.record(), "{not json"), (keys.rate(Limit::Ids), "abc")] {
        server.cli(&["SET", &key, junk]);
        let before = server.dump_all();
        for (name, source, script_keys) in &all {
            let args: &[&str] = match *name {
                "take.lua" => &["10", "1", "0"],
                "probe.lua" => &["1000", "w", "{}"],
                "retire.lua" => &["1000", "w"],
                _ => continue,
            };
            if script_keys.contains(&key) {
                assert!(
                    refused(&server, source, script_keys, args),
                    "{name} on corrupt {key}"
                );
                assert_eq!(server.dump_all(), before, "{name} wrote on corrupt {key}");
            }
        }
    }
}

/// A prober key with no TTL (written by hand, or by a foreign tool) would keep a dead
/// holder in the lead for ever: the next election gives it the term and says so.
#[tokio::test]
async fn a_prober_key_without_a_ttl_is_repaired() {
    let server = TestRedis::start();
    let conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let keys = ControlKeys::new(&schema());
    let store = RedisControlStore::new(conn, &schema(), Arc::new(ManualClock::new(1_000)));
    server.cli(&["SET", &keys.prober(), "ghost"]);
    let lead = store
        .lead_probes("w1", Duration::from_secs(3))
        .await
        .unwrap();
    assert!(!lead.leads && lead.repaired_ttl, "{lead:?}");
    let ttl: i64 = server.cli(&["PTTL", &keys.prober()]).parse().unwrap();
    assert!((1..=3_000).contains(&ttl), "{ttl}");
    let again = store
        .lead_probes("w1", Duration::from_secs(3))
        .await
        .unwrap();
    assert!(!again.repaired_ttl, "repaired once");
    // The holder's own renewal repairs it too, and it keeps the lead.
    server.cli(&["SET", &keys.prober(), "w1"]);
    let own = store
        .lead_probes("w1", Duration::from_secs(3))
        .await
        .unwrap();
    assert!(own.leads && own.repaired_ttl);
    // A prober key of the wrong type is an error, never a lead.
    server.cli(&["DEL", &keys.prober()]);
    server.cli(&["HSET", &keys.prober(), "a", "b"]);
    assert!(
        store
            .lead_probes("w1", Duration::from_secs(3))
            .await
            .is_err()
    );
}
