//! A random workload over every layer, checked against a model of each pid's state.

use super::*;

/// A tiny deterministic generator (xorshift64*), so a failure replays.
pub(super) struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// What the test believes of one pid.
#[derive(Debug, Clone)]
pub(super) enum Model {
    Unissued,
    Held(Lease),
    /// Waiting for another claim, after this many attempts.
    Pending(u32),
    Failed,
    Completed {
        worker: String,
        duration_ms: u64,
        archived: bool,
    },
}

/// Checks every router answer, the range stream and the merged statistics against
/// `model`.
pub(super) async fn check_model(job: &Job, model: &BTreeMap<u64, Model>) {
    let views: Vec<PartitionView> = job
        .router
        .range(0..=301)
        .map(Result::unwrap)
        .collect()
        .await;
    assert_eq!(views.len(), 302);
    assert_eq!(views[0], PartitionView::Unknown);
    assert_eq!(views[301], PartitionView::Unknown);
    let mut counts = StatusCounts::default();
    let mut archived_n = 0;
    for (pid, state) in model {
        let view = &views[*pid as usize];
        assert_eq!(view, &job.router.get(*pid).await.unwrap(), "pid {pid}");
        let range = (pid - 1) * 100 + 1..=pid * 100;
        match (state, view) {
            (Model::Unissued, PartitionView::Active(p)) => {
                assert_eq!((p.status, p.attempts), (Status::Pending, 0), "pid {pid}");
                counts.unissued += 1;
            }
            (Model::Pending(attempts), PartitionView::Active(p)) => {
                assert_eq!(
                    (p.status, p.attempts),
                    (Status::Pending, *attempts),
                    "pid {pid}"
                );
                counts.pending += 1;
            }
            (Model::Held(lease), PartitionView::Active(p)) => {
                assert_eq!(p.status, Status::Claimed, "pid {pid}");
                assert_eq!(p.worker.as_deref(), Some(lease.worker.as_str()));
                assert_eq!(p.lease_token, Some(lease.token));
                counts.claimed += 1;
            }
            (Model::Failed, PartitionView::Active(p)) => {
                assert_eq!(p.status, Status::Failed, "pid {pid}");
                counts.failed += 1;
            }
            (
                Model::Completed {
                    archived: false, ..
                },
                PartitionView::Archiving { pid: p, range: r },
            ) => assert_eq!((*p, r), (*pid, &range)),
            (
                Model::Completed {
                    worker,
                    duration_ms,
                    archived: true,
                },
                PartitionView::Archived { record, .. },
            ) => {
                assert_eq!(record.pid, *pid);
                assert_eq!(record.min_id..=record.max_id, range);
                assert_eq!(&*record.worker, worker.as_str(), "pid {pid}");
                assert_eq!(record.duration_ms, *duration_ms, "pid {pid}");
                archived_n += 1;
            }
            (state, view) => panic!("pid {pid}: model {state:?}, router {view:?}"),
        }
    }
    let merged = job.router.stats().await.unwrap();
    assert_eq!(merged.active, counts);
    assert_eq!(merged.completed_count(), Some(archived_n));
    let completed = merged.completed.as_ref().unwrap();
    assert_eq!(
        completed.global_stats.total_processed_data,
        archived_n * 100
    );
    let by_worker: u64 = completed
        .worker_stats
        .values()
        .map(|w| w.completed_count)
        .sum();
    assert_eq!(by_worker, archived_n);
}

pub(super) async fn a_random_workload_matches_a_model(kind: Kind) {
    for (seed, shards) in [(7, 1), (11, 4)] {
        let mut rng = Rng(seed);
        let job = Job::new(kind, shards, 0, Tier::Compressed).await;
        let mut model: BTreeMap<u64, Model> = (1..=300).map(|p| (p, Model::Unissued)).collect();
        for step in 0..400 {
            let held: Vec<u64> = model
                .iter()
                .filter(|(_, s)| matches!(s, Model::Held(_)))
                .map(|(p, _)| *p)
                .collect();
            let pick = |rng: &mut Rng| held[rng.below(held.len() as u64) as usize];
            match rng.below(10) {
                0..=2 => {
                    let worker = format!("w{}", rng.below(3));
                    let n = 1 + rng.below(8) as usize;
                    for lease in job.active.claim(&worker, n).await.unwrap() {
                        model.insert(lease.pid, Model::Held(lease));
                    }
                }
                3..=5 if !held.is_empty() => {
                    let pid = pick(&mut rng);
                    let Model::Held(lease) = model[&pid].clone() else {
                        unreachable!()
                    };
                    let duration_ms = 1 + rng.below(100_000);
                    let first = job.active.complete(&lease, duration_ms).await.unwrap();
                    assert_eq!(first, Completion::Completed);
                    // A retried completion changes nothing.
                    if rng.below(3) == 0 {
                        let again = job.active.complete(&lease, duration_ms).await;
                        assert!(
                            matches!(again, Ok(Completion::Duplicate) | Err(_)),
                            "{again:?}"
                        );
                    }
                    let worker = lease.worker.clone();
                    model.insert(
                        pid,
                        Model::Completed {
                            worker,
                            duration_ms,
                            archived: false,
                        },
                    );
                }
                6 if !held.is_empty() => {
                    let pid = pick(&mut rng);
                    let Model::Held(lease) = model[&pid].clone() else {
                        unreachable!()
                    };
                    let state = match job.active.fail(&lease, "boom").await.unwrap() {
                        FailOutcome::Retry { .. } => Model::Pending(lease.attempt),
                        FailOutcome::Failed => Model::Failed,
                    };
                    model.insert(pid, state);
                }
                7 if !held.is_empty() => {
                    let pid = pick(&mut rng);
                    let Model::Held(lease) = model[&pid].clone() else {
                        unreachable!()
                    };
                    job.active.release(&lease, lease.min_id).await.unwrap();
                    // A graceful release gives the attempt back.
                    model.insert(pid, Model::Pending(lease.attempt - 1));
                }
                _ => {
                    job.archive().await;
                    for state in model.values_mut() {
                        if let Model::Completed { archived, .. } = state {
                            *archived = true;
                        }
                    }
                }
            }
            if step % 100 == 99 {
                check_model(&job, &model).await;
            }
        }
        job.archive().await;
        for state in model.values_mut() {
            if let Model::Completed { archived, .. } = state {
                *archived = true;
            }
        }
        check_model(&job, &model).await;
        let mut seen = BTreeMap::<&str, u64>::new();
        for state in model.values() {
            let name = match state {
                Model::Unissued => "unissued",
                Model::Held(_) => "held",
                Model::Pending(_) => "pending",
                Model::Failed => "failed",
                Model::Completed { .. } => "completed",
            };
            *seen.entry(name).or_default() += 1;
        }
        // The workload reached every kind of state worth checking.
        for name in ["completed", "held", "pending", "failed"] {
            assert!(
                seen.get(name).is_some_and(|&n| n > 0),
                "seed {seed}: {seen:?}"
            );
        }
    }
}
