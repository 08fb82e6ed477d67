//! The embedded backend: the same tiers and rules as Redis, in process memory.

use std::collections::{BTreeMap, HashSet};
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use crossbeam_channel::Receiver;
use tokio::time::Instant;
use tranche_codec::{
    BinaryV2Options, CompletedRecord, KeySchema, WorkerDict, decode_binary_v2, encode_binary_v2,
};

use tranche_stats::{MemoryStats, StatsDelta};

use crate::dump::{Dump, DumpBatch};
use crate::model::{ArchivePass, Config, Lookup, RangePage, Tier};
use crate::store::{ArchiveQuery, Archiver, Compaction, Export, Import, page_by_lookup};
use crate::{Error, Result};

/// The archive in memory, fed by one channel per shard (the memory active store's
/// inboxes). Archiving and querying go through the same object.
///
/// A channel hands each record out once, so there is nothing to take over from a dead
/// archiver here; the exactly-once rule still holds: a record whose pid is archived
/// already is dropped and not counted. Without the active store's completed index this
/// backend never answers [`Lookup::Archiving`].
#[derive(Debug)]
pub struct MemoryArchive {
    config: Config,
    schema: KeySchema,
    inboxes: Vec<Receiver<CompletedRecord>>,
    shards: Vec<Mutex<Shard>>,
    /// The worker dictionary every sealed batch is written with.
    dict: Mutex<WorkerDict>,
    decode_failures: Mutex<u64>,
    /// The statistics every archived record is counted in, under the shard's lock.
    stats: Arc<MemoryStats>,
}

#[derive(Debug, Default)]
struct Shard {
    /// The archived pids: the memory twin of `{ns:s}:archived`.
    archived: HashSet<u64>,
    /// Records archived by this shard.
    count: u64,
    simple: BTreeMap<u64, CompletedRecord>,
    /// Batches still filling, batch id -> records by pid.
    open: BTreeMap<u64, (Tier, BTreeMap<u64, CompletedRecord>)>,
    /// Sealed batches: binary v2 bytes, tier, and when they expire.
    sealed: BTreeMap<u64, Sealed>,
}

