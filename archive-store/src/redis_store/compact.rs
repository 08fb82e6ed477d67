//! Compaction: older records moved into the current tier (simple into open batches,
//! open batches sealed, the summary TTL given to what lacks it) and segments a crash
//! left unjoined joined.

use super::*;

impl<C> RedisArchive<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Moves `shard`'s simple-tier records into open batches, a page at a time.
    pub(super) async fn move_simple(&self, shard: u32) -> Result<()> {
        let keys = &self.keys[shard as usize];
        let mut cursor = 0u64;
        loop {
            let (next, page): (u64, Vec<(u64, String)>) = retry(&self.conn, |mut c| async move {
                redis::cmd("HSCAN")
                    .arg(&keys.completed)
                    .arg(cursor)
                    .arg("COUNT")
                    .arg(500)
                    .query_async(&mut c)
                    .await
            })
            .await?;
            if !page.is_empty() {
                let mut batches: Vec<u64> =
                    page.iter().map(|(p, _)| self.schema.batch_of(*p)).collect();
                batches.sort_unstable();
                batches.dedup();
                let mut inv = MOVE.prepare_invoke();
                inv.key(&keys.completed).key(&keys.open).arg(batches.len());
                for &b in &batches {
                    inv.key(open_batch_key(&self.schema, b)).arg(b);
                }
                for (pid, _) in &page {
                    let k = batches
                        .binary_search(&self.schema.batch_of(*pid))
                        .unwrap_or(0)
                        + 1;
                    inv.arg(pid).arg(k);
                }
                let _: i64 = retry(&self.conn, |mut c| {
                    let inv = &inv;
                    async move { inv.invoke_async(&mut c).await }
                })
                .await?;
            }
            if next == 0 {
                return Ok(());
            }
            cursor = next;
        }
    }

    /// Gives the sealed batches and segments of `fill` (one shard's
    /// [`Self::shard_fill`]) without a TTL the summary tier's.
    pub(super) async fn expire_sealed(&self, fill: &[(u64, u64)]) -> Result<()> {
        let ttl = self.config.summary_ttl.as_millis().max(1) as u64;
        let mut keys: Vec<String> = Vec::new();
        let mut last: Option<SegmentRef> = None;
        for &(b, _) in fill {
            let (seg, _) = SegmentRef::of(&self.schema, b);
            if last != Some(seg) {
                keys.push(seg.key(&self.schema));
                last = Some(seg);
            }
            keys.push(self.schema.completed_batch(b));
        }
        for chunk in keys.chunks(500) {
            retry(&self.conn, |mut c| {
                let mut pipe = redis::pipe();
                for key in chunk {
                    pipe.cmd("PEXPIRE").arg(key).arg(ttl).arg("NX").ignore();
                }
                async move { pipe.query_async::<()>(&mut c).await }
            })
            .await?;
        }
        Ok(())
    }
}

#[async_trait]
impl<C> Compaction for RedisArchive<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn compact(&self) -> Result<usize> {
        let tier = self.config.tier_for(self.archived_count().await?);
        if tier != Tier::Simple {
            for shard in self.schema.shards() {
                self.move_simple(shard).await?;
            }
        }
        let sealed = self.seal_open_batches().await?;
        for shard in self.schema.shards() {
            let fill = self.shard_fill(shard).await?;
            self.join_complete(&fill).await?;
            if tier == Tier::Summary {
                self.expire_sealed(&fill).await?;
            }
        }
        Ok(sealed)
    }
}
