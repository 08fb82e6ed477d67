//! `doctor`'s checks, one per concern: what each reads of a Redis node (`INFO`,
//! `CONFIG GET`, `TIME`, `CLUSTER INFO`, `ACL DRYRUN`, pings) and how each reading is
//! judged. `mod.rs` runs them on each node and prints the findings.

use super::*;

/// `INFO section`'s text.
pub(super) async fn info(conn: &mut MultiplexedConnection, section: &str) -> Result<String> {
    redis::cmd("INFO")
        .arg(section)
        .query_async(conn)
        .await
        .with_context(|| format!("INFO {section}"))
}

/// One `field:value` line of an INFO reply.
pub(super) fn field(info: &str, name: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(|v| v.trim().to_owned())
}

/// `CONFIG GET name`, or `None` when CONFIG is not allowed (managed services rename
/// or forbid it).
pub(super) async fn config(conn: &mut MultiplexedConnection, name: &str) -> Option<String> {
    let pairs: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg(name)
        .query_async(conn)
        .await
        .ok()?;
    pairs.into_iter().nth(1)
}

pub(super) fn judge_version(version: Option<String>) -> Finding {
    let Some(version) = version else {
        return Finding::new("version", Verdict::Warn, "INFO names no redis_version");
    };
    let mut parts = version.split('.').map(|p| p.parse::<u64>().unwrap_or(0));
    let found = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if found < MIN_VERSION {
        return Finding::new(
            "version",
            Verdict::Fail,
            format!(
                "Redis {version}: tranche needs {}.{} or later (XAUTOCLAIM)",
                MIN_VERSION.0, MIN_VERSION.1
            ),
        );
    }
    Finding::new("version", Verdict::Ok, format!("Redis {version}"))
}

pub(super) fn judge_eviction(policy: Option<&str>) -> Finding {
    match policy {
        Some("noeviction") => Finding::new(
            "eviction",
            Verdict::Ok,
            "maxmemory-policy noeviction: a full Redis refuses writes instead of dropping keys",
        ),
        Some(policy) => Finding::new(
            "eviction",
            Verdict::Fail,
            format!(
                "maxmemory-policy {policy} may evict leases and archive segments; fix: CONFIG SET maxmemory-policy noeviction (and in redis.conf)"
            ),
        ),
        None => Finding::new(
            "eviction",
            Verdict::Skip,
            "INFO memory names no maxmemory_policy",
        ),
    }
}

pub(super) fn judge_persistence(
    aof: bool,
    save: Option<&str>,
    appendfsync: Option<&str>,
) -> Finding {
    let rdb = save.is_some_and(|s| !s.trim().is_empty());
    match (aof, rdb) {
        (true, _) if appendfsync == Some("no") => Finding::new(
            "persistence",
            Verdict::Warn,
            "AOF with appendfsync no: the OS decides when writes reach the disk; a crash loses seconds of them (CONFIG SET appendfsync everysec)",
        ),
        (true, _) => Finding::new(
            "persistence",
            Verdict::Ok,
            format!(
                "AOF on (appendfsync {}){}",
                appendfsync.unwrap_or("unknown"),
                if rdb { ", RDB snapshots too" } else { "" }
            ),
        ),
        (false, true) => Finding::new(
            "persistence",
            Verdict::Ok,
            format!(
                "RDB snapshots (save {}), no AOF: a restart loses what came after the last snapshot",
                save.unwrap_or_default().trim()
            ),
        ),
        (false, false) if save.is_none() => Finding::new(
            "persistence",
            Verdict::Warn,
            "AOF off and `save` unreadable (CONFIG not allowed): check that RDB snapshots are on",
        ),
        (false, false) => Finding::new(
            "persistence",
            Verdict::Fail,
            "neither AOF nor RDB: a restart loses the whole job; fix: CONFIG SET appendonly yes (and in redis.conf)",
        ),
    }
}

pub(super) fn judge_replicas(
    role: Option<&str>,
    replicas: Option<u64>,
    min_replicas_to_write: Option<u64>,
) -> Finding {
    if role == Some("slave") {
        return Finding::new(
            "replicas",
            Verdict::Fail,
            "this node is a replica: it refuses writes; point --redis at the master",
        );
    }
    let min = match min_replicas_to_write {
        Some(n) => format!("min-replicas-to-write {n}"),
        None => "min-replicas-to-write unreadable".to_owned(),
    };
    match replicas.unwrap_or(0) {
        0 => Finding::new(
            "replicas",
            Verdict::Warn,
            format!("no replica ({min}): losing this node loses the job unless it is persisted"),
        ),
        n => Finding::new(
            "replicas",
            Verdict::Ok,
            format!(
                "{n} replica(s), {min}{}",
                if min_replicas_to_write == Some(0) {
                    " (a failover may lose the last acknowledged writes)"
                } else {
                    ""
                }
            ),
        ),
    }
}

