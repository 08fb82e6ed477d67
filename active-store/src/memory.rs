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
use crate::state::{ACTIVE_STATE_VERSION, ActiveState, RestoredLeases, ShardState, runs};
use crate::store::{ActiveQuery, Leases, Maintenance, Planner, WorkerRegistry};
use crate::{Error, Result};

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
        if state.version != ACTIVE_STATE_VERSION {
            return Err(corrupt(format!(
                "version {} (this build reads version {ACTIVE_STATE_VERSION})",
                state.version
            )));
        }
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

impl Shard {
    fn state(&self) -> ShardState {
        let mut partitions: Vec<Partition> = self.active.values().cloned().collect();
        partitions.sort_unstable_by_key(|p| p.pid);
        let mut completed: Vec<u64> = self.completed.iter().copied().collect();
        completed.sort_unstable();
        ShardState {
            partitions,
            pending: self.pending.iter().copied().collect(),
            cursors: self.cursors.clone(),
            completed: runs(&completed),
            token: self.token,
        }
    }

    /// Shard `no` from its saved state, checked against the invariants every
    /// operation keeps; no completed pid lies past `planned_last`, the last planned.
    fn restore(
        layout: &Layout,
        no: u32,
        planned_last: u64,
        saved: ShardState,
    ) -> Result<Self, String> {
        let mut shard = Shard {
            cursors: saved.cursors,
            token: saved.token,
            ..Shard::default()
        };
        let mut prev: Option<u64> = None;
        for (first, last) in saved.completed {
            if first > last || prev.is_some_and(|p| p >= first) {
                return Err(format!(
                    "shard {no}: completed runs out of order at {first}"
                ));
            }
            if last > planned_last {
                return Err(format!("shard {no}: completed pid {last} is in no plan"));
            }
            prev = Some(last);
            for pid in first..=last {
                if layout.shard_of(pid) != no {
                    return Err(format!("shard {no}: completed pid {pid} is not its own"));
                }
                shard.completed.insert(pid);
            }
        }
        for p in saved.partitions {
            let pid = p.pid;
            if layout.shard_of(pid) != no {
                return Err(format!("shard {no}: partition {pid} is not its own"));
            }
            if shard.completed.contains(&pid) {
                return Err(format!("partition {pid} is both active and completed"));
            }
            let leased = p.status.is_leased();
            match (leased, p.deadline_ms, p.lease_token) {
                (true, Some(deadline), Some(token)) if token <= shard.token => {
                    shard.leases.insert((deadline, pid));
                }
                (false, None, _) if p.status != Status::Completed => {}
                _ => return Err(format!("partition {pid}: inconsistent lease fields")),
            }
            if shard.active.insert(pid, p).is_some() {
                return Err(format!("partition {pid} saved twice"));
            }
        }
        for (ready, pid) in saved.pending {
            if shard.active.get(&pid).map(|p| p.status) != Some(Status::Pending) {
                return Err(format!("pending entry {pid} is not a pending partition"));
            }
            shard.pending.insert((ready, pid));
        }
        let pending = shard
            .active
            .values()
            .filter(|p| p.status == Status::Pending)
            .count();
        if pending != shard.pending.len() {
            return Err(format!(
                "shard {no}: {pending} pending partitions but {} pending entries",
                shard.pending.len()
            ));
        }
        if let Some(&(first, last, _)) = shard.cursors.iter().find(|c| c.0 > c.1 || c.2 < c.0) {
            return Err(format!("shard {no}: bad cursor over {first}..={last}"));
        }
        Ok(shard)
    }

    /// Leases `p` to `worker` with a fresh token (as `lua/claim.lua` does).
    fn lease(&mut self, mut p: Partition, worker: &str, now: u64, deadline: u64) -> Lease {
        self.token += 1;
        p.status = Status::Claimed;
        p.attempts += 1;
        p.lease_token = Some(self.token);
        p.deadline_ms = Some(deadline);
        p.claimed_at_ms = Some(now);
        p.updated_at_ms = now;
        p.worker = Some(worker.to_owned());
        self.leases.insert((deadline, p.pid));
        let lease = Lease {
            pid: p.pid,
            token: self.token,
            worker: worker.to_owned(),
            min_id: p.min_id,
            max_id: p.max_id,
            attempt: p.attempts,
            progress: p.progress,
            deadline_ms: deadline,
        };
        self.active.insert(p.pid, p);
        lease
    }

