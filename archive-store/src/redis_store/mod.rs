//! The Redis backend: every archive batch and every `get` is one Lua script on one
//! shard's hash slot.

mod conn;
mod dead;
mod export;
mod lookup;
mod pass;

use std::collections::HashSet;
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures_util::future::try_join_all;
use redis::aio::ConnectionLike;
use redis::streams::{StreamAutoClaimReply, StreamId, StreamReadReply};
use redis::{FromRedisValue, Script, Value};
use tranche_codec::{
    BinaryV2Options, CompletedRecord, KeySchema, WorkerDict, decode_binary_v2, decode_json,
    encode_binary_v2, encode_json,
};

use conn::{invoke_read_only, retry};
use tranche_stats::{StatsDelta, delta_args};

use crate::dump::{Dump, DumpBatch};
use crate::model::{ArchivePass, Config, Lookup, RangePage, Tier};
use crate::segment::{self, SEGMENT_BATCHES, SegmentRef};
use crate::store::{ArchiveQuery, Archiver, Compaction, Export, Import};
use crate::{Error, Result};

macro_rules! script {
    ($name:literal) => {
        LazyLock::new(|| {
            Script::new(concat!(
                include_str!("../../lua/prelude.lua"),
                include_str!(concat!("../../lua/", $name, ".lua"))
            ))
        })
    };
}

/// The archive script: the prelude, the statistics crate's `apply_stats` fragment, and
/// `archive.lua`, so the archive write and the statistics change in one atomic step.
static ARCHIVE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{}\n{}\n{}",
        include_str!("../../lua/prelude.lua"),
        tranche_stats::APPLY_DELTA_LUA,
        include_str!("../../lua/archive.lua")
    ))
});
static GET: LazyLock<Script> = script!("get");
static SEAL: LazyLock<Script> = script!("seal");
static DICT: LazyLock<Script> = script!("dict");
static MOVE: LazyLock<Script> = script!("move");
static JOIN: LazyLock<Script> = script!("join");

/// Every script with its name, for tests that check each keeps to one slot.
pub fn scripts() -> Vec<(&'static str, &'static Script)> {
    vec![
        ("archive", &ARCHIVE),
        ("get", &GET),
        ("seal", &SEAL),
        ("dict", &DICT),
        ("move", &MOVE),
        ("join", &JOIN),
    ]
}

/// The consumer group every archiver of a namespace joins, on every inbox.
const GROUP: &str = "archivers";
/// Records per archive script call at most: Lua's `unpack` is bounded.
const MAX_SCRIPT_RECORDS: usize = 1000;

/// The archive on Redis (standalone or cluster).
///
/// Keys of shard `s` (tag `{ns:s}`): `inbox` (read through the `archivers` consumer
/// group), `completed:index` (read only: the active store's), `archived` (bitmap of
/// archived pids, at [`KeySchema::bit_offset`]), `completed` (simple tier, pid -> JSON),
/// `completed:batch:N:open` (hash of a compressed batch still filling, pid -> JSON),
/// `completed:batch:N` (a sealed binary v2 batch; with a TTL in the summary tier),
/// `completed:seg:K` (the sealed batches of segment `K`, joined once every one of them
/// is whole: see [`SEGMENT_BATCHES`]; with a TTL in the summary tier),
/// `archive` (hash: `count` of archived records, `partial:N` sizes of partial seals)
/// and `archive:open` (set of open batch ids, for compaction), beside the statistics
/// keys of `tranche-stats` that `archive.lua` updates in the same step.
/// Namespace keys: `{ns}:dict` (the worker dictionary) and `{ns}:meta`
/// (`decode_failures`).
///
/// A pass reads every shard's inbox at once and sends a shard's archive calls (up to
/// 1,000 records each, cut at batch boundaries) together, pipelined
/// on the connection: on a cluster the shards' calls go to their own nodes in
/// parallel. The simple tier and open batches store each record's inbox line as it
/// arrived (the active store's `encode_json`), decoded once to check it, to count it
/// and to seal full batches, but never encoded again. A batch complete within one call
/// is sealed before the call and sent as its binary v2 string plus its first bit
/// offset and record count (its bits are contiguous), with no per-record arguments.
/// The segments of the batches a call seals whole are joined (`join.lua`, when every
/// batch of them is whole) by calls queued right behind it, in the same round trip;
/// those of batches sealed from their open hash, after the seal. Compaction joins any
/// segment a crash left unjoined.
/// `get.lua` reads a pid's batch key and its segment in the same script, so a lookup
/// stays one round trip wherever the batch is.
///
/// Generic over the connection so any multiplexed [`ConnectionLike`] works.
#[derive(Debug)]
pub struct RedisArchive<C> {
    conn: C,
    config: Config,
    schema: KeySchema,
    keys: Arc<[ShardKeys]>,
    dict_key: String,
    meta_key: String,
    /// The worker dictionary as last read; it only grows, so a decode that meets an
    /// unknown index reads it again.
    dict: RwLock<Arc<WorkerDict>>,
    /// Per shard: whether this archiver has made sure the group exists and re-read its
    /// own pending entries (left by an earlier run under the same consumer name).
    started: Arc<[AtomicBool]>,
    /// `{ns}:dirty`, the shards completing clients marked.
    dirty_key: String,
    /// Which shards woken passes still owe a read, and when each was last read.
    woken: Mutex<Woken>,
    /// Records archived as last counted, plus what this archiver wrote since: picks
    /// the tier of a woken pass without a read per shard. Sweeps count again. The
    /// count only grows, so the tier it gives lags at most what other archivers wrote
    /// since the last sweep.
    archived: AtomicU64,
    /// Whether `archived` was ever counted (a woken pass before any sweep counts).
    counted: AtomicBool,
}

