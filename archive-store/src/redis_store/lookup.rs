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

    pub(super) async fn count_failure(&self, detail: String) -> Result<Lookup> {
        tracing::warn!(%detail, "archive batch failed to decode");
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
        let mut inv = GET.prepare_invoke();
        inv.key(&keys.index)
            .key(&keys.archived)
            .key(&keys.completed)
            .key(self.schema.completed_batch(batch))
            .key(open_batch_key(&self.schema, batch))
            .key(seg.key(&self.schema))
            .arg(pid)
            .arg(self.schema.bit_offset(pid));
        let (index, archived, simple, sealed, open, pttl, segment, segment_pttl): GetReply =
            retry(&self.conn, |mut c| {
                let inv = &inv;
                async move { inv.invoke_async(&mut c).await }
            })
            .await?;
        if archived == 0 {
            return Ok(if index == 1 {
                Lookup::Archiving
            } else {
                Lookup::Unknown
            });
        }
        if let Some(json) = simple {
            return match decode_json(&json) {
                Ok(record) => Ok(Lookup::Archived {
                    record,
                    tier: Tier::Simple,
                }),
                Err(err) => {
                    self.count_failure(format!("simple record {pid}: {err}"))
                        .await
                }
            };
        }
        if let Some(json) = open {
            return match decode_json(&json) {
                Ok(record) => Ok(Lookup::Archived {
                    record,
                    tier: Tier::Compressed,
                }),
                Err(err) => {
                    self.count_failure(format!("open batch record {pid}: {err}"))
                        .await
                }
            };
        }
        let (bytes, pttl): (&[u8], i64) = match (&sealed, &segment) {
            (Some(bytes), _) => (bytes, pttl),
            (None, Some(seg)) => match segment::slot_of(seg, slot) {
                Ok(Some(blob)) => (blob, segment_pttl),
                Ok(None) => {
                    return self
                        .count_failure(format!("segment of batch {batch} lacks it"))
                        .await;
                }
                Err(err) => {
                    return self
                        .count_failure(format!("segment of batch {batch}: {err}"))
                        .await;
                }
            },
            (None, None) => return Ok(Lookup::Expired),
        };
        match self.decode_sealed(batch, bytes, pid).await {
            Ok(Some(record)) => Ok(Lookup::Archived {
                record,
                tier: if pttl >= 0 {
                    Tier::Summary
                } else {
                    Tier::Compressed
                },
            }),
            Ok(None) => {
                self.count_failure(format!("batch {batch} lacks pid {pid}"))
                    .await
            }
            Err(detail) => self.count_failure(detail).await,
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
        page_by_lookup(pids, limit, |pid| self.lookup(pid)).await
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
