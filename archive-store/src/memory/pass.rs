//! The archive pass: inboxes into the archive, shard by shard, stalling a shard whose
//! statistics refuse deltas; and the statistics repair.

use super::*;

#[async_trait]
impl Archiver for MemoryArchive {
    async fn archive_once(&self) -> Result<ArchivePass> {
        let mut pass = ArchivePass::default();
        let tier = self.config.tier_for(self.archived_count());
        for shard in self.schema.shards() {
            let mut dict = lock(&self.dict);
            let mut s = lock(&self.shards[shard as usize]);
            s.receive(&self.inboxes[shard as usize]);
            // A shard whose statistics refuse deltas keeps its records received,
            // unarchived, until it is repaired; the others go on.
            if let Err(err) = self.stats.check_whole(shard) {
                pass.stalled += s.received.len();
                self.stall(shard, &err.into());
                continue;
            }
            if lock(&self.stalls).remove(&shard).is_some() {
                tracing::info!(shard, "archive of the shard resumed");
            }
            let records = s.take_received(self.config.batch);
            pass.entries += records.len();
            // A record of another shard would take another pid's place: drop it loudly.
            let (records, misrouted): (Vec<_>, Vec<_>) = records
                .into_iter()
                .partition(|r| self.schema.shard_of(r.pid) == shard);
            for r in &misrouted {
                tracing::warn!(
                    pid = r.pid,
                    shard,
                    "record in another shard's inbox dropped"
                );
            }
            pass.malformed += misrouted.len();
            let (written, dups) = self.archive_locked(shard, &mut s, &mut dict, records, tier)?;
            pass.archived += written;
            pass.duplicates += dups;
        }
        Ok(pass)
    }

    fn idle_wait(&self) -> Duration {
        self.config.block
    }

    async fn repair_stats(&self, shard: u32) -> Result<tranche_stats::Repaired> {
        if shard >= self.schema.num_shards() {
            return Err(Error::InvalidArgument(format!(
                "shard {shard} does not exist: the namespace has {} shards",
                self.schema.num_shards()
            )));
        }
        let mut delta = StatsDelta::default();
        let mut unreadable = 0u64;
        {
            let dict = lock(&self.dict).clone();
            let s = lock(&self.shards[shard as usize]);
            let mut held = 0u64;
            for r in s.simple.values() {
                delta.add(r);
                held += 1;
            }
            for (_, recs) in s.open.values() {
                for r in recs.values() {
                    delta.add(r);
                    held += 1;
                }
            }
            for sealed in s.sealed.values() {
                if sealed.expires.is_some_and(|e| e <= Instant::now()) {
                    continue;
                }
                if let Ok(b) = decode_binary_v2(&sealed.bytes, &dict) {
                    for r in &b.records {
                        delta.add(r);
                        held += 1;
                    }
                }
            }
            unreadable += (s.archived.len() as u64).saturating_sub(held);
        }
        Ok(self.stats.repair(shard, &delta, unreadable).await?)
    }
}

impl MemoryArchive {
    /// Records shard `shard` as stalled by `err` (the first time only: `since` stays).
    fn stall(&self, shard: u32, err: &Error) {
        let mut stalls = lock(&self.stalls);
        if stalls.contains_key(&shard) {
            return;
        }
        let reason = stall_reason(err);
        tracing::warn!(shard, %reason, "archive of the shard stalled; its records stay in the inbox");
        stalls.insert(
            shard,
            Stall {
                shard,
                since_ms: self.clock.now_ms(),
                reason,
            },
        );
    }
}
