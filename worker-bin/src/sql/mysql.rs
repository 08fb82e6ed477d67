//! [`super::SqlHandler`] on MySQL and MariaDB (`mysql://` and `mariadb://` URLs), over
//! `mysql_async`: the same semantics as on PostgreSQL, in MySQL's terms.
//!
//! - The statement's placeholders become `?` (`mysql_statement`), and it is prepared on
//!   each connection, and once at start so that a statement the server refuses fails
//!   before any claim.
//! - TLS as the URL's `ssl-mode` and `ssl-ca` ask (`tls`), verified against the
//!   system's roots.
//! - Each connection's session, set up in one statement as it opens, bounds a chunk:
//!   `innodb_lock_wait_timeout` (whole seconds, at least 1) and MariaDB's
//!   `max_statement_time` (MySQL's `max_execution_time` bounds only SELECTs, so the
//!   client's own deadline, the chunk timeout and five seconds more, is the bound
//!   there).
//! - Each chunk is one transaction in two round trips: the statement (the session's
//!   autocommit is off, so it opens the transaction; no `BEGIN`), then `COMMIT` once
//!   it has answered, never before: a worker gone by then commits nothing.
//! - A deadlock (1213), a lock wait timeout (1205: InnoDB rolls back only the
//!   statement, so the whole transaction is dropped with its connection and run
//!   again) and a lost connection (no answer, 2006, 2013, 1053, 1927, 4031) are
//!   retried inside the attempt with back-off; a constraint violation (SQLSTATE class
//!   23) can fail the partition at once; anything else fails the attempt.
//! - As on PostgreSQL, a connection goes back to the pool only between transactions.
//!   One whose chunk ended any other way is dropped: `mysql_async` then rolls back and
//!   closes it (a statement still running finishes first, bounded by the timeouts
//!   above), and a connection cut off (a killed worker) is rolled back by the server.
//!   Nothing of a chunk is ever committed half way.
//! - `affected_rows` is MySQL's: rows changed, not rows matched.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, OptsBuilder, Params, Statement, Value};
use tokio::sync::Semaphore;

use super::mysql_statement;
use super::tls::{self, MysqlSslMode};
use super::{Backoff, Counters, SqlConfig, Verdict};
use crate::error::Error;
use crate::handler::{Chunk, HandlerError};

/// Whether `url` names a MySQL or MariaDB server.
pub(super) fn is_mysql(url: &str) -> bool {
    let lower = url.trim_start().to_ascii_lowercase();
    lower.starts_with("mysql://") || lower.starts_with("mariadb://")
}

/// `url` (`mysql://` or `mariadb://`) as `mysql_async` takes it, TLS included: the
/// URL's `ssl-mode` and `ssl-ca` (`tls::mysql_ssl`), which `mysql_async` does not
/// know, are taken out and turned into its TLS options; its own `require_ssl`,
/// `verify_ca`, `verify_identity` and `built_in_roots` are refused, so that TLS has
/// one spelling and one policy.
pub(super) fn opts(url: &str) -> Result<Opts, String> {
    let url = url.trim();
    let url = match url.get(..10) {
        Some(scheme) if scheme.eq_ignore_ascii_case("mariadb://") => {
            format!("mysql://{}", &url[10..])
        }
        _ => url.to_string(),
    };
    let (base, query) = url.split_once('?').unwrap_or((&url, ""));
    let (mut mode, mut ca, mut kept) = (MysqlSslMode::Disabled, None, Vec::new());
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key.to_ascii_lowercase().replace('_', "-").as_str() {
            "ssl-mode" | "sslmode" => mode = MysqlSslMode::parse(&url_decoded(value)?)?,
            "ssl-ca" | "sslca" => ca = Some(PathBuf::from(url_decoded(value)?)),
            "require-ssl" | "verify-ca" | "verify-identity" | "built-in-roots" => {
                return Err(format!(
                    "the database URL: `{key}` is not taken; TLS is ssl-mode=REQUIRED \
                     (VERIFY_CA, VERIFY_IDENTITY) and ssl-ca=PATH"
                ));
            }
            _ => kept.push(pair),
        }
    }
    let url = if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    let opts = Opts::from_url(&url).map_err(|e| format!("the database URL: {}", one_line(&e)))?;
    let ssl = tls::mysql_ssl(mode, ca)?;
    // `mysql_async` moves a connection to a local server onto its Unix socket when it
    // can (`prefer_socket`), where it never starts TLS: a session asked to be TLS stays
    // on the TCP connection it was asked on.
    let prefer_socket = ssl.is_none() && opts.prefer_socket();
    Ok(OptsBuilder::from_opts(opts)
        .ssl_opts(ssl)
        .prefer_socket(prefer_socket)
        .into())
}

