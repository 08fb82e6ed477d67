//! The run loop: taking over a dead archiver's entries, snapshots, woken passes over
//! dirty shards, reads spaced out.

use super::*;

#[tokio::test]
async fn a_dead_archivers_entries_are_taken_over() {
    for shards in [1, 4] {
        let h = Harness::new(Kind::Redis, shards).await;
        let Backend::Redis(_, conn) = &h.backend else {
            unreachable!()
        };
        let mut c = conn.clone();
        let recs = records(1..=400);
        h.complete(&recs[..200]).await;
        // The dead archiver read (so its entries are pending) but never wrote or acked:
        // simulated with a bare XREADGROUP under its consumer name.
        read_as(&h, "dead").await;
        // A live colleague with a long idle time takes nothing of the dead one's.
        h.complete(&recs[200..]).await;
        let patient = h.another("patient", Duration::from_secs(3600)).unwrap();
        let pass = drain(&*patient).await;
        assert_eq!((pass.claimed, pass.archived), (0, 200), "{pass:?}");
        // Replayed completions of archived pids, read by a second archiver that dies.
        h.complete(&recs[200..300]).await;
        read_as(&h, "dead2").await;
        assert_eq!(drain(&*patient).await, ArchivePass::default());
        // The taker, with a short idle time, finishes both dead archivers' work: the
        // fresh records once, the replayed ones not at all.
        tokio::time::sleep(Duration::from_millis(30)).await;
        let taker = h.another("taker", Duration::from_millis(10)).unwrap();
        let pass = drain(&*taker).await;
        assert!(pass.claimed >= 1, "{pass:?}");
        assert_eq!((pass.archived, pass.duplicates), (200, 100), "{pass:?}");
        for (r, found) in recs.iter().zip(h.get_all(pids(&recs)).await) {
            assert_eq!(found, archived(r, Tier::Simple));
        }
        h.assert_stats(&recs).await;
        // Nothing pending anywhere.
        for shard in h.schema.shards() {
            let len: usize = c.xlen(h.schema.inbox(shard)).await.unwrap();
            assert_eq!(len, 0, "shard {shard}");
        }
    }
}

#[tokio::test]
async fn a_final_drain_takes_over_after_its_own_idle_time() {
    for shards in [1, 4] {
        let h = Harness::new(Kind::Redis, shards).await;
        let Backend::Redis(_, conn) = &h.backend else {
            unreachable!()
        };
        let mut c = conn.clone();
        let recs = records(1..=200);
        h.complete(&recs).await;
        read_as(&h, "dead").await;
        // An archiver whose sweeps wait an hour for a dead colleague's entries...
        let patient = h.another("patient", Duration::from_secs(3600)).unwrap();
        assert_eq!(drain(&*patient).await, ArchivePass::default());
        assert_eq!(
            patient
                .archive_taking_over(Duration::from_secs(3600))
                .await
                .unwrap(),
            ArchivePass::default()
        );
        // ...takes them over at the end of a job once they sat the drain's idle time.
        tokio::time::sleep(Duration::from_millis(30)).await;
        let mut total = ArchivePass::default();
        loop {
            let pass = patient
                .archive_taking_over(Duration::from_millis(10))
                .await
                .unwrap();
            total.add(pass);
            if pass.entries == 0 {
                break;
            }
        }
        assert!(total.claimed >= 1, "{total:?}");
        assert_eq!((total.archived, total.duplicates), (200, 0), "{total:?}");
        h.assert_stats(&recs).await;
        for shard in h.schema.shards() {
            let len: usize = c.xlen(h.schema.inbox(shard)).await.unwrap();
            assert_eq!(len, 0, "shard {shard}");
        }
    }
}

/// Reads every inbox entry as consumer `name` of the archivers' group, and dies.
pub(super) async fn read_as(h: &Harness, name: &str) {
    let Backend::Redis(_, conn) = &h.backend else {
        unreachable!()
    };
    let mut c = conn.clone();
    for shard in h.schema.shards() {
        let created: redis::RedisResult<redis::Value> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(h.schema.inbox(shard))
            .arg("archivers")
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut c)
            .await;
        assert!(created.is_ok() || created.unwrap_err().code() == Some("BUSYGROUP"));
        let _: redis::Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg("archivers")
            .arg(name)
            .arg("COUNT")
            .arg(1000)
            .arg("STREAMS")
            .arg(h.schema.inbox(shard))
            .arg(">")
            .query_async(&mut c)
            .await
            .unwrap();
    }
}

