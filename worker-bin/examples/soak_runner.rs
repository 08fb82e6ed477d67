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
//! - `SOAK_LINE_LOCK`: a file this process holds locked (`flock`) while it writes a
//!   line, from the line's timestamp to its write: an aimed stop that finds it held
//!   thaws the process and strikes again, so that no line is dated before a freeze
//!   and written after it;
//! - `SOAK_PANIC_FILE`: when this file exists, the next chunk takes it (renames it
//!   away) and panics;
//! - `SOAK_LEASE_MS`, `SOAK_CHUNK`, `SOAK_PARALLEL`, `SOAK_CONCURRENCY`: the runner's
//!   settings;
//! - `SOAK_WORK_MS`: the simulated work per chunk, `MIN-MAX` milliseconds (default
//!   `10-90`), spread by the chunk's own numbers;
//! - `SOAK_SABOTAGE` (`cargo xtask soak --self-test` only): a worker broken on purpose,
//!   for the oracle aimed at it to prove it fails. `ignore-fence`: the work runs on a
//!   thread and writes its END even after the runner dropped the chunk (its lease lost),
//!   with no KILL line; `run-twice`: each chunk runs twice at once; `complete-twice`:
//!   each partition completed here is applied to the statistics a second time;
//!   `exit-on-reset`: the process exits at the first store call the library reports
//!   failed (`Event::StoreError`: a connection reset, Redis unreachable), as a worker
//!   that gives up on connection trouble would;
//!   `swallow-panic`: the panic trigger is taken, and neither panicked on nor written;
//!   `ignore-cut`: every chunk's lines claim the IDs up to its partition's planned end,
//!   as a holder that ran past a cut would. This ledger-level form is the real
//!   sabotage, not a stand-in: a handler only ever gets chunks the library cut to size,
//!   so one running its own loop to the planned end would write these same lines,
//!   while the library's only path past a cut (a lost reply to the cutting beat) now
//!   holds the lease frozen until a beat tells its end, and reaching it would take a
//!   sabotage switch inside the library;
//!   `never-throttle`: the handler acknowledges each chunk at once and a thread of its
//!   own does the work, in order, as fast as the library hands chunks out: the work
//!   goes on through a throttle, whatever the gate says.
//!
//! ```sh
//! cargo run -p tranche-worker --example soak_runner   # started by `cargo xtask soak`
//! ```

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tranche_worker::{Chunk, Event, Handler, HandlerError, Runner};

/// A sabotage switch of `SOAK_SABOTAGE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sabotage {
    IgnoreFence,
    RunTwice,
    CompleteTwice,
    ExitOnReset,
    SwallowPanic,
    IgnoreCut,
    NeverThrottle,
}

impl Sabotage {
    fn from_env() -> Option<Sabotage> {
        match std::env::var("SOAK_SABOTAGE").ok()?.as_str() {
            "ignore-fence" => Some(Sabotage::IgnoreFence),
            "run-twice" => Some(Sabotage::RunTwice),
            "complete-twice" => Some(Sabotage::CompleteTwice),
            "exit-on-reset" => Some(Sabotage::ExitOnReset),
            "swallow-panic" => Some(Sabotage::SwallowPanic),
            "ignore-cut" => Some(Sabotage::IgnoreCut),
            "never-throttle" => Some(Sabotage::NeverThrottle),
            // The ledger script's switches, or none.
            _ => None,
        }
    }
}

/// The ledger, and the lock its lines are written under.
struct LedgerFile {
    /// Opened once for appending.
    file: File,
    /// `SOAK_LINE_LOCK`: held (`flock`) from a line's timestamp to its write. The
    /// harness's aimed stop tries it after its SIGSTOP and thaws the process if it is
    /// held: a line stamped before a freeze and written after the thaw would date an
    /// END before what other workers did meanwhile. The mutex keeps it to one writer of
    /// this process at a time (its threads share the lock file's open description, on
    /// which a second `flock` would not wait, and the first one's unlock would free it).
    lock: Option<Mutex<File>>,
}

