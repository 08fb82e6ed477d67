//! Integration tests of tranche-active-store, in one binary so they link once.

use tranche_testkit as support;
use tranche_testkit::pki;

/// A Redis store of `namespace` over `shards` shards on `conn`, with the partitions of
/// `size` IDs from `min` to `max` planned: the set-up most tests of one script share.
async fn planned<C>(
    conn: C,
    namespace: &str,
    shards: u32,
    (min, max, size): (u64, u64, u64),
) -> tranche_active_store::RedisActiveStore<C>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    use tranche_active_store::{Config, Plan, Planner, RedisActiveStore};
    let config = Config {
        namespace: namespace.into(),
        num_shards: shards,
        ..Config::default()
    };
    let store = RedisActiveStore::new(conn, config).unwrap();
    store.plan(&Plan::Uniform { min, max, size }).await.unwrap();
    store
}

mod behaviour;
mod bitmap;
mod bulk;
mod concurrency;
mod connection;
mod fail_policy;
mod memory;
mod rollback;
mod runs;
mod scripts;
mod split;
mod state;
