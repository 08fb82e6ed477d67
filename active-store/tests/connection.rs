//! Connecting: passwords, TLS, a dropped connection, and a server that is not there.

mod support;

use std::time::{Duration, Instant};

use tranche_active_store::{
    Config, Error, Leases, Plan, Planner, RedisActiveStore, RedisConnection,
};

use support::TestRedis;

async fn round_trip(conn: RedisConnection) {
    let store = RedisActiveStore::new(conn, Config::default()).unwrap();
    store
        .plan(&Plan::Uniform {
            min: 1,
            max: 10_000,
            size: 1000,
        })
        .await
        .unwrap();
    let lease = store.claim("w", 1).await.unwrap().remove(0);
    store.complete(&lease, 5).await.unwrap();
}

#[tokio::test]
async fn a_password_in_the_url_authenticates() {
    let server = TestRedis::start_with_password("s3cret");
    let url = format!("redis://:s3cret@127.0.0.1:{}", server.port());
    round_trip(RedisConnection::connect(&url).await.unwrap()).await;

    let err = RedisConnection::connect(&server.url()).await.unwrap_err();
    assert!(
        err.to_string().contains("NOAUTH") || err.to_string().to_lowercase().contains("auth"),
        "{err}"
    );
}

#[tokio::test]
async fn rediss_urls_speak_tls() {
    let dir = std::env::temp_dir().join(format!("tranche-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cert =
        rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let (cert_path, key_path) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert_path, cert.cert.pem()).unwrap();
    std::fs::write(&key_path, cert.signing_key.serialize_pem()).unwrap();
    let server = TestRedis::start_tls(&cert_path, &key_path);
    round_trip(RedisConnection::connect(&server.tls_url()).await.unwrap()).await;
    // The same server refuses plain text: TLS was really in use.
    assert!(RedisConnection::connect(&server.url()).await.is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_dropped_connection_is_retried() {
    let server = TestRedis::start();
    let conn = RedisConnection::connect(&server.url()).await.unwrap();
    let store = RedisActiveStore::new(conn, Config::default()).unwrap();
    store
        .plan(&Plan::Uniform {
            min: 1,
            max: 10_000,
            size: 1000,
        })
        .await
        .unwrap();
    for round in 0..3 {
        // Kill every normal client connection, ours included.
        let killed = server.cli(&["CLIENT", "KILL", "TYPE", "normal"]);
        assert_ne!(killed, "0", "round {round}: nothing was killed");
        let lease = store
            .claim("w", 1)
            .await
            .expect("the first command after a drop is retried");
        assert_eq!(lease.len(), 1);
    }
}

#[tokio::test]
async fn an_unreachable_server_fails_fast_and_says_so() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let start = Instant::now();
    let err = RedisConnection::connect(&format!("redis://127.0.0.1:{port}"))
        .await
        .unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "took {:?}",
        start.elapsed()
    );
    let text = Error::from(err).to_string();
    assert!(text.starts_with("redis: "), "{text}");
    assert!(
        text.to_lowercase().contains("refused") || text.to_lowercase().contains("connect"),
        "{text}"
    );
}

#[tokio::test]
async fn a_bad_url_is_an_error_not_a_panic() {
    for url in ["", "http://127.0.0.1:6379", "redis://", "redis://:@:99999"] {
        assert!(RedisConnection::connect(url).await.is_err(), "{url:?}");
    }
}
