//! Whether the job is well: `check` (statistics recomputed from the archive and active
//! counts from the records, `--repair` fixes) and `health` (the alert rules, each read in
//! O(shards), with `--check` the consistency rule too).

use anyhow::Result;
use tranche_active_store::StatusCounts;
use tranche_stats::{Stats, StatsDelta, diff};

use crate::backend::Backend;
use crate::cli::args::HealthArgs;
use crate::cli::render;

use crate::cli::ops::Outcome;

/// The statistics delta of every archived record, one per shard, read page by page
/// across the plans: memory grows with workers, ranges and days, never with the archive.
async fn archived_deltas(backend: &Backend) -> Result<Vec<StatsDelta>> {
    let schema = backend.schema()?;
    let mut deltas = vec![StatsDelta::default(); backend.shards as usize];
    for entry in backend.active.plans().await? {
        let mut from = entry.plan.first_pid();
        let last = entry.plan.last_pid();
        loop {
            let page = backend.archive.range(from..=last, 10_000).await?;
            for r in &page.records {
                deltas[schema.shard_of(r.pid) as usize].add(r);
            }
            match page.next {
                Some(next) => from = next,
                None => break,
            }
        }
    }
    Ok(deltas)
}

/// Recomputes the statistics from the archive; repairs each shard if asked.
async fn check_stats(
    backend: &Backend,
    repair: bool,
) -> Result<(Vec<tranche_stats::Difference>, u64)> {
    let deltas = archived_deltas(backend).await?;
    let expected = Stats::from_deltas(&deltas);
    let found = backend.stats.stats().await?;
    let differences = diff(&expected, &found);
    let count = deltas.iter().map(StatsDelta::len).sum();
    if repair && !differences.is_empty() {
        backend.ensure_writable()?;
        for (shard, delta) in deltas.iter().enumerate() {
            backend.stats.replace(shard as u32, delta).await?;
        }
        backend.save().await?;
    }
    Ok((differences, count))
}

/// The active layer's kept status counts against a count of its records, as
/// differences under `active_counts.` (the counters are kept by the Redis scripts; a
/// process of a version without them, writing alongside, puts them off). Read while
/// nothing runs: a claim between the two reads shows as a difference.
async fn check_counts(backend: &Backend, repair: bool) -> Result<Vec<tranche_stats::Difference>> {
    let kept = backend.active.counts().await?;
    let snapshot = backend.active.all_active().await?;
    let mut counted = StatusCounts {
        unissued: snapshot.unissued.iter().map(|u| u.count).sum(),
        ..StatusCounts::default()
    };
    for p in &snapshot.partitions {
        counted.add(p.status);
    }
    let differences: Vec<_> = [
        ("unissued", counted.unissued, kept.unissued),
        ("pending", counted.pending, kept.pending),
        ("claimed", counted.claimed, kept.claimed),
        ("running", counted.running, kept.running),
        ("failed", counted.failed, kept.failed),
        ("discarded", counted.discarded, kept.discarded),
    ]
    .into_iter()
    .filter(|(_, want, got)| want != got)
    .map(|(name, want, got)| tranche_stats::Difference {
        path: format!("active_counts.{name}"),
        expected: Some(want.to_string()),
        found: Some(got.to_string()),
    })
    .collect();
    if repair && !differences.is_empty() {
        backend.ensure_writable()?;
        backend.recount_active().await?;
    }
    Ok(differences)
}

/// The dead letters: with `repair`, each validated against the plans and the archive
/// again and re-driven, dropped or kept ([`Redrive`]); without, only counted. Runs
/// before the statistics are checked, so a record re-driven is in that check.
async fn check_dead_letters(backend: &Backend, repair: bool) -> Result<render::DeadLetters> {
    let found = backend.archive.dead_letter_count().await?;
    if !repair || found == 0 {
        return Ok(render::DeadLetters {
            found,
            redriven: None,
        });
    }
    backend.ensure_writable()?;
    let planned: Vec<_> = backend
        .active
        .plans()
        .await?
        .iter()
        .map(|e| e.plan.first_pid()..=e.plan.last_pid())
        .collect();
    let redrive = backend.archive.redrive_dead_letters(&planned).await?;
    backend.save().await?;
    Ok(render::DeadLetters {
        found,
        redriven: Some(redrive),
    })
}

