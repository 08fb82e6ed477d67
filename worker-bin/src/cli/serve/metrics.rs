//! `/metrics`: the namespace's state as Prometheus metrics (OpenMetrics text), read in
//! O(shards) per scrape: the same counters `status` and `health` read, never a walk
//! over partitions. Names follow Prometheus conventions: base units (seconds, bytes),
//! `_total` on counters, one metric with a label where values partition a whole
//! (`tranche_partitions{state}`, `tranche_workers{state}`).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::App;
use super::api::ApiError;
use crate::cli::admin::Admin;

/// The OpenMetrics content type.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QuantileLabel {
    quantile: &'static str,
}

/// What a run was doing when a call to its store failed.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabel {
    op: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WorkerQuantileLabel {
    worker: String,
    quantile: &'static str,
}

/// The layer a read went to: `active`, `archive` or `stats` (and `inbox` for a
/// completed partition not archived yet).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct LayerLabel {
    layer: &'static str,
}

type FloatGauge = Gauge<f64, AtomicU64>;

/// How long this server's reads of each layer took, over its lifetime: observed on
/// every scrape (one read of each layer) and every `get` (labelled by the layer that
/// answered).
#[derive(Clone)]
pub(crate) struct QueryLatency(Family<LayerLabel, Histogram, fn() -> Histogram>);

impl QueryLatency {
    pub(crate) fn new() -> Self {
        // 100 µs .. ~3 s.
        Self(Family::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0001, 2.5, 12))
        }))
    }

    /// Records a read of `layer` that started at `started`.
    pub(crate) fn observe(&self, layer: &'static str, started: Instant) {
        self.0
            .get_or_create(&LayerLabel { layer })
            .observe(started.elapsed().as_secs_f64());
    }

    /// Times `read` as a read of `layer`.
    async fn time<T>(&self, layer: &'static str, read: impl Future<Output = T>) -> T {
        let started = Instant::now();
        let out = read.await;
        self.observe(layer, started);
        out
    }
}

fn gauge(registry: &mut Registry, name: &str, help: &str, value: u64) {
    let g: Gauge = Gauge::default();
    g.set(i64::try_from(value).unwrap_or(i64::MAX));
    registry.register(name, help, g);
}

/// A counter read from the store (the store keeps the count; each scrape reports it).
fn counter(registry: &mut Registry, name: &str, help: &str, value: u64) {
    let c: Counter = Counter::default();
    c.inc_by(value);
    registry.register(name, help, c);
}

fn text_response(registry: &Registry) -> Result<Response, ApiError> {
    let mut text = String::new();
    encode(&mut text, registry).map_err(|e| anyhow::anyhow!("encoding metrics: {e}"))?;
    Ok(([(header::CONTENT_TYPE, OPENMETRICS)], text).into_response())
}

/// What one scrape reads of the namespace, each value read once, store by store.
struct Reading {
    counts: tranche_active_store::StatusCounts,
    total: u64,
    workers: Vec<tranche_active_store::WorkerState>,
    paused: bool,
    /// The statistics summary; its default when it does not decode (`unreadable`).
    summary: tranche_stats::StatsSummary,
    unreadable: bool,
    decode_failures: u64,
    dead_letters: u64,
    stalls: Vec<tranche_archive_store::Stall>,
    archive_damaged: usize,
    inbox: u64,
    oldest: Option<u64>,
    memory: Option<u64>,
    control: Option<tranche_control::ControlRecord>,
    /// This server's clock less the Redis server's, ms (`None` embedded).
    clock_skew_ms: Option<i64>,
}

impl Reading {
    /// Reads every figure a scrape reports, the reads of each layer timed.
    async fn read(app: &App) -> Result<Self, ApiError> {
        let backend = app.backend().await?;
        let q = &app.query_latency;
        let counts = q.time("active", backend.active.counts()).await?;
        let total = crate::cli::progress::total_partitions(backend.active.as_ref()).await?;
        let workers = q.time("active", backend.active.workers()).await?;
        let paused = backend.active.is_paused().await?;
        // A value of the summary that does not decode is damage to expose (the
        // statistics-damaged gauge), not a reason to stop serving every other figure:
        // the figures the summary gives read as zero until `tranche check --repair`.
        let (summary, unreadable) = match q.time("stats", backend.stats.summary()).await {
            Ok(summary) => (summary, false),
            Err(err @ tranche_stats::Error::Corrupt { .. }) => {
                tracing::warn!(%err, "the statistics summary does not decode; `tranche check --repair` rebuilds it");
                (Default::default(), true)
            }
            Err(err) => return Err(anyhow::Error::from(err).into()),
        };
        let archive = &backend.archive;
        let decode_failures = q
            .time("archive", archive.decode_failures())
            .await
            .map_err(anyhow::Error::from)?;
        let dead_letters = archive
            .dead_letter_count()
            .await
            .map_err(anyhow::Error::from)?;
        let stalls = archive.stalled().await.map_err(anyhow::Error::from)?;
        let archive_damaged = archive.damaged().await.map_err(anyhow::Error::from)?.len();
        Ok(Self {
            counts,
            total,
            workers,
            paused,
            summary,
            unreadable,
            decode_failures,
            dead_letters,
            stalls,
            archive_damaged,
            inbox: q.time("inbox", backend.inbox_len()).await?,
            oldest: backend.inbox_oldest_ms().await?,
            memory: backend.used_memory().await,
            control: crate::cli::control::record_of(&backend).await?,
            clock_skew_ms: crate::cli::health::clock_skew_ms(&backend).await?,
        })
    }

