//! Settings an operator writes: set, refused changes, the manual throttle, the log,
//! a start-up setting that defers to a newer change, and the watcher that publishes them.

use super::*;

both!(settings_are_set_cleared_and_logged, settings);
async fn settings(b: Backend) {
    let store = &b.store;
    assert_eq!(store.read().await.unwrap().version, 0);
    let rate: Rate = "500/s".parse().unwrap();
    let hours = ActiveHours::parse("22:00-06:00", Some("Europe/Paris")).unwrap();
    let set = store
        .set(
            &[
                Change::MaxRate(Some(rate)),
                Change::Concurrency(Some(8)),
                Change::Chunk(Some(200)),
                Change::Parallel(Some(2)),
                Change::ActiveHours(Some(hours.clone())),
            ],
            "host/1/ann",
        )
        .await
        .unwrap();
    assert_eq!(set, store.read().await.unwrap());
    assert_eq!(set.version, 1);
    assert_eq!(set.settings.max_rate, Some(500.0));
    assert_eq!(set.settings.concurrency, Some(8));
    assert_eq!(set.settings.chunk, Some(200));
    assert_eq!(set.settings.parallel, Some(2));
    assert_eq!(set.active_hours(), Some(hours));
    assert_eq!(set.ids_rate(None), Some(rate));

    b.clock.advance(10);
    let cleared = store
        .set(
            &[Change::MaxRate(None), Change::ChunkTimeMs(Some(2000))],
            "host/2/bob",
        )
        .await
        .unwrap();
    assert_eq!(cleared.version, 2);
    assert_eq!(cleared.settings.max_rate, None);
    assert_eq!(cleared.settings.concurrency, Some(8));
    assert_eq!(cleared.settings.chunk_time_ms, Some(2000));
    let fallback = Rate::per_second(7.0).unwrap();
    assert_eq!(cleared.ids_rate(Some(fallback)), Some(fallback));

    let log = store.log(10).await.unwrap();
    assert_eq!(log.len(), 2);
    assert_eq!(
        (log[0].origin.as_str(), log[0].at_ms, log[0].version),
        ("host/2/bob", T0 + 10, 2)
    );
    assert!(
        log[0].change.contains("\"max_rate\":null"),
        "{}",
        log[0].change
    );
    assert_eq!(
        (log[1].origin.as_str(), log[1].at_ms, log[1].version),
        ("host/1/ann", T0, 1)
    );
}

both!(bad_changes_are_refused_and_change_nothing, refusals);
async fn refusals(b: Backend) {
    let store = &b.store;
    store
        .set(&[Change::ChunkMax(Some(100))], "o")
        .await
        .unwrap();
    let before = store.read().await.unwrap();
    let bad: Vec<Vec<Change>> = vec![
        vec![],
        vec![Change::Concurrency(Some(0))],
        vec![Change::Parallel(Some(70_000))],
        vec![Change::Chunk(Some(0))],
        vec![Change::ChunkMin(Some(101))],
        vec![Change::KeepBelow(Some(f64::NAN))],
        vec![Change::ChunkTimeMs(Some(0))],
        vec![Change::Concurrency(Some(4)), Change::Chunk(Some(0))],
    ];
    for changes in bad {
        assert!(store.set(&changes, "o").await.is_err(), "{changes:?}");
    }
    assert!(
        store
            .set(&[Change::Concurrency(Some(4))], "")
            .await
            .is_err()
    );
    assert!(store.throttle(true, &"x".repeat(600), "o").await.is_err());
    assert_eq!(store.read().await.unwrap(), before);
    assert_eq!(store.log(100).await.unwrap().len(), 1);
}

