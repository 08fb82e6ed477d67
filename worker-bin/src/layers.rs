//! What opening a namespace takes and gives, in plain settings, shared by the Redis
//! opener (`backend`) and the embedded one (`embedded`): how a command wants the
//! namespace ([`Open`]), where it lives ([`Location`]), the layers' settings
//! ([`Tuning`], [`Tiers`], [`archive_config`]) and the archive traits as one object
//! ([`ArchiveStore`]). No clap type reaches the backends: the command line converts its
//! options into these.

use std::path::PathBuf;
use std::time::Duration;

use tranche_active_store::Config as ActiveConfig;
use tranche_archive_store::{
    ArchiveQuery, Archiver, Compaction, Config as ArchiveConfig, Export, Import,
};

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

/// Where a namespace lives and how to reach it: the plain settings that
/// [`Backend::open`](crate::backend::Backend::open) takes, whoever asks (the command
/// line through `Global::location`, the library's `Runner` from its builder). Its
/// `Debug` shows the URL redacted.
#[derive(Clone, Default)]
pub(crate) struct Location {
    /// The namespace's name.
    pub(crate) namespace: String,
    /// Shards of a new namespace; an existing one must have as many when given.
    pub(crate) shards: Option<u32>,
    /// The Redis URL; `None` (and no `redis_file`) is the embedded mode.
    pub(crate) redis: Option<String>,
    /// A file whose first line is the Redis URL (keeps a password out of `ps`).
    pub(crate) redis_file: Option<PathBuf>,
    /// PEM CA certificates to verify a `rediss://` server against.
    pub(crate) tls_ca: Option<PathBuf>,
    /// PEM client certificate, with `tls_key`.
    pub(crate) tls_cert: Option<PathBuf>,
    /// PEM private key of `tls_cert`.
    pub(crate) tls_key: Option<PathBuf>,
    /// The embedded state file; `.tranche/<namespace>.state` when `None`.
    pub(crate) state: Option<PathBuf>,
}

impl std::fmt::Debug for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Location")
            .field("namespace", &self.namespace)
            .field("shards", &self.shards)
            .field("redis", &self.redis.as_deref().map(crate::backend::redact))
            .field("redis_file", &self.redis_file)
            .field("tls_ca", &self.tls_ca)
            .field("tls_cert", &self.tls_cert)
            .field("tls_key", &self.tls_key)
            .field("state", &self.state)
            .finish()
    }
}

/// Archive tier thresholds (`run`, `archive`, the dry run's cost model).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tiers {
    /// Archived count from which records go to the compressed tier.
    pub(crate) compressed_at: u64,
    /// Archived count from which records go to the summary tier.
    pub(crate) summary_at: u64,
    /// How long summary-tier batches live.
    pub(crate) summary_ttl: Duration,
}

/// Settings of the layers that only `run` and `archive` change.
#[derive(Debug, Clone)]
pub(crate) struct Tuning {
    pub(crate) active: ActiveConfig,
    pub(crate) tiers: Option<Tiers>,
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
