//! The Redis backend: per-shard hashes written by the archive's script through
//! [`APPLY_DELTA_LUA`], read back and merged here.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::task::Poll;

use async_trait::async_trait;
use redis::Script;
use redis::aio::ConnectionLike;
use tranche_codec::KeySchema;

use crate::aggregate::{Aggregate, Counters, RANGE_SIZE, RangeAgg, WorkerAgg};
use crate::hist::{BUCKETS, Histogram};
use crate::model::render_range;
use crate::store::{SNAPSHOTS_KEPT, Snapshot, SnapshotConfig, StatsStore, now_ms};
use crate::{Error, RangeStats, Result, Stats, StatsDelta};

/// The Lua fragment defining `apply_stats(k, a)`, for the archive's script to
/// concatenate in front of its own source.
///
/// `apply_stats(k, a)` adds a [`StatsDelta`] to one shard's statistics: `KEYS[k]` to
/// `KEYS[k + 4]` are the five keys of [`stats_keys`], in that order; `ARGV[a]` is the
/// count `n` of delta arguments that follow (the strings of [`delta_args`], whose first
/// element is that count); it returns `a + n + 1`, the index of the first `ARGV` after
/// the delta. It defines only `local` names starting with `stats_` besides
/// `apply_stats`, and never reads outside its keys and arguments. A caller may skip a
/// delta without applying it (its next argument is `ARGV[a + n + 1]`), for instance
/// when its records turn out to be archived already.
///
/// Counters are `HINCRBY` (int64). Redis does not undo a script's earlier writes when
/// a command fails, so before writing anything `apply_stats` raises a script error if
/// the shard's or the delta's record count, summed IDs or summed milliseconds has
/// reached 10^18: a shard holds at most 10^18 IDs' worth of statistics. Call it before
/// the host script's own writes so that such an error leaves nothing half done.
pub const APPLY_DELTA_LUA: &str = include_str!("../lua/apply_delta.lua");

macro_rules! script {
    ($name:literal) => {
        LazyLock::new(|| {
            Script::new(concat!(
                include_str!("../lua/apply_delta.lua"),
                include_str!(concat!("../lua/", $name, ".lua"))
            ))
        })
    };
}

static APPLY: LazyLock<Script> = script!("apply");
static REPLACE: LazyLock<Script> = script!("replace");
static RANGE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../lua/range.lua")));
static PUBLISH: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/publish.lua")));

/// Every script of this crate with its name, for tests that run each on a cluster.
pub fn scripts() -> Vec<(&'static str, &'static Script)> {
    vec![
        ("apply", &APPLY),
        ("replace", &REPLACE),
        ("range", &RANGE),
        ("publish", &PUBLISH),
    ]
}

/// The statistics keys of `shard`, in the order `apply_stats` takes them:
/// `{ns:s}:stats:global`, `…:workers`, `…:ranges`, `…:hourly`, `…:hist`.
pub fn stats_keys(schema: &KeySchema, shard: u32) -> [String; 5] {
    ["global", "workers", "ranges", "hourly", "hist"].map(|suffix| schema.stats(shard, suffix))
}

