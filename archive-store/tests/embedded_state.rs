//! The embedded run's state file (`worker-bin/src/state.rs`), compiled and tested here
//! against the three memory backends until the `worker-bin` crate builds it itself:
//! this crate is the one that already sees all three (the active store as a
//! dev-dependency).

#[allow(dead_code, unreachable_pub)]
#[path = "../../worker-bin/src/state.rs"]
mod state;
