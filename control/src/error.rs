//! The crate's one error type.

/// What can go wrong controlling a namespace.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Redis refused or failed a call (a script's validation error included).
    #[error(transparent)]
    Redis(#[from] redis::RedisError),
    /// An argument is out of range or malformed; nothing was written.
    #[error("invalid {what}: {why}")]
    Invalid {
        /// The argument.
        what: &'static str,
        /// Why it was refused.
        why: String,
    },
    /// The stored control record or log entry could not be decoded.
    #[error("corrupt control data: {0}")]
    Corrupt(String),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn invalid(what: &'static str, why: impl Into<String>) -> Self {
        Error::Invalid {
            what,
            why: why.into(),
        }
    }
}
