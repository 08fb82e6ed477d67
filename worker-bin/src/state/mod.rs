//! The embedded run and its state file: without `--redis`, the active store, the archive
//! and the statistics all live in this process ([`Embedded`]), and their state is saved
//! to one file so that an interrupted run resumes where it stopped.
//!
//! The design choice a reader might get wrong: **the three states are taken at one
//! instant, not one after the other.** [`Embedded::state`] takes the archive's state
//! (which moves every record still in the inbox channels into the archive's own queue,
//! and takes the statistics under the archive's locks) *while the active store is held
//! still* (`MemoryActiveStore::state_with`). A partition completed around a save is
//! therefore completed in both saved states or in neither: never lost (completed in the
//! active state, missing from the archive), never redone because the active state still
//! held it while the archive already had it.
//!
//! On restore ([`Embedded::restore`]), the leases of the process that
//! saved the state are released at once, checkpoints kept: a resumed embedded run is the
//! only worker, so those leases are dead, and each partition resumes at its first
//! unfinished chunk.
//!
//! The file: the magic `TRSTATE\0`, the format version (u32, little-endian), the payload
//! length (u64) and its CRC32 (u32), then the payload, [`EmbeddedState`] in bincode's
//! standard (varint) encoding. A save writes a temporary file beside the target, syncs
//! it, renames it over the target and syncs the directory: a crash mid-save leaves the
//! previous state whole.
//!
//! **Two generations.** The checksum catches damage, and a damaged file must not end
//! the job: each save first keeps the file it replaces as `<name>.prev` (a hard link,
//! after checking its checksum; a damaged one is kept aside as `<name>.corrupt`
//! instead and the older `.prev` stays), and a process's first save writes its state
//! as both generations, so `.prev` holds everything earlier processes did (plans,
//! imports, operator commands). [`load`] falls back to `.prev` when the file is
//! damaged, with one warning naming both files. The fallback is sound because each
//! generation is one instant of all three stores: partitions finished after it are
//! pending again and done once more (at least once), and counted once, as in a run
//! that stopped there. A file of another format version is refused, never fallen back
//! from: it may be a newer tranche's.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tranche_active_store::{ActiveState, Clock, MemoryActiveStore, RestoredLeases};
use tranche_archive_store::{ArchiveState, MemoryArchive};
use tranche_stats::MemoryStats;

/// The version of the state file format this build writes and reads.
pub(crate) const STATE_FILE_VERSION: u32 = 1;

/// What can go wrong with the state file. Every message names the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// Reading, writing, syncing or renaming failed.
    #[error("state file {}: {source}", path.display())]
    Io {
        /// The state file.
        path: PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// The file does not start with the state file's magic bytes.
    #[error("{} is not a tranche state file", path.display())]
    NotAStateFile {
        /// The file.
        path: PathBuf,
    },
    /// Written by another version of tranche.
    #[error(
        "state file {} has format version {found}; this tranche reads version {STATE_FILE_VERSION}",
        path.display()
    )]
    Version {
        /// The file.
        path: PathBuf,
        /// The version it declares.
        found: u32,
    },
    /// Truncated, or its checksum or content is wrong.
    #[error("state file {} is corrupt: {detail}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        detail: String,
    },
    /// The state belongs to another job.
    #[error(
        "the state is of namespace {found_namespace:?} with {found_shards} shards, \
         but this run has namespace {namespace:?} with {shards}"
    )]
    Mismatch {
        /// The saved namespace.
        found_namespace: String,
        /// The saved shard count.
        found_shards: u32,
        /// This run's namespace.
        namespace: String,
        /// This run's shard count.
        shards: u32,
    },
    /// The active store refused the settings or the saved state.
    #[error("active store: {0}")]
    Active(#[from] tranche_active_store::Error),
    /// The archive refused the settings or the saved state.
    #[error("archive: {0}")]
    Archive(#[from] tranche_archive_store::Error),
}

/// Everything an embedded run holds, taken at one instant by [`Embedded::state`]. The
/// statistics travel inside the archive's state (they are taken under its locks).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmbeddedState {
    /// The active store: plans, cursors, partitions, leases, completed index, workers.
    pub(crate) active: ActiveState,
    /// The archive: tiers, archived set, records received and not archived yet, and
    /// the statistics.
    pub(crate) archive: ArchiveState,
}

/// The three layers of an embedded run, wired together: the archive drains the active
/// store's inboxes and counts into the statistics.
#[derive(Debug, Clone)]
pub struct Embedded {
    /// The active layer.
    pub active: Arc<MemoryActiveStore>,
    /// The archive, fed by `active`'s inboxes.
    pub archive: Arc<MemoryArchive>,
    /// The statistics `archive` counts into.
    pub stats: Arc<MemoryStats>,
    /// Whether this process saved already: its first save writes both generations.
    saved_once: Arc<AtomicBool>,
}

