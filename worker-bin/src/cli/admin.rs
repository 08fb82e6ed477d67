//! What only the command line does with an open store: drop a namespace, adopt and
//! write Redis hashes, force a discard, recount, read the inboxes' age and Redis's
//! memory, list the namespaces. The library never does these, so they live here, on
//! top of [`Backend`]'s two views of its store ([`Backend::redis`],
//! [`Backend::embedded`]), as the trait [`Admin`].

use std::path::PathBuf;

use anyhow::{Result, bail};
use redis::AsyncCommands;
use tranche_active_store::RedisConnection;
use tranche_archive_store::RedisArchive;
use tranche_codec::KeySchema;

use crate::backend::{self, Backend, Connections, LOCK_GRACE, Location, Open, Tuning};

/// The command line's operations on an open namespace.
pub(crate) trait Admin: Sized {
    /// [`Backend::open`] for a process that will write (`run`, `archive`): embedded,
    /// another process holding the state file's lock for a moment (a `status` or
    /// `health` that happened to start first) is waited out for up to [`LOCK_GRACE`],
    /// reopening the file each time, so the state is read under this process's own
    /// lock. A lock still held after that is a live writer: the error
    /// [`Backend::ensure_writable`] gives.
    async fn open_writable(global: &Location, open: Open, tuning: Tuning) -> Result<Self>;

    /// Deletes the whole namespace: every key with its hash tags (`{ns}` and
    /// `{ns:<shard>}`) on Redis, the state file embedded. Returns what was deleted (keys,
    /// or 1 for the file). A cluster is refused: SCAN reaches one node only.
    async fn drop_all(&self) -> Result<u64>;

    /// `discard --force`: replaces `pid`'s active record, whatever it holds, with a
    /// discarded one (Redis; an embedded record always decodes, so `discard` suffices).
    async fn force_discard(&self, pid: u64) -> Result<()>;

    /// Every (field, value) of the hash `key` on this namespace's Redis, read by HSCAN
    /// a thousand at a time (`tranche import --from-hash`). Redis only.
    async fn hash_entries(&self, key: &str) -> Result<Vec<(String, String)>>;

    /// `HSET key field value` for every pair, a thousand per command (`tranche export
    /// --to-hash`). Redis only.
    async fn write_hash(&self, key: &str, pairs: &[(String, String)]) -> Result<()>;

    /// Gives adopted partitions the attempts and failed status they had before
    /// (`RedisActiveStore::carry`). Redis only: the hashes adopted live there.
    async fn carry(&self, partitions: &[tranche_active_store::Carried]) -> Result<u64>;

    /// The Redis archive, typed (`None` embedded): its format version is Redis's alone.
    fn redis_archive(&self) -> Option<&RedisArchive<RedisConnection>>;

    /// The key schema of the namespace as opened: on Redis with its recorded layout.
    fn schema(&self) -> Result<KeySchema>;

    /// When the oldest completion still waiting in an archive inbox was written, ms
    /// since the epoch (a stream entry's id starts with it): one `XRANGE - + COUNT 1`
    /// per shard. `None` when the inboxes are empty, and embedded (its inbox is drained
    /// in the process that completes).
    async fn inbox_oldest_ms(&self) -> Result<Option<u64>>;

    /// Redis's `used_memory`, for the run summary; `None` when embedded. On a cluster,
    /// the sum over the masters (the client sends INFO to each and answers with a map
    /// of node to reply).
    async fn used_memory(&self) -> Option<u64>;

    /// Whether the namespace is empty: no plan, nothing archived (for `import`).
    async fn is_empty(&self) -> Result<bool>;
}

