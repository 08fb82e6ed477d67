//! A resumable sliding window: [`SlidingWindow`] hands out sequence numbers in
//! order, takes their acks in any order, and keeps a low-water mark,
//! [`progress`](SlidingWindow::progress), below which every number is acked.
//!
//! ```
//! use tranche_window::SlidingWindow;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tranche_window::Error> {
//! let last = 309;
//! // Resume from checkpoint 300 with at most 4 numbers in the window.
//! let window = SlidingWindow::new(4, 300);
//! loop {
//!     let sn = window.next().await?; // waits while the window is full
//!     let worker = window.clone();
//!     tokio::spawn(async move {
//!         // ... process item `sn`, idempotently ...
//!         worker.ack(sn).expect("acked once");
//!     });
//!     if sn == last {
//!         break;
//!     }
//! }
//! window.wait(last).await?;
//! assert_eq!(window.progress(), 310); // the checkpoint to persist
//! # Ok(())
//! # }
//! ```
//!
//! # Progress is a low-water mark, not a record of what is done
//!
//! The window remembers which numbers are done only inside the window; what it
//! offers to persist is one number, the lowest unfinished one. After a crash, a
//! window restarted at the last checkpoint hands out every number from there again,
//! including up to `size` numbers that had finished above the mark. Processing must
//! therefore be idempotent, and the window should be no larger than it needs to be:
//! about twice the number of concurrent workers keeps them busy (a smaller window
//! stalls behind the slowest item) while bounding the rework.
//!
//! # Cost
//!
//! `next` and `ack` are a handful of atomic operations and never allocate or lock
//! unless someone has to wait: the mark moves by compare-exchange, done by whichever
//! ack finds the oldest number finished, and a parked `next` or `wait` is woken only
//! when the mark passes what it needs. The blocking variants
//! ([`next_blocking`](SlidingWindow::next_blocking),
//! [`wait_blocking`](SlidingWindow::wait_blocking)) share the same core.

mod blocking;
mod error;
mod waiters;
mod watch;
mod window;

pub use error::Error;
pub use watch::ProgressWatcher;
pub use window::SlidingWindow;
