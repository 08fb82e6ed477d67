//! `cargo xtask soak`: a fault-injecting soak run with an oracle.
//!
//! A fleet of real `tranche run --exec` workers and one library runner (the
//! `soak_runner` example) works through a plan on a private Redis (behind the soak's own
//! TCP proxy) or a local 3+3 cluster, or (`--embedded`) one process on an embedded
//! state file, while a seeded schedule injects one fault every `--interval` seconds. Every chunk appends START and END lines to its worker's ledger;
//! at the end the oracles read the ledgers, the statistics, `check` and the `health`
//! samples, print one JSON report and write `target/soak/report.json` and
//! `target/soak/timeline.svg`. Any failed oracle makes the task fail. `--self-test`
//! (`selftest.rs`) shows that each oracle can: a short run per sabotaged worker.

mod faults;
mod fleet;
mod inject;
mod json;
mod judge;
mod ledger;
mod options;
mod proxy;
mod report;
mod resp;
mod selftest;
mod server;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use faults::{Fault, Rng};
use fleet::{Incarnation, Kind, Setup, Slot, now_us};
use json::Json;
use judge::firing;
use options::{Options, Profile};
use proxy::{Mode, Proxy};
use server::Node;

/// IDs per partition; chunks are a quarter of it.
const PARTITION: u64 = 1000;
const NAMESPACE: &str = "soak";
/// `health`'s thresholds here: a stall or an archive lag of 30 s is damage in a run
/// this short; the update-latency rule is relaxed (debug builds on a busy machine pass
/// 100 ms all the time, which would mask every other alert).
const HEALTH: [&str; 7] = [
    "--json",
    "--max-stall",
    "30s",
    "--max-archive-lag",
    "30s",
    "--max-update-p99-ms",
    "2000",
];

/// Partitions waiting to be claimed, from `status --json`: never issued or pending.
fn waiting(status: &Json) -> u64 {
    ["unissued", "pending"]
        .iter()
        .filter_map(|k| status.get(k)?.as_u64())
        .sum()
}

/// How long after a worker's kill its chunks' processes are looked for in /proc: their
/// watchers kill the groups as soon as the worker's lifeline closes (milliseconds).
const ORPHAN_CHECK: Duration = Duration::from_millis(1500);

/// `cargo xtask soak [ARGS]`.
pub(crate) fn run(args: &[String]) -> Result<()> {
    if args.iter().any(|a| a == "--self-test") {
        return selftest::run(args);
    }
    let opts = Options::parse(args)?;
    let started = Instant::now();
    let server = if opts.embedded {
        PathBuf::new()
    } else {
        crate::redis::ensure_installed()?
    };
    let (tranche, runner) = if opts.prebuilt {
        prebuilt()?
    } else {
        build(opts.release)?
    };
    let build_s = started.elapsed().as_secs_f64();
    let report = run_once(opts, &server, tranche, runner, build_s, started)?;
    let failed = failed(&report);
    if !failed.is_empty() {
        bail!("soak oracles failed: {}", failed.join(", "));
    }
    Ok(())
}

/// The oracles of `report` that failed.
fn failed(report: &Json) -> Vec<String> {
    match report.get("oracles") {
        Some(Json::Obj(o)) => o
            .iter()
            .filter(|(_, v)| v.get("pass") == Some(&Json::Bool(false)))
            .map(|(k, _)| k.clone())
            .collect(),
        _ => vec!["(no oracles)".into()],
    }
}

