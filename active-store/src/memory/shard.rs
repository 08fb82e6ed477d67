//! One shard's state and the operations on it, each under the shard's mutex: the
//! counterpart of the per-shard Lua scripts.

use super::*;

impl Shard {
    pub(super) fn state(&self) -> ShardState {
        let mut partitions: Vec<Partition> = self.active.values().cloned().collect();
        partitions.sort_unstable_by_key(|p| p.pid);
        // Pieces are not saved: a split partition is saved whole, from its lowest
        // unfinished ID, so a restored store redoes its pieces' finished chunks (at least
        // once) and never loses an ID to a piece nobody holds. Its owner's lease is kept
        // (a restore expires it and counts the attempt, as for any lease); a partition
        // whose owner part is done, leased no more, is saved pending.
        let mut pending: Vec<(u64, u64)> = self.pending.iter().copied().collect();
        for p in &mut partitions {
            let Some(entry) = self.splits.entries.get(&p.pid) else {
                continue;
            };
            let from = self
                .splits
                .lowest_unfinished(p.pid, p.progress)
                .unwrap_or(p.progress);
            (p.min_id, p.max_id, p.progress) = (entry.min_id, entry.max_id, from);
            if p.status.is_leased() && p.lease_token.is_none() {
                p.status = Status::Pending;
                p.lease_token = None;
                p.deadline_ms = None;
                pending.push((p.updated_at_ms, p.pid));
            }
        }
        pending.sort_unstable();
        let mut completed: Vec<u64> = self.completed.iter().copied().collect();
        completed.sort_unstable();
        ShardState {
            partitions,
            pending,
            cursors: self.cursors.clone(),
            completed: runs(&completed),
            token: self.token,
        }
    }

    /// Shard `no` from its saved state, checked against the invariants every
    /// operation keeps; no completed pid lies past `planned_last`, the last planned.
    pub(super) fn restore(
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
    pub(super) fn lease(
        &mut self,
        mut p: Partition,
        worker: &str,
        now: u64,
        deadline: u64,
    ) -> Lease {
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

    pub(super) fn leased(&mut self, lease: &Lease) -> Option<&mut Partition> {
        self.active
            .get_mut(&lease.pid)
            .filter(|p| p.status.is_leased() && p.lease_token == Some(lease.token))
    }

    /// Moves a leased partition out of the lease index, to pending at `ready`.
    /// Returns an expired (or released inactive worker's) lease to pending, or fails
    /// it when it expired on its last attempt: a partition that crashes its worker every
    /// time must not be retried for ever. Whether it went back to pending.
    pub(super) fn expire(&mut self, pid: u64, now: u64, max_attempts: u32) -> bool {
        let Some(p) = self.active.get_mut(&pid) else {
            return false;
        };
        if p.attempts < max_attempts {
            self.requeue(pid, now, now);
            return true;
        }
        let why = format!(
            "lease expired on attempt {} of {max_attempts} (the worker died or stalled)",
            p.attempts
        );
        // A split partition is whole again, its pieces cancelled (`lua/reap.lua`).
        if self.splits.entries.contains_key(&pid) {
            self.fail_split(pid, &why, now);
            return false;
        }
        if let Some(deadline) = p.deadline_ms.take() {
            self.leases.remove(&(deadline, pid));
        }
        p.status = Status::Failed;
        p.updated_at_ms = now;
        p.last_error = Some(why);
        false
    }

    pub(super) fn requeue(&mut self, pid: u64, ready: u64, now: u64) {
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
