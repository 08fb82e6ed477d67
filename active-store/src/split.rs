//! Splitting stragglers (issue 25, "Time"): an idle worker asks for the unprocessed
//! remainder of a running partition, and the holder cuts it off in its own next beat.
//!
//! The protocol, on both backends (`lua/split.lua` has the Redis layout):
//!
//! 1. A worker with nothing to claim reads the running parts ([`Splits::split_candidates`])
//!    and asks for pieces of the ones with the most IDs left ([`Splits::request_pieces`]),
//!    as many as it has idle slots: the partition's record is marked with a request for
//!    that part, the pieces' cut points (the part's unprocessed remainder in equal
//!    shares, [`Running::cuts`]) and a limit for each (each piece keeps at least
//!    `split_min` IDs). Refused when the part is not running under the token seen, the
//!    partition already has a request waiting (unless it is for the same part and asks
//!    for fewer pieces: it is then replaced), or too little is left.
//! 2. The holder cuts in its own next beat ([`Splits::beat_parts`]), which carries `next`,
//!    the first ID it has not handed out: each piece starts at the later of its point
//!    and `next`, so nothing the holder has started or will start lies past it, and a
//!    piece whose limit `next` passed stays the holder's. The holder's last ID becomes
//!    the one before the first piece (the beat answers [`Beat::Cut`]), and each piece
//!    becomes a pending piece with its own record, token, deadline and checkpoint. A
//!    holder past every limit drops the request, and so does a part that completes
//!    first (else the partition's other parts stayed busy until it went stale). A dead
//!    holder never beats: the request waits, its lease expires, and the partition is
//!    reclaimed (with its shortened range if it was cut) from its checkpoint.
//!    Every beat answers the part's last ID now ([`Beat::last`]), cut or not: the cut
//!    is made once, in the call that finds the request, and that call's reply can be
//!    lost (a response timeout, a dropped connection, a Redis pause). The beat sent
//!    again finds no request, renews, and answers [`Beat::Renewed`] with the shortened
//!    end, as every later beat does; a holder applies the end it is told, whichever
//!    the variant. Until a beat of its answers, a holder that sent a frontier hands
//!    out nothing at or past it (the promise `next` makes).
//! 3. A piece is claimed ([`Splits::claim_pieces`]), beaten, cut in turn, released and
//!    reaped like a partition, and spends attempts like one: a failed chunk
//!    ([`Splits::fail_piece`]) or an expired lease counts one, and its last attempt (or a
//!    permanent failure) fails the piece's *partition*, which becomes whole again (see
//!    below). The partition completes when its owner part and every
//!    piece are done: the owner's [`Leases::complete`](crate::Leases::complete) with
//!    pieces outstanding only ends its lease (the partition stays running), and the last
//!    part to finish sets the completed-index bit and sends the one completed record:
//!    the partition's whole range, its owner as worker, from its first claim to the
//!    last part's end.
//!
//! 4. A split partition that fails for good is whole again, whichever part spent its
//!    last attempt: a piece's ([`Splits::fail_piece`], a piece lease reaped) or its
//!    owner part's ([`Leases::fail_with`](crate::Leases::fail_with), an owner lease
//!    reaped by [`Maintenance::reap`](crate::Maintenance::reap) or
//!    [`Maintenance::release_worker`](crate::Maintenance::release_worker)). Its record
//!    takes its planned range back, with the lowest ID any unfinished part of it had
//!    not done as its checkpoint, status failed and the failing part's reason; its split
//!    entry and every piece go, pending or running, so every other holder's lease (the
//!    owner's too) is lost. A running piece is fenced by its record's going: its
//!    holder's beat, completion, release and failure are refused as
//!    [`Error::LeaseLost`](crate::Error::LeaseLost), and a piece of the same start cut
//!    after a retry has another token. A later
//!    [`Maintenance::retry_failed`](crate::Maintenance::retry_failed) redoes it from
//!    that checkpoint, as any failed partition: what pieces had done above it is done
//!    again (at least once, as after the embedded state file's restore).
//!    [`Maintenance::discard`](crate::Maintenance::discard) of a split partition whose
//!    owner part is pending or failed makes it whole the same way, marked discarded:
//!    nothing of it is claimed or completed again. (One whose owner part is done or
//!    running is refused as leased, as any held partition.)
//!
//! **Clocks.** Deadlines are written, and leases reaped, by the clocks of the processes
//! that call: a claim or beat sets `now + lease` by its caller's clock, and
//! [`Maintenance::reap`](crate::Maintenance::reap) takes the reaper's `now`. The
//! scripts do not read the server's `TIME` for them. So the protocol's "no ID under two
//! live leases" holds only while every process's clock agrees with every other's
//! within the holder's margin: a worker stops a chunk a twelfth of a lease before its
//! lease runs out by its own count (2.5 s at the default 30 s), so a reaper whose clock
//! runs ahead of a holder's by more than that, less a beat's round trip (or a holder
//! whose clock steps back by as much between beats), can hand the range to another
//! while the first still works on it. Every store write stays fenced by the token (the
//! stale holder's beat, completion and failure are refused), so the store's state is
//! never wrong; the work itself can overlap for up to the skew. Keep the fleet's
//! clocks within that margin (NTP slews, it does not step).
//!
//! **Invariants:** no ID is under two live leases at once (a cut happens in the
//! holder's call, past everything it handed out); every checkpoint, of a partition or a
//! piece, only moves forward; a split partition stays one partition in the counts, in
//! its own status, and is completed once; no piece is retried after its partition's
//! `max_attempts` are spent on it.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tranche_codec::Status;