/// One soak run with built binaries: its report, printed and written to
/// `target/soak/report.json`.
fn run_once(
    mut opts: Options,
    server: &Path,
    tranche: PathBuf,
    runner: PathBuf,
    build_s: f64,
    started: Instant,
) -> Result<Json> {
    // Faults the chosen topology cannot have are left out, and said so.
    let mut skipped = Vec::new();
    opts.faults.retain(|f| {
        let ok = match f.as_str() {
            _ if opts.embedded => ["kill", "stop", "panic", "corrupt-state"].contains(&f.as_str()),
            "failover" => opts.cluster,
            "redis-pause" | "proxy" | "proxy-latency" | "proxy-blackhole" | "proxy-reset" => {
                !opts.cluster
            }
            "corrupt-state" => false,
            _ => true,
        };
        if !ok {
            skipped.push(f.clone());
        }
        ok
    });
    if opts.faults.is_empty() {
        bail!(
            "no fault of --faults applies here (left out: {})",
            skipped.join(",")
        );
    }
    let dir = crate::workspace_root().join("target/soak");
    let _ = std::fs::remove_dir_all(&dir);
    for sub in ["ledger", "logs", "redis"] {
        std::fs::create_dir_all(dir.join(sub))?;
    }
    std::fs::write(dir.join("ledger.sh"), fleet::LEDGER_SH)?;
    // What the ledger script waits on: a FIFO nobody ever writes.
    crate::step("mkfifo", Command::new("mkfifo").arg(dir.join("never.fifo")))?;
    eprintln!(
        "xtask: soak seed {} for {} s, a fault every {} s from {} ({}{})",
        opts.seed,
        opts.duration.as_secs(),
        opts.interval.as_secs(),
        opts.faults.join(","),
        if opts.embedded {
            "one embedded process, by turns `tranche run --exec` and the runner".to_owned()
        } else {
            format!(
                "{} exec workers + {} runners of {}",
                opts.workers, opts.runners, opts.runner_concurrency
            )
        },
        match (opts.cluster, opts.profile) {
            (true, Profile::Classic) => ", cluster".to_owned(),
            (false, Profile::Classic) => String::new(),
            (cluster, p) => format!(
                "{}, {} profile",
                if cluster { ", cluster" } else { "" },
                p.name()
            ),
        }
    );
    let mut soak = Soak::start(&opts, server, &dir, tranche, runner)?;
    let outcome = soak.go();
    soak.shutdown();
    let mut report = outcome?;
    if let Json::Obj(pairs) = &mut report {
        pairs.insert(1, ("build_s".into(), build_s.into()));
        pairs.insert(2, ("wall_s".into(), started.elapsed().as_secs_f64().into()));
        pairs.insert(
            3,
            (
                "faults_left_out".into(),
                Json::Arr(skipped.into_iter().map(Json::from).collect()),
            ),
        );
    }
    let text = report.pretty();
    std::fs::write(dir.join("report.json"), &text)?;
    print!("{text}");
    eprintln!(
        "xtask: soak report in {}, timeline in {}",
        dir.join("report.json").display(),
        dir.join("timeline.svg").display()
    );
    Ok(report)
}

/// The debug binary and runner example a test build left in the target directory
/// (`cargo test` builds examples too), without building them again: the soak's own
/// build of the one package resolves features apart from the workspace's test build
/// and would compile most of the tree a second time.
fn prebuilt() -> Result<(PathBuf, PathBuf)> {
    let (tranche, runner) = paths(false);
    for exe in [&tranche, &runner] {
        if !exe.is_file() {
            bail!(
                "--prebuilt: {} is missing; build it first or leave --prebuilt out",
                exe.display()
            );
        }
    }
    Ok((tranche, runner))
}

/// Where the binary and the runner example are built (debug unless `release`).
fn paths(release: bool) -> (PathBuf, PathBuf) {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::workspace_root().join("target"));
    let profile = target.join(if release { "release" } else { "debug" });
    (
        profile.join("tranche"),
        profile.join("examples/soak_runner"),
    )
}

/// Builds the binary and the runner example (debug unless `release`); their paths.
fn build(release: bool) -> Result<(PathBuf, PathBuf)> {
    let mut cmd = crate::cargo();
    cmd.args([
        "build",
        "--locked",
        "-p",
        "tranche-worker",
        "--bin",
        "tranche",
    ])
    .args(["--example", "soak_runner"]);
    if release {
        cmd.arg("--release");
    }
    crate::step("cargo build (tranche and soak_runner)", &mut cmd)?;
    Ok(paths(release))
}