    fn leased(&mut self, lease: &Lease) -> Option<&mut Partition> {
        self.active
            .get_mut(&lease.pid)
            .filter(|p| p.status.is_leased() && p.lease_token == Some(lease.token))
    }

    /// Moves a leased partition out of the lease index, to pending at `ready`.
    /// Returns an expired (or released inactive worker's) lease to pending, or fails
    /// it when it expired on its last attempt: a partition that crashes its worker every
    /// time must not be retried for ever. Whether it went back to pending.
    fn expire(&mut self, pid: u64, now: u64, max_attempts: u32) -> bool {
        let Some(p) = self.active.get_mut(&pid) else {
            return false;
        };
        if p.attempts < max_attempts {
            self.requeue(pid, now, now);
            return true;
        }
        if let Some(deadline) = p.deadline_ms.take() {
            self.leases.remove(&(deadline, pid));
        }
        p.status = Status::Failed;
        p.updated_at_ms = now;
        p.last_error = Some(format!(
            "lease expired on attempt {} of {max_attempts} (the worker died or stalled)",
            p.attempts
        ));
        false
    }

    fn requeue(&mut self, pid: u64, ready: u64, now: u64) {
        if let Some(p) = self.active.get_mut(&pid) {
            if let Some(deadline) = p.deadline_ms.take() {
                self.leases.remove(&(deadline, pid));
            }
            p.status = Status::Pending;
            p.updated_at_ms = now;
            self.pending.insert((ready, pid));
        }
    }
}

#[async_trait]
impl Planner for MemoryActiveStore {
    async fn plan(&self, plan: &Plan) -> Result<PlanOutcome> {
        let request = plans::validate(plan)?;
        let now = self.now();
        let mut registry = lock(&self.registry);
        let probe = registry.clone().add(&request)?;
        if probe.created {
            plans::check_bits(self.layout.schema(), &probe.entries)?;
        }
        let outcome = registry.add(&request)?;
        for entry in &outcome.entries {
            if entry.explicit {
                let pid = entry.plan.first_pid();
                let mut shard = self.shard(pid);
                if !shard.completed.contains(&pid) && !shard.active.contains_key(&pid) {
                    let p = Partition::pending(pid, entry.plan.min(), entry.plan.max(), now);
                    shard.active.insert(pid, p);
                    shard.pending.insert((now, pid));
                }
            } else {
                for shard in &self.shards {
                    let mut shard = lock(shard);
                    let (first, last) = (entry.plan.first_pid(), entry.plan.last_pid());
                    if !shard.cursors.iter().any(|c| (c.0, c.1) == (first, last)) {
                        shard.cursors.push((first, last, first));
                    }
                }
            }
        }
        Ok(outcome)
    }

    async fn plans(&self) -> Result<Vec<PlanEntry>> {
        Ok(lock(&self.registry).entries().to_vec())
    }