impl LedgerFile {
    /// Appends the ledger line `what` for `chunk`.
    fn write(&self, worker: &str, what: &str, chunk: &Chunk) -> std::io::Result<()> {
        let held = match &self.lock {
            Some(lock) => {
                let file = lock
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                file.lock()?;
                Some(file)
            }
            None => None,
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_micros();
        let line = format!(
            "{what} {} {} {} {worker} {} {now}\n",
            chunk.pid,
            chunk.from,
            chunk.to,
            std::process::id()
        );
        // One write of a line under PIPE_BUF to a file opened O_APPEND: atomic beside
        // the other writers of the same ledger.
        let written = (&self.file).write_all(line.as_bytes());
        if let Some(file) = held {
            file.unlock()?;
        }
        written
    }
}

/// The soak handler: a ledger line before and after a short sleep.
struct Ledger {
    /// The ledger, shared with the sabotages' threads.
    file: Arc<LedgerFile>,
    worker: String,
    panic_file: Option<PathBuf>,
    /// The simulated work per chunk: `min + spread` ms at most.
    min_ms: u64,
    spread_ms: u64,
    sabotage: Option<Sabotage>,
    /// Per partition, the IDs its chunks covered here (`complete-twice` only).
    covered: Arc<Mutex<HashMap<u64, (u64, u64)>>>,
    /// `never-throttle`: the thread that does the chunks' work, fed here.
    backlog: Option<std::sync::mpsc::Sender<Chunk>>,
}

impl Ledger {
    fn line(&self, what: &str, chunk: &Chunk) -> std::io::Result<()> {
        if self.sabotage == Some(Sabotage::IgnoreCut) {
            // Each chunk runs to the end of its partition as planned (the soak plans
            // partitions of 1000 IDs from ID 1), whatever was cut off and handed away.
            let end = (chunk.from - 1) / 1000 * 1000 + 1000;
            let whole = Chunk { to: end, ..*chunk };
            return self.file.write(&self.worker, what, &whole);
        }
        self.file.write(&self.worker, what, chunk)
    }

    fn work_ms(&self, chunk: &Chunk) -> u64 {
        self.min_ms + (chunk.from.wrapping_mul(2_654_435_761) >> 7) % self.spread_ms
    }

    /// `ignore-fence`: the work on a thread of its own, which writes its END whatever
    /// becomes of the chunk's future.
    async fn unfenced(&self, chunk: &Chunk) -> Result<(), HandlerError> {
        self.line("START", chunk)?;
        let file = Arc::clone(&self.file);
        let (worker, copy, ms) = (self.worker.clone(), *chunk, self.work_ms(chunk));
        let (done, finished) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(ms));
            let _ = done.send(file.write(&worker, "END", &copy));
        });
        finished.await.map_err(std::io::Error::other)??;
        Ok(())
    }

    /// `never-throttle`: a thread that does each chunk sent to it, in order, whenever
    /// it gets to it: nothing it does waits for the gate.
    fn spawn_backlog(&self) -> std::sync::mpsc::Sender<Chunk> {
        let (tx, rx) = std::sync::mpsc::channel::<Chunk>();
        let file = Arc::clone(&self.file);
        let worker = self.worker.clone();
        let (min_ms, spread_ms) = (self.min_ms, self.spread_ms);
        std::thread::spawn(move || {
            for chunk in rx {
                let ms = min_ms + (chunk.from.wrapping_mul(2_654_435_761) >> 7) % spread_ms;
                let _ = file.write(&worker, "START", &chunk);
                std::thread::sleep(Duration::from_millis(ms));
                let _ = file.write(&worker, "END", &chunk);
            }
        });
        tx
    }

    /// `run-twice`: a second run of the chunk beside the first.
    async fn twin(&self, chunk: &Chunk) -> Result<(), HandlerError> {
        self.line("START", chunk)?;
        tokio::time::sleep(Duration::from_millis(self.work_ms(chunk))).await;
        self.line("END", chunk)?;
        Ok(())
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
        if self.sabotage == Some(Sabotage::CompleteTwice) {
            let mut covered = self.covered.lock().unwrap();
            let span = covered.entry(chunk.pid).or_insert((chunk.from, chunk.to));
            *span = (span.0.min(chunk.from), span.1.max(chunk.to));
        }
        match self.sabotage {
            Some(Sabotage::IgnoreFence) => return self.unfenced(&chunk).await,
            Some(Sabotage::NeverThrottle) => {
                if let Some(backlog) = &self.backlog {
                    backlog.send(chunk).map_err(std::io::Error::other)?;
                }
                return Ok(());
            }
            Some(Sabotage::RunTwice) => {
                let (a, b) = tokio::join!(self.chunk(&chunk), self.twin(&chunk));
                return a.and(b);
            }
            _ => {}
        }
        self.chunk(&chunk).await
    }
}

