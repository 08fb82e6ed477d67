//! The Redis backend: every state change is one Lua script on one shard's hash slot.

mod bulk;
mod conn;
mod empty;
mod record;

use std::sync::{Arc, LazyLock, OnceLock, RwLock};

use async_trait::async_trait;
use redis::aio::ConnectionLike;
use redis::{AsyncCommands, Script};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tranche_codec::{KeySchema, Partition};

pub use conn::RedisConnection;
use conn::retry;

use crate::clock::{Clock, SystemClock};
use crate::layout::Layout;
use crate::model::{
    ActiveSnapshot, Completion, Config, FailOutcome, Lease, Plan, PlanEntry, PlanOutcome,
    StatusCounts, Unissued, WorkerInfo, WorkerState,
};
use crate::plans::{self, Registry, Request};
use crate::store::{ActiveQuery, Leases, Maintenance, Planner, WorkerRegistry};
use crate::{Error, Result};

macro_rules! script {
    ($name:literal) => {
        LazyLock::new(|| {
            Script::new(concat!(
                include_str!("../../lua/record.lua"),
                include_str!(concat!("../../lua/", $name, ".lua"))
            ))
        })
    };
}

static PLAN: LazyLock<Script> = script!("plan");
static PLAN_CURSOR: LazyLock<Script> = script!("plan_cursor");
static PLAN_RANGES: LazyLock<Script> = script!("plan_ranges");
static CLAIM: LazyLock<Script> = script!("claim");
static HEARTBEAT: LazyLock<Script> = script!("heartbeat");
static COMPLETE: LazyLock<Script> = script!("complete");
static FAIL: LazyLock<Script> = script!("fail");
static RELEASE: LazyLock<Script> = script!("release");
static REAP: LazyLock<Script> = script!("reap");
static RETRY_FAILED: LazyLock<Script> = script!("retry_failed");
static DISCARD: LazyLock<Script> = script!("discard");
static RECOUNT: LazyLock<Script> = script!("recount");

/// Every script with its source, for tests that check each keeps to one slot.
pub fn scripts() -> Vec<(&'static str, &'static Script)> {
    vec![
        ("plan", &PLAN),
        ("plan_cursor", &PLAN_CURSOR),
        ("plan_ranges", &PLAN_RANGES),
        ("claim", &CLAIM),
        ("heartbeat", &HEARTBEAT),
        ("complete", &COMPLETE),
        ("fail", &FAIL),
        ("release", &RELEASE),
        ("reap", &REAP),
        ("retry_failed", &RETRY_FAILED),
        ("discard", &DISCARD),
        ("recount", &RECOUNT),
    ]
}

/// Items per script call at most (claims, completions): Lua's `unpack` is bounded, and
/// one call should not hold Redis for long.
const MAX_SCRIPT_BATCH: usize = 1000;

/// Field/value pairs of a hash, as read.
type Pairs = Vec<(String, String)>;

/// One shard as `all_active` read it: the active hash's (pid, record) pairs, borrowed
/// from the reply, and the shard's plan list and cursors.
struct ShardRead<'a> {
    entries: Vec<(&'a [u8], &'a [u8])>,
    plans: Vec<String>,
    cursor: Pairs,
}

/// What [`RedisActiveStore::read_counts`] reads of one shard.
type CountsRead = (Vec<Option<i64>>, u64, Vec<String>, Pairs);

/// Reply codes of the scripts (`record.lua`).
const OK: i64 = 1;
const DUPLICATE: i64 = 0;

/// The active layer on Redis (standalone or cluster).
///
/// Keys per shard `s` of namespace `ns` all carry the tag `{ns:s}`: `active` (hash pid ->
/// record), `pending` and `leases` (sorted sets by ready time and deadline), `plans` and
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
/// Group-commit script calls in flight at once. While they are, new completions queue
/// and go out together in the next call: under load a call carries many completions,
/// and alone a completion waits for nothing but its own round trip.
const MAX_IN_FLIGHT: usize = 2;

/// The keys of one shard, built once.
#[derive(Debug, Clone)]
struct ShardKeys {
    active: String,
    pending: String,
    leases: String,
    plans: String,
    cursor: String,
    seq: String,
    index: String,
    inbox: String,
    counts: String,
}

impl ShardKeys {
    fn new(schema: &KeySchema, shard: u32) -> Self {
        Self {
            active: schema.active(shard),
            pending: schema.pending(shard),
            leases: schema.leases(shard),
            plans: schema.shard_key(shard, "plans"),
            cursor: schema.shard_key(shard, "cursor"),
            seq: schema.shard_key(shard, "seq"),
            index: schema.completed_index(shard),
            inbox: schema.inbox(shard),
            counts: schema.shard_key(shard, "counts"),
        }
    }

    /// Every key, for the one-slot test.
    fn all(&self) -> [&str; 9] {
        [
            &self.active,
            &self.pending,
            &self.leases,
            &self.plans,
            &self.cursor,
            &self.seq,
            &self.index,
            &self.inbox,
            &self.counts,
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

    /// The sender of the group-commit task, starting the task on first use. The task
    /// ends when the store is dropped (the channel closes) after its last batch.
    fn committer(&self) -> &mpsc::UnboundedSender<Waiting> {
        self.committer.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(self.detached().commit_loop(rx));
            tx
        })
    }

