//! `tranche`: plans ID ranges, runs them on a fleet of workers through Redis (or
//! embedded in this process), archives what finished and answers for it for ever.
//!
//! This binary is the only place that knows every crate: it opens the three layers
//! ([`backend`]), hands them to the run loop ([`work`]) or to one operator command
//! ([`ops`]), and prints what they answer ([`render`]). Errors end here as one line on
//! stderr and a non-zero exit.

mod backend;
mod cli;
mod embedded;
mod held;
mod job;
mod ops;
mod progress;
mod render;
mod state;
mod work;

use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

use crate::cli::Cli;

/// Exit code of a run that ended with failed partitions or a firing alert.
const EXIT_FAILED: u8 = 1;
/// Exit code of bad input or an unreachable store.
const EXIT_ERROR: u8 = 2;
/// Exit code of a run stopped by a signal (128 + SIGINT).
const EXIT_INTERRUPTED: u8 = 130;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            // --help and --version are "errors" that print to stdout and exit 0.
            let code = if err.use_stderr() { EXIT_ERROR } else { 0 };
            let _ = err.print();
            return ExitCode::from(code);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| EnvFilter::new("warn,tranche=info")),
        )
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("tranche: cannot start the runtime: {err}");
            return ExitCode::from(EXIT_ERROR);
        }
    };
    let outcome = runtime.block_on(ops::dispatch(cli));
    // An aborted run has stopped its chunks' process groups already; do not wait for
    // blocked reads of an unreachable server either.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    match outcome {
        Ok(ops::Outcome::Success) => ExitCode::SUCCESS,
        Ok(ops::Outcome::Failed(message)) => {
            eprintln!("tranche: {message}");
            ExitCode::from(EXIT_FAILED)
        }
        Ok(ops::Outcome::Interrupted) => ExitCode::from(EXIT_INTERRUPTED),
        Err(err) => {
            // One line: the outermost context, then each cause it does not already say.
            let mut line = String::new();
            for cause in err.chain().map(|e| e.to_string()) {
                if !line.contains(&cause) {
                    if !line.is_empty() {
                        line.push_str(": ");
                    }
                    line.push_str(&cause);
                }
            }
            eprintln!("tranche: {line}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}