/// The archiver loop ([`tranche_archive_store::run`]) with `policy`, on a task of its
/// own; dropping or firing the sender stops it.
pub(super) fn start_run(
    h: &Harness,
    policy: SnapshotPolicy,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let archiver = h.archiver.clone();
    let snapshots = Snapshots {
        stats: h.stats.clone(),
        policy,
    };
    let task = tokio::spawn(async move {
        tranche_archive_store::run(&*archiver, Some(snapshots), async {
            let _ = stopped.await;
        })
        .await;
    });
    (stop, task)
}

/// Polls `check` until it returns `Some`, for at most ten seconds.
pub(super) async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The latest snapshot's version and completed count (0, 0 before the first).
pub(super) async fn latest(h: &Harness) -> (u64, u64) {
    h.stats
        .latest_snapshot()
        .await
        .unwrap()
        .map_or((0, 0), |s| {
            (s.version, s.stats.global_stats.total_completed)
        })
}

/// Completes `pid` alone (one inbox entry, so one archive batch) and waits until the
/// running archiver has archived it.
pub(super) async fn archive_alone(h: &Harness, pid: u64) {
    let r = record(pid);
    h.complete(std::slice::from_ref(&r)).await;
    eventually(&format!("pid {pid} archived"), || async {
        matches!(h.get(pid).await, Lookup::Archived { .. }).then_some(())
    })
    .await;
}

