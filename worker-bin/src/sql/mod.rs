//! [`SqlHandler`]: a ready-made [`Handler`] that runs one SQL statement per chunk on
//! PostgreSQL over a pool of warm connections (its docs say how); [`SqlConfig`] its
//! settings. The statement's rewriting is `statement`, the pool `pool`, TLS `tls` (and
//! libpq's TLS words in the connection string `conninfo`).
//! MySQL and MariaDB are `mysql` (its statement rewriting `mysql_statement`); what the
//! two rewriters share (the token model, the fence splice) is `rewrite`.
//! [`SqlProbe`], throttle probes in SQL, is `probe`.

mod conninfo;
mod mysql;
mod mysql_statement;
mod pool;
mod probe;
mod rewrite;
mod statement;
mod tls;

#[cfg(feature = "cli")]
pub(crate) use mysql::percent_decoded;
pub use probe::SqlProbe;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};

use crate::error::Error;
use crate::handler::{Chunk, Handler, HandlerError};

use pool::{Opener, Pool};

/// How a [`SqlHandler`] connects and runs its statement. Built with [`SqlConfig::new`]
/// and its setters, given to [`SqlHandler::connect`].
#[derive(Debug, Clone)]
pub struct SqlConfig {
    /// The libpq connection string or URL.
    database_url: String,
    /// The statement as the user wrote it.
    statement: String,
    /// How many chunks can run at once (concurrency × parallel): the pool needs no
    /// more connections than that.
    slots: usize,
    /// The operator's cap on connections, whatever the slots.
    db_connections: usize,
    /// Each chunk's `statement_timeout` and `lock_timeout`.
    chunk_timeout: Duration,
    /// Retries inside one attempt of what a retry can cure.
    retries: u32,
    /// The first retry's delay, doubled for each next one up to [`MAX_BACKOFF`].
    backoff: Duration,
    /// Whether a constraint violation fails the partition at once.
    constraint_violations_permanent: bool,
    /// The column that fences the UPDATE, if any.
    fence_column: Option<String>,
}

/// The longest delay between two retries inside an attempt.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

impl SqlConfig {
    /// Runs `statement` on the database at `database_url` (a libpq connection string,
    /// `host=… user=… dbname=…`, or a `postgresql://` URL; `sslmode=verify-full` (or
    /// `require`, `verify-ca`) for TLS and `sslrootcert=PATH` for a CA of your own;
    /// or MySQL/MariaDB's `mysql://user:password@host:port/database`, `mariadb://`,
    /// with `?ssl-mode=REQUIRED` for TLS and `&ssl-ca=PATH` for a CA of your own).
    /// One connection, a chunk timeout of 60 s, 5 retries from 50 ms, no fence.
    pub fn new(database_url: impl Into<String>, statement: impl Into<String>) -> Self {
        Self {
            database_url: database_url.into(),
            statement: statement.into(),
            slots: 1,
            db_connections: usize::MAX,
            chunk_timeout: Duration::from_secs(60),
            retries: 5,
            backoff: Duration::from_millis(50),
            constraint_violations_permanent: false,
            fence_column: None,
        }
    }

    /// How many chunks the run processes at once (its concurrency × parallel): the
    /// pool opens up to that many connections, as chunks need them.
    pub fn slots(mut self, n: usize) -> Self {
        self.slots = n;
        self
    }

    /// At most `n` connections, whatever the slots; chunks beyond wait for one.
    pub fn db_connections(mut self, n: usize) -> Self {
        self.db_connections = n;
        self
    }

    /// Each chunk's `statement_timeout` and `lock_timeout`: a chunk slower than this,
    /// or waiting this long for a lock, fails its attempt.
    pub fn chunk_timeout(mut self, timeout: Duration) -> Self {
        self.chunk_timeout = timeout;
        self
    }

    /// Retries inside one attempt of a serialization failure, a deadlock or a broken
    /// connection, the first after `backoff`, each next one after twice the last (up
    /// to 2 s).
    pub fn retries(mut self, retries: u32, backoff: Duration) -> Self {
        self.retries = retries;
        self.backoff = backoff;
        self
    }

