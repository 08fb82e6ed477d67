//! Commands about whole namespaces: `pause`, `resume`, `archive-format`, `plans`,
//! `namespaces`, `drop`.

use std::fmt::Write as _;

use anyhow::{Result, bail};
use serde_json::{Value, json};
use tranche_archive_store::ArchiveFormat;

use crate::backend::{self, Backend, Connections, Open, Tuning};
use crate::cli::admin::Admin;
use crate::cli::common::Global;
use crate::cli::common::Outcome;

/// `pause` / `resume`: sets the namespace's flag; workers read it once a second.
pub(crate) async fn set_paused(g: &Global, paused: bool) -> Result<Outcome> {
    let backend = Backend::open(&g.location(), Open::Existing, Tuning::default()).await?;
    if backend.is_embedded() {
        bail!(
            "pause and resume need --redis: an embedded namespace has one process at a time (stop its run with Ctrl-C)"
        );
    }
    backend.active.set_paused(paused).await?;
    crate::cli::common::say(
        g.json,
        format_args!(
            "namespace `{}` {}",
            backend.namespace,
            if paused {
                "paused: workers claim nothing until `tranche resume` (running partitions finish)"
            } else {
                "resumed"
            }
        ),
        json!({"namespace": backend.namespace, "paused": paused}),
    );
    Ok(Outcome::Success)
}

/// `archive-format [--raise N]`: the namespace's archive format, raised when asked.
pub(crate) async fn archive_format(g: &Global, raise: Option<u8>) -> Result<Outcome> {
    let backend = Backend::open(&g.location(), Open::Existing, Tuning::default()).await?;
    let Some(archive) = backend.redis_archive() else {
        bail!(
            "archive-format needs --redis: an embedded namespace keeps its archive in its state file, which has no segment format"
        );
    };
    let before = archive.format().await?;
    let asked =
        raise.map(|n| ArchiveFormat::from_number(u64::from(n)).expect("clap allows 1..=3 only"));
    let now = match asked {
        Some(to) if to > before => archive.raise_format(to).await?,
        _ => before,
    };
    let latest = ArchiveFormat::LATEST.number();
    let text = match asked {
        Some(to) if to < before => format!(
            "archive format stays {}: a format is never lowered",
            now.number()
        ),
        Some(_) if now > before => format!(
            "archive format raised from {} to {}: archivers write it from their next sweep",
            before.number(),
            now.number()
        ),
        _ => format!(
            "archive format {} (this version writes up to {latest})",
            now.number()
        ),
    };
    crate::cli::common::say(
        g.json,
        format_args!("{text}"),
        json!({
            "namespace": backend.namespace,
            "archive_format": now.number(),
            "was": before.number(),
            "latest": latest,
        }),
    );
    Ok(Outcome::Success)
}

/// `plans`: every plan of the namespace with its geometry.
pub(crate) async fn plans(g: &Global) -> Result<Outcome> {
    let backend = Backend::open(&g.location(), Open::Existing, Tuning::default()).await?;
    let plans = backend.active.plans().await?;
    if g.json {
        println!("{}", plans_json(&plans));
        return Ok(Outcome::Success);
    }
    if plans.is_empty() {
        println!("no plans");
        return Ok(Outcome::Success);
    }
    let mut out = format!(
        "{:<23} {:<27} {:>10} {:>12}  kind\n",
        "pids", "ids", "size", "partitions"
    );
    for e in &plans {
        let p = &e.plan;
        let _ = writeln!(
            out,
            "{:<23} {:<27} {:>10} {:>12}  {}",
            format!("{}..={}", p.first_pid(), p.last_pid()),
            format!("{}..={}", p.min(), p.max()),
            p.size(),
            p.last_pid() - p.first_pid() + 1,
            if e.explicit { "explicit" } else { "uniform" }
        );
    }
    print!("{out}");
    Ok(Outcome::Success)
}

/// The plans as `plans --json` prints them.
pub(crate) fn plans_json(plans: &[tranche_active_store::PlanEntry]) -> Value {
    plans
        .iter()
        .map(|e| {
            let p = &e.plan;
            json!({
                "first_pid": p.first_pid(), "last_pid": p.last_pid(),
                "min_id": p.min(), "max_id": p.max(), "size": p.size(),
                "partitions": p.last_pid() - p.first_pid() + 1,
                "kind": if e.explicit { "explicit" } else { "uniform" },
            })
        })
        .collect()
}

