//! Archive benchmark: Redis memory per completed partition, `get` latency per tier and
//! archiver throughput, on a private `redis-server`.
//!
//! For sets S (seed-shaped: 8 workers, 1000-ID ranges, whole-second times and
//! durations) and M (the same with milliseconds), records are fed into the inbox as the
//! active store writes them (entries of 100 JSON lines) and drained by the archiver
//! with the default tier thresholds (100,000 and 500,000). At each checkpoint
//! (100,000, 500,000, 1,000,000 and 5,000,000 completed) a compaction runs and the
//! `used_memory` delta over the empty server is divided by the count. The seed's own
//! text batches (`APPEND` of `P{pid}:{min}-{max}:{code}:{ts}:{dur},` per record, one key
//! per batch of 100) are measured the same way on a second server.
//!
//! Beside the archiver's records per second (wall time), the CPU that Redis and this
//! process spent per record while it ran, which other load on the machine skews less.
//!
//! `used_memory` also holds server costs that do not grow with the archive: Redis 7
//! keeps a latency histogram of about 25-30 KB for every command name ever run
//! (`latency-tracking`, on by default), about 0.9 MB for the thirty-odd commands here,
//! which is 0.9 bytes per partition at 1,000,000 and 0.2 at 5,000,000. With
//! `TRANCHE_BENCH_KEYS` set, the keys' `MEMORY USAGE` is printed by kind beside it.
//!
//! After the last checkpoint an export decodes every record (it fails on any batch or
//! segment that does not decode, and the count must be every record fed: none expired).
//!
//! Every record fed has its completed-index bit set (`{ns:s}:completed:index`, at the
//! schema's `bit_offset`), as the active store's completion script sets it in the same
//! step as its XADD: the archiver dead-letters a record whose bit is clear, and every
//! pass here asserts that none was. Past 64 KB the index is grown as that script grows
//! it, to just under a jemalloc size class (`grow_index_lua`), not by Redis's doubling.
//!
//! The namespace is raised to the latest archive format (`ArchiveFormat::LATEST`, what
//! a new namespace gets once planning raises it); `TRANCHE_BENCH_FORMAT=N` measures
//! format N instead (1, which a namespace keeps until it is raised, or 2).
//! `TRANCHE_BENCH_SETS=S` runs set S alone.
//!
//! Set `TRANCHE_BENCH_MAX` to stop earlier (e.g. 1000000). With `TRANCHE_BENCH_SMOKE=1`
//! the sizes shrink by a hundred (checkpoints 1,000 to 50,000, tier thresholds 1,000
//! and 5,000): a few seconds, figures not judged, every code path and assert still run.
//! Output: a table on stdout and JSON at `$TRANCHE_BENCH_OUT` (default
//! `target/tranche-bench/archive.json`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Map, Value, json};
use tranche_active_store::RedisConnection;
use tranche_archive_store::{
    ArchiveFormat, ArchiveQuery, Archiver, Compaction, Config, Export, Lookup, RedisArchive, Tier,
};
use tranche_codec::{CompletedRecord, KeySchema, WorkerDict, encode_json, encode_text_v1};

use tranche_testkit::TestRedis;

const WORKERS: usize = 8;
const SEED: u64 = 0x0074_7261_6e63_6865;

/// The sizes of a run: full, or a hundredth of them for `TRANCHE_BENCH_SMOKE=1`.
#[derive(Debug, Clone, Copy)]
struct Scale {
    /// Completed counts at which memory is measured.
    checkpoints: [u64; 4],
    /// The archive's tier thresholds (`Config::compressed_at`, `summary_at`).
    compressed_at: u64,
    summary_at: u64,
    /// Records fed between two drains.
    feed: u64,
    /// `get` calls per latency figure.
    samples: usize,
}

impl Scale {
    fn from_env() -> Self {
        let smoke = std::env::var("TRANCHE_BENCH_SMOKE").is_ok_and(|v| v == "1");
        let full = Self {
            checkpoints: [100_000, 500_000, 1_000_000, 5_000_000],
            compressed_at: 100_000,
            summary_at: 500_000,
            feed: 20_000,
            samples: 2000,
        };
        if smoke {
            Self {
                checkpoints: full.checkpoints.map(|c| c / 100),
                compressed_at: full.compressed_at / 100,
                summary_at: full.summary_at / 100,
                feed: full.feed / 100,
                samples: 200,
            }
        } else {
            full
        }
    }
}

