//! Sealing: open batches into binary v2 strings (whole or partial), and the segments
//! of batches sealed whole joined into one string each (`join.lua`).

use super::*;

/// A hash field and its value, as bytes (a damaged value must not fail the read).
type RawField = (Vec<u8>, Vec<u8>);

/// What [`RedisArchive::seal`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Sealing {
    /// The batch had no open hash (sealed, or never written).
    Nothing,
    /// Sealed, but not every planned pid of it is in yet.
    Partial,
    /// Sealed whole: its segment may be complete.
    Full,
}

impl<C> RedisArchive<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// The runs marked `full`, sealed as binary v2: batch id and bytes.
    pub(super) async fn seal_runs(
        &self,
        items: &[Item<'_>],
        runs: &[(u64, std::ops::Range<usize>)],
        full: &[bool],
    ) -> Result<Vec<(u64, Vec<u8>)>> {
        if !full.contains(&true) {
            return Ok(Vec::new());
        }
        let mut workers: Vec<&str> = Vec::new();
        for ((_, range), _) in runs.iter().zip(full).filter(|(_, f)| **f) {
            for item in &items[range.clone()] {
                if !workers.contains(&&*item.record.worker) {
                    workers.push(&item.record.worker);
                }
            }
        }
        let dict = self.ensure_workers(&workers).await?;
        let options = self.batch_options().await?;
        let mut out = Vec::new();
        let mut recs = Vec::new();
        for ((b, range), _) in runs.iter().zip(full).filter(|(_, f)| **f) {
            recs.clear();
            recs.extend(items[range.clone()].iter().map(|i| i.record.clone()));
            out.push((*b, encode_binary_v2(*b, &recs, &dict, &options)?));
        }
        Ok(out)
    }
    /// How many pids batch `batch` can hold: pids below `first_pid` are never planned.
    pub(super) fn planned(&self, batch: u64) -> u64 {
        self.config.planned(batch, self.schema.batch_size())
    }

    /// Seals open batch `batch`: its records (and those of an earlier partial seal) as
    /// one binary v2 string, with the summary TTL when `tier` is the summary tier.
    /// Says whether there was anything to seal, and whether the batch is now whole.
    pub(super) async fn seal(&self, batch: u64, tier: Tier) -> Result<Sealing> {
        let shard = self.schema.shard_of_batch(batch);
        let keys = &self.keys[shard as usize];
        let open_key = open_batch_key(&self.schema, batch);
        let sealed_key = self.schema.completed_batch(batch);
        let ttl = self.ttl_ms(tier);
        for _ in 0..10 {
            let (fields, old): (Vec<RawField>, Option<Vec<u8>>) = retry(&self.conn, |mut c| {
                let mut pipe = redis::pipe();
                pipe.cmd("HGETALL").arg(&open_key);
                pipe.cmd("GET").arg(&sealed_key);
                async move { pipe.query_async(&mut c).await }
            })
            .await?;
            if fields.is_empty() {
                let id = batch;
                let _: i64 = retry(&self.conn, |mut c| async move {
                    redis::cmd("SREM")
                        .arg(&keys.open)
                        .arg(id)
                        .query_async(&mut c)
                        .await
                })
                .await?;
                return Ok(Sealing::Nothing);
            }
            // A damaged record keeps the batch open (readable but for it) until
            // `check --repair` sets it aside: recorded, never the pass's failure.
            let mut records = Vec::with_capacity(fields.len());
            let mut damage = Vec::new();
            for (pid, json) in &fields {
                match super::export::decode_stored_json(json) {
                    Ok(r) => records.push(r),
                    Err(detail) => damage.push(ArchiveDamage {
                        shard,
                        key: open_key.clone(),
                        field: Some(String::from_utf8_lossy(pid).into_owned()),
                        batch,
                        detail,
                    }),
                }
            }
            if !damage.is_empty() {
                for d in &damage {
                    tracing::warn!(damage = %d, "open batch not sealed: a record of it is damaged");
                }
                self.record_damage(&damage).await?;
                return Ok(Sealing::Nothing);
            }
            let workers: Vec<&str> = records.iter().map(|r| &*r.worker).collect();
            let dict = self.ensure_workers(&workers).await?;
            let old = old.unwrap_or_default();
            if !old.is_empty() {
                // An earlier seal of a partial batch (compaction): merge it in. If it no
                // longer decodes, sealing would lose it: leave the batch open.
                let earlier = match decode_binary_v2(&old, &dict) {
                    Ok(earlier) => earlier,
                    Err(e) => {
                        let d = ArchiveDamage {
                            shard,
                            key: sealed_key.clone(),
                            field: None,
                            batch,
                            detail: e.to_string(),
                        };
                        tracing::warn!(damage = %d, "open batch not sealed: its earlier seal is damaged");
                        self.record_damage(&[d]).await?;
                        return Ok(Sealing::Nothing);
                    }
                };
                let fresh: HashSet<u64> = records.iter().map(|r| r.pid).collect();
                records.extend(
                    earlier
                        .records
                        .into_iter()
                        .filter(|r| !fresh.contains(&r.pid)),
                );
            }
            let options = self.batch_options().await?;
            let bytes = encode_binary_v2(batch, &records, &dict, &options)?;
            let mut inv = SEAL.prepare_invoke();
            inv.key(&open_key)
                .key(&sealed_key)
                .key(&keys.open)
                .key(&keys.counters)
                .arg(fields.len())
                .arg(&old)
                .arg(&bytes)
                .arg(ttl)
                .arg(batch)
                .arg(records.len())
                .arg(self.planned(batch));
            let done: i64 = retry(&self.conn, |mut c| {
                let inv = &inv;
                async move { inv.invoke_async(&mut c).await }
            })
            .await?;
            if done == 1 {
                return Ok(if records.len() as u64 >= self.planned(batch) {
                    Sealing::Full
                } else {
                    Sealing::Partial
                });
            }
        }
        tracing::debug!(batch, "batch kept changing while sealing; left open");
        Ok(Sealing::Nothing)
    }

    /// Joins the segments of `batches` (sealed whole) whose every planned batch is
    /// sealed whole; the calls go out together. Returns how many were joined.
    pub(super) async fn join_segments(&self, batches: Vec<u64>) -> Result<usize> {
        let mut segments: Vec<SegmentRef> = batches
            .into_iter()
            .map(|b| SegmentRef::of(&self.schema, b).0)
            .collect();
        segments.sort_unstable();
        segments.dedup();
        let joined = try_join_all(segments.iter().map(|s| self.join(*s))).await?;
        Ok(joined.into_iter().filter(|j| *j).count())
    }

    /// Joins segment `seg` if every planned batch of it is sealed whole (`join.lua`).
    pub(super) async fn join(&self, seg: SegmentRef) -> Result<bool> {
        let keys = &self.keys[seg.shard as usize];
        let batches = seg.batches(&self.schema);
        let layout = match self.write_format().await? {
            crate::ArchiveFormat::V1 => 1u8,
            _ => 2,
        };
        let mut inv = JOIN.prepare_invoke();
        inv.key(&keys.counters)
            .key(seg.key(&self.schema))
            .arg(SEGMENT_BATCHES);
        for &b in &batches {
            inv.key(self.schema.completed_batch(b)).arg(b);
        }
        for &b in &batches {
            inv.arg(u8::from(self.planned(b) > 0));
        }
        inv.arg(layout).arg(self.schema.batch_size());
        let joined: i64 = retry(&self.conn, |mut c| {
            let inv = &inv;
            async move { inv.invoke_async(&mut c).await }
        })
        .await?;
        Ok(joined == 1)
    }

    pub(super) async fn seal_open_batches(&self) -> Result<usize> {
        let tier = self.config.tier_for(self.archived_count().await?);
        let mut sealed = 0;
        for k in self.keys.iter() {
            let key = &k.open;
            let ids: Vec<u64> = retry(&self.conn, |mut c| async move {
                redis::cmd("SMEMBERS").arg(key).query_async(&mut c).await
            })
            .await?;
            let mut whole = Vec::new();
            for batch in ids {
                match self.seal(batch, tier.max(Tier::Compressed)).await? {
                    Sealing::Nothing => {}
                    Sealing::Partial => sealed += 1,
                    Sealing::Full => {
                        sealed += 1;
                        whole.push(batch);
                    }
                }
            }
            self.join_segments(whole).await?;
        }
        Ok(sealed)
    }
}
