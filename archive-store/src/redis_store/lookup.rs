//! Answering for one pid on Redis: `get.lua` reads its batch key and segment together,
//! sealed batches are decoded with the worker dictionary, and what does not decode is
//! an answer that is counted.

use super::*;
use crate::model::DeadLetter;

impl<C> RedisArchive<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    pub(super) async fn load_dict(&self) -> Result<Arc<WorkerDict>> {
        let key = &self.dict_key;
        let bytes: Option<Vec<u8>> = retry(&self.conn, |mut c| async move {
            redis::cmd("GET").arg(key).query_async(&mut c).await
        })
        .await?;
        let dict = match bytes {
            Some(b) => WorkerDict::from_bytes(&b)?,
            None => WorkerDict::new(),
        };
        let dict = Arc::new(dict);
        *self.dict.write().unwrap_or_else(|p| p.into_inner()) = dict.clone();
        Ok(dict)
    }

    pub(super) async fn decode_sealed(
        &self,
        batch: u64,
        bytes: &[u8],
        pid: u64,
    ) -> Result<Option<CompletedRecord>, String> {
        let cached = self.dict.read().unwrap_or_else(|p| p.into_inner()).clone();
        let decoded = match decode_binary_v2(bytes, &cached) {
            Err(tranche_codec::Error::UnknownWorkerIndex(_)) => {
                let dict = self.load_dict().await.map_err(|e| e.to_string())?;
                decode_binary_v2(bytes, &dict)
            }
            other => other,
        };
        match decoded {
            Ok(b) => Ok(b.records.into_iter().find(|r| r.pid == pid)),
            Err(err) => Err(format!("batch {batch}: {err}")),
        }
    }

    /// Counts a value `get` could not decode in `decode_failures`, records it as damage
    /// (`key`, `field`), and answers [`Lookup::Undecodable`] saying [`ARCHIVE_DAMAGED`](crate::ARCHIVE_DAMAGED).
    pub(super) async fn count_failure(
        &self,
        pid: u64,
        key: &str,
        field: Option<String>,
        detail: String,
    ) -> Result<Lookup> {
        let new = self
            .record_damage(&[ArchiveDamage {
                shard: self.schema.shard_of(pid),
                key: key.to_owned(),
                field,
                batch: self.schema.batch_of(pid),
                detail: detail.clone(),
            }])
            .await?;
        let detail = format!(
            "{}: {detail}; `tranche check --repair` sets it aside (its statistics stay counted)",
            crate::ARCHIVE_DAMAGED
        );
        if new > 0 {
            tracing::warn!(%detail, %key, "archived value damaged");
        }
        tracing::debug!(%detail, %key, "archived value failed to decode");
        let key = &self.meta_key;
        let _: i64 = retry(&self.conn, |mut c| async move {
            redis::cmd("HINCRBY")
                .arg(key)
                .arg("decode_failures")
                .arg(1)
                .query_async(&mut c)
                .await
        })
        .await?;
        Ok(Lookup::Undecodable { detail })
    }

    /// [`ArchiveQuery::range`] in O(archived): the archived bitmaps say which batches
    /// hold anything, a window of batch ids at a time (one GETRANGE per shard), and only
    /// those batches are read, each once. Pids that were never archived cost a bit each
    /// in a bitmap read, never a round trip.
    async fn range_by_batches(&self, pids: RangeInclusive<u64>, limit: usize) -> Result<RangePage> {
        /// Batch ids looked at per window.
        const WINDOW: u64 = 4096;
        let limit = limit.max(1);
        let (from, to) = (*pids.start(), *pids.end());
        let mut records: Vec<CompletedRecord> = Vec::new();
        if from > to {
            return Ok(RangePage {
                records,
                next: None,
                damaged: Vec::new(),
            });
        }
        // No batch past the last one any bitmap reaches holds anything.
        let last_batch = match self.last_archived_batch().await? {
            Some(b) => b.min(self.schema.batch_of(to)),
            None => {
                return Ok(RangePage {
                    records,
                    next: None,
                    damaged: Vec::new(),
                });
            }
        };
        let mut segments = std::collections::HashMap::new();
        let mut damaged: Vec<ArchiveDamage> = Vec::new();
        let mut window = self.schema.batch_of(from);
        while window <= last_batch {
            let end = window.saturating_add(WINDOW - 1).min(last_batch);
            for batch in self.archived_batches_in(window..=end).await? {
                let segment = segments
                    .entry(self.schema.shard_of_batch(batch))
                    .or_insert(None);
                let (held, damage) = self.batch_read(batch, segment).await?;
                if !damage.is_empty() {
                    self.record_damage(&damage).await?;
                    // A damaged segment is met once per batch of it: named once.
                    for d in damage {
                        if !damaged.iter().any(|o| o.key == d.key && o.field == d.field) {
                            damaged.push(d);
                        }
                    }
                }
                let Some(held) = held else {
                    continue;
                };
                records.extend(
                    held.records
                        .into_iter()
                        .filter(|r| (from..=to).contains(&r.pid)),
                );
                if records.len() >= limit {
                    // Batches come in id order and hold their records in pid order.
                    let next = if records.len() > limit {
                        Some(records[limit].pid)
                    } else {
                        (batch < last_batch).then(|| (batch + 1) * self.schema.batch_size())
                    };
                    records.truncate(limit);
                    return Ok(RangePage {
                        records,
                        next,
                        damaged,
                    });
                }
            }
            if end == u64::MAX {
                break;
            }
            window = end + 1;
        }
        Ok(RangePage {
            records,
            next: None,
            damaged,
        })
    }

    /// The highest batch any shard's archived bitmap reaches, from their lengths.
    async fn last_archived_batch(&self) -> Result<Option<u64>> {
        let lens = futures_util::future::join_all(self.schema.shards().map(|shard| {
            let key = &self.keys[shard as usize].archived;
            async move {
                let len: u64 = retry(&self.conn, |mut c| async move {
                    redis::cmd("STRLEN").arg(key).query_async(&mut c).await
                })
                .await?;
                Ok::<_, Error>((shard, len))
            }
        }))
        .await;
        let (size, shards) = (
            self.schema.batch_size(),
            u64::from(self.schema.num_shards()),
        );
        let mut last = None;
        for read in lens {
            let (shard, len) = read?;
            if len > 0 {
                let local = (len * 8 - 1) / size;
                last = last.max(Some(local * shards + u64::from(shard)));
            }
        }
        Ok(last)
    }

    /// The batches in `batches` with at least one archived pid, in id order: per shard
    /// one GETRANGE of the bits of its batches in the window.
    async fn archived_batches_in(&self, batches: RangeInclusive<u64>) -> Result<Vec<u64>> {
        let (b0, b1) = (*batches.start(), *batches.end());
        let (size, shards) = (
            self.schema.batch_size(),
            u64::from(self.schema.num_shards()),
        );
        let reads = futures_util::future::join_all(self.schema.shards().map(|shard| {
            let s = u64::from(shard);
            // The shard's local batch indexes l with l * shards + s in b0..=b1.
            let lo = if b0 <= s {
                0
            } else {
                (b0 - s).div_ceil(shards)
            };
            let hi = (b1 >= s).then(|| (b1 - s) / shards).filter(|&hi| hi >= lo);
            let key = &self.keys[shard as usize].archived;
            async move {
                let Some(hi) = hi else {
                    return Ok::<_, Error>(Vec::new());
                };
                let (first_bit, last_bit) = (lo * size, (hi + 1) * size - 1);
                let bytes: Vec<u8> = retry(&self.conn, |mut c| async move {
                    redis::cmd("GETRANGE")
                        .arg(key)
                        .arg(first_bit / 8)
                        .arg(last_bit / 8)
                        .query_async(&mut c)
                        .await
                })
                .await?;
                let base = first_bit / 8 * 8;
                let set = |bit: u64| {
                    let i = (bit - base) / 8;
                    bytes
                        .get(i as usize)
                        .is_some_and(|b| b & (0x80 >> ((bit - base) % 8)) != 0)
                };
                Ok((lo..=hi)
                    .filter(|l| (l * size..(l + 1) * size).any(set))
                    .map(|l| l * shards + s)
                    .collect())
            }
        }))
        .await;
        let mut out = Vec::new();
        for read in reads {
            out.extend(read?);
        }
        out.sort_unstable();
        Ok(out)
    }

    pub(super) async fn lookup(&self, pid: u64) -> Result<Lookup> {
        // Redis bitmaps end at bit 2^32 - 1: a pid beyond it could never have been
        // completed or archived here (the write would have failed), so it is unknown.
        if self.schema.bit_offset(pid) > MAX_BIT_OFFSET {
            return Ok(Lookup::Unknown);
        }
        let shard = self.schema.shard_of(pid);
        let keys = &self.keys[shard as usize];
        let batch = self.schema.batch_of(pid);
        let (seg, slot) = SegmentRef::of(&self.schema, batch);
        let (batch_key, open_key, seg_key) = (
            self.schema.completed_batch(batch),
            open_batch_key(&self.schema, batch),
            seg.key(&self.schema),
        );
        let shard_keys = keys;
        let keys = [
            &keys.index,
            &keys.archived,
            &keys.completed,
            &batch_key,
            &open_key,
            &seg_key,
        ]
        .map(|k| k.as_bytes());
        let (pid_arg, offset_arg) = (pid.to_string(), self.schema.bit_offset(pid).to_string());
        let args = [pid_arg.as_bytes(), offset_arg.as_bytes()];
        let (index, archived, simple, sealed, open, pttl, segment, segment_pttl): GetReply =
            retry(&self.conn, |mut c| {
                let (keys, args) = (&keys, &args);
                async move { invoke_read_only(&mut c, &GET, keys, args).await }
            })
            .await?;
        if archived == 0 {
            return Ok(if index == 1 {
                Lookup::Archiving
            } else {
                Lookup::Unknown
            });
        }
        let field = Some(pid.to_string());
        if let Some(json) = simple {
            return match super::export::decode_stored_json(&json) {
                Ok(record) => Ok(Lookup::Archived {
                    record,
                    tier: Tier::Simple,
                }),
                Err(err) => {
                    self.count_failure(
                        pid,
                        &shard_keys.completed,
                        field,
                        format!("simple record {pid}: {err}"),
                    )
                    .await
                }
            };
        }
        if let Some(json) = open {
            return match super::export::decode_stored_json(&json) {
                Ok(record) => Ok(Lookup::Archived {
                    record,
                    tier: Tier::Compressed,
                }),
                Err(err) => {
                    self.count_failure(
                        pid,
                        &open_key,
                        field,
                        format!("open batch record {pid}: {err}"),
                    )
                    .await
                }
            };
        }
        let (bytes, pttl): (std::borrow::Cow<'_, [u8]>, i64) = match (&sealed, &segment) {
            (Some(bytes), _) => (bytes.into(), pttl),
            (None, Some(seg)) => match segment::slot_of(seg, slot, batch) {
                Ok(Some(blob)) => (blob, segment_pttl),
                Ok(None) => {
                    return self
                        .count_failure(
                            pid,
                            &seg_key,
                            None,
                            format!("segment of batch {batch} lacks it"),
                        )
                        .await;
                }
                Err(err) => {
                    return self
                        .count_failure(
                            pid,
                            &seg_key,
                            None,
                            format!("segment of batch {batch}: {err}"),
                        )
                        .await;
                }
            },
            (None, None) => {
                // Gone: expired (summary tier), or set aside as damaged by a repair.
                return Ok(match self.quarantined(pid).await? {
                    Some(place) => Lookup::Undecodable {
                        detail: format!(
                            "{}: set aside in {place} by a repair (its statistics stay counted)",
                            crate::ARCHIVE_DAMAGED
                        ),
                    },
                    None => Lookup::Expired,
                });
            }
        };
        match self.decode_sealed(batch, &bytes, pid).await {
            Ok(Some(record)) => Ok(Lookup::Archived {
                record,
                tier: if pttl >= 0 {
                    Tier::Summary
                } else {
                    Tier::Compressed
                },
            }),
            Ok(None) => {
                self.count_failure(
                    pid,
                    if sealed.is_some() {
                        &batch_key
                    } else {
                        &seg_key
                    },
                    None,
                    format!("batch {batch} lacks pid {pid}"),
                )
                .await
            }
            Err(detail) => {
                self.count_failure(
                    pid,
                    if sealed.is_some() {
                        &batch_key
                    } else {
                        &seg_key
                    },
                    None,
                    detail,
                )
                .await
            }
        }
    }
}

