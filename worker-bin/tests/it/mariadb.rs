//! `SqlHandler` on a private MariaDB server (testkit's `TestMariadb`: Debian's
//! mariadb-server in a directory and on a port of its own): chunks update exactly their
//! range, with named or `?` placeholders; a deadlock between two chunks is retried and both complete; a
//! statement the server refuses fails at connect in its words; a fence column keeps
//! a stale chunk off its successor's rows.

use std::net::TcpListener;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use tranche_worker::{Chunk, Handler, SqlConfig, SqlHandler};

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
