//! Many threads and tasks taking numbers and acking them in random order, some acking
//! twice on purpose, while a checker keeps verifying that `progress()` never passes
//! a number that has not been acked.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};

use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tranche_window::{Error, SlidingWindow};

/// What the workers did, per sequence number.
struct Ledger {
    /// Set just before `ack(sn)` is called.
    acking: Vec<AtomicBool>,
    /// Successful acks.
    acked: Vec<AtomicU32>,
}

impl Ledger {
    fn new(len: usize) -> Self {
        Ledger {
            acking: (0..len).map(|_| AtomicBool::new(false)).collect(),
            acked: (0..len).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    fn ack(&self, window: &SlidingWindow, sn: u64) {
        self.acking[sn as usize].store(true, SeqCst);
        window.ack(sn).expect("first ack");
        self.acked[sn as usize].fetch_add(1, SeqCst);
    }

    /// Checks that every number in `from..to` has been (at least) on its way to an ack.
    /// An ack's flag is set before the ack, and the mark moves only after the ack, so
    /// a number below an observed mark must have its flag set.
    fn check_below(&self, from: u64, to: u64) {
        for sn in from..to {
            assert!(
                self.acking[sn as usize].load(SeqCst),
                "progress reached {to} but {sn} was never acked"
            );
        }
    }
}

/// Takes up to `batch` numbers (the first may wait), acks them in random order, and
/// sometimes acks one again, which must fail. Returns once it has been handed a
/// number at or beyond `total`.
fn worker(window: &SlidingWindow, ledger: &Ledger, total: u64, seed: u64) {
    let mut rng = SmallRng::seed_from_u64(seed);
    loop {
        let mut held = vec![window.next_blocking().unwrap()];
        // Only the first may block: a worker waiting for a slot must hold nothing,
        // or all workers could wait on each other.
        for _ in 1..rng.random_range(1..=4) {
            match window.try_next() {
                Ok(sn) => held.push(sn),
                Err(Error::Full) => break,
                Err(e) => panic!("{e}"),
            }
        }
        held.shuffle(&mut rng);
        let last = *held.iter().max().unwrap();
        for sn in held {
            if rng.random_ratio(1, 4) {
                std::thread::yield_now();
            }
            ledger.ack(window, sn);
            if rng.random_ratio(1, 16) {
                assert_eq!(window.ack(sn), Err(Error::AlreadyAcked { sn }));
            }
        }
        if last >= total {
            return;
        }
    }
}

fn run_threads(size: usize, threads: usize, total: u64) {
    let window = SlidingWindow::new(size, 0);
    let ledger = Arc::new(Ledger::new(total as usize + size + 8 * threads));
    let done = Arc::new(AtomicBool::new(false));
    let checker = std::thread::spawn({
        let (window, ledger, done) = (window.clone(), ledger.clone(), done.clone());
        move || {
            let mut seen = 0;
            while !done.load(SeqCst) {
                let progress = window.progress();
                assert!(progress >= seen, "progress went back");
                ledger.check_below(seen, progress);
                seen = progress;
            }
        }
    });
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (window, ledger) = (window.clone(), ledger.clone());
            std::thread::spawn(move || worker(&window, &ledger, total, t as u64))
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    done.store(true, SeqCst);
    checker.join().unwrap();

    // Every number handed out was acked exactly once, and the mark is past them all.
    let end = window.progress();
    assert!(end > total);
    assert_eq!(window.try_next(), Ok(end), "nothing is outstanding");
    for sn in 0..end {
        assert_eq!(ledger.acked[sn as usize].load(SeqCst), 1, "sn {sn}");
    }
}

#[test]
fn threads_acking_in_random_order_never_let_progress_pass_an_unacked_number() {
    for (size, threads) in [(1, 2), (2, 4), (3, 3), (8, 4), (16, 8), (64, 4)] {
        run_threads(size, threads, 5_000);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tasks_acking_in_random_order_never_let_progress_pass_an_unacked_number() {
    for (size, tasks) in [(1, 8), (4, 32), (10, 64), (100, 256)] {
        let total = 10_000u64;
        let window = SlidingWindow::new(size, 0);
        let ledger = Arc::new(Ledger::new(total as usize + size + tasks));

        // The checker follows every move through a watcher rather than polling.
        let mut watcher = window.subscribe();
        let checker = tokio::spawn({
            let ledger = ledger.clone();
            async move {
                let mut seen = 0;
                while let Ok(progress) = watcher.changed().await {
                    assert!(progress > seen);
                    ledger.check_below(seen, progress);
                    seen = progress;
                }
                seen
            }
        });
        let waiter = tokio::spawn({
            let window = window.clone();
            async move {
                window.wait(total - 1).await.unwrap();
                window.progress()
            }
        });

        let mut workers = tokio::task::JoinSet::new();
        for t in 0..tasks {
            let (window, ledger) = (window.clone(), ledger.clone());
            workers.spawn(async move {
                let mut rng = SmallRng::seed_from_u64(t as u64);
                loop {
                    let sn = window.next().await.unwrap();
                    for _ in 0..rng.random_range(0..3) {
                        tokio::task::yield_now().await;
                    }
                    ledger.ack(&window, sn);
                    if sn >= total {
                        return;
                    }
                }
            });
        }
        while let Some(joined) = workers.join_next().await {
            joined.unwrap();
        }
        assert!(waiter.await.unwrap() >= total);
        window.close();
        let seen = checker.await.unwrap();
        assert_eq!(seen, window.progress());
        for sn in 0..seen {
            assert_eq!(ledger.acked[sn as usize].load(SeqCst), 1, "sn {sn}");
        }
    }
}
