//! Connecting to Redis, standalone or cluster, and retrying through dropped connections.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{
    ClientTlsConfig, Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult,
    TlsCertificates, Value,
};

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
        Self::connect_with(url, &TlsOptions::default()).await
    }

    /// [`connect`](Self::connect) with TLS material of one's own: a CA to verify the
    /// server against instead of the system's roots, and a client certificate for servers
    /// that authenticate clients (`tls-auth-clients yes`). Options given with a URL that
    /// is not `rediss://` are an error, never silently plain text.
    pub async fn connect_with(url: &str, tls: &TlsOptions) -> RedisResult<Self> {
        let certs = if tls.is_empty() {
            None
        } else if !url.starts_with("rediss://") {
            return Err(RedisError::from((
                ErrorKind::InvalidClientConfig,
                "TLS options need a rediss:// URL",
            )));
        } else {
            Some(tls.certificates())
        };
        if url.starts_with("rediss://") {
            // rustls needs a process-wide crypto provider; a second install is a no-op.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let client = match &certs {
            Some(certs) => redis::Client::build_with_tls(url, certs.clone())?,
            None => redis::Client::open(url)?,
        };
        // One plain attempt first: a server that is not there, not Redis, or not
        // speaking TLS fails here at once, instead of after the manager's retries.
        let probe_config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(5)))
            .set_response_timeout(Some(Duration::from_secs(5)));
        let mut probe = client
            .get_multiplexed_async_connection_with_config(&probe_config)
            .await?;
        let info: String = redis::cmd("INFO")
            .arg("cluster")
            .query_async(&mut probe)
            .await?;
        drop(probe);
        let config = ConnectionManagerConfig::new()
            .set_number_of_retries(3)
            .set_max_delay(Duration::from_secs(2))
            .set_connection_timeout(Some(Duration::from_secs(5)))
            .set_response_timeout(Some(Duration::from_secs(10)));
        if info.contains("cluster_enabled:1") {
            let mut builder = ClusterClient::builder(vec![url])
                .connection_timeout(Duration::from_secs(5))
                .response_timeout(Duration::from_secs(10));
            if let Some(certs) = certs {
                builder = builder.certs(certs);
            }
            let cluster = builder.build()?;
            let conn = cluster.get_async_connection().await?;
            return Ok(Self {
                inner: Inner::Cluster(conn),
                bulk: None,
            });
        }
        let single = client.get_connection_manager_with_config(config).await?;
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

/// TLS material for [`RedisConnection::connect_with`], in PEM. The default is none:
/// the system's roots (or `SSL_CERT_FILE`) and no client certificate.
#[derive(Clone, Default)]
pub struct TlsOptions {
    /// CA certificates to verify the server against, instead of the system's roots.
    pub ca: Option<Vec<u8>>,
    /// A client certificate and its private key, for servers that ask for one.
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl TlsOptions {
    /// Reads the PEM files given: a CA file, and a client certificate with its key
    /// (both or neither). The error names the file that could not be read.
    pub fn from_files(
        ca: Option<&Path>,
        cert: Option<&Path>,
        key: Option<&Path>,
    ) -> std::io::Result<Self> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|e| {
                std::io::Error::new(e.kind(), format!("cannot read {}: {e}", path.display()))
            })
        };
        let client = match (cert, key) {
            (Some(cert), Some(key)) => Some((read(cert)?, read(key)?)),
            (None, None) => None,
            _ => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "a client certificate needs its key, and a key its certificate",
                ));
            }
        };
        Ok(Self {
            ca: ca.map(read).transpose()?,
            client,
        })
    }

    /// Whether nothing is set (the system's roots, no client certificate).
    pub fn is_empty(&self) -> bool {
        self.ca.is_none() && self.client.is_none()
    }

    fn certificates(&self) -> TlsCertificates {
        TlsCertificates {
            client_tls: self.client.as_ref().map(|(cert, key)| ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
            root_cert: self.ca.clone(),
        }
    }
}

impl std::fmt::Debug for TlsOptions {
    // Key material is never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsOptions")
            .field("ca", &self.ca.as_ref().map(|_| "<pem>"))
            .field("client", &self.client.as_ref().map(|_| "<pem>"))
            .finish()
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

/// Whether `conn` runs the commands sent on it in the order sent, whatever keys they
/// touch: a connection to one server (a [`RedisConnection`] that is not a cluster's, a
/// multiplexed connection, a connection manager). A cluster connection routes each
/// command to its key's node, so two commands on different slots may run in either
/// order; any other connection type is not taken for one.
pub(crate) fn runs_in_order<C: 'static>(conn: &C) -> bool {
    let conn = conn as &dyn std::any::Any;
    if let Some(conn) = conn.downcast_ref::<RedisConnection>() {
        return !conn.is_cluster();
    }
    conn.is::<ConnectionManager>() || conn.is::<redis::aio::MultiplexedConnection>()
}

/// The stores' one retry policy: every script of this store is safe to repeat (a
/// repeated completion is a duplicate, a repeated heartbeat renews again, and a claim
/// whose reply was lost leaves leases that expire and are reaped).
pub(crate) use tranche_codec::retry::retry;