/// `offset_ms` is Redis's `TIME` minus this host's clock, taken half way through the
/// round trip.
pub(super) fn judge_clock(offset_ms: i64) -> Finding {
    if offset_ms.abs() > MAX_CLOCK_OFFSET_MS {
        return Finding::new(
            "clock",
            Verdict::Fail,
            format!(
                "this host's clock is {} ms {} Redis's TIME (more than {MAX_CLOCK_OFFSET_MS} ms): sync it with NTP",
                offset_ms.abs(),
                if offset_ms > 0 { "behind" } else { "ahead of" }
            ),
        );
    }
    Finding::new(
        "clock",
        Verdict::Ok,
        format!(
            "this host's clock is within {} ms of Redis's TIME",
            offset_ms.abs()
        ),
    )
}

pub(super) async fn clock(conn: &mut MultiplexedConnection) -> Finding {
    let before = now_ms();
    let time: Result<(String, String), _> = redis::cmd("TIME").query_async(conn).await;
    let after = now_ms();
    match time {
        Ok((secs, micros)) => {
            let redis_ms =
                secs.parse::<i64>().unwrap_or(0) * 1000 + micros.parse::<i64>().unwrap_or(0) / 1000;
            judge_clock(redis_ms - (before + after) / 2)
        }
        Err(e) => Finding::new("clock", Verdict::Skip, format!("TIME: {e}")),
    }
}

pub(super) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// `cluster_info` is `CLUSTER INFO`'s text, `None` for a standalone server.
pub(super) fn judge_cluster(cluster_info: Option<&str>) -> Finding {
    let Some(text) = cluster_info else {
        return Finding::new("cluster", Verdict::Ok, "standalone (not a cluster)");
    };
    let state = field(text, "cluster_state").unwrap_or_default();
    let ok: u64 = field(text, "cluster_slots_ok")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    if state != "ok" || ok < 16384 {
        return Finding::new(
            "cluster",
            Verdict::Fail,
            format!(
                "cluster state {state}, {ok} of 16384 slots served: keys in the others cannot be reached (CLUSTER ADDSLOTS or fix the failed nodes)"
            ),
        );
    }
    Finding::new("cluster", Verdict::Ok, "cluster, all 16384 slots served")
}

pub(super) async fn cluster(conn: &mut MultiplexedConnection) -> Result<Finding> {
    let enabled = field(&info(conn, "cluster").await?, "cluster_enabled");
    if enabled.as_deref() != Some("1") {
        return Ok(judge_cluster(None));
    }
    let text: Result<String, _> = redis::cmd("CLUSTER").arg("INFO").query_async(conn).await;
    Ok(match text {
        Ok(text) => judge_cluster(Some(&text)),
        Err(e) => Finding::new("cluster", Verdict::Skip, format!("CLUSTER INFO: {e}")),
    })
}

/// Every command tranche sends, with plausible arguments; `K` stands for a key of
/// the namespace. deploy/redis/acl.conf grants them by category.
pub(super) const COMMANDS: &[&[&str]] = &[
    &[
        "EVALSHA",
        "0000000000000000000000000000000000000000",
        "1",
        "K",
    ],
    &["EVAL", "return 1", "1", "K"],
    &["SCRIPT", "LOAD", "return 1"],
    &["GET", "K"],
    &["SET", "K", "v"],
    &["HGET", "K", "f"],
    &["HGETALL", "K"],
    &["HMGET", "K", "f"],
    &["HSET", "K", "f", "v"],
    &["HSETNX", "K", "f", "v"],
    &["HDEL", "K", "f"],
    &["HINCRBY", "K", "f", "1"],
    &["HEXISTS", "K", "f"],
    &["HSCAN", "K", "0"],
    &["SADD", "K", "m"],
    &["SREM", "K", "m"],
    &["SPOP", "K"],
    &["SMEMBERS", "K"],
    &["GETBIT", "K", "0"],
    &["SETBIT", "K", "0", "1"],
    &["BITFIELD", "K", "GET", "u8", "0"],
    &["GETRANGE", "K", "0", "1"],
    &["STRLEN", "K"],
    &["PTTL", "K"],
    &["PEXPIRE", "K", "1000"],
    &["EXISTS", "K"],
    &["DEL", "K"],
    &["UNLINK", "K"],
    &["INCR", "K"],
    &["XADD", "K", "*", "f", "v"],
    &["XRANGE", "K", "-", "+"],
    &["XREVRANGE", "K", "+", "-"],
    &["XDEL", "K", "0-1"],
    &["XLEN", "K"],
    &["XGROUP", "CREATE", "K", "g", "$"],
    &["XREADGROUP", "GROUP", "g", "c", "STREAMS", "K", ">"],
    &["XACK", "K", "g", "0-1"],
    &["XAUTOCLAIM", "K", "g", "c", "0", "0-0"],
    &["SCAN", "0"],
    &["INFO"],
    &["PING"],
    &["CLIENT", "SETNAME", "tranche"],
    &["TIME"],
];

