//! [`SqlProbe`]: throttle probes that ask the database itself, on a connection of their
//! own (never one of the handler's): a query whose answer throttles
//! ([`SqlProbe::throttle_when`]), a query whose number `keep_below` holds under its
//! target ([`SqlProbe::metric`]), and PostgreSQL's ready-made indicators
//! ([`SqlProbe::pg_indicators`]: replication lag, autovacuum on the table, WAL rate,
//! the oldest open transaction).
//!
//! Like every probe it fails closed: a connection that cannot be opened, a query that
//! errs or outlives the probe's timeout, an answer of the wrong type, or a reason over
//! [`SqlProbe::MAX_REASON`] bytes is a [`ProbeOutcome::Error`], which throttles. The
//! connection is dropped after any error and opened again at the next check.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use mysql_async::prelude::Queryable;
use tokio::task::JoinHandle;
use tokio_postgres::types::Type;
use tranche_control::{Probe, ProbeOutcome};

use crate::error::Error;

/// What one query of a [`SqlProbe`] means.
#[derive(Debug, Clone)]
enum Check {
    /// A true, or a non-empty text, in the first column throttles with that text.
    Throttle(String),
    /// A number in the first column is the probe's metric.
    Metric(String),
    /// One of PostgreSQL's indicators.
    Pg(PgIndicator),
}

/// One of PostgreSQL's ready-made throttle indicators (`--throttle-pg`).
#[derive(Debug, Clone, PartialEq)]
enum PgIndicator {
    /// The longest write, flush or replay lag of any replica in `pg_stat_replication`.
    Lag(Duration),
    /// An autovacuum worker vacuuming this table (as `to_regclass` names it).
    Autovacuum(String),
    /// WAL written per second since the last check, above this many bytes.
    Wal(f64),
    /// The oldest open transaction of another session, older than this.
    Xact(Duration),
}

/// Throttle probes in SQL on a connection of their own, to PostgreSQL (a libpq string
/// or `postgresql://` URL) or MySQL/MariaDB (`mysql://`, `mariadb://`).
///
/// Each check runs the queries in the order they were added; the first that throttles
/// or errs decides, else the last metric is the outcome's value, else it is go.
///
/// ```no_run
/// # fn probe() -> Result<(), tranche_worker::Error> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use tranche_worker::{Runner, SqlProbe};
///
/// let probe = Arc::new(
///     SqlProbe::new("host=127.0.0.1 user=app dbname=app", Duration::from_secs(2))
///         .throttle_when("SELECT reason FROM maintenance WHERE active")
///         .pg_indicators("lag=5s,autovacuum,table=users,xact=10m")?,
/// );
/// let runner = Runner::embedded("backfill.state").throttle_probe(move || {
///     let probe = probe.clone();
///     async move { probe.check().await }
/// });
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct SqlProbe {
    url: String,
    timeout: Duration,
    checks: Vec<Check>,
    /// The open connection, kept between checks; `None` after an error.
    session: tokio::sync::Mutex<Option<Session>>,
    /// The WAL position (bytes) at the last check, and when.
    wal: std::sync::Mutex<Option<(f64, Instant)>>,
}

/// An open probe connection.
enum Session {
    Postgres {
        client: tokio_postgres::Client,
        /// Drives the socket: stopped with the session.
        driver: JoinHandle<()>,
    },
    Mysql(mysql_async::Conn),
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Session::Postgres { .. } => "Postgres",
            Session::Mysql(_) => "Mysql",
        })
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Session::Postgres { driver, .. } = self {
            driver.abort();
        }
    }
}

impl SqlProbe {
    /// The longest reason a probe may give; a longer one is an error (which throttles).
    pub const MAX_REASON: usize = 64 * 1024;

    /// A probe of the database at `database_url` with no query yet (always go until
    /// one is added); each check must answer within `timeout`, connecting included.
    pub fn new(database_url: impl Into<String>, timeout: Duration) -> Self {
        Self {
            url: database_url.into(),
            timeout,
            checks: Vec::new(),
            session: tokio::sync::Mutex::new(None),
            wal: std::sync::Mutex::new(None),
        }
    }

