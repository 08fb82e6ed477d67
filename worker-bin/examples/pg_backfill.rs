//! Backfill a PostgreSQL column with `tranche_worker::Runner`: every row of `users` gets
//! `email_lower = lower(email)`, one UPDATE per chunk of IDs, on as many processes and
//! machines as you start.
//!
//! ```sh
//! export DATABASE_URL='host=127.0.0.1 user=postgres dbname=app'
//! export TRANCHE_REDIS_URL=redis://127.0.0.1:6379     # omit to run embedded
//! cargo run --release -p tranche-worker --example pg_backfill
//! ```
//!
//! Each chunk's UPDATE is one statement, so a chunk is all or nothing, and re-running
//! one (after a crash or an expired lease) writes the same values again: the backfill
//! is idempotent, as a tranche handler must be.
//!
//! It is fenced, too: the table has a `fence bigint NOT NULL DEFAULT 0` column, each
//! UPDATE records its lease's fencing token ([`Chunk::fence`]) and writes only rows
//! whose fence is below it. A later lease on the same IDs has a larger token, so a
//! write of a worker that lost its lease without knowing (frozen, partitioned off
//! Redis, its statement queued behind a lock) arrives too late to change anything its
//! successor wrote.

use std::sync::Arc;

use tokio_postgres::{Client, NoTls};
use tranche_worker::{Chunk, Handler, HandlerError, Runner};

/// The handler: one UPDATE over the chunk's ID range.
pub(crate) struct Backfill {
    db: Arc<Client>,
}

impl Backfill {
    /// Connects to `database_url` (a libpq connection string).
    pub(crate) async fn connect(database_url: &str) -> Result<Self, tokio_postgres::Error> {
        let (client, connection) = tokio_postgres::connect(database_url, NoTls).await?;
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                eprintln!("postgres connection: {err}");
            }
        });
        Ok(Self {
            db: Arc::new(client),
        })
    }

    /// The IDs the table holds, `min..=max` (None when it is empty).
    pub(crate) async fn id_range(&self) -> Result<Option<(u64, u64)>, tokio_postgres::Error> {
        let row = self
            .db
            .query_one("SELECT min(id), max(id) FROM users", &[])
            .await?;
        let (min, max): (Option<i64>, Option<i64>) = (row.get(0), row.get(1));
        Ok(min.zip(max).map(|(a, b)| (a as u64, b as u64)))
    }
}

#[async_trait::async_trait]
impl Handler for Backfill {
    async fn process(&self, chunk: Chunk) -> Result<(), HandlerError> {
        self.db
            .execute(
                "UPDATE users SET email_lower = lower(email), fence = $3 \
                 WHERE id BETWEEN $1 AND $2 AND fence < $3",
                &[
                    &(chunk.from as i64),
                    &(chunk.to as i64),
                    &(chunk.fence as i64),
                ],
            )
            .await?;
        Ok(())
    }
}

/// Plans the table's whole ID range and runs the backfill until it is done, Ctrl-C or SIGTERM.
#[allow(dead_code)]
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let database_url = std::env::var("DATABASE_URL")?;
    let backfill = Backfill::connect(&database_url).await?;
    let Some((min, max)) = backfill.id_range().await? else {
        println!("users is empty: nothing to backfill");
        return Ok(());
    };
    let runner = match std::env::var("TRANCHE_REDIS_URL") {
        Ok(url) => Runner::redis(url),
        Err(_) => Runner::embedded(".tranche/backfill.state"),
    }
    .namespace("backfill-email-lower")
    .concurrency(4)
    .chunk(1_000);
    runner
        .plan(tranche_worker::Plan::ids(min..=max).partition_size(10_000))
        .await?;
    let report = runner
        .run_with_shutdown(backfill, async {
            tranche_worker::shutdown_signal().await;
        })
        .await?;
    println!(
        "{} partitions backfilled here; {} outstanding, {} failed",
        report.this_runner.completed, report.namespace.outstanding, report.namespace.failed
    );
    Ok(())
}