    /// The partitions by state, planned and completed, and the inbox.
    fn partitions(&self, registry: &mut Registry) {
        let (counts, g) = (&self.counts, &self.summary.global_stats);
        let by_state: Family<StateLabel, Gauge> = Family::default();
        for (state, n) in [
            ("unissued", counts.unissued),
            ("pending", counts.pending),
            ("claimed", counts.claimed),
            ("running", counts.running),
            ("failed", counts.failed),
            ("discarded", counts.discarded),
            ("archived", g.total_completed),
        ] {
            by_state
                .get_or_create(&StateLabel { state })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        registry.register(
            "partitions",
            "Partitions of the namespace by state",
            by_state,
        );
        gauge(
            registry,
            "planned_partitions",
            "Partitions of every plan of the namespace",
            self.total,
        );
        counter(
            registry,
            "partitions_completed",
            "Partitions completed and archived (counted once each, by the statistics layer)",
            g.total_completed,
        );
        gauge(
            registry,
            "inbox_backlog",
            "Completions waiting in the archive inboxes",
            self.inbox,
        );
        let age: FloatGauge = Gauge::default();
        age.set(self.oldest.map_or(0.0, |ms| {
            crate::duration::now_ms().saturating_sub(ms) as f64 / 1000.0
        }));
        registry.register(
            "inbox_oldest_age_seconds",
            "Age of the oldest completion waiting for the archiver (0 when none; Redis only)",
            age,
        );
    }

    /// The workers by liveness.
    fn workers(&self, registry: &mut Registry) {
        let by_liveness: Family<StateLabel, Gauge> = Family::default();
        let alive = self.workers.iter().filter(|w| w.active).count();
        for (state, n) in [("alive", alive), ("inactive", self.workers.len() - alive)] {
            by_liveness
                .get_or_create(&StateLabel { state })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        registry.register(
            "workers",
            "Registered workers by whether their heartbeat is recent",
            by_liveness,
        );
    }

    /// The archive's and the statistics' damage: dead letters, stalled shards,
    /// damaged values, decode failures.
    fn damage(&self, registry: &mut Registry) {
        gauge(
            registry,
            "dead_letters",
            "Records set aside as never archivable",
            self.dead_letters,
        );
        gauge(
            registry,
            "archive_stalled_shards",
            "Shards whose archive calls are refused for the shard's own state (`tranche health` names them)",
            self.stalls.len() as u64,
        );
        gauge(
            registry,
            "statistics_damaged_shards",
            "Shards with damaged statistics, stalled on them or unreadable to this scrape (`tranche check --repair` rebuilds them)",
            (self.stalls.iter().filter(|s| s.stats_damaged()).count() as u64)
                .max(u64::from(self.unreadable)),
        );
        gauge(
            registry,
            "archive_damaged_values",
            "Archived values that do not decode, as reads and the archiver's scrub met them (`tranche check --repair` sets them aside)",
            self.archive_damaged as u64,
        );
        counter(
            registry,
            "decode_failures",
            "Archived batches that failed to decode",
            self.decode_failures,
        );
    }

    /// The pause flag, the control record, and the memory Redis uses.
    fn control(&self, registry: &mut Registry) {
        gauge(
            registry,
            "paused",
            "1 while the namespace is paused",
            u64::from(self.paused),
        );
        gauge(
            registry,
            "control_record_invalid_values",
            "Values of the control record every reader ignores, as they break the write rules (`tranche check --repair`)",
            self.control.as_ref().map_or(0, |r| r.rejected.len() as u64),
        );
        if let Some(record) = &self.control {
            crate::cli::render::register_metrics(registry, record, crate::duration::now_ms());
        }
        if let Some(bytes) = self.memory {
            gauge(
                registry,
                "redis_memory_bytes",
                "Memory the Redis server (every master of a cluster) uses, all namespaces included",
                bytes,
            );
        }
        if let Some(ms) = self.clock_skew_ms {
            let skew: FloatGauge = Gauge::default();
            skew.set(ms as f64 / 1000.0);
            registry.register(
                "clock_skew_seconds",
                "This server's clock less the Redis server's TIME (positive: ahead); leases need every process within a twelfth of a lease (`clock_skew` in `tranche health`)",
                skew,
            );
        }
    }

    /// Each live worker's store-update latency, and completed partitions' durations
    /// from the statistics layer.
    fn latencies(&self, registry: &mut Registry) {
        // A gauge per live worker at its p99: workers report quantiles, not buckets, so
        // they cannot be summed into one histogram.
        let update: Family<WorkerQuantileLabel, FloatGauge> = Family::default();
        for w in self.workers.iter().filter(|w| w.active) {
            update
                .get_or_create(&WorkerQuantileLabel {
                    worker: w.info.id.clone(),
                    quantile: "0.99",
                })
                .set(w.info.latency_p99_ms / 1000.0);
        }
        registry.register(
            "worker_update_latency_seconds",
            "A live worker's store-update latency (heartbeat, complete, fail) at a quantile",
            update,
        );
        let g = &self.summary.global_stats;
        let durations: Family<QuantileLabel, FloatGauge> = Family::default();
        for (quantile, v) in [("0.5", g.p50), ("0.95", g.p95), ("0.99", g.p99)] {
            durations.get_or_create(&QuantileLabel { quantile }).set(v);
        }
        registry.register(
            "partition_duration_seconds",
            "Completed partitions' duration at a quantile, from the statistics layer's mergeable histogram",
            durations,
        );
    }
}

/// `GET /metrics`: one [`Reading`] of the namespace, registered family by family.
pub(crate) async fn scrape(State(app): State<Arc<App>>) -> Result<Response, ApiError> {
    let reading = Reading::read(&app).await?;
    let mut registry = Registry::with_prefix("tranche");
    reading.partitions(&mut registry);
    reading.workers(&mut registry);
    reading.damage(&mut registry);
    reading.control(&mut registry);
    reading.latencies(&mut registry);
    registry.register(
        "query_latency_seconds",
        "This server's reads of each layer",
        app.query_latency.0.clone(),
    );
    text_response(&registry)
}

/// `run --metrics-listen`: this worker's own counters on `/metrics`.
pub(crate) fn worker_metrics(
    counters: crate::work::Counters,
    chunk_seconds: Histogram,
) -> axum::Router {
    axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let (counters, chunk_seconds) = (counters.clone(), chunk_seconds.clone());
            async move {
                let mut registry = Registry::with_prefix("tranche_worker");
                let s = counters.snapshot();
                gauge(
                    &mut registry,
                    "partitions_in_flight",
                    "Partitions this worker runs now",
                    s.in_flight,
                );
                gauge(
                    &mut registry,
                    "chunks_in_flight",
                    "Chunks this worker runs now",
                    s.chunks_in_flight,
                );
                counter(
                    &mut registry,
                    "claimed",
                    "Partitions this worker claimed",
                    s.claimed,
                );
                counter(
                    &mut registry,
                    "completed",
                    "Partitions this worker completed",
                    s.completed,
                );
                counter(
                    &mut registry,
                    "failed_attempts",
                    "Attempts of this worker that failed",
                    s.failed_attempts,
                );
                counter(
                    &mut registry,
                    "released",
                    "Partitions this worker gave back unfinished",
                    s.released,
                );
                counter(
                    &mut registry,
                    "lost_leases",
                    "Leases this worker lost to expiry",
                    s.lost,
                );
                counter(
                    &mut registry,
                    "rows",
                    "Rows this worker's chunks affected, when the handler counts them (--sql)",
                    s.rows,
                );
                let store_errors: Family<OpLabel, Counter> = Family::default();
                for (op, n) in s.store_errors {
                    store_errors
                        .get_or_create(&OpLabel { op: op.as_str() })
                        .inc_by(n);
                }
                registry.register(
                    "store_errors",
                    "Calls of this worker to the store that failed, by what it was doing",
                    store_errors,
                );
                crate::cli::telemetry::register(&mut registry);
                registry.register(
                    "chunk_duration_seconds",
                    "How long this worker's chunks took",
                    chunk_seconds,
                );
                let durations: Family<QuantileLabel, FloatGauge> = Family::default();
                for (quantile, v) in [("0.5", s.p50_ms), ("0.99", s.p99_ms)] {
                    durations
                        .get_or_create(&QuantileLabel { quantile })
                        .set(v / 1000.0);
                }
                registry.register(
                    "partition_duration_seconds",
                    "This worker's partition durations at a quantile",
                    durations,
                );
                text_response(&registry)
            }
        }),
    )
}
