//! The window against a plain model (a set of outstanding numbers), one operation at
//! a time: every result, every error and every `progress()` must match.

use std::collections::BTreeSet;

use proptest::prelude::*;
use tranche_window::{Error, SlidingWindow};

/// The obvious, slow sliding window.
struct Model {
    size: u64,
    start: u64,
    next: u64,
    outstanding: BTreeSet<u64>,
}

impl Model {
    fn progress(&self) -> u64 {
        self.outstanding.first().copied().unwrap_or(self.next)
    }

    fn try_next(&mut self) -> Result<u64, Error> {
        if self.next == u64::MAX {
            return Err(Error::Exhausted);
        }
        if self.next - self.progress() >= self.size {
            return Err(Error::Full);
        }
        self.outstanding.insert(self.next);
        self.next += 1;
        Ok(self.next - 1)
    }

    fn ack(&mut self, sn: u64) -> Result<(), Error> {
        if sn < self.start || sn >= self.next {
            Err(Error::NotIssued { sn })
        } else if self.outstanding.remove(&sn) {
            Ok(())
        } else {
            Err(Error::AlreadyAcked { sn })
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Next,
    /// Ack an outstanding number, picked by index.
    AckHeld(usize),
    /// Ack any number near the window, valid or not.
    AckNear(i64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => Just(Op::Next),
        4 => any::<usize>().prop_map(Op::AckHeld),
        1 => (-20i64..40).prop_map(Op::AckNear),
    ]
}

fn start() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0), any::<u64>(), (u64::MAX - 40)..=u64::MAX]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn matches_the_model(
        size in 1usize..20,
        start in start(),
        ops in prop::collection::vec(op(), 0..300),
    ) {
        let window = SlidingWindow::new(size, start);
        let mut model = Model {
            size: size as u64,
            start,
            next: start,
            outstanding: BTreeSet::new(),
        };
        for op in ops {
            match op {
                Op::Next => prop_assert_eq!(window.try_next(), model.try_next()),
                Op::AckHeld(i) => {
                    if model.outstanding.is_empty() {
                        continue;
                    }
                    let sn = *model.outstanding.iter().nth(i % model.outstanding.len()).unwrap();
                    prop_assert_eq!(window.ack(sn), model.ack(sn));
                }
                Op::AckNear(offset) => {
                    let sn = model.progress().saturating_add_signed(offset);
                    prop_assert_eq!(window.ack(sn), model.ack(sn));
                }
            }
            prop_assert_eq!(window.progress(), model.progress());
        }
    }
}

/// Each misuse gives its own error and leaves the window as it was.
#[test]
fn misuse_is_an_error_not_corruption() {
    #[track_caller]
    fn check(acks: &[u64], expect: &[Result<(), Error>], progress: u64) {
        // Numbers 100..=103 are handed out; window of 4, so 104 is not.
        let window = SlidingWindow::new(4, 100);
        for _ in 0..4 {
            window.try_next().unwrap();
        }
        let got: Vec<_> = acks.iter().map(|&sn| window.ack(sn)).collect();
        assert_eq!(got, expect, "acks {acks:?}");
        assert_eq!(window.progress(), progress, "acks {acks:?}");
    }
    use Error::{AlreadyAcked, NotIssued};

    check(&[101, 101], &[Ok(()), Err(AlreadyAcked { sn: 101 })], 100);
    // Below the mark: acked before, even though the slot no longer says so.
    check(&[100, 100], &[Ok(()), Err(AlreadyAcked { sn: 100 })], 101);
    check(&[104], &[Err(NotIssued { sn: 104 })], 100);
    check(&[u64::MAX], &[Err(NotIssued { sn: u64::MAX })], 100);
    // Below the start: from before the checkpoint, not from this window.
    check(&[99], &[Err(NotIssued { sn: 99 })], 100);
    check(&[0], &[Err(NotIssued { sn: 0 })], 100);
}

/// A number acked long ago, whose slot has since served later laps, is still
/// recognised as acked.
#[test]
fn a_stale_ack_after_many_laps_is_rejected() {
    let window = SlidingWindow::new(2, 0);
    for sn in 0..1000 {
        assert_eq!(window.try_next(), Ok(sn));
        window.ack(sn).unwrap();
    }
    for sn in [0, 1, 2, 500, 997, 998, 999] {
        assert_eq!(window.ack(sn), Err(Error::AlreadyAcked { sn }));
    }
    assert_eq!(window.progress(), 1000);
}

#[test]
fn the_last_number_is_never_handed_out() {
    let window = SlidingWindow::new(3, u64::MAX - 2);
    assert_eq!(window.try_next(), Ok(u64::MAX - 2));
    assert_eq!(window.try_next(), Ok(u64::MAX - 1));
    assert_eq!(window.try_next(), Err(Error::Exhausted));
    window.ack(u64::MAX - 1).unwrap();
    window.ack(u64::MAX - 2).unwrap();
    assert_eq!(window.progress(), u64::MAX);
    assert_eq!(window.next_blocking(), Err(Error::Exhausted));
}

#[test]
fn sizes_that_are_not_powers_of_two_bound_the_window_exactly() {
    for size in [1, 3, 5, 7, 9, 31, 33, 100] {
        let window = SlidingWindow::new(size, 0);
        for sn in 0..size as u64 {
            assert_eq!(window.try_next(), Ok(sn));
        }
        assert_eq!(window.try_next(), Err(Error::Full), "size {size}");
        window.ack(0).unwrap();
        assert_eq!(window.try_next(), Ok(size as u64));
        assert_eq!(window.try_next(), Err(Error::Full), "size {size}");
    }
}

#[test]
fn a_window_needs_a_slot() {
    let made = std::panic::catch_unwind(|| SlidingWindow::new(0, 0));
    let message = *made.unwrap_err().downcast::<&str>().unwrap();
    assert_eq!(message, "a sliding window needs at least one slot");
}
