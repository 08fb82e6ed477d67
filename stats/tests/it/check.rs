//! `diff` reports every changed field with a readable path.

use std::sync::Arc;

use tranche_codec::CompletedRecord;
use tranche_stats::{Difference, Stats, diff};

fn rec(pid: u64, worker: &str, at: u64, dur: u64) -> CompletedRecord {
    CompletedRecord {
        pid,
        min_id: (pid - 1) * 1000 + 1,
        max_id: pid * 1000,
        worker: Arc::from(worker),
        completed_at_ms: at,
        duration_ms: dur,
    }
}

fn base() -> Stats {
    Stats::from_records(&[
        rec(4970, "worker1", 1_719_234_405_000, 295_000),
        rec(4971, "worker1", 1_719_234_500_000, 280_000),
        rec(4972, "worker2", 1_719_238_000_000, 310_000),
    ])
}

fn lines(d: &[Difference]) -> Vec<String> {
    d.iter().map(ToString::to_string).collect()
}

#[test]
fn equal_stats_have_no_difference() {
    assert!(diff(&base(), &base()).is_empty());
    let mut later = base();
    later.global_stats.last_updated += 60.0;
    assert!(
        diff(&base(), &later).is_empty(),
        "last_updated is not compared"
    );
}

#[test]
fn every_changed_field_is_reported() {
    let mut found = base();
    found
        .worker_stats
        .get_mut("worker1")
        .unwrap()
        .completed_count = 3;
    found.global_stats.total_processed_data = 2000;
    let r = found.range_stats.get_mut("4900000_5000000").unwrap();
    r.data_range.max = 4_971_999;
    r.worker_distribution.get_mut("worker2").unwrap().count = 2;
    found
        .time_series_stats
        .get_mut("2024-06-24")
        .unwrap()
        .hourly_completion[14] = 0;
    found.worker_stats.remove("worker2");
    assert_eq!(
        lines(&diff(&base(), &found)),
        [
            "global_stats.total_processed_data: expected 3000, found 2000",
            "range_stats.4900000_5000000.data_range.max: expected 4972000, found 4971999",
            "range_stats.4900000_5000000.worker_distribution.worker2.count: expected 1, found 2",
            "time_series_stats.2024-06-24.hourly_completion[14]: expected 1, found 0",
            "worker_stats.worker1.completed_count: expected 2, found 3",
            "worker_stats.worker2: expected {\"avg_duration\":310.0,\"completed_count\":1,\"p50\":307.199,\"p95\":307.199,\"p99\":307.199,\"total_data\":1000}, found nothing",
        ]
    );
}

#[test]
fn entries_only_on_one_side_are_reported_once() {
    let empty = Stats::default();
    let d = diff(&empty, &base());
    let paths: Vec<&str> = d.iter().map(|d| d.path.as_str()).collect();
    assert!(paths.contains(&"worker_stats.worker1"));
    assert!(paths.contains(&"range_stats.4900000_5000000"));
    assert!(paths.contains(&"time_series_stats.2024-06-24"));
    assert!(paths.contains(&"global_stats.total_completed"));
    let one = d.iter().find(|d| d.path == "worker_stats.worker1").unwrap();
    assert_eq!(one.expected, None);
    assert!(one.found.is_some());
}

proptest::proptest! {
    /// `check` adds records to per-shard deltas page by page; merging the deltas must
    /// give exactly the statistics of the records themselves, however they are split.
    #[test]
    fn deltas_merge_to_the_statistics_of_their_records(
        recs in proptest::collection::vec((1u64..5_000, 0usize..3, 0u64..200_000_000, 0u64..900_000), 0..200),
        parts in 1usize..6,
    ) {
        let records: Vec<CompletedRecord> = recs
            .iter()
            .map(|&(pid, w, at, dur)| rec(pid, ["w0", "w1", "w2"][w], 1_719_000_000_000 + at, dur))
            .collect();
        let mut deltas = vec![tranche_stats::StatsDelta::default(); parts];
        for (i, r) in records.iter().enumerate() {
            deltas[(r.pid as usize + i) % parts].add(r);
        }
        let want = Stats::from_records(&records);
        let got = Stats::from_deltas(&deltas);
        proptest::prop_assert!(diff(&want, &got).is_empty(), "{:?}", diff(&want, &got));
        proptest::prop_assert_eq!(want.global_stats.last_updated, got.global_stats.last_updated);
    }
}
