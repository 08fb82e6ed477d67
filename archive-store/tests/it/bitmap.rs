//! The archived bitmap past 64 KB is grown by `archive.lua` to just under a jemalloc
//! size class, not doubled by Redis: its memory stays within a quarter of its bits.

use crate::support;

use std::sync::Arc;

use tranche_active_store::RedisConnection;
use tranche_archive_store::{ArchiveQuery, Archiver, Config, Lookup, RedisArchive, Tier};
use tranche_codec::{CompletedRecord, encode_json};

fn record(pid: u64) -> CompletedRecord {
    CompletedRecord {
        pid,
        min_id: (pid - 1) * 1000 + 1,
        max_id: pid * 1000,
        worker: Arc::from("worker1"),
        completed_at_ms: 1_719_234_405_000 + pid,
        duration_ms: 295_000,
    }
}

/// Completes `pids` as the active store would (index bit, inbox entry) and archives them.
async fn complete_and_archive(
    server: &support::TestRedis,
    archive: &RedisArchive<RedisConnection>,
    pids: &[u64],
) {
    let schema = Config::default().schema().unwrap();
    for &pid in pids {
        let _: Vec<i64> = server.query(
            redis::cmd("BITFIELD")
                .arg(schema.completed_index(0))
                .arg("SET")
                .arg("u1")
                .arg(schema.bit_offset(pid))
                .arg(1),
        );
        let _: String = server.query(
            redis::cmd("XADD")
                .arg(schema.inbox(0))
                .arg("*")
                .arg("r")
                .arg(encode_json(&record(pid))),
        );
    }
    for _ in 0..10 {
        let pass = archive.archive_once().await.unwrap();
        assert_eq!(pass.dead_lettered, 0, "{pass:?}");
        if pass.entries == 0 {
            return;
        }
    }
    panic!("the inbox did not drain in 10 passes");
}

#[tokio::test]
async fn a_large_archived_bitmap_is_grown_to_a_size_class() {
    let server = support::TestRedis::start();
    let conn = RedisConnection::connect(&server.url()).await.unwrap();
    let config = Config {
        consumer: "test".into(),
        ..Config::default()
    };
    let key = config.schema().unwrap().shard_key(0, "archived");
    let archive = RedisArchive::new(conn, config).unwrap();
    let strlen =
        |server: &support::TestRedis| -> u64 { server.query(redis::cmd("STRLEN").arg(&key)) };

    // Below 64 KB Redis grows the bitmap as it always did.
    complete_and_archive(&server, &archive, &[1000]).await;
    assert_eq!(strlen(&server), 1000 / 8 + 1);
    // 1,000,000 bits need 125,001 bytes: grown to the 128 KB class less its header
    // and NUL, where Redis would have doubled it to 250,002 (a 256 KB allocation).
    complete_and_archive(&server, &archive, &[1_000_000]).await;
    assert_eq!(strlen(&server), 131_072 - 10);
    let used: u64 = server.query(redis::cmd("MEMORY").arg("USAGE").arg(&key));
    assert!(used < 140_000, "{used} bytes");
    // Within the padding, nothing grows; past it, the next class (160 KB).
    complete_and_archive(&server, &archive, &[1_040_000]).await;
    assert_eq!(strlen(&server), 131_072 - 10);
    complete_and_archive(&server, &archive, &[1_100_000]).await;
    assert_eq!(strlen(&server), 163_840 - 10);
    // Every record reads back, and a pid in the zero padding is unknown, not archived.
    for pid in [1000, 1_000_000, 1_040_000, 1_100_000] {
        assert_eq!(
            archive.get(pid).await.unwrap(),
            Lookup::Archived {
                record: record(pid),
                tier: Tier::Simple
            },
            "pid {pid}"
        );
    }
    assert!(
        !matches!(
            archive.get(1_100_001).await.unwrap(),
            Lookup::Archived { .. }
        ),
        "pid 1,100,001 was never archived"
    );
}
