//! The embedded backend: the same semantics as Redis, in one process.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use crossbeam_channel::{Receiver, Sender};
use dashmap::DashMap;
use tranche_codec::{CompletedRecord, Partition, Status};

use crate::clock::{Clock, TokioClock};
use crate::layout::Layout;
use crate::model::{
    ActiveSnapshot, Completion, Config, FailOutcome, Lease, Plan, PlanEntry, PlanOutcome,
    StatusCounts, Unissued, WorkerInfo, WorkerState,
};
use crate::plans::{self, Registry};
use crate::state::{ACTIVE_STATE_VERSION, ActiveState, RestoredLeases, ShardState};
use crate::store::{ActiveQuery, Leases, Maintenance, Planner, WorkerRegistry};
use crate::{Error, Result};
use tranche_codec::state::runs;

mod leases;
mod maintenance;
mod planner;
mod query;
mod shard;
mod split;

/// The active layer in memory: the embedded default when no Redis is configured.
///
/// Each shard is a mutex over plain collections, so every operation is as atomic as a
/// Lua script is on Redis; the worker registry is a `DashMap`. Completed records go to a
/// per-shard crossbeam channel, the in-process counterpart of the Redis inbox stream:
/// [`MemoryActiveStore::inbox`] hands its receiver to an archiver.
///
/// Time comes from a [`Clock`]; the default [`TokioClock`] follows tokio's clock, so
/// tests can `tokio::time::pause()` and advance through lease expiry and backoff.
#[derive(Debug)]
pub struct MemoryActiveStore {
    config: Config,
    layout: Layout,
    clock: Arc<dyn Clock>,
    registry: Mutex<Registry>,
    shards: Vec<Mutex<Shard>>,
    inbox: Vec<(Sender<CompletedRecord>, Receiver<CompletedRecord>)>,
    workers: DashMap<String, WorkerInfo>,
    /// `set_paused`; not saved with the state (an embedded run has one process).
    paused: std::sync::atomic::AtomicBool,
}

/// One shard's state: the same structures as its Redis keys.
#[derive(Debug, Default)]
struct Shard {
    /// Materialised partitions (pending, claimed, running, failed).
    active: HashMap<u64, Partition>,
    /// Pending partitions by ready time.
    pending: BTreeSet<(u64, u64)>,
    /// Leased partitions by deadline.
    leases: BTreeSet<(u64, u64)>,
    /// Uniform plans known to this shard: first pid -> (last pid, next pid to consider).
    cursors: Vec<(u64, u64, u64)>,
    /// The completed index: pids ever completed here.
    completed: HashSet<u64>,
    /// The last fencing token handed out.
    token: u64,
    /// Split partitions and their pieces (`split`).
    splits: split::ShardSplits,
}

impl MemoryActiveStore {
    /// An empty store with `config`, following tokio's clock.
    pub fn new(config: Config) -> Result<Self> {
        Self::with_clock(config, Arc::new(TokioClock::new()))
    }

    /// An empty store with `config` and `clock`.
    pub fn with_clock(config: Config, clock: Arc<dyn Clock>) -> Result<Self> {
        let layout = Layout::new(&config)?;
        let n = config.num_shards as usize;
        Ok(Self {
            config,
            layout,
            clock,
            registry: Mutex::new(Registry::default()),
            shards: (0..n).map(|_| Mutex::new(Shard::default())).collect(),
            inbox: (0..n).map(|_| crossbeam_channel::unbounded()).collect(),
            workers: DashMap::new(),
            paused: Default::default(),
        })
    }

    /// The receiving end of `shard`'s inbox: every completed record, once, in completion
    /// order. Clones share the queue (each record goes to one receiver).
    pub fn inbox(&self, shard: u32) -> Option<Receiver<CompletedRecord>> {
        self.inbox.get(shard as usize).map(|(_, rx)| rx.clone())
    }

    /// The store's settings.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Everything the store holds, for the embedded state file.
    pub fn state(&self) -> ActiveState {
        self.state_with(|| ()).0
    }

    /// Everything the store holds, and what `f` returns when run while the store is
    /// held still: no claim, completion or other change can happen between the state
    /// and `f`. The embedded state file takes the archive's state (with the inbox
    /// records) in `f`, so a partition completed around the save is either completed
    /// in both states or in neither: never lost between them, never redone.
    ///
    /// Every shard is locked for the duration, so `f` must be quick and must not call
    /// this store.
    pub fn state_with<R>(&self, f: impl FnOnce() -> R) -> (ActiveState, R) {
        // Lock order everywhere: registry, then shards in order.
        let registry = lock(&self.registry);
        let guards: Vec<MutexGuard<'_, Shard>> = self.shards.iter().map(lock).collect();
        let saved_at_ms = self.now();
        let shards = guards.iter().map(|s| s.state()).collect();
        let mut workers: Vec<WorkerInfo> = self.workers.iter().map(|w| w.clone()).collect();
        workers.sort_by(|a, b| a.id.cmp(&b.id));
        let state = ActiveState {
            version: ACTIVE_STATE_VERSION,
            namespace: self.config.namespace.clone(),
            num_shards: self.config.num_shards,
            saved_at_ms,
            plans: registry.entries().to_vec(),
            shards,
            workers,
        };
        let out = f();
        drop(guards);
        drop(registry);
        (state, out)
    }

