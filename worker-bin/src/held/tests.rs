//! The lease book's and the heartbeat's tests, on the memory store and paused time.

use super::beat::watchdog;
use super::*;
use tranche_active_store::ActiveStore;
use tranche_active_store::{
    ActiveQuery, Clock, Config, Leases, Maintenance, ManualClock, MemoryActiveStore, Plan, Planner,
    Splits,
};

/// One batch heartbeat where one lease of several was lost: the others are renewed
/// with their checkpoints, the lost one is marked and leaves the book.
#[tokio::test]
async fn a_lost_lease_among_several_is_marked_and_dropped() {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let config = Config {
        lease: Duration::from_secs(30),
        ..Config::default()
    };
    let store = Arc::new(MemoryActiveStore::with_clock(config, clock.clone()).unwrap());
    store
        .plan(&Plan::Uniform {
            min: 1,
            max: 10_000,
            size: 1000,
        })
        .await
        .unwrap();
    let leases = store.claim("me", 3).await.unwrap();
    let book = LeaseBook::new(Duration::from_secs(30), false);
    let holds: Vec<_> = leases
        .iter()
        .map(|l| book.hold(l, false, Instant::now()))
        .collect();
    // The first and third are renewed (by a heartbeat the book did not see); the
    // second expires and goes to another worker.
    clock.advance(20_000);
    let renew = [0, 2].map(|i| (leases[i].clone(), leases[i].min_id));
    for outcome in store.heartbeat_many(&renew).await.unwrap() {
        outcome.unwrap();
    }
    clock.advance(10_000);
    assert_eq!(
        store.reap(clock.now_ms()).await.unwrap(),
        vec![leases[1].pid]
    );
    let other = store.claim("other", 1).await.unwrap();
    assert_eq!(other[0].pid, leases[1].pid);

    for i in [0, 2] {
        holds[i].advance(leases[i].min_id + 700);
    }
    book.beat(store.as_ref(), &|_| {}, false).await;
    assert!(!holds[0].is_lost() && !holds[2].is_lost());
    assert!(holds[1].is_lost());
    tokio::time::timeout(Duration::from_secs(1), holds[1].lost())
        .await
        .expect("the lost lease's partition is woken");
    assert_eq!(book.len(), 2);
    for i in [0, 2] {
        let p = store.get(leases[i].pid).await.unwrap().unwrap();
        assert_eq!(p.progress, leases[i].min_id + 700, "checkpoint recorded");
    }
}

/// A lease nobody renews is fenced a quarter of a lease before it could expire, and
/// not before; a renewal moves its fence on. Paused time: the watchdog sleeps on
/// tokio's clock.
#[tokio::test(start_paused = true)]
async fn the_watchdog_fences_an_unrenewed_lease_in_time() {
    let store = MemoryActiveStore::new(Config::default()).unwrap();
    store
        .plan(&Plan::Uniform {
            min: 1,
            max: 2000,
            size: 1000,
        })
        .await
        .unwrap();
    let leases = store.claim("me", 2).await.unwrap();
    let lease = Duration::from_secs(12);
    let book = Arc::new(LeaseBook::new(lease, false));
    let start = Instant::now();
    let stale = book.hold(&leases[0], false, start);
    let renewed = book.hold(&leases[1], false, start);
    let (tx, rx) = watch::channel(false);
    let dog = tokio::spawn(watchdog(book.clone(), lease, rx));
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert!(
        !stale.is_fenced(),
        "fenced before three quarters of a lease"
    );
    renewed.renewed(Instant::now());
    tokio::time::timeout(Duration::from_millis(1100), stale.fenced())
        .await
        .expect("fenced at nine seconds");
    assert!(stale.grace_left() <= Duration::from_secs(2));
    assert!(!renewed.is_fenced(), "the renewed lease runs on");
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(!renewed.is_fenced(), "its fence moved to 17 s");
    tokio::time::timeout(Duration::from_secs(4), renewed.fenced())
        .await
        .expect("fenced once its renewal ran out too");
    tx.send(true).unwrap();
    dog.await.unwrap();
}

/// A chunk's fence follows the accepted renewals, a sixth of a lease before the
/// lease's certain end, and only ever later: a late answer to an older renewal does
/// not move it back.
#[tokio::test(start_paused = true)]
async fn a_chunks_fence_follows_the_renewals() {
    let store = MemoryActiveStore::new(Config::default()).unwrap();
    store
        .plan(&Plan::Uniform {
            min: 1,
            max: 1000,
            size: 1000,
        })
        .await
        .unwrap();
    let lease = Duration::from_secs(12);
    let book = LeaseBook::new(lease, false);
    let start = Instant::now();
    let hold = book.hold(&store.claim("me", 1).await.unwrap()[0], false, start);
    let fence = hold.fence();
    let s = Duration::from_secs;
    assert_eq!(fence.stop_at(), start + s(10));
    hold.renewed(start + s(4));
    assert_eq!(fence.stop_at(), start + s(14));
    hold.renewed(start + s(3));
    assert_eq!(fence.stop_at(), start + s(14), "never moved back");
    assert!(!hold.is_fenced());
}

