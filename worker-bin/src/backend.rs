//! Opens a namespace on Redis or embedded, and hands the rest of the binary the three
//! layers as trait objects plus a router over them. This is the only module that
//! names a concrete store.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use redis::AsyncCommands;
use tranche_active_store::{
    ActiveStore, Config as ActiveConfig, RedisActiveStore, RedisConnection,
};
use tranche_archive_store::{
    ArchiveQuery, Archiver, Compaction, Config as ArchiveConfig, Export, Import, RedisArchive,
};
use tranche_codec::KeySchema;
use tranche_router::Router;
use tranche_stats::{RedisStats, StatsStore};

use crate::cli::{Global, TierArgs};
use crate::embedded::EmbeddedBackend;

/// Shards of a namespace created without `--shards`.
pub(crate) const DEFAULT_SHARDS: u32 = 4;

/// Everything the archive layer offers, as one object.
pub(crate) trait ArchiveStore:
    Archiver + ArchiveQuery + Compaction + Export + Import
{
}
impl<T: Archiver + ArchiveQuery + Compaction + Export + Import + ?Sized> ArchiveStore for T {}

/// How a command wants the namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Open {
    /// It must exist (it has a plan).
    Existing,
    /// It may be new (`plan`, `import`).
    Create,
}

/// Settings of the layers that only `run` and `archive` change.
#[derive(Debug, Clone)]
pub(crate) struct Tuning {
    pub(crate) active: ActiveConfig,
    pub(crate) tiers: Option<TierArgs>,
    pub(crate) consumer: String,
    pub(crate) claim_idle: Duration,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            active: ActiveConfig::default(),
            tiers: None,
            consumer: format!("tranche-{}", std::process::id()),
            claim_idle: Duration::from_secs(60),
        }
    }
}

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
        schema: KeySchema,
        shown: String,
    },
    Embedded(EmbeddedBackend),
}

