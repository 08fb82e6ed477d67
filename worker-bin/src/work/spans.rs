//! The run's spans, at debug level so that the default log filter never enables them:
//! a `partition` span per lease (an attempt, or a split piece), a `chunk` span per chunk
//! under it, and the waits at the gate as events on the partition's span.
//!
//! An enabled span is entered on every poll of what it instruments, which cost the
//! default run about a tenth of its CPU when `partition` was at info level; so a
//! disabled span is never attached (`Span::none()`, and no `Instrument`), and what only
//! a span records (the gate's waits, the chunk's outcome) is measured only when its
//! span is enabled. With a [`TraceContext`], each attempt's span is put into its
//! partition's trace (`crate::trace`) and each chunk's context is handed to its command
//! and handler.
//!
//! Head sampling happens here, before a span exists: an attempt the trace context does
//! not sample ([`TraceContext::sampled`]) gets `Span::none()`, and a chunk gets a span
//! only under an enabled partition span, so an unsampled partition builds no span at
//! all (a chunk span without its partition's would be a root of a trace of its own).
//! Its chunks still get a context, flags `00` ([`unsampled`]).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use tracing::field::Empty;
use tranche_active_store::{Lease, PlanEntry};

use crate::job::{Chunk, ChunkError};
use crate::trace::{PartitionTrace, SPAN_EVENTS, TraceContext, TraceParent};

/// The trace context of a run, with what its partition traces derive from.
pub(crate) struct Traced {
    pub(crate) ctx: Arc<dyn TraceContext>,
    /// The namespace, part of every partition's trace id.
    pub(crate) namespace: String,
    /// The namespace's plans, read when tracing starts and again when a lease's pid
    /// is in none of them (planned since): the plan is part of the trace id.
    pub(crate) plans: Mutex<Vec<PlanEntry>>,
}

impl Traced {
    /// Reads the namespace's plans again; a failed read keeps those known (a pid in
    /// none of them is traced without its plan).
    pub(crate) async fn refresh(&self, backend: &crate::backend::Backend) {
        match backend.active.plans().await {
            Ok(plans) => *self.plans.lock().expect("not poisoned") = plans,
            Err(err) => tracing::debug!(%err, "plans not read for the partition traces"),
        }
    }

    /// Whether no known plan covers `pid` (the plans are to be read again).
    pub(crate) fn misses(&self, pid: u64) -> bool {
        self.plan_of(pid).is_none()
    }

    fn plan_of(&self, pid: u64) -> Option<[u64; 4]> {
        let plans = self.plans.lock().expect("not poisoned");
        plans
            .iter()
            .map(|e| &e.plan)
            .find(|p| p.contains_pid(pid))
            .map(|p| [p.first_pid(), p.min(), p.max(), p.size()])
    }
}

/// The span of one lease, `Span::none()` when the subscriber does not want it; put in
/// its partition's trace when `traced`.
pub(crate) fn partition(lease: &Lease, piece: bool, traced: Option<&Traced>) -> tracing::Span {
    // Decided before the span is built: an unsampled attempt costs no span. Debug
    // level off (nothing would record it) skips the hash.
    let trace = match traced {
        Some(traced) if tracing::level_enabled!(tracing::Level::DEBUG) => {
            let trace = PartitionTrace::new(
                &traced.namespace,
                traced.plan_of(lease.pid),
                lease.pid,
                lease.attempt,
                piece.then_some(lease.min_id),
            );
            if !traced.ctx.sampled(&trace) {
                return tracing::Span::none();
            }
            Some((traced, trace))
        }
        _ => None,
    };
    let span = tracing::debug_span!(
        "partition",
        pid = lease.pid,
        attempt = lease.attempt,
        worker = %lease.worker,
        fence = lease.token,
        min_id = lease.min_id,
        max_id = lease.max_id,
        resumed_at = lease.progress,
        piece = piece,
        outcome = Empty,
        checkpoint = Empty,
        error = Empty,
        otel.status_description = Empty,
    );
    if let Some((traced, trace)) = trace
        && !span.is_disabled()
    {
        traced.ctx.partition(&span, &trace);
    }
    span
}

