//! End-to-end benchmark: the real `tranche` binary, as users run it, against a private
//! redis-server (AOF off). Per cell (processes P, concurrency C, shards S) it plans N
//! partitions of 1000 IDs, starts P `tranche run --simulate --sim-latency 0..0 --chunk 1000
//! --parallel 1 --concurrency C` processes, waits for them to exit and then for the
//! statistics to count all N partitions, and reports:
//!
//! - partitions/s, from the start of the runs to the last partition archived and counted
//!   (`stats` total = N, verified);
//! - Redis CPU µs per partition (`INFO cpu` user + sys, delta over the cell / N);
//! - client CPU µs per partition (the run processes' user + sys time, from this process's
//!   `cutime`/`cstime` once they are reaped);
//! - Redis bytes per partition at the end (`used_memory` delta / N);
//! - Redis commands per partition by name (`INFO commandstats`), to show where the cost is;
//!
//! beside the `redis-benchmark -t set -c 50 -P 16` ceiling of the same server, in the same
//! run. The cells run one after another on a flushed server.
//!
//! With `TRANCHE_BENCH_CLUSTER=1` (`cargo xtask bench e2e --cluster`) each cell also
//! runs on a local Redis Cluster of 3 masters without replicas (the tests'
//! `TestCluster`), right after it ran on the single server, and its row adds the Redis CPU
//! per partition of each master and their spread (largest over smallest): the masters
//! share this machine's cores with each other and with the workers, so the cluster's
//! wall throughput says little, while what each master spends per partition is what
//! grows or shrinks with the number of masters. The defaults are then small: N = 50,000
//! and the one cell `4x64x16`.
//!
//! The cell `skew` (`skew/mod.rs`) is of another kind: a job of real `--exec` children
//! whose chunk costs are heavy-tailed, run once each way (`SKEW_WAYS`) side by side,
//! reporting its wall time against the ideal (total chunk-seconds ÷ chunk slots).
//! The cell `bullmq` (`bullmq/mod.rs`) runs N of BullMQ's no-op jobs on the same server,
//! one Worker at the concurrency of the first one-process cell (64 without one), and
//! reports that cell's partitions/s over BullMQ's jobs/s.
//!
//! Knobs: `TRANCHE_BENCH_N` (partitions per cell, default 200,000), `TRANCHE_BENCH_CELLS`
//! (e.g. `1x64x4,4x64x4`: P x C x S, `skew` or `bullmq`; default the four cells of issue
//! 11, `bullmq` and `skew`),
//! `TRANCHE_BENCH_RUN_ARGS` (more `run` arguments, space-separated, e.g. `--prefetch 64`),
//! `TRANCHE_BENCH_SIM_LATENCY` (each chunk's simulated work, `--sim-latency MIN..MAX` in
//! ms, default `0..0`: the partitions do nothing but their coordination),
//! `TRANCHE_BENCH_REPEAT` (runs per cell, default 3: the row shown is the run with the
//! median partitions/s, beside the slowest and fastest), `TRANCHE_BENCH_OUT` (default
//! `target/tranche-bench/e2e.json`) and `TRANCHE_BENCH_BASELINE` (another `tranche`
//! binary, e.g. one built from an older commit: each cell then also runs it, the two
//! alternating run by run on the same server, and a `baseline` row follows each cell with
//! the ratio of the medians). `TRANCHE_BENCH_OTLP=1` does the same with this build
//! exporting its spans (`--otlp-endpoint`) to a receiver in this process that reads and
//! discards them: an `otlp` row follows each cell with the ratio on / off (the target:
//! no lower than 0.9). `TRANCHE_BENCH_OTLP_SAMPLE` (ratios, comma-separated, default
//! `1`, e.g. `1,0.1`) runs the exporting build once per ratio (`--trace-sample`),
//! alternating with the others run by run, and prints an `otlp @R` row for each.
//!
//! With `TRANCHE_BENCH_SMOKE=1` it also runs under `cargo test` (with the binary of
//! that profile) as one tiny cell, `1x8x1` on 2,000 partitions, run once, with a
//! 20,000-SET ceiling and neither baseline nor cluster (each skipped with a note): a
//! few seconds, figures not judged, every check still run, JSON still written.

