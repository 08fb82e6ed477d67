//! Retrying through dropped connections (the active store has the same few lines: too
//! small for a shared crate).

use std::future::Future;
use std::time::Duration;

use redis::{RedisError, RedisResult};

/// Attempts per operation when the connection drops.
const ATTEMPTS: u32 = 5;

/// Runs `op` on a clone of `conn`, retrying with backoff while the failure is a dropped
/// or refused connection or a timeout. Every script of the archive is safe to repeat: a
/// repeated archive call finds its bits set and writes nothing.
pub(crate) async fn retry<C, T, F, Fut>(conn: &C, mut op: F) -> RedisResult<T>
where
    C: Clone,
    F: FnMut(C) -> Fut,
    Fut: Future<Output = RedisResult<T>>,
{
    let mut delay = Duration::from_millis(20);
    let mut attempt = 1;
    loop {
        match op(conn.clone()).await {
            Err(err) if attempt < ATTEMPTS && transient(&err) => {
                tracing::debug!(%err, attempt, "redis connection error; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 3).min(Duration::from_secs(1));
                attempt += 1;
            }
            other => return other,
        }
    }
}

fn transient(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_timeout()
}

/// Runs `script`, which must not write, as `EVALSHA_RO` (Redis 7): a user whose keys are
/// read-only (`%R~` in an ACL) may run it, where `EVALSHA` declares every key written.
/// Loads the script on `NOSCRIPT`; on a server without `EVALSHA_RO` it runs as a plain
/// `EVALSHA`.
pub(crate) async fn invoke_read_only<C, T>(
    conn: &mut C,
    script: &redis::Script,
    keys: &[&[u8]],
    args: &[&[u8]],
) -> RedisResult<T>
where
    C: redis::aio::ConnectionLike,
    T: redis::FromRedisValue,
{
    let call = |verb: &str| {
        let mut cmd = redis::cmd(verb);
        cmd.arg(script.get_hash())
            .arg(keys.len())
            .arg(keys)
            .arg(args);
        cmd
    };
    let read_only = call("EVALSHA_RO");
    match read_only.query_async(conn).await {
        Err(err) if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            script.load_async(conn).await?;
            read_only.query_async(conn).await
        }
        Err(err) if err.to_string().contains("unknown command") => {
            let mut inv = script.prepare_invoke();
            for k in keys {
                inv.key(*k);
            }
            for a in args {
                inv.arg(*a);
            }
            inv.invoke_async(conn).await
        }
        other => other,
    }
}