    /// Whether a constraint violation (SQLSTATE class 23: a unique key, a foreign
    /// key, a check, NOT NULL) fails the partition at once rather than its attempt:
    /// rows no retry can fix.
    pub fn constraint_violations_permanent(mut self, on: bool) -> Self {
        self.constraint_violations_permanent = on;
        self
    }

    /// Fences the statement, an UPDATE, by `column` (a `bigint` of the updated table,
    /// named as stored, case included): each row it writes gets the chunk's fence,
    /// and rows whose `column` already holds a fence as high are left alone.
    pub fn fence_column(mut self, column: impl Into<String>) -> Self {
        self.fence_column = Some(column.into());
        self
    }

    /// How many connections the pool may hold.
    fn pool_size(&self) -> usize {
        self.slots.min(self.db_connections)
    }
}

/// A ready-made [`Handler`] that runs one SQL statement per chunk on PostgreSQL, over
/// a pool of warm connections (at most [`SqlConfig::slots`], capped by
/// [`SqlConfig::db_connections`], opened as chunks need them).
///
/// The statement binds the chunk: `$1` and `$2` are its first and last ID, `$3` its
/// partition, `$4` its attempt and `$5` its fence, all `bigint`; `:from`, `:to`,
/// `:pid`, `:attempt` and `:fence` are the same by name. It is prepared once per
/// connection, and once by [`SqlHandler::connect`] before anything is claimed, so a
/// statement the database refuses fails there, in the database's own words.
///
/// Each chunk is one transaction, bounded by `statement_timeout` and `lock_timeout`
/// ([`SqlConfig::chunk_timeout`], set on each of the pool's connections as it opens:
/// they are the handler's own), in two round trips: `BEGIN` with the statement, then
/// `COMMIT` once the statement has answered (so that a worker gone by then commits
/// nothing). What a retry of the same transaction can cure is
/// retried inside the attempt, with back-off, a bounded number of times: a
/// serialization failure (40001), a deadlock (40P01), a connection that broke or was
/// terminated (class 08, 57P01-57P03, or no answer at all). Anything else fails the
/// attempt, which the run retries with its own back-off; a constraint violation
/// (class 23) can be made to fail the partition at once
/// ([`SqlConfig::constraint_violations_permanent`]).
///
/// The design choice a reader might get wrong: **a connection is trusted only between
/// transactions**. One whose chunk ended any other way (an error, a timeout, the run
/// dropping the chunk's future at the end of its grace) is closed, never reused, so
/// the server rolls its transaction back and no chunk is ever half applied.
///
/// With a fence column ([`SqlConfig::fence_column`]) the statement, an UPDATE, is
/// rewritten to stamp each row it writes with the chunk's fence and to skip rows
/// already stamped with a fence as high: a worker whose lease was taken over writes
/// nothing over its successor's rows. The fence bound is the chunk's lease token,
/// [`Chunk::fence`].
///
/// On MySQL and MariaDB (a `mysql://` or `mariadb://` URL) the same holds in MySQL's
/// terms: `?` placeholders too (the first binds `:from`, and so on), the session's
/// `innodb_lock_wait_timeout` (and MariaDB's `max_statement_time`) bound a chunk, a
/// deadlock (1213), a lock wait timeout (1205) and a lost connection are retried, SQLSTATE
/// class 23 can be permanent, and the fence guards a single-table UPDATE.
///
/// Rows affected reach the run's statistics ([`Handler::process_counted`]: the run's
/// report, `/metrics`, the chunk and partition events), and the handler keeps its own
/// totals too ([`SqlHandler::stats`], with its retries). It is cheap to clone, and
/// clones share the pool and the counters.
///
/// ```no_run
/// # async fn backfill() -> Result<(), tranche_worker::Error> {
/// use tranche_worker::{Plan, Runner, SqlConfig, SqlHandler};
///
/// let (concurrency, parallel) = (4, 2);
/// let sql = SqlHandler::connect(
///     SqlConfig::new(
///         "host=127.0.0.1 user=app dbname=app",
///         "UPDATE users SET email_lower = lower(email) WHERE id BETWEEN :from AND :to",
///     )
///     .slots(concurrency * parallel)
///     .db_connections(8),
/// )
/// .await?; // A statement the database refuses fails here, before any claim.
/// let runner = Runner::embedded("backfill.state")
///     .concurrency(concurrency)
///     .parallel(parallel)
///     .chunk(2_000);
/// runner.plan(Plan::ids(1..=1_000_000).partition_size(50_000)).await?;
/// runner.run(sql.clone()).await?;
/// println!("{} rows updated", sql.stats().rows);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct SqlHandler {
    engine: Engine,
}

