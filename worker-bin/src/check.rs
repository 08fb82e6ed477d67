//! The consistency check of a namespace ([`Job::check`](crate::Job::check), `tranche
//! check`): the statistics recomputed from the archive, the active counts from the
//! records, and every value that does not decode (statistics, archived records, active
//! records, the control record), each a [`Difference`]; with a repair, each fixed,
//! rebuilt or set aside. Also `health --check`'s consistency rule, read while archivers
//! write ([`settled_differences`]).
//!
//! Run it while nothing runs: a claim or an archive pass between two reads shows as a
//! difference (the health rule alone allows for archive passes in flight).

use tranche_active_store::StatusCounts;
use tranche_archive_store::{ARCHIVE_DAMAGED, ArchiveDamage, Redrive};
use tranche_codec::KeySchema;
use tranche_stats::{Damage, Difference, Repaired, Stats, StatsDelta, diff};

use crate::backend::Backend;
use crate::error::Error;

type Result<T, E = Error> = std::result::Result<T, E>;

/// What [`Job::check`](crate::Job::check) found, and with a repair what it did.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct CheckReport {
    /// Every difference found, one each: where (`path`), what was expected, what was
    /// found. With a repair, `expected` says what the repair did.
    pub differences: Vec<Difference>,
    /// Archived records the statistics were recomputed from.
    pub records: u64,
    /// Whether this check repaired what it found.
    pub repaired: bool,
    /// What a repair left in place, one line each (empty without a repair).
    pub left: Vec<String>,
    /// The dead letters, and what a repair did with them.
    pub(crate) dead: DeadLetters,
    /// Statistics values that do not decode, and their repair.
    pub(crate) damaged: Damaged,
    /// Archived values that do not decode, as found before any repair.
    pub(crate) archive_damage: Vec<ArchiveDamage>,
    /// How many differences are active records that do not decode.
    pub(crate) corrupt: usize,
    /// Records (by key and pid) and runs a repair left in place.
    pub(crate) corrupt_left: Vec<String>,
    /// How many differences are invalid values of the control record.
    pub(crate) control_invalid: usize,
}

impl CheckReport {
    /// Whether nothing was found: no difference and no statistics value that does not
    /// decode.
    pub fn is_clean(&self) -> bool {
        self.differences.is_empty() && self.damaged.found.is_empty()
    }

    /// Dead letters found (records set aside as never archivable).
    pub fn dead_letters(&self) -> u64 {
        self.dead.found
    }

    /// Statistics values found that do not decode.
    pub fn damaged_values(&self) -> usize {
        self.damaged.found.len()
    }

    /// Shards whose damaged statistics a repair rebuilt.
    pub fn shards_repaired(&self) -> usize {
        self.damaged.repaired.len()
    }

    /// Whether a repair re-drove the dead letters.
    pub fn dead_letters_redriven(&self) -> bool {
        self.dead.redriven.is_some()
    }

    /// Archived values found that do not decode (before any repair).
    pub fn archive_values_damaged(&self) -> usize {
        self.archive_damage.len()
    }

    /// Differences that are active records which do not decode.
    pub fn corrupt_records(&self) -> usize {
        self.corrupt
    }

    /// Corrupt records (by key and pid) and runs a repair left in place.
    pub fn corrupt_left(&self) -> &[String] {
        &self.corrupt_left
    }

    /// Differences that are invalid values of the control record.
    pub fn control_values_invalid(&self) -> usize {
        self.control_invalid
    }
}

/// What `check` found in the dead-letter streams, and with a repair what it did.
#[derive(Debug, Clone, Default)]
pub(crate) struct DeadLetters {
    /// Dead letters counted before anything was done.
    pub(crate) found: u64,
    /// With a repair, the outcome of re-driving them (none when there were none).
    pub(crate) redriven: Option<Redrive>,
}

/// What `check` found of statistics values that do not decode, and with a repair
/// what the repair did to each damaged shard.
#[derive(Debug, Clone, Default)]
pub(crate) struct Damaged {
    /// Every value found that does not decode, by shard.
    pub(crate) found: Vec<Damage>,
    /// With a repair, one per damaged shard.
    pub(crate) repaired: Vec<Repaired>,
}

/// A repair step that failed, said as the step, its cause kept.
fn repair_failed(what: String, source: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::RepairFailed {
        what,
        source: Box::new(source),
    }
}