    /// Throttles when `query`'s first column in its first row is true (a boolean, or a
    /// non-zero number on MySQL) or a non-empty text, which is the reason given. No
    /// row, NULL, false, zero or an empty text is go.
    pub fn throttle_when(mut self, query: impl Into<String>) -> Self {
        self.checks.push(Check::Throttle(query.into()));
        self
    }

    /// `query`'s first column, a number, is the metric `keep_below` holds under its
    /// target (replica lag, say). No row or NULL is an error: write
    /// `coalesce(…, 0)` where none means zero.
    pub fn metric(mut self, query: impl Into<String>) -> Self {
        self.checks.push(Check::Metric(query.into()));
        self
    }

    /// PostgreSQL's indicators from `spec`, a comma-separated list: `lag=DURATION`
    /// (replication lag of any replica above it), `autovacuum` (an autovacuum worker on
    /// the table given by `table=NAME`), `wal=RATE` (WAL generated faster than RATE, as
    /// `64MB/s`, `512kB/s`, `1GiB/s`), `xact=DURATION` (another session's transaction
    /// open longer). Each throttles with its reading as the reason.
    pub fn pg_indicators(mut self, spec: &str) -> Result<Self, Error> {
        let bad = |m: String| Error::Config(format!("--throttle-pg: {m}"));
        let mut table = None;
        let mut autovacuum = false;
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (key, value) = match item.split_once('=') {
                Some((k, v)) => (k.trim(), Some(v.trim())),
                None => (item, None),
            };
            let duration = |v: Option<&str>| {
                let v = v.ok_or_else(|| bad(format!("`{key}` needs a duration, as {key}=5s")))?;
                crate::duration::parse(v).map_err(|e| bad(format!("{key}: {e}")))
            };
            match key {
                "lag" => self
                    .checks
                    .push(Check::Pg(PgIndicator::Lag(duration(value)?))),
                "xact" => self
                    .checks
                    .push(Check::Pg(PgIndicator::Xact(duration(value)?))),
                "wal" => {
                    let v = value.ok_or_else(|| bad("`wal` needs a rate, as wal=64MB/s".into()))?;
                    let rate = parse_byte_rate(v).map_err(bad)?;
                    self.checks.push(Check::Pg(PgIndicator::Wal(rate)));
                }
                "autovacuum" if value.is_none() => autovacuum = true,
                "table" => {
                    let name = value.filter(|v| !v.is_empty());
                    table = Some(name.ok_or_else(|| bad("`table` needs a name".into()))?);
                }
                _ => {
                    return Err(bad(format!(
                        "unknown indicator `{item}` (lag=5s, autovacuum, wal=64MB/s, \
                         xact=10m, table=NAME)"
                    )));
                }
            }
        }
        if autovacuum {
            let table = table.ok_or_else(|| {
                bad("`autovacuum` needs the table being updated: add table=NAME".into())
            })?;
            self.checks
                .push(Check::Pg(PgIndicator::Autovacuum(table.to_string())));
        }
        Ok(self)
    }

    /// Runs every query on the open session (opened first if need be).
    async fn run(&self) -> Result<ProbeOutcome, String> {
        let mut session = self.session.lock().await;
        if session.is_none() {
            *session = Some(self.open().await?);
        }
        let s = session.as_mut().expect("just opened");
        let mut value = None;
        for check in &self.checks {
            match self.check_one(s, check).await {
                Ok(Answer::Go) => {}
                Ok(Answer::Value(v)) => value = Some(v),
                Ok(Answer::Throttle(reason)) => {
                    return Ok(ProbeOutcome::Throttle { reason });
                }
                Err(err) => {
                    // A connection that erred is not trusted again.
                    *session = None;
                    return Err(err);
                }
            }
        }
        Ok(value.map_or(ProbeOutcome::Go, ProbeOutcome::Value))
    }

    async fn open(&self) -> Result<Session, String> {
        if super::mysql::is_mysql(&self.url) {
            let opts = super::mysql::opts(&self.url)?;
            let conn = mysql_async::Conn::new(opts)
                .await
                .map_err(|e| format!("cannot connect to the database: {e}"))?;
            return Ok(Session::Mysql(conn));
        }
        let (mut config, tls) = super::conninfo::postgres(&self.url)?;
        if config.get_application_name().is_none() {
            config.application_name("tranche probe");
        }
        let (client, driver) = tls
            .connect(&config)
            .await
            .map_err(|e| format!("cannot connect to the database: {}", super::one_line(&e)))?;
        Ok(Session::Postgres { client, driver })
    }

    async fn check_one(&self, session: &mut Session, check: &Check) -> Result<Answer, String> {
        match (session, check) {
            (Session::Postgres { client, .. }, Check::Throttle(q)) => pg_throttle(client, q).await,
            (Session::Postgres { client, .. }, Check::Metric(q)) => {
                pg_number(client, q).await.map(Answer::Value)
            }
            (Session::Postgres { client, .. }, Check::Pg(indicator)) => {
                self.pg_indicator(client, indicator).await
            }
            (Session::Mysql(conn), Check::Throttle(q)) => my_throttle(conn, q).await,
            (Session::Mysql(conn), Check::Metric(q)) => my_number(conn, q).await.map(Answer::Value),
            (Session::Mysql(_), Check::Pg(_)) => {
                Err("--throttle-pg's indicators need a PostgreSQL database".into())
            }
        }
    }

    async fn pg_indicator(
        &self,
        client: &tokio_postgres::Client,
        indicator: &PgIndicator,
    ) -> Result<Answer, String> {
        Ok(match indicator {
            PgIndicator::Lag(limit) => {
                let lag = pg_number(
                    client,
                    "SELECT coalesce(extract(epoch FROM max(greatest(write_lag, flush_lag, \
                     replay_lag))), 0)::float8 FROM pg_stat_replication",
                )
                .await?;
                over(lag, limit.as_secs_f64(), |v| {
                    format!("replication lag {v:.1}s (above {limit:?})")
                })
            }
            PgIndicator::Xact(limit) => {
                let age = pg_number(
                    client,
                    "SELECT coalesce(extract(epoch FROM max(now() - xact_start)), 0)::float8 \
                     FROM pg_stat_activity WHERE xact_start IS NOT NULL \
                     AND pid <> pg_backend_pid() AND backend_type = 'client backend'",
                )
                .await?;
                over(age, limit.as_secs_f64(), |v| {
                    format!("a transaction open for {v:.0}s (above {limit:?})")
                })
            }
            PgIndicator::Autovacuum(table) => {
                let rows = client
                    .query(
                        "SELECT count(*) FROM pg_stat_progress_vacuum v \
                         JOIN pg_stat_activity a USING (pid) \
                         WHERE v.relid = to_regclass($1) AND a.backend_type = 'autovacuum worker'",
                        &[table],
                    )
                    .await
                    .map_err(|e| pg_line(&e))?;
                let n: i64 = rows.first().map_or(0, |r| r.get(0));
                if n > 0 {
                    Answer::Throttle(format!("autovacuum running on {table}"))
                } else {
                    Answer::Go
                }
            }
            PgIndicator::Wal(limit) => {
                // Where WAL is inserted, not where it is written: with asynchronous
                // commits the written position trails by up to the WAL writer's delay.
                let lsn = pg_number(
                    client,
                    "SELECT (pg_current_wal_insert_lsn() - '0/0')::float8",
                )
                .await?;
                let now = Instant::now();
                let last = self.wal.lock().expect("wal lock").replace((lsn, now));
                match last {
                    Some((before, at)) if now > at => {
                        let rate = (lsn - before).max(0.0) / (now - at).as_secs_f64();
                        over(rate, *limit, |v| {
                            format!("WAL at {:.1} MB/s (above {:.1} MB/s)", v / 1e6, limit / 1e6)
                        })
                    }
                    // The first reading has nothing to compare with.
                    _ => Answer::Go,
                }
            }
        })
    }
}

