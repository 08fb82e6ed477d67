//! Splitting stragglers in the run loop (`tranche_active_store::Splits`, `work/split.rs`):
//! a skewed job's slow partition is cut while it runs and its rest done by idle slots,
//! every ID processed once, embedded and on Redis; a straggler's owner killed mid-split
//! leaves nothing undone; a piece whose chunks always fail ends its partition failed.

use crate::support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::TestRedis;
use tranche_worker::Event;
use tranche_worker::{Chunk, Handler, HandlerError, Runner};

/// IDs 1..=1600 in 4 partitions of 400: partition 1's chunks are slow, the rest fast.
const MAX: u64 = 1600;

/// Sleeps `slow` for each chunk of partition 1 (`fast` for the others) and records
/// every chunk it acknowledges.
#[derive(Clone)]
struct Skewed {
    seen: Arc<Mutex<Vec<Chunk>>>,
    slow: Duration,
    fast: Duration,
}

impl Skewed {
    fn new(slow: Duration) -> Self {
        Self {
            seen: Arc::default(),
            slow,
            fast: Duration::from_millis(1),
        }
    }
}

#[async_trait::async_trait]
impl Handler for Skewed {
    async fn process(&self, chunk: Chunk) -> Result<(), HandlerError> {
        let pause = if chunk.pid == 1 { self.slow } else { self.fast };
        tokio::time::sleep(pause).await;
        self.seen.lock().unwrap().push(chunk);
        Ok(())
    }
}

/// How many times each ID of `1..=MAX` was acknowledged.
fn times(seen: &[Chunk]) -> BTreeMap<u64, u32> {
    let mut out: BTreeMap<u64, u32> = (1..=MAX).map(|id| (id, 0)).collect();
    for c in seen {
        for id in c.from..=c.to {
            *out.get_mut(&id).expect("an ID of the plan") += 1;
        }
    }
    out
}

/// Whether partition 1 ran in more than one part: two of its chunks with the same
/// index (each part numbers its chunks from its own first ID) but other IDs.
fn was_split(seen: &[Chunk]) -> bool {
    let mut first: BTreeMap<u64, u64> = BTreeMap::new();
    seen.iter().filter(|c| c.pid == 1).any(|c| {
        let from = *first.entry(c.index).or_insert(c.from);
        from != c.from
    })
}

fn runner(r: Runner, worker: &str) -> Runner {
    r.namespace("split")
        .worker_id(worker)
        .concurrency(4)
        .parallel(1)
        .chunk(10)
        .lease(Duration::from_secs(3))
}

async fn plan(r: &Runner) {
    r.plan(tranche_worker::Plan::ids(1..=MAX).partition_size(400))
        .await
        .unwrap();
}

