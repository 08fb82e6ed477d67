//! `SqlHandler` and `SqlProbe` over TLS to a private PostgreSQL server whose
//! certificate a throwaway CA signed (testkit's `TestPostgres::start_tls`), in libpq's
//! words: `sslmode=verify-full` with `sslrootcert=CA` encrypts every chunk's session
//! and the probe's, in both forms of the connection string; `verify-ca` does not check
//! the name, `verify-full` and `require` do; and TLS is never given up: a CA the roots
//! lack, a server without TLS, a name the certificate lacks, a CA without a TLS mode
//! and an unreadable CA are each refused at connect, in one line.

use std::time::Duration;

use tokio_postgres::{Client, NoTls};
use tranche_worker::{Chunk, Handler, ProbeOutcome, SqlConfig, SqlHandler, SqlProbe};

use crate::support::TestPostgres;

/// Whether the session is TLS, as the server sees it.
const SSL: &str = "(SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid())";

/// A table `t` of `rows` rows, `s` (the session's TLS) NULL.
async fn setup(pg: &TestPostgres, rows: u64) -> Client {
    let (db, connection) = tokio_postgres::connect(&pg.url(), NoTls).await.unwrap();
    tokio::spawn(connection);
    db.batch_execute(&format!(
        "CREATE TABLE t (id bigint PRIMARY KEY, s boolean);
         INSERT INTO t (id) SELECT generate_series(1, {rows});"
    ))
    .await
    .unwrap();
    db
}

fn chunk(pid: u64, from: u64, to: u64) -> Chunk {
    Chunk {
        pid,
        index: 0,
        from,
        to,
        attempt: 1,
        fence: 1,
    }
}

