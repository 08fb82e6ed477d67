//! The namespace's archive format version (`ArchiveFormat`): a namespace keeps format 1
//! until it is raised, segments written before stay byte for byte, every reader reads
//! both layouts, and nothing of either is taken for damage (the scrub and
//! `repair_damage` are what `check --repair` runs).

use crate::support;

use std::sync::Arc;

use redis::AsyncCommands;
use tranche_active_store::RedisConnection;
use tranche_archive_store::{
    ArchiveFormat, ArchiveQuery, Archiver, Config, Export, Lookup, RedisArchive, Tier,
};
use tranche_codec::{
    BinaryV2Options, CompletedRecord, KeySchema, WorkerDict, encode_binary_v2, encode_json,
    strip_binary_v2_header,
};

use support::TestRedis;

const T0: u64 = 1_719_234_405_000;

/// Seed-shaped, eight workers in turn, odd pids with a millisecond part.
fn record(pid: u64) -> CompletedRecord {
    CompletedRecord {
        pid,
        min_id: (pid - 1) * 1000 + 1,
        max_id: pid * 1000,
        worker: Arc::from(format!("worker{}", pid % 8 + 1)),
        completed_at_ms: T0 + pid * 37_000 + (pid % 2) * 17,
        duration_ms: 200_000 + (pid * 7919) % 200_000,
    }
}

fn config(consumer: &str) -> Config {
    Config {
        consumer: consumer.into(),
        compressed_at: 0,
        summary_at: u64::MAX,
        ..Config::default()
    }
}

/// Completes `pids` into shard 0's inbox as the active store would (index bit, XADD).
async fn complete(conn: &RedisConnection, schema: &KeySchema, pids: std::ops::RangeInclusive<u64>) {
    let mut c = conn.clone();
    let recs: Vec<CompletedRecord> = pids.map(record).collect();
    for chunk in recs.chunks(100) {
        for r in chunk {
            let _: i64 = c
                .setbit(
                    schema.completed_index(0),
                    schema.bit_offset(r.pid) as usize,
                    true,
                )
                .await
                .unwrap();
        }
        let lines: Vec<String> = chunk.iter().map(encode_json).collect();
        let _: String = c
            .xadd(schema.inbox(0), "*", &[("r", lines.join("\n"))])
            .await
            .unwrap();
    }
}

async fn drain(archive: &RedisArchive<RedisConnection>) {
    for _ in 0..1000 {
        if archive.archive_once().await.unwrap().entries == 0 {
            return;
        }
    }
    panic!("never drained");
}

/// Segment `k`'s bytes.
async fn segment(conn: &RedisConnection, schema: &KeySchema, k: u64) -> Vec<u8> {
    let key = schema.shard_key(0, &format!("completed:seg:{k}"));
    let bytes: Option<Vec<u8>> = conn.clone().get(&key).await.unwrap();
    bytes.unwrap_or_else(|| panic!("{key} not joined"))
}

