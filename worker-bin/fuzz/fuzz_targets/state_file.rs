//! The embedded state file's loader (`worker-bin/src/state.rs`) never panics: whatever
//! the file holds, loading it and restoring the stores from it answer or err.
//!
//! With the input's first byte odd the rest is given a valid header, CRC32 included, so
//! the fuzzer works on the payload (bincode, then the stores' own checks); with it even
//! the rest is the whole file (see `tranche_worker::fuzz_state_file`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    tranche_worker::fuzz_state_file(data);
});
