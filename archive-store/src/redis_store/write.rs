//! The write path: records cut into calls at batch boundaries, each call one
//! `archive.lua` script (exactly once by the archived bitmap, statistics in the same
//! step), with the batches it fills whole sealed before it and their segments joined
//! right behind it.

use super::*;

/// One record on its way into the archive, with the JSON line it arrived as (when it
/// came from the inbox): the simple tier and open batches store that line as it is,
/// without encoding the record again. The active store writes every inbox line with
/// codec's `encode_json`, so the stored JSON is the seed's shape either way.
#[derive(Clone)]
pub(super) struct Item<'a> {
    pub(super) record: CompletedRecord,
    pub(super) json: Option<&'a str>,
}

impl Item<'_> {
    pub(super) fn json(&self) -> std::borrow::Cow<'_, str> {
        match self.json {
            Some(line) => line.into(),
            None => encode_json(&self.record).into(),
        }
    }
}

/// Cuts `items` (sorted by pid) into runs of at most `max`, each cut at a batch
/// boundary where one lies within the run, so a batch is in one call whenever it fits.
pub(super) fn chunks_by_batch<'a>(
    mut items: Vec<Item<'a>>,
    max: usize,
    batch_of: impl Fn(u64) -> u64,
) -> Vec<Vec<Item<'a>>> {
    let mut out = Vec::with_capacity(items.len() / max + 1);
    while items.len() > max {
        let last = batch_of(items[max].record.pid);
        let cut = items[..max]
            .iter()
            .rposition(|i| batch_of(i.record.pid) != last)
            .map_or(max, |p| p + 1);
        let rest = items.split_off(cut);
        out.push(std::mem::replace(&mut items, rest));
    }
    if !items.is_empty() {
        out.push(items);
    }
    out
}

