//! The fleet: `tranche run --exec` workers and one library runner, each restartable,
//! every incarnation remembered (when it started, when and how it ended) for the oracle.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};

/// Microseconds since the epoch: the ledgers' clock.
pub(crate) fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros() as u64
}

/// Sends `sig` (a name `kill -s` takes: STOP, CONT, TERM, KILL) to process `pid`.
pub(crate) fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args(["-s", sig, &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

/// The chunk command of the `--exec` workers: a START and an END line around a short
/// wait, appended to the worker's ledger (one `printf` of a line under PIPE_BUF to an
/// O_APPEND file is atomic). `$$` is the chunk's own process, to tell its lines apart.
/// The wait is a `read -t` on a FIFO nobody writes (`SOAK_NEVER`): a timer in bash
/// itself, no `sleep` forked, so a chunk costs one shell and nothing more.
pub(crate) const LEDGER_SH: &str = r#"#!/bin/bash
# START|END|KILL partition from to worker chunk_pid time_us
me=$$
line() { printf '%s %s %s %s %s %s %s\n' "$1" "$TRANCHE_PID" "$TRANCHE_FROM" "$TRANCHE_TO" "$SOAK_WORKER" "$me" "${EPOCHREALTIME/./}" >> "$SOAK_LEDGER"; }
# Killed by its worker (lease lost, drain): say when, so the interval ends there.
trap 'line KILL; exit 143' TERM
if [[ $SOAK_SABOTAGE == tear ]]; then
  # Sabotage (`soak --self-test`): the START in two appends with a wait between them,
  # so that the other chunk's lines land inside it.
  printf '%s %s %s ' START "$TRANCHE_PID" "$TRANCHE_FROM" >> "$SOAK_LEDGER"
  read -r -t 0.05 _ <> "$SOAK_NEVER"
  printf '%s %s %s %s\n' "$TRANCHE_TO" "$SOAK_WORKER" "$me" "${EPOCHREALTIME/./}" >> "$SOAK_LEDGER"
else
  line START
fi
if [[ $SOAK_SABOTAGE == skip-guard ]]; then
  # Sabotage: the work runs in a session of its own, out of the chunk's process group,
  # where the guard's kill does not reach it; it outlives its worker.
  setsid bash -c 'read -r -t 4 _ <> "$SOAK_NEVER"' </dev/null >/dev/null 2>&1 &
  wait $!
else
  # 10-90 ms of work, or 8 s once in 2000 chunks (a chunk in flight when a fault hits;
  # rare enough that the few slots such chunks hold do not swing the fleet's rate).
  if (( RANDOM % 2000 == 0 )); then d=8; else d=0.0$(( RANDOM % 9 + 1 )); fi
  read -r -t "$d" _ <> "$SOAK_NEVER"
fi
line END
"#;

/// The workers' default `RUST_LOG`: warnings, and the split lines the report counts.
const SPLIT_LOGS: &str = "warn,tranche_worker::work::split=info,tranche_worker::held=info";

/// What runs in a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `tranche run --exec ledger.sh`.
    Exec,
    /// The `soak_runner` example: the library with a handler that can panic.
    Runner,
}

/// One process the soak started, and how it ended.
#[derive(Debug, Clone)]
pub(crate) struct Incarnation {
    /// `w3.1`: slot 3, second start. The ledgers name it.
    pub(crate) name: String,
    pub(crate) kind: Kind,
    pub(crate) pid: u32,
    pub(crate) started_us: u64,
    /// When the soak saw it gone (after its kill or exit was reaped).
    pub(crate) ended_us: Option<u64>,
    /// `killed`, `terminated`, `exited N`.
    pub(crate) end: String,
}

/// How every worker is started.
pub(crate) struct Setup {
    pub(crate) tranche: PathBuf,
    pub(crate) runner: PathBuf,
    pub(crate) dir: PathBuf,
    /// The Redis the workers use; `None` on the embedded state file `state`.
    pub(crate) redis_url: Option<String>,
    pub(crate) state: PathBuf,
    pub(crate) namespace: String,
    pub(crate) run_id: String,
    pub(crate) lease_ms: u64,
    pub(crate) compressed_at: u64,
    /// The exec workers' `--chunk`, `--parallel` and `--concurrency`.
    pub(crate) exec_chunk: u64,
    pub(crate) exec_parallel: u64,
    pub(crate) exec_concurrency: u64,
    /// The runners' chunk, chunks of a partition at once, partitions at once, and
    /// simulated work per chunk (ms, `min-max`).
    pub(crate) runner_chunk: u64,
    pub(crate) runner_parallel: u64,
    pub(crate) runner_concurrency: u64,
    pub(crate) runner_work_ms: &'static str,
    /// `SOAK_SABOTAGE` of every worker and chunk (`soak --self-test`), if any.
    pub(crate) sabotage: Option<String>,
}

impl Setup {
    /// The FIFO the ledger script waits on.
    pub(crate) fn never(&self) -> PathBuf {
        self.dir.join("never.fifo")
    }

    /// Where the workers' store is, in the environment of a `tranche` command.
    pub(crate) fn locate(&self, cmd: &mut Command) {
        super::locate(cmd, self.redis_url.as_deref(), &self.state);
    }
}

/// A worker slot: at most one live process at a time.
pub(crate) struct Slot {
    pub(crate) index: usize,
    pub(crate) kind: Kind,
    pub(crate) child: Option<Child>,
    /// Set while it is SIGSTOPped.
    pub(crate) stopped: bool,
    /// When a dead slot is started again.
    pub(crate) restart_at: Option<Instant>,
    /// What it is started as then, if not as before.
    pub(crate) next_kind: Option<Kind>,
    generation: u32,
}

impl Slot {
    pub(crate) fn new(index: usize, kind: Kind) -> Slot {
        Slot {
            index,
            kind,
            child: None,
            stopped: false,
            restart_at: None,
            next_kind: None,
            generation: 0,
        }
    }

    /// The slot's ledger file.
    pub(crate) fn ledger(&self, setup: &Setup) -> PathBuf {
        setup
            .dir
            .join("ledger")
            .join(format!("w{}.log", self.index))
    }

    /// The file a runner of this slot holds locked while it writes a ledger line (the
    /// `soak_runner` example's `SOAK_LINE_LOCK`), beside the ledgers: an aimed stop
    /// that finds it held strikes again.
    pub(crate) fn line_lock(&self, setup: &Setup) -> PathBuf {
        setup.dir.join(format!("w{}.line.lock", self.index))
    }

    /// Starts a new incarnation.
    pub(crate) fn start(&mut self, setup: &Setup, log: &mut Vec<Incarnation>) -> Result<()> {
        if let Some(kind) = self.next_kind.take() {
            self.kind = kind;
        }
        let name = format!("w{}.{}", self.index, self.generation);
        self.generation += 1;
        let out = std::fs::File::create(setup.dir.join("logs").join(format!("{name}.log")))?;
        let err = out.try_clone()?;
        let mut cmd = match self.kind {
            Kind::Exec => {
                let mut cmd = Command::new(&setup.tranche);
                cmd.arg("run")
                    .arg("--exec")
                    // A plain command, which the chunk's guard `exec`s itself: bash is
                    // the chunk's own process and gets the guard's SIGTERM first. Under
                    // a `sh -c`, dash would die of it at once, the worker then close
                    // the lifeline and the guard SIGKILL the group, which can come
                    // before bash runs its trap: the ledger had a run with no end line,
                    // which the overlap oracle stretched to its worker's death.
                    .arg(format!("bash {}", setup.dir.join("ledger.sh").display()))
                    .args(["--lease", &format!("{}ms", setup.lease_ms)])
                    .args(["--chunk", &setup.exec_chunk.to_string()])
                    .args(["--parallel", &setup.exec_parallel.to_string()])
                    .args(["--concurrency", &setup.exec_concurrency.to_string()])
                    .args(["--grace", "2s"])
                    .args(["--compressed-at", &setup.compressed_at.to_string()])
                    .args(["--worker-id", &format!("w{}", self.index)])
                    .arg("--follow")
                    .env("SOAK_NEVER", setup.never());
                cmd
            }
            Kind::Runner => {
                let mut cmd = Command::new(&setup.runner);
                cmd.env("SOAK_PANIC_FILE", panic_file(&setup.dir))
                    .env("SOAK_LEASE_MS", setup.lease_ms.to_string())
                    .env("SOAK_CHUNK", setup.runner_chunk.to_string())
                    .env("SOAK_PARALLEL", setup.runner_parallel.to_string())
                    .env("SOAK_CONCURRENCY", setup.runner_concurrency.to_string())
                    .env("SOAK_WORK_MS", setup.runner_work_ms)
                    .env("SOAK_LINE_LOCK", self.line_lock(setup));
                cmd
            }
        };
        setup.locate(&mut cmd);
        match &setup.sabotage {
            Some(s) => cmd.env("SOAK_SABOTAGE", s),
            None => cmd.env_remove("SOAK_SABOTAGE"),
        };
        cmd.env("TRANCHE_NAMESPACE", &setup.namespace)
            .env("SOAK_LEDGER", self.ledger(setup))
            .env("SOAK_WORKER", &name)
            .env("SOAK_RUN", &setup.run_id)
            // Quiet unless asked (`SOAK_RUST_LOG=tranche=debug` to see a fault from
            // inside), but for splits: the report counts pieces and cuts from the logs.
            .env(
                "RUST_LOG",
                std::env::var("SOAK_RUST_LOG").unwrap_or_else(|_| SPLIT_LOGS.to_owned()),
            )
            // A panic's backtrace would load the debug info: 170 MiB of RSS that is
            // the symbolizer's, not the worker's.
            .env("RUST_BACKTRACE", "0")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let child = cmd
            .spawn()
            .with_context(|| format!("could not start worker {name}"))?;
        log.push(Incarnation {
            name,
            kind: self.kind,
            pid: child.id(),
            started_us: now_us(),
            ended_us: None,
            end: String::new(),
        });
        self.child = Some(child);
        self.stopped = false;
        self.restart_at = None;
        Ok(())
    }

    /// The live process id.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL (SIGCONT first if stopped), reap, record.
    pub(crate) fn kill(&mut self, log: &mut [Incarnation]) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            if self.stopped {
                self.stopped = false;
            }
            ended(log, child.id(), "killed");
        }
    }

    /// SIGTERM, wait up to `grace` for the drain, then SIGKILL.
    pub(crate) fn terminate(&mut self, grace: Duration, log: &mut [Incarnation]) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if self.stopped {
            signal(child.id(), "CONT");
            self.stopped = false;
        }
        signal(child.id(), "TERM");
        let deadline = Instant::now() + grace;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                ended(log, child.id(), &format!("terminated ({status})"));
                return;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                ended(log, child.id(), "killed after SIGTERM grace");
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Reaps a process that exited by itself; true when it did.
    pub(crate) fn reap(&mut self, log: &mut [Incarnation]) -> bool {
        let Some(child) = self.child.as_mut() else {
            return false;
        };
        match child.try_wait() {
            Ok(Some(status)) => {
                let pid = child.id();
                self.child = None;
                ended(log, pid, &format!("exited by itself ({status})"));
                true
            }
            _ => false,
        }
    }
}