/// `text` with its `%XX` escapes decoded, as a URL's query value (and OTLP's
/// `key=value` lists) are written; when it cannot be, why, in a few words.
pub(crate) fn percent_decoded(text: &str) -> Result<String, &'static str> {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = text
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or("a bad % escape")?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "not UTF-8")
}

/// [`percent_decoded`] for a database URL's parts, its error naming them.
pub(super) fn url_decoded(text: &str) -> Result<String, String> {
    percent_decoded(text).map_err(|why| format!("the database URL: `{text}`: {why}"))
}

/// The handler's engine on MySQL: how to open a connection, the pool, and the policy.
pub(super) struct Mysql {
    opts: Opts,
    /// The statement with `?` placeholders.
    statement: String,
    /// What each `?` binds: an index into the chunk's five values.
    binds: Vec<usize>,
    /// The session settings that bound each chunk, and autocommit off (each chunk's
    /// statement opens its transaction), one statement run on every new connection.
    session: String,
    /// The client's own bound on a chunk's transaction.
    deadline: Duration,
    /// Caps the connections in use.
    permits: Semaphore,
    /// Open connections no chunk uses, each with the statement prepared on it.
    idle: Mutex<Vec<(Conn, Statement)>>,
    retries: u32,
    backoff: Duration,
    constraint_violations_permanent: bool,
    pub(super) stats: Counters,
}

impl std::fmt::Debug for Mysql {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mysql")
            .field("statement", &self.statement)
            .finish_non_exhaustive()
    }
}

impl Mysql {
    /// Opens the first connection, sets up its session and prepares the statement:
    /// a server that cannot be reached or refuses the statement is an [`Error`] here.
    pub(super) async fn connect(config: &SqlConfig, size: usize) -> Result<Self, Error> {
        let opts = opts(&config.database_url).map_err(Error::Config)?;
        let (statement, binds) =
            mysql_statement::prepare(&config.statement, config.fence_column.as_deref())
                .map_err(Error::Config)?;
        let timeout = config.chunk_timeout;
        let lock_wait = timeout.as_secs_f64().ceil().max(1.0) as u64;
        let mut engine = Self {
            opts,
            statement,
            binds,
            session: format!("SET SESSION autocommit = 0, innodb_lock_wait_timeout = {lock_wait}"),
            deadline: timeout + Duration::from_secs(5),
            permits: Semaphore::new(size),
            idle: Mutex::new(Vec::new()),
            retries: config.retries,
            backoff: config.backoff,
            constraint_violations_permanent: config.constraint_violations_permanent,
            stats: Counters::default(),
        };
        let mut conn = Conn::new(engine.opts.clone()).await.map_err(|e| {
            Error::Other(format!("cannot connect to the database: {}", one_line(&e)).into())
        })?;
        let version: Option<String> = conn
            .query_first("SELECT VERSION()")
            .await
            .map_err(|e| Error::Other(format!("the database: {}", one_line(&e)).into()))?;
        if version.is_some_and(|v| v.contains("MariaDB")) {
            engine
                .session
                .push_str(&format!(", max_statement_time = {}", timeout.as_secs_f64()));
        }
        let first = engine.setup(conn).await.map_err(|e| {
            let prefix = if matches!(e, mysql_async::Error::Server(_)) {
                "the database refused the statement"
            } else {
                "cannot connect to the database"
            };
            Error::Other(format!("{prefix}: {}", one_line(&e)).into())
        })?;
        engine.idle.get_mut().expect("pool lock").push(first);
        Ok(engine)
    }

    /// Sets a new connection's session up and prepares the statement on it.
    async fn setup(&self, mut conn: Conn) -> Result<(Conn, Statement), mysql_async::Error> {
        conn.query_drop(&self.session).await?;
        let statement = conn.prep(&self.statement).await?;
        Ok((conn, statement))
    }

    /// Runs `chunk`'s transaction, retrying what a retry can cure; the rows affected.
    pub(super) async fn execute(&self, chunk: &Chunk) -> Result<u64, HandlerError> {
        let values = [
            chunk.from,
            chunk.to,
            chunk.pid,
            u64::from(chunk.attempt),
            chunk.fence,
        ];
        let params: Vec<Value> = self
            .binds
            .iter()
            .map(|&n| {
                i64::try_from(values[n])
                    .map(Value::Int)
                    .map_err(|_| HandlerError::permanent(format!("{} is beyond BIGINT", values[n])))
            })
            .collect::<Result<_, _>>()?;
        let mut backoff = Backoff::new(self.retries, self.backoff);
        loop {
            let outcome = tokio::time::timeout(self.deadline, self.transaction(&params)).await;
            let err = match outcome {
                Ok(Ok(rows)) => return Ok(self.stats.committed(chunk, rows)),
                Ok(Err(err)) => err,
                Err(_) => {
                    return Err(format!(
                        "the chunk's transaction did not end within {:?}",
                        self.deadline
                    )
                    .into());
                }
            };
            let verdict = self.classify(&err);
            backoff
                .after(verdict, one_line(&err), &self.stats, chunk)
                .await?;
        }
    }

