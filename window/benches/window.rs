//! `cargo bench -p tranche-window --bench window`: the seed's `BenchmarkMultithreading`
//! table, and the raw cost of a `next` + `ack` pair against the tracker a Rust user
//! would otherwise write.
//!
//! Prints readable tables and writes the figures as JSON to `$TRANCHE_BENCH_OUT`
//! (default `target/tranche-bench/window.json` in the workspace). Pass `raw` or
//! `threads` to run only one part (the JSON then holds only that part's figures).

use std::collections::BTreeSet;
use std::future::Future;
use std::hint::black_box;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tokio::sync::{Notify, Semaphore, oneshot, watch};
use tokio::task::JoinSet;
use tranche_window::SlidingWindow;

/// The mean of the seed's per-item sleep, `rand.Int31n(50)` ms.
const MEAN_SLEEP: Duration = Duration::from_micros(24_500);
const THREADS: [usize; 4] = [10, 100, 1000, 10_000];
const MULTIPLIERS: [f64; 8] = [1.0, 1.3, 1.5, 1.8, 2.0, 3.0, 5.0, 10.0];
const REPEATS: usize = 3;

fn main() {
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let wants = |part: &str| only.is_empty() || only.iter().any(|a| a == part);

    let mut report = serde_json::Map::new();
    if wants("raw") {
        let window = raw_overheads::<Window>();
        let tracker = raw_overheads::<BTreeTracker>();
        print_raw(&window, &tracker);
        report.insert("raw_ns".into(), window.to_json());
        report.insert("btreeset_tracker_ns".into(), tracker.to_json());
    }
    if wants("threads") {
        let (cells, ceiling) = multithreading();
        report.insert("cells".into(), Value::Array(cells));
        report.insert("ceiling".into(), Value::Array(ceiling));
    }

    let out = std::env::var_os("TRANCHE_BENCH_OUT").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/tranche-bench/window.json"),
        PathBuf::from,
    );
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).expect("create the benchmark output directory");
    }
    let text = serde_json::to_string_pretty(&Value::Object(report)).expect("serialise");
    std::fs::write(&out, text + "\n").expect("write the benchmark output");
    println!("\nwrote {}", out.display());
}

// ---------------------------------------------------------------------------------
// Part 1: BenchmarkMultithreading.
// ---------------------------------------------------------------------------------

/// What a holder takes numbers from: the window, or nothing at all (the ceiling).
#[derive(Clone)]
enum Source {
    Window(SlidingWindow),
    Unbounded(Arc<AtomicU64>),
}

impl Source {
    async fn next(&self) -> Option<u64> {
        match self {
            Source::Window(w) => w.next().await.ok(),
            Source::Unbounded(n) => Some(n.fetch_add(1, Ordering::Relaxed)),
        }
    }

    fn ack(&self, sn: u64) {
        if let Source::Window(w) = self {
            w.ack(sn).expect("every number is acked once");
        }
    }

    fn close(&self) {
        if let Source::Window(w) = self {
            w.close();
        }
    }
}

/// Runs `threads` holders against `source` until `ops` numbers have been handed out,
/// and returns numbers handed out per second, timed until the last one.
fn run_cell(rt: &tokio::runtime::Runtime, threads: usize, ops: u64, source: Source) -> f64 {
    rt.block_on(async {
        let (go_tx, go_rx) = watch::channel(false);
        let (end_tx, end_rx) = oneshot::channel::<Instant>();
        let end_tx = Arc::new(Mutex::new(Some(end_tx)));
        let mut holders = JoinSet::new();
        for h in 0..threads {
            let source = source.clone();
            let mut go = go_rx.clone();
            let end_tx = end_tx.clone();
            let mut rng = SmallRng::seed_from_u64(h as u64);
            holders.spawn(async move {
                go.wait_for(|go| *go).await.expect("start signal");
                while let Some(sn) = source.next().await {
                    if sn + 1 >= ops {
                        if sn + 1 == ops {
                            let tx = end_tx.lock().unwrap().take().expect("one last number");
                            let _ = tx.send(Instant::now());
                        }
                        return;
                    }
                    precise_sleep(Duration::from_millis(rng.random_range(0..50))).await;
                    source.ack(sn);
                }
            });
        }
        // Let every holder reach the start line before the clock starts.
        tokio::task::yield_now().await;
        let start = Instant::now();
        go_tx.send(true).expect("holders listen");
        let end = end_rx.await.expect("the last number is handed out");
        source.close();
        while holders.join_next().await.is_some() {}
        ops as f64 / (end - start).as_secs_f64()
    })
}

