//! The embedded backend as the rest of the binary sees it: [`state::Embedded`]'s three
//! memory stores, the state file they are saved to, and the settings they were opened
//! with.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Result, bail};
use tranche_active_store::{
    ActiveStore, Config as ActiveConfig, RestoredLeases, SystemClock, WorkerRegistry,
};
use tranche_archive_store::Config as ArchiveConfig;
use tranche_stats::StatsStore;

use crate::backend::{ArchiveStore, DEFAULT_SHARDS, Open, Tuning, archive_config};
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
    ) -> Result<Self> {
        let lock = StateLock::acquire(path)?;
        let saved = state::load(path)?;
        let shards = match (&saved, shards) {
            (Some(s), Some(asked)) if s.active.num_shards != asked => bail!(
                "namespace `{ns}` in {} has {} shards, not {asked}",
                path.display(),
                s.active.num_shards
            ),
            (Some(s), _) if s.active.namespace != ns => bail!(
                "{} holds namespace `{}`, not `{ns}` (pass --namespace {} or another --state)",
                path.display(),
                s.active.namespace,
                s.active.namespace
            ),
            (Some(s), _) => s.active.num_shards,
            (None, _) if open == Open::Existing => bail!(
                "namespace `{ns}` has no state file at {} (run `tranche plan` first, or pass --state or --redis)",
                path.display()
            ),
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
                    Embedded::restore(active_config, archive_config.clone(), clock, saved, leases)?;
                if writer {
                    for worker in stores.active.workers().await? {
                        stores.active.deregister(&worker.info.id).await?;
                    }
                }
                stores
            }
            None => Embedded::new(active_config, archive_config.clone(), clock)?,
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
    pub(crate) fn ensure_writable(&self) -> Result<()> {
        if self.lock.is_some() {
            return Ok(());
        }
        let holder = StateLock::holder(&self.path).map_or("?".to_owned(), |p| p.to_string());
        bail!(
            "another tranche process (pid {holder}) is using {}; nothing written (try again once it has finished)",
            self.path.display()
        )
    }

    /// Writes the state file (atomically; see [`state`]). Blocking I/O, moved off the
    /// async workers.
    pub(crate) async fn save(&self) -> Result<()> {
        self.ensure_writable()?;
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
        }
        let report = tokio::task::block_in_place(|| self.stores.save(&self.path))?;
        tracing::debug!(bytes = report.bytes, held = ?report.held, total = ?report.total, "state saved");
        Ok(())
    }
}

/// `<state file>.lock`, holding the pid of the process that may write the state file.
/// Removed on drop; a lock left by a killed process is taken over once its pid is gone.
struct StateLock {
    path: PathBuf,
}

impl StateLock {
    fn lock_path(state: &Path) -> PathBuf {
        let mut name = state.file_name().unwrap_or_default().to_os_string();
        name.push(".lock");
        state.with_file_name(name)
    }

    /// Takes the lock, or returns `None` if a live process holds it.
    fn acquire(state: &Path) -> Result<Option<Self>> {
        let path = Self::lock_path(state);
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
            && !dir.exists()
        {
            // No state directory yet: nothing to protect until the first save creates it.
            return Ok(Some(Self { path }));
        }
        for _ in 0..2 {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(mut f) => {
                    use std::io::Write;
                    write!(f, "{}", std::process::id())?;
                    return Ok(Some(Self { path }));
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    match Self::holder(state) {
                        Some(pid) if Path::new(&format!("/proc/{pid}")).exists() => {
                            return Ok(None);
                        }
                        // A dead holder's (or an unreadable) lock: take it over.
                        _ => {
                            let _ = std::fs::remove_file(&path);
                        }
                    }
                }
                Err(e) => return Err(anyhow::anyhow!("cannot create {}: {e}", path.display())),
            }
        }
        Ok(None)
    }

    /// The pid written in the lock of `state`, if any.
    fn holder(state: &Path) -> Option<u32> {
        std::fs::read_to_string(Self::lock_path(state))
            .ok()?
            .trim()
            .parse()
            .ok()
    }
}

impl Drop for StateLock {
    fn drop(&mut self) {
        // Only our own lock: never one another process took over meanwhile.
        let ours = std::process::id().to_string();
        if std::fs::read_to_string(&self.path).is_ok_and(|s| s.trim() == ours) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}
