//! Read-only queries: counts, records, snapshots and plans.

use super::*;

#[async_trait]
impl ActiveQuery for MemoryActiveStore {
    async fn get(&self, pid: u64) -> Result<Option<Partition>> {
        let shard_no = self.layout.shard_of(pid);
        let shard = self.shard(pid);
        if let Some(p) = shard.active.get(&pid) {
            return Ok(Some(p.clone()));
        }
        let unissued = shard
            .cursors
            .iter()
            .any(|&(_, last, at)| pid <= last && self.layout.align(at, shard_no) <= pid);
        drop(shard);
        if unissued {
            let registry = lock(&self.registry);
            if let Some((min, max)) = registry.range_of(pid) {
                return Ok(Some(Partition::pending(pid, min, max, 0)));
            }
        }
        Ok(None)
    }

    async fn all_active(&self) -> Result<ActiveSnapshot> {
        let mut snapshot = ActiveSnapshot::default();
        for (shard_no, shard) in self.shards.iter().enumerate() {
            let shard = lock(shard);
            snapshot.partitions.extend(shard.active.values().cloned());
            for &(_, last, at) in &shard.cursors {
                let at = self.layout.align(at, shard_no as u32);
                let count = self.layout.count_in_shard(at, last, shard_no as u32);
                if count > 0 {
                    snapshot.unissued.push(Unissued {
                        shard: shard_no as u32,
                        next_pid: at,
                        last_pid: last,
                        count,
                    });
                }
            }
        }
        snapshot.partitions.sort_by_key(|p| p.pid);
        Ok(snapshot)
    }

    async fn counts(&self) -> Result<StatusCounts> {
        // Counted in place under each shard's lock, nothing cloned: a few microseconds
        // per thousand partitions.
        let mut counts = StatusCounts::default();
        for (shard_no, shard) in self.shards.iter().enumerate() {
            let shard = lock(shard);
            for p in shard.active.values() {
                counts.add(p.status);
            }
            for &(_, last, at) in &shard.cursors {
                let at = self.layout.align(at, shard_no as u32);
                counts.unissued += self.layout.count_in_shard(at, last, shard_no as u32);
            }
        }
        Ok(counts)
    }
}
