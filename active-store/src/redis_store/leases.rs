//! The lease lifecycle on Redis: batched claims (passing empty shards by), batched
//! heartbeats, the group commit of completions with its dirty marks, failures and
//! releases. One script call per shard involved, all shards' calls sent together.

use super::*;
use crate::model::FailPolicy;

impl<C> RedisActiveStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// The sender of the group-commit task, starting the task on first use. The task
    /// ends when the store is dropped (the channel closes) after its last batch.
    fn committer(&self) -> &mpsc::UnboundedSender<Waiting> {
        self.committer.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(self.detached().commit_loop(rx));
            tx
        })
    }

    async fn commit_loop(self, mut rx: mpsc::UnboundedReceiver<Waiting>) {
        let this = Arc::new(self);
        let mut in_flight = JoinSet::new();
        while let Some(first) = rx.recv().await {
            while in_flight.len() >= MAX_IN_FLIGHT {
                in_flight.join_next().await;
            }
            let mut batch = vec![first];
            while batch.len() < MAX_GROUP {
                match rx.try_recv() {
                    Ok(next) => batch.push(next),
                    Err(_) => break,
                }
            }
            let this = this.clone();
            in_flight.spawn(async move {
                let (done, replies): (Vec<(Lease, u64)>, Vec<_>) = batch
                    .into_iter()
                    .map(|(lease, ms, reply)| ((lease, ms), reply))
                    .unzip();
                match this.complete_now(&done).await {
                    Ok(outcomes) => {
                        for (reply, outcome) in replies.into_iter().zip(outcomes) {
                            let _ = reply.send(outcome);
                        }
                    }
                    Err(err) => {
                        let err = Arc::new(err);
                        for reply in replies {
                            let _ = reply.send(Err(Error::Shared(err.clone())));
                        }
                    }
                }
            });
        }
        while in_flight.join_next().await.is_some() {}
    }

    /// Turns a claim reply (`claim.lua`: the reclaimed leases in full, then each run of
    /// fresh pids as its token, first pid and count) into leases.
    async fn leases_from(
        &self,
        worker: &str,
        deadline: u64,
        reply: Vec<String>,
    ) -> Result<Vec<Lease>> {
        let malformed = |detail: &str| Error::Corrupt {
            key: "claim reply".into(),
            detail: detail.into(),
        };
        let (count, rest) = reply.split_first().ok_or_else(|| malformed("empty"))?;
        let reclaimed = parse_u64(count, "claim reply count")? as usize;
        let full = reclaimed
            .checked_mul(6)
            .filter(|&n| n <= rest.len() && (rest.len() - n) % 3 == 0)
            .ok_or_else(|| malformed("not the values its count says"))?;
        let (full, fresh) = rest.split_at(full);
        let mut out = Vec::with_capacity(reclaimed + fresh.len());
        for f in full.chunks_exact(6) {
            let pid = parse_u64(&f[0], "claim reply pid")?;
            let (min_id, max_id) = if f[3].is_empty() {
                self.range_of(pid).await?
            } else {
                (parse_u64(&f[3], "min")?, parse_u64(&f[4], "max")?)
            };
            // Read back from Redis, so checked like input: a range that runs backwards
            // would have a worker process ids it was never given.
            if min_id > max_id {
                return Err(Error::Corrupt {
                    key: format!("{} field {pid}", self.keys_of(pid).active),
                    detail: format!("range {min_id}..={max_id} runs backwards"),
                });
            }
            out.push(Lease {
                pid,
                token: parse_u64(&f[1], "token")?,
                worker: worker.to_owned(),
                min_id,
                max_id,
                attempt: parse_u64(&f[2], "attempts")? as u32,
                progress: if f[5].is_empty() {
                    min_id
                } else {
                    parse_u64(&f[5], "progress")?
                },
                deadline_ms: deadline,
            });
        }
        // Fresh leases: each run's pids under its token, attempt 1, the plan's range,
        // no checkpoint.
        for run in fresh.chunks_exact(3) {
            let token = parse_u64(&run[0], "claim reply token")?;
            let first = parse_u64(&run[1], "claim reply pid")?;
            let count = parse_u64(&run[2], "claim reply count")?;
            let last = first
                .checked_add(count.saturating_sub(1))
                .filter(|_| count > 0)
                .ok_or_else(|| malformed("a run of no pid, or past the last one"))?;
            for pid in first..=last {
                let (min_id, max_id) = self.range_of(pid).await?;
                out.push(Lease {
                    pid,
                    token,
                    worker: worker.to_owned(),
                    min_id,
                    max_id,
                    attempt: 1,
                    progress: min_id,
                    deadline_ms: deadline,
                });
            }
        }
        Ok(out)
    }

    /// Completes `done` now: one `complete` script call per shard involved (per
    /// [`MAX_SCRIPT_BATCH`] completions), every shard's calls sent together, each with
    /// its shard's `SADD` to `{ns}:dirty` for the archivers. The mark never announces
    /// an entry that is not in the inbox yet. On one server (not a cluster) it rides
    /// behind the script in the same round trip: a server runs one connection's
    /// commands in the order sent, so it lands after the script's inbox entry (after a
    /// call that completed nothing too, which costs an archiver a look at nothing). On
    /// a cluster, where `{ns}:dirty` may live on another node, one `SADD` of the shards
    /// whose inbox received records follows the replies. A mark lost with a crash in
    /// between is found by the archivers' periodic sweep.
    async fn complete_now(&self, done: &[(Lease, u64)]) -> Result<Vec<Result<Completion>>> {
        let now = self.now();
        let in_order = conn::runs_in_order(&self.conn);
        // Group by shard: one script call per shard, whatever the number of completions.
        let groups = self.by_shard(done.iter().map(|(lease, _)| lease.pid));
        let calls = groups.iter().map(|(shard, chunk)| async move {
            let keys = &self.keys[*shard];
            let (chunk, args) = self.completion_args(done, chunk, now);
            let keys = [
                &keys.active,
                &keys.leases,
                &keys.index,
                &keys.inbox,
                &keys.counts,
                &keys.splits,
                &keys.runs,
                &keys.pending,
            ];
            let reply: Result<Vec<i64>> = if in_order {
                self.complete_marked(*shard, &keys, &args).await
            } else {
                self.invoke(&COMPLETE, &keys.map(String::as_str), &args)
                    .await
            };
            (*shard, chunk, reply)
        });
        let mut out: Vec<Option<Result<Completion>>> = (0..done.len()).map(|_| None).collect();
        let mut dirty = Vec::new();
        for (shard, chunk, reply) in join_all(calls).await {
            // A failed call fails its own completions only: the other shards' went in.
            let reply = match reply {
                Ok(reply) => reply,
                Err(err) => {
                    let err = Arc::new(err);
                    for &i in &chunk {
                        out[i] = Some(Err(Error::Shared(err.clone())));
                    }
                    continue;
                }
            };
            if !in_order && reply.contains(&OK) {
                dirty.push(shard);
            }
            for (&i, code) in chunk.iter().zip(reply) {
                out[i] = Some(match code {
                    OK => Ok(Completion::Completed),
                    DUPLICATE => Ok(Completion::Duplicate),
                    PART_DONE => Ok(Completion::PartDone),
                    CORRUPT => Err(Error::Corrupt {
                        key: format!("{} {}", self.keys[shard].active, done[i].0.pid),
                        detail:
                            "the record does not decode (`tranche check --repair` sets it aside)"
                                .into(),
                    }),
                    CORRUPT_RUN => Err(corrupt_run(
                        format!("{} {}", self.keys[shard].runs, done[i].0.token),
                        done[i].0.pid,
                        None,
                    )),
                    _ => Err(lost(&done[i].0)),
                });
            }
        }
        if !dirty.is_empty() {
            dirty.dedup();
            self.mark_dirty(&dirty).await;
        }
        out.into_iter()
            .zip(done)
            .map(|(o, (lease, _))| {
                o.ok_or_else(|| Error::Corrupt {
                    key: self.keys_of(lease.pid).active.clone(),
                    detail: "complete script replied for fewer leases than sent".into(),
                })
            })
            .collect()
    }

    /// The `complete` arguments for the completions `chunk` (indices into `done`) of one
    /// shard, and the order of the replies: the pids of one run that complete together
    /// go as one group entry (`complete.lua`: consecutive pids under one token at
    /// consecutive bit offsets, their records joined by newlines, up to the longest run),
    /// which the script completes in bulk; every other pid as an entry of its own. A
    /// lease cut short (its `max_id` below its partition's planned last ID) goes alone,
    /// its last ID before its record, so that the script can tell a cut it does not
    /// hold (lost in a failover) from one it does.
    fn completion_args(
        &self,
        done: &[(Lease, u64)],
        chunk: &[usize],
        now: u64,
    ) -> (Vec<usize>, Vec<String>) {
        let mut order = chunk.to_vec();
        order.sort_by_key(|&i| (done[i].0.token, done[i].0.pid));
        let mut args = Vec::with_capacity(order.len() * 4);
        let registry = read(&self.registry);
        let cut = |lease: &Lease| {
            registry
                .range_of(lease.pid)
                .is_some_and(|(_, last)| lease.max_id < last)
        };
        let mut at = 0;
        while at < order.len() {
            let first = &done[order[at]].0;
            let bit = self.bit(first.pid);
            let first_cut = cut(first);
            let mut end = at + 1;
            while !first_cut && end < order.len() && end - at < MAX_RUN {
                let next = &done[order[end]].0;
                let step = (end - at) as u64;
                if next.token != first.token
                    || cut(next)
                    || next.pid != first.pid + step
                    || self.bit(next.pid) != bit + step
                {
                    break;
                }
                end += 1;
            }
            let mut records = String::new();
            if first_cut {
                records = format!("<{}|", first.max_id);
            }
            for &i in &order[at..end] {
                let (lease, duration_ms) = &done[i];
                if !records.is_empty() && !first_cut {
                    records.push('\n');
                }
                records.push_str(&tranche_codec::encode_json(
                    &lease.completed(now, *duration_ms),
                ));
            }
            args.push(first.pid.to_string());
            args.push(first.token.to_string());
            args.push(bit.to_string());
            args.push(records);
            at = end;
        }
        (order, args)
    }

    /// One `complete` call on `shard` with its `SADD` to `{ns}:dirty` queued behind it,
    /// in one round trip (for a connection whose commands run in the order sent). A
    /// failed mark is logged, not returned: the completions went in, and the archivers'
    /// sweep finds them without it.
    async fn complete_marked(
        &self,
        shard: usize,
        keys: &[&String; 8],
        args: &[String],
    ) -> Result<Vec<i64>> {
        let replies: Vec<redis::Value> = retry(&self.conn, |mut conn| async move {
            let mut call = COMPLETE.prepare_invoke();
            for key in keys {
                call.key(key.as_str());
            }
            for arg in args {
                call.arg(arg.as_str());
            }
            let mut pipe = redis::pipe();
            pipe.ignore_errors()
                .invoke_script(&call)
                .cmd("SADD")
                .arg(&self.dirty_key)
                .arg(shard);
            let replies: Vec<redis::Value> = pipe.query_async(&mut conn).await?;
            match replies.first() {
                // A server that does not hold the script yet (restarted, flushed):
                // load it and send both again.
                Some(redis::Value::ServerError(err))
                    if err.kind() == Some(redis::ServerErrorKind::NoScript) =>
                {
                    call.load_async(&mut conn).await?;
                    pipe.query_async(&mut conn).await
                }
                _ => Ok(replies),
            }
        })
        .await?;
        let mut replies = replies.into_iter();
        let (Some(script), Some(mark)) = (replies.next(), replies.next()) else {
            return Err(Error::Corrupt {
                key: self.keys[shard].inbox.clone(),
                detail: "complete and its dirty mark got fewer than two replies".into(),
            });
        };
        if let redis::Value::ServerError(err) = mark {
            tracing::warn!(%err, shard, "could not mark a shard dirty; the archivers' sweep will find it");
        }
        Ok(redis::from_redis_value(script.extract_error()?).map_err(redis::RedisError::from)?)
    }

    /// The indexes of `pids` grouped by shard, at most [`MAX_SCRIPT_BATCH`] to a group:
    /// one script call each.
    pub(super) fn by_shard(&self, pids: impl Iterator<Item = u64>) -> Vec<(usize, Vec<usize>)> {
        let mut by_shard: Vec<Vec<usize>> = vec![Vec::new(); self.keys.len()];
        for (i, pid) in pids.enumerate() {
            by_shard[self.layout.shard_of(pid) as usize].push(i);
        }
        let mut out = Vec::new();
        for (shard, members) in by_shard.into_iter().enumerate() {
            for chunk in members.chunks(MAX_SCRIPT_BATCH) {
                out.push((shard, chunk.to_vec()));
            }
        }
        out
    }

    /// Adds `shards` to `{ns}:dirty`. A failure is logged, not returned: the
    /// completions it announces are durable in the inbox, and the archivers' sweep finds
    /// them without the mark.
    pub(super) async fn mark_dirty(&self, shards: &[usize]) {
        let marked: redis::RedisResult<i64> = retry(&self.conn, |mut conn| async move {
            let mut cmd = redis::cmd("SADD");
            cmd.arg(&self.dirty_key).arg(shards);
            cmd.query_async(&mut conn).await
        })
        .await;
        if let Err(err) = marked {
            tracing::warn!(%err, "could not mark shards dirty; the archivers' sweep will find them");
        }
    }
}