    /// One try on a pooled connection, in two round trips: the statement (autocommit
    /// is off, so it opens the transaction), then COMMIT once it has answered, so that
    /// a worker gone by then commits nothing. The connection goes back only if both
    /// succeeded.
    async fn transaction(&self, params: &[Value]) -> Result<u64, mysql_async::Error> {
        let _permit = self
            .permits
            .acquire()
            .await
            .expect("the pool's semaphore is never closed");
        let idle = loop {
            let Some(held) = self.idle.lock().expect("pool lock").pop() else {
                break None;
            };
            if !held.0.is_disconnected() {
                break Some(held);
            }
        };
        let (mut conn, statement) = match idle {
            Some(held) => held,
            None => self.setup(Conn::new(self.opts.clone()).await?).await?,
        };
        conn.exec_drop(&statement, Params::Positional(params.to_vec()))
            .await?;
        let rows = conn.affected_rows();
        conn.query_drop("COMMIT").await?;
        self.idle.lock().expect("pool lock").push((conn, statement));
        Ok(rows)
    }

    fn classify(&self, err: &mysql_async::Error) -> Verdict {
        use mysql_async::{DriverError, Error as E};
        match err {
            E::Io(_) | E::Driver(DriverError::ConnectionClosed) => Verdict::Retry,
            E::Server(s) => match s.code {
                // Deadlock, lock wait timeout, server gone or going, connection killed.
                1213 | 1205 | 2006 | 2013 | 1053 | 1927 | 4031 => Verdict::Retry,
                _ if s.state.starts_with("23") && self.constraint_violations_permanent => {
                    Verdict::Permanent
                }
                _ => Verdict::Fail,
            },
            _ => Verdict::Fail,
        }
    }
}

/// A MySQL error on one line: the server's message with its code and SQLSTATE, or the
/// error as it displays, line breaks folded.
fn one_line(err: &(dyn std::error::Error + 'static)) -> String {
    let server = match err.downcast_ref::<mysql_async::Error>() {
        Some(mysql_async::Error::Server(s)) => Some(format!(
            "{} (error {}, SQLSTATE {})",
            s.message, s.code, s.state
        )),
        _ => None,
    };
    super::folded(err, server)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mysql_and_mariadb_urls_are_told_from_postgresql_ones() {
        assert!(is_mysql("mysql://root@127.0.0.1:3306/db"));
        assert!(is_mysql("MariaDB://root@localhost/db"));
        assert!(!is_mysql("postgresql://localhost/db"));
        assert!(!is_mysql("host=127.0.0.1 user=app dbname=mysql://"));
    }

    #[test]
    fn the_urls_tls_words_are_taken_out_and_the_rest_kept() {
        let o = opts(
            "mariadb://root@127.0.0.1:3306/db?ssl-mode=verify_ca&tcp_nodelay=false\
             &ssl_ca=/tmp/my%20ca.pem",
        )
        .unwrap();
        let ssl = o.ssl_opts().expect("TLS asked for");
        assert!(ssl.skip_domain_validation() && ssl.disable_built_in_roots());
        assert!(
            format!("{:?}", ssl.root_certs().last()).contains("/tmp/my ca.pem"),
            "{ssl:?}"
        );
        assert!(!o.tcp_nodelay() && !o.prefer_socket());
        assert_eq!(o.db_name(), Some("db"));
        let required = opts("mysql://h/db?ssl-mode=REQUIRED&ssl-ca=/ca.pem").unwrap();
        assert!(!required.ssl_opts().unwrap().skip_domain_validation());
        assert!(opts("mysql://h/db").unwrap().ssl_opts().is_none());
        for bad in [
            "mysql://h/db?ssl-mode=REQUIRED&ssl-ca=%zz",
            "mysql://h/db?ssl-mode=PREFERRED",
            "mysql://h/db?verify_identity=false",
            "mysql://h/db?ssl-ca=/ca.pem",
        ] {
            assert!(opts(bad).is_err(), "{bad}");
        }
    }
}
