//! Integration tests of tranche-control, in one binary so they link once.

use tranche_testkit as support;

mod behaviour;
mod checked;
mod pacer;
mod probes;
mod scripts;
