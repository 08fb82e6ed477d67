//! Bad input gives its specific error, never a panic and never a wrong record.
//!
//! Each table row is an input and the `Debug` of what decoding it returns.

use tranche_codec::{
    BinaryV2Options, WorkerDict, decode_binary_v2, decode_json, decode_text_v1, encode_binary_v2,
};

use crate::{dict, record};

fn check_binary(input: &[u8], dict: &WorkerDict, expect: &str) {
    let got = decode_binary_v2(input, dict).map(|batch| batch.records.len());
    assert_eq!(format!("{got:?}"), expect, "input {input:02x?}");
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A binary v2 value from its documented parts, with a correct checksum, so the
/// decoder's checks behind the checksum can be reached.
fn sealed(
    flags: u8,
    batch_id: u64,
    batch_size: u64,
    count: u64,
    raw_len: Option<u64>,
    payload: &[u8],
) -> Vec<u8> {
    let mut out = b"TRCB\x02".to_vec();
    out.push(flags);
    for v in [batch_id, batch_size, count].into_iter().chain(raw_len) {
        varint(&mut out, v);
    }
    varint(&mut out, payload.len() as u64);
    out.extend_from_slice(payload);
    out.extend_from_slice(&[0; 4]);
    reseal(out)
}

/// Recomputes the trailing CRC32 after an edit.
fn reseal(mut bytes: Vec<u8>) -> Vec<u8> {
    let body = bytes.len().saturating_sub(4);
    bytes.truncate(body);
    let crc = crc32fast::hash(&bytes);
    bytes.extend_from_slice(&crc.to_le_bytes());
    bytes
}

/// A payload of one record, pid offset 0, worker index 0, with `column` spliced in as
/// the duration column.
fn one_record_payload(duration_column: &[u8]) -> Vec<u8> {
    let mut p = vec![
        2, 0, 0, 0, // pids: gaps column [0] (base 0, width 0, no exceptions)
        0, 0, 0, 0, // ranges: model a=0 span=0, no exceptions
        1, 0, 0, 0, 0, // workers: palette [0], positions column [0]
    ];
    p.extend_from_slice(duration_column);
    p.extend_from_slice(&[0, 0, 0]); // chained starts: an empty column
    p.extend_from_slice(&[0, 0, 0]); // first starts: [0]
    p
}

#[test]
fn binary_v2_bad_inputs() {
    let workers = dict(&["worker1", "worker2"]);
    let records = vec![
        record(1003, 1, 1000, "worker1", 1_719_234_405_123, 295_000),
        record(1001, 1001, 2000, "worker2", 1_719_234_410_000, 300_000),
        record(1002, 2001, 2500, "worker1", 1_719_234_700_000, 294_877),
    ];
    let options = BinaryV2Options::new(1000).expect("valid size");
    let good = encode_binary_v2(1, &records, &workers, &options).expect("encodes");
    let check = |input: &[u8], expect: &str| check_binary(input, &workers, expect);
    let edit = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut bytes = good.clone();
        f(&mut bytes);
        bytes
    };
    let last = good.len() - 1;

    check(&good, "Ok(3)");
    check(b"", "Err(Truncated)");
    check(b"TRC", "Err(Truncated)");
    check(
        b"garbage, not a batch at all",
        "Err(BadMagic([103, 97, 114, 98]))",
    );
    check(&edit(&|b| b[0] = b'X'), "Err(BadMagic([88, 82, 67, 66]))");
    check(&edit(&|b| b[4] = 3), "Err(UnsupportedVersion(3))");
    check(&edit(&|b| b[5] |= 0x80), "Err(UnknownFlags(128))");
    check(&good[..7], "Err(Truncated)");
    check(&good[..last], "Err(Truncated)");
    check(&good[..last - 4], "Err(Truncated)");
    check(&[good.as_slice(), &[0]].concat(), "Err(TrailingBytes(1))");
    // A flipped bit anywhere in the payload or the checksum is caught by the checksum.
    for at in [12, last - 6, last] {
        let got = decode_binary_v2(&edit(&|b| b[at] ^= 0x10), &workers);
        assert!(
            matches!(got, Err(tranche_codec::Error::ChecksumMismatch { .. })),
            "byte {at}: {got:?}"
        );
    }
    // The count is wrong, and the checksum recomputed to match the lie.
    // Header: magic, version, flags, batch id 1 (one byte), batch size 1000 (two), count.
    assert_eq!(good[9], 3);
    // These three pids are stored as gaps, which the wrong count misreads.
    check(
        &reseal(edit(&|b| b[9] = 4)),
        "Err(Corrupt(\"column exception index\"))",
    );
    check(
        &reseal(edit(&|b| b[9] = 2)),
        "Err(Corrupt(\"range exception index\"))",
    );
    // Ten pids of a batch of 16 are stored as a bitmap, which holds its own count.
    let dense: Vec<_> = (0..10)
        .map(|i| record(16 + i, i, i, "worker1", 1000, 1000))
        .collect();
    let dense = encode_binary_v2(
        1,
        &dense,
        &workers,
        &BinaryV2Options::new(16).expect("valid size"),
    )
    .expect("encodes");
    assert_eq!((dense[7], dense[8]), (16, 10));
    let mut wrong = dense.clone();
    wrong[8] = 11;
    check(
        &reseal(wrong),
        "Err(CountMismatch { declared: 11, found: 10 })",
    );
    // The dictionary does not hold worker index 1.
    check_binary(&good, &dict(&["worker1"]), "Err(UnknownWorkerIndex(1))");

    // Hand-made values reaching each check behind the checksum.
    let ok_payload = one_record_payload(&[7, 0, 0]);
    check(&sealed(0, 0, 10, 1, None, &ok_payload), "Ok(1)");
    check(
        &sealed(0, 0, 0, 0, None, &ok_payload),
        "Err(InvalidBatchSize(0))",
    );
    check(
        &sealed(0, 0, 65_537, 1, None, &ok_payload),
        "Err(InvalidBatchSize(65537))",
    );
    check(
        &sealed(0, 0, 10, 11, None, &ok_payload),
        "Err(CountExceedsBatch { count: 11, batch_size: 10 })",
    );
    check(
        &sealed(0, u64::MAX, 10, 1, None, &ok_payload),
        "Err(BatchIdOutOfRange { batch_id: 18446744073709551615, batch_size: 10 })",
    );
    check(&sealed(0, 0, 10, 1, None, &[]), "Err(Truncated)");
    check(
        &sealed(0, 0, 10, 1, None, &[ok_payload.as_slice(), &[0]].concat()),
        "Err(TrailingBytes(1))",
    );
    check(
        &sealed(0, 0, 10, 1, None, &one_record_payload(&[0, 65, 0])),
        "Err(InvalidBitWidth(65))",
    );
    check(
        &sealed(0, 0, 10, 1, None, &one_record_payload(&[0x80, 0x00, 0, 0])),
        "Err(VarintOverlong)",
    );
    check(
        &sealed(
            0,
            0,
            10,
            1,
            None,
            &one_record_payload(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]),
        ),
        "Err(VarintOverflow)",
    );
    // Width 0 with an exception at index 3 of a one-value column.
    check(
        &sealed(0, 0, 10, 1, None, &one_record_payload(&[0, 0, 1, 3, 1])),
        "Err(Corrupt(\"column exception index\"))",
    );
    // Seconds flag on a value of u64::MAX seconds.
    let huge = [&[0xff; 9][..], &[0x01, 0, 0]].concat();
    check(
        &sealed(2, 0, 10, 1, None, &one_record_payload(&huge)),
        "Err(Corrupt(\"time beyond u64::MAX milliseconds\"))",
    );
    let mut bad_mode = ok_payload.clone();
    bad_mode[0] = 9;
    check(
        &sealed(0, 0, 10, 1, None, &bad_mode),
        "Err(Corrupt(\"pid section mode\"))",
    );
    // A full-batch pid section for a batch of 10 that declares one record.
    let mut full = ok_payload.clone();
    full.splice(0..4, [0]);
    check(
        &sealed(0, 0, 10, 1, None, &full),
        "Err(CountMismatch { declared: 1, found: 10 })",
    );
    // A bitmap with a bit beyond the batch size.
    let mut bitmap = ok_payload.clone();
    bitmap.splice(0..4, [1, 0x00, 0x04]);
    check(
        &sealed(0, 0, 10, 1, None, &bitmap),
        "Err(Corrupt(\"pid bitmap bit beyond the batch\"))",
    );
    // A worker position beyond the palette.
    let mut position = ok_payload.clone();
    position[10] = 1;
    check(
        &sealed(0, 0, 10, 1, None, &position),
        "Err(Corrupt(\"worker palette position\"))",
    );
    // zstd flag over bytes that are not zstd.
    check(
        &sealed(1, 0, 10, 1, Some(19), &ok_payload),
        "Err(Decompress(\"Unknown frame descriptor\"))",
    );
    check(
        &sealed(1, 0, 10, 1, Some(1 << 40), &ok_payload),
        "Err(Corrupt(\"zstd raw length\"))",
    );
}

