//! The embedded backend: the same tiers and rules as Redis, in process memory.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use crossbeam_channel::Receiver;
use tokio::time::Instant;
use tranche_codec::{
    BinaryV2Options, Clock, CompletedRecord, KeySchema, SystemClock, WorkerDict, decode_binary_v2,
    encode_binary_v2,
};

use tranche_stats::{MemoryStats, StatsDelta, StatsStore};

use crate::state::{ARCHIVE_STATE_VERSION, ArchiveState, SealedState, ShardState};

use crate::dump::{Dump, DumpBatch};
use crate::model::{ArchivePass, Config, Lookup, RangePage, Stall, Tier, stall_reason};
use crate::segment::SegmentRef;
use crate::store::{ArchiveQuery, Archiver, Compaction, Export, Import, page_by_lookup};
use crate::{Error, Result};

/// The archive in memory, fed by one channel per shard (the memory active store's
/// inboxes). Archiving and querying go through the same object.
///
/// A channel hands each record out once, so there is nothing to take over from a dead
/// archiver here; the exactly-once rule still holds: a record whose pid is archived
/// already is dropped and not counted.
///
/// The archive cannot see the memory active store's completed index, so it keeps its
/// own view of "completed, not archived yet": whenever it looks at a shard (a pass, a
/// lookup of a pid it has not archived, a state save) it moves everything waiting in
/// that shard's channel into its own per-shard queue of received records, under the
/// shard's lock. A pid in that queue answers [`Lookup::Archiving`]. Every completion
/// sends to the channel before it returns, so a pid completed before a lookup is
/// archived, received or still in the channel, and the lookup drains the channel
/// first: it never answers [`Lookup::Unknown`] for a completed pid. A discarded pid
/// never reaches an inbox and stays [`Lookup::Unknown`].
///
/// [`MemoryArchive::state`] saves everything, received records included, for the
/// embedded state file; [`MemoryArchive::restore`] reads it back.
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
    /// Wall-clock time for the saved state: a sealed batch's expiry is kept as an
    /// `Instant` here and saved as the time it reads on this clock.
    clock: Arc<dyn Clock>,
    /// The stalled shards: those whose statistics refuse deltas. Not saved with the
    /// state: the damage that stalls a shard is found again by the next pass.
    stalls: Mutex<BTreeMap<u32, Stall>>,
}

#[derive(Debug, Default)]
struct Shard {
    /// Records taken from the inbox channel and not archived yet, in arrival order
    /// (duplicates kept: archiving drops and counts them as on Redis).
    received: VecDeque<CompletedRecord>,
    /// How many times each pid is in `received`: the pids answering "archiving".
    waiting: HashMap<u64, u32>,
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

/// Runs of consecutive values in `sorted` (ascending, distinct).
fn runs(sorted: &[u64]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &v in sorted {
        match out.last_mut() {
            Some(run) if run.1.checked_add(1) == Some(v) => run.1 = v,
            _ => out.push((v, v)),
        }
    }
    out
}

/// Shares one `Arc` per worker id among restored records, as decoding does.
fn intern(names: &mut HashSet<Arc<str>>, mut r: CompletedRecord) -> CompletedRecord {
    match names.get(&*r.worker) {
        Some(name) => r.worker = name.clone(),
        None => {
            names.insert(r.worker.clone());
        }
    }
    r
}

/// The most pids one shard's archived set may hold: Redis's bitmap limit.
const MAX_ARCHIVED: u64 = 1 << 32;

impl Shard {
    /// The saved form, with `now` and `wall` the same instant on both clocks.
    fn state(&self, now: Instant, wall: u64) -> ShardState {
        let mut archived: Vec<u64> = self.archived.iter().copied().collect();
        archived.sort_unstable();
        ShardState {
            archived: runs(&archived),
            simple: self.simple.values().cloned().collect(),
            open: self
                .open
                .iter()
                .map(|(&b, (tier, recs))| (b, *tier, recs.values().cloned().collect()))
                .collect(),
            sealed: self
                .sealed
                .iter()
                .map(|(&batch, b)| SealedState {
                    batch,
                    bytes: b.bytes.clone(),
                    count: b.count,
                    tier: b.tier,
                    expires_at_ms: b.expires.map(|e| {
                        wall.saturating_add(e.saturating_duration_since(now).as_millis() as u64)
                    }),
                })
                .collect(),
            received: self.received.iter().cloned().collect(),
        }
    }