impl<C> RedisArchive<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Writes `items` (distinct pids of `shard`, at most [`MAX_SCRIPT_RECORDS`]) with
    /// the archive script, dropping those archived already and calling again until the
    /// call goes through. Returns the records written and the duplicates dropped.
    pub(super) async fn write(
        &self,
        shard: u32,
        mut items: Vec<Item<'_>>,
        tier: Tier,
    ) -> Result<(usize, usize)> {
        let keys = &self.keys[shard as usize];
        if !items.is_sorted_by_key(|i| i.record.pid) {
            items.sort_unstable_by_key(|i| i.record.pid);
        }
        let mut dups = 0;
        loop {
            if items.is_empty() {
                return Ok((0, dups));
            }
            // Per batch (a run of adjacent items): whether this call holds every planned
            // pid of it, so that it goes straight to its sealed form. Such a run's pids,
            // and so its bits, are contiguous: the script takes its first bit and count.
            let runs = self.batch_runs(&items);
            let full: Vec<bool> = runs
                .iter()
                .map(|&(b, ref r)| {
                    let run = &items[r.clone()];
                    tier != Tier::Simple
                        && run[run.len() - 1].record.pid - run[0].record.pid + 1 == run.len() as u64
                        && run
                            .iter()
                            .filter(|i| i.record.pid >= self.config.first_pid)
                            .count() as u64
                            == self.planned(b)
                })
                .collect();
            let sealed = self.seal_runs(&items, &runs, &full).await?;
            let mut inv = ARCHIVE.prepare_invoke();
            inv.key(&keys.archived)
                .key(&keys.completed)
                .key(&keys.counters);
            for k in &keys.stats {
                inv.key(k);
            }
            inv.key(&keys.open);
            // The script numbers records as it receives them: the ones sent one by one,
            // then the sealed batches'. `order` maps its numbers back to `items`.
            let mut order: Vec<usize> = Vec::with_capacity(items.len());
            let mut open: Vec<u64> = Vec::new();
            let mut delta = StatsDelta::default();
            for item in &items {
                delta.add(&item.record);
            }
            let one_by_one: usize = runs
                .iter()
                .zip(&full)
                .filter(|(_, f)| !**f)
                .map(|((_, r), _)| r.len())
                .sum();
            inv.arg(one_by_one);
            for (&(batch, ref range), _) in runs.iter().zip(&full).filter(|(_, f)| !**f) {
                let target: i64 = if tier == Tier::Simple {
                    0
                } else {
                    open.push(batch);
                    open.len() as i64
                };
                for (i, item) in items[range.clone()].iter().enumerate() {
                    let r = &item.record;
                    order.push(range.start + i);
                    inv.arg(r.pid)
                        .arg(self.schema.bit_offset(r.pid))
                        .arg(item.json().as_ref())
                        .arg(target);
                }
            }
            inv.arg(open.len());
            for &b in &open {
                inv.key(open_batch_key(&self.schema, b));
                inv.arg(b);
            }
            inv.arg(sealed.len());
            for (b, bytes) in &sealed {
                inv.key(self.schema.completed_batch(*b));
                inv.arg(bytes.as_slice());
            }
            inv.arg(self.ttl_ms(tier));
            for ((_, range), _) in runs.iter().zip(&full).filter(|(_, f)| **f) {
                order.extend(range.clone());
                inv.arg(self.schema.bit_offset(items[range.start].record.pid))
                    .arg(range.len());
            }
            for a in delta_args(&delta, self.clock.now_ms()) {
                inv.arg(a);
            }
            // The statistics' ranges layout: packed bodies from format 3 on.
            if self.write_format().await? >= crate::ArchiveFormat::V3 {
                inv.arg(2);
            }
            // The batches this call seals whole may complete their segments: their joins
            // are queued right behind the call on the same connection (one slot, so one
            // node), which runs them after it, in the same round trip. A join re-checks
            // everything, so one that runs on a refused call, or ahead of a call resent
            // after NOSCRIPT, does nothing; compaction joins what it left.
            let sealing: Vec<u64> = runs
                .iter()
                .zip(&full)
                .filter(|(_, f)| **f)
                .map(|((b, _), _)| *b)
                .collect();
            let call = retry(&self.conn, |mut c| {
                let inv = &inv;
                async move { inv.invoke_async(&mut c).await }
            });
            let (reply, joined) =
                futures_util::future::join(call, self.join_segments(sealing)).await;
            let reply: Vec<i64> = reply?;
            joined?;
            match reply.split_first() {
                Some((1, rest)) => {
                    let n = rest.first().copied().unwrap_or(0) as usize;
                    // The batches this call filled and `seal` sealed whole, whose
                    // segments may now be complete.
                    let mut whole = Vec::new();
                    // Seal the batches this call filled. A crash here leaves them open
                    // (readable, and sealed by the next compaction).
                    for (&batch, &len) in open.iter().zip(rest.iter().skip(1)) {
                        if len as u64 >= self.planned(batch)
                            && self.seal(batch, tier).await? == Sealing::Full
                        {
                            whole.push(batch);
                        }
                    }
                    // A crash before the join leaves the batches in their own keys
                    // (readable, and joined by the next compaction).
                    self.join_segments(whole).await?;
                    return Ok((n, dups));
                }
                Some((0, taken)) => {
                    let taken: HashSet<usize> = taken
                        .iter()
                        .filter_map(|&i| order.get((i as usize).wrapping_sub(1)).copied())
                        .collect();
                    dups += taken.len();
                    items = items
                        .into_iter()
                        .enumerate()
                        .filter(|(i, _)| !taken.contains(i))
                        .map(|(_, r)| r)
                        .collect();
                }
                _ => {
                    return Err(Error::Corrupt {
                        key: keys.archived.clone(),
                        detail: format!("unexpected archive reply {reply:?}"),
                    });
                }
            }
        }
    }

    /// The runs of `items` (sorted by pid) that share a batch: batch id and index range.
    pub(super) fn batch_runs(&self, items: &[Item<'_>]) -> Vec<(u64, std::ops::Range<usize>)> {
        let mut runs: Vec<(u64, std::ops::Range<usize>)> = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let b = self.schema.batch_of(item.record.pid);
            match runs.last_mut() {
                Some((last, r)) if *last == b => r.end = i + 1,
                _ => runs.push((b, i..i + 1)),
            }
        }
        runs
    }

    /// The TTL of sealed batches in `tier`, in ms (0: none).
    pub(super) fn ttl_ms(&self, tier: Tier) -> u64 {
        if tier == Tier::Summary {
            self.config.summary_ttl.as_millis().max(1) as u64
        } else {
            0
        }
    }
}
