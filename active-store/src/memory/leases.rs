//! The lease lifecycle in memory: claims, heartbeats, completions, failures and
//! releases.

use super::*;
use crate::model::FailPolicy;

#[async_trait]
impl Leases for MemoryActiveStore {
    async fn claim(&self, worker: &str, n: usize) -> Result<Vec<Lease>> {
        plans::check_worker(worker)?;
        let now = self.now();
        let deadline = now + self.config.lease.as_millis() as u64;
        // Lock order everywhere: registry, then shards.
        let registry = lock(&self.registry);
        let mut out = Vec::with_capacity(n);
        for shard_no in self.layout.claim_order(worker, now) {
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
        // A checkpoint never moves backwards (as in `lua/heartbeat.lua`): an older one,
        // from a beat reordered or retried, keeps the newer.
        p.progress = p.progress.max(progress);
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
            let Some(p) = shard.leased(lease) else {
                out.push(Err(lost(lease)));
                continue;
            };
            // Cut short by a cut the store no longer holds (`lua/complete.lua`, `short`):
            // nothing else holds the IDs past the lease's end, so the partition is pending
            // again from there, its attempt given back, rather than completed.
            if lease.max_id < p.max_id {
                p.progress = p.progress.max(lease.max_id + 1);
                p.attempts = p.attempts.saturating_sub(1);
                shard.requeue(lease.pid, now, now);
                out.push(Ok(Completion::PartDone));
                continue;
            }
            // A split partition (`split`): with pieces outstanding the owner part only
            // ends its lease, and the partition stays running until its last piece;
            // with none, its record spans the whole partition.
            let mut record = lease.completed(now, *duration_ms);
            if let Some(entry) = shard.splits.entries.get_mut(&lease.pid) {
                if entry.outstanding > 0 {
                    entry.owner_done = true;
                    entry.request = None;
                    let p = shard.active.get_mut(&lease.pid).expect("checked above");
                    p.lease_token = None;
                    let deadline = p.deadline_ms.take();
                    if let Some(deadline) = deadline {
                        shard.leases.remove(&(deadline, lease.pid));
                    }
                    out.push(Ok(Completion::PartDone));
                    continue;
                }
                record = entry.record(lease.pid, now);
                shard.splits.entries.remove(&lease.pid);
            }
            let p = shard.active.remove(&lease.pid).expect("checked above");
            if let Some(deadline) = p.deadline_ms {
                shard.leases.remove(&(deadline, lease.pid));
            }
            shard.completed.insert(lease.pid);
            // The receiver lives in `self`, so the channel cannot be disconnected.
            let _ = self.inbox[shard_no].0.send(record);
            out.push(Ok(Completion::Completed));
        }
        Ok(out)
    }

    async fn fail(&self, lease: &Lease, error: &str) -> Result<FailOutcome> {
        self.fail_with(lease, error, FailPolicy::default()).await
    }

    async fn fail_with(
        &self,
        lease: &Lease,
        error: &str,
        policy: FailPolicy,
    ) -> Result<FailOutcome> {
        let now = self.now();
        let mut shard = self.shard(lease.pid);
        let p = shard.leased(lease).ok_or_else(|| lost(lease))?;
        p.last_error = Some(error.to_owned());
        let attempts = p.attempts;
        if attempts >= self.config.max_attempts || policy.permanent {
            // A split partition is whole again, its pieces cancelled (`lua/fail.lua`).
            if shard.splits.entries.contains_key(&lease.pid) {
                shard.fail_split(lease.pid, error, now);
                return Ok(FailOutcome::Failed);
            }
            let p = shard.leased(lease).expect("checked above");
            p.status = Status::Failed;
            p.updated_at_ms = now;
            if let Some(deadline) = p.deadline_ms.take() {
                shard.leases.remove(&(deadline, lease.pid));
            }
            return Ok(FailOutcome::Failed);
        }
        let delay = policy
            .retry_after
            .unwrap_or_else(|| self.config.backoff(attempts));
        let ready_at_ms = now.saturating_add(delay.as_millis().min(u64::MAX as u128) as u64);
        shard.requeue(lease.pid, ready_at_ms, now);
        Ok(FailOutcome::Retry { ready_at_ms })
    }

    async fn release(&self, lease: &Lease, progress: u64) -> Result<()> {
        let now = self.now();
        let mut shard = self.shard(lease.pid);
        let p = shard.leased(lease).ok_or_else(|| lost(lease))?;
        p.progress = p.progress.max(progress);
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
