//! What `{ns}:meta` records of a namespace's keys (its shard count and key layout),
//! read when a namespace is opened and written once when it is planned.

use std::sync::LazyLock;

use redis::Script;
use redis::aio::ConnectionLike;
use tranche_codec::lua::{self, Fragment};
use tranche_codec::{KeyLayout, KeySchema};

use super::conn::retry;
use crate::{Error, Result};

static REGISTER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&lua::compose(&[&Fragment::new(include_str!(
        "../../lua/register.lua"
    ))]))
});

/// The register script, for the slot checks of `scripts()`.
#[cfg(feature = "testing")]
pub(super) fn register_script() -> &'static Script {
    &REGISTER
}

/// How a namespace names its keys, as `{ns}:meta` records it: fixed when the namespace
/// is planned, since every shard key's name depends on both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeysMeta {
    /// The shard count (`shards`).
    pub shards: u32,
    /// The shard tags' layout (`layout`; a namespace recorded without one was planned
    /// before layouts existed and keeps [`KeyLayout::Plain`]).
    pub layout: KeyLayout,
}

impl KeysMeta {
    /// What a namespace not planned yet gets: `shards` and the current layout.
    pub fn new_namespace(shards: u32) -> Self {
        Self {
            shards,
            layout: KeyLayout::default(),
        }
    }

    /// Reads what `{ns}:meta` records of namespace `namespace` on `conn`: `None` when it
    /// was never planned (no `shards`). A layout this version does not know, or a
    /// shard count that is not one, is [`Error::Corrupt`]: opening such a namespace
    /// with another layout would write a second set of keys beside the first.
    pub async fn read<C>(conn: &C, namespace: &str) -> Result<Option<Self>>
    where
        C: ConnectionLike + Clone + Send + Sync,
    {
        let key = KeySchema::new(namespace, 1)?.meta();
        let (shards, layout): (Option<String>, Option<String>) = retry(conn, |mut conn| {
            let key = key.clone();
            async move {
                redis::cmd("HMGET")
                    .arg(key)
                    .arg("shards")
                    .arg("layout")
                    .query_async(&mut conn)
                    .await
            }
        })
        .await?;
        shards
            .map(|s| parse(&key, &s, layout.as_deref()))
            .transpose()
    }

    /// Records `self` for namespace `namespace` unless it is recorded already, in one
    /// script, and fails with [`Error::NamespaceMismatch`] when what is recorded differs
    /// (another process planned it at the same time with other settings, or a version
    /// that records no layout did).
    pub async fn register<C>(&self, conn: &C, namespace: &str) -> Result<()>
    where
        C: ConnectionLike + Clone + Send + Sync,
    {
        let key = KeySchema::new(namespace, 1)?.meta();
        let (shards, layout): (String, Option<String>) = retry(conn, |mut conn| {
            let key = key.clone();
            let (shards, version) = (self.shards, self.layout.version());
            async move {
                REGISTER
                    .key(key)
                    .arg(shards)
                    .arg(version)
                    .invoke_async(&mut conn)
                    .await
            }
        })
        .await?;
        let recorded = parse(&key, &shards, layout.as_deref())?;
        if recorded != *self {
            return Err(Error::NamespaceMismatch {
                namespace: namespace.to_owned(),
                recorded: recorded.to_string(),
                wanted: self.to_string(),
            });
        }
        Ok(())
    }
}

impl std::fmt::Display for KeysMeta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} shards, key layout {}",
            self.shards,
            self.layout.version()
        )
    }
}

/// The record of `shards` and `layout` read from `key`.
fn parse(key: &str, shards: &str, layout: Option<&str>) -> Result<KeysMeta> {
    let corrupt = |detail: String| Error::Corrupt {
        key: key.to_owned(),
        detail,
    };
    let shards = shards
        .parse()
        .map_err(|_| corrupt(format!("shards `{shards}` is not a shard count")))?;
    let layout = match layout {
        None => KeyLayout::Plain,
        Some(v) => v
            .parse()
            .ok()
            .and_then(KeyLayout::from_version)
            .ok_or_else(|| {
                corrupt(format!(
                    "key layout `{v}` is unknown to this version of tranche (a newer one planned the namespace)"
                ))
            })?,
    };
    Ok(KeysMeta { shards, layout })
}
