//! TLS to the database: rustls (already in the tree through Redis), used when the
//! connection string asks for it, and then verified against the system's roots and
//! the operator's own CA, if given.
//!
//! PostgreSQL's connection string speaks libpq's words (taken out of it by
//! `conninfo`, since tokio-postgres knows only some): `sslmode=verify-full` verifies
//! the server's certificate and its name, `verify-ca` the certificate alone;
//! `sslrootcert=PATH` adds a PEM file's certificates to the system's roots.
//!
//! The choice a reader might not expect: libpq's `require` encrypts without verifying
//! the server's certificate, and its default `prefer` tries TLS and falls back to
//! plain text. Here `require` verifies as `verify-full` does, and `prefer` is plain:
//! TLS is either asked for and verified, or not used at all; a certificate the roots
//! do not vouch for is an error at connect, not a silent downgrade.
//!
//! MySQL and MariaDB ([`mysql_ssl`]) keep the same rule in their client's words: the
//! URL's `ssl-mode=REQUIRED` (or `VERIFY_IDENTITY`) verifies the server's certificate
//! and its name, `VERIFY_CA` the certificate alone, `DISABLED` is plain; `PREFERRED`,
//! a silent downgrade, is refused. The roots are the system's, as for PostgreSQL
//! (not `mysql_async`'s built-in bundle), and `ssl-ca=PATH` adds a PEM file of the
//! operator's own CA.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::task::JoinHandle;
use tokio_postgres::{Client, Config, NoTls};
use tokio_postgres_rustls::MakeRustlsConnect;

/// How a PostgreSQL connection string asks for TLS (libpq's `sslmode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PgSslMode {
    /// `disable`, `prefer` or none: plain TCP, or a Unix socket.
    Disable,
    /// `verify-ca`: the certificate must chain to a trusted root; its name is not
    /// checked.
    VerifyCa,
    /// `require` or `verify-full`: the certificate must chain to a trusted root and
    /// name the host connected to (`host`, even when `hostaddr` gives the address).
    VerifyFull,
}

impl PgSslMode {
    /// `sslmode`'s value, as libpq spells it.
    pub(super) fn parse(value: &str) -> Result<Self, String> {
        match value {
            // `prefer` is libpq's default: today's plain connection, never a TLS one
            // that could silently have been plain.
            "disable" | "prefer" => Ok(Self::Disable),
            "verify-ca" => Ok(Self::VerifyCa),
            "require" | "verify-full" => Ok(Self::VerifyFull),
            _ => Err(format!(
                "sslmode={value}: expected disable, prefer, require, verify-ca or verify-full"
            )),
        }
    }
}

/// How connections are opened.
#[derive(Clone)]
pub(super) enum Tls {
    /// Plain TCP or a Unix socket.
    Plain,
    /// rustls, verifying the server against the system's roots and the operator's CA.
    Rustls(MakeRustlsConnect),
}

impl Tls {
    /// TLS as `mode` asks, trusting the system's roots and the certificates of
    /// `rootcert` (a PEM file, read now). Fails, in one line, when `rootcert` is given
    /// for a plain connection, cannot be read or holds no certificate, or when TLS is
    /// asked for and there is no root at all.
    pub(super) fn postgres(mode: PgSslMode, rootcert: Option<&Path>) -> Result<Self, String> {
        if mode == PgSslMode::Disable {
            return match rootcert {
                // A CA given for a plain connection is a mistake, not a preference.
                Some(_) => Err("sslrootcert is given but TLS is not: add \
                                sslmode=verify-full (or verify-ca)"
                    .into()),
                None => Ok(Tls::Plain),
            };
        }
        let mut roots = RootCertStore::empty();
        match system_roots("sslmode") {
            Ok(certs) => {
                roots.add_parsable_certificates(certs);
            }
            // The operator's own CA may be all there is.
            Err(_) if rootcert.is_some() => {}
            Err(e) => return Err(e),
        }
        if let Some(path) = rootcert {
            for cert in pem_certificates(path)? {
                roots
                    .add(cert)
                    .map_err(|e| format!("sslrootcert={}: {e}", path.display()))?;
            }
        }
        // The provider is given here rather than installed process-wide: a library
        // does not choose the application's default.
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?;
        let tls = match mode {
            PgSslMode::VerifyCa => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(ChainOnly {
                    roots: Arc::new(roots),
                    provider,
                })),
            // `VerifyFull` (`Disable` returned above): rustls's own verifier.
            _ => builder.with_root_certificates(roots),
        };
        Ok(Tls::Rustls(MakeRustlsConnect::new(
            tls.with_no_client_auth(),
        )))
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
fn system_roots(asked: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let found = rustls_native_certs::load_native_certs();
    let certs: Vec<_> = found
        .certs
        .into_iter()
        .filter(|cert| RootCertStore::empty().add(cert.clone()).is_ok())
        .collect();
    if certs.is_empty() {
        return Err(format!(
            "{asked}, but no trusted root certificate could be read: {:?}",
            found.errors
        ));
    }
    Ok(certs)
}

/// The certificates of the PEM file at `path`: an error naming the path when it
/// cannot be read or holds none.
fn pem_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let named = || format!("sslrootcert={}", path.display());
    let pem = std::fs::read(path).map_err(|e| format!("{}: {e}", named()))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: {e}", named()))?;
    if certs.is_empty() {
        return Err(format!("{}: no PEM certificate in it", named()));
    }
    Ok(certs)
}

/// `verify-ca`'s verifier: the certificate must chain to one of `roots` (and be
/// within its dates), as rustls's own verifier checks, but the name in it is not
/// compared with the host's.
#[derive(Debug)]
struct ChainOnly {
    roots: Arc<RootCertStore>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let cert = rustls::server::ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
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