/// What one query found.
enum Answer {
    Go,
    Throttle(String),
    Value(f64),
}

fn over(value: f64, limit: f64, reason: impl Fn(f64) -> String) -> Answer {
    if value > limit {
        Answer::Throttle(reason(value))
    } else {
        Answer::Go
    }
}

/// A reason as given, refused when over [`SqlProbe::MAX_REASON`] bytes.
fn reason(text: String) -> Result<Answer, String> {
    if text.len() > SqlProbe::MAX_REASON {
        return Err(format!(
            "the probe's reason is over {} bytes",
            SqlProbe::MAX_REASON
        ));
    }
    let text = text.trim();
    Ok(if text.is_empty() {
        Answer::Go
    } else {
        Answer::Throttle(text.to_string())
    })
}

async fn pg_throttle(client: &tokio_postgres::Client, query: &str) -> Result<Answer, String> {
    let rows = client.query(query, &[]).await.map_err(|e| pg_line(&e))?;
    let Some(row) = rows.first() else {
        return Ok(Answer::Go);
    };
    let column = row.columns().first().ok_or("the query returns no column")?;
    match *column.type_() {
        Type::BOOL => Ok(match row.try_get::<_, Option<bool>>(0) {
            Ok(Some(true)) => Answer::Throttle(format!("{} is true", column.name())),
            Ok(_) => Answer::Go,
            Err(e) => return Err(pg_line(&e)),
        }),
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => {
            match row
                .try_get::<_, Option<String>>(0)
                .map_err(|e| pg_line(&e))?
            {
                Some(text) => reason(text),
                None => Ok(Answer::Go),
            }
        }
        ref other => Err(format!(
            "the probe's first column is {other}: it must be a boolean or a text"
        )),
    }
}

