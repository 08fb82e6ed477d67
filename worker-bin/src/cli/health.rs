//! Whether the job is well: `check` (the library's check, `crate::check`, printed and
//! judged in one line) and `health` (the alert rules, each read in O(shards), with
//! `--check` the consistency rule too).

use anyhow::Result;
use tranche_archive_store::{ARCHIVE_DAMAGED, ArchiveDamage, Stall};
use tranche_codec::Status;

use crate::backend::Backend;
use crate::check::CheckReport;
use crate::cli::admin::Admin;
use crate::cli::args::HealthArgs;
use crate::cli::render;

use crate::cli::common::Outcome;

pub(crate) async fn check(backend: &Backend, repair: bool, json: bool) -> Result<Outcome> {
    let report = crate::check::check(backend, repair).await?;
    print!(
        "{}",
        render::check(
            &report.differences,
            report.records,
            &report.dead,
            &report.damaged,
            repair,
            json
        )
    );
    Ok(verdict(&report))
}

/// How `check` ends: what it found, or what a repair left, in one line.
fn verdict(report: &CheckReport) -> Outcome {
    let CheckReport {
        differences,
        damaged,
        archive_damage,
        ..
    } = report;
    if report.repaired {
        if !report.left.is_empty() {
            return Outcome::Failed(format!("{}; the rest repaired", report.left.join("; ")));
        }
        return Outcome::Success;
    }
    if report.is_clean() {
        return Outcome::Success;
    }
    let (unreadable, control_invalid) = (report.corrupt, report.control_invalid);
    if control_invalid == differences.len() && damaged.found.is_empty() {
        return Outcome::Failed(format!(
            "{control_invalid} invalid value(s) in the control record, ignored by every reader; `tranche check --repair` restores the last valid ones from the control log"
        ));
    }
    if !archive_damage.is_empty() {
        let mut shards: Vec<String> = archive_damage
            .iter()
            .map(|d| format!("shard {}", d.shard))
            .collect();
        shards.dedup();
        return Outcome::Failed(format!(
            "{} damaged archived value(s) in {}; `tranche check --repair` sets them aside (their records stay counted)",
            archive_damage.len(),
            shards.join(", ")
        ));
    }
    if unreadable > 0 && damaged.found.is_empty() {
        // Only a run whose pids cannot be read is left out of the repair (none fails
        // before a repair is tried).
        let runs = match report.corrupt_left.len() {
            0 => String::new(),
            n => format!(" but {n} run(s) whose pids cannot be read"),
        };
        return Outcome::Failed(format!(
            "{unreadable} corrupt active record(s) among {} difference(s); `tranche check --repair` sets them aside and rebuilds them{runs}",
            differences.len()
        ));
    }
    if damaged.found.is_empty() {
        return Outcome::Failed(format!(
            "{} difference(s); `tranche check --repair` rewrites the statistics and the active counts",
            differences.len()
        ));
    }
    Outcome::Failed(format!(
        "corrupt statistics in {} ({} value(s){}); `tranche check --repair` quarantines them and rebuilds them from the archive",
        render::shards_named(&damaged.found),
        damaged.found.len(),
        match differences.len() {
            0 => String::new(),
            n => format!(", and {n} difference(s)"),
        }
    ))
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
    // A corrupt value in what the summary reads is damage to alert on, not a reason
    // for `health` to fail: the rules that need the summary read it as empty.
    let (stats, unreadable) = match backend.stats.summary().await {
        Ok(stats) => (stats, None),
        Err(err @ tranche_stats::Error::Corrupt { .. }) => (Default::default(), Some(err)),
        Err(err) => return Err(err.into()),
    };
    let stalls = backend.archive.stalled().await?;
    let failures = backend.archive.decode_failures().await?;
    let dead_letters = backend.archive.dead_letter_count().await?;
    let workers = backend.active.workers().await?;
    let live = workers.iter().filter(|w| w.active).count();
    let outstanding = counts.outstanding();
    let planned = crate::cli::progress::total_partitions(backend.active.as_ref()).await?;
    // With `--check`, every statistics value is read: damage no write has met yet.
    let damage = match args.check {
        true => crate::check::find_damage(backend).await?,
        false => Vec::new(),
    };
    let now_ms = crate::duration::now_ms();
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
        stalled_rule(&stalls),
        damaged_rule(&stalls, &damage, unreadable.as_ref()),
        archive_damaged_rule(&backend.archive.damaged().await?),
        control_rule(crate::cli::control::record_of(backend).await?.as_ref()),
        clock_skew_rule(clock_skew_ms(backend).await?, default_skew_bound()),
        overdue_rule(
            backend,
            args,
            counts.running,
            stats.global_stats.p99,
            now_ms,
        )
        .await?,
    ];
    if args.check {
        // Damage makes the statistics unreadable; each damaged value is a difference.
        let differences = if damage.is_empty() {
            crate::check::settled_differences(backend).await?
        } else {
            damage.len()
        };
        rules.push(
            render::Rule::new("statistics_consistency", differences as f64, 0.0).detail(|| {
                match damage.is_empty() {
                    true => "`tranche check` lists the differences".to_owned(),
                    false => format!("corrupt statistics in {}", render::shards_named(&damage)),
                }
            }),
        );
        let corrupt = backend.active.corrupt_records().await?;
        rules.push(
            render::Rule::new("active_records_corrupt", corrupt.len() as f64, 0.0).detail(|| {
                let named: Vec<String> = corrupt
                    .iter()
                    .map(|c| match c.pid {
                        Some(pid) => format!("shard {} pid {pid}", c.shard),
                        None => format!("shard {} run {} (its pids cannot be read)", c.shard, c.key),
                    })
                    .collect();
                format!(
                    "active records that do not decode: {}; `tranche check --repair` sets them aside and rebuilds them",
                    named.join(", ")
                )
            }),
        );
    }
    Ok(rules)
}