/// Where a `tranche` command finds the job: a Redis URL, or else the state file.
fn locate(cmd: &mut Command, url: Option<&str>, state: &Path) {
    match url {
        Some(url) => cmd
            .env("TRANCHE_REDIS_URL", url)
            .env_remove("TRANCHE_STATE"),
        None => cmd
            .env_remove("TRANCHE_REDIS_URL")
            .env_remove("TRANCHE_REDIS_FILE")
            .env("TRANCHE_STATE", state),
    };
}

/// One `health` sample: seconds since start, and the rules firing (None: no answer).
type Sample = (f64, Option<Vec<String>>);

struct Soak {
    opts: Options,
    dir: PathBuf,
    tranche: PathBuf,
    nodes: Vec<Node>,
    proxy: Option<Proxy>,
    /// The URL the soak's own commands use (straight to Redis, not through the proxy);
    /// `None` embedded.
    direct: Option<String>,
    setup: Setup,
    slots: Vec<Slot>,
    incarnations: Vec<Incarnation>,
    faults: Vec<Fault>,
    planned: Vec<(u64, u64)>,
    t0: Instant,
    t0_us: u64,
    health: Arc<Mutex<Vec<Sample>>>,
    stop_monitor: Arc<Mutex<bool>>,
    monitor: Option<thread::JoinHandle<()>>,
    max_redis_bytes: u64,
    max_rss_kib: u64,
    max_runner_rss_kib: u64,
    unexpected_exits: Vec<String>,
    /// Kills whose leftovers are still to be looked for: the incarnation, its slot and
    /// when to look.
    orphan_checks: Vec<(String, usize, Instant)>,
    /// What those looks found: processes of a killed worker still alive.
    orphans: Vec<String>,
    /// `check --json` and `stats --json` just before the drain's first repair, if it
    /// made one: what the oracles judge, the repair having rewritten both since.
    pre_repair: Option<(String, String)>,
}

/// A fault in progress, healed at its time.
struct Active {
    index: usize,
    /// When it is healed (for an aimed stop, at the latest).
    heal_at: Instant,
    undo: Undo,
    /// An aimed stop: healed as soon as another worker takes over what it froze.
    taken_over: Option<inject::TakeOver>,
}

enum Undo {
    Nothing,
    Cont(usize),
    Proxy,
    /// `tranche throttle off`.
    Throttle,
    Check {
        port: u16,
        key: Vec<u8>,
        field: Option<Vec<u8>>,
        value: Vec<u8>,
    },
}

