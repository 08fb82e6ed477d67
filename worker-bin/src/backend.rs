//! Opens a namespace on Redis or embedded, and hands the rest of the binary the three
//! layers as trait objects plus a router over them. This is the only module that
//! names a concrete store; what only the command line does with one (drop, adopt,
//! list namespaces) is in `cli/admin.rs`, through [`Backend::redis`] and
//! [`Backend::embedded`].

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

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
    /// The shard count, which the command line's statistics and plans read.
    pub(crate) shards: u32,
    pub(crate) archive_config: ArchiveConfig,
    place: Place,
}

/// A Redis namespace's connection and typed stores, for what only Redis has.
pub(crate) struct RedisParts<'a> {
    /// The namespace's connection.
    #[cfg(feature = "cli")]
    pub(crate) conn: &'a RedisConnection,
    /// The active store, typed (`recount`, `carry`, `force_discard`).
    pub(crate) active: &'a RedisActiveStore<RedisConnection>,
    /// The archive, typed: its format version is Redis's alone.
    #[cfg(feature = "cli")]
    pub(crate) archive: &'a RedisArchive<RedisConnection>,
    /// The key schema with the namespace's recorded layout.
    pub(crate) schema: &'a KeySchema,
}

enum Place {
    Redis {
        conn: RedisConnection,
        /// The active store again, typed: for what only Redis has (`recount`).
        active: Arc<RedisActiveStore<RedisConnection>>,
        /// The archive again, typed: for its format version (`archive-format`).
        #[cfg(feature = "cli")]
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
    pub(crate) async fn get(
        &self,
        global: &Location,
        url: &str,
    ) -> Result<(RedisConnection, String), Error> {
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
    #[cfg(feature = "cli")]
    pub(crate) async fn open(global: &Location, open: Open, tuning: Tuning) -> Result<Self, Error> {
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
        if location.redis.is_none()
            && let Some(path) = &location.state
            && open == Open::Existing
            && !path.exists()
        {
            return Err(Error::NotPlanned {
                namespace: ns.clone(),
                location: path.display().to_string(),
            });
        }
        // On Redis, one connection tells "unreachable" and "not planned" apart and
        // then serves the namespace.
        Self::open_as(
            location,
            open,
            tuning,
            &Connections::default(),
            Unplanned::Typed,
        )
        .await
    }

    /// [`Backend::open`], on Redis through a connection of `connections`.
    #[cfg(feature = "cli")]
    pub(crate) async fn open_with(
        global: &Location,
        open: Open,
        tuning: Tuning,
        connections: &Connections,
    ) -> Result<Self, Error> {
        Self::open_as(global, open, tuning, connections, Unplanned::Said).await
    }

    /// [`Backend::open_with`], a namespace not planned on Redis told as `unplanned`
    /// says.
    async fn open_as(
        global: &Location,
        open: Open,
        tuning: Tuning,
        connections: &Connections,
        unplanned: Unplanned,
    ) -> Result<Self, Error> {
        // The key schema's rules, the one statement of them; embedded, the namespace
        // names a file too.
        let ns = &global.namespace;
        let shards = global.shards.unwrap_or(DEFAULT_SHARDS);
        match KeySchema::new(ns, shards) {
            Err(tranche_codec::Error::InvalidNamespace(_)) => {
                return Err(refused(format!(
                    "invalid namespace `{ns}`: use 1 to 64 letters, digits, '-', '_' or '.'"
                )));
            }
            Err(tranche_codec::Error::InvalidShardCount(_)) => {
                return Err(refused(format!(
                    "--shards must be between 1 and {}, not {shards}",
                    tranche_codec::MAX_SHARDS
                )));
            }
            Err(err) => return Err(err.into()),
            Ok(_) => {}
        }
        match redis_url(global)? {
            Some(url) => Self::open_redis(global, &url, open, tuning, connections, unplanned).await,
            None if global.tls_ca.is_some() || global.tls_cert.is_some() => Err(refused(
                "--tls-ca, --tls-cert and --tls-key need --redis with a rediss:// URL".into(),
            )),
            None if ns.bytes().all(|b| b == b'.') => Err(refused(format!(
                "invalid namespace `{ns}`: embedded, a namespace names a file, and `{ns}` is a directory's name"
            ))),
            None => Self::open_embedded(global, open, tuning).await,
        }
    }

    async fn open_redis(
        global: &Location,
        url: &str,
        open: Open,
        tuning: Tuning,
        connections: &Connections,
        unplanned: Unplanned,
    ) -> Result<Self, Error> {
        let (conn, shown) = connections.get(global, url).await?;
        let ns = &global.namespace;
        // The shard count and key layout are part of the namespace: every key's name
        // depends on them. A new namespace gets the current layout; one planned before
        // layouts were recorded keeps the plain tags (`KeysMeta::read`).
        let recorded = KeysMeta::read(&conn, ns).await.map_err(|e| {
            let e = scrub(&e.to_string(), url);
            Error::Store(format!("cannot read namespace `{ns}` on {shown}: {e}").into())
        })?;
        let keys = match (recorded, global.shards, open) {
            (Some(r), Some(asked), _) if r.shards != asked => {
                return Err(refused(format!(
                    "namespace `{ns}` on {shown} has {} shards, not {asked}",
                    r.shards
                )));
            }
            (Some(r), _, _) => r,
            (None, _, Open::Existing) => {
                return Err(match unplanned {
                    #[cfg(feature = "cli")]
                    Unplanned::Said => refused(format!(
                        "namespace `{ns}` is unknown on {shown} (run `tranche plan` first)"
                    )),
                    Unplanned::Typed => Error::NotPlanned {
                        namespace: ns.clone(),
                        location: shown,
                    },
                });
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
            archive_config,
            Place::Redis {
                conn,
                active,
                #[cfg(feature = "cli")]
                archive,
                schema,
                keys,
                shown,
            },
        ))
    }

    async fn open_embedded(global: &Location, open: Open, tuning: Tuning) -> Result<Self, Error> {
        let ns = &global.namespace;
        let path = state_path(global);
        let embedded = EmbeddedBackend::open(&path, ns, global.shards, open, &tuning).await?;
        let archive_config = embedded.archive_config().clone();
        let (active, archive, stats) = embedded.layers();
        Ok(Self::assemble(
            active,
            archive,
            stats,
            ns,
            archive_config,
            Place::Embedded(embedded),
        ))
    }

    fn assemble(
        active: Arc<dyn ActiveStore>,
        archive: Arc<dyn ArchiveStore>,
        stats: Arc<dyn StatsStore>,
        namespace: &str,
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
            shards: match &place {
                Place::Redis { keys, .. } => keys.shards,
                Place::Embedded(e) => e.shards(),
            },
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

    /// Whether this is the embedded backend.
    pub(crate) fn is_embedded(&self) -> bool {
        matches!(self.place, Place::Embedded(_))
    }

    /// Records a new namespace's shard count and key layout (Redis), so later commands
    /// agree on them; fails if the namespace is recorded with others.
    pub(crate) async fn register_namespace(&self) -> Result<(), Error> {
        if let Place::Redis { conn, keys, .. } = &self.place {
            keys.register(conn, &self.namespace).await?;
        }
        Ok(())
    }

    /// Entries waiting in the archive inboxes, across shards.
    pub(crate) async fn inbox_len(&self) -> Result<u64, Error> {
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

    /// Fails when another live process holds the embedded state file (always fine on
    /// Redis, where every process coordinates through the server).
    pub(crate) fn ensure_writable(&self) -> Result<(), Error> {
        match &self.place {
            Place::Redis { .. } => Ok(()),
            Place::Embedded(e) => e.ensure_writable(),
        }
    }

    /// Saves the embedded state (no-op on Redis). Safe to call at any time: the
    /// embedded backend orders its snapshot so no completed partition is lost.
    pub(crate) async fn save(&self) -> Result<(), Error> {
        match &self.place {
            Place::Redis { .. } => Ok(()),
            Place::Embedded(e) => e.save().await,
        }
    }

    /// What only Redis has, for the command line's operations on a store
    /// (`cli/admin.rs`); `None` embedded.
    pub(crate) fn redis(&self) -> Option<RedisParts<'_>> {
        match &self.place {
            Place::Redis {
                #[cfg(feature = "cli")]
                conn,
                active,
                #[cfg(feature = "cli")]
                archive,
                schema,
                ..
            } => Some(RedisParts {
                #[cfg(feature = "cli")]
                conn,
                active,
                #[cfg(feature = "cli")]
                archive,
                schema,
            }),
            Place::Embedded(_) => None,
        }
    }

    /// The embedded backend, for the command line's operations on a store
    /// (`cli/admin.rs`); `None` on Redis.
    #[cfg(feature = "cli")]
    pub(crate) fn embedded(&self) -> Option<&EmbeddedBackend> {
        match &self.place {
            Place::Redis { .. } => None,
            Place::Embedded(e) => Some(e),
        }
    }
}

/// The lowest pid any plan issues (1 when there is no plan yet).
async fn first_pid(active: &dyn ActiveStore) -> Result<u64, Error> {
    let plans = active.plans().await?;
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
pub(crate) fn redis_url(global: &Location) -> Result<Option<String>, Error> {
    match (&global.redis, &global.redis_file) {
        (Some(url), _) => Ok(Some(url.clone())),
        (None, Some(path)) => read_url(path).map(Some),
        (None, None) => Ok(None),
    }
}

/// Connects to `url` with the TLS options of `global`; returns the connection and the
/// URL with its password masked.
async fn connect(global: &Location, url: &str) -> Result<(RedisConnection, String), Error> {
    let shown = redact(url);
    if !["redis://", "rediss://", "redis+unix://", "unix://"]
        .iter()
        .any(|s| url.starts_with(s))
    {
        return Err(refused(format!(
            "invalid --redis URL `{shown}`: expected redis://, rediss:// or unix://"
        )));
    }
    let tls = TlsOptions::from_files(
        global.tls_ca.as_deref(),
        global.tls_cert.as_deref(),
        global.tls_key.as_deref(),
    )
    .map_err(|e| refused(e.to_string()))?;
    if !tls.is_empty() && !url.starts_with("rediss://") {
        return Err(refused(format!(
            "--tls-ca, --tls-cert and --tls-key need a rediss:// URL, not `{shown}`"
        )));
    }
    let conn = RedisConnection::connect_with(url, &tls)
        .await
        .map_err(|e| {
            let why = if e.kind() == redis::ErrorKind::Parse {
                // Its reply, quoted by the parser, would run over several lines.
                format!(
                    "cannot connect to Redis at {shown}: the server did not answer as Redis (is that the port of a Redis server?)"
                )
            } else {
                let hint = if url.starts_with("rediss://") && e.is_timeout() {
                    " (a rediss:// URL needs a server speaking TLS on that port)"
                } else {
                    ""
                };
                format!(
                    "cannot connect to Redis at {shown}: {}{hint}",
                    scrub(&e.to_string(), url)
                )
            };
            Error::StoreUnreachable {
                location: shown.clone(),
                source: why.into(),
            }
        })?;
    Ok((conn, shown))
}

/// The Redis URL in `path`: its first line, trimmed. One line of error, never the URL.
fn read_url(path: &std::path::Path) -> Result<String, Error> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| refused(format!("cannot read --redis-file {}: {e}", path.display())))?;
    match text.lines().next().map(str::trim) {
        Some(url) if !url.is_empty() => Ok(url.to_owned()),
        _ => Err(refused(format!(
            "--redis-file {} holds no URL on its first line",
            path.display()
        ))),
    }
}

/// A request refused with `message` (see [`Error::Refused`]).
fn refused(message: String) -> Error {
    Error::Refused(message)
}

/// How [`Backend::open_as`] tells that a namespace is not planned on Redis.
#[derive(Clone, Copy)]
enum Unplanned {
    /// In the command line's words, with what to do about it.
    #[cfg(feature = "cli")]
    Said,
    /// As [`Error::NotPlanned`], for a library caller to match.
    Typed,
}
