//! The Redis backend: per-shard hashes written by the archive's script through
//! [`APPLY_DELTA_LUA`], read back and merged here.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use futures_util::future::join_all;
use redis::Script;
use redis::aio::ConnectionLike;
use tranche_codec::lua::{self, Constant, Fragment};
use tranche_codec::{Clock, KeySchema, SystemClock};

use crate::aggregate::{Aggregate, RANGE_SIZE, RangeAgg, WorkerAgg};
use crate::damage::{self, Damage, HASHES, KEEP_FIRST, KEEP_LAST, Repaired};
use crate::hist::{BUCKETS, Histogram};
use crate::model::render_range;
use crate::packed::{block_of, read_block, read_day};
use crate::store::{SNAPSHOTS_KEPT, Snapshot, SnapshotConfig, StatsStore};
use crate::{Error, RangeStats, Result, Stats, StatsDelta, StatsSummary};

/// The Lua fragment defining `apply_stats(k, a)`, for the archive's script to compose
/// in front of its own source with [`lua::compose`] (which puts `common.lua`, that it
/// reads, first; the fragment carries [`RANGE_SIZE`] as `STATS_RANGE`).
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
/// The per-range and hourly statistics are packed values it reads, updates and writes
/// back whole (one hash field per block of 64 ranges, one per day): a call costs a
/// read and a write per block and day its delta touches, whatever its record count.
/// The other counters are `HINCRBY` (int64). Redis does not undo a script's earlier writes when
/// a command fails, so before writing anything `apply_stats` raises a script error if
/// the shard's or the delta's record count, summed IDs or summed milliseconds has
/// reached 10^18: a shard holds at most 10^18 IDs' worth of statistics. Call it before
/// the host script's own writes so that such an error leaves nothing half done.
pub const APPLY_DELTA_LUA: Fragment = Fragment::with(
    &[Constant::Number("STATS_RANGE", RANGE_SIZE)],
    include_str!("../lua/apply_delta.lua"),
);

/// The script `lua/NAME.lua` after the preludes named, composed by [`lua::compose`].
macro_rules! script {
    ($($prelude:expr),*; $name:literal) => {
        LazyLock::new(|| {
            Script::new(&lua::compose(&[
                $(&$prelude,)*
                &Fragment::new(include_str!(concat!("../lua/", $name, ".lua"))),
            ]))
        })
    };
}

#[cfg(any(test, feature = "testing"))]
static APPLY: LazyLock<Script> = script!(APPLY_DELTA_LUA; "apply");
static REPLACE: LazyLock<Script> = script!(APPLY_DELTA_LUA; "replace");
static REPAIR: LazyLock<Script> = script!(APPLY_DELTA_LUA; "repair");
static PUBLISH: LazyLock<Script> = script!(; "publish");

/// Every script of this crate with its name, for tests that run each on a cluster.
#[cfg(any(test, feature = "testing"))]
pub(crate) fn scripts() -> Vec<(&'static str, &'static Script)> {
    vec![
        ("apply", &APPLY),
        ("replace", &REPLACE),
        ("repair", &REPAIR),
        ("publish", &PUBLISH),
    ]
}

/// The position of the ranges hash in [`stats_keys`]: the one hash whose size grows
/// with the ID space, which [`StatsStore::summary`] never reads.
const RANGES: usize = 2;

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
/// the worker count, then per worker `worker count ids dur_ms`; the count of blocks of
/// 64 ranges, then per block `block nr` and per range of it (ascending)
/// `slot min_rel max_rel first_ms last_ms` (range `64 * block + slot`, row IDs
/// relative to the range's first ID `100000 * r`), its worker count and per worker
/// `wpos count dur_ms ids` (`wpos` its position, from 1, in the worker list); the day
/// count, then per UTC day `YYYY-MM-DD nh` and `nh` times `hour count`; the bucket
/// count, then per histogram bucket `*|b count` (global) or `worker|b count`.
pub fn delta_args(delta: &StatsDelta, now_ms: u64) -> Vec<String> {
    if delta.is_empty() {
        return vec!["0".to_owned()];
    }
    agg_args(&delta.agg, now_ms)
}

