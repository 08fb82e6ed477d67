//! The library worker of `cargo xtask soak`: a [`Runner`] whose handler appends each
//! chunk's START and END to a ledger file, sleeps a little (the simulated work), and
//! panics once whenever the soak harness drops a trigger file (the "handler panic"
//! fault). It runs until SIGTERM or SIGINT, then drains.
//!
//! Everything comes from the environment the harness sets:
//!
//! - `TRANCHE_REDIS_URL`, `TRANCHE_NAMESPACE`: where the job is (without a Redis URL,
//!   `TRANCHE_STATE` names the embedded state file);
//! - `SOAK_LEDGER`: the ledger file, lines
//!   `START|END|PANIC|KILL pid from to worker chunk_pid time_us` (the same shape the
//!   `--exec` workers' script writes; `chunk_pid` is this process, as the chunk runs in
//!   it). KILL is written when the runner drops a chunk's future before it ended (its
//!   lease lost, its fence due, a drain's grace over): the chunk does nothing after it;
//!   without the line, the ledger would show it running to the end of the soak;
//! - `SOAK_WORKER`: this incarnation's name in the ledger;
//! - `SOAK_PANIC_FILE`: when this file exists, the next chunk takes it (renames it
//!   away) and panics;
//! - `SOAK_LEASE_MS`, `SOAK_CHUNK`, `SOAK_PARALLEL`, `SOAK_CONCURRENCY`: the runner's
//!   settings;
//! - `SOAK_WORK_MS`: the simulated work per chunk, `MIN-MAX` milliseconds (default
//!   `10-90`), spread by the chunk's own numbers.
//!
//! ```sh
//! cargo run -p tranche-worker --example soak_runner   # started by `cargo xtask soak`
//! ```

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tranche_worker::{Chunk, Handler, HandlerError, Runner};

/// The soak handler: a ledger line before and after a short sleep.
struct Ledger {
    /// The ledger, opened once for appending.
    file: File,
    worker: String,
    panic_file: Option<PathBuf>,
    /// The simulated work per chunk: `min + spread` ms at most.
    min_ms: u64,
    spread_ms: u64,
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
        (&self.file).write_all(line.as_bytes())
    }
}

/// Writes the KILL line of a chunk whose future is dropped before it wrote its END or
/// PANIC (`ended` set).
struct Unfinished<'a> {
    ledger: &'a Ledger,
    chunk: &'a Chunk,
    ended: bool,
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if !self.ended {
            let _ = self.ledger.line("KILL", self.chunk);
        }
    }
}

#[async_trait::async_trait]
impl Handler for Ledger {
    async fn process(&self, chunk: Chunk) -> Result<(), HandlerError> {
        self.line("START", &chunk)?;
        let mut unfinished = Unfinished {
            ledger: self,
            chunk: &chunk,
            ended: false,
        };
        // The simulated work, spread by the chunk's own numbers.
        let ms = self.min_ms + (chunk.from.wrapping_mul(2_654_435_761) >> 7) % self.spread_ms;
        tokio::time::sleep(Duration::from_millis(ms)).await;
        // Only a partition's first chunk takes the trigger: with more chunks than the
        // window, a first chunk that never finishes holds the partition's checkpoint.
        if let (Some(trigger), 0) = (&self.panic_file, chunk.index) {
            let taken = trigger.with_extension("taken");
            if std::fs::rename(trigger, &taken).is_ok() {
                unfinished.ended = true;
                self.line("PANIC", &chunk)?;
                panic!("soak: the injected handler panic (chunk {})", chunk.from);
            }
        }
        unfinished.ended = true;
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
    let ledger = env("SOAK_LEDGER")?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&ledger)
        .map_err(|e| format!("cannot open the ledger {ledger}: {e}"))?;
    let work = std::env::var("SOAK_WORK_MS").unwrap_or_else(|_| "10-90".into());
    let (min_ms, max_ms) = work
        .split_once('-')
        .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)))
        .filter(|(a, b)| a <= b)
        .ok_or_else(|| format!("SOAK_WORK_MS={work} is not MIN-MAX milliseconds"))?;
    let handler = Ledger {
        file,
        worker: env("SOAK_WORKER")?,
        panic_file: std::env::var_os("SOAK_PANIC_FILE").map(PathBuf::from),
        min_ms,
        spread_ms: max_ms - min_ms + 1,
    };
    let runner = match std::env::var("TRANCHE_REDIS_URL") {
        Ok(url) => Runner::redis(url),
        Err(_) => Runner::embedded(env("TRANCHE_STATE")?),
    };
    let runner = runner
        .namespace(env("TRANCHE_NAMESPACE")?)
        .worker_id(handler.worker.clone())
        .lease(Duration::from_millis(env_u64("SOAK_LEASE_MS", 3000)?))
        .chunk(env_u64("SOAK_CHUNK", 250)?)
        .parallel(env_u64("SOAK_PARALLEL", 1)? as usize)
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
