//! Reads of the active layer on Redis: `get`, `all_active` (each shard's records with
//! its plan list and cursors in one transaction, through the `tranche-bulk` reader when
//! there is one) and `counts` (the per-status counters, derived once for a namespace
//! written without them), and the parsing they share.

use super::*;

/// Where `all_active` found an active pid: a record of its shard's active hash (its
/// bytes, as the reply holds them), or a run that holds it.
#[derive(Clone, Copy)]
enum Held<'a> {
    Record(&'a [u8]),
    Run(&'a record::Run),
}

/// The (field, value) pairs of a reply to HGETALL of `key`, borrowed from it.
pub(super) fn hash_of<'a>(reply: &'a redis::Value, key: &str) -> Result<Vec<(&'a [u8], &'a [u8])>> {
    record::hash_entries(reply).ok_or_else(|| Error::Corrupt {
        key: key.to_owned(),
        detail: "the reply to HGETALL is not a hash".into(),
    })
}

impl<C> RedisActiveStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// One shard's records, runs, plan list and cursors, read in one transaction so
    /// that a claim cannot slip between the reads and leave its pids in neither the
    /// records nor the unissued ranges.
    fn shard_read(&self, shard: u32) -> redis::Pipeline {
        let keys = &self.keys[shard as usize];
        let mut pipe = redis::pipe();
        pipe.atomic()
            .hgetall(&keys.active)
            .hgetall(&keys.runs)
            .lrange(&keys.plans, 0, -1)
            .hgetall(&keys.cursor);
        pipe
    }

    /// [`shard_read`](Self::shard_read) through redis-rs. The records and runs stay raw
    /// replies, parsed in place.
    async fn read_shard(
        &self,
        shard: u32,
    ) -> Result<(redis::Value, redis::Value, Vec<String>, Pairs)> {
        let pipe = &self.shard_read(shard);
        Ok(retry(&self.conn, |mut conn| async move {
            pipe.query_async(&mut conn).await
        })
        .await?)
    }

    /// Every shard's [`shard_read`](Self::shard_read) on the bulk connection, in one
    /// write; `None` (logged by the reader) when it fails, so the caller reads the
    /// ordinary way.
    async fn read_shards_bulk(&self, reader: &Arc<bulk::BulkReader>) -> Option<bulk::Replies> {
        let reads: Vec<_> = (0..self.layout.shards())
            .map(|s| self.shard_read(s))
            .collect();
        reader.query(&reads).await.ok()
    }

    /// The shards' reads out of [`read_shards_bulk`](Self::read_shards_bulk)'s replies,
    /// borrowed from them; `None` if they are not what the commands answer (an error
    /// reply, say), for the ordinary read to report.
    fn shard_reads<'a>(&self, replies: &'a bulk::Replies) -> Option<Vec<ShardRead<'a>>> {
        use bulk::Frame;
        let text = |f: &Frame| match f {
            Frame::Bulk(r) => String::from_utf8(replies.bytes(r).to_vec()).ok(),
            _ => None,
        };
        let bytes = |f: &'a Frame| match f {
            Frame::Bulk(r) => Some(replies.bytes(r)),
            _ => None,
        };
        let frames = replies.frames();
        // MULTI, four QUEUED, EXEC per shard.
        if frames.len() != self.keys.len() * 6 {
            return None;
        }
        frames
            .chunks_exact(6)
            .map(|shard| {
                let Frame::Array(exec) = &shard[5] else {
                    return None;
                };
                let [
                    Frame::Array(active),
                    Frame::Array(runs),
                    Frame::Array(plans),
                    Frame::Array(cursor),
                ] = exec.as_slice()
                else {
                    return None;
                };
                if active.len() % 2 != 0 || runs.len() % 2 != 0 || cursor.len() % 2 != 0 {
                    return None;
                }
                Some(ShardRead {
                    entries: active
                        .chunks_exact(2)
                        .map(|kv| Some((bytes(&kv[0])?, bytes(&kv[1])?)))
                        .collect::<Option<_>>()?,
                    runs: runs
                        .chunks_exact(2)
                        .map(|kv| Some((bytes(&kv[0])?, bytes(&kv[1])?)))
                        .collect::<Option<_>>()?,
                    plans: plans.iter().map(text).collect::<Option<_>>()?,
                    cursor: cursor
                        .chunks_exact(2)
                        .map(|kv| Some((text(&kv[0])?, text(&kv[1])?)))
                        .collect::<Option<_>>()?,
                })
            })
            .collect()
    }

    /// One shard's counters (`p`, `c`, `r`, `f`, then the mark `v`), the number of its
    /// records and runs, its plan list and cursors, in one transaction: a claim moves pids from a
    /// cursor to the counters atomically, so reading them apart could count a pid twice
    /// or not at all.
    async fn read_counts(&self, shard: u32) -> Result<CountsRead> {
        let keys = &self.keys[shard as usize];
        let (counters, records, runs, plans, cursor): (_, u64, u64, _, _) =
            retry(&self.conn, |mut conn| async move {
                redis::pipe()
                    .atomic()
                    .hmget(&keys.counts, &["p", "c", "r", "f", "v", "d"])
                    .hlen(&keys.active)
                    .hlen(&keys.runs)
                    .lrange(&keys.plans, 0, -1)
                    .hgetall(&keys.cursor)
                    .query_async(&mut conn)
                    .await
            })
            .await?;
        // Runs hold partitions as records do: a shard whose claims are all still runs
        // was claimed in, and its unmarked counters are not left-overs.
        Ok((counters, records + runs, plans, cursor))
    }

    /// Derives every shard's status counters from its records, once, and marks them
    /// exact; the scripts keep them from then on. [`ActiveQuery::counts`] does this by
    /// itself for a shard whose counters were never marked (a namespace written by a
    /// version without them). Run it by hand after processes of such a version wrote to
    /// the namespace alongside this one (a rolling upgrade): their scripts change
    /// statuses without counting. Costs one read of every active record.
    pub async fn recount(&self) -> Result<StatusCounts> {
        let shards: Vec<u32> = (0..self.layout.shards()).collect();
        self.recount_shards(&shards).await?;
        self.counts().await
    }

    /// Replaces whatever record `pid` has in the active layer, even one that does not
    /// decode, with a discarded one (`tranche discard --force`), takes it off the
    /// pending and lease indexes, and derives its shard's counters again: gives up a
    /// corrupt record's partition, where [`Maintenance::repair_corrupt`] rebuilds it
    /// (the scripts that change a record refuse a corrupt one). Refused for a pid
    /// no plan has, or one already completed. Not atomic with running workers: a lease
    /// on the pid is lost (its holder's next call gets `LeaseLost`).
    pub async fn force_discard(&self, pid: u64) -> Result<()> {
        if self.range_of(pid).await.is_err() {
            return Err(Error::InvalidArgument(format!(
                "no plan has partition {pid}"
            )));
        }
        // Out of its run first: the record written below replaces the pid's own.
        self.carve_pids(&[pid]).await?;
        let keys = self.keys_of(pid);
        let offset = self.layout.schema().bit_offset(pid);
        let completed: u8 = retry(&self.conn, |mut conn| async move {
            redis::cmd("GETBIT")
                .arg(&keys.index)
                .arg(offset)
                .query_async(&mut conn)
                .await
        })
        .await?;
        if completed == 1 {
            return Err(Error::InvalidArgument(format!(
                "partition {pid} is completed: nothing to discard"
            )));
        }
        let now = self.now();
        let record =
            format!("d|0|||{now}||{now}|||||discarded by force: its record could not be read");
        let field = pid.to_string();
        retry(&self.conn, |mut conn| {
            let (record, field) = (record.clone(), field.clone());
            async move {
                redis::pipe()
                    .atomic()
                    .hset(&keys.active, &field, record)
                    .ignore()
                    .zrem(&keys.pending, &field)
                    .ignore()
                    .zrem(&keys.leases, &field)
                    .ignore()
                    .query_async::<()>(&mut conn)
                    .await
            }
        })
        .await?;
        self.recount_shards(&[self.layout.shard_of(pid)]).await
    }

    /// Gives adopted partitions the state they had in the system they came from
    /// (`tranche import --from-hash`, after [`Planner::adopt`](crate::Planner::adopt)
    /// made them pending): each keeps its attempts, and is failed (last held by its
    /// worker, out of every index) when [`Carried::failed`] says so. Only a
    /// pending record changes, so calling it again changes nothing more. One script call
    /// per shard and chunk; returns how many records changed.
    pub async fn carry(&self, partitions: &[Carried]) -> Result<u64> {
        let now = self.now().to_string();
        let mut args: Vec<Vec<String>> = vec![vec![now.clone()]; self.keys.len()];
        for c in partitions {
            if !c.worker.is_empty() {
                plans::check_worker(&c.worker)?;
            }
            let shard = self.layout.shard_of(c.pid) as usize;
            args[shard].extend([
                c.pid.to_string(),
                c.attempts.to_string(),
                if c.failed { "f" } else { "p" }.to_owned(),
                c.worker.clone(),
            ]);
        }
        let mut changed = 0;
        for (shard, args) in args.iter().enumerate() {
            let keys = &self.keys[shard];
            for chunk in args[1..].chunks(4 * MAX_SCRIPT_BATCH) {
                let mut call = vec![now.clone()];
                call.extend_from_slice(chunk);
                let n: u64 = self
                    .invoke(&CARRY, &[&keys.active, &keys.pending, &keys.counts], &call)
                    .await?;
                changed += n;
            }
        }
        self.empty.wake_all();
        Ok(changed)
    }

    async fn recount_shards(&self, shards: &[u32]) -> Result<()> {
        let calls = shards.iter().map(|&s| async move {
            let keys = &self.keys[s as usize];
            // recount.lua counts records: every pid held in a run gets one first.
            self.carve(s as usize, &["all".to_owned()]).await?;
            self.invoke::<Vec<i64>>(&RECOUNT, &[&keys.active, &keys.counts], &[])
                .await
        });
        for reply in join_all(calls).await {
            reply?;
        }
        Ok(())
    }

    /// The partitions of `records` (each pid with where it is held), in their order, and
    /// the pids whose record does not decode (left out); `None` if one belongs to a plan
    /// `registry` does not know yet.
    fn partitions(
        &self,
        records: &[(u64, Held<'_>)],
        registry: &Registry,
    ) -> Option<(Vec<Partition>, Vec<u64>)> {
        let mut out = Vec::with_capacity(records.len());
        let mut corrupt = Vec::new();
        for &(pid, held) in records {
            let rec = match held {
                Held::Record(rec) => rec,
                Held::Run(run) => {
                    out.push(run.partition(pid, registry.range_of(pid)?));
                    continue;
                }
            };
            match record::parse_bytes(pid, rec, |pid| registry.range_of(pid)) {
                Some(p) => out.push(p),
                None if record::parse_bytes(pid, rec, |_| Some((0, 0))).is_some() => {
                    return None;
                }
                None => corrupt.push(pid),
            }
        }
        Some((out, corrupt))
    }

    /// The unissued ranges of `shard` from its plans list and cursors.
    fn unissued(&self, shard: u32, plans: &[String], cursor: &Pairs) -> Result<Vec<Unissued>> {
        Ok(self
            .cursors(shard, plans, cursor)?
            .into_iter()
            .filter_map(|(_, last, at)| {
                let count = self.layout.count_in_shard(at, last, shard);
                (count > 0).then_some(Unissued {
                    shard,
                    next_pid: at,
                    last_pid: last,
                    count,
                })
            })
            .collect())
    }

    /// A shard's uniform plans as (first pid, last pid, next pid it will issue), from its
    /// `plans` list and `cursor` hash.
    fn cursors(
        &self,
        shard: u32,
        plans: &[String],
        cursor: &Pairs,
    ) -> Result<Vec<(u64, u64, u64)>> {
        let keys = &self.keys[shard as usize];
        plans
            .iter()
            .map(|entry| {
                let (first, last) =
                    record::parse_cursor_plan(entry).ok_or_else(|| Error::Corrupt {
                        key: keys.plans.clone(),
                        detail: format!("unreadable entry {entry:?}"),
                    })?;
                let at = cursor
                    .iter()
                    .find(|(f, _)| f.parse() == Ok(first))
                    .map(|(_, at)| parse_u64(at, &keys.cursor))
                    .transpose()?
                    .unwrap_or(first);
                Ok((first, last, self.layout.align(at, shard)))
            })
            .collect()
    }
}

#[async_trait]
impl<C> ActiveQuery for RedisActiveStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn get(&self, pid: u64) -> Result<Option<Partition>> {
        let shard = self.layout.shard_of(pid);
        let keys = &self.keys[shard as usize];
        // One round trip: the record, and the cursors in case it is not issued yet. In
        // one transaction (the keys share a slot): a claim running between the HGET and
        // the cursor read would otherwise move the pid out of both, and an issued pid
        // would read as completed.
        // The record and the runs as bytes: a corrupt one need not be UTF-8.
        let (rec, runs, plans, cursor): (Option<Vec<u8>>, redis::Value, Vec<String>, Pairs) =
            retry(&self.conn, |mut conn| async move {
                redis::pipe()
                    .atomic()
                    .hget(&keys.active, pid)
                    .hgetall(&keys.runs)
                    .lrange(&keys.plans, 0, -1)
                    .hgetall(&keys.cursor)
                    .query_async(&mut conn)
                    .await
            })
            .await?;
        // A pid held in a run reads as the record the run stands for. A run that does
        // not decode is passed by, unless it names the pid: then what holds the pid
        // cannot be told, and that is the answer.
        let rec = match rec {
            Some(rec) => Some(rec),
            None => {
                let (sound, broken) = record::runs_of(&hash_of(&runs, &keys.runs)?);
                if let Some(run) = sound.iter().find(|run| run.holds(pid)) {
                    Some(run.record().into_bytes())
                } else if let Some(run) = broken.iter().find(|run| run.names(pid)) {
                    return Err(Error::Corrupt {
                        key: format!("{} {}", keys.runs, String::from_utf8_lossy(run.token)),
                        detail: format!(
                            "the run naming pid {pid} does not decode: what holds it is unknown"
                        ),
                    });
                } else {
                    None
                }
            }
        };
        if let Some(rec) = rec {
            let mut p = record::parse_bytes(pid, &rec, |pid| read(&self.registry).range_of(pid));
            if p.is_none() {
                let registry = self.refresh_registry().await?;
                p = record::parse_bytes(pid, &rec, |pid| registry.range_of(pid));
            }
            return p.map(Some).ok_or_else(|| Error::Corrupt {
                key: format!("{} {pid}", keys.active),
                detail: format!("unreadable record {:?}", String::from_utf8_lossy(&rec)),
            });
        }
        let unissued = self
            .cursors(shard, &plans, &cursor)?
            .into_iter()
            .any(|(first, last, at)| (first..=last).contains(&pid) && at <= pid);
        if unissued {
            let (min, max) = self.range_of(pid).await?;
            return Ok(Some(Partition::pending(pid, min, max, 0)));
        }
        Ok(None)
    }

    async fn all_active(&self) -> Result<ActiveSnapshot> {
        // One round trip: every shard's read is sent before any answer is awaited, so
        // they share one pipeline, on the bulk connection when there is one (its
        // replies are scanned in place) and otherwise on the multiplexed connection.
        // The records are parsed straight from the reply's bytes, sorted by pid as
        // (pid, bytes) pairs before any partition is built. The cached registry
        // supplies uniform plans' ranges (plans are append-only); only a record of a
        // plan added since it was read costs a second round trip, to read it again.
        let bulk = match &self.bulk {
            Some(reader) => self.read_shards_bulk(reader).await,
            None => None,
        };
        // The ordinary read's replies, which its shard reads borrow from.
        let values: Vec<(redis::Value, redis::Value, Vec<String>, Pairs)>;
        let reads = match bulk.as_ref().and_then(|r| self.shard_reads(r)) {
            Some(reads) => reads,
            None => {
                values = join_all((0..self.layout.shards()).map(|s| self.read_shard(s)))
                    .await
                    .into_iter()
                    .collect::<Result<_>>()?;
                values
                    .iter()
                    .zip(self.keys.iter())
                    .map(|((active, runs, plans, cursor), keys)| {
                        Ok(ShardRead {
                            entries: hash_of(active, &keys.active)?,
                            runs: hash_of(runs, &keys.runs)?,
                            plans: plans.clone(),
                            cursor: cursor.clone(),
                        })
                    })
                    .collect::<Result<Vec<_>>>()?
            }
        };
        let mut snapshot = ActiveSnapshot::default();
        // Every active pid, from its record or from the run that holds it (parsed
        // before any is borrowed). A run that does not parse is left out, as a corrupt
        // record is below; the pids it still names are listed with them.
        let mut broken: Vec<(u32, record::BrokenRun<'_>)> = Vec::new();
        let runs: Vec<Vec<record::Run>> = (0..)
            .zip(&reads)
            .map(|(shard, read)| {
                let (sound, bad) = record::runs_of(&read.runs);
                broken.extend(bad.into_iter().map(|run| (shard, run)));
                sound
            })
            .collect();
        let mut records = Vec::new();
        for run in runs.iter().flatten() {
            records.extend(run.pids().map(|pid| (pid, Held::Run(run))));
        }
        for (shard, read) in (0..).zip(&reads) {
            let key = &self.keys[shard as usize].active;
            records.reserve(read.entries.len());
            for &(pid, rec) in &read.entries {
                let pid = record::parse_u64(pid).ok_or_else(|| Error::Corrupt {
                    key: key.clone(),
                    detail: format!("field {:?} is not a pid", String::from_utf8_lossy(pid)),
                })?;
                records.push((pid, Held::Record(rec)));
            }
            snapshot
                .unissued
                .extend(self.unissued(shard, &read.plans, &read.cursor)?);
        }
        records.sort_unstable_by_key(|&(pid, ..)| pid);
        let cached = self.partitions(&records, &read(&self.registry));
        let (partitions, corrupt) = match cached {
            Some(read) => read,
            None => {
                let registry = self.refresh_registry().await?;
                self.partitions(&records, &registry)
                    .ok_or_else(|| Error::Corrupt {
                        key: self.registry_key.clone(),
                        detail: "an active record is in no plan".into(),
                    })?
            }
        };
        // One record that does not decode must not blind every reader of the active
        // set (the splitter, `list`, the dashboard): it is left out, said once per read.
        if let Some(&first) = corrupt.first() {
            tracing::warn!(
                records = corrupt.len(),
                first,
                "active records that do not decode are left out; `tranche check --repair` sets them aside"
            );
        }
        // Nor must one run: its pids are listed as corrupt, those its first and last
        // fields still name and nothing else holds (a pid with a record left its run).
        let mut corrupt = corrupt;
        if let Some(&(shard, first)) = broken.first() {
            tracing::warn!(
                runs = broken.len(),
                first = %format_args!(
                    "{} {}",
                    self.keys[shard as usize].runs,
                    String::from_utf8_lossy(first.token)
                ),
                "active runs that do not decode are left out; the pids they name are listed as corrupt"
            );
            let held = |pid: u64| records.binary_search_by_key(&pid, |&(p, _)| p).is_ok();
            corrupt.extend(
                broken
                    .iter()
                    .filter_map(|(_, run)| run.span)
                    .flat_map(|(first, last)| first..=last)
                    .filter(|&pid| !held(pid)),
            );
            corrupt.sort_unstable();
            corrupt.dedup();
        }
        snapshot.partitions = partitions;
        snapshot.corrupt = corrupt;
        Ok(snapshot)
    }

    async fn corrupt_records(&self) -> Result<Vec<CorruptRecord>> {
        // Each shard's records and runs whole, as bytes (HGETALL, as `all_active` reads
        // them), parsed here: a record is corrupt when it does not parse whatever its
        // plan's range; a run when it does not parse as one.
        let mut found = Vec::new();
        for (shard, keys) in (0..).zip(self.keys.iter()) {
            let (active, runs): (redis::Value, redis::Value) =
                retry(&self.conn, |mut conn| async move {
                    redis::pipe()
                        .hgetall(&keys.active)
                        .hgetall(&keys.runs)
                        .query_async(&mut conn)
                        .await
                })
                .await?;
            // A run that does not parse, listed under each pid its first and last fields
            // still name, or once without a pid when not even those read.
            for run in record::runs_of(&hash_of(&runs, &keys.runs)?).1 {
                let key = format!("{} {}", keys.runs, String::from_utf8_lossy(run.token));
                let listed = |pid| CorruptRecord {
                    shard,
                    pid,
                    key: key.clone(),
                    raw: run.value.to_vec(),
                };
                match run.span {
                    Some((first, last)) => found.extend((first..=last).map(|p| listed(Some(p)))),
                    None => found.push(listed(None)),
                }
            }
            for (pid, rec) in hash_of(&active, &keys.active)? {
                let Some(pid) = record::parse_u64(pid) else {
                    continue;
                };
                if record::parse_bytes(pid, rec, |_| Some((0, 0))).is_none() {
                    found.push(CorruptRecord {
                        shard,
                        pid: Some(pid),
                        key: keys.active.clone(),
                        raw: rec.to_vec(),
                    });
                }
            }
        }
        found.sort_by_key(|c| c.pid);
        Ok(found)
    }

    async fn counts(&self) -> Result<StatusCounts> {
        // One round trip: each shard's counters beside its cursors, all shards
        // pipelined. Counters not marked exact are zero when the shard holds no record
        // (nothing was ever claimed there); otherwise the shard was written by a version
        // without them, and they are derived from its records once, then read again.
        let shards = 0..self.layout.shards();
        let mut reads = join_all(shards.clone().map(|s| self.read_counts(s)))
            .await
            .into_iter()
            .collect::<Result<Vec<_>>>()?;
        let unmarked: Vec<u32> = shards
            .clone()
            .filter(|&s| {
                let (counters, records, ..) = &reads[s as usize];
                *records > 0 && counters.get(4).copied().flatten() != Some(1)
            })
            .collect();
        if !unmarked.is_empty() {
            tracing::info!(
                namespace = %self.config.namespace,
                shards = ?unmarked,
                "deriving the active layer's status counters from its records, once"
            );
            self.recount_shards(&unmarked).await?;
            reads = join_all(shards.map(|s| self.read_counts(s)))
                .await
                .into_iter()
                .collect::<Result<Vec<_>>>()?;
        }
        let mut counts = StatusCounts::default();
        for (shard, (counters, records, plans, cursor)) in (0..).zip(&reads) {
            // Unmarked counters of a shard without records are left-overs: it holds none.
            let exact = *records > 0 || counters.get(4).copied().flatten() == Some(1);
            let get = |i: usize| {
                let n = counters
                    .get(i)
                    .copied()
                    .flatten()
                    .filter(|_| exact)
                    .unwrap_or(0);
                if n < 0 {
                    tracing::warn!(
                        key = %self.keys[shard as usize].counts,
                        value = n,
                        "a negative status counter: a writer did not keep the counters; \
                         run recount"
                    );
                }
                n.max(0) as u64
            };
            counts.pending += get(0);
            counts.claimed += get(1);
            counts.running += get(2);
            counts.failed += get(3);
            counts.discarded += get(5);
            counts.unissued += self
                .unissued(shard, plans, cursor)?
                .iter()
                .map(|u| u.count)
                .sum::<u64>();
        }
        Ok(counts)
    }
}
