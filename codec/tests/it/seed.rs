//! The seed's own examples decode to exactly the seed's values and re-encode to themselves.

use tranche_codec::{
    BinaryV2Options, decode_binary_v2, decode_json, decode_text_v1, encode_binary_v2, encode_json,
    encode_text_v1,
};

use crate::{dict, record};

const SEED_JSON: &str = r#"{"pid":4970,"min_id":4969001,"max_id":4970000,"worker_id":"worker1","completed_at":1719234405,"duration":295}"#;
const SEED_TEXT_ONE: &str = "P4970:4969001-4970000:w1:1719234405:295";
const SEED_TEXT_BATCH: &str =
    "P4970:4969001-4970000:w1:1719234405:295,P4971:4970001-4971000:w2:1719234410:300";

#[test]
fn seed_strings_decode_to_the_seed_values() {
    let workers = dict(&["worker1", "worker2"]);
    let p4970 = record(
        4970,
        4_969_001,
        4_970_000,
        "worker1",
        1_719_234_405_000,
        295_000,
    );
    let p4971 = record(
        4971,
        4_970_001,
        4_971_000,
        "worker2",
        1_719_234_410_000,
        300_000,
    );

    assert_eq!(decode_json(SEED_JSON).ok().as_ref(), Some(&p4970));
    assert_eq!(encode_json(&p4970), SEED_JSON);

    assert_eq!(
        decode_text_v1(SEED_TEXT_ONE, &workers).ok(),
        Some(vec![p4970.clone()])
    );
    let batch = vec![p4970, p4971];
    assert_eq!(
        decode_text_v1(SEED_TEXT_BATCH, &workers).ok().as_ref(),
        Some(&batch)
    );
    assert_eq!(
        encode_text_v1(&batch, &workers).ok().as_deref(),
        Some(SEED_TEXT_BATCH)
    );

    // The same two records sealed in their batch of 100 (batch 49).
    let options = BinaryV2Options::default();
    let sealed = encode_binary_v2(49, &batch, &workers, &options).expect("encodes");
    let decoded = decode_binary_v2(&sealed, &workers).expect("decodes");
    assert_eq!((decoded.batch_id, decoded.batch_size), (49, 100));
    assert_eq!(decoded.records, batch);
    assert!(
        sealed.len() < SEED_TEXT_BATCH.len(),
        "{} bytes",
        sealed.len()
    );
}

#[test]
fn seed_short_codes_come_from_the_seed_worker_names() {
    let workers = dict(&["worker1", "worker-2", "worker3"]);
    let codes: Vec<_> = workers.entries().iter().map(|e| e.code.as_str()).collect();
    assert_eq!(codes, ["w1", "w2", "w3"]);
}
