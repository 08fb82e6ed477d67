//! [`Job`]: what a namespace's job has done, asked from Rust, the same on Redis and
//! embedded: its status, one partition, the partition holding a row ID, partitions by
//! state, the statistics, the workers, the plans and the dead letters. The command
//! line's `get`, `locate`, `stats` and `workers` print what these return.
//!
//! Beside the questions, the operator's actions, through the same store operations
//! the command line and `tranche serve` call: [`Job::retry_failed`],
//! [`Job::discard`], [`Job::pause`], [`Job::resume`] and [`Job::export`], and the
//! consistency check, [`Job::check`].
//!
//! A job opened on an embedded state file that a run holds reads the file as that run
//! last saved it (every few seconds, and at its end). One opened on a free state file
//! holds it, as a run would, until it is dropped.

use tranche_active_store::{PlanEntry, StatusCounts, WorkerState};
use tranche_archive_store::{DeadLetter, Dump};
use tranche_codec::{Partition, Status};
use tranche_router::{Located, MergedStats, PartitionView};

use crate::backend::{Backend, Location, Open, Tuning};
use crate::check::CheckReport;
use crate::error::Error;

/// A namespace opened to be asked about: [`Runner::job`](crate::Runner::job) or
/// [`Job::open`].
pub struct Job {
    backend: Backend,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("namespace", &self.backend.namespace)
            .field("at", &self.backend.location())
            .finish()
    }
}

/// Where a job stands ([`Job::status`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct JobStatus {
    /// Partitions every plan issues, done or not.
    pub total: u64,
    /// Unfinished partitions by state.
    pub counts: StatusCounts,
    /// Partitions completed (`total` minus what is unfinished or discarded).
    pub completed: u64,
    /// Whether the namespace is paused.
    pub paused: bool,
    /// Workers that beat recently.
    pub workers: usize,
}

impl Job {
    /// Opens `namespace` at `at`: a Redis URL (`redis://`, `rediss://`, `unix://`) or
    /// the path of an embedded state file.
    pub async fn open(at: &str, namespace: &str) -> Result<Self, Error> {
        let redis = ["redis://", "rediss://", "redis+unix://", "unix://"]
            .iter()
            .any(|s| at.starts_with(s));
        let location = Location {
            namespace: namespace.to_owned(),
            redis: redis.then(|| at.to_owned()),
            state: (!redis).then(|| at.into()),
            ..Location::default()
        };
        Self::at(&location).await
    }

    /// Opens the namespace at `location` ([`Runner::job`](crate::Runner::job)).
    pub(crate) async fn at(location: &Location) -> Result<Self, Error> {
        Ok(Self {
            backend: Backend::open_checked(location, Open::Existing, Tuning::default()).await?,
        })
    }

    /// Wraps a backend the command line opened.
    #[cfg(feature = "cli")]
    pub(crate) fn from_backend(backend: Backend) -> Self {
        Self { backend }
    }

    /// Where the job stands.
    pub async fn status(&self) -> Result<JobStatus, Error> {
        let active = &self.backend.active;
        let total = active
            .plans()
            .await?
            .iter()
            .map(|e| e.plan.last_pid() - e.plan.first_pid() + 1)
            .sum::<u64>();
        let counts = active.counts().await?;
        let unfinished = counts.outstanding() + counts.failed + counts.discarded;
        Ok(JobStatus {
            total,
            counts,
            completed: total.saturating_sub(unfinished),
            paused: active.is_paused().await?,
            workers: active.workers().await?.iter().filter(|w| w.active).count(),
        })
    }

    /// Everything known about partition `pid`, from whichever layer holds it.
    pub async fn get(&self, pid: u64) -> Result<PartitionView, Error> {
        self.backend.router.get(pid).await.map_err(store)
    }

    /// The partition covering row ID `id`, and what is known of it; `None` when no
    /// plan covers it.
    pub async fn locate(&self, id: u64) -> Result<Option<Located>, Error> {
        self.backend.router.locate(id).await.map_err(store)
    }

    /// Unfinished partitions in `state` (every unfinished state when `None`) with
    /// pids above `after`, by pid, at most `limit`: page on with the last pid.
    /// Completed partitions are asked one at a time ([`get`](Self::get)).
    pub async fn list(
        &self,
        state: Option<Status>,
        after: u64,
        limit: usize,
    ) -> Result<Vec<Partition>, Error> {
        let snapshot = self.backend.router.all_active().await.map_err(store)?;
        let mut rows: Vec<Partition> = snapshot
            .partitions
            .into_iter()
            .filter(|p| p.pid > after && state.is_none_or(|s| p.status == s))
            .collect();
        rows.sort_unstable_by_key(|p| p.pid);
        rows.truncate(limit);
        Ok(rows)
    }

