//! A real backfill, and where its time goes: `UPDATE t SET v = v + 1 WHERE id BETWEEN
//! … AND …` over a private PostgreSQL's table of 1,000,000 rows (testkit's
//! `TestPostgres`), in chunks of 2,000 and of 200, eight at a time (`--concurrency 4 --parallel 2`), done five ways side by side:
//!
//! - `floor`: the same statements through 8 sessions opened beforehand (tokio-postgres,
//!   prepared, autocommit): what the database costs, nothing else;
//! - `--sql`: `tranche run --sql` (leases, checkpoints and statistics through a
//!   private Redis, a transaction per chunk on a pool of warm connections);
//! - `--exec-persistent`: `tranche run --exec-persistent CMD`, with CMD from
//!   `TRANCHE_BENCH_PERSISTENT` (a warm process running this bench's statement);
//! - `--exec psql`: `tranche run --exec 'psql -c …'`, one `psql` per chunk;
//! - `xargs -P 8 psql`: the same chunks without tranche, one `psql` per chunk.
//!
//! Every cell runs `TRANCHE_BENCH_ROUNDS` times (default 3), the cells in a rotated
//! order each round, the table after a `VACUUM`; each run must add exactly 1 to every
//! row (checked by the sum). The table shows each cell's median wall time, its
//! slowest, and its ratio to the floor, with `redis-benchmark -t set -c 50 -P 16 -q`
//! beside (the machine's state when measured). The target: `--sql` within 1.2× of the
//! floor at both chunk sizes. Knobs: `TRANCHE_BENCH_ROWS` (default 1,000,000),
//! `TRANCHE_BENCH_OUT` (default `target/tranche-bench/backfill.json`).
//!
//! With `TRANCHE_BENCH_SMOKE=1` it runs under `cargo test` too: 4,000 rows, one round,
//! figures not judged, every cell and check still run.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use serde_json::json;
use tranche_testkit::{TestPostgres, TestRedis};

const BIN: &str = env!("CARGO_BIN_EXE_tranche");

/// The statement every cell runs per chunk.
const UPDATE: &str = "UPDATE t SET v = v + 1 WHERE id BETWEEN $1 AND $2";

/// Chunks in flight: `--concurrency 4 --parallel 2`, `xargs -P 8`, 8 sessions.
const SLOTS: usize = 8;