/// Sleeps for `d`, waking as close to the deadline as the timer allows.
async fn precise_sleep(d: Duration) {
    tokio::time::sleep(d).await;
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn multithreading() -> (Vec<Value>, Vec<Value>) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_time()
        .build()
        .expect("tokio runtime");
    let mut cells = Vec::new();
    let mut ceiling = Vec::new();
    println!("BenchmarkMultithreading: T holders, each item sleeps uniform 0-49 ms then acks;");
    println!("efficiency = op/s / (T / 24.5 ms); median of {REPEATS} runs of about 1 s.\n");
    println!(
        "{:>7} {:>8} {:>11} {:>10} {:>12}",
        "threads", "window", "op/s", "efficiency", "of ceiling"
    );
    for &threads in &THREADS {
        let ideal = threads as f64 / MEAN_SLEEP.as_secs_f64();
        let ops = ideal.round() as u64;
        let free = median(
            (0..REPEATS)
                .map(|_| run_cell(&rt, threads, ops, Source::Unbounded(Default::default())))
                .collect(),
        );
        println!(
            "{threads:>7} {:>8} {free:>11.0} {:>10.3} {:>12}",
            "none",
            free / ideal,
            "1.000"
        );
        ceiling.push(json!({"threads": threads, "ops_per_s": free, "efficiency": free / ideal}));
        for &m in &MULTIPLIERS {
            let size = (threads as f64 * m).round() as usize;
            let rate = median(
                (0..REPEATS)
                    .map(|_| {
                        let w = SlidingWindow::new(size, 0);
                        run_cell(&rt, threads, ops, Source::Window(w))
                    })
                    .collect(),
            );
            println!(
                "{:>7} {:>7.1}x {rate:>11.0} {:>10.3} {:>12.3}",
                "",
                m,
                rate / ideal,
                rate / free
            );
            cells.push(json!({
                "threads": threads,
                "multiplier": m,
                "ops_per_s": rate,
                "efficiency": rate / ideal,
            }));
        }
    }
    (cells, ceiling)
}

// ---------------------------------------------------------------------------------
// Part 2: raw overhead per next + ack pair.
// ---------------------------------------------------------------------------------

/// The operations the raw benchmarks need, implemented by the window and by the
/// tracker it is compared with. None of the runs below ever has to wait.
trait Pairs: Send + Sync + 'static {
    fn new(size: usize) -> Self;
    fn next_sync(&self) -> u64;
    fn next_async(&self) -> impl Future<Output = u64> + Send;
    fn ack(&self, sn: u64);
}

struct Window(SlidingWindow);

impl Pairs for Window {
    fn new(size: usize) -> Self {
        Window(SlidingWindow::new(size, 0))
    }
    fn next_sync(&self) -> u64 {
        self.0.next_blocking().unwrap()
    }
    async fn next_async(&self) -> u64 {
        self.0.next().await.unwrap()
    }
    fn ack(&self, sn: u64) {
        self.0.ack(sn).unwrap();
    }
}

/// The tracker a Rust user would otherwise write: the outstanding numbers in a
/// `Mutex<BTreeSet>`, a semaphore for the free slots, a `Notify` for `wait`.
struct BTreeTracker {
    state: Mutex<TrackerState>,
    slots: Semaphore,
    progress: Notify,
}

struct TrackerState {
    outstanding: BTreeSet<u64>,
    next: u64,
    low: u64,
}

impl BTreeTracker {
    fn issue(&self) -> u64 {
        let mut state = self.state.lock().unwrap();
        let sn = state.next;
        state.next += 1;
        state.outstanding.insert(sn);
        sn
    }
}

impl Pairs for BTreeTracker {
    fn new(size: usize) -> Self {
        BTreeTracker {
            state: Mutex::new(TrackerState {
                outstanding: BTreeSet::new(),
                next: 0,
                low: 0,
            }),
            slots: Semaphore::new(size),
            progress: Notify::new(),
        }
    }
    fn next_sync(&self) -> u64 {
        loop {
            if let Ok(permit) = self.slots.try_acquire() {
                permit.forget();
                return self.issue();
            }
            std::thread::yield_now();
        }
    }
    async fn next_async(&self) -> u64 {
        self.slots.acquire().await.unwrap().forget();
        self.issue()
    }
    fn ack(&self, sn: u64) {
        let freed = {
            let mut state = self.state.lock().unwrap();
            assert!(state.outstanding.remove(&sn), "acked once");
            let low = state.outstanding.first().copied().unwrap_or(state.next);
            let freed = low - state.low;
            state.low = low;
            freed
        };
        if freed > 0 {
            self.slots.add_permits(freed as usize);
            self.progress.notify_waiters();
        }
    }
}

#[derive(Debug)]
struct Raw {
    in_order: f64,
    random_64: f64,
    random_1000: f64,
    async_: f64,
    contended: f64,
    /// Not in the JSON: how much the contended run really interleaved.
    interleaved: f64,
}

impl Raw {
    fn to_json(&self) -> Value {
        json!({
            "in_order": self.in_order,
            "random_64": self.random_64,
            "random_1000": self.random_1000,
            "async": self.async_,
            "contended": self.contended,
        })
    }
}

const RAW_PAIRS: usize = 1_000_000;
const RAW_REPEATS: usize = 7;