impl Soak {
    fn start(
        opts: &Options,
        server: &Path,
        dir: &Path,
        tranche: PathBuf,
        runner: PathBuf,
    ) -> Result<Soak> {
        let base = dir.join("redis");
        let (nodes, proxy, url, direct) = if opts.embedded {
            (Vec::new(), None, None, None)
        } else if opts.cluster {
            let nodes = server::start_cluster(server, &base)?;
            let url = format!("redis://127.0.0.1:{}", nodes[0].port);
            (nodes, None, Some(url.clone()), Some(url))
        } else {
            let node = Node::start(server, &base, crate::redis::free_port()?, &[])?;
            let proxy = Proxy::start(node.port)?;
            let url = format!("redis://127.0.0.1:{}", proxy.port);
            let direct = format!("redis://127.0.0.1:{}", node.port);
            (vec![node], Some(proxy), Some(url), Some(direct))
        };
        let run_id = format!("{}-{}", std::process::id(), now_us());
        let setup = Setup {
            tranche: tranche.clone(),
            runner,
            dir: dir.to_owned(),
            redis_url: url,
            state: dir.join("embedded").join(format!("{NAMESPACE}.state")),
            namespace: NAMESPACE.into(),
            run_id,
            lease_ms: opts.lease.as_millis() as u64,
            compressed_at: 200,
            // The fast profile: a chunk is a whole partition (one shell per partition),
            // twelve partitions at once; the runners' chunks are half of one, both at
            // once, with 1-20 ms of work each, many partitions at once. The splits
            // profile: forty chunks one at a time, so a partition lasts seconds and is
            // worth splitting. Otherwise four chunks of a quarter, two partitions at
            // once; the runners' chunks smaller than the exec workers' (more chunks per
            // partition than a window holds).
            exec_chunk: match opts.profile {
                Profile::Classic => PARTITION / 4,
                Profile::Fast => PARTITION,
                Profile::Splits => PARTITION / 40,
            },
            exec_parallel: match opts.profile {
                Profile::Classic => 4,
                Profile::Fast | Profile::Splits => 1,
            },
            exec_concurrency: match opts.profile {
                Profile::Classic | Profile::Splits => 2,
                Profile::Fast => 12,
            },
            runner_chunk: match opts.profile {
                Profile::Classic => PARTITION / 20,
                Profile::Fast => PARTITION / 2,
                Profile::Splits => PARTITION / 40,
            },
            runner_parallel: match opts.profile {
                Profile::Classic | Profile::Splits => 1,
                Profile::Fast => 2,
            },
            runner_concurrency: opts.runner_concurrency as u64,
            runner_work_ms: match opts.profile {
                Profile::Fast => "1-20",
                Profile::Classic | Profile::Splits => "10-90",
            },
            sabotage: opts.sabotage.clone(),
        };
        if opts.embedded {
            std::fs::create_dir_all(dir.join("embedded"))?;
        }
        let mut slots: Vec<Slot> = (0..opts.workers)
            .map(|i| Slot::new(i, Kind::Exec))
            .collect();
        for r in 0..opts.runners {
            slots.push(Slot::new(opts.workers + r, Kind::Runner));
        }
        Ok(Soak {
            opts: opts.clone(),
            dir: dir.to_owned(),
            tranche,
            nodes,
            proxy,
            direct,
            setup,
            slots,
            incarnations: Vec::new(),
            faults: Vec::new(),
            planned: Vec::new(),
            t0: Instant::now(),
            t0_us: now_us(),
            health: Arc::new(Mutex::new(Vec::new())),
            stop_monitor: Arc::new(Mutex::new(false)),
            monitor: None,
            max_redis_bytes: 0,
            max_rss_kib: 0,
            max_runner_rss_kib: 0,
            unexpected_exits: Vec::new(),
            orphan_checks: Vec::new(),
            orphans: Vec::new(),
            pre_repair: None,
        })
    }

    /// Where the soak's own commands find the job: the direct URL, or the state file.
    fn locate(&self, cmd: &mut Command) {
        locate(cmd, self.direct.as_deref(), &self.setup.state);
    }

    /// A `tranche` command on the direct URL, its stdout (and whether it exited 0).
    fn tranche(&self, args: &[&str]) -> Result<(bool, String)> {
        let mut cmd = Command::new(&self.tranche);
        self.locate(&mut cmd);
        let out = cmd
            .args(args)
            .env("TRANCHE_NAMESPACE", NAMESPACE)
            .env("RUST_LOG", "error")
            .output()
            .with_context(|| format!("could not run tranche {}", args.join(" ")))?;
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        if text.trim().is_empty() {
            // Failures come as {"error": ...} (or a line) on stderr.
            text = String::from_utf8_lossy(&out.stderr).trim().to_owned();
        }
        Ok((out.status.success(), text))
    }

