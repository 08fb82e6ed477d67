//! Probing: one leader per term, findings from every prober, long reasons, the prober's
//! rate driving, `--keep-below`, and a worker held from before its first result.

use super::*;

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
