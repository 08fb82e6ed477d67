//! The seed's resume story: process items through the window, stop midway, restart
//! a new window at the persisted `progress()`, and finish. Every item is done; an
//! item is done twice only if it lay inside the window at the stop.
//!
//! Item durations are simulated with tokio's paused clock, so the runs are exact and
//! take no real time.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinSet;
use tranche_window::SlidingWindow;

/// How often each item was processed.
type Done = Arc<Mutex<BTreeMap<u64, u32>>>;

/// Runs the seed's loop: take a number, process it in its own task (a random 0-49 ms
/// of simulated work, then record it, then ack), until `last` is handed out or the
/// clock reaches `stop_at`. At the stop, items in flight are abandoned as a crash
/// would, possibly after being recorded but before their ack. Returns the numbers
/// handed out and the checkpoint to persist.
async fn run(
    window: SlidingWindow,
    last: u64,
    stop_at: Option<Duration>,
    done: Done,
    seed: u64,
) -> (Vec<u64>, u64) {
    let started = tokio::time::Instant::now();
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut in_flight = JoinSet::new();
    let mut handed_out = Vec::new();
    let dispatch = async {
        loop {
            let sn = window.next().await.unwrap();
            handed_out.push(sn);
            let (window, done) = (window.clone(), done.clone());
            let work = Duration::from_millis(rng.random_range(0..50));
            in_flight.spawn(async move {
                tokio::time::sleep(work).await;
                *done.lock().unwrap().entry(sn).or_default() += 1;
                // A crash may fall between the work and its ack.
                tokio::task::yield_now().await;
                window.ack(sn).unwrap();
            });
            if sn == last {
                break;
            }
        }
        window.wait(last).await.unwrap();
    };
    match stop_at {
        Some(at) => {
            tokio::select! {
                biased; // a due stop wins, so the outcome depends on the seed alone
                () = tokio::time::sleep_until(started + at) => {}
                () = dispatch => {}
            }
        }
        None => dispatch.await,
    }
    in_flight.abort_all();
    window.close();
    (handed_out, window.progress())
}

/// Runs the story and returns the checkpoint and how many items were done twice.
async fn story(size: usize, first: u64, last: u64, stop_at: Duration, seed: u64) -> (u64, usize) {
    let done = Done::default();
    let (before, checkpoint) = run(
        SlidingWindow::new(size, first),
        last,
        Some(stop_at),
        done.clone(),
        seed,
    )
    .await;
    // In order from the start, possibly nothing at all if the stop came first.
    let issued = first..first + before.len() as u64;
    assert_eq!(before, issued.collect::<Vec<_>>());
    assert!((first..=last + 1).contains(&checkpoint));
    // Everything below the checkpoint is done; above it, only a window's width.
    let done_before = done.lock().unwrap().clone();
    for sn in first..checkpoint {
        assert_eq!(
            done_before.get(&sn),
            Some(&1),
            "sn {sn} below the checkpoint"
        );
    }
    for &sn in done_before.keys() {
        assert!(
            sn < checkpoint + size as u64,
            "{sn} is done beyond the window"
        );
    }

    if checkpoint <= last {
        let (after, end) = run(
            SlidingWindow::new(size, checkpoint),
            last,
            None,
            done.clone(),
            seed + 1,
        )
        .await;
        // The restarted window hands out exactly the unfinished tail, in order.
        assert_eq!(after, (checkpoint..=last).collect::<Vec<_>>());
        assert_eq!(end, last + 1);
    }

    let done = done.lock().unwrap();
    let mut redone = 0;
    for sn in first..=last {
        let times = done.get(&sn).copied().unwrap_or(0);
        let in_window = (checkpoint..checkpoint + size as u64).contains(&sn);
        match times {
            1 => {}
            2 if in_window => redone += 1, // finished above the mark before the stop
            _ => panic!("sn {sn} done {times} times (checkpoint {checkpoint})"),
        }
    }
    (checkpoint, redone)
}

#[tokio::test(start_paused = true)]
async fn the_seed_example_resumed_midway() {
    // The seed: 1000 items, a window of 100, starting at 300.
    let (checkpoint, redone) = story(100, 300, 999, Duration::from_millis(120), 1).await;
    assert!((301..999).contains(&checkpoint), "stopped at {checkpoint}");
    assert!((1..100).contains(&redone), "{redone} redone");
}

#[tokio::test(start_paused = true)]
async fn a_run_without_a_stop_processes_each_item_once() {
    let done = Done::default();
    let (handed_out, end) = run(SlidingWindow::new(8, 0), 99, None, done.clone(), 3).await;
    assert_eq!(handed_out, (0..100).collect::<Vec<_>>());
    assert_eq!(end, 100);
    assert!(done.lock().unwrap().values().all(|&n| n == 1));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn any_stop_resumes_to_each_item_once_or_redone_within_the_window(
        size in 1usize..40,
        first in 0u64..1000,
        len in 1u64..300,
        stop_ms in 0u64..400,
        seed in any::<u64>(),
    ) {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap()
            .block_on(story(size, first, first + len - 1, Duration::from_millis(stop_ms), seed));
    }
}
