//! Splitting in memory: the counterpart of `lua/split.lua` and the piece scripts, each
//! operation under its shard's mutex.

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::model::FailPolicy;
use crate::split::{Beat, Part, PartBeat, Piece, PieceDone, Running, SplitAnswer, Splits};

/// A piece's key in its shard: (pid, start).
pub(super) type PieceKey = (u64, u64);

/// A request waiting for its holder's beat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Request {
    pub(super) part: Part,
    /// Per piece asked for: its first ID and the highest first ID allowed.
    pub(super) cuts: Vec<(u64, u64)>,
    pub(super) at_ms: u64,
}

/// A split partition's entry (`splits` on Redis).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Entry {
    pub(super) request: Option<Request>,
    pub(super) outstanding: u64,
    pub(super) owner_done: bool,
    pub(super) first_claimed_ms: u64,
    pub(super) min_id: u64,
    pub(super) max_id: u64,
    pub(super) owner: String,
}

/// The split state of one shard.
#[derive(Debug, Default)]
pub(super) struct ShardSplits {
    pub(super) entries: HashMap<u64, Entry>,
    /// Pieces by key; a piece is a partition record whose `min_id` is its start.
    pub(super) pieces: BTreeMap<PieceKey, Partition>,
    pub(super) pending: BTreeSet<(u64, PieceKey)>,
    pub(super) leases: BTreeSet<(u64, PieceKey)>,
}

impl ShardSplits {
    /// Serves `entry`'s request for `part` on `rec` (`lua/split.lua`'s `cut`): new
    /// pending pieces, `rec.max_id` shortened to before the first, which it returns;
    /// or nothing.
    fn cut(
        &mut self,
        pid: u64,
        part: Part,
        rec: &mut Partition,
        next: Option<u64>,
        now: u64,
    ) -> Option<u64> {
        let entry = self.entries.get_mut(&pid)?;
        let next = next?;
        let req = entry.request.as_ref().filter(|r| r.part == part)?.clone();
        entry.request = None;
        let mut starts: Vec<u64> = Vec::new();
        for &(point, limit) in &req.cuts {
            let s = if starts.is_empty() {
                point.max(next)
            } else {
                point
            };
            if s <= limit && s <= rec.max_id && s > rec.min_id {
                starts.push(s);
            }
        }
        let first = *starts.first()?;
        for (i, &s) in starts.iter().enumerate() {
            let to = starts.get(i + 1).map_or(rec.max_id, |next| next - 1);
            let mut piece = Partition::pending(pid, s, to, now);
            piece.progress = s;
            self.pieces.insert((pid, s), piece);
            self.pending.insert((now, (pid, s)));
        }
        rec.max_id = first - 1;
        entry.outstanding += starts.len() as u64;
        Some(first - 1)
    }

    fn leased(&mut self, lease: &Lease) -> Option<&mut Partition> {
        self.pieces
            .get_mut(&(lease.pid, lease.min_id))
            .filter(|p| p.status.is_leased() && p.lease_token == Some(lease.token))
    }

    /// The lowest ID split partition `pid`'s unfinished parts have not done: its owner
    /// part's checkpoint `owner` unless that part is done, and every piece's. `None` if
    /// `pid` is not split.
    pub(super) fn lowest_unfinished(&self, pid: u64, owner: u64) -> Option<u64> {
        let entry = self.entries.get(&pid)?;
        let pieces = self
            .pieces
            .range((pid, 0)..=(pid, u64::MAX))
            .map(|(_, piece)| piece.progress);
        let from = (!entry.owner_done).then_some(owner);
        Some(from.into_iter().chain(pieces).min().unwrap_or(owner))
    }
}

