//! [`RunDefaults`]: the one statement of a run's defaults, read by the library's
//! builder ([`Runner`](crate::Runner), [`Plan`](crate::Plan)) and by `tranche run`'s
//! and `tranche plan`'s flags (clap's `default_value_t`), so the two ways to run a job
//! cannot drift apart.

use std::time::Duration;

/// A run's defaults. Durations are written as people write them (`30s`), which is how
/// `--help` shows them; [`RunDefaults::duration`] reads one.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunDefaults {
    /// Row IDs per partition. 1,000: with the default chunk of 100 a partition is ten
    /// chunks, so a lost lease redoes at most 1,000 IDs and a split has pieces to cut,
    /// while a claim round trip is spread over a partition's ten chunks.
    pub(crate) partition_size: u64,
    /// Row IDs per chunk.
    pub(crate) chunk: u64,
    /// Chunks of one partition in flight at once.
    pub(crate) parallel: u32,
    /// Partitions processed at once by one worker.
    pub(crate) concurrency: u32,
    /// The smallest piece a split cuts off, in chunks.
    pub(crate) split_min: u64,
    /// Attempts before a partition ends failed.
    pub(crate) max_attempts: u32,
    /// Lease length.
    pub(crate) lease: &'static str,
    /// Back-off before the first retry, doubling after.
    pub(crate) backoff: &'static str,
    /// How long a shutdown lets running chunks finish.
    pub(crate) grace: &'static str,
}

impl RunDefaults {
    /// The defaults.
    pub(crate) const RUN: RunDefaults = RunDefaults {
        partition_size: 1_000,
        chunk: 100,
        parallel: 4,
        concurrency: 2,
        split_min: 4,
        max_attempts: 5,
        lease: "30s",
        backoff: "1s",
        grace: "10s",
    };

    /// One of the durations above, parsed.
    pub(crate) fn duration(text: &str) -> Duration {
        crate::duration::parse(text).expect("the defaults are valid durations")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_default_duration_parses() {
        let d = RunDefaults::RUN;
        assert_eq!(RunDefaults::duration(d.lease), Duration::from_secs(30));
        assert_eq!(RunDefaults::duration(d.backoff), Duration::from_secs(1));
        assert_eq!(RunDefaults::duration(d.grace), Duration::from_secs(10));
    }
}
