//! The cached plan registry. Plans are append-only and never change once written, so a
//! cached entry is right for ever; only a miss can mean the cache is stale.

use std::ops::RangeInclusive;
use std::sync::{Arc, RwLock};

use tranche_active_store::{ActiveStore, PlanEntry};

use crate::Result;

/// The plan entries, indexed both ways.
#[derive(Debug, Default)]
pub(crate) struct Plans {
    /// Entries by first pid (pid runs never overlap).
    by_pid: Vec<PlanEntry>,
    /// Indices into `by_pid`, by first row ID (ID ranges never overlap either, but
    /// their order need not follow the pids').
    by_id: Vec<usize>,
}

impl Plans {
    fn new(mut entries: Vec<PlanEntry>) -> Self {
        entries.sort_by_key(|e| e.plan.first_pid());
        let mut by_id: Vec<usize> = (0..entries.len()).collect();
        by_id.sort_by_key(|&i| entries[i].plan.min());
        Self {
            by_pid: entries,
            by_id,
        }
    }

    /// The row IDs of `pid`, if a plan has it.
    fn range_of(&self, pid: u64) -> Option<RangeInclusive<u64>> {
        let i = self.by_pid.partition_point(|e| e.plan.first_pid() <= pid);
        self.by_pid[..i].last()?.plan.range_of(pid)
    }

    /// The pid covering row ID `id` and its row IDs, if a plan covers `id`.
    fn locate(&self, id: u64) -> Option<(u64, RangeInclusive<u64>)> {
        let i = self
            .by_id
            .partition_point(|&i| self.by_pid[i].plan.min() <= id);
        let plan = &self.by_pid[*self.by_id[..i].last()?].plan;
        let pid = plan.pid_of(id)?;
        Some((pid, plan.range_of(pid)?))
    }
}

/// The plan registry, read once and again only when asked about something it lacks.
#[derive(Debug, Default)]
pub(crate) struct PlanCache {
    current: RwLock<Arc<Plans>>,
}

impl PlanCache {
    fn get(&self) -> Arc<Plans> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    async fn refresh(&self, active: &dyn ActiveStore) -> Result<Arc<Plans>> {
        let fresh = Arc::new(Plans::new(active.plans().await?));
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = fresh.clone();
        Ok(fresh)
    }

    /// Looks `f` up in the cache, and once more in a fresh copy on a miss.
    async fn lookup<T>(
        &self,
        active: &dyn ActiveStore,
        f: impl Fn(&Plans) -> Option<T>,
    ) -> Result<Option<T>> {
        if let Some(hit) = f(&self.get()) {
            return Ok(Some(hit));
        }
        Ok(f(&*self.refresh(active).await?))
    }

    /// The row IDs of `pid` if the cached plans have it (no round trip).
    pub(crate) fn cached_range(&self, pid: u64) -> Option<RangeInclusive<u64>> {
        self.get().range_of(pid)
    }

    /// The row IDs of `pid` from a fresh read of the plans, or `None` if no plan has it.
    pub(crate) async fn refresh_range(
        &self,
        active: &dyn ActiveStore,
        pid: u64,
    ) -> Result<Option<RangeInclusive<u64>>> {
        Ok(self.refresh(active).await?.range_of(pid))
    }

    /// The pid covering row ID `id` and its row IDs, or `None` if no plan covers `id`.
    pub(crate) async fn locate(
        &self,
        active: &dyn ActiveStore,
        id: u64,
    ) -> Result<Option<(u64, RangeInclusive<u64>)>> {
        self.lookup(active, |p| p.locate(id)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(first_pid: u64, min: u64, max: u64, size: u64) -> PlanEntry {
        PlanEntry {
            plan: tranche_codec::PlanGeometry::new(first_pid, min, max, size).unwrap(),
            explicit: false,
        }
    }

    #[test]
    fn lookups_both_ways_across_plans_out_of_id_order() {
        // Pids 1..=10 cover IDs 1001..=2000; pid 11 (explicit) covers 1..=500.
        let plans = Plans::new(vec![entry(11, 1, 500, 500), entry(1, 1001, 2000, 100)]);
        assert_eq!(plans.range_of(1), Some(1001..=1100));
        assert_eq!(plans.range_of(10), Some(1901..=2000));
        assert_eq!(plans.range_of(11), Some(1..=500));
        assert_eq!(plans.range_of(0), None);
        assert_eq!(plans.range_of(12), None);
        assert_eq!(plans.locate(1), Some((11, 1..=500)));
        assert_eq!(plans.locate(500), Some((11, 1..=500)));
        assert_eq!(plans.locate(501), None);
        assert_eq!(plans.locate(1000), None);
        assert_eq!(plans.locate(1001), Some((1, 1001..=1100)));
        assert_eq!(plans.locate(2000), Some((10, 1901..=2000)));
        assert_eq!(plans.locate(2001), None);
        assert_eq!(Plans::default().locate(5), None);
        assert_eq!(Plans::default().range_of(5), None);
    }
}
