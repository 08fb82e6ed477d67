//! The control store's behaviour, one suite run on the memory and the Redis backend.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use tranche_codec::{KeySchema, ManualClock};
use tranche_control::{
    ActiveHours, Change, ControlKeys, ControlStore, ControlWatcher, FnProbe, MemoryControlStore,
    ProbeOutcome, ProbeReport, Prober, ProberConfig, Rate, RedisControlStore,
};

use support::TestRedis;

const T0: u64 = 1_768_435_200_000;

/// One backend under test: the store, its clock, and how to end the probe leader's term.
struct Backend {
    store: Arc<dyn ControlStore>,
    clock: Arc<ManualClock>,
    end_term: Box<dyn Fn() + Send + Sync>,
    _server: Option<TestRedis>,
}

fn memory() -> Backend {
    let clock = Arc::new(ManualClock::new(T0));
    let moved = clock.clone();
    Backend {
        store: Arc::new(MemoryControlStore::new(clock.clone())),
        clock,
        end_term: Box::new(move || moved.advance(3_600_000)),
        _server: None,
    }
}

async fn redis() -> Backend {
    let server = TestRedis::start();
    let conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let schema = KeySchema::new("elk", 4).unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let prober = ControlKeys::new(&schema).prober();
    let url = server.url();
    Backend {
        store: Arc::new(RedisControlStore::new(conn, &schema, clock.clone())),
        clock,
        // Forces the term's end with PEXPIRE rather than racing its TTL.
        end_term: Box::new(move || {
            let client = redis::Client::open(url.as_str()).unwrap();
            let mut c = client.get_connection().unwrap();
            let _: i64 = redis::cmd("PEXPIRE")
                .arg(&prober)
                .arg(1)
                .query(&mut c)
                .unwrap();
            std::thread::sleep(Duration::from_millis(5));
        }),
        _server: Some(server),
    }
}

/// Runs `check` on both backends.
macro_rules! both {
    ($name:ident, $check:ident) => {
        mod $name {
            #[tokio::test]
            async fn memory() {
                super::$check(super::memory()).await;
            }
            #[tokio::test]
            async fn redis() {
                super::$check(super::redis().await).await;
            }
        }
    };
}

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