/// `delta` as the `ARGV` strings of `apply_stats`, stamped `now_ms` (the shard's
/// `updated_ms` becomes the greater of it and the current value).
///
/// The first string is the count `n` of the strings after it (`"0"` alone for an empty
/// delta). Then, all numbers in decimal: `now_ms count ids dur_ms first_ms last_ms`;
/// the worker count, then per worker `worker count ids dur_ms`; the range count, then
/// per range `r count dur_ms min_id max_id first_ms last_ms` and its worker count and
/// per worker `worker count dur_ms ids`; the hour count, then per hour
/// `YYYY-MM-DD|HH count`; the bucket count, then per histogram bucket `*|b count`
/// (global) or `worker|b count`.
pub fn delta_args(delta: &StatsDelta, now_ms: u64) -> Vec<String> {
    if delta.is_empty() {
        return vec!["0".to_owned()];
    }
    let a = &delta.agg;
    let mut out = vec![String::new()];
    let t = &a.totals;
    out.extend([
        now_ms.to_string(),
        t.count.to_string(),
        t.ids.to_string(),
        t.dur.to_string(),
        a.first.unwrap_or(0).to_string(),
        a.last.unwrap_or(0).to_string(),
    ]);
    out.push(a.workers.len().to_string());
    for (w, agg) in &a.workers {
        let c = &agg.totals;
        out.extend([
            w.to_string(),
            c.count.to_string(),
            c.ids.to_string(),
            c.dur.to_string(),
        ]);
    }
    out.push(a.ranges.len().to_string());
    for (r, range) in &a.ranges {
        out.extend([
            r.to_string(),
            range.count.to_string(),
            range.dur.to_string(),
            range.min.to_string(),
            range.max.to_string(),
            range.first.to_string(),
            range.last.to_string(),
            range.workers.len().to_string(),
        ]);
        for (w, c) in &range.workers {
            out.extend([
                w.to_string(),
                c.count.to_string(),
                c.dur.to_string(),
                c.ids.to_string(),
            ]);
        }
    }
    let mut pairs = Vec::new();
    for (day, hours) in &a.hourly {
        for (h, &n) in hours.iter().enumerate() {
            if n > 0 {
                pairs.push(format!("{day}|{h:02}"));
                pairs.push(n.to_string());
            }
        }
    }
    out.push((pairs.len() / 2).to_string());
    out.append(&mut pairs);
    let hists =
        std::iter::once(("*", &a.hist)).chain(a.workers.iter().map(|(w, agg)| (&**w, &agg.hist)));
    for (who, h) in hists {
        for (b, n) in &h.counts {
            pairs.push(format!("{who}|{b}"));
            pairs.push(n.to_string());
        }
    }
    out.push((pairs.len() / 2).to_string());
    out.append(&mut pairs);
    out[0] = (out.len() - 1).to_string();
    out
}

/// Statistics on Redis, standalone or cluster.
///
/// Per shard `s` of namespace `ns`, five hashes tagged `{ns:s}` (see [`stats_keys`]):
/// `global` (`count`, `ids`, `dur_sum_ms`, `first_completed_ms`, `last_completed_ms`,
/// `updated_ms`), `workers` (`{worker}|count`, `|ids`, `|dur`), `ranges` (per range
/// number `r = min_id / 100000`: `{r}|count`, `|dur`, `|min`, `|max`, `|first`,
/// `|last`, and `{r}|w|{worker}|count`, `|dur`, `|ids`), `hourly` (`YYYY-MM-DD|HH`)
/// and `hist` (`*|{bucket}` and `{worker}|{bucket}`). Snapshots are namespace-wide:
/// `{ns}:stats:snapshot:v{n}`, `{ns}:stats:latest`, `{ns}:stats:config` and the
/// version counter `{ns}:stats:version`.
#[derive(Debug, Clone)]
pub struct RedisStats<C> {
    conn: C,
    schema: KeySchema,
    keys: Arc<[[String; 5]]>,
}