/// [`delta_args`] of an aggregate, empty or not (a repair's patch counts no record).
fn agg_args(a: &Aggregate, now_ms: u64) -> Vec<String> {
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
    let mut wpos: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, (w, agg)) in a.workers.iter().enumerate() {
        let c = &agg.totals;
        wpos.insert(w, i + 1);
        out.extend([
            w.to_string(),
            c.count.to_string(),
            c.ids.to_string(),
            c.dur.to_string(),
        ]);
    }
    let mut blocks: BTreeMap<u64, Vec<(u64, &RangeAgg)>> = BTreeMap::new();
    for (&r, range) in &a.ranges {
        let (block, slot) = block_of(r);
        blocks.entry(block).or_default().push((slot, range));
    }
    out.push(blocks.len().to_string());
    for (block, ranges) in blocks {
        out.push(block.to_string());
        out.push(ranges.len().to_string());
        for (slot, range) in ranges {
            let lo = u128::from(range.min / RANGE_SIZE) * u128::from(RANGE_SIZE);
            out.extend([
                slot.to_string(),
                (u128::from(range.min) - lo).to_string(),
                (u128::from(range.max) - lo).to_string(),
                range.first.to_string(),
                range.last.to_string(),
                range.workers.len().to_string(),
            ]);
            for (w, c) in &range.workers {
                out.extend([
                    wpos.get(&**w).copied().unwrap_or(0).to_string(),
                    c.count.to_string(),
                    c.dur.to_string(),
                    c.ids.to_string(),
                ]);
            }
        }
    }
    let active: Vec<(&String, Vec<(usize, u64)>)> = a
        .hourly
        .iter()
        .map(|(day, hours)| {
            let nonzero = hours.iter().copied().enumerate().filter(|&(_, n)| n > 0);
            (day, nonzero.collect())
        })
        .collect();
    out.push(active.len().to_string());
    for (day, hours) in active {
        out.push(day.clone());
        out.push(hours.len().to_string());
        for (h, n) in hours {
            out.push(h.to_string());
            out.push(n.to_string());
        }
    }
    let mut pairs = Vec::new();
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
/// `updated_ms`, and `palette`, the next worker palette index), `workers`
/// (`{worker}|count`, `|ids`, `|dur`, and `|idx`, its palette index), `ranges` (one
/// field per block of 64 ranges `r = min_id / 100000`, the block number `r / 64`,
/// holding every range's count, duration, data range, completion time range and
/// worker distribution packed into a few dozen bytes per range), `hourly` (one field
/// per UTC day `YYYY-MM-DD`, its 24 hourly counts packed) and `hist` (`*|{bucket}` and
/// `{worker}|{bucket}`). The packed layouts are in `lua/apply_delta.lua`, their only
/// writer. Snapshots are namespace-wide: `{ns}:stats:snapshot:v{n}`,
/// `{ns}:stats:latest`, `{ns}:stats:config` and the version counter
/// `{ns}:stats:version`.
#[derive(Debug, Clone)]
pub struct RedisStats<C> {
    conn: C,
    schema: KeySchema,
    keys: Arc<[[String; 5]]>,
    /// Stamps replaced shards (`last_updated`) and snapshots.
    clock: Arc<dyn Clock>,
}