use crate::Result;
use crate::model::{FailOutcome, FailPolicy, Lease};

/// Which part of a partition: its owner part (the range its lease covers, from the
/// partition's first ID), or the piece starting at an ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Part {
    /// The partition's own lease.
    Owner,
    /// The piece whose first ID this is (fixed for its life).
    Piece(u64),
}

/// A running part, as [`Splits::split_candidates`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    /// The partition.
    pub pid: u64,
    /// Which part of it.
    pub part: Part,
    /// The holder's fencing token.
    pub token: u64,
    /// The holder.
    pub worker: String,
    /// The part's last ID now (it shrinks when the part is cut).
    pub max_id: u64,
    /// The part's checkpoint: every ID of it below is done.
    pub progress: u64,
    /// The partition's first ID.
    pub partition_min: u64,
    /// The partition's last ID as planned.
    pub partition_max: u64,
    /// The partition's owner (the worker its completed record names).
    pub owner: String,
    /// When the holder claimed the part (ms since the epoch, the claimer's clock), if
    /// known: with the checkpoint, how fast the holder goes ([`Running::ms_per_id`]).
    pub claimed_ms: Option<u64>,
}

impl Running {
    /// IDs of the part not yet checkpointed.
    pub fn remaining(&self) -> u64 {
        (self.max_id + 1).saturating_sub(self.progress)
    }

    /// The part's first ID: the partition's for its owner part, the piece's start.
    pub fn first(&self) -> u64 {
        match self.part {
            Part::Owner => self.partition_min,
            Part::Piece(start) => start,
        }
    }

    /// How long the holder has taken per ID so far, at `now_ms`: from its claim to its
    /// checkpoint. `None` before its first checkpoint (or with no claim time). An owner
    /// part resumed from a checkpoint counts the IDs done before its claim too, so it
    /// looks faster than it is.
    pub fn ms_per_id(&self, now_ms: u64) -> Option<f64> {
        let done = self.progress.checked_sub(self.first()).filter(|d| *d > 0)?;
        let elapsed = now_ms.checked_sub(self.claimed_ms?)?;
        Some(elapsed as f64 / done as f64)
    }

    /// The cut point and its limit for a split leaving both sides at least `split_min`
    /// IDs (the midpoint of the unprocessed remainder), or `None` if too little is left.
    pub fn cut_point(&self, split_min: u64) -> Option<(u64, u64)> {
        let split_min = split_min.max(1);
        let remaining = self.remaining();
        if remaining < split_min.saturating_mul(2) {
            return None;
        }
        Some((self.progress + remaining / 2, self.max_id + 1 - split_min))
    }

