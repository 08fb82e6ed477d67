//! `tranche run --sql` for real: the binary against a private PostgreSQL (testkit's
//! `TestPostgres`) and a private Redis. A statement the database refuses, or a
//! database out of reach, fails at start with exit 2 and writes nothing; a worker
//! SIGKILLed inside a chunk's transaction leaves none of it, and the next attempt
//! completes it (the rows reach the run's summary), on PostgreSQL and on MariaDB; a
//! worker frozen past its lease
//! writes nothing over its successor with `--fence-column`; a deadlock between two
//! chunks is retried and both complete.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio_postgres::{Client, NoTls};

use crate::common::{ok, output, scratch, tranche, wait};
use crate::support::TestRedis;
use crate::support::{TestMariadb, TestPostgres};

/// A table `t` of `rows` rows (`v` 0, `fence` 0), `slow` (one row: the seconds each
/// row of a chunk waits) and `nap(seconds)`: true after a sleep.
async fn setup(pg: &TestPostgres, rows: u64) -> Client {
    let (db, connection) = tokio_postgres::connect(&pg.url(), NoTls).await.unwrap();
    tokio::spawn(connection);
    db.batch_execute(&format!(
        "CREATE TABLE t (id bigint PRIMARY KEY, v bigint NOT NULL DEFAULT 0,
                         fence bigint NOT NULL DEFAULT 0);
         INSERT INTO t (id) SELECT generate_series(1, {rows});
         CREATE TABLE slow (d float8 NOT NULL);
         INSERT INTO slow VALUES (0);
         CREATE FUNCTION nap(seconds float8) RETURNS boolean LANGUAGE plpgsql AS
           $$ BEGIN PERFORM pg_sleep(seconds); RETURN true; END $$;"
    ))
    .await
    .unwrap();
    db
}

/// `tranche --redis URL run --sql STATEMENT --database-url PG ARGS`, in `dir`.
fn run_sql(dir: &Path, redis: &str, pg: &str, statement: &str, args: &[&str]) -> Command {
    let mut all = vec![
        "--redis",
        redis,
        "run",
        "--sql",
        statement,
        "--database-url",
        pg,
    ];
    all.extend_from_slice(args);
    tranche(dir, &all)
}

/// Starts `cmd` in the background, its output in `dir/NAME.{log,err}`.
fn spawn(mut cmd: Command, dir: &Path, name: &str) -> Child {
    cmd.stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join(format!("{name}.log"))).unwrap())
        .stderr(std::fs::File::create(dir.join(format!("{name}.err"))).unwrap())
        .spawn()
        .unwrap()
}