impl Ledger {
    async fn chunk(&self, chunk: &Chunk) -> Result<(), HandlerError> {
        self.line("START", chunk)?;
        let mut unfinished = Unfinished {
            ledger: self,
            chunk,
            ended: false,
        };
        // The simulated work, spread by the chunk's own numbers.
        tokio::time::sleep(Duration::from_millis(self.work_ms(chunk))).await;
        // Only a partition's first chunk takes the trigger: with more chunks than the
        // window, a first chunk that never finishes holds the partition's checkpoint.
        if let (Some(trigger), 0) = (&self.panic_file, chunk.index) {
            let taken = trigger.with_extension("taken");
            if std::fs::rename(trigger, &taken).is_ok()
                && self.sabotage != Some(Sabotage::SwallowPanic)
            {
                unfinished.ended = true;
                self.line("PANIC", chunk)?;
                panic!("soak: the injected handler panic (chunk {})", chunk.from);
            }
        }
        unfinished.ended = true;
        self.line("END", chunk)?;
        Ok(())
    }
}

/// `complete-twice`: applies each partition completed here (`done`) to the statistics
/// of the first shard a second time, as a completion counted twice would, through the
/// statistics' own delta script.
async fn complete_again(
    url: String,
    namespace: String,
    worker: String,
    covered: Arc<Mutex<HashMap<u64, (u64, u64)>>>,
    mut done: tokio::sync::mpsc::UnboundedReceiver<u64>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    use tranche_stats::archive_protocol::{APPLY_DELTA_LUA, delta_args};
    let mut conn = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    // Shard 0's statistics keys, as the job's plan named them (the tags depend on its
    // shard count and layout): `{tag}:stats:global` and the rest, once they exist.
    let global = loop {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("*{namespace}*:stats:global"))
            .query_async(&mut conn)
            .await?;
        match keys.into_iter().min() {
            Some(key) => break key,
            None => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    };
    let tag = global.trim_end_matches("stats:global").to_owned();
    let keys = ["global", "workers", "ranges", "hourly", "hist"].map(|s| format!("{tag}stats:{s}"));
    // apply.lua of the statistics crate, whose test hook is not in this build.
    let script = redis::Script::new(&format!(
        "{}\nreturn apply_stats(1, 1, true)",
        tranche_codec::lua::compose(&[&APPLY_DELTA_LUA])
    ));
    let worker: Arc<str> = Arc::from(worker.as_str());
    while let Some(pid) = done.recv().await {
        let Some((min_id, max_id)) = covered.lock().unwrap().remove(&pid) else {
            continue;
        };
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as u64;
        let record = tranche_codec::CompletedRecord {
            pid,
            min_id,
            max_id,
            worker: Arc::clone(&worker),
            completed_at_ms: now_ms,
            duration_ms: 1,
        };
        let delta = tranche_stats::StatsDelta::from_records(&[record]);
        let mut call = script.prepare_invoke();
        for key in &keys {
            call.key(key);
        }
        for arg in delta_args(&delta, now_ms) {
            call.arg(arg);
        }
        if let Err(err) = call.invoke_async::<i64>(&mut conn).await {
            eprintln!("soak_runner: complete-twice: {err}");
        }
    }
    Ok(())
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
    let lock = match std::env::var_os("SOAK_LINE_LOCK") {
        Some(path) => Some(Mutex::new(
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .map_err(|e| format!("cannot open the line lock {}: {e}", path.display()))?,
        )),
        None => None,
    };
    let sabotage = Sabotage::from_env();
    let mut handler = Ledger {
        file: Arc::new(LedgerFile { file, lock }),
        worker: env("SOAK_WORKER")?,
        panic_file: std::env::var_os("SOAK_PANIC_FILE").map(PathBuf::from),
        min_ms,
        spread_ms: max_ms - min_ms + 1,
        sabotage,
        covered: Arc::default(),
        backlog: None,
    };
    if sabotage == Some(Sabotage::NeverThrottle) {
        handler.backlog = Some(handler.spawn_backlog());
    }
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
    let url = std::env::var("TRANCHE_REDIS_URL").ok();
    let runner = match (sabotage, url) {
        (Some(Sabotage::CompleteTwice), Some(url)) => {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            let again = complete_again(
                url,
                env("TRANCHE_NAMESPACE")?,
                handler.worker.clone(),
                Arc::clone(&handler.covered),
                rx,
            );
            tokio::spawn(async move {
                if let Err(err) = again.await {
                    eprintln!("soak_runner: complete-twice: {err}");
                }
            });
            runner.on_event(move |event| {
                if let Event::PartitionDone { pid, .. } = event {
                    let _ = tx.send(*pid);
                }
            })
        }
        (Some(Sabotage::ExitOnReset), Some(_)) => runner.on_event(|event| {
            if let Event::StoreError { op, error } = event {
                eprintln!("soak_runner: exit-on-reset: {op} failed ({error}); exiting");
                std::process::exit(3);
            }
        }),
        _ => runner,
    };
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
