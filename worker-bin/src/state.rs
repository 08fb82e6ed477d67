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

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tranche_active_store::{ActiveState, Clock, MemoryActiveStore, RestoredLeases};
use tranche_archive_store::{ArchiveState, MemoryArchive};
use tranche_stats::MemoryStats;

/// The version of the state file format this build writes and reads.
pub(crate) const STATE_FILE_VERSION: u32 = 1;

/// The first bytes of every state file.
const MAGIC: &[u8; 8] = b"TRSTATE\0";

/// Magic, version, payload length, payload CRC32.
const HEADER_LEN: usize = 8 + 4 + 8 + 4;

/// The largest payload a state file may declare (16 GiB): a bound on what a damaged
/// length field can make the loader allocate.
const MAX_PAYLOAD: u64 = 1 << 34;

/// What can go wrong with the state file. Every message names the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum StateError {
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
pub(crate) struct EmbeddedState {
    /// The active store: plans, cursors, partitions, leases, completed index, workers.
    pub(crate) active: ActiveState,
    /// The archive: tiers, archived set, records received and not archived yet, and
    /// the statistics.
    pub(crate) archive: ArchiveState,
}

/// The three layers of an embedded run, wired together: the archive drains the active
/// store's inboxes and counts into the statistics.
#[derive(Debug, Clone)]
pub(crate) struct Embedded {
    /// The active layer.
    pub(crate) active: Arc<MemoryActiveStore>,
    /// The archive, fed by `active`'s inboxes.
    pub(crate) archive: Arc<MemoryArchive>,
    /// The statistics `archive` counts into.
    pub(crate) stats: Arc<MemoryStats>,
}

/// What one [`Embedded::save`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SaveReport {
    /// Bytes written, header included.
    pub(crate) bytes: u64,
    /// How long the stores were held still while their states were taken.
    pub(crate) held: Duration,
    /// How long the whole save took, writing and syncing included.
    pub(crate) total: Duration,
}

impl Embedded {
    /// A fresh embedded run.
    pub(crate) fn new(
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
        })
    }

    /// An embedded run restored from `state`, with what becomes of the saved leases.
    /// [`StateError::Mismatch`] when the state is of another namespace or shard count.
    pub(crate) fn restore(
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
    pub(crate) fn state(&self) -> EmbeddedState {
        let (active, archive) = self.active.state_with(|| self.archive.state());
        EmbeddedState { active, archive }
    }

    /// Saves [`Embedded::state`] to `path`, atomically. Call it periodically while
    /// running and once more after the workers and the archiver have stopped.
    pub(crate) fn save(&self, path: &Path) -> Result<SaveReport, StateError> {
        let start = Instant::now();
        let state = self.state();
        let held = start.elapsed();
        let bytes = save(path, &state)?;
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

/// Writes `state` to `path` atomically and privately (0600, through
/// [`crate::atomic::write`]). The caller holds the state lock. Returns the bytes
/// written.
pub(crate) fn save(path: &Path, state: &EmbeddedState) -> Result<u64, StateError> {
    let io = |source| StateError::Io {
        path: path.to_owned(),
        source,
    };
    let payload =
        bincode::serde::encode_to_vec(state, bincode::config::standard()).map_err(|e| {
            StateError::Corrupt {
                path: path.to_owned(),
                detail: format!("cannot encode the state: {e}"),
            }
        })?;
    let header = header(&payload);
    crate::atomic::write(path, &[&header, &payload], 0o600).map_err(io)
}

/// Reads the state saved at `path`; `None` if there is no such file.
pub(crate) fn load(path: &Path) -> Result<Option<EmbeddedState>, StateError> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(StateError::Io {
                path: path.to_owned(),
                source,
            });
        }
    };
    decode(path, &bytes).map(Some)
}

fn decode(path: &Path, bytes: &[u8]) -> Result<EmbeddedState, StateError> {
    let corrupt = |detail: String| StateError::Corrupt {
        path: path.to_owned(),
        detail,
    };
    if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
        return Err(StateError::NotAStateFile {
            path: path.to_owned(),
        });
    }
    if bytes.len() < HEADER_LEN {
        return Err(corrupt(format!("{} bytes is too short", bytes.len())));
    }
    let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    let version = word(8);
    if version != STATE_FILE_VERSION {
        return Err(StateError::Version {
            path: path.to_owned(),
            found: version,
        });
    }
    let len = u64::from_le_bytes(bytes[12..20].try_into().expect("8 bytes"));
    let payload = &bytes[HEADER_LEN..];
    if len > MAX_PAYLOAD || len != payload.len() as u64 {
        return Err(corrupt(format!(
            "it declares {len} bytes of state but holds {}",
            payload.len()
        )));
    }
    if crc32fast::hash(payload) != word(20) {
        return Err(corrupt("checksum mismatch".into()));
    }
    let (state, read) = decode_bounded(payload).map_err(|e| corrupt(e.to_string()))?;
    if read != payload.len() {
        return Err(corrupt(format!(
            "{} bytes after the state",
            payload.len() - read
        )));
    }
    Ok(state)
}

