//! Every Lua script is an atomic unit on one Redis Cluster slot.
//!
//! Three checks together prove it: scripts name keys only through `KEYS[]` (Redis 7 does
//! not stop a script on a one-node cluster from reaching an undeclared key, so this is
//! checked on the source); the store passes only one shard's keys (the behaviour suite
//! runs every script against a cluster node, which refuses cross-slot `KEYS` with
//! CROSSSLOT); and that node does refuse them, which the negative control below shows.

mod support;

use support::TestRedis;

fn lua_sources() -> Vec<(String, String)> {
    support::lua_sources(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn scripts_name_keys_only_through_keys() {
    let offenders = support::keys_not_from_keys(
        &lua_sources(),
        &[("variadic", 1), ("count", 0), ("start_counting", 0)],
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
        if name == "record.lua" {
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
            name == "record.lua" || loaded.contains(&name),
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
