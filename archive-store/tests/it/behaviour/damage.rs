//! Damage: statistics that stall a shard until repaired, a batch the statistics
//! refuse, poison records, damaged archived values set aside.

use super::*;

/// Issue 22: one corrupt byte in a shard's statistics. Archiving that shard is refused,
/// so it stalls alone, its records left in the inbox and the stall recorded with its
/// reason; the other shards drain. A repair sets the bad value aside and rebuilds the
/// shard from its archived records; the next pass drains it and clears the stall, and
/// the statistics count every record once. With one shard, the damaged shard is the
/// whole archive: it stalls alone, nothing drains, and the same repair frees it.
pub(super) async fn damaged_statistics_stall_one_shard_until_repaired(kind: Kind, shards: u32) {
    let h = Harness::new(kind, shards).await;
    // The healthy shard's records: none with one shard.
    let healthy = if shards > 1 { 1 } else { 0 };
    // Shard 0 holds batches 0, s, 2s, ...; shard 1 batches 1, s + 1, ...
    let of = |shard: u32, n: u64| -> Vec<CompletedRecord> {
        records(
            (1..)
                .filter(|&p| h.schema.shard_of(p) == shard)
                .take(n as usize),
        )
    };
    let (first0, first1) = (of(0, 50), of(1, 50 * healthy));
    h.complete(&first0).await;
    h.complete(&first1).await;
    h.drain().await;
    assert!(h.query.stalled().await.unwrap().is_empty());

    h.corrupt_stats(0, "ranges", "0", b"\x80").await;
    let more0 = of(0, 75)[50..].to_vec();
    let more1 = of(1, 75 * healthy)[(50 * healthy) as usize..].to_vec();
    h.complete(&more0).await;
    h.complete(&more1).await;
    let pass = h.drain().await;
    assert_eq!(
        pass.archived,
        more1.len(),
        "the healthy shard drained: {pass:?}"
    );
    assert!(pass.stalled > 0, "{pass:?}");
    for found in h.get_all(pids(&more1)).await {
        assert!(matches!(found, Lookup::Archived { .. }));
    }
    // Nothing of shard 0's records is lost: completed, not archived, still waiting.
    for (r, found) in more0.iter().zip(h.get_all(pids(&more0)).await) {
        assert_eq!(found, Lookup::Archiving, "pid {}", r.pid);
    }
    let stalled = h.query.stalled().await.unwrap();
    assert_eq!(stalled.len(), 1, "{stalled:?}");
    assert_eq!(stalled[0].shard, 0);
    assert!(stalled[0].stats_damaged(), "{stalled:?}");
    assert!(stalled[0].since_ms > 0);
    // Another pass changes nothing and says the same.
    let again = h.archiver.archive_once().await.unwrap();
    assert_eq!((again.entries, again.archived), (0, 0), "{again:?}");
    assert!(again.stalled > 0);
    assert_eq!(
        h.query.stalled().await.unwrap()[0].since_ms,
        stalled[0].since_ms
    );

    let damage = h.stats.damage(0).await.unwrap();
    assert_eq!(damage.len(), 1, "{damage:?}");
    let repaired = h.archiver.repair_stats(0).await.unwrap();
    assert!(repaired.whole, "{repaired:?}");
    assert_eq!(repaired.unreadable, 0);
    assert_eq!(repaired.quarantined, damage);
    assert!(h.stats.damage(0).await.unwrap().is_empty());

    let pass = h.drain().await;
    assert_eq!(pass.archived, 25, "{pass:?}");
    assert_eq!(pass.stalled, 0, "{pass:?}");
    assert!(h.query.stalled().await.unwrap().is_empty());
    let all: Vec<CompletedRecord> = [first0, first1, more0, more1].concat();
    h.assert_stats(&all).await;
}

