//! The archive store's error type.

/// What can go wrong in the archive layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A bad setting or argument, such as a zero batch or inverted tier thresholds.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Redis answered with an error, or stayed unreachable after the retries.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// Redis returned something this version cannot read.
    #[error("corrupt state in {key}: {detail}")]
    Corrupt {
        /// The key (or key and field) holding the bad value.
        key: String,
        /// What was wrong with it.
        detail: String,
    },
    /// The statistics layer refused (a damaged shard's statistics refuse every delta
    /// until repaired).
    #[error(transparent)]
    Stats(#[from] tranche_stats::Error),
    /// A key-schema or encoding error from the codec.
    #[error(transparent)]
    Codec(#[from] tranche_codec::Error),
}

/// `Result` with the archive store's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