/// The database the handler speaks to.
#[derive(Clone)]
enum Engine {
    Postgres(Arc<Inner>),
    Mysql(Arc<mysql::Mysql>),
}

struct Inner {
    pool: Pool,
    /// How many of `$1..$5` the prepared statement takes.
    params: usize,
    retries: u32,
    backoff: Duration,
    constraint_violations_permanent: bool,
    stats: Counters,
}

/// What [`SqlStats`] reads, counted by either engine.
#[derive(Default)]
struct Counters {
    chunks: AtomicU64,
    rows: AtomicU64,
    retries: AtomicU64,
}

impl Counters {
    /// Counts `chunk`'s transaction, which committed having affected `rows`; `rows`.
    fn committed(&self, chunk: &Chunk, rows: u64) -> u64 {
        self.chunks.fetch_add(1, Ordering::Relaxed);
        self.rows.fetch_add(rows, Ordering::Relaxed);
        tracing::debug!(pid = chunk.pid, from = chunk.from, rows, "chunk committed");
        rows
    }
}

/// What a [`SqlHandler`] did so far, over all its clones.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SqlStats {
    /// Chunks whose transaction committed.
    pub chunks: u64,
    /// Rows the statement affected in them (its command tag's count).
    pub rows: u64,
    /// Transactions retried inside an attempt (a deadlock, a serialization failure,
    /// a broken connection).
    pub retries: u64,
}

impl SqlHandler {
    /// Opens the first connection and prepares the statement on it. A statement the
    /// database refuses, or a database that cannot be reached, is an [`Error`] here,
    /// on one line and in the database's words, before any chunk is claimed.
    pub async fn connect(config: SqlConfig) -> Result<Self, Error> {
        let size = config.pool_size();
        if size == 0 {
            return Err(Error::Config(
                "the SQL handler needs at least one slot and one connection".into(),
            ));
        }
        if config.chunk_timeout.is_zero() {
            return Err(Error::Config("the chunk timeout must be above 0".into()));
        }
        if mysql::is_mysql(&config.database_url) {
            let engine = mysql::Mysql::connect(&config, size).await?;
            return Ok(Self {
                engine: Engine::Mysql(Arc::new(engine)),
            });
        }
        let (mut pg, tls) = conninfo::postgres(&config.database_url).map_err(Error::Config)?;
        if pg.get_application_name().is_none() {
            pg.application_name("tranche");
        }
        let (mut statement, highest) = statement::positional(&config.statement);
        if highest > rewrite::FENCE {
            return Err(Error::Config(
                "the statement uses a placeholder beyond $5; a chunk binds $1 to $5 (:from, \
                 :to, :pid, :attempt, :fence)"
                    .into(),
            ));
        }
        let mut fenced = highest == rewrite::FENCE;
        if let Some(column) = &config.fence_column {
            statement = statement::fenced(&statement, column).map_err(Error::Config)?;
            fenced = true;
        }
        let params = if fenced {
            rewrite::FENCE
        } else {
            rewrite::FENCE - 1
        };
        let ms = config.chunk_timeout.as_millis().max(1);
        let opener = Opener {
            config: pg,
            tls,
            session: format!("SET statement_timeout = {ms}; SET lock_timeout = {ms}"),
            statement,
            types: vec![Type::INT8; params],
        };
        let first = opener.open().await.map_err(|e| {
            let message = one_line(&e);
            let prefix = if e.as_db_error().is_some() {
                "the database refused the statement"
            } else {
                "cannot connect to the database"
            };
            Error::Other(format!("{prefix}: {message}").into())
        })?;
        Ok(Self {
            engine: Engine::Postgres(Arc::new(Inner {
                pool: Pool::new(opener, size, first),
                params,
                retries: config.retries,
                backoff: config.backoff,
                constraint_violations_permanent: config.constraint_violations_permanent,
                stats: Counters::default(),
            })),
        })
    }

