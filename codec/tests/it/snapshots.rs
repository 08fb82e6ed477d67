//! The exact JSON and text v1 output, pinned by insta snapshots.

use insta::assert_snapshot;
use tranche_codec::{encode_json, encode_text_v1};

use crate::{dict, record};

fn samples() -> Vec<tranche_codec::CompletedRecord> {
    vec![
        // The seed's record: whole seconds print as integers.
        record(
            4970,
            4_969_001,
            4_970_000,
            "worker1",
            1_719_234_405_000,
            295_000,
        ),
        // Millisecond parts print as up to three decimals, trailing zeros trimmed.
        record(
            4971,
            4_970_001,
            4_971_000,
            "worker-2",
            1_719_234_405_120,
            295_005,
        ),
        record(
            4972,
            4_971_001,
            4_972_000,
            "worker3",
            1_719_234_405_100,
            999,
        ),
        // A non-uniform range, a worker id JSON must escape, and one it need not.
        record(
            4973,
            4_972_001,
            4_972_500,
            "naïve \"w\" \u{1F600}\n",
            1_719_234_406_000,
            0,
        ),
        record(4974, 4_972_501, 4_974_000, "作业者-7", 0, 1),
        // The extremes.
        record(
            u64::MAX,
            u64::MAX - 999,
            u64::MAX,
            "worker1",
            u64::MAX,
            u64::MAX,
        ),
    ]
}

#[test]
fn json_output() {
    let lines: Vec<String> = samples().iter().map(encode_json).collect();
    assert_snapshot!("json", lines.join("\n"));
}

#[test]
fn text_v1_output() {
    let records = samples();
    let ids: Vec<&str> = records.iter().map(|r| &*r.worker).collect();
    let text = encode_text_v1(&records, &dict(&ids)).expect("every worker is in the dictionary");
    // One record per line for review; the stored form is joined by commas alone.
    assert_snapshot!("text_v1", text.replace(',', ",\n"));
}
