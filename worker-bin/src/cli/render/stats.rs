//! `stats`: the merged statistics, with their per-range table.

use super::*;

pub(super) fn range_lines(out: &mut String, r: &RangeStats) {
    let _ = writeln!(
        out,
        "range      {} partitions, ids {}..={}",
        r.completed_count, r.data_range.min, r.data_range.max
    );
    let _ = writeln!(
        out,
        "completed  {} .. {}",
        time((r.completed_time_range.start * 1000.0) as u64),
        time((r.completed_time_range.end * 1000.0) as u64)
    );
    let _ = writeln!(
        out,
        "duration   avg {}, total {}",
        ms(r.avg_duration * 1000.0),
        ms(r.total_duration * 1000.0)
    );
    for (w, share) in &r.worker_distribution {
        let w = shown(w);
        let _ = writeln!(
            out,
            "  {w:<24} {:>8} partitions  avg {}",
            share.count,
            ms(share.avg_duration * 1000.0)
        );
    }
}

/// `stats` (`--ranges`: with every range's statistics, when `m` has them).
///
/// `--json` says whether the ranges are in: `ranges_included`, and `completed` holds
/// `range_stats` (the seed's full statistics) only then.
/// The statistics document keeps the seed's fields and units (durations in seconds,
/// `last_updated` in epoch seconds, range labels `start_end`, half-open); beside each
/// time goes the CLI's own form: `<duration>_ms` integers, and `last_updated_ms` with
/// `last_updated_at` (RFC 3339), as every other command writes times.
pub(super) fn with_ms(v: &mut Value) {
    match v {
        Value::Object(map) => {
            let mut extra = Vec::new();
            for (key, value) in map.iter() {
                let Some(secs) = value.as_f64() else { continue };
                match key.as_str() {
                    "avg_duration" | "p50" | "p95" | "p99" => {
                        extra.push((format!("{key}_ms"), json!((secs * 1000.0).round() as u64)));
                    }
                    "last_updated" => {
                        let ms = (secs * 1000.0).round() as u64;
                        extra.push(("last_updated_ms".to_owned(), json!(ms)));
                        extra.push(("last_updated_at".to_owned(), json!(rfc3339(ms))));
                    }
                    _ => {}
                }
            }
            map.extend(extra);
            map.values_mut().for_each(with_ms);
        }
        Value::Array(items) => items.iter_mut().for_each(with_ms),
        _ => {}
    }
}

pub(crate) fn stats(m: &MergedStats, json: bool) -> Result<String> {
    let c = &m.active;
    let ranges = m.ranges.as_ref().filter(|_| m.completed.is_ok());
    if json {
        let completed = match &m.completed {
            Ok(s) => {
                let mut v = serde_json::to_value(s)?;
                if let (Some(r), Some(obj)) = (ranges, v.as_object_mut()) {
                    obj.insert("range_stats".into(), serde_json::to_value(r)?);
                }
                with_ms(&mut v);
                v
            }
            Err(e) => json!({"error": e.to_string()}),
        };
        return Ok(line(json!({
            "total": m.total(),
            "active": {"unissued": c.unissued, "pending": c.pending, "claimed": c.claimed, "running": c.running, "failed": c.failed, "discarded": c.discarded},
            "ranges_included": ranges.is_some(),
            "completed": completed,
        })));
    }
    let mut out = String::new();
    let _ = writeln!(out, "partitions {}", m.total());
    let _ = writeln!(
        out,
        "active     {} pending ({} never claimed), {} claimed, {} running, {} failed, {} discarded",
        c.unissued + c.pending,
        c.unissued,
        c.claimed,
        c.running,
        c.failed,
        c.discarded
    );
    match &m.completed {
        Err(e) => {
            let _ = writeln!(out, "completed  unavailable: {e}");
        }
        Ok(s) => {
            stats_lines(&mut out, s);
            let _ = writeln!(out);
            match ranges {
                Some(r) => range_table(&mut out, r),
                None => {
                    let _ = writeln!(
                        out,
                        "ranges     per 100,000 ids: `tranche stats --ranges` lists them"
                    );
                }
            }
        }
    }
    Ok(out)
}

pub(super) fn stats_lines(out: &mut String, s: &StatsSummary) {
    let g = &s.global_stats;
    let _ = writeln!(
        out,
        "completed  {} partitions, {} ids",
        g.total_completed, g.total_processed_data
    );
    let _ = writeln!(
        out,
        "duration   avg {}  p50 {}  p95 {}  p99 {}",
        ms(g.avg_duration * 1000.0),
        ms(g.p50 * 1000.0),
        ms(g.p95 * 1000.0),
        ms(g.p99 * 1000.0)
    );
    if g.last_updated > 0.0 {
        let _ = writeln!(out, "updated    {}", time((g.last_updated * 1000.0) as u64));
    }
    if !s.worker_stats.is_empty() {
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "{:<28} {:>10} {:>12} {:>9} {:>9} {:>9}",
            "worker", "completed", "ids", "avg", "p50", "p99"
        );
        for (w, ws) in &s.worker_stats {
            let w = shown(w);
            let _ = writeln!(
                out,
                "{w:<28} {:>10} {:>12} {:>9} {:>9} {:>9}",
                ws.completed_count,
                ws.total_data,
                ms(ws.avg_duration * 1000.0),
                ms(ws.p50 * 1000.0),
                ms(ws.p99 * 1000.0)
            );
        }
    }
    if !s.time_series_stats.is_empty() {
        let _ = writeln!(out);
        for (day, d) in &s.time_series_stats {
            let hours: Vec<String> = d.hourly_completion.iter().map(u64::to_string).collect();
            let _ = writeln!(out, "{day}  by hour (UTC): {}", hours.join(" "));
        }
    }
}

/// One line per 100,000-ID range, in ID order.
pub(super) fn range_table(
    out: &mut String,
    ranges: &std::collections::BTreeMap<String, RangeStats>,
) {
    let _ = writeln!(out, "ranges     {} of 100,000 ids each", ranges.len());
    if ranges.is_empty() {
        return;
    }
    let mut rows: Vec<(&String, &RangeStats)> = ranges.iter().collect();
    // The keys are "{start}_{end}": sort by number, not text.
    rows.sort_by_key(|(_, r)| r.data_range.min);
    let _ = writeln!(
        out,
        "{:<28} {:>10} {:>8} {:>9} {:>9}  last completed",
        "range", "completed", "workers", "avg", "total"
    );
    for (k, r) in rows {
        let _ = writeln!(
            out,
            "{k:<28} {:>10} {:>8} {:>9} {:>9}  {}",
            r.completed_count,
            r.workers.len(),
            ms(r.avg_duration * 1000.0),
            ms(r.total_duration * 1000.0),
            time((r.completed_time_range.end * 1000.0) as u64)
        );
    }
}
