//! The capability traits: archiving and querying, held as `Arc<dyn …>`.

use std::future::Future;
use std::ops::RangeInclusive;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::Result;
use crate::dump::Dump;
use crate::model::{ArchiveDamage, ArchivePass, DeadLetter, Lookup, RangePage, Redrive, Stall};
use crate::snapshots::{Publisher, Snapshots};

/// Drains the shards' inboxes into the archive.
#[async_trait]
pub trait Archiver: Send + Sync {
    /// One pass: reads up to the configured batch of inbox entries per shard (taking
    /// over a dead archiver's entries first), writes each fresh record into the tier in
    /// force and counts it in the statistics in the same atomic step, then acknowledges
    /// the entries. Never waits for entries that are not there.
    async fn archive_once(&self) -> Result<ArchivePass>;

    /// [`archive_once`](Self::archive_once), taking over the entries another archiver
    /// has held unacknowledged for `idle` rather than for
    /// [`Config::claim_idle`](crate::Config::claim_idle): for the drain at the end of a
    /// job, when every live archiver is finishing its passes too, so that one killed
    /// while it held entries keeps the others waiting seconds, not `claim_idle`. Taking
    /// over a slow live archiver's entries costs no correctness: the archived bits count
    /// each record once whoever writes it, and the holder's acknowledgement still
    /// clears the entry. A backend without consumers keeps this default.
    async fn archive_taking_over(&self, idle: Duration) -> Result<ArchivePass> {
        let _ = idle;
        self.archive_once().await
    }

    /// A pass over the shards with news only: those completing clients marked dirty
    /// since (on Redis, `{ns}:dirty`), each read at most once per
    /// [`Config::gather`](crate::Config::gather) unless its last read came back full.
    /// Takes over nobody's entries: [`archive_once`](Self::archive_once) does, on
    /// [`run`]'s sweeps. A backend whose full pass is cheap keeps this default.
    async fn archive_woken(&self) -> Result<ArchivePass> {
        self.archive_once().await
    }

    /// How often [`run`] sweeps every shard with [`archive_once`](Self::archive_once).
    fn idle_wait(&self) -> Duration;

    /// Validates every dead letter again and re-drives what is archivable now through
    /// the ordinary archive path, whose archived bit makes it count once however often
    /// this runs or crashes half way. A record whose pid is archived already is
    /// dropped; one whose pid lies in none of `planned` (the plans' pid ranges, which
    /// the archive does not know), or that is refused again, is kept with the reason.
    /// A backend that never sets records aside has nothing to do.
    async fn redrive_dead_letters(&self, planned: &[RangeInclusive<u64>]) -> Result<Redrive> {
        let _ = planned;
        Ok(Redrive::default())
    }

    /// Rebuilds shard `shard`'s statistics from the records the archive holds for it
    /// (every pid of its archived bitmap, read batch by batch: memory grows with one
    /// batch, not the shard), setting every damaged value aside in the statistics'
    /// quarantine first: [`StatsStore::repair`](tranche_stats::StatsStore::repair),
    /// whose rule says what happens when some records cannot be read (expired summary
    /// batches, batches that do not decode: [`Repaired::unreadable`]). Run it while the
    /// shard is not archiving (a stalled shard is not): a record archived during the
    /// rebuild may be left out. The shard's stall clears on its next successful pass
    /// ([`Archiver::archive_once`]).
    ///
    /// [`Repaired::unreadable`]: tranche_stats::Repaired::unreadable
    async fn repair_stats(&self, shard: u32) -> Result<tranche_stats::Repaired>;

    /// Sets one damaged archived value aside, exactly as it was, in its shard's
    /// quarantine (`{ns:s}:archive:quarantine` on Redis: field the pid, or
    /// `batch:N` for a sealed batch, `@ms` added if taken), and removes it: its
    /// records were counted when archived and stay counted (their archived bits and
    /// completed-index bits still say done), the rest of its batch stays readable, and
    /// a lookup of them answers [`ARCHIVE_DAMAGED`](crate::ARCHIVE_DAMAGED) from then
    /// on. Returns how many archived records were lost with it, or `None` when it is
    /// not repaired here (a segment, which holds other batches whole: it stays, named
    /// by `check`). A value that changed or went since it was read is left alone
    /// (`Some(0)`). A backend that never stores undecodable values has nothing to do.
    async fn repair_damage(&self, damage: &ArchiveDamage) -> Result<Option<u64>> {
        let _ = damage;
        Ok(Some(0))
    }

    /// Verifies the next slice of the archive (a bounded number of batches, going
    /// round the shards from where the last call stopped) and records what does not
    /// decode where [`ArchiveQuery::damaged`] reads it, so damage no reader meets
    /// still shows. [`run`] calls it after each sweep. Returns the damage found.
    async fn scrub(&self) -> Result<Vec<ArchiveDamage>> {
        Ok(Vec::new())
    }

    /// Replaces the record of damage with `found`, what a read of the whole archive
    /// just met (`tranche check`), so damage repaired or gone since stops showing.
    async fn note_damage(&self, found: &[ArchiveDamage]) -> Result<()> {
        let _ = found;
        Ok(())
    }
}

