//! Integration tests of tranche-window, in one binary so they link once.

mod common;

mod concurrent;
mod model;
mod resume;
mod waiting;
