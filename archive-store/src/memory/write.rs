//! The write path: records into a shard's tiers, counted in the statistics under
//! the shard's lock.

use super::*;

impl MemoryArchive {
    pub(super) fn archive_records(
        &self,
        shard: u32,
        records: Vec<CompletedRecord>,
        tier: Tier,
    ) -> Result<(usize, usize)> {
        // Lock order everywhere: the dictionary, then shards in order.
        let mut dict = lock(&self.dict);
        let mut s = lock(&self.shards[shard as usize]);
        self.archive_locked(shard, &mut s, &mut dict, records, tier)
    }

    /// Archives `records` into the locked shard `s` (number `shard`).
    pub(super) fn archive_locked(
        &self,
        shard: u32,
        s: &mut Shard,
        dict: &mut WorkerDict,
        records: Vec<CompletedRecord>,
        tier: Tier,
    ) -> Result<(usize, usize)> {
        let (mut written, mut dups) = (0, 0);
        let batch_size = self.schema.batch_size();
        // A shard whose statistics refuse deltas must refuse before anything changes.
        self.stats.check_whole(shard)?;
        let mut delta = StatsDelta::default();
        for record in records {
            if !s.archived.insert(record.pid) {
                dups += 1;
                continue;
            }
            delta.add(&record);
            written += 1;
            s.count += 1;
            if tier == Tier::Simple {
                s.simple.insert(record.pid, record);
                continue;
            }
            dict.insert(&record.worker)?;
            let batch = self.schema.batch_of(record.pid);
            let open = s
                .open
                .entry(batch)
                .or_insert_with(|| (tier, BTreeMap::new()));
            open.0 = open.0.max(tier);
            open.1.insert(record.pid, record);
            let partial = s.sealed.get(&batch).map_or(0, |b| b.count);
            let open_len = s.open.get(&batch).map_or(0, |o| o.1.len() as u64);
            if open_len + partial >= self.config.planned(batch, batch_size) {
                self.seal_locked(s, dict, batch, tier)?;
            }
        }
        // Still under the shard lock: the statistics change with the archive. Checked
        // whole above, under the same lock.
        self.stats.apply(shard, &delta)?;
        Ok((written, dups))
    }
}
