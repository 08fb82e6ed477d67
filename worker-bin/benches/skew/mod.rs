//! The `skew` cell of the end-to-end bench (issue 25, "Time"): does a job's wall time
//! follow its total work, or its slowest partitions?
//!
//! 64 partitions of 1000 IDs on 4 shards, run by 4 `tranche run --exec` processes with
//! `--concurrency 4 --parallel 1 --prefetch 0` (16 chunk slots), in chunks of 50 IDs
//! (20 per partition). Every chunk of partition `p` is a real child that sleeps
//! `cost[p]`: a seeded Pareto draw (shape [`ALPHA`], seed [`SEED`]) scaled so the median
//! partition's chunk takes [`MEDIAN_S`] and capped at 50 times it; a few partitions are
//! 20-50 times the median (checked). The child (a bash script whose builtins read the
//! clock and the cost, so that it forks only its `sleep`) appends the IDs it processed
//! and its start and end to a log.
//!
//! `TRANCHE_BENCH_SKEW_WAYS` (e.g. `split`) runs only the ways named, comma-separated;
//! `TRANCHE_BENCH_SKEW_ARGS` (e.g. `--split-min 1`) adds `run` arguments to every way;
//! `TRANCHE_BENCH_SKEW_BIN` runs another `tranche` binary (one built from an older
//! commit, for a before/after).
//!
//! Reported per way of running (each a fresh namespace on the flushed server): the
//! job's wall time (start of the runs to the last one's exit, every partition counted
//! by the statistics), the ideal (total chunk-seconds slept ÷ 16 slots), their ratio,
//! and from the children's log whether every ID was processed and how many more than
//! once. Spawning a child (its guard, its shell, its `sleep`) costs a few ms of each
//! 50 ms chunk, so even a perfect balance sits a little above the ideal: the log's
//! chunk times also give the chunk-seconds the children really took (their `sleep` on a
//! busy machine), and the wall time over those ÷ 16 slots (`ratio_to_busy`), the
//! balance with the children's own cost taken out (not the time spent starting them).

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use tranche_testkit::TestRedis;

/// Partitions, IDs per partition, IDs per chunk.
const PARTITIONS: u64 = 64;
const SIZE: u64 = 1000;
const CHUNK: u64 = 50;
/// Processes x partitions each, one chunk in flight per partition.
const PROCESSES: usize = 4;
const CONCURRENCY: usize = 4;
const SHARDS: u32 = 4;
/// The draw: Pareto shape and seed (seed 8 gives three partitions at 20x or more).
const ALPHA: f64 = 0.9;
const SEED: u64 = 8;
/// The median partition's chunk cost, seconds, and the cap in medians.
const MEDIAN_S: f64 = 0.05;
const CAP: f64 = 50.0;

/// splitmix64: a seeded stream of u64s, so the costs are the same on every machine.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Chunk cost in seconds by partition (index 0 is pid 1), rounded to milliseconds.
fn costs() -> Vec<f64> {
    let mut rng = SplitMix(SEED);
    let draws: Vec<f64> = (0..PARTITIONS)
        .map(|_| (1.0 - rng.unit()).powf(-1.0 / ALPHA))
        .collect();
    let mut sorted = draws.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    draws
        .iter()
        .map(|d| ((d / median).min(CAP) * MEDIAN_S * 1000.0).round() / 1000.0)
        .collect()
}

