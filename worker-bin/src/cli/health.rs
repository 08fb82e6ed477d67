//! Whether the job is well: `check` (statistics recomputed from the archive and active
//! counts from the records, `--repair` fixes) and `health` (the alert rules, each read in
//! O(shards), with `--check` the consistency rule too).

use anyhow::{Context, Result};
use tranche_active_store::StatusCounts;
use tranche_archive_store::{ARCHIVE_DAMAGED, ArchiveDamage, Stall};
use tranche_codec::Status;
use tranche_stats::{Damage, Stats, StatsDelta, diff};

use crate::backend::Backend;
use crate::cli::admin::Admin;
use crate::cli::args::HealthArgs;
use crate::cli::render;

use crate::cli::common::Outcome;

/// The statistics delta of every archived record that decodes, one per shard, read
/// page by page across the plans (memory grows with workers, ranges and days, never
/// with the archive), and every archived value that does not decode.
async fn archived_deltas(backend: &Backend) -> Result<(Vec<StatsDelta>, Vec<ArchiveDamage>)> {
    let schema = backend.schema()?;
    let mut deltas = vec![StatsDelta::default(); backend.shards as usize];
    let mut damaged: Vec<ArchiveDamage> = Vec::new();
    for entry in backend.active.plans().await? {
        let mut from = entry.plan.first_pid();
        let last = entry.plan.last_pid();
        loop {
            let page = backend.archive.range(from..=last, 10_000).await?;
            for r in &page.records {
                deltas[schema.shard_of(r.pid) as usize].add(r);
            }
            for d in page.damaged {
                if !damaged.iter().any(|o| o.key == d.key && o.field == d.field) {
                    damaged.push(d);
                }
            }
            match page.next {
                Some(next) => from = next,
                None => break,
            }
        }
    }
    Ok((deltas, damaged))
}

/// The statistics kept against those recomputed from `deltas` (the archived records
/// that decode). With `lost` records set aside as damaged (still counted, never to be
/// read again) only the count can be compared: the records that decode plus the lost
/// ones against the count kept.
/// Returns the differences and the completed counts, (archived, kept).
async fn compare_stats(
    backend: &Backend,
    deltas: &[StatsDelta],
    lost: u64,
) -> Result<(Vec<tranche_stats::Difference>, (u64, u64))> {
    let mut expected = Stats::from_deltas(deltas);
    expected.global_stats.total_completed += lost;
    let found = backend.stats.stats().await?;
    let counts = (
        expected.global_stats.total_completed,
        found.global_stats.total_completed,
    );
    let differences = diff(&expected, &found);
    if lost == 0 {
        return Ok((differences, counts));
    }
    let differences = differences
        .into_iter()
        .filter(|d| d.path == "global_stats.total_completed")
        .collect();
    Ok((differences, counts))
}

/// How many times `health --check` reads the archive looking for a moment no archive
/// pass ran in before it judges from the counts alone.
const SETTLE_TRIES: usize = 3;

/// `health --check`'s statistics differences, read while archivers may write. An
/// archive pass moves a shard's records and statistics in one atomic step, so when the
/// completed count reads the same before and after the archive is read, nothing moved
/// in between and every difference is real. Archived to the end of each try, it judges
/// only what no pass in flight explains: a count of archived records outside the
/// counts read before and after (counted twice, or lost).
async fn settled_differences(backend: &Backend) -> Result<usize> {
    let mut tries = 0;
    loop {
        tries += 1;
        let before = backend.stats.summary().await?.global_stats.total_completed;
        let (deltas, archive_damage) = archived_deltas(backend).await?;
        if !archive_damage.is_empty() {
            // Unreadable archived values: `archive_damaged` names them.
            return Ok(0);
        }
        let lost = backend.archive.lost_records().await?;
        let (differences, (archived, after)) = compare_stats(backend, &deltas, lost).await?;
        let read = SettleRead {
            before,
            archived,
            after,
            differences: differences.len(),
        };
        if let Some(n) = read.verdict(tries == SETTLE_TRIES) {
            return Ok(n);
        }
    }
}

/// One try of [`settled_differences`]: the completed count kept before and after the
/// archive was read, the count archived, and how many paths differed.
#[derive(Debug, Clone, Copy)]
struct SettleRead {
    before: u64,
    archived: u64,
    after: u64,
    differences: usize,
}

impl SettleRead {
    /// The differences to report, or None to read again.
    fn verdict(self, last_try: bool) -> Option<usize> {
        if self.differences == 0 || self.before == self.after {
            Some(self.differences)
        } else if last_try {
            Some(usize::from(
                !(self.before..=self.after).contains(&self.archived),
            ))
        } else {
            None
        }
    }
}