#[derive(Debug)]
struct Sealed {
    bytes: Vec<u8>,
    /// Records in the batch, so a partial seal's later records know when it is full.
    count: u64,
    tier: Tier,
    expires: Option<Instant>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl MemoryArchive {
    /// An archive draining `inboxes` (one receiver per shard, in shard order) and
    /// counting what it archives in `stats`.
    pub fn new(
        config: Config,
        inboxes: Vec<Receiver<CompletedRecord>>,
        stats: Arc<MemoryStats>,
    ) -> Result<Self> {
        let schema = config.schema()?;
        if inboxes.len() != schema.num_shards() as usize {
            return Err(Error::InvalidArgument(format!(
                "{} inboxes for {} shards",
                inboxes.len(),
                schema.num_shards()
            )));
        }
        Ok(Self {
            shards: schema.shards().map(|_| Mutex::default()).collect(),
            config,
            schema,
            inboxes,
            dict: Mutex::default(),
            decode_failures: Mutex::default(),
            stats,
        })
    }

    /// The settings.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Records archived so far, over every shard.
    pub fn archived_count(&self) -> u64 {
        self.shards.iter().map(|s| lock(s).count).sum()
    }

    /// Overwrites the sealed bytes of `batch` (tests of the corrupt-batch path).
    /// Returns whether the batch was sealed.
    pub fn corrupt_batch(&self, batch: u64, bytes: Vec<u8>) -> bool {
        let mut shard = lock(&self.shards[self.schema.shard_of_batch(batch) as usize]);
        match shard.sealed.get_mut(&batch) {
            Some(s) => {
                s.bytes = bytes;
                true
            }
            None => false,
        }
    }

    fn archive_records(
        &self,
        shard: u32,
        records: Vec<CompletedRecord>,
        tier: Tier,
    ) -> Result<(usize, usize)> {
        let mut dict = lock(&self.dict);
        let mut s = lock(&self.shards[shard as usize]);
        let (mut written, mut dups) = (0, 0);
        let batch_size = self.schema.batch_size();
        let mut delta = StatsDelta::default();
        for record in records {
            if !s.archived.insert(record.pid) {
                dups += 1;
                continue;
            }
            delta.add(&record);
            written += 1;
            s.count += 1;
            if tier == Tier::Simple {
                s.simple.insert(record.pid, record);
                continue;
            }
            dict.insert(&record.worker)?;
            let batch = self.schema.batch_of(record.pid);
            let open = s
                .open
                .entry(batch)
                .or_insert_with(|| (tier, BTreeMap::new()));
            open.0 = open.0.max(tier);
            open.1.insert(record.pid, record);
            let partial = s.sealed.get(&batch).map_or(0, |b| b.count);
            let open_len = s.open.get(&batch).map_or(0, |o| o.1.len() as u64);
            if open_len + partial >= self.config.planned(batch, batch_size) {
                self.seal_locked(&mut s, &dict, batch, tier)?;
            }
        }
        // Still under the shard lock: the statistics change with the archive.
        self.stats.apply(shard, &delta);
        Ok((written, dups))
    }

    /// Seals open batch `batch` of the locked shard `s`, merging an earlier partial seal.
    fn seal_locked(
        &self,
        s: &mut Shard,
        dict: &WorkerDict,
        batch: u64,
        tier: Tier,
    ) -> Result<bool> {
        let Some((_, recs)) = s.open.remove(&batch) else {
            return Ok(false);
        };
        let mut records: BTreeMap<u64, CompletedRecord> = BTreeMap::new();
        if let Some(old) = s.sealed.get(&batch) {
            match decode_binary_v2(&old.bytes, dict) {
                Ok(b) => records.extend(b.records.into_iter().map(|r| (r.pid, r))),
                Err(err) => {
                    // Sealing over it would lose it: leave the batch open.
                    s.open.insert(batch, (tier, recs));
                    return Err(Error::Corrupt {
                        key: format!("batch {batch}"),
                        detail: err.to_string(),
                    });
                }
            }
        }
        records.extend(recs);
        let records: Vec<CompletedRecord> = records.into_values().collect();
        let options = BinaryV2Options::new(self.schema.batch_size())?;
        let bytes = encode_binary_v2(batch, &records, dict, &options)?;
        let count = records.len() as u64;
        let expires = (tier == Tier::Summary).then(|| Instant::now() + self.config.summary_ttl);
        s.sealed.insert(
            batch,
            Sealed {
                bytes,
                count,
                tier,
                expires,
            },
        );
        Ok(true)
    }

    fn lookup(&self, pid: u64) -> Lookup {
        let shard = lock(&self.shards[self.schema.shard_of(pid) as usize]);
        if !shard.archived.contains(&pid) {
            return Lookup::Unknown;
        }
        if let Some(r) = shard.simple.get(&pid) {
            return Lookup::Archived {
                record: r.clone(),
                tier: Tier::Simple,
            };
        }
        let batch = self.schema.batch_of(pid);
        if let Some((_, recs)) = shard.open.get(&batch)
            && let Some(r) = recs.get(&pid)
        {
            return Lookup::Archived {
                record: r.clone(),
                tier: Tier::Compressed,
            };
        }
        let Some(sealed) = shard.sealed.get(&batch) else {
            return Lookup::Expired;
        };
        if sealed.expires.is_some_and(|e| e <= Instant::now()) {
            return Lookup::Expired;
        }
        let dict = lock(&self.dict);
        match decode_binary_v2(&sealed.bytes, &dict) {
            Ok(b) => match b.records.into_iter().find(|r| r.pid == pid) {
                Some(record) => Lookup::Archived {
                    record,
                    tier: sealed.tier,
                },
                None => self.failed(format!("batch {batch} lacks pid {pid}")),
            },
            Err(err) => self.failed(format!("batch {batch}: {err}")),
        }
    }

    fn failed(&self, detail: String) -> Lookup {
        *lock(&self.decode_failures) += 1;
        Lookup::Undecodable { detail }
    }
}

#[async_trait]
impl Archiver for MemoryArchive {
    async fn archive_once(&self) -> Result<ArchivePass> {
        let mut pass = ArchivePass::default();
        let tier = self.config.tier_for(self.archived_count());
        for shard in self.schema.shards() {
            let records: Vec<CompletedRecord> = self.inboxes[shard as usize]
                .try_iter()
                .take(self.config.batch)
                .collect();
            pass.entries += records.len();
            // A record of another shard would take another pid's place: drop it loudly.
            let (records, misrouted): (Vec<_>, Vec<_>) = records
                .into_iter()
                .partition(|r| self.schema.shard_of(r.pid) == shard);
            for r in &misrouted {
                tracing::warn!(
                    pid = r.pid,
                    shard,
                    "record in another shard's inbox dropped"
                );
            }
            pass.malformed += misrouted.len();
            let (written, dups) = self.archive_records(shard, records, tier)?;
            pass.archived += written;
            pass.duplicates += dups;
        }
        Ok(pass)
    }

