//! Queries: one pid's answer, pages of them, decode failures and stalls.

use super::*;

impl MemoryArchive {
    fn lookup(&self, pid: u64) -> Lookup {
        let shard_no = self.schema.shard_of(pid) as usize;
        let mut shard = lock(&self.shards[shard_no]);
        if !shard.archived.contains(&pid) {
            shard.receive(&self.inboxes[shard_no]);
            return if shard.waiting.contains_key(&pid) {
                Lookup::Archiving
            } else {
                Lookup::Unknown
            };
        }
        if let Some(r) = shard.simple.get(&pid) {
            return Lookup::Archived {
                record: r.clone(),
                tier: Tier::Simple,
            };
        }
        let batch = self.schema.batch_of(pid);
        if let Some((_, recs)) = shard.open.get(&batch)
            && let Some(r) = recs.get(&pid)
        {
            return Lookup::Archived {
                record: r.clone(),
                tier: Tier::Compressed,
            };
        }
        let Some(sealed) = shard.sealed.get(&batch) else {
            return Lookup::Expired;
        };
        if sealed.expires.is_some_and(|e| e <= Instant::now()) {
            return Lookup::Expired;
        }
        let (bytes, tier) = (sealed.bytes.clone(), sealed.tier);
        // The dictionary is locked before a shard everywhere else: let the shard go
        // first. The dictionary only grows, so it still decodes these bytes.
        drop(shard);
        let dict = lock(&self.dict);
        match decode_binary_v2(&bytes, &dict) {
            Ok(b) => match b.records.into_iter().find(|r| r.pid == pid) {
                Some(record) => Lookup::Archived { record, tier },
                None => self.failed(format!("batch {batch} lacks pid {pid}")),
            },
            Err(err) => self.failed(format!("batch {batch}: {err}")),
        }
    }

    fn failed(&self, detail: String) -> Lookup {
        *lock(&self.decode_failures) += 1;
        Lookup::Undecodable { detail }
    }
}

#[async_trait]
impl ArchiveQuery for MemoryArchive {
    async fn get(&self, pid: u64) -> Result<Lookup> {
        Ok(self.lookup(pid))
    }

    async fn range(&self, pids: RangeInclusive<u64>, limit: usize) -> Result<RangePage> {
        page_by_lookup(pids, limit, |pid| std::future::ready(Ok(self.lookup(pid)))).await
    }

    async fn decode_failures(&self) -> Result<u64> {
        Ok(*lock(&self.decode_failures))
    }

    async fn stalled(&self) -> Result<Vec<Stall>> {
        Ok(lock(&self.stalls).values().cloned().collect())
    }
}
