//! Integration tests of tranche-active-store, in one binary so they link once.

use tranche_testkit as support;
use tranche_testkit::pki;

mod behaviour;
mod bitmap;
mod bulk;
mod concurrency;
mod connection;
mod fail_policy;
mod memory;
mod rollback;
mod runs;
mod scripts;
mod split;
mod state;
