//! Compaction: open batches sealed, older records moved to the current tier.

use super::*;

#[async_trait]
impl Compaction for MemoryArchive {
    async fn compact(&self) -> Result<usize> {
        self.compact_tiers(true)
    }
}

impl MemoryArchive {
    /// Seals the open batches and, with `move_tiers`, first moves older records to the
    /// current tier (simple records into batches, summary TTLs on sealed batches).
    pub(super) fn compact_tiers(&self, move_tiers: bool) -> Result<usize> {
        let current = self.config.tier_for(self.archived_count());
        let tier = current.max(Tier::Compressed);
        let mut dict = lock(&self.dict);
        let mut sealed = 0;
        for shard in &self.shards {
            let mut s = lock(shard);
            if move_tiers && current != Tier::Simple {
                // Older simple-tier records move to the current tier.
                for (pid, r) in std::mem::take(&mut s.simple) {
                    dict.insert(&r.worker)?;
                    let batch = self.schema.batch_of(pid);
                    s.open
                        .entry(batch)
                        .or_insert_with(|| (tier, BTreeMap::new()))
                        .1
                        .insert(pid, r);
                }
            }
            if move_tiers && current == Tier::Summary {
                let expires = Instant::now() + self.config.summary_ttl;
                for b in s.sealed.values_mut().filter(|b| b.expires.is_none()) {
                    b.expires = Some(expires);
                    b.tier = Tier::Summary;
                }
            }
            let batches: Vec<u64> = s.open.keys().copied().collect();
            for batch in batches {
                sealed += usize::from(self.seal_locked(&mut s, &dict, batch, tier)?);
            }
        }
        Ok(sealed)
    }
}