    /// A store answering exactly as the one that saved `state` did, with `config`
    /// (its namespace and shard count must be the saved ones; lease, backoff and the
    /// other settings may change) and `clock`. `leases` says what becomes of the leases
    /// the saving process held. The inboxes start empty: their records were saved with
    /// the archive.
    ///
    /// Claims go on from the saved cursors and fencing tokens from the saved counters,
    /// so a token handed out after the restore is larger than any before it.
    /// [`Error::InvalidArgument`] when the namespace or shard count differ,
    /// [`Error::Corrupt`] for another state version or a state that breaks the store's
    /// invariants.
    pub fn restore(
        config: Config,
        clock: Arc<dyn Clock>,
        state: ActiveState,
        leases: RestoredLeases,
    ) -> Result<Self> {
        let corrupt = |detail: String| Error::Corrupt {
            key: "active state".into(),
            detail,
        };
        tranche_codec::state::check_version(state.version, ACTIVE_STATE_VERSION)
            .map_err(|e| corrupt(e.to_string()))?;
        if (state.namespace.as_str(), state.num_shards)
            != (config.namespace.as_str(), config.num_shards)
        {
            return Err(Error::InvalidArgument(format!(
                "the state is of namespace {:?} with {} shards, not {:?} with {}",
                state.namespace, state.num_shards, config.namespace, config.num_shards
            )));
        }
        if state.shards.len() != config.num_shards as usize {
            return Err(corrupt(format!(
                "{} shards saved for {}",
                state.shards.len(),
                config.num_shards
            )));
        }
        let store = Self::with_clock(config, clock)?;
        let mut plans = state.plans;
        plans.sort_by_key(|e| e.plan.first_pid());
        for pair in plans.windows(2) {
            if pair[0].plan.last_pid() >= pair[1].plan.first_pid() {
                return Err(corrupt(format!(
                    "plans from pid {} and {} overlap",
                    pair[0].plan.first_pid(),
                    pair[1].plan.first_pid()
                )));
            }
        }
        let planned_last = plans.last().map_or(0, |e| e.plan.last_pid());
        *lock(&store.registry) = Registry::from_entries(plans);
        for (no, saved) in state.shards.into_iter().enumerate() {
            let shard =
                Shard::restore(&store.layout, no as u32, planned_last, saved).map_err(corrupt)?;
            *lock(&store.shards[no]) = shard;
        }
        for w in state.workers {
            store.workers.insert(w.id.clone(), w);
        }
        if leases == RestoredLeases::Release {
            store.expire_all();
        }
        Ok(store)
    }

    /// Every lease expired at once, as the reaper would find it (the process that
    /// held them is gone): pending again with its attempt counted and its checkpoint
    /// kept, or failed if that was its last attempt, so a partition that kills its
    /// process every time ends failed at `max_attempts` as it does on Redis.
    fn expire_all(&self) {
        let now = self.now();
        for shard in &self.shards {
            let mut shard = lock(shard);
            let held: Vec<u64> = shard.leases.iter().map(|&(_, pid)| pid).collect();
            for pid in held {
                shard.expire(pid, now, self.config.max_attempts);
            }
        }
    }

    /// Releases every lease at once, whoever holds it: pending and ready now, the
    /// checkpoint kept. Returns the pids, in order. For a process that knows it is the
    /// only worker and starts again (an embedded run resumed from its state file).
    pub fn release_all(&self) -> Vec<u64> {
        let now = self.now();
        let mut out = Vec::new();
        for shard in &self.shards {
            let mut shard = lock(shard);
            let held: Vec<u64> = shard.leases.iter().map(|&(_, pid)| pid).collect();
            for pid in held {
                shard.requeue(pid, now, now);
                out.push(pid);
            }
        }
        out.sort_unstable();
        out
    }

    fn shard(&self, pid: u64) -> MutexGuard<'_, Shard> {
        lock(&self.shards[self.layout.shard_of(pid) as usize])
    }

    fn now(&self) -> u64 {
        self.clock.now_ms()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave a half-applied change behind (every
    // operation validates before it mutates), so a poisoned lock is still usable.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
