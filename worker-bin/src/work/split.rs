//! The asking side of splitting (`tranche_active_store::Splits`): a process with free
//! slots and nothing to claim takes pending pieces of split partitions, or shares its
//! free slots among the running parts with the most IDs left (its own process's
//! included) and asks each holder for that many pieces at once. The holder cuts them
//! all in its next beat (`held`), at most [`SPLIT_BEAT`](crate::held::SPLIT_BEAT)
//! later (at once when the holder is this process), and the asker looks for the
//! pieces every [`AWAIT_TURN`] until then, asking nothing more meanwhile.
//!
//! With long partitions ([`EARLY_MEDIAN`]) a free slot also looks before it starts or
//! claims a partition ([`Mode::Early`]): a straggler whose expected rest runs well past
//! the job's expected end (the work left, running and waiting, over every slot) is cut
//! then, into pieces of half that share, and pending pieces go before queued and fresh
//! partitions. The heaviest work starts first and the light partitions fill the end,
//! rather than the stragglers' last chunks, which cannot be divided, running on after
//! everything else.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use tranche_active_store::{Lease, Running, SplitAnswer};

use super::{Settings, Shared};
use crate::backend::Backend;
use crate::event::{Event, StoreOp};
use crate::held::{Hold, LeaseBook};

/// How often a process asks for a split at most: each idle turn ([`IDLE_TURN`]), so a
/// slot that finds no piece and no part worth cutting looks again a turn later.
const ASK_EVERY: Duration = IDLE_TURN;

/// How long after a holder's beat is due its cut may still be on the way (the beat's
/// round trip, a late tick).
const CUT_SLACK: Duration = Duration::from_millis(100);

/// The most pieces one early look asks for, over every part (a request carries 64 at
/// most).
const MAX_PIECES: usize = 64;

/// Candidates tried beyond one per free slot before giving up until the next turn
/// (other idle processes may have asked for the first ones).
const TRIES: usize = 3;

/// The longest an idle process with splitting on waits between turns while something
/// runs: a split's latency is a turn, a beat and a turn.
pub(super) const IDLE_TURN: std::time::Duration = std::time::Duration::from_millis(250);

/// How often an idle process looks for the pieces it asked for, until the holders'
/// next beat has certainly cut them ([`Splitter::awaits_cut`]): a piece waits for its
/// claim a few of these rather than an idle turn.
pub(super) const AWAIT_TURN: Duration = Duration::from_millis(25);

/// The median partition duration from which free slots look for stragglers before
/// they claim ([`Mode::Early`]): each look reads every running part, once per
/// [`ASK_EVERY`] at most, which partitions this long amortise (a process finishes at
/// most two a second per slot). Jobs of shorter partitions cut stragglers once nothing
/// is left to claim.
const EARLY_MEDIAN: Duration = Duration::from_millis(500);

/// An early cut is made only in a part whose rest is this many fair shares or more
/// (its holder would end well after everything else): a part just over the job's
/// expected end is left for the tail, when the fair share is known better.
const EARLY_SLACK: f64 = 1.5;

/// An early cut's pieces, as a fraction of the fair share: smaller than the share, so
/// that the straggler's work spreads over more slots and ends before the light
/// partitions that fill the end (which the tail can cut finely), rather than with them.
const EARLY_PIECE: f64 = 0.5;

/// Why a free slot looks at the running parts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Mode {
    /// Nothing is left to claim: every free slot takes a piece of whatever runs longest.
    Idle,
    /// Partitions wait to be claimed, whose expected work (their count times the
    /// median partition, [`Ahead`]) counts in the job's expected end: only the parts
    /// running well past it are cut ([`EARLY_SLACK`]).
    Early {
        /// The median duration of a partition this process finished, ms.
        median_ms: f64,
    },
}

