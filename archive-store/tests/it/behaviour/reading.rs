//! Archiving and reading back: lookups, range pages, export and import, a random
//! workload against the model.

use super::*;

pub(super) async fn simple_tier_round_trip(kind: Kind, shards: u32) {
    let h = Harness::new(kind, shards).await;
    let recs = records(1..=250);
    h.complete(&recs[..100]).await;
    h.complete(&recs[100..]).await;
    let pass = h.drain().await;
    assert_eq!(pass.archived, 250);
    assert_eq!(pass.duplicates, 0);
    for (r, found) in recs.iter().zip(h.get_all(pids(&recs)).await) {
        assert_eq!(found, archived(r, Tier::Simple), "pid {}", r.pid);
    }
    // Nothing left to do.
    assert_eq!(h.drain().await, ArchivePass::default());
    h.assert_stats(&recs).await;
}

pub(super) async fn duplicates_are_stored_once(kind: Kind, shards: u32) {
    let h = Harness::new(kind, shards).await;
    let recs = records(1..=120);
    h.complete(&recs).await;
    // The same pids again, in one pass with the originals and in a later pass.
    h.complete(&recs[..30]).await;
    let first = h.drain().await;
    h.complete(&recs[50..70]).await;
    let second = h.drain().await;
    assert_eq!(first.archived + second.archived, 120);
    assert_eq!(first.duplicates + second.duplicates, 50);
    for (r, found) in recs.iter().zip(h.get_all(pids(&recs)).await) {
        assert_eq!(found, archived(r, Tier::Simple));
    }
    h.assert_stats(&recs).await;
}

pub(super) async fn unknown_and_archiving(kind: Kind, shards: u32) {
    let h = Harness::new(kind, shards).await;
    assert_eq!(h.get(7).await, Lookup::Unknown);
    h.complete(&records([7])).await;
    // Completed (index bit set, or received by the memory archive) but not archived.
    assert_eq!(h.get(7).await, Lookup::Archiving);
    h.drain().await;
    assert_eq!(h.get(7).await, archived(&record(7), Tier::Simple));
    assert_eq!(h.get(8).await, Lookup::Unknown);
    // Pids whose bit lies past Redis's 2^32-bit bitmap limit were never archived.
    assert_eq!(h.get(u64::MAX).await, Lookup::Unknown);
}

pub(super) async fn range_pages(kind: Kind, shards: u32) {
    let h = Harness::new(kind, shards).await;
    let recs = records((1..=90).filter(|p| p % 3 != 0));
    h.complete(&recs).await;
    h.drain().await;
    let mut got = Vec::new();
    let mut from = Some(1);
    while let Some(start) = from {
        let page = h.query.range(start..=95, 7).await.unwrap();
        assert!(page.records.len() <= 7);
        got.extend(page.records);
        from = page.next;
    }
    assert_eq!(got, recs);
}

/// Pages of a range over sparse archived batches in every tier, starting and ending
/// mid-batch: each archived pid of the range once, in order, nothing outside it, and
/// the empty stretches between batches skipped.
pub(super) async fn range_pages_through_sparse_batches(kind: Kind, shards: u32) {
    let h = Harness::with(kind, compressed_config(shards, 2, Duration::ZERO)).await;
    // Batches 0, 1, 3, 4 and 19 (of 100 pids), with gaps inside them.
    let held = |p: u64| matches!(p / 100, 0 | 1 | 3 | 4 | 19) && !p.is_multiple_of(7);
    let recs = records((1..=1999).filter(|&p| held(p)));
    h.complete(&recs).await;
    h.drain().await;
    let want: Vec<_> = recs
        .iter()
        .filter(|r| (150..=1950).contains(&r.pid))
        .cloned()
        .collect();
    for limit in [13, 1, 1000] {
        let mut got = Vec::new();
        let mut from = Some(150);
        while let Some(start) = from {
            let page = h.query.range(start..=1950, limit).await.unwrap();
            assert!(page.records.len() <= limit);
            got.extend(page.records);
            from = page.next;
        }
        assert_eq!(got, want, "limit {limit}");
    }
    let empty = h.query.range(500..=1899, 10).await.unwrap();
    assert!(empty.records.is_empty(), "{empty:?}");
}

pub(super) async fn export_import_round_trip(kind: Kind, shards: u32) {
    let config = Config {
        num_shards: shards,
        consumer: "a1".into(),
        compressed_at: 100,
        summary_at: 300,
        ..Config::default()
    };
    let h = Harness::with(kind, config.clone()).await;
    let recs = records(1..=450);
    for round in recs.chunks(50) {
        h.complete(round).await;
        h.drain().await;
    }
    let dump = h.export.export(T0).await.unwrap();
    assert_eq!(dump.entries(), 450);
    let bytes = dump.to_bytes().unwrap();
    assert_eq!(Dump::from_bytes(&bytes).unwrap(), dump);
    // Every corruption is caught, none panics.
    for at in (0..bytes.len()).step_by(97) {
        let mut bad = bytes.clone();
        bad[at] ^= 0x41;
        assert!(Dump::from_bytes(&bad).is_err(), "flip at {at}");
    }
    assert!(Dump::from_bytes(&bytes[..bytes.len() - 1]).is_err());
    let lines = dump.to_json_lines();
    assert_eq!(lines.lines().count(), 450);
    assert_eq!(lines.lines().next().unwrap(), encode_json(&recs[0]));

    // Into an empty namespace with another shard count, then not again.
    let other = h
        .beside(Config {
            num_shards: if shards == 1 { 4 } else { 1 },
            ..config
        })
        .await;
    assert_eq!(other.import.import(&dump).await.unwrap(), 450);
    assert!(other.import.import(&dump).await.is_err());
    for (r, found) in recs.iter().zip(other.get_all(pids(&recs)).await) {
        match found {
            Lookup::Archived { record, tier } => {
                assert_eq!(&record, r);
                // A batch goes back whole to the highest tier it held: batch 1 held
                // simple pid 100 and compressed 101..=199, and comes back compressed.
                assert_eq!(tier == Tier::Simple, r.pid < 100, "pid {}", r.pid);
            }
            found => panic!("pid {}: {found:?}", r.pid),
        }
    }
    other.assert_stats(&recs).await;
    assert_eq!(
        other.export.export(T0).await.unwrap().to_json_lines(),
        lines
    );
}

