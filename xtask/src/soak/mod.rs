//! `cargo xtask soak`: a fault-injecting soak run with an oracle.
//!
//! A fleet of real `tranche run --exec` workers and one library runner (the
//! `soak_runner` example) works through a plan on a private Redis (behind the soak's own
//! TCP proxy) or a local 3+3 cluster, while a seeded schedule injects one fault every
//! `--interval` seconds. Every chunk appends START and END lines to its worker's ledger;
//! at the end the oracles read the ledgers, the statistics, `check` and the `health`
//! samples, print one JSON report and write `target/soak/report.json` and
//! `target/soak/timeline.svg`. Any failed oracle makes the task fail.

mod faults;
mod fleet;
mod json;
mod ledger;
mod proxy;
mod report;
mod resp;
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

/// The options of one soak run.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    seed: u64,
    duration: Duration,
    interval: Duration,
    partitions: u64,
    workers: usize,
    faults: Vec<String>,
    cluster: bool,
    release: bool,
    lease: Duration,
    drain: Duration,
    max_redis_mib: u64,
    max_rss_mib: u64,
}

const USAGE: &str = "usage: cargo xtask soak [--ci] [--seed N] [--duration SECS] [--interval SECS] \
[--partitions N] [--workers N] [--faults kill,stop,...] [--cluster] [--release] \
[--lease MS] [--drain SECS]";

impl Options {
    fn parse(args: &[String]) -> Result<Options> {
        let mut o = Options {
            seed: now_us() % 1_000_000,
            duration: Duration::from_secs(120),
            interval: Duration::from_secs(20),
            partitions: 0,
            workers: 4,
            faults: vec!["kill".into(), "stop".into()],
            cluster: false,
            release: false,
            lease: Duration::from_secs(3),
            drain: Duration::from_secs(90),
            max_redis_mib: 256,
            max_rss_mib: 256,
        };
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            let mut value = || {
                it.next()
                    .with_context(|| format!("{flag} wants a value; {USAGE}"))
            };
            let number = |v: &String| -> Result<u64> {
                v.parse()
                    .with_context(|| format!("{flag} {v}: not a number"))
            };
            match flag.as_str() {
                "--ci" => {
                    o.seed = 22;
                    o.duration = Duration::from_secs(120);
                    o.interval = Duration::from_secs(15);
                    o.faults = faults::CI.split(',').map(str::to_owned).collect();
                }
                "--seed" => o.seed = number(value()?)?,
                "--duration" => o.duration = Duration::from_secs(number(value()?)?),
                "--interval" => o.interval = Duration::from_secs(number(value()?)?.max(1)),
                "--partitions" => o.partitions = number(value()?)?,
                "--workers" => o.workers = number(value()?)?.clamp(1, 64) as usize,
                "--lease" => o.lease = Duration::from_millis(number(value()?)?.max(500)),
                "--drain" => o.drain = Duration::from_secs(number(value()?)?),
                "--faults" => {
                    let v = value()?;
                    o.faults = if v == "all" {
                        // `proxy` stands for its three kinds.
                        faults::MENU
                            .iter()
                            .filter(|s| !s.starts_with("proxy-"))
                            .map(|s| s.to_string())
                            .collect()
                    } else {
                        v.split(',')
                            .filter(|s| !s.is_empty())
                            .map(str::to_owned)
                            .collect()
                    };
                    for f in &o.faults {
                        if !faults::MENU.contains(&f.as_str()) {
                            bail!("unknown fault `{f}`; the menu: {}", faults::MENU.join(","));
                        }
                    }
                }
                "--cluster" => o.cluster = true,
                "--release" => o.release = true,
                "--embedded" => bail!(
                    "--embedded (and the corrupt-state fault) is not built yet: the soak \
                     runs on Redis only"
                ),
                _ => bail!("unknown option `{flag}`; {USAGE}"),
            }
        }
        Ok(o)
    }
}

