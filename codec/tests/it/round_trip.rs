//! Every encoding gives back exactly what it was given.

use std::sync::Arc;

use proptest::prelude::*;
use proptest::sample::subsequence;
use tranche_codec::{
    BinaryV2Options, CompletedRecord, WorkerDict, decode_binary_v2, decode_json, decode_text_v1,
    encode_binary_v2, encode_json, encode_text_v1, restore_binary_v2_header,
    strip_binary_v2_header,
};

const WORKERS: &[&str] = &[
    "worker1",
    "worker-2",
    "worker2",
    "w1",
    "",
    "naïve",
    "作业者",
    "emoji \u{1F600}",
    "a:b,c",
];

fn workers() -> WorkerDict {
    crate::dict(WORKERS)
}

/// Times in milliseconds: whole seconds (the seed), sub-second parts, and extremes.
fn millis() -> impl Strategy<Value = u64> {
    prop_oneof![
        (0..4_000_000_000u64).prop_map(|s| s * 1000),
        0..4_000_000_000_000u64,
        0..1000u64,
        any::<u64>(),
        Just(u64::MAX),
    ]
}

/// IDs: small, near u64::MAX, anything.
fn id() -> impl Strategy<Value = u64> {
    prop_oneof![
        0..10_000_000u64,
        (0..10_000u64).prop_map(|d| u64::MAX - d),
        any::<u64>()
    ]
}

fn worker() -> impl Strategy<Value = Arc<str>> {
    proptest::sample::select(WORKERS).prop_map(Arc::from)
}

fn any_record() -> impl Strategy<Value = CompletedRecord> {
    (any::<u64>(), id(), id(), worker(), millis(), millis()).prop_map(
        |(pid, min_id, max_id, worker, completed_at_ms, duration_ms)| CompletedRecord {
            pid,
            min_id,
            max_id,
            worker,
            completed_at_ms,
            duration_ms,
        },
    )
}

/// A batch: a batch id and size, a subset of its pids in shuffled order, ranges that are
/// uniform, uniform with exceptions, or arbitrary, and seconds or milliseconds throughout.
fn batch() -> impl Strategy<Value = (u64, u64, Vec<CompletedRecord>)> {
    let size = prop_oneof![1..=8u64, Just(100u64), 1..=1000u64];
    (size, any::<bool>())
        .prop_flat_map(|(batch_size, at_top)| {
            let last_batch = u64::MAX / batch_size;
            let batch_id = if at_top {
                (last_batch - 3..=last_batch).boxed()
            } else {
                (0..1_000_000u64).boxed()
            };
            let offsets: Vec<u64> = (0..batch_size).collect();
            let count = 0..=batch_size as usize;
            (Just(batch_size), batch_id, subsequence(offsets, count))
        })
        .prop_flat_map(|(batch_size, batch_id, offsets)| {
            let n = offsets.len();
            let first_pid = batch_id * batch_size;
            let ranges = prop_oneof![
                // A uniform plan, perhaps with some ranges replaced.
                (
                    id(),
                    1..=2000u64,
                    proptest::collection::vec(proptest::option::weighted(0.1, (id(), id())), n)
                )
                    .prop_map(|(base, size, odd)| (Some((base, size)), odd)),
                proptest::collection::vec(proptest::option::of((id(), id())), n)
                    .prop_map(|odd| (None, odd)),
            ];
            let whole_seconds = any::<bool>();
            let times = proptest::collection::vec((worker(), millis(), millis()), n);
            let order = Just(offsets.clone()).prop_shuffle();
            (
                Just(batch_size),
                Just(batch_id),
                Just(first_pid),
                order,
                ranges,
                whole_seconds,
                times,
            )
        })
        .prop_map(
            |(batch_size, batch_id, first_pid, offsets, (plan, odd), whole_seconds, times)| {
                let records = offsets
                    .iter()
                    .zip(odd)
                    .zip(times)
                    .map(|((&o, odd), (worker, completed, duration))| {
                        // Pids near u64::MAX can be cut short; keep only real ones.
                        let pid = first_pid.checked_add(o)?;
                        let (min_id, max_id) = match (odd, plan) {
                            (Some(pair), _) => pair,
                            (None, Some((base, size))) => {
                                let min = base.wrapping_add(pid.wrapping_mul(size));
                                (min, min.wrapping_add(size - 1))
                            }
                            (None, None) => (pid, pid),
                        };
                        let round = |t: u64| if whole_seconds { t / 1000 * 1000 } else { t };
                        Some(CompletedRecord {
                            pid,
                            min_id,
                            max_id,
                            worker,
                            completed_at_ms: round(completed),
                            duration_ms: round(duration),
                        })
                    })
                    .collect::<Option<Vec<_>>>()
                    .unwrap_or_default();
                (batch_id, batch_size, records)
            },
        )
}

