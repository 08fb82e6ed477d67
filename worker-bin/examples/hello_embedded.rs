//! The smallest tranche job: embedded (no Redis, state in a temporary file), a handler
//! that sums its chunks, and the report. Ctrl-C or SIGTERM drains it: running chunks
//! finish, the rest is left for another run.
//!
//! `cargo run -p tranche-worker --example hello_embedded [-- LAST_ID]` (1,000,000 by
//! default)

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tranche_worker::{Chunk, Handler, HandlerError, Plan, Runner, shutdown_signal};

struct Sum(Arc<AtomicU64>);

#[async_trait::async_trait]
impl Handler for Sum {
    async fn process(&self, chunk: Chunk) -> Result<(), HandlerError> {
        let sum: u64 = (chunk.from..=chunk.to).sum();
        self.0.fetch_add(sum, Ordering::Relaxed);
        Ok(())
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let last: u64 = match std::env::args().nth(1) {
        Some(arg) => arg.parse()?,
        None => 1_000_000,
    };
    let dir = std::env::temp_dir().join(format!("tranche-hello-{}", std::process::id()));
    let runner = Runner::embedded(dir.join("hello.state")).chunk(1_000);
    runner
        .plan(Plan::ids(1..=last).partition_size(50_000))
        .await?;
    let sum = Arc::new(AtomicU64::new(0));
    let report = runner
        .run_with_shutdown(Sum(sum.clone()), shutdown_signal())
        .await?;
    let done = report.this_runner.completed;
    if report.interrupted {
        println!("stopped by a signal: {done} partitions completed, the rest left");
    } else {
        let sum = sum.load(Ordering::Relaxed);
        println!("{done} partitions completed; the IDs sum to {sum}");
    }
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}
