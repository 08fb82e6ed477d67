//! Every Lua script is an atomic unit on one Redis Cluster slot: scripts name keys only
//! through `KEYS[]` (checked on the source, since a one-node cluster does not stop an
//! undeclared key), and the behaviour suite runs every script against a cluster node.

use std::fs;
use std::path::Path;

fn lua_sources() -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("lua");
    let mut out: Vec<(String, String)> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "lua"))
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                fs::read_to_string(&p).unwrap(),
            )
        })
        .collect();
    out.sort();
    out
}

#[test]
fn scripts_name_keys_only_through_keys() {
    let mut offenders = Vec::new();
    for (name, source) in lua_sources() {
        for (n, line) in source.lines().enumerate() {
            // `variadic(cmd, key, list)` in prelude.lua forwards its key to redis.call;
            // its callers are checked like redis.call's.
            if line.contains("redis.call(cmd, key,") || line.trim_start().starts_with("--") {
                continue;
            }
            let mut rest = line;
            while let Some(at) = rest.find("redis.call(").or_else(|| rest.find("variadic(")) {
                let call = if rest[at..].starts_with("redis.call(") {
                    "redis.call("
                } else {
                    "variadic("
                };
                rest = &rest[at + call.len()..];
                if rest.starts_with("cmd,") {
                    continue;
                }
                let args: Vec<&str> = rest.splitn(3, ',').map(str::trim).collect();
                let command = args[0].trim_matches(|c| c == '\'' || c == '"' || c == ')');
                let keyless = command == "TIME";
                if !keyless && !args.get(1).is_some_and(|a| a.starts_with("KEYS[")) {
                    offenders.push(format!("{name}:{}: {}", n + 1, line.trim()));
                }
            }
        }
    }
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