/// When this process last asked for a split, and until when the cut is due.
#[derive(Debug, Default)]
pub(super) struct Splitter {
    asked: Option<Instant>,
    /// When free slots last looked for pieces and stragglers before claiming
    /// ([`Mode::Early`]).
    looked: Option<Instant>,
    /// When an early look last asked the store for pending pieces.
    took: Option<Instant>,
    /// A holder asked for pieces cuts them in its next beat, within
    /// [`SPLIT_BEAT`](crate::held::SPLIT_BEAT) of the ask: until then (and a little
    /// after, for the beat's round trip) the pieces are looked for every
    /// [`AWAIT_TURN`].
    cut_due: Option<Instant>,
}

impl Splitter {
    /// Whether a cut this process asked for is due any moment: its idle turns are
    /// then [`AWAIT_TURN`] long.
    pub(super) fn awaits_cut(&self) -> bool {
        self.cut_due.is_some_and(|at| Instant::now() < at)
    }

    /// Whether free slots should look for pieces and stragglers before claiming
    /// ([`Mode::Early`]), and with what median: the last look was an [`ASK_EVERY`] ago
    /// (an [`AWAIT_TURN`] while pieces asked for are due), and partitions take
    /// [`EARLY_MEDIAN`] or more (`median`, this process's, read only then: a short
    /// median counts as a look).
    pub(super) fn early(&mut self, median: impl FnOnce() -> Option<Duration>) -> Option<Mode> {
        let every = if self.awaits_cut() {
            AWAIT_TURN
        } else {
            ASK_EVERY
        };
        if self.looked.is_some_and(|at| at.elapsed() < every) {
            return None;
        }
        let Some(median) = median().filter(|m| *m >= EARLY_MEDIAN) else {
            self.looked = Some(Instant::now());
            return None;
        };
        Some(Mode::Early {
            median_ms: median.as_secs_f64() * 1000.0,
        })
    }

