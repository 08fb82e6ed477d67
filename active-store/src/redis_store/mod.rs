//! The Redis backend: every state change is one Lua script on one shard's hash slot.

mod bulk;
mod conn;
mod empty;
mod leases;
mod maintenance;
mod namespace;
mod planner;
mod query;
mod record;
mod registry;
mod skew;
mod split;

use std::sync::{Arc, LazyLock, OnceLock, RwLock};

use async_trait::async_trait;
use futures_util::future::join_all;
use redis::aio::ConnectionLike;
use redis::{AsyncCommands, Script};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tranche_codec::lua::{self, Constant, Fragment};
use tranche_codec::{KeySchema, Partition};

#[cfg(feature = "fuzzing")]
pub use bulk::fuzz_replies;
use conn::retry;
pub use conn::{RedisConnection, TlsOptions};
pub use namespace::KeysMeta;

use crate::clock::{Clock, SystemClock};
use crate::layout::Layout;
use crate::model::{
    ActiveSnapshot, Carried, Completion, Config, CorruptRecord, FailOutcome, Lease, Plan,
    PlanEntry, PlanOutcome, Repair, StatusCounts, Unissued, WorkerInfo, WorkerState,
};
use crate::plans::{self, Registry, Request};
use crate::store::{ActiveQuery, Leases, Maintenance, Planner, WorkerRegistry};
use crate::{Error, Result};

/// `record.lua`: the record layout, the argument checks and the status counters, the
/// prelude of every script of this crate (after `common.lua`).
const RECORD: Fragment = Fragment::new(include_str!("../../lua/record.lua"));
/// `split.lua`: split partitions and their pieces, a prelude of the scripts that meet them.
const SPLIT: Fragment = Fragment::new(include_str!("../../lua/split.lua"));
/// `runs.lua`: the interval leases of fresh claims, a prelude of the scripts that meet
/// them, with [`MAX_RUN`] and the masks of a run that long.
const RUNS: Fragment = Fragment::with(
    &[
        Constant::Number("MAX_RUN", MAX_RUN as u64),
        Constant::Repeat("FULL_MASK", 'c', MAX_RUN as u64),
        Constant::Repeat("EMPTY_MASK", '.', MAX_RUN as u64),
    ],
    include_str!("../../lua/runs.lua"),
);

/// The script `lua/NAME.lua` (or a [`Fragment`] of it that reads constants) after the
/// preludes named, in the order every script takes them (`RECORD`, `SPLIT`, `RUNS`),
/// composed by [`lua::compose`].
macro_rules! script {
    ($($prelude:ident),+; $name:literal) => {
        script!($($prelude),+; fragment Fragment::new(include_str!(concat!("../../lua/", $name, ".lua"))))
    };
    ($($prelude:ident),+; fragment $script:expr) => {
        LazyLock::new(|| Script::new(&lua::compose(&[$(&$prelude,)+ &$script])))
    };
}

static PLAN: LazyLock<Script> = script!(RECORD; "plan");
static PLAN_CURSOR: LazyLock<Script> = script!(RECORD; "plan_cursor");
static PLAN_RANGES: LazyLock<Script> = script!(RECORD; "plan_ranges");
static CLAIM: LazyLock<Script> = script!(
    RECORD, RUNS;
    fragment Fragment::with(
        &[Constant::Number("MAX_CLAIM", MAX_CLAIM)],
        include_str!("../../lua/claim.lua")
    )
);
static CARVE: LazyLock<Script> = script!(RECORD, RUNS; "carve");
static HEARTBEAT: LazyLock<Script> = script!(RECORD, SPLIT, RUNS; "heartbeat");
static COMPLETE: LazyLock<Script> = script!(RECORD, SPLIT, RUNS; "complete");
static SPLIT_REQUEST: LazyLock<Script> = script!(RECORD, SPLIT; "split_request");
static PIECE_CLAIM: LazyLock<Script> = script!(RECORD, SPLIT; "piece_claim");
static PIECE_BEAT: LazyLock<Script> = script!(RECORD, SPLIT; "piece_beat");
static PIECE_COMPLETE: LazyLock<Script> = script!(RECORD, SPLIT; "piece_complete");
static PIECE_RELEASE: LazyLock<Script> = script!(RECORD, SPLIT; "piece_release");
static PIECE_FAIL: LazyLock<Script> = script!(RECORD, SPLIT; "piece_fail");
static FAIL: LazyLock<Script> = script!(RECORD, SPLIT; "fail");
static RELEASE: LazyLock<Script> = script!(RECORD; "release");
static REAP: LazyLock<Script> = script!(RECORD, SPLIT; "reap");
static RETRY_FAILED: LazyLock<Script> = script!(RECORD; "retry_failed");
static DISCARD: LazyLock<Script> = script!(RECORD, SPLIT; "discard");
static RECOUNT: LazyLock<Script> = script!(RECORD; "recount");
static CARRY: LazyLock<Script> = script!(RECORD; "carry");
static REPAIR: LazyLock<Script> = script!(RECORD; "repair");