/// One process: its own idle slots split its straggler. 40 chunks of 40 ms would take
/// 1.6 s alone; every ID is processed exactly once and partition 1 counted once.
async fn a_straggler_is_split_by_idle_slots(r: Runner) {
    plan(&r).await;
    let handler = Skewed::new(Duration::from_millis(100));
    let report = r.run(handler.clone()).await.unwrap();
    assert_eq!(
        (
            report.this_runner.completed,
            report.namespace.outstanding,
            report.namespace.failed
        ),
        (4, 0, 0),
        "{report:?}"
    );
    let seen = handler.seen.lock().unwrap().clone();
    let counts = times(&seen);
    let wrong: Vec<(&u64, &u32)> = counts.iter().filter(|(_, n)| **n != 1).take(5).collect();
    assert!(
        wrong.is_empty(),
        "IDs not processed exactly once: {wrong:?}"
    );
    assert!(was_split(&seen), "partition 1 ran in one piece: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_straggler_is_split_on_redis() {
    let redis = TestRedis::start();
    a_straggler_is_split_by_idle_slots(runner(Runner::redis(redis.url()), "w1")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_straggler_is_split_embedded() {
    let dir = std::env::temp_dir().join(format!("tranche-split-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    a_straggler_is_split_by_idle_slots(runner(Runner::embedded(dir.join("s.state")), "w1")).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Without splitting the straggler runs in one piece, as before.
/// Chunks sized by time (`--chunk-time`) are cut too: they are handed out through the
/// lease's hold, whose beats carry the frontier a cut needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_straggler_is_split_on_redis() {
    let redis = TestRedis::start();
    let r = runner(Runner::redis(redis.url()), "w1").chunk_time(Duration::from_millis(100), 10, 10);
    a_straggler_is_split_by_idle_slots(r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_straggler_is_split_embedded() {
    let dir = std::env::temp_dir().join(format!("tranche-split-timed-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let r = runner(Runner::embedded(dir.join("s.state")), "w1").chunk_time(
        Duration::from_millis(100),
        10,
        10,
    );
    a_straggler_is_split_by_idle_slots(r).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_split_runs_the_straggler_whole() {
    let redis = TestRedis::start();
    let r = runner(Runner::redis(redis.url()), "w1").split(false);
    plan(&r).await;
    let handler = Skewed::new(Duration::from_millis(5));
    let report = r.run(handler.clone()).await.unwrap();
    assert_eq!(report.namespace.outstanding, 0, "{report:?}");
    let seen = handler.seen.lock().unwrap().clone();
    assert!(times(&seen).values().all(|n| *n == 1));
    assert!(!was_split(&seen));
}

/// Long partitions (10 chunks of 55 ms) and a straggler (10 of 600 ms), four slots:
/// the straggler is cut while partitions still wait to be claimed, and its pieces run
/// before the last of them starts (heaviest work first), not once nothing is left.
async fn a_straggler_is_cut_while_partitions_wait(r: Runner) {
    r.plan(tranche_worker::Plan::ids(1..=MAX).partition_size(100))
        .await
        .unwrap();
    let handler = Started::default();
    let report = r.run(handler.clone()).await.unwrap();
    assert_eq!(
        (report.namespace.outstanding, report.namespace.failed),
        (0, 0),
        "{report:?}"
    );
    let seen = handler.seen.lock().unwrap().clone();
    let chunks: Vec<Chunk> = seen.iter().map(|(c, _)| *c).collect();
    assert!(
        times(&chunks).values().all(|n| *n == 1),
        "IDs not processed exactly once"
    );
    // A piece's chunks are numbered from its own first ID.
    let first_piece = seen
        .iter()
        .filter(|(c, _)| c.pid == 1 && c.from != 1 + c.index * 10)
        .map(|(_, at)| *at)
        .min()
        .expect("partition 1 was cut");
    let last_start = (2..=16)
        .filter_map(|pid| {
            seen.iter()
                .filter(|(c, _)| c.pid == pid)
                .map(|(_, at)| *at)
                .min()
        })
        .max()
        .expect("the light partitions ran");
    assert!(
        first_piece < last_start,
        "partition 1 was cut only after the last partition started ({:?} after)",
        first_piece - last_start
    );
}

/// Records each chunk with when it started: partition 1's chunks sleep 600 ms, the
/// others' 55 ms.
#[derive(Clone, Default)]
struct Started {
    seen: Arc<Mutex<Vec<(Chunk, std::time::Instant)>>>,
}

#[async_trait::async_trait]
impl Handler for Started {
    async fn process(&self, chunk: Chunk) -> Result<(), HandlerError> {
        let at = std::time::Instant::now();
        let pause = if chunk.pid == 1 { 600 } else { 55 };
        tokio::time::sleep(Duration::from_millis(pause)).await;
        self.seen.lock().unwrap().push((chunk, at));
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_straggler_is_cut_while_partitions_wait_on_redis() {
    let redis = TestRedis::start();
    a_straggler_is_cut_while_partitions_wait(runner(Runner::redis(redis.url()), "w1")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_straggler_is_cut_while_partitions_wait_embedded() {
    let dir = std::env::temp_dir().join(format!("tranche-early-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let r = runner(Runner::embedded(dir.join("s.state")), "w1");
    a_straggler_is_cut_while_partitions_wait(r).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two processes on Redis: the owner of the straggler is killed (its run dropped, no
/// release) once its partition was split and a piece of it ran. Its lease expires, the other reclaims the
/// owner part from its checkpoint, and the job ends with every ID processed (at least
/// once: the killed chunks are redone) and every partition counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_killed_mid_split_leaves_nothing_undone() {
    let redis = TestRedis::start();
    let owner = runner(Runner::redis(redis.url()), "owner").concurrency(1);
    plan(&owner).await;
    let slow = Skewed::new(Duration::from_millis(100));
    // The owner claims partition 1 first (one partition at a time, pids in order).
    let killed = {
        let (owner, slow) = (owner.clone(), slow.clone());
        tokio::spawn(async move { owner.run(slow).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let helper = runner(Runner::redis(redis.url()), "helper");
    let fast = Skewed::new(Duration::from_millis(100));
    let helping = {
        let (helper, fast) = (helper.clone(), fast.clone());
        tokio::spawn(async move { helper.run(fast).await })
    };
    // Once partition 1 was cut and a piece of it ran a chunk (on either process), kill
    // the owner: its part, and the piece if it took it, are left to expire.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let mut seen = slow.seen.lock().unwrap().clone();
        seen.extend(fast.seen.lock().unwrap().iter().copied());
        if was_split(&seen) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "partition 1 was never split"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    killed.abort();
    let _ = killed.await;
    let report = tokio::time::timeout(Duration::from_secs(60), helping)
        .await
        .expect("the helper finishes the job")
        .unwrap()
        .unwrap();
    assert_eq!(
        (report.namespace.outstanding, report.namespace.failed),
        (0, 0),
        "{report:?}"
    );
    let mut seen = slow.seen.lock().unwrap().clone();
    seen.extend(fast.seen.lock().unwrap().iter().copied());
    let missing: Vec<u64> = times(&seen)
        .into_iter()
        .filter(|(_, n)| *n == 0)
        .map(|(id, _)| id)
        .take(5)
        .collect();
    assert!(missing.is_empty(), "never processed: {missing:?}");
    let status = helper.job().await.unwrap().status().await.unwrap();
    assert_eq!(
        status.completed, 4,
        "each partition counted once: {status:?}"
    );
}

/// Partition 1's chunks are slow (40 of 100 ms: a lease straggles after a quarter of a
/// second) and
/// fail wherever they run in a piece (a chunk of a
/// piece is numbered from the piece's first ID, so its `from` is not the owner's for
/// its index); the rest succeed. `permanent`: each failure says no retry can help.
#[derive(Clone)]
struct FailsInPieces {
    permanent: bool,
}

#[async_trait::async_trait]
impl Handler for FailsInPieces {
    async fn process(&self, chunk: Chunk) -> Result<(), HandlerError> {
        if chunk.pid != 1 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        if chunk.from == 1 + chunk.index * 10 {
            return Ok(());
        }
        let error = format!("piece chunk {}..={} fails", chunk.from, chunk.to);
        Err(if self.permanent {
            HandlerError::permanent(error)
        } else {
            HandlerError::from(error)
        })
    }
}

/// A piece whose chunks always fail spends its attempts and then fails its partition:
/// the run ends (no retrying for ever) with partition 1 failed, whole again, and the
/// rest completed. Returns partition 1's failed attempts as the run saw them.
async fn a_failing_piece_fails_its_partition(r: Runner, permanent: bool) -> Vec<Event> {
    use tranche_worker::{PartitionView, Status};
    let events: Arc<Mutex<Vec<Event>>> = Arc::default();
    let r = r
        .max_attempts(3)
        .backoff(Duration::from_millis(20))
        .on_event({
            let events = events.clone();
            move |e| events.lock().unwrap().push(e.clone())
        });
    plan(&r).await;
    let report = tokio::time::timeout(Duration::from_secs(60), r.run(FailsInPieces { permanent }))
        .await
        .expect("the run ends: a failing piece is not retried for ever")
        .unwrap();
    assert_eq!(
        (
            report.this_runner.failed_pids.as_slice(),
            report.namespace.failed,
            report.namespace.outstanding,
        ),
        (&[1][..], 1, 0),
        "{report:?}"
    );
    // Partition 1 is not counted, even when its owner part ends before the piece fails
    // it: only a partition's last part counts it.
    assert_eq!(report.this_runner.completed, 3, "{report:?}");
    let status = r.job().await.unwrap().status().await.unwrap();
    assert_eq!(status.completed, 3, "{status:?}");
    let PartitionView::Active(p) = r.job().await.unwrap().get(1).await.unwrap() else {
        panic!("partition 1 is not active");
    };
    assert_eq!(
        (p.status, p.min_id, p.max_id),
        (Status::Failed, 1, 400),
        "{p:?}"
    );
    let error = p.last_error.unwrap_or_default();
    assert!(error.contains("failed: piece chunk "), "{error}");
    let events = events.lock().unwrap();
    events
        .iter()
        .filter(|e| matches!(e, Event::AttemptFailed { pid: 1, .. }))
        .cloned()
        .collect()
}

/// One of partition 1's failed attempts ended it, on the piece's last attempt
/// (`max_attempts` 3); every other one was retried.
fn ended_on_the_last_attempt(failed: &[Event]) {
    let (ended, retried): (Vec<&Event>, Vec<&Event>) = failed
        .iter()
        .partition(|e| matches!(e, Event::AttemptFailed { retry_in: None, .. }));
    assert!(
        matches!(
            ended.as_slice(),
            [Event::AttemptFailed {
                attempt: 3,
                permanent: false,
                ..
            }]
        ),
        "{failed:?}"
    );
    assert!(retried.len() >= 2, "{failed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_piece_fails_its_partition_on_redis() {
    let redis = TestRedis::start();
    let r = runner(Runner::redis(redis.url()), "w1");
    ended_on_the_last_attempt(&a_failing_piece_fails_its_partition(r, false).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_piece_fails_its_partition_embedded() {
    let dir = std::env::temp_dir().join(format!("tranche-split-fail-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let r = runner(Runner::embedded(dir.join("s.state")), "w1");
    ended_on_the_last_attempt(&a_failing_piece_fails_its_partition(r, false).await);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A permanent failure of a piece's chunk fails the partition at once, on the piece's
/// first attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_piece_failure_fails_its_partition_at_once() {
    let redis = TestRedis::start();
    let r = runner(Runner::redis(redis.url()), "w1");
    let failed = a_failing_piece_fails_its_partition(r, true).await;
    // Every failure is permanent: the first one reported fails the partition, and the
    // other pieces' holders find their leases lost.
    assert!(
        matches!(
            failed.as_slice(),
            [Event::AttemptFailed {
                attempt: 1,
                permanent: true,
                retry_in: None,
                ..
            }]
        ),
        "{failed:?}"
    );
}

/// Holds every chunk run in a piece of partition 1 until `go` turns true (partition 1's
/// own chunks take 100 ms, the rest none), and says when the first one started.
#[cfg(feature = "cli")]
#[derive(Clone)]
struct HeldPieces {
    go: tokio::sync::watch::Receiver<bool>,
    held: Arc<std::sync::atomic::AtomicBool>,
}

#[cfg(feature = "cli")]
#[async_trait::async_trait]
impl Handler for HeldPieces {
    async fn process(&self, chunk: Chunk) -> Result<(), HandlerError> {
        if chunk.pid != 1 {
            return Ok(());
        }
        if chunk.from == 1 + chunk.index * 10 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            return Ok(());
        }
        self.held.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = self.go.clone().wait_for(|go| *go).await;
        Ok(())
    }
}

/// `tranche get` of a split partition lists its pieces while it runs, with their
/// holder, range and progress, in text and JSON; the run then completes it once.
#[cfg(feature = "cli")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_lists_a_running_partitions_pieces() {
    use crate::common::{output, scratch, tranche};
    let redis = TestRedis::start();
    let r = runner(Runner::redis(redis.url()), "w1");
    plan(&r).await;
    let (go, rx) = tokio::sync::watch::channel(false);
    let handler = HeldPieces {
        go: rx,
        held: Arc::default(),
    };
    let running = {
        let (r, handler) = (r.clone(), handler.clone());
        tokio::spawn(async move { r.run(handler).await })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !handler.held.load(std::sync::atomic::Ordering::SeqCst) {
        assert!(
            std::time::Instant::now() < deadline,
            "partition 1 was never split"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (dir, url) = (scratch("split-get"), redis.url());
    let get = move |json: bool| {
        let mut args = vec!["--redis", url.as_str(), "--namespace", "split"];
        if json {
            args.push("--json");
        }
        args.extend(["get", "1"]);
        let out = output(tranche(&dir, &args));
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let (text, json) = tokio::task::spawn_blocking(move || (get(false), get(true)))
        .await
        .unwrap();
    let _ = go.send(true);

    assert!(
        text.contains("split off, each under its own lease") && text.contains("  w1  attempt 1"),
        "{text}"
    );
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let pieces = v["pieces"].as_array().expect("a pieces array");
    assert!(!pieces.is_empty(), "{v}");
    let first = &pieces[0];
    assert_eq!(
        (&first["worker"], &first["attempt"]),
        (&serde_json::json!("w1"), &serde_json::json!(1)),
        "{v}"
    );
    let (min, max) = (
        first["min_id"].as_u64().unwrap(),
        first["max_id"].as_u64().unwrap(),
    );
    assert!(
        v["max_id"].as_u64().unwrap() < min && min <= max && max <= 400,
        "{v}"
    );
    assert!(first["checkpoint"].as_u64().unwrap() >= min, "{v}");

    let report = tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .expect("the run ends once the pieces go on")
        .unwrap()
        .unwrap();
    assert_eq!(
        (report.namespace.outstanding, report.namespace.failed),
        (0, 0),
        "{report:?}"
    );
}
