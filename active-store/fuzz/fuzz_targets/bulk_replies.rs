//! The RESP2 reply reader of the bulk reads (`redis_store/bulk.rs`) never panics,
//! whatever a server sends and however the bytes are cut into reads; the replies it
//! accepts lie within its buffer.
//!
//! The input's first byte is the size of the pieces the rest arrives in, its second how
//! many replies are awaited (see `tranche_active_store::fuzz_replies`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    tranche_active_store::fuzz_replies(data);
});