#[tokio::test]
async fn a_batch_the_statistics_refuse_writes_nothing() {
    let h = Harness::new(Kind::Redis, 1).await;
    let Backend::Redis(_, conn) = &h.backend else {
        unreachable!()
    };
    let mut c = conn.clone();
    // The shard's count has reached 10^18: the statistics refuse any further delta.
    let global = tranche_stats::archive_protocol::stats_keys(&h.schema, 0)[0].clone();
    let _: () = c
        .hset(&global, "count", "1000000000000000000")
        .await
        .unwrap();
    h.complete(&records(1..=10)).await;
    let pass = h.archiver.archive_once().await.unwrap();
    assert_eq!(
        (pass.entries, pass.archived, pass.stalled),
        (0, 0, 1),
        "{pass:?}"
    );
    let stalled = h.query.stalled().await.unwrap();
    assert_eq!(stalled.len(), 1);
    assert!(stalled[0].reason.contains("10^18"), "{stalled:?}");
    // A counter at the guard is not damage: no repair changes it.
    assert!(!stalled[0].stats_damaged(), "{stalled:?}");
    // Nothing of the batch was written: no archived bit, no record, no count, and the
    // entry is still pending for a later pass.
    let archived: Option<Vec<u8>> = c.get(h.schema.shard_key(0, "archived")).await.unwrap();
    assert_eq!(archived, None);
    let simple: usize = c.hlen(h.schema.completed(0)).await.unwrap();
    assert_eq!(simple, 0);
    let count: Option<u64> = c
        .hget(h.schema.shard_key(0, "archive"), "count")
        .await
        .unwrap();
    assert_eq!(count, None);
    assert_eq!(h.get(3).await, Lookup::Archiving);
    let pending: redis::Value = c.xpending(h.schema.inbox(0), "archivers").await.unwrap();
    assert!(
        matches!(pending, redis::Value::Array(ref v) if v.first() == Some(&redis::Value::Int(1))),
        "{pending:?}"
    );
}

/// A record that can never be archived does not stall its shard: the others of the
/// same inbox entry and pass are archived and counted, it goes to the shard's
/// dead-letter stream with the reason, and the entry is acknowledged.
pub(super) async fn poison_records_go_to_the_dead_letter_stream(kind: Kind) {
    let h = Harness::new(kind, 1).await;
    let Backend::Redis(Some(server), _) = &h.backend else {
        unreachable!("Redis only")
    };
    let good = records(1..=50);
    // Its duration passes the statistics' 10^18 guard: the script refuses it.
    let mut too_long = record(51);
    too_long.duration_ms = u64::MAX;
    let mut batch = good.clone();
    batch.push(too_long);
    h.complete(&batch).await;
    // Its bit offset is past the 2^32 bits of a Redis bitmap.
    h.push_into(0, &record(1 << 33)).await;
    let pass = h.drain().await;
    assert_eq!((pass.archived, pass.dead_lettered), (50, 2), "{pass:?}");
    h.assert_stats(&good).await;
    assert!(!matches!(
        h.query.get(51).await.unwrap(),
        Lookup::Archived { .. }
    ));
    let dead = h.schema.shard_key(0, "dead");
    assert_eq!(server.cli(&["XLEN", &dead]).trim(), "2");
    let entries = server.cli(&["XRANGE", &dead, "-", "+"]);
    assert!(entries.contains("10^18"), "{entries}");
    assert!(entries.contains("bit offset"), "{entries}");
    assert_eq!(server.cli(&["XLEN", &h.schema.inbox(0)]).trim(), "0");
    assert_eq!(h.drain().await.entries, 0, "nothing is retried");
    let listed = h.query.dead_letters(10).await.unwrap();
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(listed.iter().all(|d| d.shard == 0));
    let too_long_json = encode_json(&{
        let mut r = record(51);
        r.duration_ms = u64::MAX;
        r
    });
    assert!(
        listed
            .iter()
            .any(|d| d.record == too_long_json && d.reason.contains("10^18")),
        "{listed:?}"
    );
    assert_eq!(
        h.query.dead_letters(1).await.unwrap().len(),
        1,
        "limit per shard"
    );
    assert_eq!(h.query.dead_letter_count().await.unwrap(), 2);
}

/// An inbox line that no completion wrote (its completed-index bit is clear) is set
/// aside with the reason, never archived or counted: a forged pid cannot grow a bitmap
/// or push the statistics past the plan. The genuine records beside it are archived.
#[tokio::test]
async fn redis_an_inbox_line_never_completed_is_set_aside() {
    let h = Harness::new(Kind::Redis, 4).await;
    let genuine = records(1..=20);
    h.complete(&genuine).await;
    h.forge(&record(4_294_967_000)).await;
    h.forge(&record(7)).await;
    let pass = h.drain().await;
    assert_eq!((pass.archived, pass.dead_lettered), (20, 1), "{pass:?}");
    let dead = h.query.dead_letters(10).await.unwrap();
    assert!(
        dead.iter()
            .any(|d| d.reason.contains("never completed here")),
        "{dead:?}"
    );
    assert_eq!(h.get(4_294_967_000).await, Lookup::Unknown);
    h.assert_stats(&genuine).await;
}

