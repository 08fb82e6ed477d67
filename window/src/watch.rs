//! Watching the low-water mark move, for checkpointing.

use crate::{Error, SlidingWindow};

/// Waits for a window's [`progress`](SlidingWindow::progress) to move; made by
/// [`SlidingWindow::subscribe`].
///
/// It remembers the last value it returned and [`changed`](Self::changed) waits for
/// a larger one, so a slow reader skips intermediate values rather than queueing
/// them, like `tokio::sync::watch`. Unlike a watch channel, acks publish nothing: a
/// watcher costs acks one atomic load, and only while it is parked.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tranche_window::Error> {
/// let window = tranche_window::SlidingWindow::new(8, 0);
/// let mut checkpoints = window.subscribe();
/// let first = window.next().await?;
/// window.ack(first)?;
/// assert_eq!(checkpoints.changed().await?, 1);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct ProgressWatcher {
    window: SlidingWindow,
    /// The last value returned, or the progress at subscription.
    seen: u64,
}

impl ProgressWatcher {
    pub(crate) fn new(window: SlidingWindow) -> Self {
        let seen = window.progress();
        ProgressWatcher { window, seen }
    }

    /// The last value [`changed`](Self::changed) returned, or the progress when the
    /// watcher was made.
    pub fn seen(&self) -> u64 {
        self.seen
    }

    /// Waits until the progress exceeds [`seen`](Self::seen), then returns it and
    /// remembers it.
    ///
    /// # Errors
    ///
    /// [`Error::Closed`] if the window is closed and the progress has not moved since
    /// the last call. After a close, call [`SlidingWindow::progress`] once the work
    /// in flight has been acked to get the final checkpoint.
    pub async fn changed(&mut self) -> Result<u64, Error> {
        self.window
            .wait_for_progress(self.seen.checked_add(1))
            .await?;
        self.seen = self.window.progress();
        Ok(self.seen)
    }
}
