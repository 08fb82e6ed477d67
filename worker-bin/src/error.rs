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

impl From<anyhow::Error> for Error {
    /// Sorts an internal error by what it wraps: a store's error is [`Error::Store`],
    /// anything else keeps its message as [`Error::Other`].
    fn from(err: anyhow::Error) -> Self {
        let err = match err.downcast::<tranche_active_store::Error>() {
            Ok(err) => return err.into(),
            Err(err) => err,
        };
        let err = match err.downcast::<Error>() {
            Ok(err) => return err,
            Err(err) => err,
        };
        let store = err.is::<tranche_archive_store::Error>()
            || err.is::<tranche_stats::Error>()
            || err.is::<tranche_router::Error>()
            || err.is::<redis::RedisError>();
        if store {
            Error::Store(err.into())
        } else {
            Error::Other(err.into())
        }
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
        let wrapped: Error = anyhow::Error::new(tranche_active_store::Error::Leased(3)).into();
        assert!(matches!(wrapped, Error::Store(_)), "{wrapped:?}");
    }
}