impl<C> RedisStats<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Statistics of the namespace and shards of `schema`, through `conn`.
    pub fn new(conn: C, schema: KeySchema) -> Self {
        let keys = schema.shards().map(|s| stats_keys(&schema, s)).collect();
        Self { conn, schema, keys }
    }

    /// The key schema.
    pub fn schema(&self) -> &KeySchema {
        &self.schema
    }

    /// Applies `delta` to shard `shard` on its own (the standalone `apply` script). The
    /// archive does not use this: it runs [`APPLY_DELTA_LUA`] inside its own script, so
    /// that statistics and archive change together.
    pub async fn apply(&self, shard: u32, delta: &StatsDelta, now_ms: u64) -> Result<()> {
        self.run_delta(&APPLY, shard, delta, now_ms).await
    }

    /// The configuration of the latest snapshot (`{ns}:stats:config`), if any.
    pub async fn snapshot_config(&self) -> Result<Option<SnapshotConfig>> {
        let key = self.global_key("config");
        let json: Option<String> = redis::cmd("GET")
            .arg(&key)
            .query_async(&mut self.conn.clone())
            .await?;
        json.map(|j| {
            serde_json::from_str(&j).map_err(|e| Error::Corrupt {
                key,
                detail: e.to_string(),
            })
        })
        .transpose()
    }

    async fn run_delta(
        &self,
        script: &Script,
        shard: u32,
        delta: &StatsDelta,
        now_ms: u64,
    ) -> Result<()> {
        let keys = self.shard_keys(shard)?;
        let mut call = script.prepare_invoke();
        for k in keys {
            call.key(k.as_str());
        }
        for a in delta_args(delta, now_ms) {
            call.arg(a);
        }
        let _: i64 = call.invoke_async(&mut self.conn.clone()).await?;
        Ok(())
    }

    fn shard_keys(&self, shard: u32) -> Result<&[String; 5]> {
        self.keys.get(shard as usize).ok_or(Error::InvalidShard {
            shard,
            shards: self.schema.num_shards(),
        })
    }

    /// Every shard's statistics, merged: one pipeline of five `HGETALL` per shard
    /// (a cluster client refuses pipelines that span slots), all shards at once.
    async fn read_all(&self) -> Result<Aggregate> {
        let reads = self.keys.iter().map(|keys| async move {
            let mut pipe = redis::pipe();
            for k in keys {
                pipe.hgetall(k);
            }
            let hashes: Vec<Vec<(String, String)>> =
                pipe.query_async(&mut self.conn.clone()).await?;
            parse_shard(keys, &hashes)
        });
        let mut all = Aggregate::default();
        for shard in join_all(reads).await {
            all.merge(&shard?);
        }
        Ok(all)
    }

    fn snapshot_key(&self, version: u64) -> String {
        format!("{}:stats:snapshot:v{version}", self.schema.global_tag())
    }

    fn global_key(&self, suffix: &str) -> String {
        format!("{}:stats:{suffix}", self.schema.global_tag())
    }
}

#[async_trait]
impl<C> StatsStore for RedisStats<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn stats(&self) -> Result<Stats> {
        Ok(self.read_all().await?.render())
    }

    async fn range_summary(&self, id: u64) -> Result<Option<RangeStats>> {
        let r = id / RANGE_SIZE;
        let reads = self.keys.iter().map(|keys| async move {
            let reply: Vec<Option<String>> = RANGE
                .key(keys[1].as_str())
                .key(keys[2].as_str())
                .arg(r)
                .invoke_async(&mut self.conn.clone())
                .await?;
            parse_range(&keys[2], &reply)
        });
        let mut all = Aggregate::default();
        for range in join_all(reads).await {
            if let Some(range) = range? {
                let mut one = Aggregate::default();
                one.ranges.insert(r, range);
                all.merge(&one);
            }
        }
        Ok(all.ranges.get(&r).map(render_range))
    }

    async fn replace(&self, shard: u32, delta: &StatsDelta) -> Result<()> {
        self.run_delta(&REPLACE, shard, delta, now_ms()).await
    }

    async fn publish_snapshot(&self) -> Result<u64> {
        let stats = self.stats().await?;
        let mut conn = self.conn.clone();
        let version: u64 = redis::cmd("INCR")
            .arg(self.global_key("version"))
            .query_async(&mut conn)
            .await?;
        let timestamp_ms = now_ms();
        let config = SnapshotConfig {
            version,
            timestamp_ms,
            count: stats.global_stats.total_completed,
        };
        let snapshot = Snapshot {
            version,
            timestamp_ms,
            stats,
        };
        let mut call = PUBLISH.prepare_invoke();
        call.key(self.snapshot_key(version))
            .key(self.global_key("latest"))
            .key(self.global_key("config"));
        if version > SNAPSHOTS_KEPT {
            call.key(self.snapshot_key(version - SNAPSHOTS_KEPT));
        }
        call.arg(version)
            .arg(to_json(&snapshot))
            .arg(to_json(&config));
        let _: i64 = call.invoke_async(&mut conn).await?;
        Ok(version)
    }

    async fn latest_snapshot(&self) -> Result<Option<Snapshot>> {
        let latest: Option<u64> = redis::cmd("GET")
            .arg(self.global_key("latest"))
            .query_async(&mut self.conn.clone())
            .await?;
        match latest {
            Some(v) => self.snapshot(v).await,
            None => Ok(None),
        }
    }

    async fn snapshot(&self, version: u64) -> Result<Option<Snapshot>> {
        let key = self.snapshot_key(version);
        let json: Option<String> = redis::cmd("GET")
            .arg(&key)
            .query_async(&mut self.conn.clone())
            .await?;
        json.map(|j| {
            serde_json::from_str(&j).map_err(|e| Error::Corrupt {
                key,
                detail: e.to_string(),
            })
        })
        .transpose()
    }
}

