//! The statistics layer's error type.

/// What can go wrong in the statistics layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Redis answered with an error or could not be reached.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// Redis holds something this version cannot read (written by a newer version, or
    /// corrupted).
    #[error("corrupt statistics in {key}: {detail}")]
    Corrupt {
        /// The key (and field) holding the bad value.
        key: String,
        /// What was wrong with it.
        detail: String,
    },
}

/// `Result` with the statistics layer's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