/// `cargo xtask soak [ARGS]`.
pub(crate) fn run(args: &[String]) -> Result<()> {
    let mut opts = Options::parse(args)?;
    let started = Instant::now();
    let server = crate::redis::ensure_installed()?;
    let (tranche, runner) = build(opts.release)?;
    let build_s = started.elapsed().as_secs_f64();
    // Faults the chosen topology cannot have are left out, and said so.
    let mut skipped = Vec::new();
    opts.faults.retain(|f| {
        let ok = match f.as_str() {
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
    eprintln!(
        "xtask: soak seed {} for {} s, a fault every {} s from {} ({} workers + 1 runner{})",
        opts.seed,
        opts.duration.as_secs(),
        opts.interval.as_secs(),
        opts.faults.join(","),
        opts.workers,
        if opts.cluster { ", cluster" } else { "" }
    );
    let mut soak = Soak::start(&opts, &server, &dir, tranche, runner)?;
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
    let failed: Vec<String> = match report.get("oracles") {
        Some(Json::Obj(o)) => o
            .iter()
            .filter(|(_, v)| v.get("pass") == Some(&Json::Bool(false)))
            .map(|(k, _)| k.clone())
            .collect(),
        _ => vec!["(no oracles)".into()],
    };
    eprintln!(
        "xtask: soak report in {}, timeline in {}",
        dir.join("report.json").display(),
        dir.join("timeline.svg").display()
    );
    if !failed.is_empty() {
        bail!("soak oracles failed: {}", failed.join(", "));
    }
    Ok(())
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
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::workspace_root().join("target"));
    let profile = target.join(if release { "release" } else { "debug" });
    Ok((
        profile.join("tranche"),
        profile.join("examples/soak_runner"),
    ))
}

/// One `health` sample: seconds since start, and the rules firing (None: no answer).
type Sample = (f64, Option<Vec<String>>);

struct Soak {
    opts: Options,
    dir: PathBuf,
    tranche: PathBuf,
    nodes: Vec<Node>,
    proxy: Option<Proxy>,
    /// The URL the soak's own commands use (straight to Redis, not through the proxy).
    direct: String,
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
}

/// A fault in progress, healed at its time.
struct Active {
    index: usize,
    heal_at: Instant,
    undo: Undo,
}

enum Undo {
    Nothing,
    Cont(usize),
    Proxy,
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
        let (nodes, proxy, url, direct) = if opts.cluster {
            let nodes = server::start_cluster(server, &base)?;
            let url = format!("redis://127.0.0.1:{}", nodes[0].port);
            (nodes, None, url.clone(), url)
        } else {
            let node = Node::start(server, &base, server::free_port()?, &[])?;
            let proxy = Proxy::start(node.port)?;
            let url = format!("redis://127.0.0.1:{}", proxy.port);
            let direct = format!("redis://127.0.0.1:{}", node.port);
            (vec![node], Some(proxy), url, direct)
        };
        let run_id = format!("{}-{}", std::process::id(), now_us());
        let setup = Setup {
            tranche: tranche.clone(),
            runner,
            dir: dir.to_owned(),
            redis_url: url,
            namespace: NAMESPACE.into(),
            run_id,
            lease_ms: opts.lease.as_millis() as u64,
            chunk: PARTITION / 4,
            compressed_at: 200,
        };
        let mut slots: Vec<Slot> = (0..opts.workers)
            .map(|i| Slot::new(i, Kind::Exec))
            .collect();
        slots.push(Slot::new(opts.workers, Kind::Runner));
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
        })
    }

    /// A `tranche` command on the direct URL, its stdout (and whether it exited 0).
    fn tranche(&self, args: &[&str]) -> Result<(bool, String)> {
        let out = Command::new(&self.tranche)
            .args(args)
            .env("TRANCHE_REDIS_URL", &self.direct)
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
        let (ok, out) = self.tranche(&[
            "plan",
            "--min",
            &min.to_string(),
            "--max",
            &max.to_string(),
            "--size",
            &PARTITION.to_string(),
            "--compressed-at",
            &self.setup.compressed_at.to_string(),
        ])?;
        if !ok {
            bail!("tranche plan {min}..={max} failed: {out}");
        }
        self.planned.push((min, max));
        Ok(())
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
        let partitions = if self.opts.partitions > 0 {
            self.opts.partitions
        } else {
            // Roughly what the fleet does in the duration on a small machine; more is
            // planned whenever it runs low.
            (self.opts.duration.as_secs() * 6 * self.opts.workers as u64).max(200)
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
        // fault comes after 20 s at the earliest.
        let mut next_fault = self.t0 + self.opts.interval.max(Duration::from_secs(20));
        // No fault so late that its recovery could not be seen before the end.
        let last_fault = self.t0 + self.opts.duration.saturating_sub(Duration::from_secs(12));
        let end = self.t0 + self.opts.duration;
        let mut active: Vec<Active> = Vec::new();
        let mut next_topup = Instant::now() + Duration::from_secs(5);
        let mut next_sample = Instant::now();
        while Instant::now() < end {
            self.tend()?;
            let now = Instant::now();
            active.retain_mut(|a| {
                if now < a.heal_at {
                    return true;
                }
                self.heal(a);
                // The 10 s after a heal are its recovery window: no fault in them.
                next_fault = next_fault.max(Instant::now() + Duration::from_secs(10));
                false
            });
            // One fault at a time: the next waits until the last one is healed (a
            // 15 s outage every 10 s would otherwise never end, or be cut short).
            if now >= next_fault && now < last_fault && active.is_empty() {
                next_fault = (next_fault + self.opts.interval).max(now + Duration::from_secs(5));
                match self.inject(&mut rng, &mut bag) {
                    Ok(Some(a)) => active.push(a),
                    Ok(None) => {}
                    Err(err) => eprintln!("xtask: soak: a fault could not be injected: {err:#}"),
                }
            }
            if now >= next_topup {
                next_topup = now + Duration::from_secs(5);
                if let Some(s) = self.status() {
                    let left = ["unissued", "pending"]
                        .iter()
                        .filter_map(|k| s.get(k)?.as_u64())
                        .sum::<u64>();
                    if left < 50 * self.slots.len() as u64 {
                        self.plan(partitions / 4 + 100)?;
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

    /// Polls `health --json` every 2 s on its own thread.
    fn start_monitor(&mut self) {
        let tranche = self.tranche.clone();
        let direct = self.direct.clone();
        let samples = Arc::clone(&self.health);
        let stop = Arc::clone(&self.stop_monitor);
        let t0 = self.t0;
        self.monitor = Some(thread::spawn(move || {
            while !*stop.lock().unwrap() {
                let out = Command::new(&tranche)
                    .arg("health")
                    .args(HEALTH)
                    .env("TRANCHE_REDIS_URL", &direct)
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

    /// Picks and injects the next fault; what heals it, if anything.
    fn inject(&mut self, rng: &mut Rng, bag: &mut Vec<String>) -> Result<Option<Active>> {
        // A seeded shuffle of the menu, drawn from until empty: every kind comes once
        // per round, so a short run still meets each.
        if bag.is_empty() {
            *bag = self.opts.faults.clone();
            for i in (1..bag.len()).rev() {
                bag.swap(i, rng.below(i + 1));
            }
        }
        let kind = bag.pop().expect("the menu is not empty");
        let at = self.secs();
        let live: Vec<usize> = (0..self.slots.len())
            .filter(|&i| self.slots[i].child.is_some() && !self.slots[i].stopped)
            .collect();
        let mut fault = Fault {
            kind: kind.clone(),
            at,
            healed: None,
            target: String::new(),
            note: String::new(),
            persisted: None,
            recovery_s: None,
            health_fired_after_s: None,
            health_masked: false,
        };
        let mut undo = Undo::Nothing;
        match kind.as_str() {
            "kill" | "stop" => {
                if live.is_empty() {
                    return Ok(None);
                }
                let i = live[rng.below(live.len())];
                let name = self
                    .incarnations
                    .iter()
                    .rev()
                    .find(|x| Some(x.pid) == self.slots[i].pid());
                fault.target = name.map_or(String::new(), |x| x.name.clone());
                if kind == "kill" {
                    self.slots[i].kill(&mut self.incarnations);
                    self.slots[i].restart_at = Some(Instant::now() + Duration::from_secs(1));
                } else {
                    fleet::signal(self.slots[i].pid().unwrap_or(0), "STOP");
                    self.slots[i].stopped = true;
                    undo = Undo::Cont(i);
                }
            }
            "panic" => {
                std::fs::write(fleet::panic_file(&self.dir), b"panic")?;
                fault.target = format!("w{} (runner)", self.opts.workers);
            }
            "redis-kill" => {
                let ports = self.redis_ports();
                let n = if self.opts.cluster {
                    // A master: its replica takes over; the node comes back as a replica.
                    let masters: Vec<usize> = (0..self.nodes.len())
                        .filter(|&i| server::role(self.nodes[i].port).as_deref() == Some("master"))
                        .collect();
                    if masters.is_empty() {
                        return Ok(None);
                    }
                    masters[rng.below(masters.len())]
                } else {
                    0
                };
                fault.target = format!("redis :{}", self.nodes[n].port);
                let _ = ports;
                self.nodes[n].kill();
                if self.opts.cluster {
                    thread::sleep(Duration::from_secs(5));
                }
                self.nodes[n].restart()?;
                fault.healed = Some(self.secs());
                fault.note = "SIGKILL, restarted from its AOF".into();
            }
            "redis-pause" => {
                self.proxy.as_ref().context("no proxy")?.set(Mode::Refuse);
                fault.note = "proxy refuses every connection".into();
                undo = Undo::Proxy;
            }
            "proxy" | "proxy-latency" | "proxy-blackhole" | "proxy-reset" => {
                let proxy = self.proxy.as_ref().context("no proxy")?;
                let pick = match kind.as_str() {
                    "proxy-latency" => 0,
                    "proxy-blackhole" => 1,
                    "proxy-reset" => 2,
                    _ => rng.below(3),
                };
                match pick {
                    0 => {
                        fault.kind = "proxy-latency".into();
                        proxy.set(Mode::Latency(Duration::from_millis(100)));
                        fault.note = "100 ms each way (200 ms round trip)".into();
                        undo = Undo::Proxy;
                    }
                    1 => {
                        fault.kind = "proxy-blackhole".into();
                        proxy.set(Mode::Blackhole);
                        undo = Undo::Proxy;
                    }
                    _ => {
                        fault.kind = "proxy-reset".into();
                        proxy.reset();
                        fault.healed = Some(self.secs());
                    }
                }
            }
            "failover" => {
                let replicas: Vec<u16> = self
                    .redis_ports()
                    .into_iter()
                    .filter(|&p| server::role(p).as_deref() == Some("slave"))
                    .collect();
                if replicas.is_empty() {
                    return Ok(None);
                }
                let port = replicas[rng.below(replicas.len())];
                resp::cmd(port, &["CLUSTER", "FAILOVER"])?;
                fault.target = format!("replica :{port}");
                fault.healed = Some(self.secs());
            }
            "corrupt-stats" | "corrupt-batch" | "corrupt-active" => {
                match self.corrupt(&kind, rng) {
                    Ok((port, key, field, value, note)) => {
                        fault.target = String::from_utf8_lossy(&key).into_owned();
                        fault.note = note;
                        undo = Undo::Check {
                            port,
                            key,
                            field,
                            value,
                        };
                    }
                    Err(err) => {
                        fault.note = format!("not injected: {err:#}");
                        self.faults.push(fault);
                        return Ok(None);
                    }
                }
            }
            other => bail!("fault `{other}` is not on this topology's menu"),
        }
        eprintln!(
            "xtask: soak: {at:6.1} s  {} {} {}",
            fault.kind, fault.target, fault.note
        );
        let heal_at = Instant::now() + faults::length(&fault.kind, self.opts.lease);
        self.faults.push(fault);
        Ok(Some(Active {
            index: self.faults.len() - 1,
            heal_at,
            undo,
        }))
    }

    /// One corrupt byte in a key the kind names: the key, the hash field, the new value.
    #[allow(clippy::type_complexity)]
    fn corrupt(
        &self,
        kind: &str,
        rng: &mut Rng,
    ) -> Result<(u16, Vec<u8>, Option<Vec<u8>>, Vec<u8>, String)> {
        let pattern = match kind {
            "corrupt-stats" => "*:stats:ranges",
            "corrupt-batch" => "*:completed:batch:*",
            _ => "*:active",
        };
        let mut keys = self.scan_masters(pattern)?;
        let mut note = String::new();
        if keys.is_empty() && kind == "corrupt-batch" {
            // The simple tier: no batch string yet, so an archived record instead.
            keys = self.scan_masters("*:completed")?;
            note = "no batch string yet: an archived record of the simple tier; ".into();
        }
        if keys.is_empty() {
            bail!("no key matches {pattern}");
        }
        let (port, key) = keys[rng.below(keys.len())].clone();
        let key_type = resp::call(port, &[b"TYPE", &key])?.text();
        if key_type == "string" {
            let resp::Reply::Bytes(value) = resp::call(port, &[b"GET", &key])? else {
                bail!("GET of a string key returned no bytes");
            };
            if value.is_empty() {
                bail!("an empty batch string");
            }
            let at = rng.below(value.len());
            let byte = [value[at] ^ 0x5a];
            resp::call(port, &[b"SETRANGE", &key, at.to_string().as_bytes(), &byte])?;
            let mut new = value;
            new[at] = byte[0];
            note.push_str(&format!("byte {at} flipped"));
            return Ok((port, key, None, new, note));
        }
        let resp::Reply::Array(fields) = resp::call(port, &[b"HKEYS", &key])? else {
            bail!("HKEYS failed");
        };
        if fields.is_empty() {
            bail!("an empty hash");
        }
        let resp::Reply::Bytes(field) = fields[rng.below(fields.len())].clone() else {
            bail!("HKEYS returned a non-string");
        };
        let value = if kind == "corrupt-stats" {
            note.push_str("value set to the one byte \\x80");
            vec![0x80]
        } else {
            let resp::Reply::Bytes(mut value) = resp::call(port, &[b"HGET", &key, &field])? else {
                bail!("the field went away");
            };
            if value.is_empty() {
                bail!("an empty value");
            }
            let at = rng.below(value.len());
            value[at] ^= 0x5a;
            note.push_str(&format!(
                "byte {at} of field {} flipped",
                String::from_utf8_lossy(&field)
            ));
            value
        };
        resp::call(port, &[b"HSET", &key, &field, &value])?;
        Ok((port, key, Some(field), value, note))
    }

    /// The keys matching `pattern` on every master, with the master's port.
    fn scan_masters(&self, pattern: &str) -> Result<Vec<(u16, Vec<u8>)>> {
        let mut found = Vec::new();
        for port in self.redis_ports() {
            if self.opts.cluster && server::role(port).as_deref() != Some("master") {
                continue;
            }
            found.extend(resp::scan(port, pattern)?.into_iter().map(|k| (port, k)));
        }
        Ok(found)
    }

    fn heal(&mut self, a: &mut Active) {
        match &a.undo {
            Undo::Nothing => {}
            Undo::Cont(i) => {
                if let Some(pid) = self.slots[*i].pid() {
                    fleet::signal(pid, "CONT");
                }
                self.slots[*i].stopped = false;
            }
            Undo::Proxy => {
                if let Some(p) = &self.proxy {
                    p.set(Mode::Pass);
                }
            }
            Undo::Check {
                port,
                key,
                field,
                value,
            } => {
                let now = match field {
                    Some(f) => resp::call(*port, &[b"HGET", key, f]),
                    None => resp::call(*port, &[b"GET", key]),
                };
                self.faults[a.index].persisted =
                    Some(matches!(now, Ok(resp::Reply::Bytes(b)) if &b == value));
            }
        }
        if self.faults[a.index].healed.is_none() {
            self.faults[a.index].healed = Some(self.secs());
        }
    }

    /// Waits until every planned partition is archived (or the drain deadline).
    fn drain(&mut self) -> Result<bool> {
        let total: u64 = self
            .planned
            .iter()
            .map(|(a, b)| (b - a + 1) / PARTITION)
            .sum();
        let deadline = Instant::now() + self.opts.drain;
        loop {
            self.tend()?;
            if let Some(s) = self.status() {
                let archived = s.get("archived").and_then(Json::as_u64).unwrap_or(0);
                let inbox = s.get("inbox").and_then(Json::as_u64).unwrap_or(1);
                if archived >= total && inbox == 0 {
                    return Ok(true);
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

    /// The oracles, the report and the timeline.
    fn judge(
        &mut self,
        drained: bool,
        fleet_end: f64,
        drain_s: f64,
        strays: Vec<(u32, String)>,
    ) -> Result<Json> {
        let run_end_us = now_us();
        let (runs, bad_lines) = ledger::read(&self.dir.join("ledger"));
        let planned_ids: u64 = self.planned.iter().map(|(a, b)| b - a + 1).sum();
        let planned_partitions = planned_ids / PARTITION;
        let (lost, gaps) = ledger::lost(&runs, &self.planned);
        let all_overlaps = ledger::overlaps(&runs, &self.incarnations, run_end_us);
        // A run whose own worker was SIGSTOPped during it ends after the pause, when
        // its lease may have gone to another worker: in-process work (the runner's
        // handler) cannot be fenced there, only reported. The rest fail the oracle.
        let stops: Vec<(String, u64, u64)> = self
            .faults
            .iter()
            .filter(|f| f.kind == "stop")
            .map(|f| {
                let us = |s: f64| self.t0_us + (s * 1e6) as u64;
                (f.target.clone(), us(f.at), us(f.healed.unwrap_or(f.at)))
            })
            .collect();
        let paused = |r: &ledger::ChunkRun| {
            stops.iter().any(|(w, a, b)| {
                *w == r.worker && r.start_us < *b && r.end_us.unwrap_or(u64::MAX) > *a
            })
        };
        let (after_pause, overlaps): (Vec<_>, Vec<_>) = all_overlaps
            .into_iter()
            .partition(|o| paused(&o.a) || paused(&o.b));
        let outlived = ledger::outlived(&runs, &self.incarnations);
        let seconds = (fleet_end + drain_s).ceil() as usize + 1;
        let tput = ledger::throughput(&runs, self.t0_us, seconds);
        report::recovery(&mut self.faults, &tput);
        let samples = self.health.lock().unwrap().clone();
        report::health_after(&mut self.faults, &samples);
        let health_rules = report::health_rules(&samples);

        // What an operator does once `health` named the damage: check, repair, then
        // archive what the damage held back. Only then is everything counted.
        let check_before = self.tranche(&["check", "--json"])?;
        let repair = self.tranche(&["check", "--repair", "--json"])?;
        let _ = self.tranche(&["archive"]);
        // The statistics: each partition counted once.
        let stats = self.tranche(&["stats", "--json"])?.1;
        let stats = Json::parse(&stats).unwrap_or(Json::Null);
        let counted = stats
            .at(&["completed", "global_stats", "total_completed"])
            .and_then(Json::as_u64);
        let counted_ids = stats
            .at(&["completed", "global_stats", "total_processed_data"])
            .and_then(Json::as_u64);
        let check_after = self.tranche(&["check", "--json"])?;
        let mut health_args = vec!["health"];
        health_args.extend(HEALTH);
        let health_end = self.tranche(&health_args)?;
        let final_status = self.status().unwrap_or(Json::Null);
        // Damage holds its shard's records back until the repair above: what counts is
        // that everything is archived once the operator has done what health asked.
        let drained = drained || {
            let archived = final_status.get("archived").and_then(Json::as_u64);
            let inbox = final_status.get("inbox").and_then(Json::as_u64);
            archived == Some(planned_partitions) && inbox == Some(0)
        };

        let mut oracles: Vec<(String, Json)> = Vec::new();
        let mut oracle = |name: &str, pass: bool, detail: Json| {
            oracles.push((
                name.to_owned(),
                Json::obj([("pass", Json::from(pass)), ("detail", detail)]),
            ));
        };
        oracle(
            "every_id_processed",
            lost == 0,
            Json::obj([
                ("ids_planned", Json::from(planned_ids)),
                ("ids_lost", Json::from(lost)),
                (
                    "first_gaps",
                    Json::Arr(
                        gaps.iter()
                            .map(|(a, b)| Json::from(format!("{a}..={b}")))
                            .collect(),
                    ),
                ),
            ]),
        );
        oracle(
            "everything_archived_after_the_faults",
            drained,
            Json::obj([
                ("drain_deadline_s", Json::from(self.opts.drain.as_secs())),
                ("drain_s", Json::from(drain_s)),
                ("final_status", final_status.clone()),
            ]),
        );
        oracle(
            "no_range_run_twice_at_once",
            overlaps.is_empty(),
            Json::obj([
                ("overlaps", Json::from(overlaps.len() as u64)),
                (
                    "examples",
                    Json::Arr(overlaps.iter().take(5).map(describe).collect()),
                ),
                (
                    "across_a_sigstop_not_counted",
                    Json::from(after_pause.len() as u64),
                ),
                (
                    "across_a_sigstop_examples",
                    Json::Arr(after_pause.iter().take(3).map(describe).collect()),
                ),
            ]),
        );
        oracle(
            "no_chunk_outlives_its_worker",
            outlived.is_empty(),
            Json::obj([
                ("chunks", Json::from(outlived.len() as u64)),
                ("examples", Json::Arr(outlived.iter().take(5).map(|(r, dead)| {
                    Json::from(format!(
                        "{} chunk pid {} ids {}..={}: {} {:.0} ms after its worker died",
                        r.worker, r.chunk_pid, r.from, r.to, r.end,
                        (r.end_us.unwrap_or(r.start_us) as f64 - *dead as f64) / 1000.0
                    ))
                }).collect())),
            ]),
        );
        oracle(
            "each_partition_counted_once",
            counted == Some(planned_partitions) && counted_ids == Some(planned_ids),
            Json::obj([
                ("planned", Json::from(planned_partitions)),
                ("counted", counted.map_or(Json::Null, Json::from)),
                ("ids_counted", counted_ids.map_or(Json::Null, Json::from)),
                (
                    "double_counted",
                    Json::from(counted.unwrap_or(0).saturating_sub(planned_partitions)),
                ),
            ]),
        );
        oracle(
            "check_clean_after_repair",
            check_after.0 && clean(&check_after.1),
            Json::obj([
                (
                    "before",
                    Json::parse(&check_before.1).unwrap_or(Json::from(check_before.1.clone())),
                ),
                (
                    "repair",
                    Json::parse(&repair.1).unwrap_or(Json::from(repair.1.clone())),
                ),
                (
                    "after",
                    Json::parse(&check_after.1).unwrap_or(Json::from(check_after.1.clone())),
                ),
            ]),
        );
        let damage = || {
            self.faults
                .iter()
                .filter(|f| faults::damage(&f.kind) && f.persisted != Some(false))
        };
        let name = |f: &Fault| Json::from(format!("{} at {:.1} s", f.kind, f.at));
        let missed: Vec<Json> = damage()
            .filter(|f| !f.health_masked && f.health_fired_after_s.is_none())
            .map(name)
            .collect();
        let masked: Vec<Json> = damage().filter(|f| f.health_masked).map(name).collect();
        oracle(
            "health_fired_on_damage",
            missed.is_empty(),
            Json::obj([
                ("missed", Json::Arr(missed)),
                ("masked_by_an_earlier_alert", Json::Arr(masked)),
            ]),
        );
        let end_firing = firing(&health_end.1);
        oracle(
            "health_true_at_end",
            // Clear when everything is archived; firing when something is stuck.
            match &end_firing {
                Some(rules) => rules.is_empty() == drained && health_end.0 == drained,
                None => false,
            },
            Json::obj([
                ("everything_archived", Json::from(drained)),
                (
                    "firing",
                    end_firing.map_or(Json::from(health_end.1.clone()), |v| {
                        Json::Arr(v.into_iter().map(Json::from).collect())
                    }),
                ),
            ]),
        );
        let slow: Vec<Json> = self
            .faults
            .iter()
            .filter(|f| faults::transient(&f.kind) && f.recovery_s.is_none_or(|r| r > 10.0))
            .map(|f| {
                Json::from(format!(
                    "{} at {:.1} s: {}",
                    f.kind,
                    f.at,
                    f.recovery_s.map_or("never".into(), |r| format!("{r:.1} s"))
                ))
            })
            .collect();
        oracle(
            "throughput_back_within_10s",
            slow.is_empty(),
            Json::obj([("slow", Json::Arr(slow))]),
        );
        oracle(
            "no_stray_processes",
            strays.is_empty(),
            Json::Arr(
                strays
                    .iter()
                    .map(|(p, c)| Json::from(format!("{p}: {c}")))
                    .collect(),
            ),
        );
        let redis_mib = self.max_redis_bytes / (1 << 20);
        let rss_mib = self.max_rss_kib / 1024;
        let runner_mib = self.max_runner_rss_kib / 1024;
        oracle(
            "memory_bounded",
            redis_mib <= self.opts.max_redis_mib
                && rss_mib.max(runner_mib) <= self.opts.max_rss_mib,
            Json::obj([
                ("redis_used_memory_max_mib", Json::from(redis_mib)),
                ("redis_limit_mib", Json::from(self.opts.max_redis_mib)),
                ("tranche_run_rss_max_mib", Json::from(rss_mib)),
                ("runner_rss_max_mib", Json::from(runner_mib)),
                ("worker_limit_mib", Json::from(self.opts.max_rss_mib)),
            ]),
        );

        report::svg(
            &self.dir.join("timeline.svg"),
            &tput,
            &self.faults,
            fleet_end,
            self.opts.seed,
        )?;
        let recoveries: Vec<f64> = self.faults.iter().filter_map(|f| f.recovery_s).collect();
        Ok(Json::obj([
            ("seed", Json::from(self.opts.seed)),
            (
                "topology",
                Json::from(if self.opts.cluster {
                    "cluster 3+3"
                } else {
                    "one redis behind the proxy"
                }),
            ),
            ("duration_s", Json::from(self.opts.duration.as_secs())),
            ("interval_s", Json::from(self.opts.interval.as_secs())),
            ("drain_s", Json::from(drain_s)),
            ("workers", Json::from(self.opts.workers as u64 + 1)),
            ("partitions_planned", Json::from(planned_partitions)),
            ("chunk_runs", Json::from(runs.len() as u64)),
            ("bad_ledger_lines", Json::from(bad_lines)),
            (
                "throughput_ids_per_s_mean",
                Json::from(tput.iter().sum::<f64>() / fleet_end.max(1.0)),
            ),
            ("faults_by_kind", report::by_kind(&self.faults)),
            (
                "recovery_s",
                Json::obj([
                    ("p50", report::pct(&recoveries, 0.5)),
                    ("p99", report::pct(&recoveries, 0.99)),
                ]),
            ),
            (
                "faults",
                Json::Arr(self.faults.iter().map(report::fault).collect()),
            ),
            ("health_samples", health_rules),
            (
                "incarnations",
                Json::Arr(
                    self.incarnations
                        .iter()
                        .map(|i| {
                            Json::from(format!(
                                "{} pid {} from {:.1} s to {}: {}",
                                i.name,
                                i.pid,
                                i.started_us.saturating_sub(self.t0_us) as f64 / 1e6,
                                i.ended_us.map_or("the end".into(), |e| format!(
                                    "{:.1} s",
                                    e.saturating_sub(self.t0_us) as f64 / 1e6
                                )),
                                if i.end.is_empty() {
                                    "ran to the end"
                                } else {
                                    &i.end
                                }
                            ))
                        })
                        .collect(),
                ),
            ),
            (
                "unexpected_exits",
                Json::Arr(
                    self.unexpected_exits
                        .iter()
                        .cloned()
                        .map(Json::from)
                        .collect(),
                ),
            ),
            ("final_status", final_status),
            ("oracles", Json::Obj(oracles)),
        ]))
    }
}

fn describe(o: &ledger::Overlap) -> Json {
    Json::from(format!(
        "partition {} ids {}..={} by {} (chunk pid {}, {}) and {}..={} by {} (chunk pid {}, {}): {:.0} ms together",
        o.a.partition,
        o.a.from,
        o.a.to,
        o.a.worker,
        o.a.chunk_pid,
        ended(&o.a),
        o.b.from,
        o.b.to,
        o.b.worker,
        o.b.chunk_pid,
        ended(&o.b),
        o.both_ms
    ))
}

fn ended(r: &ledger::ChunkRun) -> &'static str {
    if r.end.is_empty() {
        "no end line"
    } else {
        r.end
    }
}

/// The rules firing in a `health --json` reply (None when it is no such reply).
fn firing(out: &str) -> Option<Vec<String>> {
    let Json::Arr(rules) = Json::parse(out)? else {
        return None;
    };
    Some(
        rules
            .iter()
            .filter(|r| r.get("firing") == Some(&Json::Bool(true)))
            .filter_map(|r| match r.get("rule") {
                Some(Json::Str(s)) => Some(s.clone()),
                _ => None,
            })
            .collect(),
    )
}

/// Whether a `check --json` reply reports no difference and no dead letter.
fn clean(out: &str) -> bool {
    let Some(v) = Json::parse(out) else {
        return false;
    };
    v.get("differences") == Some(&Json::Arr(vec![]))
        && v.at(&["dead_letters", "found"]).and_then(Json::as_u64) == Some(0)
}
