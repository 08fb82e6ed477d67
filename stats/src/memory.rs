//! The in-memory statistics backend, for the embedded mode.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use dashmap::DashMap;
use tranche_codec::{Clock, SystemClock};

use crate::aggregate::{Aggregate, RANGE_SIZE};
use crate::damage::{patch_in_place, rebuild_whole};
use crate::model::render_range;
use crate::state::{AggState, STATS_STATE_VERSION, StatsState};
use crate::store::{SNAPSHOTS_KEPT, Snapshot, SnapshotConfig, StatsStore};
use crate::{Damage, Error, RangeStats, Repaired, Result, Stats, StatsDelta, StatsSummary};

/// Statistics in memory, per shard, with the same behaviour as [`RedisStats`].
///
/// The memory archive calls [`MemoryStats::apply`] while it holds its own shard lock,
/// which gives the same "archive write and statistics together" atomicity as the Redis
/// script.
///
/// [`RedisStats`]: crate::RedisStats
#[derive(Debug)]
pub struct MemoryStats {
    shards: DashMap<u32, Aggregate>,
    /// Per shard, the values marked damaged (the memory twin of a value that does not
    /// decode on Redis: only the `testing` hook [`MemoryStats::corrupt`] makes one):
    /// `(hash, field)` -> the bad bytes. A damaged shard refuses deltas, as Redis does.
    damaged: DashMap<u32, BTreeMap<(String, String), Vec<u8>>>,
    /// Per shard, the bad values a repair set aside, `<hash>:<field>@<ms>` -> bytes.
    quarantine: DashMap<u32, BTreeMap<String, Vec<u8>>>,
    snapshots: Mutex<Snapshots>,
    /// Stamps deltas (`last_updated`) and snapshots.
    clock: Arc<dyn Clock>,
}

impl Default for MemoryStats {
    fn default() -> Self {
        Self {
            shards: DashMap::new(),
            damaged: DashMap::new(),
            quarantine: DashMap::new(),
            snapshots: Mutex::default(),
            clock: Arc::new(SystemClock),
        }
    }
}

#[derive(Debug, Default)]
struct Snapshots {
    next: u64,
    kept: BTreeMap<u64, Snapshot>,
    config: Option<SnapshotConfig>,
}

impl MemoryStats {
    /// Empty statistics.
    pub fn new() -> Self {
        Self::default()
    }

    /// These statistics, stamping deltas and snapshots by `clock` rather than the
    /// system clock.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Adds `delta` to shard `shard`'s statistics, stamped with the clock's time (a
    /// test that wants another time gives the statistics a `ManualClock`).
    ///
    /// Only the memory archive calls this, under its shard lock, in the same step as it
    /// marks the records archived: statistics applied anywhere else would count those
    /// records again when they are archived. A shard with damaged values refuses every
    /// delta ([`Error::Corrupt`], nothing applied) until it is repaired, as on Redis.
    pub fn apply(&self, shard: u32, delta: &StatsDelta) -> Result<()> {
        self.check_whole(shard)?;
        self.apply_at(shard, delta, self.clock.now_ms());
        Ok(())
    }

    /// [`Error::Corrupt`] naming the first damaged value of `shard`, if it has any.
    pub fn check_whole(&self, shard: u32) -> Result<()> {
        match self.damaged.get(&shard) {
            Some(d) if !d.is_empty() => {
                let ((hash, field), _) = d.iter().next().expect("not empty");
                Err(Error::Corrupt {
                    key: format!("shard {shard} stats:{hash} {field}"),
                    detail: "a packed statistics value is corrupt".to_owned(),
                })
            }
            _ => Ok(()),
        }
    }

    /// Marks `field` of shard `shard`'s statistics hash `hash` (`global`, `workers`,
    /// `ranges`, `hourly`, `hist`) as holding `bytes`, which do not decode: the shard
    /// then refuses deltas and reports the damage until repaired (feature `testing`).
    #[cfg(feature = "testing")]
    pub fn corrupt(&self, shard: u32, hash: &str, field: &str, bytes: Vec<u8>) {
        self.damaged
            .entry(shard)
            .or_default()
            .insert((hash.to_owned(), field.to_owned()), bytes);
    }