fn ended(log: &mut [Incarnation], pid: u32, how: &str) {
    if let Some(inc) = log
        .iter_mut()
        .rev()
        .find(|i| i.pid == pid && i.ended_us.is_none())
    {
        inc.ended_us = Some(now_us());
        inc.end = how.to_owned();
    }
}

/// The file whose appearance makes the runner's next chunk panic.
pub(crate) fn panic_file(dir: &Path) -> PathBuf {
    dir.join("panic.trigger")
}

/// Resident set size of `pid` in KiB, from /proc.
pub(crate) fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Live processes of run `run_id` left by the killed incarnation `name` (whose chunks
/// wrote to `ledger`): those whose environment carries `SOAK_WORKER=name` (every chunk process
/// inherits it, whatever session or group it moved to) or whose process group is one
/// of its chunks' (a chunk's group is led by the chunk's own process), with their
/// command lines. The incarnation itself is reaped by then.
pub(crate) fn orphans_of(name: &str, ledger: &Path, run_id: &str) -> Vec<(u32, String)> {
    let needle = format!("SOAK_WORKER={name}");
    let run = format!("SOAK_RUN={run_id}");
    // The chunks it left open (a START and no line after it): older chunk pids may
    // have been reused by now.
    let mut groups: Vec<u32> = Vec::new();
    for l in std::fs::read_to_string(ledger).unwrap_or_default().lines() {
        let f: Vec<&str> = l.split(' ').collect();
        let Some(pid) = f.get(5).and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if f.len() != 7 || f[4] != name {
            continue;
        }
        groups.retain(|&g| g != pid);
        if f[0] == "START" {
            groups.push(pid);
        }
    }
    let mut found = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // After the command's closing parenthesis: state, ppid, pgrp.
        let fields: Vec<&str> = stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .split_whitespace()
            .collect();
        if fields.first().is_none_or(|s| *s == "Z") {
            continue;
        }
        let pgrp: u32 = fields.get(2).and_then(|g| g.parse().ok()).unwrap_or(0);
        let env = std::fs::read(entry.path().join("environ")).unwrap_or_default();
        let has = |var: &String| env.split(|&b| b == 0).any(|v| v == var.as_bytes());
        // This run's only: another soak on the machine has workers of the same names.
        if has(&run) && (has(&needle) || groups.contains(&pgrp)) {
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            found.push((pid, format!("group {pgrp}: {}", cmdline.trim())));
        }
    }
    found
}

/// Live processes whose environment carries `SOAK_RUN=run_id` (the workers, their
/// chunk processes and anything those left behind), with their command lines.
pub(crate) fn processes_of_run(run_id: &str) -> Vec<(u32, String)> {
    let needle = format!("SOAK_RUN={run_id}");
    let mut found = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(env) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if env.split(|&b| b == 0).any(|v| v == needle.as_bytes()) {
            // A zombie (already dead, not yet reaped) is no stray.
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            if stat
                .rsplit(')')
                .next()
                .is_some_and(|s| s.trim_start().starts_with('Z'))
            {
                continue;
            }
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            found.push((pid, cmdline.trim().to_owned()));
        }
    }
    found
}
