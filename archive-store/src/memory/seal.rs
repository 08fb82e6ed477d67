//! Sealing: open batches into binary v2 bytes, and whole segments expiring together.

use super::*;

impl MemoryArchive {
    /// Seals open batch `batch` of the locked shard `s`, merging an earlier partial seal.
    pub(super) fn seal_locked(
        &self,
        s: &mut Shard,
        dict: &WorkerDict,
        batch: u64,
        tier: Tier,
    ) -> Result<bool> {
        let Some((_, recs)) = s.open.remove(&batch) else {
            return Ok(false);
        };
        let mut records: BTreeMap<u64, CompletedRecord> = BTreeMap::new();
        if let Some(old) = s.sealed.get(&batch) {
            match decode_binary_v2(&old.bytes, dict) {
                Ok(b) => records.extend(b.records.into_iter().map(|r| (r.pid, r))),
                Err(err) => {
                    // Sealing over it would lose it: leave the batch open.
                    s.open.insert(batch, (tier, recs));
                    return Err(Error::Corrupt {
                        key: format!("batch {batch}"),
                        detail: err.to_string(),
                    });
                }
            }
        }
        records.extend(recs);
        let records: Vec<CompletedRecord> = records.into_values().collect();
        let options = BinaryV2Options::new(self.schema.batch_size())?;
        let bytes = encode_binary_v2(batch, &records, dict, &options)?;
        let count = records.len() as u64;
        let expires = (tier == Tier::Summary).then(|| Instant::now() + self.config.summary_ttl);
        s.sealed.insert(
            batch,
            Sealed {
                bytes,
                count,
                tier,
                expires,
            },
        );
        if count >= self.config.planned(batch, self.schema.batch_size()) {
            self.join_locked(s, batch);
        }
        Ok(true)
    }

    /// What joining `batch`'s segment does on Redis, where the segment's batches then
    /// share one key: once every planned batch of it is sealed whole, they expire
    /// together, when the last of them would have; none does if one of them has no
    /// expiry (sealed under the compressed tier), and all then answer compressed.
    fn join_locked(&self, s: &mut Shard, batch: u64) {
        let size = self.schema.batch_size();
        let (seg, _) = SegmentRef::of(&self.schema, batch);
        let members = seg.batches(&self.schema);
        let complete = members.iter().all(|b| {
            let planned = self.config.planned(*b, size);
            planned == 0 || s.sealed.get(b).is_some_and(|x| x.count >= planned)
        });
        if !complete {
            return;
        }
        let mut expires = Some(None);
        for b in &members {
            if let Some(x) = s.sealed.get(b) {
                expires = match (expires, x.expires) {
                    (Some(e), Some(x)) => Some(Some(e.map_or(x, |e: Instant| e.max(x)))),
                    _ => None,
                };
            }
        }
        let expires = expires.flatten();
        for b in &members {
            if let Some(x) = s.sealed.get_mut(b) {
                x.expires = expires;
                x.tier = if expires.is_some() {
                    Tier::Summary
                } else {
                    Tier::Compressed
                };
            }
        }
    }
}
