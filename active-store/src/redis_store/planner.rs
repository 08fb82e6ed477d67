//! Plans on Redis: uniform plans registered with per-shard cursors, explicit ranges
//! materialised at once, adoption of an exported registry.

use super::*;

#[async_trait]
impl<C> Planner for RedisActiveStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn plan(&self, plan: &Plan) -> Result<PlanOutcome> {
        let request = plans::validate(plan)?;
        let args: Vec<String> = match &request {
            Request::Uniform {
                min,
                max,
                size,
                count,
            } => {
                vec![
                    "u".into(),
                    min.to_string(),
                    max.to_string(),
                    size.to_string(),
                    count.to_string(),
                ]
            }
            Request::Ranges(ranges) => std::iter::once("r".to_owned())
                .chain(ranges.iter().flat_map(|&(min, max)| {
                    [
                        min.to_string(),
                        max.to_string(),
                        (max - min + 1).to_string(),
                    ]
                }))
                .collect(),
        };
        // The pids this plan would take, from the registry as it stands: none may need
        // a completed-index bit past a Redis bitmap. Checked before anything is written.
        let probe = self.refresh_registry().await?.add(&request)?;
        if probe.created {
            plans::check_bits(self.layout.schema(), &probe.entries)?;
        }
        // Step 1, atomic on the registry's slot: validate and record. A rejected plan
        // stops here with nothing written.
        let reply: Vec<String> = match self.invoke(&PLAN, &[&self.registry_key], &args).await {
            Err(Error::Redis(err)) => return Err(plan_error(err)),
            other => other?,
        };
        let created = reply.first().map(String::as_str) == Some("1");
        let mut entries = Vec::new();
        for f in reply[1..].chunks_exact(5) {
            let n: Vec<u64> = f
                .iter()
                .map(|s| parse_u64(s, "plan reply"))
                .collect::<Result<_>>()?;
            let plan = tranche_codec::PlanGeometry::new(n[0], n[2], n[3], n[4])
                .map_err(|err| Error::InvalidPlan(err.to_string()))?;
            entries.push(PlanEntry {
                plan,
                explicit: matches!(request, Request::Ranges(_)),
            });
        }
        // Step 2, per shard: make the plan claimable. Idempotent, so a crash between the
        // steps is repaired by planning again (which is then a no-op in step 1).
        let now = self.now().to_string();
        for entry in &entries {
            let p = &entry.plan;
            if entry.explicit {
                let pid = p.first_pid();
                let keys = self.keys_of(pid);
                let args = [
                    now.clone(),
                    pid.to_string(),
                    p.min().to_string(),
                    p.max().to_string(),
                    self.bit(pid).to_string(),
                ];
                let _: i64 = self
                    .invoke(
                        &PLAN_RANGES,
                        &[&keys.active, &keys.pending, &keys.index, &keys.counts],
                        &args,
                    )
                    .await?;
            } else {
                let arg = [format!("{}|{}", p.first_pid(), p.last_pid())];
                for keys in self.keys.iter() {
                    let _: i64 = self.invoke(&PLAN_CURSOR, &[&keys.plans], &arg).await?;
                }
            }
        }
        self.refresh_registry().await?;
        self.empty.wake_all();
        Ok(PlanOutcome { entries, created })
    }

    async fn plans(&self) -> Result<Vec<PlanEntry>> {
        Ok(self.refresh_registry().await?.entries().to_vec())
    }

    async fn adopt(&self, entries: &[PlanEntry], completed: &[u64]) -> Result<u64> {
        let pending = plans::validate_adoption(entries, completed)?;
        if !self.refresh_registry().await?.entries().is_empty() {
            return Err(Error::InvalidPlan(
                "plans are adopted only into a namespace without any".into(),
            ));
        }
        // Completed first: registering an explicit range then skips its completed pid
        // (`plan_ranges` leaves completed pids alone). One BITFIELD per shard and chunk.
        let mut bits = vec![Vec::new(); self.keys.len()];
        for &pid in completed {
            bits[self.layout.shard_of(pid) as usize].push(self.bit(pid));
        }
        for (keys, bits) in self.keys.iter().zip(&bits) {
            for chunk in bits.chunks(MAX_SCRIPT_BATCH) {
                let mut cmd = redis::cmd("BITFIELD");
                cmd.arg(&keys.index);
                for bit in chunk {
                    cmd.arg("SET").arg("u1").arg(bit).arg(1);
                }
                let cmd = &cmd;
                retry(&self.conn, |mut conn| async move {
                    cmd.query_async::<redis::Value>(&mut conn).await
                })
                .await?;
            }
        }
        let now = self.now().to_string();
        let mut done = completed.iter().copied().peekable();
        for entry in entries {
            let outcome = self.plan(&Plan::from(entry)).await?;
            if outcome.entries != [*entry] {
                return Err(Error::Corrupt {
                    key: self.registry_key.clone(),
                    detail: format!("{entry:?} registered as {:?}", outcome.entries),
                });
            }
            if entry.explicit {
                continue;
            }
            // Every pid issued at once: each shard's cursor past the plan, the pids not
            // completed materialised as pending (ready now) in chunks.
            let (first, last) = (entry.plan.first_pid(), entry.plan.last_pid());
            for keys in self.keys.iter() {
                let key = keys.cursor.as_str();
                retry(&self.conn, |mut conn| async move {
                    conn.hset::<_, _, _, ()>(key, first, last + 1).await
                })
                .await?;
            }
            let mut args: Vec<Vec<String>> = vec![vec![now.clone()]; self.keys.len()];
            for pid in first..=last {
                while done.next_if(|&d| d < pid).is_some() {}
                if done.next_if_eq(&pid).is_some() {
                    continue;
                }
                let Some(ids) = entry.plan.range_of(pid) else {
                    continue;
                };
                let shard = self.layout.shard_of(pid) as usize;
                args[shard].extend([
                    pid.to_string(),
                    ids.start().to_string(),
                    ids.end().to_string(),
                    self.bit(pid).to_string(),
                ]);
                if args[shard].len() > 4 * MAX_SCRIPT_BATCH {
                    self.materialise(shard, &mut args[shard], &now).await?;
                }
            }
            for (shard, args) in args.iter_mut().enumerate() {
                if args.len() > 1 {
                    self.materialise(shard, args, &now).await?;
                }
            }
        }
        self.empty.wake_all();
        Ok(pending)
    }
}
