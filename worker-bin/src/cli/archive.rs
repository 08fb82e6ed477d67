//! `archive`: drains the archive's queue into compressed batches, reporting stalls.

use std::time::Duration;

use anyhow::Result;
use tranche_archive_store::Snapshots;

use crate::backend::{Backend, Open, Tuning};
use crate::cli::admin::Admin;
use crate::cli::args::ArchiveArgs;
use crate::cli::common::{Global, Outcome, say, signals};
use crate::cli::render;
use crate::slot;
use crate::work::Stop;

/// The one line a drain that ended on stalled shards says: which, what is left, why
/// and how to repair.
pub(super) fn stalled_outcome(stalls: &[tranche_archive_store::Stall], left: &str) -> String {
    let shards: Vec<String> = stalls.iter().map(|s| s.shard.to_string()).collect();
    let why: Vec<String> = stalls
        .iter()
        .map(|s| format!("shard {}: {}", s.shard, render::shown(&s.reason)))
        .collect();
    let repair = if stalls.iter().all(|s| s.stats_damaged()) {
        "`tranche check --repair` rebuilds damaged statistics, then `tranche archive` drains them"
    } else {
        "`tranche check` names the damage and `tranche check --repair` repairs it, then `tranche archive` drains them"
    };
    format!(
        "archive stalled on shard{} {}: {left} left ({}); {repair}",
        if shards.len() == 1 { "" } else { "s" },
        shards.join(", "),
        why.join("; "),
    )
}

/// `n inbox entries`.
pub(super) fn entries(n: u64) -> String {
    format!("{n} inbox entr{}", if n == 1 { "y" } else { "ies" })
}

/// Archive bytes per archived partition in the embedded store: its dump's size.
pub(super) async fn embedded_archive_bytes(backend: &Backend) -> Option<render::ArchiveBytes> {
    let dump = backend
        .archive
        .export(crate::duration::now_ms())
        .await
        .ok()?;
    let entries = dump.entries();
    let bytes = dump.to_bytes().ok()?.len();
    (entries > 0).then(|| render::ArchiveBytes::Dump(bytes as f64 / entries as f64))
}

pub(super) async fn archive(g: &Global, args: ArchiveArgs) -> Result<Outcome> {
    let ArchiveArgs {
        follow,
        tiers,
        snapshots,
    } = args;
    let mut slot = None;
    let tuning = Tuning {
        tiers: Some(tiers.tiers()),
        consumer: format!("archiver-{}", slot::default_name("archiver", &mut slot)),
        claim_idle: crate::duration::claim_idle(),
        ..Tuning::default()
    };
    let stop = signals(Duration::from_secs(5))?;
    let backend = Backend::open_writable(&g.location(), Open::Existing, tuning).await?;
    if follow {
        let mut s = stop.clone();
        let snapshots = Snapshots {
            stats: backend.stats.clone(),
            policy: snapshots.policy(),
        };
        tranche_archive_store::run(backend.archive.as_ref(), Some(snapshots), async move {
            let _ = s.wait_for(|s| *s != Stop::Running).await;
        })
        .await;
    }
    let stalls = crate::work::drain_archive(&backend, None, &stop).await;
    if let Err(err) = backend.stats.publish_snapshot().await {
        tracing::warn!(%err, "statistics snapshot failed");
    }
    backend.save().await?;
    let left = backend.inbox_len().await?;
    if left == 0 || stalls.is_empty() {
        say(
            g.json,
            format_args!("archive drained; {} left", entries(left)),
            serde_json::json!({"inbox_left": left}),
        );
    } else {
        let mut text = format!(
            "archived what could be; {} left, on stalled shard(s):",
            entries(left)
        );
        for s in &stalls {
            text.push_str(&format!(
                "\n  shard {}: {}",
                s.shard,
                render::shown(&s.reason)
            ));
        }
        say(
            g.json,
            text,
            serde_json::json!({"inbox_left": left, "stalled": stalls}),
        );
    }
    if *stop.borrow() != Stop::Running {
        return Ok(Outcome::Interrupted);
    }
    if left > 0 && !stalls.is_empty() {
        return Ok(Outcome::Failed(stalled_outcome(&stalls, &entries(left))));
    }
    Ok(Outcome::Success)
}
