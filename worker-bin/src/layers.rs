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
            .field("redis", &self.redis.as_deref().map(redact))
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

/// The URL with its password replaced, for messages and logs: the one place a URL is
/// made fit to print, malformed ones included. Whatever lies between the authority's
/// start (after `//`, or `:/` for a URL missing a slash) and the last `@` is user
/// information: its user name is kept, the rest is `***` (a password may hold `?`,
/// `#`, `/` or `@`, so nothing before that last `@` is read as a path or query). A
/// `pass` or `password` parameter of the query is masked too
/// (`redis+unix:///run/redis.sock?pass=...`).
pub(crate) fn redact(url: &str) -> String {
    let (scheme, userinfo, host) = split_url(url);
    let mut out = scheme.to_owned();
    match userinfo.map(|u| u.split_once(':')) {
        Some(Some((user, _))) => {
            out.push_str(user);
            out.push_str(":***@");
        }
        Some(None) => out.push_str("***@"),
        None => {}
    }
    match host.split_once('?') {
        Some((base, query)) => {
            let params: Vec<String> = query
                .split('&')
                .map(|param| match param.split_once('=') {
                    Some((key, _)) if matches!(key, "pass" | "password") => format!("{key}=***"),
                    _ => param.to_owned(),
                })
                .collect();
            out.push_str(base);
            out.push('?');
            out.push_str(&params.join("&"));
        }
        None => out.push_str(host),
    }
    out
}

/// `url` cut into what comes before its authority (the scheme and slashes), its user
/// information (up to the last `@`, which is dropped) and the rest.
fn split_url(url: &str) -> (&str, Option<&str>, &str) {
    let start = match (url.find("//"), url.find(":/")) {
        (Some(slashes), Some(colon)) if colon < slashes => colon + 1,
        (Some(slashes), _) => slashes,
        (None, Some(colon)) => colon + 1,
        // No authority marker at all: anything before an `@` may still be a secret.
        (None, None) => 0,
    };
    let start = start + url[start..].len() - url[start..].trim_start_matches('/').len();
    let (scheme, rest) = url.split_at(start);
    match rest.rfind('@') {
        Some(at) => (scheme, Some(&rest[..at]), &rest[at + 1..]),
        None => (scheme, None, rest),
    }
}

/// `text` (an error's message) with `url` and the secrets in it masked as [`redact`]
/// masks them: for messages of a library that might quote the URL it was given.
pub(crate) fn scrub(text: &str, url: &str) -> String {
    let (_, userinfo, host) = split_url(url);
    // The password (or the token that is the whole user information), and the query's.
    let mut secrets: Vec<&str> = userinfo
        .map(|u| u.split_once(':').map_or(u, |(_, password)| password))
        .into_iter()
        .collect();
    if let Some((_, query)) = host.split_once('?') {
        secrets.extend(query.split('&').filter_map(|param| {
            let (key, value) = param.split_once('=')?;
            matches!(key, "pass" | "password").then_some(value)
        }));
    }
    let mut text = text.replace(url, &redact(url));
    for secret in secrets {
        // Too short a secret would mask ordinary words; such a password is no secret.
        if secret.len() >= 4 {
            text = text.replace(secret, "***");
        }
    }
    text
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
        // A password with the characters that end a path or start a query, or an `@`.
        assert_eq!(redact("redis://:pa?ss@host"), "redis://:***@host");
        assert_eq!(
            redact("redis://u:p/a#s@s@host:1/0"),
            "redis://u:***@host:1/0"
        );
        // Malformed: one slash, none, no scheme, only slashes.
        assert_eq!(redact("redis:/:S3cretPW@host"), "redis:/:***@host");
        assert_eq!(redact("redis:S3cretPW@host"), "redis:***@host");
        assert_eq!(redact("S3cretPW@host"), "***@host");
        assert_eq!(redact("//u:S3cretPW@host"), "//u:***@host");
        assert_eq!(redact("redis//:S3cretPW@host"), "redis//:***@host");
        assert_eq!(redact("plain-host"), "plain-host");
        assert_eq!(redact(""), "");
    }

    #[test]
    fn a_location_debugs_its_url_redacted() {
        let location = Location {
            redis: Some("redis://:s3cret@host".into()),
            ..Location::default()
        };
        let shown = format!("{location:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("redis://:***@host"), "{shown}");
    }

    #[test]
    fn a_message_quoting_the_url_is_scrubbed() {
        let url = "redis://:pa?ss-w0rd@host:1";
        assert_eq!(
            scrub(&format!("bad URL {url}; password pa?ss-w0rd rejected"), url),
            "bad URL redis://:***@host:1; password *** rejected"
        );
        let unix = "unix:///r.sock?pass=s3cret-x";
        assert_eq!(scrub("got s3cret-x", unix), "got ***");
        assert_eq!(scrub("no secret here", "redis://host"), "no secret here");
    }
}