    /// What this handler (and its clones) did so far.
    pub fn stats(&self) -> SqlStats {
        let c = match &self.engine {
            Engine::Postgres(inner) => &inner.stats,
            Engine::Mysql(engine) => &engine.stats,
        };
        SqlStats {
            chunks: c.chunks.load(Ordering::Relaxed),
            rows: c.rows.load(Ordering::Relaxed),
            retries: c.retries.load(Ordering::Relaxed),
        }
    }
}

impl Inner {
    /// Runs `chunk`'s transaction, retrying what a retry can cure; the rows affected.
    async fn execute(&self, chunk: Chunk) -> Result<u64, HandlerError> {
        let inner = self;
        let values: [i64; 5] = [
            to_i64(chunk.from)?,
            to_i64(chunk.to)?,
            to_i64(chunk.pid)?,
            i64::from(chunk.attempt),
            to_i64(chunk.fence)?,
        ];
        let mut backoff = Backoff::new(inner.retries, inner.backoff);
        loop {
            match self.transaction(&values[..inner.params]).await {
                Ok(rows) => return Ok(inner.stats.committed(&chunk, rows)),
                Err(err) => {
                    let verdict = self.classify(&err);
                    backoff
                        .after(verdict, one_line(&err), &inner.stats, &chunk)
                        .await?;
                }
            }
        }
    }

    /// One try, in two round trips: `BEGIN` and the statement pipelined, then
    /// `COMMIT`. The session's timeouts, set when the connection opened, bound it.
    ///
    /// The COMMIT is sent only once the statement has answered, never with it: a
    /// worker that dies, freezes or drops the chunk (its lease lost) while the
    /// statement runs has sent no COMMIT, so its transaction is rolled back. (Sent
    /// alone in autocommit, or with the COMMIT in the same pipeline, the statement
    /// would commit on the server whatever became of the worker.) The connection goes
    /// back to the pool only when the transaction ended; on an error it is closed (the
    /// server rolls back).
    async fn transaction(&self, values: &[i64]) -> Result<u64, tokio_postgres::Error> {
        let lease = self.pool.get().await?;
        let conn = lease.conn();
        let params: Vec<&(dyn ToSql + Sync)> =
            values.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
        // Each request is sent when its future is first polled, and `try_join` polls
        // them in order: the two go out together, BEGIN first.
        let ((), rows) = futures_util::future::try_join(
            conn.client.batch_execute("BEGIN"),
            conn.client.execute(&conn.statement, &params),
        )
        .await?;
        conn.client.batch_execute("COMMIT").await?;
        lease.release();
        Ok(rows)
    }

    fn classify(&self, err: &tokio_postgres::Error) -> Verdict {
        let Some(code) = err.code() else {
            // No SQLSTATE: the connection broke, or never opened.
            return Verdict::Retry;
        };
        let class = &code.code()[..2];
        if code == &SqlState::T_R_SERIALIZATION_FAILURE
            || code == &SqlState::T_R_DEADLOCK_DETECTED
            || class == "08"
            || code == &SqlState::ADMIN_SHUTDOWN
            || code == &SqlState::CRASH_SHUTDOWN
            || code == &SqlState::CANNOT_CONNECT_NOW
        {
            Verdict::Retry
        } else if class == "23" && self.constraint_violations_permanent {
            Verdict::Permanent
        } else {
            Verdict::Fail
        }
    }
}

