//! Everything a new user's trial did, with tranche-worker alone: a plan, a handler
//! with a permanent failure and a retried one, progress from events, a drain on Ctrl-C or SIGTERM, then the
//! failed partitions, a row located and the workers' statistics. Embedded by default;
//! `cargo run -p tranche-worker --example new_user -- --redis URL` runs it on Redis.
use std::time::Duration;
use tranche_worker::{CancellationToken, Chunk, Event, Handler, HandlerError, Plan, Runner};

struct Import;

#[async_trait::async_trait]
impl Handler for Import {
    async fn process(&self, chunk: Chunk) -> Result<(), HandlerError> {
        if chunk.pid == 13 {
            return Err(HandlerError::permanent("a row is malformed"));
        }
        if (chunk.pid, chunk.attempt) == (7, 1) {
            return Err(HandlerError::retry_after(
                "busy",
                Duration::from_millis(100),
            ));
        }
        Ok(()) // the real work: rows chunk.from..=chunk.to
    }
}

fn show(event: &Event) {
    match event {
        Event::Progress(p) => eprintln!("{} done, {} running", p.completed, p.in_flight),
        Event::AttemptFailed { pid, error, .. } => eprintln!("pid {pid} failed: {error}"),
        _ => {}
    }
}

#[tokio::main]
async fn main() -> Result<(), tranche_worker::Error> {
    let args: Vec<String> = std::env::args().collect();
    let dir = std::env::temp_dir().join(format!("tranche-new-user-{}", std::process::id()));
    let runner = match args.iter().position(|a| a == "--redis") {
        Some(i) => Runner::redis(&args[i + 1]),
        None => Runner::embedded(dir.join("import.state")),
    };
    let runner = runner.namespace("import").chunk(250).on_event(show);
    let plan = Plan::ids(1..=200_000).partition_size(1_000);
    runner.plan(plan).await?;
    let token = CancellationToken::new();
    let on_signal = token.clone();
    tokio::spawn(async move {
        tranche_worker::shutdown_signal().await; // Ctrl-C or SIGTERM (an orchestrator's stop)
        on_signal.cancel(); // drains: running chunks finish, the rest is released
    });
    let report = runner.run_until_cancelled(Import, token).await?;
    let mine = &report.this_runner;
    println!(
        "here: {} completed, {} attempts failed, failed pids {:?}",
        mine.completed, mine.attempts_failed, mine.failed_pids
    );
    let job = runner.job().await?;
    for p in job.failed().await? {
        println!("failed: pid {} {:?}", p.pid, p.last_error);
    }
    if let Some(row) = job.locate(123_456).await? {
        let (pid, done) = (row.pid, row.view.is_completed());
        println!("row 123456: partition {pid}, completed: {done}");
    }
    let status = job.status().await?;
    println!("job: {} of {} completed", status.completed, status.total);
    for w in job.workers().await? {
        let i = &w.info;
        println!("worker {}: {} completed", i.id, i.completed);
    }
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}