pub(crate) async fn check(backend: &Backend, repair: bool, json: bool) -> Result<Outcome> {
    let dead = check_dead_letters(backend, repair).await?;
    let (mut differences, records) = check_stats(backend, repair).await?;
    differences.extend(check_counts(backend, repair).await?);
    print!(
        "{}",
        render::check(&differences, records, &dead, repair, json)
    );
    if differences.is_empty() || repair {
        Ok(Outcome::Success)
    } else {
        Ok(Outcome::Failed(format!(
            "{} difference(s); `tranche check --repair` rewrites the statistics and the active counts",
            differences.len()
        )))
    }
}

pub(crate) async fn health(backend: &Backend, args: &HealthArgs, json: bool) -> Result<Outcome> {
    let rules = health_rules(backend, args).await?;
    print!("{}", render::health(&rules, json));
    let firing: Vec<&str> = rules
        .iter()
        .filter(|r| r.firing())
        .map(|r| r.name)
        .collect();
    if firing.is_empty() {
        Ok(Outcome::Success)
    } else {
        Ok(Outcome::Failed(format!(
            "alert firing: {}",
            firing.join(", ")
        )))
    }
}

/// Every alert rule with its reading, in O(shards) (plus a full check with `--check`).
pub(crate) async fn health_rules(
    backend: &Backend,
    args: &HealthArgs,
) -> Result<Vec<render::Rule>> {
    let counts = backend.active.counts().await?;
    let inbox = backend.inbox_len().await?;
    let stats = backend.stats.summary().await?;
    let failures = backend.archive.decode_failures().await?;
    let dead_letters = backend.archive.dead_letter_count().await?;
    let workers = backend.active.workers().await?;
    let live = workers.iter().filter(|w| w.active).count();
    let outstanding = counts.outstanding();
    let planned = crate::cli::progress::total_partitions(backend.active.as_ref()).await?;
    let now_ms = crate::now_ms();
    // Minutes since anything was last archived, while work is outstanding. Before the
    // first archive, since the oldest live worker started: a fleet stuck from its start
    // is stalled too. 0 when the job is done or no worker runs (then
    // `outstanding_no_worker` tells).
    let last_ms = match stats.global_stats.last_updated {
        last if last > 0.0 => Some((last * 1000.0) as u64),
        _ => workers
            .iter()
            .filter(|w| w.active)
            .map(|w| w.info.started_ms)
            .min(),
    };
    let stalled_min = match last_ms {
        Some(ms) if outstanding > 0 => now_ms.saturating_sub(ms) as f64 / 60_000.0,
        _ => 0.0,
    };
    let lag_s = backend
        .inbox_oldest_ms()
        .await?
        .map_or(0.0, |ms| now_ms.saturating_sub(ms) as f64 / 1000.0);
    let mut rules = vec![
        render::Rule::new(
            "active_partitions",
            (counts.claimed + counts.running) as f64,
            args.max_active as f64,
        ),
        render::Rule::new("archive_queue", inbox as f64, args.max_inbox as f64),
        render::Rule::new(
            "archive_lag_seconds",
            lag_s,
            args.max_archive_lag.as_secs_f64(),
        ),
        render::Rule::new(
            "decode_failure_rate",
            failures as f64 / stats.global_stats.total_completed.max(1) as f64,
            0.01,
        ),
        render::Rule::new(
            "worker_update_p99_ms",
            workers
                .iter()
                .filter(|w| w.active)
                .map(|w| w.info.latency_p99_ms)
                .fold(0.0, f64::max),
            args.max_update_p99_ms,
        ),
        render::Rule::new(
            "failed_partitions",
            counts.failed as f64,
            args.max_failed as f64,
        ),
        render::Rule::new(
            "failed_share",
            counts.failed as f64 / planned.max(1) as f64,
            args.max_failed_share,
        ),
        render::Rule::new(
            "outstanding_no_worker",
            if live == 0 { outstanding as f64 } else { 0.0 },
            0.0,
        ),
        render::Rule::new(
            "stalled_minutes",
            stalled_min,
            args.max_stall.as_secs_f64() / 60.0,
        ),
        render::Rule::new("dead_letters", dead_letters as f64, 0.0),
    ];
    if args.check {
        let (differences, _) = check_stats(backend, false).await?;
        rules.push(render::Rule::new(
            "statistics_consistency",
            differences.len() as f64,
            0.0,
        ));
    }
    Ok(rules)
}
