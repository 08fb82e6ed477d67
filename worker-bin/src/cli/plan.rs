//! `plan`: cuts an ID range into partitions and writes the plan, or refuses one that
//! differs from the namespace's.

use anyhow::{Context, Result};
use tranche_active_store::{Config as ActiveConfig, MemoryActiveStore, Plan, Planner};

use crate::backend::Backend;
use crate::cli::admin::Admin;
use crate::cli::args::PlanArgs;
use crate::cli::common::Outcome;
use crate::cli::render;

pub(super) async fn plan(backend: &Backend, args: &PlanArgs, json: bool) -> Result<Outcome> {
    // Validate as the store will, before anything is written.
    let geometry = tranche_codec::PlanGeometry::new(1, args.min, args.max, args.size)
        .map_err(|e| anyhow::anyhow!("invalid plan: {e}"))?;
    let plan = Plan::Uniform {
        min: args.min,
        max: args.max,
        size: args.size,
    };
    if args.dry_run {
        // The store's own validation, on a scratch copy of the plan registry: a dry
        // run refuses exactly what `plan` would (an overlap with an existing plan, a
        // plan past what the shards' bitmaps hold), with the same message.
        let scratch = MemoryActiveStore::new(ActiveConfig {
            namespace: backend.namespace.clone(),
            num_shards: backend.shards,
            layout: backend.schema()?.layout(),
            ..ActiveConfig::default()
        })?;
        for entry in backend.active.plans().await? {
            scratch.plan(&Plan::from(&entry)).await?;
        }
        scratch.plan(&plan).await.map_err(plan_refused)?;
        print!(
            "{}",
            render::plan_cost(&geometry, backend.shards, &args.tiers.tiers(), json)
        );
        return Ok(Outcome::Success);
    }
    backend.ensure_writable()?;
    let outcome = backend.active.plan(&plan).await.map_err(plan_refused)?;
    backend.register_namespace().await?;
    backend.save().await?;
    let entry = outcome
        .entries
        .last()
        .context("the store returned no plan")?;
    let p = &entry.plan;
    if json {
        println!(
            "{}",
            serde_json::json!({
                "namespace": backend.namespace, "created": outcome.created,
                "first_pid": p.first_pid(), "last_pid": p.last_pid(), "partitions": p.partitions(),
                "min_id": p.min(), "max_id": p.max(), "size": p.size(), "shards": backend.shards,
            })
        );
    } else if outcome.created {
        println!(
            "planned {} partitions (pids {}..={}, IDs {}..={} by {}) in `{}` on {}",
            p.partitions(),
            p.first_pid(),
            p.last_pid(),
            p.min(),
            p.max(),
            p.size(),
            backend.namespace,
            backend.location()
        );
    } else {
        println!(
            "already planned: pids {}..={} in `{}`; nothing changed",
            p.first_pid(),
            p.last_pid(),
            backend.namespace
        );
    }
    Ok(Outcome::Success)
}

/// The store's refusal of a plan as the command says it.
pub(super) fn plan_refused(e: tranche_active_store::Error) -> anyhow::Error {
    match e {
        // The store's refusal already says "invalid plan: …".
        tranche_active_store::Error::InvalidPlan(_) => anyhow::Error::new(e),
        other => anyhow::Error::new(other).context("cannot register the plan"),
    }
}
