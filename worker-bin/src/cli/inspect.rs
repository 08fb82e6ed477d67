//! The readers `status`, `get` and their refusals share with `serve`'s API: where a
//! namespace stands, one partition's state in a word, and its pieces.

use anyhow::Result;

use crate::backend::Backend;
use crate::cli::render;

/// What `status` shows, read in O(shards).
pub(crate) async fn status_of(backend: &Backend) -> Result<render::Status> {
    Ok(render::Status {
        namespace: backend.namespace.clone(),
        location: backend.location(),
        shards: backend.shards,
        total: crate::cli::progress::total_partitions(backend.active.as_ref()).await?,
        counts: backend.active.counts().await?,
        archived: backend.stats.summary().await?.global_stats.total_completed,
        inbox: backend.inbox_len().await?,
        workers: backend
            .active
            .workers()
            .await?
            .iter()
            .filter(|w| w.active)
            .count(),
        decode_failures: backend.archive.decode_failures().await?,
        dead_letters: backend.archive.dead_letter_count().await?,
        paused: backend.active.is_paused().await?,
        control: crate::cli::control::record_of(backend).await?,
    })
}

/// What `get` would call `pid`'s state, in one word, for a refusal's message
/// (`unreadable` when even that read fails).
pub(crate) async fn state_of(backend: &Backend, pid: u64) -> &'static str {
    use tranche_router::PartitionView;
    match backend.router.get(pid).await {
        Ok(PartitionView::Active(p)) => p.status.as_str(),
        Ok(PartitionView::Unknown) => "unknown",
        Ok(_) => "completed",
        Err(_) => "unreadable",
    }
}

/// The pieces a split cut off `view`'s partition while it is active (`get`, and the
/// dashboard's `/api/v1/get/PID`); none for any other answer.
pub(crate) async fn pieces_of(
    active: &dyn tranche_active_store::ActiveStore,
    view: &tranche_router::PartitionView,
) -> Result<Vec<tranche_active_store::Piece>, tranche_active_store::Error> {
    match view {
        tranche_router::PartitionView::Active(p) => active.pieces(p.pid).await,
        _ => Ok(Vec::new()),
    }
}
