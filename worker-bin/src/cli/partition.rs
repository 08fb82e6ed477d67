//! Commands on one partition or the whole store: `get`, `locate`, `stats`,
//! `retry-failed`, `discard` and `compact`.

use anyhow::{Result, bail};

use crate::backend::Backend;
use crate::cli::common::{Outcome, say};
use crate::cli::inspect::{pieces_of, state_of};
use crate::cli::render;

/// `get`: one partition, with the pieces a split cut off it.
pub(super) async fn get(backend: Backend, pid: u64, json: bool) -> Result<Outcome> {
    let active = backend.active.clone();
    let view = crate::query::Job::from_backend(backend).get(pid).await?;
    let pieces = pieces_of(active.as_ref(), &view).await?;
    print!("{}", render::view(pid, &view, &pieces, json));
    Ok(Outcome::Success)
}

/// `locate`: the partition that covered row ID `id`.
pub(super) async fn locate(backend: Backend, id: u64, json: bool) -> Result<Outcome> {
    let namespace = backend.namespace.clone();
    match crate::query::Job::from_backend(backend).locate(id).await? {
        Some(located) => {
            print!("{}", render::located(&located, json));
            Ok(Outcome::Success)
        }
        None => bail!("no plan of namespace `{namespace}` covers row ID {id}"),
    }
}

/// `stats`, with every range's statistics when `ranges`.
pub(super) async fn stats(backend: Backend, ranges: bool, json: bool) -> Result<Outcome> {
    let merged = if ranges {
        backend.router.stats_with_ranges().await?
    } else {
        crate::query::Job::from_backend(backend).stats().await?
    };
    print!("{}", render::stats(&merged, json)?);
    Ok(Outcome::Success)
}

/// `retry-failed`: one failed partition, or every one, pending again.
pub(super) async fn retry_failed(
    backend: &Backend,
    pid: Option<u64>,
    json: bool,
) -> Result<Outcome> {
    backend.ensure_writable()?;
    let pids = backend.active.retry_failed(pid).await?;
    backend.save().await?;
    if let (Some(pid), true) = (pid, pids.is_empty()) {
        bail!("partition {pid} is not failed");
    }
    say(
        json,
        format_args!("{} failed partition(s) pending again", pids.len()),
        serde_json::json!({"retried": pids}),
    );
    Ok(Outcome::Success)
}

/// `discard` without `--force`: only a pending or failed partition, never half.
pub(super) async fn discard(backend: &Backend, pid: u64, json: bool) -> Result<Outcome> {
    backend.ensure_writable()?;
    let discarded = match backend.active.discard(pid).await {
        // A record the store cannot read is never half-discarded: say so, and
        // what removes it.
        Err(err) if err.to_string().contains("corrupt record") => {
            bail!("{err}: nothing discarded (`discard {pid} --force` replaces the record)")
        }
        other => other?,
    };
    if !discarded {
        let now = state_of(backend, pid).await;
        bail!("partition {pid} is not pending or failed (it is {now}): nothing discarded");
    }
    backend.save().await?;
    say(
        json,
        format_args!("partition {pid} discarded"),
        serde_json::json!({"discarded": pid, "forced": false}),
    );
    Ok(Outcome::Success)
}

/// `compact`: seal the open archive batches now.
pub(super) async fn compact(backend: &Backend, json: bool) -> Result<Outcome> {
    backend.ensure_writable()?;
    let sealed = backend.archive.compact().await?;
    backend.save().await?;
    say(
        json,
        format_args!("{sealed} batch(es) sealed"),
        serde_json::json!({"sealed": sealed}),
    );
    Ok(Outcome::Success)
}
