//! The worker dictionary on Redis: read, and grown by compare-and-set (`dict.lua`) so
//! that concurrent archivers agree on every code.

use super::*;

impl<C> RedisArchive<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// The worker dictionary, holding every one of `workers` (added atomically with a
    /// compare-and-set, so concurrent archivers agree on every index).
    pub(super) async fn ensure_workers(&self, workers: &[&str]) -> Result<Arc<WorkerDict>> {
        let cached = self.dict.read().unwrap_or_else(|p| p.into_inner()).clone();
        if workers.iter().all(|w| cached.index_of(w).is_some()) {
            return Ok(cached);
        }
        let key = &self.dict_key;
        loop {
            let bytes: Option<Vec<u8>> = retry(&self.conn, |mut c| async move {
                redis::cmd("GET").arg(key).query_async(&mut c).await
            })
            .await?;
            let old = bytes.unwrap_or_default();
            let mut dict = if old.is_empty() {
                WorkerDict::new()
            } else {
                WorkerDict::from_bytes(&old)?
            };
            let before = dict.len();
            for w in workers {
                dict.insert(w)?;
            }
            let dict = Arc::new(dict);
            if dict.len() != before {
                let mut inv = DICT.prepare_invoke();
                inv.key(key).arg(&old).arg(dict.to_bytes());
                let done: i64 = retry(&self.conn, |mut c| {
                    let inv = &inv;
                    async move { inv.invoke_async(&mut c).await }
                })
                .await?;
                if done == 0 {
                    continue;
                }
            }
            *self.dict.write().unwrap_or_else(|p| p.into_inner()) = dict.clone();
            return Ok(dict);
        }
    }
}
