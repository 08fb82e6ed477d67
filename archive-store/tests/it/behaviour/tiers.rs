//! Segments, tiers and compaction: full segments joined and read, batches moving
//! between tiers, expiring, sealed and compacted.

use super::*;

/// Every pid of segment 0 of every shard (batches `0..10 * shards`), and a few beyond.
pub(super) fn segment_records(shards: u32) -> Vec<CompletedRecord> {
    records(1..=SEGMENT_BATCHES * 100 * u64::from(shards) + 30)
}

pub(super) async fn full_segments_are_joined_and_read(kind: Kind, shards: u32) {
    use rand::SeedableRng;
    use rand::seq::SliceRandom;
    let h = Harness::with(kind, compressed_config(shards, u64::MAX, Duration::ZERO)).await;
    let recs = segment_records(shards);
    // Out of order, in several entries and passes, with a replay.
    let mut shuffled = recs.clone();
    shuffled.shuffle(&mut rand::rngs::StdRng::seed_from_u64(5));
    for part in shuffled.chunks(370) {
        h.complete(part).await;
        h.drain().await;
    }
    h.complete(&shuffled[..50]).await;
    assert_eq!(h.drain().await.archived, 0);
    for (r, found) in recs.iter().zip(h.get_all(pids(&recs)).await) {
        assert_eq!(found, archived(r, Tier::Compressed), "pid {}", r.pid);
    }
    h.assert_stats(&recs).await;
    // Joined: one key per segment, no batch keys; the last batch stays on its own.
    assert_joined(&h, shards).await;
    // In order, each batch arrives whole and is sealed before its archive call, whose
    // joins ride behind it: joined as well, without any compaction.
    let in_order = h
        .beside(compressed_config(shards, u64::MAX, Duration::ZERO))
        .await;
    in_order.complete(&recs).await;
    in_order.drain().await;
    assert_joined(&in_order, shards).await;
    // The dump holds every record, and comes back whole elsewhere.
    let dump = h.export.export(T0).await.unwrap();
    assert_eq!(dump.entries(), recs.len() as u64);
    let other = h
        .beside(compressed_config(shards, u64::MAX, Duration::ZERO))
        .await;
    assert_eq!(other.import.import(&dump).await.unwrap(), recs.len() as u64);
    let again = other.export.export(T0).await.unwrap();
    assert_eq!(again.to_json_lines(), dump.to_json_lines());
    // A corrupted batch of a joined segment fails alone, and is counted.
    h.corrupt(3).await;
    assert!(matches!(h.get(350).await, Lookup::Undecodable { .. }));
    assert_eq!(h.query.decode_failures().await.unwrap(), 1);
    assert_eq!(h.get(250).await, archived(&recs[249], Tier::Compressed));
    assert_eq!(h.get(450).await, archived(&recs[449], Tier::Compressed));
}

/// Asserts (on Redis) that segment 0 of every shard is joined: its key is there and
/// none of its batches keeps its own.
pub(super) async fn assert_joined(h: &Harness, shards: u32) {
    if let Backend::Redis(_, conn) = &h.backend {
        let mut c = conn.clone();
        for shard in h.schema.shards() {
            let seg = h.schema.shard_key(shard, "completed:seg:0");
            assert!(c.exists::<_, bool>(&seg).await.unwrap(), "{seg}");
        }
        for b in 0..SEGMENT_BATCHES * u64::from(shards) {
            let key = h.schema.completed_batch(b);
            assert!(!c.exists::<_, bool>(&key).await.unwrap(), "{key}");
        }
    }
}

pub(super) async fn compaction_joins_segments_from_the_simple_tier(kind: Kind, shards: u32) {
    let recs = segment_records(shards);
    let config = Config {
        num_shards: shards,
        consumer: "a1".into(),
        compressed_at: recs.len() as u64,
        summary_at: u64::MAX,
        ..Config::default()
    };
    let h = Harness::with(kind, config).await;
    h.complete(&recs).await;
    h.drain().await;
    assert_eq!(h.get(5).await, archived(&recs[4], Tier::Simple));
    // Compaction moves them into batches, seals them and joins the full segments.
    h.compaction.compact().await.unwrap();
    assert_joined(&h, shards).await;
    for (r, found) in recs.iter().zip(h.get_all(pids(&recs)).await) {
        assert_eq!(found, archived(r, Tier::Compressed), "pid {}", r.pid);
    }
    assert_eq!(h.compaction.compact().await.unwrap(), 0);
    h.assert_stats(&recs).await;
}

