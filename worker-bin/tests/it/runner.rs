//! `tranche_worker::Runner`: a worker embedded in a Rust program with its own async
//! handler, on a private Redis and embedded, through retries and a drain.

use crate::support;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::TestRedis;
use tranche_worker::{CancellationToken, Chunk, Handler, HandlerError, Runner};

/// Records every chunk it processes; fails the first attempt of partition 3's chunk 1.
#[derive(Clone, Default)]
struct Recorder {
    seen: Arc<Mutex<Vec<Chunk>>>,
    delay: Duration,
}

#[async_trait::async_trait]
impl Handler for Recorder {
    async fn process(&self, chunk: Chunk) -> Result<(), HandlerError> {
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        if chunk.pid == 3 && chunk.index == 1 && chunk.attempt == 1 {
            return Err("the database said no".into());
        }
        self.seen.lock().unwrap().push(chunk);
        Ok(())
    }
}

/// Every row ID of `1..=max` covered by an acknowledged chunk.
fn covered(seen: &[Chunk], max: u64) {
    let mut ids = BTreeSet::new();
    for c in seen {
        ids.extend(c.from..=c.to);
    }
    let missing: Vec<u64> = (1..=max).filter(|i| !ids.contains(i)).take(5).collect();
    assert!(missing.is_empty(), "never processed: {missing:?}...");
}

