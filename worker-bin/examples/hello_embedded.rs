//! The smallest tranche job: embedded (no Redis, state in a temporary file), a handler
//! that sums its chunks, and the report.
//!
//! `cargo run -p tranche-worker --example hello_embedded`

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tranche_worker::{Chunk, Handler, HandlerError, Plan, Runner};

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
async fn main() -> Result<(), tranche_worker::Error> {
    let dir = std::env::temp_dir().join(format!("tranche-hello-{}", std::process::id()));
    let runner = Runner::embedded(dir.join("hello.state")).chunk(1_000);
    runner
        .plan(Plan::ids(1..=1_000_000).partition_size(50_000))
        .await?;
    let sum = Arc::new(AtomicU64::new(0));
    let report = runner.run(Sum(sum.clone())).await?;
    println!(
        "{} partitions completed; the IDs sum to {}",
        report.this_runner.completed,
        sum.load(Ordering::Relaxed)
    );
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}
