//! Checked reads: nothing in a stored record makes a reader panic or allocate by it.

use proptest::prelude::*;
use serde_json::{Map, Value, json};
use tranche_control::{ControlRecord, ProbeStale, Rate};

/// Numbers a flipped byte or a foreign writer leaves: bounds, just past them, huge.
fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!(0)),
        Just(json!(-1)),
        Just(json!(1)),
        Just(json!(65_536)),
        Just(json!(65_537)),
        Just(json!(4_294_967_295u64)),
        Just(json!(u64::MAX)),
        Just(json!(i64::MIN)),
        Just(json!(1e12)),
        Just(json!(1e300)),
        Just(json!(1e-300)),
        Just(json!(0.5)),
        Just(json!(1e14)),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("JSON has no NaN", |f| f.is_finite())
            .prop_map(|f| json!(f)),
    ]
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number(),
        ".{0,20}".prop_map(Value::String),
        Just(json!("01:00-02:00")),
        Just(json!("Europe/Paris")),
        Just(Value::String("x".repeat(2_000))),
    ]
}

const NAMES: &[&str] = &[
    "version",
    "settings",
    "manual",
    "probe",
    "probes",
    "max_rate",
    "max_partitions_rate",
    "concurrency",
    "chunk",
    "parallel",
    "chunk_time_ms",
    "chunk_min",
    "chunk_max",
    "keep_below",
    "active_hours",
    "tz",
    "reason",
    "since_ms",
    "origin",
    "throttled",
    "value",
    "error",
    "rate",
    "at_ms",
    "expires_ms",
    "worker",
    "w1",
    "",
];

fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(NAMES), inner), 0..8).prop_map(|kv| {
                Value::Object(kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
            }),
        ]
    })
}

/// A record-shaped object: the top-level names with arbitrary values.
pub(crate) fn record() -> impl Strategy<Value = Value> {
    prop::collection::vec((prop::sample::select(NAMES), value()), 0..8).prop_map(|kv| {
        Value::Object(
            kv.into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect::<Map<_, _>>(),
        )
    })
}

/// Every use a worker makes of a record, so a panic anywhere shows.
fn use_all(r: &ControlRecord) {
    let _ = r.throttle_in_force(1_768_435_200_000, ProbeStale::Throttle);
    let _ = r.throttled();
    let _ = r.ids_rate(Rate::per_second(10.0).ok());
    let _ = r.partitions_rate(None);
    let _ = r.active_hours().map(|h| h.is_active(1_768_435_200_000));
}

