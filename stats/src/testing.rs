//! Test hooks (feature `testing`, which this crate's own tests turn on): ways around the
//! statistics layer's invariants that tests need and production code must never use.

use redis::Script;
use redis::aio::ConnectionLike;

use crate::{RedisStats, Result, StatsDelta};

/// Every script of this crate with its name, for tests that run each on a cluster.
pub fn scripts() -> Vec<(&'static str, &'static Script)> {
    crate::redis_store::scripts()
}

/// Applies `delta` to shard `shard` of `stats` on its own, stamped `now_ms`, through the
/// standalone `apply` script: the statistics change without any archive write, so
/// nothing keeps the records from being counted again when they are archived.
pub async fn apply_alone<C>(
    stats: &RedisStats<C>,
    shard: u32,
    delta: &StatsDelta,
    now_ms: u64,
) -> Result<()>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    stats.apply(shard, delta, now_ms, false).await
}

/// [`apply_alone`], writing the ranges the delta touches as packed bodies (flag 16 of
/// `apply_delta.lua`'s layout), as the archive does under its format 3.
pub async fn apply_alone_packed<C>(
    stats: &RedisStats<C>,
    shard: u32,
    delta: &StatsDelta,
    now_ms: u64,
) -> Result<()>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    stats.apply(shard, delta, now_ms, true).await
}
