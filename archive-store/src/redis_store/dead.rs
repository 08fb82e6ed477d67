//! Re-driving the dead-letter streams (`tranche check --repair`): each record set aside
//! is validated again; what is archivable now goes through the ordinary write path,
//! duplicates are dropped, the rest stays with the reason it still fails.

use std::collections::HashMap;

use redis::streams::StreamRangeReply;

use super::*;
use crate::model::{DeadLetter, Redrive};

/// Dead-letter entries read per XRANGE call.
const PAGE: usize = 1000;

/// One dead letter as read: its stream id and the record's line as kept.
struct Letter {
    id: String,
    line: String,
}

impl<C> RedisArchive<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Every entry of `shard`'s dead-letter stream, oldest first, page by page.
    async fn read_dead(&self, shard: u32) -> Result<Vec<Letter>> {
        let key = self.schema.shard_key(shard, "dead");
        let mut out: Vec<Letter> = Vec::new();
        let mut from = "-".to_owned();
        loop {
            let reply: StreamRangeReply = retry(&self.conn, |mut c| {
                let (key, from) = (key.clone(), from.clone());
                async move {
                    redis::cmd("XRANGE")
                        .arg(key)
                        .arg(from)
                        .arg("+")
                        .arg("COUNT")
                        .arg(PAGE)
                        .query_async(&mut c)
                        .await
                }
            })
            .await?;
            let n = reply.ids.len();
            for entry in reply.ids {
                let field = |name: &str| {
                    entry
                        .map
                        .get(name)
                        .and_then(|v| String::from_redis_value(v.clone()).ok())
                        .unwrap_or_default()
                };
                out.push(Letter {
                    line: field("r"),
                    id: entry.id.clone(),
                });
            }
            match out.last() {
                Some(last) if n == PAGE => from = format!("({}", last.id),
                _ => return Ok(out),
            }
        }
    }

    /// The bits of `pids` in the bitmap `key` (their offsets all within a bitmap), in
    /// one round trip.
    async fn bits(&self, key: &str, pids: &[u64]) -> Result<Vec<bool>> {
        let offsets: Vec<u64> = pids.iter().map(|&p| self.schema.bit_offset(p)).collect();
        bits::read_bits(&self.conn, key, &offsets).await
    }

    /// Re-drives `shard`'s dead letters into `out`.
    async fn redrive_shard(
        &self,
        shard: u32,
        tier: Tier,
        planned: &[RangeInclusive<u64>],
        out: &mut Redrive,
    ) -> Result<()> {
        let letters = self.read_dead(shard).await?;
        if letters.is_empty() {
            return Ok(());
        }
        out.found += letters.len();
        // Stream ids to delete: records archived now, or archived already.
        let mut gone: Vec<&str> = Vec::new();
        let mut candidates: Vec<(&Letter, CompletedRecord)> = Vec::new();
        for letter in &letters {
            let record = match decode_json(&letter.line) {
                Ok(record) => record,
                Err(err) => {
                    keep(out, shard, letter, format!("undecodable: {err}"));
                    continue;
                }
            };
            let pid = record.pid;
            let offset = self.schema.bit_offset(pid);
            if self.schema.shard_of(pid) != shard {
                keep(
                    out,
                    shard,
                    letter,
                    format!("pid {pid} belongs to another shard"),
                );
            } else if offset > MAX_BIT_OFFSET {
                let reason = format!(
                    "pid {pid}: its bit offset {offset} is past the 2^32 bits of a Redis bitmap"
                );
                keep(out, shard, letter, reason);
            } else if !planned.iter().any(|r| r.contains(&pid)) {
                keep(out, shard, letter, format!("pid {pid} is in no plan"));
            } else {
                candidates.push((letter, record));
            }
        }
        // A pid may be in the stream more than once (a poisoned copy and a good one): each
        // round takes one letter per pid, and a later letter of a pid archived meanwhile
        // finds its bit set and is dropped as a duplicate.
        let mut refused = Vec::new();
        while !candidates.is_empty() {
            let mut seen = HashSet::new();
            let (round, rest): (Vec<_>, Vec<_>) = candidates
                .into_iter()
                .partition(|(_, r)| seen.insert(r.pid));
            candidates = rest;
            self.redrive_round(shard, tier, round, out, &mut gone, &mut refused)
                .await?;
        }
        // A letter refused in one round whose pid a later round archived is a duplicate
        // now, like one found archived from the start.
        let pids: Vec<u64> = refused.iter().map(|(_, pid, _)| *pid).collect();
        let archived = self
            .bits(&self.keys[shard as usize].archived, &pids)
            .await?;
        for ((letter, _, reason), archived) in refused.into_iter().zip(archived) {
            if archived {
                out.duplicates += 1;
                gone.push(&letter.id);
            } else {
                keep(out, shard, letter, reason);
            }
        }
        if !gone.is_empty() {
            let key = self.schema.shard_key(shard, "dead");
            retry(&self.conn, |mut c| {
                let mut cmd = redis::cmd("XDEL");
                cmd.arg(&key).arg(&gone);
                async move { cmd.query_async::<u64>(&mut c).await }
            })
            .await?;
        }
        Ok(())
    }

    /// Checks and writes `round` (letters of distinct pids): the ids of those archived
    /// now or before go to `gone`, those the archive script refused to `refused` with
    /// their pid and reason, the others to `out.kept` with the reason.
    async fn redrive_round<'a>(
        &self,
        shard: u32,
        tier: Tier,
        round: Vec<(&'a Letter, CompletedRecord)>,
        out: &mut Redrive,
        gone: &mut Vec<&'a str>,
        refused: &mut Vec<(&'a Letter, u64, String)>,
    ) -> Result<()> {
        let pids: Vec<u64> = round.iter().map(|(_, r)| r.pid).collect();
        let keys = &self.keys[shard as usize];
        let archived = self.bits(&keys.archived, &pids).await?;
        let completed = self.bits(&keys.index, &pids).await?;
        let mut items: Vec<Item<'a>> = Vec::new();
        let mut by_pid: HashMap<u64, &'a Letter> = HashMap::new();
        for (((letter, record), archived), completed) in
            round.into_iter().zip(archived).zip(completed)
        {
            if archived {
                out.duplicates += 1;
                gone.push(&letter.id);
            } else if !completed {
                let reason = "never completed here (its completed-index bit is clear): forged, or from another namespace";
                keep(out, shard, letter, reason.to_owned());
            } else {
                by_pid.insert(record.pid, letter);
                items.push(Item {
                    record,
                    json: Some(&letter.line),
                });
            }
        }
        // Through the ordinary write path: the archive script checks the archived bit
        // first, so a record some archiver wrote meanwhile comes back a duplicate. A
        // crash after the write and before the caller's XDEL leaves the letter, which the
        // next repair finds archived and drops: counted once either way.
        items.sort_unstable_by_key(|i| i.record.pid);
        for chunk in chunks_by_batch(items, MAX_SCRIPT_RECORDS, |p| self.schema.batch_of(p)) {
            let pids: Vec<u64> = chunk.iter().map(|i| i.record.pid).collect();
            let (written, dups, aside) = self.write_or_set_aside(shard, chunk, tier).await?;
            out.archived += written;
            out.duplicates += dups;
            self.archived.fetch_add(written as u64, Ordering::Relaxed);
            let refused_pids: HashSet<u64> = aside.iter().map(|(i, _)| i.record.pid).collect();
            for (item, reason) in aside {
                let pid = item.record.pid;
                refused.push((by_pid[&pid], pid, reason));
            }
            gone.extend(
                pids.iter()
                    .filter(|p| !refused_pids.contains(p))
                    .map(|p| by_pid[p].id.as_str()),
            );
        }
        Ok(())
    }

    /// Re-drives every shard's dead letters, one shard after the other (they are few).
    pub(super) async fn redrive(&self, planned: &[RangeInclusive<u64>]) -> Result<Redrive> {
        let archived = self.count_archived().await?;
        let tier = self.config.tier_for(archived);
        let mut out = Redrive::default();
        for shard in self.schema.shards() {
            self.redrive_shard(shard, tier, planned, &mut out).await?;
        }
        Ok(out)
    }
}

/// Notes `letter` of `shard` as kept in the stream, with the reason it is still refused.
fn keep(out: &mut Redrive, shard: u32, letter: &Letter, reason: String) {
    out.kept.push(DeadLetter {
        shard,
        id: letter.id.clone(),
        record: letter.line.clone(),
        reason,
    });
}
