//! What runs beside the claim loop: the reaper, the worker's registry heartbeat, and the
//! archive drain at the end of a run.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tranche_active_store::{ActiveStore, WorkerInfo};

use crate::backend::Backend;
use crate::event::StoreOp;

use super::{Shared, Stop};
use crate::duration::now_ms;
use crate::slot::hostname;
use crate::sync::until;

/// How long a silent worker stays in the registry before the reaper forgets it.
pub(crate) const WORKER_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// How often the reaper prunes the worker registry.
const PRUNE_EVERY: Duration = Duration::from_secs(600);

/// Requeues expired leases every half lease, and forgets workers silent for longer than
/// [`WORKER_RETENTION`] every [`PRUNE_EVERY`] (first at start).
pub(super) async fn reaper(
    active: Arc<dyn ActiveStore>,
    lease: Duration,
    shared: Arc<Shared>,
    mut done: watch::Receiver<bool>,
) {
    let failed = |err: &tranche_active_store::Error| shared.store_error(StoreOp::Reap, err);
    let every = (lease / 2).clamp(Duration::from_millis(200), Duration::from_secs(15));
    let mut pruned: Option<Instant> = None;
    loop {
        if pruned.is_none_or(|at| at.elapsed() >= PRUNE_EVERY) {
            pruned = Some(Instant::now());
            match active.prune_workers(WORKER_RETENTION).await {
                Ok(ids) if !ids.is_empty() => {
                    tracing::info!(count = ids.len(), "forgot workers silent for a day")
                }
                Ok(_) => {}
                Err(err) => {
                    tracing::warn!(%err, "pruning the worker registry failed");
                    failed(&err);
                }
            }
        }
        tokio::select! {
            () = until(&mut done, |d| *d) => return,
            () = tokio::time::sleep(every) => {}
        }
        match active.reap(now_ms()).await {
            Ok(pids) if !pids.is_empty() => {
                tracing::info!(count = pids.len(), "requeued expired leases")
            }
            Ok(_) => {}
            Err(err) => {
                tracing::warn!(%err, "reap failed");
                failed(&err);
            }
        }
    }
}

/// Registers the worker and beats every few seconds with its counters.
pub(super) async fn worker_heartbeat(
    active: Arc<dyn ActiveStore>,
    worker: String,
    shared: Arc<Shared>,
    mut done: watch::Receiver<bool>,
) {
    let started_ms = now_ms();
    let started = Instant::now();
    let host = hostname();
    loop {
        let [p50, p99] = shared
            .update_us
            .lock()
            .expect("not poisoned")
            .quantiles([0.5, 0.99], Instant::now())
            .map(|us| us as f64 / 1000.0);
        let completed = shared.completed.load(Relaxed);
        let info = WorkerInfo {
            id: worker.clone(),
            host: host.clone(),
            process_id: std::process::id(),
            started_ms,
            last_beat_ms: now_ms(),
            in_flight: shared.in_flight.load(Relaxed),
            completed,
            rate_per_s: completed as f64 / started.elapsed().as_secs_f64().max(1e-3),
            latency_p50_ms: p50,
            latency_p99_ms: p99,
            version: env!("CARGO_PKG_VERSION").to_owned(),
        };
        if let Err(err) = active.worker_heartbeat(info).await {
            tracing::warn!(%err, "worker heartbeat failed");
            shared.store_error(StoreOp::WorkerHeartbeat, &err);
        }
        tokio::select! {
            () = until(&mut done, |d| *d) => return,
            () = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
    }
}

/// Archives what is left in the inboxes before the process ends, so a finished job is
/// archived when `run` returns (and what `tranche archive` drains with): passes until
/// the inboxes are empty or nothing more can be done, which is when a pass archives
/// nothing (`entries == 0`) and leaves entries on stalled shards (a stalled shard stays
/// stalled until repaired; the other shards go on while they archive anything, then the
/// drain ends at once rather than waiting on it). With no stall, entries another live
/// archiver holds are its business for [`DRAIN_CLAIM_IDLE`] (it is finishing its own
/// passes); held longer, they are a dead one's and are taken over. Returns the stalled
/// shards (empty when none is, or the drain was aborted). Publishing the last
/// statistics snapshot is the caller's.
pub(crate) async fn drain_archive(
    backend: &Backend,
    shared: Option<&Shared>,
    stop: &watch::Receiver<Stop>,
) -> Vec<tranche_archive_store::Stall> {
    // Counted as the run's failed store calls, when a run drains.
    let failed = |err: &dyn std::fmt::Display| {
        if let Some(shared) = shared {
            shared.store_error(StoreOp::Archive, err);
        }
    };
    let idle = backend.archive_config.claim_idle.min(DRAIN_CLAIM_IDLE);
    let patience = idle + Duration::from_secs(5);
    let started = Instant::now();
    // Entries other archivers are still writing keep the inboxes from emptying for a
    // few milliseconds at the end of a job: looked at again soon at first, then less
    // often (a dead archiver's entries take `idle`).
    let mut wait = DRAIN_POLL_FIRST;
    loop {
        if *stop.borrow() == Stop::Abort {
            return Vec::new();
        }
        let pass = backend.archive.archive_taking_over(idle).await;
        let left = backend.inbox_len().await;
        match (&pass, &left) {
            (_, Ok(0)) => return Vec::new(),
            (Ok(pass), Ok(_)) if pass.entries > 0 => continue,
            (Ok(pass), Ok(_)) if pass.stalled > 0 => match backend.archive.stalled().await {
                Ok(stalls) if !stalls.is_empty() => return stalls,
                Ok(_) => {}
                Err(err) => {
                    tracing::warn!(%err, "cannot read the stalled shards");
                    failed(&err);
                }
            },
            _ => {}
        }
        if let Err(err) = &pass {
            tracing::warn!(%err, "archive pass failed");
            failed(err);
        }
        if let Err(err) = &left {
            tracing::warn!(%err, "cannot read the inbox length");
            failed(err);
        }
        if started.elapsed() > patience {
            tracing::warn!(
                left = left.ok(),
                "inbox entries are left (held by other archivers?); `tranche archive` will finish them"
            );
            return backend.archive.stalled().await.unwrap_or_default();
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(DRAIN_POLL_MOST);
    }
}

/// How long the final drain lets another archiver hold inbox entries unacknowledged
/// before it takes them over (the archive's own `claim_idle`, 60 s by default, if that
/// is shorter). At the end of a job every live archiver is finishing passes of
/// milliseconds, so entries held this long belong to a process that died mid-pass, and
/// a fleet that lost one finishes seconds after its job rather than a minute. Taking
/// over a live but slow archiver's entries only archives them twice, counted once.
const DRAIN_CLAIM_IDLE: Duration = Duration::from_secs(5);
/// The final drain's first wait for entries other archivers hold.
const DRAIN_POLL_FIRST: Duration = Duration::from_millis(5);
/// Its longest wait: the waits double up to here.
const DRAIN_POLL_MOST: Duration = Duration::from_millis(200);
