//! Maintenance (the reaper, retries, discards, pause) and the worker registry.

use super::*;

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
            // Expired pieces go back to pending too (not listed, as on Redis).
            shard.expire_pieces(now_ms, self.config.max_attempts, None);
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
            out.extend(shard.expire_pieces(now, self.config.max_attempts, Some(worker)));
        }
        out.sort_unstable();
        out.dedup();
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
        let shard_no = self.layout.shard_of(pid);
        // Lock order everywhere: registry, then shards.
        let registry = lock(&self.registry);
        let mut shard = lock(&self.shards[shard_no as usize]);
        let now = self.now();
        match shard.active.get(&pid).map(|p| p.status) {
            None => {}
            Some(status) if status.is_leased() => return Err(Error::Leased(pid)),
            Some(Status::Discarded) => return Ok(false),
            Some(_) => {
                // A split partition is discarded whole, its pieces cancelled
                // (`lua/discard.lua`).
                shard.unsplit(pid);
                // The record stays, marked: the pid answers "discarded" for ever.
                let p = shard.active.get_mut(&pid).expect("present");
                p.status = Status::Discarded;
                p.deadline_ms = None;
                p.updated_at_ms = now;
                shard.pending.retain(|&(_, p)| p != pid);
                return Ok(true);
            }
        }
        // Not materialised: pending if a cursor has yet to issue it. Its cursor is split
        // around it (as `lua/discard.lua` splits the plan entry), so it is never issued.
        let Some(c) = shard
            .cursors
            .iter()
            .position(|&(first, last, at)| first <= pid && pid <= last && at <= pid)
        else {
            return Ok(false);
        };
        let Some((min, max)) = registry.range_of(pid) else {
            return Ok(false);
        };
        let (first, last, at) = shard.cursors[c];
        shard.cursors[c] = if pid > first {
            (first, pid - 1, at)
        } else {
            (first, first, first + 1)
        };
        if pid < last {
            shard.cursors.insert(c + 1, (pid + 1, last, pid + 1));
        }
        let mut p = Partition::pending(pid, min, max, now);
        p.status = Status::Discarded;
        shard.active.insert(pid, p);
        Ok(true)
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