impl Shard {
    /// Makes split partition `pid` whole again (`lua/split.lua`'s `unsplit`): its
    /// record takes its planned range back, from its lowest unfinished ID; its entry and
    /// every piece go, pending or not, so every lease on a piece of it is lost (a
    /// running piece is fenced: its beat, completion and failure are refused). Its
    /// status is the caller's. False if `pid` is not split.
    pub(super) fn unsplit(&mut self, pid: u64) -> bool {
        let owner = self.active.get(&pid).map_or(0, |p| p.progress);
        let from = self.splits.lowest_unfinished(pid, owner);
        let entry = self.splits.entries.remove(&pid);
        let gone: Vec<PieceKey> = self
            .splits
            .pieces
            .range((pid, 0)..=(pid, u64::MAX))
            .map(|(key, _)| *key)
            .collect();
        for key in &gone {
            self.splits.pieces.remove(key);
        }
        self.splits.pending.retain(|(_, key)| key.0 != pid);
        self.splits.leases.retain(|(_, key)| key.0 != pid);
        let (Some(entry), Some(from)) = (entry, from) else {
            return false;
        };
        if let Some(p) = self.active.get_mut(&pid) {
            (p.min_id, p.max_id, p.progress) = (entry.min_id, entry.max_id, from);
        }
        true
    }

    /// Fails split partition `pid` for good with `error`, whole again
    /// ([`unsplit`](Self::unsplit)), whichever part's last attempt it was: failed (a
    /// discarded one stays discarded), out of every index.
    pub(super) fn fail_split(&mut self, pid: u64, error: &str, now: u64) {
        if !self.unsplit(pid) {
            return;
        }
        let Some(p) = self.active.get_mut(&pid) else {
            return;
        };
        if p.status == Status::Discarded {
            return;
        }
        if let Some(deadline) = p.deadline_ms.take() {
            self.leases.remove(&(deadline, pid));
        }
        if p.status == Status::Pending {
            self.pending.retain(|&(_, q)| q != pid);
        }
        p.status = Status::Failed;
        p.updated_at_ms = now;
        p.last_error = Some(error.to_owned());
    }

    /// Piece leases whose holder is gone: every one with its deadline at or before
    /// `now`, or every one `worker` holds. Each is pending again from its checkpoint,
    /// its attempt counted, or, on its last attempt, fails its partition (as
    /// [`Shard::expire`] does a partition's lease: a piece that kills its worker every
    /// time must not be retried for ever). Returns the pids of the pieces pending again.
    pub(super) fn expire_pieces(
        &mut self,
        now: u64,
        max_attempts: u32,
        worker: Option<&str>,
    ) -> Vec<u64> {
        let held: Vec<(u64, PieceKey)> = match worker {
            None => self
                .splits
                .leases
                .range(..=(now, (u64::MAX, u64::MAX)))
                .copied()
                .collect(),
            Some(worker) => self
                .splits
                .leases
                .iter()
                .filter(|(_, key)| {
                    self.splits
                        .pieces
                        .get(key)
                        .and_then(|p| p.worker.as_deref())
                        == Some(worker)
                })
                .copied()
                .collect(),
        };
        let mut out = Vec::new();
        for (deadline, key) in held {
            self.splits.leases.remove(&(deadline, key));
            // Gone when an earlier one of its partition failed it.
            let Some(p) = self.splits.pieces.get_mut(&key) else {
                continue;
            };
            if p.attempts >= max_attempts {
                let why = format!(
                    "the lease of its piece from {} expired on attempt {} of {max_attempts} \
                     (the worker died or stalled)",
                    key.1, p.attempts
                );
                self.fail_split(key.0, &why, now);
                continue;
            }
            p.status = Status::Pending;
            p.deadline_ms = None;
            p.updated_at_ms = now;
            self.splits.pending.insert((now, key));
            out.push(key.0);
        }
        out
    }
}

/// A beat's answer: cut in this call at `cut`, or renewed with the part ending at
/// `last` (its record's end, which an earlier cut may have moved).
fn answer(cut: Option<u64>, last: u64) -> Beat {
    cut.map_or(Beat::Renewed { last }, |last| Beat::Cut { last })
}

fn lost(lease: &Lease) -> Error {
    Error::LeaseLost {
        pid: lease.pid,
        token: lease.token,
    }
}

