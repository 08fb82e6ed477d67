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