/// The file header of `payload`: magic, version, length, CRC32.
fn header(payload: &[u8]) -> Vec<u8> {
    let mut header = Vec::with_capacity(HEADER_LEN);
    header.extend_from_slice(MAGIC);
    header.extend_from_slice(&STATE_FILE_VERSION.to_le_bytes());
    header.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    header.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    header
}

/// The state-file loader fed `data`, for the fuzz target (`worker-bin/fuzz`, `cargo
/// xtask fuzz state`). With the first byte odd, the rest is a payload given a valid
/// header (random bytes almost never carry a valid CRC32, and the fuzzer would spend
/// its time on that check instead of on bincode and the stores' checks behind it);
/// with it even, the rest is the whole file. A state that loads is restored as a
/// writer restores it. Whatever the bytes, both answer or err, never panic.
#[cfg(feature = "fuzzing")]
pub fn fuzz_state_file(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let bytes = if mode & 1 == 1 {
        [header(rest).as_slice(), rest].concat()
    } else {
        rest.to_vec()
    };
    let Ok(state) = decode(Path::new("fuzz.state"), &bytes) else {
        return;
    };
    let (ns, shards) = (state.active.namespace.clone(), state.active.num_shards);
    let active = tranche_active_store::Config {
        namespace: ns.clone(),
        num_shards: shards,
        ..Default::default()
    };
    let first_pid = state.active.first_pid().unwrap_or(1);
    let tuning = crate::backend::Tuning::default();
    let archive = crate::backend::archive_config(&ns, shards, first_pid, &tuning);
    let clock = Arc::new(tranche_active_store::SystemClock);
    let _ = Embedded::restore(active, archive, clock, state, RestoredLeases::Release);
}

/// How many bytes bincode may claim per payload byte. It claims a string's or byte
/// string's length (bytes that must then be in the payload) and each number's size in
/// memory (at most 8 bytes for our widest, a u64, from at least one byte of varint), so
/// a valid state never claims more than 8 per payload byte.
const CLAIM_PER_BYTE: u64 = 16;

