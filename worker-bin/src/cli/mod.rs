//! The command-line floor: the `tranche` binary's commands (`args` parses them, `ops`
//! runs them), what they print (`render`, `progress`), and the HTTP side (`serve`, and
//! the worker's `--metrics-listen`). Under every command: `common` (global options,
//! outcome, signals) and `inspect` (the status, state and pieces readers). It uses the library floor below it (the run loop,
//! the backends) and nothing there uses it: progress and metrics attach to a run from
//! outside, through the run loop's [`Observer`](crate::work::Observer).

mod admin;
mod alert;
mod archive;
mod args;
mod calendar;
mod common;
mod control;
mod cost;
mod doctor;
mod generate;
mod health;
mod inspect;
mod jsonl;
mod list;
mod namespace;
mod observe;
mod ops;
mod partition;
mod plan;
mod progress;
mod render;
mod run;
mod seed;
mod serve;
mod sql_probe;
mod status;
mod telemetry;
mod transfer;

use std::process::ExitCode;

use clap::Parser;

use args::Cli;
use common::{Outcome, one_line};

/// Exit code of a run that ended with failed partitions or a firing alert.
const EXIT_FAILED: u8 = 1;
/// Exit code of bad input or an unreachable store.
const EXIT_ERROR: u8 = 2;
/// Exit code of a run stopped by a signal (128 + SIGINT).
const EXIT_INTERRUPTED: u8 = 130;

/// Prints a failure on stderr: `tranche: MESSAGE`, or with `--json` one object
/// `{"error": {"kind", "message"}}`, so a script reading JSON gets JSON on both streams.
fn report(json: bool, kind: &str, message: &str) {
    if json {
        eprintln!(
            "{}",
            serde_json::json!({"error": {"kind": kind, "message": message}})
        );
    } else {
        eprintln!("tranche: {message}");
    }
}

/// Lets an output command end quietly with exit 0 when the reader of its stdout goes
/// away (`tranche list | head -1`), instead of panicking in `print!` with "failed
/// printing to stdout: Broken pipe". Exit 0 rather than death by SIGPIPE (status 141),
/// so that a `set -o pipefail` script reading the first lines does not fail.
///
/// Rust ignores SIGPIPE, so the write fails with EPIPE and `print!` panics; this hook
/// turns that one panic into an exit. It is not SIGPIPE restored to its default: a
/// signal is per process, not per descriptor, and `run` and `serve` must outlive a
/// peer that resets a socket or a chunk that closes its stdin. They get no hook
/// either: a worker whose stdout closes keeps its outcome (and its drain), not exit 0.
fn quiet_when_stdout_closes() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let printing = info
            .payload_as_str()
            .is_some_and(|m| m.starts_with("failed printing to stdout"));
        if printing && stdout_closed() {
            std::process::exit(0);
        }
        default(info);
    }));
}

/// Whether nobody reads stdout any more: a pipe or socket whose other end is closed
/// polls as an error or a hang-up at once.
fn stdout_closed() -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    let stdout = std::io::stdout();
    let mut fds = [PollFd::new(stdout.as_fd(), PollFlags::empty())];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(1..))
        && fds[0]
            .revents()
            .is_some_and(|r| r.intersects(PollFlags::POLLERR | PollFlags::POLLHUP))
}

/// Whether `err` is a write to a stdout whose reader went away (`export --output -`
/// and `completions` write with `write_all` and return the error rather than panic).
fn stdout_went_away(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    }) && stdout_closed()
}

/// How many threads `cli` runs on: `--threads`, else one for `run`, else `None` (one
/// per core).
fn threads_for(cli: &Cli) -> Option<usize> {
    cli.global
        .threads
        .map(usize::from)
        .or_else(|| matches!(cli.command, args::Command::Run(_)).then_some(1))
}

/// The runtime `cli` runs on: a current-thread runtime for one thread (no wake-up ever
/// crosses threads), a multi-thread one otherwise. Blocking work (state saves, bulk
/// reads) goes to tokio's blocking pool either way.
fn runtime_for(cli: &Cli) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = match threads_for(cli) {
        Some(1) => tokio::runtime::Builder::new_current_thread(),
        Some(n) => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(n);
            builder
        }
        None => tokio::runtime::Builder::new_multi_thread(),
    };
    builder.enable_all().build()
}

/// The `tranche` command line: parses the arguments, runs the command, and returns the
/// exit code (0 success; 1 failed partitions or a firing alert; 2 bad input or an
/// unreachable store; 130 a signal).
pub fn cli_main() -> ExitCode {
    // Known before parsing, so that even a usage error can answer in JSON.
    let json = std::env::args_os().any(|a| a == "--json");
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            // --help and --version are "errors" that print to stdout and exit 0.
            if !err.use_stderr() {
                let _ = err.print();
                return ExitCode::SUCCESS;
            }
            if json {
                let text = err.to_string();
                let first = text
                    .lines()
                    .next()
                    .unwrap_or("")
                    .trim_start_matches("error: ");
                report(true, "usage", first);
            } else {
                let _ = err.print();
            }
            return ExitCode::from(EXIT_ERROR);
        }
    };
    let telemetry = match telemetry::init(
        cli.global.log_format,
        &telemetry::Traces {
            endpoint: cli.global.otlp_endpoint.clone(),
            sample: cli.global.trace_sample,
        },
    ) {
        Ok(telemetry) => telemetry,
        Err(err) => {
            report(json, "usage", &one_line(&err));
            return ExitCode::from(EXIT_ERROR);
        }
    };
    let output_command = !matches!(cli.command, args::Command::Run(_) | args::Command::Serve(_));
    if output_command {
        quiet_when_stdout_closes();
    }
    let runtime = match runtime_for(&cli) {
        Ok(rt) => rt,
        Err(err) => {
            report(json, "error", &format!("cannot start the runtime: {err}"));
            return ExitCode::from(EXIT_ERROR);
        }
    };
    let outcome = runtime.block_on(ops::dispatch(cli));
    // An aborted run has stopped its chunks' process groups already; do not wait for
    // blocked reads of an unreachable server either.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    // Spans still queued go to the collector now (bounded), after the last one ended.
    drop(telemetry);
    match outcome {
        Ok(Outcome::Success) => ExitCode::SUCCESS,
        Ok(Outcome::Failed(message)) => {
            report(json, "failed", &message);
            ExitCode::from(EXIT_FAILED)
        }
        Ok(Outcome::Interrupted) => ExitCode::from(EXIT_INTERRUPTED),
        Err(err) if output_command && stdout_went_away(&err) => ExitCode::SUCCESS,
        Err(err) => {
            report(json, "error", &one_line(&err));
            ExitCode::from(EXIT_ERROR)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn threads(args: &[&str]) -> Option<usize> {
        threads_for(&Cli::try_parse_from(args).expect("valid arguments"))
    }

    #[test]
    fn run_works_on_one_thread_unless_told_otherwise() {
        assert_eq!(threads(&["tranche", "run", "--simulate"]), Some(1));
        assert_eq!(threads(&["tranche", "status"]), None, "one per core");
        assert_eq!(
            threads(&["tranche", "run", "--simulate", "--threads", "4"]),
            Some(4)
        );
        assert_eq!(threads(&["tranche", "--threads", "2", "serve"]), Some(2));
        assert!(Cli::try_parse_from(["tranche", "--threads", "0", "status"]).is_err());
    }
}