/// Waits until `query` (a count) answers more than 0, or fails after 20 s.
async fn wait_for(db: &Client, what: &str, query: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let n: i64 = db.query_one(query, &[]).await.unwrap().get(0);
        if n > 0 {
            return;
        }
        assert!(Instant::now() < deadline, "never saw {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `(v, fence, rows)` groups of the table, in order.
async fn groups(db: &Client) -> Vec<(i64, i64, i64)> {
    db.query(
        "SELECT v, fence, count(*) FROM t GROUP BY v, fence ORDER BY v, fence",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

/// The worker's backends (its connections are named `tranche`).
const BACKENDS: &str = "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'tranche'";

fn kill(signal: &str, child: &Child) {
    let ok = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success(), "kill {signal}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_statement_or_an_unreachable_database_fails_at_start_writing_nothing() {
    let pg = TestPostgres::start();
    let _db = setup(&pg, 10).await;
    let redis = TestRedis::start();
    let dir = scratch("sql-refused");
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let nowhere = format!("host=127.0.0.1 port={port} user=postgres connect_timeout=5");
    let good = "UPDATE t SET v = v + 1 WHERE id BETWEEN $1 AND $2";
    let cases = [
        (
            pg.url(),
            "UPDATE t SET v = WHERE id BETWEEN $1 AND $2",
            "syntax error at or near \"WHERE\"",
        ),
        (
            pg.url(),
            "UPDATE nope SET v = 1 WHERE id BETWEEN :from AND :to",
            "relation \"nope\" does not exist",
        ),
        (nowhere, good, "cannot connect to the database"),
    ];
    for (n, (url, statement, said)) in cases.iter().enumerate() {
        // A one-shot run (--min/--max), so that even the plan would be written; and
        // then one on a namespace that holds a plan already.
        for planned in [false, true] {
            let ns = format!("refused{n}{planned}");
            if planned {
                ok(tranche(
                    &dir,
                    &[
                        "--redis",
                        &redis.url(),
                        "--namespace",
                        &ns,
                        "plan",
                        "--min",
                        "1",
                        "--max",
                        "10",
                        "--size",
                        "5",
                    ],
                ));
            }
            let before = redis.dump_all();
            let out = output(run_sql(
                &dir,
                &redis.url(),
                url,
                statement,
                &[
                    "--namespace",
                    &ns,
                    "--min",
                    "1",
                    "--max",
                    "10",
                    "--size",
                    "5",
                ],
            ));
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{statement}: {stderr}");
            let lines: Vec<&str> = stderr.lines().collect();
            assert_eq!(lines.len(), 1, "one line: {stderr}");
            assert!(lines[0].contains(said), "{stderr}");
            assert_eq!(
                redis.dump_all(),
                before,
                "{statement}: something was written"
            );
        }
    }
    // The same one-shot run with a statement the database takes: it plans and runs.
    let out = ok(run_sql(
        &dir,
        &redis.url(),
        &pg.url(),
        good,
        &[
            "--namespace",
            "accepted",
            "--min",
            "1",
            "--max",
            "10",
            "--size",
            "5",
        ],
    ));
    assert!(out.contains("rows        10 affected here"), "{out}");
}

/// The SIGKILL tests' plan: IDs 1..=200, one partition.
fn plan_one_partition(dir: &Path, redis: &str) {
    ok(tranche(
        dir,
        &[
            "--redis", redis, "plan", "--min", "1", "--max", "200", "--size", "200",
        ],
    ));
}

/// The killed and the retrying worker of the SIGKILL tests: `run --sql` over the one
/// partition as one chunk, leases of 2 s, the summary in JSON.
fn one_chunk_worker(dir: &Path, redis: &str, db: &str, statement: &str, name: &str) -> Command {
    run_sql(
        dir,
        redis,
        db,
        statement,
        &[
            "--chunk",
            "200",
            "--lease",
            "2s",
            "--worker-id",
            name,
            "--json",
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_sigkilled_inside_a_transaction_leaves_nothing_and_the_retry_completes_it() {
    let pg = TestPostgres::start();
    let db = setup(&pg, 200).await;
    let redis = TestRedis::start();
    let dir = scratch("sql-sigkill");
    plan_one_partition(&dir, &redis.url());
    // Every row waits `slow.d`: 20 ms now, 4 s for the chunk; A is killed long before.
    db.batch_execute("UPDATE slow SET d = 0.02").await.unwrap();
    let statement =
        "UPDATE t SET v = v + 1 WHERE id BETWEEN $1 AND $2 AND nap((SELECT d FROM slow))";
    let worker = |name: &str| one_chunk_worker(&dir, &redis.url(), &pg.url(), statement, name);
    let mut a = spawn(worker("a"), &dir, "a");
    wait_for(
        &db,
        "a's UPDATE running",
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'tranche' \
         AND state = 'active' AND query LIKE 'UPDATE%' AND now() - query_start > interval '300 ms'",
    )
    .await;
    kill("-KILL", &a);
    let _ = wait(&mut a, Duration::from_secs(10));
    // The server ends the killed worker's transaction once it sees the socket closed.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let n: i64 = db.query_one(BACKENDS, &[]).await.unwrap().get(0);
        if n == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "a's backend outlived it");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(groups(&db).await, vec![(0, 0, 200)], "a partial chunk");
    // B waits out A's lease, reclaims the partition and completes it, once.
    db.batch_execute("UPDATE slow SET d = 0").await.unwrap();
    let summary = ok(worker("b"));
    assert_eq!(groups(&db).await, vec![(1, 0, 200)]);
    let json: serde_json::Value = serde_json::from_str(summary.trim()).unwrap();
    assert_eq!(json["completed"], 1, "{summary}");
    assert_eq!(json["rows"], 200, "{summary}");
}

/// The same on MariaDB: A's UPDATE sleeps 20 ms a row inside its transaction when A
/// is SIGKILLed. The server runs the statement to its end, sees the socket closed and
/// rolls the transaction back; B reclaims the partition after A's lease and completes
/// it, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_mariadb_a_worker_sigkilled_inside_a_transaction_leaves_nothing() {
    use mysql_async::prelude::Queryable;
    let my = TestMariadb::start();
    let mut db = mysql_async::Conn::from_url(my.url()).await.unwrap();
    for sql in [
        "CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT NOT NULL DEFAULT 0) ENGINE=InnoDB",
        "INSERT INTO t (id) SELECT seq FROM seq_1_to_200",
        "CREATE TABLE slow (d DOUBLE NOT NULL)",
        "INSERT INTO slow VALUES (0.02)",
    ] {
        db.query_drop(sql).await.unwrap();
    }
    let redis = TestRedis::start();
    let dir = scratch("sql-sigkill-mariadb");
    plan_one_partition(&dir, &redis.url());
    let statement = "UPDATE t SET v = v + 1 WHERE id BETWEEN :from AND :to \
                     AND SLEEP((SELECT d FROM slow)) = 0";
    let worker = |name: &str| one_chunk_worker(&dir, &redis.url(), &my.url(), statement, name);
    // The count of the server's sessions (other than this one) that `condition` picks.
    let sessions = |condition: &str| {
        format!(
            "SELECT count(*) FROM information_schema.processlist \
             WHERE id <> CONNECTION_ID() AND db = 'test' AND {condition}"
        )
    };
    let mut a = spawn(worker("a"), &dir, "a");
    let running = sessions("info LIKE 'UPDATE t SET%' AND time_ms > 300");
    let deadline = Instant::now() + Duration::from_secs(20);
    while db.query_first::<i64, _>(&running).await.unwrap() != Some(1) {
        assert!(Instant::now() < deadline, "never saw a's UPDATE running");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    kill("-KILL", &a);
    let _ = wait(&mut a, Duration::from_secs(10));
    // The UPDATE runs out its 4 s, then the server finds the client gone.
    let all = sessions("TRUE");
    let deadline = Instant::now() + Duration::from_secs(30);
    while db.query_first::<i64, _>(&all).await.unwrap() != Some(0) {
        assert!(Instant::now() < deadline, "a's sessions outlived it");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let groups = "SELECT v, count(*) FROM t GROUP BY v ORDER BY v";
    let seen: Vec<(i64, i64)> = db.query(groups).await.unwrap();
    assert_eq!(seen, vec![(0, 200)], "a partial chunk");
    db.query_drop("UPDATE slow SET d = 0").await.unwrap();
    let summary = ok(worker("b"));
    let seen: Vec<(i64, i64)> = db.query(groups).await.unwrap();
    assert_eq!(seen, vec![(1, 200)]);
    let json: serde_json::Value = serde_json::from_str(summary.trim()).unwrap();
    assert_eq!(json["completed"], 1, "{summary}");
    assert_eq!(json["rows"], 200, "{summary}");
}

/// A's chunk is on the server, its UPDATE waiting for an advisory lock the test holds
/// (attempt 1 only), when A is frozen (SIGSTOP). Its 2 s lease passes; B reclaims the
/// partition and writes every row with its larger fence. Then the lock is released:
/// A's UPDATE goes on, on the server, after B's commit, and finds every row fenced
/// beyond its own. A is thawed and stops. Every row holds B's write, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_frozen_past_its_lease_writes_nothing_with_a_fence_column() {
    let pg = TestPostgres::start();
    let db = setup(&pg, 100).await;
    db.batch_execute(
        "CREATE FUNCTION gate(attempt bigint) RETURNS boolean LANGUAGE plpgsql AS $$
         BEGIN
           IF attempt = 1 THEN
             PERFORM pg_advisory_lock_shared(42);
             PERFORM pg_advisory_unlock_shared(42);
           END IF;
           RETURN true;
         END $$;
         SELECT pg_advisory_lock(42);",
    )
    .await
    .unwrap();
    let redis = TestRedis::start();
    let dir = scratch("sql-sigstop");
    ok(tranche(
        &dir,
        &[
            "--redis",
            &redis.url(),
            "plan",
            "--min",
            "1",
            "--max",
            "100",
            "--size",
            "100",
        ],
    ));
    let statement = "UPDATE t SET v = v + 1 WHERE id BETWEEN :from AND :to AND gate(:attempt)";
    let worker = |name: &str| {
        run_sql(
            &dir,
            &redis.url(),
            &pg.url(),
            statement,
            &[
                "--chunk",
                "100",
                "--lease",
                "2s",
                "--worker-id",
                name,
                "--fence-column",
                "fence",
                "--max-attempts",
                "5",
                "--chunk-timeout",
                "30s",
            ],
        )
    };
    let mut a = spawn(worker("a"), &dir, "a");
    wait_for(
        &db,
        "a's UPDATE waiting for the lock",
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'tranche' \
         AND wait_event_type = 'Lock' AND query LIKE 'UPDATE%'",
    )
    .await;
    kill("-STOP", &a);
    let b = ok(worker("b"));
    let fenced = groups(&db).await;
    assert_eq!(fenced.len(), 1, "{fenced:?} ({b})");
    let (v, fence_b, n) = fenced[0];
    assert_eq!((v, n), (1, 100), "{fenced:?}");
    assert!(fence_b > 0, "{fenced:?}");
    // A's UPDATE runs now, on the server, past B's commit.
    db.batch_execute("SELECT pg_advisory_unlock(42)")
        .await
        .unwrap();
    wait_for(
        &db,
        "a's UPDATE done, its transaction open",
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'tranche' \
         AND state = 'idle in transaction'",
    )
    .await;
    kill("-CONT", &a);
    let _ = wait(&mut a, Duration::from_secs(30));
    assert_eq!(groups(&db).await, vec![(1, fence_b, 100)], "a wrote over b");
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
    let redis = TestRedis::start();
    let dir = scratch("sql-deadlock");
    let out = output(run_sql(
        &dir,
        &redis.url(),
        &pg.url(),
        "SELECT cross_update(:from)",
        &[
            "--min",
            "1",
            "--max",
            "4",
            "--size",
            "4",
            "--chunk",
            "2",
            "--parallel",
            "2",
            "--max-attempts",
            "1",
        ],
    ));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // Each chunk added 1 to rows 1 and 3, once: the deadlock's victim rolled back and
    // ran again inside its one attempt.
    let v: Vec<(i64, i64)> = db
        .query("SELECT id, v FROM t ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(v, vec![(1, 2), (2, 0), (3, 2), (4, 0)]);
    // The server's statistics reach the view within a second or so.
    wait_for(
        &db,
        "the deadlock counted",
        "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()",
    )
    .await;
}