async fn format_is_raised_only_when_asked_and_both_layouts_read(cluster: bool) {
    let server = if cluster {
        TestRedis::start_cluster()
    } else {
        TestRedis::start()
    };
    let conn = RedisConnection::connect(&server.url()).await.unwrap();
    let a = RedisArchive::new(conn.clone(), config("a")).unwrap();
    let b = RedisArchive::new(conn.clone(), config("b")).unwrap();
    let schema = config("a").schema().unwrap();

    // A namespace nobody raised writes format 1: segments of whole batches.
    assert_eq!(a.format().await.unwrap(), ArchiveFormat::V1);
    assert_eq!(b.format().await.unwrap(), ArchiveFormat::V1);
    complete(&conn, &schema, 1..=2050).await;
    drain(&a).await;
    let old = [
        segment(&conn, &schema, 0).await,
        segment(&conn, &schema, 1).await,
    ];
    assert_eq!((old[0][0], old[1][0]), (1, 1));

    // Raised once, never lowered; another archiver follows from its next sweep.
    assert_eq!(
        a.raise_format(ArchiveFormat::V2).await.unwrap(),
        ArchiveFormat::V2
    );
    assert_eq!(
        a.raise_format(ArchiveFormat::V1).await.unwrap(),
        ArchiveFormat::V2
    );
    let recorded: Option<String> = conn
        .clone()
        .hget(schema.meta(), "archive_format")
        .await
        .unwrap();
    assert_eq!(recorded.as_deref(), Some("2"));
    complete(&conn, &schema, 2051..=4100).await;
    drain(&b).await;
    let new = [
        segment(&conn, &schema, 2).await,
        segment(&conn, &schema, 3).await,
    ];
    assert_eq!((new[0][0], new[1][0]), (2, 2));
    // About 11 bytes less per batch than whole batches.
    assert!(
        new[1].len() + 100 < old[1].len(),
        "{} vs {}",
        new[1].len(),
        old[1].len()
    );
    // What was written before is as it was.
    assert_eq!(segment(&conn, &schema, 0).await, old[0]);
    assert_eq!(segment(&conn, &schema, 1).await, old[1]);

    // Every reader path reads both layouts: get, range, export.
    for pid in (1..=4100)
        .step_by(7)
        .chain([999, 1000, 1999, 2000, 3999, 4000])
    {
        assert_eq!(
            a.get(pid).await.unwrap(),
            Lookup::Archived {
                record: record(pid),
                tier: Tier::Compressed
            },
            "pid {pid}"
        );
    }
    let page = a.range(1..=4100, 10_000).await.unwrap();
    assert_eq!(page.records, (1..=4100).map(record).collect::<Vec<_>>());
    assert!(page.damaged.is_empty(), "{:?}", page.damaged);
    let dump = b.export(T0).await.unwrap();
    assert_eq!(dump.entries(), 4100);

    // Nothing is damage: the scrub (what `check --repair` repairs from) finds nothing,
    // nothing is listed as damaged, nothing counted as a decode failure.
    let mut scrubbed = Vec::new();
    for _ in 0..10 {
        scrubbed.extend(a.scrub().await.unwrap());
    }
    assert!(scrubbed.is_empty(), "{scrubbed:?}");
    assert!(a.damaged().await.unwrap().is_empty());
    assert_eq!(a.decode_failures().await.unwrap(), 0);
    let quarantine: Vec<String> = conn
        .clone()
        .hkeys(schema.shard_key(0, "archive:quarantine"))
        .await
        .unwrap();
    assert!(quarantine.is_empty(), "{quarantine:?}");

    // A damaged batch in a layout 2 segment fails alone, as in layout 1 (a repair
    // leaves a segment as it is: it holds the other batches whole).
    assert!(
        a.corrupt_batch(25, b"TRB2 not a batch".to_vec())
            .await
            .unwrap()
    );
    assert!(matches!(
        a.get(2550).await.unwrap(),
        Lookup::Undecodable { .. }
    ));
    let page = a.range(2001..=3000, 10_000).await.unwrap();
    assert_eq!(page.records.len(), 900);
    assert_eq!(page.damaged.len(), 1, "{:?}", page.damaged);
    assert_eq!(a.repair_damage(&page.damaged[0]).await.unwrap(), None);
    assert_eq!(
        a.get(2650).await.unwrap(),
        Lookup::Archived {
            record: record(2650),
            tier: Tier::Compressed
        }
    );
    assert_eq!(segment(&conn, &schema, 0).await, old[0]);
}

#[tokio::test]
async fn redis_format_is_raised_only_when_asked_and_both_layouts_read() {
    format_is_raised_only_when_asked_and_both_layouts_read(false).await;
}

#[tokio::test]
async fn cluster_format_is_raised_only_when_asked_and_both_layouts_read() {
    format_is_raised_only_when_asked_and_both_layouts_read(true).await;
}