async fn runs_every_chunk(runner: Runner) {
    runner
        .plan(tranche_worker::Plan::ids(1..=20_000).partition_size(1000))
        .await
        .unwrap();
    let handler = Recorder::default();
    let report = runner
        .clone()
        .backoff(Duration::from_millis(10))
        .run(handler.clone())
        .await
        .unwrap();
    assert_eq!(
        (
            report.this_runner.completed,
            report.namespace.failed,
            report.namespace.outstanding
        ),
        (20, 0, 0),
        "{report:?}"
    );
    assert_eq!(report.this_runner.attempts_failed, 1, "{report:?}");
    assert!(!report.interrupted);
    let mine = &report.this_runner;
    assert!(
        Duration::from_millis(1) <= mine.partition_p50 && mine.partition_p50 <= mine.partition_p99,
        "{report:?}"
    );
    let seen = handler.seen.lock().unwrap().clone();
    covered(&seen, 20_000);
    // The failed chunk was retried on attempt 2, from the partition's checkpoint.
    assert!(
        seen.iter()
            .any(|c| c.pid == 3 && c.index == 1 && c.attempt == 2),
        "{seen:?}"
    );
    assert!(seen.iter().all(|c| c.to - c.from < 250 && c.from <= c.to));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_runs_every_chunk_on_redis() {
    let redis = TestRedis::start();
    runs_every_chunk(
        Runner::redis(redis.url())
            .namespace("lib")
            .concurrency(4)
            .chunk(250)
            .worker_id("lib-1"),
    )
    .await;
}

/// Tracks the partitions whose chunks are running, and the most of them at once.
#[derive(Clone, Default)]
struct Peak {
    /// Running chunks per pid, and the most pids with a running chunk so far.
    at_work: Arc<Mutex<(HashMap<u64, usize>, usize)>>,
}

#[async_trait::async_trait]
impl Handler for Peak {
    async fn process(&self, chunk: Chunk) -> Result<(), HandlerError> {
        {
            let mut at_work = self.at_work.lock().unwrap();
            *at_work.0.entry(chunk.pid).or_default() += 1;
            at_work.1 = at_work.1.max(at_work.0.len());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
        let mut at_work = self.at_work.lock().unwrap();
        let left = at_work.0.get_mut(&chunk.pid).unwrap();
        *left -= 1;
        if *left == 0 {
            at_work.0.remove(&chunk.pid);
        }
        Ok(())
    }
}

// A partition's slot frees when its chunks end, before its completion reaches Redis:
// the partitions at work never exceed the concurrency, and reach it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_bounds_the_partitions_at_work() {
    let redis = TestRedis::start();
    let runner = Runner::redis(redis.url())
        .namespace("peak")
        .concurrency(3)
        .chunk(500)
        .parallel(2)
        .worker_id("peak-1");
    runner
        .plan(tranche_worker::Plan::ids(1..=40_000).partition_size(1000))
        .await
        .unwrap();
    let handler = Peak::default();
    let report = runner.run(handler.clone()).await.unwrap();
    assert_eq!(report.this_runner.completed, 40, "{report:?}");
    let peak = handler.at_work.lock().unwrap().1;
    assert_eq!(
        peak, 3,
        "partitions at work at once with a concurrency of 3"
    );
}

// A current-thread runtime, as a library user may have: saving the embedded state
// must not need a multi-threaded one.
#[tokio::test]
async fn a_handler_runs_every_chunk_embedded() {
    let dir = std::env::temp_dir().join(format!("tranche-runner-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    runs_every_chunk(
        Runner::embedded(dir.join("lib.state"))
            .namespace("lib")
            .concurrency(4)
            .chunk(250),
    )
    .await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A shutdown drains: nothing more is claimed, unfinished partitions are released with
/// their checkpoints, and a second run finishes the job without a gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_drains_and_a_second_run_finishes() {
    let redis = TestRedis::start();
    let runner = Runner::redis(redis.url())
        .namespace("drain")
        .concurrency(2)
        .chunk(100)
        .grace(Duration::from_secs(5))
        .backoff(Duration::from_millis(10));
    runner
        .plan(tranche_worker::Plan::ids(1..=40_000).partition_size(1000))
        .await
        .unwrap();
    let slow = Recorder {
        delay: Duration::from_millis(20),
        ..Recorder::default()
    };
    let first = runner
        .run_with_shutdown(slow.clone(), tokio::time::sleep(Duration::from_millis(300)))
        .await
        .unwrap();
    assert!(first.interrupted, "{first:?}");
    assert!(
        first.namespace.outstanding > 0,
        "the job should outlast the first run: {first:?}"
    );
    let rest = Recorder::default();
    let second = runner.run(rest.clone()).await.unwrap();
    assert_eq!(
        (second.namespace.outstanding, second.namespace.failed),
        (0, 0),
        "{second:?}"
    );
    assert_eq!(
        first.this_runner.completed + second.this_runner.completed,
        40
    );
    let mut all = slow.seen.lock().unwrap().clone();
    all.extend(rest.seen.lock().unwrap().iter().copied());
    covered(&all, 40_000);
}

/// Panics on every chunk of partition 3.
struct PanicsOnThree;

#[async_trait::async_trait]
impl Handler for PanicsOnThree {
    async fn process(&self, chunk: Chunk) -> Result<(), HandlerError> {
        if chunk.pid == 3 {
            panic!("row {} is cursed", chunk.from);
        }
        Ok(())
    }
}

/// A panicking handler fails its attempt like an error: retried up to `max_attempts`,
/// then failed, and the rest of the run goes on (it used to hang for ever, the
/// partition `running` under a lease the heartbeat kept renewing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_fails_its_attempt() {
    let dir = std::env::temp_dir().join(format!("tranche-panic-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let runner = Runner::embedded(dir.join("panic.state"))
        .namespace("panic")
        .lease(Duration::from_secs(2))
        .max_attempts(2)
        .backoff(Duration::from_millis(10))
        .chunk(100);
    runner
        .plan(tranche_worker::Plan::ids(1..=1000).partition_size(200))
        .await
        .unwrap();
    let report = tokio::time::timeout(Duration::from_secs(60), runner.run(PanicsOnThree))
        .await
        .expect("the run returns although a handler panicked")
        .unwrap();
    assert_eq!(
        (
            report.this_runner.completed,
            report.namespace.failed,
            report.namespace.outstanding
        ),
        (4, 1, 0),
        "{report:?}"
    );
    assert_eq!(report.this_runner.attempts_failed, 2, "{report:?}");
    let failed = runner.job().await.unwrap().failed().await.unwrap();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].pid, 3);
    let error = failed[0].last_error.as_deref().unwrap_or_default();
    assert!(error.contains("handler panicked: row "), "{error}");
    assert!(error.ends_with(" is cursed"), "{error}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Fails partition 2 for good, and asks partition 4 to come back after a delay.
#[derive(Clone, Default)]
struct Picky {
    seen: Arc<Mutex<Vec<Chunk>>>,
}

#[async_trait::async_trait]
impl Handler for Picky {
    async fn process(&self, chunk: Chunk) -> Result<(), HandlerError> {
        self.seen.lock().unwrap().push(chunk);
        match (chunk.pid, chunk.attempt) {
            (2, _) => Err(HandlerError::permanent("row 1234 cannot be parsed")),
            (4, 1) => Err(HandlerError::retry_after(
                "rate limited",
                Duration::from_millis(50),
            )),
            _ => Ok(()),
        }
    }
}

/// A permanent error fails its partition on the first attempt, with attempts left;
/// `retry_after` is retried (after its own delay, not the 1 h back-off).
async fn permanent_and_delayed(runner: Runner) {
    runner
        .plan(tranche_worker::Plan::ids(1..=1000).partition_size(200))
        .await
        .unwrap();
    let handler = Picky::default();
    let report = tokio::time::timeout(
        Duration::from_secs(30),
        runner
            .clone()
            .max_attempts(5)
            .backoff(Duration::from_secs(3600))
            .run(handler.clone()),
    )
    .await
    .expect("retry_after is not the hour-long back-off")
    .unwrap();
    assert_eq!(
        (
            report.this_runner.completed,
            report.namespace.failed,
            report.namespace.outstanding
        ),
        (4, 1, 0),
        "{report:?}"
    );
    assert_eq!(report.this_runner.attempts_failed, 2, "{report:?}");
    let seen = handler.seen.lock().unwrap().clone();
    assert!(
        seen.iter().filter(|c| c.pid == 2).all(|c| c.attempt == 1),
        "a permanent failure is not retried: {seen:?}"
    );
    assert!(
        seen.iter().any(|c| c.pid == 4 && c.attempt == 2),
        "{seen:?}"
    );
}

#[tokio::test]
async fn permanent_and_delayed_failures_embedded() {
    let dir = std::env::temp_dir().join(format!("tranche-picky-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    permanent_and_delayed(Runner::embedded(dir.join("picky.state")).chunk(100)).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanent_and_delayed_failures_on_redis() {
    let redis = TestRedis::start();
    permanent_and_delayed(Runner::redis(redis.url()).namespace("picky").chunk(100)).await;
}

/// Errors are kinds to match, with messages of the library's, not the command line's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_typed() {
    use tranche_worker::Error;
    let dir = std::env::temp_dir().join(format!("tranche-errors-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let runner = Runner::embedded(dir.join("e.state")).namespace("e");
    let err = runner.run(Recorder::default()).await.unwrap_err();
    assert!(matches!(err, Error::NotPlanned { .. }), "{err:?}");
    assert!(!err.to_string().contains("tranche plan"), "{err}");

    runner
        .plan(tranche_worker::Plan::ids(1..=100).partition_size(10))
        .await
        .unwrap();
    let err = runner
        .plan(tranche_worker::Plan::ids(50..=200).partition_size(10))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidPlan(_)), "{err:?}");
    assert_eq!(err.to_string().matches("invalid plan").count(), 1, "{err}");

    let bad = Runner::embedded(dir.join("x.state")).namespace("a b");
    assert!(matches!(
        bad.plan(tranche_worker::Plan::ids(1..=2).partition_size(1))
            .await,
        Err(Error::Config(_))
    ));

    // A run in progress holds the state file: a second runner is refused, naming it.
    let token = CancellationToken::new();
    let busy = Recorder::default();
    let first = tokio::spawn({
        let (runner, busy, token) = (runner.clone().follow(true), busy.clone(), token.clone());
        async move { runner.run_until_cancelled(busy, token).await }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while busy.seen.lock().unwrap().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the first run started"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let err = runner
        .plan(tranche_worker::Plan::ids(1000..=2000).partition_size(10))
        .await
        .unwrap_err();
    let Error::StateLocked { holder, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(*holder, Some(std::process::id()), "{err}");
    assert!(!err.to_string().contains("tranche process"), "{err}");
    token.cancel();
    let first = first.await.unwrap().unwrap();
    assert!(
        first.interrupted,
        "a follow run ends by its token: {first:?}"
    );

    let redis = TestRedis::start();
    let err = Runner::redis(redis.url())
        .namespace("never")
        .run(Recorder::default())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotPlanned { .. }), "{err:?}");
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let err = Runner::redis(format!("redis://127.0.0.1:{closed}"))
        .plan(tranche_worker::Plan::ids(1..=2).partition_size(1))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::StoreUnreachable { .. }), "{err:?}");
    assert!(std::error::Error::source(&err).is_some());
    let _ = std::fs::remove_dir_all(&dir);
}

/// What the run loop refuses reaches a library caller as a kind it can match, not an
/// `Error::Other` string: a probe interval below its bound is `Error::Config`, said as
/// the setting it is, and nothing runs.
#[tokio::test]
async fn the_run_loop_errors_are_typed() {
    use tranche_worker::{Error, ProbeOutcome};
    let dir = std::env::temp_dir().join(format!("tranche-loop-errors-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let runner = Runner::embedded(dir.join("l.state")).namespace("l");
    runner
        .plan(tranche_worker::Plan::ids(1..=100).partition_size(10))
        .await
        .unwrap();
    let handler = Recorder::default();
    let err = runner
        .clone()
        .throttle_probe(|| async { ProbeOutcome::Go })
        .throttle_interval(Duration::from_millis(1))
        .run(handler.clone())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    assert!(err.to_string().contains("throttle-interval"), "{err}");
    assert!(handler.seen.lock().unwrap().is_empty(), "nothing ran");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Fails partition 2 for good; partition 4 asks to come back in an hour.
struct Stubborn;

#[async_trait::async_trait]
impl Handler for Stubborn {
    async fn process(&self, chunk: Chunk) -> Result<(), HandlerError> {
        match chunk.pid {
            2 => Err(HandlerError::permanent("bad row")),
            4 => Err(HandlerError::retry_after(
                "come back later",
                Duration::from_secs(3600),
            )),
            _ => Ok(()),
        }
    }
}

/// Subscribers see what happened, the report tells this runner's work from the
/// namespace's, and `Until::NothingToClaim` returns without waiting for a retry an hour
/// away.
#[tokio::test]
async fn events_and_until_nothing_to_claim() {
    use tranche_worker::{Event, Until};
    let dir = std::env::temp_dir().join(format!("tranche-events-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let events: Arc<Mutex<Vec<Event>>> = Arc::default();
    let runner = Runner::embedded(dir.join("ev.state"))
        .chunk(50)
        .until(Until::NothingToClaim)
        .on_event({
            let events = events.clone();
            move |e| events.lock().unwrap().push(e.clone())
        });
    runner
        .plan(tranche_worker::Plan::ids(1..=1000).partition_size(200))
        .await
        .unwrap();
    let report = tokio::time::timeout(Duration::from_secs(30), runner.run(Stubborn))
        .await
        .expect("no wait for the namespace to drain")
        .unwrap();
    assert_eq!(report.this_runner.completed, 3, "{report:?}");
    assert_eq!(report.this_runner.failed_pids, vec![2], "{report:?}");
    assert_eq!(report.this_runner.attempts_failed, 2, "{report:?}");
    assert_eq!(
        (report.namespace.failed, report.namespace.outstanding),
        (1, 1),
        "{report:?}"
    );
    let events = events.lock().unwrap().clone();
    let claimed = events
        .iter()
        .filter(|e| matches!(e, Event::Claimed { .. }))
        .count();
    let done: BTreeSet<u64> = events
        .iter()
        .filter_map(|e| match e {
            Event::PartitionDone { pid, .. } => Some(*pid),
            _ => None,
        })
        .collect();
    assert_eq!(claimed, 5, "{events:?}");
    assert_eq!(done, BTreeSet::from([1, 3, 5]));
    assert!(
        events.iter().any(|e| matches!(
            e,
            Event::AttemptFailed { pid: 2, permanent: true, retry_in: None, error, .. }
                if error.contains("bad row")
        )),
        "{events:?}"
    );
    assert!(
        events.iter().any(|e| matches!(
            e,
            Event::AttemptFailed { pid: 4, permanent: false, retry_in: Some(d), .. }
                if *d > Duration::from_secs(3000)
        )),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .filter(|e| matches!(e, Event::ChunkDone { ok: true, .. }))
            .count()
            >= 12,
        "{events:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A shutdown that is already over drains at once, whichever way it is given: the run
/// claims nothing and says it was interrupted.
#[tokio::test]
async fn a_finished_shutdown_claims_nothing() {
    let dir = std::env::temp_dir().join(format!("tranche-done-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let runner = Runner::embedded(dir.join("d.state"));
    runner
        .plan(tranche_worker::Plan::ids(1..=1000).partition_size(100))
        .await
        .unwrap();
    let handler = Recorder::default();
    let report = runner
        .run_with_shutdown(handler.clone(), async {})
        .await
        .unwrap();
    assert!(report.interrupted, "{report:?}");
    assert_eq!(report.this_runner.completed, 0, "{report:?}");
    assert_eq!(report.namespace.outstanding, 10, "{report:?}");
    let token = CancellationToken::new();
    token.cancel();
    let report = runner
        .run_until_cancelled(handler.clone(), token)
        .await
        .unwrap();
    assert!(
        report.interrupted && report.this_runner.completed == 0,
        "{report:?}"
    );
    assert!(handler.seen.lock().unwrap().is_empty());
    let report = runner.run(handler.clone()).await.unwrap();
    assert!(!report.interrupted, "{report:?}");
    assert_eq!(report.this_runner.completed, 10, "{report:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// What a job did, asked from Rust after the run: the same answers on both backends.
async fn asks_what_happened(runner: Runner) {
    use tranche_worker::{PartitionView, Status};
    runner
        .plan(tranche_worker::Plan::ids(1..=1000).partition_size(200))
        .await
        .unwrap();
    let report = runner
        .clone()
        .worker_id("asker-1")
        .run(Stubborn)
        .await
        .unwrap();
    // Partition 4 waits an hour for its retry: a drained run would wait with it.
    assert_eq!(report.this_runner.completed, 3, "{report:?}");
    let job = runner.job().await.unwrap();
    let status = job.status().await.unwrap();
    assert_eq!((status.total, status.completed), (5, 3), "{status:?}");
    assert_eq!(
        (status.counts.failed, status.counts.pending),
        (1, 1),
        "{status:?}"
    );
    let failed = job.failed().await.unwrap();
    assert_eq!(failed.iter().map(|p| p.pid).collect::<Vec<_>>(), vec![2]);
    assert!(failed[0].last_error.as_deref().unwrap().contains("bad row"));
    let pending = job.list(Some(Status::Pending), 0, 10).await.unwrap();
    assert_eq!(pending.iter().map(|p| p.pid).collect::<Vec<_>>(), vec![4]);
    assert!(
        matches!(job.get(2).await.unwrap(), PartitionView::Active(p) if p.status == Status::Failed)
    );
    let located = job.locate(450).await.unwrap().expect("planned");
    assert_eq!((located.pid, located.range.clone()), (3, 401..=600));
    assert!(located.view.is_completed(), "{located:?}");
    assert!(job.locate(5000).await.unwrap().is_none());
    // A worker leaves the registry when its run ends: none is left.
    let workers = job.workers().await.unwrap();
    assert!(
        workers.iter().all(|w| w.info.id != "asker-1"),
        "{workers:?}"
    );
    assert_eq!(job.plans().await.unwrap().len(), 1);
    assert!(job.dead_letters(10).await.unwrap().is_empty());
    let stats = job.stats().await.unwrap();
    assert!(format!("{stats:?}").contains('3'), "{stats:?}");
}

#[tokio::test]
async fn asks_what_happened_embedded() {
    let dir = std::env::temp_dir().join(format!("tranche-ask-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    asks_what_happened(
        Runner::embedded(dir.join("ask.state"))
            .chunk(50)
            .until(tranche_worker::Until::NothingToClaim),
    )
    .await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asks_what_happened_on_redis() {
    let redis = TestRedis::start();
    asks_what_happened(
        Runner::redis(redis.url())
            .namespace("ask")
            .chunk(50)
            .until(tranche_worker::Until::NothingToClaim),
    )
    .await;
}

/// `Runner::metrics` fills the application's registry from the run's events.
#[cfg(feature = "metrics")]
#[tokio::test]
async fn metrics_land_in_the_applications_registry() {
    let dir = std::env::temp_dir().join(format!("tranche-metrics-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut registry = prometheus_client::registry::Registry::default();
    let runner = Runner::embedded(dir.join("m.state"))
        .chunk(50)
        .until(tranche_worker::Until::NothingToClaim)
        .metrics(&mut registry);
    runner
        .plan(tranche_worker::Plan::ids(1..=1000).partition_size(200))
        .await
        .unwrap();
    runner.run(Stubborn).await.unwrap();
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for line in [
        "tranche_worker_claimed_total 5",
        "tranche_worker_completed_total 3",
        "tranche_worker_failed_attempts_total 2",
        "tranche_worker_partitions_failed_total 1",
        "tranche_worker_partition_seconds_count 3",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Fails every chunk of partitions 2 and 4 for good.
struct FailsTwoAndFour;

#[async_trait::async_trait]
impl Handler for FailsTwoAndFour {
    async fn process(&self, chunk: Chunk) -> Result<(), HandlerError> {
        if chunk.pid == 2 || chunk.pid == 4 {
            return Err(HandlerError::permanent("bad rows"));
        }
        Ok(())
    }
}

/// The operator's actions from Rust, on Redis: pause and resume flip what `status`
/// reads, discard and retry-failed move the failed partitions, and the export holds
/// the plan and every completed record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_takes_the_operators_actions() {
    let redis = TestRedis::start();
    let runner = Runner::redis(redis.url()).namespace("actions").chunk(100);
    runner
        .plan(tranche_worker::Plan::ids(1..=1_000).partition_size(100))
        .await
        .unwrap();
    let report = runner.run(FailsTwoAndFour).await.unwrap();
    let mut failed = report.this_runner.failed_pids.clone();
    failed.sort_unstable();
    assert_eq!(failed, vec![2, 4]);
    let job = runner.job().await.unwrap();
    job.pause().await.unwrap();
    assert!(job.status().await.unwrap().paused);
    job.resume().await.unwrap();
    assert!(!job.status().await.unwrap().paused);
    assert!(job.discard(4).await.unwrap());
    assert!(
        !job.discard(5).await.unwrap(),
        "a completed partition stays"
    );
    assert_eq!(job.retry_failed(None).await.unwrap(), vec![2]);
    let status = job.status().await.unwrap();
    assert_eq!((status.counts.failed, status.counts.discarded), (0, 1));
    let dump = job.export().await.unwrap();
    assert_eq!(dump.plans.len(), 1);
    assert_eq!(dump.entries(), 8, "the 8 completed partitions");
}