    /// Shard `no` from its saved state, checked against the invariants every write
    /// keeps.
    fn restore(
        schema: &KeySchema,
        no: u32,
        saved: ShardState,
        names: &mut HashSet<Arc<str>>,
        now: Instant,
        wall: u64,
    ) -> Result<Self, String> {
        let mut s = Shard::default();
        let mut prev: Option<u64> = None;
        for (first, last) in saved.archived {
            if first > last || prev.is_some_and(|p| p >= first) {
                return Err(format!("shard {no}: archived runs out of order at {first}"));
            }
            prev = Some(last);
            if (s.archived.len() as u64).saturating_add(last - first) >= MAX_ARCHIVED {
                return Err(format!("shard {no}: more archived pids than a shard holds"));
            }
            for pid in first..=last {
                if schema.shard_of(pid) != no {
                    return Err(format!("shard {no}: archived pid {pid} is not its own"));
                }
                s.archived.insert(pid);
            }
        }
        s.count = s.archived.len() as u64;
        let own = |pid: u64, s: &Shard| -> Result<(), String> {
            if schema.shard_of(pid) != no || !s.archived.contains(&pid) {
                return Err(format!("shard {no}: record {pid} is not archived here"));
            }
            Ok(())
        };
        for r in saved.simple {
            own(r.pid, &s)?;
            s.simple.insert(r.pid, intern(names, r));
        }
        for (batch, tier, recs) in saved.open {
            let mut records = BTreeMap::new();
            for r in recs {
                own(r.pid, &s)?;
                if schema.batch_of(r.pid) != batch {
                    return Err(format!("open batch {batch} holds pid {}", r.pid));
                }
                records.insert(r.pid, intern(names, r));
            }
            s.open.insert(batch, (tier, records));
        }
        for b in saved.sealed {
            if schema.shard_of_batch(b.batch) != no {
                return Err(format!(
                    "shard {no}: sealed batch {} is not its own",
                    b.batch
                ));
            }
            let expires = b
                .expires_at_ms
                .map(|at| now + Duration::from_millis(at.saturating_sub(wall)));
            let sealed = Sealed {
                bytes: b.bytes,
                count: b.count,
                tier: b.tier,
                expires,
            };
            s.sealed.insert(b.batch, sealed);
        }
        for r in saved.received {
            s.push_received(intern(names, r));
        }
        Ok(s)
    }

    /// Moves every record waiting in `inbox` into `received`.
    fn receive(&mut self, inbox: &Receiver<CompletedRecord>) {
        for r in inbox.try_iter() {
            self.push_received(r);
        }
    }

    fn push_received(&mut self, r: CompletedRecord) {
        *self.waiting.entry(r.pid).or_default() += 1;
        self.received.push_back(r);
    }