impl MemoryActiveStore {
    fn deadline(&self, now: u64) -> u64 {
        now + self.config.lease.as_millis() as u64
    }
}

#[async_trait]
impl Splits for MemoryActiveStore {
    async fn split_candidates(&self) -> Result<Vec<Running>> {
        let mut out = Vec::new();
        for shard in &self.shards {
            let shard = lock(shard);
            let range = |pid: u64, p: &Partition| {
                shard
                    .splits
                    .entries
                    .get(&pid)
                    .map_or((p.min_id, p.max_id), |e| (e.min_id, e.max_id))
            };
            for p in shard.active.values() {
                if let (Status::Running, Some(token)) = (p.status, p.lease_token) {
                    let (partition_min, partition_max) = range(p.pid, p);
                    out.push(Running {
                        pid: p.pid,
                        part: Part::Owner,
                        token,
                        worker: p.worker.clone().unwrap_or_default(),
                        max_id: p.max_id,
                        progress: p.progress,
                        partition_min,
                        partition_max,
                        owner: p.worker.clone().unwrap_or_default(),
                        claimed_ms: p.claimed_at_ms,
                    });
                }
            }
            for ((pid, start), piece) in &shard.splits.pieces {
                let (Status::Running, Some(token), Some(parent), Some(entry)) = (
                    piece.status,
                    piece.lease_token,
                    shard.active.get(pid),
                    shard.splits.entries.get(pid),
                ) else {
                    continue;
                };
                let _ = parent;
                out.push(Running {
                    pid: *pid,
                    part: Part::Piece(*start),
                    token,
                    worker: piece.worker.clone().unwrap_or_default(),
                    max_id: piece.max_id,
                    progress: piece.progress,
                    partition_min: entry.min_id,
                    partition_max: entry.max_id,
                    owner: entry.owner.clone(),
                    claimed_ms: piece.claimed_at_ms,
                });
            }
        }
        out.sort_by_key(|r| (r.pid, r.part));
        Ok(out)
    }

    async fn request_pieces(
        &self,
        part: &Running,
        worker: &str,
        cuts: &[(u64, u64)],
    ) -> Result<SplitAnswer> {
        plans::check_worker(worker)?;
        crate::split::check_cuts(cuts)?;
        let (Some(&(point, _)), Some(&(_, limit))) = (cuts.first(), cuts.last()) else {
            return Ok(SplitAnswer::TooSmall);
        };
        let now = self.now();
        let stale = self.config.lease.as_millis() as u64;
        let mut guard = self.shard(part.pid);
        let shard = &mut *guard;
        let Some(p) = shard.active.get(&part.pid) else {
            return Ok(SplitAnswer::NotRunning);
        };
        let holder = match part.part {
            Part::Owner => Some(p),
            Part::Piece(start) => shard.splits.pieces.get(&(part.pid, start)),
        };
        let Some(holder) =
            holder.filter(|h| h.status == Status::Running && h.lease_token == Some(part.token))
        else {
            return Ok(SplitAnswer::NotRunning);
        };
        // The same order as split_request.lua: not running, then busy, then too small;
        // a refused request leaves no entry behind.
        let busy = shard.splits.entries.get(&part.pid).is_some_and(|e| {
            e.request.as_ref().is_some_and(|r| {
                now.saturating_sub(r.at_ms) < stale
                    && !(r.part == part.part && cuts.len() > r.cuts.len())
            })
        });
        if busy {
            return Ok(SplitAnswer::Busy);
        }
        if point <= holder.progress.max(holder.min_id)
            || limit > holder.max_id
            || cuts.iter().any(|(point, limit)| point > limit)
        {
            return Ok(SplitAnswer::TooSmall);
        }
        let claimed = p.claimed_at_ms.unwrap_or(now);
        let entry = shard
            .splits
            .entries
            .entry(part.pid)
            .or_insert_with(|| Entry {
                request: None,
                outstanding: 0,
                owner_done: false,
                first_claimed_ms: claimed,
                min_id: part.partition_min,
                max_id: part.partition_max,
                owner: part.owner.clone(),
            });
        entry.request = Some(Request {
            part: part.part,
            cuts: cuts.to_vec(),
            at_ms: now,
        });
        Ok(SplitAnswer::Requested { point })
    }

