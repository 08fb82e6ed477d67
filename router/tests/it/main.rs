//! Integration tests of tranche-router, in one binary so they link once.

#[path = "../../../active-store/tests/support/mod.rs"]
mod support;

mod round_trips;
mod router;