/// Generates records `from..=to` of a set, continuing `free_at` and `rng`.
struct Gen {
    rng: StdRng,
    free_at: [u64; WORKERS],
    names: Vec<Arc<str>>,
    millis: bool,
}

impl Gen {
    fn new(millis: bool) -> Self {
        Self {
            rng: StdRng::seed_from_u64(SEED),
            free_at: [1_719_234_000_000; WORKERS],
            names: (1..=WORKERS).map(|w| format!("worker{w}").into()).collect(),
            millis,
        }
    }

    fn next(&mut self, pid: u64) -> CompletedRecord {
        let w = (0..WORKERS).min_by_key(|&w| self.free_at[w]).unwrap_or(0);
        let duration_ms = if self.millis {
            self.rng.random_range(200_000..=400_000)
        } else {
            self.rng.random_range(200..=400u64) * 1000
        };
        let completed_at_ms = self.free_at[w] + duration_ms;
        self.free_at[w] = completed_at_ms;
        CompletedRecord {
            pid,
            min_id: (pid - 1) * 1000 + 1,
            max_id: pid * 1000,
            worker: Arc::clone(&self.names[w]),
            completed_at_ms,
            duration_ms,
        }
    }
}

/// How the completion script grows a large completed index before its `BITFIELD`:
/// `grow_bitmap` of `codec/lua/common.lua`, the rule complete.lua and archive.lua
/// share. `KEYS[1]` the index, `ARGV[1]` the highest bit offset the batch sets.
fn grow_index_lua() -> String {
    use tranche_codec::lua::{self, Fragment};
    const GROW: Fragment = Fragment::new("grow_bitmap(KEYS[1], tonumber(ARGV[1]))\n");
    lua::compose(&[&GROW])
}

/// The archive format the bench's namespace is raised to (`TRANCHE_BENCH_FORMAT`).
fn bench_format() -> ArchiveFormat {
    std::env::var("TRANCHE_BENCH_FORMAT")
        .ok()
        .and_then(|v| v.parse().ok())
        .and_then(ArchiveFormat::from_number)
        .unwrap_or(ArchiveFormat::LATEST)
}

fn used_memory(server: &TestRedis) -> u64 {
    let info = server.cli(&["INFO", "memory"]);
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("used_memory in INFO")
}

/// `MEMORY USAGE` summed by key kind (the key with digits blanked out).
fn print_breakdown(server: &TestRedis) {
    let keys: Vec<String> = server.query(redis::cmd("KEYS").arg("*"));
    let mut kinds: std::collections::BTreeMap<String, (u64, u64, u64)> = Default::default();
    for k in keys {
        let used: u64 = server.query(
            redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(&k)
                .arg("SAMPLES")
                .arg(0),
        );
        let kind: String = k
            .chars()
            .map(|c| if c.is_ascii_digit() { '#' } else { c })
            .collect();
        // A string's own length beside what Redis allocates for it.
        let len: u64 = if kind.contains(":completed:seg:") || kind.ends_with("archived") {
            server.query(redis::cmd("STRLEN").arg(&k))
        } else {
            0
        };
        let e = kinds.entry(kind).or_default();
        e.0 += 1;
        e.1 += used;
        e.2 += len;
    }
    for (kind, (n, bytes, len)) in kinds {
        let strlen = if len > 0 {
            format!(" (string length {:.0} a key)", len as f64 / n as f64)
        } else {
            String::new()
        };
        println!("  {kind:<40} {n:>8} keys {bytes:>12} bytes{strlen}");
    }
    // Where memory goes beside the keys: dictionaries, clients, scripts.
    for line in server.cli(&["INFO", "memory"]).lines() {
        if [
            "used_memory:",
            "used_memory_overhead:",
            "used_memory_dataset:",
            "used_memory_scripts:",
            "mem_clients_normal:",
            "used_memory_startup:",
        ]
        .iter()
        .any(|p| line.starts_with(p))
        {
            println!("  {line}");
        }
    }
    for line in server.cli(&["INFO", "commandstats"]).lines() {
        if line.starts_with("cmdstat_") {
            println!("  {line}");
        }
    }
}

