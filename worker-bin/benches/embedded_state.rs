//! Embedded state file benchmark: how long an embedded run of a 1,000,000-partition job
//! is held still while its state is taken, and how long saving (bincode, write, fsync,
//! rename) and loading and restoring it take, with the file's size.
//!
//! The job (1..=1,000,000,000 in partitions of 1000, one shard, default tier thresholds)
//! is completed through the memory active store and archived by the memory archive, as
//! `tranche run` does without `--redis`; at each checkpoint (100,000, 500,000 and
//! 1,000,000 completed, with 1000 leases held and 500 records still in the inbox) the
//! save and the load run five times and the medians are reported. The state file is the
//! library's own (`src/state/`), reached through its hidden `embedded_state` module.
//!
//! Set `TRANCHE_BENCH_MAX` to stop earlier. With `TRANCHE_BENCH_SMOKE=1` the job has
//! 10,000 partitions (checkpoints 1,000, 5,000 and 10,000) and each figure one run: a
//! few seconds, figures not judged, every path still run, JSON still written. Output: a table on stdout and JSON at
//! `$TRANCHE_BENCH_OUT` (default `target/tranche-bench/embedded_state.json`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tranche_active_store::{Lease, Leases, Plan, Planner, RestoredLeases, SystemClock};
use tranche_archive_store::Archiver;
use tranche_worker::embedded_state::{Embedded, load};

/// The sizes of a run: full, or a hundredth for `TRANCHE_BENCH_SMOKE=1`.
struct Scale {
    /// Completed counts at which the state is saved and loaded.
    checkpoints: [u64; 3],
    /// Saves and loads per checkpoint.
    runs: usize,
}

impl Scale {
    fn from_env() -> Self {
        if std::env::var("TRANCHE_BENCH_SMOKE").is_ok_and(|v| v == "1") {
            Self {
                checkpoints: [1_000, 5_000, 10_000],
                runs: 1,
            }
        } else {
            Self {
                checkpoints: [100_000, 500_000, 1_000_000],
                runs: 5,
            }
        }
    }
}

fn configs() -> (tranche_active_store::Config, tranche_archive_store::Config) {
    (
        tranche_active_store::Config::default(),
        tranche_archive_store::Config {
            batch: 10_000,
            consumer: "bench".into(),
            ..Default::default()
        },
    )
}

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort_unstable();
    v[v.len() / 2].as_secs_f64() * 1000.0
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let scale = Scale::from_env();
    let max: u64 = std::env::var("TRANCHE_BENCH_MAX")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(scale.checkpoints[2]);
    let out = std::env::var_os("TRANCHE_BENCH_OUT").map_or_else(
        || {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../target/tranche-bench/embedded_state.json")
        },
        PathBuf::from,
    );
    let dir = std::env::temp_dir().join(format!("tranche-bench-state-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("run.state");

    let (a, b) = configs();
    let run = Embedded::new(a, b, Arc::new(SystemClock)).unwrap();
    run.active
        .plan(&Plan::Uniform {
            min: 1,
            max: max * 1000,
            size: 1000,
        })
        .await
        .unwrap();
    let mut done = 0u64;
    let mut rows = Vec::new();
    println!(
        "{:>10} {:>10} {:>9} {:>9} {:>9} {:>9}",
        "completed", "bytes", "held ms", "save ms", "load ms", "restore ms"
    );
    for &checkpoint in scale.checkpoints.iter().filter(|&&c| c <= max) {
        // Everything up to the checkpoint completed and archived but the last 500.
        while done < checkpoint {
            let n = (checkpoint - done).min(1000) as usize;
            let leases = run.active.claim("w1", n).await.unwrap();
            let batch: Vec<(Lease, u64)> = leases.into_iter().map(|l| (l, 295_000)).collect();
            done += batch.len() as u64;
            run.active.complete_many(&batch).await.unwrap();
            if done + 500 <= checkpoint {
                while run.archive.archive_once().await.unwrap().entries > 0 {}
            }
        }
        // 1000 leases held, with checkpoints.
        let held = run.active.claim("w1", 1000).await.unwrap();
        for l in &held {
            run.active.heartbeat(l, l.min_id + 500).await.unwrap();
        }
        let (mut holds, mut saves, mut loads, mut restores) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut bytes = 0;
        for _ in 0..scale.runs {
            let report = run.save(&path).unwrap();
            bytes = report.bytes;
            holds.push(report.held);
            saves.push(report.total);
            let start = Instant::now();
            let loaded = load(&path).unwrap().unwrap();
            loads.push(start.elapsed());
            let (a, b) = configs();
            let start = Instant::now();
            let restored =
                Embedded::restore(a, b, Arc::new(SystemClock), loaded, RestoredLeases::Release)
                    .unwrap();
            restores.push(start.elapsed());
            drop(restored);
        }
        // The held leases are finished before the next checkpoint.
        let batch: Vec<(Lease, u64)> = held.into_iter().map(|l| (l, 295_000)).collect();
        done += batch.len() as u64;
        run.active.complete_many(&batch).await.unwrap();
        let row = json!({
            "completed": checkpoint,
            "bytes": bytes,
            "held_ms": median(holds),
            "save_ms": median(saves),
            "load_ms": median(loads),
            "restore_ms": median(restores),
        });
        println!(
            "{:>10} {:>10} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
            checkpoint,
            bytes,
            row["held_ms"].as_f64().unwrap(),
            row["save_ms"].as_f64().unwrap(),
            row["load_ms"].as_f64().unwrap(),
            row["restore_ms"].as_f64().unwrap(),
        );
        rows.push(row);
    }
    let _ = std::fs::remove_dir_all(&dir);
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(
        &out,
        serde_json::to_string_pretty(&json!({ "rows": rows })).unwrap(),
    )
    .unwrap();
}
