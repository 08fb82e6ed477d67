//! Statistics and fallbacks: active counts merged with completed statistics, and the
//! range summary answering for a batch expired or corrupted.

use super::*;

pub(super) async fn stats_merge_active_counts_with_completed_statistics(kind: Kind) {
    let job = Job::new(kind, 4, 200, Tier::Simple).await;
    let claimed: Vec<u64> = job.leases.keys().copied().collect();
    job.complete(claimed[..150].iter().copied()).await;
    job.archive().await;
    job.complete(claimed[150..160].iter().copied()).await;

    let merged = job.router.stats().await.unwrap();
    assert_eq!(
        merged.active,
        StatusCounts {
            unissued: 100,
            claimed: 40,
            ..Default::default()
        }
    );
    let completed = merged.completed.as_ref().unwrap();
    let full = job.stats.stats().await.unwrap();
    assert_eq!(completed, &full.summary());
    assert!(merged.ranges.is_none(), "the summary leaves the ranges out");
    assert_eq!(merged.full_stats(), None);
    assert_eq!(completed.global_stats.total_completed, 150);
    assert_eq!(completed.global_stats.total_processed_data, 150 * 100);
    assert_eq!(completed.worker_stats["w1"].completed_count, 150);
    assert_eq!(merged.completed_count(), Some(150));
    // The ten in the inbox are counted by neither side until archived.
    assert_eq!(merged.total(), 290);
    assert_eq!(merged.completed_ratio(), Some(150.0 / 290.0));

    // With the ranges: the same summary, and the ranges of the same read.
    let with_ranges = job.router.stats_with_ranges().await.unwrap();
    assert_eq!(with_ranges.active, merged.active);
    assert_eq!(with_ranges.completed.as_ref().unwrap(), completed);
    assert_eq!(with_ranges.ranges.as_ref(), Some(&full.range_stats));
    assert_eq!(with_ranges.full_stats(), Some(full));

    job.archive().await;
    let merged = job.router.stats().await.unwrap();
    assert_eq!(merged.completed_count(), Some(160));
    assert_eq!(merged.total(), 300);
}

/// A statistics layer that is down.
pub(super) struct FailingStats;

pub(super) fn down() -> tranche_stats::Error {
    tranche_stats::Error::Corrupt {
        key: "{elk:0}:stats:global".into(),
        detail: "down for the test".into(),
    }
}

#[async_trait]
impl StatsStore for FailingStats {
    async fn stats(&self) -> tranche_stats::Result<Stats> {
        Err(down())
    }
    async fn summary(&self) -> tranche_stats::Result<StatsSummary> {
        Err(down())
    }
    async fn range_summary(&self, _id: u64) -> tranche_stats::Result<Option<RangeStats>> {
        Err(down())
    }
    async fn replace(&self, _shard: u32, _delta: &StatsDelta) -> tranche_stats::Result<()> {
        Err(down())
    }
    async fn damage(&self, _shard: u32) -> tranche_stats::Result<Vec<tranche_stats::Damage>> {
        Err(down())
    }
    async fn repair(
        &self,
        _shard: u32,
        _rebuilt: &StatsDelta,
        _unreadable: u64,
    ) -> tranche_stats::Result<tranche_stats::Repaired> {
        Err(down())
    }
    async fn publish_snapshot(&self) -> tranche_stats::Result<u64> {
        Err(down())
    }

    async fn latest_snapshot(&self) -> tranche_stats::Result<Option<Snapshot>> {
        Err(down())
    }
    async fn snapshot(&self, _version: u64) -> tranche_stats::Result<Option<Snapshot>> {
        Err(down())
    }
}

