//! What a run reports to its caller: [`RunReport`], built from the run loop's own
//! report when the run ends.

use std::time::Duration;

use crate::work;

/// What a run did: this runner's own work, and where the namespace (every worker's)
/// stood when it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunReport {
    /// What this runner did.
    pub this_runner: RunnerReport,
    /// The namespace as a whole when the run ended.
    pub namespace: NamespaceReport,
    /// Whether the shutdown ended the run.
    pub interrupted: bool,
    /// How long the run took.
    pub elapsed: Duration,
}

/// What one runner did in one run ([`RunReport::this_runner`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunnerReport {
    /// Partitions completed here.
    pub completed: u64,
    /// Partitions that ended failed here (their last attempt ran here), in order.
    pub failed_pids: Vec<u64>,
    /// Attempts that failed here (each retried, or ending failed).
    pub attempts_failed: u64,
    /// Partitions given back unfinished (a drain).
    pub released: u64,
    /// Leases lost (expired while running here; another worker may have redone them).
    pub lost: u64,
    /// The median time a partition completed here took (zero before the first).
    pub partition_p50: Duration,
    /// The 99th percentile of the same.
    pub partition_p99: Duration,
    /// Rows the chunks run here affected, when the handler counts them
    /// ([`Handler::process_counted`](crate::Handler::process_counted)).
    pub rows: Option<u64>,
}

/// Where the namespace stood when a run ended ([`RunReport::namespace`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct NamespaceReport {
    /// Partitions that ended failed, by any worker, in any run.
    pub failed: u64,
    /// Partitions still outstanding (pending, claimed or running).
    pub outstanding: u64,
}

impl RunReport {
    /// The caller's view of the run loop's `report`.
    pub(super) fn of(report: work::Report) -> Self {
        let quantile = |q: f64| {
            let h = &report.durations_ms;
            Duration::from_millis(if h.is_empty() {
                0
            } else {
                h.value_at_quantile(q)
            })
        };
        let (partition_p50, partition_p99) = (quantile(0.5), quantile(0.99));
        RunReport {
            this_runner: RunnerReport {
                completed: report.completed,
                failed_pids: report.failed_pids,
                attempts_failed: report.failed_attempts,
                released: report.released,
                lost: report.lost,
                partition_p50,
                partition_p99,
                rows: report.rows,
            },
            namespace: NamespaceReport {
                failed: report.counts.failed,
                outstanding: report.counts.outstanding(),
            },
            interrupted: report.interrupted,
            elapsed: report.elapsed,
        }
    }
}