pub(super) async fn run_publishes_a_snapshot_every_n_archive_batches(kind: Kind, shards: u32) {
    let h = Harness::new(kind, shards).await;
    let policy = SnapshotPolicy {
        every: 2,
        interval: Duration::from_secs(3600),
        min_gap: Duration::ZERO,
    };
    let (stop, task) = start_run(&h, policy);
    // Every second batch publishes, off the archiving path: each snapshot holds what
    // was archived when it started, and no record is archived while one is awaited.
    for pid in 1..=6 {
        archive_alone(&h, pid).await;
        if pid % 2 == 0 {
            let want = (pid / 2, pid);
            eventually(&format!("snapshot {want:?}"), || async {
                (latest(&h).await == want).then_some(())
            })
            .await;
        } else {
            // One batch since the last snapshot: none is due. The archiver's passes go
            // on meanwhile (it polls the empty inboxes).
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert_eq!(
                latest(&h).await,
                ((pid - 1) / 2, pid - 1),
                "after pid {pid}"
            );
        }
    }
    // Passes that archive nothing (a replay of archived records) are no batches.
    h.complete(&records(1..=6)).await;
    h.complete(&records(1..=6)).await;
    eventually("the replays read", || async {
        (h.archiver.archive_once().await.unwrap().entries == 0).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(latest(&h).await, (3, 6));
    stop.send(()).unwrap();
    task.await.unwrap();
    h.assert_stats(&records(1..=6)).await;
}

pub(super) async fn run_publishes_after_the_interval_only_when_something_was_archived(
    kind: Kind,
    shards: u32,
) {
    let h = Harness::with(
        kind,
        Config {
            num_shards: shards,
            consumer: "a1".into(),
            // Idle passes at most 50 ms apart, so the interval is noticed soon after.
            block: Duration::from_millis(50),
            ..Config::default()
        },
    )
    .await;
    let policy = SnapshotPolicy {
        every: 1000,
        interval: Duration::from_millis(300),
        min_gap: Duration::ZERO,
    };
    let (stop, task) = start_run(&h, policy);
    // Idle from the start: nothing archived, nothing published.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(latest(&h).await, (0, 0));
    // One batch, far below `every`: the interval publishes it.
    archive_alone(&h, 7).await;
    eventually("a snapshot after the interval", || async {
        (latest(&h).await == (1, 1)).then_some(())
    })
    .await;
    // Idle again: more intervals pass, and no snapshot repeats the last.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(latest(&h).await, (1, 1));
    stop.send(()).unwrap();
    task.await.unwrap();
}

/// A woken pass picks its tier from the namespace's count, which other archivers move:
/// an archiver that wrote a sixteenth of the way to the next threshold since it last
/// counted counts again, so records past the threshold go to the compressed tier even
/// when another archiver wrote most of the way there. (It kept the count of its last
/// sweep plus its own writes, and in a fleet of four sharing the work went on writing
/// the simple tier to about four times the threshold.)
#[tokio::test]
async fn a_woken_pass_counts_again_as_other_archivers_write() {
    let config = Config {
        consumer: "a".into(),
        gather: Duration::ZERO,
        compressed_at: 160,
        ..Config::default()
    };
    let h = Harness::with(Kind::Redis, config).await;
    let b = h.another("b", Duration::from_secs(60)).unwrap();
    let woken = |a: &Arc<dyn Archiver>| {
        let a = a.clone();
        async move { a.archive_woken().await.unwrap().archived }
    };
    let query = h.query.clone();
    let tier = |pid| {
        let query = query.clone();
        async move {
            match query.get(pid).await.unwrap() {
                Lookup::Archived { tier, .. } => tier,
                other => panic!("pid {pid}: {other:?}"),
            }
        }
    };
    // b counts (nothing yet) and writes 20 itself.
    h.complete(&records(1..=20)).await;
    assert_eq!(woken(&b).await, 20);
    // The other archiver writes 200 more: the namespace is past the threshold.
    h.complete(&records(21..=220)).await;
    assert_eq!(woken(&h.archiver).await, 200);
    // b has written 20 since its count, more than a sixteenth of the 140 it believes
    // are left: it counts again, and writes the next records compressed.
    h.complete(&records(221..=230)).await;
    assert_eq!(woken(&b).await, 10);
    assert_eq!(tier(20).await, Tier::Simple);
    assert_eq!(tier(220).await, Tier::Simple);
    assert_eq!(tier(225).await, Tier::Compressed);
}

/// Woken passes alone (no sweep) archive everything completions marked, exactly once.
pub(super) async fn a_woken_pass_archives_what_completions_marked(kind: Kind, shards: u32) {
    let h = Harness::with(
        kind,
        Config {
            num_shards: shards,
            consumer: "a1".into(),
            batch: 3,
            gather: Duration::ZERO,
            ..Config::default()
        },
    )
    .await;
    let recs = records(1..=700);
    for part in recs.chunks(50) {
        h.complete(part).await;
    }
    let mut total = ArchivePass::default();
    loop {
        let pass = h.archiver.archive_woken().await.unwrap();
        if pass.entries == 0 {
            break;
        }
        total.add(pass);
    }
    assert_eq!(total.archived, 700);
    for r in [&recs[0], &recs[350], &recs[699]] {
        assert!(matches!(
            h.query.get(r.pid).await.unwrap(),
            Lookup::Archived { .. }
        ));
    }
    h.assert_stats(&recs).await;
}

/// `run` archives completions that arrive while it idles, through woken passes: the
/// sweep that would also find them is an hour away.
pub(super) async fn run_archives_what_arrives_while_it_idles(kind: Kind, shards: u32) {
    let h = Harness::with(
        kind,
        Config {
            num_shards: shards,
            consumer: "a1".into(),
            block: Duration::from_secs(3600),
            gather: Duration::from_millis(20),
            ..Config::default()
        },
    )
    .await;
    let (stop, task) = start_run(&h, SnapshotPolicy::default());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let recs = records(1..=300);
    h.complete(&recs).await;
    for r in [&recs[0], &recs[299]] {
        eventually(&format!("pid {} archived", r.pid), || async {
            matches!(h.query.get(r.pid).await.unwrap(), Lookup::Archived { .. }).then_some(())
        })
        .await;
    }
    stop.send(()).unwrap();
    task.await.unwrap();
    h.assert_stats(&recs).await;
}

/// Calls of `command` the server ran so far (`INFO commandstats`).
pub(super) fn calls(server: &TestRedis, command: &str) -> u64 {
    server
        .cli(&["INFO", "commandstats"])
        .lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|l| l.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// Of 64 shards with inbox entries, a woken pass reads only the one marked dirty: one
/// SPOP, no takeover, the other shards' inboxes untouched; the sweep then finds the
/// entries whose mark was lost.
pub(super) async fn woken_for_one_dirty_shard_of_64(kind: Kind) {
    let h = Harness::with(
        kind,
        Config {
            num_shards: 64,
            consumer: "a1".into(),
            ..Config::default()
        },
    )
    .await;
    let Backend::Redis(Some(server), conn) = &h.backend else {
        unreachable!("Redis only")
    };
    // Pid 3700 is in batch 37, so shard 37; pid 500 in shard 5. Neither is marked.
    let (marked, lost) = (record(3700), record(500));
    assert_eq!(h.schema.shard_of(marked.pid), 37);
    h.push_into(37, &marked).await;
    h.push_into(5, &lost).await;
    let _: i64 = conn.clone().sadd(h.schema.dirty(), 37).await.unwrap();
    let before = ["spop", "xreadgroup", "xautoclaim", "xgroup|create"].map(|c| calls(server, c));
    let pass = h.archiver.archive_woken().await.unwrap();
    let after = ["spop", "xreadgroup", "xautoclaim", "xgroup|create"].map(|c| calls(server, c));
    assert_eq!(pass.archived, 1);
    assert_eq!(after[0] - before[0], 1, "one SPOP");
    // The first visit of a shard reads this consumer's own pending entries, then new ones.
    assert_eq!(after[1] - before[1], 2, "XREADGROUP on shard 37 only");
    assert_eq!(after[2] - before[2], 0, "no takeover outside a sweep");
    assert_eq!(
        after[3] - before[3],
        1,
        "one consumer group made: shard 37's"
    );
    assert!(matches!(
        h.query.get(3700).await.unwrap(),
        Lookup::Archived { .. }
    ));
    assert!(!matches!(
        h.query.get(500).await.unwrap(),
        Lookup::Archived { .. }
    ));
    assert_eq!(h.archiver.archive_woken().await.unwrap().entries, 0);
    // The lost mark: the sweep finds its entry.
    assert_eq!(h.archiver.archive_once().await.unwrap().archived, 1);
    assert!(matches!(
        h.query.get(500).await.unwrap(),
        Lookup::Archived { .. }
    ));
    h.assert_stats(&[lost, marked]).await;
}

#[tokio::test]
async fn redis_woken_for_one_dirty_shard_of_64() {
    woken_for_one_dirty_shard_of_64(Kind::Redis).await;
}

#[tokio::test]
async fn cluster_woken_for_one_dirty_shard_of_64() {
    woken_for_one_dirty_shard_of_64(Kind::Cluster).await;
}

/// A shard whose read came back full is read again by the next woken pass without a
/// new mark; one whose read was not full waits `gather` before its next woken read.
#[tokio::test]
async fn a_full_read_is_read_again_and_gather_spaces_reads() {
    let h = Harness::with(
        Kind::Redis,
        Config {
            num_shards: 4,
            consumer: "a1".into(),
            batch: 2,
            gather: Duration::from_secs(3600),
            ..Config::default()
        },
    )
    .await;
    let Backend::Redis(_, conn) = &h.backend else {
        unreachable!()
    };
    let mark = || async {
        conn.clone()
            .sadd::<_, _, i64>(h.schema.dirty(), 1)
            .await
            .unwrap()
    };
    // Pids 101..=105: batch 1, shard 1; five entries of one record each.
    for r in records(101..=105) {
        h.push_into(1, &r).await;
    }
    mark().await;
    let entries = |p: ArchivePass| p.entries;
    assert_eq!(entries(h.archiver.archive_woken().await.unwrap()), 2);
    assert_eq!(
        entries(h.archiver.archive_woken().await.unwrap()),
        2,
        "full: read again"
    );
    assert_eq!(entries(h.archiver.archive_woken().await.unwrap()), 1);
    assert_eq!(entries(h.archiver.archive_woken().await.unwrap()), 0);
    h.push_into(1, &record(106)).await;
    mark().await;
    assert_eq!(
        entries(h.archiver.archive_woken().await.unwrap()),
        0,
        "read less than gather ago, and not full"
    );
    assert_eq!(
        h.archiver.archive_once().await.unwrap().archived,
        1,
        "the sweep does not wait"
    );
    h.assert_stats(&records(101..=106)).await;
}
