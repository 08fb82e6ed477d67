//! [`Error`]: what can go wrong in the library, as kinds a caller can match.
//!
//! Messages describe the problem in the library's terms (a namespace, a state file, a
//! store), never the command line's; the cause, where there is one, is the error's
//! [`source`](std::error::Error::source), not repeated in its message.

use std::path::PathBuf;

/// Any error, boxed: the cause of an [`Error`] that wraps another crate's.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A failure of the runner or a query (the store, the settings, the state file), not
/// of a chunk: a chunk's failure is its partition's, recorded in the store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The namespace has no plan where the runner looked: plan it first
    /// ([`Runner::plan`](crate::Runner::plan)).
    #[error("namespace `{namespace}` is not planned in {location}")]
    NotPlanned {
        /// The namespace.
        namespace: String,
        /// Where it was looked for: the state file, or the Redis URL (password masked).
        location: String,
    },
    /// The plan was refused (bad bounds, an overlap with an existing plan); nothing
    /// was written.
    #[error("invalid plan: {0}")]
    InvalidPlan(String),
    /// The store could not be reached (connection refused, timeout, not a Redis
    /// server).
    #[error("cannot reach the store at {location}")]
    StoreUnreachable {
        /// The Redis URL, password masked.
        location: String,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// Another live process holds the embedded state file: what this one wrote would
    /// be overwritten by its saves, or overwrite them. Nothing was written.
    #[error("the state file {} is in use by another process{}", path.display(), holder.map(|p| format!(" (pid {p})")).unwrap_or_default())]
    StateLocked {
        /// The state file.
        path: PathBuf,
        /// The process id the holder wrote in the lock file, if readable.
        holder: Option<u32>,
    },
    /// The store answered with an error (or stayed unreachable through its retries).
    #[error("the store failed")]
    Store(#[source] BoxError),
    /// Reading or writing a local file failed.
    #[error("I/O on {}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A setting is out of range or inconsistent (a namespace name, a shard count, a
    /// state file holding another namespace).
    #[error("invalid setting: {0}")]
    Config(String),
    /// The request does not fit what the store holds or the options given (a
    /// namespace recorded with other shards, a state file holding another namespace,
    /// an option only Redis has), said in one message; nothing was written.
    #[error("{0}")]
    Refused(String),
    /// The embedded state file could not be read, restored or saved: the cause is a
    /// [`StateError`](crate::embedded_state::StateError), said as it is.
    #[error(transparent)]
    State(BoxError),
    /// A repair step failed (`Job::check` with a repair): the step, said in one line,
    /// and its cause; what was repaired before it stays repaired.
    #[error("{what}")]
    RepairFailed {
        /// The step: "cannot repair the statistics of shard 3".
        what: String,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// Anything else, with its own message.
    #[error(transparent)]
    Other(BoxError),
}

impl From<tranche_active_store::Error> for Error {
    fn from(err: tranche_active_store::Error) -> Self {
        match err {
            tranche_active_store::Error::InvalidPlan(reason) => Error::InvalidPlan(reason),
            err => Error::Store(Box::new(err)),
        }
    }
}

/// A store crate's error, other than an active store's: the store failed.
macro_rules! store_error {
    ($($err:ty),+) => {$(
        impl From<$err> for Error {
            fn from(err: $err) -> Self {
                Error::Store(Box::new(err))
            }
        }
    )+};
}

store_error!(
    tranche_archive_store::Error,
    tranche_stats::Error,
    tranche_router::Error,
    redis::RedisError
);

impl From<tranche_codec::Error> for Error {
    /// A key schema or record the codec refused, with its own message.
    fn from(err: tranche_codec::Error) -> Self {
        Error::Other(Box::new(err))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_speak_of_the_library_and_chain_their_causes() {
        let err = Error::StoreUnreachable {
            location: "redis://:***@db:6379".into(),
            source: "connection refused".into(),
        };
        assert_eq!(
            err.to_string(),
            "cannot reach the store at redis://:***@db:6379"
        );
        assert_eq!(
            std::error::Error::source(&err).unwrap().to_string(),
            "connection refused"
        );
        let err = Error::StateLocked {
            path: "/x/a.state".into(),
            holder: Some(42),
        };
        assert_eq!(
            err.to_string(),
            "the state file /x/a.state is in use by another process (pid 42)"
        );
        let plan: Error = tranche_active_store::Error::InvalidPlan("max < min".into()).into();
        assert_eq!(plan.to_string(), "invalid plan: max < min", "said once");
        let leased: Error = tranche_active_store::Error::Leased(3).into();
        assert!(matches!(leased, Error::Store(_)), "{leased:?}");
        let refused = Error::Refused("namespace `a` has 2 shards, not 3".into());
        assert_eq!(refused.to_string(), "namespace `a` has 2 shards, not 3");
    }
}
