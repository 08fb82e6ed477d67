//! The archiving pass on Redis: reading the shards' inboxes through the consumer group
//! (woken passes from `{ns}:dirty`, sweeps with takeover), writing each chunk with the
//! archive script, setting aside records that can never be archived, acknowledging.

use super::*;

/// How long a woken pass goes by the count it keeps before it counts again, while a
/// tier threshold is ahead.
const RECOUNT_EVERY: Duration = Duration::from_secs(1);

/// Whether Redis refused a call for what it carried (a script's error), rather than
/// the call failing to get through: only then is trying the records one by one of use.
fn refused(err: &redis::RedisError) -> bool {
    !(err.is_io_error()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_timeout()
        || err.is_cluster_error())
}

/// Whether a shard's failure may pass by itself (a connection dropped, a timeout):
/// the pass fails and is retried. Anything else is the shard's own state, and stalls
/// it until repaired.
fn transient(err: &Error) -> bool {
    matches!(err, Error::Redis(e) if !refused(e))
}

/// Whether the archive script refused one record for the record itself (its own
/// counters past the statistics' guard, or arguments it cannot take), so that it can
/// never be archived; anything else it refuses is the shard's state.
fn poison(err: &redis::RedisError) -> bool {
    let text = err.to_string();
    text.contains("a delta counter reached") || text.contains("malformed delta argument")
}

