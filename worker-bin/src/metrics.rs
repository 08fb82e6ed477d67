//! Prometheus metrics of a run for a library user's own registry
//! ([`Runner::metrics`](crate::Runner::metrics), feature `metrics`), built from the
//! run's [`Event`]s as any subscriber would: the runner itself keeps no metric and
//! serves nothing; the application mounts its registry where it likes. The families
//! are named as `tranche run --metrics-listen` names its own (`claimed`, `completed`,
//! `failed_attempts`, `released`, `lost_leases`, `rows`, `partitions_in_flight`,
//! `chunks_in_flight`, `chunk_duration_seconds`, `store_errors`), so one dashboard reads
//! both.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
pub(crate) use prometheus_client::registry::Registry;

use crate::event::Event;

/// What a run was doing when a call to its store failed ([`crate::StoreOp`]'s name).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabel {
    op: &'static str,
}

/// The metric families of one runner, registered once, fed by every run's events.
#[derive(Clone)]
pub(crate) struct RunMetrics {
    claimed: Counter,
    completed: Counter,
    attempts_failed: Counter,
    failed: Counter,
    released: Counter,
    lost: Counter,
    rows: Counter,
    in_flight: Gauge,
    chunks_in_flight: Gauge,
    chunk_seconds: Histogram,
    partition_seconds: Histogram,
    store_errors: Family<OpLabel, Counter>,
}

impl RunMetrics {
    /// Registers the families in `registry` (under the prefix `tranche_worker`).
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let m = Self {
            claimed: Counter::default(),
            completed: Counter::default(),
            attempts_failed: Counter::default(),
            failed: Counter::default(),
            released: Counter::default(),
            lost: Counter::default(),
            rows: Counter::default(),
            in_flight: Gauge::default(),
            chunks_in_flight: Gauge::default(),
            chunk_seconds: Histogram::new(exponential_buckets(0.001, 4.0, 10)),
            partition_seconds: Histogram::new(exponential_buckets(0.01, 4.0, 10)),
            store_errors: Family::default(),
        };
        let r = registry.sub_registry_with_prefix("tranche_worker");
        r.register(
            "claimed",
            "Partitions this runner claimed",
            m.claimed.clone(),
        );
        r.register(
            "completed",
            "Partitions this runner completed",
            m.completed.clone(),
        );
        r.register(
            "failed_attempts",
            "Attempts that failed here (retried or not)",
            m.attempts_failed.clone(),
        );
        r.register(
            "partitions_failed",
            "Partitions that ended failed here",
            m.failed.clone(),
        );
        r.register(
            "released",
            "Partitions given back unfinished",
            m.released.clone(),
        );
        r.register(
            "lost_leases",
            "Leases lost while running here",
            m.lost.clone(),
        );
        r.register(
            "rows",
            "Rows the chunks affected here, when the handler counts them",
            m.rows.clone(),
        );
        r.register(
            "partitions_in_flight",
            "Partitions running now (sampled each second)",
            m.in_flight.clone(),
        );
        r.register(
            "chunks_in_flight",
            "Chunks running now (sampled each second)",
            m.chunks_in_flight.clone(),
        );
        r.register(
            "chunk_duration_seconds",
            "How long the handler took per chunk",
            m.chunk_seconds.clone(),
        );
        r.register(
            "store_errors",
            "Calls to the store that failed, by what the run was doing",
            m.store_errors.clone(),
        );
        r.register(
            "partition_seconds",
            "How long a partition took here, claim to completion",
            m.partition_seconds.clone(),
        );
        m
    }

    /// Counts one event.
    pub(crate) fn observe(&self, event: &Event) {
        match event {
            Event::Claimed { .. } => {
                self.claimed.inc();
            }
            Event::ChunkDone { duration, rows, .. } => {
                self.chunk_seconds.observe(duration.as_secs_f64());
                if let Some(rows) = rows {
                    self.rows.inc_by(*rows);
                }
            }
            Event::PartitionDone { duration, .. } => {
                self.completed.inc();
                self.partition_seconds.observe(duration.as_secs_f64());
            }
            Event::AttemptFailed { retry_in, .. } => {
                self.attempts_failed.inc();
                if retry_in.is_none() {
                    self.failed.inc();
                }
            }
            Event::Released { .. } => {
                self.released.inc();
            }
            Event::LeaseLost { .. } => {
                self.lost.inc();
            }
            Event::Progress(p) => {
                self.in_flight.set(p.in_flight as i64);
                self.chunks_in_flight.set(p.chunks_in_flight as i64);
            }
            Event::StoreError { op, .. } => {
                self.store_errors
                    .get_or_create(&OpLabel { op: op.as_str() })
                    .inc();
            }
            Event::Throttled { .. } | Event::Resumed => {}
        }
    }
}
