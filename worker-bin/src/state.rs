//! The embedded backend: the three memory stores of one namespace in this process,
//! saved to a state file so an interrupted run resumes where it stopped.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Result, bail};
use tranche_active_store::{ActiveStore, Config as ActiveConfig, MemoryActiveStore, SystemClock};
use tranche_archive_store::{Config as ArchiveConfig, MemoryArchive};
use tranche_stats::{MemoryStats, StatsStore};

use crate::backend::{ArchiveStore, DEFAULT_SHARDS, Open, Tuning, archive_config};

/// One namespace held in memory, and the file it is saved to.
pub(crate) struct Embedded {
    path: PathBuf,
    active: Arc<MemoryActiveStore>,
    archive: Arc<MemoryArchive>,
    stats: Arc<MemoryStats>,
    archive_config: ArchiveConfig,
    shards: u32,
}

impl Embedded {
    /// Loads the namespace from `path`, or starts an empty one when `open` allows.
    pub(crate) async fn open(
        path: &Path,
        ns: &str,
        shards: Option<u32>,
        open: Open,
        tuning: &Tuning,
    ) -> Result<Self> {
        if path.exists() {
            bail!("state files are not supported yet: {}", path.display());
        }
        if open == Open::Existing {
            bail!(
                "namespace `{ns}` has no state file at {} (run `tranche plan` first, or pass --state or --redis)",
                path.display()
            );
        }
        let shards = shards.unwrap_or(DEFAULT_SHARDS);
        let config = ActiveConfig {
            namespace: ns.to_owned(),
            num_shards: shards,
            ..tuning.active.clone()
        };
        let active = Arc::new(MemoryActiveStore::with_clock(
            config,
            Arc::new(SystemClock),
        )?);
        let stats = Arc::new(MemoryStats::new());
        let archive_config = archive_config(ns, shards, 1, tuning);
        let inboxes = (0..shards).filter_map(|s| active.inbox(s)).collect();
        let archive = Arc::new(MemoryArchive::new(
            archive_config.clone(),
            inboxes,
            stats.clone(),
        )?);
        Ok(Self {
            path: path.to_owned(),
            active,
            archive,
            stats,
            archive_config,
            shards,
        })
    }

    pub(crate) fn shards(&self) -> u32 {
        self.shards
    }

    pub(crate) fn archive_config(&self) -> &ArchiveConfig {
        &self.archive_config
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn layers(
        &self,
    ) -> (
        Arc<dyn ActiveStore>,
        Arc<dyn ArchiveStore>,
        Arc<dyn StatsStore>,
    ) {
        (
            self.active.clone(),
            self.archive.clone(),
            self.stats.clone(),
        )
    }

    /// Records completed but not yet archived.
    pub(crate) fn inbox_len(&self) -> u64 {
        (0..self.shards)
            .filter_map(|s| self.active.inbox(s))
            .map(|r| r.len() as u64)
            .sum()
    }

    /// Writes the state file.
    pub(crate) async fn save(&self) -> Result<()> {
        Ok(())
    }
}