pub(super) async fn stats_fall_back_to_the_active_counts_when_the_statistics_layer_fails(
    kind: Kind,
) {
    let job = Job::new(kind, 1, 20, Tier::Simple).await;
    job.complete(1..=5).await;
    job.archive().await;
    let router = job.router_with(Arc::new(FailingStats));

    let merged = router.stats().await.unwrap();
    assert_eq!(
        merged.active,
        StatusCounts {
            unissued: 280,
            claimed: 15,
            ..Default::default()
        }
    );
    let err = merged.completed.as_ref().unwrap_err();
    assert!(err.to_string().contains("down for the test"), "{err}");
    assert_eq!(merged.completed_count(), None);
    assert_eq!(merged.completed_ratio(), None);
    assert_eq!(merged.total(), 295);
    let with_ranges = router.stats_with_ranges().await.unwrap();
    assert_eq!(with_ranges.active, merged.active);
    assert!(with_ranges.completed.is_err() && with_ranges.ranges.is_none());

    // Reads that do not need the statistics layer are unaffected.
    assert_eq!(archived(&router.get(3).await.unwrap()), (3, Tier::Simple));
}

/// Completes pids 100..=199 (batch 1, full) into the summary tier, whose batches live
/// `ttl`; the router reads statistics from `stats`, or the job's own.
pub(super) async fn summary_job(
    kind: Kind,
    ttl: Duration,
    stats: Option<Arc<dyn StatsStore>>,
) -> (Job, Router) {
    let job = Job::with_ttl(kind, 1, 200, Tier::Summary, ttl).await;
    job.complete(100..=199).await;
    job.archive().await;
    let router = job.router_with(stats.unwrap_or_else(|| job.stats.clone()));
    (job, router)
}

/// Long enough never to expire during a test.
pub(super) const HOUR: Duration = Duration::from_secs(3600);

pub(super) async fn an_expired_batch_is_answered_from_the_range_summary(kind: Kind) {
    // The batch is expired by force once its TTL has been read: nothing races a clock.
    let (job, router) = summary_job(kind, HOUR, None).await;
    assert_eq!(
        archived(&router.get(150).await.unwrap()),
        (150, Tier::Summary)
    );
    let left = job.expire(1, HOUR).await;
    assert!(
        !left.is_empty() && left.iter().all(|&ms| ms <= 3_600_000 && ms > 3_540_000),
        "{left:?}"
    );
    let expected_summary = job.stats.range_summary(14_901).await.unwrap().unwrap();
    assert_eq!(expected_summary.completed_count, 100);
    for pid in [100, 150, 199] {
        let view = router.get(pid).await.unwrap();
        assert_eq!(
            view,
            PartitionView::Summarised {
                pid,
                range: (pid - 1) * 100 + 1..=pid * 100,
                cause: Fallback::Expired,
                summary: Some(expected_summary.clone()),
            }
        );
        assert!(view.is_completed());
    }
    let located = router.locate(15_000).await.unwrap().unwrap();
    assert!(matches!(
        located.view,
        PartitionView::Summarised {
            pid: 150,
            cause: Fallback::Expired,
            ..
        }
    ));
    assert_eq!(router.decode_failures().await.unwrap(), 0);
}

pub(super) async fn a_corrupted_batch_is_answered_from_the_range_summary_and_counted(kind: Kind) {
    let (job, router) = summary_job(kind, HOUR, None).await;
    job.corrupt(1, vec![0xde, 0xad, 0xbe, 0xef]).await;
    let view = router.get(123).await.unwrap();
    match &view {
        PartitionView::Summarised {
            pid: 123,
            range,
            cause: Fallback::Undecodable { .. },
            summary: Some(summary),
        } => {
            assert_eq!(range, &(12_201..=12_300));
            assert_eq!(summary.completed_count, 100);
            assert_eq!(summary.workers, ["w1"]);
        }
        other => panic!("{other:?}"),
    }
    assert!(router.decode_failures().await.unwrap() >= 1);
    // Other layers still answer for their pids.
    assert!(matches!(
        router.get(200).await.unwrap(),
        PartitionView::Active(_)
    ));
}

pub(super) async fn a_fallback_with_the_statistics_layer_down_is_an_error(kind: Kind) {
    let (job, router) = summary_job(kind, HOUR, Some(Arc::new(FailingStats))).await;
    job.corrupt(1, b"not a batch".to_vec()).await;
    match router.get(150).await {
        Err(Error::Stats(err)) => assert!(err.to_string().contains("down for the test")),
        other => panic!("{other:?}"),
    }
}