impl<C> RedisStats<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Statistics of the namespace and shards of `schema`, through `conn`.
    pub fn new(conn: C, schema: KeySchema) -> Self {
        let keys = schema.shards().map(|s| stats_keys(&schema, s)).collect();
        Self {
            conn,
            schema,
            keys,
            clock: Arc::new(SystemClock),
        }
    }

    /// These statistics, stamping by `clock` rather than the system clock.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The key schema.
    pub fn schema(&self) -> &KeySchema {
        &self.schema
    }

    /// Applies `delta` to shard `shard` on its own (the standalone `apply` script), for
    /// this crate's tests ([`testing::apply_alone`](crate::testing::apply_alone)). Not
    /// public: outside the archive's script nothing marks the records archived, so a
    /// delta applied this way is counted again when they are archived. The archive runs
    /// [`APPLY_DELTA_LUA`] inside its own script, so that statistics and archive change
    /// together.
    #[cfg(any(test, feature = "testing"))]
    ///
    /// With `packed`, the ranges it touches are written as packed bodies (what the
    /// archive writes under its format 3).
    pub(crate) async fn apply(
        &self,
        shard: u32,
        delta: &StatsDelta,
        now_ms: u64,
        packed: bool,
    ) -> Result<()> {
        let keys = self.shard_keys(shard)?;
        let mut call = APPLY.prepare_invoke();
        for k in keys {
            call.key(k.as_str());
        }
        for a in delta_args(delta, now_ms) {
            call.arg(a);
        }
        if packed {
            call.arg(2);
        }
        let _: i64 = call.invoke_async(&mut self.conn.clone()).await?;
        Ok(())
    }

    /// The configuration of the latest snapshot (`{ns}:stats:config`), if any.
    pub async fn snapshot_config(&self) -> Result<Option<SnapshotConfig>> {
        self.get_json(self.global_key("config")).await
    }

    /// The JSON value at `key`, if any; malformed JSON is [`Error::Corrupt`].
    async fn get_json<T: serde::de::DeserializeOwned>(&self, key: String) -> Result<Option<T>> {
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

    /// Every shard's statistics, merged: one pipeline of `HGETALL`s per shard (a
    /// cluster client refuses pipelines that span slots), all shards at once. Without
    /// `ranges`, the ranges hash is neither read nor decoded, and the aggregate has no
    /// ranges: the read then costs what the other four hashes hold (workers, histogram
    /// buckets, days), whatever the number of ranges.
    async fn read_all(&self, ranges: bool) -> Result<Aggregate> {
        let reads = self.keys.iter().map(|keys| async move {
            let mut pipe = redis::pipe();
            for (i, k) in keys.iter().enumerate() {
                if ranges || i != RANGES {
                    pipe.hgetall(k);
                }
            }
            let mut hashes: Vec<Vec<(String, Vec<u8>)>> =
                pipe.query_async(&mut self.conn.clone()).await?;
            if !ranges {
                hashes.insert(RANGES.min(hashes.len()), Vec::new());
            }
            parse_shard(keys, &hashes)
        });
        let mut all = Aggregate::default();
        for shard in join_all(reads).await {
            all.absorb(shard?);
        }
        Ok(all)
    }

    /// The quarantine of shard `shard`: `{ns:s}:stats:quarantine`, a hash of the bad
    /// values a repair set aside, `<hash>:<field>@<ms>` -> the bytes as they were.
    pub fn quarantine_key(&self, shard: u32) -> String {
        self.schema.stats(shard, "quarantine")
    }

    /// Every value in shard `shard`'s quarantine, by field.
    pub async fn quarantined(&self, shard: u32) -> Result<Vec<(String, Vec<u8>)>> {
        self.shard_keys(shard)?;
        Ok(redis::cmd("HGETALL")
            .arg(self.quarantine_key(shard))
            .query_async(&mut self.conn.clone())
            .await?)
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
        Ok(self.read_all(true).await?.render())
    }

    async fn summary(&self) -> Result<StatsSummary> {
        Ok(self.read_all(false).await?.render_summary())
    }

    async fn range_summary(&self, id: u64) -> Result<Option<RangeStats>> {
        let r = id / RANGE_SIZE;
        let (block, _) = block_of(r);
        let reads = self.keys.iter().map(|keys| async move {
            // One pipeline in the shard's slot: the block's value and the palette.
            let (packed, workers): (Option<Vec<u8>>, Vec<(String, Vec<u8>)>) = redis::pipe()
                .hget(keys[2].as_str(), block)
                .hgetall(keys[1].as_str())
                .query_async(&mut self.conn.clone())
                .await?;
            let Some(packed) = packed else {
                return Ok(None);
            };
            let mut agg = Aggregate::default();
            let palette = parse_workers(&keys[1], &workers, &mut agg)?;
            let mut ranges = BTreeMap::new();
            read_block(&keys[2], block, &packed, &palette, &mut ranges)?;
            Ok::<_, Error>(ranges.remove(&r))
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
        self.run_delta(&REPLACE, shard, delta, self.clock.now_ms())
            .await
    }

    async fn damage(&self, shard: u32) -> Result<Vec<Damage>> {
        let keys = self.shard_keys(shard)?;
        let mut pipe = redis::pipe();
        for k in keys {
            pipe.hgetall(k);
        }
        let hashes: Vec<Vec<(String, Vec<u8>)>> = pipe.query_async(&mut self.conn.clone()).await?;
        Ok(damage::scan(shard, &hashes))
    }

    async fn repair(&self, shard: u32, rebuilt: &StatsDelta, unreadable: u64) -> Result<Repaired> {
        let keys = self.shard_keys(shard)?;
        let found = self.damage(shard).await?;
        let whole = damage::rebuild_whole(&found, unreadable);
        let done = Repaired {
            shard,
            quarantined: found,
            whole,
            unreadable,
        };
        if !whole && done.quarantined.is_empty() {
            return Ok(done);
        }
        let now = self.clock.now_ms();
        let mut call = REPAIR.prepare_invoke();
        for k in keys {
            call.key(k.as_str());
        }
        call.key(self.quarantine_key(shard));
        call.arg(if whole { "whole" } else { "patch" })
            .arg(now)
            .arg(done.quarantined.len());
        for d in &done.quarantined {
            let j = HASHES.iter().position(|h| *h == d.hash).unwrap_or(0) + 1;
            call.arg(j).arg(&d.field);
        }
        let args = if whole {
            delta_args(rebuilt, now)
        } else {
            let (patch, first, last) = damage::patch(&rebuilt.agg, &done.quarantined);
            let mut args = agg_args(&patch, now);
            if !first {
                args[5] = KEEP_FIRST.to_owned();
            }
            if !last {
                args[6] = KEEP_LAST.to_owned();
            }
            args
        };
        for a in args {
            call.arg(a);
        }
        let _moved: usize = call.invoke_async(&mut self.conn.clone()).await?;
        Ok(done)
    }

    async fn publish_snapshot(&self) -> Result<u64> {
        let mut stats = self.stats().await?;
        crate::store::bound_snapshot_ranges(&mut stats);
        let mut conn = self.conn.clone();
        let version: u64 = redis::cmd("INCR")
            .arg(self.global_key("version"))
            .query_async(&mut conn)
            .await?;
        let timestamp_ms = self.clock.now_ms();
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
        self.get_json(self.snapshot_key(version)).await
    }
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

fn text<'a>(key: &str, field: &str, value: &'a [u8]) -> Result<&'a str> {
    std::str::from_utf8(value).map_err(|e| corrupt(key, field, e))
}

/// `agg`'s entry for worker `w`, made if new (a worker has a few dozen fields: look the
/// name up before allocating it).
fn worker_entry<'a>(agg: &'a mut Aggregate, w: &str) -> &'a mut WorkerAgg {
    if !agg.workers.contains_key(w) {
        agg.workers.insert(Arc::from(w), WorkerAgg::default());
    }
    agg.workers
        .get_mut(w)
        .expect("the worker was inserted just above")
}

