//! The PostgreSQL backfill example, for real: a private PostgreSQL server (initdb and
//! pg_ctl on a free port, as the Redis tests start their own redis-server), a table of
//! 25,000 rows, and the example's handler run by `tranche_worker::runner` on a private
//! Redis, stopped halfway and run again: every row is backfilled, none is missed.

#[path = "../../active-store/tests/support/mod.rs"]
mod support;

#[path = "../examples/pg_backfill.rs"]
#[allow(dead_code)]
mod example;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use example::Backfill;
use support::TestRedis;
use tranche_worker::runner::Runner;

/// A private PostgreSQL cluster, stopped and removed on drop.
struct TestPostgres {
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
}

impl TestPostgres {
    fn start() -> Self {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .ok()
            .and_then(|d| {
                d.flatten()
                    .map(|e| e.path().join("bin"))
                    .find(|p| p.join("initdb").exists())
            })
            .expect("PostgreSQL's initdb not found: apt-get install postgresql");
        let dir = std::env::temp_dir().join(format!("tranche-pg-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        // initdb refuses to run as root: run the server as `postgres` then.
        let root = nix_is_root();
        if root {
            let ok = Command::new("chown")
                .args(["-R", "postgres"])
                .arg(&dir)
                .status()
                .unwrap();
            assert!(ok.success());
        }
        let data = dir.join("data");
        run_as(
            root,
            &bin.join("initdb"),
            &[
                "-D",
                data.to_str().unwrap(),
                "-U",
                "postgres",
                "-A",
                "trust",
            ],
        );
        let opts = format!(
            "-p {port} -c listen_addresses=127.0.0.1 -k {}",
            dir.display()
        );
        run_as(
            root,
            &bin.join("pg_ctl"),
            &[
                "-D",
                data.to_str().unwrap(),
                "-o",
                &opts,
                "-l",
                dir.join("log").to_str().unwrap(),
                "-w",
                "start",
            ],
        );
        Self { dir, bin, port }
    }

    fn url(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            self.port
        )
    }
}

impl Drop for TestPostgres {
    fn drop(&mut self) {
        let data = self.dir.join("data");
        let _ = Command::new(if nix_is_root() { "runuser" } else { "env" })
            .args(if nix_is_root() {
                vec!["-u", "postgres", "--"]
            } else {
                vec![]
            })
            .arg(self.bin.join("pg_ctl"))
            .args(["-D", data.to_str().unwrap(), "-m", "immediate", "stop"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn nix_is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0\n"))
        .unwrap_or(false)
}

fn run_as(root: bool, program: &Path, args: &[&str]) {
    let out = if root {
        Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(program)
            .args(args)
            .output()
    } else {
        Command::new(program).args(args).output()
    }
    .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()));
    assert!(
        out.status.success(),
        "{} failed: {}{}",
        program.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_backfill_runs_to_the_end_through_a_restart() {
    let pg = TestPostgres::start();
    let (db, connection) = tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    db.batch_execute(
        "CREATE TABLE users (id bigint PRIMARY KEY, email text NOT NULL, email_lower text);
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
    runner.plan(min, max, 1000).await.unwrap();
    // Stopped early, then started again, as an operator would.
    let first = runner
        .run(backfill, tokio::time::sleep(Duration::from_millis(200)))
        .await
        .unwrap();
    let second = runner
        .run(
            Backfill::connect(&pg.url()).await.unwrap(),
            std::future::pending(),
        )
        .await
        .unwrap();
    assert_eq!((second.outstanding, second.failed), (0, 0), "{second:?}");
    assert_eq!(
        first.completed + second.completed,
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