    async fn adopt(&self, entries: &[PlanEntry], completed: &[u64]) -> Result<u64> {
        let pending = plans::validate_adoption(entries, completed)?;
        if !lock(&self.registry).entries().is_empty() {
            return Err(Error::InvalidPlan(
                "plans are adopted only into a namespace without any".into(),
            ));
        }
        // Completed first: registering an explicit range then skips its completed pid.
        for &pid in completed {
            self.shard(pid).completed.insert(pid);
        }
        let now = self.now();
        for entry in entries {
            let outcome = self.plan(&Plan::from(entry)).await?;
            if outcome.entries != [*entry] {
                return Err(Error::Corrupt {
                    key: "plans".into(),
                    detail: format!("{entry:?} registered as {:?}", outcome.entries),
                });
            }
            if entry.explicit {
                continue;
            }
            // Every pid issued at once: the completed ones stay in the index, the others
            // are pending.
            let (first, last) = (entry.plan.first_pid(), entry.plan.last_pid());
            for shard in &self.shards {
                for c in lock(shard).cursors.iter_mut().filter(|c| c.0 == first) {
                    c.2 = last + 1;
                }
            }
            for pid in first..=last {
                let mut shard = self.shard(pid);
                if !shard.completed.contains(&pid)
                    && let Some(ids) = entry.plan.range_of(pid)
                {
                    let p = Partition::pending(pid, *ids.start(), *ids.end(), now);
                    shard.active.insert(pid, p);
                    shard.pending.insert((now, pid));
                }
            }
        }
        Ok(pending)
    }
}

#[async_trait]
impl Leases for MemoryActiveStore {
    async fn claim(&self, worker: &str, n: usize) -> Result<Vec<Lease>> {
        plans::check_worker(worker)?;
        let now = self.now();
        let deadline = now + self.config.lease.as_millis() as u64;
        // Lock order everywhere: registry, then shards.
        let registry = lock(&self.registry);
        let mut out = Vec::with_capacity(n);
        for shard_no in self.layout.claim_order(worker) {
            if out.len() >= n {
                break;
            }
            let mut guard = lock(&self.shards[shard_no as usize]);
            let shard = &mut *guard;
            // Ready retries first.
            let ready: Vec<(u64, u64)> = shard
                .pending
                .range(..=(now, u64::MAX))
                .take(n - out.len())
                .copied()
                .collect();
            for key in ready {
                shard.pending.remove(&key);
                if let Some(p) = shard.active.remove(&key.1) {
                    out.push(shard.lease(p, worker, now, deadline));
                }
            }
            // Then fresh pids from the cursors.
            for c in 0..shard.cursors.len() {
                let (_, last, mut at) = shard.cursors[c];
                at = self.layout.align(at, shard_no);
                while out.len() < n && at <= last {
                    let (min, max) = registry.range_of(at).ok_or_else(|| Error::Corrupt {
                        key: "plans".into(),
                        detail: format!("pid {at} is in a cursor but in no plan"),
                    })?;
                    out.push(shard.lease(
                        Partition::pending(at, min, max, now),
                        worker,
                        now,
                        deadline,
                    ));
                    at = self.layout.align(at + 1, shard_no);
                }
                shard.cursors[c].2 = at;
            }
        }
        Ok(out)
    }

    async fn heartbeat(&self, lease: &Lease, progress: u64) -> Result<()> {
        let now = self.now();
        let deadline = now + self.config.lease.as_millis() as u64;
        let mut shard = self.shard(lease.pid);
        let p = shard.leased(lease).ok_or_else(|| lost(lease))?;
        let old = p.deadline_ms.replace(deadline);
        p.status = Status::Running;
        p.progress = progress;
        p.updated_at_ms = now;
        if let Some(old) = old {
            shard.leases.remove(&(old, lease.pid));
        }
        shard.leases.insert((deadline, lease.pid));
        Ok(())
    }

    async fn complete_many(&self, done: &[(Lease, u64)]) -> Result<Vec<Result<Completion>>> {
        let now = self.now();
        let mut out = Vec::with_capacity(done.len());
        for (lease, duration_ms) in done {
            let shard_no = self.layout.shard_of(lease.pid) as usize;
            let mut shard = lock(&self.shards[shard_no]);
            if shard.completed.contains(&lease.pid) {
                out.push(Ok(Completion::Duplicate));
                continue;
            }
            if shard.leased(lease).is_none() {
                out.push(Err(lost(lease)));
                continue;
            }
            let p = shard.active.remove(&lease.pid).expect("checked above");
            if let Some(deadline) = p.deadline_ms {
                shard.leases.remove(&(deadline, lease.pid));
            }
            shard.completed.insert(lease.pid);
            // The receiver lives in `self`, so the channel cannot be disconnected.
            let _ = self.inbox[shard_no]
                .0
                .send(lease.completed(now, *duration_ms));
            out.push(Ok(Completion::Completed));
        }
        Ok(out)
    }

