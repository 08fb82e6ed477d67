//! Codec benchmark: bytes per partition and single-thread encode/decode records/s of
//! JSON, text v1, binary v2, binary v2 + zstd and binary v2 with ranked workers (flag bit
//! 2, what archive format 2 seals with), on 1,000,000 records in three sets
//! sealed in batches of 1000:
//!
//! - **S**, seed-shaped: 8 workers each taking the next free partition, durations
//!   uniform in 200..=400 whole seconds, uniform 1000-ID ranges;
//! - **M**, the same with millisecond times and durations;
//! - **N**, set S with 5 % of ranges non-uniform.
//!
//! Every encoding must round-trip every set, and the size targets (on S binary v2 at
//! most 6 bytes per partition and v2 + zstd at most 4; on M the best at most 6) must
//! hold: otherwise the benchmark exits non-zero. Speeds are reported, not enforced,
//! because they depend on the machine and its load. Figures go to the table on stdout
//! and as JSON to `$TRANCHE_BENCH_OUT` (default `target/tranche-bench/codec.json`).
//!
//! With `TRANCHE_BENCH_SMOKE=1` each set has 20,000 records and one run: a few
//! seconds, every encoding and round trip still checked, the sizes printed but not
//! judged (they depend on the set's size), JSON still written.
//!
//! Run with `cargo bench -p tranche-codec --bench codec`.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Map, Value, json};
use tranche_codec::{
    BinaryV2Options, CompletedRecord, WorkerDict, decode_binary_v2, decode_json, decode_text_v1,
    encode_binary_v2, encode_json, encode_text_v1,
};

const BATCH_SIZE: u64 = 1000;
const WORKERS: usize = 8;
const SEED: u64 = 0x0074_7261_6e63_6865;
const ZSTD_LEVEL: i32 = 19;
/// The sizes of a run: full, or small for `TRANCHE_BENCH_SMOKE=1`.
struct Scale {
    /// Records per set.
    records: u64,
    /// Timed runs per encode and decode figure.
    runs: usize,
    /// Smoke mode: the size targets are printed, not judged.
    smoke: bool,
}

static SCALE: std::sync::LazyLock<Scale> = std::sync::LazyLock::new(|| {
    if std::env::var("TRANCHE_BENCH_SMOKE").is_ok_and(|v| v == "1") {
        Scale {
            records: 20_000,
            runs: 1,
            smoke: true,
        }
    } else {
        Scale {
            records: 1_000_000,
            runs: 5,
            smoke: false,
        }
    }
});

const ENCODINGS: [&str; 5] = [
    "json",
    "text_v1",
    "binary_v2",
    "binary_v2_zstd",
    "binary_v2_ranks",
];

/// One generated set.
#[derive(Clone, Copy)]
enum Set {
    Seconds,
    Millis,
    NonUniform,
}

impl Set {
    const ALL: [Set; 3] = [Set::Seconds, Set::Millis, Set::NonUniform];

    fn name(self) -> &'static str {
        match self {
            Set::Seconds => "S",
            Set::Millis => "M",
            Set::NonUniform => "N",
        }
    }
}

