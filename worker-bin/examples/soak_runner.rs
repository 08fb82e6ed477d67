//! The library worker of `cargo xtask soak`: a [`Runner`] whose handler appends each
//! chunk's START and END to a ledger file, sleeps a little (the simulated work), and
//! panics once whenever the soak harness drops a trigger file (the "handler panic"
//! fault). It runs until SIGTERM or SIGINT, then drains.
//!
//! Everything comes from the environment the harness sets:
//!
//! - `TRANCHE_REDIS_URL`, `TRANCHE_NAMESPACE`: where the job is;
//! - `SOAK_LEDGER`: the ledger file, lines
//!   `START|END|PANIC pid from to worker chunk_pid time_us` (the same shape the `--exec`
//!   workers' script writes; `chunk_pid` is this process, as the chunk runs in it);
//! - `SOAK_WORKER`: this incarnation's name in the ledger;
//! - `SOAK_PANIC_FILE`: when this file exists, the next chunk takes it (renames it
//!   away) and panics;
//! - `SOAK_LEASE_MS`, `SOAK_CHUNK`, `SOAK_CONCURRENCY`: the runner's settings.
//!
//! ```sh
//! cargo run -p tranche-worker --example soak_runner   # started by `cargo xtask soak`
//! ```

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tranche_worker::runner::{Chunk, Handler, HandlerError, Runner};

/// The soak handler: a ledger line before and after a short sleep.
struct Ledger {
    file: PathBuf,
    worker: String,
    panic_file: Option<PathBuf>,
}

impl Ledger {
    fn line(&self, what: &str, chunk: &Chunk) -> std::io::Result<()> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_micros();
        let line = format!(
            "{what} {} {} {} {} {} {now}\n",
            chunk.pid,
            chunk.from,
            chunk.to,
            self.worker,
            std::process::id()
        );
        // One write of a line under PIPE_BUF to a file opened O_APPEND: atomic beside
        // the other writers of the same ledger.
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.file)?
            .write_all(line.as_bytes())
    }
}

#[async_trait::async_trait]
impl Handler for Ledger {
    async fn process(&self, chunk: Chunk) -> Result<(), HandlerError> {
        self.line("START", &chunk)?;
        // 10..90 ms of simulated work, spread by the chunk's own numbers.
        let ms = 10 + (chunk.from.wrapping_mul(2_654_435_761) >> 7) % 80;
        tokio::time::sleep(Duration::from_millis(ms)).await;
        // Only a partition's first chunk takes the trigger: with more chunks than the
        // window, a first chunk that never finishes holds the partition's checkpoint.
        if let (Some(trigger), 0) = (&self.panic_file, chunk.index) {
            let taken = trigger.with_extension("taken");
            if std::fs::rename(trigger, &taken).is_ok() {
                self.line("PANIC", &chunk)?;
                panic!("soak: the injected handler panic (chunk {})", chunk.from);
            }
        }
        self.line("END", &chunk)?;
        Ok(())
    }
}

fn env(name: &str) -> Result<String, Box<dyn std::error::Error>> {
    std::env::var(name).map_err(|_| format!("{name} is not set").into())
}

fn env_u64(name: &str, default: u64) -> Result<u64, Box<dyn std::error::Error>> {
    match std::env::var(name) {
        Ok(v) => Ok(v
            .parse()
            .map_err(|_| format!("{name}={v} is not a number"))?),
        Err(_) => Ok(default),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let handler = Ledger {
        file: env("SOAK_LEDGER")?.into(),
        worker: env("SOAK_WORKER")?,
        panic_file: std::env::var_os("SOAK_PANIC_FILE").map(PathBuf::from),
    };
    let runner = Runner::redis(env("TRANCHE_REDIS_URL")?)
        .namespace(env("TRANCHE_NAMESPACE")?)
        .worker_id(handler.worker.clone())
        .lease(Duration::from_millis(env_u64("SOAK_LEASE_MS", 3000)?))
        .chunk(env_u64("SOAK_CHUNK", 250)?)
        .concurrency(env_u64("SOAK_CONCURRENCY", 2)? as usize)
        .grace(Duration::from_secs(2))
        .follow(true);
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("a SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    let report = runner.run_with_shutdown(handler, shutdown).await?;
    let mine = &report.this_runner;
    eprintln!(
        "soak_runner: {} completed, {} failed attempts, {} released",
        mine.completed, mine.attempts_failed, mine.released
    );
    Ok(())
}
