//! `decode_text_v1` never panics, and accepts only the canonical spelling: whatever it
//! decodes re-encodes to the very same text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tranche_codec::{WorkerDict, decode_text_v1, encode_text_v1};

fn dict() -> WorkerDict {
    let mut dict = WorkerDict::new();
    for id in ["worker1", "worker2", "worker-3", "alice", "作业者"] {
        let _ = dict.insert(id);
    }
    dict
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let dict = dict();
    if let Ok(records) = decode_text_v1(text, &dict) {
        let again = encode_text_v1(&records, &dict).expect("decoded workers are in the dictionary");
        assert_eq!(again, text);
    }
});