/// Every script with its source, for tests that check each keeps to one slot.
#[cfg(feature = "testing")]
pub fn scripts() -> Vec<(&'static str, &'static Script)> {
    vec![
        ("plan", &PLAN),
        ("plan_cursor", &PLAN_CURSOR),
        ("plan_ranges", &PLAN_RANGES),
        ("claim", &CLAIM),
        ("carve", &CARVE),
        ("heartbeat", &HEARTBEAT),
        ("complete", &COMPLETE),
        ("fail", &FAIL),
        ("release", &RELEASE),
        ("reap", &REAP),
        ("retry_failed", &RETRY_FAILED),
        ("discard", &DISCARD),
        ("recount", &RECOUNT),
        ("repair", &REPAIR),
        ("carry", &CARRY),
        ("split_request", &SPLIT_REQUEST),
        ("piece_claim", &PIECE_CLAIM),
        ("piece_beat", &PIECE_BEAT),
        ("piece_complete", &PIECE_COMPLETE),
        ("piece_release", &PIECE_RELEASE),
        ("piece_fail", &PIECE_FAIL),
        ("register", namespace::register_script()),
    ]
}

/// Items per script call at most (claims, completions): Lua's `unpack` is bounded, and
/// one call should not hold Redis for long.
const MAX_SCRIPT_BATCH: usize = 1000;

/// The most pids one interval lease holds, and so one group entry of a `complete`
/// call (written into the scripts' prelude as `MAX_RUN`, with the masks of `runs.lua`).
const MAX_RUN: usize = 128;

/// The most partitions one `claim` call asks for (`MAX_CLAIM` of `lua/claim.lua`): it
/// reserves their tokens up front, and a huge count would spend the sequence.
const MAX_CLAIM: u64 = 100_000;

/// Field/value pairs of a hash, as read.
type Pairs = Vec<(String, String)>;

/// One shard as `all_active` read it: the active hash's (pid, record) pairs and its
/// runs, borrowed from the reply, and the shard's plan list and cursors.
struct ShardRead<'a> {
    entries: Vec<(&'a [u8], &'a [u8])>,
    /// The runs hash's (token, run) pairs, as bytes: a corrupt run need not be UTF-8,
    /// and must not fail the read.
    runs: Vec<(&'a [u8], &'a [u8])>,
    plans: Vec<String>,
    cursor: Pairs,
}

/// What [`RedisActiveStore::read_counts`] reads of one shard.
type CountsRead = (Vec<Option<i64>>, u64, Vec<String>, Pairs);

/// Reply codes of the scripts (`record.lua`).
const OK: i64 = 1;
const DUPLICATE: i64 = 0;
/// complete.lua's reply for the owner part of a split partition with pieces left.
const PART_DONE: i64 = 2;
/// complete.lua's reply for a pid whose record, not held, does not decode.
const CORRUPT: i64 = -2;
/// complete.lua's reply for a pid without a record whose token names a run that does
/// not decode.
const CORRUPT_RUN: i64 = -3;

/// A lease of `pid` answered by its script for the run that holds it, which does not
/// decode (complete.lua's [`CORRUPT_RUN`], heartbeat.lua's `!ERR corrupt run`): named
/// by the runs key and token (the key [`ActiveQuery::corrupt_records`] gives a run),
/// with what the script found wrong when it says. The script wrote nothing of it.
fn corrupt_run(key: String, pid: u64, found: Option<&str>) -> Error {
    let found = found.map(|f| format!(": {f}")).unwrap_or_default();
    Error::Corrupt {
        key,
        detail: format!("the run holding pid {pid} does not decode{found}; it is left as it is"),
    }
}