/// The workers hash into `agg`'s worker totals; returns the palette (index -> worker).
fn parse_workers(
    key: &str,
    hash: &[(String, Vec<u8>)],
    agg: &mut Aggregate,
) -> Result<HashMap<u64, Arc<str>>> {
    let mut palette = HashMap::new();
    for (f, v) in hash {
        let v = text(key, f, v)?;
        let (w, kind) = f
            .rsplit_once('|')
            .ok_or_else(|| corrupt(key, f, "no '|'"))?;
        if kind == "idx" {
            if palette.insert(num(key, f, v)?, Arc::from(w)).is_some() {
                return Err(corrupt(key, f, "palette index used twice"));
            }
            continue;
        }
        let c = &mut worker_entry(agg, w).totals;
        match kind {
            "count" => c.count = num(key, f, v)?,
            "ids" => c.ids = num(key, f, v)?,
            "dur" => c.dur = num(key, f, v)?,
            _ => return Err(corrupt(key, f, "unknown field")),
        }
    }
    Ok(palette)
}

fn parse_shard(keys: &[String; 5], hashes: &[Vec<(String, Vec<u8>)>]) -> Result<Aggregate> {
    let mut agg = Aggregate::default();
    let empty = Vec::new();
    let hash = |i: usize| hashes.get(i).unwrap_or(&empty);

    let key = &keys[0];
    for (f, v) in hash(0) {
        let v = text(key, f, v)?;
        match f.as_str() {
            "count" => agg.totals.count = num(key, f, v)?,
            "ids" => agg.totals.ids = num(key, f, v)?,
            "dur_sum_ms" => agg.totals.dur = num(key, f, v)?,
            "first_completed_ms" => agg.first = Some(num(key, f, v)?),
            "last_completed_ms" => agg.last = Some(num(key, f, v)?),
            "updated_ms" => agg.updated = Some(num(key, f, v)?),
            "palette" => {
                num::<u64>(key, f, v)?;
            }
            _ => return Err(corrupt(key, f, "unknown field")),
        }
    }

    let palette = parse_workers(&keys[1], hash(1), &mut agg)?;

    let key = &keys[2];
    for (f, v) in hash(2) {
        read_block(key, num(key, f, f)?, v, &palette, &mut agg.ranges)?;
    }

    let key = &keys[3];
    for (f, v) in hash(3) {
        let day = f.as_str();
        if day.len() < 10 || day.contains('|') {
            return Err(corrupt(key, f, "not YYYY-MM-DD"));
        }
        agg.hourly
            .insert(day.to_owned(), read_day(&format!("{key} {f}"), v)?);
    }

    let key = &keys[4];
    for (f, v) in hash(4) {
        let v = text(key, f, v)?;
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
            &mut worker_entry(&mut agg, who).hist
        };
        h.add_bucket(bucket, num(key, f, v)?);
    }
    Ok(agg)
}