/// The records of `set`, grouped into batches of `BATCH_SIZE` pids (pid / 1000), in
/// pid order. Pids start at 1, as in the seed, so the first batch is partial.
fn generate(set: Set) -> Vec<(u64, Vec<CompletedRecord>)> {
    let mut rng = StdRng::seed_from_u64(SEED);
    let epoch_ms = 1_719_234_000_000u64;
    let mut free_at = [epoch_ms; WORKERS];
    let names: Vec<Arc<str>> = (1..=WORKERS).map(|w| format!("worker{w}").into()).collect();
    let mut batches: Vec<(u64, Vec<CompletedRecord>)> = Vec::new();
    for pid in 1..=SCALE.records {
        // The worker that frees up first takes the next partition.
        let w = (0..WORKERS).min_by_key(|&w| free_at[w]).unwrap_or(0);
        let duration_ms = match set {
            Set::Millis => rng.random_range(200_000..=400_000),
            Set::Seconds | Set::NonUniform => rng.random_range(200..=400u64) * 1000,
        };
        let completed_at_ms = free_at[w] + duration_ms;
        free_at[w] = completed_at_ms;
        let (mut min_id, mut max_id) = ((pid - 1) * 1000 + 1, pid * 1000);
        if matches!(set, Set::NonUniform) && rng.random_bool(0.05) {
            min_id += rng.random_range(0..1000);
            max_id = min_id + rng.random_range(0..2000);
        }
        let record = CompletedRecord {
            pid,
            min_id,
            max_id,
            worker: Arc::clone(&names[w]),
            completed_at_ms,
            duration_ms,
        };
        let batch_id = pid / BATCH_SIZE;
        match batches.last_mut() {
            Some((id, records)) if *id == batch_id => records.push(record),
            _ => batches.push((batch_id, vec![record])),
        }
    }
    batches
}

