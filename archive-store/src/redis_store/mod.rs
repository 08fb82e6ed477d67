//! The Redis backend: every archive batch and every `get` is one Lua script on one
//! shard's hash slot.

mod conn;

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

use conn::retry;
use tranche_stats::{StatsDelta, delta_args};

use crate::dump::{Dump, DumpBatch};
use crate::model::{ArchivePass, Config, Lookup, RangePage, Tier};
use crate::segment::{self, SEGMENT_BATCHES, SegmentRef};
use crate::store::{ArchiveQuery, Archiver, Compaction, Export, Import, page_by_lookup};
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

/// Whether Redis refused a call for what it carried (a script's error), rather than
/// the call failing to get through: only then is trying the records one by one of use.
fn refused(err: &redis::RedisError) -> bool {
    !(err.is_io_error()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_timeout()
        || err.is_cluster_error())
}

/// Whether the archive script refused one record for the record itself (its own
/// counters past the statistics' guard, or arguments it cannot take), so that it can
/// never be archived; anything else it refuses is the shard's state.
fn poison(err: &redis::RedisError) -> bool {
    let text = err.to_string();
    text.contains("a delta counter reached") || text.contains("malformed delta argument")
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

    async fn ensure_group(&self, shard: u32) -> Result<bool> {
        if self.started[shard as usize].load(Ordering::Acquire) {
            return Ok(false);
        }
        let key = self.keys[shard as usize].inbox.clone();
        let created: redis::RedisResult<Value> = retry(&self.conn, |mut c| {
            let key = key.clone();
            async move {
                redis::cmd("XGROUP")
                    .arg("CREATE")
                    .arg(key)
                    .arg(GROUP)
                    .arg("0")
                    .arg("MKSTREAM")
                    .query_async(&mut c)
                    .await
            }
        })
        .await;
        match created {
            Ok(_) => {}
            Err(e) if e.code() == Some("BUSYGROUP") => {}
            Err(e) => return Err(e.into()),
        }
        Ok(true)
    }

    /// Counts the archived records again (one read per shard) and keeps the count for
    /// woken passes.
    async fn count_archived(&self) -> Result<u64> {
        let archived = self.archived_count().await?;
        self.archived.fetch_max(archived, Ordering::Relaxed);
        self.counted.store(true, Ordering::Relaxed);
        Ok(self.archived.load(Ordering::Relaxed))
    }

    /// Takes over up to `batch` entries of `shard` that another archiver has held
    /// unacknowledged for `claim_idle` (it died): XAUTOCLAIM, on sweeps only.
    async fn take_over(&self, shard: u32, pass: &mut ArchivePass) -> Result<Vec<StreamId>> {
        let inbox = &self.keys[shard as usize].inbox;
        let consumer = &self.config.consumer;
        let want = self.config.batch;
        let idle = self.config.claim_idle.as_millis().min(u64::MAX as u128) as u64;
        let claimed: StreamAutoClaimReply = retry(&self.conn, |mut c| async move {
            redis::cmd("XAUTOCLAIM")
                .arg(inbox)
                .arg(GROUP)
                .arg(consumer)
                .arg(idle)
                .arg("0-0")
                .arg("COUNT")
                .arg(want)
                .query_async(&mut c)
                .await
        })
        .await?;
        pass.claimed += claimed.claimed.len();
        Ok(claimed.claimed)
    }

    /// Pops every mark of `{ns}:dirty` (one command, whatever the shard count; marks
    /// another archiver pops are its to serve) and returns the shard numbers.
    async fn pop_dirty(&self) -> Result<Vec<u32>> {
        let count = self.schema.num_shards() as usize;
        let key = &self.dirty_key;
        let marks: Vec<String> = retry(&self.conn, |mut c| async move {
            redis::cmd("SPOP")
                .arg(key)
                .arg(count)
                .query_async(&mut c)
                .await
        })
        .await?;
        Ok(marks
            .iter()
            .filter_map(|m| {
                let shard = m
                    .parse::<u32>()
                    .ok()
                    .filter(|&s| s < self.schema.num_shards());
                if shard.is_none() {
                    tracing::warn!(key = %self.dirty_key, mark = %m, "not a shard number; ignored");
                }
                shard
            })
            .collect())
    }

    /// The shards a woken pass reads now: those owed a read whose last read came back
    /// full or was at least `gather` ago. They are no longer owed.
    fn ripe(&self, marked: &[u32], now: Instant) -> Vec<u32> {
        let mut w = self.woken.lock().unwrap_or_else(|p| p.into_inner());
        for &shard in marked {
            w.owed[shard as usize] = true;
        }
        let mut out = Vec::new();
        for shard in 0..w.owed.len() {
            let ready = w.full[shard]
                || w.last_read[shard].is_none_or(|t| now.duration_since(t) >= self.config.gather);
            if w.owed[shard] && ready {
                w.owed[shard] = false;
                out.push(shard as u32);
            }
        }
        out
    }

    /// Notes what a read of `shard` at `at` found (or that it failed: owed again).
    fn read_done(&self, shard: u32, at: Instant, entries: Option<usize>) {
        let mut w = self.woken.lock().unwrap_or_else(|p| p.into_inner());
        let s = shard as usize;
        match entries {
            Some(entries) => {
                let full = entries >= self.config.batch;
                w.full[s] = full;
                w.owed[s] |= full;
                w.last_read[s] = Some(at);
            }
            None => w.owed[s] = true,
        }
    }

    /// Archives `shards` at once, their calls pipelined; `takeover` on sweeps.
    async fn archive_shards(
        &self,
        shards: &[u32],
        tier: Tier,
        takeover: bool,
    ) -> Result<ArchivePass> {
        let at = Instant::now();
        let results = futures_util::future::join_all(
            shards
                .iter()
                .map(|&s| self.archive_shard(s, tier, takeover)),
        )
        .await;
        let mut pass = ArchivePass::default();
        let mut failed = None;
        for (&shard, result) in shards.iter().zip(results) {
            match result {
                Ok(p) => {
                    self.read_done(shard, at, Some(p.entries));
                    pass.add(p);
                }
                Err(err) => {
                    self.read_done(shard, at, None);
                    failed.get_or_insert(err);
                }
            }
        }
        self.archived
            .fetch_add(pass.archived as u64, Ordering::Relaxed);
        match failed {
            Some(err) => Err(err),
            None => Ok(pass),
        }
    }

    /// Reads up to `batch` entries of `shard`: with `takeover`, a dead archiver's
    /// (idle long enough) first; then, on the first visit, this consumer's own pending
    /// ones; then new ones.
    async fn read(
        &self,
        shard: u32,
        takeover: bool,
        pass: &mut ArchivePass,
    ) -> Result<Vec<StreamId>> {
        let first = self.ensure_group(shard).await?;
        let inbox = &self.keys[shard as usize].inbox;
        let consumer = &self.config.consumer;
        let mut want = self.config.batch;
        let mut out = Vec::new();
        if takeover {
            out = self.take_over(shard, pass).await?;
            want -= out.len().min(want);
        }
        for from in [first.then_some("0"), Some(">")].into_iter().flatten() {
            if want == 0 {
                break;
            }
            let reply: Option<StreamReadReply> = retry(&self.conn, |mut c| async move {
                redis::cmd("XREADGROUP")
                    .arg("GROUP")
                    .arg(GROUP)
                    .arg(consumer)
                    .arg("COUNT")
                    .arg(want)
                    .arg("STREAMS")
                    .arg(inbox)
                    .arg(from)
                    .query_async(&mut c)
                    .await
            })
            .await?;
            let ids: Vec<StreamId> = reply
                .into_iter()
                .flat_map(|r| r.keys)
                .flat_map(|k| k.ids)
                .filter(|id| !out.iter().any(|o| o.id == id.id))
                .collect();
            want -= ids.len().min(want);
            out.extend(ids);
        }
        if first {
            self.started[shard as usize].store(true, Ordering::Release);
        }
        Ok(out)
    }

    async fn archive_shard(&self, shard: u32, tier: Tier, takeover: bool) -> Result<ArchivePass> {
        let mut pass = ArchivePass::default();
        let raw = self.read(shard, takeover, &mut pass).await?;
        if raw.is_empty() {
            return Ok(pass);
        }
        pass.entries = raw.len();
        let mut ids = Vec::with_capacity(raw.len());
        let mut texts = Vec::with_capacity(raw.len());
        for mut entry in raw {
            let text = entry
                .map
                .remove("r")
                .and_then(|v| String::from_redis_value(v).ok());
            if text.is_none() {
                pass.malformed += 1;
                tracing::warn!(entry = %entry.id, "inbox entry without field r dropped");
            }
            texts.push(text.unwrap_or_default());
            ids.push(entry.id);
        }
        // A pid twice in one pass is a duplicate completion: keep the first.
        let mut seen = HashSet::new();
        let mut items = Vec::new();
        for (text, id) in texts.iter().zip(&ids) {
            for line in text.lines().filter(|l| !l.is_empty()) {
                match decode_json(line) {
                    // A record of another shard would land on this shard's bit offsets,
                    // where another pid lives: drop it loudly rather than corrupt both.
                    Ok(r) if self.schema.shard_of(r.pid) != shard => {
                        pass.malformed += 1;
                        tracing::warn!(
                            pid = r.pid,
                            shard,
                            "record in another shard's inbox dropped"
                        );
                    }
                    Ok(record) if seen.insert(record.pid) => items.push(Item {
                        record,
                        json: Some(line),
                    }),
                    Ok(_) => pass.duplicates += 1,
                    Err(err) => {
                        pass.malformed += 1;
                        tracing::warn!(%err, entry = %id, line, "undecodable inbox line dropped");
                    }
                }
            }
        }
        // In pid order a batch's records are adjacent: chunks cut at batch boundaries,
        // and a batch complete in one chunk is sealed from a slice, without a copy.
        items.sort_unstable_by_key(|i| i.record.pid);
        let chunks = chunks_by_batch(items, MAX_SCRIPT_RECORDS, |p| self.schema.batch_of(p));
        // The chunks hold distinct pids (and, but for batches larger than a chunk,
        // distinct batches), so their calls go out together, pipelined on the one
        // connection: the client prepares the next call while Redis runs this one.
        let written = try_join_all(
            chunks
                .into_iter()
                .map(|c| self.write_or_set_aside(shard, c, tier)),
        )
        .await?;
        let mut dead = Vec::new();
        for (n, dups, refused) in written {
            pass.archived += n;
            pass.duplicates += dups;
            dead.extend(refused);
        }
        if !dead.is_empty() {
            pass.dead_lettered += dead.len();
            self.dead_letter(shard, &dead).await?;
        }
        // Only now, with every record stored and counted, let the entries go. A crash
        // before this line leaves them pending; whoever takes them over finds their bits
        // set and writes nothing twice.
        let inbox = &self.keys[shard as usize].inbox;
        retry(&self.conn, |mut c| {
            let mut pipe = redis::pipe();
            pipe.cmd("XACK").arg(inbox).arg(GROUP).arg(&ids).ignore();
            pipe.cmd("XDEL").arg(inbox).arg(&ids).ignore();
            async move { pipe.query_async::<()>(&mut c).await }
        })
        .await?;
        Ok(pass)
    }

    /// [`write`](Self::write), but a record that can never be archived does not stall
    /// the shard: when the script refuses a call for its data (not for a connection
    /// failure), its records are written one by one, and each one refused alone for
    /// itself is returned with the reason, for the dead-letter stream; one refused for
    /// the shard's state fails the pass, as before, until the shard is repaired. A record whose bit offset
    /// is past what a Redis bitmap holds is set aside before any call. Returns the
    /// records written, the duplicates dropped and the records set aside.
    async fn write_or_set_aside<'a>(
        &self,
        shard: u32,
        items: Vec<Item<'a>>,
        tier: Tier,
    ) -> Result<(usize, usize, Vec<(Item<'a>, String)>)> {
        let (items, mut aside): (Vec<_>, Vec<_>) = items
            .into_iter()
            .partition(|i| self.schema.bit_offset(i.record.pid) <= MAX_BIT_OFFSET);
        let mut aside: Vec<(Item<'a>, String)> = aside
            .drain(..)
            .map(|i| {
                let reason = format!(
                    "pid {}: its bit offset {} is past the 2^32 bits of a Redis bitmap",
                    i.record.pid,
                    self.schema.bit_offset(i.record.pid)
                );
                (i, reason)
            })
            .collect();
        let err = match self.write(shard, items.clone(), tier).await {
            Ok((n, dups)) => return Ok((n, dups, aside)),
            Err(Error::Redis(err)) if refused(&err) => err,
            Err(err) => return Err(err),
        };
        tracing::warn!(shard, %err, records = items.len(), "archive call refused; writing its records one by one");
        let (mut written, mut dups) = (0, 0);
        for item in items {
            match self.write(shard, vec![item.clone()], tier).await {
                Ok((n, d)) => {
                    written += n;
                    dups += d;
                }
                Err(Error::Redis(err)) if refused(&err) && poison(&err) => {
                    aside.push((item, err.to_string()))
                }
                // The shard, not the record (a counter at the guard, a corrupt packed
                // value): the pass fails and its entries wait for a repair.
                Err(err) => return Err(err),
            }
        }
        Ok((written, dups, aside))
    }

    /// Moves records that can never be archived to the shard's dead-letter stream
    /// (`{ns:s}:dead`, the last 10,000 kept): the JSON line and the reason, for an
    /// operator. Their inbox entries are then acknowledged with the others.
    async fn dead_letter(&self, shard: u32, dead: &[(Item<'_>, String)]) -> Result<()> {
        let key = self.schema.shard_key(shard, "dead");
        for (item, reason) in dead {
            tracing::warn!(pid = item.record.pid, shard, %reason, "record moved to the dead-letter stream");
        }
        retry(&self.conn, |mut c| {
            let mut pipe = redis::pipe();
            for (item, reason) in dead {
                pipe.cmd("XADD")
                    .arg(&key)
                    .arg("MAXLEN")
                    .arg("~")
                    .arg(10_000)
                    .arg("*")
                    .arg("r")
                    .arg(item.json().as_ref())
                    .arg("reason")
                    .arg(reason)
                    .ignore();
            }
            async move { pipe.query_async::<()>(&mut c).await }
        })
        .await?;
        Ok(())
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

    async fn load_dict(&self) -> Result<Arc<WorkerDict>> {
        let key = &self.dict_key;
        let bytes: Option<Vec<u8>> = retry(&self.conn, |mut c| async move {
            redis::cmd("GET").arg(key).query_async(&mut c).await
        })
        .await?;
        let dict = match bytes {
            Some(b) => WorkerDict::from_bytes(&b)?,
            None => WorkerDict::new(),
        };
        let dict = Arc::new(dict);
        *self.dict.write().unwrap_or_else(|p| p.into_inner()) = dict.clone();
        Ok(dict)
    }

    async fn decode_sealed(
        &self,
        batch: u64,
        bytes: &[u8],
        pid: u64,
    ) -> Result<Option<CompletedRecord>, String> {
        let cached = self.dict.read().unwrap_or_else(|p| p.into_inner()).clone();
        let decoded = match decode_binary_v2(bytes, &cached) {
            Err(tranche_codec::Error::UnknownWorkerIndex(_)) => {
                let dict = self.load_dict().await.map_err(|e| e.to_string())?;
                decode_binary_v2(bytes, &dict)
            }
            other => other,
        };
        match decoded {
            Ok(b) => Ok(b.records.into_iter().find(|r| r.pid == pid)),
            Err(err) => Err(format!("batch {batch}: {err}")),
        }
    }

    async fn count_failure(&self, detail: String) -> Result<Lookup> {
        tracing::warn!(%detail, "archive batch failed to decode");
        let key = &self.meta_key;
        let _: i64 = retry(&self.conn, |mut c| async move {
            redis::cmd("HINCRBY")
                .arg(key)
                .arg("decode_failures")
                .arg(1)
                .query_async(&mut c)
                .await
        })
        .await?;
        Ok(Lookup::Undecodable { detail })
    }

    async fn lookup(&self, pid: u64) -> Result<Lookup> {
        // Redis bitmaps end at bit 2^32 - 1: a pid beyond it could never have been
        // completed or archived here (the write would have failed), so it is unknown.
        if self.schema.bit_offset(pid) > MAX_BIT_OFFSET {
            return Ok(Lookup::Unknown);
        }
        let shard = self.schema.shard_of(pid);
        let keys = &self.keys[shard as usize];
        let batch = self.schema.batch_of(pid);
        let (seg, slot) = SegmentRef::of(&self.schema, batch);
        let mut inv = GET.prepare_invoke();
        inv.key(&keys.index)
            .key(&keys.archived)
            .key(&keys.completed)
            .key(self.schema.completed_batch(batch))
            .key(open_batch_key(&self.schema, batch))
            .key(seg.key(&self.schema))
            .arg(pid)
            .arg(self.schema.bit_offset(pid));
        let (index, archived, simple, sealed, open, pttl, segment, segment_pttl): GetReply =
            retry(&self.conn, |mut c| {
                let inv = &inv;
                async move { inv.invoke_async(&mut c).await }
            })
            .await?;
        if archived == 0 {
            return Ok(if index == 1 {
                Lookup::Archiving
            } else {
                Lookup::Unknown
            });
        }
        if let Some(json) = simple {
            return match decode_json(&json) {
                Ok(record) => Ok(Lookup::Archived {
                    record,
                    tier: Tier::Simple,
                }),
                Err(err) => {
                    self.count_failure(format!("simple record {pid}: {err}"))
                        .await
                }
            };
        }
        if let Some(json) = open {
            return match decode_json(&json) {
                Ok(record) => Ok(Lookup::Archived {
                    record,
                    tier: Tier::Compressed,
                }),
                Err(err) => {
                    self.count_failure(format!("open batch record {pid}: {err}"))
                        .await
                }
            };
        }
        let (bytes, pttl): (&[u8], i64) = match (&sealed, &segment) {
            (Some(bytes), _) => (bytes, pttl),
            (None, Some(seg)) => match segment::slot_of(seg, slot) {
                Ok(Some(blob)) => (blob, segment_pttl),
                Ok(None) => {
                    return self
                        .count_failure(format!("segment of batch {batch} lacks it"))
                        .await;
                }
                Err(err) => {
                    return self
                        .count_failure(format!("segment of batch {batch}: {err}"))
                        .await;
                }
            },
            (None, None) => return Ok(Lookup::Expired),
        };
        match self.decode_sealed(batch, bytes, pid).await {
            Ok(Some(record)) => Ok(Lookup::Archived {
                record,
                tier: if pttl >= 0 {
                    Tier::Summary
                } else {
                    Tier::Compressed
                },
            }),
            Ok(None) => {
                self.count_failure(format!("batch {batch} lacks pid {pid}"))
                    .await
            }
            Err(detail) => self.count_failure(detail).await,
        }
    }
}

#[async_trait]
impl<C> Archiver for RedisArchive<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn archive_once(&self) -> Result<ArchivePass> {
        let archived = self.count_archived().await?;
        let tier = self.config.tier_for(archived);
        // Shards are independent (own keys, own slot, on a cluster often their own
        // node): all of them are archived at once, their calls pipelined.
        let shards: Vec<u32> = self.schema.shards().collect();
        self.archive_shards(&shards, tier, true).await
    }

    async fn archive_woken(&self) -> Result<ArchivePass> {
        let marked = self.pop_dirty().await?;
        let shards = self.ripe(&marked, Instant::now());
        if shards.is_empty() {
            return Ok(ArchivePass::default());
        }
        let archived = if self.counted.load(Ordering::Relaxed) {
            self.archived.load(Ordering::Relaxed)
        } else {
            self.count_archived().await?
        };
        self.archive_shards(&shards, self.config.tier_for(archived), false)
            .await
    }

    fn idle_wait(&self) -> Duration {
        self.config.block
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

#[async_trait]
impl<C> ArchiveQuery for RedisArchive<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn get(&self, pid: u64) -> Result<Lookup> {
        self.lookup(pid).await
    }

    async fn range(&self, pids: RangeInclusive<u64>, limit: usize) -> Result<RangePage> {
        page_by_lookup(pids, limit, |pid| self.lookup(pid)).await
    }

    async fn decode_failures(&self) -> Result<u64> {
        let key = &self.meta_key;
        let n: Option<u64> = retry(&self.conn, |mut c| async move {
            redis::cmd("HGET")
                .arg(key)
                .arg("decode_failures")
                .query_async(&mut c)
                .await
        })
        .await?;
        Ok(n.unwrap_or(0))
    }
}

/// Milliseconds since the Unix epoch, for the statistics' `last_updated`.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl<C> RedisArchive<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// The batches of `shard` holding at least one archived pid, from the archived
    /// bitmap (the one complete index of what the archive holds).
    async fn shard_batches(&self, shard: u32) -> Result<Vec<u64>> {
        Ok(self
            .shard_fill(shard)
            .await?
            .into_iter()
            .map(|(b, _)| b)
            .collect())
    }

    /// The batches of `shard` holding at least one archived pid, in id order, with how
    /// many archived pids each holds.
    async fn shard_fill(&self, shard: u32) -> Result<Vec<(u64, u64)>> {
        let key = &self.keys[shard as usize].archived;
        let bits: Option<Vec<u8>> = retry(&self.conn, |mut c| async move {
            redis::cmd("GET").arg(key).query_async(&mut c).await
        })
        .await?;
        let size = self.schema.batch_size();
        let shards = u64::from(self.schema.num_shards());
        let mut out: Vec<(u64, u64)> = Vec::new();
        for (i, &byte) in bits.unwrap_or_default().iter().enumerate() {
            if byte == 0 {
                continue;
            }
            for bit in 0..8 {
                if byte & (0x80 >> bit) != 0 {
                    let offset = i as u64 * 8 + bit;
                    let batch = (offset / size) * shards + u64::from(shard);
                    match out.last_mut() {
                        Some((b, n)) if *b == batch => *n += 1,
                        _ => out.push((batch, 1)),
                    }
                }
            }
        }
        Ok(out)
    }

    /// Joins every segment of `shard` whose planned pids are all archived and which is
    /// not joined yet: those a crash left between a seal and its join, and those whose
    /// last batch compaction just sealed. `fill` is [`Self::shard_fill`]'s answer.
    async fn join_complete(&self, fill: &[(u64, u64)]) -> Result<usize> {
        let mut whole: Vec<u64> = Vec::new();
        let mut by_segment: Vec<(SegmentRef, Vec<(u64, u64)>)> = Vec::new();
        for &(b, n) in fill {
            let (seg, _) = SegmentRef::of(&self.schema, b);
            match by_segment.last_mut() {
                Some((s, v)) if *s == seg => v.push((b, n)),
                _ => by_segment.push((seg, vec![(b, n)])),
            }
        }
        for (seg, batches) in by_segment {
            let complete = seg.batches(&self.schema).iter().all(|&b| {
                let planned = self.planned(b);
                planned == 0 || batches.iter().any(|&(id, n)| id == b && n >= planned)
            });
            if complete {
                whole.push(seg.batches(&self.schema)[0]);
            }
        }
        let mut joined = 0;
        for chunk in whole.chunks(256) {
            joined += self.join_segments(chunk.to_vec()).await?;
        }
        Ok(joined)
    }

    /// Every record of `batch` still held, and the highest tier they live in.
    /// `segment` caches the last segment read (with its PTTL): export reads a shard's
    /// batches in id order, so each segment is read once.
    async fn batch_records(
        &self,
        batch: u64,
        segment: &mut Option<(SegmentRef, SegmentRead)>,
    ) -> Result<Option<DumpBatch>> {
        let keys = &self.keys[self.schema.shard_of_batch(batch) as usize];
        let first = batch * self.schema.batch_size();
        let pids: Vec<u64> = (first..first + self.schema.batch_size()).collect();
        let open_key = open_batch_key(&self.schema, batch);
        let sealed_key = self.schema.completed_batch(batch);
        let (seg, slot) = SegmentRef::of(&self.schema, batch);
        let seg_key = seg.key(&self.schema);
        let cached = segment.as_ref().is_some_and(|(s, _)| *s == seg);
        let ((simple, open, sealed, pttl), joined): (BatchReply, Option<SegmentRead>) =
            retry(&self.conn, |mut c| {
                let mut pipe = redis::pipe();
                pipe.cmd("HMGET").arg(&keys.completed).arg(&pids);
                pipe.cmd("HGETALL").arg(&open_key);
                pipe.cmd("GET").arg(&sealed_key);
                pipe.cmd("PTTL").arg(&sealed_key);
                if !cached {
                    pipe.cmd("GET").arg(&seg_key);
                    pipe.cmd("PTTL").arg(&seg_key);
                }
                async move {
                    if cached {
                        let batch: BatchReply = pipe.query_async(&mut c).await?;
                        Ok((batch, None))
                    } else {
                        let (a, b, c2, d, e, f) = pipe.query_async(&mut c).await?;
                        Ok(((a, b, c2, d), Some((e, f))))
                    }
                }
            })
            .await?;
        if let Some(read) = joined {
            *segment = Some((seg, read));
        }
        let corrupt = |key: &str, e: tranche_codec::Error| Error::Corrupt {
            key: key.to_owned(),
            detail: e.to_string(),
        };
        let mut tier = Tier::Simple;
        let mut records = Vec::new();
        for json in simple.into_iter().flatten() {
            records.push(decode_json(&json).map_err(|e| corrupt(&keys.completed, e))?);
        }
        for (_, json) in &open {
            tier = Tier::Compressed;
            records.push(decode_json(json).map_err(|e| corrupt(&open_key, e))?);
        }
        if let Some(bytes) = sealed {
            tier = if pttl >= 0 {
                Tier::Summary
            } else {
                Tier::Compressed
            };
            let cached = self.dict.read().unwrap_or_else(|p| p.into_inner()).clone();
            let decoded = match decode_binary_v2(&bytes, &cached) {
                Err(tranche_codec::Error::UnknownWorkerIndex(_)) => {
                    decode_binary_v2(&bytes, &*self.load_dict().await?)
                }
                other => other,
            };
            records.extend(decoded.map_err(|e| corrupt(&sealed_key, e))?.records);
        } else if let Some((_, (Some(seg_bytes), seg_ttl))) = segment.as_ref() {
            let blob = segment::slot_of(seg_bytes, slot).map_err(|detail| Error::Corrupt {
                key: seg_key.clone(),
                detail,
            })?;
            if let Some(blob) = blob {
                tier = if *seg_ttl >= 0 {
                    Tier::Summary
                } else {
                    Tier::Compressed
                };
                let cached = self.dict.read().unwrap_or_else(|p| p.into_inner()).clone();
                let decoded = match decode_binary_v2(blob, &cached) {
                    Err(tranche_codec::Error::UnknownWorkerIndex(_)) => {
                        decode_binary_v2(blob, &*self.load_dict().await?)
                    }
                    other => other,
                };
                let decoded = decoded.map_err(|e| corrupt(&seg_key, e))?;
                if decoded.batch_id != batch {
                    return Err(Error::Corrupt {
                        key: seg_key,
                        detail: format!("slot of batch {batch} holds batch {}", decoded.batch_id),
                    });
                }
                records.extend(decoded.records);
            }
        }
        if records.is_empty() {
            return Ok(None);
        }
        records.sort_unstable_by_key(|r| r.pid);
        Ok(Some(DumpBatch {
            id: batch,
            tier,
            records,
        }))
    }
}

#[async_trait]
impl<C> Export for RedisArchive<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn export(&self, created_ms: u64) -> Result<Dump> {
        let mut batches = Vec::new();
        for shard in self.schema.shards() {
            // A shard's batches in id order: each segment is read once.
            let mut segment = None;
            for id in self.shard_batches(shard).await? {
                batches.extend(self.batch_records(id, &mut segment).await?);
            }
        }
        batches.sort_unstable_by_key(|b: &DumpBatch| b.id);
        let dict = self.load_dict().await?;
        // Simple-tier and open records are JSON: their workers may not be in the
        // dictionary yet, and the dump's batches are binary v2.
        let workers: Vec<&str> = batches
            .iter()
            .flat_map(|b| &b.records)
            .map(|r| &*r.worker)
            .collect();
        let dict = if workers.iter().all(|w| dict.index_of(w).is_some()) {
            dict
        } else {
            let mut d = (*dict).clone();
            for w in workers {
                d.insert(w)?;
            }
            Arc::new(d)
        };
        Ok(Dump::new(
            &self.schema,
            created_ms,
            (*dict).clone(),
            batches,
        ))
    }
}

#[async_trait]
impl<C> Import for RedisArchive<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn import(&self, dump: &Dump) -> Result<u64> {
        if self.archived_count().await? != 0 {
            return Err(Error::InvalidArgument(
                "import needs an empty archive".into(),
            ));
        }
        let mut restored = 0;
        for b in &dump.batches {
            let shard = self.schema.shard_of_batch(b.id);
            for chunk in b.records.chunks(MAX_SCRIPT_RECORDS) {
                let items = chunk
                    .iter()
                    .map(|r| Item {
                        record: r.clone(),
                        json: None,
                    })
                    .collect();
                let (written, _) = self.write(shard, items, b.tier).await?;
                restored += written as u64;
            }
        }
        self.seal_open_batches().await?;
        Ok(restored)
    }
}
