//! Plans: validation, generators, explicit ranges, the bitmap limit, adoption of
//! exported plans.

use super::*;

pub(super) async fn plan_validation(h: Harness) {
    let s = &h.store;
    for bad in [
        uniform(10, 9, 1),
        uniform(1, 10, 0),
        Plan::Ranges(vec![]),
        Plan::Ranges(vec![1..=5, 5..=9]),
    ] {
        let err = s.plan(&bad).await.unwrap_err();
        assert!(matches!(err, Error::InvalidPlan(_)), "{bad:?}: {err}");
    }
    assert!(
        s.plans().await.unwrap().is_empty(),
        "a rejected plan writes nothing"
    );
    assert_eq!(s.counts().await.unwrap().outstanding(), 0);

    let first = s.plan(&uniform(1, 5_000_000, 1000)).await.unwrap();
    assert!(first.created);
    assert_eq!(
        (
            first.entries[0].plan.first_pid(),
            first.entries[0].plan.last_pid()
        ),
        (1, 5000)
    );
    assert_eq!(
        first.entries[0].plan.range_of(4970),
        Some(4_969_001..=4_970_000),
        "the seed's numbering"
    );

    let again = s.plan(&uniform(1, 5_000_000, 1000)).await.unwrap();
    assert!(!again.created, "the same plan twice is a no-op");
    assert_eq!(again.entries, first.entries);

    for overlap in [
        uniform(5_000_000, 6_000_000, 1000),
        uniform(1, 5_000_000, 500),
        Plan::Ranges(vec![10..=20]),
    ] {
        let err = s.plan(&overlap).await.unwrap_err();
        assert!(
            matches!(err, Error::InvalidPlan(ref m) if m.contains("overlap")),
            "{overlap:?}: {err}"
        );
    }
    assert_eq!(
        s.plans().await.unwrap().len(),
        1,
        "rejected plans left the registry alone"
    );

    let second = s.plan(&uniform(5_000_001, 5_000_500, 100)).await.unwrap();
    assert_eq!(
        second.entries[0].plan.first_pid(),
        5001,
        "pids continue after the last plan"
    );
    assert_eq!(s.counts().await.unwrap().unissued, 5005);
}

pub(super) async fn plans_are_generators(h: Harness) {
    let s = &h.store;
    s.plan(&uniform(1, 5_000_000_000, 1000)).await.unwrap();
    let counts = s.counts().await.unwrap();
    assert_eq!(counts.unissued, 5_000_000);
    assert_eq!(
        s.all_active().await.unwrap().partitions.len(),
        0,
        "nothing materialised"
    );
    let leases = s.claim("w1", 3).await.unwrap();
    assert_eq!(leases.len(), 3);
    assert_eq!(s.all_active().await.unwrap().partitions.len(), 3);
    assert_eq!(s.counts().await.unwrap().unissued, 5_000_000 - 3);
}

pub(super) async fn explicit_ranges(h: Harness) {
    let s = &h.store;
    let ranges = vec![1..=10, 11..=500, 501..=501, 10_000..=u64::MAX - 1];
    let out = s.plan(&Plan::Ranges(ranges.clone())).await.unwrap();
    assert_eq!(out.entries.len(), 4);
    let counts = s.counts().await.unwrap();
    assert_eq!(
        (counts.pending, counts.unissued),
        (4, 0),
        "explicit ranges are materialised"
    );
    let mut leases = s.claim("w1", 10).await.unwrap();
    leases.sort_by_key(|l| l.min_id);
    let got: Vec<_> = leases.iter().map(|l| l.min_id..=l.max_id).collect();
    assert_eq!(
        got, ranges,
        "each range is one partition with its own bounds"
    );
    assert_eq!(leases[3].progress, 10_000);
    for l in &leases {
        assert_eq!(s.complete(l, 5).await.unwrap(), Completion::Completed);
    }
    let again = s.plan(&Plan::Ranges(ranges)).await.unwrap();
    assert!(!again.created);
    assert_eq!(
        s.counts().await.unwrap().outstanding(),
        0,
        "completed ranges are not planned again"
    );
    let inbox = h.inbox().await;
    assert!(
        inbox.iter().any(|r| r.max_id == u64::MAX - 1),
        "huge IDs survive the Lua round trip"
    );
}

