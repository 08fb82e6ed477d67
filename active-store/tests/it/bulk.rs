//! `all_active` over a [`RedisConnection`] reads on the store's own bulk connection
//! (`tranche-bulk` in `CLIENT LIST`), scanning the replies in place. Whatever happens to
//! that connection, it answers exactly what the ordinary read through redis-rs answers.

use crate::support;

use redis::aio::ConnectionManager;
use tranche_active_store::{
    ActiveQuery, ActiveSnapshot, Config, Leases, Plan, Planner, RedisActiveStore, RedisConnection,
};

use support::TestRedis;

fn config() -> Config {
    Config {
        num_shards: 4,
        ..Config::default()
    }
}

/// A store reading the ordinary way only: redis-rs's own connection manager.
async fn plain(url: &str) -> RedisActiveStore<ConnectionManager> {
    let conn = redis::Client::open(url)
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    RedisActiveStore::new(conn, config()).unwrap()
}

/// Partitions in every state, explicit ranges beside a uniform plan, and error texts
/// with the record separator and line breaks in them.
async fn busy(store: &RedisActiveStore) {
    store
        .plan(&Plan::Uniform {
            min: 1,
            max: 3_000_000,
            size: 1000,
        })
        .await
        .unwrap();
    store
        .plan(&Plan::Ranges(vec![
            5_000_001..=5_000_100,
            u64::MAX - 10..=u64::MAX,
        ]))
        .await
        .unwrap();
    let leases = store.claim("worker-a", 1500).await.unwrap();
    assert_eq!(leases.len(), 1500);
    for (i, lease) in leases.iter().enumerate() {
        match i % 5 {
            0 => store.heartbeat(lease, lease.min_id + 250).await.unwrap(),
            1 => {
                store
                    .fail(lease, &format!("boom | {i}\nsecond line, Ünïcode"))
                    .await
                    .unwrap();
            }
            2 => store.release(lease, lease.min_id + 10).await.unwrap(),
            3 => {
                store.complete(lease, 1234).await.unwrap();
            }
            _ => {}
        }
    }
    store.claim("worker-b", 100).await.unwrap();
}

/// A store at `url`, with [`busy`]'s partitions in it, and its connection.
async fn busy_store(url: &str) -> (RedisConnection, RedisActiveStore) {
    let conn = RedisConnection::connect(url).await.unwrap();
    let store = RedisActiveStore::new(conn.clone(), config()).unwrap();
    busy(&store).await;
    (conn, store)
}

/// `CLIENT LIST`, asked on `conn` (a connection that is already there).
async fn client_list(conn: &RedisConnection) -> String {
    redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut conn.clone())
        .await
        .unwrap()
}

/// Every client named `tranche-bulk`, by id.
async fn bulk_clients(conn: &RedisConnection) -> Vec<String> {
    client_list(conn)
        .await
        .lines()
        .filter(|l| l.contains(" name=tranche-bulk "))
        .filter_map(|l| l.split(' ').next()?.strip_prefix("id=").map(str::to_owned))
        .collect()
}

/// The snapshot has something of every kind in it, so an equality means something.
fn assert_rich(s: &ActiveSnapshot) {
    assert!(s.partitions.len() > 1000, "{}", s.partitions.len());
    assert!(s.partitions.iter().any(|p| p.last_error.is_some()));
    assert!(s.partitions.iter().any(|p| p.progress > p.min_id));
    assert!(!s.unissued.is_empty());
}

#[tokio::test]
async fn the_bulk_read_answers_what_the_ordinary_read_answers() {
    let server = TestRedis::start();
    let (conn, store) = busy_store(&server.url()).await;
    assert!(
        bulk_clients(&conn).await.is_empty(),
        "opened on first use only"
    );
    let fast = store.all_active().await.unwrap();
    assert_eq!(
        bulk_clients(&conn).await.len(),
        1,
        "read on the bulk connection"
    );
    assert_rich(&fast);
    assert_eq!(fast, plain(&server.url()).await.all_active().await.unwrap());
    // Kept, not reopened, for the next read.
    let id = bulk_clients(&conn).await;
    assert_eq!(store.all_active().await.unwrap(), fast);
    assert_eq!(bulk_clients(&conn).await, id);
}