    /// The cuts for up to `pieces` pieces at once, as (first ID, highest first ID
    /// allowed) per piece: the unprocessed remainder in `pieces + 1` equal parts (fewer
    /// if each would keep less than `split_min` IDs), the holder keeping the first; each
    /// part a multiple of `grain` IDs (a chunk: no piece starts with a short chunk) and
    /// each piece left at least `split_min` IDs; at most 64 pieces. Empty if too little is
    /// left. One piece
    /// with a grain of 1 is [`cut_point`](Self::cut_point).
    pub fn cuts(&self, split_min: u64, pieces: u64, grain: u64) -> Vec<(u64, u64)> {
        let split_min = split_min.max(1);
        let remaining = self.remaining();
        let n = pieces
            .min(64)
            .min((remaining / split_min).saturating_sub(1));
        if n == 0 {
            return Vec::new();
        }
        let grain = grain.max(1);
        let share = remaining / (n + 1);
        let share = (share - share % grain).max(split_min);
        let points: Vec<u64> = (1..=n).map(|i| self.progress + i * share).collect();
        self.limits(points, split_min)
    }

    /// The cuts for up to `pieces` pieces of `size` IDs each (rounded down to whole
    /// `grain`s, at least `split_min`) off the end of the part, the holder keeping the
    /// rest (at least `split_min` IDs); equal shares ([`cuts`](Self::cuts)) if the
    /// pieces would leave it less. Pieces sized to what an idle slot does in the time
    /// the job has left, rather than halves, end together.
    pub fn cuts_of(&self, size: u64, pieces: u64, split_min: u64, grain: u64) -> Vec<(u64, u64)> {
        let (split_min, grain) = (split_min.max(1), grain.max(1));
        let size = (size - size % grain).max(split_min);
        let n = pieces.min(64);
        let remaining = self.remaining();
        match n.checked_mul(size) {
            Some(cut) if n > 0 && remaining >= cut.saturating_add(split_min) => {
                let end = self.max_id + 1;
                let points: Vec<u64> = (1..=n).rev().map(|i| end - i * size).collect();
                self.limits(points, split_min)
            }
            _ => self.cuts(split_min, pieces, grain),
        }
    }

    /// Each point with its limit: the next point (or the part's end) less `split_min`.
    fn limits(&self, points: Vec<u64>, split_min: u64) -> Vec<(u64, u64)> {
        (0..points.len())
            .map(|i| {
                let limit = points
                    .get(i + 1)
                    .map_or(self.max_id + 1 - split_min, |next| next - split_min);
                (points[i], limit)
            })
            .collect()
    }
}

/// Checks a request's cuts ([`Splits::request_pieces`]): at most 64, each limit below
/// the next point.
pub(crate) fn check_cuts(cuts: &[(u64, u64)]) -> crate::Result<()> {
    let ordered = cuts.windows(2).all(|w| w[0].1 < w[1].0);
    if cuts.len() > 64 || !ordered {
        return Err(crate::Error::InvalidArgument(format!(
            "split cuts {cuts:?}: at most 64, each limit below the next point"
        )));
    }
    Ok(())
}

/// The answer to [`Splits::request_split`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitAnswer {
    /// Marked: the holder cuts at or after `point` in its next beat.
    Requested {
        /// The requested cut point.
        point: u64,
    },
    /// The part is not running under the token seen (done, lost, reclaimed).
    NotRunning,
    /// The partition has a request waiting already.
    Busy,
    /// Too little is left to cut off a piece of `split_min` IDs.
    TooSmall,
}

/// One lease's beat with what splitting needs: a partition's lease (`piece` false) or a
/// piece's (`piece` true, `lease.min_id` the piece's start).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartBeat {
    /// The lease renewed.
    pub lease: Lease,
    /// Whether it is a piece's.
    pub piece: bool,
    /// The checkpoint: every ID below it is done.
    pub progress: u64,
    /// The first ID the holder has not handed out, which it promises not to hand out
    /// until the beat's answer arrives; `None`: do not cut.
    pub next: Option<u64>,
}

/// What a beat did to its lease, and where the lease's part ends now.
///
/// Every answer carries the part's current last ID, not only the one that cut it: a
/// beat whose reply is lost after its cut is sent again, finds no request left, and
/// must still tell the holder where its range ends (the module's step 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Beat {
    /// Renewed: the part ends at `last`, which an earlier beat's cut may have moved
    /// below the end the lease was claimed with.
    Renewed {
        /// The part's last ID now (the lease's own `max_id` if it was never cut).
        last: u64,
    },
    /// Renewed and cut in this call: the lease now ends at `last`; every later ID is
    /// another's.
    Cut {
        /// The lease's new last ID.
        last: u64,
    },
}