/// The server's CPU time so far (user + system, every thread), in seconds.
async fn server_cpu_s(conn: &RedisConnection) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(&mut conn.clone())
        .await
        .unwrap();
    info.lines()
        .filter_map(|l| {
            l.strip_prefix("used_cpu_user:")
                .or_else(|| l.strip_prefix("used_cpu_sys:"))
        })
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum()
}

/// This process's CPU time so far (user + system, every thread), in seconds, from
/// `/proc/self/stat` (clock ticks of 10 ms; summed over many rounds the rounding
/// averages out). 0 where there is no `/proc`.
fn own_cpu_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let ticks: u64 = after
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse::<u64>().ok())
        .sum();
    ticks as f64 / 100.0
}

fn p99_ms(mut xs: Vec<Duration>) -> f64 {
    xs.sort();
    xs[xs.len() * 99 / 100].as_secs_f64() * 1000.0
}

async fn get_p99(
    archive: &RedisArchive<RedisConnection>,
    samples: usize,
    upto: u64,
    want: Tier,
) -> f64 {
    let mut rng = StdRng::seed_from_u64(7);
    let mut times = Vec::with_capacity(samples);
    for _ in 0..samples {
        let pid = rng.random_range(1..=upto);
        let t = Instant::now();
        let found = archive.get(pid).await.unwrap();
        times.push(t.elapsed());
        match found {
            Lookup::Archived { record, tier } => {
                assert_eq!(record.pid, pid);
                assert_eq!(tier, want, "pid {pid}");
            }
            other => panic!("pid {pid}: {other:?}"),
        }
    }
    p99_ms(times)
}

