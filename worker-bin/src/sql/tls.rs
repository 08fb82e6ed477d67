//! TLS to the database: rustls (already in the tree through Redis), used when the
//! connection string asks for it (`sslmode=require`), and then verified against the
//! system's roots.
//!
//! The choice a reader might not expect: libpq's `require` encrypts without verifying
//! the server's certificate, and its default `prefer` tries TLS and falls back to
//! plain text. Here TLS is either asked for and verified, or not used at all; a
//! certificate the system does not trust is an error at connect, not a silent
//! downgrade.

use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio_postgres::config::SslMode;
use tokio_postgres::{Client, Config, NoTls};
use tokio_postgres_rustls::MakeRustlsConnect;

/// How connections are opened.
#[derive(Clone)]
pub(super) enum Tls {
    /// Plain TCP or a Unix socket.
    Plain,
    /// rustls, verifying the server against the system's roots.
    Rustls(MakeRustlsConnect),
}

impl Tls {
    /// What `config` asks for. Fails when TLS is required and the system's roots
    /// cannot be read.
    pub(super) fn for_config(config: &Config) -> Result<Self, String> {
        if config.get_ssl_mode() != SslMode::Require {
            return Ok(Tls::Plain);
        }
        let found = rustls_native_certs::load_native_certs();
        let mut roots = rustls::RootCertStore::empty();
        for cert in found.certs {
            // A system store may hold certificates rustls cannot parse; the rest stand.
            let _ = roots.add(cert);
        }
        if roots.is_empty() {
            return Err(format!(
                "sslmode=require, but no trusted root certificate could be read: {:?}",
                found.errors
            ));
        }
        // The provider is given here rather than installed process-wide: a library
        // does not choose the application's default.
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Tls::Rustls(MakeRustlsConnect::new(tls)))
    }

    /// Opens a connection; its socket is driven by the returned task.
    pub(super) async fn connect(
        &self,
        config: &Config,
    ) -> Result<(Client, JoinHandle<()>), tokio_postgres::Error> {
        Ok(match self {
            Tls::Plain => {
                let (client, connection) = config.connect(NoTls).await?;
                (client, tokio::spawn(drive(connection)))
            }
            Tls::Rustls(tls) => {
                let (client, connection) = config.connect(tls.clone()).await?;
                (client, tokio::spawn(drive(connection)))
            }
        })
    }
}

/// Drives one connection until it closes. Its errors reach the chunk that uses it
/// (as a closed connection); this only leaves a trace.
async fn drive<F>(connection: F)
where
    F: std::future::Future<Output = Result<(), tokio_postgres::Error>>,
{
    if let Err(err) = connection.await {
        tracing::debug!(error = %err, "database connection closed");
    }
}
