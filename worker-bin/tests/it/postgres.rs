//! The PostgreSQL backfill example, for real: a private PostgreSQL server (testkit's
//! `TestPostgres`, as the Redis tests start their own redis-server) and the
//! example's handler run by `tranche_worker::Runner` on a private Redis. A table of
//! 25,000 rows is stopped halfway and run again; a table of 1,000,000 rows is
//! backfilled by three runner processes, one of them SIGKILLed mid-run: every row is
//! backfilled as intended, none is missed, and `tranche check` finds nothing amiss.

use crate::support;

#[path = "../../examples/pg_backfill.rs"]
#[allow(dead_code)]
mod example;

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use example::Backfill;
use support::{TestPostgres, TestRedis};
use tranche_worker::Runner;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_backfill_runs_to_the_end_through_a_restart() {
    let pg = TestPostgres::start();
    let (db, connection) = tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    db.batch_execute(
        "CREATE TABLE users (id bigint PRIMARY KEY, email text NOT NULL, email_lower text, fence bigint NOT NULL DEFAULT 0);
         INSERT INTO users (id, email) SELECT i, 'User' || i || '@Example.COM' FROM generate_series(1, 25000) i;",
    )
    .await
    .unwrap();

    let redis = TestRedis::start();
    let backfill = Backfill::connect(&pg.url()).await.unwrap();
    let (min, max) = backfill.id_range().await.unwrap().unwrap();
    let runner = Runner::redis(redis.url())
        .namespace("backfill")
        .concurrency(2)
        .chunk(500)
        .grace(Duration::from_secs(5));
    runner
        .plan(tranche_worker::Plan::ids(min..=max).partition_size(1000))
        .await
        .unwrap();
    // Stopped early, then started again, as an operator would.
    let first = runner
        .run_with_shutdown(backfill, tokio::time::sleep(Duration::from_millis(200)))
        .await
        .unwrap();
    let second = runner
        .run(Backfill::connect(&pg.url()).await.unwrap())
        .await
        .unwrap();
    assert_eq!(
        (second.namespace.outstanding, second.namespace.failed),
        (0, 0),
        "{second:?}"
    );
    assert_eq!(
        first.this_runner.completed + second.this_runner.completed,
        25,
        "{first:?} {second:?}"
    );

    let row = db
        .query_one(
            "SELECT count(*) FILTER (WHERE email_lower = lower(email)), count(*) FROM users",
            &[],
        )
        .await
        .unwrap();
    let (done, all): (i64, i64) = (row.get(0), row.get(1));
    assert_eq!((done, all), (25_000, 25_000));
}

/// The runner processes' settings: partitions of 10,000 IDs (100 of them), chunks of
/// 2,000 rows, leases of 2 s so that the killed runner's partitions come back quickly,
/// and the inbox entries it was archiving when killed as quickly ([`CLAIM_IDLE`]).
const ROWS: u64 = 1_000_000;
const PARTITION: u64 = 10_000;
const LEASE: Duration = Duration::from_secs(2);
/// How long a dead archiver's inbox entries wait before another's sweep takes them over
/// (`TRANCHE_ARCHIVE_CLAIM_IDLE`; 60 s by default; the final drain takes them over after
/// at most 5 s). A runner killed while it held some once made the survivors' final
/// drain wait the whole minute.
const CLAIM_IDLE: &str = "2s";
/// Set in a runner process: the test binary runs this test again as one of the runners.
const ROLE: &str = "TRANCHE_PG_RUNNER";