both!(the_manual_throttle_keeps_its_start, manual_throttle);
async fn manual_throttle(b: Backend) {
    let store = &b.store;
    let on = store
        .throttle(true, "backup running", "host/1/ann")
        .await
        .unwrap();
    let t = on.throttled().unwrap();
    assert_eq!((t.reason.as_str(), t.since_ms), ("backup running", T0));
    assert_eq!(on.manual.as_ref().unwrap().origin, "host/1/ann");
    b.clock.advance(5_000);
    let again = store
        .throttle(true, "backup still running", "host/2/bob")
        .await
        .unwrap();
    let t = again.throttled().unwrap();
    assert_eq!(
        (t.reason.as_str(), t.since_ms),
        ("backup still running", T0)
    );
    // A manual throttle never goes stale.
    let far = T0 + 1_000_000_000;
    assert!(again.throttled_as_of(far, Duration::from_secs(1)).is_some());
    let off = store.throttle(false, "", "host/1/ann").await.unwrap();
    assert_eq!(off.throttled(), None);
    assert_eq!(off.version, 3);
    assert_eq!(store.log(100).await.unwrap().len(), 3);
}

both!(the_log_keeps_the_last_hundred, log_cap);
async fn log_cap(b: Backend) {
    for i in 1..=130u32 {
        b.store
            .set(&[Change::Concurrency(Some(i))], "o")
            .await
            .unwrap();
    }
    let log = b.store.log(1_000).await.unwrap();
    assert_eq!(log.len(), 100);
    assert_eq!(log[0].version, 130);
    assert_eq!(log[99].version, 31);
    assert_eq!(b.store.log(3).await.unwrap().len(), 3);
}

both!(a_start_up_setting_defers_to_a_newer_change, unless_changed);
/// `--keep-below` at start never overwrites an operator's later `set`.
async fn unless_changed(b: Backend) {
    let store = &b.store;
    let keep = [Change::KeepBelow(Some(50.0)), Change::Chunk(Some(9))];
    let first = store
        .set_unless_changed(&keep, "w@start", T0)
        .await
        .unwrap();
    assert!(first.skipped.is_empty());
    b.clock.advance(10);
    store.set(&[Change::KeepBelow(None)], "op").await.unwrap();
    b.clock.advance(10);
    // The worker restarts; its run began at T0 + 5: the operator's change is newer.
    let again = store
        .set_unless_changed(&keep, "w@start", T0 + 5)
        .await
        .unwrap();
    assert_eq!(again.skipped, ["keep_below"]);
    assert_eq!(again.record.settings.keep_below, None);
    assert_eq!(again.record.settings.chunk, Some(9));
    let all = store
        .set_unless_changed(&[Change::KeepBelow(Some(50.0))], "w@start", T0 + 5)
        .await
        .unwrap();
    assert_eq!(all.skipped, ["keep_below"]);
    assert_eq!(all.record.version, again.record.version, "nothing written");
    // Since after the operator's change: applied.
    let later = store
        .set_unless_changed(&[Change::KeepBelow(Some(40.0))], "w@start", T0 + 15)
        .await
        .unwrap();
    assert!(later.skipped.is_empty());
    assert_eq!(later.record.settings.keep_below, Some(40.0));
    // A bad value is refused even where it would be skipped.
    assert!(
        store
            .set_unless_changed(&[Change::Chunk(Some(0))], "w", T0)
            .await
            .is_err()
    );
    // A log that no longer reaches back to `since`: every setting counts as changed.
    for i in 1..=100u32 {
        b.clock.advance(1);
        store
            .set(&[Change::Concurrency(Some(i))], "op")
            .await
            .unwrap();
    }
    let full = store
        .set_unless_changed(&[Change::Parallel(Some(2))], "w@start", T0 + 20)
        .await
        .unwrap();
    assert_eq!(full.skipped, ["parallel"]);
}

both!(the_watcher_publishes_a_change, watcher);
async fn watcher(b: Backend) {
    let watcher = ControlWatcher::start(b.store.clone(), Duration::from_millis(50))
        .await
        .unwrap();
    let mut rx = watcher.subscribe();
    assert_eq!(watcher.current().version, 0);
    b.store
        .set(&[Change::Concurrency(Some(3))], "o")
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), rx.changed())
        .await
        .expect("the watcher published within 5 s")
        .unwrap();
    assert_eq!(rx.borrow().settings.concurrency, Some(3));
}
