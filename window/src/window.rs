//! The window itself: the lock-free fast path and the parking slow path.

use std::fmt;
use std::future::poll_fn;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::task::{Context, Poll};

use crate::Error;
use crate::blocking::block_on;
use crate::waiters::{NONE, WaitList};
use crate::watch::ProgressWatcher;

/// A sliding window over sequence numbers: hands them out in order, takes their
/// acks in any order, and reports the low-water mark below which every number is
/// acked.
///
/// `next` hands out `sn` only while `sn < progress() + size`, so at most `size`
/// numbers separate the oldest unfinished one from the newest handed out. That bound
/// is what a restart from [`progress`](Self::progress) may redo.
///
/// A `SlidingWindow` is a handle: cloning it is cheap and every clone refers to the
/// same window, so it can be moved into as many tasks or threads as needed (it is
/// `Send + Sync`, and `Arc<SlidingWindow>` works as well).
#[derive(Clone)]
pub struct SlidingWindow {
    shared: Arc<Shared>,
}

/// The state every handle shares.
///
/// Memory orderings: every atomic access here is `SeqCst`. On x86-64 that costs
/// nothing beyond the locked instructions the read-modify-writes need anyway, and the
/// wake-up protocol relies on a single total order (see [`WaitList::first`]).
struct Shared {
    /// `next` and the low-water mark.
    head: CachePadded<Head>,
    /// One done marker per ring slot: the slot of `sn` holds `sn + 1` once `sn` is
    /// acked. A marker names its number rather than being a flag, so slots need no
    /// clearing when the window slides, and the value a slot must hold before `sn` is
    /// acked is known exactly (see [`Shared::ack`]).
    slots: Box<[AtomicU64]>,
    /// `slots.len() - 1`; the ring length is `size` rounded up to a power of two.
    mask: u64,
    /// How ring positions are spread over the cache lines of `slots`.
    spread: Spread,
    /// The most numbers between the low-water mark and `next`.
    size: u64,
    /// The first number this window hands out; acks below it were never issued.
    start: u64,
    /// Set once by `close`; `next` and `wait` fail from then on.
    closed: AtomicBool,
    /// Parked `next` calls, all under key 0, first come first served.
    space: WaitList,
    /// Parked `wait` calls, keyed by the low-water mark they need.
    progress: WaitList,
}

impl SlidingWindow {
    /// Creates a window of `size` slots whose first sequence number is `start`.
    ///
    /// To resume after a stop, pass the last checkpointed [`progress`](Self::progress)
    /// as `start`. The window allocates 8 bytes per slot, `size` rounded up to a power
    /// of two.
    ///
    /// # Panics
    ///
    /// If `size` is zero (such a window could never hand out a number), or too large
    /// to allocate.
    pub fn new(size: usize, start: u64) -> Self {
        assert!(size > 0, "a sliding window needs at least one slot");
        let len = size
            .checked_next_power_of_two()
            .expect("sliding window size too large");
        let slots = (0..len).map(|_| AtomicU64::new(0)).collect();
        SlidingWindow {
            shared: Arc::new(Shared {
                head: CachePadded(Head {
                    next: AtomicU64::new(start),
                    low: AtomicU64::new(start),
                }),
                slots,
                mask: len as u64 - 1,
                spread: Spread::new(len),
                size: size as u64,
                start,
                closed: AtomicBool::new(false),
                space: WaitList::new(),
                progress: WaitList::new(),
            }),
        }
    }

    /// Hands out the next sequence number, waiting while the window is full.
    ///
    /// # Errors
    ///
    /// [`Error::Closed`] once the window is closed, including while waiting;
    /// [`Error::Exhausted`] after `u64::MAX - 1` has been handed out.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future never loses a number, and a wake-up it
    /// received passes on to the next waiter.
    pub async fn next(&self) -> Result<u64, Error> {
        match self.shared.try_reserve() {
            Err(Error::Full) => self.next_slow().await,
            done => done,
        }
    }

    /// Hands out the next sequence number without waiting.
    ///
    /// # Errors
    ///
    /// [`Error::Full`] if the window is full, otherwise as [`next`](Self::next).
    pub fn try_next(&self) -> Result<u64, Error> {
        self.shared.try_reserve()
    }