/// Runs `futures` concurrently (on a multiplexed connection, one round trip for all
/// shards rather than one each) and returns their outputs in order.
async fn join_all<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut pending: Vec<Option<Pin<Box<F>>>> =
        futures.into_iter().map(|f| Some(Box::pin(f))).collect();
    let mut out: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut waiting = false;
        for (slot, result) in pending.iter_mut().zip(out.iter_mut()) {
            if let Some(fut) = slot {
                match fut.as_mut().poll(cx) {
                    Poll::Ready(v) => {
                        *result = Some(v);
                        *slot = None;
                    }
                    Poll::Pending => waiting = true,
                }
            }
        }
        if waiting {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    // Every slot was filled before poll_fn returned Ready.
    out.into_iter().flatten().collect()
}

/// `value` as JSON. Snapshots and their config hold only string-keyed maps and finite
/// numbers, which always serialise.
fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

fn corrupt(key: &str, field: &str, detail: impl std::fmt::Display) -> Error {
    Error::Corrupt {
        key: format!("{key} {field}"),
        detail: detail.to_string(),
    }
}

fn num<T: std::str::FromStr>(key: &str, field: &str, value: &str) -> Result<T>
where
    T::Err: std::fmt::Display,
{
    value
        .parse()
        .map_err(|e| corrupt(key, field, format!("{value:?}: {e}")))
}

/// A range's fields as read, before they are known complete.
#[derive(Default)]
struct RangeFields {
    count: u64,
    dur: u128,
    min: Option<u64>,
    max: Option<u64>,
    first: Option<u64>,
    last: Option<u64>,
    workers: BTreeMap<Arc<str>, Counters>,
}

impl RangeFields {
    fn finish(self, key: &str, r: u64) -> Result<RangeAgg> {
        let need = |v: Option<u64>, what: &str| {
            v.ok_or_else(|| corrupt(key, &format!("{r}|{what}"), "missing"))
        };
        Ok(RangeAgg {
            count: self.count,
            dur: self.dur,
            min: need(self.min, "min")?,
            max: need(self.max, "max")?,
            first: need(self.first, "first")?,
            last: need(self.last, "last")?,
            workers: self.workers,
        })
    }
}