/// One way of running the job: a label and the extra `run` arguments.
pub(crate) type Way = (&'static str, &'static [&'static str]);

/// Runs the job once each way, in turn, on `redis`; prints a row per way and returns
/// the cell's figures.
pub(crate) fn run(bin: &str, redis: &TestRedis, dir: &Path, ways: &[Way], repeat: usize) -> Value {
    let other = std::env::var("TRANCHE_BENCH_SKEW_BIN").ok();
    let bin = other.as_deref().unwrap_or(bin);
    let costs = costs();
    let mut sorted = costs.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    let heavy = costs.iter().filter(|c| **c >= 20.0 * median - 1e-9).count();
    assert!(
        heavy >= 2,
        "the draw has {heavy} partitions at 20x the median or more"
    );
    let chunks_per = SIZE / CHUNK;
    let chunk_seconds: f64 = costs.iter().sum::<f64>() * chunks_per as f64;
    let slots = (PROCESSES * CONCURRENCY) as f64;
    let ideal = chunk_seconds / slots;
    let longest = sorted[sorted.len() - 1] * chunks_per as f64;
    let dir = dir.join("skew");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("skew dir");
    let cost_file = dir.join("costs");
    let lines: Vec<String> = costs.iter().map(|c| format!("{c:.3}")).collect();
    std::fs::write(&cost_file, lines.join("\n") + "\n").expect("cost file");
    println!(
        "skew: {PARTITIONS} partitions x {chunks_per} chunks, {PROCESSES} processes x {CONCURRENCY}, \
         chunk cost median {median:.3} s, max {:.3} s ({heavy} partitions >= 20x), \
         ideal {ideal:.1} s, longest partition {longest:.1} s",
        sorted[sorted.len() - 1],
    );
    let only = std::env::var("TRANCHE_BENCH_SKEW_WAYS").ok();
    let ways = ways.iter().filter(|(label, _)| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|w| w.trim() == *label))
    });
    let mut rows = Vec::new();
    for (label, args) in ways {
        let mut runs: Vec<Value> = (0..repeat)
            .map(|i| once(bin, redis, &dir, &cost_file, args, &format!("{label}-{i}")))
            .collect();
        let wall = |v: &Value| v["wall_s"].as_f64().unwrap();
        runs.sort_by(|a, b| wall(a).total_cmp(&wall(b)));
        let (fastest, slowest) = (wall(&runs[0]), wall(&runs[runs.len() - 1]));
        let mut row = runs.swap_remove(runs.len() / 2);
        let ratio = wall(&row) / ideal;
        println!(
            "skew {label:>9}: wall {:.1} s ({fastest:.1}-{slowest:.1} over {repeat}), ideal {ideal:.1} s, \
             ratio {ratio:.2}; chunks took {:.1} s, wall over that / {slots}: {:.2}; \
             IDs processed more than once: {}",
            wall(&row),
            row["busy_s"].as_f64().unwrap(),
            row["ratio_to_busy"].as_f64().unwrap(),
            row["ids_repeated"],
        );
        row["way"] = json!(label);
        row["args"] = json!(args);
        row["runs"] = json!(repeat);
        row["wall_s_fastest"] = json!(fastest);
        row["wall_s_slowest"] = json!(slowest);
        row["ratio_to_ideal"] = json!(ratio);
        rows.push(row);
    }
    json!({
        "cell": "skew",
        "partitions": PARTITIONS,
        "chunks_per_partition": chunks_per,
        "processes": PROCESSES,
        "concurrency": CONCURRENCY,
        "shards": SHARDS,
        "seed": SEED,
        "alpha": ALPHA,
        "chunk_cost_median_s": median,
        "chunk_cost_max_s": sorted[sorted.len() - 1],
        "partitions_20x_median": heavy,
        "chunk_seconds": chunk_seconds,
        "ideal_s": ideal,
        "longest_partition_s": longest,
        "ways": rows,
    })
}