    /// Hands out the next sequence number, blocking the thread while the window is
    /// full. Do not call it from an async task: it would block the executor thread.
    ///
    /// # Errors
    ///
    /// As [`next`](Self::next).
    pub fn next_blocking(&self) -> Result<u64, Error> {
        match self.shared.try_reserve() {
            Err(Error::Full) => block_on(self.next_slow()),
            done => done,
        }
    }

    /// Marks `sn` as done. Once every number below it is done too,
    /// [`progress`](Self::progress) is past it, and any `next` or `wait` this frees is
    /// woken.
    ///
    /// Acks still count after [`close`](Self::close), so work already in flight can
    /// finish and be reflected in [`progress`](Self::progress).
    ///
    /// # Errors
    ///
    /// [`Error::AlreadyAcked`] if `sn` was acked before, [`Error::NotIssued`] if this
    /// window never handed it out. Either way the window is unchanged.
    pub fn ack(&self, sn: u64) -> Result<(), Error> {
        self.shared.ack(sn)
    }

    /// Waits until every sequence number up to and including `target` is acked.
    ///
    /// Numbers below the window's start count as acked, and `target` need not have
    /// been handed out yet.
    ///
    /// # Errors
    ///
    /// [`Error::Closed`] if the window is closed before `target` is reached.
    pub async fn wait(&self, target: u64) -> Result<(), Error> {
        self.wait_for_progress(target.checked_add(1)).await
    }

    /// Blocks the thread until every sequence number up to and including `target` is
    /// acked. Do not call it from an async task.
    ///
    /// # Errors
    ///
    /// As [`wait`](Self::wait).
    pub fn wait_blocking(&self, target: u64) -> Result<(), Error> {
        block_on(self.wait(target))
    }

    /// The low-water mark: every sequence number below it is acked, and the one at it
    /// is not (or has not been handed out yet). This is the checkpoint to persist; a
    /// restart at it redoes at most `size` numbers.
    ///
    /// Acks do not move the mark themselves unless someone waits; this call catches it
    /// up, scanning the acks since the last move.
    pub fn progress(&self) -> u64 {
        self.shared.advance()
    }

    /// Returns a watcher that waits for [`progress`](Self::progress) to move, for a
    /// task that persists checkpoints. Watching costs acks nothing while the watcher
    /// is not parked in [`ProgressWatcher::changed`].
    pub fn subscribe(&self) -> ProgressWatcher {
        ProgressWatcher::new(self.clone())
    }

    /// Closes the window: every parked and future `next` and `wait` fails with
    /// [`Error::Closed`]. Acks keep working. Closing twice is harmless.
    pub fn close(&self) {
        self.shared.closed.store(true, SeqCst);
        // A waiter registers under the list lock and then checks `closed`, so after
        // these calls every waiter has either been woken or will see the flag.
        self.shared.space.wake(u64::MAX, usize::MAX);
        self.shared.progress.wake(u64::MAX, usize::MAX);
    }

    /// Whether [`close`](Self::close) has been called.
    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(SeqCst)
    }

    /// The window size given to [`new`](Self::new).
    pub fn size(&self) -> usize {
        self.shared.size as usize
    }

    /// Waits until the low-water mark reaches `mark` (`None`: a mark it can never
    /// reach, so only `close` ends the wait).
    pub(crate) async fn wait_for_progress(&self, mark: Option<u64>) -> Result<(), Error> {
        let shared = &*self.shared;
        let reached = || mark.is_some_and(|mark| shared.advance() >= mark);
        if reached() {
            return Ok(());
        }
        let mut parked = Parked::new(&shared.progress, mark.unwrap_or(u64::MAX), false);
        poll_fn(|cx| {
            parked.poll_with(cx, || {
                if reached() {
                    Some(Ok(()))
                } else if shared.closed.load(SeqCst) {
                    Some(Err(Error::Closed))
                } else {
                    None
                }
            })
        })
        .await
    }

    async fn next_slow(&self) -> Result<u64, Error> {
        let shared = &*self.shared;
        let mut parked = Parked::new(&shared.space, 0, true);
        poll_fn(|cx| {
            parked.poll_with(cx, || match shared.try_reserve() {
                Err(Error::Full) => None,
                done => Some(done),
            })
        })
        .await
    }
}