/// What woken passes know of each shard.
#[derive(Debug)]
struct Woken {
    /// Marked dirty (popped from `{ns}:dirty`) or left full by its last read, and not
    /// read since.
    owed: Vec<bool>,
    /// Whether its last read came back full: read it again without waiting.
    full: Vec<bool>,
    /// When a pass last read it.
    last_read: Vec<Option<Instant>>,
}

#[derive(Debug, Clone)]
struct ShardKeys {
    inbox: String,
    index: String,
    archived: String,
    completed: String,
    counters: String,
    stats: [String; 5],
    /// The ids of the shard's open batches, so compaction finds them without SCAN.
    open: String,
}

/// The largest bit offset a Redis bitmap accepts.
const MAX_BIT_OFFSET: u64 = (1 << 32) - 1;
impl ShardKeys {
    fn new(schema: &KeySchema, shard: u32) -> Self {
        Self {
            inbox: schema.inbox(shard),
            index: schema.completed_index(shard),
            archived: schema.shard_key(shard, "archived"),
            completed: schema.completed(shard),
            counters: schema.shard_key(shard, "archive"),
            stats: tranche_stats::stats_keys(schema, shard),
            open: schema.shard_key(shard, "archive:open"),
        }
    }
}

/// The hash of a compressed batch still taking records.
fn open_batch_key(schema: &KeySchema, batch: u64) -> String {
    format!("{}:open", schema.completed_batch(batch))
}

/// `get.lua`'s reply: index bit, archived bit, simple JSON, sealed batch, open-batch
/// JSON, the sealed batch's PTTL, the batch's segment and its PTTL.
type GetReply = (
    i64,
    i64,
    Option<String>,
    Option<Vec<u8>>,
    Option<String>,
    i64,
    Option<Vec<u8>>,
    i64,
);

/// A segment as read: its bytes (none once expired) and its PTTL.
type SegmentRead = (Option<Vec<u8>>, i64);

/// What [`RedisArchive::seal`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sealing {
    /// The batch had no open hash (sealed, or never written).
    Nothing,
    /// Sealed, but not every planned pid of it is in yet.
    Partial,
    /// Sealed whole: its segment may be complete.
    Full,
}

/// One batch as read for export: simple JSON per pid, open fields, sealed bytes, PTTL.
type BatchReply = (
    Vec<Option<String>>,
    Vec<(u64, String)>,
    Option<Vec<u8>>,
    i64,
);

/// One record on its way into the archive, with the JSON line it arrived as (when it
/// came from the inbox): the simple tier and open batches store that line as it is,
/// without encoding the record again. The active store writes every inbox line with
/// codec's `encode_json`, so the stored JSON is the seed's shape either way.
#[derive(Clone)]
struct Item<'a> {
    record: CompletedRecord,
    json: Option<&'a str>,
}

impl Item<'_> {
    fn json(&self) -> std::borrow::Cow<'_, str> {
        match self.json {
            Some(line) => line.into(),
            None => encode_json(&self.record).into(),
        }
    }
}