#[async_trait::async_trait]
impl Handler for SqlHandler {
    async fn process(&self, chunk: Chunk) -> Result<(), HandlerError> {
        match &self.engine {
            Engine::Postgres(inner) => inner.execute(chunk).await.map(drop),
            Engine::Mysql(engine) => engine.execute(&chunk).await.map(drop),
        }
    }

    /// The statement's command tag count reaches the run's statistics.
    async fn process_counted(&self, chunk: Chunk) -> Result<Option<u64>, HandlerError> {
        match &self.engine {
            Engine::Postgres(inner) => inner.execute(chunk).await.map(Some),
            Engine::Mysql(engine) => engine.execute(&chunk).await.map(Some),
        }
    }
}

/// What to do about a failed transaction.
enum Verdict {
    /// Run it again (within the retries).
    Retry,
    /// Fail the attempt.
    Fail,
    /// Fail the partition.
    Permanent,
}

/// One chunk's retries, the same for either engine: how many were made and the delay
/// before the next.
struct Backoff {
    /// The retries made so far.
    tries: u32,
    /// The most that may be made.
    retries: u32,
    /// The next one's delay (before jitter), doubled after each up to [`MAX_BACKOFF`].
    delay: Duration,
}

impl Backoff {
    fn new(retries: u32, first: Duration) -> Self {
        Self {
            tries: 0,
            retries,
            delay: first,
        }
    }

    /// What a failed try comes to: when `verdict` allows another within the retries,
    /// `Ok` once its delay has passed (the retry counted in `stats`); else the chunk's
    /// error, saying `message`.
    async fn after(
        &mut self,
        verdict: Verdict,
        message: String,
        stats: &Counters,
        chunk: &Chunk,
    ) -> Result<(), HandlerError> {
        match verdict {
            Verdict::Retry if self.tries < self.retries => {
                self.tries += 1;
                stats.retries.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    pid = chunk.pid,
                    from = chunk.from,
                    error = %message,
                    "chunk's transaction retried"
                );
                tokio::time::sleep(jitter(self.delay)).await;
                self.delay = (self.delay * 2).min(MAX_BACKOFF);
                Ok(())
            }
            Verdict::Permanent => Err(HandlerError::permanent(message)),
            Verdict::Retry | Verdict::Fail => Err(message.into()),
        }
    }
}

fn to_i64(v: u64) -> Result<i64, HandlerError> {
    i64::try_from(v).map_err(|_| HandlerError::permanent(format!("{v} is beyond bigint")))
}

/// `delay`, give or take a quarter, so that two chunks that deadlocked do not meet
/// again at the same instant.
fn jitter(delay: Duration) -> Duration {
    delay.mul_f64(rand::random_range(0.75..1.25))
}

/// A database error on one line: its message, its SQLSTATE and where in the
/// statement; anything else as it displays, line breaks folded.
fn one_line(err: &(dyn std::error::Error + 'static)) -> String {
    let db = err
        .downcast_ref::<tokio_postgres::Error>()
        .and_then(|e| e.as_db_error());
    let server = db.map(|db| {
        let at = match db.position() {
            Some(tokio_postgres::error::ErrorPosition::Original(n)) => {
                format!(" at character {n}")
            }
            _ => String::new(),
        };
        format!("{}{at} (SQLSTATE {})", db.message(), db.code().code())
    });
    folded(err, server)
}

/// `server` (the server's own words for `err`, when it sent some), or else `err` as it
/// displays with each of its causes that it does not already say; on one line.
fn folded(err: &(dyn std::error::Error + 'static), server: Option<String>) -> String {
    let text = server.unwrap_or_else(|| {
        let mut text = err.to_string();
        let mut source = err.source();
        while let Some(cause) = source {
            let cause_text = cause.to_string();
            if !text.contains(&cause_text) {
                text = format!("{text}: {cause_text}");
            }
            source = cause.source();
        }
        text
    });
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