/// The same fixed workload gives the same dump bytes on every backend and shard count.
pub(super) async fn a_small_export_snapshot(kind: Kind, shards: u32) {
    let h = Harness::new(kind, shards).await;
    h.complete(&records([1, 2, 3, 99, 100, 101, 250, 4970, 4971]))
        .await;
    h.drain().await;
    let dump = h.export.export(T0).await.unwrap();
    let bytes = dump.to_bytes().unwrap();
    let mut text = format!(
        "namespace {} shards {} batch_size {} entries {} created {} updated {} workers {:?}\n",
        dump.namespace,
        dump.num_shards,
        dump.batch_size,
        dump.entries(),
        dump.created_ms,
        dump.updated_ms,
        dump.dict
            .entries()
            .iter()
            .map(|e| format!("{}={}", e.code, e.id))
            .collect::<Vec<_>>(),
    );
    for b in &dump.batches {
        text += &format!(
            "batch {} tier {} records {}\n",
            b.id,
            b.tier.as_str(),
            b.records.len()
        );
    }
    text += &dump.to_json_lines();
    // The shard count is in the header (and its checksum): hash what follows it, which
    // is identical for every backend and shard count.
    let header_len = 8 + 2 + 4 + 5 * 8 + 2 + dump.namespace.len() + 4;
    text += &format!(
        "{} bytes, crc32 after the header {:08x}\n",
        bytes.len(),
        crc32fast::hash(&bytes[header_len..])
    );
    let text = text.replace(&format!("shards {shards} "), "shards N ");
    insta::assert_snapshot!("small_export", text);
}

/// Completions, duplicate completions, archive passes, archivers dying with entries
/// pending and others taking over, compactions across tier thresholds: every answer and
/// the statistics equal a map of first completions.
pub(super) async fn a_random_workload_matches_a_model(kind: Kind, shards: u32) {
    use rand::{Rng, SeedableRng};
    let config = Config {
        num_shards: shards,
        consumer: "a0".into(),
        compressed_at: 150,
        summary_at: 400,
        claim_idle: Duration::from_millis(1),
        ..Config::default()
    };
    let h = Harness::with(kind, config).await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(u64::from(shards) * 7 + 1);
    let mut model: BTreeMap<u64, CompletedRecord> = BTreeMap::new();
    let mut archiver = h.archiver.clone();
    for step in 0..120 {
        match rng.random_range(0..10) {
            0..=4 => {
                let n = rng.random_range(1..30);
                let batch: Vec<CompletedRecord> =
                    (0..n).map(|_| record(rng.random_range(1..=700))).collect();
                for r in &batch {
                    model.entry(r.pid).or_insert_with(|| r.clone());
                }
                h.complete(&batch).await;
            }
            5..=6 => {
                archiver.archive_once().await.unwrap();
            }
            7 => {
                // An archiver dies holding entries; a new one (another consumer) starts.
                if kind != Kind::Memory {
                    read_as(&h, &format!("dead{step}")).await;
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    archiver = h
                        .another(&format!("a{step}"), Duration::from_millis(1))
                        .unwrap();
                }
            }
            8 => {
                h.compaction.compact().await.unwrap();
            }
            _ => {
                let pid = rng.random_range(1..=700);
                match h.get(pid).await {
                    Lookup::Archived { record, .. } => assert_eq!(Some(&record), model.get(&pid)),
                    Lookup::Archiving | Lookup::Unknown => {}
                    other => panic!("pid {pid}: {other:?}"),
                }
            }
        }
    }
    tokio::time::sleep(Duration::from_millis(3)).await;
    drain(&*archiver).await;
    for (pid, found) in (1..=700).zip(h.get_all(1..=700).await) {
        match (found, model.get(&pid)) {
            (Lookup::Archived { record, .. }, Some(want)) => assert_eq!(&record, want),
            (Lookup::Unknown, None) => {}
            (found, want) => panic!("pid {pid}: {found:?}, model {want:?}"),
        }
    }
    let all: Vec<CompletedRecord> = model.into_values().collect();
    h.assert_stats(&all).await;
}

pub(super) async fn records_in_the_wrong_inbox_are_dropped(kind: Kind, shards: u32) {
    let h = Harness::new(kind, shards).await;
    // Batch 1 lives in shard 1 of 4 (and in shard 0 of 1).
    let r = record(150);
    h.push_into(0, &r).await;
    let pass = h.drain().await;
    if shards == 1 {
        assert_eq!((pass.archived, pass.malformed), (1, 0));
        assert_eq!(h.get(150).await, archived(&r, Tier::Simple));
    } else {
        assert_eq!((pass.archived, pass.malformed), (0, 1));
        assert_eq!(h.get(150).await, Lookup::Unknown);
        h.assert_stats(&[]).await;
    }
}