fn main() {
    let smoke = std::env::var("TRANCHE_BENCH_SMOKE").is_ok_and(|v| v == "1");
    // `cargo test` runs a harness-less bench with no argument; `cargo bench` passes
    // `--bench`. Only the smoke run is cheap enough for the former.
    if !smoke && !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let knob = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let rows = knob("TRANCHE_BENCH_ROWS", if smoke { 4_000 } else { 1_000_000 });
    let rounds = knob("TRANCHE_BENCH_ROUNDS", if smoke { 1 } else { 3 }).max(1) as usize;
    let out = std::env::var_os("TRANCHE_BENCH_OUT").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/tranche-bench/backfill.json"),
        PathBuf::from,
    );
    let pg = TestPostgres::start();
    let redis = TestRedis::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let db = runtime.block_on(async {
        let db = connect(&pg.url()).await;
        db.batch_execute(&format!(
            "CREATE TABLE t (id bigint PRIMARY KEY, v bigint NOT NULL DEFAULT 0);
             INSERT INTO t (id) SELECT generate_series(1, {rows});"
        ))
        .await
        .unwrap();
        // VACUUM refuses a multi-statement message (an implicit transaction).
        db.batch_execute("VACUUM ANALYZE t").await.unwrap();
        db
    });
    let persistent = persistent_example();
    let mut cells: Vec<&str> = vec!["floor", "--sql", "--exec psql", "xargs -P 8 psql"];
    if persistent.is_some() {
        cells.insert(2, "--exec-persistent");
    } else {
        println!("--exec-persistent: not measured (TRANCHE_BENCH_PERSISTENT names no command)");
    }
    let sizes: [u64; 2] = [2_000, 200];
    // (size, cell) -> seconds of each round.
    let mut times: Vec<((u64, &str), Vec<f64>)> = Vec::new();
    let mut expected = 0i64;
    let mut run = 0;
    for round in 0..rounds {
        for &size in &sizes {
            let mut order = cells.clone();
            order.rotate_left(round % cells.len());
            for cell in order {
                runtime.block_on(async { db.batch_execute("VACUUM t").await.unwrap() });
                run += 1;
                let ns = format!("bf{run}");
                let started = Instant::now();
                match cell {
                    "floor" => runtime.block_on(floor(&pg.url(), rows, size)),
                    "--sql" => tranche(&redis, &ns, rows, size, &["--sql", UPDATE], &pg),
                    "--exec-persistent" => tranche(
                        &redis,
                        &ns,
                        rows,
                        size,
                        &["--exec-persistent", persistent.as_deref().unwrap()],
                        &pg,
                    ),
                    "--exec psql" => tranche(&redis, &ns, rows, size, &["--exec", PSQL], &pg),
                    _ => xargs(&pg, rows, size),
                }
                let secs = started.elapsed().as_secs_f64();
                expected += rows as i64;
                let sum: i64 = runtime.block_on(async {
                    db.query_one("SELECT sum(v)::bigint FROM t", &[])
                        .await
                        .unwrap()
                        .get(0)
                });
                assert_eq!(
                    sum, expected,
                    "{cell} at {size}: not every row updated once"
                );
                match times.iter_mut().find(|(k, _)| *k == (size, cell)) {
                    Some((_, v)) => v.push(secs),
                    None => times.push(((size, cell), vec![secs])),
                }
            }
        }
    }
    let set = set_ceiling(&redis, smoke);
    let commit = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    println!(
        "backfill: {rows} rows, {SLOTS} at once, median of {rounds} round(s), commit {commit}"
    );
    println!(
        "{:<8} {:<20} {:>10} {:>10} {:>10} {:>10}",
        "chunk", "cell", "median s", "slowest s", "rows/s", "÷ floor"
    );
    let mut json_rows = Vec::new();
    for &size in &sizes {
        let floor = median(&times_of(&times, size, "floor"));
        for &cell in &cells {
            let t = times_of(&times, size, cell);
            let (m, slowest) = (median(&t), t.iter().copied().fold(0.0, f64::max));
            let ratio = m / floor;
            let verdict = if cell == "--sql" && !smoke {
                if ratio <= 1.2 {
                    "  (≤ 1.2: met)"
                } else {
                    "  (≤ 1.2: MISSED)"
                }
            } else {
                ""
            };
            println!(
                "{size:<8} {cell:<20} {m:>10.2} {slowest:>10.2} {:>10.0} {ratio:>9.2}×{verdict}",
                rows as f64 / m
            );
            json_rows.push(json!({
                "chunk": size,
                "cell": cell,
                "median_s": m,
                "slowest_s": slowest,
                "rounds_s": t,
                "rows_per_s": rows as f64 / m,
                "ratio_to_floor": ratio,
            }));
        }
    }
    match set {
        Some(set) => println!("redis-benchmark -t set -c 50 -P 16 -q: {set:.0} SET/s"),
        None => println!("redis-benchmark not found: no SET ceiling"),
    }
    let figures = json!({
        "rows": rows,
        "slots": SLOTS,
        "rounds": rounds,
        "commit": commit,
        "smoke": smoke,
        "redis_set_per_s": set,
        "cells": json_rows,
    });
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::write(&out, serde_json::to_string_pretty(&figures).unwrap()).unwrap();
}

