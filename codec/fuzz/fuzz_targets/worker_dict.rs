//! `WorkerDict::from_bytes` never panics, and accepts only the canonical form: whatever
//! it reads writes back byte for byte. As for binary v2, the trailing CRC32 is fixed up
//! first so the fuzzer reaches the entries.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tranche_codec::WorkerDict;

fuzz_target!(|data: &[u8]| {
    let mut bytes = data.to_vec();
    if let Some(body_len) = bytes.len().checked_sub(4) {
        let crc = crc32fast::hash(&bytes[..body_len]);
        bytes[body_len..].copy_from_slice(&crc.to_le_bytes());
    }
    if let Ok(dict) = WorkerDict::from_bytes(&bytes) {
        assert_eq!(dict.to_bytes(), bytes);
        let mut copy = WorkerDict::new();
        for entry in dict.entries() {
            // Re-inserting gives the same indices (codes may differ: they were imported).
            assert_eq!(copy.insert(&entry.id).ok(), dict.index_of(&entry.id));
        }
    }
});
