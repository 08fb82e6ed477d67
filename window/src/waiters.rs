//! Parked `next` and `wait` calls, and how an ack finds out whether to wake any.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::task::Waker;

/// Stands for "no waiter" in [`WaitList::first`].
pub(crate) const NONE: u64 = u64::MAX;

/// How many wakers are taken out under the lock before they are woken outside it.
const BATCH: usize = 32;

/// A set of parked futures, each waiting for the low-water mark to reach a key.
///
/// Waiters are kept in `(key, id)` order, so equal keys wake first come, first
/// served. A plain mutex is enough: only callers that actually wait take it. The
/// hot path (every ack) reads [`first`](Self::first), one atomic load, and takes the
/// lock only when a waiter could be due.
pub(crate) struct WaitList {
    /// The smallest key in `entries`, or [`NONE`] when it is empty (see
    /// [`first`](Self::first)). Written only with the lock held, so it always matches
    /// the map; read without the lock.
    first: AtomicU64,
    entries: Mutex<Entries>,
}

#[derive(Default)]
struct Entries {
    waiters: BTreeMap<(u64, u64), Waker>,
    /// Ids make equal keys distinct and order them by arrival.
    next_id: u64,
}

impl WaitList {
    pub(crate) fn new() -> Self {
        WaitList {
            first: AtomicU64::new(NONE),
            entries: Mutex::new(Entries::default()),
        }
    }

    /// The smallest registered key (at most `u64::MAX - 1`), or [`NONE`] when nobody
    /// waits.
    ///
    /// `SeqCst` pairs with the window's `SeqCst` writes: a waiter registers, then
    /// looks at the window again; an ack writes its done marker (and an advance moves
    /// the mark), then reads this. At least one of the two sees the other's write, so
    /// no wake-up is lost.
    #[inline]
    pub(crate) fn first(&self) -> u64 {
        self.first.load(SeqCst)
    }

    /// Registers a waiter under `key`, or refreshes its waker. Pass the id a previous
    /// call returned to keep the waiter's place in line.
    pub(crate) fn register(&self, key: u64, id: Option<u64>, waker: &Waker) -> u64 {
        let mut entries = self.lock();
        let id = id.unwrap_or_else(|| {
            let id = entries.next_id;
            entries.next_id += 1;
            id
        });
        match entries.waiters.entry((key, id)) {
            Entry::Occupied(mut entry) => {
                if !entry.get().will_wake(waker) {
                    entry.insert(waker.clone());
                }
            }
            Entry::Vacant(entry) => {
                entry.insert(waker.clone());
            }
        }
        self.publish_first(&entries);
        id
    }

    /// Removes a waiter. Returns `false` if it was no longer registered, that is, it
    /// has been woken.
    pub(crate) fn deregister(&self, key: u64, id: u64) -> bool {
        let mut entries = self.lock();
        let was_registered = entries.waiters.remove(&(key, id)).is_some();
        self.publish_first(&entries);
        was_registered
    }

    /// Wakes up to `limit` waiters whose key is at most `up_to`, smallest key first.
    /// Each woken waiter is removed.
    pub(crate) fn wake(&self, up_to: u64, mut limit: usize) {
        let mut batch: [Option<Waker>; BATCH] = Default::default();
        loop {
            let mut taken = 0;
            {
                let mut entries = self.lock();
                while taken < BATCH && limit > 0 {
                    match entries.waiters.first_entry() {
                        Some(entry) if entry.key().0 <= up_to => {
                            batch[taken] = Some(entry.remove());
                            taken += 1;
                            limit -= 1;
                        }
                        _ => break,
                    }
                }
                self.publish_first(&entries);
            }
            // Wake outside the lock: a waker may run arbitrary code.
            for waker in batch.iter_mut().take(taken).filter_map(Option::take) {
                waker.wake();
            }
            if taken < BATCH || limit == 0 {
                return;
            }
        }
    }

    fn publish_first(&self, entries: &Entries) {
        // A waiter keyed `u64::MAX` is published as `u64::MAX - 1`, so that `NONE`
        // always means "nobody": the hot path then takes the lock one step early,
        // finds nobody due, and no waiter can be overlooked.
        let first = entries
            .waiters
            .first_key_value()
            .map_or(NONE, |(k, _)| k.0.min(NONE - 1));
        self.first.store(first, SeqCst);
    }

    fn lock(&self) -> MutexGuard<'_, Entries> {
        // Nothing panics while the lock is held except allocation failure; the map
        // is consistent after every statement, so a poisoned lock is still usable.
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
