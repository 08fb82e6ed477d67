//! Read-only script calls (`EVALSHA_RO`). Retries go through the one policy,
//! `tranche_codec::retry`: every script of the archive is safe to repeat, since a
//! repeated archive call finds its bits set and writes nothing.

use redis::RedisResult;

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
