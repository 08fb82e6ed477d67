//! Plans: the registry, uniform plans issued lazily from per-shard cursors, explicit
//! ranges materialised at once.

use super::*;

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
                    // The plan may be there in pieces: a discard of a pid not issued
                    // yet splits its cursor around it.
                    if !shard.cursors.iter().any(|c| first <= c.0 && c.1 <= last) {
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