/// `join.lua` strips exactly what codec's `strip_binary_v2_header` strips, and keeps
/// layout 1 when a batch does not strip (its bytes are then kept whole).
#[tokio::test]
async fn join_strips_as_the_codec_does_and_keeps_what_does_not_strip() {
    let server = TestRedis::start();
    let script = tranche_archive_store::scripts()
        .into_iter()
        .find(|(n, _)| *n == "join")
        .unwrap()
        .1;
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut dict = WorkerDict::new();
    for w in 1..=8 {
        dict.insert(&format!("worker{w}")).unwrap();
    }
    // Batch 130 (a three-byte id): full, then zstd-compressed and partial.
    let full: Vec<CompletedRecord> = (13_000..13_100).map(record).collect();
    let options = BinaryV2Options::new(100).unwrap();
    let batches = [
        encode_binary_v2(130, &full, &dict, &options).unwrap(),
        encode_binary_v2(130, &full[..60], &dict, &options.with_zstd(3)).unwrap(),
    ];
    for (i, bytes) in batches.iter().enumerate() {
        for garbage in [false, true] {
            let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
            let stored = if garbage {
                // The right header, another batch id: no longer this slot's.
                encode_binary_v2(131, &[], &dict, &options).unwrap()
            } else {
                bytes.clone()
            };
            let _: () = conn
                .set("{t:0}:completed:batch:130", &stored)
                .await
                .unwrap();
            let joined: i64 = script
                .key("{t:0}:archive")
                .key("{t:0}:completed:seg:13")
                .key("{t:0}:completed:batch:130")
                .arg(1)
                .arg(130)
                .arg(1)
                .arg(2)
                .arg(100)
                .invoke_async(&mut conn)
                .await
                .unwrap();
            assert_eq!(joined, 1);
            let seg: Vec<u8> = conn.get("{t:0}:completed:seg:13").await.unwrap();
            let expected = if garbage {
                let mut v = vec![1, 1, stored.len() as u8];
                v.extend_from_slice(&stored);
                v
            } else {
                let (id, size, headless) = strip_binary_v2_header(bytes).unwrap();
                assert_eq!((id, size), (130, 100));
                // Version, one batch of 100, the shortest length, one slot of it.
                let mut v = vec![2, 1, 100];
                let mut len = headless.len();
                while len >= 0x80 {
                    v.push((len as u8 & 0x7f) | 0x80);
                    len >>= 7;
                }
                v.push(len as u8);
                v.push(1);
                v.extend_from_slice(&headless);
                v
            };
            assert_eq!(seg, expected, "batch {i}, garbage {garbage}");
        }
    }
}

/// Under format 2 in the summary tier, a layout 2 segment expires with its batches
/// (the TTL of the last of them) and reads as the summary tier until then.
#[tokio::test]
async fn format_2_segments_keep_the_summary_expiry() {
    let server = TestRedis::start();
    let conn = RedisConnection::connect(&server.url()).await.unwrap();
    let config = Config {
        summary_at: 0,
        summary_ttl: std::time::Duration::from_secs(3600),
        ..config("a")
    };
    let schema = config.schema().unwrap();
    let a = RedisArchive::new(conn.clone(), config).unwrap();
    a.raise_format(ArchiveFormat::V2).await.unwrap();
    complete(&conn, &schema, 1..=1050).await;
    drain(&a).await;
    assert_eq!(segment(&conn, &schema, 0).await[0], 2);
    let key = schema.shard_key(0, "completed:seg:0");
    let pttl: i64 = conn.clone().pttl(&key).await.unwrap();
    assert!(pttl > 3_500_000 && pttl <= 3_600_000, "{pttl}");
    assert_eq!(
        a.get(500).await.unwrap(),
        Lookup::Archived {
            record: record(500),
            tier: Tier::Summary
        }
    );
    assert_eq!(a.expire_batch(5).await.unwrap().len(), 1);
    assert_eq!(a.get(500).await.unwrap(), Lookup::Expired);
}