/// The active layer on Redis (standalone or cluster).
///
/// Keys per shard `s` of namespace `ns` all carry the tag `{ns:s}`: `active` (hash pid ->
/// record), `runs` (hash token -> a run of fresh pids claimed as one lease, see
/// `lua/runs.lua`), `pending` and `leases` (sorted sets by ready time and deadline), `plans` and
/// `cursor` (the uniform plans this shard issues from, and how far), `seq` (fencing
/// tokens), `completed:index` (bitmap), `inbox` (stream of completed records: each
/// entry's field `r` holds one or more records as JSON lines, one line per completion of
/// a group commit) and `counts` (partitions per status, kept by the scripts; see
/// `lua/record.lua`). The namespace's plan registry is `{ns}:plans` and its workers
/// `{ns}:workers`.
///
/// Generic over the connection so any multiplexed [`ConnectionLike`] works;
/// [`RedisConnection`] picks standalone or cluster by asking the server. Over a
/// [`RedisConnection`] to a standalone server (TCP or a Unix socket, not TLS),
/// [`ActiveQuery::all_active`] reads on a second connection of the store's own, named
/// `tranche-bulk`, whose replies it scans in place: redis-rs would parse each of the
/// hash's elements into a value of its own, which costs more than Redis takes to send
/// them. That read holds a thread of tokio's blocking pool while it lasts (a
/// blocking socket; see `ARCHITECTURE.md`). Any failure there falls back to the
/// ordinary read.
#[derive(Debug)]
pub struct RedisActiveStore<C = RedisConnection> {
    conn: C,
    /// The big-read connection, when `conn` is a [`RedisConnection`] that has one.
    bulk: Option<Arc<bulk::BulkReader>>,
    config: Config,
    layout: Layout,
    clock: Arc<dyn Clock>,
    keys: Arc<[ShardKeys]>,
    registry_key: String,
    workers_key: String,
    /// The plan registry as last read: pid -> range lookups without a round trip. Plans
    /// are append-only, so a miss just means "read it again".
    registry: Arc<RwLock<Registry>>,
    /// Feeds the group-commit task, started by the first `complete`.
    committer: OnceLock<mpsc::UnboundedSender<Waiting>>,
    /// Shards a claim recently found without ready work, passed by until a back-off
    /// ends or this store puts work back in them.
    empty: Arc<empty::EmptyShards>,
    /// `{ns}:dirty`: the shards whose inbox has completions no archiver looked at yet.
    dirty_key: String,
}

/// A completion waiting for the group-commit task, and where its outcome goes.
type Waiting = (Lease, u64, oneshot::Sender<Result<Completion>>);

/// Completions per script call at most.
const MAX_GROUP: usize = 256;
/// Group-commit script calls in flight at once. While one is, new completions queue
/// and go out together in the next call: under load a call carries many completions
/// (one in flight makes the groups half again as large as two did, and each script
/// call has a fixed cost in Redis), and alone a completion waits for nothing but its
/// own round trip.
const MAX_IN_FLIGHT: usize = 1;

/// The keys of one shard, built once.
#[derive(Debug, Clone)]
struct ShardKeys {
    active: String,
    /// Runs of fresh pids held as one lease each (`lua/runs.lua`).
    runs: String,
    pending: String,
    leases: String,
    plans: String,
    cursor: String,
    seq: String,
    index: String,
    inbox: String,
    counts: String,
    /// Split partitions' entries, their pieces, and the pieces' pending and lease
    /// indexes (`lua/split.lua`).
    splits: String,
    pieces: String,
    piece_pending: String,
    piece_leases: String,
}

impl ShardKeys {
    fn new(schema: &KeySchema, shard: u32) -> Self {
        Self {
            active: schema.active(shard),
            runs: schema.runs(shard),
            pending: schema.pending(shard),
            leases: schema.leases(shard),
            plans: schema.shard_key(shard, "plans"),
            cursor: schema.shard_key(shard, "cursor"),
            seq: schema.shard_key(shard, "seq"),
            index: schema.completed_index(shard),
            inbox: schema.inbox(shard),
            counts: schema.shard_key(shard, "counts"),
            splits: schema.shard_key(shard, "splits"),
            pieces: schema.shard_key(shard, "pieces"),
            piece_pending: schema.shard_key(shard, "piece_pending"),
            piece_leases: schema.shard_key(shard, "piece_leases"),
        }
    }

    /// Every key, for the one-slot test.
    fn all(&self) -> [&str; 14] {
        [
            &self.active,
            &self.runs,
            &self.pending,
            &self.leases,
            &self.plans,
            &self.cursor,
            &self.seq,
            &self.index,
            &self.inbox,
            &self.counts,
            &self.splits,
            &self.pieces,
            &self.piece_pending,
            &self.piece_leases,
        ]
    }
}