    async fn commit_loop(self, mut rx: mpsc::UnboundedReceiver<Waiting>) {
        let this = Arc::new(self);
        let mut in_flight = JoinSet::new();
        while let Some(first) = rx.recv().await {
            while in_flight.len() >= MAX_IN_FLIGHT {
                in_flight.join_next().await;
            }
            let mut batch = vec![first];
            while batch.len() < MAX_GROUP {
                match rx.try_recv() {
                    Ok(next) => batch.push(next),
                    Err(_) => break,
                }
            }
            let this = this.clone();
            in_flight.spawn(async move {
                let (done, replies): (Vec<(Lease, u64)>, Vec<_>) = batch
                    .into_iter()
                    .map(|(lease, ms, reply)| ((lease, ms), reply))
                    .unzip();
                match this.complete_now(&done).await {
                    Ok(outcomes) => {
                        for (reply, outcome) in replies.into_iter().zip(outcomes) {
                            let _ = reply.send(outcome);
                        }
                    }
                    Err(err) => {
                        let err = Arc::new(err);
                        for reply in replies {
                            let _ = reply.send(Err(Error::Shared(err.clone())));
                        }
                    }
                }
            });
        }
        while in_flight.join_next().await.is_some() {}
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

    /// Turns a claim reply into leases.
    async fn leases_from(
        &self,
        worker: &str,
        deadline: u64,
        reply: Vec<String>,
    ) -> Result<Vec<Lease>> {
        let mut out = Vec::with_capacity(reply.len() / 6);
        for f in reply.chunks_exact(6) {
            let pid = parse_u64(&f[0], "claim reply pid")?;
            let (min_id, max_id) = if f[3].is_empty() {
                self.range_of(pid).await?
            } else {
                (parse_u64(&f[3], "min")?, parse_u64(&f[4], "max")?)
            };
            // Read back from Redis, so checked like input: a range that runs backwards
            // would have a worker process ids it was never given.
            if min_id > max_id {
                return Err(Error::Corrupt {
                    key: format!("{} field {pid}", self.keys_of(pid).active),
                    detail: format!("range {min_id}..={max_id} runs backwards"),
                });
            }
            out.push(Lease {
                pid,
                token: parse_u64(&f[1], "token")?,
                worker: worker.to_owned(),
                min_id,
                max_id,
                attempt: parse_u64(&f[2], "attempts")? as u32,
                progress: if f[5].is_empty() {
                    min_id
                } else {
                    parse_u64(&f[5], "progress")?
                },
                deadline_ms: deadline,
            });
        }
        Ok(out)
    }

    /// Runs `script` (reap or release_worker) on every shard, all shards' calls sent
    /// together, and returns the pids it put back to pending, sorted. Their shards are
    /// woken for this process's claims.
    async fn per_shard_pids(&self, script: &Script, args: &[String]) -> Result<Vec<u64>> {
        let calls = self.keys.iter().map(|keys| async move {
            self.invoke::<Vec<String>>(
                script,
                &[&keys.active, &keys.leases, &keys.pending, &keys.counts],
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

    /// One shard's records, plan list and cursors, read in one transaction so that a
    /// claim cannot slip between the reads and leave its pids in neither the records
    /// nor the unissued runs.
    fn shard_read(&self, shard: u32) -> redis::Pipeline {
        let keys = &self.keys[shard as usize];
        let mut pipe = redis::pipe();
        pipe.atomic()
            .hgetall(&keys.active)
            .lrange(&keys.plans, 0, -1)
            .hgetall(&keys.cursor);
        pipe
    }

    /// [`shard_read`](Self::shard_read) through redis-rs. The records stay one raw
    /// reply, parsed in place.
    async fn read_shard(&self, shard: u32) -> Result<(redis::Value, Vec<String>, Pairs)> {
        let pipe = &self.shard_read(shard);
        Ok(retry(&self.conn, |mut conn| async move {
            pipe.query_async(&mut conn).await
        })
        .await?)
    }

    /// Every shard's [`shard_read`](Self::shard_read) on the bulk connection, in one
    /// write; `None` (logged by the reader) when it fails, so the caller reads the
    /// ordinary way.
    async fn read_shards_bulk(&self, reader: &Arc<bulk::BulkReader>) -> Option<bulk::Replies> {
        let reads: Vec<_> = (0..self.layout.shards())
            .map(|s| self.shard_read(s))
            .collect();
        reader.query(&reads).await.ok()
    }

    /// The shards' reads out of [`read_shards_bulk`](Self::read_shards_bulk)'s replies,
    /// borrowed from them; `None` if they are not what the commands answer (an error
    /// reply, say), for the ordinary read to report.
    fn shard_reads<'a>(&self, replies: &'a bulk::Replies) -> Option<Vec<ShardRead<'a>>> {
        use bulk::Frame;
        let text = |f: &Frame| match f {
            Frame::Bulk(r) => String::from_utf8(replies.bytes(r).to_vec()).ok(),
            _ => None,
        };
        let bytes = |f: &'a Frame| match f {
            Frame::Bulk(r) => Some(replies.bytes(r)),
            _ => None,
        };
        let frames = replies.frames();
        if frames.len() != self.keys.len() * 5 {
            return None;
        }
        frames
            .chunks_exact(5)
            .map(|shard| {
                let Frame::Array(exec) = &shard[4] else {
                    return None;
                };
                let [
                    Frame::Array(active),
                    Frame::Array(plans),
                    Frame::Array(cursor),
                ] = exec.as_slice()
                else {
                    return None;
                };
                if active.len() % 2 != 0 || cursor.len() % 2 != 0 {
                    return None;
                }
                Some(ShardRead {
                    entries: active
                        .chunks_exact(2)
                        .map(|kv| Some((bytes(&kv[0])?, bytes(&kv[1])?)))
                        .collect::<Option<_>>()?,
                    plans: plans.iter().map(text).collect::<Option<_>>()?,
                    cursor: cursor
                        .chunks_exact(2)
                        .map(|kv| Some((text(&kv[0])?, text(&kv[1])?)))
                        .collect::<Option<_>>()?,
                })
            })
            .collect()
    }

    /// One shard's counters (`p`, `c`, `r`, `f`, then the mark `v`), the number of its
    /// records, its plan list and cursors, in one transaction: a claim moves pids from a
    /// cursor to the counters atomically, so reading them apart could count a pid twice
    /// or not at all.
    async fn read_counts(&self, shard: u32) -> Result<CountsRead> {
        let keys = &self.keys[shard as usize];
        Ok(retry(&self.conn, |mut conn| async move {
            redis::pipe()
                .atomic()
                .hmget(&keys.counts, &["p", "c", "r", "f", "v"])
                .hlen(&keys.active)
                .lrange(&keys.plans, 0, -1)
                .hgetall(&keys.cursor)
                .query_async(&mut conn)
                .await
        })
        .await?)
    }

    /// Derives every shard's status counters from its records, once, and marks them
    /// exact; the scripts keep them from then on. [`ActiveQuery::counts`] does this by
    /// itself for a shard whose counters were never marked (a namespace written by a
    /// version without them). Run it by hand after processes of such a version wrote to
    /// the namespace alongside this one (a rolling upgrade): their scripts change
    /// statuses without counting. Costs one read of every active record.
    pub async fn recount(&self) -> Result<StatusCounts> {
        let shards: Vec<u32> = (0..self.layout.shards()).collect();
        self.recount_shards(&shards).await?;
        self.counts().await
    }

    async fn recount_shards(&self, shards: &[u32]) -> Result<()> {
        let calls = shards.iter().map(|&s| async move {
            let keys = &self.keys[s as usize];
            self.invoke::<Vec<i64>>(&RECOUNT, &[&keys.active, &keys.counts], &[])
                .await
        });
        for reply in join_all(calls).await {
            reply?;
        }
        Ok(())
    }

    /// The partitions of `records` (pid, shard, record bytes), in their order; `None` if
    /// a record belongs to a plan `registry` does not know yet.
    fn partitions(
        &self,
        records: &[(u64, u32, &[u8])],
        registry: &Registry,
    ) -> Result<Option<Vec<Partition>>> {
        let mut out = Vec::with_capacity(records.len());
        for &(pid, shard, rec) in records {
            match record::parse_bytes(pid, rec, |pid| registry.range_of(pid)) {
                Some(p) => out.push(p),
                None if record::parse_bytes(pid, rec, |_| Some((0, 0))).is_some() => {
                    return Ok(None);
                }
                None => {
                    return Err(Error::Corrupt {
                        key: format!("{} {pid}", self.keys[shard as usize].active),
                        detail: format!("unreadable record {:?}", String::from_utf8_lossy(rec)),
                    });
                }
            }
        }
        Ok(Some(out))
    }

    /// The unissued runs of `shard` from its plans list and cursors.
    fn unissued(&self, shard: u32, plans: &[String], cursor: &Pairs) -> Result<Vec<Unissued>> {
        Ok(self
            .cursors(shard, plans, cursor)?
            .into_iter()
            .filter_map(|(_, last, at)| {
                let count = self.layout.count_in_shard(at, last, shard);
                (count > 0).then_some(Unissued {
                    shard,
                    next_pid: at,
                    last_pid: last,
                    count,
                })
            })
            .collect())
    }

    /// A shard's uniform plans as (first pid, last pid, next pid it will issue), from its
    /// `plans` list and `cursor` hash.
    fn cursors(
        &self,
        shard: u32,
        plans: &[String],
        cursor: &Pairs,
    ) -> Result<Vec<(u64, u64, u64)>> {
        let keys = &self.keys[shard as usize];
        plans
            .iter()
            .map(|entry| {
                let (first, last) =
                    record::parse_cursor_plan(entry).ok_or_else(|| Error::Corrupt {
                        key: keys.plans.clone(),
                        detail: format!("unreadable entry {entry:?}"),
                    })?;
                let at = cursor
                    .iter()
                    .find(|(f, _)| f.parse() == Ok(first))
                    .map(|(_, at)| parse_u64(at, &keys.cursor))
                    .transpose()?
                    .unwrap_or(first);
                Ok((first, last, self.layout.align(at, shard)))
            })
            .collect()
    }

    /// Completes `done` now: one `complete` script call per shard involved (per
    /// [`MAX_SCRIPT_BATCH`] completions), every shard's calls sent together, then one
    /// `SADD` marking the shards whose inbox received records dirty for the archivers.
    /// The mark goes out after the completions' replies, so it never announces an
    /// entry that is not in the inbox yet; one lost with a crash in between is found
    /// by the archivers' periodic sweep.
    async fn complete_now(&self, done: &[(Lease, u64)]) -> Result<Vec<Result<Completion>>> {
        let now = self.now();
        // Group by shard: one script call per shard, whatever the number of completions.
        let groups = self.by_shard(done.iter().map(|(lease, _)| lease.pid));
        let calls = groups.iter().map(|(shard, chunk)| async move {
            let keys = &self.keys[*shard];
            let mut args = Vec::with_capacity(chunk.len() * 4);
            for &i in chunk {
                let (lease, duration_ms) = &done[i];
                let record = lease.completed(now, *duration_ms);
                args.push(lease.pid.to_string());
                args.push(lease.token.to_string());
                args.push(self.bit(lease.pid).to_string());
                args.push(tranche_codec::encode_json(&record));
            }
            let reply: Result<Vec<i64>> = self
                .invoke(
                    &COMPLETE,
                    &[
                        &keys.active,
                        &keys.leases,
                        &keys.index,
                        &keys.inbox,
                        &keys.counts,
                    ],
                    &args,
                )
                .await;
            (*shard, chunk, reply)
        });
        let mut out: Vec<Option<Result<Completion>>> = (0..done.len()).map(|_| None).collect();
        let mut dirty = Vec::new();
        for (shard, chunk, reply) in join_all(calls).await {
            // A failed call fails its own completions only: the other shards' went in.
            let reply = match reply {
                Ok(reply) => reply,
                Err(err) => {
                    let err = Arc::new(err);
                    for &i in chunk {
                        out[i] = Some(Err(Error::Shared(err.clone())));
                    }
                    continue;
                }
            };
            if reply.contains(&OK) {
                dirty.push(shard);
            }
            for (&i, code) in chunk.iter().zip(reply) {
                out[i] = Some(match code {
                    OK => Ok(Completion::Completed),
                    DUPLICATE => Ok(Completion::Duplicate),
                    _ => Err(lost(&done[i].0)),
                });
            }
        }
        if !dirty.is_empty() {
            dirty.dedup();
            self.mark_dirty(&dirty).await;
        }
        out.into_iter()
            .zip(done)
            .map(|(o, (lease, _))| {
                o.ok_or_else(|| Error::Corrupt {
                    key: self.keys_of(lease.pid).active.clone(),
                    detail: "complete script replied for fewer leases than sent".into(),
                })
            })
            .collect()
    }

    /// The indexes of `pids` grouped by shard, at most [`MAX_SCRIPT_BATCH`] to a group:
    /// one script call each.
    fn by_shard(&self, pids: impl Iterator<Item = u64>) -> Vec<(usize, Vec<usize>)> {
        let mut by_shard: Vec<Vec<usize>> = vec![Vec::new(); self.keys.len()];
        for (i, pid) in pids.enumerate() {
            by_shard[self.layout.shard_of(pid) as usize].push(i);
        }
        let mut out = Vec::new();
        for (shard, members) in by_shard.into_iter().enumerate() {
            for chunk in members.chunks(MAX_SCRIPT_BATCH) {
                out.push((shard, chunk.to_vec()));
            }
        }
        out
    }

    /// Adds `shards` to `{ns}:dirty`. A failure is logged, not returned: the
    /// completions it announces are durable in the inbox, and the archivers' sweep finds
    /// them without the mark.
    async fn mark_dirty(&self, shards: &[usize]) {
        let marked: redis::RedisResult<i64> = retry(&self.conn, |mut conn| async move {
            let mut cmd = redis::cmd("SADD");
            cmd.arg(&self.dirty_key).arg(shards);
            cmd.query_async(&mut conn).await
        })
        .await;
        if let Err(err) = marked {
            tracing::warn!(%err, "could not mark shards dirty; the archivers' sweep will find them");
        }
    }
}

/// Awaits every future of `futs`, polling them in order, and returns their outputs in
/// order. The first poll of each happens before any is awaited, so requests they send
/// leave together (the `futures` crate's `join_all`, without the dependency).
async fn join_all<F: Future>(futs: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut futs: Vec<_> = futs.into_iter().map(Box::pin).collect();
    let mut outs: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (fut, out) in futs.iter_mut().zip(outs.iter_mut()) {
            if out.is_none() {
                match fut.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *out = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outs.into_iter().flatten().collect()
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

#[async_trait]
impl<C> Planner for RedisActiveStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn plan(&self, plan: &Plan) -> Result<PlanOutcome> {
        let request = plans::validate(plan)?;
        let args: Vec<String> = match &request {
            Request::Uniform {
                min,
                max,
                size,
                count,
            } => {
                vec![
                    "u".into(),
                    min.to_string(),
                    max.to_string(),
                    size.to_string(),
                    count.to_string(),
                ]
            }
            Request::Ranges(ranges) => std::iter::once("r".to_owned())
                .chain(ranges.iter().flat_map(|&(min, max)| {
                    [
                        min.to_string(),
                        max.to_string(),
                        (max - min + 1).to_string(),
                    ]
                }))
                .collect(),
        };
        // The pids this plan would take, from the registry as it stands: none may need
        // a completed-index bit past a Redis bitmap. Checked before anything is written.
        let probe = self.refresh_registry().await?.add(&request)?;
        if probe.created {
            plans::check_bits(self.layout.schema(), &probe.entries)?;
        }
        // Step 1, atomic on the registry's slot: validate and record. A rejected plan
        // stops here with nothing written.
        let reply: Vec<String> = match self.invoke(&PLAN, &[&self.registry_key], &args).await {
            Err(Error::Redis(err)) => return Err(plan_error(err)),
            other => other?,
        };
        let created = reply.first().map(String::as_str) == Some("1");
        let mut entries = Vec::new();
        for f in reply[1..].chunks_exact(5) {
            let n: Vec<u64> = f
                .iter()
                .map(|s| parse_u64(s, "plan reply"))
                .collect::<Result<_>>()?;
            let plan = tranche_codec::Plan::new(n[0], n[2], n[3], n[4])
                .map_err(|err| Error::InvalidPlan(err.to_string()))?;
            entries.push(PlanEntry {
                plan,
                explicit: matches!(request, Request::Ranges(_)),
            });
        }
        // Step 2, per shard: make the plan claimable. Idempotent, so a crash between the
        // steps is repaired by planning again (which is then a no-op in step 1).
        let now = self.now().to_string();
        for entry in &entries {
            let p = &entry.plan;
            if entry.explicit {
                let pid = p.first_pid();
                let keys = self.keys_of(pid);
                let args = [
                    now.clone(),
                    pid.to_string(),
                    p.min().to_string(),
                    p.max().to_string(),
                    self.bit(pid).to_string(),
                ];
                let _: i64 = self
                    .invoke(
                        &PLAN_RANGES,
                        &[&keys.active, &keys.pending, &keys.index, &keys.counts],
                        &args,
                    )
                    .await?;
            } else {
                let arg = [format!("{}|{}", p.first_pid(), p.last_pid())];
                for keys in self.keys.iter() {
                    let _: i64 = self.invoke(&PLAN_CURSOR, &[&keys.plans], &arg).await?;
                }
            }
        }
        self.refresh_registry().await?;
        self.empty.wake_all();
        Ok(PlanOutcome { entries, created })
    }

    async fn plans(&self) -> Result<Vec<PlanEntry>> {
        Ok(self.refresh_registry().await?.entries().to_vec())
    }

    async fn adopt(&self, entries: &[PlanEntry], completed: &[u64]) -> Result<u64> {
        let pending = plans::validate_adoption(entries, completed)?;
        if !self.refresh_registry().await?.entries().is_empty() {
            return Err(Error::InvalidPlan(
                "plans are adopted only into a namespace without any".into(),
            ));
        }
        // Completed first: registering an explicit range then skips its completed pid
        // (`plan_ranges` leaves completed pids alone). One BITFIELD per shard and chunk.
        let mut bits = vec![Vec::new(); self.keys.len()];
        for &pid in completed {
            bits[self.layout.shard_of(pid) as usize].push(self.bit(pid));
        }
        for (keys, bits) in self.keys.iter().zip(&bits) {
            for chunk in bits.chunks(MAX_SCRIPT_BATCH) {
                let mut cmd = redis::cmd("BITFIELD");
                cmd.arg(&keys.index);
                for bit in chunk {
                    cmd.arg("SET").arg("u1").arg(bit).arg(1);
                }
                let cmd = &cmd;
                retry(&self.conn, |mut conn| async move {
                    cmd.query_async::<redis::Value>(&mut conn).await
                })
                .await?;
            }
        }
        let now = self.now().to_string();
        let mut done = completed.iter().copied().peekable();
        for entry in entries {
            let outcome = self.plan(&entry.to_plan()).await?;
            if outcome.entries != [*entry] {
                return Err(Error::Corrupt {
                    key: self.registry_key.clone(),
                    detail: format!("{entry:?} registered as {:?}", outcome.entries),
                });
            }
            if entry.explicit {
                continue;
            }
            // Every pid issued at once: each shard's cursor past the plan, the pids not
            // completed materialised as pending (ready now) in chunks.
            let (first, last) = (entry.plan.first_pid(), entry.plan.last_pid());
            for keys in self.keys.iter() {
                let key = keys.cursor.as_str();
                retry(&self.conn, |mut conn| async move {
                    conn.hset::<_, _, _, ()>(key, first, last + 1).await
                })
                .await?;
            }
            let mut args: Vec<Vec<String>> = vec![vec![now.clone()]; self.keys.len()];
            for pid in first..=last {
                while done.next_if(|&d| d < pid).is_some() {}
                if done.next_if_eq(&pid).is_some() {
                    continue;
                }
                let Some(ids) = entry.plan.range_of(pid) else {
                    continue;
                };
                let shard = self.layout.shard_of(pid) as usize;
                args[shard].extend([
                    pid.to_string(),
                    ids.start().to_string(),
                    ids.end().to_string(),
                    self.bit(pid).to_string(),
                ]);
                if args[shard].len() > 4 * MAX_SCRIPT_BATCH {
                    self.materialise(shard, &mut args[shard], &now).await?;
                }
            }
            for (shard, args) in args.iter_mut().enumerate() {
                if args.len() > 1 {
                    self.materialise(shard, args, &now).await?;
                }
            }
        }
        self.empty.wake_all();
        Ok(pending)
    }
}

#[async_trait]
impl<C> Leases for RedisActiveStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn claim(&self, worker: &str, n: usize) -> Result<Vec<Lease>> {
        plans::check_worker(worker)?;
        let now = self.now();
        let deadline = self.deadline(now);
        let mut out = Vec::new();
        for shard in self.layout.claim_order(worker) {
            if out.len() >= n {
                break;
            }
            // A shard found without ready work a moment ago is passed by: an idle claim
            // costs nothing, whatever the shard count.
            if self.empty.skip(shard, now) {
                continue;
            }
            let keys = &self.keys[shard as usize];
            let want = (n - out.len()).min(MAX_SCRIPT_BATCH);
            let args = [
                worker.to_owned(),
                want.to_string(),
                now.to_string(),
                deadline.to_string(),
                shard.to_string(),
                self.layout.shards().to_string(),
                self.layout.per_batch().to_string(),
            ];
            let reply: Vec<String> = self
                .invoke(
                    &CLAIM,
                    &[
                        &keys.active,
                        &keys.pending,
                        &keys.leases,
                        &keys.plans,
                        &keys.cursor,
                        &keys.seq,
                        &keys.counts,
                    ],
                    &args,
                )
                .await?;
            let leases = self.leases_from(worker, deadline, reply).await?;
            if leases.len() < want {
                self.empty.found_short(shard, now);
            }
            out.extend(leases);
        }
        Ok(out)
    }

    async fn heartbeat(&self, lease: &Lease, progress: u64) -> Result<()> {
        let mut out = self.heartbeat_many(&[(lease.clone(), progress)]).await?;
        out.pop().expect("one outcome per lease")
    }

    async fn heartbeat_many(&self, beats: &[(Lease, u64)]) -> Result<Vec<Result<()>>> {
        let now = self.now();
        let deadline = self.deadline(now).to_string();
        let now = now.to_string();
        let groups = self.by_shard(beats.iter().map(|(lease, _)| lease.pid));
        let (now, deadline) = (&now, &deadline);
        let calls = groups.iter().map(|(shard, chunk)| async move {
            let keys = &self.keys[*shard];
            let mut args = Vec::with_capacity(2 + chunk.len() * 3);
            args.push(now.clone());
            args.push(deadline.clone());
            for &i in chunk {
                let (lease, progress) = &beats[i];
                args.push(lease.pid.to_string());
                args.push(lease.token.to_string());
                args.push(progress.to_string());
            }
            let reply: Result<Vec<i64>> = self
                .invoke(
                    &HEARTBEAT,
                    &[&keys.active, &keys.leases, &keys.counts],
                    &args,
                )
                .await;
            (chunk, reply)
        });
        let mut out: Vec<Option<Result<()>>> = (0..beats.len()).map(|_| None).collect();
        for (chunk, reply) in join_all(calls).await {
            match reply {
                Ok(codes) => {
                    for (&i, code) in chunk.iter().zip(codes) {
                        out[i] = Some(if code == OK {
                            Ok(())
                        } else {
                            Err(lost(&beats[i].0))
                        });
                    }
                }
                // A failed call fails its own leases only: the other shards' renewed.
                Err(err) => {
                    let err = Arc::new(err);
                    for &i in chunk {
                        out[i] = Some(Err(Error::Shared(err.clone())));
                    }
                }
            }
        }
        out.into_iter()
            .zip(beats)
            .map(|(o, (lease, _))| {
                o.ok_or_else(|| Error::Corrupt {
                    key: self.keys_of(lease.pid).active.clone(),
                    detail: "heartbeat script replied for fewer leases than sent".into(),
                })
            })
            .collect()
    }

    async fn complete(&self, lease: &Lease, duration_ms: u64) -> Result<Completion> {
        let (tx, rx) = oneshot::channel();
        if self
            .committer()
            .send((lease.clone(), duration_ms, tx))
            .is_err()
        {
            // The commit task is gone (its runtime shut down): complete directly.
            let mut out = self.complete_now(&[(lease.clone(), duration_ms)]).await?;
            return out.pop().expect("one outcome per completion");
        }
        match rx.await {
            Ok(outcome) => outcome,
            Err(_) => self
                .complete_now(&[(lease.clone(), duration_ms)])
                .await?
                .pop()
                .expect("one outcome"),
        }
    }

    async fn complete_many(&self, done: &[(Lease, u64)]) -> Result<Vec<Result<Completion>>> {
        self.complete_now(done).await
    }

    async fn fail(&self, lease: &Lease, error: &str) -> Result<FailOutcome> {
        let keys = self.keys_of(lease.pid);
        let args = [
            lease.pid.to_string(),
            lease.token.to_string(),
            self.now().to_string(),
            error.to_owned(),
            self.config.max_attempts.to_string(),
            self.config.backoff_base.as_millis().to_string(),
            self.config.backoff_max.as_millis().to_string(),
        ];
        let reply: Vec<i64> = self
            .invoke(
                &FAIL,
                &[&keys.active, &keys.leases, &keys.pending, &keys.counts],
                &args,
            )
            .await?;
        match reply.as_slice() {
            [OK, -1] => Ok(FailOutcome::Failed),
            [OK, ready] => Ok(FailOutcome::Retry {
                ready_at_ms: *ready as u64,
            }),
            _ => Err(lost(lease)),
        }
    }

    async fn release(&self, lease: &Lease, progress: u64) -> Result<()> {
        let keys = self.keys_of(lease.pid);
        let args = [
            self.now().to_string(),
            lease.pid.to_string(),
            lease.token.to_string(),
            progress.to_string(),
        ];
        let reply: Vec<i64> = self
            .invoke(
                &RELEASE,
                &[&keys.active, &keys.leases, &keys.pending, &keys.counts],
                &args,
            )
            .await?;
        match reply.first() {
            Some(&OK) => {
                // Pending again: this process may claim it at once.
                self.empty.wake(self.layout.shard_of(lease.pid));
                Ok(())
            }
            _ => Err(lost(lease)),
        }
    }
}

fn lost(lease: &Lease) -> Error {
    Error::LeaseLost {
        pid: lease.pid,
        token: lease.token,
    }
}

/// Leases reaped per shard per script call: bounds the time one call holds Redis.
const REAP_BATCH: usize = 1000;

#[async_trait]
impl<C> Maintenance for RedisActiveStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn reap(&self, now_ms: u64) -> Result<Vec<u64>> {
        let args = [
            now_ms.to_string(),
            REAP_BATCH.to_string(),
            String::new(),
            self.config.max_attempts.to_string(),
        ];
        let mut all = Vec::new();
        loop {
            let batch = self.per_shard_pids(&REAP, &args).await?;
            let done = batch.len() < REAP_BATCH;
            all.extend(batch);
            if done {
                break;
            }
        }
        all.sort_unstable();
        Ok(all)
    }

    async fn release_worker(&self, worker: &str) -> Result<Vec<u64>> {
        plans::check_worker(worker)?;
        let args = [
            self.now().to_string(),
            "0".to_owned(),
            worker.to_owned(),
            self.config.max_attempts.to_string(),
        ];
        self.per_shard_pids(&REAP, &args).await
    }

    async fn retry_failed(&self, pid: Option<u64>) -> Result<Vec<u64>> {
        let args = [
            self.now().to_string(),
            pid.map(|p| p.to_string()).unwrap_or_default(),
        ];
        let shards: Vec<&ShardKeys> = match pid {
            Some(pid) => vec![self.keys_of(pid)],
            None => self.keys.iter().collect(),
        };
        let mut out = Vec::new();
        for keys in shards {
            let reply: Vec<String> = self
                .invoke(
                    &RETRY_FAILED,
                    &[&keys.active, &keys.pending, &keys.counts],
                    &args,
                )
                .await?;
            for pid in reply {
                out.push(parse_u64(&pid, "pid")?);
            }
        }
        self.wake_shards_of(&out);
        out.sort_unstable();
        Ok(out)
    }

    async fn discard(&self, pid: u64) -> Result<bool> {
        let keys = self.keys_of(pid);
        let code: i64 = self
            .invoke(
                &DISCARD,
                &[&keys.active, &keys.pending, &keys.counts],
                &[pid.to_string()],
            )
            .await?;
        match code {
            1 => Ok(true),
            0 => Ok(false),
            _ => Err(Error::Leased(pid)),
        }
    }
}

#[async_trait]
impl<C> WorkerRegistry for RedisActiveStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn worker_heartbeat(&self, mut info: WorkerInfo) -> Result<()> {
        plans::check_worker(&info.id)?;
        info.last_beat_ms = self.now();
        let json = serde_json::to_string(&info).expect("WorkerInfo serialises");
        let key = &self.workers_key;
        let id = &info.id;
        retry(&self.conn, |mut conn| {
            let json = json.clone();
            async move { conn.hset::<_, _, _, ()>(key, id, json).await }
        })
        .await?;
        Ok(())
    }

    async fn workers(&self) -> Result<Vec<WorkerState>> {
        let key = &self.workers_key;
        let raw: Vec<(String, String)> =
            retry(
                &self.conn,
                |mut conn| async move { conn.hgetall(key).await },
            )
            .await?;
        let now = self.now();
        let mut out = Vec::with_capacity(raw.len());
        for (id, json) in raw {
            let info: WorkerInfo = serde_json::from_str(&json).map_err(|err| Error::Corrupt {
                key: format!("{key} {id}"),
                detail: err.to_string(),
            })?;
            out.push(WorkerState {
                active: self.config.worker_active(info.last_beat_ms, now),
                info,
            });
        }
        out.sort_by(|a, b| a.info.id.cmp(&b.info.id));
        Ok(out)
    }

    async fn deregister(&self, worker: &str) -> Result<()> {
        let key = &self.workers_key;
        retry(&self.conn, |mut conn| async move {
            conn.hdel::<_, _, ()>(key, worker).await
        })
        .await?;
        Ok(())
    }
}

#[async_trait]
impl<C> ActiveQuery for RedisActiveStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn get(&self, pid: u64) -> Result<Option<Partition>> {
        let shard = self.layout.shard_of(pid);
        let keys = &self.keys[shard as usize];
        // One round trip: the record, and the cursors in case it is not issued yet. In
        // one transaction (the keys share a slot): a claim running between the HGET and
        // the cursor read would otherwise move the pid out of both, and an issued pid
        // would read as completed.
        let (rec, plans, cursor): (Option<String>, Vec<String>, Pairs) =
            retry(&self.conn, |mut conn| async move {
                redis::pipe()
                    .atomic()
                    .hget(&keys.active, pid)
                    .lrange(&keys.plans, 0, -1)
                    .hgetall(&keys.cursor)
                    .query_async(&mut conn)
                    .await
            })
            .await?;
        if let Some(rec) = rec {
            let mut p = record::parse(pid, &rec, |pid| read(&self.registry).range_of(pid));
            if p.is_none() {
                let registry = self.refresh_registry().await?;
                p = record::parse(pid, &rec, |pid| registry.range_of(pid));
            }
            return p.map(Some).ok_or_else(|| Error::Corrupt {
                key: format!("{} {pid}", keys.active),
                detail: format!("unreadable record {rec:?}"),
            });
        }
        let unissued = self
            .cursors(shard, &plans, &cursor)?
            .into_iter()
            .any(|(first, last, at)| (first..=last).contains(&pid) && at <= pid);
        if unissued {
            let (min, max) = self.range_of(pid).await?;
            return Ok(Some(Partition::pending(pid, min, max, 0)));
        }
        Ok(None)
    }

