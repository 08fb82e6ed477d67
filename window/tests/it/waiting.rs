//! When parked `next` and `wait` calls wake: exactly when the mark allows, on close,
//! and after a cancelled waiter. Futures are polled by hand with a counting waker,
//! so every assertion is about ordering, never about time.

use crate::common;

use common::Polled;
use tranche_window::{Error, SlidingWindow};

fn issue(window: &SlidingWindow, n: usize) -> Vec<u64> {
    (0..n).map(|_| window.try_next().unwrap()).collect()
}

#[test]
fn wait_wakes_exactly_when_the_target_is_acked() {
    let window = SlidingWindow::new(8, 10);
    issue(&window, 5); // 10..=14
    let mut wait = Polled::new(window.wait(13));
    assert_eq!(wait.poll(), None);

    // Everything but the oldest: the mark stays at 10.
    for sn in [13, 11, 14, 12] {
        window.ack(sn).unwrap();
        assert_eq!(wait.wakes(), 0, "woken early, after acking {sn}");
    }
    assert_eq!(wait.poll(), None);
    assert_eq!(window.progress(), 10);

    window.ack(10).unwrap();
    assert_eq!(wait.wakes(), 1);
    assert_eq!(wait.poll(), Some(Ok(())));
    assert_eq!(window.progress(), 15);
}

#[test]
fn wait_wakes_only_the_waiters_whose_target_is_reached() {
    let window = SlidingWindow::new(8, 0);
    issue(&window, 4);
    let mut near = Polled::new(window.wait(1));
    let mut far = Polled::new(window.wait(3));
    assert_eq!((near.poll(), far.poll()), (None, None));

    window.ack(0).unwrap();
    window.ack(1).unwrap();
    assert_eq!((near.wakes(), far.wakes()), (1, 0));
    assert_eq!(near.poll(), Some(Ok(())));
    assert_eq!(far.poll(), None);

    window.ack(3).unwrap();
    assert_eq!(far.wakes(), 0);
    window.ack(2).unwrap();
    assert_eq!(far.wakes(), 1);
    assert_eq!(far.poll(), Some(Ok(())));
}

#[test]
fn wait_returns_at_once_for_a_target_already_reached() {
    let window = SlidingWindow::new(4, 100);
    // Below the start counts as done: that is what resuming from a checkpoint means.
    assert_eq!(Polled::new(window.wait(99)).poll(), Some(Ok(())));
    let sn = window.try_next().unwrap();
    window.ack(sn).unwrap();
    assert_eq!(Polled::new(window.wait(100)).poll(), Some(Ok(())));
}

#[test]
fn wait_for_a_number_not_yet_handed_out() {
    let window = SlidingWindow::new(2, 0);
    let mut wait = Polled::new(window.wait(3));
    assert_eq!(wait.poll(), None);
    for _ in 0..4 {
        let sn = window.try_next().unwrap();
        assert_eq!(wait.wakes(), 0);
        window.ack(sn).unwrap();
    }
    assert_eq!(wait.wakes(), 1);
    assert_eq!(wait.poll(), Some(Ok(())));
}

#[test]
fn next_waits_for_the_oldest_not_for_any_ack() {
    let window = SlidingWindow::new(3, 0);
    issue(&window, 3);
    let mut next = Polled::new(window.next());
    assert_eq!(next.poll(), None);

    // Acking the newer numbers frees nothing: the window slides only at its start.
    window.ack(1).unwrap();
    window.ack(2).unwrap();
    assert_eq!(next.wakes(), 0);
    assert_eq!(next.poll(), None);

    window.ack(0).unwrap();
    assert_eq!(next.wakes(), 1);
    assert_eq!(next.poll(), Some(Ok(3)));
}

#[test]
fn each_freed_slot_wakes_one_next_in_arrival_order() {
    let window = SlidingWindow::new(2, 0);
    issue(&window, 2);
    let mut first = Polled::new(window.next());
    let mut second = Polled::new(window.next());
    let mut third = Polled::new(window.next());
    assert_eq!(
        (first.poll(), second.poll(), third.poll()),
        (None, None, None)
    );

    window.ack(0).unwrap();
    assert_eq!((first.wakes(), second.wakes(), third.wakes()), (1, 0, 0));
    assert_eq!(first.poll(), Some(Ok(2)));

    window.ack(1).unwrap();
    assert_eq!((second.wakes(), third.wakes()), (1, 0));
    assert_eq!(second.poll(), Some(Ok(3)));
    assert_eq!(third.poll(), None);
}

#[test]
fn a_cancelled_next_passes_its_wake_up_on() {
    let window = SlidingWindow::new(1, 0);
    issue(&window, 1);
    let mut first = Polled::new(window.next());
    let mut second = Polled::new(window.next());
    assert_eq!((first.poll(), second.poll()), (None, None));

    window.ack(0).unwrap();
    assert_eq!((first.wakes(), second.wakes()), (1, 0));
    drop(first); // woken, never used the slot
    assert_eq!(second.wakes(), 1);
    assert_eq!(second.poll(), Some(Ok(1)));
}

