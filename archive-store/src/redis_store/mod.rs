//! The Redis backend: every archive batch and every `get` is one Lua script on one
//! shard's hash slot.

mod bits;
mod compact;
mod conn;
mod damage;
mod dead;
mod dict;
mod export;
mod format;
mod lookup;
mod pass;
mod seal;
mod stall;
#[cfg(feature = "testing")]
mod testing;
mod write;

use std::collections::HashSet;
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures_util::future::try_join_all;
use redis::aio::ConnectionLike;
use redis::streams::{StreamAutoClaimReply, StreamId, StreamReadReply};
use redis::{FromRedisValue, Script, Value};
use tranche_codec::{
    BinaryV2Options, Clock, CompletedRecord, KeySchema, SystemClock, WorkerDict, decode_binary_v2,
    decode_json, encode_binary_v2, encode_json,
};

use conn::invoke_read_only;
use seal::Sealing;
use tranche_codec::lua::{self, Fragment};
use tranche_codec::retry::retry;
use tranche_stats::archive_protocol::delta_args;
use tranche_stats::{Repaired, StatsDelta, StatsStore};
use write::{Item, chunks_by_batch};

use crate::dump::{Dump, DumpBatch};
use crate::model::{
    ArchiveDamage, ArchivePass, Config, Lookup, RangePage, Stall, Tier, stall_reason,
};
use crate::segment::{self, SEGMENT_BATCHES, SegmentRef};
use crate::store::{ArchiveQuery, Archiver, Compaction, Export, Import};
use crate::{Error, Result};

/// `prelude.lua`, the prelude of every script of this crate (after `common.lua`).
const PRELUDE: Fragment = Fragment::new(include_str!("../../lua/prelude.lua"));

/// The script `lua/NAME.lua` after the preludes named, composed by [`lua::compose`].
macro_rules! script {
    ($($prelude:expr),+; $name:literal) => {
        LazyLock::new(|| {
            Script::new(&lua::compose(&[
                $(&$prelude,)+
                &Fragment::new(include_str!(concat!("../../lua/", $name, ".lua"))),
            ]))
        })
    };
}

/// The archive script: the prelude, the statistics crate's `apply_stats` fragment, and
/// `archive.lua`, so the archive write and the statistics change in one atomic step.
static ARCHIVE: LazyLock<Script> =
    script!(PRELUDE, tranche_stats::archive_protocol::APPLY_DELTA_LUA; "archive");
static GET: LazyLock<Script> = script!(PRELUDE; "get");
static SEAL: LazyLock<Script> = script!(PRELUDE; "seal");
static DICT: LazyLock<Script> = script!(PRELUDE; "dict");
static MOVE: LazyLock<Script> = script!(PRELUDE; "move");
static JOIN: LazyLock<Script> = script!(PRELUDE; "join");
static QUARANTINE: LazyLock<Script> = script!(PRELUDE; "quarantine");
static FORMAT: LazyLock<Script> = script!(PRELUDE; "format");

/// Every script with its name, for tests that check each keeps to one slot (feature
/// `testing`).
#[cfg(feature = "testing")]
pub fn scripts() -> Vec<(&'static str, &'static Script)> {
    vec![
        ("archive", &ARCHIVE),
        ("get", &GET),
        ("seal", &SEAL),
        ("dict", &DICT),
        ("move", &MOVE),
        ("join", &JOIN),
        ("quarantine", &QUARANTINE),
        ("format", &FORMAT),
    ]
}

/// The consumer group every archiver of a namespace joins, on every inbox.
const GROUP: &str = "archivers";
/// Records per archive script call at most: Lua's `unpack` is bounded (8000 values),
/// and `archive.lua` unpacks four per record into one BITFIELD.
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
/// (`decode_failures`, and `archive_format`: see [`ArchiveFormat`](crate::ArchiveFormat)).
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
    /// the tier of a woken pass without a read per shard. Sweeps count again, and so
    /// do woken passes when [`recount_due`](Self::recount_due) says the tier may have
    /// changed under other archivers' writes. The count only grows.
    archived: AtomicU64,
    /// What this archiver wrote since `archived` was last counted.
    written_since: AtomicU64,
    /// When `archived` was last counted; `None` before the first count (a woken pass
    /// before any sweep counts).
    counted_at: Mutex<Option<Instant>>,
    /// The namespace's archive format version as last read (`{ns}:meta`
    /// `archive_format`, read on every sweep), 0 before the first read: what joins write.
    format: AtomicU8,
    /// Stamps the statistics deltas (`last_updated`) and stalls.
    clock: Arc<dyn Clock>,
    /// `{ns}:archive:stalled`: shard -> `since_ms reason`.
    stalled_key: String,
    /// The shards this archiver knows stalled (its own refusals, and on every sweep
    /// what the hash holds): woken passes skip them (a sweep retries them), and a
    /// pass that archives one clears its entry.
    stalled: Mutex<HashSet<u32>>,
    /// `{ns}:archive:damaged`: `key` or `key field` -> `since_ms detail`, the archived
    /// values reads found damaged and no repair has set aside yet.
    damaged_key: String,
    /// Where the next scrub goes on: (shard, first batch id not verified yet).
    scrub_at: Mutex<(u32, u64)>,
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
const MAX_BIT_OFFSET: u64 = lua::BITMAP_BITS - 1;
impl ShardKeys {
    fn new(schema: &KeySchema, shard: u32) -> Self {
        Self {
            inbox: schema.inbox(shard),
            index: schema.completed_index(shard),
            archived: schema.shard_key(shard, "archived"),
            completed: schema.completed(shard),
            counters: schema.shard_key(shard, "archive"),
            stats: tranche_stats::archive_protocol::stats_keys(schema, shard),
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
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    i64,
    Option<Vec<u8>>,
    i64,
);

/// A segment as read: its bytes (none once expired) and its PTTL.
type SegmentRead = (Option<Vec<u8>>, i64);

/// One batch as read for export: simple JSON per pid, open fields, sealed bytes, PTTL
/// (bytes, not text: a damaged value must not fail the read of the others).
type BatchReply = (
    Vec<Option<Vec<u8>>>,
    Vec<(Vec<u8>, Vec<u8>)>,
    Option<Vec<u8>>,
    i64,
);

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
            stalled_key: format!("{}:archive:stalled", schema.global_tag()),
            stalled: Mutex::default(),
            damaged_key: format!("{}:archive:damaged", schema.global_tag()),
            scrub_at: Mutex::new((0, 0)),
            woken: Mutex::new(Woken {
                owed: vec![false; schema.num_shards() as usize],
                full: vec![false; schema.num_shards() as usize],
                last_read: vec![None; schema.num_shards() as usize],
            }),
            archived: AtomicU64::new(0),
            written_since: AtomicU64::new(0),
            counted_at: Mutex::new(None),
            format: AtomicU8::new(0),
            clock: Arc::new(SystemClock),
            dict: RwLock::default(),
            conn,
            config,
            schema,
        })
    }

    /// This archive, stamping the statistics deltas it applies by `clock` rather than
    /// the system clock.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
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
}
