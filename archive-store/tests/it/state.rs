//! The memory archive's saved state: every tier, the inbox records not archived yet,
//! the decode failures and the statistics come back, and a restored archive answers
//! and goes on as the saved one.

use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::Sender;
use tranche_archive_store::{
    ArchiveQuery, ArchiveState, Archiver, Config, Error, Export, Lookup, MemoryArchive, Tier,
};
use tranche_codec::{CompletedRecord, KeySchema};
use tranche_stats::{MemoryStats, StatsStore};

const T0: u64 = 1_719_234_405_000;

fn record(pid: u64) -> CompletedRecord {
    CompletedRecord {
        pid,
        min_id: (pid - 1) * 1000 + 1,
        max_id: pid * 1000,
        worker: Arc::from(format!("worker{}", pid % 5 + 1)),
        completed_at_ms: T0 + pid * 1000 + (pid % 2) * 17,
        duration_ms: 295_000 + (pid % 7) * 1000 + (pid % 3),
    }
}

fn config(shards: u32) -> Config {
    Config {
        num_shards: shards,
        consumer: "a1".into(),
        compressed_at: 150,
        summary_at: 300,
        summary_ttl: Duration::from_secs(3600),
        ..Config::default()
    }
}

struct Embedded {
    archive: MemoryArchive,
    inboxes: Vec<Sender<CompletedRecord>>,
    schema: KeySchema,
}

impl Embedded {
    fn new(shards: u32) -> Self {
        let (inboxes, rxs) = (0..shards).map(|_| crossbeam_channel::unbounded()).unzip();
        let archive =
            MemoryArchive::new(config(shards), rxs, Arc::new(MemoryStats::new())).unwrap();
        Self::with(archive, inboxes, shards)
    }

    fn restore(shards: u32, state: ArchiveState) -> Self {
        let (inboxes, rxs) = (0..shards).map(|_| crossbeam_channel::unbounded()).unzip();
        let archive = MemoryArchive::restore(config(shards), rxs, state).unwrap();
        Self::with(archive, inboxes, shards)
    }

    fn with(archive: MemoryArchive, inboxes: Vec<Sender<CompletedRecord>>, shards: u32) -> Self {
        Self {
            archive,
            inboxes,
            schema: KeySchema::new("elk", shards).unwrap(),
        }
    }

    fn complete(&self, pids: impl IntoIterator<Item = u64>) {
        for pid in pids {
            self.inboxes[self.schema.shard_of(pid) as usize]
                .send(record(pid))
                .unwrap();
        }
    }

    async fn drain(&self) -> usize {
        let mut archived = 0;
        loop {
            let pass = self.archive.archive_once().await.unwrap();
            archived += pass.archived;
            if pass.entries == 0 {
                return archived;
            }
        }
    }

    /// Every answer the archive and its statistics give, to compare two by.
    async fn answers(&self) -> Vec<String> {
        let a = &self.archive;
        let mut out = vec![
            format!("{:?}", a.decode_failures().await.unwrap()),
            format!("{:?}", a.archived_count()),
            // `last_updated` is the wall-clock time of the last write: two archives
            // archiving the same records a millisecond apart differ there only.
            format!("{:?}", {
                let mut stats = a.stats().stats().await.unwrap();
                stats.global_stats.last_updated = 0.0;
                stats
            }),
            format!("{:?}", a.stats().latest_snapshot().await.unwrap()),
            format!("{:?}", a.export(T0).await.map_err(|e| e.to_string())),
        ];
        for pid in 0..=560 {
            out.push(format!("{pid}: {:?}", a.get(pid).await.unwrap()));
        }
        out.push(format!("{:?}", a.range(1..=560, 1000).await.unwrap()));
        for id in (0..=560_000).step_by(100_000) {
            out.push(format!("{:?}", a.stats().range_summary(id).await.unwrap()));
        }
        out
    }
}

