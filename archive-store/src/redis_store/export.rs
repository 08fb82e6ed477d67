//! The whole archive out and back in on Redis: every batch of every shard in id order for
//! a dump, and a dump restored into an empty namespace.

use super::*;

impl<C> RedisArchive<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// The batches of `shard` holding at least one archived pid, from the archived
    /// bitmap (the one complete index of what the archive holds).
    pub(super) async fn shard_batches(&self, shard: u32) -> Result<Vec<u64>> {
        Ok(self
            .shard_fill(shard)
            .await?
            .into_iter()
            .map(|(b, _)| b)
            .collect())
    }

    /// The batches of `shard` holding at least one archived pid, in id order, with how
    /// many archived pids each holds.
    pub(super) async fn shard_fill(&self, shard: u32) -> Result<Vec<(u64, u64)>> {
        let key = &self.keys[shard as usize].archived;
        let bits: Option<Vec<u8>> = retry(&self.conn, |mut c| async move {
            redis::cmd("GET").arg(key).query_async(&mut c).await
        })
        .await?;
        let size = self.schema.batch_size();
        let shards = u64::from(self.schema.num_shards());
        let mut out: Vec<(u64, u64)> = Vec::new();
        for (i, &byte) in bits.unwrap_or_default().iter().enumerate() {
            if byte == 0 {
                continue;
            }
            for bit in 0..8 {
                if byte & (0x80 >> bit) != 0 {
                    let offset = i as u64 * 8 + bit;
                    let batch = (offset / size) * shards + u64::from(shard);
                    match out.last_mut() {
                        Some((b, n)) if *b == batch => *n += 1,
                        _ => out.push((batch, 1)),
                    }
                }
            }
        }
        Ok(out)
    }

    /// Joins every segment of `shard` whose planned pids are all archived and which is
    /// not joined yet: those a crash left between a seal and its join, and those whose
    /// last batch compaction just sealed. `fill` is [`Self::shard_fill`]'s answer.
    pub(super) async fn join_complete(&self, fill: &[(u64, u64)]) -> Result<usize> {
        let mut whole: Vec<u64> = Vec::new();
        let mut by_segment: Vec<(SegmentRef, Vec<(u64, u64)>)> = Vec::new();
        for &(b, n) in fill {
            let (seg, _) = SegmentRef::of(&self.schema, b);
            match by_segment.last_mut() {
                Some((s, v)) if *s == seg => v.push((b, n)),
                _ => by_segment.push((seg, vec![(b, n)])),
            }
        }
        for (seg, batches) in by_segment {
            let complete = seg.batches(&self.schema).iter().all(|&b| {
                let planned = self.planned(b);
                planned == 0 || batches.iter().any(|&(id, n)| id == b && n >= planned)
            });
            if complete {
                whole.push(seg.batches(&self.schema)[0]);
            }
        }
        let mut joined = 0;
        for chunk in whole.chunks(256) {
            joined += self.join_segments(chunk.to_vec()).await?;
        }
        Ok(joined)
    }

    /// Every record of `batch` still held, and the highest tier they live in; an error
    /// names the first stored value of it that does not decode (export: a dump must be
    /// complete, or not be). `segment` caches the last segment read (with its PTTL):
    /// export reads a shard's batches in id order, so each segment is read once.
    pub(super) async fn batch_records(
        &self,
        batch: u64,
        segment: &mut Option<(SegmentRef, SegmentRead)>,
    ) -> Result<Option<DumpBatch>> {
        let (held, damage) = self.batch_read(batch, segment).await?;
        match damage.into_iter().next() {
            None => Ok(held),
            Some(d) => Err(Error::Corrupt {
                key: d.location(),
                detail: d.detail,
            }),
        }
    }

    /// Every record of `batch` that decodes, the highest tier they live in, and every
    /// stored value of the batch that does not (a record of the simple tier or of its
    /// open hash, its sealed string, or its slot of a segment), each on its own: one
    /// damaged value never hides the others. `segment` as for [`Self::batch_records`].
    pub(super) async fn batch_read(
        &self,
        batch: u64,
        segment: &mut Option<(SegmentRef, SegmentRead)>,
    ) -> Result<(Option<DumpBatch>, Vec<ArchiveDamage>)> {
        let shard = self.schema.shard_of_batch(batch);
        let keys = &self.keys[shard as usize];
        let first = batch * self.schema.batch_size();
        let pids: Vec<u64> = (first..first + self.schema.batch_size()).collect();
        let open_key = open_batch_key(&self.schema, batch);
        let sealed_key = self.schema.completed_batch(batch);
        let (seg, slot) = SegmentRef::of(&self.schema, batch);
        let seg_key = seg.key(&self.schema);
        let cached = segment.as_ref().is_some_and(|(s, _)| *s == seg);
        let ((simple, open, sealed, pttl), joined): (BatchReply, Option<SegmentRead>) =
            retry(&self.conn, |mut c| {
                let mut pipe = redis::pipe();
                pipe.cmd("HMGET").arg(&keys.completed).arg(&pids);
                pipe.cmd("HGETALL").arg(&open_key);
                pipe.cmd("GET").arg(&sealed_key);
                pipe.cmd("PTTL").arg(&sealed_key);
                if !cached {
                    pipe.cmd("GET").arg(&seg_key);
                    pipe.cmd("PTTL").arg(&seg_key);
                }
                async move {
                    if cached {
                        let batch: BatchReply = pipe.query_async(&mut c).await?;
                        Ok((batch, None))
                    } else {
                        let (a, b, c2, d, e, f) = pipe.query_async(&mut c).await?;
                        Ok(((a, b, c2, d), Some((e, f))))
                    }
                }
            })
            .await?;
        if let Some(read) = joined {
            *segment = Some((seg, read));
        }
        let mut damage = Vec::new();
        let mut bad = |key: &str, field: Option<String>, detail: String| {
            damage.push(ArchiveDamage {
                shard,
                key: key.to_owned(),
                field,
                batch,
                detail,
            })
        };
        let mut tier = Tier::Simple;
        let mut records = Vec::new();
        for (pid, json) in pids.iter().zip(simple) {
            let Some(json) = json else { continue };
            match decode_stored_json(&json) {
                Ok(r) => records.push(r),
                Err(e) => bad(&keys.completed, Some(pid.to_string()), e),
            }
        }
        for (field, json) in &open {
            tier = Tier::Compressed;
            match decode_stored_json(json) {
                Ok(r) => records.push(r),
                Err(e) => bad(
                    &open_key,
                    Some(String::from_utf8_lossy(field).into_owned()),
                    e,
                ),
            }
        }
        if let Some(bytes) = sealed {
            tier = if pttl >= 0 {
                Tier::Summary
            } else {
                Tier::Compressed
            };
            let cached = self.dict.read().unwrap_or_else(|p| p.into_inner()).clone();
            let decoded = match decode_binary_v2(&bytes, &cached) {
                Err(tranche_codec::Error::UnknownWorkerIndex(_)) => {
                    decode_binary_v2(&bytes, &*self.load_dict().await?)
                }
                other => other,
            };
            match decoded {
                Ok(d) => records.extend(d.records),
                Err(e) => bad(&sealed_key, None, e.to_string()),
            }
        } else if let Some((_, (Some(seg_bytes), seg_ttl))) = segment.as_ref() {
            match segment::slot_of(seg_bytes, slot, batch) {
                Err(detail) => bad(&seg_key, None, detail),
                Ok(None) => {}
                Ok(Some(blob)) => {
                    tier = if *seg_ttl >= 0 {
                        Tier::Summary
                    } else {
                        Tier::Compressed
                    };
                    let cached = self.dict.read().unwrap_or_else(|p| p.into_inner()).clone();
                    let decoded = match decode_binary_v2(&blob, &cached) {
                        Err(tranche_codec::Error::UnknownWorkerIndex(_)) => {
                            decode_binary_v2(&blob, &*self.load_dict().await?)
                        }
                        other => other,
                    };
                    match decoded {
                        Ok(d) if d.batch_id != batch => bad(
                            &seg_key,
                            None,
                            format!("slot of batch {batch} holds batch {}", d.batch_id),
                        ),
                        Ok(d) => records.extend(d.records),
                        Err(e) => bad(&seg_key, None, format!("batch {batch}: {e}")),
                    }
                }
            }
        }
        if records.is_empty() {
            return Ok((None, damage));
        }
        records.sort_unstable_by_key(|r| r.pid);
        Ok((
            Some(DumpBatch {
                id: batch,
                tier,
                records,
            }),
            damage,
        ))
    }
}

