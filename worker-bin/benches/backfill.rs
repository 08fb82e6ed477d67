//! A real backfill, and where its time goes: `UPDATE t SET v = v + 1 WHERE id BETWEEN
//! … AND …` over a private PostgreSQL's table of 1,000,000 rows (testkit's
//! `TestPostgres`, durability off), in chunks of 2,000 and of 200, eight at a time
//! (`--concurrency 4 --parallel 2`), done five ways side by side:
//!
//! - `floor`: the same statements through 8 sessions opened beforehand (tokio-postgres,
//!   prepared, autocommit): what the database costs, nothing else;
//! - `--sql`: `tranche run --sql` (leases, checkpoints and statistics through a
//!   private Redis, a transaction per chunk on a pool of warm connections);
//! - `--exec-persistent`: `tranche run --exec-persistent`, warm Python processes
//!   running a copy of `examples/persistent-psycopg.py` whose UPDATE is this bench's
//!   (unfenced, as `--sql`'s is: the two differ in who speaks SQL, nothing else); it
//!   needs psycopg2 (Debian's `python3-psycopg2`, which `cargo xtask bench backfill`
//!   installs), and `TRANCHE_BENCH_PERSISTENT=CMD` measures CMD instead. Without
//!   either the cell is left out, and the table and the JSON say why;
//! - `--exec psql`: `tranche run --exec 'psql -c …'`, one `psql` per chunk;
//! - `xargs -P 8 psql`: the same chunks without tranche, one `psql` per chunk.
//!
//! Every cell runs `TRANCHE_BENCH_ROUNDS` times (default 5), the cells in a rotated
//! order each round, the table after a `VACUUM` and a `CHECKPOINT` (autovacuum off for
//! the table, so none starts inside a run); after each run every row must hold
//! exactly the number of runs that covered it. Each run prints a line to stderr as it
//! ends (round, chunk size, cell, seconds). The table shows each cell's median wall
//! time, its slowest, and its ratio to the floor, with `redis-benchmark -t set -c 50
//! -P 16 -q` beside (the machine's state when measured). The targets: `--sql` within
//! 1.2× of the floor at both chunk sizes, `--exec-persistent` within 1.5× of `--sql`.
//!
//! The two per-process cells at 200-row chunks (5,000 processes a run: 9 to 18 minutes
//! a cell a round on a loaded 2-core machine) run on the first
//! `TRANCHE_BENCH_PREFIX_ROWS` rows (default 100,000), their times scaled to the whole
//! table and marked `*` (`"prefix_rows"` in the JSON, beside the measured seconds).
//! Their cost is a process, a connection and a backend per chunk, the same for every
//! chunk, so their time grows with the chunks; what does not (the run's start and
//! end, under a second against minutes) is scaled too, and overstates them by as
//! much. A prefix rather than one round keeps the median of five on a machine whose
//! load moves. The floor, `--sql` and `--exec-persistent` run whole at both sizes: the
//! targets are theirs.
//!
//! Knobs: `TRANCHE_BENCH_ROWS` (default 1,000,000), `TRANCHE_BENCH_ROUNDS`,
//! `TRANCHE_BENCH_PREFIX_ROWS`, `TRANCHE_BENCH_CELLS` (a comma-separated list of the
//! cells to run, the floor always among them; default all), `TRANCHE_BENCH_OUT` (default
//! `target/tranche-bench/backfill.json`). With `TRANCHE_BENCH_SMOKE=1` it runs under
//! `cargo test` too: 4,000 rows, one round, a prefix of 2,000 rows, figures not
//! judged, every cell and check still run.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use serde_json::json;
use tranche_testkit::{TestPostgres, TestRedis, psycopg_python};

const BIN: &str = env!("CARGO_BIN_EXE_tranche");

/// The statement every cell runs per chunk.
const UPDATE: &str = "UPDATE t SET v = v + 1 WHERE id BETWEEN $1 AND $2";

/// Chunks in flight: `--concurrency 4 --parallel 2`, `xargs -P 8`, 8 sessions.
const SLOTS: usize = 8;

/// The chunk sizes, each a table of its own.
const SIZES: [u64; 2] = [2_000, 200];

/// The chunk size at which the per-process cells run on a prefix of the table.
const PREFIX_SIZE: u64 = 200;

/// The cells, in the table's order; the per-process ones are those with a `psql`.
const CELLS: [&str; 5] = [
    "floor",
    "--sql",
    "--exec-persistent",
    "--exec psql",
    "xargs -P 8 psql",
];

fn per_process(cell: &str) -> bool {
    cell.ends_with("psql")
}