#[test]
fn a_cancelled_wait_leaves_the_others_waiting() {
    let window = SlidingWindow::new(4, 0);
    issue(&window, 1);
    let mut kept = Polled::new(window.wait(0));
    let mut dropped = Polled::new(window.wait(0));
    assert_eq!((kept.poll(), dropped.poll()), (None, None));
    drop(dropped);
    window.ack(0).unwrap();
    assert_eq!(kept.wakes(), 1);
    assert_eq!(kept.poll(), Some(Ok(())));
}

#[test]
fn close_wakes_parked_next_and_wait() {
    let window = SlidingWindow::new(1, 0);
    issue(&window, 1);
    let mut next = Polled::new(window.next());
    let mut wait = Polled::new(window.wait(5));
    assert_eq!((next.poll(), wait.poll()), (None, None));

    window.close();
    assert_eq!((next.wakes(), wait.wakes()), (1, 1));
    assert_eq!(next.poll(), Some(Err(Error::Closed)));
    assert_eq!(wait.poll(), Some(Err(Error::Closed)));
    assert!(window.is_closed());
}

#[test]
fn after_close_acks_still_count_and_reached_waits_still_succeed() {
    let window = SlidingWindow::new(4, 0);
    issue(&window, 2);
    window.close();
    window.close(); // harmless
    assert_eq!(window.try_next(), Err(Error::Closed));
    assert_eq!(Polled::new(window.next()).poll(), Some(Err(Error::Closed)));

    window.ack(0).unwrap();
    window.ack(1).unwrap();
    assert_eq!(window.progress(), 2);
    assert_eq!(Polled::new(window.wait(1)).poll(), Some(Ok(())));
    assert_eq!(Polled::new(window.wait(2)).poll(), Some(Err(Error::Closed)));
}

#[test]
fn close_wakes_a_thread_blocked_in_next_and_in_wait() {
    let window = SlidingWindow::new(1, 0);
    issue(&window, 1);
    let blocked_next = std::thread::spawn({
        let window = window.clone();
        move || window.next_blocking()
    });
    let blocked_wait = std::thread::spawn({
        let window = window.clone();
        move || window.wait_blocking(0)
    });
    // Whether the threads parked before this or not, both must end with `Closed`.
    window.close();
    assert_eq!(blocked_next.join().unwrap(), Err(Error::Closed));
    assert_eq!(blocked_wait.join().unwrap(), Err(Error::Closed));
}

#[test]
fn blocking_next_resumes_when_the_slot_is_freed() {
    let window = SlidingWindow::new(1, 7);
    let sn = window.next_blocking().unwrap();
    let blocked = std::thread::spawn({
        let window = window.clone();
        move || window.next_blocking()
    });
    window.ack(sn).unwrap();
    assert_eq!(blocked.join().unwrap(), Ok(8));
    window.wait_blocking(7).unwrap();
}

#[test]
fn watcher_reports_each_move_and_then_close() {
    let window = SlidingWindow::new(4, 0);
    let mut watcher = window.subscribe();
    assert_eq!(watcher.seen(), 0);
    issue(&window, 3);

    let mut changed = Polled::new(async move {
        let first = watcher.changed().await;
        (first, watcher)
    });
    assert!(changed.poll().is_none());
    window.ack(1).unwrap();
    assert_eq!(changed.wakes(), 0);
    window.ack(0).unwrap();
    assert_eq!(changed.wakes(), 1);
    let (first, mut watcher) = changed.poll().unwrap();
    assert_eq!(first, Ok(2));

    // A move before the next call is reported at once, even after close.
    window.ack(2).unwrap();
    window.close();
    assert_eq!(Polled::new(watcher.changed()).poll(), Some(Ok(3)));
    assert_eq!(
        Polled::new(watcher.changed()).poll(),
        Some(Err(Error::Closed))
    );
    assert_eq!(watcher.seen(), 3);
}

#[test]
fn a_wait_at_the_top_of_the_sequence_wakes() {
    let window = SlidingWindow::new(2, u64::MAX - 2);
    let sn = window.try_next().unwrap();
    let last = window.try_next().unwrap();
    assert_eq!(last, u64::MAX - 1);
    let mut wait = Polled::new(window.wait(last));
    assert_eq!(wait.poll(), None);
    window.ack(last).unwrap();
    window.ack(sn).unwrap();
    assert_eq!(wait.wakes(), 1);
    assert_eq!(wait.poll(), Some(Ok(())));
}

#[test]
fn handles_and_futures_can_move_between_threads() {
    fn send_sync<T: Send + Sync>(_: &T) {}
    fn send<T: Send>(_: &T) {}
    let window = SlidingWindow::new(1, 0);
    send_sync(&window);
    send_sync(&std::sync::Arc::new(window.clone()));
    send(&window.next());
    send(&window.wait(0));
    let mut watcher = window.subscribe();
    send(&watcher.changed());
    send_sync(&watcher);
    send_sync(&Error::Closed);
}