    async fn beat_parts(&self, beats: &[PartBeat]) -> Result<Vec<Result<Beat>>> {
        let now = self.now();
        let deadline = self.deadline(now);
        let mut out = Vec::with_capacity(beats.len());
        for b in beats {
            let lease = &b.lease;
            let mut guard = self.shard(lease.pid);
            let shard = &mut *guard;
            if b.piece {
                let key = (lease.pid, lease.min_id);
                let Some(rec) = shard.splits.leased(lease) else {
                    out.push(Err(lost(lease)));
                    continue;
                };
                let old = rec.deadline_ms.replace(deadline);
                rec.status = Status::Running;
                rec.progress = rec.progress.max(b.progress);
                rec.updated_at_ms = now;
                let mut rec = rec.clone();
                let cut =
                    shard
                        .splits
                        .cut(lease.pid, Part::Piece(lease.min_id), &mut rec, b.next, now);
                if let Some(old) = old {
                    shard.splits.leases.remove(&(old, key));
                }
                shard.splits.leases.insert((deadline, key));
                out.push(Ok(answer(cut, rec.max_id)));
                shard.splits.pieces.insert(key, rec);
            } else {
                let Some(p) = shard.leased(lease) else {
                    out.push(Err(lost(lease)));
                    continue;
                };
                let old = p.deadline_ms.replace(deadline);
                p.status = Status::Running;
                p.progress = p.progress.max(b.progress);
                p.updated_at_ms = now;
                let mut rec = p.clone();
                let cut = shard
                    .splits
                    .cut(lease.pid, Part::Owner, &mut rec, b.next, now);
                if let Some(old) = old {
                    shard.leases.remove(&(old, lease.pid));
                }
                shard.leases.insert((deadline, lease.pid));
                out.push(Ok(answer(cut, rec.max_id)));
                shard.active.insert(lease.pid, rec);
            }
        }
        Ok(out)
    }

    async fn claim_pieces(&self, worker: &str, n: usize) -> Result<Vec<Lease>> {
        plans::check_worker(worker)?;
        let now = self.now();
        let deadline = self.deadline(now);
        let mut out = Vec::new();
        for shard_no in self.layout.claim_order(worker, now) {
            if out.len() >= n {
                break;
            }
            let mut guard = lock(&self.shards[shard_no as usize]);
            let shard = &mut *guard;
            let ready: Vec<(u64, PieceKey)> = shard
                .splits
                .pending
                .range(..=(now, (u64::MAX, u64::MAX)))
                .take(n - out.len())
                .copied()
                .collect();
            for (at, key) in ready {
                shard.splits.pending.remove(&(at, key));
                shard.token += 1;
                let token = shard.token;
                let Some(p) = shard.splits.pieces.get_mut(&key) else {
                    continue;
                };
                p.status = Status::Claimed;
                p.attempts += 1;
                p.lease_token = Some(token);
                p.deadline_ms = Some(deadline);
                p.claimed_at_ms = Some(now);
                p.updated_at_ms = now;
                p.worker = Some(worker.to_owned());
                out.push(Lease {
                    pid: key.0,
                    token,
                    worker: worker.to_owned(),
                    min_id: p.min_id,
                    max_id: p.max_id,
                    attempt: p.attempts,
                    progress: p.progress,
                    deadline_ms: deadline,
                });
                shard.splits.leases.insert((deadline, key));
            }
        }
        Ok(out)
    }

