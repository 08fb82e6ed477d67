//! The tranche worker: the `tranche` command line, and [`runner`], the same worker as a
//! library for Rust programs that process chunks with their own async handler.
//!
//! The crate has two floors, and arrows only point down:
//!
//! - **The library floor** (the modules at the top level): the run loop (`work`), the
//!   leases it holds (`held`), the jobs it runs (`job`), the backends and their layers
//!   (`backend`, `layers`, `embedded`, `state`, `atomic`), worker names (`slot`), and
//!   [`runner`]. It imports nothing from the command line, the terminal or HTTP, and
//!   builds without default features.
//! - **The command-line floor** (`cli`, the default `cli` feature, which the `tranche`
//!   binary requires): the commands (`ops`), what they print (`render`), the progress
//!   bar, `tranche serve` and `--metrics-listen`. It attaches progress and metrics to a
//!   run from outside, through the run loop's observer hook. `cli_main` is the whole
//!   binary; errors end there as one line on stderr and a non-zero exit.

// Without the command line, parts of the engine that only its commands use (exec
// jobs, namespace listing, the run's counters for `--metrics-listen`) have no caller
// yet; they become public API in a later step.
#![cfg_attr(not(feature = "cli"), allow(dead_code))]

mod atomic;
mod backend;
#[cfg(feature = "cli")]
mod cli;
mod control;
mod duration;
mod embedded;
mod held;
mod job;
mod layers;
pub mod runner;
mod slot;
mod state;
mod work;

/// The state-file loader's fuzz entry (`worker-bin/fuzz`); not an API.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub use state::fuzz_state_file;

#[cfg(feature = "cli")]
pub use cli::cli_main;

/// Milliseconds since the Unix epoch, by the system clock: the binary's one "now",
/// read from the same [`Clock`](tranche_codec::Clock) the stores take.
pub(crate) fn now_ms() -> u64 {
    use tranche_codec::Clock;
    tranche_codec::SystemClock.now_ms()
}