impl Admin for Backend {
    async fn open_writable(global: &Location, open: Open, tuning: Tuning) -> Result<Self> {
        let start = std::time::Instant::now();
        loop {
            let backend = Self::open(global, open, tuning.clone()).await?;
            if backend.ensure_writable().is_ok() || start.elapsed() >= LOCK_GRACE {
                backend.ensure_writable()?;
                return Ok(backend);
            }
            drop(backend);
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    async fn drop_all(&self) -> Result<u64> {
        if let Some(embedded) = self.embedded() {
            embedded.delete()?;
            return Ok(1);
        }
        let Some(redis) = self.redis() else {
            unreachable!("a backend is on Redis or embedded");
        };
        let conn = redis.conn;
        if conn.is_cluster() {
            bail!(
                "drop is not supported on Redis Cluster yet: delete the keys tagged {{{ns}}} and {{{ns}:<shard>}} on every master",
                ns = self.namespace
            );
        }
        let mut deleted = 0;
        // `{` is not special in a SCAN pattern, and a namespace has no ':'.
        for pattern in [
            format!("{{{}}}:*", self.namespace),
            format!("{{{}:*", self.namespace),
        ] {
            for keys in scan(conn, &pattern).await?.chunks(1000) {
                let mut c = conn.clone();
                let n: u64 = redis::cmd("UNLINK").arg(keys).query_async(&mut c).await?;
                deleted += n;
            }
        }
        Ok(deleted)
    }

    async fn force_discard(&self, pid: u64) -> Result<()> {
        match self.redis() {
            Some(redis) => Ok(redis.active.force_discard(pid).await?),
            None => bail!(
                "--force is for a Redis record that cannot be read; an embedded one always can: use discard"
            ),
        }
    }

    async fn hash_entries(&self, key: &str) -> Result<Vec<(String, String)>> {
        let Some(redis) = self.redis() else {
            bail!("reading a hash needs --redis");
        };
        let mut found = Vec::new();
        let mut cursor = 0u64;
        loop {
            let mut c = redis.conn.clone();
            let (next, pairs): (u64, Vec<(String, String)>) = redis::cmd("HSCAN")
                .arg(key)
                .arg(cursor)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut c)
                .await?;
            found.extend(pairs);
            if next == 0 {
                // HSCAN may return a field twice while the hash is rehashed.
                found.sort_unstable();
                found.dedup();
                return Ok(found);
            }
            cursor = next;
        }
    }

    async fn write_hash(&self, key: &str, pairs: &[(String, String)]) -> Result<()> {
        let Some(redis) = self.redis() else {
            bail!("writing a hash needs --redis");
        };
        for chunk in pairs.chunks(1000) {
            let mut c = redis.conn.clone();
            let () = c.hset_multiple(key, chunk).await?;
        }
        Ok(())
    }

    async fn carry(&self, partitions: &[tranche_active_store::Carried]) -> Result<u64> {
        match self.redis() {
            Some(redis) => Ok(redis.active.carry(partitions).await?),
            None => bail!("adopting hashes needs --redis"),
        }
    }

    fn redis_archive(&self) -> Option<&RedisArchive<RedisConnection>> {
        self.redis().map(|redis| redis.archive)
    }

    fn schema(&self) -> Result<KeySchema> {
        match self.redis() {
            Some(redis) => Ok(redis.schema.clone()),
            None => Ok(KeySchema::new(&self.namespace, self.shards)?),
        }
    }

    async fn inbox_oldest_ms(&self) -> Result<Option<u64>> {
        let Some(redis) = self.redis() else {
            return Ok(None);
        };
        let (conn, schema) = (redis.conn, redis.schema);
        let firsts = schema.shards().map(|shard| {
            let (mut c, key) = (conn.clone(), schema.inbox(shard));
            async move {
                let reply: redis::streams::StreamRangeReply =
                    c.xrange_count(key, "-", "+", 1).await?;
                Ok::<_, redis::RedisError>(reply.ids.first().and_then(|e| {
                    e.id.split_once('-')
                        .and_then(|(ms, _)| ms.parse::<u64>().ok())
                }))
            }
        });
        let firsts = futures_util::future::try_join_all(firsts).await?;
        Ok(firsts.into_iter().flatten().min())
    }

    async fn used_memory(&self) -> Option<u64> {
        let mut c = self.redis()?.conn.clone();
        let info: redis::Value = redis::cmd("INFO")
            .arg("memory")
            .query_async(&mut c)
            .await
            .ok()?;
        used_memory_of(&info)
    }

    async fn is_empty(&self) -> Result<bool> {
        let plans = self.active.plans().await?;
        let stats = self.stats.summary().await?;
        Ok(plans.is_empty() && stats.global_stats.total_completed == 0)
    }
}

/// `used_memory` out of an INFO reply: one node's text, or a map of node to text (a
/// cluster), summed. `None` if any node's figure is missing.
fn used_memory_of(info: &redis::Value) -> Option<u64> {
    use redis::Value;
    match info {
        Value::Map(nodes) => nodes.iter().map(|(_, v)| used_memory_of(v)).sum(),
        Value::BulkString(_) | Value::VerbatimString { .. } | Value::SimpleString(_) => {
            let text: String = redis::from_redis_value_ref(info).ok()?;
            text.lines()
                .find_map(|l| l.strip_prefix("used_memory:")?.trim().parse().ok())
        }
        _ => None,
    }
}

/// The namespaces on the Redis of `global` (their `{ns}:meta` keys), or the state files
/// beside the embedded state path, sorted. A cluster is refused: SCAN reaches one node.
pub(crate) async fn namespace_names(
    global: &Location,
    connections: &Connections,
) -> Result<Vec<String>> {
    let mut names = Vec::new();
    match backend::redis_url(global)? {
        Some(url) => {
            let (conn, _) = connections.get(global, &url).await?;
            if conn.is_cluster() {
                bail!(
                    "listing namespaces is not supported on Redis Cluster yet (SCAN reaches one node)"
                );
            }
            let keys = scan(&conn, "{*}:meta").await?;
            names.extend(keys.iter().filter_map(|k| {
                k.strip_prefix('{')?
                    .strip_suffix("}:meta")
                    .map(str::to_owned)
            }));
        }
        None => {
            let path = backend::state_path(global);
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
                _ => PathBuf::from("."),
            };
            if let Ok(entries) = std::fs::read_dir(&dir) {
                for entry in entries.flatten() {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    if let Some(ns) = name.strip_suffix(".state") {
                        names.push(ns.to_owned());
                    }
                }
            }
        }
    }
    names.sort();
    names.dedup();
    Ok(names)
}