/// Recomputes the statistics from the archive; repairs each shard if asked (not when
/// records were lost to damage: the statistics are all that still counts them).
async fn check_stats(
    backend: &Backend,
    deltas: &[StatsDelta],
    repair: bool,
) -> Result<Vec<tranche_stats::Difference>> {
    let lost = backend.archive.lost_records().await?;
    let (differences, _) = compare_stats(backend, deltas, lost).await?;
    if repair && !differences.is_empty() && lost == 0 {
        backend.ensure_writable()?;
        for (shard, delta) in deltas.iter().enumerate() {
            backend.stats.replace(shard as u32, delta).await?;
        }
        backend.save().await?;
    }
    Ok(differences)
}

/// The archived values that do not decode, one difference each under
/// `archive_records.` (shard, key and field, what is wrong); with `repair` each is set
/// aside in its shard's quarantine ([`Archiver::repair_damage`]
/// (tranche_archive_store::Archiver::repair_damage)), its records still counted.
/// Returns the differences and how many values are left damaged.
async fn check_archive(
    backend: &Backend,
    found: &[ArchiveDamage],
    repair: bool,
) -> Result<(Vec<tranche_stats::Difference>, usize)> {
    let mut differences = Vec::with_capacity(found.len());
    let mut left = Vec::new();
    for d in found {
        let expected = if repair {
            backend.ensure_writable()?;
            match backend
                .archive
                .repair_damage(d)
                .await
                .with_context(|| format!("cannot set aside {}", d.location()))?
            {
                Some(0) => "nothing to set aside: it changed or went since it was read".to_owned(),
                Some(lost) => format!(
                    "set aside in the shard's archive:quarantine; {lost} record(s) lost, still counted in the statistics"
                ),
                None => {
                    left.push(d.clone());
                    "left in place: a segment holds other batches whole (export what decodes and restore)".to_owned()
                }
            }
        } else {
            left.push(d.clone());
            format!(
                "a readable record (`tranche check --repair` sets it aside; {} stay counted)",
                match &d.field {
                    Some(_) => "it stays completed and its statistics",
                    None => "its records stay completed and their statistics",
                }
            )
        };
        differences.push(tranche_stats::Difference {
            path: format!("archive_records.shard{}.{}", d.shard, d.location()),
            expected: Some(expected),
            found: Some(format!("{}: {}", ARCHIVE_DAMAGED, d.detail)),
        });
    }
    if repair {
        backend.archive.note_damage(&left).await?;
        backend.save().await?;
    }
    Ok((differences, left.len()))
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

/// Every statistics value of every shard that does not decode (reads each shard whole).
async fn find_damage(backend: &Backend) -> Result<Vec<Damage>> {
    let mut found = Vec::new();
    for shard in 0..backend.shards {
        found.extend(backend.stats.damage(shard).await?);
    }
    Ok(found)
}

/// The statistics' damage, and with `repair` each damaged shard rebuilt from its
/// archived records, its bad values set aside in its quarantine (the archive's
/// [`repair_stats`](tranche_archive_store::Archiver::repair_stats)). `check` runs
/// while nothing archives; a stalled shard archives nothing.
async fn check_damage(backend: &Backend, repair: bool) -> Result<render::Damaged> {
    let found = find_damage(backend).await?;
    let mut repaired = Vec::new();
    if repair && !found.is_empty() {
        backend.ensure_writable()?;
        let mut shards: Vec<u32> = found.iter().map(|d| d.shard).collect();
        shards.dedup();
        for shard in shards {
            let done = backend
                .archive
                .repair_stats(shard)
                .await
                .with_context(|| format!("cannot repair the statistics of shard {shard}"))?;
            repaired.push(done);
        }
        backend.save().await?;
    }
    Ok(render::Damaged { found, repaired })
}

/// The active records that do not decode, one difference each under
/// `active_records.` (shard, pid, the raw value); with `repair` each is set aside in its
/// shard's quarantine and rebuilt ([`Maintenance::repair_corrupt`]
/// (tranche_active_store::Maintenance::repair_corrupt)). Runs before the counts are
/// compared: the records are read whole for them, which a corrupt one stops.
/// A run whose pids cannot be read is listed once (`.run`, by runs key and token) and
/// never repaired: nothing knows which partitions to rebuild. One that cannot be
/// repaired (that, or a repair the store refuses) costs its own line, never the repair
/// of the rest; an unreachable Redis stops the check. Returns the differences and the
/// records left in place, by key (and pid).
async fn check_records(
    backend: &Backend,
    repair: bool,
) -> Result<(Vec<tranche_stats::Difference>, Vec<String>)> {
    use tranche_active_store::{Error, Maintenance, Repair};
    let corrupt = backend.active.corrupt_records().await?;
    let mut differences = Vec::with_capacity(corrupt.len());
    let mut left = Vec::new();
    // The broken runs already broken up: a repair rebuilds every pid its run held at
    // once, so the run's later pids find nothing left to repair.
    let mut broken_up: Vec<String> = Vec::new();
    for c in corrupt {
        let raw = String::from_utf8_lossy(&c.raw);
        let Some(pid) = c.pid else {
            left.push(c.key.clone());
            differences.push(tranche_stats::Difference {
                path: format!("active_records.shard{}.run ({})", c.shard, c.key),
                expected: Some(
                    "not repairable by itself: its pids cannot be read, so it is left in place"
                        .to_owned(),
                ),
                found: Some(format!("unreadable run {raw:?}")),
            });
            continue;
        };
        let expected = if repair {
            backend.ensure_writable()?;
            match backend.active.repair_corrupt(pid).await {
                Ok(Repair::Removed) => "removed: the partition was completed".to_owned(),
                Ok(Repair::Nothing) if broken_up.contains(&c.key) => {
                    "rebuilt pending with the rest of its run".to_owned()
                }
                Ok(Repair::Nothing) => "nothing to repair: it decodes now".to_owned(),
                Ok(_) => {
                    broken_up.push(c.key.clone());
                    "set aside in the quarantine and rebuilt pending".to_owned()
                }
                Err(err @ Error::Redis(_)) => {
                    return Err(err).with_context(|| format!("cannot repair {} {pid}", c.key));
                }
                Err(err) => {
                    left.push(format!("{} {pid}", c.key));
                    format!("left in place, not repaired: {err}")
                }
            }
        } else {
            "a record (`tranche check --repair` sets it aside and rebuilds it)".to_owned()
        };
        differences.push(tranche_stats::Difference {
            path: format!("active_records.shard{}.{pid} ({})", c.shard, c.key),
            expected: Some(expected),
            found: Some(format!("unreadable record {raw:?}")),
        });
    }
    Ok((differences, left))
}

/// The values of the namespace's control record that break the write rules, one
/// difference each under `control_record.` (Redis only: an embedded record lives in its
/// worker's process). With `repair` the record is moved to `{ns}:control:quarantine`
/// and its valid values written in its place, each bad setting restored to its last
/// valid value in the control log.
async fn check_control(backend: &Backend, repair: bool) -> Result<Vec<tranche_stats::Difference>> {
    let Some(record) = crate::cli::control::record_of(backend).await? else {
        return Ok(Vec::new());
    };
    if record.rejected.is_empty() {
        return Ok(Vec::new());
    }
    let note = if repair {
        backend.ensure_writable()?;
        let (store, _) = crate::control::stores(backend);
        match store
            .repair(&crate::control::origin())
            .await
            .context("cannot repair the control record")?
        {
            Some(done) => format!(
                "moved to {{ns}}:control:quarantine, replaced (v{}): {}",
                done.record.version, done.note
            ),
            None => "nothing to repair: it is valid now".to_owned(),
        }
    } else {
        "a value by the write rules (`tranche check --repair` restores the last valid one from the control log)".to_owned()
    };
    Ok(record
        .rejected
        .iter()
        .map(|r| tranche_stats::Difference {
            path: format!("control_record.{}", r.key),
            expected: Some(note.clone()),
            found: Some(format!("{}: {}", r.value, r.why)),
        })
        .collect())
}

pub(crate) async fn check(backend: &Backend, repair: bool, json: bool) -> Result<Outcome> {
    let control = check_control(backend, repair).await?;
    let dead = check_dead_letters(backend, repair).await?;
    let damaged = check_damage(backend, repair).await?;
    let (corrupt, corrupt_left) = check_records(backend, repair).await?;
    let (mut deltas, archive_damage) = archived_deltas(backend).await?;
    let (mut differences, archive_left) = check_archive(backend, &archive_damage, repair).await?;
    if repair && !archive_damage.is_empty() {
        // What the repair set aside is no longer read: compare what is left.
        deltas = archived_deltas(backend).await?.0;
    }
    let records = deltas.iter().map(StatsDelta::len).sum();
    // Damage left in place makes the statistics unreadable, or the archive incomplete:
    // it is the finding, and the comparison waits for the repair.
    if (damaged.found.is_empty() && archive_damage.is_empty()) || repair {
        differences.extend(check_stats(backend, &deltas, repair).await?);
    }
    // Corrupt records left in place stop the count of the records: they are the
    // finding, and the comparison waits for the repair.
    if corrupt.is_empty() || repair {
        differences.extend(check_counts(backend, repair).await?);
    }
    let unreadable = corrupt.len();
    let control_invalid = control.len();
    differences.extend(corrupt);
    differences.extend(control);
    print!(
        "{}",
        render::check(&differences, records, &dead, &damaged, repair, json)
    );
    if repair {
        let mut left = Vec::new();
        if archive_left > 0 {
            left.push(format!(
                "{archive_left} damaged archived value(s) left in place (a segment)"
            ));
        }
        if !corrupt_left.is_empty() {
            left.push(format!(
                "{} corrupt active record(s) left in place ({})",
                corrupt_left.len(),
                corrupt_left.join(", ")
            ));
        }
        if !left.is_empty() {
            return Ok(Outcome::Failed(format!(
                "{}; the rest repaired",
                left.join("; ")
            )));
        }
        return Ok(Outcome::Success);
    }
    if differences.is_empty() && damaged.found.is_empty() {
        return Ok(Outcome::Success);
    }
    if control_invalid == differences.len() && damaged.found.is_empty() {
        return Ok(Outcome::Failed(format!(
            "{control_invalid} invalid value(s) in the control record, ignored by every reader; `tranche check --repair` restores the last valid ones from the control log"
        )));
    }
    if !archive_damage.is_empty() {
        let mut shards: Vec<String> = archive_damage
            .iter()
            .map(|d| format!("shard {}", d.shard))
            .collect();
        shards.dedup();
        return Ok(Outcome::Failed(format!(
            "{} damaged archived value(s) in {}; `tranche check --repair` sets them aside (their records stay counted)",
            archive_damage.len(),
            shards.join(", ")
        )));
    }
    if unreadable > 0 && damaged.found.is_empty() {
        // Only a run whose pids cannot be read is left out of the repair (none fails
        // before a repair is tried).
        let runs = match corrupt_left.len() {
            0 => String::new(),
            n => format!(" but {n} run(s) whose pids cannot be read"),
        };
        return Ok(Outcome::Failed(format!(
            "{unreadable} corrupt active record(s) among {} difference(s); `tranche check --repair` sets them aside and rebuilds them{runs}",
            differences.len()
        )));
    }
    if damaged.found.is_empty() {
        return Ok(Outcome::Failed(format!(
            "{} difference(s); `tranche check --repair` rewrites the statistics and the active counts",
            differences.len()
        )));
    }
    Ok(Outcome::Failed(format!(
        "corrupt statistics in {} ({} value(s){}); `tranche check --repair` quarantines them and rebuilds them from the archive",
        render::shards_named(&damaged.found),
        damaged.found.len(),
        match differences.len() {
            0 => String::new(),
            n => format!(", and {n} difference(s)"),
        }
    )))
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
        damaged_rule(&stalls, unreadable.as_ref()),
        archive_damaged_rule(&backend.archive.damaged().await?),
        control_rule(crate::cli::control::record_of(backend).await?.as_ref()),
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
        let damage = find_damage(backend).await?;
        let differences = if damage.is_empty() {
            settled_differences(backend).await?
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
/// as the archiver found them (a stall for that reason) or as the summary `health`
/// reads found them; `tranche check --repair` rebuilds them.
fn damaged_rule(stalls: &[Stall], unreadable: Option<&tranche_stats::Error>) -> render::Rule {
    let damaged: Vec<u32> = stalls
        .iter()
        .filter(|s| s.stats_damaged())
        .map(|s| s.shard)
        .collect();
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
    use super::SettleRead;

    fn read(before: u64, archived: u64, after: u64, differences: usize) -> SettleRead {
        SettleRead {
            before,
            archived,
            after,
            differences,
        }
    }

    #[test]
    fn a_quiet_read_reports_every_difference() {
        assert_eq!(read(10, 10, 10, 0).verdict(false), Some(0));
        assert_eq!(read(11, 10, 11, 3).verdict(false), Some(3));
    }

    #[test]
    fn a_read_an_archive_pass_crossed_is_tried_again() {
        assert_eq!(read(10, 12, 14, 5).verdict(false), None);
    }

    #[test]
    fn never_quiet_judges_the_count_alone() {
        // Archived between the counts read before and after: passes in flight.
        assert_eq!(read(10, 12, 14, 5).verdict(true), Some(0));
        // Kept more than ever archived (counted twice), or fewer (lost).
        assert_eq!(read(10, 8, 14, 5).verdict(true), Some(1));
        assert_eq!(read(10, 15, 14, 5).verdict(true), Some(1));
    }
}