/// Two partitions of 1000 in a memory store, claimed by `me`; the first held by a
/// splitting book and armed (a chunk of 50 handed out); the heartbeat task running.
async fn straggler() -> (
    Arc<MemoryActiveStore>,
    Arc<LeaseBook>,
    Lease,
    Arc<Hold>,
    watch::Sender<bool>,
) {
    let store = Arc::new(MemoryActiveStore::new(Config::default()).unwrap());
    store
        .plan(&Plan::Uniform {
            min: 1,
            max: 2000,
            size: 1000,
        })
        .await
        .unwrap();
    let lease = store.claim("me", 1).await.unwrap().remove(0);
    let length = Duration::from_secs(30);
    let book = Arc::new(LeaseBook::new(length, true));
    let hold = book.hold(&lease, false, Instant::now());
    assert_eq!(hold.issue(lease.min_id, 50).await, Some(lease.min_id + 49));
    let (tx, rx) = watch::channel(false);
    let active: Arc<dyn ActiveStore> = store.clone();
    tokio::spawn(heartbeat(
        book.clone(),
        active,
        Arc::new(|_| {}),
        length,
        rx,
    ));
    (store, book, lease, hold, tx)
}

/// A partition starting does not hold the straggling leases' beats back: their
/// checkpoints reach the store every [`SPLIT_BEAT`] while the start's own beat
/// waits its [`FIRST_BEAT`].
#[tokio::test(start_paused = true)]
async fn a_start_does_not_hold_back_the_stragglers_beats() {
    let (store, book, lease, hold, done) = straggler().await;
    // Straggling from a second on.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    book.started();
    tokio::time::sleep(Duration::from_millis(10)).await;
    hold.advance(lease.min_id + 50);
    tokio::time::sleep(SPLIT_BEAT + Duration::from_millis(50)).await;
    let p = store.get(lease.pid).await.unwrap().unwrap();
    assert_eq!(p.progress, lease.min_id + 50, "beaten within a split beat");
    done.send(true).unwrap();
}

/// A part this process asked for pieces is cut at once, not at the next
/// [`SPLIT_BEAT`].
#[tokio::test(start_paused = true)]
async fn a_cut_asked_by_this_process_is_made_at_once() {
    let (store, book, lease, hold, done) = straggler().await;
    tokio::time::sleep(Duration::from_millis(1010)).await;
    hold.advance(lease.min_id + 50);
    // Running (its first beat was a second in), checkpointed at 1.25 s; the next
    // split beat is due at 1.5 s.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let part = store.split_candidates().await.unwrap().remove(0);
    assert_eq!(part.progress, lease.min_id + 50);
    let asked = store
        .request_pieces(&part, "me", &[(lease.min_id + 500, lease.min_id + 900)])
        .await
        .unwrap();
    assert_eq!(
        asked,
        tranche_active_store::SplitAnswer::Requested {
            point: lease.min_id + 500
        }
    );
    book.cut_asked();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(hold.end(), lease.min_id + 499, "cut in the beat it woke");
    done.send(true).unwrap();
}

/// A beat that cut the lease, its reply lost (the cut made in the store, the
/// answer never read: a timeout, a dropped connection), leaves the lease frozen:
/// nothing is handed out. The next answered beat, which finds no request any more,
/// still tells the part's end, and the owner stops at the cut.
#[tokio::test]
async fn a_cut_whose_reply_was_lost_is_learnt_at_the_next_beat() {
    let store = Arc::new(MemoryActiveStore::new(Config::default()).unwrap());
    store
        .plan(&Plan::Uniform {
            min: 1,
            max: 1000,
            size: 1000,
        })
        .await
        .unwrap();
    let lease = store.claim("me", 1).await.unwrap().remove(0);
    let book = LeaseBook::new(Duration::from_secs(30), true);
    let hold = book.hold(&lease, false, Instant::now());
    assert_eq!(hold.issue(lease.min_id, 50).await, Some(lease.min_id + 49));
    hold.advance(lease.min_id + 50);
    // Marked running with its checkpoint, then asked for pieces from 500 on.
    book.beat(store.as_ref(), &|_| {}, false).await;
    let part = store.split_candidates().await.unwrap().remove(0);
    store
        .request_pieces(&part, "other", &[(lease.min_id + 500, lease.min_id + 999)])
        .await
        .unwrap();
    // The beat that cuts: sent as the book sends it, its answer dropped.
    let beat = PartBeat {
        lease: lease.clone(),
        piece: false,
        progress: lease.min_id + 50,
        next: hold.freeze(),
    };
    let lost = store.beat_parts(&[beat]).await.unwrap();
    assert!(matches!(lost[0], Ok(Beat::Cut { .. })), "{lost:?}");
    assert_eq!(hold.end(), lease.max_id, "the owner never heard of the cut");
    let frozen = tokio::time::timeout(
        Duration::from_millis(100),
        hold.issue(lease.min_id + 50, 50),
    );
    assert!(frozen.await.is_err(), "a frozen lease hands nothing out");
    // The next beat finds no request: renewed, with the part's end.
    book.beat(store.as_ref(), &|_| {}, false).await;
    assert_eq!(hold.end(), lease.min_id + 499);
    assert_eq!(
        hold.issue(lease.min_id + 450, 100).await,
        Some(lease.min_id + 499),
        "the last chunk stops at the cut"
    );
    assert_eq!(hold.issue(lease.min_id + 500, 50).await, None);
}