/// Records how an attempt ended on its span: `outcome` (`done`, `failed`, `broken`,
/// `released`, `lost`), the checkpoint reached, and a failure's reason as the span's
/// error.
pub(crate) fn partition_ended(
    span: &tracing::Span,
    outcome: &str,
    checkpoint: u64,
    error: Option<&str>,
) {
    if span.is_disabled() {
        return;
    }
    span.record("outcome", outcome);
    span.record("checkpoint", checkpoint);
    if let Some(error) = error {
        span.record("error", error);
        span.record("otel.status_description", error);
    }
}

/// The span of one chunk, a child of the current (its partition's) span; none when
/// that span is disabled or not sampled.
pub(crate) fn chunk(c: &Chunk) -> tracing::Span {
    if !in_enabled_span() {
        return tracing::Span::none();
    }
    tracing::debug_span!(
        "chunk",
        index = c.index,
        from = c.from,
        to = c.to,
        duration_ms = Empty,
        exit_status = Empty,
        stderr_bytes = Empty,
        error = Empty,
        otel.status_description = Empty,
    )
}

/// The chunk's trace context, if its span is in a trace.
pub(crate) fn traceparent(span: &tracing::Span, traced: Option<&Traced>) -> Option<TraceParent> {
    let traced = traced?;
    if span.is_disabled() {
        return None;
    }
    traced.ctx.traceparent(span)
}

/// The trace context of a chunk that has no span, under a trace context: its
/// partition's trace and unexported root, flags `00` (not sampled), so that the
/// chunk's command and handler do not record either, and a `TRACEPARENT` in this
/// process's own environment never reaches it as if it were the chunk's.
pub(crate) fn unsampled(c: &Chunk, traced: Option<&Traced>) -> Option<TraceParent> {
    let traced = traced?;
    PartitionTrace::new(
        &traced.namespace,
        traced.plan_of(c.pid),
        c.pid,
        c.attempt,
        None,
    )
    .unsampled()
}

/// Records how a chunk ended on its span (its exit status and stderr are recorded
/// where the command ends, `crate::job`).
pub(crate) fn chunk_ended<T>(
    span: &tracing::Span,
    started: Instant,
    result: &Result<T, ChunkError>,
) {
    span.record("duration_ms", started.elapsed().as_secs_f64() * 1e3);
    let error = match result {
        Ok(_) => return,
        Err(ChunkError::Interrupted) => "interrupted",
        Err(ChunkError::Failed(e) | ChunkError::Broken(e) | ChunkError::Refused(e, _)) => e,
    };
    span.record("error", error);
    span.record("otel.status_description", error);
}

/// Whether the current span (a partition's) is enabled: what only it records is
/// measured then. Debug level off (the default) answers from one atomic load, without
/// asking the subscriber for its current span.
pub(crate) fn in_enabled_span() -> bool {
    tracing::level_enabled!(tracing::Level::DEBUG) && !tracing::Span::current().is_disabled()
}

/// Awaits the gate's `open` (a throttle, the active hours, the rate limit) and, when
/// the current span is enabled and the wait was a millisecond or more, records it there
/// as an event.
pub(crate) async fn gate_wait(traced: bool, ids: u64, open: impl std::future::Future<Output = ()>) {
    if !traced {
        return open.await;
    }
    let started = Instant::now();
    open.await;
    let waited = started.elapsed();
    if waited.as_millis() >= 1 {
        tracing::debug!(
            target: SPAN_EVENTS,
            waited_ms = waited.as_secs_f64() * 1e3,
            ids,
            "waited at the gate (a throttle, the active hours or the rate limit)"
        );
    }
}