/// Three runners (processes of their own, this test binary run again with [`ROLE`] set)
/// backfill a million rows; one is SIGKILLed mid-run, holding leases. The others reap
/// its leases and finish: every row is backfilled, by the same UPDATE, and `tranche
/// check` is clean. How fast is not asserted (the job takes 5-15 s): the deadline only
/// catches a runner that never finishes, and the job's time is printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_runners_backfill_a_million_rows_through_a_sigkill() {
    if let Ok(worker) = std::env::var(ROLE) {
        return runner_process(&worker).await;
    }
    let pg = TestPostgres::start();
    let (db, connection) = tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    db.batch_execute(&format!(
        "CREATE TABLE users (id bigint PRIMARY KEY, email text NOT NULL, email_lower text, fence bigint NOT NULL DEFAULT 0);
         INSERT INTO users (id, email)
           SELECT i, 'User' || i || '@Example.COM' FROM generate_series(1, {ROWS}) i;"
    ))
    .await
    .unwrap();
    let redis = TestRedis::start();
    Runner::redis(redis.url())
        .namespace("backfill")
        .plan(tranche_worker::Plan::ids(1..=ROWS).partition_size(PARTITION))
        .await
        .unwrap();

    let logs = pg.dir().join("runners");
    std::fs::create_dir_all(&logs).unwrap();
    // A hang, not a slow job: the survivors must be done by then (`wait_with_deadline`).
    let job = Instant::now();
    let deadline = job + Duration::from_secs(300);
    let mut runners: Vec<Child> = (0..3)
        .map(|n| spawn_runner(&format!("runner-{n}"), &pg.url(), &redis.url(), &logs))
        .collect();
    // Kill the first runner once the job is well under way.
    let updated = || async {
        let row = db
            .query_one("SELECT count(email_lower) FROM users", &[])
            .await
            .unwrap();
        row.get::<_, i64>(0) as u64
    };
    let mut at_kill = updated().await;
    while at_kill < ROWS / 5 {
        assert!(Instant::now() < deadline, "no progress: {at_kill} rows");
        tokio::time::sleep(Duration::from_millis(20)).await;
        at_kill = updated().await;
    }
    runners[0].kill().unwrap(); // SIGKILL: no drain, no release, its leases left held.
    runners[0].wait().unwrap();
    assert!(at_kill < ROWS, "the job was over before the kill");

    let mut survivors = 0;
    for (n, runner) in runners.iter_mut().enumerate().skip(1) {
        let log = logs.join(format!("runner-{n}"));
        let status = wait_with_deadline(runner, deadline, &log).await;
        let said = std::fs::read_to_string(&log).unwrap();
        assert!(status.success(), "runner-{n}: {said}");
        assert!(
            said.contains("outstanding=0 failed=0"),
            "runner-{n}: {said}"
        );
        survivors += said
            .split("completed=")
            .nth(1)
            .and_then(|s| s.split(' ').next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("runner-{n}: {said}"));
    }
    eprintln!(
        "killed at {at_kill} rows; the other two completed {survivors} partitions; the job took {:?}",
        job.elapsed()
    );

    // Every row holds exactly what the UPDATE writes, and nothing else changed.
    let row = db
        .query_one(
            "SELECT count(*),
                    count(*) FILTER (WHERE email_lower = lower(email)),
                    count(*) FILTER (WHERE email = 'User' || id || '@Example.COM'),
                    min(id), max(id)
             FROM users",
            &[],
        )
        .await
        .unwrap();
    let got: (i64, i64, i64, i64, i64) =
        (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
    let rows = ROWS as i64;
    assert_eq!(got, (rows, rows, rows, 1, rows));

    let check = Command::new(env!("CARGO_BIN_EXE_tranche"))
        .args(["--redis", &redis.url(), "--namespace", "backfill", "check"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&check.stdout);
    assert!(
        check.status.success() && said.contains("consistent"),
        "{said}{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let status = Command::new(env!("CARGO_BIN_EXE_tranche"))
        .args([
            "--redis",
            &redis.url(),
            "--namespace",
            "backfill",
            "status",
            "--json",
        ])
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(
        (&status["finished"], &status["failed"]),
        (&serde_json::json!(ROWS / PARTITION), &serde_json::json!(0)),
        "{status}"
    );
}

/// Starts this test binary again as runner `worker`, its output in `logs/<worker>`.
fn spawn_runner(worker: &str, pg: &str, redis: &str, logs: &Path) -> Child {
    let out = std::fs::File::create(logs.join(worker)).unwrap();
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "postgres::three_runners_backfill_a_million_rows_through_a_sigkill",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, worker)
        .env("TRANCHE_ARCHIVE_CLAIM_IDLE", CLAIM_IDLE)
        .env("TRANCHE_PG_URL", pg)
        .env("TRANCHE_PG_REDIS", redis)
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap()
}

/// One runner process: the example's handler, run until nothing is outstanding.
async fn runner_process(worker: &str) {
    let pg = std::env::var("TRANCHE_PG_URL").unwrap();
    let redis = std::env::var("TRANCHE_PG_REDIS").unwrap();
    let report = Runner::redis(redis)
        .namespace("backfill")
        .worker_id(worker)
        .concurrency(2)
        .chunk(2_000)
        .lease(LEASE)
        .run(Backfill::connect(&pg).await.unwrap())
        .await
        .unwrap();
    println!(
        "{worker}: completed={} outstanding={} failed={}",
        report.this_runner.completed, report.namespace.outstanding, report.namespace.failed
    );
}

/// Waits for `child` until `deadline` (killing it then, and failing with what it wrote
/// to `log`).
async fn wait_with_deadline(
    child: &mut Child,
    deadline: Instant,
    log: &Path,
) -> std::process::ExitStatus {
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let said = std::fs::read_to_string(log).unwrap_or_default();
            panic!("a runner did not finish within the deadline; it wrote:\n{said}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The example's backfill under `keep_below`: each chunk's UPDATE also logs its IDs in
/// `chunk_log` on the server, and the probe asks the server how many IDs it was given
/// in the last second. The runner's AIMD brings the rate down from its 6000 IDs/s
/// ceiling and holds the server's figure under 3000.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_below_holds_a_server_figure_under_its_target() {
    use std::sync::Arc;
    use tranche_worker::{Chunk, Handler, HandlerError, ProbeOutcome};

    struct Logged {
        backfill: Backfill,
        db: Arc<tokio_postgres::Client>,
    }

    #[async_trait::async_trait]
    impl Handler for Logged {
        async fn process(&self, chunk: Chunk) -> Result<(), HandlerError> {
            self.backfill.process(chunk).await?;
            self.db
                .execute(
                    "INSERT INTO chunk_log (at, ids) VALUES (clock_timestamp(), $1)",
                    &[&((chunk.to - chunk.from + 1) as i64)],
                )
                .await?;
            Ok(())
        }
    }

    async fn client(url: &str) -> Arc<tokio_postgres::Client> {
        let (db, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        Arc::new(db)
    }

    /// IDs the server was given over the last `secs` seconds, per second.
    async fn figure(db: &tokio_postgres::Client, secs: f64) -> f64 {
        let row = db
            .query_one(
                "SELECT coalesce(sum(ids), 0)::float8 FROM chunk_log \
                 WHERE at > clock_timestamp() - make_interval(secs => $1)",
                &[&secs],
            )
            .await
            .unwrap();
        row.get::<_, f64>(0) / secs
    }

    let pg = TestPostgres::start();
    let db = client(&pg.url()).await;
    db.batch_execute(
        "CREATE TABLE users (id bigint PRIMARY KEY, email text NOT NULL, email_lower text, fence bigint NOT NULL DEFAULT 0);
         INSERT INTO users (id, email) SELECT i, 'User' || i || '@Example.COM' FROM generate_series(1, 200000) i;
         CREATE TABLE chunk_log (at timestamptz NOT NULL, ids bigint NOT NULL);",
    )
    .await
    .unwrap();
    let redis = TestRedis::start();
    let probe_db = client(&pg.url()).await;
    let runner = Runner::redis(redis.url())
        .namespace("backfill-aimd")
        .concurrency(4)
        .chunk(100)
        .max_rate(6000.0)
        .keep_below(3000.0)
        .throttle_probe(move || {
            let db = probe_db.clone();
            async move { ProbeOutcome::Value(figure(&db, 1.0).await) }
        });
    runner
        .plan(tranche_worker::Plan::ids(1..=200_000).partition_size(1000))
        .await
        .unwrap();
    let handler = Logged {
        backfill: Backfill::connect(&pg.url()).await.unwrap(),
        db: client(&pg.url()).await,
    };
    let run = tokio::spawn(async move {
        runner
            .run_with_shutdown(handler, tokio::time::sleep(Duration::from_secs(18)))
            .await
    });
    // Three cuts (6000 → 4200 → 2940) take about 7 s; then sample the figure.
    tokio::time::sleep(Duration::from_secs(9)).await;
    let mut samples = Vec::new();
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        samples.push(figure(&db, 1.0).await);
    }
    let report = run.await.unwrap().unwrap();
    assert!(report.interrupted, "{report:?}");
    let mean = samples.iter().sum::<f64>() / samples.len() as f64;
    eprintln!("IDs/s the server saw each second: {samples:.0?} (mean {mean:.0})");
    assert!(
        (1500.0..=3300.0).contains(&mean),
        "the server's figure was {mean:.0} IDs/s on average for a target of 3000: {samples:.0?}"
    );
    assert!(
        samples.iter().all(|&s| s < 4500.0),
        "no second far above the target: {samples:.0?}"
    );
}

/// The shipped `--exec` example, fenced in the database: worker A's chunk is frozen
/// (SIGSTOP, the worker and the chunk's whole group, its guard included) just before
/// its UPDATE; its 2 s lease expires, worker B reclaims the partition and writes every
/// row with its larger fence; then A is thawed. Every row keeps B's fence: A's chunk,
/// thawed past its lease, overwrote nothing. Its guard may stop it before its psql
/// runs, so the write A would have made is then replayed by hand with A's own
/// environment, as a write delayed in flight would arrive: it changes no row (and the
/// same script with a newer fence does, so the check could fail).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_thawed_past_its_lease_cannot_overwrite_its_successor() {
    use crate::common::{ok, scratch, tranche, wait};
    let pg = TestPostgres::start();
    let (db, connection) = tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    db.batch_execute(
        "CREATE TABLE users (id bigint PRIMARY KEY, email text NOT NULL, email_lower text, fence bigint NOT NULL DEFAULT 0);
         INSERT INTO users (id, email) SELECT i, 'User' || i || '@Example.COM' FROM generate_series(1, 100) i;",
    )
    .await
    .unwrap();
    let redis = TestRedis::start();
    let url = redis.url();
    let dir = scratch("pg-fence");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/backfill-postgres.sh");
    ok(tranche(
        &dir,
        &[
            "--redis", &url, "plan", "--min", "1", "--max", "100", "--size", "100",
        ],
    ));
    // Each attempt writes its environment down; the first waits for `go` first (its
    // pid, its group's, in `pgid`).
    let exec = format!(
        "env > env.$TRANCHE_ATTEMPT; if [ $TRANCHE_ATTEMPT = 1 ]; then echo $$ > pgid; \
         while [ ! -e go ]; do sleep 0.02; done; fi; exec {}",
        script.display()
    );
    let path = format!(
        "{}:{}",
        pg.bin().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let worker = |name: &str| {
        let mut cmd = tranche(
            &dir,
            &[
                "--redis",
                &url,
                "run",
                "--exec",
                &exec,
                "--chunk",
                "100",
                "--lease",
                "2s",
                "--worker-id",
                name,
                "--max-attempts",
                "5",
            ],
        );
        cmd.env("DATABASE_URL", pg.url())
            .env("PATH", &path)
            .stdin(std::process::Stdio::null())
            .stdout(std::fs::File::create(dir.join(format!("{name}.log"))).unwrap())
            .stderr(std::fs::File::create(dir.join(format!("{name}.err"))).unwrap());
        cmd.spawn().unwrap()
    };
    let mut a = worker("a");
    let deadline = Instant::now() + Duration::from_secs(20);
    let pgid = loop {
        if let Some(pgid) = std::fs::read_to_string(dir.join("pgid"))
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
        {
            break pgid;
        }
        assert!(Instant::now() < deadline, "worker a's chunk never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let kill = |signal: &str, target: String| {
        let ok = Command::new("kill")
            .args([signal, "--", &target])
            .status()
            .unwrap();
        assert!(ok.success(), "kill {signal} {target}");
    };
    kill("-STOP", format!("-{pgid}"));
    kill("-STOP", a.id().to_string());
    std::fs::write(dir.join("go"), "").unwrap();

    // B waits out A's lease, reclaims, writes every row and ends: nothing is left.
    let mut b = worker("b");
    let status = wait(&mut b, Duration::from_secs(60));
    assert!(status.success(), "worker b: {status:?}");
    let fence_of = |attempt: u32| -> i64 {
        let env = std::fs::read_to_string(dir.join(format!("env.{attempt}"))).unwrap();
        env.lines()
            .find_map(|l| l.strip_prefix("TRANCHE_FENCE="))
            .unwrap()
            .parse()
            .unwrap()
    };
    let (stale, newer) = (fence_of(1), fence_of(2));
    assert!(stale < newer, "{stale} {newer}");
    let fences = || async {
        let rows = db
            .query(
                "SELECT fence, count(*) FROM users WHERE email_lower = lower(email) GROUP BY fence",
                &[],
            )
            .await
            .unwrap();
        rows.iter()
            .map(|r| (r.get::<_, i64>(0), r.get::<_, i64>(1)))
            .collect::<Vec<_>>()
    };
    assert_eq!(fences().await, vec![(newer, 100)]);

    // A thaws: its chunk goes on from where it froze, or its guard stops it first.
    kill("-CONT", a.id().to_string());
    kill("-CONT", format!("-{pgid}"));
    let _ = wait(&mut a, Duration::from_secs(30));
    assert_eq!(fences().await, vec![(newer, 100)], "a overwrote b's rows");

    // A's write, delivered now, as a statement stuck in flight would be.
    let replay = |fence: i64| {
        let env = std::fs::read_to_string(dir.join("env.1")).unwrap();
        let mut cmd = Command::new(&script);
        cmd.env_clear();
        for (k, v) in env.lines().filter_map(|l| l.split_once('=')) {
            cmd.env(k, v);
        }
        let out = cmd
            .env("TRANCHE_FENCE", fence.to_string())
            .env("PATH", &path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    };
    replay(stale);
    assert_eq!(
        fences().await,
        vec![(newer, 100)],
        "a stale write went through"
    );
    replay(newer + 1);
    assert_eq!(fences().await, vec![(newer + 1, 100)]);
}
