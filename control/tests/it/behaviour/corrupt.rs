//! A record no worker takes on faith: bad values dropped one by one, an unreadable
//! record that throttles, and the repair from the control log.

use super::*;

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