/// One run of the job on a flushed server.
fn once(
    bin: &str,
    redis: &TestRedis,
    dir: &Path,
    cost_file: &Path,
    args: &[&str],
    tag: &str,
) -> Value {
    redis.cli(&["FLUSHALL"]);
    let url = redis.url();
    let log = dir.join(format!("ids-{tag}"));
    let script = dir.join(format!("chunk-{tag}.sh"));
    // Bash's builtins read the clock and the cost: the child spawns only its
    // `sleep`, so the chunk-seconds it adds to the job's are a few ms a chunk.
    std::fs::write(
        &script,
        format!(
            "#!/bin/bash\nt0=$EPOCHREALTIME\nmapfile -t cost < '{}'\n\
             sleep \"${{cost[TRANCHE_PID - 1]}}\"\nt1=$EPOCHREALTIME\n\
             printf '%s %s %s %s000 %s000\\n' \"$TRANCHE_PID\" \"$TRANCHE_FROM\" \"$TRANCHE_TO\" \
             \"${{t0/./}}\" \"${{t1/./}}\" >> '{}'\n",
            cost_file.display(),
            log.display()
        ),
    )
    .expect("chunk script");
    let max = (PARTITIONS * SIZE).to_string();
    super::run_ok(super::tranche_at(
        bin,
        &url,
        &[
            "plan",
            "--min",
            "1",
            "--max",
            &max,
            "--size",
            &SIZE.to_string(),
            "--shards",
            &SHARDS.to_string(),
        ],
    ));
    let exec = format!("bash {}", script.display());
    let (chunk, concurrency) = (CHUNK.to_string(), CONCURRENCY.to_string());
    let started = Instant::now();
    let mut runs: Vec<_> = (0..PROCESSES)
        .map(|i| {
            let log = std::fs::File::create(dir.join(format!("run-{tag}-{i}.log"))).expect("log");
            let mut cmd = super::tranche_at(
                bin,
                &url,
                &[
                    "run",
                    "--exec",
                    &exec,
                    "--chunk",
                    &chunk,
                    "--parallel",
                    "1",
                    "--concurrency",
                    &concurrency,
                    "--prefetch",
                    "0",
                    "--worker-id",
                    &format!("skew-{i}"),
                ],
            );
            cmd.args(args);
            if let Ok(extra) = std::env::var("TRANCHE_BENCH_SKEW_ARGS") {
                cmd.args(extra.split_whitespace());
            }
            // The split and claim lines, with times, for reading a run's timeline.
            cmd.env("RUST_LOG", "warn,tranche=info");
            cmd.stdout(Stdio::null()).stderr(log);
            cmd.spawn().expect("spawn run")
        })
        .collect();
    for (i, run) in runs.iter_mut().enumerate() {
        let status = run.wait().expect("wait run");
        assert!(status.success(), "skew run {tag}-{i} exited {status}");
    }
    let wall = started.elapsed().as_secs_f64();
    let deadline = Instant::now() + Duration::from_secs(60);
    while super::total_completed(&url) < PARTITIONS {
        assert!(
            Instant::now() < deadline,
            "skew: statistics never counted every partition"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        super::total_completed(&url),
        PARTITIONS,
        "each partition counted once"
    );
    let (missing, repeated, busy) = coverage(&log);
    assert_eq!(missing, 0, "skew: {missing} IDs never processed");
    let slots = (PROCESSES * CONCURRENCY) as f64;
    json!({
        "wall_s": wall,
        "ids_repeated": repeated,
        "busy_s": busy,
        "ratio_to_busy": wall / (busy / slots),
    })
}

/// From the children's log: IDs never processed, IDs processed more than once, and
/// the seconds the chunks took (each from its start to its end, as the child read them).
fn coverage(log: &Path) -> (u64, u64, f64) {
    let mut seen = vec![0u32; (PARTITIONS * SIZE + 1) as usize];
    let mut busy_ns = 0u64;
    for line in std::fs::read_to_string(log).expect("ids log").lines() {
        // pid, first ID, last ID, then the chunk's start and end (ns since the epoch,
        // for reading a run's timeline by hand).
        let f: Vec<u64> = line.split(' ').map(|x| x.parse().expect("id")).collect();
        assert_eq!(
            f[0],
            (f[1] - 1) / SIZE + 1,
            "pid {} holds IDs {}..={}",
            f[0],
            f[1],
            f[2]
        );
        for id in f[1]..=f[2] {
            seen[id as usize] += 1;
        }
        busy_ns += f[4].saturating_sub(f[3]);
    }
    let missing = seen[1..].iter().filter(|n| **n == 0).count() as u64;
    let repeated = seen[1..].iter().filter(|n| **n > 1).count() as u64;
    (missing, repeated, busy_ns as f64 / 1e9)
}
