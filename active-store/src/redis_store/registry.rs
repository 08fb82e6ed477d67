//! The worker registry on Redis: `{ns}:workers`, one field per worker.

use super::*;

impl<C> RedisActiveStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Every `(worker id, JSON)` entry of the registry, as stored.
    async fn worker_entries(&self) -> Result<Vec<(String, String)>> {
        let key = &self.workers_key;
        Ok(retry(
            &self.conn,
            |mut conn| async move { conn.hgetall(key).await },
        )
        .await?)
    }
}

#[async_trait]
impl<C> WorkerRegistry for RedisActiveStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn worker_heartbeat(&self, mut info: WorkerInfo) -> Result<()> {
        plans::check_worker(&info.id)?;
        info.last_beat_ms = self.now();
        let json = serde_json::to_string(&info).expect("WorkerInfo serialises");
        let key = &self.workers_key;
        let id = &info.id;
        retry(&self.conn, |mut conn| {
            let json = json.clone();
            async move { conn.hset::<_, _, _, ()>(key, id, json).await }
        })
        .await?;
        Ok(())
    }

    async fn workers(&self) -> Result<Vec<WorkerState>> {
        let raw = self.worker_entries().await?;
        let now = self.now();
        let mut out = Vec::with_capacity(raw.len());
        for (id, json) in raw {
            // One bad entry must not blind every reader of the registry: it is left out,
            // said once per read, and removed by `prune_workers`.
            let info: WorkerInfo = match serde_json::from_str(&json) {
                Ok(info) => info,
                Err(err) => {
                    tracing::warn!(key = %self.workers_key, field = %id.escape_debug(), %err, "worker entry does not decode; left out");
                    continue;
                }
            };
            out.push(WorkerState {
                active: self.config.worker_active(info.last_beat_ms, now),
                info,
            });
        }
        out.sort_by(|a, b| a.info.id.cmp(&b.info.id));
        Ok(out)
    }

    async fn deregister(&self, worker: &str) -> Result<()> {
        let key = &self.workers_key;
        retry(&self.conn, |mut conn| async move {
            conn.hdel::<_, _, ()>(key, worker).await
        })
        .await?;
        Ok(())
    }

    async fn prune_workers(&self, retention: std::time::Duration) -> Result<Vec<String>> {
        let raw = self.worker_entries().await?;
        let cutoff = self.now().saturating_sub(retention.as_millis() as u64);
        let mut gone: Vec<String> = raw
            .into_iter()
            .filter(|(_, json)| {
                serde_json::from_str::<WorkerInfo>(json).map_or(true, |w| w.last_beat_ms < cutoff)
            })
            .map(|(id, _)| id)
            .collect();
        gone.sort();
        if !gone.is_empty() {
            // A worker that beats between the read and this HDEL registers again on its
            // next beat: forgetting it for one period is harmless.
            let (key, gone) = (&self.workers_key, &gone);
            retry(&self.conn, |mut conn| async move {
                conn.hdel::<_, _, ()>(key, gone).await
            })
            .await?;
        }
        Ok(gone)
    }
}