/// Cuts `items` (sorted by pid) into runs of at most `max`, each cut at a batch
/// boundary where one lies within the run, so a batch is in one call whenever it fits.
fn chunks_by_batch<'a>(
    mut items: Vec<Item<'a>>,
    max: usize,
    batch_of: impl Fn(u64) -> u64,
) -> Vec<Vec<Item<'a>>> {
    let mut out = Vec::with_capacity(items.len() / max + 1);
    while items.len() > max {
        let last = batch_of(items[max].record.pid);
        let cut = items[..max]
            .iter()
            .rposition(|i| batch_of(i.record.pid) != last)
            .map_or(max, |p| p + 1);
        let rest = items.split_off(cut);
        out.push(std::mem::replace(&mut items, rest));
    }
    if !items.is_empty() {
        out.push(items);
    }
    out
}

impl<C> RedisArchive<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// An archive over `conn` with `config`.
    pub fn new(conn: C, config: Config) -> Result<Self> {
        let schema = config.schema()?;
        Ok(Self {
            keys: schema
                .shards()
                .map(|s| ShardKeys::new(&schema, s))
                .collect::<Vec<_>>()
                .into(),
            started: schema
                .shards()
                .map(|_| AtomicBool::new(false))
                .collect::<Vec<_>>()
                .into(),
            dict_key: schema.dict(),
            meta_key: schema.meta(),
            dirty_key: schema.dirty(),
            woken: Mutex::new(Woken {
                owed: vec![false; schema.num_shards() as usize],
                full: vec![false; schema.num_shards() as usize],
                last_read: vec![None; schema.num_shards() as usize],
            }),
            archived: AtomicU64::new(0),
            counted: AtomicBool::new(false),
            dict: RwLock::default(),
            conn,
            config,
            schema,
        })
    }

    /// The settings.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Records archived so far, over every shard (one read per shard, all sent at once).
    pub async fn archived_count(&self) -> Result<u64> {
        let counts = try_join_all(self.keys.iter().map(|k| {
            retry(&self.conn, move |mut c| async move {
                redis::cmd("HGET")
                    .arg(&k.counters)
                    .arg("count")
                    .query_async::<Option<u64>>(&mut c)
                    .await
            })
        }))
        .await?;
        Ok(counts.into_iter().flatten().sum())
    }

    /// Overwrites the sealed bytes of `batch` with `bytes`, in its own key or in its
    /// segment, keeping the TTL (tests of the corrupt-batch path; not atomic). Returns
    /// whether the batch was sealed.
    pub async fn corrupt_batch(&self, batch: u64, bytes: Vec<u8>) -> Result<bool> {
        let key = self.schema.completed_batch(batch);
        let (seg, slot) = SegmentRef::of(&self.schema, batch);
        let seg_key = seg.key(&self.schema);
        let (own, joined): (bool, Option<Vec<u8>>) = retry(&self.conn, |mut c| {
            let mut pipe = redis::pipe();
            pipe.cmd("EXISTS").arg(&key).cmd("GET").arg(&seg_key);
            async move { pipe.query_async(&mut c).await }
        })
        .await?;
        let (target, value) = if own {
            (key, bytes)
        } else if let Some(old) = joined {
            let mut blobs = segment::blobs(&old).map_err(|detail| Error::Corrupt {
                key: seg_key.clone(),
                detail,
            })?;
            if blobs[slot].is_empty() {
                return Ok(false);
            }
            blobs[slot] = bytes;
            (seg_key, segment::build(&blobs))
        } else {
            return Ok(false);
        };
        let _: () = retry(&self.conn, |mut c| {
            let (target, value) = (&target, &value);
            async move {
                redis::cmd("SET")
                    .arg(target)
                    .arg(value)
                    .arg("KEEPTTL")
                    .query_async(&mut c)
                    .await
            }
        })
        .await?;
        Ok(true)
    }

    /// Writes `items` (distinct pids of `shard`, at most [`MAX_SCRIPT_RECORDS`]) with
    /// the archive script, dropping those archived already and calling again until the
    /// call goes through. Returns the records written and the duplicates dropped.
    async fn write(
        &self,
        shard: u32,
        mut items: Vec<Item<'_>>,
        tier: Tier,
    ) -> Result<(usize, usize)> {
        let keys = &self.keys[shard as usize];
        if !items.is_sorted_by_key(|i| i.record.pid) {
            items.sort_unstable_by_key(|i| i.record.pid);
        }
        let mut dups = 0;
        loop {
            if items.is_empty() {
                return Ok((0, dups));
            }
            // Per batch (a run of adjacent items): whether this call holds every planned
            // pid of it, so that it goes straight to its sealed form. Such a run's pids,
            // and so its bits, are contiguous: the script takes its first bit and count.
            let runs = self.batch_runs(&items);
            let full: Vec<bool> = runs
                .iter()
                .map(|&(b, ref r)| {
                    let run = &items[r.clone()];
                    tier != Tier::Simple
                        && run[run.len() - 1].record.pid - run[0].record.pid + 1 == run.len() as u64
                        && run
                            .iter()
                            .filter(|i| i.record.pid >= self.config.first_pid)
                            .count() as u64
                            == self.planned(b)
                })
                .collect();
            let sealed = self.seal_runs(&items, &runs, &full).await?;
            let mut inv = ARCHIVE.prepare_invoke();
            inv.key(&keys.archived)
                .key(&keys.completed)
                .key(&keys.counters);
            for k in &keys.stats {
                inv.key(k);
            }
            inv.key(&keys.open);
            // The script numbers records as it receives them: the ones sent one by one,
            // then the sealed batches'. `order` maps its numbers back to `items`.
            let mut order: Vec<usize> = Vec::with_capacity(items.len());
            let mut open: Vec<u64> = Vec::new();
            let mut delta = StatsDelta::default();
            for item in &items {
                delta.add(&item.record);
            }
            let one_by_one: usize = runs
                .iter()
                .zip(&full)
                .filter(|(_, f)| !**f)
                .map(|((_, r), _)| r.len())
                .sum();
            inv.arg(one_by_one);
            for (&(batch, ref range), _) in runs.iter().zip(&full).filter(|(_, f)| !**f) {
                let target: i64 = if tier == Tier::Simple {
                    0
                } else {
                    open.push(batch);
                    open.len() as i64
                };
                for (i, item) in items[range.clone()].iter().enumerate() {
                    let r = &item.record;
                    order.push(range.start + i);
                    inv.arg(r.pid)
                        .arg(self.schema.bit_offset(r.pid))
                        .arg(item.json().as_ref())
                        .arg(target);
                }
            }
            inv.arg(open.len());
            for &b in &open {
                inv.key(open_batch_key(&self.schema, b));
                inv.arg(b);
            }
            inv.arg(sealed.len());
            for (b, bytes) in &sealed {
                inv.key(self.schema.completed_batch(*b));
                inv.arg(bytes.as_slice());
            }
            inv.arg(self.ttl_ms(tier));
            for ((_, range), _) in runs.iter().zip(&full).filter(|(_, f)| **f) {
                order.extend(range.clone());
                inv.arg(self.schema.bit_offset(items[range.start].record.pid))
                    .arg(range.len());
            }
            for a in delta_args(&delta, now_ms()) {
                inv.arg(a);
            }
            // The batches this call seals whole may complete their segments: their joins
            // are queued right behind the call on the same connection (one slot, so one
            // node), which runs them after it, in the same round trip. A join re-checks
            // everything, so one that runs on a refused call, or ahead of a call resent
            // after NOSCRIPT, does nothing; compaction joins what it left.
            let sealing: Vec<u64> = runs
                .iter()
                .zip(&full)
                .filter(|(_, f)| **f)
                .map(|((b, _), _)| *b)
                .collect();
            let call = retry(&self.conn, |mut c| {
                let inv = &inv;
                async move { inv.invoke_async(&mut c).await }
            });
            let (reply, joined) =
                futures_util::future::join(call, self.join_segments(sealing)).await;
            let reply: Vec<i64> = reply?;
            joined?;
            match reply.split_first() {
                Some((1, rest)) => {
                    let n = rest.first().copied().unwrap_or(0) as usize;
                    // The batches this call filled and `seal` sealed whole, whose
                    // segments may now be complete.
                    let mut whole = Vec::new();
                    // Seal the batches this call filled. A crash here leaves them open
                    // (readable, and sealed by the next compaction).
                    for (&batch, &len) in open.iter().zip(rest.iter().skip(1)) {
                        if len as u64 >= self.planned(batch)
                            && self.seal(batch, tier).await? == Sealing::Full
                        {
                            whole.push(batch);
                        }
                    }
                    // A crash before the join leaves the batches in their own keys
                    // (readable, and joined by the next compaction).
                    self.join_segments(whole).await?;
                    return Ok((n, dups));
                }
                Some((0, taken)) => {
                    let taken: HashSet<usize> = taken
                        .iter()
                        .filter_map(|&i| order.get((i as usize).wrapping_sub(1)).copied())
                        .collect();
                    dups += taken.len();
                    items = items
                        .into_iter()
                        .enumerate()
                        .filter(|(i, _)| !taken.contains(i))
                        .map(|(_, r)| r)
                        .collect();
                }
                _ => {
                    return Err(Error::Corrupt {
                        key: keys.archived.clone(),
                        detail: format!("unexpected archive reply {reply:?}"),
                    });
                }
            }
        }
    }

    /// The runs of `items` (sorted by pid) that share a batch: batch id and index range.
    fn batch_runs(&self, items: &[Item<'_>]) -> Vec<(u64, std::ops::Range<usize>)> {
        let mut runs: Vec<(u64, std::ops::Range<usize>)> = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let b = self.schema.batch_of(item.record.pid);
            match runs.last_mut() {
                Some((last, r)) if *last == b => r.end = i + 1,
                _ => runs.push((b, i..i + 1)),
            }
        }
        runs
    }

    /// The TTL of sealed batches in `tier`, in ms (0: none).
    fn ttl_ms(&self, tier: Tier) -> u64 {
        if tier == Tier::Summary {
            self.config.summary_ttl.as_millis().max(1) as u64
        } else {
            0
        }
    }

    /// The runs marked `full`, sealed as binary v2: batch id and bytes.
    async fn seal_runs(
        &self,
        items: &[Item<'_>],
        runs: &[(u64, std::ops::Range<usize>)],
        full: &[bool],
    ) -> Result<Vec<(u64, Vec<u8>)>> {
        if !full.contains(&true) {
            return Ok(Vec::new());
        }
        let mut workers: Vec<&str> = Vec::new();
        for ((_, range), _) in runs.iter().zip(full).filter(|(_, f)| **f) {
            for item in &items[range.clone()] {
                if !workers.contains(&&*item.record.worker) {
                    workers.push(&item.record.worker);
                }
            }
        }
        let dict = self.ensure_workers(&workers).await?;
        let options = BinaryV2Options::new(self.schema.batch_size())?;
        let mut out = Vec::new();
        let mut recs = Vec::new();
        for ((b, range), _) in runs.iter().zip(full).filter(|(_, f)| **f) {
            recs.clear();
            recs.extend(items[range.clone()].iter().map(|i| i.record.clone()));
            out.push((*b, encode_binary_v2(*b, &recs, &dict, &options)?));
        }
        Ok(out)
    }
    /// How many pids batch `batch` can hold: pids below `first_pid` are never planned.
    fn planned(&self, batch: u64) -> u64 {
        self.config.planned(batch, self.schema.batch_size())
    }

    /// Seals open batch `batch`: its records (and those of an earlier partial seal) as
    /// one binary v2 string, with the summary TTL when `tier` is the summary tier.
    /// Says whether there was anything to seal, and whether the batch is now whole.
    async fn seal(&self, batch: u64, tier: Tier) -> Result<Sealing> {
        let shard = self.schema.shard_of_batch(batch);
        let keys = &self.keys[shard as usize];
        let open_key = open_batch_key(&self.schema, batch);
        let sealed_key = self.schema.completed_batch(batch);
        let ttl = self.ttl_ms(tier);
        for _ in 0..10 {
            let (fields, old): (Vec<(u64, String)>, Option<Vec<u8>>) =
                retry(&self.conn, |mut c| {
                    let mut pipe = redis::pipe();
                    pipe.cmd("HGETALL").arg(&open_key);
                    pipe.cmd("GET").arg(&sealed_key);
                    async move { pipe.query_async(&mut c).await }
                })
                .await?;
            if fields.is_empty() {
                let id = batch;
                let _: i64 = retry(&self.conn, |mut c| async move {
                    redis::cmd("SREM")
                        .arg(&keys.open)
                        .arg(id)
                        .query_async(&mut c)
                        .await
                })
                .await?;
                return Ok(Sealing::Nothing);
            }
            let mut records = Vec::with_capacity(fields.len());
            for (pid, json) in &fields {
                records.push(decode_json(json).map_err(|e| Error::Corrupt {
                    key: format!("{open_key} {pid}"),
                    detail: e.to_string(),
                })?);
            }
            let workers: Vec<&str> = records.iter().map(|r| &*r.worker).collect();
            let dict = self.ensure_workers(&workers).await?;
            let old = old.unwrap_or_default();
            if !old.is_empty() {
                // An earlier seal of a partial batch (compaction): merge it in. If it no
                // longer decodes, sealing would lose it: leave the batch open.
                let earlier = decode_binary_v2(&old, &dict).map_err(|e| Error::Corrupt {
                    key: sealed_key.clone(),
                    detail: e.to_string(),
                })?;
                let fresh: HashSet<u64> = records.iter().map(|r| r.pid).collect();
                records.extend(
                    earlier
                        .records
                        .into_iter()
                        .filter(|r| !fresh.contains(&r.pid)),
                );
            }
            let options = BinaryV2Options::new(self.schema.batch_size())?;
            let bytes = encode_binary_v2(batch, &records, &dict, &options)?;
            let mut inv = SEAL.prepare_invoke();
            inv.key(&open_key)
                .key(&sealed_key)
                .key(&keys.open)
                .key(&keys.counters)
                .arg(fields.len())
                .arg(&old)
                .arg(&bytes)
                .arg(ttl)
                .arg(batch)
                .arg(records.len())
                .arg(self.planned(batch));
            let done: i64 = retry(&self.conn, |mut c| {
                let inv = &inv;
                async move { inv.invoke_async(&mut c).await }
            })
            .await?;
            if done == 1 {
                return Ok(if records.len() as u64 >= self.planned(batch) {
                    Sealing::Full
                } else {
                    Sealing::Partial
                });
            }
        }
        tracing::debug!(batch, "batch kept changing while sealing; left open");
        Ok(Sealing::Nothing)
    }

    /// Joins the segments of `batches` (sealed whole) whose every planned batch is
    /// sealed whole; the calls go out together. Returns how many were joined.
    async fn join_segments(&self, batches: Vec<u64>) -> Result<usize> {
        let mut segments: Vec<SegmentRef> = batches
            .into_iter()
            .map(|b| SegmentRef::of(&self.schema, b).0)
            .collect();
        segments.sort_unstable();
        segments.dedup();
        let joined = try_join_all(segments.iter().map(|s| self.join(*s))).await?;
        Ok(joined.into_iter().filter(|j| *j).count())
    }

    /// Joins segment `seg` if every planned batch of it is sealed whole (`join.lua`).
    async fn join(&self, seg: SegmentRef) -> Result<bool> {
        let keys = &self.keys[seg.shard as usize];
        let batches = seg.batches(&self.schema);
        let mut inv = JOIN.prepare_invoke();
        inv.key(&keys.counters)
            .key(seg.key(&self.schema))
            .arg(SEGMENT_BATCHES);
        for &b in &batches {
            inv.key(self.schema.completed_batch(b)).arg(b);
        }
        for &b in &batches {
            inv.arg(u8::from(self.planned(b) > 0));
        }
        let joined: i64 = retry(&self.conn, |mut c| {
            let inv = &inv;
            async move { inv.invoke_async(&mut c).await }
        })
        .await?;
        Ok(joined == 1)
    }

    /// The worker dictionary, holding every one of `workers` (added atomically with a
    /// compare-and-set, so concurrent archivers agree on every index).
    async fn ensure_workers(&self, workers: &[&str]) -> Result<Arc<WorkerDict>> {
        let cached = self.dict.read().unwrap_or_else(|p| p.into_inner()).clone();
        if workers.iter().all(|w| cached.index_of(w).is_some()) {
            return Ok(cached);
        }
        let key = &self.dict_key;
        loop {
            let bytes: Option<Vec<u8>> = retry(&self.conn, |mut c| async move {
                redis::cmd("GET").arg(key).query_async(&mut c).await
            })
            .await?;
            let old = bytes.unwrap_or_default();
            let mut dict = if old.is_empty() {
                WorkerDict::new()
            } else {
                WorkerDict::from_bytes(&old)?
            };
            let before = dict.len();
            for w in workers {
                dict.insert(w)?;
            }
            let dict = Arc::new(dict);
            if dict.len() != before {
                let mut inv = DICT.prepare_invoke();
                inv.key(key).arg(&old).arg(dict.to_bytes());
                let done: i64 = retry(&self.conn, |mut c| {
                    let inv = &inv;
                    async move { inv.invoke_async(&mut c).await }
                })
                .await?;
                if done == 0 {
                    continue;
                }
            }
            *self.dict.write().unwrap_or_else(|p| p.into_inner()) = dict.clone();
            return Ok(dict);
        }
    }

    /// Moves `shard`'s simple-tier records into open batches, a page at a time.
    async fn move_simple(&self, shard: u32) -> Result<()> {
        let keys = &self.keys[shard as usize];
        let mut cursor = 0u64;
        loop {
            let (next, page): (u64, Vec<(u64, String)>) = retry(&self.conn, |mut c| async move {
                redis::cmd("HSCAN")
                    .arg(&keys.completed)
                    .arg(cursor)
                    .arg("COUNT")
                    .arg(500)
                    .query_async(&mut c)
                    .await
            })
            .await?;
            if !page.is_empty() {
                let mut batches: Vec<u64> =
                    page.iter().map(|(p, _)| self.schema.batch_of(*p)).collect();
                batches.sort_unstable();
                batches.dedup();
                let mut inv = MOVE.prepare_invoke();
                inv.key(&keys.completed).key(&keys.open).arg(batches.len());
                for &b in &batches {
                    inv.key(open_batch_key(&self.schema, b)).arg(b);
                }
                for (pid, _) in &page {
                    let k = batches
                        .binary_search(&self.schema.batch_of(*pid))
                        .unwrap_or(0)
                        + 1;
                    inv.arg(pid).arg(k);
                }
                let _: i64 = retry(&self.conn, |mut c| {
                    let inv = &inv;
                    async move { inv.invoke_async(&mut c).await }
                })
                .await?;
            }
            if next == 0 {
                return Ok(());
            }
            cursor = next;
        }
    }

    /// Gives the sealed batches and segments of `fill` (one shard's
    /// [`Self::shard_fill`]) without a TTL the summary tier's.
    async fn expire_sealed(&self, fill: &[(u64, u64)]) -> Result<()> {
        let ttl = self.config.summary_ttl.as_millis().max(1) as u64;
        let mut keys: Vec<String> = Vec::new();
        let mut last: Option<SegmentRef> = None;
        for &(b, _) in fill {
            let (seg, _) = SegmentRef::of(&self.schema, b);
            if last != Some(seg) {
                keys.push(seg.key(&self.schema));
                last = Some(seg);
            }
            keys.push(self.schema.completed_batch(b));
        }
        for chunk in keys.chunks(500) {
            retry(&self.conn, |mut c| {
                let mut pipe = redis::pipe();
                for key in chunk {
                    pipe.cmd("PEXPIRE").arg(key).arg(ttl).arg("NX").ignore();
                }
                async move { pipe.query_async::<()>(&mut c).await }
            })
            .await?;
        }
        Ok(())
    }

    async fn seal_open_batches(&self) -> Result<usize> {
        let tier = self.config.tier_for(self.archived_count().await?);
        let mut sealed = 0;
        for k in self.keys.iter() {
            let key = &k.open;
            let ids: Vec<u64> = retry(&self.conn, |mut c| async move {
                redis::cmd("SMEMBERS").arg(key).query_async(&mut c).await
            })
            .await?;
            let mut whole = Vec::new();
            for batch in ids {
                match self.seal(batch, tier.max(Tier::Compressed)).await? {
                    Sealing::Nothing => {}
                    Sealing::Partial => sealed += 1,
                    Sealing::Full => {
                        sealed += 1;
                        whole.push(batch);
                    }
                }
            }
            self.join_segments(whole).await?;
        }
        Ok(sealed)
    }
}

#[async_trait]
impl<C> Compaction for RedisArchive<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn compact(&self) -> Result<usize> {
        let tier = self.config.tier_for(self.archived_count().await?);
        if tier != Tier::Simple {
            for shard in self.schema.shards() {
                self.move_simple(shard).await?;
            }
        }
        let sealed = self.seal_open_batches().await?;
        for shard in self.schema.shards() {
            let fill = self.shard_fill(shard).await?;
            self.join_complete(&fill).await?;
            if tier == Tier::Summary {
                self.expire_sealed(&fill).await?;
            }
        }
        Ok(sealed)
    }
}

/// Milliseconds since the Unix epoch, for the statistics' `last_updated`.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
