//! `fail.lua`'s optional policy argument (ARGV[8]): anything but `permanent` or a
//! whole number of milliseconds is refused before the script writes anything, proven
//! by every key it can touch being byte-for-byte the same (DUMP) after the refusal.

use crate::support;

use redis::AsyncCommands;
use support::TestRedis;
use tranche_active_store::{Leases, RedisConnection};

#[tokio::test]
async fn a_bad_policy_argument_writes_nothing() {
    let server = TestRedis::start();
    let conn = RedisConnection::connect(&server.url()).await.unwrap();
    let store = crate::planned(conn, "fp", 1, (1, 100, 10)).await;
    let lease = store.claim("w", 1).await.unwrap().remove(0);
    // Out of its run into a record of its own, as the store does before it calls fail.
    store.heartbeat(&lease, lease.min_id).await.unwrap();
    let keys: Vec<String> = ["active", "leases", "pending", "counts"]
        .iter()
        .map(|k| format!("{{fp:0}}:{k}"))
        .collect();
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let dump = |mut conn: redis::aio::MultiplexedConnection, keys: Vec<String>| async move {
        let mut out = Vec::new();
        for k in &keys {
            let v: Option<Vec<u8>> = redis::cmd("DUMP")
                .arg(k)
                .query_async(&mut conn)
                .await
                .unwrap();
            out.push(v);
        }
        out
    };
    let before = dump(conn.clone(), keys.clone()).await;
    assert!(
        before[0].is_some() && before[1].is_some(),
        "the lease is in the active hash and the lease index"
    );
    let fail = tranche_active_store::scripts()
        .into_iter()
        .find(|(n, _)| *n == "fail")
        .unwrap()
        .1;
    for bad in ["soon", "-5", "1.5", "permanently"] {
        let mut call = fail.prepare_invoke();
        for k in &keys {
            call.key(k);
        }
        for a in [
            lease.pid.to_string(),
            lease.token.to_string(),
            "1719234405000".into(),
            "boom".into(),
            "3".into(),
            "1000".into(),
            "60000".into(),
            bad.to_owned(),
        ] {
            call.arg(a);
        }
        let err = call.invoke_async::<Vec<i64>>(&mut conn).await.unwrap_err();
        assert!(err.to_string().contains("retry delay"), "{bad:?}: {err}");
        assert_eq!(
            dump(conn.clone(), keys.clone()).await,
            before,
            "{bad:?} wrote"
        );
    }
    let _: () = conn.ping().await.unwrap();
}
