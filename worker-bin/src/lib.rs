//! The tranche worker: the `tranche` command line, and the same worker as a library
//! for Rust programs that process chunks with their own async [`Handler`].
//!
//! The library in one screen: plan a job, run a handler over it, ask what happened.
//! Embedded (one process, state in a file) needs no service; [`Runner::redis`] runs
//! the same code on a fleet.
//!
//! In `Cargo.toml` (Rust 1.95 or later), the library without the command line, and
//! the two crates a handler needs beside it: tokio to run, async-trait to implement
//! [`Handler`]:
//!
//! ```toml
//! [dependencies]
//! tranche-worker = { path = "../tranche/worker-bin", default-features = false }
//! tokio = { version = "1", features = ["macros", "rt-multi-thread", "signal"] }
//! async-trait = "0.1"
//! ```
//!
//! (or `git = "…"` for `path`; feature `metrics` adds Prometheus families.) A run
//! drains on the stop an operator sends, Ctrl-C or SIGTERM, when given
//! [`shutdown_signal`] through [`Runner::run_with_shutdown`].
//!
//! ```
//! use tranche_worker::{Chunk, Handler, HandlerError, Plan, Runner, Status};
//!
//! struct Square;
//!
//! #[async_trait::async_trait]
//! impl Handler for Square {
//!     async fn process(&self, chunk: Chunk) -> Result<(), HandlerError> {
//!         if chunk.from <= 4_242 && 4_242 <= chunk.to {
//!             return Err(HandlerError::permanent("row 4242 is malformed"));
//!         }
//!         Ok(())
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tranche_worker::Error> {
//! let dir = std::env::temp_dir().join(format!("tranche-doc-{}", std::process::id()));
//! let runner = Runner::embedded(dir.join("square.state")).chunk(100);
//! runner.plan(Plan::ids(1..=10_000).partition_size(1_000)).await?;
//! let report = runner.run(Square).await?;
//! assert_eq!(report.this_runner.completed, 9);
//! assert_eq!(report.this_runner.failed_pids, vec![5]);
//!
//! let job = runner.job().await?;
//! let located = job.locate(4_242).await?.expect("planned");
//! assert_eq!((located.pid, located.range), (5, 4_001..=5_000));
//! let failed = job.list(Some(Status::Failed), 0, 10).await?;
//! assert!(failed[0].last_error.as_deref().unwrap().contains("row 4242"));
//! # std::fs::remove_dir_all(&dir).ok();
//! # Ok(())
//! # }
//! ```
//!
//! [`Runner`] explains the settings (concurrency, parallel, window, prefetch) and the
//! shutdown; [`Event`] what a run reports as it goes; [`Job`] what can be asked after,
//! and the operator's actions (retry failed, discard, pause, resume, export).
//! Errors are one [`Error`] enum. Feature `metrics` adds [`Runner::metrics`]-style
//! Prometheus families to the application's own registry.
//!
//! The crate has two floors, and arrows only point down:
//!
//! - **The library floor** (the modules at the top level): the run loop (`work`), the
//!   leases it holds (`held`), the jobs it runs (`job`), the backends and their layers
//!   (`backend`, `layers`, `embedded`, `state`, `atomic`), worker names (`slot`), and
//!   the public API (`runner`, `handler`, `event`, `query`, `plan`, `error`,
//!   `metrics`). It imports nothing from the command line, the terminal or HTTP, and
//!   builds without default features.
//! - **The command-line floor** (`cli`, the default `cli` feature, which the `tranche`
//!   binary requires): the commands (`ops`), what they print (`render`), the progress
//!   bar, `tranche serve` and `--metrics-listen`. It attaches progress and metrics to a
//!   run from outside, through the run's events. `cli_main` is the whole binary;
//!   errors end there as one line on stderr and a non-zero exit.

mod atomic;
mod backend;
mod check;
#[cfg(feature = "cli")]
mod cli;
mod control;
mod defaults;
mod duration;
mod embedded;
mod error;
mod event;
mod handler;
mod held;
mod job;
mod layers;
#[cfg(feature = "metrics")]
mod metrics;
mod plan;
mod query;
mod runner;
mod signal;
mod slot;
#[cfg(feature = "sql")]
mod sql;
mod state;
mod sync;
mod trace;
mod work;

/// The embedded run's state file, for `benches/embedded_state.rs` (which times saving,
/// loading and restoring it); not an API, and no stability is promised.
#[doc(hidden)]
pub mod embedded_state {
    pub use crate::state::{Embedded, EmbeddedState, SaveReport, StateError, load};
}

/// The state-file loader's fuzz entry (`worker-bin/fuzz`); not an API.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub use state::fuzz_state_file;

/// The whole `tranche` binary (its `main` calls this); not a library API.
#[cfg(feature = "cli")]
#[doc(hidden)]
pub use cli::cli_main;

pub use check::CheckReport;
pub use control::ControlHandle;
pub use error::Error;
pub use event::{Event, Progress, StoreOp};
pub use handler::{Chunk, Handler, HandlerError};
pub use job::PersistentCommand;
pub use plan::Plan;
pub use query::{Job, JobStatus};
pub use runner::{DEFAULT_SPLIT_MIN, NamespaceReport, RunReport, Runner, RunnerReport, Until};
pub use signal::shutdown_signal;
#[cfg(feature = "sql")]
pub use sql::{SqlConfig, SqlHandler, SqlProbe, SqlStats};
/// The token that drains a run ([`Runner::run_until_cancelled`]), re-exported from
/// `tokio-util`.
pub use tokio_util::sync::CancellationToken;
pub use trace::{PartitionTrace, TraceContext, TraceParent};
/// The values a [`Job`] answers with, from the crates underneath.
pub use tranche_active_store::{PlanEntry, StatusCounts, WorkerInfo, WorkerState};
pub use tranche_archive_store::{DeadLetter, Dump};
pub use tranche_codec::{CompletedRecord, Partition, Status};
/// What a throttle probe found ([`Runner::throttle_probe`]).
pub use tranche_control::ProbeOutcome;
pub use tranche_router::{Located, MergedStats, PartitionView};
/// One difference [`Job::check`] found ([`CheckReport::differences`]).
pub use tranche_stats::Difference;

/// The README's "Embed a worker in Rust" section, compiled and run as a doctest so
/// that it stays true.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