/// Every namespace on the Redis (or beside the state file) with its size and state,
/// each read in O(shards): what `namespaces` prints and `serve` shows as its overview.
/// On Redis every namespace is read through the one connection of `connections`.
pub(crate) async fn overview(g: &Global, connections: &Connections) -> Result<Vec<Value>> {
    let embedded = g.redis.is_none() && g.redis_file.is_none();
    let targets: Vec<(String, Option<std::path::PathBuf>)> = if embedded {
        // Each state file beside this one holds one namespace, whatever the file's
        // name (`--state` may name it freely): ask the file.
        let path = backend::state_path(&g.location());
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
            _ => std::path::PathBuf::from("."),
        };
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .map(|d| {
                d.flatten()
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "state"))
                    .collect()
            })
            .unwrap_or_default();
        files.sort();
        files
            .into_iter()
            .filter_map(|file| match crate::state::load(&file) {
                Ok(Some(saved)) => Some((saved.active.namespace.clone(), Some(file))),
                Ok(None) => None,
                Err(err) => {
                    tracing::warn!(file = %file.display(), %err, "not a state file; left out");
                    None
                }
            })
            .collect()
    } else {
        crate::cli::admin::namespace_names(&g.location(), connections)
            .await?
            .into_iter()
            .map(|name| (name, None))
            .collect()
    };
    let mut rows = Vec::new();
    for (name, file) in targets {
        let mut global = g.clone();
        global.namespace = name.clone();
        if file.is_some() {
            global.state = file;
        }
        let backend = match Backend::open_with(
            &global.location(),
            Open::Existing,
            Tuning::default(),
            connections,
        )
        .await
        {
            Ok(b) => b,
            Err(err) => {
                tracing::warn!(namespace = %name, %err, "cannot open; left out");
                continue;
            }
        };
        let total = crate::cli::progress::total_partitions(backend.active.as_ref()).await?;
        let counts = backend.active.counts().await?;
        let paused = backend.active.is_paused().await?;
        let finished = total
            .saturating_sub(counts.outstanding())
            .saturating_sub(counts.failed)
            .saturating_sub(counts.discarded);
        rows.push(json!({
            "namespace": name, "shards": backend.shards, "partitions": total,
            "finished": finished, "outstanding": counts.outstanding(),
            "failed": counts.failed, "discarded": counts.discarded, "paused": paused,
        }));
    }
    Ok(rows)
}

/// `namespaces`: [`overview`] as a table or JSON.
pub(crate) async fn list(g: &Global) -> Result<Outcome> {
    let rows = overview(g, &Connections::default()).await?;
    if g.json {
        println!("{}", Value::Array(rows));
        return Ok(Outcome::Success);
    }
    if rows.is_empty() {
        println!("no namespaces");
        return Ok(Outcome::Success);
    }
    let mut out = format!(
        "{:<24} {:>6} {:>12} {:>12} {:>9}  state\n",
        "namespace", "shards", "partitions", "outstanding", "failed"
    );
    for r in &rows {
        let n = |field: &str| r[field].as_u64().unwrap_or(0);
        let _ = writeln!(
            out,
            "{:<24} {:>6} {:>12} {:>12} {:>9}  {}",
            crate::cli::render::shown(r["namespace"].as_str().unwrap_or("")),
            n("shards"),
            n("partitions"),
            n("outstanding"),
            n("failed"),
            if r["paused"] == true { "paused" } else { "" }
        );
    }
    print!("{out}");
    Ok(Outcome::Success)
}

/// `drop`: deletes the namespace. Needs `--yes`; refused while a worker is alive unless
/// `--force`.
pub(crate) async fn drop(g: &Global, yes: bool, force: bool) -> Result<Outcome> {
    if !yes {
        bail!(
            "drop deletes namespace `{}` and everything in it for good; pass --yes to do it",
            g.namespace
        );
    }
    let backend = Backend::open(&g.location(), Open::Existing, Tuning::default()).await?;
    backend.ensure_writable()?;
    let live: Vec<String> = backend
        .active
        .workers()
        .await?
        .into_iter()
        .filter(|w| w.active)
        .map(|w| w.info.id)
        .collect();
    if !live.is_empty() && !force {
        bail!(
            "namespace `{}` has {} live worker(s) ({}); stop them first, or pass --force",
            backend.namespace,
            live.len(),
            live.join(", ")
        );
    }
    let deleted = backend.drop_all().await?;
    let text = if backend.is_embedded() {
        format!(
            "namespace `{}` dropped (state file removed)",
            backend.namespace
        )
    } else {
        format!("namespace `{}` dropped ({deleted} keys)", backend.namespace)
    };
    crate::cli::common::say(
        g.json,
        text,
        json!({"namespace": backend.namespace, "dropped": true, "keys": deleted}),
    );
    Ok(Outcome::Success)
}