#[test]
fn json_bad_inputs() {
    let check = |input: &str, expect: &str| {
        let got = match decode_json(input) {
            Ok(r) => format!("Ok({})", r.pid),
            // serde_json's messages are its own; the variant is what the caller sees.
            Err(tranche_codec::Error::Json(e)) => format!("Err(Json({:?}))", e.classify()),
            Err(e) => format!("Err({e:?})"),
        };
        assert_eq!(got, expect, "input {input}");
    };
    let seed = r#"{"pid":4970,"min_id":4969001,"max_id":4970000,"worker_id":"worker1","completed_at":1719234405,"duration":295}"#;
    check(seed, "Ok(4970)");
    check(
        r#"{"duration":295,"completed_at":1719234405,"worker_id":"worker1","max_id":4970000,"min_id":4969001,"pid":4970}"#,
        "Ok(4970)",
    );
    check("", "Err(Json(Eof))");
    check(&seed[..40], "Err(Json(Eof))");
    check("garbage", "Err(Json(Syntax))");
    check(&seed.replace("\"pid\":4970,", ""), "Err(Json(Data))");
    check(&seed.replace("}", ",\"extra\":1}"), "Err(Json(Data))");
    check(&seed.replace("}", ",\"pid\":1}"), "Err(Json(Data))");
    check(&seed.replace("4970,", "-4970,"), "Err(Json(Data))");
    check(
        &seed.replace("4970,", "18446744073709551616,"),
        "Err(Json(Data))",
    );
    check(
        &seed.replace("1719234405", "1719234405.1234"),
        "Err(InexactTime { field: \"completed_at\", text: \"1719234405.1234\" })",
    );
    check(
        &seed.replace("295", "2.95e-2"),
        "Err(InexactTime { field: \"duration\", text: \"2.95e-2\" })",
    );
    check(
        &seed.replace("295", "-295"),
        "Err(InvalidTime { field: \"duration\", text: \"-295\" })",
    );
    check(
        &seed.replace("295", "\"295\""),
        "Err(InvalidTime { field: \"duration\", text: \"\\\"295\\\"\" })",
    );
    check(
        &seed.replace("1719234405", "1e17"),
        "Err(InvalidTime { field: \"completed_at\", text: \"1e17\" })",
    );
    check(&format!("{seed} {seed}"), "Err(Json(Syntax))");
}