/// The namespace's key schema.
fn schema(backend: &Backend) -> Result<KeySchema> {
    match backend.redis() {
        Some(redis) => Ok(redis.schema.clone()),
        None => Ok(KeySchema::new(&backend.namespace, backend.shards)?),
    }
}

/// Derives the active layer's status counters from its records again (Redis keeps
/// them in the scripts; the memory store counts its records directly, so there is
/// nothing to do embedded).
async fn recount(backend: &Backend) -> Result<()> {
    if let Some(redis) = backend.redis() {
        redis.active.recount().await?;
    }
    Ok(())
}

/// Checks the namespace, repairing what it finds with `repair`.
pub(crate) async fn check(backend: &Backend, repair: bool) -> Result<CheckReport> {
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
    let mut left = Vec::new();
    if repair {
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
    }
    Ok(CheckReport {
        differences,
        records,
        repaired: repair,
        left,
        dead,
        damaged,
        archive_damage,
        corrupt: unreadable,
        corrupt_left,
        control_invalid,
    })
}

/// The statistics delta of every archived record that decodes, one per shard, read
/// page by page across the plans (memory grows with workers, ranges and days, never
/// with the archive), and every archived value that does not decode.
async fn archived_deltas(backend: &Backend) -> Result<(Vec<StatsDelta>, Vec<ArchiveDamage>)> {
    let schema = schema(backend)?;
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

#[cfg(feature = "cli")]
/// How many times `health --check` reads the archive looking for a moment no archive
/// pass ran in before it judges from the counts alone.
const SETTLE_TRIES: usize = 3;

#[cfg(feature = "cli")]
/// `health --check`'s statistics differences, read while archivers may write. An
/// archive pass moves a shard's records and statistics in one atomic step, so when the
/// completed count reads the same before and after the archive is read, nothing moved
/// in between and every difference is real. Archived to the end of each try, it judges
/// only what no pass in flight explains: a count of archived records outside the
/// counts read before and after (counted twice, or lost).
pub(crate) async fn settled_differences(backend: &Backend) -> Result<usize> {
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

#[cfg(feature = "cli")]
/// One try of [`settled_differences`]: the completed count kept before and after the
/// archive was read, the count archived, and how many paths differed.
#[derive(Debug, Clone, Copy)]
struct SettleRead {
    before: u64,
    archived: u64,
    after: u64,
    differences: usize,
}

#[cfg(feature = "cli")]
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
                .map_err(|e| repair_failed(format!("cannot set aside {}", d.location()), e))?
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
        recount(backend).await?;
    }
    Ok(differences)
}

/// The dead letters: with `repair`, each validated against the plans and the archive
/// again and re-driven, dropped or kept ([`Redrive`]); without, only counted. Runs
/// before the statistics are checked, so a record re-driven is in that check.
async fn check_dead_letters(backend: &Backend, repair: bool) -> Result<DeadLetters> {
    let found = backend.archive.dead_letter_count().await?;
    if !repair || found == 0 {
        return Ok(DeadLetters {
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
    Ok(DeadLetters {
        found,
        redriven: Some(redrive),
    })
}

/// Every statistics value of every shard that does not decode (reads each shard whole).
pub(crate) async fn find_damage(backend: &Backend) -> Result<Vec<Damage>> {
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
async fn check_damage(backend: &Backend, repair: bool) -> Result<Damaged> {
    let found = find_damage(backend).await?;
    let mut repaired = Vec::new();
    if repair && !found.is_empty() {
        backend.ensure_writable()?;
        let mut shards: Vec<u32> = found.iter().map(|d| d.shard).collect();
        shards.dedup();
        for shard in shards {
            let done = backend.archive.repair_stats(shard).await.map_err(|e| {
                repair_failed(format!("cannot repair the statistics of shard {shard}"), e)
            })?;
            repaired.push(done);
        }
        backend.save().await?;
    }
    Ok(Damaged { found, repaired })
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
                    return Err(repair_failed(format!("cannot repair {} {pid}", c.key), err));
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
    let Some(record) = crate::control::record_of(backend).await? else {
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
            .map_err(|e| repair_failed("cannot repair the control record".to_owned(), e))?
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

/// [`SettleRead`] is `health --check`'s, in the CLI floor.
#[cfg(all(test, feature = "cli"))]
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
