//! The `bullmq` cell of `bench e2e`: BullMQ's no-op jobs on the bench's own Redis, in
//! the same run, beside one `tranche run` process at the same concurrency (issue 25's
//! "one process >= 4x BullMQ").
//!
//! BullMQ (`VERSION`, with the Redis client it loads, `IOREDIS`) is installed from npm
//! once into `target/tranche-bench/bullmq` (kept between runs); `bench.js` beside this
//! file enqueues the jobs, then one Worker runs them with no-op processing. A machine
//! without `node` and `npm` gets a note and no row.

use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};
use tranche_testkit::TestRedis;

/// The BullMQ release measured.
const VERSION: &str = "6.7.0";
/// The ioredis release it runs on (an optional dependency of BullMQ 6).
const IOREDIS: &str = "6.0.0";

/// Installs BullMQ under `root` unless it is there; its `node_modules`, or why not.
fn install(root: &Path) -> Result<std::path::PathBuf, String> {
    let modules = root.join("node_modules");
    let has = |package: &str, version: &str| {
        std::fs::read_to_string(modules.join(package).join("package.json"))
            .ok()
            .and_then(|s| serde_json::from_str::<Value>(&s).ok())
            .is_some_and(|v| v["version"] == version)
    };
    if has("bullmq", VERSION) && has("ioredis", IOREDIS) {
        return Ok(modules);
    }
    std::fs::create_dir_all(root).map_err(|e| format!("{}: {e}", root.display()))?;
    let out = Command::new("npm")
        .args(["install", "--no-audit", "--no-fund", "--silent", "--prefix"])
        .arg(root)
        .arg(format!("bullmq@{VERSION}"))
        .arg(format!("ioredis@{IOREDIS}"))
        .output()
        .map_err(|e| format!("npm: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "npm install bullmq@{VERSION} ioredis@{IOREDIS} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(modules)
}

/// One `node bench.js` call; its stdout.
fn node(modules: &Path, args: &[&str]) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/bullmq/bench.js");
    let out = Command::new("node")
        .arg(&script)
        .args(args)
        .env("NODE_PATH", modules)
        .output()
        .expect("run node");
    assert!(
        out.status.success(),
        "node bench.js {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// Runs `n` jobs at `concurrency` on `redis`, `repeat` times (the server flushed before
/// each); the median run's jobs/s and Redis CPU µs per job, beside the slowest and
/// fastest, or `None` with a note when BullMQ cannot run here.
pub(crate) fn run(
    redis: &TestRedis,
    n: u64,
    concurrency: usize,
    repeat: usize,
    redis_cpu: impl Fn(&TestRedis) -> f64,
) -> Option<Value> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/tranche-bench/bullmq");
    let modules = match install(&root) {
        Ok(modules) => modules,
        Err(why) => {
            println!("bullmq: not measured ({why})");
            return None;
        }
    };
    let port = redis.port().to_string();
    let (n_s, c_s) = (n.to_string(), concurrency.to_string());
    let mut runs: Vec<(f64, f64)> = (0..repeat)
        .map(|_| {
            redis.cli(&["FLUSHALL"]);
            node(&modules, &["add", &port, &n_s]);
            let cpu = redis_cpu(redis);
            let out = node(&modules, &["work", &port, &n_s, &c_s]);
            let cpu = redis_cpu(redis) - cpu;
            let v: Value = serde_json::from_str(out.trim()).expect("bench.js output");
            let seconds = v["seconds"].as_f64().expect("seconds");
            (n as f64 / seconds, cpu * 1e6 / n as f64)
        })
        .collect();
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let median = runs[runs.len() / 2];
    println!(
        "bullmq {VERSION}, 1 worker x {concurrency}: {:.0} jobs/s ({:.0}-{:.0}), Redis {:.1} µs/job",
        median.0,
        runs[0].0,
        runs[runs.len() - 1].0,
        median.1
    );
    Some(json!({
        "version": VERSION,
        "ioredis": IOREDIS,
        "jobs": n,
        "concurrency": concurrency,
        "jobs_per_s": median.0,
        "slowest_per_s": runs[0].0,
        "fastest_per_s": runs[runs.len() - 1].0,
        "redis_cpu_us_per_job": median.1,
    }))
}
