//! The lines `run` ends with, and their JSON.

use super::*;

/// How the run summary reports archive size.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ArchiveBytes {
    /// Redis `used_memory` growth over the run, per partition this process completed.
    RedisGrowth(f64),
    /// The embedded archive's dump size per archived partition.
    Dump(f64),
}

/// The lines `run` ends with.
pub(crate) fn run_summary(
    r: &Report,
    stats: Option<&StatsSummary>,
    archive: Option<&ArchiveBytes>,
) -> String {
    let secs = r.elapsed.as_secs_f64().max(1e-3);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}",
        if r.interrupted {
            "run interrupted"
        } else {
            "run finished"
        }
    );
    let _ = writeln!(
        out,
        "  partitions  {} completed here in {:.1}s ({:.1}/s); {} failed attempt(s); {} released",
        r.completed,
        secs,
        r.completed as f64 / secs,
        r.failed_attempts,
        r.released
    );
    if r.lost > 0 {
        let _ = writeln!(out, "  lost leases {}", r.lost);
    }
    if let Some(rows) = r.rows {
        let _ = writeln!(
            out,
            "  rows        {rows} affected here ({:.0}/s)",
            rows as f64 / secs
        );
    }
    let c = &r.counts;
    let _ = writeln!(
        out,
        "  namespace   {} outstanding, {} failed{}",
        c.outstanding(),
        c.failed,
        stats
            .map(|s| format!(", {} archived", s.global_stats.total_completed))
            .unwrap_or_default()
    );
    if r.completed > 0 {
        let _ = writeln!(out, "  durations   {}", percentiles(&r.durations_ms));
    }
    match archive {
        Some(ArchiveBytes::RedisGrowth(b)) => {
            let _ = writeln!(
                out,
                "  archive     {b:.1} bytes of Redis memory per partition (used_memory growth)"
            );
        }
        Some(ArchiveBytes::Dump(b)) => {
            let _ = writeln!(
                out,
                "  archive     {b:.1} bytes per partition (binary v2 dump)"
            );
        }
        None => {}
    }
    out
}

/// `run --json`: the summary as one object.
pub(crate) fn run_summary_json(
    r: &Report,
    stats: Option<&StatsSummary>,
    archive: Option<&ArchiveBytes>,
) -> String {
    let c = &r.counts;
    let quantile = |q: f64| (r.completed > 0).then(|| r.durations_ms.value_at_quantile(q));
    let (archive_bytes, measured_by) = match archive {
        Some(ArchiveBytes::RedisGrowth(b)) => (Some(*b), Some("redis_used_memory_growth")),
        Some(ArchiveBytes::Dump(b)) => (Some(*b), Some("binary_v2_dump")),
        None => (None, None),
    };
    let mut summary = serde_json::json!({
        "interrupted": r.interrupted,
        "completed": r.completed,
        "failed_attempts": r.failed_attempts,
        "released": r.released,
        "lost_leases": r.lost,
        "elapsed_ms": r.elapsed.as_millis() as u64,
        "rate_per_s": r.completed as f64 / r.elapsed.as_secs_f64().max(1e-3),
        "duration_ms": {"p50": quantile(0.5), "p95": quantile(0.95), "p99": quantile(0.99)},
        "namespace": {
            "outstanding": c.outstanding(),
            "failed": c.failed,
            "discarded": c.discarded,
            "archived": stats.map(|s| s.global_stats.total_completed),
        },
        "archive_bytes_per_partition": archive_bytes,
        "archive_bytes_measured_by": measured_by,
        "broken": r.broken,
    });
    // Only when the handler counts rows (`--sql`): a command's summary is unchanged.
    if let Some(rows) = r.rows {
        summary["rows"] = rows.into();
        summary["rows_per_s"] = (rows as f64 / r.elapsed.as_secs_f64().max(1e-3)).into();
    }
    summary.to_string()
}

pub(super) fn percentiles(h: &Histogram<u64>) -> String {
    format!(
        "p50 {}  p95 {}  p99 {}  max {}",
        ms(h.value_at_quantile(0.5) as f64),
        ms(h.value_at_quantile(0.95) as f64),
        ms(h.value_at_quantile(0.99) as f64),
        ms(h.max() as f64)
    )
}
