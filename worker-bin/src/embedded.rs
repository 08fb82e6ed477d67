//! The embedded backend as the rest of the binary sees it: [`state::Embedded`]'s three
//! memory stores, the state file they are saved to, and the settings they were opened
//! with.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tranche_active_store::{
    ActiveStore, Config as ActiveConfig, RestoredLeases, SystemClock, WorkerRegistry,
};
use tranche_archive_store::Config as ArchiveConfig;
use tranche_stats::StatsStore;

use crate::error::Error;
use crate::layers::{ArchiveStore, DEFAULT_SHARDS, Open, Tuning, archive_config};
use crate::state::{self, Embedded};

/// One namespace held in this process, and the file it is saved to.
pub(crate) struct EmbeddedBackend {
    path: PathBuf,
    /// The lock on the state file, when this process holds it; `None` while another
    /// live `tranche` holds it (this one may read, never save).
    lock: Option<StateLock>,
    stores: Embedded,
    archive_config: ArchiveConfig,
    shards: u32,
}

impl EmbeddedBackend {
    /// Loads the namespace from `path`, or starts an empty one when `open` allows.
    ///
    /// When this process takes the lock, the process that saved the file is gone (one
    /// writer per state file): its leases are released at once, checkpoints kept, and
    /// its worker entries are dropped. A reader opening the file while a live `run`
    /// holds the lock sees that run's leases and workers as they were saved.
    pub(crate) async fn open(
        path: &Path,
        ns: &str,
        shards: Option<u32>,
        open: Open,
        tuning: &Tuning,
    ) -> Result<Self, Error> {
        let lock = StateLock::acquire(path, open == Open::Create)?;
        let saved = state::load(path).map_err(state_error)?;
        let shards = match (&saved, shards) {
            (Some(s), Some(asked)) if s.active.num_shards != asked => {
                return Err(Error::Refused(format!(
                    "namespace `{ns}` in {} has {} shards, not {asked}",
                    path.display(),
                    s.active.num_shards
                )));
            }
            (Some(s), _) if s.active.namespace != ns => {
                return Err(Error::Refused(format!(
                    "{} holds namespace `{}`, not `{ns}` (pass --namespace {} or another --state)",
                    path.display(),
                    s.active.namespace,
                    s.active.namespace
                )));
            }
            (Some(s), _) => s.active.num_shards,
            (None, _) if open == Open::Existing => {
                return Err(Error::Refused(format!(
                    "namespace `{ns}` has no state file at {} (run `tranche plan` first, or pass --state or --redis)",
                    path.display()
                )));
            }
            (None, asked) => asked.unwrap_or(DEFAULT_SHARDS),
        };
        let active_config = ActiveConfig {
            namespace: ns.to_owned(),
            num_shards: shards,
            ..tuning.active.clone()
        };
        let first_pid = saved
            .as_ref()
            .and_then(|s| s.active.first_pid())
            .unwrap_or(1);
        let archive_config = archive_config(ns, shards, first_pid, tuning);
        let clock = Arc::new(SystemClock);
        let writer = lock.is_some();
        let leases = if writer {
            RestoredLeases::Release
        } else {
            RestoredLeases::Keep
        };
        let stores = match saved {
            Some(saved) => {
                let stores =
                    Embedded::restore(active_config, archive_config.clone(), clock, saved, leases)
                        .map_err(state_error)?;
                if writer {
                    for worker in stores.active.workers().await? {
                        stores.active.deregister(&worker.info.id).await?;
                    }
                }
                stores
            }
            None => {
                Embedded::new(active_config, archive_config.clone(), clock).map_err(state_error)?
            }
        };
        Ok(Self {
            path: path.to_owned(),
            lock,
            stores,
            archive_config,
            shards,
        })
    }

    /// The namespace's shard count.
    pub(crate) fn shards(&self) -> u32 {
        self.shards
    }

    /// The archive settings the stores were opened with.
    pub(crate) fn archive_config(&self) -> &ArchiveConfig {
        &self.archive_config
    }

    /// The state file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The three layers as trait objects.
    pub(crate) fn layers(
        &self,
    ) -> (
        Arc<dyn ActiveStore>,
        Arc<dyn ArchiveStore>,
        Arc<dyn StatsStore>,
    ) {
        (
            self.stores.active.clone(),
            self.stores.archive.clone(),
            self.stores.stats.clone(),
        )
    }

    /// Records completed and not yet archived.
    pub(crate) fn inbox_len(&self) -> u64 {
        let channels: u64 = (0..self.shards)
            .filter_map(|s| self.stores.active.inbox(s))
            .map(|r| r.len() as u64)
            .sum();
        channels + self.stores.archive.received_count()
    }

    /// Refuses when another live process holds the state file: what this one changed
    /// would overwrite that one's saves, or be overwritten by them.
    pub(crate) fn ensure_writable(&self) -> Result<(), Error> {
        if self.lock.is_some() {
            return Ok(());
        }
        let holder = StateLock::holder(&self.path).map_or("?".to_owned(), |p| p.to_string());
        Err(Error::Refused(format!(
            "another tranche process (pid {holder}) is using {}; nothing written (try again once it has finished)",
            self.path.display()
        )))
    }