/// The block value's range bodies (`apply_delta.lua`'s layout: `varint(base)`, then per
/// range `slot`, `varint(len)`, body) by slot.
fn range_bodies(block: &[u8]) -> std::collections::BTreeMap<u8, Vec<u8>> {
    let varint = |at: &mut usize| {
        let (mut v, mut shift) = (0usize, 0);
        loop {
            let b = block[*at];
            *at += 1;
            v |= usize::from(b & 0x7f) << shift;
            shift += 7;
            if b < 0x80 {
                return v;
            }
        }
    };
    let mut at = 0;
    varint(&mut at);
    let mut out = std::collections::BTreeMap::new();
    while at < block.len() {
        let slot = block[at];
        at += 1;
        let len = varint(&mut at);
        out.insert(slot, block[at..at + len].to_vec());
        at += len;
    }
    out
}

/// Format 3 packs the statistics' ranges an archive write touches (flag 16), leaves
/// those written before as they were, and every reader reads both: the statistics
/// equal their records', `get` and export answer, the statistics' check finds no
/// damage, and a rebuild from the records (what `check --repair` writes) reads the same.
#[tokio::test]
async fn format_3_packs_the_ranges_it_touches_and_both_read() {
    use tranche_stats::{RedisStats, Stats, StatsDelta, StatsStore, diff};
    let server = TestRedis::start();
    let conn = RedisConnection::connect(&server.url()).await.unwrap();
    let a = RedisArchive::new(conn.clone(), config("a")).unwrap();
    let schema = config("a").schema().unwrap();
    let stats = RedisStats::new(conn.clone(), schema.clone());
    let ranges_key = schema.stats(0, "ranges");
    let block = |conn: &RedisConnection| {
        let mut c = conn.clone();
        let key = ranges_key.clone();
        async move {
            let v: Vec<u8> = c.hget(&key, "0").await.unwrap();
            range_bodies(&v)
        }
    };

    // Format 2: ranges 0..=19 whole, range 20 started (pids 2001..=2050).
    a.raise_format(ArchiveFormat::V2).await.unwrap();
    complete(&conn, &schema, 1..=2050).await;
    drain(&a).await;
    let before = block(&conn).await;
    assert!(before.values().all(|b| b[0] & 16 == 0), "{before:?}");

    assert_eq!(
        a.raise_format(ArchiveFormat::V3).await.unwrap(),
        ArchiveFormat::V3
    );
    complete(&conn, &schema, 2051..=8100).await;
    drain(&a).await;
    let after = block(&conn).await;
    // Untouched ranges keep their bytes; range 20, touched again, and the new ones are
    // packed, and smaller.
    for slot in 0..20 {
        assert_eq!(after[&slot], before[&slot], "slot {slot}");
    }
    for slot in 20..64 {
        assert!(after[&slot][0] & 16 != 0, "slot {slot}: {:?}", after[&slot]);
    }
    assert!(after[&21].len() < before[&19].len(), "{after:?}");

    let records: Vec<CompletedRecord> = (1..=8100).map(record).collect();
    let want = Stats::from_records(&records);
    let got = stats.stats().await.unwrap();
    assert!(diff(&want, &got).is_empty(), "{:#?}", diff(&want, &got));
    assert!(stats.damage(0).await.unwrap().is_empty());
    for pid in [1, 2000, 2001, 2050, 2051, 8100] {
        assert_eq!(
            a.get(pid).await.unwrap(),
            Lookup::Archived {
                record: record(pid),
                tier: Tier::Compressed
            },
            "pid {pid}"
        );
    }
    assert_eq!(a.export(T0).await.unwrap().entries(), 8100);

    // A rebuild writes compact bodies, which read the same.
    stats
        .replace(0, &StatsDelta::from_records(&records))
        .await
        .unwrap();
    assert!(block(&conn).await.values().all(|b| b[0] & 16 == 0));
    let rebuilt = stats.stats().await.unwrap();
    assert!(
        diff(&want, &rebuilt).is_empty(),
        "{:#?}",
        diff(&want, &rebuilt)
    );
}
