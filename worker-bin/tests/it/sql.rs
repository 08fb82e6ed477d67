//! `SqlHandler` against a private PostgreSQL server (testkit's `TestPostgres`): a
//! chunk binds and updates exactly its range; a statement the database refuses fails
//! at connect in the database's words; what a retry cures (a deadlock, a
//! terminated connection) is retried inside the attempt, and what it cannot (a
//! timeout, a constraint) fails it; a worker killed inside a chunk's transaction
//! leaves nothing of it, and the retry completes it.

use std::process::Command;
use std::time::{Duration, Instant};

use tokio_postgres::{Client, NoTls};
use tranche_worker::{Chunk, Handler, SqlConfig, SqlHandler};

use crate::support::TestPostgres;

/// A table `t` of `rows` rows, `v` 0, `u` unique, and `nap(seconds)`: true after a
/// sleep, to hold a statement open row by row.
async fn setup(pg: &TestPostgres, rows: u64) -> Client {
    let (db, connection) = tokio_postgres::connect(&pg.url(), NoTls).await.unwrap();
    tokio::spawn(connection);
    db.batch_execute(&format!(
        "CREATE TABLE t (id bigint PRIMARY KEY, v bigint NOT NULL DEFAULT 0, u bigint UNIQUE);
         INSERT INTO t (id) SELECT generate_series(1, {rows});
         CREATE FUNCTION nap(seconds float8) RETURNS boolean LANGUAGE plpgsql AS
           $$ BEGIN PERFORM pg_sleep(seconds); RETURN true; END $$;"
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

/// The IDs whose `v` is not 0, and the sum of `v` over them.
async fn touched(db: &Client) -> (Vec<i64>, i64) {
    let rows = db
        .query("SELECT id, v FROM t WHERE v <> 0 ORDER BY id", &[])
        .await
        .unwrap();
    let ids = rows.iter().map(|r| r.get::<_, i64>(0)).collect();
    (ids, rows.iter().map(|r| r.get::<_, i64>(1)).sum())
}

/// Waits until `query` (a count) answers more than 0, or fails after 10 s.
async fn wait_for(db: &Client, what: &str, query: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let n: i64 = db.query_one(query, &[]).await.unwrap().get(0);
        if n > 0 {
            return;
        }
        assert!(Instant::now() < deadline, "never saw {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The handler's statement running on the server (the handler's connections are
/// named `tranche`), for at least 100 ms.
const RUNNING: &str = "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'tranche' \
     AND state = 'active' AND query LIKE 'UPDATE%' AND now() - query_start > interval '100 ms'";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_updates_exactly_its_range_with_either_placeholder_style() {
    let pg = TestPostgres::start();
    let db = setup(&pg, 100).await;
    let positional = SqlHandler::connect(SqlConfig::new(
        pg.url(),
        "UPDATE t SET v = v + 1 WHERE id BETWEEN $1 AND $2",
    ))
    .await
    .unwrap();
    positional.process(chunk(2, 11, 20)).await.unwrap();
    assert_eq!(touched(&db).await, ((11..=20).collect(), 10));
    assert_eq!(
        (positional.stats().chunks, positional.stats().rows),
        (1, 10)
    );

    // Named, every one of them, and a `::` cast and a string the rewrite leaves be.
    let named = SqlHandler::connect(SqlConfig::new(
        pg.url(),
        "UPDATE t SET v = :pid * 100 + :attempt::int -- not :from\n\
         WHERE id BETWEEN :from AND :to AND ':to' <> ''",
    ))
    .await
    .unwrap();
    let mut third = chunk(3, 31, 33);
    third.attempt = 7;
    named.process(third).await.unwrap();
    let (ids, sum) = touched(&db).await;
    assert_eq!(ids, (11..=20).chain(31..=33).collect::<Vec<i64>>());
    assert_eq!(sum, 10 + 3 * 307);
    assert_eq!(named.stats().rows, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_statement_fails_at_connect_in_the_databases_words() {
    let pg = TestPostgres::start();
    let _db = setup(&pg, 10).await;
    let refused = |sql: &'static str| {
        let config = SqlConfig::new(pg.url(), sql);
        async move {
            match SqlHandler::connect(config).await {
                Ok(_) => panic!("connected with {sql:?}"),
                Err(err) => err.to_string(),
            }
        }
    };
    let syntax = refused("UPDAT t SET v = 1 WHERE id BETWEEN $1 AND $2").await;
    assert_eq!(
        syntax,
        "the database refused the statement: syntax error at or near \"UPDAT\" at character 1 (SQLSTATE 42601)"
    );
    let missing = refused("UPDATE nope SET v = 1 WHERE id BETWEEN :from AND :to").await;
    assert!(
        missing.contains("relation \"nope\" does not exist") && !missing.contains('\n'),
        "{missing}"
    );
    let six = refused("SELECT $6::int").await;
    assert!(six.contains("a placeholder beyond $5"), "{six}");
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let url = format!("host=127.0.0.1 port={port} user=postgres connect_timeout=5");
    let err = SqlHandler::connect(SqlConfig::new(url, "SELECT 1"))
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.starts_with("cannot connect to the database: ") && !err.contains('\n'),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadlock_between_two_chunks_is_retried_and_both_complete() {
    let pg = TestPostgres::start();
    let db = setup(&pg, 4).await;
    // Chunk 1..=2 locks row 1, then row 3; chunk 3..=4 locks row 3, then row 1.
    db.batch_execute(
        "CREATE FUNCTION cross_update(a bigint) RETURNS boolean LANGUAGE plpgsql AS $$
         BEGIN
           UPDATE t SET v = v + 1 WHERE id = a;
           PERFORM pg_sleep(0.3);
           UPDATE t SET v = v + 1 WHERE id = CASE WHEN a = 1 THEN 3 ELSE 1 END;
           RETURN true;
         END $$;",
    )
    .await
    .unwrap();
    let handler = SqlHandler::connect(
        SqlConfig::new(pg.url(), "SELECT cross_update(:from)")
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
    // Each chunk added 1 to rows 1 and 3, once: the deadlock's victim rolled back.
    assert_eq!(touched(&db).await, (vec![1, 3], 4));
    let stats = handler.stats();
    assert_eq!(stats.chunks, 2);
    assert!(stats.retries >= 1, "no retry: {stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_connection_is_retried() {
    let pg = TestPostgres::start();
    let db = setup(&pg, 100).await;
    let handler = SqlHandler::connect(SqlConfig::new(
        pg.url(),
        "UPDATE t SET v = v + 1 WHERE id BETWEEN :from AND :to AND nap(0.01)",
    ))
    .await
    .unwrap();
    // Terminated in the middle of the chunk's UPDATE.
    let running = tokio::spawn({
        let handler = handler.clone();
        async move { handler.process(chunk(1, 1, 50)).await }
    });
    wait_for(&db, "the chunk running", RUNNING).await;
    db.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'tranche'",
        &[],
    )
    .await
    .unwrap();
    running.await.unwrap().unwrap();
    // Every row once: the terminated transaction left nothing, the retry did it all.
    assert_eq!(touched(&db).await, ((1..=50).collect(), 50));
    assert_eq!(handler.stats().retries, 1);

    // Terminated while idle in the pool: the next chunk gets a fresh connection.
    db.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'tranche'",
        &[],
    )
    .await
    .unwrap();
    handler.process(chunk(2, 51, 52)).await.unwrap();
    assert_eq!(touched(&db).await, ((1..=52).collect(), 52));
    assert_eq!(handler.stats().chunks, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_retry_cannot_cure_fails_the_attempt() {
    let pg = TestPostgres::start();
    let db = setup(&pg, 10).await;
    // A chunk slower than its timeout fails its attempt (transient) and writes nothing.
    let slow = SqlHandler::connect(
        SqlConfig::new(
            pg.url(),
            "UPDATE t SET v = 1 WHERE id BETWEEN :from AND :to AND nap(0.1)",
        )
        .chunk_timeout(Duration::from_millis(250)),
    )
    .await
    .unwrap();
    let err = slow.process(chunk(1, 1, 10)).await.unwrap_err();
    assert!(!err.is_permanent(), "{err:?}");
    assert!(err.to_string().contains("statement timeout"), "{err}");
    assert_eq!(slow.stats().retries, 0);
    assert_eq!(touched(&db).await, (vec![], 0));

    // A constraint violation: transient by default, permanent when asked.
    let sql = "UPDATE t SET u = 1 WHERE id BETWEEN :from AND :to";
    let transient = SqlHandler::connect(SqlConfig::new(pg.url(), sql))
        .await
        .unwrap();
    let err = transient.process(chunk(1, 1, 2)).await.unwrap_err();
    assert!(!err.is_permanent(), "{err:?}");
    assert!(err.to_string().contains("SQLSTATE 23505"), "{err}");
    let permanent =
        SqlHandler::connect(SqlConfig::new(pg.url(), sql).constraint_violations_permanent(true))
            .await
            .unwrap();
    let err = permanent.process(chunk(1, 1, 2)).await.unwrap_err();
    assert!(err.is_permanent(), "{err:?}");
    // Both connections were trusted again only after their rollback: a good chunk runs.
    permanent.process(chunk(1, 3, 3)).await.unwrap();
    let u: Option<i64> = db
        .query_one("SELECT u FROM t WHERE id = 3", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(u, Some(1));
}

/// A CALL is one transaction per chunk too: the handler's BEGIN (pipelined with it)
/// makes a procedure that commits half way fail whole, writing nothing (sent alone in
/// autocommit, its first half would stay committed); and the session's timeouts, set
/// once per connection rather than per chunk, bound it as they bound an UPDATE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_is_one_transaction_bounded_by_the_chunk_timeout() {
    let pg = TestPostgres::start();
    let db = setup(&pg, 10).await;
    db.batch_execute(
        "CREATE PROCEDURE half(a bigint) LANGUAGE plpgsql AS $$ BEGIN
           UPDATE t SET v = v + 1 WHERE id = a; COMMIT;
           UPDATE t SET v = v + 1 WHERE id = a + 1; END $$;
         CREATE PROCEDURE whole(a bigint) LANGUAGE plpgsql AS $$ BEGIN
           UPDATE t SET v = v + 1 WHERE id BETWEEN a AND a + 1; END $$;",
    )
    .await
    .unwrap();
    let half = SqlHandler::connect(SqlConfig::new(pg.url(), "CALL half(:from)"))
        .await
        .unwrap();
    let err = half.process(chunk(1, 1, 2)).await.unwrap_err();
    assert!(err.to_string().contains("SQLSTATE 2D000"), "{err}");
    assert_eq!(touched(&db).await, (vec![], 0));

    let whole = SqlHandler::connect(
        SqlConfig::new(pg.url(), "CALL whole(:from)").chunk_timeout(Duration::from_millis(300)),
    )
    .await
    .unwrap();
    whole.process(chunk(1, 3, 4)).await.unwrap();
    assert_eq!(touched(&db).await, (vec![3, 4], 2));
    // Row 5 locked by another session: the chunk gives up at its timeout.
    let (locker, connection) = tokio_postgres::connect(&pg.url(), NoTls).await.unwrap();
    tokio::spawn(connection);
    locker
        .batch_execute("BEGIN; SELECT 1 FROM t WHERE id = 5 FOR UPDATE")
        .await
        .unwrap();
    let started = Instant::now();
    let err = whole.process(chunk(1, 5, 6)).await.unwrap_err();
    // statement_timeout and lock_timeout are the same: either may be the first.
    let text = err.to_string();
    assert!(
        text.contains("canceling statement due to") && text.contains("timeout"),
        "{text}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    locker.batch_execute("COMMIT").await.unwrap();
    whole.process(chunk(1, 5, 6)).await.unwrap();
    assert_eq!(touched(&db).await, (vec![3, 4, 5, 6], 4));
}

/// Set in the worker process of [`a_worker_killed_inside_a_chunk_leaves_none_of_it`].
const ROLE: &str = "TRANCHE_SQL_WORKER";

/// A worker process (this test binary run again with [`ROLE`] set) is SIGKILLed while
/// its chunk's UPDATE has written half its rows: once its backend is gone, none of
/// them is there, and the retry writes every one exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_inside_a_chunk_leaves_none_of_it() {
    let sql =
        "UPDATE t SET v = v + 1 WHERE id BETWEEN :from AND :to AND nap(:attempt * 0.02 - 0.02)";
    if let Ok(url) = std::env::var(ROLE) {
        // Attempt 2: 20 ms a row, 2 s for the chunk; killed long before its end.
        let handler = SqlHandler::connect(SqlConfig::new(url, sql)).await.unwrap();
        let mut second = chunk(1, 1, 100);
        second.attempt = 2;
        handler.process(second).await.unwrap();
        return;
    }
    let pg = TestPostgres::start();
    let db = setup(&pg, 100).await;
    let mut worker = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "sql::a_worker_killed_inside_a_chunk_leaves_none_of_it",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, pg.url())
        .spawn()
        .unwrap();
    // Well inside the UPDATE: about half its rows written, uncommitted.
    wait_for(&db, "the worker's chunk running", RUNNING).await;
    tokio::time::sleep(Duration::from_millis(900)).await;
    worker.kill().unwrap();
    let status = worker.wait().unwrap();
    assert!(!status.success(), "the worker ended before the kill");
    // Its backend notices the closed socket when the UPDATE ends, and rolls back.
    wait_for(
        &db,
        "the killed worker's backend gone",
        "SELECT (count(*) = 0)::int::bigint FROM pg_stat_activity WHERE application_name = 'tranche'",
    )
    .await;
    assert_eq!(touched(&db).await, (vec![], 0), "a partial chunk was left");

    // The retry (attempt 1: no nap) completes it, each row once.
    let handler = SqlHandler::connect(SqlConfig::new(pg.url(), sql))
        .await
        .unwrap();
    handler.process(chunk(1, 1, 100)).await.unwrap();
    assert_eq!(touched(&db).await, ((1..=100).collect(), 100));
    assert_eq!(handler.stats().rows, 100);
}

/// A fence column: the chunk's fence stamps every row it writes, and a chunk whose
/// lease was since taken over (a lower fence) writes nothing over its successor's rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_column_keeps_a_stale_chunk_off_its_successors_rows() {
    let pg = TestPostgres::start();
    let db = setup(&pg, 20).await;
    db.batch_execute("ALTER TABLE t ADD COLUMN fence bigint")
        .await
        .unwrap();
    let handler = SqlHandler::connect(
        SqlConfig::new(
            pg.url(),
            "UPDATE t SET v = v + 1 WHERE id BETWEEN $1 AND $2",
        )
        .fence_column("fence"),
    )
    .await
    .unwrap();
    let mut successor = chunk(1, 1, 10);
    successor.fence = 7;
    handler.process(successor).await.unwrap();
    assert_eq!(touched(&db).await, ((1..=10).collect(), 10));
    // The stale owner (fence 5) and a replay of the successor's own chunk (fence 7,
    // a lost COMMIT acknowledgement) both change nothing.
    let mut stale = successor;
    stale.fence = 5;
    handler.process(stale).await.unwrap();
    handler.process(successor).await.unwrap();
    assert_eq!(touched(&db).await, ((1..=10).collect(), 10));
    let fences: Vec<Option<i64>> = db
        .query("SELECT fence FROM t ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(fences[..10], [Some(7); 10]);
    assert_eq!(fences[10..], [None; 10]);
    assert_eq!(handler.stats().rows, 10);
}