pub(super) async fn joined_segments_expire_together(kind: Kind, shards: u32) {
    let ttl = Duration::from_secs(3600);
    let h = Harness::with(kind, compressed_config(shards, 0, ttl)).await;
    let recs = segment_records(shards);
    h.complete(&recs).await;
    h.drain().await;
    let last = SEGMENT_BATCHES * 100 * u64::from(shards) - 1;
    for pid in [1, 150, 999, last] {
        assert_eq!(
            h.get(pid).await,
            archived(&recs[pid as usize - 1], Tier::Summary)
        );
    }
    h.expire(&[1, 150, 999, last], ttl).await;
    for pid in [1, 150, 999, last] {
        assert_eq!(h.get(pid).await, Lookup::Expired, "pid {pid}");
    }
    assert_eq!(h.query.decode_failures().await.unwrap(), 0);
    h.assert_stats(&recs).await;
}

pub(super) async fn tier_transitions(kind: Kind, shards: u32) {
    let config = Config {
        num_shards: shards,
        consumer: "a1".into(),
        compressed_at: 100,
        summary_at: 300,
        ..Config::default()
    };
    let h = Harness::with(kind, config).await;
    // Rounds of 50: the tier is read once per pass, so each round lands in one tier.
    let recs = records(1..=600);
    let mut tiers = Vec::new();
    for round in recs.chunks(50) {
        h.complete(round).await;
        h.drain().await;
        tiers.push(h.config.tier_for((tiers.len() as u64) * 50));
    }
    let found = h.get_all(pids(&recs)).await;
    for (i, (r, found)) in recs.iter().zip(found).enumerate() {
        let want = tiers[i / 50];
        match found {
            Lookup::Archived { record, tier } => {
                assert_eq!(&record, r, "pid {}", r.pid);
                // Batches are sealed with the tier of the pass that fills them, so the
                // batches straddling a threshold may report the later tier; open ones
                // (batch 1, missing simple pid 100, and batch 6) report compressed.
                match r.pid {
                    ..=100 => assert_eq!(tier, Tier::Simple, "pid {}", r.pid),
                    101..=299 => assert_eq!(tier, Tier::Compressed, "pid {}", r.pid),
                    400..=599 => assert_eq!(tier, Tier::Summary, "pid {}", r.pid),
                    _ => assert_ne!(tier, Tier::Simple, "pid {}", r.pid),
                }
                assert_eq!(want == Tier::Simple, tier == Tier::Simple);
            }
            other => panic!("pid {}: {other:?}", r.pid),
        }
    }
    h.assert_stats(&recs).await;
}

pub(super) fn compressed_config(shards: u32, summary_at: u64, ttl: Duration) -> Config {
    Config {
        num_shards: shards,
        consumer: "a1".into(),
        compressed_at: 0,
        summary_at,
        summary_ttl: ttl,
        ..Config::default()
    }
}

pub(super) async fn summary_batches_expire(kind: Kind, shards: u32) {
    let ttl = Duration::from_secs(3600);
    let h = Harness::with(kind, compressed_config(shards, 0, ttl)).await;
    // Batch 0 holds pids 1..=99 (pid 0 is never planned), batch 1 pids 100..=199.
    let recs = records(1..=199);
    h.complete(&recs).await;
    h.drain().await;
    for (r, found) in recs.iter().zip(h.get_all(pids(&recs)).await) {
        assert_eq!(found, archived(r, Tier::Summary));
    }
    h.expire(&[1, 150], ttl).await;
    assert_eq!(h.get(1).await, Lookup::Expired);
    assert_eq!(h.get(150).await, Lookup::Expired);
    assert_eq!(h.query.decode_failures().await.unwrap(), 0);
    // The statistics outlive the batches.
    h.assert_stats(&recs).await;
}

pub(super) async fn a_corrupted_batch_is_reported_and_counted(kind: Kind, shards: u32) {
    let h = Harness::with(kind, compressed_config(shards, u64::MAX, Duration::ZERO)).await;
    let recs = records(1..=199);
    h.complete(&recs).await;
    h.drain().await;
    assert_eq!(h.get(5).await, archived(&recs[4], Tier::Compressed));
    h.corrupt(0).await;
    assert!(matches!(h.get(5).await, Lookup::Undecodable { .. }));
    assert!(matches!(h.get(6).await, Lookup::Undecodable { .. }));
    assert_eq!(h.query.decode_failures().await.unwrap(), 2);
    // The other batch is untouched.
    assert_eq!(h.get(150).await, archived(&recs[149], Tier::Compressed));
}

