//! Connecting: passwords, TLS, a dropped connection, and a server that is not there.

use crate::pki;
use crate::support;

use std::time::{Duration, Instant};

use tranche_active_store::{
    Config, Error, Leases, Plan, Planner, RedisActiveStore, RedisConnection, TlsOptions,
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

/// Without `#insecure`, a certificate the system does not trust is refused; the CA file
/// that signed it makes it trusted; a server that demands client certificates accepts
/// ours and refuses a connection without one.
#[tokio::test]
async fn tls_verifies_against_a_ca_file_and_presents_a_client_certificate() {
    let dir = std::env::temp_dir().join(format!("tranche-pki-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let [ca, cert, key, client_cert, client_key] = pki::write(&dir);
    let url = |server: &TestRedis| format!("rediss://127.0.0.1:{}", server.port());

    let server = TestRedis::start_tls(&cert, &key);
    let err = RedisConnection::connect(&url(&server)).await.unwrap_err();
    assert!(
        err.to_string().to_lowercase().contains("certificate"),
        "{err}"
    );
    let trusted = TlsOptions::from_files(Some(&ca), None, None).unwrap();
    round_trip(
        RedisConnection::connect_with(&url(&server), &trusted)
            .await
            .unwrap(),
    )
    .await;
    drop(server);

    let server = TestRedis::start_mtls(&cert, &key, &ca);
    let err = RedisConnection::connect_with(&url(&server), &trusted)
        .await
        .unwrap_err();
    assert!(!err.to_string().is_empty());
    let mtls = TlsOptions::from_files(Some(&ca), Some(&client_cert), Some(&client_key)).unwrap();
    round_trip(
        RedisConnection::connect_with(&url(&server), &mtls)
            .await
            .unwrap(),
    )
    .await;

    // Options with a plain URL are refused, not ignored; half a key pair too.
    let err = RedisConnection::connect_with(&server.url(), &trusted)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("rediss://"), "{err}");
    let err = TlsOptions::from_files(None, Some(&client_cert), None).unwrap_err();
    assert!(err.to_string().contains("needs its key"), "{err}");
    let err = TlsOptions::from_files(Some(&dir.join("nope.pem")), None, None).unwrap_err();
    assert!(err.to_string().contains("nope.pem"), "{err}");
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
