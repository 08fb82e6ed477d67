//! `decode_binary_v2` never panics, and a batch it accepts re-seals to the same records.
//!
//! The input's last four bytes are replaced by the CRC32 of the rest before decoding:
//! random bytes almost never carry a valid checksum, and without this the fuzzer
//! would spend its time on the first check instead of the payload parser behind it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tranche_codec::{BinaryV2Options, WorkerDict, decode_binary_v2, encode_binary_v2};

fn dict() -> WorkerDict {
    let mut dict = WorkerDict::new();
    for id in ["worker1", "worker2", "worker-3", "alice", "作业者"] {
        let _ = dict.insert(id);
    }
    dict
}

fuzz_target!(|data: &[u8]| {
    let mut bytes = data.to_vec();
    if let Some(body_len) = bytes.len().checked_sub(4) {
        let crc = crc32fast::hash(&bytes[..body_len]);
        bytes[body_len..].copy_from_slice(&crc.to_le_bytes());
    }
    let dict = dict();
    if let Ok(batch) = decode_binary_v2(&bytes, &dict) {
        let options = BinaryV2Options::new(batch.batch_size).expect("decoded batch sizes are valid");
        let again = encode_binary_v2(batch.batch_id, &batch.records, &dict, &options)
            .expect("a decoded batch is a valid batch");
        let decoded = decode_binary_v2(&again, &dict).expect("a fresh encoding decodes");
        assert_eq!(decoded, batch);
    }
});