    /// Deletes the state file, its previous generation, a damaged file kept aside and
    /// its lock file (`drop`), while holding the lock.
    #[cfg(feature = "cli")]
    pub(crate) fn delete(&self) -> Result<(), Error> {
        self.ensure_writable()?;
        for path in [
            self.path.clone(),
            state::previous(&self.path),
            state::quarantined(&self.path),
            StateLock::lock_path(&self.path),
        ] {
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(Error::Io { path, source: e });
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Writes the state file (atomically; see [`state`]). Blocking I/O, moved off the
    /// async workers.
    pub(crate) async fn save(&self) -> Result<(), Error> {
        // The lock holder's directory exists: taking the lock created it.
        self.ensure_writable()?;
        // On the blocking pool: `block_in_place` would panic on a current-thread runtime,
        // which a library user of `runner` may well have.
        let (stores, path) = (self.stores.clone(), self.path.clone());
        let report = tokio::task::spawn_blocking(move || stores.save(&path))
            .await
            .map_err(|e| Error::Other(format!("saving the state failed: {e}").into()))?
            .map_err(state_error)?;
        tracing::debug!(bytes = report.bytes, held = ?report.held, total = ?report.total, "state saved");
        Ok(())
    }
}

/// `<state file>.lock`: whoever holds an exclusive `flock` on it may write the state
/// file. The kernel drops the lock when its holder exits, however it exits, so a lock
/// is never stale and liveness is never guessed from a pid (reused pids, containers and
/// NFS made that unreliable). The file itself stays: removing a locked file lets two
/// processes lock two different inodes under one name. It holds the holder's pid, for
/// people only.
struct StateLock {
    // Held open for the lock's lifetime; closing it releases the lock.
    _file: std::fs::File,
    /// The directory this lock created, with the lock and state paths: removed again on
    /// drop if no state was ever saved, so a refused first command leaves nothing.
    created: Option<(PathBuf, PathBuf, PathBuf)>,
}

impl Drop for StateLock {
    fn drop(&mut self) {
        if let Some((dir, lock, state)) = &self.created
            && !state.exists()
        {
            let _ = std::fs::remove_file(lock);
            let _ = std::fs::remove_dir(dir);
        }
    }
}

impl StateLock {
    fn lock_path(state: &Path) -> PathBuf {
        let mut name = state.file_name().unwrap_or_default().to_os_string();
        name.push(".lock");
        state.with_file_name(name)
    }

    /// Takes the lock, or returns `None` if another process holds it. A missing state
    /// directory is created (private to the user) when `create` allows, else there is
    /// nothing to lock and nothing to read: `None`.
    fn acquire(state: &Path, create: bool) -> Result<Option<Self>, Error> {
        use std::io::Write;
        use std::os::unix::fs::DirBuilderExt;
        let path = Self::lock_path(state);
        let mut created = None;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
            && !dir.exists()
        {
            if !create {
                return Ok(None);
            }
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| io(dir, e))?;
            created = Some((dir.to_owned(), path.clone(), state.to_owned()));
        }
        let mut file = crate::slot::open_lock_file(&path).map_err(|e| io(&path, e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Ok(None),
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(io(&path, e));
            }
        }
        // Informational only; the lock is the flock.
        file.set_len(0)
            .and_then(|()| write!(file, "{}", std::process::id()))
            .map_err(|e| io(&path, e))?;
        Ok(Some(Self {
            _file: file,
            created,
        }))
    }

    /// The pid the holder of `state`'s lock wrote in it, if readable.
    fn holder(state: &Path) -> Option<u32> {
        std::fs::read_to_string(Self::lock_path(state))
            .ok()?
            .trim()
            .parse()
            .ok()
    }
}

/// A state file's error, as the library's.
fn state_error(err: state::StateError) -> Error {
    Error::State(Box::new(err))
}

/// A failed I/O on `path`, as the library's error.
fn io(path: &Path, source: std::io::Error) -> Error {
    Error::Io {
        path: path.to_owned(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tranche-lock-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir.join("state").join("ns.state")
    }

    /// Two first runs in a directory that does not exist yet: the first creates it
    /// (private) and takes the lock, the second is refused.
    #[test]
    fn two_first_runs_get_one_lock() {
        use std::os::unix::fs::PermissionsExt;
        let state = fresh("first");
        let dir = state.parent().unwrap().to_owned();
        assert!(StateLock::acquire(&state, false).unwrap().is_none());
        assert!(!dir.exists(), "a reader created the state directory");
        let one = StateLock::acquire(&state, true).unwrap();
        assert!(one.is_some());
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{mode:o}");
        assert!(StateLock::acquire(&state, true).unwrap().is_none());
        assert_eq!(StateLock::holder(&state), Some(std::process::id()));
        drop(one);
        assert!(StateLock::acquire(&state, true).unwrap().is_some());
        let _ = std::fs::remove_dir_all(dir.parent().unwrap());
    }

    /// A lock file left behind, naming a pid that may well be alive, is not a lock:
    /// only a held `flock` is.
    #[test]
    fn a_left_lock_file_is_taken() {
        let state = fresh("stale");
        let dir = state.parent().unwrap().to_owned();
        std::fs::create_dir_all(&dir).unwrap();
        // Pid 1 is alive; under the old pid-file scheme this lock was never taken.
        std::fs::write(StateLock::lock_path(&state), "1").unwrap();
        assert!(StateLock::acquire(&state, false).unwrap().is_some());
        assert_eq!(StateLock::holder(&state), Some(std::process::id()));
        let _ = std::fs::remove_dir_all(dir.parent().unwrap());
    }
}