both!(one_worker_leads_the_probes, leadership);
async fn leadership(b: Backend) {
    let store = &b.store;
    let term = Duration::from_secs(3);
    assert!(store.lead_probes("w1", term).await.unwrap());
    assert!(!store.lead_probes("w2", term).await.unwrap());
    assert!(store.lead_probes("w1", term).await.unwrap());
    let throttle = ProbeReport {
        throttle: Some("lag 9000 ms".into()),
        value: Some(9000.0),
        ..ProbeReport::default()
    };
    // A worker that does not lead writes nothing.
    assert!(!store.report_probe("w2", &throttle).await.unwrap());
    assert_eq!(store.read().await.unwrap().probe, None);

    assert!(store.report_probe("w1", &throttle).await.unwrap());
    b.clock.advance(1_000);
    assert!(store.report_probe("w1", &throttle).await.unwrap());
    let record = store.read().await.unwrap();
    let t = record.throttled().unwrap();
    assert_eq!((t.reason.as_str(), t.since_ms), ("lag 9000 ms", T0));
    assert_eq!(record.probe.as_ref().unwrap().value, Some(9000.0));
    assert_eq!(record.probe.as_ref().unwrap().at_ms, T0 + 1_000);
    let stale = Duration::from_secs(10);
    assert!(record.throttled_as_of(T0 + 11_000, stale).is_some());
    assert!(record.throttled_as_of(T0 + 11_001, stale).is_none());

    (b.end_term)();
    assert!(store.lead_probes("w2", term).await.unwrap());
    assert!(!store.lead_probes("w1", term).await.unwrap());
    assert!(
        !store
            .report_probe("w1", &ProbeReport::default())
            .await
            .unwrap()
    );
    assert!(
        store
            .report_probe("w2", &ProbeReport::default())
            .await
            .unwrap()
    );
    assert_eq!(store.read().await.unwrap().throttled(), None);

    // Only the flips are logged: on (by w1) and off (by w2).
    let log = store.log(10).await.unwrap();
    let changes: Vec<(&str, &str)> = log
        .iter()
        .map(|e| (e.origin.as_str(), e.change.as_str()))
        .collect();
    assert_eq!(
        changes,
        [
            ("probe@w2", "probe throttle off"),
            ("probe@w1", "probe throttle on: lag 9000 ms")
        ]
    );
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

both!(the_prober_throttles_and_drives_the_rate, prober);
async fn prober(b: Backend) {
    let value = Arc::new(std::sync::Mutex::new(ProbeOutcome::Go));
    let v = value.clone();
    let probe = FnProbe::new(move || {
        let outcome = v.lock().unwrap().clone();
        async move { outcome }
    });
    let config = |worker: &str| ProberConfig {
        worker: worker.into(),
        interval: Duration::from_secs(1),
        max_rate: None,
        floor: 1.0,
    };
    let mut p1 = Prober::new(
        b.store.clone(),
        Arc::new(probe),
        b.clock.clone(),
        config("w1"),
    );
    let idle = FnProbe::new(|| async {
        ProbeOutcome::Throttle {
            reason: "never".into(),
        }
    });
    let mut p2 = Prober::new(
        b.store.clone(),
        Arc::new(idle),
        b.clock.clone(),
        config("w2"),
    );

    assert_eq!(p1.step().await.unwrap(), Some(ProbeReport::default()));
    assert_eq!(p2.step().await.unwrap(), None, "w2 does not lead");

    *value.lock().unwrap() = ProbeOutcome::Error("exit 2".into());
    let report = p1.step().await.unwrap().unwrap();
    assert_eq!(report.throttle.as_deref(), Some("probe error: exit 2"));
    assert!(b.store.read().await.unwrap().throttled().is_some());

    // keep_below with a ceiling: a value above the target cuts the rate to 70 %.
    b.store
        .set(
            &[
                Change::MaxRate(Some(Rate::per_second(1000.0).unwrap())),
                Change::KeepBelow(Some(50.0)),
            ],
            "o",
        )
        .await
        .unwrap();
    *value.lock().unwrap() = ProbeOutcome::Value(80.0);
    let report = p1.step().await.unwrap().unwrap();
    assert_eq!(report.rate, Some(700.0));
    let record = b.store.read().await.unwrap();
    assert_eq!(record.throttled(), None);
    assert_eq!(
        record.ids_rate(None),
        Some(Rate::per_second(700.0).unwrap())
    );
    *value.lock().unwrap() = ProbeOutcome::Value(10.0);
    let report = p1.step().await.unwrap().unwrap();
    assert_eq!(report.rate, Some(710.0));
}

both!(keep_below_holds_a_metric_under_its_target, keep_below);
/// The whole loop through the store: a probe whose metric follows the rate in force
/// (with a lag) is held within 10 % of the target once settled, and not far below it.
async fn keep_below(b: Backend) {
    let target = 200.0;
    b.store
        .set(
            &[
                Change::MaxRate(Some(Rate::per_second(5_000.0).unwrap())),
                Change::KeepBelow(Some(target)),
            ],
            "o",
        )
        .await
        .unwrap();
    // The plant: metric → rate / 10 (so 2.5 × the target at the ceiling), closing half
    // the gap per step.
    let metric = Arc::new(std::sync::Mutex::new(0.0f64));
    let (m, store) = (metric.clone(), b.store.clone());
    let probe = FnProbe::new(move || {
        let (m, store) = (m.clone(), store.clone());
        async move {
            let rate = store.read().await.unwrap().ids_rate(None).unwrap().get();
            let mut m = m.lock().unwrap();
            *m += 0.5 * (rate / 10.0 - *m);
            ProbeOutcome::Value(*m)
        }
    });
    let config = ProberConfig {
        worker: "w1".into(),
        interval: Duration::from_secs(1),
        max_rate: None,
        floor: 10.0,
    };
    let mut prober = Prober::new(b.store.clone(), Arc::new(probe), b.clock.clone(), config);
    let mut settled = Vec::new();
    for step in 0..400 {
        prober.step().await.unwrap().expect("w1 leads");
        b.clock.advance(1_000);
        if step >= 100 {
            settled.push(*metric.lock().unwrap());
        }
    }
    let worst = settled.iter().cloned().fold(0.0, f64::max);
    let mean = settled.iter().sum::<f64>() / settled.len() as f64;
    assert!(worst <= 1.1 * target, "worst {worst}");
    assert!(mean >= 0.7 * target, "mean {mean}");
}