mod bullmq;
mod common;
mod skew;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::run_ok;
use serde_json::{Value, json};
use tranche_testkit::{TestCluster, TestRedis};

/// The binary under test, built by cargo in the profile of this bench (release under
/// `cargo bench`).
const BIN: &str = env!("CARGO_BIN_EXE_tranche");
const NAMESPACE: &str = "e2e";
const DEFAULT_CELLS: &str = "1x64x4,4x64x4,4x64x16,4x64x64,bullmq,skew";
/// The ways the `skew` cell runs its job, side by side.
const SKEW_WAYS: &[skew::Way] = &[("no-split", &["--no-split"]), ("split", &[])];
/// The cells, and partitions per cell, of a run with the cluster.
const CLUSTER_CELLS: &str = "4x64x16";
const CLUSTER_N: u64 = 50_000;
/// The cell, and partitions, of a smoke run (`TRANCHE_BENCH_SMOKE=1`).
const SMOKE_CELLS: &str = "1x8x1";
const SMOKE_N: u64 = 2_000;

/// One cell of the table.
#[derive(Debug, Clone, Copy)]
struct Cell {
    processes: usize,
    concurrency: usize,
    shards: u32,
}

/// The throughput cells asked for, and whether `skew` and `bullmq` are.
fn cells(default: &str) -> (Vec<Cell>, bool, bool) {
    let spec = std::env::var("TRANCHE_BENCH_CELLS").unwrap_or_else(|_| default.into());
    let named = |name: &str| spec.split(',').any(|c| c.trim() == name);
    let (skew, bullmq) = (named("skew"), named("bullmq"));
    let cells = spec
        .split(',')
        .filter(|c| !matches!(c.trim(), "skew" | "bullmq"))
        .map(|cell| {
            let parts: Vec<&str> = cell.trim().split('x').collect();
            let [p, c, s] = parts.as_slice() else {
                panic!("TRANCHE_BENCH_CELLS: `{cell}` is not PxCxS");
            };
            Cell {
                processes: p.parse().expect("P"),
                concurrency: c.parse().expect("C"),
                shards: s.parse().expect("S"),
            }
        })
        .collect();
    (cells, skew, bullmq)
}