fn parse_shard(keys: &[String; 5], hashes: &[Vec<(String, String)>]) -> Result<Aggregate> {
    let mut agg = Aggregate::default();
    let empty = Vec::new();
    let hash = |i: usize| hashes.get(i).unwrap_or(&empty);

    let key = &keys[0];
    for (f, v) in hash(0) {
        match f.as_str() {
            "count" => agg.totals.count = num(key, f, v)?,
            "ids" => agg.totals.ids = num(key, f, v)?,
            "dur_sum_ms" => agg.totals.dur = num(key, f, v)?,
            "first_completed_ms" => agg.first = Some(num(key, f, v)?),
            "last_completed_ms" => agg.last = Some(num(key, f, v)?),
            "updated_ms" => agg.updated = Some(num(key, f, v)?),
            _ => return Err(corrupt(key, f, "unknown field")),
        }
    }

    let key = &keys[1];
    for (f, v) in hash(1) {
        let (w, kind) = f
            .rsplit_once('|')
            .ok_or_else(|| corrupt(key, f, "no '|'"))?;
        let c = &mut agg.workers.entry(Arc::from(w)).or_default().totals;
        match kind {
            "count" => c.count = num(key, f, v)?,
            "ids" => c.ids = num(key, f, v)?,
            "dur" => c.dur = num(key, f, v)?,
            _ => return Err(corrupt(key, f, "unknown field")),
        }
    }

    let key = &keys[2];
    let mut ranges: BTreeMap<u64, RangeFields> = BTreeMap::new();
    for (f, v) in hash(2) {
        let (r, rest) = f.split_once('|').ok_or_else(|| corrupt(key, f, "no '|'"))?;
        let range = ranges.entry(num(key, f, r)?).or_default();
        if let Some(wfield) = rest.strip_prefix("w|") {
            let (w, kind) = wfield
                .rsplit_once('|')
                .ok_or_else(|| corrupt(key, f, "no '|'"))?;
            let c = range.workers.entry(Arc::from(w)).or_default();
            match kind {
                "count" => c.count = num(key, f, v)?,
                "dur" => c.dur = num(key, f, v)?,
                "ids" => c.ids = num(key, f, v)?,
                _ => return Err(corrupt(key, f, "unknown field")),
            }
            continue;
        }
        match rest {
            "count" => range.count = num(key, f, v)?,
            "dur" => range.dur = num(key, f, v)?,
            "min" => range.min = Some(num(key, f, v)?),
            "max" => range.max = Some(num(key, f, v)?),
            "first" => range.first = Some(num(key, f, v)?),
            "last" => range.last = Some(num(key, f, v)?),
            _ => return Err(corrupt(key, f, "unknown field")),
        }
    }
    for (r, fields) in ranges {
        agg.ranges.insert(r, fields.finish(key, r)?);
    }

    let key = &keys[3];
    for (f, v) in hash(3) {
        let (day, hour) = f
            .rsplit_once('|')
            .ok_or_else(|| corrupt(key, f, "no '|'"))?;
        let hour: usize = num(key, f, hour)?;
        if hour >= 24 || day.len() < 10 {
            return Err(corrupt(key, f, "not YYYY-MM-DD|HH"));
        }
        agg.hourly.entry(day.to_owned()).or_default()[hour] = num(key, f, v)?;
    }

    let key = &keys[4];
    for (f, v) in hash(4) {
        let (who, bucket) = f
            .rsplit_once('|')
            .ok_or_else(|| corrupt(key, f, "no '|'"))?;
        let bucket: u32 = num(key, f, bucket)?;
        if bucket >= BUCKETS {
            return Err(corrupt(key, f, "no such bucket"));
        }
        let h: &mut Histogram = if who == "*" {
            &mut agg.hist
        } else {
            &mut agg
                .workers
                .entry(Arc::from(who))
                .or_insert_with(WorkerAgg::default)
                .hist
        };
        h.add_bucket(bucket, num(key, f, v)?);
    }
    Ok(agg)
}

fn parse_range(key: &str, reply: &[Option<String>]) -> Result<Option<RangeAgg>> {
    let Some(Some(count)) = reply.first() else {
        return Ok(None);
    };
    let field = |i: usize, name: &str| -> Result<u64> {
        match reply.get(i) {
            Some(Some(v)) => num(key, name, v),
            _ => Err(corrupt(key, name, "missing")),
        }
    };
    let mut range = RangeAgg {
        count: num(key, "count", count)?,
        dur: match reply.get(1) {
            Some(Some(v)) => num(key, "dur", v)?,
            _ => 0,
        },
        min: field(2, "min")?,
        max: field(3, "max")?,
        first: field(4, "first")?,
        last: field(5, "last")?,
        workers: BTreeMap::new(),
    };
    for w in reply.get(6..).unwrap_or_default().chunks(4) {
        let get = |i: usize| w.get(i).cloned().flatten().unwrap_or_default();
        let name = get(0);
        range.workers.insert(
            Arc::from(name.as_str()),
            Counters {
                count: num(key, &name, &get(1))?,
                dur: num(key, &name, &get(2))?,
                ids: num(key, &name, &get(3))?,
            },
        );
    }
    Ok(Some(range))
}