/// A stored seed-JSON record (the simple tier, an open batch), whatever its bytes.
pub(super) fn decode_stored_json(bytes: &[u8]) -> Result<CompletedRecord, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))?;
    decode_json(text).map_err(|e| e.to_string())
}

#[async_trait]
impl<C> Export for RedisArchive<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn export(&self, created_ms: u64) -> Result<Dump> {
        let mut batches = Vec::new();
        for shard in self.schema.shards() {
            // A shard's batches in id order: each segment is read once.
            let mut segment = None;
            for id in self.shard_batches(shard).await? {
                batches.extend(self.batch_records(id, &mut segment).await?);
            }
        }
        batches.sort_unstable_by_key(|b: &DumpBatch| b.id);
        let dict = self.load_dict().await?;
        // Simple-tier and open records are JSON: their workers may not be in the
        // dictionary yet, and the dump's batches are binary v2.
        let workers: Vec<&str> = batches
            .iter()
            .flat_map(|b| &b.records)
            .map(|r| &*r.worker)
            .collect();
        let dict = if workers.iter().all(|w| dict.index_of(w).is_some()) {
            dict
        } else {
            let mut d = (*dict).clone();
            for w in workers {
                d.insert(w)?;
            }
            Arc::new(d)
        };
        Ok(Dump::new(
            &self.schema,
            created_ms,
            (*dict).clone(),
            batches,
        ))
    }
}

#[async_trait]
impl<C> Import for RedisArchive<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn import(&self, dump: &Dump) -> Result<u64> {
        if self.archived_count().await? != 0 {
            return Err(Error::InvalidArgument(
                "import needs an empty archive".into(),
            ));
        }
        let mut restored = 0;
        for b in &dump.batches {
            let shard = self.schema.shard_of_batch(b.id);
            for chunk in b.records.chunks(MAX_SCRIPT_RECORDS) {
                let items = chunk
                    .iter()
                    .map(|r| Item {
                        record: r.clone(),
                        json: None,
                    })
                    .collect();
                let (written, _) = self.write(shard, items, b.tier).await?;
                restored += written as u64;
            }
        }
        self.seal_open_batches().await?;
        Ok(restored)
    }
}
