//! A lease whose beat failed stays frozen: no chunk past its last known end is handed
//! out until a beat is answered. The beat that failed may have cut the lease in the
//! store (its reply lost), so the holder must not trust the end it knew. Driven through
//! a store whose `beat_parts` fails on demand, the whole call or one lease's answer.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::FutureExt;
use tokio::time::Instant;
use tranche_active_store::{
    Beat, Config, Error, FailOutcome, FailPolicy, Lease, Leases, MemoryActiveStore, PartBeat,
    Piece, PieceDone, Plan, Planner, Result, Running, SplitAnswer, Splits,
};

use super::LeaseBook;

/// How [`Flaky::beat_parts`] answers.
const ANSWER: u8 = 0;
/// The whole call fails (a timeout, a dropped connection).
const FAIL_CALL: u8 = 1;
/// Each lease's beat fails on its own (its record unreadable), the call answered.
const FAIL_EACH: u8 = 2;

/// A memory store's splitting (what `LeaseBook::beat` calls) whose `beat_parts` fails
/// while told to; everything else passes through, and the test plans and claims on
/// the inner store.
struct Flaky {
    inner: MemoryActiveStore,
    beats: AtomicU8,
}

#[async_trait]
impl Splits for Flaky {
    async fn split_candidates(&self) -> Result<Vec<Running>> {
        self.inner.split_candidates().await
    }
    async fn request_split(
        &self,
        part: &Running,
        worker: &str,
        split_min: u64,
    ) -> Result<SplitAnswer> {
        self.inner.request_split(part, worker, split_min).await
    }
    async fn request_pieces(
        &self,
        part: &Running,
        worker: &str,
        cuts: &[(u64, u64)],
    ) -> Result<SplitAnswer> {
        self.inner.request_pieces(part, worker, cuts).await
    }
    async fn beat_parts(&self, beats: &[PartBeat]) -> Result<Vec<Result<Beat>>> {
        let broken = || Error::Corrupt {
            key: "flaky".into(),
            detail: "told to fail".into(),
        };
        match self.beats.load(Relaxed) {
            FAIL_CALL => Err(broken()),
            FAIL_EACH => Ok(beats.iter().map(|_| Err(broken())).collect()),
            _ => self.inner.beat_parts(beats).await,
        }
    }
    async fn claim_pieces(&self, worker: &str, n: usize) -> Result<Vec<Lease>> {
        self.inner.claim_pieces(worker, n).await
    }
    async fn complete_piece(&self, lease: &Lease) -> Result<PieceDone> {
        self.inner.complete_piece(lease).await
    }
    async fn release_piece(&self, lease: &Lease, progress: u64) -> Result<()> {
        self.inner.release_piece(lease, progress).await
    }
    async fn fail_piece(
        &self,
        lease: &Lease,
        progress: u64,
        error: &str,
        policy: FailPolicy,
    ) -> Result<FailOutcome> {
        self.inner.fail_piece(lease, progress, error, policy).await
    }
    async fn pieces(&self, pid: u64) -> Result<Vec<Piece>> {
        self.inner.pieces(pid).await
    }
}

/// Whether the hold hands out the chunk from `from` now, without waiting.
async fn hands_out(hold: &super::Hold, from: u64) -> Option<Option<u64>> {
    hold.issue(from, 50).now_or_never()
}

/// Each way a beat can fail (the call, or the lease's own answer) freezes the lease
/// until a beat is answered, and the answer's end applies.
#[tokio::test]
async fn a_lease_whose_beat_failed_stays_frozen_until_one_is_answered() {
    for failure in [FAIL_CALL, FAIL_EACH] {
        let store = Flaky {
            inner: MemoryActiveStore::new(Config::default()).unwrap(),
            beats: AtomicU8::new(ANSWER),
        };
        store
            .inner
            .plan(&Plan::Uniform {
                min: 1,
                max: 1000,
                size: 1000,
            })
            .await
            .unwrap();
        let lease = store.inner.claim("me", 1).await.unwrap().remove(0);
        let min = lease.min_id;
        let book = Arc::new(LeaseBook::new(Duration::from_secs(30), true));
        let hold = book.hold(&lease, false, Instant::now());
        assert_eq!(hands_out(&hold, min).await, Some(Some(min + 49)));
        hold.advance(min + 50);
        // Answered: running, and so a candidate for splitting.
        book.beat(&store, &|_| {}, false).await;

        store.beats.store(failure, Relaxed);
        book.beat(&store, &|_| {}, false).await;
        assert_eq!(
            hands_out(&hold, min + 50).await,
            None,
            "failure {failure}: frozen after a failed beat"
        );
        book.beat(&store, &|_| {}, false).await;
        assert_eq!(
            hands_out(&hold, min + 50).await,
            None,
            "failure {failure}: still frozen after a second"
        );
        assert!(!hold.is_lost(), "a failed beat is no lost lease");

        // Cut meanwhile (the failed beat's, its reply lost): the answered beat tells
        // the end, and issuing goes on up to it.
        let part = store.split_candidates().await.unwrap().remove(0);
        store
            .request_pieces(&part, "other", &[(min + 500, min + 999)])
            .await
            .unwrap();
        store.beats.store(ANSWER, Relaxed);
        book.beat(&store, &|_| {}, false).await;
        assert_eq!(hold.end(), min + 499, "failure {failure}: the cut applies");
        assert_eq!(hands_out(&hold, min + 50).await, Some(Some(min + 99)));
        assert_eq!(
            hands_out(&hold, min + 500).await,
            Some(None),
            "past the cut"
        );
    }
}
