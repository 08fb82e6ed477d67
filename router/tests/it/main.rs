//! Integration tests of tranche-router, in one binary so they link once.

use tranche_testkit as support;

mod round_trips;
mod router;
