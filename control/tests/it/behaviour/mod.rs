//! The control store's behaviour, one suite run on the memory and the Redis backend:
//! the backends and the `both!` macro here, the cases by concern in the modules below.

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
                super::$check(crate::behaviour::memory()).await;
            }
            #[tokio::test]
            async fn redis() {
                super::$check(crate::behaviour::redis().await).await;
            }
        }
    };
}

mod corrupt;
mod probes;
mod settings;