#[async_trait]
impl<C> Leases for RedisActiveStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn claim(&self, worker: &str, n: usize) -> Result<Vec<Lease>> {
        plans::check_worker(worker)?;
        let now = self.now();
        let deadline = self.deadline(now);
        let mut out = Vec::new();
        for shard in self.layout.claim_order(worker, now) {
            if out.len() >= n {
                break;
            }
            // A shard found without ready work a moment ago is passed by: an idle claim
            // costs nothing, whatever the shard count.
            if self.empty.skip(shard, now) {
                continue;
            }
            let keys = &self.keys[shard as usize];
            let want = (n - out.len()).min(MAX_SCRIPT_BATCH);
            let args = [
                worker.to_owned(),
                want.to_string(),
                now.to_string(),
                deadline.to_string(),
                shard.to_string(),
                self.layout.shards().to_string(),
                self.layout.per_batch().to_string(),
            ];
            let taken = match self
                .invoke(
                    &CLAIM,
                    &[
                        &keys.active,
                        &keys.pending,
                        &keys.leases,
                        &keys.plans,
                        &keys.cursor,
                        &keys.seq,
                        &keys.counts,
                        &keys.runs,
                    ],
                    &args,
                )
                .await
            {
                Ok(reply) => self.leases_from(worker, deadline, reply).await,
                Err(err) => Err(err),
            };
            let leases = match taken {
                Ok(leases) => leases,
                // What the shards before it handed out is this worker's: returned, not
                // dropped with the error (claimed by nobody, until their leases expired).
                Err(err) if !out.is_empty() => {
                    tracing::warn!(shard, %err, "a claim failed on one shard; the leases taken before it stand");
                    break;
                }
                Err(err) => return Err(err),
            };
            if leases.len() < want {
                self.empty.found_short(shard, now);
            }
            out.extend(leases);
        }
        Ok(out)
    }

    async fn heartbeat(&self, lease: &Lease, progress: u64) -> Result<()> {
        let mut out = self.heartbeat_many(&[(lease.clone(), progress)]).await?;
        out.pop().expect("one outcome per lease")
    }

    async fn heartbeat_many(&self, beats: &[(Lease, u64)]) -> Result<Vec<Result<()>>> {
        let beats: Vec<(&Lease, u64, Option<u64>)> =
            beats.iter().map(|(l, p)| (l, *p, None)).collect();
        Ok(self
            .beat_owners(&beats)
            .await?
            .into_iter()
            .map(|r| r.map(|_| ()))
            .collect())
    }

    async fn complete(&self, lease: &Lease, duration_ms: u64) -> Result<Completion> {
        let (tx, rx) = oneshot::channel();
        if self
            .committer()
            .send((lease.clone(), duration_ms, tx))
            .is_err()
        {
            // The commit task is gone (its runtime shut down): complete directly.
            let mut out = self.complete_now(&[(lease.clone(), duration_ms)]).await?;
            return out.pop().expect("one outcome per completion");
        }
        match rx.await {
            Ok(outcome) => outcome,
            Err(_) => self
                .complete_now(&[(lease.clone(), duration_ms)])
                .await?
                .pop()
                .expect("one outcome"),
        }
    }

    async fn complete_many(&self, done: &[(Lease, u64)]) -> Result<Vec<Result<Completion>>> {
        self.complete_now(done).await
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
        self.carve_pids(&[lease.pid]).await?;
        let keys = self.keys_of(lease.pid);
        let mut args = vec![
            lease.pid.to_string(),
            lease.token.to_string(),
            self.now().to_string(),
            error.to_owned(),
            self.config.max_attempts.to_string(),
            self.config.backoff_base.as_millis().to_string(),
            self.config.backoff_max.as_millis().to_string(),
        ];
        args.push(split::policy_arg(policy));
        let reply: Vec<i64> = self
            .invoke(
                &FAIL,
                &[
                    &keys.active,
                    &keys.leases,
                    &keys.pending,
                    &keys.counts,
                    &keys.splits,
                    &keys.pieces,
                    &keys.piece_pending,
                    &keys.piece_leases,
                ],
                &args,
            )
            .await?;
        match reply.as_slice() {
            [OK, -1] => Ok(FailOutcome::Failed),
            [OK, ready] => Ok(FailOutcome::Retry {
                ready_at_ms: *ready as u64,
            }),
            _ => Err(lost(lease)),
        }
    }

    async fn release(&self, lease: &Lease, progress: u64) -> Result<()> {
        self.carve_pids(&[lease.pid]).await?;
        let keys = self.keys_of(lease.pid);
        let args = [
            self.now().to_string(),
            lease.pid.to_string(),
            lease.token.to_string(),
            progress.to_string(),
        ];
        let reply: Vec<i64> = self
            .invoke(
                &RELEASE,
                &[&keys.active, &keys.leases, &keys.pending, &keys.counts],
                &args,
            )
            .await?;
        match reply.first() {
            Some(&OK) => {
                // Pending again: this process may claim it at once.
                self.empty.wake(self.layout.shard_of(lease.pid));
                Ok(())
            }
            _ => Err(lost(lease)),
        }
    }
}

fn lost(lease: &Lease) -> Error {
    Error::LeaseLost {
        pid: lease.pid,
        token: lease.token,
    }
}
