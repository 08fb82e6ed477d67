//! Integration tests of tranche-archive-store, in one binary so they link once.

#[path = "../../../active-store/tests/support/mod.rs"]
mod support;

mod behaviour;
mod end_to_end;
mod scripts;
mod state;