    fn idle_wait(&self) -> Duration {
        self.config.block
    }
}

#[async_trait]
impl Compaction for MemoryArchive {
    async fn compact(&self) -> Result<usize> {
        self.compact_tiers(true)
    }
}

impl MemoryArchive {
    /// Seals the open batches and, with `move_tiers`, first moves older records to the
    /// current tier (simple records into batches, summary TTLs on sealed batches).
    fn compact_tiers(&self, move_tiers: bool) -> Result<usize> {
        let current = self.config.tier_for(self.archived_count());
        let tier = current.max(Tier::Compressed);
        let mut dict = lock(&self.dict);
        let mut sealed = 0;
        for shard in &self.shards {
            let mut s = lock(shard);
            if move_tiers && current != Tier::Simple {
                // Older simple-tier records move to the current tier.
                for (pid, r) in std::mem::take(&mut s.simple) {
                    dict.insert(&r.worker)?;
                    let batch = self.schema.batch_of(pid);
                    s.open
                        .entry(batch)
                        .or_insert_with(|| (tier, BTreeMap::new()))
                        .1
                        .insert(pid, r);
                }
            }
            if move_tiers && current == Tier::Summary {
                let expires = Instant::now() + self.config.summary_ttl;
                for b in s.sealed.values_mut().filter(|b| b.expires.is_none()) {
                    b.expires = Some(expires);
                    b.tier = Tier::Summary;
                }
            }
            let batches: Vec<u64> = s.open.keys().copied().collect();
            for batch in batches {
                sealed += usize::from(self.seal_locked(&mut s, &dict, batch, tier)?);
            }
        }
        Ok(sealed)
    }
}

#[async_trait]
impl ArchiveQuery for MemoryArchive {
    async fn get(&self, pid: u64) -> Result<Lookup> {
        Ok(self.lookup(pid))
    }

    async fn range(&self, pids: RangeInclusive<u64>, limit: usize) -> Result<RangePage> {
        page_by_lookup(pids, limit, |pid| std::future::ready(Ok(self.lookup(pid)))).await
    }

    async fn decode_failures(&self) -> Result<u64> {
        Ok(*lock(&self.decode_failures))
    }
}

#[async_trait]
impl Export for MemoryArchive {
    async fn export(&self, created_ms: u64) -> Result<Dump> {
        let dict = lock(&self.dict).clone();
        let mut batches: BTreeMap<u64, DumpBatch> = BTreeMap::new();
        let mut add = |batch: u64, tier: Tier, records: Vec<CompletedRecord>| {
            let b = batches.entry(batch).or_insert_with(|| DumpBatch {
                id: batch,
                tier,
                records: Vec::new(),
            });
            b.tier = b.tier.max(tier);
            b.records.extend(records);
        };
        for shard in &self.shards {
            let s = lock(shard);
            for r in s.simple.values() {
                add(self.schema.batch_of(r.pid), Tier::Simple, vec![r.clone()]);
            }
            for (&batch, (_, recs)) in &s.open {
                add(batch, Tier::Compressed, recs.values().cloned().collect());
            }
            for (&batch, sealed) in &s.sealed {
                if sealed.expires.is_some_and(|e| e <= Instant::now()) {
                    continue;
                }
                let decoded =
                    decode_binary_v2(&sealed.bytes, &dict).map_err(|e| Error::Corrupt {
                        key: format!("batch {batch}"),
                        detail: e.to_string(),
                    })?;
                add(batch, sealed.tier, decoded.records);
            }
        }
        let mut batches: Vec<DumpBatch> = batches.into_values().collect();
        let mut dict = dict;
        for b in &mut batches {
            b.records.sort_unstable_by_key(|r| r.pid);
            // Simple-tier records never needed the dictionary; the dump's batches do.
            for r in &b.records {
                dict.insert(&r.worker)?;
            }
        }
        let updated_ms = batches
            .iter()
            .flat_map(|b| &b.records)
            .map(|r| r.completed_at_ms)
            .max()
            .unwrap_or(0);
        Ok(Dump {
            namespace: self.config.namespace.clone(),
            num_shards: self.schema.num_shards(),
            batch_size: self.schema.batch_size(),
            created_ms,
            updated_ms,
            dict,
            batches,
        })
    }
}

#[async_trait]
impl Import for MemoryArchive {
    async fn import(&self, dump: &Dump) -> Result<u64> {
        if self.archived_count() != 0 {
            return Err(Error::InvalidArgument(
                "import needs an empty archive".into(),
            ));
        }
        let mut restored = 0;
        for b in &dump.batches {
            let shard = self.schema.shard_of_batch(b.id);
            let (written, _) = self.archive_records(shard, b.records.clone(), b.tier)?;
            restored += written as u64;
        }
        self.compact_tiers(false)?;
        Ok(restored)
    }
}
