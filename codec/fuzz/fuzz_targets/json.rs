//! `decode_json` never panics, and what it accepts survives a re-encode exactly.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tranche_codec::{decode_json, encode_json};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(record) = decode_json(text) {
        let again = encode_json(&record);
        assert_eq!(decode_json(&again).ok(), Some(record), "{again}");
    }
});
