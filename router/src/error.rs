//! The router's error type: the three layers' errors.

/// What can go wrong while routing a query.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The active layer failed (its answer comes first, so the archive's, read at the
    /// same time, was not used).
    #[error("active layer: {0}")]
    Active(#[from] tranche_active_store::Error),
    /// The archive layer failed.
    #[error("archive layer: {0}")]
    Archive(#[from] tranche_archive_store::Error),
    /// The statistics layer failed where its answer was the only one left (a batch
    /// expired or did not decode). [`Router::stats`](crate::Router::stats) does not fail
    /// this way: it answers with the active counts alone.
    #[error("statistics layer: {0}")]
    Stats(#[from] tranche_stats::Error),
}

/// `Result` with the router's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