    fn plan(&mut self, partitions: u64) -> Result<()> {
        let min = self.planned.last().map_or(1, |&(_, max)| max + 1);
        let max = min + partitions * PARTITION - 1;
        let (min_s, max_s) = (min.to_string(), max.to_string());
        let (size, compressed_at) = (PARTITION.to_string(), self.setup.compressed_at.to_string());
        let mut args = vec![
            "plan",
            "--min",
            &min_s,
            "--max",
            &max_s,
            "--size",
            &size,
            "--compressed-at",
            &compressed_at,
        ];
        // Every plan names the same count: the first sets it, the others agree.
        let shards = self.opts.shards.map(|n| n.to_string());
        if let Some(n) = &shards {
            args.extend(["--shards", n.as_str()]);
        }
        let (ok, out) = self.tranche(&args)?;
        if !ok {
            bail!("tranche plan {min}..={max} failed: {out}");
        }
        self.planned.push((min, max));
        Ok(())
    }

    /// The splits profile's plans: half as many partitions as the fleet has slots.
    fn splits_batch(&self) -> u64 {
        let slots = self.opts.workers as u64 * self.setup.exec_concurrency
            + self.opts.runners as u64 * self.setup.runner_concurrency;
        (slots / 2).max(1)
    }

    fn status(&self) -> Option<Json> {
        let (_, out) = self.tranche(&["status", "--json"]).ok()?;
        Json::parse(&out)
    }

    fn secs(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

    fn redis_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(|n| n.port)
            .collect()
    }

    /// The whole run: plan, fleet, faults, drain, then the oracles' report.
    fn go(&mut self) -> Result<Json> {
        let secs = self.opts.duration.as_secs();
        let partitions = if self.opts.partitions > 0 {
            self.opts.partitions
        } else if self.opts.embedded {
            // What one process does in the duration; nothing can be planned later
            // (the run holds the state file), so not more.
            (secs * 6).max(200)
        } else if self.opts.profile == Profile::Fast {
            secs * options::FAST_RATE
        } else if self.opts.profile == Profile::Splits {
            self.splits_batch()
        } else {
            // Roughly what the fleet does in the duration on a small machine, a minute
            // at most; more is planned whenever it runs low. (A plan for all of a long
            // run is more than a busy machine does in it, and the drain cannot catch
            // up.)
            (secs.min(60) * 6 * self.opts.workers as u64).max(200)
        };
        self.plan(partitions)?;
        self.t0 = Instant::now();
        self.t0_us = now_us();
        for i in 0..self.slots.len() {
            self.slots[i].start(&self.setup, &mut self.incarnations)?;
        }
        self.start_monitor();
        let mut rng = Rng::new(self.opts.seed);
        let mut bag = Vec::new();
        // The first seconds are a start-up burst, no baseline for a recovery: the first
        // fault comes 10 s after the warm-up at the earliest.
        let first = self
            .opts
            .first_fault
            .unwrap_or(Duration::from_secs(report::WARM_UP_S as u64 + 10));
        let mut next_fault = self.t0 + self.opts.interval.max(first);
        // No fault so late that its recovery could not be seen before the end.
        let last_fault = self.t0 + self.opts.duration.saturating_sub(self.opts.quiet_end);
        let end = self.t0 + self.opts.duration;
        let mut active: Vec<Active> = Vec::new();
        let mut next_topup = Instant::now() + Duration::from_secs(5);
        let mut last_finished = (0u64, Instant::now());
        let mut next_sample = Instant::now();
        while Instant::now() < end {
            self.tend()?;
            let now = Instant::now();
            active.retain_mut(|a| {
                if now < a.heal_at && !self.taken_over(a) {
                    return true;
                }
                self.heal(a);
                // The 10 s after a heal are its recovery window: no fault in them.
                next_fault = next_fault.max(Instant::now() + faults::RECOVERY);
                false
            });
            // One fault at a time: the next waits until the last one is healed (a
            // 15 s outage every 10 s would otherwise never end, or be cut short).
            if now >= next_fault && now < last_fault && active.is_empty() {
                next_fault = (next_fault + self.opts.interval).max(now + Duration::from_secs(5));
                if let Some(a) = self.inject(&mut rng, &mut bag)? {
                    active.push(a);
                }
            }
            // Embedded, the run holds the state file: nothing can be planned beside it.
            let may_plan = self.opts.top_up && !self.opts.embedded && now >= next_topup;
            if may_plan && self.opts.profile == Profile::Splits {
                // A few partitions at a time, and only once none is waiting: half the
                // slots take them, the other half split them.
                next_topup = now + Duration::from_secs(1);
                if self.status().is_some_and(|s| waiting(&s) == 0) {
                    self.plan(self.splits_batch())?;
                }
            } else if may_plan {
                next_topup = now + Duration::from_secs(5);
                if let Some(s) = self.status() {
                    let left = waiting(&s);
                    // The fleet's rate since the last look: less than 10 s of work
                    // left is topped up with at least 20 s of it (the looks are 5 s
                    // apart; more would only lengthen the drain).
                    let finished = s.get("finished").and_then(Json::as_u64).unwrap_or(0);
                    let rate = finished.saturating_sub(last_finished.0) as f64
                        / last_finished.1.elapsed().as_secs_f64().max(1.0);
                    last_finished = (finished, Instant::now());
                    if left < (50 * self.slots.len() as u64).max((10.0 * rate) as u64) {
                        self.plan((partitions / 20).max(100).max((20.0 * rate) as u64))?;
                    }
                }
            }
            if now >= next_sample {
                next_sample = now + Duration::from_secs(1);
                self.sample_memory();
            }
            thread::sleep(Duration::from_millis(100));
        }
        for mut a in active.drain(..) {
            self.heal(&mut a);
        }
        let fleet_end = self.secs();
        eprintln!("xtask: soak: faults over at {fleet_end:.0} s; draining");
        let drained = self.drain()?;
        let drain_s = self.secs() - fleet_end;
        for i in 0..self.slots.len() {
            self.slots[i].terminate(Duration::from_secs(10), &mut self.incarnations);
        }
        *self.stop_monitor.lock().unwrap() = true;
        if let Some(h) = self.monitor.take() {
            let _ = h.join();
        }
        thread::sleep(Duration::from_millis(500));
        let strays = fleet::processes_of_run(&self.setup.run_id);
        for (pid, _) in &strays {
            fleet::signal(*pid, "KILL");
        }
        self.judge(drained, fleet_end, drain_s, strays)
    }

