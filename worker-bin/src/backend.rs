//! Opens a namespace on Redis or embedded, and hands the rest of the binary the three
//! layers as trait objects plus a router over them. This is the only module that
//! names a concrete store.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, anyhow, bail};
use redis::AsyncCommands;
use tranche_active_store::{
    ActiveStore, Config as ActiveConfig, KeysMeta, RedisActiveStore, RedisConnection, TlsOptions,
};
use tranche_archive_store::{Config as ArchiveConfig, RedisArchive};
use tranche_codec::KeySchema;
use tranche_router::Router;
use tranche_stats::{RedisStats, StatsStore};

use crate::embedded::EmbeddedBackend;
use crate::error::Error;
pub(crate) use crate::layers::{
    ArchiveStore, DEFAULT_SHARDS, Location, Open, Tuning, archive_config,
};
use crate::layers::{redact, scrub};

/// How long a writer waits for another process's hold on an embedded state file to
/// end before it gives up: a reader holds it for as long as one command takes.
pub(crate) const LOCK_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// An open namespace.
pub(crate) struct Backend {
    pub(crate) active: Arc<dyn ActiveStore>,
    pub(crate) archive: Arc<dyn ArchiveStore>,
    pub(crate) stats: Arc<dyn StatsStore>,
    pub(crate) router: Router,
    pub(crate) namespace: String,
    pub(crate) shards: u32,
    pub(crate) archive_config: ArchiveConfig,
    place: Place,
}

enum Place {
    Redis {
        conn: RedisConnection,
        /// The active store again, typed: for what only Redis has (`recount`).
        active: Arc<RedisActiveStore<RedisConnection>>,
        /// The archive again, typed: for its format version (`archive-format`).
        archive: Arc<RedisArchive<RedisConnection>>,
        schema: KeySchema,
        /// The shard count and key layout the namespace was opened with.
        keys: KeysMeta,
        shown: String,
    },
    Embedded(EmbeddedBackend),
}

/// Redis connections by URL (and TLS files), opened once and shared by every namespace
/// opened through it: a long-lived process opening namespace after namespace (`serve`'s
/// overview) opens no new connection per namespace and request. Each entry reconnects
/// by itself (`RedisConnection`), so one that broke is never stale for long. Clones
/// share the entries.
#[derive(Clone, Default)]
pub(crate) struct Connections(Arc<Mutex<HashMap<String, RedisConnection>>>);

impl Connections {
    /// The connection to `url`, opened now if none is kept yet.
    async fn get(&self, global: &Location, url: &str) -> Result<(RedisConnection, String)> {
        let key = format!(
            "{url}\n{:?}\n{:?}\n{:?}",
            global.tls_ca, global.tls_cert, global.tls_key
        );
        let kept = self.0.lock().expect("not poisoned").get(&key).cloned();
        if let Some(conn) = kept {
            return Ok((conn, redact(url)));
        }
        let (conn, shown) = connect(global, url).await?;
        self.0
            .lock()
            .expect("not poisoned")
            .insert(key, conn.clone());
        Ok((conn, shown))
    }
}

impl Backend {
    /// Opens the namespace `global` names, on Redis when `--redis` is given.
    pub(crate) async fn open(global: &Location, open: Open, tuning: Tuning) -> Result<Self> {
        Self::open_with(global, open, tuning, &Connections::default()).await
    }

