//! `SqlProbe` against a private PostgreSQL server: a query that errs, times out, or
//! answers with the wrong type or an oversized reason throttles (as an error); a
//! text or a true throttles with it as the reason; NULL, false and no row let work
//! run; a metric is read from any numeric type; the connection is opened again after
//! an error. Then `tranche run --throttle-sql` end to end: no chunk runs while the
//! query gives a reason or errs, and all of them run once it answers NULL; on
//! `--probe-database-url` when it is given.

use std::time::Duration;

use tokio_postgres::NoTls;
use tranche_worker::{ProbeOutcome, SqlProbe};

use crate::common;
use crate::support::TestPostgres;

fn probe(pg: &TestPostgres) -> SqlProbe {
    SqlProbe::new(pg.url(), Duration::from_secs(2))
}

fn is_error(outcome: &ProbeOutcome, words: &str) -> bool {
    matches!(outcome, ProbeOutcome::Error(e) if e.contains(words))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttle_query_throttles_with_its_text_and_fails_closed() {
    let pg = TestPostgres::start();
    let throttle = |q: &str| probe(&pg).throttle_when(q);
    let go = ProbeOutcome::Go;
    let says = |r: &str| ProbeOutcome::Throttle { reason: r.into() };
    for (query, expect) in [
        ("SELECT 'replica lag 9s'", says("replica lag 9s")),
        ("SELECT 'vacuum'::varchar WHERE true", says("vacuum")),
        ("SELECT true AS busy", says("busy is true")),
        ("SELECT NULL::text", go.clone()),
        ("SELECT ''", go.clone()),
        ("SELECT false", go.clone()),
        ("SELECT 'x' WHERE false", go.clone()),
    ] {
        assert_eq!(throttle(query).check().await, expect, "{query}");
    }
    for (query, words) in [
        (
            "SELECT reason FROM nowhere",
            "does not exist (SQLSTATE 42P01)",
        ),
        ("SELECT 1/0 = 1", "division by zero"),
        ("SELECT 42", "must be a boolean or a text"),
        ("SELECT repeat('x', 70000)", "over 65536 bytes"),
    ] {
        let outcome = throttle(query).check().await;
        assert!(is_error(&outcome, words), "{query}: {outcome:?}");
    }
    // A query slower than the probe's timeout is an error, and the next check opens a
    // fresh connection.
    let slow = SqlProbe::new(pg.url(), Duration::from_millis(300))
        .throttle_when("SELECT CASE WHEN pg_sleep(2) IS NULL THEN 'slow' END");
    assert!(is_error(&slow.check().await, "no answer within"));
    let after = probe(&pg).throttle_when("SELECT 'x'");
    assert_eq!(after.check().await, says("x"));
    // No server: an error.
    let gone = SqlProbe::new(
        "host=127.0.0.1 port=1 user=postgres dbname=postgres",
        Duration::from_secs(2),
    )
    .throttle_when("SELECT NULL");
    assert!(is_error(&gone.check().await, "cannot connect"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metric_query_gives_a_number_or_fails_closed() {
    let pg = TestPostgres::start();
    for (query, value) in [
        ("SELECT 9", 9.0),
        ("SELECT 1.5::numeric", 1.5),
        ("SELECT extract(epoch FROM interval '2 minutes')", 120.0),
    ] {
        let outcome = probe(&pg).metric(query).check().await;
        assert_eq!(outcome, ProbeOutcome::Value(value), "{query}");
    }
    for (query, words) in [
        ("SELECT NULL::int", "no number"),
        ("SELECT 'lots'", "not a number"),
    ] {
        let outcome = probe(&pg).metric(query).check().await;
        assert!(is_error(&outcome, words), "{query}: {outcome:?}");
    }
    // A throttle before the metric decides; a go lets the metric through.
    let both = probe(&pg)
        .throttle_when("SELECT NULL::text")
        .metric("SELECT 3");
    assert_eq!(both.check().await, ProbeOutcome::Value(3.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgresql_indicators_report_their_reading() {
    let pg = TestPostgres::start();
    let (db, connection) = tokio_postgres::connect(&pg.url(), NoTls).await.unwrap();
    tokio::spawn(connection);
    db.batch_execute("CREATE TABLE t (id bigint PRIMARY KEY)")
        .await
        .unwrap();
    // No replica, no vacuum, no old transaction: go, twice (the second reads a WAL rate).
    let quiet = probe(&pg)
        .pg_indicators("lag=1s,autovacuum,table=t,wal=1GB/s,xact=10m")
        .unwrap();
    assert_eq!(quiet.check().await, ProbeOutcome::Go);
    assert_eq!(quiet.check().await, ProbeOutcome::Go);
    // A transaction left open: `xact` throttles with its age.
    db.batch_execute("BEGIN; SELECT txid_current();")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let outcome = probe(&pg).pg_indicators("xact=1s").unwrap().check().await;
    assert!(
        matches!(&outcome, ProbeOutcome::Throttle { reason } if reason.starts_with("a transaction open for")),
        "{outcome:?}"
    );
    db.batch_execute("COMMIT").await.unwrap();
    // WAL written faster than 1 byte a second.
    let wal = probe(&pg).pg_indicators("wal=1B/s").unwrap();
    assert_eq!(wal.check().await, ProbeOutcome::Go);
    db.batch_execute("INSERT INTO t SELECT generate_series(1, 10000)")
        .await
        .unwrap();
    let outcome = wal.check().await;
    assert!(
        matches!(&outcome, ProbeOutcome::Throttle { reason } if reason.starts_with("WAL at")),
        "{outcome:?}"
    );
}

/// `tranche run --exec` (each chunk's start in a ledger) on a state file, with a SQL
/// probe `query` on a table `gate (reason text)` holding one row `reason`; the ledger
/// after 4 s, the run and its stderr file.
struct Gated {
    dir: std::path::PathBuf,
    run: std::process::Child,
}

impl Gated {
    fn start(pg: &TestPostgres, name: &str, probe: &[&str]) -> Self {
        Self::start_on(&["--database-url", &pg.url()], name, probe)
    }

    /// As [`Gated::start`], the databases given by `urls`.
    fn start_on(urls: &[&str], name: &str, probe: &[&str]) -> Self {
        let dir = common::scratch(name);
        let cmd = |args: &[&str]| {
            let mut c = common::tranche(&dir, args);
            c.env("TRANCHE_STATE", dir.join("state"));
            c
        };
        common::ok(cmd(&[
            "plan", "--min", "1", "--max", "4000", "--size", "1000",
        ]));
        let exec = format!("echo $TRANCHE_FROM >> {}", dir.join("ledger").display());
        let mut args = vec![
            "run",
            "--exec",
            &exec,
            "--json",
            "--chunk",
            "1000",
            "--throttle-interval",
            "200ms",
        ];
        args.extend_from_slice(urls);
        args.extend_from_slice(probe);
        let stderr = std::fs::File::create(dir.join("stderr")).unwrap();
        let run = cmd(&args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn run");
        Self { dir, run }
    }

    fn chunks(&self) -> usize {
        std::fs::read_to_string(self.dir.join("ledger"))
            .unwrap_or_default()
            .lines()
            .count()
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.join("stderr")).unwrap_or_default()
    }
}

impl Drop for Gated {
    fn drop(&mut self) {
        if matches!(self.run.try_wait(), Ok(None)) {
            let _ = self.run.kill();
            let _ = self.run.wait();
        }
    }
}

async fn gate(pg: &TestPostgres, reason: Option<&str>) -> tokio_postgres::Client {
    let (db, connection) = tokio_postgres::connect(&pg.url(), NoTls).await.unwrap();
    tokio::spawn(connection);
    db.batch_execute("CREATE TABLE IF NOT EXISTS gate (reason text)")
        .await
        .unwrap();
    db.execute("INSERT INTO gate VALUES ($1)", &[&reason])
        .await
        .unwrap();
    db
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_throttle_sql_holds_every_chunk_while_it_gives_a_reason() {
    let pg = TestPostgres::start();
    let db = gate(&pg, Some("replica lag 9s")).await;
    let mut job = Gated::start(
        &pg,
        "sql-probe-reason",
        &["--throttle-sql", "SELECT reason FROM gate"],
    );
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        job.chunks(),
        0,
        "a chunk ran while throttled: {}",
        job.stderr()
    );
    assert!(job.stderr().contains("replica lag 9s"), "{}", job.stderr());
    // NULL: go.
    db.execute("UPDATE gate SET reason = NULL", &[])
        .await
        .unwrap();
    let status = common::wait(&mut job.run, Duration::from_secs(60));
    assert!(status.success(), "{}", job.stderr());
    assert_eq!(job.chunks(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_throttle_sql_that_errs_holds_every_chunk() {
    let pg = TestPostgres::start();
    let _db = gate(&pg, None).await;
    let job = Gated::start(
        &pg,
        "sql-probe-error",
        &["--throttle-sql", "SELECT reason FROM nowhere"],
    );
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        job.chunks(),
        0,
        "a chunk ran under an erring probe: {}",
        job.stderr()
    );
    assert!(job.stderr().contains("does not exist"), "{}", job.stderr());
    // The same run with a probe that answers NULL does all the work.
    drop(job);
    let mut job = Gated::start(
        &pg,
        "sql-probe-null",
        &["--throttle-sql", "SELECT reason FROM gate"],
    );
    let status = common::wait(&mut job.run, Duration::from_secs(60));
    assert!(status.success(), "{}", job.stderr());
    assert_eq!(job.chunks(), 4);
}

/// `--probe-database-url` is where the probes run, ahead of `--database-url` (here a
/// server that refuses every connection, which would throttle for ever), and alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_probes_the_probe_database_url_first() {
    let pg = TestPostgres::start();
    let db = gate(&pg, Some("replica lag 9s")).await;
    let probe_url = pg.url();
    let nowhere = "host=127.0.0.1 port=1 user=postgres dbname=postgres";
    let mut job = Gated::start_on(
        &[
            "--database-url",
            nowhere,
            "--probe-database-url",
            &probe_url,
        ],
        "sql-probe-url",
        &["--throttle-sql", "SELECT reason FROM gate"],
    );
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        job.chunks(),
        0,
        "a chunk ran while throttled: {}",
        job.stderr()
    );
    assert!(job.stderr().contains("replica lag 9s"), "{}", job.stderr());
    db.execute("UPDATE gate SET reason = NULL", &[])
        .await
        .unwrap();
    let status = common::wait(&mut job.run, Duration::from_secs(60));
    assert!(status.success(), "{}", job.stderr());
    assert_eq!(job.chunks(), 4);
    // Neither: refused at parse time, nothing run.
    let dir = common::scratch("sql-probe-url-none");
    let out = common::output(common::tranche(
        &dir,
        &["run", "--exec", "true", "--throttle-sql", "SELECT 1"],
    ));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    // Alone, without --database-url: the same.
    let mut job = Gated::start_on(
        &["--probe-database-url", &probe_url],
        "sql-probe-url-alone",
        &["--throttle-sql", "SELECT reason FROM gate"],
    );
    let status = common::wait(&mut job.run, Duration::from_secs(60));
    assert!(status.success(), "{}", job.stderr());
    assert_eq!(job.chunks(), 4);
}