    /// Every value in shard `shard`'s quarantine, by field.
    pub fn quarantined(&self, shard: u32) -> Vec<(String, Vec<u8>)> {
        self.quarantine
            .get(&shard)
            .map(|q| q.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default()
    }

    /// Adds `delta` to shard `shard`'s statistics, stamped `now_ms` (as [`delta_args`]
    /// stamps it on Redis). An empty delta changes nothing.
    ///
    /// [`delta_args`]: crate::archive_protocol::delta_args
    pub(crate) fn apply_at(&self, shard: u32, delta: &StatsDelta, now_ms: u64) {
        if delta.is_empty() {
            return;
        }
        let mut agg = delta.agg.clone();
        agg.updated = Some(now_ms);
        self.shards.entry(shard).or_default().merge(&agg);
    }

    /// Everything these statistics hold, for the embedded state file. Consistent with
    /// an archive only while nothing applies a delta, so the memory archive takes it
    /// under its own locks when it saves its state.
    pub fn state(&self) -> StatsState {
        let mut shards: Vec<(u32, AggState)> = self
            .shards
            .iter()
            .map(|e| (*e.key(), AggState::from_agg(e.value())))
            .collect();
        shards.sort_unstable_by_key(|(s, _)| *s);
        let snapshots = lock(&self.snapshots);
        StatsState {
            version: STATS_STATE_VERSION,
            shards,
            next_snapshot: snapshots.next,
            snapshots: snapshots.kept.values().cloned().collect(),
            snapshot_config: snapshots.config.clone(),
        }
    }

    /// Statistics exactly as `state` saved them: every query answers as it did.
    /// [`Error::Corrupt`] for another state version or a malformed state.
    pub fn restore(state: StatsState) -> Result<Self> {
        tranche_codec::state::check_version(state.version, STATS_STATE_VERSION).map_err(|e| {
            Error::Corrupt {
                key: "stats state".into(),
                detail: e.to_string(),
            }
        })?;
        let shards = DashMap::new();
        for (shard, agg) in state.shards {
            if shards.insert(shard, agg.into_agg()?).is_some() {
                return Err(Error::Corrupt {
                    key: "stats state".into(),
                    detail: format!("shard {shard} saved twice"),
                });
            }
        }
        let kept: BTreeMap<u64, Snapshot> = state
            .snapshots
            .into_iter()
            .map(|s| (s.version, s))
            .collect();
        if kept.keys().any(|&v| v > state.next_snapshot) {
            return Err(Error::Corrupt {
                key: "stats state".into(),
                detail: format!(
                    "a snapshot is newer than the last version {}",
                    state.next_snapshot
                ),
            });
        }
        Ok(Self {
            shards,
            damaged: DashMap::new(),
            quarantine: DashMap::new(),
            snapshots: Mutex::new(Snapshots {
                next: state.next_snapshot,
                kept,
                config: state.snapshot_config,
            }),
            clock: Arc::new(SystemClock),
        })
    }

    /// The configuration of the latest snapshot, if any.
    pub fn snapshot_config(&self) -> Option<SnapshotConfig> {
        lock(&self.snapshots).config.clone()
    }

    fn merged(&self) -> Aggregate {
        self.merged_with(Aggregate::merge)
    }

    /// Every shard merged, ranges left out (and never copied).
    fn merged_summary(&self) -> Aggregate {
        self.merged_with(Aggregate::merge_summary)
    }

    fn merged_with(&self, merge: fn(&mut Aggregate, &Aggregate)) -> Aggregate {
        let mut all = Aggregate::default();
        let mut shards: Vec<u32> = self.shards.iter().map(|e| *e.key()).collect();
        shards.sort_unstable();
        for s in shards {
            if let Some(agg) = self.shards.get(&s) {
                merge(&mut all, &agg);
            }
        }
        all
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[async_trait]
impl StatsStore for MemoryStats {
    async fn stats(&self) -> Result<Stats> {
        Ok(self.merged().render())
    }

    async fn summary(&self) -> Result<StatsSummary> {
        Ok(self.merged_summary().render_summary())
    }

    async fn range_summary(&self, id: u64) -> Result<Option<RangeStats>> {
        let r = id / RANGE_SIZE;
        let mut all = Aggregate::default();
        for shard in self.shards.iter() {
            if let Some(range) = shard.ranges.get(&r) {
                let mut one = Aggregate::default();
                one.ranges.insert(r, range.clone());
                all.merge(&one);
            }
        }
        Ok(all.ranges.get(&r).map(render_range))
    }

    async fn replace(&self, shard: u32, delta: &StatsDelta) -> Result<()> {
        let mut agg = delta.agg.clone();
        if !delta.is_empty() {
            agg.updated = Some(self.clock.now_ms());
        }
        self.shards.insert(shard, agg);
        Ok(())
    }

    async fn damage(&self, shard: u32) -> Result<Vec<Damage>> {
        Ok(self
            .damaged
            .get(&shard)
            .map(|d| {
                d.keys()
                    .map(|(hash, field)| Damage {
                        shard,
                        hash: hash.clone(),
                        field: field.clone(),
                        detail: "a packed statistics value is corrupt".to_owned(),
                    })
                    .collect()
            })
            .unwrap_or_default())
    }

    async fn repair(&self, shard: u32, rebuilt: &StatsDelta, unreadable: u64) -> Result<Repaired> {
        let found = self.damage(shard).await?;
        let whole = rebuild_whole(&found, unreadable);
        if !whole && found.is_empty() {
            return Ok(Repaired {
                shard,
                quarantined: found,
                whole,
                unreadable,
            });
        }
        let now = self.clock.now_ms();
        if let Some((_, bad)) = self.damaged.remove(&shard) {
            let mut q = self.quarantine.entry(shard).or_default();
            for ((hash, field), bytes) in bad {
                q.insert(format!("{hash}:{field}@{now}"), bytes);
            }
        }
        if whole {
            self.replace(shard, rebuilt).await?;
        } else {
            let mut agg = self.shards.entry(shard).or_default();
            patch_in_place(&mut agg, &rebuilt.agg, &found);
            agg.updated = Some(now);
        }
        Ok(Repaired {
            shard,
            quarantined: found,
            whole,
            unreadable,
        })
    }

    async fn publish_snapshot(&self) -> Result<u64> {
        let mut stats = self.merged().render();
        crate::store::bound_snapshot_ranges(&mut stats);
        let timestamp_ms = self.clock.now_ms();
        let mut s = lock(&self.snapshots);
        s.next += 1;
        let version = s.next;
        s.config = Some(SnapshotConfig {
            version,
            timestamp_ms,
            count: stats.global_stats.total_completed,
        });
        s.kept.insert(
            version,
            Snapshot {
                version,
                timestamp_ms,
                stats,
            },
        );
        s.kept.retain(|&v, _| v + SNAPSHOTS_KEPT > version);
        Ok(version)
    }

    async fn latest_snapshot(&self) -> Result<Option<Snapshot>> {
        Ok(lock(&self.snapshots)
            .kept
            .last_key_value()
            .map(|(_, s)| s.clone()))
    }

    async fn snapshot(&self, version: u64) -> Result<Option<Snapshot>> {
        Ok(lock(&self.snapshots).kept.get(&version).cloned())
    }
}