    async fn fail(&self, lease: &Lease, error: &str) -> Result<FailOutcome> {
        let now = self.now();
        let mut shard = self.shard(lease.pid);
        let p = shard.leased(lease).ok_or_else(|| lost(lease))?;
        p.last_error = Some(error.to_owned());
        let attempts = p.attempts;
        if attempts >= self.config.max_attempts {
            p.status = Status::Failed;
            p.updated_at_ms = now;
            if let Some(deadline) = p.deadline_ms.take() {
                shard.leases.remove(&(deadline, lease.pid));
            }
            return Ok(FailOutcome::Failed);
        }
        let ready_at_ms = now + self.config.backoff(attempts).as_millis() as u64;
        shard.requeue(lease.pid, ready_at_ms, now);
        Ok(FailOutcome::Retry { ready_at_ms })
    }

    async fn release(&self, lease: &Lease, progress: u64) -> Result<()> {
        let now = self.now();
        let mut shard = self.shard(lease.pid);
        let p = shard.leased(lease).ok_or_else(|| lost(lease))?;
        p.progress = progress;
        // A graceful release gives the attempt back (as `lua/release.lua` does); a
        // reaped lease keeps it.
        p.attempts = p.attempts.saturating_sub(1);
        shard.requeue(lease.pid, now, now);
        Ok(())
    }
}

fn lost(lease: &Lease) -> Error {
    Error::LeaseLost {
        pid: lease.pid,
        token: lease.token,
    }
}

#[async_trait]
impl Maintenance for MemoryActiveStore {
    async fn reap(&self, now_ms: u64) -> Result<Vec<u64>> {
        let mut out = Vec::new();
        for shard in &self.shards {
            let mut shard = lock(shard);
            let expired: Vec<u64> = shard
                .leases
                .range(..=(now_ms, u64::MAX))
                .map(|&(_, pid)| pid)
                .collect();
            for pid in expired {
                if shard.expire(pid, now_ms, self.config.max_attempts) {
                    out.push(pid);
                }
            }
        }
        Ok(out)
    }

    async fn release_worker(&self, worker: &str) -> Result<Vec<u64>> {
        let now = self.now();
        let mut out = Vec::new();
        for shard in &self.shards {
            let mut shard = lock(shard);
            let held: Vec<u64> = shard
                .leases
                .iter()
                .map(|&(_, pid)| pid)
                .filter(|pid| shard.active[pid].worker.as_deref() == Some(worker))
                .collect();
            for pid in held {
                if shard.expire(pid, now, self.config.max_attempts) {
                    out.push(pid);
                }
            }
        }
        Ok(out)
    }