impl Backend {
    /// Opens the namespace `global` names, on Redis when `--redis` is given.
    pub(crate) async fn open(global: &Global, open: Open, tuning: Tuning) -> Result<Self> {
        if global.namespace.is_empty()
            || !global
                .namespace
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            bail!(
                "invalid namespace `{}`: use letters, digits, '-', '_' or '.'",
                global.namespace
            );
        }
        if let Some(shards) = global.shards
            && !(1..=1024).contains(&shards)
        {
            bail!("--shards must be between 1 and 1024, not {shards}");
        }
        match &global.redis {
            Some(url) => Self::open_redis(global, url, open, tuning).await,
            None => Self::open_embedded(global, open, tuning).await,
        }
    }

    async fn open_redis(global: &Global, url: &str, open: Open, tuning: Tuning) -> Result<Self> {
        let shown = redact(url);
        if !["redis://", "rediss://", "redis+unix://", "unix://"]
            .iter()
            .any(|s| url.starts_with(s))
        {
            bail!("invalid --redis URL `{shown}`: expected redis://, rediss:// or unix://");
        }
        let conn = RedisConnection::connect(url)
            .await
            .map_err(|e| anyhow!("cannot connect to Redis at {shown}: {e}"))?;
        let ns = &global.namespace;
        // The shard count is part of the namespace: every key's name depends on it.
        let meta = KeySchema::new(ns, 1)?.meta();
        let mut c = conn.clone();
        let stored: Option<u32> = c
            .hget(&meta, "shards")
            .await
            .map_err(|e| anyhow!("cannot read namespace `{ns}` on {shown}: {e}"))?;
        let shards = match (stored, global.shards, open) {
            (Some(s), Some(asked), _) if s != asked => {
                bail!("namespace `{ns}` on {shown} has {s} shards, not {asked}")
            }
            (Some(s), _, _) => s,
            (None, _, Open::Existing) => {
                bail!("namespace `{ns}` is unknown on {shown} (run `tranche plan` first)")
            }
            (None, asked, Open::Create) => asked.unwrap_or(DEFAULT_SHARDS),
        };
        let schema = KeySchema::new(ns, shards)?;
        let active_config = ActiveConfig {
            namespace: ns.clone(),
            num_shards: shards,
            ..tuning.active.clone()
        };
        let active = Arc::new(RedisActiveStore::new(conn.clone(), active_config)?);
        let first_pid = first_pid(active.as_ref()).await?;
        let archive_config = archive_config(ns, shards, first_pid, &tuning);
        let archive = Arc::new(RedisArchive::new(conn.clone(), archive_config.clone())?);
        let stats = Arc::new(RedisStats::new(conn.clone(), schema.clone()));
        Ok(Self::assemble(
            active.clone(),
            archive,
            stats,
            ns,
            shards,
            archive_config,
            Place::Redis {
                conn,
                active,
                schema,
                shown,
            },
        ))
    }

    async fn open_embedded(global: &Global, open: Open, tuning: Tuning) -> Result<Self> {
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

    /// Where the namespace lives, for messages: the redacted URL or the state file.
    pub(crate) fn location(&self) -> String {
        match &self.place {
            Place::Redis { shown, .. } => shown.clone(),
            Place::Embedded(e) => e.path().display().to_string(),
        }
    }

    /// Whether this is the embedded backend.
    pub(crate) fn is_embedded(&self) -> bool {
        matches!(self.place, Place::Embedded(_))
    }

    /// Records a new namespace's shard count (Redis), so later commands agree on it.
    pub(crate) async fn register_namespace(&self) -> Result<()> {
        if let Place::Redis { conn, schema, .. } = &self.place {
            let mut c = conn.clone();
            let _: bool = c.hset_nx(schema.meta(), "shards", self.shards).await?;
        }
        Ok(())
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

/// The archive settings of this process.
pub(crate) fn archive_config(
    ns: &str,
    shards: u32,
    first_pid: u64,
    tuning: &Tuning,
) -> ArchiveConfig {
    let mut config = ArchiveConfig {
        namespace: ns.to_owned(),
        num_shards: shards,
        first_pid,
        consumer: tuning.consumer.clone(),
        claim_idle: tuning.claim_idle,
        ..ArchiveConfig::default()
    };
    if let Some(t) = &tuning.tiers {
        config.compressed_at = t.compressed_at;
        config.summary_at = t.summary_at;
        config.summary_ttl = t.summary_ttl;
    }
    config
}

/// The lowest pid any plan issues (1 when there is no plan yet).
async fn first_pid(active: &dyn ActiveStore) -> Result<u64> {
    let plans = active.plans().await.context("reading the plans")?;
    Ok(plans.iter().map(|p| p.plan.first_pid()).min().unwrap_or(1))
}

/// The embedded state file: `--state`, or `.tranche/<namespace>.state` here.
fn state_path(global: &Global) -> PathBuf {
    global
        .state
        .clone()
        .unwrap_or_else(|| PathBuf::from(".tranche").join(format!("{}.state", global.namespace)))
}

/// The URL with its password replaced, for messages and logs.
pub(crate) fn redact(url: &str) -> String {
    // A password may also ride in the query (`redis+unix:///run/redis.sock?pass=...`).
    let (url, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let mut out = match url.split_once("://") {
        Some((scheme, rest)) => match rest.rsplit_once('@') {
            Some((userinfo, host)) => match userinfo.split_once(':') {
                Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
                None => format!("{scheme}://***@{host}"),
            },
            None => url.to_owned(),
        },
        None => url.to_owned(),
    };
    if let Some(query) = query {
        let params: Vec<String> = query
            .split('&')
            .map(|param| match param.split_once('=') {
                Some((key, _)) if matches!(key, "pass" | "password") => format!("{key}=***"),
                _ => param.to_owned(),
            })
            .collect();
        out.push('?');
        out.push_str(&params.join("&"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_a_message() {
        assert_eq!(
            redact("redis://:s3cret@host:6379/0"),
            "redis://:***@host:6379/0"
        );
        assert_eq!(redact("rediss://bob:pw@host"), "rediss://bob:***@host");
        assert_eq!(redact("redis://token@host"), "redis://***@host");
        assert_eq!(redact("redis://host:6379"), "redis://host:6379");
        assert_eq!(
            redact("redis+unix:///run/redis.sock?db=2&pass=s3cret"),
            "redis+unix:///run/redis.sock?db=2&pass=***"
        );
        assert_eq!(
            redact("unix:///tmp/r.sock?password=s3cret"),
            "unix:///tmp/r.sock?password=***"
        );
        assert_eq!(
            redact("redis://:a@h/0?protocol=resp3"),
            "redis://:***@h/0?protocol=resp3"
        );
    }

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