impl<C> RedisArchive<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    pub(super) async fn ensure_group(&self, shard: u32) -> Result<bool> {
        if self.started[shard as usize].load(Ordering::Acquire) {
            return Ok(false);
        }
        let key = self.keys[shard as usize].inbox.clone();
        let created: redis::RedisResult<Value> = retry(&self.conn, |mut c| {
            let key = key.clone();
            async move {
                redis::cmd("XGROUP")
                    .arg("CREATE")
                    .arg(key)
                    .arg(GROUP)
                    .arg("0")
                    .arg("MKSTREAM")
                    .query_async(&mut c)
                    .await
            }
        })
        .await;
        match created {
            Ok(_) => {}
            Err(e) if e.code() == Some("BUSYGROUP") => {}
            Err(e) => return Err(e.into()),
        }
        Ok(true)
    }

    /// Counts the archived records again (one read per shard) and keeps the count for
    /// woken passes.
    pub(super) async fn count_archived(&self) -> Result<u64> {
        let started = Instant::now();
        let archived = self.archived_count().await?;
        self.archived.fetch_max(archived, Ordering::Relaxed);
        self.written_since.store(0, Ordering::Relaxed);
        *self.counted_at.lock().expect("count lock") = Some(started);
        Ok(self.archived.load(Ordering::Relaxed))
    }

    /// Whether a woken pass counts again before it picks its tier: never counted yet;
    /// or a tier threshold is ahead and either a second has passed since the count or
    /// this archiver alone wrote a sixteenth of the way to it since. Archivers of a
    /// fleet share the work, so each one's writes stand for the fleet's: the tier then
    /// changes within a few percent of its threshold, at a cost of one read per shard
    /// every sixteenth of the distance, and none past the last threshold.
    pub(super) fn recount_due(&self, now: Instant) -> bool {
        let Some(at) = *self.counted_at.lock().expect("count lock") else {
            return true;
        };
        let archived = self.archived.load(Ordering::Relaxed);
        let Some(next) = self.config.next_tier_at(archived) else {
            return false;
        };
        let since = self.written_since.load(Ordering::Relaxed);
        now.duration_since(at) >= RECOUNT_EVERY || (since > 0 && since >= (next - archived) / 16)
    }

    /// Takes over up to `batch` entries of `shard` that another archiver has held
    /// unacknowledged for `idle` (it died): XAUTOCLAIM, on sweeps only. On a shard
    /// known stalled, whatever their idle time: whoever held them could not archive
    /// them either (a `run` that ended on the stall leaves them pending under its
    /// name), and the archived bits count each record once whoever writes it, so the
    /// first archiver after the repair drains the shard at once.
    pub(super) async fn take_over(
        &self,
        shard: u32,
        idle: Duration,
        pass: &mut ArchivePass,
    ) -> Result<Vec<StreamId>> {
        let inbox = &self.keys[shard as usize].inbox;
        let consumer = &self.config.consumer;
        let want = self.config.batch;
        let idle = if self.is_stalled(shard) {
            0
        } else {
            idle.as_millis().min(u64::MAX as u128) as u64
        };
        let claimed: StreamAutoClaimReply = retry(&self.conn, |mut c| async move {
            redis::cmd("XAUTOCLAIM")
                .arg(inbox)
                .arg(GROUP)
                .arg(consumer)
                .arg(idle)
                .arg("0-0")
                .arg("COUNT")
                .arg(want)
                .query_async(&mut c)
                .await
        })
        .await?;
        pass.claimed += claimed.claimed.len();
        Ok(claimed.claimed)
    }

    /// Pops every mark of `{ns}:dirty` (one command, whatever the shard count; marks
    /// another archiver pops are its to serve) and returns the shard numbers.
    pub(super) async fn pop_dirty(&self) -> Result<Vec<u32>> {
        let count = self.schema.num_shards() as usize;
        let key = &self.dirty_key;
        let marks: Vec<String> = retry(&self.conn, |mut c| async move {
            redis::cmd("SPOP")
                .arg(key)
                .arg(count)
                .query_async(&mut c)
                .await
        })
        .await?;
        Ok(marks
            .iter()
            .filter_map(|m| {
                let shard = m
                    .parse::<u32>()
                    .ok()
                    .filter(|&s| s < self.schema.num_shards());
                if shard.is_none() {
                    tracing::warn!(key = %self.dirty_key, mark = %m, "not a shard number; ignored");
                }
                shard
            })
            .collect())
    }

    /// The shards a woken pass reads now: those owed a read whose last read came back
    /// full or was at least `gather` ago. They are no longer owed.
    pub(super) fn ripe(&self, marked: &[u32], now: Instant) -> Vec<u32> {
        let mut w = self.woken.lock().unwrap_or_else(|p| p.into_inner());
        for &shard in marked {
            w.owed[shard as usize] = true;
        }
        let mut out = Vec::new();
        for shard in 0..w.owed.len() {
            let ready = w.full[shard]
                || w.last_read[shard].is_none_or(|t| now.duration_since(t) >= self.config.gather);
            // A stalled shard waits for a sweep (or a repair): every retry costs a
            // refused call, and nothing changes until someone repairs it.
            if w.owed[shard] && ready && !self.is_stalled(shard as u32) {
                w.owed[shard] = false;
                out.push(shard as u32);
            }
        }
        out
    }

    /// Notes what a read of `shard` at `at` found (or that it failed: owed again).
    pub(super) fn read_done(&self, shard: u32, at: Instant, entries: Option<usize>) {
        let mut w = self.woken.lock().unwrap_or_else(|p| p.into_inner());
        let s = shard as usize;
        match entries {
            Some(entries) => {
                let full = entries >= self.config.batch;
                w.full[s] = full;
                w.owed[s] |= full;
                w.last_read[s] = Some(at);
            }
            None => w.owed[s] = true,
        }
    }

    /// Archives `shards` at once, their calls pipelined. `takeover` (on sweeps) is how
    /// long another archiver's entries must have sat unacknowledged to be taken over.
    pub(super) async fn archive_shards(
        &self,
        shards: &[u32],
        tier: Tier,
        takeover: Option<Duration>,
    ) -> Result<ArchivePass> {
        let at = Instant::now();
        let results = futures_util::future::join_all(
            shards
                .iter()
                .map(|&s| self.archive_shard(s, tier, takeover)),
        )
        .await;
        let mut pass = ArchivePass::default();
        let mut failed = None;
        let (mut stalls, mut resumed) = (Vec::new(), Vec::new());
        for (&shard, result) in shards.iter().zip(results) {
            match result {
                Ok(p) => {
                    self.read_done(shard, at, Some(p.entries));
                    if p.entries > 0 && self.is_stalled(shard) {
                        resumed.push(shard);
                    }
                    pass.add(p);
                }
                Err((err, entries)) => {
                    // Its entries are pending with this consumer: read them again
                    // (from 0) on the next visit rather than waiting for a takeover.
                    self.started[shard as usize].store(false, Ordering::Release);
                    if transient(&err) {
                        self.read_done(shard, at, None);
                        failed.get_or_insert(err);
                    } else {
                        // The shard's own state refused (its statistics damaged, ...):
                        // it stalls alone, its entries stay unacknowledged, and the
                        // other shards' results stand.
                        self.read_done(shard, at, Some(0));
                        pass.stalled += entries;
                        stalls.push((shard, stall_reason(&err)));
                    }
                }
            }
        }
        self.archived
            .fetch_add(pass.archived as u64, Ordering::Relaxed);
        self.written_since
            .fetch_add(pass.archived as u64, Ordering::Relaxed);
        self.note_stalls(&stalls, &resumed).await?;
        match failed {
            Some(err) => Err(err),
            None => Ok(pass),
        }
    }

    /// Reads up to `batch` entries of `shard`: with `takeover`, a dead archiver's
    /// (idle that long) first; then, on the first visit, this consumer's own pending
    /// ones; then new ones.
    pub(super) async fn read(
        &self,
        shard: u32,
        takeover: Option<Duration>,
        pass: &mut ArchivePass,
    ) -> Result<Vec<StreamId>> {
        let first = self.ensure_group(shard).await?;
        let inbox = &self.keys[shard as usize].inbox;
        let consumer = &self.config.consumer;
        let mut want = self.config.batch;
        let mut out = Vec::new();
        if let Some(idle) = takeover {
            out = self.take_over(shard, idle, pass).await?;
            want -= out.len().min(want);
        }
        for from in [first.then_some("0"), Some(">")].into_iter().flatten() {
            if want == 0 {
                break;
            }
            let reply: Option<StreamReadReply> = retry(&self.conn, |mut c| async move {
                redis::cmd("XREADGROUP")
                    .arg("GROUP")
                    .arg(GROUP)
                    .arg(consumer)
                    .arg("COUNT")
                    .arg(want)
                    .arg("STREAMS")
                    .arg(inbox)
                    .arg(from)
                    .query_async(&mut c)
                    .await
            })
            .await?;
            let ids: Vec<StreamId> = reply
                .into_iter()
                .flat_map(|r| r.keys)
                .flat_map(|k| k.ids)
                .filter(|id| !out.iter().any(|o| o.id == id.id))
                .collect();
            want -= ids.len().min(want);
            out.extend(ids);
        }
        if first {
            self.started[shard as usize].store(true, Ordering::Release);
        }
        Ok(out)
    }

    /// Takes out of `items` every record whose completed-index bit is clear (or whose
    /// bit offset is past a Redis bitmap, which the write would refuse anyway) and
    /// returns those as dead letters with the reason. One read of the bitmap's bytes
    /// around them for the pass.
    async fn unconfirmed<'a>(
        &self,
        shard: u32,
        items: &mut Vec<Item<'a>>,
    ) -> Result<Vec<(Item<'a>, String)>> {
        let mut dead = Vec::new();
        let in_range: Vec<u64> = items
            .iter()
            .map(|i| self.schema.bit_offset(i.record.pid))
            .filter(|&o| o <= MAX_BIT_OFFSET)
            .collect();
        if in_range.is_empty() {
            return Ok(dead);
        }
        let key = &self.keys[shard as usize].index;
        let mut bits = bits::read_bits(&self.conn, key, &in_range)
            .await?
            .into_iter();
        let mut kept = Vec::with_capacity(items.len());
        for item in items.drain(..) {
            if self.schema.bit_offset(item.record.pid) > MAX_BIT_OFFSET {
                // Left to the write path, which sets it aside with its own reason.
                kept.push(item);
            } else if bits.next() == Some(true) {
                kept.push(item);
            } else {
                dead.push((
                    item,
                    "never completed here (its completed-index bit is clear): forged, or from another namespace"
                        .to_owned(),
                ));
            }
        }
        *items = kept;
        Ok(dead)
    }

    /// Archives what a read of `shard` finds; a failure comes with the count of
    /// entries read (left unacknowledged).
    pub(super) async fn archive_shard(
        &self,
        shard: u32,
        tier: Tier,
        takeover: Option<Duration>,
    ) -> std::result::Result<ArchivePass, (Error, usize)> {
        let mut pass = ArchivePass::default();
        let raw = self
            .read(shard, takeover, &mut pass)
            .await
            .map_err(|e| (e, 0))?;
        if raw.is_empty() {
            return Ok(pass);
        }
        let entries = raw.len();
        pass.entries = entries;
        self.archive_entries(shard, raw, tier, pass)
            .await
            .map_err(|e| (e, entries))
    }

    /// Archives the entries `raw` of `shard` and acknowledges them.
    async fn archive_entries(
        &self,
        shard: u32,
        raw: Vec<StreamId>,
        tier: Tier,
        mut pass: ArchivePass,
    ) -> Result<ArchivePass> {
        let mut ids = Vec::with_capacity(raw.len());
        let mut texts = Vec::with_capacity(raw.len());
        for mut entry in raw {
            let text = entry
                .map
                .remove("r")
                .and_then(|v| String::from_redis_value(v).ok());
            if text.is_none() {
                pass.malformed += 1;
                tracing::warn!(entry = %entry.id, "inbox entry without field r dropped");
            }
            texts.push(text.unwrap_or_default());
            ids.push(entry.id);
        }
        // A pid twice in one pass is a duplicate completion: keep the first.
        let mut seen = HashSet::new();
        let mut items = Vec::new();
        for (text, id) in texts.iter().zip(&ids) {
            for line in text.lines().filter(|l| !l.is_empty()) {
                match decode_json(line) {
                    // A record of another shard would land on this shard's bit offsets,
                    // where another pid lives: drop it loudly rather than corrupt both.
                    Ok(r) if self.schema.shard_of(r.pid) != shard => {
                        pass.malformed += 1;
                        tracing::warn!(
                            pid = r.pid,
                            shard,
                            "record in another shard's inbox dropped"
                        );
                    }
                    Ok(record) if seen.insert(record.pid) => items.push(Item {
                        record,
                        json: Some(line),
                    }),
                    Ok(_) => pass.duplicates += 1,
                    Err(err) => {
                        pass.malformed += 1;
                        tracing::warn!(%err, entry = %id, line, "undecodable inbox line dropped");
                    }
                }
            }
        }
        // A completion sets its pid's completed-index bit in the same script that adds
        // it to the inbox, so a line whose bit is clear was never completed here: forged,
        // or from another namespace. It must not be archived or counted (one forged pid
        // could grow a bitmap to hundreds of MB and the statistics past the plan).
        let mut dead = self.unconfirmed(shard, &mut items).await?;
        // In pid order a batch's records are adjacent: chunks cut at batch boundaries,
        // and a batch complete in one chunk is sealed from a slice, without a copy.
        items.sort_unstable_by_key(|i| i.record.pid);
        let chunks = chunks_by_batch(items, MAX_SCRIPT_RECORDS, |p| self.schema.batch_of(p));
        // The chunks hold distinct pids (and, but for batches larger than a chunk,
        // distinct batches), so their calls go out together, pipelined on the one
        // connection: the client prepares the next call while Redis runs this one.
        let written = try_join_all(
            chunks
                .into_iter()
                .map(|c| self.write_or_set_aside(shard, c, tier)),
        )
        .await?;
        for (n, dups, refused) in written {
            pass.archived += n;
            pass.duplicates += dups;
            dead.extend(refused);
        }
        if !dead.is_empty() {
            pass.dead_lettered += dead.len();
            self.dead_letter(shard, &dead).await?;
        }
        // Only now, with every record stored and counted, let the entries go. A crash
        // before this line leaves them pending; whoever takes them over finds their bits
        // set and writes nothing twice.
        let inbox = &self.keys[shard as usize].inbox;
        retry(&self.conn, |mut c| {
            let mut pipe = redis::pipe();
            pipe.cmd("XACK").arg(inbox).arg(GROUP).arg(&ids).ignore();
            pipe.cmd("XDEL").arg(inbox).arg(&ids).ignore();
            async move { pipe.query_async::<()>(&mut c).await }
        })
        .await?;
        Ok(pass)
    }

    /// [`write`](Self::write), but a record that can never be archived does not stall
    /// the shard: when the script refuses a call for its data (not for a connection
    /// failure), its records are written one by one, and each one refused alone for
    /// itself is returned with the reason, for the dead-letter stream; one refused for
    /// the shard's state fails the pass, as before, until the shard is repaired. A record whose bit offset
    /// is past what a Redis bitmap holds is set aside before any call. Returns the
    /// records written, the duplicates dropped and the records set aside.
    pub(super) async fn write_or_set_aside<'a>(
        &self,
        shard: u32,
        items: Vec<Item<'a>>,
        tier: Tier,
    ) -> Result<(usize, usize, Vec<(Item<'a>, String)>)> {
        let (items, mut aside): (Vec<_>, Vec<_>) = items
            .into_iter()
            .partition(|i| self.schema.bit_offset(i.record.pid) <= MAX_BIT_OFFSET);
        let mut aside: Vec<(Item<'a>, String)> = aside
            .drain(..)
            .map(|i| {
                let reason = format!(
                    "pid {}: its bit offset {} is past the 2^32 bits of a Redis bitmap",
                    i.record.pid,
                    self.schema.bit_offset(i.record.pid)
                );
                (i, reason)
            })
            .collect();
        let err = match self.write(shard, items.clone(), tier).await {
            Ok((n, dups)) => return Ok((n, dups, aside)),
            Err(Error::Redis(err)) if refused(&err) => err,
            Err(err) => return Err(err),
        };
        tracing::warn!(shard, %err, records = items.len(), "archive call refused; writing its records one by one");
        let (mut written, mut dups) = (0, 0);
        for item in items {
            match self.write(shard, vec![item.clone()], tier).await {
                Ok((n, d)) => {
                    written += n;
                    dups += d;
                }
                Err(Error::Redis(err)) if refused(&err) && poison(&err) => {
                    aside.push((item, err.to_string()))
                }
                // The shard, not the record (a counter at the guard, a corrupt packed
                // value): the pass fails and its entries wait for a repair.
                Err(err) => return Err(err),
            }
        }
        Ok((written, dups, aside))
    }

    /// Moves records that can never be archived to the shard's dead-letter stream
    /// (`{ns:s}:dead`, the last 10,000 kept): the JSON line and the reason, for an
    /// operator. Their inbox entries are then acknowledged with the others.
    pub(super) async fn dead_letter(&self, shard: u32, dead: &[(Item<'_>, String)]) -> Result<()> {
        let key = self.schema.shard_key(shard, "dead");
        for (item, reason) in dead {
            tracing::warn!(pid = item.record.pid, shard, %reason, "record moved to the dead-letter stream");
        }
        retry(&self.conn, |mut c| {
            let mut pipe = redis::pipe();
            for (item, reason) in dead {
                pipe.cmd("XADD")
                    .arg(&key)
                    .arg("MAXLEN")
                    .arg("~")
                    .arg(10_000)
                    .arg("*")
                    .arg("r")
                    .arg(item.json().as_ref())
                    .arg("reason")
                    .arg(reason)
                    .ignore();
            }
            async move { pipe.query_async::<()>(&mut c).await }
        })
        .await?;
        Ok(())
    }
}

#[async_trait]
impl<C> Archiver for RedisArchive<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn archive_once(&self) -> Result<ArchivePass> {
        self.archive_taking_over(self.config.claim_idle).await
    }

    async fn archive_taking_over(&self, idle: Duration) -> Result<ArchivePass> {
        // Learn the stalls other archivers recorded, so a success here clears them, and
        // the namespace's format, as an upgrade may have raised it since the last sweep
        // (both reads at once, on the multiplexed connection).
        futures_util::future::try_join(self.read_stalls(), self.format()).await?;
        let archived = self.count_archived().await?;
        let tier = self.config.tier_for(archived);
        // Shards are independent (own keys, own slot, on a cluster often their own
        // node): all of them are archived at once, their calls pipelined.
        let shards: Vec<u32> = self.schema.shards().collect();
        self.archive_shards(&shards, tier, Some(idle)).await
    }

    async fn archive_woken(&self) -> Result<ArchivePass> {
        let marked = self.pop_dirty().await?;
        let shards = self.ripe(&marked, Instant::now());
        if shards.is_empty() {
            return Ok(ArchivePass::default());
        }
        let archived = if self.recount_due(Instant::now()) {
            self.count_archived().await?
        } else {
            self.archived.load(Ordering::Relaxed)
        };
        self.archive_shards(&shards, self.config.tier_for(archived), None)
            .await
    }

    fn idle_wait(&self) -> Duration {
        self.config.block
    }

    async fn redrive_dead_letters(
        &self,
        planned: &[RangeInclusive<u64>],
    ) -> Result<crate::model::Redrive> {
        self.redrive(planned).await
    }

    async fn repair_stats(&self, shard: u32) -> Result<Repaired> {
        self.repair_shard_stats(shard).await
    }

    async fn repair_damage(&self, damage: &ArchiveDamage) -> Result<Option<u64>> {
        self.repair_one(damage).await
    }

    async fn scrub(&self) -> Result<Vec<ArchiveDamage>> {
        self.scrub_slice().await
    }

    async fn note_damage(&self, found: &[ArchiveDamage]) -> Result<()> {
        self.replace_damage(found).await
    }
}