    /// Reaps workers that exited, and restarts the dead ones when due.
    fn tend(&mut self) -> Result<()> {
        let t = self.secs();
        for i in 0..self.slots.len() {
            let slot = &mut self.slots[i];
            if slot.reap(&mut self.incarnations) {
                let inc = self
                    .incarnations
                    .iter()
                    .rev()
                    .find(|x| x.ended_us.is_some());
                self.unexpected_exits.push(format!(
                    "{} at {t:.1} s: {}",
                    inc.map_or("?", |x| x.name.as_str()),
                    inc.map_or("", |x| x.end.as_str())
                ));
                slot.restart_at = Some(Instant::now() + Duration::from_secs(1));
            }
            if slot.child.is_none() && slot.restart_at.is_some_and(|at| Instant::now() >= at) {
                slot.start(&self.setup, &mut self.incarnations)?;
            }
        }
        let now = Instant::now();
        let due: Vec<(String, usize, Instant)> = self
            .orphan_checks
            .extract_if(.., |(_, _, at)| *at <= now)
            .collect();
        for (name, slot, _) in due {
            let ledger = self.slots[slot].ledger(&self.setup);
            for (pid, what) in fleet::orphans_of(&name, &ledger, &self.setup.run_id) {
                self.orphans.push(format!(
                    "{name}: pid {pid} ({what}) alive {ORPHAN_CHECK:?} after its worker's kill"
                ));
                fleet::signal(pid, "KILL");
            }
        }
        Ok(())
    }

