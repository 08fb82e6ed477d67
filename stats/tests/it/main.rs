//! Integration tests of tranche-stats, in one binary so they link once.

use tranche_testkit as support;

mod behaviour;
mod check;
mod damage;
mod refusal;
mod scripts;