#[tokio::test]
async fn redis_poison_records_go_to_the_dead_letter_stream() {
    poison_records_go_to_the_dead_letter_stream(Kind::Redis).await;
}

#[tokio::test]
async fn cluster_poison_records_go_to_the_dead_letter_stream() {
    poison_records_go_to_the_dead_letter_stream(Kind::Cluster).await;
}

/// Issue 22: one damaged sealed batch and one damaged record of an open batch. A range
/// read answers every other record and names both (and records them where `health`
/// reads); the scrub finds them too. A repair sets each aside as it was in its
/// shard's `archive:quarantine`, counting the records lost with it; lookups of those
/// pids then say so, the statistics still count every record once, and nothing is
/// left damaged. On Redis and on a cluster (every script on one slot).
pub(super) async fn damaged_archived_values_are_found_and_set_aside(kind: Kind, shards: u32) {
    let h = Harness::with(kind, compressed_config(shards, u64::MAX, Duration::ZERO)).await;
    let Backend::Redis(_, conn) = &h.backend else {
        unreachable!()
    };
    let mut c = conn.clone();
    let recs = records(1..=250);
    h.complete(&recs).await;
    h.drain().await;
    h.corrupt(1).await;
    let open = format!("{}:open", h.schema.completed_batch(2));
    let _: i64 = c.hset(&open, "210", "not json").await.unwrap();

    let page = h.query.range(1..=250, 1000).await.unwrap();
    assert_eq!(page.records.len(), 250 - 100 - 1);
    let mut found = page.damaged.clone();
    found.sort_by_key(|d| d.batch);
    assert_eq!(found.len(), 2, "{found:?}");
    assert_eq!(
        (found[0].batch, found[0].field.as_deref()),
        (1, None),
        "{found:?}"
    );
    assert_eq!(found[0].key, h.schema.completed_batch(1));
    assert_eq!(
        (found[1].key.as_str(), found[1].field.as_deref()),
        (open.as_str(), Some("210"))
    );
    assert_eq!(h.query.damaged().await.unwrap().len(), 2);
    // The scrub finds the same, with nobody reading.
    let mut scrubbed = h.archiver.scrub().await.unwrap();
    scrubbed.sort_by_key(|d| d.batch);
    assert_eq!(scrubbed, found);

    // The repair sets each aside, once.
    assert_eq!(
        h.archiver.repair_damage(&found[0]).await.unwrap(),
        Some(100)
    );
    assert_eq!(h.archiver.repair_damage(&found[1]).await.unwrap(), Some(1));
    assert_eq!(h.archiver.repair_damage(&found[0]).await.unwrap(), Some(0));
    let q1: Vec<(String, Vec<u8>)> = c
        .hgetall(h.schema.shard_key(found[0].shard, "archive:quarantine"))
        .await
        .unwrap();
    assert!(
        q1.contains(&("batch:1".to_owned(), b"TRB2 not a batch".to_vec())),
        "{q1:?}"
    );
    let q2: Vec<(String, Vec<u8>)> = c
        .hgetall(h.schema.shard_key(found[1].shard, "archive:quarantine"))
        .await
        .unwrap();
    assert!(
        q2.contains(&("210".to_owned(), b"not json".to_vec())),
        "{q2:?}"
    );
    for pid in [150, 210] {
        match h.get(pid).await {
            Lookup::Undecodable { detail } => assert!(
                detail.starts_with(ARCHIVE_DAMAGED) && detail.contains("set aside"),
                "{detail}"
            ),
            other => panic!("{pid}: {other:?}"),
        }
    }
    assert_eq!(h.get(211).await, archived(&recs[210], Tier::Compressed));
    assert_eq!(h.query.damaged().await.unwrap(), Vec::new());
    assert_eq!(h.query.lost_records().await.unwrap(), 101);
    let page = h.query.range(1..=250, 1000).await.unwrap();
    assert_eq!((page.records.len(), page.damaged.len()), (149, 0));
    assert!(h.archiver.scrub().await.unwrap().is_empty());
    // Counted once, still.
    h.assert_stats(&recs).await;
}

#[tokio::test]
async fn redis_damaged_archived_values_are_found_and_set_aside() {
    damaged_archived_values_are_found_and_set_aside(Kind::Redis, 4).await;
}

#[tokio::test]
async fn cluster_damaged_archived_values_are_found_and_set_aside() {
    damaged_archived_values_are_found_and_set_aside(Kind::Cluster, 4).await;
}