fn times_of(times: &[((u64, &str), Vec<f64>)], size: u64, cell: &str) -> Vec<f64> {
    times
        .iter()
        .find(|(k, _)| *k == (size, cell))
        .map(|(_, v)| v.clone())
        .unwrap_or_default()
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The chunks of `1..=rows` by `size`.
fn chunks(rows: u64, size: u64) -> Vec<(u64, u64)> {
    (0..rows.div_ceil(size))
        .map(|i| (i * size + 1, ((i + 1) * size).min(rows)))
        .collect()
}

async fn connect(url: &str) -> tokio_postgres::Client {
    let (db, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    db
}

/// The floor: [`SLOTS`] sessions, opened before the clock starts (by the caller: the
/// connect is inside, but a few ms against seconds), each taking the next chunk.
async fn floor(url: &str, rows: u64, size: u64) {
    let chunks = Arc::new(chunks(rows, size));
    let next = Arc::new(AtomicU64::new(0));
    let mut sessions = Vec::new();
    for _ in 0..SLOTS {
        let (chunks, next, url) = (chunks.clone(), next.clone(), url.to_owned());
        sessions.push(tokio::spawn(async move {
            let db = connect(&url).await;
            let update = db.prepare(UPDATE).await.unwrap();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                let Some(&(from, to)) = chunks.get(i) else {
                    return;
                };
                db.execute(&update, &[&(from as i64), &(to as i64)])
                    .await
                    .unwrap();
            }
        }));
    }
    for s in sessions {
        s.await.unwrap();
    }
}

/// `--exec`'s command: one `psql` per chunk, the connection from the environment.
const PSQL: &str = "psql -X -q -v ON_ERROR_STOP=1 -c \
     \"UPDATE t SET v = v + 1 WHERE id BETWEEN $TRANCHE_FROM AND $TRANCHE_TO\"";

/// `tranche run` over the whole table in one fresh namespace, plan included.
fn tranche(redis: &TestRedis, ns: &str, rows: u64, size: u64, job: &[&str], pg: &TestPostgres) {
    let (max, chunk) = (rows.to_string(), size.to_string());
    // Twenty partitions: eight slots stay busy to the end, and each partition holds
    // many chunks (two in flight).
    let partition = (rows / 20).max(size).to_string();
    let mut args = vec![
        "run",
        "--min",
        "1",
        "--max",
        &max,
        "--size",
        &partition,
        "--chunk",
        &chunk,
        "--concurrency",
        "4",
        "--parallel",
        "2",
    ];
    args.extend_from_slice(job);
    let mut cmd = common::tranche_at(BIN, &redis.url(), ns, &args);
    pg.env(&mut cmd);
    cmd.env("TRANCHE_QUIET", "1");
    common::run_ok(cmd);
}

/// `xargs -P 8 psql` over the same chunks: no tranche at all.
fn xargs(pg: &TestPostgres, rows: u64, size: u64) {
    let list: String = chunks(rows, size)
        .iter()
        .map(|(from, to)| format!("{from} {to}\n"))
        .collect();
    let file = pg.dir().join("chunks");
    std::fs::write(&file, list).unwrap();
    let mut cmd = Command::new("xargs");
    cmd.args(["-P", &SLOTS.to_string(), "-n", "2", "-a"])
        .arg(&file)
        .args([
            "sh",
            "-c",
            "exec psql -X -q -v ON_ERROR_STOP=1 -c \"UPDATE t SET v = v + 1 WHERE id BETWEEN $0 AND $1\"",
        ])
        .stdin(Stdio::null());
    pg.env(&mut cmd);
    let status = cmd.status().unwrap();
    assert!(status.success(), "xargs psql: {status:?}");
}

/// The `--exec-persistent` command to measure, from `TRANCHE_BENCH_PERSISTENT`: the
/// shipped Python example updates its own `users` table, not this bench's `t`, so the
/// cell runs only when given a command that runs this bench's statement.
fn persistent_example() -> Option<String> {
    std::env::var("TRANCHE_BENCH_PERSISTENT")
        .ok()
        .filter(|c| !c.is_empty())
}

/// `redis-benchmark -t set -c 50 -P 16 -q` against the server: SET/s.
fn set_ceiling(redis: &TestRedis, smoke: bool) -> Option<f64> {
    let sets = if smoke { "20000" } else { "2000000" };
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &redis.port().to_string()])
        .args(["-t", "set", "-c", "50", "-P", "16", "-n", sets, "-q"])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .rsplit('\r')
        .find(|l| l.contains("requests per second"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