fn check(bytes: &[u8]) -> Result<(), TestCaseError> {
    let r = ControlRecord::decode(bytes);
    use_all(&r);
    let s = &r.settings;
    // What a reader applies is within what the window and the limiter can take.
    prop_assert!(s.parallel.is_none_or(|p| (1..=65_536).contains(&p)));
    prop_assert!(s.concurrency.is_none_or(|p| (1..=65_536).contains(&p)));
    for c in [s.chunk, s.chunk_min, s.chunk_max].into_iter().flatten() {
        prop_assert!((1..=1_000_000_000_000).contains(&c));
    }
    prop_assert!(
        s.chunk_time_ms
            .is_none_or(|t| (1..=86_400_000).contains(&t))
    );
    for rate in [s.max_rate, s.max_partitions_rate].into_iter().flatten() {
        prop_assert!(Rate::per_second(rate).is_ok());
    }
    prop_assert!(
        r.findings()
            .all(|p| p.throttled.as_ref().is_none_or(|t| t.reason.len() <= 512))
    );
    // What a reader kept is itself valid: decoding it again rejects nothing.
    let again = ControlRecord::decode(serde_json::to_string(&r).unwrap().as_bytes());
    prop_assert!(again.rejected.is_empty(), "{:?}", again.rejected);
    prop_assert_eq!(
        ControlRecord {
            rejected: Vec::new(),
            ..r
        },
        again
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn arbitrary_records_decode_value_by_value(record in record()) {
        check(record.to_string().as_bytes())?;
    }

    #[test]
    fn arbitrary_bytes_decode(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        check(&bytes)?;
    }

    #[test]
    fn a_flipped_byte_in_a_valid_record_decodes(at in any::<prop::sample::Index>(), bit in 0u8..8) {
        let mut bytes = json!({
            "version": 12,
            "settings": {"chunk": 500, "parallel": 4, "max_rate": 250.5, "tz": "UTC",
                "active_hours": "22:00-06:00"},
            "manual": {"reason": "vacuum", "since_ms": 1_768_435_200_000u64, "origin": "o"},
            "probes": {"w1": {"throttled": {"reason": "lag", "since_ms": 1}, "at_ms": 5,
                "expires_ms": 10, "worker": "w1"}},
        })
        .to_string()
        .into_bytes();
        let i = at.index(bytes.len());
        bytes[i] ^= 1 << bit;
        check(&bytes)?;
    }
}

#[test]
fn the_issues_records_are_read_safely() {
    for (raw, key) in [
        (r#"{"version":1,"settings":{"chunk":0}}"#, "settings.chunk"),
        (
            r#"{"version":1,"settings":{"parallel":4294967295}}"#,
            "settings.parallel",
        ),
        (
            r#"{"version":1,"settings":{"max_rate":1e-300}}"#,
            "settings.max_rate",
        ),
        (r#"{"version":"x","settings":{}}"#, "version"),
    ] {
        let r = ControlRecord::decode(raw.as_bytes());
        assert_eq!(r.rejected.len(), 1, "{raw}");
        assert_eq!(r.rejected[0].key, key);
        assert_eq!(r.settings, Default::default(), "{raw}");
        assert!(r.rejected[0].to_string().starts_with(key));
    }
}

/// The two backends agree on a corrupt record: a probe report and a `set` over it keep
/// and drop the same values on Redis (probe.lua, set.lua) as in memory (the Rust
/// rules), and throttle alike.
#[test]
fn set_over_a_corrupt_record_agrees_on_both_backends() {
    use std::sync::Arc;
    use tranche_codec::{KeySchema, ManualClock};
    use tranche_control::{
        Change, ControlKeys, ControlStore, MemoryControlStore, RedisControlStore,
    };

    let server = crate::support::TestRedis::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let schema = KeySchema::new("elk", 4).unwrap();
    let key = ControlKeys::new(&schema).record();
    let conn = runtime.block_on(async {
        redis::Client::open(server.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    });
    let config = ProptestConfig::with_cases(400);
    proptest!(config, |(record in record())| {
        let raw = record.to_string();
        server.cli(&["FLUSHALL"]);
        server.cli(&["SET", &key, &raw]);
        let clock = Arc::new(ManualClock::new(1_000));
        let redis = RedisControlStore::new(conn.clone(), &schema, clock.clone());
        let memory = MemoryControlStore::new(clock);
        memory.put_raw(raw.as_bytes());
        // A probe report over it: both refuse it, or both record the same finding.
        let report = tranche_control::ProbeReport {
            throttle: Some("lag".into()),
            ttl_ms: Some(5_000),
            ..Default::default()
        };
        let (reported_redis, reported_memory) = runtime.block_on(async {
            (
                redis.report_probe("w1", &report).await.is_ok(),
                memory.report_probe("w1", &report).await.is_ok(),
            )
        });
        prop_assert_eq!(reported_redis, reported_memory, "{}", raw);
        let change = [Change::Parallel(Some(3))];
        let (on_redis, in_memory) = runtime.block_on(async {
            (redis.set(&change, "o").await, memory.set(&change, "o").await)
        });
        let (on_redis, in_memory) = (on_redis.unwrap(), in_memory.unwrap());
        // The same settings and throttles either way. (Not the whole record: cjson
        // keeps 14 significant digits of a probe's value, and set.lua leaves bad
        // manual and probe values for the readers to drop again.)
        // Floats as cjson writes them back: 14 significant digits (set.lua re-encodes the
        // record; the memory store keeps every bit). A threshold or a rate loses nothing
        // that matters there.
        let digits14 = |x: Option<f64>| x.map(|v| format!("{v:.13e}").parse::<f64>().unwrap());
        let cjson = |s: &tranche_control::Settings| {
            let mut s = s.clone();
            s.max_rate = digits14(s.max_rate);
            s.max_partitions_rate = digits14(s.max_partitions_rate);
            s.keep_below = digits14(s.keep_below);
            s
        };
        prop_assert_eq!(cjson(&on_redis.settings), cjson(&in_memory.settings), "{}", raw);
        prop_assert_eq!(on_redis.version, in_memory.version, "{}", raw);
        prop_assert_eq!(&on_redis.manual, &in_memory.manual, "{}", raw);
        let throttles = |r: &ControlRecord| -> Vec<_> {
            r.findings()
                .map(|p| (p.worker.clone(), p.throttled.clone(), p.at_ms, p.expires_ms))
                .collect()
        };
        prop_assert_eq!(throttles(&on_redis), throttles(&in_memory), "{}", raw);
        for at in [0, 1_000, u64::MAX / 2] {
            prop_assert_eq!(
                on_redis.throttle_in_force(at, ProbeStale::Throttle),
                in_memory.throttle_in_force(at, ProbeStale::Throttle),
                "{}", raw
            );
        }
    });
}
