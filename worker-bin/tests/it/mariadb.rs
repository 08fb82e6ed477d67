//! `SqlHandler` on a private MariaDB server (testkit's `TestMariadb`: Debian's
//! mariadb-server in a directory and on a port of its own): chunks update exactly their
//! range, with named or `?` placeholders; a deadlock between two chunks is retried and both complete; a
//! statement the server refuses fails at connect in its words; a fence column keeps
//! a stale chunk off its successor's rows; TLS (`ssl-mode`, `ssl-ca`) encrypts the
//! handler's and the probe's sessions and is never given up; `--keep-below-sql 'SHOW
//! REPLICA STATUS'` reads a real replica's lag, and fails closed when it has none.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use tranche_worker::{Chunk, Handler, ProbeOutcome, SqlConfig, SqlHandler, SqlProbe};

use crate::support::TestMariadb;

/// A table `t` of `rows` rows, `v` 0, and an unused `f` for fences.
async fn setup(db: &TestMariadb, rows: u64) -> mysql_async::Conn {
    let mut conn = mysql_async::Conn::from_url(db.url()).await.unwrap();
    conn.query_drop(
        "CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT NOT NULL DEFAULT 0, f BIGINT) \
         ENGINE=InnoDB",
    )
    .await
    .unwrap();
    conn.query_drop(format!(
        "INSERT INTO t (id) SELECT seq FROM seq_1_to_{rows}"
    ))
    .await
    .unwrap();
    conn
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

/// The IDs whose `v` is not 0, and the sum of `v` over them.
async fn touched(conn: &mut mysql_async::Conn) -> (Vec<i64>, i64) {
    let rows: Vec<(i64, i64)> = conn
        .query("SELECT id, v FROM t WHERE v <> 0 ORDER BY id")
        .await
        .unwrap();
    let sum = rows.iter().map(|r| r.1).sum();
    (rows.into_iter().map(|r| r.0).collect(), sum)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_updates_exactly_its_range_with_either_placeholder_style() {
    let my = TestMariadb::start();
    let mut db = setup(&my, 100).await;
    for (n, statement) in [
        "UPDATE t SET v = v + :attempt WHERE id BETWEEN :from AND :to",
        "UPDATE t SET v = v + 1 WHERE id BETWEEN ? AND ?",
    ]
    .into_iter()
    .enumerate()
    {
        let handler = SqlHandler::connect(SqlConfig::new(my.url(), statement).slots(4))
            .await
            .unwrap();
        let (a, b) = tokio::join!(
            handler.process(chunk(1, 11, 20)),
            handler.process(chunk(2, 41, 45))
        );
        a.unwrap();
        b.unwrap();
        let stats = handler.stats();
        assert_eq!((stats.chunks, stats.rows), (2, 15), "{statement}");
        let (ids, sum) = touched(&mut db).await;
        let expect: Vec<i64> = (11..=20).chain(41..=45).collect();
        assert_eq!(ids, expect, "{statement}");
        assert_eq!(sum, 15 * (n as i64 + 1), "{statement}");
    }
    // The URL's other spelling reaches the same server.
    let url = my.url().replacen("mysql://", "mariadb://", 1);
    let handler = SqlHandler::connect(SqlConfig::new(url, "UPDATE t SET v = 0 WHERE id = :pid"))
        .await
        .unwrap();
    handler.process(chunk(11, 11, 11)).await.unwrap();
    assert_eq!(touched(&mut db).await.0.first(), Some(&12));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_statement_fails_at_connect_in_the_servers_words() {
    let my = TestMariadb::start();
    let _db = setup(&my, 1).await;
    let err = SqlHandler::connect(SqlConfig::new(
        my.url(),
        "UPDATE t SET v = WHERE id = :from",
    ))
    .await
    .err()
    .expect("a syntax error is refused at connect");
    let text = err.to_string();
    assert!(
        text.starts_with("the database refused the statement: ")
            && text.contains("SQL syntax")
            && text.contains("error 1064")
            && !text.contains('\n'),
        "{text}"
    );
    let err = SqlHandler::connect(SqlConfig::new(my.url(), "UPDATE nope SET v = 1"))
        .await
        .err()
        .expect("a missing table is refused at connect");
    assert!(err.to_string().contains("doesn't exist"), "{err}");
    let err = SqlHandler::connect(SqlConfig::new(
        format!("mysql://root@127.0.0.1:{}/test", free_port()),
        "UPDATE t SET v = 1",
    ))
    .await
    .err()
    .expect("no server is refused at connect");
    assert!(
        err.to_string()
            .starts_with("cannot connect to the database: "),
        "{err}"
    );
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadlock_between_two_chunks_is_retried_and_both_complete() {
    let my = TestMariadb::start();
    let mut db = setup(&my, 4).await;
    // Chunk 1..=2 locks row 1, then row 3; chunk 3..=4 locks row 3, then row 1.
    db.query_drop(
        "CREATE PROCEDURE cross_update(a BIGINT)
         BEGIN
           UPDATE t SET v = v + 1 WHERE id = a;
           DO SLEEP(0.3);
           UPDATE t SET v = v + 1 WHERE id = IF(a = 1, 3, 1);
         END",
    )
    .await
    .unwrap();
    let handler = SqlHandler::connect(
        SqlConfig::new(my.url(), "CALL cross_update(:from)")
            .slots(2)
            .retries(5, Duration::from_millis(50)),
    )
    .await
    .unwrap();
    let (a, b) = tokio::join!(
        handler.process(chunk(1, 1, 2)),
        handler.process(chunk(2, 3, 4))
    );
    a.unwrap();
    b.unwrap();
    let stats = handler.stats();
    assert_eq!(stats.chunks, 2);
    assert!(stats.retries >= 1, "no deadlock was retried: {stats:?}");
    // Each chunk applied exactly once: rows 1 and 3 got one from each.
    assert_eq!(touched(&mut db).await, (vec![1, 3], 4));
    // Without retries the same deadlock fails the attempt, with the server's words.
    db.query_drop("UPDATE t SET v = 0").await.unwrap();
    let handler = SqlHandler::connect(
        SqlConfig::new(my.url(), "CALL cross_update(:from)")
            .slots(2)
            .retries(0, Duration::from_millis(50)),
    )
    .await
    .unwrap();
    let (a, b) = tokio::join!(
        handler.process(chunk(1, 1, 2)),
        handler.process(chunk(2, 3, 4))
    );
    let failed = [a, b]
        .into_iter()
        .filter_map(Result::err)
        .collect::<Vec<_>>();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(format!("{:?}", failed[0]).contains("1213"), "{failed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_column_keeps_a_stale_chunk_off_its_successors_rows() {
    let my = TestMariadb::start();
    let mut db = setup(&my, 10).await;
    let handler = SqlHandler::connect(
        SqlConfig::new(
            my.url(),
            "UPDATE t SET v = v + 1 WHERE id BETWEEN :from AND :to",
        )
        .fence_column("f"),
    )
    .await
    .unwrap();
    // The successor (fence 2) wrote rows 1..=5.
    let mut successor = chunk(1, 1, 5);
    successor.fence = 2;
    handler.process(successor).await.unwrap();
    // The stale worker (fence 1) writes none of them, and the same fence twice once.
    handler.process(chunk(1, 1, 5)).await.unwrap();
    handler.process(successor).await.unwrap();
    assert_eq!(touched(&mut db).await, ((1..=5).collect(), 5));
    let fences: Vec<Option<i64>> = db.query("SELECT f FROM t ORDER BY id").await.unwrap();
    assert_eq!(
        fences[..6],
        [Some(2), Some(2), Some(2), Some(2), Some(2), None]
    );
}

/// The session's TLS cipher, as the server sees it: empty on a plain connection.
const CIPHER: &str = "SELECT VARIABLE_VALUE FROM information_schema.SESSION_STATUS \
     WHERE VARIABLE_NAME = 'Ssl_cipher'";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_encrypts_the_handlers_and_the_probes_sessions_and_is_never_given_up() {
    let my = TestMariadb::start_tls();
    let mut db = setup(&my, 20).await;
    db.query_drop("ALTER TABLE t ADD c VARCHAR(200)")
        .await
        .unwrap();
    // Each chunk writes its own session's cipher into the rows it updates.
    let statement = format!("UPDATE t SET v = v + 1, c = ({CIPHER}) WHERE id BETWEEN ? AND ?");
    let tls = format!(
        "{}?ssl-mode=REQUIRED&ssl-ca={}",
        my.url(),
        my.ca().display()
    );
    let handler = SqlHandler::connect(SqlConfig::new(&tls, &statement).slots(2))
        .await
        .unwrap();
    let (a, b) = tokio::join!(
        handler.process(chunk(1, 1, 5)),
        handler.process(chunk(2, 6, 10))
    );
    a.unwrap();
    b.unwrap();
    // A plain session's chunk, for contrast: the column tells the two apart.
    let plain = SqlHandler::connect(SqlConfig::new(my.url(), &statement))
        .await
        .unwrap();
    plain.process(chunk(3, 11, 12)).await.unwrap();
    let ciphers: Vec<(i64, String)> = db
        .query("SELECT id, c FROM t WHERE c IS NOT NULL ORDER BY id")
        .await
        .unwrap();
    assert_eq!(ciphers.len(), 12, "{ciphers:?}");
    let cipher = ciphers[0].1.clone();
    assert!(!cipher.is_empty(), "{ciphers:?}");
    for (id, c) in &ciphers {
        let expect = if *id <= 10 { cipher.as_str() } else { "" };
        assert_eq!(c, expect, "row {id}: {ciphers:?}");
    }
    // The probe's own session, on the same URL, is encrypted too.
    let probe = SqlProbe::new(&tls, Duration::from_secs(5)).throttle_when(CIPHER);
    assert_eq!(
        probe.check().await,
        ProbeOutcome::Throttle { reason: cipher }
    );
    // VERIFY_CA spells it too; lower case is the same.
    let verify_ca = format!(
        "{}?ssl-mode=verify_ca&ssl-ca={}",
        my.url(),
        my.ca().display()
    );
    SqlHandler::connect(SqlConfig::new(verify_ca, &statement))
        .await
        .unwrap();

    // Never given up: a CA the system does not trust, a server without TLS, a
    // fallback to plain text, and the client's own TLS switches are all refused.
    let refused = |url: String| {
        let statement = statement.clone();
        async move {
            SqlHandler::connect(SqlConfig::new(url.clone(), statement))
                .await
                .err()
                .unwrap_or_else(|| panic!("{url} connected"))
                .to_string()
        }
    };
    let untrusted = refused(format!("{}?ssl-mode=REQUIRED", my.url())).await;
    assert!(
        untrusted.starts_with("cannot connect to the database: ")
            && untrusted.to_lowercase().contains("certificate"),
        "{untrusted}"
    );
    let without = TestMariadb::start();
    let no_tls = refused(format!(
        "{}?ssl-mode=REQUIRED&ssl-ca={}",
        without.url(),
        my.ca().display()
    ))
    .await;
    assert!(
        no_tls.starts_with("cannot connect to the database: ") && no_tls.contains("SSL"),
        "{no_tls}"
    );
    let probe = SqlProbe::new(
        format!(
            "{}?ssl-mode=REQUIRED&ssl-ca={}",
            without.url(),
            my.ca().display()
        ),
        Duration::from_secs(5),
    )
    .throttle_when(CIPHER);
    assert!(
        matches!(probe.check().await, ProbeOutcome::Error(e) if e.contains("SSL")),
        "a probe without TLS answered"
    );
    for (query, words) in [
        ("ssl-mode=PREFERRED", "falls back to plain text"),
        ("ssl-mode=ON", "expected DISABLED, REQUIRED"),
        ("require_ssl=true", "is not taken"),
        ("ssl-ca=/etc/ca.pem", "add ssl-mode=REQUIRED"),
    ] {
        let text = refused(format!("{}?{query}", my.url())).await;
        assert!(text.contains(words), "{query}: {text}");
    }
}

/// Runs `sql` and returns the first column of its first row, as text.
async fn first(conn: &mut mysql_async::Conn, sql: &str) -> Option<String> {
    let row: Option<mysql_async::Row> = conn.query_first(sql).await.unwrap();
    row.and_then(|mut r| r.take::<Option<String>, _>(0).flatten())
}

/// Polls `probe` until `done` holds for its outcome; fails after 30 s with the last.
async fn until(probe: &SqlProbe, what: &str, done: impl Fn(&ProbeOutcome) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let outcome = probe.check().await;
        if done(&outcome) {
            return;
        }
        assert!(Instant::now() < deadline, "never saw {what}: {outcome:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `--keep-below-sql 'SHOW REPLICA STATUS'` (the probe's metric) on a real replica of
/// a private primary: 0 while it keeps up; the seconds it trails by while its SQL
/// thread waits on a row lock held on the replica; 0 again once the lock goes; an
/// error (which throttles) when the SQL thread is stopped (the lag is NULL), or on a
/// server that is no replica (no row).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_below_reads_a_real_replicas_seconds_behind() {
    let primary = TestMariadb::start_with(&["--log-bin=primary-bin", "--server-id=1"]);
    let replica = TestMariadb::start_with(&["--server-id=2"]);
    let mut p = mysql_async::Conn::from_url(primary.url()).await.unwrap();
    let mut r = mysql_async::Conn::from_url(replica.url()).await.unwrap();
    r.query_drop(format!(
        "CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = {}, \
         MASTER_USER = 'root', MASTER_USE_GTID = no",
        primary.port()
    ))
    .await
    .unwrap();
    r.query_drop("START SLAVE").await.unwrap();
    p.query_drop("CREATE TABLE test.lag (id INT PRIMARY KEY, v INT) ENGINE=InnoDB")
        .await
        .unwrap();
    p.query_drop("INSERT INTO test.lag VALUES (1, 0)")
        .await
        .unwrap();
    let lag = SqlProbe::new(replica.url(), Duration::from_secs(5)).metric("SHOW REPLICA STATUS");
    let value =
        |v: fn(f64) -> bool| move |o: &ProbeOutcome| matches!(o, ProbeOutcome::Value(x) if v(*x));
    let deadline = Instant::now() + Duration::from_secs(30);
    // Until the replica applied both statements (before the first, the table is not
    // there: an error, read as not yet).
    let count = "SELECT COUNT(*) FROM test.lag";
    while r
        .query_first::<Option<String>, _>(count)
        .await
        .ok()
        .flatten()
        .flatten()
        .as_deref()
        != Some("1")
    {
        assert!(
            Instant::now() < deadline,
            "the replica never caught up: {:?}",
            lag.check().await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    until(&lag, "no lag", value(|x| x == 0.0)).await;

    // A session on the replica holds the row: the replicated UPDATE waits behind it.
    let mut holder = mysql_async::Conn::from_url(replica.url()).await.unwrap();
    holder.query_drop("BEGIN").await.unwrap();
    holder
        .query_drop("SELECT * FROM test.lag WHERE id = 1 FOR UPDATE")
        .await
        .unwrap();
    p.query_drop("UPDATE test.lag SET v = 1 WHERE id = 1")
        .await
        .unwrap();
    until(&lag, "a lag of 2 s or more", value(|x| x >= 2.0)).await;
    holder.query_drop("COMMIT").await.unwrap();
    until(&lag, "the lag gone", value(|x| x == 0.0)).await;
    assert_eq!(
        first(&mut r, "SELECT v FROM test.lag WHERE id = 1")
            .await
            .as_deref(),
        Some("1")
    );

    // Replication stopped: the lag is NULL, an error.
    r.query_drop("STOP SLAVE SQL_THREAD").await.unwrap();
    until(
        &lag,
        "an error for a NULL lag",
        |o| matches!(o, ProbeOutcome::Error(e) if e.contains("Seconds_Behind_Master is NULL")),
    )
    .await;
    // No replica at all: no row, an error.
    let none = SqlProbe::new(primary.url(), Duration::from_secs(5)).metric("SHOW REPLICA STATUS");
    let outcome = none.check().await;
    assert!(
        matches!(&outcome, ProbeOutcome::Error(e) if e.contains("no row")),
        "{outcome:?}"
    );
}
