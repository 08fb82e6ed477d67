//! TLS to the database: rustls (already in the tree through Redis), used when the
//! connection string asks for it (`sslmode=require`), and then verified against the
//! system's roots.
//!
//! The choice a reader might not expect: libpq's `require` encrypts without verifying
//! the server's certificate, and its default `prefer` tries TLS and falls back to
//! plain text. Here TLS is either asked for and verified, or not used at all; a
//! certificate the system does not trust is an error at connect, not a silent
//! downgrade.
//!
//! MySQL and MariaDB ([`mysql_ssl`]) keep the same rule in their client's words: the
//! URL's `ssl-mode=REQUIRED` (or `VERIFY_IDENTITY`) verifies the server's certificate
//! and its name, `VERIFY_CA` the certificate alone, `DISABLED` is plain; `PREFERRED`,
//! a silent downgrade, is refused. The roots are the system's, as for PostgreSQL
//! (not `mysql_async`'s built-in bundle), and `ssl-ca=PATH` adds a PEM file of the
//! operator's own CA.

use std::path::PathBuf;
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
        let mut roots = rustls::RootCertStore::empty();
        roots.add_parsable_certificates(system_roots("sslmode=require")?);
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

/// The system's trusted roots that rustls can read (a system store may hold some it
/// cannot parse; the rest stand); an error naming `asked` (what asked for TLS) when
/// there are none.
fn system_roots(asked: &str) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, String> {
    let found = rustls_native_certs::load_native_certs();
    let certs: Vec<_> = found
        .certs
        .into_iter()
        .filter(|cert| rustls::RootCertStore::empty().add(cert.clone()).is_ok())
        .collect();
    if certs.is_empty() {
        return Err(format!(
            "{asked}, but no trusted root certificate could be read: {:?}",
            found.errors
        ));
    }
    Ok(certs)
}

/// How a MySQL URL asks for TLS (`ssl-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MysqlSslMode {
    /// `DISABLED`: plain TCP (the default).
    Disabled,
    /// `VERIFY_CA`: the certificate must chain to a trusted root; its name is not
    /// checked.
    VerifyCa,
    /// `REQUIRED` or `VERIFY_IDENTITY`: the certificate must chain to a trusted root
    /// and name the host connected to.
    VerifyIdentity,
}

impl MysqlSslMode {
    /// `ssl-mode`'s value, any case.
    pub(super) fn parse(value: &str) -> Result<Self, String> {
        match value.to_ascii_uppercase().as_str() {
            "DISABLED" => Ok(Self::Disabled),
            "VERIFY_CA" => Ok(Self::VerifyCa),
            "REQUIRED" | "VERIFY_IDENTITY" => Ok(Self::VerifyIdentity),
            "PREFERRED" => {
                Err("ssl-mode=PREFERRED falls back to plain text: say REQUIRED or DISABLED".into())
            }
            _ => Err(format!(
                "ssl-mode={value}: expected DISABLED, REQUIRED, VERIFY_CA or VERIFY_IDENTITY"
            )),
        }
    }
}

/// `mysql_async`'s TLS options for `mode`, trusting the system's roots and `ca` (a
/// PEM file), or `None` when `mode` is [`MysqlSslMode::Disabled`] (then `ca` is refused:
/// a CA given for a plain connection is a mistake, not a preference).
pub(super) fn mysql_ssl(
    mode: MysqlSslMode,
    ca: Option<PathBuf>,
) -> Result<Option<mysql_async::SslOpts>, String> {
    if mode == MysqlSslMode::Disabled {
        return match ca {
            Some(_) => Err("ssl-ca is given but TLS is not: add ssl-mode=REQUIRED".into()),
            None => Ok(None),
        };
    }
    // `mysql_async` names no type for a root (its `PathOrBuf` is not exported): the
    // vector's type comes from `with_root_certs`.
    let mut roots = Vec::new();
    match system_roots("ssl-mode") {
        Ok(certs) => roots.extend(certs.into_iter().map(|c| c.to_vec().into())),
        // The operator's own CA may be all there is.
        Err(_) if ca.is_some() => {}
        Err(e) => return Err(e),
    }
    if let Some(ca) = ca {
        roots.push(ca.into());
    }
    Ok(Some(
        mysql_async::SslOpts::default()
            .with_disable_built_in_roots(true)
            .with_root_certs(roots)
            .with_danger_skip_domain_validation(mode == MysqlSslMode::VerifyCa),
    ))
}