impl Shared {
    /// The fast path of `next`: claims a number with one compare-exchange.
    #[inline]
    fn try_reserve(&self) -> Result<u64, Error> {
        if self.closed.load(SeqCst) {
            return Err(Error::Closed);
        }
        let head = &self.head.0;
        let mut sn = head.next.load(SeqCst);
        let mut low = head.low.load(SeqCst);
        loop {
            if sn == u64::MAX {
                // `u64::MAX` is never handed out: acking it would need a mark of 2^64.
                return Err(Error::Exhausted);
            }
            if sn >= low.saturating_add(self.size) {
                // The bound may lag behind the acks; only the exact mark says full.
                let exact = self.advance();
                if exact == low {
                    return Err(Error::Full);
                }
                low = exact;
                sn = head.next.load(SeqCst);
                continue;
            }
            // A stale `sn` (below a newer `low`) only makes this exchange fail.
            match head.next.compare_exchange(sn, sn + 1, SeqCst, SeqCst) {
                Ok(_) => return Ok(sn),
                Err(current) => sn = current,
            }
        }
    }

    #[inline]
    fn ack(&self, sn: u64) -> Result<(), Error> {
        // `next` only grows, so a number below it has been handed out for good.
        if sn < self.start || sn >= self.head.0.next.load(SeqCst) {
            return Err(Error::NotIssued { sn });
        }
        // The slot last served `sn - len`, which was acked before `sn` could be
        // handed out (the window is at most `len` wide), so it holds exactly that
        // number's marker, or 0 if `sn` is the slot's first use. Anything else means
        // `sn` itself, or a later lap, which needs `sn` acked, has been there: a
        // repeated or stale ack, and the exchange leaves the slot alone.
        let previous = sn
            .checked_sub(self.mask + 1)
            .filter(|&before| before >= self.start)
            .map_or(0, |before| before + 1);
        if let Err(actual) = self
            .slot(sn)
            .compare_exchange(previous, sn + 1, SeqCst, SeqCst)
        {
            debug_assert!(actual > sn, "slot of {sn} holds {actual}");
            return Err(Error::AlreadyAcked { sn });
        }
        // Parked callers need the mark moved now; everyone else moves it when they
        // need it. `SeqCst` on both sides: a waiter registers, then scans the
        // markers; this ack wrote its marker, then reads the lists. One of the two
        // sees the other, so no wake-up is lost.
        if self.space.first() != NONE || self.progress.first() != NONE {
            self.advance();
        }
        Ok(())
    }

    /// Moves the low-water mark over every acked number at its head, wakes whoever
    /// that frees, and returns the mark.
    ///
    /// Several threads may run this at once: each scans the run of markers from the
    /// mark it read and publishes the run's end by compare-exchange, retrying from
    /// the newer mark if it lost.
    fn advance(&self) -> u64 {
        let mark = &self.head.0.low;
        let mut low = mark.load(SeqCst);
        loop {
            let mut end = low;
            while self.is_acked(end) {
                end += 1;
            }
            if end == low {
                return low;
            }
            // Every number in `low..end` was seen acked, and markers are permanent;
            // the exchange succeeds only if no one moved the mark meanwhile, so no
            // slot in the run can have been reused for a later lap.
            match mark.compare_exchange(low, end, SeqCst, SeqCst) {
                Ok(_) => {
                    self.advanced(low, end);
                    low = end;
                }
                Err(current) => low = current,
            }
        }
    }

    /// Wakes whoever the move of the mark from `from` to `to` lets through.
    #[inline]
    fn advanced(&self, from: u64, to: u64) {
        if self.space.first() != NONE {
            // Each freed slot can serve one parked `next`.
            self.space
                .wake(0, usize::try_from(to - from).unwrap_or(usize::MAX));
        }
        if self.progress.first() <= to {
            self.progress.wake(to, usize::MAX);
        }
    }

    #[inline]
    fn is_acked(&self, sn: u64) -> bool {
        // `u64::MAX` is never issued; its `sn + 1` would wrap to the initial 0.
        sn != u64::MAX && self.slot(sn).load(SeqCst) == sn + 1
    }

    #[inline]
    fn slot(&self, sn: u64) -> &AtomicU64 {
        // Consecutive numbers go to different cache lines (see `spread`), so threads
        // acking neighbours do not fight over one line.
        &self.slots[self.spread.index(sn & self.mask) as usize]
    }
}

