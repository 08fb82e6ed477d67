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

mod compact;
mod export;
mod lookup;
mod pass;
mod seal;
mod state;
mod write;

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

impl Shard {
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
}