/// An archive with every tier in use, an open and a corrupted batch, a lookup failure
/// counted, a published statistics snapshot, and records still in the inboxes
/// (one a duplicate of an archived pid).
async fn busy(shards: u32) -> Embedded {
    let e = Embedded::new(shards);
    // In steps of 50, so the tiers change where the thresholds say: 1 to 149 simple,
    // 150 to 299 compressed (batch 1 open, batch 2 sealed), 300 on summary (batches 3
    // and 4 sealed with a TTL, batch 5 open).
    for from in (1..=520).step_by(50) {
        e.complete(from..=(from + 49).min(520));
        assert_eq!(e.drain().await as u64, (from + 49).min(520) - from + 1);
    }
    // Batch 2 is sealed in the compressed tier: corrupt it and look it up.
    assert!(e.archive.corrupt_batch(2, b"not a batch".to_vec()));
    assert!(matches!(
        e.archive.get(250).await.unwrap(),
        Lookup::Undecodable { .. }
    ));
    e.archive.stats().publish_snapshot().await.unwrap();
    // Inbox records not archived yet, one of them a duplicate.
    e.complete([521, 522, 530, 7]);
    e
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_restored_archive_answers_and_goes_on_as_the_saved_one() {
    for shards in [1, 4] {
        let live = busy(shards).await;
        let state = live.archive.state();
        assert_eq!(state.archived_count(), 520);
        assert_eq!(state.received_count(), 4);
        assert_eq!(state.stats().total_completed(), 520);
        // Through text and back, as a state file would carry it.
        let json = serde_json::to_vec(&state).unwrap();
        let back: ArchiveState = serde_json::from_slice(&json).unwrap();
        assert_eq!(back, state);
        let restored = Embedded::restore(shards, back);

        let (a, b) = (live.answers().await, restored.answers().await);
        assert_eq!(a, b);
        // Every tier is in use, and the inbox records answer "archiving".
        let joined = a.join("\n");
        for tier in [Tier::Simple, Tier::Compressed, Tier::Summary] {
            assert!(joined.contains(&format!("tier: {tier:?}")), "{tier:?}");
        }
        assert_eq!(live.archive.get(521).await.unwrap(), Lookup::Archiving);
        assert!(matches!(
            live.archive.get(7).await.unwrap(),
            Lookup::Archived { .. }
        ));
        assert!(a[0] != "0", "decode failures were counted");

        // Both go on the same way: the saved inbox records, then new ones.
        live.complete(523..=529);
        restored.complete(523..=529);
        // The three saved new pids and seven more; pid 7 is a duplicate.
        assert_eq!(live.drain().await, 10);
        assert_eq!(restored.drain().await, 10);
        assert_eq!(live.answers().await, restored.answers().await);
        assert!(matches!(
            restored.archive.get(530).await.unwrap(),
            Lookup::Archived { .. }
        ));

        // Summary batches expire at the same time in both.
        tokio::time::advance(Duration::from_secs(3601)).await;
        assert_eq!(live.answers().await, restored.answers().await);
        assert_eq!(restored.archive.get(350).await.unwrap(), Lookup::Expired);
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_state_of_another_archive_or_version_is_refused() {
    let live = busy(4).await;
    let state = live.archive.state();
    let restore = |config: Config, state: ArchiveState| {
        let rxs = (0..config.num_shards)
            .map(|_| crossbeam_channel::unbounded().1)
            .collect();
        MemoryArchive::restore(config, rxs, state)
    };
    let err = restore(config(2), state.clone()).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    let other = Config {
        namespace: "other".into(),
        ..config(4)
    };
    assert!(matches!(
        restore(other, state.clone()),
        Err(Error::InvalidArgument(_))
    ));
    let mut newer = state.clone();
    newer.version += 1;
    let err = restore(config(4), newer).unwrap_err();
    assert!(err.to_string().contains("version 2"), "{err}");
    // Shards swapped: their pids are not their own.
    let mut json = serde_json::to_value(&state).unwrap();
    json["shards"].as_array_mut().unwrap().swap(0, 1);
    let swapped: ArchiveState = serde_json::from_value(json).unwrap();
    assert!(matches!(
        restore(config(4), swapped),
        Err(Error::Corrupt { .. })
    ));
}

#[tokio::test(flavor = "current_thread")]
async fn a_received_pid_is_archiving_and_an_unsent_one_unknown() {
    let e = Embedded::new(4);
    e.complete([150]);
    assert_eq!(e.archive.get(150).await.unwrap(), Lookup::Archiving);
    assert_eq!(e.archive.get(151).await.unwrap(), Lookup::Unknown);
    // Still archiving after a save, which moves the inbox into the archive.
    let _ = e.archive.state();
    assert_eq!(e.archive.get(150).await.unwrap(), Lookup::Archiving);
    e.drain().await;
    assert!(matches!(
        e.archive.get(150).await.unwrap(),
        Lookup::Archived { .. }
    ));
}
