//! `/metrics`: the namespace's state as Prometheus metrics (OpenMetrics text), read in
//! O(shards) per scrape: the same counters `status` and `health` read, never a walk
//! over partitions.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::App;
use super::api::ApiError;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QuantileLabel {
    quantile: &'static str,
}

fn gauge(registry: &mut Registry, name: &str, help: &str, value: i64) {
    let g: Gauge = Gauge::default();
    g.set(value);
    registry.register(name, help, g);
}

pub(crate) async fn scrape(State(app): State<Arc<App>>) -> Result<Response, ApiError> {
    let backend = app.backend().await?;
    let status = crate::ops::status_of(&backend).await?;
    let summary = backend.stats.summary().await.map_err(anyhow::Error::from)?;
    let workers = backend.active.workers().await?;
    let mut registry = Registry::with_prefix("tranche");
    let c = &status.counts;
    let by_state: Family<StateLabel, Gauge> = Family::default();
    for (state, n) in [
        ("unissued", c.unissued),
        ("pending", c.pending),
        ("claimed", c.claimed),
        ("running", c.running),
        ("failed", c.failed),
        ("discarded", c.discarded),
        ("archived", status.archived),
    ] {
        by_state.get_or_create(&StateLabel { state }).set(n as i64);
    }
    registry.register(
        "partitions",
        "Partitions of the namespace by state",
        by_state,
    );
    gauge(
        &mut registry,
        "planned_partitions",
        "Partitions of every plan of the namespace",
        status.total as i64,
    );
    gauge(
        &mut registry,
        "inbox_entries",
        "Completion entries waiting in the archive inboxes",
        status.inbox as i64,
    );
    gauge(
        &mut registry,
        "workers_alive",
        "Workers whose heartbeat is recent",
        status.workers as i64,
    );
    gauge(
        &mut registry,
        "dead_letters",
        "Records set aside as never archivable",
        status.dead_letters as i64,
    );
    gauge(
        &mut registry,
        "decode_failures",
        "Archived batches that failed to decode",
        status.decode_failures as i64,
    );
    gauge(
        &mut registry,
        "paused",
        "1 while the namespace is paused",
        i64::from(status.paused),
    );
    let p99 = workers
        .iter()
        .filter(|w| w.active)
        .map(|w| w.info.latency_p99_ms)
        .fold(0.0, f64::max);
    let update: Gauge<f64, std::sync::atomic::AtomicU64> = Gauge::default();
    update.set(p99 / 1000.0);
    registry.register(
        "worker_update_p99_seconds",
        "The slowest live worker's store-update latency p99",
        update,
    );
    let g = &summary.global_stats;
    let durations: Family<QuantileLabel, Gauge<f64, std::sync::atomic::AtomicU64>> =
        Family::default();
    for (quantile, v) in [("0.5", g.p50), ("0.95", g.p95), ("0.99", g.p99)] {
        durations.get_or_create(&QuantileLabel { quantile }).set(v);
    }
    registry.register(
        "partition_duration_seconds",
        "Completed partitions' duration quantiles, from the statistics layer",
        durations,
    );
    let mut text = String::new();
    encode(&mut text, &registry).map_err(|e| anyhow::anyhow!("encoding metrics: {e}"))?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

/// `run --metrics-listen`: this worker's own counters on `/metrics`.
pub(crate) fn worker_metrics(shared: Arc<crate::work::Shared>) -> axum::Router {
    axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let shared = shared.clone();
            async move {
                let mut registry = Registry::with_prefix("tranche_worker");
                let s = shared.snapshot();
                gauge(
                    &mut registry,
                    "in_flight",
                    "Partitions this worker runs now",
                    s.in_flight as i64,
                );
                gauge(
                    &mut registry,
                    "completed",
                    "Partitions this worker completed",
                    s.completed as i64,
                );
                gauge(
                    &mut registry,
                    "failed_attempts",
                    "Attempts of this worker that failed",
                    s.failed_attempts as i64,
                );
                gauge(
                    &mut registry,
                    "released",
                    "Partitions this worker gave back unfinished",
                    s.released as i64,
                );
                gauge(
                    &mut registry,
                    "lost_leases",
                    "Leases this worker lost to expiry",
                    s.lost as i64,
                );
                let durations: Family<QuantileLabel, Gauge<f64, std::sync::atomic::AtomicU64>> =
                    Family::default();
                for (quantile, v) in [("0.5", s.p50_ms), ("0.99", s.p99_ms)] {
                    durations
                        .get_or_create(&QuantileLabel { quantile })
                        .set(v / 1000.0);
                }
                registry.register(
                    "partition_duration_seconds",
                    "This worker's partition durations",
                    durations,
                );
                let mut text = String::new();
                let _ = encode(&mut text, &registry);
                (
                    [(
                        header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    text,
                )
            }
        }),
    )
}