    async fn retry_failed(&self, pid: Option<u64>) -> Result<Vec<u64>> {
        let now = self.now();
        let mut out = Vec::new();
        for shard in &self.shards {
            let mut shard = lock(shard);
            let failed: Vec<u64> = shard
                .active
                .values()
                .filter(|p| p.status == Status::Failed && pid.is_none_or(|only| only == p.pid))
                .map(|p| p.pid)
                .collect();
            for pid in failed {
                let p = shard.active.get_mut(&pid).expect("listed above");
                p.attempts = 0;
                p.status = Status::Pending;
                p.updated_at_ms = now;
                shard.pending.insert((now, pid));
                out.push(pid);
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    async fn discard(&self, pid: u64) -> Result<bool> {
        let mut shard = self.shard(pid);
        match shard.active.get(&pid).map(|p| p.status) {
            None => Ok(false),
            Some(status) if status.is_leased() => Err(Error::Leased(pid)),
            Some(Status::Discarded) => Ok(false),
            Some(_) => {
                let now = self.now();
                // The record stays, marked: the pid answers "discarded" for ever.
                let p = shard.active.get_mut(&pid).expect("present");
                p.status = Status::Discarded;
                p.deadline_ms = None;
                p.updated_at_ms = now;
                shard.pending.retain(|&(_, p)| p != pid);
                Ok(true)
            }
        }
    }

    async fn set_paused(&self, paused: bool) -> Result<()> {
        self.paused
            .store(paused, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    async fn is_paused(&self) -> Result<bool> {
        Ok(self.paused.load(std::sync::atomic::Ordering::Relaxed))
    }
}

#[async_trait]
impl WorkerRegistry for MemoryActiveStore {
    async fn worker_heartbeat(&self, mut info: WorkerInfo) -> Result<()> {
        plans::check_worker(&info.id)?;
        info.last_beat_ms = self.now();
        self.workers.insert(info.id.clone(), info);
        Ok(())
    }

    async fn workers(&self) -> Result<Vec<WorkerState>> {
        let now = self.now();
        let mut out: Vec<WorkerState> = self
            .workers
            .iter()
            .map(|w| WorkerState {
                active: self.config.worker_active(w.last_beat_ms, now),
                info: w.value().clone(),
            })
            .collect();
        out.sort_by(|a, b| a.info.id.cmp(&b.info.id));
        Ok(out)
    }

    async fn deregister(&self, worker: &str) -> Result<()> {
        self.workers.remove(worker);
        Ok(())
    }

    async fn prune_workers(&self, retention: std::time::Duration) -> Result<Vec<String>> {
        let cutoff = self.now().saturating_sub(retention.as_millis() as u64);
        let mut gone: Vec<String> = Vec::new();
        self.workers.retain(|id, w| {
            let keep = w.last_beat_ms >= cutoff;
            if !keep {
                gone.push(id.clone());
            }
            keep
        });
        gone.sort();
        Ok(gone)
    }
}

#[async_trait]
impl ActiveQuery for MemoryActiveStore {
    async fn get(&self, pid: u64) -> Result<Option<Partition>> {
        let shard_no = self.layout.shard_of(pid);
        let shard = self.shard(pid);
        if let Some(p) = shard.active.get(&pid) {
            return Ok(Some(p.clone()));
        }
        let unissued = shard
            .cursors
            .iter()
            .any(|&(_, last, at)| pid <= last && self.layout.align(at, shard_no) <= pid);
        drop(shard);
        if unissued {
            let registry = lock(&self.registry);
            if let Some((min, max)) = registry.range_of(pid) {
                return Ok(Some(Partition::pending(pid, min, max, 0)));
            }
        }
        Ok(None)
    }

    async fn all_active(&self) -> Result<ActiveSnapshot> {
        let mut snapshot = ActiveSnapshot::default();
        for (shard_no, shard) in self.shards.iter().enumerate() {
            let shard = lock(shard);
            snapshot.partitions.extend(shard.active.values().cloned());
            for &(_, last, at) in &shard.cursors {
                let at = self.layout.align(at, shard_no as u32);
                let count = self.layout.count_in_shard(at, last, shard_no as u32);
                if count > 0 {
                    snapshot.unissued.push(Unissued {
                        shard: shard_no as u32,
                        next_pid: at,
                        last_pid: last,
                        count,
                    });
                }
            }
        }
        snapshot.partitions.sort_by_key(|p| p.pid);
        Ok(snapshot)
    }

    async fn counts(&self) -> Result<StatusCounts> {
        // Counted in place under each shard's lock, nothing cloned: a few microseconds
        // per thousand partitions.
        let mut counts = StatusCounts::default();
        for (shard_no, shard) in self.shards.iter().enumerate() {
            let shard = lock(shard);
            for p in shard.active.values() {
                counts.add(p.status);
            }
            for &(_, last, at) in &shard.cursors {
                let at = self.layout.align(at, shard_no as u32);
                counts.unissued += self.layout.count_in_shard(at, last, shard_no as u32);
            }
        }
        Ok(counts)
    }
}