/// Median ns per pair over `RAW_REPEATS` runs of `run`, which does `pairs` pairs.
fn ns_per_pair(pairs: usize, mut run: impl FnMut() -> Duration) -> f64 {
    run(); // warm up caches, the allocator and the branch predictors
    median(
        (0..RAW_REPEATS)
            .map(|_| run().as_nanos() as f64 / pairs as f64)
            .collect(),
    )
}

fn raw_overheads<P: Pairs>() -> Raw {
    let in_order = ns_per_pair(RAW_PAIRS, || {
        let p = P::new(1024);
        let start = Instant::now();
        for _ in 0..RAW_PAIRS {
            let sn = p.next_sync();
            p.ack(black_box(sn));
        }
        start.elapsed()
    });
    let random = |in_flight: usize| {
        let size = in_flight * 16;
        let schedule = ack_schedule(in_flight, size, RAW_PAIRS);
        ns_per_pair(RAW_PAIRS, || {
            let p = P::new(size);
            let mut held: Vec<u64> = (0..in_flight).map(|_| p.next_sync()).collect();
            let start = Instant::now();
            for &i in &schedule {
                let slot = &mut held[i as usize];
                p.ack(*slot);
                *slot = p.next_sync();
            }
            start.elapsed()
        })
    };
    let random_64 = random(64);
    let random_1000 = random(1000);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("tokio runtime");
    let async_ = ns_per_pair(RAW_PAIRS, || {
        let p = P::new(1024);
        rt.block_on(async {
            let start = Instant::now();
            for _ in 0..RAW_PAIRS {
                let sn = p.next_async().await;
                p.ack(black_box(sn));
            }
            start.elapsed()
        })
    });
    // Both threads start together and the run lasts until the later one is done. A
    // machine busy with other work may run the two on one core by turns, where they
    // hardly contend; `interleaved` tells: the share of numbers whose predecessor
    // went to the other thread.
    let mut handoffs = Vec::new();
    let contended = ns_per_pair(RAW_PAIRS, || {
        let p = Arc::new(P::new(1024));
        let barrier = Arc::new(Barrier::new(3));
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let p = p.clone();
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    barrier.wait();
                    let (mut last, mut handoffs) = (u64::MAX - 1, 0u64);
                    for _ in 0..RAW_PAIRS / 2 {
                        let sn = p.next_sync();
                        handoffs += u64::from(sn != last + 1);
                        last = sn;
                        p.ack(black_box(sn));
                    }
                    handoffs
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        let total: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
        let elapsed = start.elapsed();
        handoffs.push(total as f64 / RAW_PAIRS as f64);
        elapsed
    });
    let interleaved = median(handoffs);
    Raw {
        in_order,
        random_64,
        random_1000,
        async_,
        contended,
        interleaved,
    }
}

/// Which held number to ack at each step so that `in_flight` stay held, acks come in
/// random order, and the window of `size` never fills (the oldest is acked first
/// when it would): both implementations replay the same schedule without waiting.
fn ack_schedule(in_flight: usize, size: usize, steps: usize) -> Vec<u32> {
    let mut rng = SmallRng::seed_from_u64(7);
    let mut held: Vec<u64> = (0..in_flight as u64).collect();
    let mut outstanding: BTreeSet<u64> = held.iter().copied().collect();
    let mut schedule = Vec::with_capacity(steps);
    for next in (in_flight as u64..).take(steps) {
        let mut i = rng.random_range(0..in_flight);
        let oldest = *outstanding.first().unwrap();
        let low_after = if held[i] == oldest {
            outstanding.iter().nth(1).copied().unwrap_or(next)
        } else {
            oldest
        };
        if next >= low_after + size as u64 {
            i = held.iter().position(|&sn| sn == oldest).unwrap();
        }
        outstanding.remove(&held[i]);
        held[i] = next;
        outstanding.insert(next);
        schedule.push(i as u32);
    }
    schedule
}

fn print_raw(window: &Raw, tracker: &Raw) {
    println!(
        "Raw overhead per next + ack pair, ns (median of {RAW_REPEATS} runs of {RAW_PAIRS} pairs)\n"
    );
    println!(
        "{:<34} {:>10} {:>16} {:>8}",
        "", "window", "BTreeSet tracker", "speed-up"
    );
    let rows = [
        ("in order (sync)", window.in_order, tracker.in_order),
        (
            "64 in flight, random acks",
            window.random_64,
            tracker.random_64,
        ),
        (
            "1000 in flight, random acks",
            window.random_1000,
            tracker.random_1000,
        ),
        (
            "async, current-thread runtime",
            window.async_,
            tracker.async_,
        ),
        (
            "two threads contending",
            window.contended,
            tracker.contended,
        ),
    ];
    for (name, w, t) in rows {
        println!("{name:<34} {w:>10.1} {t:>16.1} {:>7.1}x", t / w);
    }
    println!(
        "(contended runs interleaved: window {:.0} %, tracker {:.0} % of numbers)",
        window.interleaved * 100.0,
        tracker.interleaved * 100.0
    );
    println!();
}