    async fn complete_piece(&self, lease: &Lease) -> Result<PieceDone> {
        let now = self.now();
        let shard_no = self.layout.shard_of(lease.pid) as usize;
        let mut guard = lock(&self.shards[shard_no]);
        let shard = &mut *guard;
        let key = (lease.pid, lease.min_id);
        if shard.splits.leased(lease).is_none() {
            return Err(lost(lease));
        }
        let entry = shard
            .splits
            .entries
            .get_mut(&lease.pid)
            .filter(|e| e.outstanding > 0)
            .ok_or_else(|| Error::Corrupt {
                key: format!("splits {}", lease.pid),
                detail: "a piece without its split entry".into(),
            })?;
        entry.outstanding -= 1;
        // A request for this piece goes with it (`lua/piece_complete.lua`).
        if entry
            .request
            .as_ref()
            .is_some_and(|r| r.part == Part::Piece(lease.min_id))
        {
            entry.request = None;
        }
        let finish = entry.outstanding == 0 && entry.owner_done;
        let p = shard.splits.pieces.remove(&key).expect("checked above");
        if let Some(deadline) = p.deadline_ms {
            shard.splits.leases.remove(&(deadline, key));
        }
        if !finish || shard.completed.contains(&lease.pid) {
            return Ok(PieceDone::Done);
        }
        let entry = shard.splits.entries.remove(&lease.pid).expect("read above");
        shard.active.remove(&lease.pid);
        shard.completed.insert(lease.pid);
        let _ = self.inbox[shard_no].0.send(entry.record(lease.pid, now));
        Ok(PieceDone::Completed)
    }

    async fn release_piece(&self, lease: &Lease, progress: u64) -> Result<()> {
        let now = self.now();
        let mut shard = self.shard(lease.pid);
        let key = (lease.pid, lease.min_id);
        let p = shard.splits.leased(lease).ok_or_else(|| lost(lease))?;
        p.progress = p.progress.max(progress);
        p.attempts = p.attempts.saturating_sub(1);
        p.status = Status::Pending;
        p.updated_at_ms = now;
        if let Some(deadline) = p.deadline_ms.take() {
            shard.splits.leases.remove(&(deadline, key));
        }
        shard.splits.pending.insert((now, key));
        Ok(())
    }

    async fn fail_piece(
        &self,
        lease: &Lease,
        progress: u64,
        error: &str,
        policy: FailPolicy,
    ) -> Result<FailOutcome> {
        let now = self.now();
        let mut guard = self.shard(lease.pid);
        let shard = &mut *guard;
        let key = (lease.pid, lease.min_id);
        let p = shard.splits.leased(lease).ok_or_else(|| lost(lease))?;
        p.progress = p.progress.max(progress);
        p.last_error = Some(error.to_owned());
        p.updated_at_ms = now;
        let attempts = p.attempts;
        if attempts >= self.config.max_attempts || policy.permanent {
            shard.fail_split(lease.pid, error, now);
            return Ok(FailOutcome::Failed);
        }
        let delay = policy
            .retry_after
            .unwrap_or_else(|| self.config.backoff(attempts));
        let ready_at_ms = now.saturating_add(delay.as_millis().min(u64::MAX as u128) as u64);
        p.status = Status::Pending;
        if let Some(deadline) = p.deadline_ms.take() {
            shard.splits.leases.remove(&(deadline, key));
        }
        shard.splits.pending.insert((ready_at_ms, key));
        Ok(FailOutcome::Retry { ready_at_ms })
    }

    async fn pieces(&self, pid: u64) -> Result<Vec<Piece>> {
        let shard = self.shard(pid);
        Ok(shard
            .splits
            .pieces
            .range((pid, 0)..=(pid, u64::MAX))
            .map(|(&(pid, start), p)| Piece {
                pid,
                start,
                max_id: p.max_id,
                status: p.status,
                worker: p.worker.clone(),
                progress: p.progress,
                attempts: p.attempts,
            })
            .collect())
    }
}

impl Entry {
    /// The partition's completed record: its whole range, its owner, from its first
    /// claim to `now`.
    pub(super) fn record(&self, pid: u64, now: u64) -> CompletedRecord {
        CompletedRecord {
            pid,
            min_id: self.min_id,
            max_id: self.max_id,
            worker: self.owner.as_str().into(),
            completed_at_ms: now,
            duration_ms: now.saturating_sub(self.first_claimed_ms),
        }
    }
}
