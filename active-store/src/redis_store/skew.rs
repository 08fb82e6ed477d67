//! How far this process's clock is from the server's. Deadlines are set and reaped by
//! the callers' clocks (`src/split.rs`, "Clocks"): a process whose clock is off by
//! more than a twelfth of a lease can reap, or be reaped, while the holder still
//! works. The server's `TIME` is the one reading every process of a namespace shares,
//! so each measures itself against it.

use super::*;

impl<C> RedisActiveStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// This store's clock less the server's `TIME`, in ms: positive when this process
    /// runs ahead. The server's reading is taken as of the middle of the round trip,
    /// so the figure is off by at most half of it. One round trip (on a cluster, to
    /// any node).
    pub async fn clock_skew_ms(&self) -> Result<i64> {
        let before = self.now();
        let (secs, micros): (u64, u64) = retry(&self.conn, |mut conn| async move {
            redis::cmd("TIME").query_async(&mut conn).await
        })
        .await?;
        let after = self.now();
        let server = secs.saturating_mul(1000).saturating_add(micros / 1000);
        let local = before + after.saturating_sub(before) / 2;
        Ok(local as i64 - server as i64)
    }
}