impl Beat {
    /// The part's last ID now, cut in this call or before: the holder hands out
    /// nothing past it.
    pub fn last(&self) -> u64 {
        match *self {
            Beat::Renewed { last } | Beat::Cut { last } => last,
        }
    }
}

/// What completing a piece did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PieceDone {
    /// The piece is done; other parts of its partition are not.
    Done,
    /// The piece was the last part: the partition completed (its bit set, its record
    /// in the inbox).
    Completed,
}

/// A piece of a split partition, for `get` and the operator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Piece {
    /// The partition.
    pub pid: u64,
    /// First ID (fixed for the piece's life).
    pub start: u64,
    /// Last ID now.
    pub max_id: u64,
    /// Pending, claimed or running.
    pub status: Status,
    /// The holder, or the last one.
    pub worker: Option<String>,
    /// The checkpoint.
    pub progress: u64,
    /// Claims so far.
    pub attempts: u32,
}

/// Splitting running partitions (the module's protocol).
#[async_trait]
pub trait Splits: Send + Sync {
    /// Every running part held under a lease: partitions' owner parts and pieces.
    async fn split_candidates(&self) -> Result<Vec<Running>>;

    /// Asks the holder of `part` to cut off the second half of its unprocessed
    /// remainder, each side keeping at least `split_min` IDs. `worker` is the asker.
    async fn request_split(
        &self,
        part: &Running,
        worker: &str,
        split_min: u64,
    ) -> Result<SplitAnswer> {
        self.request_pieces(part, worker, &part.cuts(split_min, 1, 1))
            .await
    }

    /// Asks the holder of `part` to cut off several pieces at once, so that as many
    /// idle slots get work in one beat: `cuts` has each piece's first ID and the
    /// highest first ID allowed for it ([`Running::cuts`], [`Running::cuts_of`]),
    /// increasing, each limit below the next point, at most 64; empty is
    /// [`SplitAnswer::TooSmall`]. A request waiting for the same part is replaced by
    /// one for more pieces (several idle workers' asks are served in one cut); any
    /// other waiting one makes it [`SplitAnswer::Busy`].
    async fn request_pieces(
        &self,
        part: &Running,
        worker: &str,
        cuts: &[(u64, u64)],
    ) -> Result<SplitAnswer>;

    /// Renews leases, partitions' and pieces', and cuts those asked to split (see
    /// [`PartBeat::next`]). Each has its own outcome, as
    /// [`Leases::heartbeat`](crate::Leases::heartbeat) gives it.
    async fn beat_parts(&self, beats: &[PartBeat]) -> Result<Vec<Result<Beat>>>;

    /// Claims up to `n` pending pieces for `worker` (each lease's `min_id` is its
    /// piece's start).
    async fn claim_pieces(&self, worker: &str, n: usize) -> Result<Vec<Lease>>;

    /// Completes a piece; the last part of a partition completes the partition.
    /// [`Error::LeaseLost`](crate::Error::LeaseLost) if the token is stale.
    async fn complete_piece(&self, lease: &Lease) -> Result<PieceDone>;

    /// Gives a piece back, pending again from `progress` (its attempt given back).
    async fn release_piece(&self, lease: &Lease, progress: u64) -> Result<()>;

    /// Reports a failed attempt of a piece, as
    /// [`Leases::fail_with`](crate::Leases::fail_with) does a partition's: the piece
    /// is pending again from `progress` once the backoff its attempts give (or
    /// `policy.retry_after`) is over, or, on its last attempt or a permanent failure,
    /// its partition fails for good with `error` ([`FailOutcome::Failed`]), whole
    /// again (the module's step 4).
    /// [`Error::LeaseLost`](crate::Error::LeaseLost) if the token is stale.
    async fn fail_piece(
        &self,
        lease: &Lease,
        progress: u64,
        error: &str,
        policy: FailPolicy,
    ) -> Result<FailOutcome>;

    /// The pieces of `pid` while it is active, by start.
    async fn pieces(&self, pid: u64) -> Result<Vec<Piece>>;
}
