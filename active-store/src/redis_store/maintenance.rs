//! Maintenance on Redis: the reaper, retries of failed partitions, discards, the
//! pause flag and recounts.

use super::*;

/// Leases reaped per shard per script call: bounds the time one call holds Redis.
const REAP_BATCH: usize = 1000;

#[async_trait]
impl<C> Maintenance for RedisActiveStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn reap(&self, now_ms: u64) -> Result<Vec<u64>> {
        let args = [
            now_ms.to_string(),
            REAP_BATCH.to_string(),
            String::new(),
            self.config.max_attempts.to_string(),
        ];
        let mut all = Vec::new();
        loop {
            let carve = ["expired".to_owned(), now_ms.to_string()];
            let batch = self.per_shard_pids(&REAP, &carve, &args).await?;
            let done = batch.len() < REAP_BATCH;
            all.extend(batch);
            if done {
                break;
            }
        }
        // Expired pieces of split partitions go back to pending too (not listed: the
        // pids returned are partitions').
        self.expire_pieces(None).await?;
        all.sort_unstable();
        Ok(all)
    }

    async fn release_worker(&self, worker: &str) -> Result<Vec<u64>> {
        plans::check_worker(worker)?;
        let args = [
            self.now().to_string(),
            "0".to_owned(),
            worker.to_owned(),
            self.config.max_attempts.to_string(),
        ];
        let carve = ["worker".to_owned(), worker.to_owned()];
        let mut out = self.per_shard_pids(&REAP, &carve, &args).await?;
        out.extend(self.expire_pieces(Some(worker)).await?);
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    async fn retry_failed(&self, pid: Option<u64>) -> Result<Vec<u64>> {
        let args = [
            self.now().to_string(),
            pid.map(|p| p.to_string()).unwrap_or_default(),
        ];
        let shards: Vec<&ShardKeys> = match pid {
            Some(pid) => vec![self.keys_of(pid)],
            None => self.keys.iter().collect(),
        };
        let mut out = Vec::new();
        for keys in shards {
            let reply: Vec<String> = self
                .invoke(
                    &RETRY_FAILED,
                    &[&keys.active, &keys.pending, &keys.counts],
                    &args,
                )
                .await?;
            for pid in reply {
                out.push(parse_u64(&pid, "pid")?);
            }
        }
        self.wake_shards_of(&out);
        out.sort_unstable();
        Ok(out)
    }

    async fn discard(&self, pid: u64) -> Result<bool> {
        // A pid held in a run is leased: carved, discard.lua sees it so.
        self.carve_pids(&[pid]).await?;
        let keys = self.keys_of(pid);
        let code: i64 = self
            .invoke(
                &DISCARD,
                &[
                    &keys.active,
                    &keys.pending,
                    &keys.counts,
                    &keys.plans,
                    &keys.cursor,
                    &keys.splits,
                    &keys.pieces,
                    &keys.piece_pending,
                    &keys.piece_leases,
                ],
                &[pid.to_string(), self.now().to_string()],
            )
            .await?;
        match code {
            1 => Ok(true),
            0 => Ok(false),
            _ => Err(Error::Leased(pid)),
        }
    }

    async fn set_paused(&self, paused: bool) -> Result<()> {
        let key = self.layout.schema().meta();
        retry(&self.conn, |mut conn| {
            let key = key.clone();
            async move {
                if paused {
                    conn.hset::<_, _, _, ()>(key, "paused", 1).await
                } else {
                    conn.hdel::<_, _, ()>(key, "paused").await
                }
            }
        })
        .await?;
        Ok(())
    }

    async fn is_paused(&self) -> Result<bool> {
        let key = self.layout.schema().meta();
        let flag: Option<String> = retry(&self.conn, |mut conn| {
            let key = key.clone();
            async move { conn.hget(key, "paused").await }
        })
        .await?;
        Ok(flag.is_some())
    }

    async fn repair_corrupt(&self, pid: u64) -> Result<Repair> {
        // The pid must be in a plan before anything is carved.
        self.range_of(pid).await?;
        // repair.lua derives the shard's counters from its records: every pid of it
        // needs one. A pid of a run that does not decode gets a record that does not
        // either (the run broken up), which repair.lua then sets aside and rebuilds:
        // every pid the break-up wrote, not only this one, as the pids the run held
        // may not be the ones its damaged first and last fields name.
        let shard = self.layout.shard_of(pid) as usize;
        self.carve(shard, &["all".to_owned()]).await?;
        // The runs as bytes: a broken one need not be UTF-8.
        let runs: redis::Value = retry(&self.conn, |mut conn| async move {
            conn.hgetall(&self.keys[shard].runs).await
        })
        .await?;
        let mut also = Vec::new();
        for run in record::runs_of(&query::hash_of(&runs, &self.keys[shard].runs)?).1 {
            if run.names(pid) {
                let keys = &self.keys[shard];
                let args = [
                    "broken".to_owned(),
                    String::from_utf8_lossy(run.token).into_owned(),
                    shard.to_string(),
                    self.layout.shards().to_string(),
                    self.layout.per_batch().to_string(),
                ];
                let broken: Vec<u64> = self
                    .invoke(
                        &CARVE,
                        &[
                            &keys.runs,
                            &keys.active,
                            &keys.leases,
                            &keys.plans,
                            &keys.cursor,
                        ],
                        &args,
                    )
                    .await?;
                also.extend(broken.into_iter().filter(|&p| p != pid));
            }
        }
        let done = self.repair_record(pid).await?;
        for other in also {
            self.repair_record(other).await?;
        }
        self.empty.wake_all();
        Ok(match done {
            1 => Repair::Rebuilt,
            2 => Repair::Removed,
            _ => Repair::Nothing,
        })
    }
}

impl<C> RedisActiveStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// `repair.lua` on `pid`'s record: set aside and rebuilt pending from its plan (1),
    /// removed as completed (2), or nothing to repair (0).
    async fn repair_record(&self, pid: u64) -> Result<i64> {
        let (min, max) = self.range_of(pid).await?;
        let keys = self.keys_of(pid);
        let quarantine = format!("{}:quarantine", keys.active);
        let args = [
            pid.to_string(),
            self.now().to_string(),
            self.bit(pid).to_string(),
            min.to_string(),
            max.to_string(),
        ];
        self.invoke(
            &REPAIR,
            &[
                &keys.active,
                &keys.pending,
                &keys.leases,
                &keys.index,
                &keys.counts,
                &quarantine,
            ],
            &args,
        )
        .await
    }
}
