//! Damaged archived values on Redis: recorded where `health` reads them
//! (`{ns}:archive:damaged`), found a slice at a time by the scrub, and set aside by a
//! repair in the shard's quarantine (`quarantine.lua`), their records still counted.

use super::*;

/// Batches a scrub verifies per call (one pipelined read each).
const SCRUB_BATCHES: usize = 256;

impl<C> RedisArchive<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// `{ns:s}:archive:quarantine`.
    fn quarantine_key(&self, shard: u32) -> String {
        self.schema.shard_key(shard, "archive:quarantine")
    }

    /// Records `found` in `{ns}:archive:damaged` (a value already there keeps its
    /// first sighting); returns how many were not there yet.
    pub(super) async fn record_damage(&self, found: &[ArchiveDamage]) -> Result<usize> {
        if found.is_empty() {
            return Ok(0);
        }
        let key = &self.damaged_key;
        let now = self.clock.now_ms();
        retry(&self.conn, |mut c| {
            let mut pipe = redis::pipe();
            for d in found {
                pipe.cmd("HSETNX").arg(key).arg(d.location()).arg(format!(
                    "{now} {} {} {} {}",
                    d.shard,
                    d.batch,
                    d.field.as_deref().unwrap_or("-"),
                    d.detail
                ));
            }
            async move { pipe.query_async::<Vec<i64>>(&mut c).await }
        })
        .await
        .map(|new| new.iter().filter(|&&n| n == 1).count())
        .map_err(Error::from)
    }

    /// Every damaged value recorded, in key order.
    pub(super) async fn read_damage(&self) -> Result<Vec<ArchiveDamage>> {
        let key = &self.damaged_key;
        let all: Vec<(String, String)> = retry(&self.conn, |mut c| async move {
            redis::cmd("HGETALL").arg(key).query_async(&mut c).await
        })
        .await?;
        let mut out = Vec::with_capacity(all.len());
        for (location, value) in all {
            let mut parts = value.splitn(5, ' ');
            let (_since, shard, batch, field, detail) = (
                parts.next(),
                parts.next().and_then(|s| s.parse().ok()),
                parts.next().and_then(|b| b.parse().ok()),
                parts.next(),
                parts.next(),
            );
            let (Some(shard), Some(batch), Some(field), Some(detail)) =
                (shard, batch, field, detail)
            else {
                return Err(Error::Corrupt {
                    key: format!("{key} {location}"),
                    detail: format!("not `since_ms shard batch field detail`: {value:?}"),
                });
            };
            let (key, field) = match field {
                "-" => (location, None),
                f => (
                    location
                        .strip_suffix(&format!(" {f}"))
                        .unwrap_or(&location)
                        .to_owned(),
                    Some(f.to_owned()),
                ),
            };
            out.push(ArchiveDamage {
                shard,
                key,
                field,
                batch,
                detail: detail.to_owned(),
            });
        }
        out.sort_by(|a, b| (a.shard, &a.key, &a.field).cmp(&(b.shard, &b.key, &b.field)));
        Ok(out)
    }

    /// Records set aside as lost, over every shard (`lost` of each counters hash).
    pub(super) async fn lost_count(&self) -> Result<u64> {
        let counts = try_join_all(self.keys.iter().map(|k| {
            retry(&self.conn, move |mut c| async move {
                redis::cmd("HGET")
                    .arg(&k.counters)
                    .arg("lost")
                    .query_async::<Option<u64>>(&mut c)
                    .await
            })
        }))
        .await?;
        Ok(counts.into_iter().flatten().sum())
    }

    /// Where `pid`'s record was set aside, if a repair did: its quarantine key and
    /// field (the pid's own, or its batch's).
    pub(super) async fn quarantined(&self, pid: u64) -> Result<Option<String>> {
        let key = self.quarantine_key(self.schema.shard_of(pid));
        let fields = [
            pid.to_string(),
            format!("batch:{}", self.schema.batch_of(pid)),
        ];
        let there: Vec<bool> = {
            let (key, fields) = (&key, &fields);
            retry(&self.conn, |mut c| async move {
                let mut pipe = redis::pipe();
                for f in fields {
                    pipe.cmd("HEXISTS").arg(key).arg(f);
                }
                pipe.query_async(&mut c).await
            })
            .await?
        };
        Ok(fields
            .iter()
            .zip(there)
            .find(|(_, t)| *t)
            .map(|(f, _)| format!("{key} {f}")))
    }

    pub(super) async fn repair_one(&self, d: &ArchiveDamage) -> Result<Option<u64>> {
        if d.shard >= self.schema.num_shards() || self.schema.shard_of_batch(d.batch) != d.shard {
            return Err(Error::InvalidArgument(format!(
                "no batch {} on shard {} of this namespace",
                d.batch, d.shard
            )));
        }
        let keys = &self.keys[d.shard as usize];
        let open_key = open_batch_key(&self.schema, d.batch);
        let sealed_key = self.schema.completed_batch(d.batch);
        let (qfield, open_id) = if d.key == keys.completed && d.field.is_some() {
            (d.field.clone().unwrap_or_default(), String::new())
        } else if d.key == open_key && d.field.is_some() {
            (d.field.clone().unwrap_or_default(), d.batch.to_string())
        } else if d.key == sealed_key && d.field.is_none() {
            (format!("batch:{}", d.batch), String::new())
        } else {
            // A segment holds other batches whole: not rewritten here.
            return Ok(None);
        };
        // What is there now, and whether it still does not decode.
        let (held, damage) = self.batch_read(d.batch, &mut None).await?;
        if !damage.iter().any(|x| x.key == d.key && x.field == d.field) {
            return Ok(Some(0));
        }
        let lost = match &d.field {
            Some(_) => 1,
            None => {
                // Every archived pid of the batch neither readable elsewhere (its
                // simple or open records) nor damaged on its own.
                let readable = held.map_or(0, |b| b.records.len() as u64);
                let single = damage.iter().filter(|x| x.field.is_some()).count() as u64;
                self.batch_bits(d.batch)
                    .await?
                    .saturating_sub(readable + single)
            }
        };
        let raw: Option<Vec<u8>> = {
            let (key, field) = (&d.key, &d.field);
            retry(&self.conn, |mut c| async move {
                match field {
                    Some(f) => redis::cmd("HGET").arg(key).arg(f).query_async(&mut c).await,
                    None => redis::cmd("GET").arg(key).query_async(&mut c).await,
                }
            })
            .await?
        };
        let Some(raw) = raw else {
            return Ok(Some(0));
        };
        let quarantine = self.quarantine_key(d.shard);
        let mut inv = QUARANTINE.prepare_invoke();
        inv.key(&d.key)
            .key(&quarantine)
            .key(&keys.counters)
            .key(&keys.open)
            .arg(d.field.as_deref().unwrap_or(""))
            .arg(&raw)
            .arg(&qfield)
            .arg(lost)
            .arg(self.clock.now_ms())
            .arg(&open_id);
        let done: i64 = retry(&self.conn, |mut c| {
            let inv = &inv;
            async move { inv.invoke_async(&mut c).await }
        })
        .await?;
        if done == 0 {
            return Ok(Some(0));
        }
        tracing::warn!(key = %d.key, field = ?d.field, lost, %quarantine, "damaged archived value set aside");
        let location = d.location();
        let (damaged, location) = (&self.damaged_key, &location);
        let _: i64 = retry(&self.conn, |mut c| async move {
            redis::cmd("HDEL")
                .arg(damaged)
                .arg(location)
                .query_async(&mut c)
                .await
        })
        .await?;
        Ok(Some(lost))
    }

    /// How many pids of `batch` are archived (its bits of the shard's bitmap).
    async fn batch_bits(&self, batch: u64) -> Result<u64> {
        let shard = self.schema.shard_of_batch(batch);
        let size = self.schema.batch_size();
        let first_bit = self.schema.bit_offset(batch * size);
        let key = &self.keys[shard as usize].archived;
        let bytes: Vec<u8> = retry(&self.conn, |mut c| async move {
            redis::cmd("GETRANGE")
                .arg(key)
                .arg(first_bit / 8)
                .arg((first_bit + size - 1) / 8)
                .query_async(&mut c)
                .await
        })
        .await?;
        let base = first_bit / 8 * 8;
        Ok((first_bit..first_bit + size)
            .filter(|&bit| {
                bytes
                    .get(((bit - base) / 8) as usize)
                    .is_some_and(|b| b & (0x80 >> ((bit - base) % 8)) != 0)
            })
            .count() as u64)
    }

    /// The scrub: the next [`SCRUB_BATCHES`] archived batches from where the last call
    /// stopped, round the shards.
    pub(super) async fn scrub_slice(&self) -> Result<Vec<ArchiveDamage>> {
        let (mut shard, mut from) = *self.scrub_at.lock().unwrap_or_else(|p| p.into_inner());
        if shard >= self.schema.num_shards() {
            (shard, from) = (0, 0);
        }
        let mut budget = SCRUB_BATCHES;
        let mut found = Vec::new();
        let mut visited = 0;
        while budget > 0 && visited < self.schema.num_shards() {
            let batches: Vec<u64> = self
                .shard_batches(shard)
                .await?
                .into_iter()
                .filter(|&b| b >= from)
                .take(budget)
                .collect();
            let mut segment = None;
            for &b in &batches {
                let (_, damage) = self.batch_read(b, &mut segment).await?;
                for d in damage {
                    if !found
                        .iter()
                        .any(|o: &ArchiveDamage| o.key == d.key && o.field == d.field)
                    {
                        found.push(d);
                    }
                }
            }
            budget -= batches.len();
            if budget > 0 {
                // The shard is done: the next one, from its start.
                shard = (shard + 1) % self.schema.num_shards();
                from = 0;
                visited += 1;
            } else {
                from = batches.last().map_or(0, |b| b + 1);
            }
        }
        *self.scrub_at.lock().unwrap_or_else(|p| p.into_inner()) = (shard, from);
        self.record_damage(&found).await?;
        Ok(found)
    }

    /// Replaces the damage recorded with `found`.
    pub(super) async fn replace_damage(&self, found: &[ArchiveDamage]) -> Result<()> {
        let key = &self.damaged_key;
        let _: i64 = retry(&self.conn, |mut c| async move {
            redis::cmd("DEL").arg(key).query_async(&mut c).await
        })
        .await?;
        self.record_damage(found).await.map(drop)
    }
}