    /// One turn: queues up to `free` pending pieces (first in the queue), or asks for a
    /// split. Returns how many pieces were queued.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn step(
        &mut self,
        backend: &Backend,
        settings: &Settings,
        shared: &Shared,
        book: &Arc<LeaseBook>,
        queue: &mut VecDeque<(Lease, Arc<Hold>)>,
        free: usize,
        mode: Mode,
    ) -> usize {
        let sent = Instant::now();
        // Pieces looked for less than an await turn ago (an early look earlier in the
        // same loop turn) are not looked for again.
        let recent = self.took.is_some_and(|at| at.elapsed() < AWAIT_TURN);
        let pieces = match mode {
            Mode::Idle if recent => Ok(Vec::new()),
            Mode::Idle => backend.active.claim_pieces(&settings.worker, free).await,
            Mode::Early { .. } => {
                (self.looked, self.took) = (Some(sent), Some(sent));
                backend.active.claim_pieces(&settings.worker, free).await
            }
        };
        match pieces {
            Ok(pieces) if !pieces.is_empty() => {
                let n = pieces.len();
                shared.claimed.fetch_add(n as u64, Relaxed);
                for lease in pieces {
                    tracing::info!(
                        pid = lease.pid,
                        from = lease.min_id,
                        to = lease.max_id,
                        "claimed a piece of a split partition"
                    );
                    shared.emit(|| Event::Claimed {
                        pid: lease.pid,
                        attempt: lease.attempt,
                    });
                    let hold = book.hold(&lease, true, sent.into());
                    queue.push_front((lease, hold));
                }
                return n;
            }
            Ok(_) => {}
            Err(err) => {
                tracing::warn!(%err, "claiming pieces failed; retrying");
                shared.store_error(StoreOp::ClaimPieces, &err);
                return 0;
            }
        }
        // Not while pieces asked for are due: they are this slot's (asking again
        // would cut a second piece for the same free slot).
        if self.awaits_cut() || self.asked.is_some_and(|at| at.elapsed() < ASK_EVERY) {
            return 0;
        }
        self.asked = Some(Instant::now());
        let split_min = settings.split_min.max(1).saturating_mul(settings.chunk);
        let parts = match backend.active.split_candidates().await {
            Ok(parts) => parts,
            Err(err) => {
                tracing::warn!(%err, "reading running partitions failed");
                shared.store_error(StoreOp::Split, &err);
                return 0;
            }
        };
        // Its own parts too: an idle slot of the process that holds the straggler
        // helps as well as another's (an embedded run is one process).
        let grain = Grain {
            chunk: settings.chunk,
            window: settings
                .chunk
                .saturating_mul(settings.parallel.max(1) as u64),
        };
        let ahead = match mode {
            Mode::Idle => None,
            Mode::Early { median_ms } => match backend.active.counts().await {
                Ok(c) => Some(Ahead {
                    waiting_ms: (c.unissued + c.pending) as f64 * median_ms,
                    median_ms,
                }),
                Err(err) => {
                    tracing::warn!(%err, "reading the namespace's counts failed");
                    shared.store_error(StoreOp::Split, &err);
                    return 0;
                }
            },
        };
        let asks = plan(
            &parts,
            free,
            split_min,
            grain,
            crate::duration::now_ms(),
            ahead,
        );
        // A part another process asked for already (for as many pieces or more) is
        // passed by. An early look asks for every piece its plan has.
        let (want, most) = match mode {
            Mode::Idle => (free, free + TRIES),
            Mode::Early { .. } => (usize::MAX, asks.len()),
        };
        let (mut asked, mut tried) = (0, 0);
        for (part, cuts) in &asks {
            if asked >= want || tried >= most {
                break;
            }
            tried += 1;
            match backend
                .active
                .request_pieces(part, &settings.worker, cuts)
                .await
            {
                Ok(SplitAnswer::Requested { point }) => {
                    asked += cuts.len();
                    self.cut_due = Some(Instant::now() + crate::held::SPLIT_BEAT + CUT_SLACK);
                    if part.worker == settings.worker {
                        book.cut_asked();
                    }
                    tracing::info!(
                        pid = part.pid,
                        holder = %part.worker,
                        point,
                        pieces = cuts.len(),
                        "asked for a split"
                    );
                }
                Ok(_) => {}
                Err(err) => {
                    tracing::warn!(pid = part.pid, %err, "asking for a split failed");
                    shared.store_error(StoreOp::Split, &err);
                    break;
                }
            }
        }
        0
    }
}

/// The least work a piece is cut for, at its holder's pace: below `--split-min` chunks
/// when chunks are slow (a 1 s chunk is worth a piece of its own; a piece costs a
/// claim and a beat, some milliseconds). Near a job's end the last parts have a few
/// slow chunks left, and a second each lets them be cut to the end.
const MIN_PIECE_MS: f64 = 1000.0;

/// The job's chunking, as the asker runs it (the holders are assumed to run alike).
#[derive(Debug, Clone, Copy)]
pub(super) struct Grain {
    /// IDs per chunk: pieces are cut in whole chunks.
    pub(super) chunk: u64,
    /// IDs a holder has in flight at once (`--chunk` x `--parallel`): past its
    /// checkpoint, about half of it is done on average.
    pub(super) window: u64,
}

/// How long the holder of `part` takes per ID, at `now_ms`: from its claim to its
/// checkpoint, counting half its window of chunks in flight as done. The checkpoint
/// lags the work by the chunks in flight, so elapsed time over checkpointed IDs alone
/// overstates a slow part's pace by up to a chunk in so many (a third for a part three
/// chunks in), and the pieces cut at that pace come out too long: the last to end.
/// `None` before its first checkpoint (or with no claim time).
fn pace(part: &Running, window: u64, now_ms: u64) -> Option<f64> {
    let done = part.progress.checked_sub(part.first()).filter(|d| *d > 0)?;
    let elapsed = now_ms.checked_sub(part.claimed_ms?)?;
    Some(elapsed as f64 / (done as f64 + window as f64 / 2.0))
}

