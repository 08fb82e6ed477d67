//! The one retry policy for the stores' Redis calls (feature `retry`).

use std::future::Future;
use std::time::Duration;

use redis::{RedisError, RedisResult};

/// Attempts per operation when the connection drops: the first command after a drop
/// fails while the connection manager reconnects, so one retry usually suffices.
pub const ATTEMPTS: u32 = 5;

/// Runs `op` on a clone of `conn`, retrying with backoff (20 ms, tripling, at most 1 s,
/// [`ATTEMPTS`] in all) while the failure [`is_transient`]. Any other error, or the last
/// attempt's, is returned as it came.
///
/// Only for operations that are safe to repeat: the caller's scripts must make a
/// repeated call harmless (a repeated archive call finds its bits set and writes
/// nothing; a repeated completion is a duplicate), since a call whose reply was lost
/// may have run.
pub async fn retry<C, T, F, Fut>(conn: &C, mut op: F) -> RedisResult<T>
where
    C: Clone,
    F: FnMut(C) -> Fut,
    Fut: Future<Output = RedisResult<T>>,
{
    let mut delay = Duration::from_millis(20);
    let mut attempt = 1;
    loop {
        match op(conn.clone()).await {
            Err(err) if attempt < ATTEMPTS && is_transient(&err) => {
                tracing::debug!(%err, attempt, "redis connection error; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 3).min(Duration::from_secs(1));
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// Whether `err` is connection trouble that may pass (an I/O error, a dropped or
/// refused connection, a timeout) rather than an answer from the server.
pub fn is_transient(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_timeout()
}