pub(super) async fn compaction_seals_partial_batches(kind: Kind, shards: u32) {
    let h = Harness::with(kind, compressed_config(shards, u64::MAX, Duration::ZERO)).await;
    let recs = records(1..=250);
    h.complete(&recs[..150]).await;
    h.drain().await;
    // Batch 0 is full and sealed; batch 1 is half open.
    assert_eq!(h.compaction.compact().await.unwrap(), 1);
    assert_eq!(h.compaction.compact().await.unwrap(), 0);
    // The rest arrives out of order; batch 1 fills and is sealed over its partial seal.
    let mut rest = recs[150..].to_vec();
    rest.reverse();
    h.complete(&rest).await;
    h.drain().await;
    assert_eq!(h.compaction.compact().await.unwrap(), 1); // batch 2, half full
    for (r, found) in recs.iter().zip(h.get_all(pids(&recs)).await) {
        assert_eq!(found, archived(r, Tier::Compressed), "pid {}", r.pid);
    }
    h.assert_stats(&recs).await;
}

pub(super) async fn compaction_moves_older_records_to_the_current_tier(kind: Kind, shards: u32) {
    let config = Config {
        num_shards: shards,
        consumer: "a1".into(),
        compressed_at: 100,
        summary_at: 300,
        ..Config::default()
    };
    let h = Harness::with(kind, config).await;
    let recs = records(1..=450);
    for round in recs.chunks(50) {
        h.complete(round).await;
        h.drain().await;
    }
    assert_eq!(h.get(5).await, archived(&recs[4], Tier::Simple));
    h.compaction.compact().await.unwrap();
    for (r, found) in recs.iter().zip(h.get_all(pids(&recs)).await) {
        assert_eq!(found, archived(r, Tier::Summary), "pid {}", r.pid);
    }
    assert_eq!(h.compaction.compact().await.unwrap(), 0);
    h.assert_stats(&recs).await;
    assert_eq!(h.query.decode_failures().await.unwrap(), 0);
}

pub(super) async fn open_batches_answer_compressed_until_sealed(kind: Kind, shards: u32) {
    let h = Harness::with(
        kind,
        compressed_config(shards, 0, Duration::from_secs(3600)),
    )
    .await;
    // The summary tier from the start. Batch 0 (pids 1..=99) is complete and sealed at
    // once; batch 1 gets half its pids and stays open.
    let recs = records(1..=150);
    h.complete(&recs).await;
    h.drain().await;
    assert_eq!(h.get(5).await, archived(&recs[4], Tier::Summary));
    // An open batch has no expiry: it answers as compressed, whatever tier is in force.
    assert_eq!(h.get(120).await, archived(&recs[119], Tier::Compressed));
    // Sealed (here by compaction) under the summary tier, it expires and says so.
    assert_eq!(h.compaction.compact().await.unwrap(), 1);
    assert_eq!(h.get(120).await, archived(&recs[119], Tier::Summary));
    h.assert_stats(&recs).await;
}

pub(super) async fn duplicates_in_a_complete_batch_are_found(kind: Kind, shards: u32) {
    let h = Harness::with(kind, compressed_config(shards, u64::MAX, Duration::ZERO)).await;
    // Some pids of batches 0 and 1 first (at both ends of the script's 32-bit fields
    // and inside them), then both batches whole: those arrive complete in one call,
    // and the archived ones must be found and dropped, the rest written once.
    let recs = records(1..=199);
    let early: Vec<CompletedRecord> = [1, 32, 33, 64, 70, 99, 100, 131, 150, 199]
        .iter()
        .map(|&p| record(p))
        .collect();
    h.complete(&early).await;
    assert_eq!(h.drain().await.archived, early.len());
    h.complete(&recs).await;
    let pass = h.drain().await;
    assert_eq!(
        (pass.archived, pass.duplicates),
        (recs.len() - early.len(), early.len())
    );
    for (r, found) in recs.iter().zip(h.get_all(pids(&recs)).await) {
        assert_eq!(found, archived(r, Tier::Compressed), "pid {}", r.pid);
    }
    h.assert_stats(&recs).await;
}