/// Every key matching `pattern` on a standalone server, by SCAN.
async fn scan(conn: &RedisConnection, pattern: &str) -> Result<Vec<String>> {
    let mut found = Vec::new();
    let mut cursor = 0u64;
    loop {
        let mut c = conn.clone();
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut c)
            .await?;
        found.extend(keys);
        if next == 0 {
            return Ok(found);
        }
        cursor = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn used_memory_is_read_from_one_node_or_summed_over_a_cluster() {
        use redis::Value;
        let node = |n: u64| Value::VerbatimString {
            format: redis::VerbatimFormat::Text,
            text: format!("# Memory\r\nused_memory:{n}\r\nused_memory_human:1M\r\n"),
        };
        let text = Value::BulkString(b"# Memory\r\nused_memory:1000\r\n".to_vec());
        assert_eq!(used_memory_of(&text), Some(1000));
        assert_eq!(used_memory_of(&node(7)), Some(7));
        let cluster = Value::Map(vec![
            (Value::SimpleString("127.0.0.1:7000".into()), node(1000)),
            (Value::SimpleString("127.0.0.1:7001".into()), node(234)),
        ]);
        assert_eq!(used_memory_of(&cluster), Some(1234));
        let partial = Value::Map(vec![
            (Value::SimpleString("a".into()), node(1)),
            (Value::SimpleString("b".into()), Value::Nil),
        ]);
        assert_eq!(used_memory_of(&partial), None, "a node without a figure");
    }
}