/// `pg`'s connection string in libpq's `key=value` form, for `host` (at 127.0.0.1,
/// whatever the name) and the given TLS words.
fn keywords(pg: &TestPostgres, host: &str, tls: &str) -> String {
    format!(
        "host={host} hostaddr=127.0.0.1 port={} user=postgres dbname=postgres {tls}",
        pg.port()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_tls_encrypts_the_handlers_and_the_probes_sessions_and_is_never_given_up() {
    let pg = TestPostgres::start_tls();
    let ca = pg.ca();
    let ca = ca.to_str().unwrap();
    let db = setup(&pg, 14).await;
    // Each chunk writes its own session's TLS into the rows it updates.
    let statement = format!("UPDATE t SET s = {SSL} WHERE id BETWEEN $1 AND $2");
    let url = format!(
        "postgres://postgres@127.0.0.1:{}/postgres?sslmode=verify-full&sslrootcert={ca}",
        pg.port()
    );
    let handler = SqlHandler::connect(SqlConfig::new(&url, &statement).slots(2))
        .await
        .unwrap();
    let (a, b) = tokio::join!(
        handler.process(chunk(1, 1, 4)),
        handler.process(chunk(2, 5, 8))
    );
    a.unwrap();
    b.unwrap();
    // The key=value form; `verify-ca` takes a name the certificate lacks (the address
    // is still 127.0.0.1); `require` verifies, and with the CA connects.
    for (ids, url) in [
        (
            (9, 9),
            keywords(
                &pg,
                "127.0.0.1",
                &format!("sslmode=verify-full sslrootcert='{ca}'"),
            ),
        ),
        (
            (10, 10),
            keywords(
                &pg,
                "db.invalid",
                &format!("sslmode=verify-ca sslrootcert={ca}"),
            ),
        ),
        (
            (11, 12),
            keywords(
                &pg,
                "localhost",
                &format!("sslmode=require sslrootcert={ca}"),
            ),
        ),
    ] {
        SqlHandler::connect(SqlConfig::new(&url, &statement))
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"))
            .process(chunk(3, ids.0, ids.1))
            .await
            .unwrap();
    }
    // A plain session's chunk, for contrast: the column tells the two apart.
    SqlHandler::connect(SqlConfig::new(pg.url(), &statement))
        .await
        .unwrap()
        .process(chunk(4, 13, 14))
        .await
        .unwrap();
    let rows: Vec<(i64, Option<bool>)> = db
        .query("SELECT id, s FROM t ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(rows.len(), 14);
    for (id, s) in &rows {
        assert_eq!(*s, Some(*id <= 12), "row {id}: {rows:?}");
    }
    // The probe's own session, on the same URL, is encrypted too.
    let version = "SELECT version FROM pg_stat_ssl WHERE pid = pg_backend_pid() AND ssl";
    let probe = SqlProbe::new(&url, Duration::from_secs(5)).throttle_when(version);
    assert!(
        matches!(probe.check().await, ProbeOutcome::Throttle { reason } if reason.starts_with("TLSv1.")),
        "the probe's session is not TLS"
    );

    // Never given up: each is refused at connect, before any chunk, in one line.
    let refused = |url: String| {
        let statement = statement.clone();
        async move {
            let text = SqlHandler::connect(SqlConfig::new(url.clone(), statement))
                .await
                .err()
                .unwrap_or_else(|| panic!("{url} connected"))
                .to_string();
            assert!(!text.contains('\n'), "{url}: {text}");
            text
        }
    };
    let without = TestPostgres::start();
    for (url, words) in [
        // The system's roots do not vouch for the CA, under any TLS mode.
        (
            keywords(&pg, "127.0.0.1", "sslmode=verify-full"),
            "invalid peer certificate: UnknownIssuer",
        ),
        (
            keywords(&pg, "127.0.0.1", "sslmode=require"),
            "invalid peer certificate: UnknownIssuer",
        ),
        (
            keywords(&pg, "db.invalid", "sslmode=verify-ca"),
            "invalid peer certificate: UnknownIssuer",
        ),
        // A name the certificate lacks, where `verify-ca` took it.
        (
            keywords(
                &pg,
                "db.invalid",
                &format!("sslmode=verify-full sslrootcert={ca}"),
            ),
            "invalid peer certificate: certificate not valid for name \"db.invalid\"",
        ),
        (
            format!(
                "postgres://postgres@db.invalid:{}/postgres?hostaddr=127.0.0.1\
                 &sslmode=require&sslrootcert={ca}",
                pg.port()
            ),
            "certificate not valid for name \"db.invalid\"",
        ),
        // A server without TLS.
        (
            keywords(
                &without,
                "127.0.0.1",
                &format!("sslmode=verify-full sslrootcert={ca}"),
            ),
            "server does not support TLS",
        ),
        // A CA without a TLS mode, or with a plain one.
        (
            format!("{}?sslrootcert={ca}", url.split('?').next().unwrap()),
            "sslrootcert is given but TLS is not: add sslmode=verify-full",
        ),
        (
            keywords(
                &pg,
                "127.0.0.1",
                &format!("sslmode=prefer sslrootcert={ca}"),
            ),
            "sslrootcert is given but TLS is not",
        ),
        // A CA that cannot be read, or is no certificate.
        (
            keywords(
                &pg,
                "127.0.0.1",
                "sslmode=verify-full sslrootcert=/nonexistent/ca.pem",
            ),
            "sslrootcert=/nonexistent/ca.pem: No such file or directory",
        ),
        (
            keywords(
                &pg,
                "127.0.0.1",
                &format!(
                    "sslmode=verify-full sslrootcert={}",
                    pg.dir().join("server.key").display()
                ),
            ),
            "server.key: no PEM certificate in it",
        ),
        // libpq's `allow`, plain first.
        (
            keywords(&pg, "127.0.0.1", "sslmode=allow"),
            "sslmode=allow: expected disable, prefer, require, verify-ca or verify-full",
        ),
    ] {
        let text = refused(url.clone()).await;
        assert!(text.contains(words), "{url}: {text}");
    }
    // The probe fails closed on a server without TLS, as the handler does.
    let probe = SqlProbe::new(
        keywords(
            &without,
            "127.0.0.1",
            &format!("sslmode=verify-full sslrootcert={ca}"),
        ),
        Duration::from_secs(5),
    )
    .throttle_when(version);
    let outcome = probe.check().await;
    assert!(
        matches!(&outcome, ProbeOutcome::Error(e) if e.contains("server does not support TLS")),
        "a probe without TLS answered: {outcome:?}"
    );
}
