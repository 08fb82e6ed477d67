//! Integration tests of tranche-worker, in one binary so they link once. The modules
//! that drive the `tranche` binary (and its helpers in `common`) need the binary, which
//! only the `cli` feature builds; `examples` and `runner` use the library alone.

use tranche_testkit as support;
#[cfg(feature = "cli")]
use tranche_testkit::pki;

#[cfg(feature = "cli")]
mod common;

#[cfg(feature = "cli")]
mod browser;
mod check;
#[cfg(feature = "cli")]
mod cli;
#[cfg(feature = "cli")]
mod cluster;
#[cfg(feature = "cli")]
mod control;
#[cfg(feature = "cli")]
mod control_failsafe;
#[cfg(feature = "cli")]
mod deploy;
#[cfg(feature = "cli")]
mod embedded;
#[cfg(feature = "cli")]
mod escape;
mod examples;
#[cfg(feature = "cli")]
mod fence;
#[cfg(feature = "cli")]
mod fleet;
#[cfg(feature = "cli")]
mod json;
mod logged;
#[cfg(feature = "cli")]
mod mariadb;
#[cfg(feature = "otel")]
mod otel;
#[cfg(feature = "cli")]
mod persistent;
#[cfg(feature = "cli")]
mod pg_tls;
#[cfg(feature = "cli")]
mod postgres;
#[cfg(feature = "cli")]
mod repair;
mod runner;
#[cfg(feature = "cli")]
mod serve;
#[cfg(feature = "cli")]
mod signals;
mod split;
#[cfg(feature = "cli")]
mod sql;
#[cfg(feature = "cli")]
mod sql_cli;
#[cfg(feature = "cli")]
mod sql_probe;
mod store_error;
mod tidy;