/// Seed-shaped batches: a few workers completing partitions in turn.
fn chained_batch() -> impl Strategy<Value = Vec<CompletedRecord>> {
    (
        1..=8usize,
        proptest::collection::vec((0..1000u64, 0..3u64), 1..=100),
        any::<bool>(),
    )
        .prop_map(|(workers, steps, ms)| {
            let unit = if ms { 1 } else { 1000 };
            let mut free_at = vec![1_719_234_000_000u64; workers];
            steps
                .iter()
                .enumerate()
                .map(|(i, &(duration, pause))| {
                    let w = (0..workers).min_by_key(|&w| free_at[w]).unwrap_or(0);
                    let start = free_at[w] + pause * unit;
                    let duration_ms = (200_000 / unit + duration) * unit;
                    free_at[w] = start + duration_ms;
                    let pid = 1000 + i as u64;
                    CompletedRecord {
                        pid,
                        min_id: (pid - 1) * 1000 + 1,
                        max_id: pid * 1000,
                        worker: WORKERS[w].into(),
                        completed_at_ms: free_at[w],
                        duration_ms,
                    }
                })
                .collect()
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn json_round_trips(r in any_record()) {
        let text = encode_json(&r);
        prop_assert_eq!(decode_json(&text).ok(), Some(r));
    }

    #[test]
    fn text_v1_round_trips(records in proptest::collection::vec(any_record(), 0..20)) {
        let dict = workers();
        let text = encode_text_v1(&records, &dict).expect("every worker is in the dictionary");
        prop_assert_eq!(decode_text_v1(&text, &dict).ok(), Some(records));
    }

    #[test]
    fn binary_v2_round_trips(
        (batch_id, batch_size, records) in batch(),
        zstd in any::<bool>(),
        ranks in any::<bool>(),
    ) {
        let dict = workers();
        let mut options = BinaryV2Options::new(batch_size).expect("valid size");
        if zstd {
            options = options.with_zstd(3);
        }
        if ranks {
            options = options.with_ranks();
        }
        let bytes = encode_binary_v2(batch_id, &records, &dict, &options).expect("encodes");
        let decoded = decode_binary_v2(&bytes, &dict).expect("decodes");
        let mut sorted = records;
        sorted.sort_by_key(|r| r.pid);
        prop_assert_eq!(decoded.batch_id, batch_id);
        prop_assert_eq!(decoded.batch_size, batch_size);
        prop_assert_eq!(decoded.records, sorted);
        // Headless in a segment, restored to the very same bytes.
        let (id, size, headless) = strip_binary_v2_header(&bytes).expect("strips");
        prop_assert_eq!((id, size), (batch_id, batch_size));
        prop_assert!(headless.len() < bytes.len());
        prop_assert_eq!(restore_binary_v2_header(id, size, &headless).expect("restores"), bytes);
    }

    #[test]
    fn restoring_garbage_never_panics_and_fails_its_checksum(
        headless in proptest::collection::vec(any::<u8>(), 0..64),
        batch_id in 0..1_000_000u64,
    ) {
        let dict = workers();
        if let Ok(bytes) = restore_binary_v2_header(batch_id, 100, &headless) {
            prop_assert!(decode_binary_v2(&bytes, &dict).is_err());
        }
        prop_assert!(strip_binary_v2_header(&headless).is_none());
    }

    #[test]
    fn binary_v2_round_trips_chained_work(records in chained_batch()) {
        let dict = workers();
        let options = BinaryV2Options::new(1000).expect("valid size");
        let bytes = encode_binary_v2(1, &records, &dict, &options).expect("encodes");
        prop_assert_eq!(decode_binary_v2(&bytes, &dict).expect("decodes").records, records.clone());
        // Ranks are kept only when smaller, and decode to the same records.
        let ranked = encode_binary_v2(1, &records, &dict, &options.with_ranks()).expect("encodes");
        prop_assert!(ranked.len() <= bytes.len());
        prop_assert_eq!(decode_binary_v2(&ranked, &dict).expect("decodes").records, records);
    }

    #[test]
    fn worker_dict_round_trips(ids in proptest::collection::vec(".{0,12}", 0..40)) {
        let mut dict = WorkerDict::new();
        for id in &ids {
            dict.insert(id).expect("room");
        }
        prop_assert_eq!(WorkerDict::from_bytes(&dict.to_bytes()).ok(), Some(dict.clone()));
        let json = serde_json::to_string(&dict).expect("serializes");
        prop_assert_eq!(serde_json::from_str::<WorkerDict>(&json).ok(), Some(dict.clone()));
        for id in &ids {
            let code = dict.code_of(id).expect("inserted");
            prop_assert_eq!(dict.id_of_code(code), Some(id.as_str()));
        }
    }
}

/// Eight workers in turn over a batch of 100, durations of 200 to 400 s (the archive
/// bench's set S): ranks cost a few exceptions where positions cost three bits a
/// record.
#[test]
fn ranks_shrink_seed_shaped_batches() {
    let dict = workers();
    let mut free_at = [1_719_234_000_000u64; 8];
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let records: Vec<CompletedRecord> = (4900..5000u64)
        .map(|pid| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let w = (0..8).min_by_key(|&w| free_at[w]).unwrap_or(0);
            let duration_ms = (200 + seed % 201) * 1000;
            free_at[w] += duration_ms;
            CompletedRecord {
                pid,
                min_id: (pid - 1) * 1000 + 1,
                max_id: pid * 1000,
                worker: WORKERS[w].into(),
                completed_at_ms: free_at[w],
                duration_ms,
            }
        })
        .collect();
    let options = BinaryV2Options::new(100).unwrap();
    let plain = encode_binary_v2(49, &records, &dict, &options).unwrap();
    let ranked = encode_binary_v2(49, &records, &dict, &options.with_ranks()).unwrap();
    assert!(
        ranked.len() + 25 <= plain.len(),
        "{} vs {}",
        ranked.len(),
        plain.len()
    );
    assert_eq!(decode_binary_v2(&ranked, &dict).unwrap().records, records);
    // The flag is bit 2 of the flags byte, which decoders before it refuse.
    assert_eq!((plain[5] & 4, ranked[5] & 4), (0, 4));
}
