//! What a library user writes: a [`Handler`] processes one chunk, and its
//! [`HandlerError`] says whether the attempt may be retried, and when.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tranche_active_store::FailPolicy;

/// One chunk: the IDs `from..=to` of partition `pid`, on attempt `attempt`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    /// The partition.
    pub pid: u64,
    /// The chunk's number within the partition, from 0.
    pub index: u64,
    /// First row ID of the chunk.
    pub from: u64,
    /// Last row ID of the chunk (inclusive).
    pub to: u64,
    /// The partition's attempt, from 1.
    pub attempt: u32,
    /// The fencing token of the lease the chunk runs under (`TRANCHE_FENCE` for a
    /// command): a later lease on the same range always carries a larger one. Write it
    /// beside the rows and guard each write with it, and a worker that lost its lease
    /// without knowing (paused past it, cut off from Redis) cannot overwrite what its
    /// successor wrote:
    ///
    /// ```sql
    /// UPDATE users SET email_lower = lower(email), fence = $3
    ///  WHERE id BETWEEN $1 AND $2 AND fence < $3
    /// ```
    ///
    /// A row the successor already wrote carries a larger fence and is left alone. See
    /// the guide's "Fencing your writes" and `examples/pg_backfill.rs`.
    pub fence: u64,
}

/// What processes each chunk of a partition.
#[async_trait::async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Processes the row IDs `chunk.from..=chunk.to` of partition `chunk.pid`. `Ok`
    /// acknowledges the chunk (the checkpoint moves past it once every earlier chunk
    /// is done); `Err` fails the partition's attempt, retried with back-off up to
    /// `max_attempts` unless the error says otherwise ([`HandlerError::permanent`],
    /// [`HandlerError::retry_after`]). A panic fails the attempt the same way, with
    /// the message "handler panicked: …".
    async fn process(&self, chunk: Chunk) -> Result<(), HandlerError>;

    /// [`process`](Self::process), and how many rows the chunk affected when the
    /// handler knows it. The run calls this method: the figure reaches its statistics
    /// (rows and rows per second in the summary, the `rows` counter of `/metrics`, and
    /// the `rows` of [`Event::ChunkDone`](crate::Event::ChunkDone) and
    /// [`Event::PartitionDone`](crate::Event::PartitionDone)). By default it runs
    /// `process` and reports no figure (`None`); a handler that counts overrides it
    /// and lets `process` call it, as [`SqlHandler`](crate::SqlHandler) does with
    /// its statement's command tag.
    async fn process_counted(&self, chunk: Chunk) -> Result<Option<u64>, HandlerError> {
        self.process(chunk).await.map(|()| None)
    }
}

/// Why a chunk failed, and what to do about it.
///
/// Any error converts into one with `?` (an ordinary failure: retried with back-off
/// until `max_attempts` are spent). [`permanent`](Self::permanent) fails the partition
/// at once, without a retry (a row no retry can fix); [`retry_after`](Self::retry_after)
/// retries it after the delay it names (a rate limit's `Retry-After`).
///
/// It deliberately does not implement [`std::error::Error`] itself (no more than
/// `Box<dyn Error>` does), so that every error can convert into it.
pub struct HandlerError {
    error: Box<dyn std::error::Error + Send + Sync>,
    policy: FailPolicy,
}

impl HandlerError {
    /// A failure no retry can fix: the partition ends failed now, whatever attempts
    /// are left.
    pub fn permanent(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self {
            error: error.into(),
            policy: FailPolicy {
                permanent: true,
                retry_after: None,
            },
        }
    }

    /// A failure to retry after `delay` rather than the back-off (if attempts are
    /// left).
    pub fn retry_after(
        error: impl Into<Box<dyn std::error::Error + Send + Sync>>,
        delay: Duration,
    ) -> Self {
        Self {
            error: error.into(),
            policy: FailPolicy {
                permanent: false,
                retry_after: Some(delay),
            },
        }
    }

    /// Whether the partition fails at once.
    pub fn is_permanent(&self) -> bool {
        self.policy.permanent
    }

    /// The delay asked for before the retry, if any.
    pub fn retry_delay(&self) -> Option<Duration> {
        self.policy.retry_after
    }

    /// The error itself.
    pub fn into_inner(self) -> Box<dyn std::error::Error + Send + Sync> {
        self.error
    }

    pub(crate) fn policy(&self) -> FailPolicy {
        self.policy
    }
}

impl<E: Into<Box<dyn std::error::Error + Send + Sync>>> From<E> for HandlerError {
    fn from(error: E) -> Self {
        Self {
            error: error.into(),
            policy: FailPolicy::default(),
        }
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerError")
            .field("error", &self.error)
            .field("permanent", &self.policy.permanent)
            .field("retry_after", &self.policy.retry_after)
            .finish()
    }
}

/// A shared handler, as the run loop holds it.
#[derive(Clone)]
pub(crate) struct HandlerRef(pub(crate) Arc<dyn Handler>);

impl fmt::Debug for HandlerRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Handler")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn question_mark(fail: bool) -> Result<(), HandlerError> {
        if fail {
            Err(std::io::Error::other("disk full"))?;
        }
        Ok(())
    }

    #[test]
    fn any_error_converts_and_keeps_its_message() {
        let err = question_mark(true).unwrap_err();
        assert_eq!(err.to_string(), "disk full");
        assert!(!err.is_permanent());
        assert_eq!(err.retry_delay(), None);
        let err: HandlerError = "plain text".into();
        assert_eq!(err.to_string(), "plain text");
        let err = HandlerError::permanent("bad row");
        assert!(err.is_permanent());
        let err = HandlerError::retry_after("429", Duration::from_secs(3));
        assert_eq!(err.retry_delay(), Some(Duration::from_secs(3)));
    }
}