/// Where ring position `r` lives in `slots`: with `L` lines of eight slots, at slot
/// `r / L` of line `r % L`. Neighbouring numbers, which different threads hold at the
/// same time, thus share a cache line only every `L` positions.
struct Spread {
    /// `L - 1`, with `L` the number of lines (1 for rings shorter than two lines).
    lines_mask: u64,
    /// `log2(L)`.
    line_bits: u32,
}

/// `log2` of the `AtomicU64` slots in a 64-byte cache line.
const SLOTS_PER_LINE_BITS: u32 = 3;

impl Spread {
    fn new(len: usize) -> Self {
        let lines = (len >> SLOTS_PER_LINE_BITS).max(1) as u64;
        Spread {
            lines_mask: lines - 1,
            line_bits: lines.trailing_zeros(),
        }
    }

    #[inline]
    fn index(&self, ring: u64) -> u64 {
        ((ring & self.lines_mask) << SLOTS_PER_LINE_BITS) | (ring >> self.line_bits)
    }
}

/// The counters every `next` reads and writes, together on one cache line: a `next`
/// then costs one line transfer between threads, not two.
struct Head {
    /// The next sequence number `next` hands out. Written only by a successful
    /// compare-exchange in [`Shared::try_reserve`].
    next: AtomicU64,
    /// A lower bound of the low-water mark: every number below it is acked. It is
    /// moved lazily, by compare-exchange over the acked run at its head, by whoever
    /// needs the exact value: `next` when the bound says the window is full,
    /// `progress`, `wait`, and acks while someone is parked. An ack nobody waits for
    /// therefore costs one atomic write.
    low: AtomicU64,
}

/// A future's place in a [`WaitList`], removed when the future completes or drops.
struct Parked<'a> {
    list: &'a WaitList,
    key: u64,
    id: Option<u64>,
    /// Whether a wake-up this waiter received and did not use must go to the next
    /// waiter: true for `next`, where one freed slot wakes exactly one waiter.
    pass_on: bool,
    /// Whether the future returned `Ready`: a wake-up it received was used.
    done: bool,
}

impl<'a> Parked<'a> {
    fn new(list: &'a WaitList, key: u64, pass_on: bool) -> Self {
        Parked {
            list,
            key,
            id: None,
            pass_on,
            done: false,
        }
    }

    /// Polls `attempt`, registering before the second try so that a wake-up between
    /// the two cannot be missed.
    fn poll_with<T>(&mut self, cx: &mut Context<'_>, attempt: impl Fn() -> Option<T>) -> Poll<T> {
        if let Some(out) = attempt() {
            self.done = true;
            return Poll::Ready(out);
        }
        self.id = Some(self.list.register(self.key, self.id, cx.waker()));
        match attempt() {
            Some(out) => {
                self.done = true;
                Poll::Ready(out)
            }
            None => Poll::Pending,
        }
    }
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            let woken = !self.list.deregister(self.key, id);
            if woken && self.pass_on && !self.done {
                self.list.wake(self.key, 1);
            }
        }
    }
}

/// Keeps hot atomics on cache lines of their own (two lines, against adjacent-line
/// prefetch), so writes to them do not evict the read-only fields beside them.
#[repr(align(128))]
struct CachePadded<T>(T);

impl fmt::Debug for SlidingWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shared = &*self.shared;
        f.debug_struct("SlidingWindow")
            .field("progress", &shared.advance())
            .field("next", &shared.head.0.next.load(SeqCst))
            .field("size", &shared.size)
            .field("closed", &shared.closed.load(SeqCst))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_is_a_permutation_that_separates_neighbours() {
        for len in [1usize, 2, 4, 8, 16, 64, 1024] {
            let spread = Spread::new(len);
            let index = |ring| spread.index(ring);
            let mut seen = vec![false; len];
            for ring in 0..len as u64 {
                let i = index(ring) as usize;
                assert!(!seen[i], "len {len}: index {i} used twice");
                seen[i] = true;
                if len >= 16 && ring > 0 {
                    assert_ne!(
                        i / 8,
                        index(ring - 1) as usize / 8,
                        "len {len}, ring {ring}"
                    );
                }
            }
        }
    }
}
