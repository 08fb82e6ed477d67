//! Integration tests of tranche-archive-store, in one binary so they link once.

use tranche_testkit as support;

mod behaviour;
mod bitmap;
mod end_to_end;
mod format;
mod scripts;
mod state;