    /// Takes up to `n` received records, oldest first.
    fn take_received(&mut self, n: usize) -> Vec<CompletedRecord> {
        let n = n.min(self.received.len());
        let out: Vec<CompletedRecord> = self.received.drain(..n).collect();
        for r in &out {
            if let Some(c) = self.waiting.get_mut(&r.pid) {
                *c -= 1;
                if *c == 0 {
                    self.waiting.remove(&r.pid);
                }
            }
        }
        out
    }
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
            clock: Arc::new(SystemClock),
            stalls: Mutex::default(),
        })
    }

    /// This archive, reading wall-clock time (for the expiries of a saved state) from
    /// `clock` rather than the system clock. The statistics take their own
    /// ([`MemoryStats::with_clock`]).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The settings.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The statistics every archived record is counted in.
    pub fn stats(&self) -> &Arc<MemoryStats> {
        &self.stats
    }

    /// Everything the archive holds and the statistics it counts into, taken at one
    /// instant for the embedded state file. Every record waiting in an inbox channel
    /// is moved into the archive's queue of received records first, and saved with it.
    ///
    /// Take it inside `MemoryActiveStore::state_with`, so the active store is held
    /// still meanwhile: a partition completed around the save is then in both states
    /// or in neither. Taken after the active store's state instead, a partition
    /// completed in between would be saved as archived (or received) while the saved
    /// active store still holds it leased; it would be redone, and its second record
    /// dropped as a duplicate.
    pub fn state(&self) -> ArchiveState {
        // Lock order everywhere: the dictionary, then shards in order. With all of them
        // held no archive write, and so no statistics delta, can happen.
        let dict = lock(&self.dict);
        let mut guards: Vec<MutexGuard<'_, Shard>> = self.shards.iter().map(lock).collect();
        let (now, wall) = (Instant::now(), self.clock.now_ms());
        let shards = guards
            .iter_mut()
            .zip(&self.inboxes)
            .map(|(s, inbox)| {
                s.receive(inbox);
                s.state(now, wall)
            })
            .collect();
        ArchiveState {
            version: ARCHIVE_STATE_VERSION,
            namespace: self.config.namespace.clone(),
            num_shards: self.schema.num_shards(),
            batch_size: self.schema.batch_size(),
            dict: dict.clone(),
            decode_failures: *lock(&self.decode_failures),
            shards,
            stats: self.stats.state(),
        }
    }

    /// An archive holding exactly what `state` saved, draining `inboxes` from here on,
    /// with statistics restored from the state too ([`MemoryArchive::stats`]).
    /// `config` must have the saved namespace and shard count; tier thresholds, TTL and
    /// pass size may change (they apply from the next pass on). Summary batches keep
    /// their wall-clock expiry.
    ///
    /// [`Error::InvalidArgument`] when the namespace or shard count differ,
    /// [`Error::Corrupt`] for another state version or a state that breaks the
    /// archive's invariants.
    pub fn restore(
        config: Config,
        inboxes: Vec<Receiver<CompletedRecord>>,
        state: ArchiveState,
    ) -> Result<Self> {
        let corrupt = |detail: String| Error::Corrupt {
            key: "archive state".into(),
            detail,
        };
        if state.version != ARCHIVE_STATE_VERSION {
            return Err(corrupt(format!(
                "version {} (this build reads version {ARCHIVE_STATE_VERSION})",
                state.version
            )));
        }
        if (state.namespace.as_str(), state.num_shards)
            != (config.namespace.as_str(), config.num_shards)
        {
            return Err(Error::InvalidArgument(format!(
                "the state is of namespace {:?} with {} shards, not {:?} with {}",
                state.namespace, state.num_shards, config.namespace, config.num_shards
            )));
        }
        let stats = MemoryStats::restore(state.stats).map_err(|e| corrupt(e.to_string()))?;
        let archive = Self::new(config, inboxes, Arc::new(stats))?;
        if state.batch_size != archive.schema.batch_size() {
            return Err(corrupt(format!(
                "batches of {} pids, not {}",
                state.batch_size,
                archive.schema.batch_size()
            )));
        }
        if state.shards.len() != archive.shards.len() {
            return Err(corrupt(format!(
                "{} shards saved for {}",
                state.shards.len(),
                archive.shards.len()
            )));
        }
        let (now, wall) = (Instant::now(), archive.clock.now_ms());
        let mut names = HashSet::new();
        for (no, saved) in state.shards.into_iter().enumerate() {
            let shard = Shard::restore(&archive.schema, no as u32, saved, &mut names, now, wall)
                .map_err(corrupt)?;
            *lock(&archive.shards[no]) = shard;
        }
        *lock(&archive.dict) = state.dict;
        *lock(&archive.decode_failures) = state.decode_failures;
        Ok(archive)
    }

    /// Records archived so far, over every shard.
    pub fn archived_count(&self) -> u64 {
        self.shards.iter().map(|s| lock(s).count).sum()
    }

    /// Records received from the inboxes and not archived yet (those still in the
    /// channels are not counted: the active store's receivers tell those).
    pub fn received_count(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| lock(s).received.len() as u64)
            .sum()
    }

    /// Overwrites the sealed bytes of `batch` (tests of the corrupt-batch path; feature
    /// `testing`). Returns whether the batch was sealed.
    #[cfg(feature = "testing")]
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

    /// Makes the expiry of sealed batch `batch` happen now (feature `testing`), so
    /// tests never wait on a clock. Returns the time it had left, in ms (none without
    /// an expiry).
    #[cfg(feature = "testing")]
    pub fn expire_batch(&self, batch: u64) -> Vec<i64> {
        let mut shard = lock(&self.shards[self.schema.shard_of_batch(batch) as usize]);
        let now = Instant::now();
        match shard.sealed.get_mut(&batch) {
            Some(Sealed {
                expires: Some(e), ..
            }) if *e > now => {
                let left = e.saturating_duration_since(now).as_millis() as i64;
                *e = now;
                vec![left]
            }
            _ => Vec::new(),
        }
    }

    fn archive_records(
        &self,
        shard: u32,
        records: Vec<CompletedRecord>,
        tier: Tier,
    ) -> Result<(usize, usize)> {
        // Lock order everywhere: the dictionary, then shards in order.
        let mut dict = lock(&self.dict);
        let mut s = lock(&self.shards[shard as usize]);
        self.archive_locked(shard, &mut s, &mut dict, records, tier)
    }

    /// Archives `records` into the locked shard `s` (number `shard`).
    fn archive_locked(
        &self,
        shard: u32,
        s: &mut Shard,
        dict: &mut WorkerDict,
        records: Vec<CompletedRecord>,
        tier: Tier,
    ) -> Result<(usize, usize)> {
        let (mut written, mut dups) = (0, 0);
        let batch_size = self.schema.batch_size();
        // A shard whose statistics refuse deltas must refuse before anything changes.
        self.stats.check_whole(shard)?;
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
                self.seal_locked(s, dict, batch, tier)?;
            }
        }
        // Still under the shard lock: the statistics change with the archive. Checked
        // whole above, under the same lock.
        self.stats.apply(shard, &delta)?;
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
        if count >= self.config.planned(batch, self.schema.batch_size()) {
            self.join_locked(s, batch);
        }
        Ok(true)
    }

    /// What joining `batch`'s segment does on Redis, where the segment's batches then
    /// share one key: once every planned batch of it is sealed whole, they expire
    /// together, when the last of them would have; none does if one of them has no
    /// expiry (sealed under the compressed tier), and all then answer compressed.
    fn join_locked(&self, s: &mut Shard, batch: u64) {
        let size = self.schema.batch_size();
        let (seg, _) = SegmentRef::of(&self.schema, batch);
        let members = seg.batches(&self.schema);
        let complete = members.iter().all(|b| {
            let planned = self.config.planned(*b, size);
            planned == 0 || s.sealed.get(b).is_some_and(|x| x.count >= planned)
        });
        if !complete {
            return;
        }
        let mut expires = Some(None);
        for b in &members {
            if let Some(x) = s.sealed.get(b) {
                expires = match (expires, x.expires) {
                    (Some(e), Some(x)) => Some(Some(e.map_or(x, |e: Instant| e.max(x)))),
                    _ => None,
                };
            }
        }
        let expires = expires.flatten();
        for b in &members {
            if let Some(x) = s.sealed.get_mut(b) {
                x.expires = expires;
                x.tier = if expires.is_some() {
                    Tier::Summary
                } else {
                    Tier::Compressed
                };
            }
        }
    }

    fn lookup(&self, pid: u64) -> Lookup {
        let shard_no = self.schema.shard_of(pid) as usize;
        let mut shard = lock(&self.shards[shard_no]);
        if !shard.archived.contains(&pid) {
            shard.receive(&self.inboxes[shard_no]);
            return if shard.waiting.contains_key(&pid) {
                Lookup::Archiving
            } else {
                Lookup::Unknown
            };
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
        let (bytes, tier) = (sealed.bytes.clone(), sealed.tier);
        // The dictionary is locked before a shard everywhere else: let the shard go
        // first. The dictionary only grows, so it still decodes these bytes.
        drop(shard);
        let dict = lock(&self.dict);
        match decode_binary_v2(&bytes, &dict) {
            Ok(b) => match b.records.into_iter().find(|r| r.pid == pid) {
                Some(record) => Lookup::Archived { record, tier },
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
            let mut dict = lock(&self.dict);
            let mut s = lock(&self.shards[shard as usize]);
            s.receive(&self.inboxes[shard as usize]);
            // A shard whose statistics refuse deltas keeps its records received,
            // unarchived, until it is repaired; the others go on.
            if let Err(err) = self.stats.check_whole(shard) {
                pass.stalled += s.received.len();
                self.stall(shard, &err.into());
                continue;
            }
            if lock(&self.stalls).remove(&shard).is_some() {
                tracing::info!(shard, "archive of the shard resumed");
            }
            let records = s.take_received(self.config.batch);
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
            let (written, dups) = self.archive_locked(shard, &mut s, &mut dict, records, tier)?;
            pass.archived += written;
            pass.duplicates += dups;
        }
        Ok(pass)
    }

    fn idle_wait(&self) -> Duration {
        self.config.block
    }

    async fn repair_stats(&self, shard: u32) -> Result<tranche_stats::Repaired> {
        if shard >= self.schema.num_shards() {
            return Err(Error::InvalidArgument(format!(
                "shard {shard} does not exist: the namespace has {} shards",
                self.schema.num_shards()
            )));
        }
        let mut delta = StatsDelta::default();
        let mut unreadable = 0u64;
        {
            let dict = lock(&self.dict).clone();
            let s = lock(&self.shards[shard as usize]);
            let mut held = 0u64;
            for r in s.simple.values() {
                delta.add(r);
                held += 1;
            }
            for (_, recs) in s.open.values() {
                for r in recs.values() {
                    delta.add(r);
                    held += 1;
                }
            }
            for sealed in s.sealed.values() {
                if sealed.expires.is_some_and(|e| e <= Instant::now()) {
                    continue;
                }
                if let Ok(b) = decode_binary_v2(&sealed.bytes, &dict) {
                    for r in &b.records {
                        delta.add(r);
                        held += 1;
                    }
                }
            }
            unreadable += (s.archived.len() as u64).saturating_sub(held);
        }
        Ok(self.stats.repair(shard, &delta, unreadable).await?)
    }
}

impl MemoryArchive {
    /// Records shard `shard` as stalled by `err` (the first time only: `since` stays).
    fn stall(&self, shard: u32, err: &Error) {
        let mut stalls = lock(&self.stalls);
        if stalls.contains_key(&shard) {
            return;
        }
        let reason = stall_reason(err);
        tracing::warn!(shard, %reason, "archive of the shard stalled; its records stay in the inbox");
        stalls.insert(
            shard,
            Stall {
                shard,
                since_ms: self.clock.now_ms(),
                reason,
            },
        );
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

    async fn stalled(&self) -> Result<Vec<Stall>> {
        Ok(lock(&self.stalls).values().cloned().collect())
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
        Ok(Dump::new(&self.schema, created_ms, dict, batches))
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
