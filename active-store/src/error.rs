//! The active store's error type.

/// What can go wrong in the active layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The plan was rejected (bad bounds, overlap with an existing plan); nothing was
    /// written.
    #[error("invalid plan: {0}")]
    InvalidPlan(String),
    /// The lease is no longer held by its token: it expired and was reaped, or it was
    /// completed, failed or released already. Nothing was changed.
    #[error("lease lost: partition {pid} is no longer held by token {token}")]
    LeaseLost {
        /// The partition.
        pid: u64,
        /// The stale token.
        token: u64,
    },
    /// A bad argument, such as a worker id with a `|` or an out-of-range shard count.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The partition is leased, so the operation would pull it from under a worker.
    #[error("partition {0} is leased by a worker; release or reap it first")]
    Leased(u64),
    /// Redis answered with an error, or stayed unreachable after the retries.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// Redis returned something this version cannot read (a record written by a newer
    /// version, or a corrupted one).
    #[error("corrupt state in {key}: {detail}")]
    Corrupt {
        /// The key (or key and field) holding the bad value.
        key: String,
        /// What was wrong with it.
        detail: String,
    },
    /// The namespace is recorded with another shard count or key layout than this
    /// process opened it with (planned at the same time by another process, or by a
    /// version that records no layout). Nothing more is written under the other layout.
    #[error("namespace `{namespace}` is recorded with {recorded}, not {wanted}; open it again")]
    NamespaceMismatch {
        /// The namespace.
        namespace: String,
        /// What `{ns}:meta` records.
        recorded: String,
        /// What this process opened it with.
        wanted: String,
    },
    /// An error shared by every completion of one group-commit script call.
    #[error(transparent)]
    Shared(std::sync::Arc<Error>),
    /// A key-schema or encoding error from the codec.
    #[error(transparent)]
    Codec(#[from] tranche_codec::Error),
}

/// `Result` with the active store's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Whether the same call cannot succeed by being repeated: Redis refused it for
    /// what it is (an error raised inside a script, a missing ACL permission, keys in
    /// two slots), or what it read is corrupt or malformed. A dropped connection, a
    /// timeout, a failover (`MOVED`, `TRYAGAIN`, `CLUSTERDOWN`, `READONLY`,
    /// `LOADING`) or a lost lease is not permanent.
    pub fn is_permanent(&self) -> bool {
        use redis::{ErrorKind, ServerErrorKind};
        match self {
            Error::Redis(err) => matches!(
                err.kind(),
                ErrorKind::Server(
                    ServerErrorKind::ResponseError
                        | ServerErrorKind::NoPerm
                        | ServerErrorKind::CrossSlot
                ) | ErrorKind::AuthenticationFailed
                    | ErrorKind::UnexpectedReturnType
            ),
            Error::Shared(inner) => inner.is_permanent(),
            Error::Corrupt { .. }
            | Error::InvalidArgument(_)
            | Error::Codec(_)
            | Error::NamespaceMismatch { .. } => true,
            Error::InvalidPlan(_) | Error::LeaseLost { .. } | Error::Leased(_) => false,
        }
    }
}
