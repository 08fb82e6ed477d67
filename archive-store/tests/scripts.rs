//! Every Lua script is an atomic unit on one Redis Cluster slot: scripts name keys only
//! through `KEYS[]` (checked on the source, since a one-node cluster does not stop an
//! undeclared key), and the behaviour suite runs every script against a cluster node.

#[path = "../../active-store/tests/support/mod.rs"]
mod support;

fn lua_sources() -> Vec<(String, String)> {
    support::lua_sources(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn scripts_name_keys_only_through_keys() {
    let offenders = support::keys_not_from_keys(&lua_sources(), &[("variadic", 1)]);
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
    let call = |second_target: &str, ttl: &str| {
        let mut call = script.prepare_invoke();
        for key in keys {
            call.key(key);
        }
        // Two records one by one, no open or sealed batch, an empty statistics delta.
        call.arg("2")
            .arg(&["1", "1", "a", "0"][..])
            .arg(&["2", "2", "b", second_target][..])
            .arg("0")
            .arg("0")
            .arg(ttl)
            .arg("0");
        call
    };
    let before = server.dump_all();
    for (target, ttl, says) in [
        ("1", "0", "target"),
        ("x", "0", "target"),
        ("0", "x", "time to live"),
    ] {
        let err = call(target, ttl)
            .invoke_async::<redis::Value>(&mut conn)
            .await
            .unwrap_err();
        assert!(err.to_string().contains(says), "{target} {ttl}: {err}");
        assert_eq!(server.dump_all(), before, "a refused archive call wrote");
    }
    let written: Vec<i64> = call("0", "0").invoke_async(&mut conn).await.unwrap();
    assert_eq!(written, vec![1, 2]);
    assert_ne!(server.dump_all(), before);
}