/// One run's measure: its wall time and the rows it covered.
#[derive(Clone, Copy)]
struct Measure {
    secs: f64,
    rows: u64,
}

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
    let rows = knob("TRANCHE_BENCH_ROWS", if smoke { 4_000 } else { 1_000_000 }).max(1);
    let rounds = knob("TRANCHE_BENCH_ROUNDS", if smoke { 1 } else { 5 }).max(1) as usize;
    let prefix = knob(
        "TRANCHE_BENCH_PREFIX_ROWS",
        if smoke { rows / 2 } else { 100_000 },
    )
    .clamp(1, rows);
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
        // No autovacuum: each run leaves a million dead rows, and a vacuum launched in
        // the middle of whichever cell runs next took its CPU. The bench vacuums
        // between runs itself. VACUUM refuses a multi-statement message (an implicit
        // transaction).
        db.batch_execute("ALTER TABLE t SET (autovacuum_enabled = off)")
            .await
            .unwrap();
        // One pass over every row before the clock: the first update of freshly loaded
        // rows also sets their hint bits and prunes their pages, a cost the first cell
        // of the first round alone paid (a third slower than every later run).
        db.batch_execute("UPDATE t SET v = 0").await.unwrap();
        db.batch_execute("VACUUM ANALYZE t").await.unwrap();
        db
    });
    let persistent = persistent_command(pg.dir());
    // `TRANCHE_BENCH_CELLS=floor,--sql`: only these (the floor always, the ratios need it).
    let only = std::env::var("TRANCHE_BENCH_CELLS")
        .ok()
        .filter(|c| !c.is_empty());
    let cells: Vec<&str> = CELLS
        .into_iter()
        .filter(|&c| c != "--exec-persistent" || persistent.is_ok())
        .filter(|&c| {
            c == "floor"
                || only
                    .as_deref()
                    .is_none_or(|o| o.split(',').any(|w| w.trim() == c))
        })
        .collect();
    if let Err(why) = &persistent {
        eprintln!("backfill: --exec-persistent not measured: {why}");
    }
    eprintln!(
        "backfill: {rows} rows, {rounds} round(s), chunks of {SIZES:?}, cells {cells:?}; \
         per-process cells at {PREFIX_SIZE} on the first {prefix} rows"
    );
    // (size, cell) -> each round's measure.
    let mut times: Vec<((u64, &str), Vec<Measure>)> = Vec::new();
    // What every row must hold: runs over the whole table plus runs over the prefix.
    let (mut whole, mut prefixed) = (0i64, 0i64);
    let mut run = 0;
    for round in 0..rounds {
        for &size in &SIZES {
            let mut order = cells.clone();
            order.rotate_left(round % cells.len());
            for cell in order {
                let upto = if per_process(cell) && size == PREFIX_SIZE {
                    prefix
                } else {
                    rows
                };
                // A checkpoint too, so that none falls inside a run.
                runtime.block_on(async {
                    db.batch_execute("VACUUM t").await.unwrap();
                    db.batch_execute("CHECKPOINT").await.unwrap();
                });
                run += 1;
                let ns = format!("bf{run}");
                let started = Instant::now();
                match cell {
                    "floor" => runtime.block_on(floor(&pg.url(), upto, size)),
                    "--sql" => tranche(&redis, &ns, upto, size, &["--sql", UPDATE], &pg),
                    "--exec-persistent" => {
                        let cmd = persistent.as_deref().unwrap();
                        tranche(&redis, &ns, upto, size, &["--exec-persistent", cmd], &pg)
                    }
                    "--exec psql" => tranche(&redis, &ns, upto, size, &["--exec", PSQL], &pg),
                    _ => xargs(&pg, upto, size),
                }
                let secs = started.elapsed().as_secs_f64();
                eprintln!(
                    "backfill: round {}/{rounds} chunk {size:>5} {cell:<18} {secs:>8.2} s{}",
                    round + 1,
                    if upto < rows {
                        format!(" (first {upto} rows)")
                    } else {
                        String::new()
                    }
                );
                if upto < rows {
                    prefixed += 1;
                } else {
                    whole += 1;
                }
                let wrong: i64 = runtime.block_on(async {
                    db.query_one(
                        "SELECT count(*) FROM t \
                         WHERE v <> CASE WHEN id <= $1::bigint THEN $2::bigint ELSE $3::bigint END",
                        &[&(prefix as i64), &(whole + prefixed), &whole],
                    )
                    .await
                    .unwrap()
                    .get(0)
                });
                assert_eq!(wrong, 0, "{cell} at {size}: rows not updated exactly once");
                let measure = Measure { secs, rows: upto };
                match times.iter_mut().find(|(k, _)| *k == (size, cell)) {
                    Some((_, v)) => v.push(measure),
                    None => times.push(((size, cell), vec![measure])),
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
    let mut scaled_any = false;
    for &size in &SIZES {
        // Seconds for the whole table: a prefix's scaled by the rows it covered.
        let whole_secs = |cell: &str| -> Vec<f64> {
            times_of(&times, size, cell)
                .iter()
                .map(|m| m.secs * rows as f64 / m.rows as f64)
                .collect()
        };
        let floor = median(&whole_secs("floor"));
        let sql = median(&whole_secs("--sql"));
        for &cell in &cells {
            let t = whole_secs(cell);
            let measured: Vec<f64> = times_of(&times, size, cell)
                .iter()
                .map(|m| m.secs)
                .collect();
            let covered = times_of(&times, size, cell)
                .first()
                .map_or(rows, |m| m.rows);
            let (m, slowest) = (median(&t), t.iter().copied().fold(0.0, f64::max));
            let ratio = m / floor;
            let verdict = match cell {
                _ if smoke => String::new(),
                "--sql" => target(ratio, 1.2, "floor"),
                "--exec-persistent" => target(m / sql, 1.5, "--sql"),
                _ => String::new(),
            };
            let mark = if covered < rows {
                scaled_any = true;
                "*"
            } else {
                ""
            };
            println!(
                "{size:<8} {:<20} {m:>10.2} {slowest:>10.2} {:>10.0} {ratio:>9.2}×{verdict}",
                format!("{cell}{mark}"),
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
                // The rows each run covered; below `rows`, the seconds above are
                // `measured_rounds_s` scaled by rows / prefix_rows.
                "prefix_rows": (covered < rows).then_some(covered),
                "measured_rounds_s": measured,
            }));
        }
    }
    if scaled_any {
        println!(
            "* run on the first {prefix} rows only; seconds and rows/s scaled ×{:.1} to {rows} rows",
            rows as f64 / prefix as f64
        );
    }
    if let Err(why) = &persistent {
        println!("--exec-persistent: not measured ({why})");
    }
    match set {
        Some(set) => println!("redis-benchmark -t set -c 50 -P 16 -q: {set:.0} SET/s"),
        None => println!("redis-benchmark not found: no SET ceiling"),
    }
    let figures = json!({
        "rows": rows,
        "slots": SLOTS,
        "rounds": rounds,
        "prefix_rows": prefix,
        "commit": commit,
        "smoke": smoke,
        "redis_set_per_s": set,
        "exec_persistent": match &persistent {
            Ok(cmd) => json!({ "command": cmd }),
            Err(why) => json!({ "not_measured": why }),
        },
        "cells": json_rows,
    });
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::write(&out, serde_json::to_string_pretty(&figures).unwrap()).unwrap();
}

/// `  (≤ 1.2× floor: met)` or `MISSED`.
fn target(ratio: f64, limit: f64, of: &str) -> String {
    let verdict = if ratio <= limit { "met" } else { "MISSED" };
    format!("  ({ratio:.2}× {of}, ≤ {limit}: {verdict})")
}

fn times_of(times: &[((u64, &str), Vec<Measure>)], size: u64, cell: &str) -> Vec<Measure> {
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

/// `tranche run` over IDs `1..=rows` in one fresh namespace, plan included.
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

/// The `--exec-persistent` command to measure: `TRANCHE_BENCH_PERSISTENT` when set,
/// else the Python example, copied into `dir` with this bench's statement for its own,
/// under the first Python that imports psycopg2 ([`psycopg_python`]). `Err` says why
/// none.
fn persistent_command(dir: &Path) -> Result<String, String> {
    if let Some(cmd) = std::env::var("TRANCHE_BENCH_PERSISTENT")
        .ok()
        .filter(|c| !c.is_empty())
    {
        return Ok(cmd);
    }
    let python = psycopg_python().ok_or(
        "no python3 imports psycopg2: apt-get install python3-psycopg2 \
         (cargo xtask bench backfill does), or TRANCHE_BENCH_PERSISTENT=CMD",
    )?;
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/persistent-psycopg.py");
    let source = std::fs::read_to_string(&example).unwrap();
    let script = dir.join("persistent-bench.py");
    std::fs::write(&script, with_bench_update(&source)).unwrap();
    Ok(format!("{python} {}", script.display()))
}

/// The example with its `UPDATE = """…"""` replaced by this bench's statement, in
/// psycopg's placeholders. Panics when the example no longer has one such block: the
/// cell would otherwise measure another statement than the others.
fn with_bench_update(example: &str) -> String {
    let start = example
        .find("UPDATE = \"\"\"")
        .expect("examples/persistent-psycopg.py has no UPDATE = \"\"\"…\"\"\" to replace");
    let body = start + "UPDATE = \"\"\"".len();
    let end = body
        + example[body..]
            .find("\"\"\"")
            .expect("examples/persistent-psycopg.py: UPDATE's string never ends");
    format!(
        "{}UPDATE = \"UPDATE t SET v = v + 1 WHERE id BETWEEN %(from)s AND %(to)s\"{}",
        &example[..start],
        &example[end + 3..]
    )
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
