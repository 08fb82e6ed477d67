//! Export and import: the whole archive as a dump, and a dump into an empty archive.

use super::*;

#[async_trait]
impl Export for MemoryArchive {
    async fn export(&self, created_ms: u64) -> Result<Dump> {
        let dict = lock(&self.dict).clone();
        let mut batches: BTreeMap<u64, DumpBatch> = BTreeMap::new();
        let mut add = |batch: u64, tier: Tier, records: Vec<CompletedRecord>| {
            let b = batches.entry(batch).or_insert_with(|| DumpBatch {
                id: batch,
                tier,
                records: Vec::new(),
            });
            b.tier = b.tier.max(tier);
            b.records.extend(records);
        };
        for shard in &self.shards {
            let s = lock(shard);
            for r in s.simple.values() {
                add(self.schema.batch_of(r.pid), Tier::Simple, vec![r.clone()]);
            }
            for (&batch, (_, recs)) in &s.open {
                add(batch, Tier::Compressed, recs.values().cloned().collect());
            }
            for (&batch, sealed) in &s.sealed {
                if sealed.expires.is_some_and(|e| e <= Instant::now()) {
                    continue;
                }
                let decoded =
                    decode_binary_v2(&sealed.bytes, &dict).map_err(|e| Error::Corrupt {
                        key: format!("batch {batch}"),
                        detail: e.to_string(),
                    })?;
                add(batch, sealed.tier, decoded.records);
            }
        }
        let mut batches: Vec<DumpBatch> = batches.into_values().collect();
        let mut dict = dict;
        for b in &mut batches {
            b.records.sort_unstable_by_key(|r| r.pid);
            // Simple-tier records never needed the dictionary; the dump's batches do.
            for r in &b.records {
                dict.insert(&r.worker)?;
            }
        }
        Ok(Dump::new(&self.schema, created_ms, dict, batches))
    }
}

#[async_trait]
impl Import for MemoryArchive {
    async fn import(&self, dump: &Dump) -> Result<u64> {
        if self.archived_count() != 0 {
            return Err(Error::InvalidArgument(
                "import needs an empty archive".into(),
            ));
        }
        let mut restored = 0;
        for b in &dump.batches {
            let shard = self.schema.shard_of_batch(b.id);
            let (written, _) = self.archive_records(shard, b.records.clone(), b.tier)?;
            restored += written as u64;
        }
        self.compact_tiers(false)?;
        Ok(restored)
    }
}