/// What one [`Embedded::save`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaveReport {
    /// Bytes written, header included.
    pub bytes: u64,
    /// How long the stores were held still while their states were taken.
    pub held: Duration,
    /// How long the whole save took, writing and syncing included.
    pub total: Duration,
}

impl Embedded {
    /// A fresh embedded run.
    pub fn new(
        active: tranche_active_store::Config,
        archive: tranche_archive_store::Config,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, StateError> {
        check_configs(&active, &archive)?;
        let active = Arc::new(MemoryActiveStore::with_clock(active, clock)?);
        let stats = Arc::new(MemoryStats::new());
        let archive = Arc::new(MemoryArchive::new(
            archive,
            inboxes(&active),
            stats.clone(),
        )?);
        Ok(Self {
            active,
            archive,
            stats,
            saved_once: Arc::default(),
        })
    }

    /// An embedded run restored from `state`, with what becomes of the saved leases.
    /// [`StateError::Mismatch`] when the state is of another namespace or shard count.
    pub fn restore(
        active: tranche_active_store::Config,
        archive: tranche_archive_store::Config,
        clock: Arc<dyn Clock>,
        state: EmbeddedState,
        leases: RestoredLeases,
    ) -> Result<Self, StateError> {
        check_configs(&active, &archive)?;
        for (ns, shards) in [
            (&state.active.namespace, state.active.num_shards),
            (&state.archive.namespace, state.archive.num_shards),
        ] {
            if (ns.as_str(), shards) != (active.namespace.as_str(), active.num_shards) {
                return Err(StateError::Mismatch {
                    found_namespace: ns.clone(),
                    found_shards: shards,
                    namespace: active.namespace.clone(),
                    shards: active.num_shards,
                });
            }
        }
        let active = Arc::new(MemoryActiveStore::restore(
            active,
            clock,
            state.active,
            leases,
        )?);
        let archive = Arc::new(MemoryArchive::restore(
            archive,
            inboxes(&active),
            state.archive,
        )?);
        Ok(Self {
            stats: archive.stats().clone(),
            active,
            archive,
            saved_once: Arc::default(),
        })
    }

    #[cfg(test)]
    /// The run saved at `path` if there is one, its dead leases released; otherwise a
    /// fresh run. The flag says whether it was resumed.
    pub(crate) fn open(
        path: &Path,
        active: tranche_active_store::Config,
        archive: tranche_archive_store::Config,
        clock: Arc<dyn Clock>,
    ) -> Result<(Self, bool), StateError> {
        match load(path)? {
            Some(state) => {
                let run = Self::restore(active, archive, clock, state, RestoredLeases::Release)?;
                Ok((run, true))
            }
            None => Ok((Self::new(active, archive, clock)?, false)),
        }
    }

    /// Everything the run holds, taken at one instant (see the module docs). Every
    /// store is held still meanwhile: a few milliseconds per hundred thousand
    /// partitions in the simple tier, less in the others.
    pub fn state(&self) -> EmbeddedState {
        let (active, archive) = self.active.state_with(|| self.archive.state());
        EmbeddedState { active, archive }
    }

    /// Saves [`Embedded::state`] to `path`, atomically, keeping the generation it
    /// replaces (the first save of this process writes the state as both; see the
    /// module docs). Call it periodically while running and once more after the
    /// workers and the archiver have stopped.
    pub fn save(&self, path: &Path) -> Result<SaveReport, StateError> {
        let start = Instant::now();
        let state = self.state();
        let held = start.elapsed();
        let first = !self.saved_once.swap(true, Ordering::AcqRel);
        let bytes = save(path, &state, first)?;
        Ok(SaveReport {
            bytes,
            held,
            total: start.elapsed(),
        })
    }
}

/// The receivers of `active`'s inboxes, in shard order.
fn inboxes(
    active: &MemoryActiveStore,
) -> Vec<crossbeam_channel::Receiver<tranche_codec::CompletedRecord>> {
    (0..active.config().num_shards)
        .map(|s| active.inbox(s).expect("every shard has an inbox"))
        .collect()
}

fn check_configs(
    active: &tranche_active_store::Config,
    archive: &tranche_archive_store::Config,
) -> Result<(), StateError> {
    if (active.namespace.as_str(), active.num_shards)
        != (archive.namespace.as_str(), archive.num_shards)
    {
        return Err(StateError::Archive(
            tranche_archive_store::Error::InvalidArgument(format!(
                "the archive's namespace {:?} with {} shards differs from the active store's \
                 {:?} with {}",
                archive.namespace, archive.num_shards, active.namespace, active.num_shards
            )),
        ));
    }
    Ok(())
}

mod file;
#[cfg(test)]
mod tests;

#[cfg(feature = "fuzzing")]
pub use file::fuzz_state_file;
pub use file::load;
pub(crate) use file::save;
/// The state file's neighbours, which `tranche drop` deletes with it.
#[cfg(feature = "cli")]
pub(crate) use file::{previous, quarantined};