/// Reads the archive.
#[async_trait]
pub trait ArchiveQuery: Send + Sync {
    /// What the archive knows of `pid`, in one round trip on Redis.
    async fn get(&self, pid: u64) -> Result<Lookup>;

    /// Archived records with pids in `pids`, at most `limit` per page, in pid order:
    /// call again from `next` until it is `None`. Memory stays bounded by `limit`.
    async fn range(&self, pids: RangeInclusive<u64>, limit: usize) -> Result<RangePage>;

    /// How many batches failed to decode since the namespace was created.
    async fn decode_failures(&self) -> Result<u64>;

    /// Records that can never be archived, set aside with their reason: up to `limit`
    /// per shard, oldest first. A backend that never sets records aside has none.
    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>> {
        let _ = limit;
        Ok(Vec::new())
    }

    /// How many records are set aside in the dead-letter streams (the last 10,000 per
    /// shard are kept). O(shards).
    async fn dead_letter_count(&self) -> Result<u64> {
        Ok(0)
    }

    /// The shards whose archiving is stalled, with since when and why, by shard. One
    /// read on Redis (`{ns}:archive:stalled`), whatever the shard count: what `health`
    /// polls, and what `tranche archive` names when a pass can do nothing more
    /// (`entries == 0`) while records are left.
    async fn stalled(&self) -> Result<Vec<Stall>> {
        Ok(Vec::new())
    }

    /// The damaged archived values reads, scrubs and `check` met and no repair has set
    /// aside yet (one read on Redis, `{ns}:archive:damaged`): what `health` polls.
    async fn damaged(&self) -> Result<Vec<ArchiveDamage>> {
        Ok(Vec::new())
    }

    /// Archived records lost to damage: set aside by
    /// [`Archiver::repair_damage`] and counted in the statistics still. O(shards).
    async fn lost_records(&self) -> Result<u64> {
        Ok(0)
    }
}

/// Background maintenance of the archive's tiers.
#[async_trait]
pub trait Compaction: Send + Sync {
    /// Seals every open batch, full or not (batches left open by a crash between a
    /// write and its seal, or the last partial batches of a job), merging any earlier
    /// partial seal. Returns how many batches were sealed. Never stops the archiver:
    /// a batch that changes while it is sealed is retried or left for the next run.
    async fn compact(&self) -> Result<usize>;
}

/// Writes the whole archive out.
#[async_trait]
pub trait Export: Send + Sync {
    /// Every record the archive still holds, grouped by batch in id order, stamped
    /// `created_ms`. Expired batches are gone and left out; a batch that does not
    /// decode is an error (a dump must be complete, or not be).
    async fn export(&self, created_ms: u64) -> Result<Dump>;
}

/// Restores a dump.
#[async_trait]
pub trait Import: Send + Sync {
    /// Restores `dump` into this archive, which must be empty: every record goes back
    /// to its tier and is counted in the statistics once. Returns the records restored.
    async fn import(&self, dump: &Dump) -> Result<u64>;
}

macro_rules! forward {
    ($($ty:ty),*) => {$(
        #[async_trait]
        impl<T: Archiver + ?Sized> Archiver for $ty {
            async fn archive_once(&self) -> Result<ArchivePass> {
                (**self).archive_once().await
            }
            async fn archive_taking_over(&self, idle: Duration) -> Result<ArchivePass> {
                (**self).archive_taking_over(idle).await
            }
            async fn archive_woken(&self) -> Result<ArchivePass> {
                (**self).archive_woken().await
            }
            fn idle_wait(&self) -> Duration {
                (**self).idle_wait()
            }
            async fn redrive_dead_letters(&self, planned: &[RangeInclusive<u64>]) -> Result<Redrive> {
                (**self).redrive_dead_letters(planned).await
            }
            async fn repair_stats(&self, shard: u32) -> Result<tranche_stats::Repaired> {
                (**self).repair_stats(shard).await
            }
            async fn repair_damage(&self, damage: &ArchiveDamage) -> Result<Option<u64>> {
                (**self).repair_damage(damage).await
            }
            async fn scrub(&self) -> Result<Vec<ArchiveDamage>> {
                (**self).scrub().await
            }
            async fn note_damage(&self, found: &[ArchiveDamage]) -> Result<()> {
                (**self).note_damage(found).await
            }
        }

        #[async_trait]
        impl<T: Compaction + ?Sized> Compaction for $ty {
            async fn compact(&self) -> Result<usize> {
                (**self).compact().await
            }
        }

        #[async_trait]
        impl<T: ArchiveQuery + ?Sized> ArchiveQuery for $ty {
            async fn get(&self, pid: u64) -> Result<Lookup> {
                (**self).get(pid).await
            }
            async fn range(&self, pids: RangeInclusive<u64>, limit: usize) -> Result<RangePage> {
                (**self).range(pids, limit).await
            }
            async fn decode_failures(&self) -> Result<u64> {
                (**self).decode_failures().await
            }
            async fn dead_letter_count(&self) -> Result<u64> {
                (**self).dead_letter_count().await
            }
            async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>> {
                (**self).dead_letters(limit).await
            }
            async fn stalled(&self) -> Result<Vec<Stall>> {
                (**self).stalled().await
            }
            async fn damaged(&self) -> Result<Vec<ArchiveDamage>> {
                (**self).damaged().await
            }
            async fn lost_records(&self) -> Result<u64> {
                (**self).lost_records().await
            }
        }
    )*};
}