    /// Opens the namespace, with typed errors for what a caller may want to tell
    /// apart: a namespace not planned, a store out of reach, bad settings.
    pub(crate) async fn open_checked(
        location: &Location,
        open: Open,
        tuning: Tuning,
    ) -> Result<Self, Error> {
        let ns = &location.namespace;
        if ns.is_empty()
            || !ns
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(Error::Config(format!(
                "namespace `{ns}`: use letters, digits, '-', '_' or '.'"
            )));
        }
        if let Some(shards) = location.shards
            && !(1..=1024).contains(&shards)
        {
            return Err(Error::Config(format!(
                "shards must be between 1 and 1024, not {shards}"
            )));
        }
        match (&location.redis, &location.state) {
            (Some(url), _) => {
                // Connected once here to tell "unreachable" and "not planned" from
                // the rest; the backend then opens its own connection.
                let shown = redact(url);
                let conn = tranche_active_store::RedisConnection::connect(url)
                    .await
                    .map_err(|e| Error::StoreUnreachable {
                        location: shown.clone(),
                        source: e.into(),
                    })?;
                if open == Open::Existing
                    && tranche_active_store::KeysMeta::read(&conn, ns)
                        .await?
                        .is_none()
                {
                    return Err(Error::NotPlanned {
                        namespace: ns.clone(),
                        location: shown,
                    });
                }
            }
            (None, Some(path)) if open == Open::Existing && !path.exists() => {
                return Err(Error::NotPlanned {
                    namespace: ns.clone(),
                    location: path.display().to_string(),
                });
            }
            _ => {}
        }
        Ok(Self::open(location, open, tuning).await?)
    }

    /// [`Backend::open`], on Redis through a connection of `connections`.
    pub(crate) async fn open_with(
        global: &Location,
        open: Open,
        tuning: Tuning,
        connections: &Connections,
    ) -> Result<Self> {
        // The key schema's rules, the one statement of them; embedded, the namespace
        // names a file too.
        let ns = &global.namespace;
        let shards = global.shards.unwrap_or(DEFAULT_SHARDS);
        match KeySchema::new(ns, shards) {
            Err(tranche_codec::Error::InvalidNamespace(_)) => {
                bail!("invalid namespace `{ns}`: use 1 to 64 letters, digits, '-', '_' or '.'")
            }
            Err(tranche_codec::Error::InvalidShardCount(_)) => bail!(
                "--shards must be between 1 and {}, not {shards}",
                tranche_codec::MAX_SHARDS
            ),
            Err(err) => return Err(err.into()),
            Ok(_) => {}
        }
        match redis_url(global)? {
            Some(url) => Self::open_redis(global, &url, open, tuning, connections).await,
            None if global.tls_ca.is_some() || global.tls_cert.is_some() => {
                bail!("--tls-ca, --tls-cert and --tls-key need --redis with a rediss:// URL")
            }
            None if ns.bytes().all(|b| b == b'.') => bail!(
                "invalid namespace `{ns}`: embedded, a namespace names a file, and `{ns}` is a directory's name"
            ),
            None => Self::open_embedded(global, open, tuning).await,
        }
    }

    async fn open_redis(
        global: &Location,
        url: &str,
        open: Open,
        tuning: Tuning,
        connections: &Connections,
    ) -> Result<Self> {
        let (conn, shown) = connections.get(global, url).await?;
        let ns = &global.namespace;
        // The shard count and key layout are part of the namespace: every key's name
        // depends on them. A new namespace gets the current layout; one planned before
        // layouts were recorded keeps the plain tags (`KeysMeta::read`).
        let recorded = KeysMeta::read(&conn, ns).await.map_err(|e| {
            let e = scrub(&e.to_string(), url);
            anyhow!("cannot read namespace `{ns}` on {shown}: {e}")
        })?;
        let keys = match (recorded, global.shards, open) {
            (Some(r), Some(asked), _) if r.shards != asked => {
                bail!(
                    "namespace `{ns}` on {shown} has {} shards, not {asked}",
                    r.shards
                )
            }
            (Some(r), _, _) => r,
            (None, _, Open::Existing) => {
                bail!("namespace `{ns}` is unknown on {shown} (run `tranche plan` first)")
            }
            (None, asked, Open::Create) => KeysMeta::new_namespace(asked.unwrap_or(DEFAULT_SHARDS)),
        };
        let shards = keys.shards;
        let schema = KeySchema::new(ns, shards)?.with_layout(keys.layout);
        let active_config = ActiveConfig {
            namespace: ns.clone(),
            num_shards: shards,
            layout: keys.layout,
            ..tuning.active.clone()
        };
        let active = Arc::new(RedisActiveStore::new(conn.clone(), active_config)?);
        let first_pid = first_pid(active.as_ref()).await?;
        let archive_config = ArchiveConfig {
            layout: keys.layout,
            ..archive_config(ns, shards, first_pid, &tuning)
        };
        let archive = Arc::new(RedisArchive::new(conn.clone(), archive_config.clone())?);
        let stats = Arc::new(RedisStats::new(conn.clone(), schema.clone()));
        Ok(Self::assemble(
            active.clone(),
            archive.clone(),
            stats,
            ns,
            shards,
            archive_config,
            Place::Redis {
                conn,
                active,
                archive,
                schema,
                keys,
                shown,
            },
        ))
    }

    async fn open_embedded(global: &Location, open: Open, tuning: Tuning) -> Result<Self> {
        let ns = &global.namespace;
        let path = state_path(global);
        let embedded = EmbeddedBackend::open(&path, ns, global.shards, open, &tuning).await?;
        let shards = embedded.shards();
        let archive_config = embedded.archive_config().clone();
        let (active, archive, stats) = embedded.layers();
        Ok(Self::assemble(
            active,
            archive,
            stats,
            ns,
            shards,
            archive_config,
            Place::Embedded(embedded),
        ))
    }

    fn assemble(
        active: Arc<dyn ActiveStore>,
        archive: Arc<dyn ArchiveStore>,
        stats: Arc<dyn StatsStore>,
        namespace: &str,
        shards: u32,
        archive_config: ArchiveConfig,
        place: Place,
    ) -> Self {
        let router = Router::new(active.clone(), archive.clone(), stats.clone());
        Self {
            active,
            archive,
            stats,
            router,
            namespace: namespace.to_owned(),
            shards,
            archive_config,
            place,
        }
    }

    /// The namespace's Redis connection and key schema (`None` embedded), for the
    /// control record and the rate limiter (`crate::control`).
    pub(crate) fn redis_parts(&self) -> Option<(RedisConnection, KeySchema)> {
        match &self.place {
            Place::Redis { conn, schema, .. } => Some((conn.clone(), schema.clone())),
            Place::Embedded(_) => None,
        }
    }

    /// Where the namespace lives, for messages: the redacted URL or the state file.
    pub(crate) fn location(&self) -> String {
        match &self.place {
            Place::Redis { shown, .. } => shown.clone(),
            Place::Embedded(e) => e.path().display().to_string(),
        }
    }

    /// Deletes the whole namespace: every key with its hash tags (`{ns}` and
    /// `{ns:<shard>}`) on Redis, the state file embedded. Returns what was deleted (keys,
    /// or 1 for the file). A cluster is refused: SCAN reaches one node only.
    pub(crate) async fn drop_all(&self) -> Result<u64> {
        match &self.place {
            Place::Embedded(e) => {
                e.delete()?;
                Ok(1)
            }
            Place::Redis { conn, .. } if conn.is_cluster() => bail!(
                "drop is not supported on Redis Cluster yet: delete the keys tagged {{{ns}}} and {{{ns}:<shard>}} on every master",
                ns = self.namespace
            ),
            Place::Redis { conn, .. } => {
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
        }
    }

    /// `discard --force`: replaces `pid`'s active record, whatever it holds, with a
    /// discarded one (Redis; an embedded record always decodes, so `discard` suffices).
    pub(crate) async fn force_discard(&self, pid: u64) -> Result<()> {
        match &self.place {
            Place::Redis { active, .. } => Ok(active.force_discard(pid).await?),
            Place::Embedded(_) => bail!(
                "--force is for a Redis record that cannot be read; an embedded one always can: use discard"
            ),
        }
    }

    /// Every (field, value) of the hash `key` on this namespace's Redis, read by HSCAN
    /// a thousand at a time (`tranche import --from-hash`). Redis only.
    pub(crate) async fn hash_entries(&self, key: &str) -> Result<Vec<(String, String)>> {
        let Place::Redis { conn, .. } = &self.place else {
            bail!("reading a hash needs --redis");
        };
        let mut found = Vec::new();
        let mut cursor = 0u64;
        loop {
            let mut c = conn.clone();
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

    /// `HSET key field value` for every pair, a thousand per command (`tranche export
    /// --to-hash`). Redis only.
    pub(crate) async fn write_hash(&self, key: &str, pairs: &[(String, String)]) -> Result<()> {
        let Place::Redis { conn, .. } = &self.place else {
            bail!("writing a hash needs --redis");
        };
        for chunk in pairs.chunks(1000) {
            let mut c = conn.clone();
            let () = c.hset_multiple(key, chunk).await?;
        }
        Ok(())
    }

    /// Gives adopted partitions the attempts and failed status they had before
    /// (`RedisActiveStore::carry`). Redis only: the hashes adopted live there.
    pub(crate) async fn carry(&self, partitions: &[tranche_active_store::Carried]) -> Result<u64> {
        match &self.place {
            Place::Redis { active, .. } => Ok(active.carry(partitions).await?),
            Place::Embedded(_) => bail!("adopting hashes needs --redis"),
        }
    }

    /// Whether this is the embedded backend.
    pub(crate) fn is_embedded(&self) -> bool {
        matches!(self.place, Place::Embedded(_))
    }

    /// The Redis archive, typed (`None` embedded): its format version is Redis's alone.
    pub(crate) fn redis_archive(&self) -> Option<&RedisArchive<RedisConnection>> {
        match &self.place {
            Place::Redis { archive, .. } => Some(archive),
            Place::Embedded(_) => None,
        }
    }

    /// Records a new namespace's shard count and key layout (Redis), so later commands
    /// agree on them; fails if the namespace is recorded with others.
    pub(crate) async fn register_namespace(&self) -> Result<()> {
        if let Place::Redis { conn, keys, .. } = &self.place {
            keys.register(conn, &self.namespace).await?;
        }
        Ok(())
    }

    /// The key schema of the namespace as opened: on Redis with its recorded layout.
    pub(crate) fn schema(&self) -> Result<KeySchema> {
        match &self.place {
            Place::Redis { schema, .. } => Ok(schema.clone()),
            Place::Embedded(_) => Ok(KeySchema::new(&self.namespace, self.shards)?),
        }
    }

    /// Derives the active layer's status counters from its records again (Redis keeps
    /// them in the scripts; the memory store counts its records directly, so there is
    /// nothing to do embedded).
    pub(crate) async fn recount_active(&self) -> Result<()> {
        if let Place::Redis { active, .. } = &self.place {
            active.recount().await?;
        }
        Ok(())
    }

    /// Entries waiting in the archive inboxes, across shards.
    pub(crate) async fn inbox_len(&self) -> Result<u64> {
        match &self.place {
            Place::Redis { conn, schema, .. } => {
                // One command per shard, all in flight at once: the shards' inboxes
                // live in different slots, which a cluster pipeline refuses.
                let lens = schema.shards().map(|shard| {
                    let (mut c, key) = (conn.clone(), schema.inbox(shard));
                    async move { c.xlen::<_, u64>(key).await }
                });
                let lens = futures_util::future::try_join_all(lens).await?;
                Ok(lens.iter().sum())
            }
            Place::Embedded(e) => Ok(e.inbox_len()),
        }
    }

    /// When the oldest completion still waiting in an archive inbox was written, ms
    /// since the epoch (a stream entry's id starts with it): one `XRANGE - + COUNT 1`
    /// per shard. `None` when the inboxes are empty, and embedded (its inbox is drained
    /// in the process that completes).
    pub(crate) async fn inbox_oldest_ms(&self) -> Result<Option<u64>> {
        let Place::Redis { conn, schema, .. } = &self.place else {
            return Ok(None);
        };
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

    /// Redis's `used_memory`, for the run summary; `None` when embedded. On a cluster,
    /// the sum over the masters (the client sends INFO to each and answers with a map
    /// of node to reply).
    pub(crate) async fn used_memory(&self) -> Option<u64> {
        let Place::Redis { conn, .. } = &self.place else {
            return None;
        };
        let mut c = conn.clone();
        let info: redis::Value = redis::cmd("INFO")
            .arg("memory")
            .query_async(&mut c)
            .await
            .ok()?;
        used_memory_of(&info)
    }

    /// [`Backend::open`] for a process that will write (`run`, `archive`): embedded,
    /// another process holding the state file's lock for a moment (a `status` or
    /// `health` that happened to start first) is waited out for up to
    /// [`LOCK_GRACE`], reopening the file each time, so the state is read under this
    /// process's own lock. A lock still held after that is a live writer: the error
    /// [`Backend::ensure_writable`] gives.
    pub(crate) async fn open_writable(
        global: &Location,
        open: Open,
        tuning: Tuning,
    ) -> Result<Self> {
        let start = std::time::Instant::now();
        loop {
            let backend = Self::open(global, open, tuning.clone()).await?;
            if backend.ensure_writable().is_ok() || start.elapsed() >= LOCK_GRACE {
                return backend.ensure_writable().map(|()| backend);
            }
            drop(backend);
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// Fails when another live process holds the embedded state file (always fine on
    /// Redis, where every process coordinates through the server).
    pub(crate) fn ensure_writable(&self) -> Result<()> {
        match &self.place {
            Place::Redis { .. } => Ok(()),
            Place::Embedded(e) => e.ensure_writable(),
        }
    }

    /// Saves the embedded state (no-op on Redis). Safe to call at any time: the
    /// embedded backend orders its snapshot so no completed partition is lost.
    pub(crate) async fn save(&self) -> Result<()> {
        match &self.place {
            Place::Redis { .. } => Ok(()),
            Place::Embedded(e) => e.save().await,
        }
    }

    /// Whether the namespace is empty: no plan, nothing archived (for `import`).
    pub(crate) async fn is_empty(&self) -> Result<bool> {
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

/// The lowest pid any plan issues (1 when there is no plan yet).
async fn first_pid(active: &dyn ActiveStore) -> Result<u64> {
    let plans = active.plans().await.context("reading the plans")?;
    Ok(plans.iter().map(|p| p.plan.first_pid()).min().unwrap_or(1))
}

/// The embedded state file: `--state`, or `.tranche/<namespace>.state` here.
pub(crate) fn state_path(global: &Location) -> PathBuf {
    global
        .state
        .clone()
        .unwrap_or_else(|| PathBuf::from(".tranche").join(format!("{}.state", global.namespace)))
}

/// The Redis URL: `--redis`, or the first line of `--redis-file`; `None` embedded.
pub(crate) fn redis_url(global: &Location) -> Result<Option<String>> {
    match (&global.redis, &global.redis_file) {
        (Some(url), _) => Ok(Some(url.clone())),
        (None, Some(path)) => read_url(path).map(Some),
        (None, None) => Ok(None),
    }
}

/// Connects to `url` with the TLS options of `global`; returns the connection and the
/// URL with its password masked.
async fn connect(global: &Location, url: &str) -> Result<(RedisConnection, String)> {
    let shown = redact(url);
    if !["redis://", "rediss://", "redis+unix://", "unix://"]
        .iter()
        .any(|s| url.starts_with(s))
    {
        bail!("invalid --redis URL `{shown}`: expected redis://, rediss:// or unix://");
    }
    let tls = TlsOptions::from_files(
        global.tls_ca.as_deref(),
        global.tls_cert.as_deref(),
        global.tls_key.as_deref(),
    )?;
    if !tls.is_empty() && !url.starts_with("rediss://") {
        bail!("--tls-ca, --tls-cert and --tls-key need a rediss:// URL, not `{shown}`");
    }
    let conn = RedisConnection::connect_with(url, &tls)
        .await
        .map_err(|e| {
            if e.kind() == redis::ErrorKind::Parse {
                // Its reply, quoted by the parser, would run over several lines.
                return anyhow!(
                    "cannot connect to Redis at {shown}: the server did not answer as Redis (is that the port of a Redis server?)"
                );
            }
            let hint = if url.starts_with("rediss://") && e.is_timeout() {
                " (a rediss:// URL needs a server speaking TLS on that port)"
            } else {
                ""
            };
            anyhow!(
                "cannot connect to Redis at {shown}: {}{hint}",
                scrub(&e.to_string(), url)
            )
        })?;
    Ok((conn, shown))
}

/// The namespaces on the Redis of `global` (their `{ns}:meta` keys), or the state files
/// beside the embedded state path, sorted. A cluster is refused: SCAN reaches one node.
pub(crate) async fn namespace_names(
    global: &Location,
    connections: &Connections,
) -> Result<Vec<String>> {
    let mut names = Vec::new();
    match redis_url(global)? {
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
            let path = state_path(global);
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

/// The Redis URL in `path`: its first line, trimmed. One line of error, never the URL.
fn read_url(path: &std::path::Path) -> Result<String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow!("cannot read --redis-file {}: {e}", path.display()))?;
    match text.lines().next().map(str::trim) {
        Some(url) if !url.is_empty() => Ok(url.to_owned()),
        _ => bail!(
            "--redis-file {} holds no URL on its first line",
            path.display()
        ),
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