/// The work still waiting to be claimed, for an early look ([`Mode::Early`]).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Ahead {
    /// The partitions not yet claimed, at the median partition's duration each, ms.
    waiting_ms: f64,
    /// The median partition's duration, ms: the expected rest of a part not yet timed.
    median_ms: f64,
}

/// Which running parts to ask for pieces, and the cuts, for `free` idle slots at
/// `now_ms`. Each part's expected rest is its IDs left at its holder's pace so far
/// ([`pace`]; a piece not checkpointed yet goes at its partition's other parts' pace). The slots
/// go one by one to the part whose share of its rest would be largest with it (so the
/// shares come out even), and each piece is cut to the job's fair share: the expected
/// rest of every running part over the running parts and the free slots, what an idle
/// slot should do so that all end together, rather than a half (halvings a beat apart
/// leave the last pieces too long). A piece keeps at least `split_min` IDs, or fewer
/// whole chunks when they take [`MIN_PIECE_MS`] at the part's pace. Without any
/// pace known (nothing checkpointed yet) the parts are weighed by IDs left and cut in
/// equal shares. The longest part first.
///
/// With work `ahead` (an early look, before claiming) the fair share counts it too,
/// and the parts not timed yet at the median; only timed parts with a rest of
/// [`EARLY_SLACK`] fair shares or more are cut, into pieces of [`EARLY_PIECE`] of the
/// share while the holder keeps one such piece at least, however many slots are free
/// (up to [`MAX_PIECES`]).
fn plan(
    parts: &[Running],
    free: usize,
    split_min: u64,
    grain: Grain,
    now_ms: u64,
    ahead: Option<Ahead>,
) -> Vec<(Running, Vec<(u64, u64)>)> {
    let chunk = grain.chunk.max(1);
    let pace: Vec<Option<f64>> = parts
        .iter()
        .map(|p| pace(p, grain.window, now_ms))
        .collect();
    let of_pid = |pid: u64| {
        parts
            .iter()
            .zip(&pace)
            .filter(|(p, _)| p.pid == pid)
            .filter_map(|(_, r)| *r)
            .reduce(f64::max)
    };
    let pace: Vec<Option<f64>> = parts
        .iter()
        .zip(&pace)
        .map(|(p, r)| r.or_else(|| of_pid(p.pid)))
        .collect();
    let timed = pace.iter().any(Option::is_some);
    if ahead.is_some() && !timed {
        return Vec::new();
    }
    // Per part: expected rest (ms, or IDs untimed) and the smallest piece (IDs).
    let (rest, least): (Vec<f64>, Vec<u64>) = parts
        .iter()
        .zip(&pace)
        .map(|(p, r)| match (timed, r) {
            (true, Some(ms)) => {
                let chunks = (MIN_PIECE_MS / (ms * chunk as f64)).ceil().max(1.0) as u64;
                let least = chunks.saturating_mul(chunk).min(split_min).max(1);
                (p.remaining() as f64 * ms, least)
            }
            (true, None) => (0.0, split_min),
            (false, _) => (p.remaining() as f64, split_min),
        })
        .unzip();
    let (waiting, untimed) = match ahead {
        Some(a) => {
            let untimed = pace.iter().filter(|r| r.is_none()).count() as f64;
            (a.waiting_ms, untimed * a.median_ms)
        }
        None => (0.0, 0.0),
    };
    let fair = (rest.iter().sum::<f64>() + untimed + waiting) / (parts.len() + free).max(1) as f64;
    // Early, a part running on well past the end is cut into pieces of a fraction of
    // the fair share (IDs, whole chunks at its pace), its holder keeping one such
    // piece at least.
    let early_size = |i: usize| {
        let ms = pace[i]?;
        let ids = (fair * EARLY_PIECE / ms) as u64;
        Some((ids - ids % chunk).max(least[i]))
    };
    let worth = |i: usize, ways: u64| {
        ahead.is_none()
            || (rest[i] > EARLY_SLACK * fair
                && early_size(i)
                    .is_some_and(|size| parts[i].remaining() >= (ways + 2).saturating_mul(size)))
    };
    // Early, every piece worth cutting is asked for at once, free slots or not: the
    // pieces wait first in line, and the next slots to free take them.
    let pieces = if ahead.is_some() { MAX_PIECES } else { free };
    let mut ways = vec![0u64; parts.len()];
    for _ in 0..pieces {
        let best = (0..parts.len())
            .filter(|&i| rest[i] > 0.0 && parts[i].remaining() / least[i] > ways[i] + 1)
            .filter(|&i| worth(i, ways[i]))
            .max_by(|&a, &b| {
                let share = |i: usize| rest[i] / (ways[i] + 1) as f64;
                share(a).total_cmp(&share(b)).then(b.cmp(&a))
            });
        let Some(i) = best else { break };
        ways[i] += 1;
    }
    let mut out: Vec<(Running, Vec<(u64, u64)>)> = (0..parts.len())
        .filter(|&i| ways[i] > 0)
        .map(|i| {
            let cuts = match pace[i] {
                Some(ms) if timed => {
                    let size = match ahead {
                        Some(_) => early_size(i).unwrap_or(least[i]),
                        None => (fair / ms) as u64,
                    };
                    parts[i].cuts_of(size, ways[i], least[i], chunk)
                }
                _ => parts[i].cuts(least[i], ways[i], chunk),
            };
            (parts[i].clone(), cuts)
        })
        .filter(|(_, cuts)| !cuts.is_empty())
        .collect();
    out.sort_by_key(|(p, _)| std::cmp::Reverse(p.remaining()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tranche_active_store::Part;

    fn part(pid: u64, progress: u64, claimed_ms: u64) -> Running {
        Running {
            pid,
            part: Part::Owner,
            token: 1,
            worker: "w".into(),
            max_id: pid * 1000,
            progress,
            partition_min: (pid - 1) * 1000 + 1,
            partition_max: pid * 1000,
            owner: "w".into(),
            claimed_ms: Some(claimed_ms),
        }
    }

    /// Chunks of 50 IDs, one in flight at a time.
    const GRAIN: Grain = Grain {
        chunk: 50,
        window: 50,
    };

    /// A slow part (4 chunks of 50 done in 10 s, a fifth half done: 44 ms an ID)
    /// beside two fast ones (about 1 and 1.7 ms an ID): every free slot goes to the
    /// slow one, its pieces a chunk each at least (a chunk is over a second of work),
    /// each the fair share (the rest of all over parts and slots, whole chunks) off
    /// its end.
    #[test]
    fn slots_go_to_the_slowest_rest_in_fair_shares() {
        let now = 100_000;
        let slow = part(1, 201, now - 10_000);
        let fast = [part(2, 1401, now - 400), part(3, 2801, now - 1400)];
        let parts = vec![fast[0].clone(), slow.clone(), fast[1].clone()];
        let asks = plan(&parts, 3, 200, GRAIN, now, None);
        assert_eq!(asks.len(), 1, "{asks:?}");
        let (p, cuts) = &asks[0];
        assert_eq!(p.pid, 1);
        // Rest: 800 IDs x 44.4 ms = 35.6 s, plus 600 x 0.94 ms and 200 x 1.7 ms:
        // 36.5 s over 3 parts and 3 slots, 6.1 s, 136 IDs, 100 in whole chunks; each
        // limit a chunk below the next point.
        assert_eq!(cuts, &vec![(701, 751), (801, 851), (901, 951)]);
    }

    /// The pace counts half the chunks in flight as done: 3 chunks of 2.5 s
    /// checkpointed and a fourth half way, 8.75 s in, is 50 ms an ID, not the 58 that
    /// the checkpoint alone gives.
    #[test]
    fn the_pace_counts_half_the_window_in_flight() {
        let now = 100_000;
        let p = part(1, 151, now - 8_750);
        assert_eq!(pace(&p, 50, now), Some(50.0));
        assert_eq!(
            pace(&part(1, 1, now - 8_750), 50, now),
            None,
            "no checkpoint"
        );
    }

    /// Near the end of a job, a part with three slow chunks left (1.5 s each, one in
    /// flight) still gives its last two to two idle slots, a chunk each; the holder
    /// keeps the one it runs. A nearly done fast part is not cut.
    #[test]
    fn a_slow_parts_last_chunks_go_to_idle_slots() {
        let now = 100_000;
        // 850 IDs done and half a chunk more in 26.25 s: 30 ms an ID.
        let slow = part(1, 851, now - 26_250);
        let fast = part(2, 1951, now - 1_000);
        let asks = plan(&[fast.clone(), slow.clone()], 2, 200, GRAIN, now, None);
        assert_eq!(asks.len(), 1, "{asks:?}");
        assert_eq!(asks[0].0.pid, 1);
        assert_eq!(asks[0].1, vec![(901, 901), (951, 951)]);
        let one = plan(&[fast, slow], 1, 200, GRAIN, now, None);
        assert_eq!(one[0].1, vec![(951, 951)], "one slot: the last chunk");
    }

    /// Early (partitions still waiting): the slow part's rest (800 IDs at 44.4 ms, 35.6
    /// s) is well past the fair share (its rest, the fast ones' and 10 s waiting, over 3
    /// parts and a free slot: 11.6 s), so it is cut into pieces of half a share in whole
    /// chunks (5.8 s, 130 IDs: 100), as many as leave its holder one such piece, more
    /// than the one free slot; the fast parts are not cut.
    #[test]
    fn early_a_straggler_is_cut_into_half_shares() {
        let now = 100_000;
        let slow = part(1, 201, now - 10_000);
        let fast = [part(2, 1401, now - 400), part(3, 2801, now - 1400)];
        let parts = vec![fast[0].clone(), slow.clone(), fast[1].clone()];
        let ahead = Ahead {
            waiting_ms: 10_000.0,
            median_ms: 1_000.0,
        };
        let asks = plan(&parts, 1, 200, GRAIN, now, Some(ahead));
        assert_eq!(asks.len(), 1, "{asks:?}");
        assert_eq!(asks[0].0.pid, 1);
        let points: Vec<u64> = asks[0].1.iter().map(|c| c.0).collect();
        assert_eq!(points, vec![301, 401, 501, 601, 701, 801, 901]);
        assert_eq!(asks[0].1[6], (901, 951), "the last piece's limit");
        // Idle, the one free slot gets one piece, a whole fair share.
        let idle = plan(&parts, 1, 200, GRAIN, now, None);
        assert_eq!(idle[0].1.len(), 1, "{idle:?}");
    }

    /// Early with much work still waiting, the slow part ends before the job would
    /// (the fair share counts the waiting partitions): nothing is cut. Nor is anything
    /// when no part has a pace yet.
    #[test]
    fn early_nothing_is_cut_while_the_rest_fits() {
        let now = 100_000;
        let parts = vec![part(1, 201, now - 10_000), part(2, 1401, now - 400)];
        let ahead = Ahead {
            waiting_ms: 1_000.0 * 1_000.0,
            median_ms: 1_000.0,
        };
        assert!(plan(&parts, 2, 200, GRAIN, now, Some(ahead)).is_empty());
        let mut untimed = part(1, 1, 0);
        untimed.claimed_ms = None;
        let ahead = Ahead {
            waiting_ms: 0.0,
            median_ms: 1_000.0,
        };
        assert!(plan(&[untimed], 2, 200, GRAIN, now, Some(ahead)).is_empty());
    }

    /// Nothing checkpointed yet: weighed by IDs left, equal shares of `split_min`.
    #[test]
    fn without_a_pace_parts_are_cut_in_equal_shares() {
        let mut a = part(1, 1, 0);
        a.claimed_ms = None;
        let asks = plan(&[a], 1, 200, GRAIN, 1_000, None);
        assert_eq!(asks[0].1, vec![(501, 801)]);
    }
}