/// What one encoding of one set measured.
struct Measure {
    bytes_per_partition: f64,
    encode_per_s: f64,
    decode_per_s: f64,
    round_trips: bool,
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Runs `encode` and `decode` `SCALE.runs` times each over all batches, as a consumer would
/// stream them: each batch is timed on its own, and checking and dropping what it
/// decoded to are not timed. Bytes come from the last encode.
fn measure<E>(
    batches: &[(u64, Vec<CompletedRecord>)],
    encode: impl Fn(u64, &[CompletedRecord]) -> E,
    size: impl Fn(&E) -> usize,
    decode: impl Fn(&E) -> Option<Vec<CompletedRecord>>,
) -> Measure {
    let records = batches.iter().map(|(_, b)| b.len()).sum::<usize>() as f64;
    let mut encoded = Vec::new();
    let mut encode_rates = Vec::new();
    for _ in 0..SCALE.runs {
        drop(std::mem::take(&mut encoded));
        let start = Instant::now();
        encoded = batches
            .iter()
            .map(|(id, b)| black_box(encode(*id, b)))
            .collect();
        encode_rates.push(records / start.elapsed().as_secs_f64());
    }
    let bytes = encoded.iter().map(&size).sum::<usize>() as f64;
    let mut decode_rates = Vec::new();
    let mut round_trips = true;
    for _ in 0..SCALE.runs {
        let mut elapsed = Duration::ZERO;
        for (e, (_, batch)) in encoded.iter().zip(batches) {
            let start = Instant::now();
            let decoded = black_box(decode(e));
            elapsed += start.elapsed();
            round_trips &= decoded.as_deref() == Some(batch.as_slice());
        }
        decode_rates.push(records / elapsed.as_secs_f64());
    }
    Measure {
        bytes_per_partition: bytes / records,
        encode_per_s: median(encode_rates),
        decode_per_s: median(decode_rates),
        round_trips,
    }
}

fn measure_set(batches: &[(u64, Vec<CompletedRecord>)], dict: &WorkerDict) -> Vec<Measure> {
    let v2 = BinaryV2Options::new(BATCH_SIZE).expect("1000 is a valid batch size");
    let v2_zstd = v2.with_zstd(ZSTD_LEVEL);
    let binary = |options: BinaryV2Options| {
        measure(
            batches,
            move |id, b| encode_binary_v2(id, b, dict, &options).expect("binary v2 encodes"),
            Vec::len,
            |e| decode_binary_v2(e, dict).ok().map(|batch| batch.records),
        )
    };
    vec![
        measure(
            batches,
            |_, b| b.iter().map(encode_json).collect::<Vec<String>>(),
            |e| e.iter().map(String::len).sum(),
            |e| e.iter().map(|s| decode_json(s).ok()).collect(),
        ),
        measure(
            batches,
            |_, b| encode_text_v1(b, dict).expect("text v1 encodes"),
            String::len,
            |e| decode_text_v1(e, dict).ok(),
        ),
        binary(v2),
        binary(v2_zstd),
        // Flag bit 2 (workers as ranks), what archive format 2 seals with.
        binary(v2.with_ranks()),
    ]
}

fn output_path() -> PathBuf {
    match std::env::var_os("TRANCHE_BENCH_OUT") {
        Some(path) => PathBuf::from(path),
        None => {
            let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
            let workspace = manifest.parent().unwrap_or(manifest);
            workspace.join("target/tranche-bench/codec.json")
        }
    }
}

fn main() -> ExitCode {
    let mut dict = WorkerDict::new();
    for w in 1..=WORKERS {
        dict.insert(&format!("worker{w}"))
            .expect("room for eight workers");
    }
    let (records, runs) = (SCALE.records, SCALE.runs);
    println!(
        "codec: {records} records per set, sealed in batches of {BATCH_SIZE}, median of {runs} runs, one thread"
    );
    println!(
        "{:<4}{:<16}{:>16}{:>18}{:>18}  round trip",
        "set", "encoding", "bytes/partition", "encode rec/s", "decode rec/s"
    );
    let mut report = Map::new();
    let mut failures = Vec::new();
    for set in Set::ALL {
        let batches = generate(set);
        let measures = measure_set(&batches, &dict);
        let mut bytes = Map::new();
        let mut encode = Map::new();
        let mut decode = Map::new();
        for (name, m) in ENCODINGS.iter().zip(&measures) {
            println!(
                "{:<4}{:<16}{:>16.3}{:>18.0}{:>18.0}  {}",
                set.name(),
                name,
                m.bytes_per_partition,
                m.encode_per_s,
                m.decode_per_s,
                if m.round_trips { "ok" } else { "FAILED" }
            );
            if !m.round_trips {
                failures.push(format!("{name} does not round-trip set {}", set.name()));
            }
            bytes.insert(name.to_string(), json!(m.bytes_per_partition));
            encode.insert(name.to_string(), json!(m.encode_per_s));
            decode.insert(name.to_string(), json!(m.decode_per_s));
        }
        let size = |name: &str| {
            ENCODINGS
                .iter()
                .position(|e| *e == name)
                .map_or(f64::INFINITY, |i| measures[i].bytes_per_partition)
        };
        let best = measures
            .iter()
            .map(|m| m.bytes_per_partition)
            .fold(f64::INFINITY, f64::min);
        let targets: &[(&str, f64, f64)] = match set {
            Set::Seconds => &[
                ("binary_v2", size("binary_v2"), 6.0),
                ("binary_v2_zstd", size("binary_v2_zstd"), 4.0),
            ],
            Set::Millis => &[("best variant", best, 6.0)],
            Set::NonUniform => &[],
        };
        for &(what, got, limit) in targets {
            if got > limit && SCALE.smoke {
                println!(
                    "smoke: set {}: {what} costs {got:.3} bytes per partition, over {limit} (not judged)",
                    set.name()
                );
            } else if got > limit {
                failures.push(format!(
                    "set {}: {what} costs {got:.3} bytes per partition, over {limit}",
                    set.name()
                ));
            }
        }
        report.insert(
            set.name().to_owned(),
            json!({"bytes_per_partition": bytes, "decode_records_per_s": decode, "encode_records_per_s": encode}),
        );
    }
    report.insert("records".to_owned(), json!(records));

    let path = output_path();
    let written = path
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| {
            std::fs::write(
                &path,
                serde_json::to_string_pretty(&Value::Object(report)).unwrap_or_default(),
            )
        });
    match written {
        Ok(()) => println!("wrote {}", path.display()),
        Err(e) => failures.push(format!("cannot write {}: {e}", path.display())),
    }
    if failures.is_empty() {
        println!(
            "targets: met (sizes; decode speed is for the reader to judge: the aim is >= 20M records/s)"
        );
        ExitCode::SUCCESS
    } else {
        for f in &failures {
            eprintln!("FAILED: {f}");
        }
        ExitCode::FAILURE
    }
}