#[test]
fn text_v1_bad_inputs() {
    let workers = dict(&["worker1", "worker2"]);
    let check = |input: &str, expect: &str| {
        let got = decode_text_v1(input, &workers).map(|records| records.len());
        assert_eq!(format!("{got:?}"), expect, "input {input}");
    };
    let seed = "P4970:4969001-4970000:w1:1719234405:295";
    check(seed, "Ok(1)");
    check("", "Ok(0)");
    check(
        ",",
        "Err(TextSyntax { record: 0, expected: \"'P' and a pid\" })",
    );
    check(
        &format!("{seed},"),
        "Err(TextSyntax { record: 1, expected: \"'P' and a pid\" })",
    );
    check(
        "garbage",
        "Err(TextSyntax { record: 0, expected: \"'P' and a pid\" })",
    );
    check(
        "P4970:4969001-4970000:w1:1719234405",
        "Err(TextSyntax { record: 0, expected: \"duration\" })",
    );
    check(
        &format!("{seed}:1"),
        "Err(TextSyntax { record: 0, expected: \"end of record after duration\" })",
    );
    check(
        "P4970:4969001:w1:1719234405:295",
        "Err(TextSyntax { record: 0, expected: \"min_id-max_id\" })",
    );
    check(
        "P04970:4969001-4970000:w1:1719234405:295",
        "Err(TextNumber { record: 0, field: \"pid\", text: \"04970\" })",
    );
    check(
        "P4970:+4969001-4970000:w1:1719234405:295",
        "Err(TextNumber { record: 0, field: \"min_id\", text: \"+4969001\" })",
    );
    check(
        "P4970:4969001-18446744073709551616:w1:1:2",
        "Err(TextNumber { record: 0, field: \"max_id\", text: \"18446744073709551616\" })",
    );
    check(
        "P4970:4969001-4970000:w9:1719234405:295",
        "Err(UnknownWorkerCode(\"w9\"))",
    );
    check(
        "P4970:4969001-4970000:worker1:1719234405:295",
        "Err(UnknownWorkerCode(\"worker1\"))",
    );
    check(
        "P4970:4969001-4970000:w1:1719234405.1234:295",
        "Err(InexactTime { field: \"completed_at\", text: \"1719234405.1234\" })",
    );
    check(
        "P4970:4969001-4970000:w1:1719234405.10:295",
        "Err(InvalidTime { field: \"completed_at\", text: \"1719234405.10\" })",
    );
    check(
        "P4970:4969001-4970000:w1:1719234405: 295",
        "Err(InvalidTime { field: \"duration\", text: \" 295\" })",
    );
}

