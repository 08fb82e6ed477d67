//! Integration tests of tranche-stats, in one binary so they link once.

#[path = "../../../active-store/tests/support/mod.rs"]
mod support;

mod behaviour;
mod check;
mod damage;
mod scripts;