    fn sample_memory(&mut self) {
        let bytes: u64 = self
            .redis_ports()
            .iter()
            .filter_map(|&p| resp::info_field(p, "memory", "used_memory").ok())
            .sum();
        self.max_redis_bytes = self.max_redis_bytes.max(bytes);
        for slot in &self.slots {
            if let Some(kib) = slot.pid().and_then(fleet::rss_kib) {
                let max = match slot.kind {
                    Kind::Exec => &mut self.max_rss_kib,
                    Kind::Runner => &mut self.max_runner_rss_kib,
                };
                *max = (*max).max(kib);
            }
        }
    }

    /// Polls `health --json` every 2 s on its own thread, every fifth time with
    /// `--check` (which reads every active record and compares the statistics with the
    /// archive: what finds a corrupt active record, at a cost not paid every 2 s).
    fn start_monitor(&mut self) {
        let tranche = self.tranche.clone();
        let direct = self.direct.clone();
        let state = self.setup.state.clone();
        let samples = Arc::clone(&self.health);
        let stop = Arc::clone(&self.stop_monitor);
        let t0 = self.t0;
        self.monitor = Some(thread::spawn(move || {
            let mut polls = 0u64;
            while !*stop.lock().unwrap() {
                let mut cmd = Command::new(&tranche);
                locate(&mut cmd, direct.as_deref(), &state);
                cmd.arg("health").args(HEALTH);
                if polls % 5 == 4 {
                    cmd.arg("--check");
                }
                polls += 1;
                let out = cmd
                    .env("TRANCHE_NAMESPACE", NAMESPACE)
                    .env("RUST_LOG", "error")
                    .output();
                let firing = out
                    .ok()
                    .and_then(|o| firing(&String::from_utf8_lossy(&o.stdout)));
                samples
                    .lock()
                    .unwrap()
                    .push((t0.elapsed().as_secs_f64(), firing));
                thread::sleep(Duration::from_secs(2));
            }
        }));
    }

    /// Waits until every planned partition is archived (or the drain deadline). When
    /// the archive stops moving for 15 s after injected damage, does what `health`
    /// asks an operator to: `check --repair`, then `archive` (the damage holds its
    /// partitions back until then; the end-of-run checks repeat it).
    fn drain(&mut self) -> Result<bool> {
        let total: u64 = self
            .planned
            .iter()
            .map(|(a, b)| (b - a + 1) / PARTITION)
            .sum();
        let deadline = Instant::now() + self.opts.drain;
        let damaged = self.faults.iter().any(|f| faults::damage(&f.kind));
        let mut last = (u64::MAX, Instant::now());
        loop {
            self.tend()?;
            if let Some(s) = self.status() {
                let archived = s.get("archived").and_then(Json::as_u64).unwrap_or(0);
                let inbox = s.get("inbox").and_then(Json::as_u64).unwrap_or(1);
                if archived >= total && inbox == 0 {
                    return Ok(true);
                }
                if archived != last.0 {
                    last = (archived, Instant::now());
                } else if damaged && last.1.elapsed() >= Duration::from_secs(15) {
                    eprintln!(
                        "xtask: soak: {archived} of {total} archived, none for 15 s: \
                         check --repair, as an operator would"
                    );
                    if self.pre_repair.is_none() {
                        let check = self.tranche(&["check", "--json"])?.1;
                        let stats = self.tranche(&["stats", "--json"])?.1;
                        self.pre_repair = Some((check, stats));
                    }
                    let _ = self.tranche(&["check", "--repair", "--json"]);
                    let _ = self.tranche(&["archive"]);
                    last.1 = Instant::now();
                }
            }
            if Instant::now() > deadline {
                return Ok(false);
            }
            thread::sleep(Duration::from_secs(1));
        }
    }

    fn shutdown(&mut self) {
        for i in 0..self.slots.len() {
            if self.slots[i].child.is_some() {
                self.slots[i].kill(&mut self.incarnations);
            }
        }
        *self.stop_monitor.lock().unwrap() = true;
        if let Some(p) = &self.proxy {
            p.set(Mode::Pass);
        }
        for node in &mut self.nodes {
            node.kill();
        }
    }
}