forward!(Arc<T>, Box<T>);

/// The longest [`run`] waits between two woken passes while nothing arrives.
const IDLE_POLL: Duration = Duration::from_millis(50);

/// Runs `archiver` until `shutdown` resolves. It starts with a full pass
/// ([`Archiver::archive_once`], which takes over a dead archiver's entries) and sweeps
/// again every [`Archiver::idle_wait`] (the seed's "every 30 s"); in between it runs
/// woken passes ([`Archiver::archive_woken`]) that visit only the shards with news:
/// back to back while work arrives, and while idle spaced from 1 ms doubling up to
/// 50 ms, so a completion is archived soon and an idle archiver costs one small read
/// per poll whatever the shard count. A failed pass is logged and retried after a
/// second (a failed sweep is retried as a sweep); the loop never gives up on its own.
/// After each sweep it scrubs the next slice of the archive ([`Archiver::scrub`]).
/// A shard stalled on its own state (see [`ArchivePass::stalled`]) does not fail the
/// pass: the backend logs it once, woken passes leave it alone and every sweep tries
/// it again, so it resumes by itself once repaired.
///
/// With `snapshots`, it publishes statistics snapshots as their [`SnapshotPolicy`]
/// says, each on a task of its own so archiving never waits for one (a failed snapshot
/// is logged and the next one covers it); one still in flight at shutdown is waited
/// for. Whoever archives after the loop (a final drain) publishes the last snapshot.
///
/// It polls instead of blocking in `XREADGROUP … BLOCK`: the Redis archiver shares one
/// multiplexed connection, which a blocking read would stall for everyone, and a
/// blocking read covers the streams of one slot only.
///
/// [`SnapshotPolicy`]: crate::SnapshotPolicy
pub async fn run<A: Archiver + ?Sized>(
    archiver: &A,
    snapshots: Option<Snapshots>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let mut publisher = snapshots.map(Publisher::new);
    let sweep_every = archiver.idle_wait().max(Duration::from_millis(1));
    let first_wait = Duration::from_millis(1);
    let mut wait = first_wait;
    let mut last_sweep: Option<tokio::time::Instant> = None;
    loop {
        let sweep = last_sweep.is_none_or(|t| t.elapsed() >= sweep_every);
        let pass = if sweep {
            let started = tokio::time::Instant::now();
            let pass = archiver.archive_once().await;
            if pass.is_ok() {
                last_sweep = Some(started);
                match archiver.scrub().await {
                    Ok(found) => {
                        for d in &found {
                            tracing::warn!(damage = %d, "archived value damaged; `tranche check --repair` sets it aside");
                        }
                    }
                    Err(err) => tracing::warn!(%err, "archive scrub failed"),
                }
            }
            pass
        } else {
            archiver.archive_woken().await
        };
        let pause = match pass {
            Ok(pass) => {
                if let Some(p) = &mut publisher {
                    p.after(&pass);
                }
                if pass.entries > 0 {
                    wait = first_wait;
                    Duration::ZERO
                } else {
                    let w = wait;
                    wait = (wait * 2).min(IDLE_POLL).min(sweep_every);
                    w
                }
            }
            Err(err) => {
                tracing::warn!(%err, "archive pass failed");
                sweep_every.min(Duration::from_secs(1))
            }
        };
        tokio::select! {
            () = &mut shutdown => break,
            () = tokio::time::sleep(pause) => {}
        }
    }
    if let Some(p) = publisher {
        p.finish().await;
    }
}

/// The paging of [`ArchiveQuery::range`], shared by both backends: looks up each pid of
/// `pids` in order with `lookup` and keeps the archived records, at most `limit` (at
/// least 1) per page. Memory stays bounded by `limit`.
pub(crate) async fn page_by_lookup<F, Fut>(
    pids: RangeInclusive<u64>,
    limit: usize,
    mut lookup: F,
) -> Result<RangePage>
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = Result<Lookup>>,
{
    let limit = limit.max(1);
    let (mut pid, end) = (*pids.start(), *pids.end());
    let mut records = Vec::new();
    while pid <= end {
        if records.len() == limit {
            return Ok(RangePage {
                records,
                next: Some(pid),
                damaged: Vec::new(),
            });
        }
        if let Lookup::Archived { record, .. } = lookup(pid).await? {
            records.push(record);
        }
        if pid == u64::MAX {
            break;
        }
        pid += 1;
    }
    Ok(RangePage {
        records,
        next: None,
        damaged: Vec::new(),
    })
}