/// The first column of the first row, as a number (any numeric type: the query is
/// sent as simple text).
async fn pg_number(client: &tokio_postgres::Client, query: &str) -> Result<f64, String> {
    let messages = client.simple_query(query).await.map_err(|e| pg_line(&e))?;
    let row = messages.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(row) => Some(row),
        _ => None,
    });
    let text = row
        .and_then(|r| r.try_get(0).ok().flatten())
        .ok_or("the query returned no number (no row, or NULL)")?;
    number(text)
}

fn number(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v),
        _ => Err(format!("the query returned `{}`, not a number", cut(text))),
    }
}

/// At most 200 bytes of `text`, for an error message.
fn cut(text: &str) -> &str {
    let mut end = text.len().min(200);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

async fn my_first(conn: &mut mysql_async::Conn, query: &str) -> Result<mysql_async::Value, String> {
    let row: Option<mysql_async::Row> = conn.query_first(query).await.map_err(|e| my_line(&e))?;
    Ok(row
        .and_then(|mut r| r.take::<mysql_async::Value, _>(0))
        .unwrap_or(mysql_async::Value::NULL))
}

async fn my_throttle(conn: &mut mysql_async::Conn, query: &str) -> Result<Answer, String> {
    use mysql_async::Value as V;
    match my_first(conn, query).await? {
        V::NULL | V::Int(0) | V::UInt(0) => Ok(Answer::Go),
        V::Int(n) => Ok(Answer::Throttle(format!("the probe returned {n}"))),
        V::UInt(n) => Ok(Answer::Throttle(format!("the probe returned {n}"))),
        V::Bytes(b) => reason(String::from_utf8_lossy(&b).into_owned()),
        other => Err(format!(
            "the probe's first column is {other:?}: it must be a number or a text"
        )),
    }
}

/// The columns that hold a replica's lag in `SHOW REPLICA STATUS` (MySQL 8.0.22 on)
/// and `SHOW SLAVE STATUS` (older MySQL, and MariaDB under either name).
const LAG_COLUMNS: [&str; 2] = ["Seconds_Behind_Source", "Seconds_Behind_Master"];

/// The metric of a MySQL query: the first column of its first row, or, when the row
/// has a replica's lag column ([`LAG_COLUMNS`]: `SHOW REPLICA STATUS` as it stands),
/// that one. A lag of NULL (replication stopped or broken) is an error, which throttles.
async fn my_number(conn: &mut mysql_async::Conn, query: &str) -> Result<f64, String> {
    use mysql_async::Value as V;
    let row: Option<mysql_async::Row> = conn.query_first(query).await.map_err(|e| my_line(&e))?;
    let Some(mut row) = row else {
        return Err(
            "the query returned no number (no row: a server that is no replica has no \
             replica status)"
                .into(),
        );
    };
    let lag = row.columns_ref().iter().position(|c| {
        LAG_COLUMNS
            .iter()
            .any(|name| c.name_str().eq_ignore_ascii_case(name))
    });
    let value = row
        .take::<mysql_async::Value, _>(lag.unwrap_or(0))
        .unwrap_or(V::NULL);
    if let (Some(at), V::NULL) = (lag, &value) {
        let name = row.columns_ref()[at].name_str().into_owned();
        return Err(format!(
            "{name} is NULL: the replica is not replicating (a replication thread stopped \
             or failed)"
        ));
    }
    match value {
        V::Int(n) => Ok(n as f64),
        V::UInt(n) => Ok(n as f64),
        V::Float(v) => Ok(f64::from(v)),
        V::Double(v) => Ok(v),
        V::Bytes(b) => number(&String::from_utf8_lossy(&b)),
        V::NULL => Err("the query returned no number (no row, or NULL)".into()),
        other => Err(format!("the query returned {other:?}, not a number")),
    }
}

fn pg_line(err: &tokio_postgres::Error) -> String {
    let text = match err.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => err.to_string(),
    };
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn my_line(err: &mysql_async::Error) -> String {
    err.to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// `64MB/s`, `512kB/s`, `1GiB/s`, `1000000` (bytes per second).
fn parse_byte_rate(text: &str) -> Result<f64, String> {
    let s = text.trim();
    let s = s.strip_suffix("/s").unwrap_or(s);
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a rate (try 64MB/s)"))?;
    let scale = match unit.trim() {
        "" | "B" => 1.0,
        "kB" | "KB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        _ => {
            return Err(format!(
                "`{text}` has an unknown unit (B, kB, MB, GB, KiB, MiB, GiB)"
            ));
        }
    };
    let rate = value * scale;
    if !rate.is_finite() || rate <= 0.0 {
        return Err(format!("`{text}` must be above 0"));
    }
    Ok(rate)
}

impl SqlProbe {
    /// Runs every query once, within the probe's timeout: what they found.
    pub async fn check(&self) -> ProbeOutcome {
        match tokio::time::timeout(self.timeout, self.run()).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(err)) => ProbeOutcome::Error(err),
            Err(_) => {
                // The session may be mid-query: drop it.
                if let Ok(mut session) = self.session.try_lock() {
                    *session = None;
                }
                ProbeOutcome::Error(format!("no answer within {:?}", self.timeout))
            }
        }
    }
}