/// `archive_stalled_shards`: shards whose archive calls are refused for the shard's
/// own state, so their completions stay in the inbox (set by the archiver's pass that
/// meets the refusal: within a sweep, 30 s, of the damage while an archiver runs;
/// cleared by the first pass that archives the shard again).
fn stalled_rule(stalls: &[Stall]) -> render::Rule {
    render::Rule::new("archive_stalled_shards", stalls.len() as f64, 0.0).detail(|| {
        let now_ms = crate::duration::now_ms();
        stalls
            .iter()
            .map(|s| {
                format!(
                    "archive stalled on shard {} for {}: {}",
                    s.shard,
                    crate::duration::ms(now_ms.saturating_sub(s.since_ms) as f64),
                    s.reason
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    })
}

/// `statistics_damaged`: shards whose statistics hold a value that does not decode,
/// as the archiver found them (a stall for that reason), as `--check` found them
/// (`found`: every value read, so damage no write has met yet) or as the summary
/// `health` reads found them; `tranche check --repair` rebuilds them.
fn damaged_rule(
    stalls: &[Stall],
    found: &[tranche_stats::Damage],
    unreadable: Option<&tranche_stats::Error>,
) -> render::Rule {
    let mut damaged: Vec<u32> = stalls
        .iter()
        .filter(|s| s.stats_damaged())
        .map(|s| s.shard)
        .chain(found.iter().map(|d| d.shard))
        .collect();
    damaged.sort_unstable();
    damaged.dedup();
    let value = damaged.len().max(usize::from(unreadable.is_some()));
    render::Rule::new("statistics_damaged", value as f64, 0.0).detail(|| {
        let mut said: Vec<String> = damaged
            .iter()
            .map(|s| format!("statistics damaged on shard {s}"))
            .collect();
        if let Some(err) = unreadable {
            said.push(err.to_string());
        }
        format!(
            "{}; `tranche check --repair` rebuilds them from the archive",
            said.join("; ")
        )
    })
}

/// `archive_damaged`: archived values that do not decode, as reads met them (`get`,
/// `list`, `check`, the archiver's sealing) or the archiver's scrub found them (a
/// slice of the archive after every sweep); cleared as `tranche check --repair` sets
/// them aside.
fn archive_damaged_rule(damaged: &[ArchiveDamage]) -> render::Rule {
    render::Rule::new("archive_damaged", damaged.len() as f64, 0.0).detail(|| {
        let named: Vec<String> = damaged.iter().map(ArchiveDamage::location).collect();
        format!(
            "{ARCHIVE_DAMAGED}: {}; `tranche check --repair` sets them aside (their records stay counted)",
            named.join(", ")
        )
    })
}

/// `control_record_invalid`: values of the namespace's control record that break the
/// write rules, which every reader ignores (the workers' own options apply in their
/// place); `tranche check --repair` restores the last valid ones from the control log.
fn control_rule(record: Option<&tranche_control::ControlRecord>) -> render::Rule {
    let rejected = record.map_or(&[][..], |r| r.rejected.as_slice());
    render::Rule::new("control_record_invalid", rejected.len() as f64, 0.0).detail(|| {
        let named: Vec<String> = rejected.iter().map(ToString::to_string).collect();
        format!(
            "{{ns}}:control values ignored: {}; `tranche check --repair` restores the last valid ones",
            named.join("; ")
        )
    })
}

/// This process's clock less the Redis server's `TIME`, ms (`None` embedded: one
/// process, one clock; and when the server refuses `TIME`, as a user without `+time`
/// does, said in a WARN: the other rules still read).
pub(crate) async fn clock_skew_ms(backend: &Backend) -> Result<Option<i64>> {
    let Some(redis) = backend.redis() else {
        return Ok(None);
    };
    match redis.active.clock_skew_ms().await {
        Ok(ms) => Ok(Some(ms)),
        Err(err) if err.is_permanent() => {
            tracing::warn!(%err, "cannot read the server's TIME: clock_skew is not checked (grant the user +time)");
            Ok(None)
        }
        Err(err) => Err(err.into()),
    }
}

/// The clock skew a fleet at the default lease may have: a twelfth of it (2.5 s at
/// 30 s).
pub(crate) fn default_skew_bound() -> std::time::Duration {
    use crate::defaults::RunDefaults;
    crate::held::skew_bound(RunDefaults::duration(RunDefaults::RUN.lease))
}

/// The clock of the process reading (`health`, `serve`) against the Redis server's,
/// in seconds either way, against `bound`: deadlines are set and reaped by each
/// process's own clock, so a fleet whose clocks are further apart than a holder's
/// margin can reap a lease while its holder still works.
fn clock_skew_rule(skew_ms: Option<i64>, bound: std::time::Duration) -> render::Rule {
    let skew = skew_ms.unwrap_or(0);
    render::Rule::new(
        "clock_skew",
        skew.unsigned_abs() as f64 / 1000.0,
        bound.as_secs_f64(),
    )
    .detail(|| {
        format!(
            "this clock is {} ms {} the Redis server's TIME; leases need every process within {} ms of the others (a twelfth of the lease): keep the fleet on NTP",
            skew.unsigned_abs(),
            if skew > 0 { "ahead of" } else { "behind" },
            bound.as_millis()
        )
    })
}

/// How many times the p99 partition duration a partition may run before it is overdue
/// (unless `--max-partition-time` is longer).
const OVERDUE_P99S: f64 = 10.0;

/// `longest_partition_seconds`: the longest a running partition whose lease is still
/// live (its worker heartbeats: a hung handler, not a dead worker, which the reaper
/// handles) has been held, against its expected time, the longer of
/// `--max-partition-time` and [`OVERDUE_P99S`] times the p99 partition duration. Reads
/// the active records only while some partition runs.
async fn overdue_rule(
    backend: &Backend,
    args: &HealthArgs,
    running: u64,
    p99_s: f64,
    now_ms: u64,
) -> Result<render::Rule> {
    let expected_s = args
        .max_partition_time
        .as_secs_f64()
        .max(OVERDUE_P99S * p99_s);
    let mut held: Vec<(u64, f64)> = Vec::new();
    if running > 0 {
        // Damage the read cannot pass by (a plan entry or cursor that does not read; a
        // corrupt record or run is only left out) stops it: no partition is held as far
        // as this rule can tell.
        let partitions = match backend.active.all_active().await {
            Ok(snapshot) => snapshot.partitions,
            Err(err @ tranche_active_store::Error::Corrupt { .. }) => {
                tracing::warn!(%err, "cannot read the active records; `tranche check` lists what does not decode");
                Vec::new()
            }
            Err(err) => return Err(err.into()),
        };
        for p in partitions {
            let live = p.deadline_ms.is_some_and(|d| d > now_ms);
            if let (Status::Running, true, Some(claimed)) = (p.status, live, p.claimed_at_ms) {
                held.push((p.pid, now_ms.saturating_sub(claimed) as f64 / 1000.0));
            }
        }
    }
    let longest = held.iter().map(|&(_, s)| s).fold(0.0, f64::max);
    Ok(
        render::Rule::new("longest_partition_seconds", longest, expected_s).detail(|| {
            let over: Vec<String> = held
                .iter()
                .filter(|&&(_, s)| s > expected_s)
                .map(|&(pid, s)| format!("{pid} ({})", crate::duration::ms(s * 1000.0)))
                .collect();
            format!(
                "partition(s) running past their expected {} with live heartbeats (a hung handler?): {}",
                crate::duration::ms(expected_s * 1000.0),
                over.join(", ")
            )
        }),
    )
}

#[cfg(test)]
mod tests {
    /// The seam the skew comes through: a skew past a twelfth of the lease fires,
    /// either way, naming the direction; one within it, or none (embedded), is quiet.
    #[test]
    fn clock_skew_fires_past_a_twelfth_of_the_lease() {
        let bound = super::default_skew_bound();
        assert_eq!(bound, std::time::Duration::from_millis(2500));
        for skew in [2501_i64, -2501, 60_000] {
            let rule = super::clock_skew_rule(Some(skew), bound);
            assert!(rule.firing(), "{skew}: {rule:?}");
            let detail = rule.detail.expect("a detail while firing");
            assert!(
                detail.contains(&skew.unsigned_abs().to_string()),
                "{detail}"
            );
            let side = if skew > 0 { "ahead of" } else { "behind" };
            assert!(detail.contains(side), "{detail}");
        }
        for skew in [Some(0), Some(2500), Some(-2500), Some(-3), None] {
            let rule = super::clock_skew_rule(skew, bound);
            assert!(
                !rule.firing() && rule.detail.is_none(),
                "{skew:?}: {rule:?}"
            );
        }
    }
}
