//! Fleet-wide control of a tranche namespace: what keeps a run safe to point at a
//! production database.
//!
//! - [`RateLimiter`] ([`RedisRateLimiter`], [`MemoryRateLimiter`]) and the client-side
//!   [`Pacer`]: a fleet-wide limit in IDs/s or partitions/s.
//! - [`ControlRecord`] in a [`ControlStore`] ([`RedisControlStore`],
//!   [`MemoryControlStore`]): the namespace's live settings, manual and probe throttles,
//!   with a capped change log; [`ControlWatcher`] publishes the record in force to a
//!   run loop through a `tokio::sync::watch` channel. Every read is checked
//!   ([`ControlRecord::decode`]): a value that breaks the write rules is dropped and
//!   listed as [`Rejected`], never applied, never an error.
//! - [`Probe`] ([`ExecProbe`], [`HttpProbe`], [`FnProbe`]) run by every worker that has
//!   one ([`Prober`]), each reporting under its own name: a throttle from any live
//!   prober holds the fleet. One elected worker also drives the [`Aimd`] rate
//!   controller for `--keep-below`.
//! - [`ActiveHours`] and [`ChunkSizer`]: pure logic for time windows and chunks sized
//!   by time.
//!
//! The design choice a reader would otherwise get wrong: the rate limiter is a GCRA
//! with *reservations*, not a token bucket polled per chunk. A pacer reserves a batch of
//! units in one Redis call (moving the shared theoretical arrival time forward by
//! `units / rate`) and then spends it locally, unit `i` no earlier than
//! `start + i / rate`. Reservations of the whole fleet never overlap, so the limit holds
//! in every window (to one chunk per worker) while Redis sees one call per batch, and a
//! limit of none makes no call at all.

mod aimd;
mod checked;
mod error;
mod hours;
mod http;
mod limiter;
mod pacer;
mod probe;
mod prober;
mod rate;
mod record;
mod repair;
mod sizer;
mod store;
mod watcher;

pub use aimd::Aimd;
pub use checked::{
    MAX_PROBERS, MAX_REASON_BYTES, MAX_RECORD_BYTES, MAX_WORKER_BYTES, Rejected, TRUNCATED,
    UNREADABLE_THROTTLE, truncate,
};
pub use error::{Error, Result};
pub use hours::ActiveHours;
pub use limiter::{Limit, MemoryRateLimiter, RateLimiter, RedisRateLimiter, Reservation};
pub use pacer::Pacer;
pub use probe::{ExecProbe, FnProbe, HttpProbe, Probe, ProbeOutcome};
pub use prober::{OwnProbe, Prober, ProberConfig};
pub use rate::Rate;
pub use record::{
    Change, ControlRecord, LogEntry, ManualThrottle, ProbeReport, ProbeStale, ProbeState, Settings,
    Throttled,
};
pub use sizer::ChunkSizer;
#[cfg(feature = "testing")]
pub use store::scripts;
pub use store::{
    ControlKeys, ControlStore, LOG_CAP, Lead, MemoryControlStore, QUARANTINE_TTL,
    RedisControlStore, Repaired, SetOutcome,
};
pub use watcher::ControlWatcher;
