//! The control store's behaviour, one suite run on the memory and the Redis backend.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use tranche_codec::{KeySchema, ManualClock};
use tranche_control::{
    ActiveHours, Change, ControlKeys, ControlStore, ControlWatcher, FnProbe, MemoryControlStore,
    ProbeOutcome, ProbeReport, ProbeStale, Prober, ProberConfig, Rate, RedisControlStore,
    TRUNCATED, UNREADABLE_THROTTLE,
};

use support::TestRedis;

const T0: u64 = 1_768_435_200_000;

type PutRaw = Box<dyn Fn(&[u8]) + Send + Sync>;
type Quarantined = Box<dyn Fn() -> Option<Vec<u8>> + Send + Sync>;

/// One backend under test: the store, its clock, how to end the probe leader's term,
/// how to store raw bytes as the record (a foreign writer, a flipped byte) and what was
/// quarantined.
struct Backend {
    store: Arc<dyn ControlStore>,
    clock: Arc<ManualClock>,
    end_term: Box<dyn Fn() + Send + Sync>,
    put_raw: PutRaw,
    quarantined: Quarantined,
    _server: Option<TestRedis>,
}

fn memory() -> Backend {
    let clock = Arc::new(ManualClock::new(T0));
    let moved = clock.clone();
    let store = Arc::new(MemoryControlStore::new(clock.clone()));
    let (raw, quarantine) = (store.clone(), store.clone());
    Backend {
        store,
        clock,
        end_term: Box::new(move || moved.advance(3_600_000)),
        put_raw: Box::new(move |bytes| raw.put_raw(bytes)),
        quarantined: Box::new(move || quarantine.quarantined()),
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
    let keys = ControlKeys::new(&schema);
    let prober = keys.prober();
    let url = server.url();
    let raw_url = server.url();
    let record = keys.record();
    let quarantine_url = server.url();
    let quarantine = keys.quarantine();
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
        put_raw: Box::new(move |bytes| {
            let client = redis::Client::open(raw_url.as_str()).unwrap();
            let mut c = client.get_connection().unwrap();
            let _: () = redis::cmd("SET")
                .arg(&record)
                .arg(bytes)
                .query(&mut c)
                .unwrap();
        }),
        quarantined: Box::new(move || {
            let client = redis::Client::open(quarantine_url.as_str()).unwrap();
            let mut c = client.get_connection().unwrap();
            redis::cmd("GET").arg(&quarantine).query(&mut c).unwrap()
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
    assert!(store.lead_probes("w1", term).await.unwrap().leads);
    assert!(!store.lead_probes("w2", term).await.unwrap().leads);
    assert!(store.lead_probes("w1", term).await.unwrap().leads);
    let throttle = ProbeReport {
        throttle: Some("lag 9000 ms".into()),
        value: Some(9000.0),
        rate: Some(5.0),
        ..ProbeReport::default()
    };
    // A worker that does not lead records its own finding, but no rate.
    assert!(!store.report_probe("w2", &throttle).await.unwrap());
    let record = store.read().await.unwrap();
    assert_eq!(record.probe, None);
    assert_eq!(record.probes["w2"].rate, None);
    assert_eq!(record.throttled().unwrap().reason, "lag 9000 ms");

    assert!(store.report_probe("w1", &throttle).await.unwrap());
    b.clock.advance(1_000);
    assert!(store.report_probe("w1", &throttle).await.unwrap());
    let record = store.read().await.unwrap();
    let t = record.throttled().unwrap();
    assert_eq!((t.reason.as_str(), t.since_ms), ("lag 9000 ms", T0));
    let lead = record.probe.as_ref().unwrap();
    assert_eq!(
        (lead.value, lead.rate, lead.at_ms),
        (Some(9000.0), Some(5.0), T0 + 1_000)
    );
    assert_eq!(lead.expires_ms, T0 + 1_000 + 30_000, "the default TTL");

    (b.end_term)();
    assert!(store.lead_probes("w2", term).await.unwrap().leads);
    assert!(!store.lead_probes("w1", term).await.unwrap().leads);
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

    // Each worker's flips are logged: w1 on, w2 on, w1 off, w2 off.
    let log = store.log(10).await.unwrap();
    let changes: Vec<(&str, &str)> = log
        .iter()
        .map(|e| (e.origin.as_str(), e.change.as_str()))
        .collect();
    assert_eq!(
        changes,
        [
            ("probe@w2", "probe throttle off"),
            ("probe@w1", "probe throttle off"),
            ("probe@w1", "probe throttle on: lag 9000 ms"),
            ("probe@w2", "probe throttle on: lag 9000 ms"),
        ]
    );
}

both!(any_live_prober_holds_the_fleet, any_live_prober);
/// Findings from probers that disagree: a throttle from any live one holds; a finding
/// nobody renews is stale and throttles unless `go` was chosen; with no finding at all
/// nothing is probed (the worker side waits for its own first result).
async fn any_live_prober(b: Backend) {
    let store = &b.store;
    let record = store.read().await.unwrap();
    assert_eq!(
        record.throttle_in_force(T0, ProbeStale::Throttle),
        None,
        "missing: none"
    );
    let go = ProbeReport {
        ttl_ms: Some(5_000),
        ..ProbeReport::default()
    };
    let lag = ProbeReport {
        throttle: Some("replica lag 9s".into()),
        ttl_ms: Some(10_000),
        ..ProbeReport::default()
    };
    store
        .lead_probes("w1", Duration::from_secs(3))
        .await
        .unwrap();
    store.report_probe("w1", &go).await.unwrap();
    store.report_probe("w2", &lag).await.unwrap();
    let now = |r: &tranche_control::ControlRecord, at: u64| {
        r.throttle_in_force(at, ProbeStale::Throttle)
            .map(|t| t.reason)
    };
    let r = store.read().await.unwrap();
    assert_eq!(
        now(&r, T0 + 1).as_deref(),
        Some("replica lag 9s"),
        "w1's go does not override w2"
    );
    // Late: w2 stops renewing; once its finding expires, w1's live go holds.
    b.clock.advance(9_000);
    store.report_probe("w1", &go).await.unwrap();
    let r = store.read().await.unwrap();
    assert!(now(&r, T0 + 9_999).is_some());
    assert_eq!(
        now(&r, T0 + 10_000),
        None,
        "w2's finding expired, w1's go is live"
    );
    // Nobody renews: stale throttles, unless the operator chose go.
    let stale = now(&r, T0 + 14_000).expect("stale findings throttle");
    assert!(stale.contains("no prober renewed"), "{stale}");
    assert_eq!(r.throttle_in_force(T0 + 14_000, ProbeStale::Go), None);
    assert_eq!(
        r.throttled_as_of(T0 + 14_000, Duration::from_secs(30)),
        None,
        "the old entry point ignores stale findings"
    );
    // Corrupt: an unreadable finding is a stale one, so it holds only when no live
    // finding does.
    let mut raw = serde_json::to_value(&r).unwrap();
    raw["probes"]["w3"] = serde_json::json!("garbage");
    (b.put_raw)(raw.to_string().as_bytes());
    let r = store.read().await.unwrap();
    assert_eq!(r.rejected.len(), 1, "{:?}", r.rejected);
    assert_eq!(r.rejected[0].key, "probes.w3");
    assert_eq!(now(&r, T0 + 10_500), None, "w1's live go holds");
    assert!(now(&r, T0 + 14_000).is_some());

    // A worker that stops on purpose retires its finding: it does not go stale.
    assert!(store.retire_probe("w1").await.unwrap());
    assert!(
        !store.retire_probe("w1").await.unwrap(),
        "nothing left to retire"
    );
    let r = store.read().await.unwrap();
    assert!(!r.probes.contains_key("w1"));
    assert!(
        store
            .lead_probes("w2", Duration::from_secs(3))
            .await
            .unwrap()
            .leads,
        "lead given up"
    );
}

both!(a_long_probe_reason_is_cut_not_refused, long_reasons);
/// Oversized: a probe that prints 600 bytes throttles with its reason cut and marked.
async fn long_reasons(b: Backend) {
    let store = &b.store;
    let report = ProbeReport {
        throttle: Some("é".repeat(300)),
        error: Some("x".repeat(600)),
        value: Some(f64::NAN),
        ..ProbeReport::default()
    };
    store.report_probe("w1", &report).await.unwrap();
    let r = store.read().await.unwrap();
    assert!(r.rejected.is_empty(), "{:?}", r.rejected);
    let t = r.throttle_in_force(T0, ProbeStale::Throttle).unwrap();
    assert!(
        t.reason.len() <= 512 && t.reason.ends_with(TRUNCATED),
        "{}",
        t.reason
    );
    assert!(t.reason.starts_with("éé"));
    let error = r.probes["w1"].error.clone().unwrap();
    assert!(error.len() <= 512 && error.ends_with(TRUNCATED));
    // A value that is not a number throttles rather than being refused.
    store
        .report_probe(
            "w2",
            &ProbeReport {
                value: Some(f64::INFINITY),
                ..ProbeReport::default()
            },
        )
        .await
        .unwrap();
    let r = store.read().await.unwrap();
    assert!(r.probes["w2"].throttled.is_some());
}

both!(bad_values_are_dropped_one_by_one, corrupt_values);
/// Corrupt: a record any Redis writer could leave is read value by value, and `set`
/// and `throttle on` work over it, keeping the good values.
async fn corrupt_values(b: Backend) {
    (b.put_raw)(
        br#"{"version":7,"settings":{"chunk":0,"parallel":4294967295,"concurrency":"x",
            "max_rate":1e-300,"chunk_min":50,"chunk_max":10,
            "active_hours":"01:00-02:00","keep_below":12.5},"extra":1}"#,
    );
    let r = b.store.read().await.unwrap();
    let mut keys: Vec<&str> = r.rejected.iter().map(|x| x.key.as_str()).collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "extra",
            "settings.chunk",
            "settings.chunk_max",
            "settings.chunk_min",
            "settings.concurrency",
            "settings.max_rate",
            "settings.parallel",
        ]
    );
    assert_eq!(r.version, 7);
    assert_eq!(r.settings.keep_below, Some(12.5));
    assert_eq!(r.settings.active_hours.as_deref(), Some("01:00-02:00"));
    assert_eq!((r.settings.chunk, r.settings.parallel), (None, None));
    assert_eq!(r.throttled(), None);

    let set = b
        .store
        .set(&[Change::Parallel(Some(4))], "host/1/ann")
        .await
        .unwrap();
    assert_eq!(set.version, 8);
    assert_eq!(set.settings.parallel, Some(4));
    assert_eq!(set.settings.keep_below, Some(12.5), "a good value is kept");
    let on = b
        .store
        .throttle(true, "vacuum", "host/1/ann")
        .await
        .unwrap();
    assert_eq!(on.throttled().unwrap().reason, "vacuum");
    let r = b.store.read().await.unwrap();
    assert!(
        r.rejected.is_empty(),
        "set dropped the bad values: {:?}",
        r.rejected
    );
    assert_eq!(r.settings.chunk, None);

    // A zone the time-zone database does not know is dropped with its reason.
    (b.put_raw)(br#"{"version":1,"settings":{"active_hours":"01:00-02:00","tz":"Mars/Base"}}"#);
    let r = b.store.read().await.unwrap();
    assert_eq!(r.rejected.len(), 1);
    assert_eq!(r.rejected[0].key, "settings.tz");
    assert_eq!(r.settings.tz, None);

    // A manual throttle that cannot be read still throttles.
    (b.put_raw)(br#"{"version":1,"settings":{},"manual":"yes"}"#);
    let r = b.store.read().await.unwrap();
    assert_eq!(r.throttled().unwrap().reason, UNREADABLE_THROTTLE);
}

both!(
    a_record_that_is_not_json_throttles_until_replaced,
    unreadable_record
);
async fn unreadable_record(b: Backend) {
    let inf = br#"{"version":1,"settings":{"chunk":5},"probe":{"value":1e999}}"#;
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    let nested = format!(r#"{{"version":1,"settings":{{}},"x":{deep}}}"#);
    for junk in [
        &b"{not json"[..],
        b"\xff\xfe",
        b"[1,2]",
        b"\"text\"",
        b"",
        inf,
        nested.as_bytes(),
    ] {
        (b.put_raw)(junk);
        let r = b.store.read().await.unwrap();
        assert_eq!(r.rejected.len(), 1, "{junk:?}");
        assert_eq!(r.rejected[0].key, "record");
        assert_eq!(
            r.throttled().unwrap().reason,
            UNREADABLE_THROTTLE,
            "fail closed"
        );
        // A reporter must not erase a throttle it cannot read.
        assert!(
            b.store
                .report_probe("w", &ProbeReport::default())
                .await
                .is_err()
        );
    }
    let huge = format!(
        r#"{{"version":1,"settings":{{}},"pad":"{}"}}"#,
        "x".repeat(300_000)
    );
    (b.put_raw)(huge.as_bytes());
    assert_eq!(b.store.read().await.unwrap().rejected[0].key, "record");

    for junk in [&b"{not json"[..], inf] {
        (b.put_raw)(junk);
        let set = b
            .store
            .set(&[Change::Parallel(Some(3))], "o")
            .await
            .unwrap();
        assert_eq!(set.settings.parallel, Some(3));
        assert_eq!(
            set.settings.chunk, None,
            "a record that is not JSON keeps nothing"
        );
        assert!(set.rejected.is_empty(), "{:?}", set.rejected);
        assert_eq!(set.throttled(), None, "the operator's set replaced it");
        assert_eq!((b.quarantined)().as_deref(), Some(junk));
    }
}

both!(repair_quarantines_and_restores_from_the_log, repair);
async fn repair(b: Backend) {
    let store = &b.store;
    assert_eq!(
        store.repair("o").await.unwrap(),
        None,
        "missing: nothing to do"
    );
    for chunk in [200, 300] {
        store
            .set(&[Change::Chunk(Some(chunk))], "ann")
            .await
            .unwrap();
    }
    store
        .set(&[Change::Concurrency(Some(4))], "ann")
        .await
        .unwrap();
    store.throttle(true, "vacuum", "bob").await.unwrap();
    assert_eq!(
        store.repair("o").await.unwrap(),
        None,
        "a valid record is left alone"
    );
    let bad = br#"{"version":4,"settings":{"chunk":0,"concurrency":4},"manual":7}"#;
    (b.put_raw)(bad);
    let repaired = store.repair("host/1/op").await.unwrap().unwrap();
    let mut keys: Vec<&str> = repaired.rejected.iter().map(|r| r.key.as_str()).collect();
    keys.sort();
    assert_eq!(keys, ["manual", "settings.chunk"]);
    let r = store.read().await.unwrap();
    assert!(r.rejected.is_empty(), "{:?}", r.rejected);
    assert_eq!(r, repaired.record);
    assert_eq!(
        (r.settings.chunk, r.settings.concurrency),
        (Some(300), Some(4))
    );
    let m = r.manual.as_ref().unwrap();
    assert_eq!((m.reason.as_str(), m.origin.as_str()), ("vacuum", "bob"));
    assert_eq!(r.version, 5);
    assert_eq!((b.quarantined)().as_deref(), Some(&bad[..]));
    let log = store.log(1).await.unwrap();
    assert_eq!(log[0].origin, "host/1/op");
    let note = &log[0].change;
    assert!(note.starts_with("repair: dropped "), "{note}");
    assert!(note.contains("chunk from the log (v2)"), "{note}");
    assert!(
        note.contains("manual throttle on from the log (v4)"),
        "{note}"
    );

    // A record that is not JSON is rebuilt from the log alone.
    (b.put_raw)(b"\x00garbage");
    store.repair("host/1/op").await.unwrap().unwrap();
    let r = store.read().await.unwrap();
    assert!(r.rejected.is_empty());
    assert_eq!(
        (r.settings.chunk, r.settings.concurrency),
        (Some(300), Some(4))
    );
    assert_eq!(r.manual.unwrap().reason, "vacuum");
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
    let idle = FnProbe::new(|| async { ProbeOutcome::Go });
    let mut p2 = Prober::new(
        b.store.clone(),
        Arc::new(idle),
        b.clock.clone(),
        config("w2"),
    );

    let ttl = Some(5_000);
    assert_eq!(
        p1.step().await.unwrap(),
        ProbeReport {
            ttl_ms: ttl,
            ..ProbeReport::default()
        }
    );
    assert_eq!(
        p2.step().await.unwrap(),
        ProbeReport {
            ttl_ms: ttl,
            ..ProbeReport::default()
        },
        "w2 probes too"
    );

    *value.lock().unwrap() = ProbeOutcome::Error("exit 2".into());
    let report = p1.step().await.unwrap();
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
    let report = p1.step().await.unwrap();
    assert_eq!(report.rate, Some(700.0));
    assert_eq!(
        p2.step().await.unwrap().rate,
        None,
        "only the leader sets a rate"
    );
    let record = b.store.read().await.unwrap();
    assert_eq!(record.throttled(), None);
    assert_eq!(
        record.ids_rate(None),
        Some(Rate::per_second(700.0).unwrap())
    );
    *value.lock().unwrap() = ProbeOutcome::Value(10.0);
    let report = p1.step().await.unwrap();
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
        prober.step().await.unwrap();
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

both!(
    a_fleet_that_starts_throttled_holds_from_the_first_chunk,
    starts_throttled
);
/// With a probe configured, a worker's own prober holds it before its first result,
/// while its probe throttles, when it cannot report, and when it stops reporting.
async fn starts_throttled(b: Backend) {
    let lag = FnProbe::new(|| async {
        ProbeOutcome::Throttle {
            reason: "replica lag 9s".into(),
        }
    });
    let config = ProberConfig {
        worker: "w1".into(),
        interval: Duration::from_millis(100),
        max_rate: None,
        floor: 1.0,
    };
    config.check().unwrap();
    let stale = Duration::from_secs(1);
    let prober = Prober::new(b.store.clone(), Arc::new(lag), b.clock.clone(), config);
    let (task, mut own) = prober.spawn_watched();
    // Missing: before the first result, nothing starts.
    assert_eq!(
        own.borrow().holds(T0, stale).as_deref(),
        Some("waiting for the first probe result")
    );
    tokio::time::timeout(Duration::from_secs(5), own.changed())
        .await
        .expect("a first result within 5 s")
        .unwrap();
    let first = own.borrow().clone();
    assert_eq!(first.holds(T0, stale).as_deref(), Some("replica lag 9s"));
    let r = b.store.read().await.unwrap();
    assert_eq!(
        r.throttle_in_force(T0, ProbeStale::Throttle)
            .unwrap()
            .reason,
        "replica lag 9s",
        "the whole fleet holds"
    );
    // Late: a report older than the bound holds too.
    assert!(
        first
            .holds(T0 + 1_001, stale)
            .unwrap()
            .contains("not reported")
    );
    // Corrupt: a record the prober must not overwrite makes its step fail: it holds.
    (b.put_raw)(b"{not json");
    let failed = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            own.changed().await.unwrap();
            let state = own.borrow().clone();
            if matches!(state, tranche_control::OwnProbe::Failed { .. }) {
                return state;
            }
        }
    })
    .await
    .expect("a failed step within 5 s");
    assert!(
        failed
            .holds(T0, stale)
            .unwrap()
            .starts_with("the probe cannot report")
    );
    task.abort();
    // A fresh go lets chunks start.
    let go = tranche_control::OwnProbe::Reported {
        report: ProbeReport::default(),
        at_ms: T0,
    };
    assert_eq!(go.holds(T0 + 1_000, stale), None);
    // An interval past its bound is refused by name.
    let long = ProberConfig {
        worker: "w1".into(),
        interval: Duration::from_secs(21 * 60),
        max_rate: None,
        floor: 1.0,
    };
    let err = long.check().unwrap_err().to_string();
    assert!(err.contains("throttle interval"), "{err}");
}
