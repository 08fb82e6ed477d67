//! Shards whose archiving is stalled on Redis (`{ns}:archive:stalled`), and the
//! statistics repair that ends the usual stall: rebuilding a shard's statistics from
//! the records its archived bitmap names.

use super::*;

impl<C> RedisArchive<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Records `stalls` (shard, reason) in `{ns}:archive:stalled` (a shard already
    /// there keeps its `since`) and forgets `resumed` there, in one pipeline.
    pub(super) async fn note_stalls(
        &self,
        stalls: &[(u32, String)],
        resumed: &[u32],
    ) -> Result<()> {
        if stalls.is_empty() && resumed.is_empty() {
            return Ok(());
        }
        {
            let mut known = self.stalled.lock().unwrap_or_else(|p| p.into_inner());
            for (shard, reason) in stalls {
                if known.insert(*shard) {
                    tracing::warn!(shard, %reason, "archive of the shard stalled; its records stay in the inbox");
                }
            }
            for shard in resumed {
                if known.remove(shard) {
                    tracing::info!(shard, "archive of the shard resumed");
                }
            }
        }
        let key = &self.stalled_key;
        let now = self.clock.now_ms();
        retry(&self.conn, |mut c| {
            let mut pipe = redis::pipe();
            for (shard, reason) in stalls {
                pipe.cmd("HSETNX")
                    .arg(key)
                    .arg(shard)
                    .arg(format!("{now} {reason}"))
                    .ignore();
            }
            if !resumed.is_empty() {
                pipe.cmd("HDEL").arg(key).arg(resumed).ignore();
            }
            async move { pipe.query_async::<()>(&mut c).await }
        })
        .await?;
        Ok(())
    }

    /// Every stall recorded, by shard; also what this archiver knows from now on
    /// (a stall another archiver recorded is cleared by this one's next success).
    pub(super) async fn read_stalls(&self) -> Result<Vec<Stall>> {
        let key = &self.stalled_key;
        let raw: Vec<(String, String)> = retry(&self.conn, |mut c| async move {
            redis::cmd("HGETALL").arg(key).query_async(&mut c).await
        })
        .await?;
        let mut out = Vec::with_capacity(raw.len());
        for (field, value) in raw {
            let shard = field
                .parse::<u32>()
                .ok()
                .filter(|&s| s < self.schema.num_shards());
            let parsed = value
                .split_once(' ')
                .and_then(|(since, reason)| Some((since.parse::<u64>().ok()?, reason)));
            match (shard, parsed) {
                (Some(shard), Some((since_ms, reason))) => out.push(Stall {
                    shard,
                    since_ms,
                    reason: reason.to_owned(),
                }),
                _ => {
                    return Err(Error::Corrupt {
                        key: format!("{key} {field}"),
                        detail: format!("not `since_ms reason`: {value:?}"),
                    });
                }
            }
        }
        out.sort_unstable_by_key(|s| s.shard);
        let mut known = self.stalled.lock().unwrap_or_else(|p| p.into_inner());
        known.extend(out.iter().map(|s| s.shard));
        Ok(out)
    }

    /// Whether this archiver knows `shard` as stalled.
    pub(super) fn is_stalled(&self, shard: u32) -> bool {
        self.stalled
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&shard)
    }

    /// The statistics of every record `shard` still holds, read batch by batch from
    /// its archived bitmap, and how many archived records could not be read (expired,
    /// or in a batch that does not decode).
    pub(super) async fn rebuild_delta(&self, shard: u32) -> Result<(StatsDelta, u64)> {
        let fill = self.shard_fill(shard).await?;
        let mut delta = StatsDelta::default();
        let mut unreadable = 0u64;
        let mut segment = None;
        for (batch, n) in fill {
            let (held, damage) = self.batch_read(batch, &mut segment).await?;
            for d in &damage {
                tracing::warn!(damage = %d, "archived value unreadable; left out of the rebuild");
            }
            let read = held.map_or(0, |b| {
                for r in &b.records {
                    delta.add(r);
                }
                b.records.len() as u64
            });
            unreadable += n.saturating_sub(read);
        }
        Ok((delta, unreadable))
    }

    pub(super) async fn repair_shard_stats(&self, shard: u32) -> Result<Repaired> {
        if shard >= self.schema.num_shards() {
            return Err(Error::InvalidArgument(format!(
                "shard {shard} does not exist: the namespace has {} shards",
                self.schema.num_shards()
            )));
        }
        let (delta, unreadable) = self.rebuild_delta(shard).await?;
        let stats = tranche_stats::RedisStats::new(self.conn.clone(), self.schema.clone())
            .with_clock(self.clock.clone());
        let repaired = stats.repair(shard, &delta, unreadable).await?;
        // Woken passes may visit it again; the next success clears the stall.
        self.stalled
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&shard);
        self.woken.lock().unwrap_or_else(|p| p.into_inner()).owed[shard as usize] = true;
        Ok(repaired)
    }
}