    /// Every partition that ended failed, by pid, with its last error.
    pub async fn failed(&self) -> Result<Vec<Partition>, Error> {
        self.list(Some(Status::Failed), 0, usize::MAX).await
    }

    /// The statistics: unfinished counts merged with what the archive has counted.
    pub async fn stats(&self) -> Result<MergedStats, Error> {
        self.backend.router.stats().await.map_err(store)
    }

    /// The workers of the registry, each with its own counters (completed, rate,
    /// update latency) and whether it beat recently.
    pub async fn workers(&self) -> Result<Vec<WorkerState>, Error> {
        Ok(self.backend.active.workers().await?)
    }

    /// The namespace's plans, by first pid.
    pub async fn plans(&self) -> Result<Vec<PlanEntry>, Error> {
        Ok(self.backend.active.plans().await?)
    }

    /// Up to `limit` completions the archiver could not store.
    pub async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, Error> {
        self.backend
            .archive
            .dead_letters(limit)
            .await
            .map_err(store)
    }
}

impl Job {
    /// Makes failed partition `pid` pending again (every failed one with `None`),
    /// its attempts counted afresh; returns the pids made pending, none when `pid` is
    /// not failed. `tranche retry-failed`.
    pub async fn retry_failed(&self, pid: Option<u64>) -> Result<Vec<u64>, Error> {
        retry_failed(&self.backend, pid).await
    }

    /// Discards partition `pid` when it is pending or failed: it is never run and
    /// counts as discarded, not completed. Returns `false`, changing nothing, when it
    /// is in another state (running partitions are never discarded half way).
    /// `tranche discard`.
    pub async fn discard(&self, pid: u64) -> Result<bool, Error> {
        discard(&self.backend, pid).await
    }

    /// Pauses the namespace: every worker stops claiming within a second, and the
    /// partitions running finish. Redis only ([`Error::Config`] embedded, where one
    /// process runs at a time: drain it instead). `tranche pause`.
    pub async fn pause(&self) -> Result<(), Error> {
        set_paused(&self.backend, true).await
    }

    /// Lets the workers claim again after [`pause`](Self::pause). `tranche resume`.
    pub async fn resume(&self) -> Result<(), Error> {
        set_paused(&self.backend, false).await
    }

    /// The archive with the plans, as `tranche export` writes it:
    /// [`Dump::to_bytes`] gives the file `tranche import` reads back into an empty
    /// namespace.
    pub async fn export(&self) -> Result<Dump, Error> {
        export(&self.backend).await
    }

    /// Checks the namespace's consistency, as `tranche check` does: the statistics
    /// recomputed from the archive, the active counts from the records, and every
    /// value that does not decode. With `repair`, what it finds is fixed, rebuilt or
    /// set aside (as `tranche check --repair`); [`CheckReport::left`] says what a
    /// repair could not. Run it while no worker runs: a claim or an archive pass
    /// between its reads shows as a difference.
    pub async fn check(&self, repair: bool) -> Result<CheckReport, Error> {
        crate::check::check(&self.backend, repair).await
    }
}

/// [`Job::retry_failed`], for the command line's callers too.
pub(crate) async fn retry_failed(backend: &Backend, pid: Option<u64>) -> Result<Vec<u64>, Error> {
    backend.ensure_writable().map_err(other)?;
    let pids = backend.active.retry_failed(pid).await?;
    backend.save().await.map_err(other)?;
    Ok(pids)
}

/// [`Job::discard`], for the command line's callers too.
pub(crate) async fn discard(backend: &Backend, pid: u64) -> Result<bool, Error> {
    backend.ensure_writable().map_err(other)?;
    let discarded = backend.active.discard(pid).await?;
    if discarded {
        backend.save().await.map_err(other)?;
    }
    Ok(discarded)
}

/// [`Job::pause`] and [`Job::resume`], for the command line's callers too.
pub(crate) async fn set_paused(backend: &Backend, paused: bool) -> Result<(), Error> {
    if backend.is_embedded() {
        return Err(Error::Config(
            "pause and resume need Redis: an embedded namespace has one process at a time"
                .to_owned(),
        ));
    }
    Ok(backend.active.set_paused(paused).await?)
}

/// [`Job::export`], for the command line's callers too.
pub(crate) async fn export(backend: &Backend) -> Result<Dump, Error> {
    let mut dump = backend
        .archive
        .export(crate::duration::now_ms())
        .await
        .map_err(store)?;
    // The plan registry travels with the archive, so that an import answers for pids
    // and never issues an archived one again.
    dump.plans = backend.active.plans().await?;
    Ok(dump)
}

/// A backend helper's error (it says what failed in one message) as [`Error::Other`].
fn other(err: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Error {
    Error::Other(err.into())
}

fn store(err: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::Store(Box::new(err))
}