#[tokio::test]
async fn a_password_and_a_database_in_the_url_apply_to_the_bulk_connection() {
    let server = TestRedis::start_with_password("s3cret");
    let url = format!("redis://:s3cret@127.0.0.1:{}/3", server.port());
    let (conn, store) = busy_store(&url).await;
    let fast = store.all_active().await.unwrap();
    assert_rich(&fast);
    assert_eq!(fast, plain(&url).await.all_active().await.unwrap());
    // Database 3 it was: database 0 holds nothing.
    let url0 = format!("redis://:s3cret@127.0.0.1:{}/0", server.port());
    assert!(
        plain(&url0)
            .await
            .all_active()
            .await
            .unwrap()
            .partitions
            .is_empty()
    );
    let clients = client_list(&conn).await;
    assert!(
        clients
            .lines()
            .any(|l| l.contains("name=tranche-bulk") && l.contains(" db=3 ")),
        "{clients}"
    );
}

#[tokio::test]
async fn a_killed_bulk_connection_is_replaced() {
    let server = TestRedis::start();
    let (conn, store) = busy_store(&server.url()).await;
    let before = store.all_active().await.unwrap();
    for round in 0..3 {
        let ids = bulk_clients(&conn).await;
        assert_eq!(ids.len(), 1, "round {round}");
        assert_eq!(server.cli(&["CLIENT", "KILL", "ID", &ids[0]]), "1");
        assert_eq!(store.all_active().await.unwrap(), before, "round {round}");
        let now = bulk_clients(&conn).await;
        assert_eq!(now.len(), 1, "round {round}");
        assert_ne!(now, ids, "round {round}: a new connection");
    }
}

#[tokio::test]
async fn a_bulk_connection_that_cannot_be_had_falls_back_to_the_ordinary_read() {
    let server = TestRedis::start();
    let (conn, store) = busy_store(&server.url()).await;
    let reference = plain(&server.url()).await;
    let expected = reference.all_active().await.unwrap();
    // Every client slot is taken: the server turns the bulk connection away.
    let connected = client_list(&conn)
        .await
        .lines()
        .filter(|l| !l.is_empty())
        .count();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxclients")
        .arg(connected)
        .query_async(&mut conn.clone())
        .await
        .unwrap();
    assert_eq!(store.all_active().await.unwrap(), expected);
    assert!(bulk_clients(&conn).await.is_empty());
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxclients")
        .arg(10_000)
        .query_async(&mut conn.clone())
        .await
        .unwrap();
    // Room again: the next read opens it.
    assert_eq!(store.all_active().await.unwrap(), expected);
    assert_eq!(bulk_clients(&conn).await.len(), 1);
}

#[tokio::test]
async fn a_unix_socket_url_reads_on_a_unix_socket() {
    let path = std::env::temp_dir().join(format!("tranche-bulk-{}.sock", std::process::id()));
    let server = TestRedis::start_with_unix_socket(&path);
    let url = format!("unix://{}", path.display());
    let (conn, store) = busy_store(&url).await;
    let fast = store.all_active().await.unwrap();
    assert_rich(&fast);
    assert_eq!(fast, plain(&server.url()).await.all_active().await.unwrap());
    let socket = format!(" addr={}:0 ", path.display());
    assert!(
        client_list(&conn)
            .await
            .lines()
            .any(|l| l.contains(" name=tranche-bulk ") && l.contains(&socket)),
        "{}",
        client_list(&conn).await
    );
    drop(server);
    let _ = std::fs::remove_file(&path);
}

#[tokio::test]
async fn a_read_cancelled_halfway_leaves_no_reply_behind_for_the_next() {
    let server = TestRedis::start();
    let (_conn, store) = busy_store(&server.url()).await;
    let reference = plain(&server.url()).await;
    store.all_active().await.unwrap();
    // Cut reads off at every stage: before the write, after it, halfway through the
    // reply. Each time the namespace changes before the next whole read, which must
    // see the change, not the reply of the read that was given up.
    for (round, micros) in [0u64, 50, 100, 200, 400, 800, 1600, 3200]
        .into_iter()
        .enumerate()
    {
        let cut =
            tokio::time::timeout(std::time::Duration::from_micros(micros), store.all_active())
                .await;
        store.claim(&format!("late-{round}"), 3).await.unwrap();
        let whole = store.all_active().await.unwrap();
        let expected = reference.all_active().await.unwrap();
        assert!(
            whole == expected,
            "round {round} (cut: {}): a stale read of {} partitions, not {}",
            cut.is_err(),
            whole.partitions.len(),
            expected.partitions.len()
        );
    }
}