#[async_trait]
impl<C> ArchiveQuery for RedisArchive<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn get(&self, pid: u64) -> Result<Lookup> {
        self.lookup(pid).await
    }

    async fn range(&self, pids: RangeInclusive<u64>, limit: usize) -> Result<RangePage> {
        self.range_by_batches(pids, limit).await
    }

    async fn decode_failures(&self) -> Result<u64> {
        let key = &self.meta_key;
        let n: Option<u64> = retry(&self.conn, |mut c| async move {
            redis::cmd("HGET")
                .arg(key)
                .arg("decode_failures")
                .query_async(&mut c)
                .await
        })
        .await?;
        Ok(n.unwrap_or(0))
    }

    async fn dead_letter_count(&self) -> Result<u64> {
        // One XLEN per shard, all sent together (each on its own slot in a cluster).
        let lens = futures_util::future::join_all(self.schema.shards().map(|shard| {
            let key = self.schema.shard_key(shard, "dead");
            async move {
                retry(&self.conn, |mut c| {
                    let key = key.clone();
                    async move { redis::cmd("XLEN").arg(key).query_async::<u64>(&mut c).await }
                })
                .await
            }
        }))
        .await;
        let mut total = 0;
        for len in lens {
            total += len?;
        }
        Ok(total)
    }

    async fn stalled(&self) -> Result<Vec<Stall>> {
        self.read_stalls().await
    }

    async fn damaged(&self) -> Result<Vec<ArchiveDamage>> {
        self.read_damage().await
    }

    async fn lost_records(&self) -> Result<u64> {
        self.lost_count().await
    }

    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>> {
        let limit = limit.max(1);
        let reads = futures_util::future::join_all(self.schema.shards().map(|shard| {
            let key = self.schema.shard_key(shard, "dead");
            async move {
                let reply: redis::streams::StreamRangeReply = retry(&self.conn, |mut c| {
                    let key = key.clone();
                    async move {
                        redis::cmd("XRANGE")
                            .arg(key)
                            .arg("-")
                            .arg("+")
                            .arg("COUNT")
                            .arg(limit)
                            .query_async(&mut c)
                            .await
                    }
                })
                .await?;
                Ok::<_, Error>((shard, reply))
            }
        }))
        .await;
        let mut out = Vec::new();
        for read in reads {
            let (shard, reply) = read?;
            for entry in reply.ids {
                let field = |name: &str| {
                    entry
                        .map
                        .get(name)
                        .and_then(|v| String::from_redis_value(v.clone()).ok())
                        .unwrap_or_default()
                };
                out.push(DeadLetter {
                    shard,
                    record: field("r"),
                    reason: field("reason"),
                    id: entry.id.clone(),
                });
            }
        }
        Ok(out)
    }
}
