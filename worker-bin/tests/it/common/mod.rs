//! Helpers for tests that spawn the real `tranche` binary.

#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub(crate) use crate::logged::{LoggedChild, exit_within, scratch};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_tranche");

/// The example `--exec` script shipped in `examples/`.
pub fn example_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/process-range.sh")
}

/// `tranche ARGS` with a clean environment (no inherited TRANCHE_* settings).
pub fn tranche(dir: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .current_dir(dir)
        .env("RUST_LOG", "warn,tranche=info");
    for (key, _) in std::env::vars() {
        if key.starts_with("TRANCHE_") {
            cmd.env_remove(key);
        }
    }
    // The test servers have no persistence: their start-up warning would add a line
    // to every `plan`, `run` and `serve` (cli/doctor/ tests it without this).
    cmd.env("TRANCHE_QUIET", "1");
    cmd
}

/// Runs to completion; panics with its output if it cannot be started.
///
/// Bounded by [`OUTPUT_LIMIT`]: a command still running then is killed and the test
/// fails with what it printed, so a hang fails one test instead of stalling the suite.
pub fn output(mut cmd: Command) -> Output {
    use std::io::Read;
    use std::sync::{Arc, Mutex};
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tranche");
    // Each pipe is read into a buffer the test can look at even while a grandchild
    // still holds the pipe open.
    let drain = |mut pipe: Box<dyn Read + Send>| {
        let bytes = Arc::new(Mutex::new(Vec::new()));
        let sink = bytes.clone();
        let reader = std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n @ 1..) = pipe.read(&mut buf) {
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        (bytes, reader)
    };
    let (stdout, out_reader) = drain(Box::new(child.stdout.take().expect("piped")));
    let (stderr, err_reader) = drain(Box::new(child.stderr.take().expect("piped")));
    let deadline = Instant::now() + OUTPUT_LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{cmd:?} did not exit within {OUTPUT_LIMIT:?}; stderr:\n{}",
                String::from_utf8_lossy(&stderr.lock().unwrap())
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let _ = (out_reader.join(), err_reader.join());
    let take = |b: Arc<Mutex<Vec<u8>>>| std::mem::take(&mut *b.lock().unwrap());
    Output {
        status,
        stdout: take(stdout),
        stderr: take(stderr),
    }
}

/// How long [`output`] lets one command run.
pub const OUTPUT_LIMIT: Duration = Duration::from_secs(180);

/// Runs and asserts success, returning stdout.
pub fn ok(cmd: Command) -> String {
    let out = output(cmd);
    assert!(
        out.status.success(),
        "tranche failed ({:?})\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// Sends `signal` (a `kill` name such as `INT` or `KILL`) to `child`.
pub fn signal(child: &Child, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(child.id().to_string())
        .status()
        .expect("kill");
    assert!(status.success(), "kill -{signal} failed");
}

/// Waits for `child` to exit, at most `limit`. A child whose output the test reads is a
/// [`LoggedChild`], with a wait of its own: a pipe read after the exit can stop it.
pub fn wait(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    exit_within(child, limit).unwrap_or_else(|| {
        let _ = child.kill();
        panic!("tranche did not exit within {limit:?}");
    })
}

/// Lines of the chunk log the example script writes: (pid, from, to).
pub fn chunk_log(path: &Path) -> Vec<(u64, u64, u64)> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace().map(|w| w.parse::<u64>());
            Some((it.next()?.ok()?, it.next()?.ok()?, it.next()?.ok()?))
        })
        .collect()
}

/// Asserts every ID in `min..=max` appears in some chunk of the log.
pub fn assert_every_id_processed(log: &[(u64, u64, u64)], min: u64, max: u64) {
    let mut covered = vec![false; (max - min + 1) as usize];
    for &(_, from, to) in log {
        for id in from..=to {
            covered[(id - min) as usize] = true;
        }
    }
    let missing: Vec<u64> = covered
        .iter()
        .enumerate()
        .filter(|(_, c)| !**c)
        .map(|(i, _)| min + i as u64)
        .collect();
    assert!(
        missing.is_empty(),
        "{} IDs never processed, first {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
}

/// Polls until `f` is true, at most `limit`.
pub fn eventually(limit: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Replaces what differs from run to run in a command's JSON (times, durations, rates,
/// where the store is, and the keys in `also`) with a marker, so that a snapshot pins
/// the shape and every count.
pub fn steady(v: &mut serde_json::Value, also: &[&str]) {
    use serde_json::Value;
    const VOLATILE: &[&str] = &[
        "avg_duration",
        "p50",
        "p95",
        "p99",
        "last_updated",
        "rate_per_s",
        "location",
        "latency_p50_ms",
        "latency_p99_ms",
        "update_p99_ms",
        "duration",
        "time_series_stats",
        "version",
        "host",
        "process_id",
    ];
    match v {
        Value::Object(map) => {
            let rule = map.get("rule").and_then(Value::as_str).map(str::to_owned);
            for (key, value) in map.iter_mut() {
                let timed = key.ends_with("_ms") || key.ends_with("_at") || key.ends_with("_s");
                let rule_value = key == "value"
                    && matches!(
                        rule.as_deref(),
                        Some(
                            "worker_update_p99_ms"
                                | "stalled_minutes"
                                | "archive_lag_seconds"
                                | "clock_skew"
                        )
                    );
                let named = VOLATILE.contains(&key.as_str()) || also.contains(&key.as_str());
                if !value.is_null() && (timed || rule_value || named) {
                    *value = Value::String("[varies]".into());
                } else {
                    steady(value, also);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|i| steady(i, also)),
        _ => {}
    }
}
