//! Two worker processes sharing one job through Redis: this process plans, starts a
//! second copy of itself as another worker, works beside it, and each reports its own
//! share. Ctrl-C or SIGTERM drains each worker (its running chunks finish, the rest is
//! released for the others).
//!
//! `cargo run -p tranche-worker --example fleet_redis -- redis://127.0.0.1:6379`

use std::time::Duration;

use tranche_worker::{Chunk, Handler, HandlerError, Plan, Runner, Until, shutdown_signal};

struct Slow;

#[async_trait::async_trait]
impl Handler for Slow {
    async fn process(&self, _chunk: Chunk) -> Result<(), HandlerError> {
        tokio::time::sleep(Duration::from_millis(2)).await;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned());
    let role = args.next();
    let worker = |id: &str| {
        Runner::redis(&url)
            .namespace("fleet-example")
            .worker_id(id)
            .chunk(100)
            .until(Until::Drained)
    };
    if role.as_deref() == Some("second") {
        let report = worker("second")
            .run_with_shutdown(Slow, shutdown_signal())
            .await?;
        println!("second: {} partitions", report.this_runner.completed);
        return Ok(());
    }
    worker("first")
        .plan(Plan::ids(1..=200_000).partition_size(2_000))
        .await?;
    let mut second = tokio::process::Command::new(std::env::current_exe()?)
        .args([url.as_str(), "second"])
        .spawn()?;
    let report = worker("first")
        .run_with_shutdown(Slow, shutdown_signal())
        .await?;
    println!("first: {} partitions", report.this_runner.completed);
    if report.interrupted {
        // Stopped by a signal (an orchestrator's stop reaches this process alone): pass
        // it on, so that the second worker drains too.
        if let Some(pid) = second.id() {
            std::process::Command::new("kill")
                .arg(pid.to_string())
                .status()?;
        }
    }
    let status = second.wait().await?;
    let job = worker("first").job().await?.status().await?;
    println!(
        "the job: {} of {} partitions completed ({status})",
        job.completed, job.total
    );
    Ok(())
}
