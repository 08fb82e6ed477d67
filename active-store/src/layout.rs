//! Which shard owns a pid, how a shard's cursor walks its own batches, and the order in
//! which a claim visits the shards.

use tranche_codec::KeySchema;

use crate::Result;
use crate::model::Config;

/// The shard arithmetic of one namespace, on top of the codec's key schema (a batch is
/// `pid / 100`; a batch, its index bits and its statistics live on shard
/// `batch % num_shards`).
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    schema: KeySchema,
    shards: u32,
    per_batch: u64,
}

impl Layout {
    pub(crate) fn new(config: &Config) -> Result<Self> {
        let schema =
            KeySchema::new(&config.namespace, config.num_shards)?.with_layout(config.layout);
        Ok(Self {
            shards: schema.num_shards(),
            per_batch: schema.batch_size(),
            schema,
        })
    }

    pub(crate) fn schema(&self) -> &KeySchema {
        &self.schema
    }

    pub(crate) fn shards(&self) -> u32 {
        self.shards
    }

    pub(crate) fn per_batch(&self) -> u64 {
        self.per_batch
    }

    /// The shard owning `pid`.
    pub(crate) fn shard_of(&self, pid: u64) -> u32 {
        self.schema.shard_of(pid)
    }

    /// The smallest pid `>= pid` owned by `shard` (as `lua/claim.lua` computes it).
    pub(crate) fn align(&self, pid: u64, shard: u32) -> u64 {
        let n = u64::from(self.shards);
        let batch = pid / self.per_batch;
        let skip = (u64::from(shard) + n - batch % n) % n;
        if skip == 0 {
            pid
        } else {
            (batch + skip).saturating_mul(self.per_batch)
        }
    }

    /// How many pids of `from..=last` `shard` owns, for `from` already aligned.
    pub(crate) fn count_in_shard(&self, from: u64, last: u64, shard: u32) -> u64 {
        if from > last {
            return 0;
        }
        let n = u64::from(self.shards);
        // Whole batches of this shard between the two ends, plus the partial ends.
        let (b0, b1) = (from / self.per_batch, last / self.per_batch);
        if b0 == b1 {
            return if self.shard_of(from) == shard {
                last - from + 1
            } else {
                0
            };
        }
        let head = (b0 + 1) * self.per_batch - from; // from is in b0, which is ours
        let tail = if b1 % n == u64::from(shard) {
            last - b1 * self.per_batch + 1
        } else {
            0
        };
        // Batches strictly between b0 and b1 owned by this shard.
        let mut middle = 0;
        if b1 > b0 + 1 {
            let first = self.align((b0 + 1) * self.per_batch, shard) / self.per_batch;
            if first < b1 {
                middle = (b1 - 1 - first) / n + 1;
            }
        }
        head + middle * self.per_batch + tail
    }

    /// The order in which a claim (or a piece claim) of `worker` at `now_ms` visits
    /// the shards: from a shard derived from its id, so that a fleet spreads over the
    /// shards, moved one further round the ring every [`CLAIM_TURN_MS`], then round the
    /// ring. Starting every claim at the same shard would let that shard's fresh work
    /// always come first: a retry ready in a shard late in the order would wait until
    /// every shard before it ran dry. Turned by the clock rather than per claim, a
    /// worker claiming many times a second keeps taking one shard's work at a time, so
    /// its heartbeats and completions stay batched per shard, while a ready retry waits
    /// at most `shards` turns of claiming.
    pub(crate) fn claim_order(
        &self,
        worker: &str,
        now_ms: u64,
    ) -> impl Iterator<Item = u32> + use<> {
        ring(self.shards, worker, now_ms / CLAIM_TURN_MS)
    }
}

/// How long a worker's claims keep starting at the same shard: every `CLAIM_TURN_MS` of
/// the store's clock they start one shard further round the ring, so a ready retry waits
/// at most one turn of the ring while claims within a turn stay on one shard.
pub const CLAIM_TURN_MS: u64 = 1000;

/// The shards of a ring of `n`, from the one `worker`'s id gives moved on by `turn`.
fn ring(n: u32, worker: &str, turn: u64) -> impl Iterator<Item = u32> + use<> {
    // FNV-1a: stable across processes and versions, unlike std's hasher.
    let hash = worker.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let n64 = u64::from(n);
    let start = ((hash % n64 + turn % n64) % n64) as u32;
    (0..n).map(move |i| (start + i) % n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(shards: u32) -> Layout {
        Layout::new(&Config {
            num_shards: shards,
            ..Config::default()
        })
        .unwrap()
    }

    #[test]
    fn align_and_count_agree_with_brute_force() {
        for shards in [1, 2, 3, 4, 7] {
            let l = layout(shards);
            for shard in 0..shards {
                for from in (0..1500).step_by(37) {
                    let expect = (from..).find(|&p| l.shard_of(p) == shard).unwrap();
                    assert_eq!(
                        l.align(from, shard),
                        expect,
                        "align({from}, {shard}) of {shards}"
                    );
                    for last in [from, from + 99, from + 250, from + 1234] {
                        let a = l.align(from, shard);
                        let brute = (a..=last).filter(|&p| l.shard_of(p) == shard).count() as u64;
                        assert_eq!(
                            l.count_in_shard(a, last, shard),
                            brute,
                            "{a}..={last} s{shard}/{shards}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn claim_order_visits_every_shard_once() {
        let l = layout(8);
        let mut seen: Vec<u32> = l.claim_order("worker-1", 0).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..8).collect::<Vec<_>>());
    }

    /// A claim's first shard moves one further every turn, so every shard comes first
    /// once in `shards` turns; claims within one turn start at the same shard.
    #[test]
    fn claims_start_one_shard_further_each_turn() {
        let l = layout(5);
        let first = |now| l.claim_order("worker-1", now).next().unwrap();
        let home = first(0);
        assert_eq!(first(CLAIM_TURN_MS - 1), home);
        let firsts: Vec<u32> = (0..10).map(|t| first(t * CLAIM_TURN_MS)).collect();
        let expect: Vec<u32> = (0..10).map(|t| (home + t) % 5).collect();
        assert_eq!(firsts, expect);
        let mut seen: Vec<u32> = ring(5, "worker-1", u64::MAX).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..5).collect::<Vec<_>>());
    }
}
