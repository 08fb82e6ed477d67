//! The one error type of the crate.

/// Why a window operation failed.
///
/// Every misuse (acking twice, acking a number the window never handed out) is
/// reported here and leaves the window untouched: a buggy caller can lose its own
/// acks, but never makes [`progress`](crate::SlidingWindow::progress) pass an
/// unfinished sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The window was closed; `next` and `wait` no longer wait.
    #[error("the sliding window is closed")]
    Closed,
    /// The window is full: `try_next` would have to wait for the low-water mark to move.
    #[error("the sliding window is full")]
    Full,
    /// The sequence number was acknowledged before.
    #[error("sequence number {sn} was already acknowledged")]
    AlreadyAcked {
        /// The offending sequence number.
        sn: u64,
    },
    /// The sequence number was never handed out by this window: it lies below the
    /// window's start or at or above the next number `next` would return.
    #[error("sequence number {sn} was never handed out by this window")]
    NotIssued {
        /// The offending sequence number.
        sn: u64,
    },
    /// Every sequence number below `u64::MAX` has been handed out.
    #[error("the sequence numbers are exhausted")]
    Exhausted,
}