struct SetResult {
    bytes: Vec<(u64, f64)>,
    seed_text: Vec<(u64, f64)>,
    get_p99: Vec<(&'static str, f64)>,
    records_per_s: f64,
    /// Redis CPU per archived record while the archiver ran, µs.
    redis_cpu_us: f64,
    /// This process's CPU per archived record while the archiver ran, µs.
    client_cpu_us: f64,
}

async fn run_set(millis: bool, max: u64, scale: Scale) -> SetResult {
    let server = TestRedis::start();
    let conn = RedisConnection::connect(&server.url()).await.unwrap();
    let config = Config {
        consumer: "bench".into(),
        compressed_at: scale.compressed_at,
        summary_at: scale.summary_at,
        ..Config::default()
    };
    let schema = config.schema().unwrap();
    let archive = RedisArchive::new(conn.clone(), config).unwrap();
    archive.raise_format(bench_format()).await.unwrap();
    let grow_index: String = server.query(redis::cmd("SCRIPT").arg("LOAD").arg(grow_index_lua()));
    let base = used_memory(&server);
    let mut source = Gen::new(millis);
    let mut all_done = 0u64;
    let mut busy = Duration::ZERO;
    // CPU seconds spent while the archiver ran, by Redis and by this process: less
    // sensitive than wall time to other load on the machine.
    let (mut server_cpu, mut client_cpu) = (0.0f64, 0.0f64);
    let mut bytes = Vec::new();
    let mut gets = Vec::new();
    for &checkpoint in scale.checkpoints.iter().filter(|&&c| c <= max) {
        while all_done < checkpoint {
            let n = scale.feed.min(checkpoint - all_done);
            let mut pipe = redis::pipe();
            let recs: Vec<CompletedRecord> = (all_done + 1..=all_done + n)
                .map(|p| source.next(p))
                .collect();
            for chunk in recs.chunks(100) {
                let lines: Vec<String> = chunk.iter().map(encode_json).collect();
                // What the completion script does in the same step as its XADD: grow a
                // large index to just under a size class (`grow_index_lua`), then set
                // each pid's completed-index bit, without which the archiver
                // dead-letters the record as never completed.
                let top = chunk
                    .iter()
                    .map(|r| schema.bit_offset(r.pid))
                    .max()
                    .unwrap_or(0);
                pipe.cmd("EVALSHA")
                    .arg(&grow_index)
                    .arg(1)
                    .arg(schema.completed_index(0))
                    .arg(top)
                    .ignore();
                let index = pipe.cmd("BITFIELD").arg(schema.completed_index(0));
                for r in chunk {
                    index
                        .arg("SET")
                        .arg("u1")
                        .arg(schema.bit_offset(r.pid))
                        .arg(1);
                }
                index.ignore();
                pipe.cmd("XADD")
                    .arg(schema.inbox(0))
                    .arg("*")
                    .arg("r")
                    .arg(lines.join("\n"))
                    .ignore();
            }
            let _: () = pipe.query_async(&mut conn.clone()).await.unwrap();
            let (server0, own0) = (server_cpu_s(&conn).await, own_cpu_s());
            let t = Instant::now();
            loop {
                let pass = archive.archive_once().await.unwrap();
                assert_eq!(pass.dead_lettered, 0, "records dead-lettered: {pass:?}");
                assert_eq!(pass.malformed, 0, "records dropped: {pass:?}");
                if pass.entries == 0 {
                    break;
                }
            }
            busy += t.elapsed();
            server_cpu += server_cpu_s(&conn).await - server0;
            client_cpu += own_cpu_s() - own0;
            let before = all_done;
            all_done += n;
            let (compressed, simple) = (3 * scale.compressed_at, scale.compressed_at / 2);
            if before < compressed && all_done >= compressed {
                // Compacted at the first checkpoint: everything is in batches, none
                // expires yet.
                gets.push((
                    "compressed",
                    get_p99(&archive, scale.samples, compressed, Tier::Compressed).await,
                ));
            }
            if before < simple && all_done >= simple {
                gets.push((
                    "simple",
                    get_p99(&archive, scale.samples, simple, Tier::Simple).await,
                ));
            }
        }
        archive.compact().await.unwrap();
        if std::env::var_os("TRANCHE_BENCH_KEYS").is_some() {
            print_breakdown(&server);
        }
        let used = used_memory(&server).saturating_sub(base);
        bytes.push((checkpoint, used as f64 / checkpoint as f64));
        let index: u64 = server.query(
            redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(schema.completed_index(0))
                .arg("SAMPLES")
                .arg(0),
        );
        println!("{checkpoint}: completed index MEMORY USAGE {index} bytes");
    }
    if all_done >= 2 * scale.summary_at {
        gets.push((
            "summary",
            get_p99(&archive, scale.samples, all_done - 1000, Tier::Summary).await,
        ));
    }
    // Every record is still there and decodes: an export decodes every batch and
    // segment, and fails on any that does not.
    let t = Instant::now();
    let dump = archive.export(0).await.unwrap();
    assert_eq!(dump.entries(), all_done, "records lost or expired");
    println!(
        "export: all {all_done} records decoded in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    drop(server);
    let seed_text = seed_text(millis, max, scale).await;
    SetResult {
        bytes,
        seed_text,
        get_p99: gets,
        records_per_s: all_done as f64 / busy.as_secs_f64(),
        redis_cpu_us: server_cpu * 1e6 / all_done as f64,
        client_cpu_us: client_cpu * 1e6 / all_done as f64,
    }
}

/// The seed's compressed format as the seed stores it: APPEND per record.
async fn seed_text(millis: bool, max: u64, scale: Scale) -> Vec<(u64, f64)> {
    let server = TestRedis::start();
    let conn = RedisConnection::connect(&server.url()).await.unwrap();
    let schema = KeySchema::new("elk", 1).unwrap();
    let mut dict = WorkerDict::new();
    for w in 1..=WORKERS {
        dict.insert(&format!("worker{w}")).unwrap();
    }
    let base = used_memory(&server);
    let mut source = Gen::new(millis);
    let mut done = 0u64;
    let mut out = Vec::new();
    for &checkpoint in scale.checkpoints.iter().filter(|&&c| c <= max) {
        while done < checkpoint {
            let n = scale.feed.min(checkpoint - done);
            let mut pipe = redis::pipe();
            for pid in done + 1..=done + n {
                let r = source.next(pid);
                let text = encode_text_v1(std::slice::from_ref(&r), &dict).unwrap();
                pipe.cmd("APPEND")
                    .arg(schema.completed_batch(pid / 100))
                    .arg(format!("{text},"))
                    .ignore();
            }
            let _: () = pipe.query_async(&mut conn.clone()).await.unwrap();
            done += n;
        }
        let used = used_memory(&server).saturating_sub(base);
        out.push((checkpoint, used as f64 / checkpoint as f64));
    }
    out
}

fn by_count(xs: &[(u64, f64)]) -> Value {
    Value::Object(
        xs.iter()
            .map(|(k, v)| (k.to_string(), json!((v * 100.0).round() / 100.0)))
            .collect::<Map<_, _>>(),
    )
}

#[tokio::main]
async fn main() {
    let max: u64 = std::env::var("TRANCHE_BENCH_MAX")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(u64::MAX);
    let scale = Scale::from_env();
    println!("archive format {}", bench_format().number());
    let s = run_set(false, max, scale).await;
    let m = if std::env::var("TRANCHE_BENCH_SETS").is_ok_and(|v| v == "S") {
        None
    } else {
        Some(run_set(true, max, scale).await)
    };
    // The seed's table: 100K simple ~ 20 MB, 500K compressed ~ 15 MB, 5M summary ~ 30 MB.
    let seed_table = [
        (100_000u64, 200.0),
        (500_000, 30.0),
        (1_000_000, 20.0),
        (5_000_000, 6.0),
    ];
    println!(
        "{:>10} {:>10} {:>10} {:>12} {:>14}",
        "completed", "S B/part", "M B/part", "seed text", "seed table"
    );
    for (i, (count, s_b)) in s.bytes.iter().enumerate() {
        let table = seed_table
            .iter()
            .find(|(c, _)| c == count)
            .map_or(0.0, |t| t.1);
        let m_b = m
            .as_ref()
            .map_or_else(|| "-".to_owned(), |m| format!("{:.2}", m.bytes[i].1));
        println!(
            "{count:>10} {s_b:>10.2} {m_b:>10} {:>12.2} {table:>14.1}",
            s.seed_text[i].1
        );
    }
    for (tier, p99) in &s.get_p99 {
        println!("get p99 {tier:>10}: {p99:.3} ms (seed table: 0.5 / 3 / 5 ms)");
    }
    println!(
        "archiver: {:.0} records/s, CPU per record: Redis {:.2} µs, client {:.2} µs (S)",
        s.records_per_s, s.redis_cpu_us, s.client_cpu_us
    );
    if let Some(m) = &m {
        println!(
            "archiver: {:.0} records/s, CPU per record: Redis {:.2} µs, client {:.2} µs (M)",
            m.records_per_s, m.redis_cpu_us, m.client_cpu_us
        );
    }
    let mut get = Map::new();
    get.insert("active".into(), Value::Null);
    for (tier, p99) in &s.get_p99 {
        get.insert((*tier).into(), json!(p99));
    }
    let out = json!({
        "bytes_per_partition": by_count(&s.bytes),
        "seed_text_bytes_per_partition": by_count(&s.seed_text),
        "get_p99_ms": get,
        "all_active_p99_ms": Value::Null,
        "stats_p99_ms": Value::Null,
        "archiver_records_per_s": s.records_per_s.round(),
        "archiver_redis_cpu_us_per_record": (s.redis_cpu_us * 100.0).round() / 100.0,
        "archiver_client_cpu_us_per_record": (s.client_cpu_us * 100.0).round() / 100.0,
        "archive_format": bench_format().number(),
        "M": m.as_ref().map(|m| json!({
            "bytes_per_partition": by_count(&m.bytes),
            "seed_text_bytes_per_partition": by_count(&m.seed_text),
            "archiver_records_per_s": m.records_per_s.round(),
            "archiver_redis_cpu_us_per_record": (m.redis_cpu_us * 100.0).round() / 100.0,
            "archiver_client_cpu_us_per_record": (m.client_cpu_us * 100.0).round() / 100.0,
        })),
    });
    let path = std::env::var_os("TRANCHE_BENCH_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/tranche-bench/archive.json")
        });
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::write(&path, serde_json::to_string_pretty(&out).unwrap()).unwrap();
    println!("written to {}", path.display());
}