/// Whether `user` may send every command in [`COMMANDS`] on the namespace's keys, by
/// ACL DRYRUN (Redis 7.0 and later).
pub(super) async fn acl(
    conn: &mut MultiplexedConnection,
    g: &Global,
    user: Option<&str>,
) -> Finding {
    let user = match user {
        Some(user) => user.to_owned(),
        None => match redis::cmd("ACL").arg("WHOAMI").query_async(conn).await {
            Ok(user) => user,
            Err(e) => {
                return Finding::new(
                    "acl",
                    Verdict::Skip,
                    format!(
                        "ACL WHOAMI refused ({}): run doctor as an admin with --acl-user USER",
                        crate::cli::common::one_line(&anyhow::Error::new(e))
                    ),
                );
            }
        },
    };
    let schema = match tranche_codec::KeySchema::new(&g.namespace, 1) {
        Ok(schema) => schema,
        Err(e) => return Finding::new("acl", Verdict::Skip, format!("namespace: {e}")),
    };
    // A key under the namespace's own tag and one under a shard's: acl.conf grants
    // the two patterns separately.
    let keys = [schema.meta(), schema.pending(0)];
    let mut denied = Vec::new();
    for command in COMMANDS {
        for key in &keys {
            let mut cmd = redis::cmd("ACL");
            cmd.arg("DRYRUN").arg(&user);
            for part in *command {
                cmd.arg(if *part == "K" { key.as_str() } else { part });
            }
            match cmd.query_async::<redis::Value>(conn).await {
                Ok(redis::Value::Okay) => {}
                Ok(redis::Value::SimpleString(s)) if s == "OK" => {}
                Ok(_) => {
                    denied.push(
                        command
                            .iter()
                            .take(2)
                            .copied()
                            .collect::<Vec<_>>()
                            .join(" "),
                    );
                    break;
                }
                Err(e) if e.to_string().contains("unknown subcommand") => {
                    return Finding::new(
                        "acl",
                        Verdict::Skip,
                        "this Redis has no ACL DRYRUN (it came with 7.0): not checked",
                    );
                }
                Err(e) if e.to_string().contains("NOPERM") => {
                    return Finding::new(
                        "acl",
                        Verdict::Skip,
                        "ACL DRYRUN refused to this user: run doctor as an admin with --acl-user USER",
                    );
                }
                Err(e) => {
                    return Finding::new("acl", Verdict::Fail, format!("ACL DRYRUN {user}: {e}"));
                }
            }
        }
    }
    let denied: Vec<String> = denied
        .into_iter()
        .map(|c| c.split(' ').next().unwrap_or_default().to_owned())
        .collect();
    if denied.is_empty() {
        Finding::new(
            "acl",
            Verdict::Ok,
            format!(
                "user `{user}` may send every command tranche sends on `{}` keys",
                g.namespace
            ),
        )
    } else {
        Finding::new(
            "acl",
            Verdict::Fail,
            format!(
                "user `{user}` may not send {} on `{}` keys (deploy/redis/acl.conf grants what tranche needs)",
                denied.join(", "),
                g.namespace
            ),
        )
    }
}

pub(super) async fn latency(conn: &mut MultiplexedConnection) -> Result<Finding> {
    let mut times = Vec::with_capacity(PINGS);
    for _ in 0..PINGS {
        let start = Instant::now();
        let _: String = redis::cmd("PING").query_async(conn).await?;
        times.push(start.elapsed());
    }
    times.sort();
    let median = times[PINGS / 2];
    let text = format!(
        "round trip {:.2} ms (median of {PINGS})",
        median.as_secs_f64() * 1e3
    );
    Ok(if median > SLOW_ROUND_TRIP {
        Finding::new(
            "latency",
            Verdict::Warn,
            format!("{text}: every chunk pays a few; run workers near the Redis"),
        )
    } else {
        Finding::new("latency", Verdict::Ok, text)
    })
}