#[test]
fn worker_dict_bad_inputs() {
    let good = dict(&["worker1", "ワーカー"]).to_bytes();
    let check = |input: &[u8], expect: &str| {
        let got = WorkerDict::from_bytes(input).map(|d| d.len());
        assert_eq!(format!("{got:?}"), expect, "input {input:02x?}");
    };
    check(&good, "Ok(2)");
    check(b"", "Err(Truncated)");
    check(b"garbage", "Err(BadMagic([103, 97, 114, 98]))");
    check(&[&good[..4], &[9]].concat(), "Err(UnsupportedVersion(9))");
    // The checksum ends the value, so a cut or flipped byte reads as a checksum mismatch.
    let mut flipped = good.clone();
    flipped[8] ^= 1;
    for input in [&good[..good.len() - 1], &flipped] {
        let got = WorkerDict::from_bytes(input);
        assert!(
            matches!(got, Err(tranche_codec::Error::ChecksumMismatch { .. })),
            "{got:?}"
        );
    }
    check(&reseal(good[..good.len() - 1].to_vec()), "Err(Truncated)");
    check(
        &reseal([good.as_slice(), &[0]].concat()),
        "Err(TrailingBytes(1))",
    );
    check(
        &reseal(b"TRWD\x01\x02\x00\x02w1\x00\x02w2....".to_vec()),
        "Err(DuplicateWorkerId(\"\"))",
    );
    check(
        &reseal(b"TRWD\x01\x01\x00\x02W1....".to_vec()),
        "Err(InvalidWorkerCode(\"W1\"))",
    );
    check(
        &reseal(b"TRWD\x01\x01\x01\xff\x02w1....".to_vec()),
        "Err(NotUtf8)",
    );
    check(
        &reseal(b"TRWD\x01\x80\x00....".to_vec()),
        "Err(VarintOverlong)",
    );
}
