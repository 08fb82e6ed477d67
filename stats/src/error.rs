//! The statistics layer's error type.

/// What can go wrong in the statistics layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Redis answered with an error or could not be reached.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// A shard number outside the namespace's shards.
    #[error("shard {shard} does not exist: the namespace has {shards} shards")]
    InvalidShard {
        /// The shard asked for.
        shard: u32,
        /// How many shards the namespace has.
        shards: u32,
    },
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