    async fn all_active(&self) -> Result<ActiveSnapshot> {
        // One round trip: every shard's read is sent before any answer is awaited, so
        // they share one pipeline, on the bulk connection when there is one (its
        // replies are scanned in place) and otherwise on the multiplexed connection.
        // The records are parsed straight from the reply's bytes, sorted by pid as
        // (pid, bytes) pairs before any partition is built. The cached registry
        // supplies uniform plans' ranges (plans are append-only); only a record of a
        // plan added since it was read costs a second round trip, to read it again.
        let bulk = match &self.bulk {
            Some(reader) => self.read_shards_bulk(reader).await,
            None => None,
        };
        // The ordinary read's replies, which its shard reads borrow from.
        let values: Vec<(redis::Value, Vec<String>, Pairs)>;
        let reads = match bulk.as_ref().and_then(|r| self.shard_reads(r)) {
            Some(reads) => reads,
            None => {
                values = join_all((0..self.layout.shards()).map(|s| self.read_shard(s)))
                    .await
                    .into_iter()
                    .collect::<Result<_>>()?;
                values
                    .iter()
                    .zip(self.keys.iter())
                    .map(|((active, plans, cursor), keys)| {
                        let entries =
                            record::hash_entries(active).ok_or_else(|| Error::Corrupt {
                                key: keys.active.clone(),
                                detail: "the reply to HGETALL is not a hash".into(),
                            })?;
                        Ok(ShardRead {
                            entries,
                            plans: plans.clone(),
                            cursor: cursor.clone(),
                        })
                    })
                    .collect::<Result<Vec<_>>>()?
            }
        };
        let mut snapshot = ActiveSnapshot::default();
        let mut records = Vec::new();
        for (shard, read) in (0..).zip(&reads) {
            let key = &self.keys[shard as usize].active;
            records.reserve(read.entries.len());
            for &(pid, rec) in &read.entries {
                let pid = record::parse_u64(pid).ok_or_else(|| Error::Corrupt {
                    key: key.clone(),
                    detail: format!("field {:?} is not a pid", String::from_utf8_lossy(pid)),
                })?;
                records.push((pid, shard, rec));
            }
            snapshot
                .unissued
                .extend(self.unissued(shard, &read.plans, &read.cursor)?);
        }
        records.sort_unstable_by_key(|&(pid, ..)| pid);
        let cached = self.partitions(&records, &read(&self.registry))?;
        snapshot.partitions = match cached {
            Some(partitions) => partitions,
            None => {
                let registry = self.refresh_registry().await?;
                self.partitions(&records, &registry)?
                    .ok_or_else(|| Error::Corrupt {
                        key: self.registry_key.clone(),
                        detail: "an active record is in no plan".into(),
                    })?
            }
        };
        Ok(snapshot)
    }