/// `payload` decoded by bincode with an allocation limit in proportion to its size
/// (the next power of two of [`CLAIM_PER_BYTE`] times it, at most [`MAX_PAYLOAD`]):
/// a length field in a damaged or hostile file is refused before it is allocated,
/// instead of allocating up to the 16 GiB a fixed limit allows (found by fuzzing: a
/// 100-byte payload asked for 4 GB). bincode takes the limit as a const generic,
/// hence the ladder.
fn decode_bounded(payload: &[u8]) -> Result<(EmbeddedState, usize), bincode::error::DecodeError> {
    let need = (payload.len() as u64).saturating_mul(CLAIM_PER_BYTE);
    macro_rules! ladder {
        ($($bits:literal)*) => {$(
            if need <= 1u64 << $bits {
                let config = bincode::config::standard().with_limit::<{ 1usize << $bits }>();
                return bincode::serde::decode_from_slice(payload, config);
            }
        )*};
    }
    ladder!(16 18 20 22 24 26 28 30 32);
    let config = bincode::config::standard().with_limit::<{ MAX_PAYLOAD as usize }>();
    bincode::serde::decode_from_slice(payload, config)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use tranche_active_store::{
        ActiveQuery, Leases, ManualClock, Plan, Planner, WorkerInfo, WorkerRegistry,
    };
    use tranche_archive_store::{ArchiveQuery, Archiver, Lookup};
    use tranche_stats::StatsStore;

    use super::*;

    const T0: u64 = 1_719_234_405_000;

    fn configs(shards: u32) -> (tranche_active_store::Config, tranche_archive_store::Config) {
        let active = tranche_active_store::Config {
            num_shards: shards,
            ..Default::default()
        };
        let archive = tranche_archive_store::Config {
            num_shards: shards,
            consumer: "embedded".into(),
            compressed_at: 100,
            summary_at: 200,
            ..Default::default()
        };
        (active, archive)
    }

    /// A fresh file path in the temporary directory, removed when dropped.
    struct TempPath(PathBuf);

    impl TempPath {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!(
                "tranche-state-{}-{name}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            Self(dir.join("run.state"))
        }
    }

    impl Drop for TempPath {
        fn drop(&mut self) {
            if let Some(dir) = self.0.parent() {
                let _ = fs::remove_dir_all(dir);
            }
        }
    }

    fn new_run(shards: u32, clock: &Arc<ManualClock>) -> Embedded {
        let (a, b) = configs(shards);
        Embedded::new(a, b, clock.clone()).unwrap()
    }

    async fn drain(run: &Embedded) {
        while run.archive.archive_once().await.unwrap().entries > 0 {}
    }

    /// Works on 300 partitions until at least `done` are completed, ten per claim,
    /// archiving every other round; then claims three more and checkpoints them
    /// (`min_id + 250`) without finishing them. Returns the pids it completed.
    async fn work(run: &Embedded, clock: &ManualClock, done: usize) -> BTreeSet<u64> {
        let mut completed = BTreeSet::new();
        let mut round = 0;
        while completed.len() < done {
            let leases = run.active.claim("w1", 10).await.unwrap();
            assert!(!leases.is_empty(), "ran out of work at {}", completed.len());
            clock.advance(100);
            for l in &leases {
                run.active.complete(l, 1000 + l.pid).await.unwrap();
                completed.insert(l.pid);
            }
            round += 1;
            if round % 2 == 0 {
                run.archive.archive_once().await.unwrap();
            }
        }
        for l in run.active.claim("w1", 3).await.unwrap() {
            run.active.heartbeat(&l, l.min_id + 250).await.unwrap();
        }
        completed
    }

    /// Every answer the three layers give, to compare two runs by.
    async fn answers(run: &Embedded) -> Vec<String> {
        let mut out = vec![
            format!("{:?}", run.active.all_active().await.unwrap()),
            format!("{:?}", run.active.counts().await.unwrap()),
            format!("{:?}", run.stats.stats().await.unwrap()),
            format!("{:?}", run.archive.decode_failures().await.unwrap()),
        ];
        for pid in 0..=310 {
            out.push(format!(
                "{pid}: {:?} {:?}",
                run.active.get(pid).await.unwrap(),
                run.archive.get(pid).await.unwrap()
            ));
        }
        out
    }

    #[tokio::test]
    async fn a_saved_run_loads_and_answers_as_it_did() {
        for shards in [1, 4] {
            let clock = Arc::new(ManualClock::new(T0));
            let run = new_run(shards, &clock);
            run.active
                .plan(&Plan::Uniform {
                    min: 1,
                    max: 300_000,
                    size: 1000,
                })
                .await
                .unwrap();
            run.active
                .worker_heartbeat(WorkerInfo {
                    id: "w1".into(),
                    host: "h".into(),
                    process_id: 1,
                    started_ms: T0,
                    last_beat_ms: 0,
                    in_flight: 3,
                    completed: 0,
                    rate_per_s: 0.0,
                    latency_p50_ms: 0.0,
                    latency_p99_ms: 0.0,
                    version: "0".into(),
                })
                .await
                .unwrap();
            work(&run, &clock, 250).await;
            let path = TempPath::new(&format!("answers{shards}"));
            let report = run.save(&path.0).unwrap();
            assert_eq!(report.bytes, fs::metadata(&path.0).unwrap().len());
            assert!(!path.0.with_file_name("run.state.tmp").exists());
            let state = load(&path.0).unwrap().unwrap();
            assert_eq!(state, run.state());
            let (a, b) = configs(shards);
            let back = Embedded::restore(a, b, clock.clone(), state, RestoredLeases::Keep).unwrap();
            assert_eq!(answers(&back).await, answers(&run).await);
            // Saved again, the restored run loads as it is.
            let again = TempPath::new(&format!("again{shards}"));
            back.save(&again.0).unwrap();
            assert_eq!(load(&again.0).unwrap().unwrap(), back.state());
        }
    }

    #[tokio::test]
    async fn an_interrupted_run_resumes_and_redoes_no_finished_partition() {
        for shards in [1, 4] {
            let clock = Arc::new(ManualClock::new(T0));
            let path = TempPath::new(&format!("resume{shards}"));
            let (a, b) = configs(shards);
            let (run, resumed) = Embedded::open(&path.0, a, b, clock.clone()).unwrap();
            assert!(!resumed);
            run.active
                .plan(&Plan::Uniform {
                    min: 1,
                    max: 300_000,
                    size: 1000,
                })
                .await
                .unwrap();
            let first = work(&run, &clock, 120).await;
            // Some completions are still in the inbox, three leases are held.
            run.save(&path.0).unwrap();
            let in_flight = run.active.counts().await.unwrap();
            assert_eq!(in_flight.running, 3);
            drop(run);

            let (a, b) = configs(shards);
            let (run, resumed) = Embedded::open(&path.0, a, b, clock.clone()).unwrap();
            assert!(resumed);
            let counts = run.active.counts().await.unwrap();
            assert_eq!((counts.claimed, counts.running, counts.pending), (0, 0, 3));
            // The released partitions come back first, from their checkpoints.
            let leases = run.active.claim("w1", 3).await.unwrap();
            assert_eq!(leases.len(), 3);
            for l in &leases {
                assert_eq!(l.progress, l.min_id + 250, "{l:?}");
                run.active.complete(l, 5).await.unwrap();
            }
            let mut rest = BTreeSet::new();
            loop {
                let leases = run.active.claim("w1", 50).await.unwrap();
                if leases.is_empty() {
                    break;
                }
                for l in &leases {
                    run.active.complete(l, 5).await.unwrap();
                    rest.insert(l.pid);
                }
            }
            assert!(first.is_disjoint(&rest), "a finished partition was redone");
            drain(&run).await;
            assert_eq!(first.len() + 3 + rest.len(), 300);
            let stats = run.stats.stats().await.unwrap();
            assert_eq!(stats.global_stats.total_completed, 300);
            for pid in 1..=300 {
                assert!(
                    matches!(run.archive.get(pid).await.unwrap(), Lookup::Archived { .. }),
                    "pid {pid}"
                );
            }
        }
    }

    /// A length field asking for more than the payload could hold is refused before
    /// anything is allocated. The fuzzer's find (`cargo xtask fuzz state`): this
    /// 130-byte payload's string length of 0xfcfcfcfc made bincode, under the old fixed
    /// 16 GiB limit, allocate 4 GB before finding the bytes missing.
    #[test]
    fn a_length_past_the_payload_is_refused_unallocated() {
        let payload: &[u8] = &[
            1, 7, 116, 114, 97, 110, 99, 104, 101, 4, 1, 0, 0, 252, 252, 252, 252, 252, 252, 252,
            252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252,
            252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252,
            252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252,
            252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252, 252,
            252, 252, 252, 252, 252, 252, 252, 252, 252, 0, 0, 1, 1, 10, 1, 37, 0, 14, 0, 0, 0, 0,
            162, 1, 0, 0, 1, 1, 1, 251, 16, 39, 251, 232, 3, 0, 253, 4,
        ];
        let err = decode_bounded(payload).unwrap_err();
        assert!(
            matches!(err, bincode::error::DecodeError::LimitExceeded),
            "{err:?}"
        );
        let bytes = [header(payload).as_slice(), payload].concat();
        let err = decode(Path::new("t.state"), &bytes).unwrap_err();
        assert!(matches!(err, StateError::Corrupt { .. }), "{err}");
    }

    #[test]
    fn a_bad_file_is_refused_with_a_clear_error() {
        let clock = Arc::new(ManualClock::new(T0));
        let run = new_run(2, &clock);
        let path = TempPath::new("bad");
        assert!(load(&path.0).unwrap().is_none());
        run.save(&path.0).unwrap();
        let good = fs::read(&path.0).unwrap();
        let check = |bytes: &[u8], want: &str| {
            fs::write(&path.0, bytes).unwrap();
            let err = load(&path.0).unwrap_err().to_string();
            assert!(err.contains(want), "{err}");
            assert!(err.contains("run.state"), "{err}");
        };
        check(b"hello", "is not a tranche state file");
        check(&good[..HEADER_LEN - 1], "too short");
        check(&good[..good.len() - 1], "is corrupt");
        let mut flipped = good.clone();
        *flipped.last_mut().unwrap() ^= 1;
        check(&flipped, "checksum mismatch");
        let mut newer = good.clone();
        newer[8] += 1;
        check(&newer, "format version 2");

        // Another job's state.
        fs::write(&path.0, &good).unwrap();
        let state = load(&path.0).unwrap().unwrap();
        let (a, b) = configs(3);
        let err = Embedded::restore(a, b, clock.clone(), state, RestoredLeases::Release)
            .unwrap_err()
            .to_string();
        assert!(err.contains("2 shards") && err.contains("with 3"), "{err}");
    }

    /// A temporary file planted as a symlink is never followed: the link goes, its
    /// target stays as it was, and the state is written to a new private file.
    #[test]
    fn a_planted_temporary_symlink_is_not_followed() {
        use std::os::unix::fs::PermissionsExt;
        let clock = Arc::new(ManualClock::new(T0));
        let run = new_run(2, &clock);
        let path = TempPath::new("symlink");
        let victim = path.0.with_file_name("victim.txt");
        fs::write(&victim, "precious").unwrap();
        std::os::unix::fs::symlink(&victim, path.0.with_file_name("run.state.tmp")).unwrap();
        run.save(&path.0).unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
        assert!(load(&path.0).unwrap().is_some());
        let mode = fs::metadata(&path.0).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{mode:o}");
        assert!(!path.0.with_file_name("run.state.tmp").exists());
    }
}