#[async_trait]
impl Probe for SqlProbe {
    async fn check(&self) -> ProbeOutcome {
        SqlProbe::check(self).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indicators_parse_and_refuse_what_they_cannot_mean() {
        let p = SqlProbe::new("host=x", Duration::from_secs(1))
            .pg_indicators("lag=5s, wal=64MB/s,xact=10m,autovacuum,table=public.t")
            .unwrap();
        let got: Vec<_> = p
            .checks
            .iter()
            .map(|c| match c {
                Check::Pg(i) => i.clone(),
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(
            got,
            [
                PgIndicator::Lag(Duration::from_secs(5)),
                PgIndicator::Wal(64e6),
                PgIndicator::Xact(Duration::from_secs(600)),
                PgIndicator::Autovacuum("public.t".into()),
            ]
        );
        for bad in [
            "autovacuum",
            "lag",
            "wal=fast",
            "wal=0MB/s",
            "bloat=1",
            "table=",
        ] {
            assert!(
                SqlProbe::new("host=x", Duration::from_secs(1))
                    .pg_indicators(bad)
                    .is_err(),
                "{bad}"
            );
        }
        assert_eq!(parse_byte_rate("1GiB/s"), Ok(1024.0 * 1024.0 * 1024.0));
        assert_eq!(parse_byte_rate("512kB/s"), Ok(512e3));
    }
}