    async fn counts(&self) -> Result<StatusCounts> {
        // One round trip: each shard's counters beside its cursors, all shards
        // pipelined. Counters not marked exact are zero when the shard holds no record
        // (nothing was ever claimed there); otherwise the shard was written by a version
        // without them, and they are derived from its records once, then read again.
        let shards = 0..self.layout.shards();
        let mut reads = join_all(shards.clone().map(|s| self.read_counts(s)))
            .await
            .into_iter()
            .collect::<Result<Vec<_>>>()?;
        let unmarked: Vec<u32> = shards
            .clone()
            .filter(|&s| {
                let (counters, records, ..) = &reads[s as usize];
                *records > 0 && counters.get(4).copied().flatten() != Some(1)
            })
            .collect();
        if !unmarked.is_empty() {
            tracing::info!(
                namespace = %self.config.namespace,
                shards = ?unmarked,
                "deriving the active layer's status counters from its records, once"
            );
            self.recount_shards(&unmarked).await?;
            reads = join_all(shards.map(|s| self.read_counts(s)))
                .await
                .into_iter()
                .collect::<Result<Vec<_>>>()?;
        }
        let mut counts = StatusCounts::default();
        for (shard, (counters, records, plans, cursor)) in (0..).zip(&reads) {
            // Unmarked counters of a shard without records are left-overs: it holds none.
            let exact = *records > 0 || counters.get(4).copied().flatten() == Some(1);
            let get = |i: usize| {
                let n = counters
                    .get(i)
                    .copied()
                    .flatten()
                    .filter(|_| exact)
                    .unwrap_or(0);
                if n < 0 {
                    tracing::warn!(
                        key = %self.keys[shard as usize].counts,
                        value = n,
                        "a negative status counter: a writer did not keep the counters; \
                         run recount"
                    );
                }
                n.max(0) as u64
            };
            counts.pending += get(0);
            counts.claimed += get(1);
            counts.running += get(2);
            counts.failed += get(3);
            counts.unissued += self
                .unissued(shard, plans, cursor)?
                .iter()
                .map(|u| u.count)
                .sum::<u64>();
        }
        Ok(counts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shard_key_hashes_to_one_slot() {
        for shards in [1u32, 4, 16, 1024] {
            let schema = KeySchema::new("elk", shards).unwrap();
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
