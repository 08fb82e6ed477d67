//! Connecting to Redis, standalone or cluster, and retrying through dropped connections.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Value};

use super::bulk::BulkReader;

/// A connection to a standalone Redis or a Redis Cluster, chosen by asking the server.
///
/// Cheap to clone (clones share one multiplexed connection), reconnects by itself, and
/// works with `rediss://` URLs and passwords (`redis://:secret@host:6379`). Every store
/// takes any [`ConnectionLike`] + `Clone`, so this type is a convenience, not a must.
#[derive(Clone)]
pub struct RedisConnection {
    inner: Inner,
    /// A second connection for big reads (see `bulk.rs`), for a standalone server over
    /// TCP or a Unix socket; opened on first use.
    bulk: Option<Arc<BulkReader>>,
}

#[derive(Clone)]
enum Inner {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl std::fmt::Debug for RedisConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.inner {
            Inner::Single(_) => "RedisConnection::Single",
            Inner::Cluster(_) => "RedisConnection::Cluster",
        })
    }
}

impl RedisConnection {
    /// Connects to `url`. If the server runs in cluster mode, connects to the whole
    /// cluster through it; otherwise keeps one auto-reconnecting multiplexed connection.
    ///
    /// `rediss://` URLs use TLS, verified against the system's roots; append `#insecure`
    /// (`rediss://host:6380/#insecure`) to skip verification, for self-signed test setups.
    pub async fn connect(url: &str) -> RedisResult<Self> {
        if url.starts_with("rediss://") {
            // rustls needs a process-wide crypto provider; a second install is a no-op.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let client = redis::Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_number_of_retries(3)
            .set_max_delay(Duration::from_secs(2))
            .set_connection_timeout(Some(Duration::from_secs(5)))
            .set_response_timeout(Some(Duration::from_secs(10)));
        let mut single = client.get_connection_manager_with_config(config).await?;
        let info: String = redis::cmd("INFO")
            .arg("cluster")
            .query_async(&mut single)
            .await?;
        if info.contains("cluster_enabled:1") {
            let cluster = ClusterClient::builder(vec![url])
                .connection_timeout(Duration::from_secs(5))
                .response_timeout(Duration::from_secs(10))
                .build()?;
            let conn = cluster.get_async_connection().await?;
            return Ok(Self {
                inner: Inner::Cluster(conn),
                bulk: None,
            });
        }
        Ok(Self {
            inner: Inner::Single(single),
            bulk: BulkReader::for_server(client.get_connection_info()).map(Arc::new),
        })
    }

    /// Whether this is a cluster connection.
    pub fn is_cluster(&self) -> bool {
        matches!(self.inner, Inner::Cluster(_))
    }

    /// The big-read connection, if this connection has one.
    pub(crate) fn bulk_reader(&self) -> Option<Arc<BulkReader>> {
        self.bulk.clone()
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match &mut self.inner {
            Inner::Single(c) => c.req_packed_command(cmd),
            Inner::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match &mut self.inner {
            Inner::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Inner::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match &self.inner {
            Inner::Single(c) => c.get_db(),
            Inner::Cluster(c) => c.get_db(),
        }
    }
}

/// Attempts per operation when the connection drops: the first command after a drop
/// fails while the connection manager reconnects, so one retry usually suffices.
const ATTEMPTS: u32 = 5;

/// Runs `op` on a clone of `conn`, retrying with backoff while the failure is a dropped
/// or refused connection or a timeout. Every script of the store is safe to repeat: a
/// repeated completion is a duplicate, a repeated heartbeat renews again, and a claim
/// whose reply was lost leaves leases that expire and are reaped.
pub(crate) async fn retry<C, T, F, Fut>(conn: &C, mut op: F) -> RedisResult<T>
where
    C: Clone,
    F: FnMut(C) -> Fut,
    Fut: Future<Output = RedisResult<T>>,
{
    let mut delay = Duration::from_millis(20);
    let mut attempt = 1;
    loop {
        match op(conn.clone()).await {
            Err(err) if attempt < ATTEMPTS && transient(&err) => {
                tracing::debug!(%err, attempt, "redis connection error; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 3).min(Duration::from_secs(1));
                attempt += 1;
            }
            other => return other,
        }
    }
}

fn transient(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_timeout()
}