impl<C> RedisActiveStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// A store over `conn` with `config`, on the system clock.
    pub fn new(conn: C, config: Config) -> Result<Self> {
        Self::with_clock(conn, config, Arc::new(SystemClock))
    }

    /// A store over `conn` with `config` and `clock`.
    pub fn with_clock(conn: C, config: Config, clock: Arc<dyn Clock>) -> Result<Self> {
        let layout = Layout::new(&config)?;
        let schema = layout.schema();
        Ok(Self {
            keys: schema
                .shards()
                .map(|s| ShardKeys::new(schema, s))
                .collect::<Vec<_>>()
                .into(),
            registry_key: schema.plans(),
            workers_key: schema.workers(),
            dirty_key: schema.dirty(),
            empty: Arc::new(empty::EmptyShards::new(config.num_shards)),
            bulk: (&conn as &dyn std::any::Any)
                .downcast_ref::<RedisConnection>()
                .and_then(RedisConnection::bulk_reader),
            conn,
            layout,
            clock,
            registry: Arc::default(),
            committer: OnceLock::new(),
            config,
        })
    }

    /// A copy sharing everything but the group-commit channel, for the commit task (so
    /// the task does not keep its own channel open).
    fn detached(&self) -> Self {
        Self {
            conn: self.conn.clone(),
            bulk: self.bulk.clone(),
            config: self.config.clone(),
            layout: self.layout.clone(),
            clock: self.clock.clone(),
            keys: self.keys.clone(),
            registry_key: self.registry_key.clone(),
            workers_key: self.workers_key.clone(),
            registry: self.registry.clone(),
            committer: OnceLock::new(),
            empty: self.empty.clone(),
            dirty_key: self.dirty_key.clone(),
        }
    }

    /// The store's settings.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Every key of `shard`, for tests and tools that check slot placement.
    pub fn shard_keys(&self, shard: u32) -> Vec<String> {
        self.keys[shard as usize]
            .all()
            .iter()
            .map(|k| k.to_string())
            .collect()
    }

    /// The inbox stream key of `shard`, where completed records arrive for the archiver.
    pub fn inbox_key(&self, shard: u32) -> &str {
        &self.keys[shard as usize].inbox
    }

    /// Runs `plan_ranges` on `shard` with `args` (now, then pid, min, max, bit per
    /// partition) and leaves `args` holding `now` alone again.
    async fn materialise(&self, shard: usize, args: &mut Vec<String>, now: &str) -> Result<()> {
        let keys = &self.keys[shard];
        let _: i64 = self
            .invoke(
                &PLAN_RANGES,
                &[&keys.active, &keys.pending, &keys.index, &keys.counts],
                args,
            )
            .await?;
        args.clear();
        args.push(now.to_owned());
        Ok(())
    }

    fn keys_of(&self, pid: u64) -> &ShardKeys {
        &self.keys[self.layout.shard_of(pid) as usize]
    }

    fn now(&self) -> u64 {
        self.clock.now_ms()
    }

    fn deadline(&self, now: u64) -> u64 {
        now + self.config.lease.as_millis() as u64
    }

    /// The bit of `pid` in its shard's dense completed index.
    fn bit(&self, pid: u64) -> u64 {
        self.layout.schema().bit_offset(pid)
    }

    async fn invoke<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[String],
    ) -> Result<T> {
        Ok(retry(&self.conn, |mut conn| async move {
            let mut call = script.prepare_invoke();
            for key in keys {
                call.key(*key);
            }
            for arg in args {
                call.arg(arg.as_str());
            }
            call.invoke_async(&mut conn).await
        })
        .await?)
    }

    /// Moves pids of `shard` out of their runs into records of their own
    /// (`lua/carve.lua`, whose arguments `what` are): every script but claim and
    /// complete acts on records only, so a call that names a pid, a worker or expired
    /// leases carves them first. Carving changes how a pid is held, not what is held.
    async fn carve(&self, shard: usize, what: &[String]) -> Result<()> {
        let keys = &self.keys[shard];
        let _: i64 = self
            .invoke(&CARVE, &[&keys.runs, &keys.active, &keys.leases], what)
            .await?;
        Ok(())
    }

    /// [`carve`](Self::carve)s `pids` out of their runs: one call per shard involved,
    /// all sent together.
    async fn carve_pids(&self, pids: &[u64]) -> Result<()> {
        let groups = self.by_shard(pids.iter().copied());
        let calls = groups.iter().map(|(shard, chunk)| {
            let mut what = Vec::with_capacity(chunk.len() + 2);
            what.push("pids".to_owned());
            what.push(chunk.len().to_string());
            what.extend(chunk.iter().map(|&i| pids[i].to_string()));
            async move { self.carve(*shard, &what).await }
        });
        join_all(calls).await.into_iter().collect()
    }

    /// The range of `pid`, reading the registry again if the cache does not know it.
    async fn range_of(&self, pid: u64) -> Result<(u64, u64)> {
        if let Some(range) = read(&self.registry).range_of(pid) {
            return Ok(range);
        }
        self.refresh_registry().await?;
        read(&self.registry)
            .range_of(pid)
            .ok_or_else(|| Error::Corrupt {
                key: self.registry_key.clone(),
                detail: format!("pid {pid} is active but in no plan"),
            })
    }

    async fn refresh_registry(&self) -> Result<Registry> {
        let raw: Vec<String> = retry(&self.conn, |mut conn| {
            let key = self.registry_key.clone();
            async move { conn.lrange(key, 0, -1).await }
        })
        .await?;
        let entries = raw
            .iter()
            .map(|e| record::parse_plan_entry(e).ok_or_else(|| self.corrupt_registry(e)))
            .collect::<Result<Vec<_>>>()?;
        let registry = Registry::from_entries(entries);
        *self.registry.write().unwrap_or_else(|p| p.into_inner()) = registry.clone();
        Ok(registry)
    }

    fn corrupt_registry(&self, entry: &str) -> Error {
        Error::Corrupt {
            key: self.registry_key.clone(),
            detail: format!("unreadable plan entry {entry:?}"),
        }
    }

    /// Runs `script` (reap or release_worker) on every shard after carving with `carve`
    /// there (`lua/carve.lua`'s arguments), all shards' calls sent together, and returns the pids it put back to pending, sorted. Their shards are
    /// woken for this process's claims.
    async fn per_shard_pids(
        &self,
        script: &Script,
        carve: &[String],
        args: &[String],
    ) -> Result<Vec<u64>> {
        let calls = self
            .keys
            .iter()
            .enumerate()
            .map(|(shard, keys)| async move {
                // The runs' pids it may meet get records of their own first.
                self.carve(shard, carve).await?;
                self.invoke::<Vec<String>>(
                    script,
                    &[
                        &keys.active,
                        &keys.leases,
                        &keys.pending,
                        &keys.counts,
                        &keys.splits,
                        &keys.pieces,
                        &keys.piece_pending,
                        &keys.piece_leases,
                    ],
                    args,
                )
                .await
            });
        let mut out = Vec::new();
        for reply in join_all(calls).await {
            for pid in reply? {
                out.push(parse_u64(&pid, "pid")?);
            }
        }
        self.wake_shards_of(&out);
        out.sort_unstable();
        Ok(out)
    }

    /// Wakes the shards of `pids` (work was put back there).
    fn wake_shards_of(&self, pids: &[u64]) {
        for &pid in pids {
            self.empty.wake(self.layout.shard_of(pid));
        }
    }
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|p| p.into_inner())
}

fn parse_u64(s: &str, what: &str) -> Result<u64> {
    s.parse().map_err(|_| Error::Corrupt {
        key: what.to_owned(),
        detail: format!("{s:?} is not a u64"),
    })
}

fn plan_error(err: redis::RedisError) -> Error {
    match err.code() {
        Some("PLAN") => Error::InvalidPlan(err.detail().unwrap_or_default().to_owned()),
        _ => Error::Redis(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shard_key_hashes_to_one_slot() {
        let layouts = [
            tranche_codec::KeyLayout::Plain,
            tranche_codec::KeyLayout::Spread,
        ];
        for (shards, layout) in [1u32, 4, 16, 1024]
            .into_iter()
            .flat_map(|n| layouts.map(|l| (n, l)))
        {
            let schema = KeySchema::new("elk", shards).unwrap().with_layout(layout);
            for s in [0, shards / 2, shards - 1] {
                let keys = ShardKeys::new(&schema, s);
                let slot = tranche_codec::key_slot(&keys.active);
                assert!(
                    keys.all()
                        .iter()
                        .all(|k| tranche_codec::key_slot(k) == slot),
                    "{keys:?}"
                );
            }
        }
    }
}