/// `tranche import`: an exported registry adopted into an empty namespace keeps its
/// pids; completed pids are never issued again, every other pid is pending.
pub(super) async fn adopt_restores_exported_plans(h: Harness) {
    use tranche_active_store::PlanEntry;
    let s = &h.store;
    let entry = |first, min, max, size, explicit| PlanEntry {
        plan: tranche_codec::PlanGeometry::new(first, min, max, size).unwrap(),
        explicit,
    };
    // Pids 1..=100, then one explicit range (101), then 102..=112.
    let entries = [
        entry(1, 1, 10_000, 100, false),
        entry(101, 20_000, 20_499, 500, true),
        entry(102, 30_000, 31_000, 100, false),
    ];
    let completed: Vec<u64> = (1..=112).filter(|p| p % 3 == 0 || *p == 101).collect();
    let missing: Vec<u64> = (1..=112).filter(|p| !completed.contains(p)).collect();

    // Refused before anything is written.
    let gap = [entry(2, 1, 10_000, 100, false)];
    assert!(matches!(
        s.adopt(&gap, &[]).await,
        Err(Error::InvalidPlan(_))
    ));
    let unsorted = [5, 3];
    assert!(matches!(
        s.adopt(&entries, &unsorted).await,
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        s.adopt(&entries, &[113]).await,
        Err(Error::InvalidArgument(_))
    ));
    assert!(s.plans().await.unwrap().is_empty());
    assert_eq!(s.counts().await.unwrap().outstanding(), 0);

    let pending = s.adopt(&entries, &completed).await.unwrap();
    assert_eq!(pending, missing.len() as u64);
    assert_eq!(s.plans().await.unwrap(), entries);
    assert_eq!(s.get(3).await.unwrap(), None, "completed: not active");
    assert_eq!(
        s.get(101).await.unwrap(),
        None,
        "a completed explicit range"
    );
    let p = s.get(104).await.unwrap().unwrap();
    assert_eq!(
        (p.status, p.attempts, p.min_id, p.max_id),
        (Status::Pending, 0, 30_200, 30_299)
    );
    let p = s.get(112).await.unwrap().unwrap();
    assert_eq!(
        (p.min_id, p.max_id),
        (31_000, 31_000),
        "the short last partition"
    );
    let snap = s.all_active().await.unwrap();
    let pids: Vec<u64> = snap.partitions.iter().map(|p| p.pid).collect();
    assert_eq!(pids, missing);
    assert!(
        snap.unissued.iter().all(|u| u.count == 0),
        "{:?}",
        snap.unissued
    );
    let c = s.counts().await.unwrap();
    assert_eq!((c.unissued, c.pending), (0, missing.len() as u64));

    // Claims hand out exactly the missing pids, each once.
    let mut claimed = Vec::new();
    for round in 0.. {
        assert!(round <= missing.len(), "claims never ran dry: {claimed:?}");
        let leases = s.claim("w", 7).await.unwrap();
        if leases.is_empty() {
            break;
        }
        claimed.extend(leases.iter().map(|l| l.pid));
    }
    claimed.sort_unstable();
    assert_eq!(claimed, missing);

    // Only into a namespace without plans.
    assert!(matches!(
        s.adopt(&entries, &completed).await,
        Err(Error::InvalidPlan(_))
    ));
}

/// A shard's completed index is a Redis bitmap of at most 2^32 bits: a plan with a pid
/// past it is refused before anything is written, and the error says the way out.
pub(super) async fn a_plan_past_the_bitmap_limit_is_refused(h: Harness) {
    let s = &h.store;
    let shards = u64::from(h.config.num_shards);
    let too_many = (1u64 << 32) * shards + 100;
    let err = s.plan(&uniform(1, too_many, 1)).await.unwrap_err();
    assert!(
        matches!(&err, Error::InvalidPlan(m) if m.contains("more shards or bigger partitions")),
        "{err}"
    );
    assert!(s.plans().await.unwrap().is_empty(), "nothing was written");
    assert_eq!(s.counts().await.unwrap().unissued, 0);
    // Just below the bound, per shard: accepted.
    let fits = ((1u64 << 32) - 200) * shards;
    let outcome = s.plan(&uniform(1, fits, 1)).await.unwrap();
    assert_eq!(outcome.entries[0].plan.partitions(), fits);
    // A later plan past it is refused too, the first one kept.
    let err = s
        .plan(&uniform(fits + 1, fits + 300 * shards, 1))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidPlan(_)), "{err}");
    assert_eq!(s.plans().await.unwrap().len(), 1);
}