/// `INFO section` as field -> value.
fn info(redis: &TestRedis, section: &str) -> BTreeMap<String, String> {
    redis
        .cli(&["INFO", section])
        .lines()
        .filter_map(|l| l.trim().split_once(':'))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// Redis CPU seconds so far (user + sys, every thread).
fn redis_cpu(redis: &TestRedis) -> f64 {
    let cpu = info(redis, "cpu");
    let get = |k: &str| {
        cpu.get(k)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    get("used_cpu_user") + get("used_cpu_sys")
}

fn used_memory(redis: &TestRedis) -> u64 {
    info(redis, "memory")
        .get("used_memory")
        .and_then(|v| v.parse().ok())
        .expect("used_memory")
}

/// Commands run so far, by name: calls and µs spent (`cmdstat_evalsha:calls=...,usec=...`).
/// A command a script calls is counted under its own name too, and its time is also
/// inside the script's.
fn command_stats(redis: &TestRedis) -> BTreeMap<String, (u64, u64)> {
    info(redis, "commandstats")
        .into_iter()
        .filter_map(|(k, v)| {
            let name = k.strip_prefix("cmdstat_")?.to_owned();
            let field = |f: &str| {
                v.split(',')
                    .find_map(|x| x.strip_prefix(f))
                    .and_then(|x| x.parse::<u64>().ok())
            };
            Some((name, (field("calls=")?, field("usec=")?)))
        })
        .collect()
}

/// CPU seconds of this process's reaped children (fields 16 and 17 of /proc/self/stat,
/// in clock ticks): the run processes' rusage without an unsafe `wait4`.
fn children_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // The command name (field 2) may hold spaces; count fields after its closing paren.
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3, so field n is fields[n - 3].
    let ticks: u64 = fields[13].parse::<u64>().unwrap() + fields[14].parse::<u64>().unwrap();
    ticks as f64 / clock_ticks()
}

fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

fn tranche(url: &str, args: &[&str]) -> Command {
    tranche_at(BIN, url, args)
}

fn tranche_at(bin: &str, url: &str, args: &[&str]) -> Command {
    common::tranche_at(bin, url, NAMESPACE, args)
}

fn total_completed(url: &str) -> u64 {
    let out = run_ok(tranche(url, &["--json", "stats"]));
    let v: Value = serde_json::from_str(out.trim()).expect("stats --json");
    v["completed"]["global_stats"]["total_completed"]
        .as_u64()
        .unwrap_or(0)
}

/// `redis-benchmark -t set -c 50 -P 16` against the server: SET/s.
fn set_ceiling(redis: &TestRedis, smoke: bool) -> Option<f64> {
    let sets = if smoke { "20000" } else { "2000000" };
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &redis.port().to_string()])
        .args(["-t", "set", "-c", "50", "-P", "16", "-n", sets, "-q"])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    // "SET: 512345.67 requests per second, p50=..."; progress lines end in \r.
    let line = text
        .rsplit('\r')
        .find(|l| l.contains("requests per second"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// How many of the namespace's shards each of `nodes` holds (the distinct shard tags of
/// its keys), and which of them holds the namespace's own tag `{ns}`.
fn placement(nodes: &[&TestRedis]) -> (Vec<usize>, Option<usize>) {
    let shards = nodes
        .iter()
        .map(|node| {
            let keys: Vec<String> = node.query(redis::cmd("KEYS").arg(format!("{{{NAMESPACE}:*")));
            let tags: std::collections::BTreeSet<&str> = keys
                .iter()
                .filter_map(|k| k.split_once('}').map(|(tag, _)| tag))
                .collect();
            tags.len()
        })
        .collect();
    let meta = format!("{{{NAMESPACE}}}:meta");
    let holder = nodes
        .iter()
        .position(|node| node.cli(&["EXISTS", &meta]) == "1");
    (shards, holder)
}

/// Commands by name summed over `nodes`.
fn command_stats_of(nodes: &[&TestRedis]) -> BTreeMap<String, (u64, u64)> {
    let mut sum: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for node in nodes {
        for (name, (calls, usec)) in command_stats(node) {
            let entry = sum.entry(name).or_default();
            entry.0 += calls;
            entry.1 += usec;
        }
    }
    sum
}

/// Runs one cell against `nodes`: the single server, or every master of a cluster
/// (flushed, statistics reset and measured one by one; the figures are their sums, and
/// `redis_cpu_us_per_partition_per_master` each one's share).
fn run_cell(
    bin: &str,
    nodes: &[&TestRedis],
    url: &str,
    cell: Cell,
    n: u64,
    dir: &std::path::Path,
    more: &[&str],
) -> Value {
    for node in nodes {
        node.cli(&["FLUSHALL"]);
        node.cli(&["CONFIG", "RESETSTAT"]);
    }
    let memory_before: u64 = nodes.iter().map(|r| used_memory(r)).sum();
    let max = (n * 1000).to_string();
    let shards = cell.shards.to_string();
    run_ok(tranche_at(
        bin,
        url,
        &[
            "plan", "--min", "1", "--max", &max, "--size", "1000", "--shards", &shards,
        ],
    ));
    let calls_before = command_stats_of(nodes);
    let cpu_before: Vec<f64> = nodes.iter().map(|r| redis_cpu(r)).collect();
    let client_before = children_cpu();
    let started = Instant::now();
    let concurrency = cell.concurrency.to_string();
    let latency = std::env::var("TRANCHE_BENCH_SIM_LATENCY")
        .ok()
        .filter(|l| !l.is_empty())
        .unwrap_or_else(|| "0..0".to_owned());
    let mut runs: Vec<_> = (0..cell.processes)
        .map(|i| {
            let log = std::fs::File::create(dir.join(format!("run-{i}.log"))).expect("log file");
            let mut cmd = tranche_at(
                bin,
                url,
                &[
                    "run",
                    "--simulate",
                    "--sim-latency",
                    &latency,
                    "--chunk",
                    "1000",
                    "--parallel",
                    "1",
                    "--concurrency",
                    &concurrency,
                    "--worker-id",
                    &format!("bench-{i}"),
                ],
            );
            let extra = std::env::var("TRANCHE_BENCH_RUN_ARGS").unwrap_or_default();
            cmd.args(extra.split_whitespace()).args(more);
            cmd.stdout(Stdio::null()).stderr(log);
            cmd.spawn().expect("spawn run")
        })
        .collect();
    for (i, run) in runs.iter_mut().enumerate() {
        let status = run.wait().expect("wait run");
        assert!(
            status.success(),
            "run {i} exited {status}; see {}",
            dir.join(format!("run-{i}.log")).display()
        );
    }
    let client_cpu = children_cpu() - client_before;
    // The runs drain the archive before they exit; poll in case one left work behind.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut counted = total_completed(url);
    while counted < n {
        assert!(
            Instant::now() < deadline,
            "statistics count {counted} of {n} partitions two minutes after the runs"
        );
        std::thread::sleep(Duration::from_millis(20));
        counted = total_completed(url);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let per_master: Vec<f64> = nodes
        .iter()
        .zip(&cpu_before)
        .map(|(r, before)| (redis_cpu(r) - before) * 1e6 / n as f64)
        .collect();
    let redis_cpu_s: f64 = per_master.iter().sum::<f64>() * n as f64 / 1e6;
    assert_eq!(counted, n, "every partition counted exactly once");
    let memory_after: u64 = nodes.iter().map(|r| used_memory(r)).sum();
    let memory = memory_after.saturating_sub(memory_before);
    let per_partition = |v: u64| (v as f64 / n as f64 * 1000.0).round() / 1000.0;
    let mut calls = BTreeMap::new();
    let mut usec = BTreeMap::new();
    for (name, (c, us)) in command_stats_of(nodes) {
        let (c0, us0) = calls_before.get(&name).copied().unwrap_or((0, 0));
        if c > c0 {
            calls.insert(name.clone(), per_partition(c - c0));
            usec.insert(name, per_partition(us - us0));
        }
    }
    let (shards_per_master, holds_namespace) = placement(nodes);
    json!({
        "shards_per_master": shards_per_master,
        "namespace_tag_on": holds_namespace,
        "processes": cell.processes,
        "concurrency": cell.concurrency,
        "shards": cell.shards,
        "partitions": n,
        "seconds": elapsed,
        "partitions_per_s": n as f64 / elapsed,
        "redis_cpu_us_per_partition": redis_cpu_s * 1e6 / n as f64,
        "redis_cpu_us_per_partition_per_master": per_master,
        "redis_cpu_spread": spread(&per_master),
        "client_cpu_us_per_partition": client_cpu * 1e6 / n as f64,
        "redis_bytes_per_partition": memory as f64 / n as f64,
        "commands_per_partition": calls,
        "command_us_per_partition": usec,
    })
}

/// The largest of `values` over the smallest (1 for one value).
fn spread(values: &[f64]) -> f64 {
    let max = values.iter().copied().fold(f64::MIN, f64::max);
    let min = values.iter().copied().fold(f64::MAX, f64::min);
    if min > 0.0 { max / min } else { f64::INFINITY }
}

/// The run with the median partitions/s, with the spread of all of them.
fn median_row(mut runs: Vec<Value>, repeat: usize) -> Value {
    let rate = |v: &Value| v["partitions_per_s"].as_f64().unwrap();
    runs.sort_by(|a, b| rate(a).total_cmp(&rate(b)));
    let (slowest, fastest) = (rate(&runs[0]), rate(&runs[runs.len() - 1]));
    let mut row = runs.swap_remove(runs.len() / 2);
    row["runs"] = json!(repeat);
    row["partitions_per_s_slowest"] = json!(slowest);
    row["partitions_per_s_fastest"] = json!(fastest);
    row
}

fn print_row(cell: &Cell, row: &Value, label: &str) {
    println!(
        "{:>3} {:>4} {:>6} {:>12.0} {:>17} {:>14.1} {:>15.1} {:>13.1}{label}",
        cell.processes,
        cell.concurrency,
        cell.shards,
        row["partitions_per_s"].as_f64().unwrap(),
        format!(
            "({:.0}-{:.0})",
            row["partitions_per_s_slowest"].as_f64().unwrap(),
            row["partitions_per_s_fastest"].as_f64().unwrap()
        ),
        row["redis_cpu_us_per_partition"].as_f64().unwrap(),
        row["client_cpu_us_per_partition"].as_f64().unwrap(),
        row["redis_bytes_per_partition"].as_f64().unwrap(),
    );
}

/// The cluster row's per-master figures, under its table row.
fn print_masters(row: &Value) {
    let per: Vec<String> = row["redis_cpu_us_per_partition_per_master"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| format!("{:.1}", v.as_f64().unwrap()))
        .collect();
    println!(
        "    Redis µs per partition per master: {} (spread {:.2}); shards per master {}, {{ns}} on master {}",
        per.join(" / "),
        row["redis_cpu_spread"].as_f64().unwrap(),
        row["shards_per_master"],
        row["namespace_tag_on"],
    );
}

/// What every cell of one bench run shares.
struct Settings {
    /// Partitions per cell.
    n: u64,
    /// Runs per cell (and per binary).
    repeat: usize,
    /// Another `tranche` binary to run beside this one.
    baseline: Option<String>,
    /// A discarding OTLP receiver's endpoint: this build also runs exporting to it.
    otlp: Option<String>,
    /// The head-sampling ratios the exporting runs take (`--trace-sample`), one row each.
    otlp_sample: Vec<String>,
    /// Where the runs' logs go.
    dir: PathBuf,
}

/// Runs `cell` `repeat` times on `nodes` (alternating with the baseline's runs when
/// there is one) and prints the median row, and the baseline's beside it.
fn measure(nodes: &[&TestRedis], url: &str, label: &str, cell: Cell, set: &Settings) -> Value {
    let (n, repeat, dir) = (set.n, set.repeat, set.dir.as_path());
    let mut runs: Vec<Value> = Vec::new();
    let mut base_runs: Vec<Value> = Vec::new();
    let mut otlp_runs: Vec<Vec<Value>> = vec![Vec::new(); set.otlp_sample.len()];
    for _ in 0..repeat {
        runs.push(run_cell(BIN, nodes, url, cell, n, dir, &[]));
        if let Some(bin) = &set.baseline {
            base_runs.push(run_cell(bin, nodes, url, cell, n, dir, &[]));
        }
        if let Some(endpoint) = &set.otlp {
            for (runs, ratio) in otlp_runs.iter_mut().zip(&set.otlp_sample) {
                let on = [
                    "--otlp-endpoint",
                    endpoint.as_str(),
                    "--trace-sample",
                    ratio.as_str(),
                ];
                runs.push(run_cell(BIN, nodes, url, cell, n, dir, &on));
            }
        }
    }
    let mut row = median_row(runs, repeat);
    print_row(&cell, &row, label);
    if nodes.len() > 1 {
        print_masters(&row);
    }
    println!(
        "    commands per partition: {}",
        row["commands_per_partition"]
    );
    println!(
        "    command µs per partition: {}",
        row["command_us_per_partition"]
    );
    if !base_runs.is_empty() {
        let base = median_row(base_runs, repeat);
        print_row(&cell, &base, &format!("{label}  baseline"));
        let ratio =
            row["partitions_per_s"].as_f64().unwrap() / base["partitions_per_s"].as_f64().unwrap();
        println!("    partitions/s, this build / baseline: {ratio:.2}");
        row["baseline"] = base;
        row["ratio_to_baseline"] = json!(ratio);
    }
    if set.otlp.is_some() {
        let mut sampled = Vec::new();
        for (runs, sample) in otlp_runs.into_iter().zip(&set.otlp_sample) {
            let mut on = median_row(runs, repeat);
            print_row(&cell, &on, &format!("{label}  otlp @{sample}"));
            let ratio = on["partitions_per_s"].as_f64().unwrap()
                / row["partitions_per_s"].as_f64().unwrap();
            let cpu = on["client_cpu_us_per_partition"].as_f64().unwrap()
                / row["client_cpu_us_per_partition"].as_f64().unwrap();
            println!(
                "    sampled {sample}: partitions/s exported / not {ratio:.2} (target: 0.90 or more), client CPU {cpu:.2}x"
            );
            on["trace_sample"] = json!(sample.parse::<f64>().unwrap());
            on["ratio_to_off"] = json!(ratio);
            sampled.push(on);
        }
        // The first ratio's row where it always was, every ratio's in `otlp_sampled`.
        row["otlp"] = sampled[0].clone();
        row["ratio_otlp_to_off"] = sampled[0]["ratio_to_off"].clone();
        row["otlp_sampled"] = json!(sampled);
    }
    row
}

/// An OTLP/HTTP receiver on a free port that reads every request whole and answers 200,
/// keeping nothing but the bytes it was sent (shared with the caller): what a collector
/// costs the exporter, and no more.
fn discarding_receiver() -> (String, std::sync::Arc<std::sync::atomic::AtomicU64>) {
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicU64, Ordering};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a receiver");
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let received = std::sync::Arc::new(AtomicU64::new(0));
    let total = received.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let total = total.clone();
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 65536];
                loop {
                    let head_end = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                        match stream.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    while buf.len() < head_end + length {
                        match stream.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    buf.drain(..head_end + length);
                    total.fetch_add(length as u64, Ordering::Relaxed);
                    let answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
                    if stream.write_all(answer).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (endpoint, received)
}

fn main() {
    let smoke = std::env::var("TRANCHE_BENCH_SMOKE").is_ok_and(|v| v == "1");
    // `cargo test --all-targets` builds benches as tests and runs them with no argument
    // telling them apart; `cargo bench` passes `--bench`. Only the smoke run is cheap
    // enough for the former.
    if !smoke && !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let mut with_cluster = std::env::var("TRANCHE_BENCH_CLUSTER").is_ok_and(|v| v == "1");
    if smoke && with_cluster {
        println!("smoke: TRANCHE_BENCH_CLUSTER ignored, no cluster");
        with_cluster = false;
    }
    let n: u64 = std::env::var("TRANCHE_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(match (smoke, with_cluster) {
            (true, _) => SMOKE_N,
            (false, true) => CLUSTER_N,
            (false, false) => 200_000,
        });
    let out = std::env::var_os("TRANCHE_BENCH_OUT").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/tranche-bench/e2e.json"),
        PathBuf::from,
    );
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("e2e-bench");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");

    let redis = TestRedis::start();
    let url = redis.url();
    let ceiling = set_ceiling(&redis, smoke);
    // Three masters without replicas, beside the single server: a replica would add
    // its master's replication work, which the single server does not do.
    let cluster = with_cluster.then(|| TestCluster::start_with(3, 0));
    let mut rows = Vec::new();
    println!(
        "{:>3} {:>4} {:>6} {:>12} {:>17} {:>14} {:>15} {:>13}",
        "P",
        "C",
        "shards",
        "partitions/s",
        "(slowest-fastest)",
        "Redis µs/part",
        "client µs/part",
        "Redis B/part"
    );
    let repeat: usize = std::env::var("TRANCHE_BENCH_REPEAT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if smoke { 1 } else { 3 })
        .max(1);
    let mut baseline = std::env::var("TRANCHE_BENCH_BASELINE").ok();
    if smoke && baseline.take().is_some() {
        println!("smoke: TRANCHE_BENCH_BASELINE ignored, no baseline");
    }
    let mut otlp = std::env::var("TRANCHE_BENCH_OTLP").is_ok_and(|v| v == "1");
    if smoke && otlp {
        println!("smoke: TRANCHE_BENCH_OTLP ignored, no export");
        otlp = false;
    }
    let receiver = otlp.then(discarding_receiver);
    let otlp_sample: Vec<String> = std::env::var("TRANCHE_BENCH_OTLP_SAMPLE")
        .unwrap_or_else(|_| "1".into())
        .split(',')
        .map(|r| r.trim().to_owned())
        .filter(|r| !r.is_empty())
        .collect();
    for r in &otlp_sample {
        let ok = r.parse::<f64>().is_ok_and(|r| (0.0..=1.0).contains(&r));
        assert!(
            ok,
            "TRANCHE_BENCH_OTLP_SAMPLE: {r:?} is not a ratio from 0 to 1"
        );
    }
    assert!(
        !otlp_sample.is_empty(),
        "TRANCHE_BENCH_OTLP_SAMPLE names no ratio"
    );
    let set = Settings {
        n,
        repeat,
        baseline,
        otlp: receiver.as_ref().map(|(endpoint, _)| endpoint.clone()),
        otlp_sample,
        dir,
    };
    let default_cells = if smoke {
        SMOKE_CELLS
    } else if with_cluster {
        CLUSTER_CELLS
    } else {
        DEFAULT_CELLS
    };
    let (cells, with_skew, mut with_bullmq) = cells(default_cells);
    if smoke && with_bullmq {
        println!("smoke: bullmq cell skipped, no npm install");
        with_bullmq = false;
    }
    // The one-process cell BullMQ is set beside: the first, if any.
    let single = cells.iter().position(|c| c.processes == 1);
    let bullmq_concurrency = single.map_or(64, |i| cells[i].concurrency);
    for cell in cells {
        let mut row = measure(&[&redis], &url, "", cell, &set);
        if let Some(cluster) = &cluster {
            let masters = cluster.masters();
            row["cluster"] = measure(&masters, &cluster.url(), "  cluster of 3", cell, &set);
        }
        rows.push(row);
    }
    let bullmq_row = with_bullmq
        .then(|| bullmq::run(&redis, n, bullmq_concurrency, repeat, redis_cpu))
        .flatten()
        .map(|mut row| {
            if let Some(i) = single {
                let ratio = rows[i]["partitions_per_s"].as_f64().unwrap()
                    / row["jobs_per_s"].as_f64().unwrap();
                println!("    one tranche process / BullMQ, same concurrency: {ratio:.2}");
                row["one_process_ratio"] = json!(ratio);
            }
            row
        });
    // Minutes of sleeping children, not throughput: run once unless asked for more.
    let skew_row = with_skew.then(|| {
        let repeat = std::env::var("TRANCHE_BENCH_REPEAT")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1usize)
            .max(1);
        skew::run(BIN, &redis, &set.dir, SKEW_WAYS, repeat)
    });
    match ceiling {
        Some(set) => println!("redis-benchmark -t set -c 50 -P 16: {set:.0} SET/s"),
        None => println!("redis-benchmark not found: no SET ceiling"),
    }
    // The exporting runs sent their spans, or their ratio measured nothing.
    let otlp_bytes = receiver.map(|(_, bytes)| {
        let bytes = bytes.load(std::sync::atomic::Ordering::Relaxed);
        let some_kept = set
            .otlp_sample
            .iter()
            .any(|r| r.parse::<f64>().unwrap() > 0.0);
        assert!(
            bytes > 0 || !some_kept,
            "--otlp-endpoint runs exported nothing"
        );
        println!("OTLP bytes received from the exporting runs: {bytes}");
        bytes
    });
    let report = json!({
        "partitions": n,
        "otlp_bytes_received": otlp_bytes,
        "set_ceiling_per_s": ceiling,
        "cluster_masters": cluster.as_ref().map(|_| 3),
        "cells": rows,
        "skew": skew_row,
        "bullmq": bullmq_row,
    });
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent).expect("output dir");
    }
    std::fs::write(&out, serde_json::to_string_pretty(&report).unwrap()).expect("write output");
    println!("figures written to {}", out.display());
}
