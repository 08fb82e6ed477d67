//! `get` and `locate`: one partition, from whichever layer answered.

use super::*;

/// `get PID`: the partition, and the pieces a split cut off it while it runs (the
/// active store's, listed for an active partition only; finished pieces are gone).
/// The JSON carries `pieces` whatever the layer, empty when there are none.
pub(crate) fn view(pid: u64, view: &PartitionView, pieces: &[Piece], json: bool) -> String {
    if json {
        let mut v = view_json(pid, view);
        v["pieces"] = pieces_json(pieces);
        return line(v);
    }
    let mut out = String::new();
    match view {
        PartitionView::Active(p) => {
            partition(&mut out, p);
            piece_lines(&mut out, pieces);
        }
        PartitionView::Archived { record, tier } => {
            let _ = writeln!(out, "partition  {}", record.pid);
            let _ = writeln!(
                out,
                "status     completed (archived, {} tier)",
                tier.as_str()
            );
            record_lines(&mut out, record);
        }
        PartitionView::Archiving { pid, range } => {
            let _ = writeln!(out, "partition  {pid}");
            let _ = writeln!(
                out,
                "status     completed (archiving: in the archive inbox)"
            );
            let _ = writeln!(out, "ids        {}..={}", range.start(), range.end());
        }
        PartitionView::Summarised {
            pid,
            range,
            cause,
            summary,
        } => {
            let _ = writeln!(out, "partition  {pid}");
            let why = match cause {
                Fallback::Expired => "its batch expired".to_owned(),
                Fallback::Undecodable { detail }
                    if detail.starts_with(tranche_archive_store::ARCHIVE_DAMAGED) =>
                {
                    detail.clone()
                }
                Fallback::Undecodable { detail } => format!("its batch does not decode: {detail}"),
            };
            let _ = writeln!(out, "status     completed ({why}; range summary below)");
            let _ = writeln!(out, "ids        {}..={}", range.start(), range.end());
            match summary {
                Some(r) => range_lines(&mut out, r),
                None => {
                    let _ = writeln!(out, "summary    none (statistics were reset)");
                }
            }
        }
        PartitionView::Unknown => {
            let _ = writeln!(out, "partition  {pid}");
            let _ = writeln!(out, "status     unknown (no plan has it)");
        }
    }
    out
}

/// `locate ID`.
pub(crate) fn located(l: &Located, json: bool) -> String {
    if json {
        let mut v = view_json(l.pid, &l.view);
        v["id"] = json!(l.id);
        return line(v);
    }
    let mut out = format!(
        "row id     {} is in partition {} ({}..={})\n",
        l.id,
        l.pid,
        l.range.start(),
        l.range.end()
    );
    out.push_str(&view(l.pid, &l.view, &[], false));
    out
}

/// The one JSON shape of a partition, whatever the layer that answers for it: every
/// field is always there (null when that layer does not know it), times as RFC 3339
/// strings beside their `_ms` integers. `list` and `locate` use it too.
pub(crate) fn view_json(pid: u64, view: &PartitionView) -> Value {
    let mut v = json!({
        "pid": pid, "status": "unknown", "layer": null, "min_id": null, "max_id": null,
        "worker": null, "attempt": null, "checkpoint": null,
        "lease_deadline": null, "lease_deadline_ms": null, "updated_at": null, "updated_at_ms": null,
        "last_error": null, "completed_at": null, "completed_at_ms": null, "duration_ms": null,
        "tier": null, "cause": null, "range_summary": null,
    });
    let ts = |ms: Option<u64>| ms.map(rfc3339);
    match view {
        PartitionView::Active(p) => {
            v["status"] = json!(p.status.as_str());
            v["layer"] = json!("active");
            v["min_id"] = json!(p.min_id);
            v["max_id"] = json!(p.max_id);
            v["worker"] = json!(p.worker);
            v["attempt"] = json!(p.attempts);
            v["checkpoint"] = json!(p.progress);
            v["lease_deadline"] = json!(ts(p.deadline_ms));
            v["lease_deadline_ms"] = json!(p.deadline_ms);
            v["updated_at"] = json!(rfc3339(p.updated_at_ms));
            v["updated_at_ms"] = json!(p.updated_at_ms);
            v["last_error"] = json!(p.last_error);
        }
        PartitionView::Archived { record, tier } => {
            completed_fields(&mut v, record);
            v["layer"] = json!("archive");
            v["tier"] = json!(tier.as_str());
        }
        PartitionView::Archiving { range, .. } => {
            v["status"] = json!("archiving");
            v["layer"] = json!("inbox");
            v["min_id"] = json!(range.start());
            v["max_id"] = json!(range.end());
        }
        PartitionView::Summarised {
            range,
            cause,
            summary,
            ..
        } => {
            v["status"] = json!("completed");
            v["layer"] = json!("stats");
            v["min_id"] = json!(range.start());
            v["max_id"] = json!(range.end());
            v["cause"] = json!(match cause {
                Fallback::Expired => "expired".to_owned(),
                Fallback::Undecodable { detail } => format!("undecodable: {detail}"),
            });
            v["range_summary"] = json!(summary);
        }
        PartitionView::Unknown => {}
    }
    v
}

/// The fields of a completed record in the shape of [`view_json`].
pub(crate) fn completed_fields(v: &mut Value, r: &CompletedRecord) {
    v["status"] = json!("completed");
    v["min_id"] = json!(r.min_id);
    v["max_id"] = json!(r.max_id);
    v["worker"] = json!(&*r.worker);
    v["completed_at"] = json!(rfc3339(r.completed_at_ms));
    v["completed_at_ms"] = json!(r.completed_at_ms);
    v["duration_ms"] = json!(r.duration_ms);
}

pub(super) fn partition(out: &mut String, p: &Partition) {
    let _ = writeln!(out, "partition  {}", p.pid);
    let _ = writeln!(
        out,
        "status     {}",
        format!("{:?}", p.status).to_lowercase()
    );
    let _ = writeln!(out, "ids        {}..={}", p.min_id, p.max_id);
    let done = p.progress.saturating_sub(p.min_id);
    let _ = writeln!(
        out,
        "progress   {} of {} ids done (resumes at {})",
        done,
        p.max_id - p.min_id + 1,
        p.progress
    );
    let _ = writeln!(out, "attempts   {}", p.attempts);
    if let Some(w) = &p.worker {
        let _ = writeln!(out, "worker     {}", shown(w));
    }
    if let Some(d) = p.deadline_ms {
        let _ = writeln!(out, "lease ends {}", time(d));
    }
    if let Some(e) = &p.last_error {
        let _ = writeln!(out, "last error {}", shown(e));
    }
}

/// A split partition's pieces, one line each: range, status, holder (or the last
/// one), attempts, progress.
fn piece_lines(out: &mut String, pieces: &[Piece]) {
    if pieces.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "pieces     {} split off, each under its own lease",
        pieces.len()
    );
    let ranges: Vec<String> = pieces
        .iter()
        .map(|p| format!("{}..={}", p.start, p.max_id))
        .collect();
    let workers: Vec<String> = pieces
        .iter()
        .map(|p| {
            p.worker
                .as_deref()
                .map_or_else(|| "-".to_owned(), |w| shown(w).into_owned())
        })
        .collect();
    let range_w = ranges.iter().map(String::len).max().unwrap_or(0);
    let worker_w = workers.iter().map(String::len).max().unwrap_or(0);
    for ((p, range), worker) in pieces.iter().zip(&ranges).zip(&workers) {
        let total = p.max_id - p.start + 1;
        let done = p.progress.saturating_sub(p.start).min(total);
        let _ = writeln!(
            out,
            "  {range:<range_w$}  {:<9} {worker:<worker_w$}  attempt {}  {done} of {total} ids done",
            p.status.as_str(),
            p.attempts,
        );
    }
}

/// The pieces of `get --json`: the fields of [`view_json`] a piece has.
fn pieces_json(pieces: &[Piece]) -> Value {
    pieces
        .iter()
        .map(|p| {
            json!({
                "min_id": p.start, "max_id": p.max_id, "status": p.status.as_str(),
                "worker": p.worker, "attempt": p.attempts, "checkpoint": p.progress,
            })
        })
        .collect()
}

pub(super) fn record_lines(out: &mut String, r: &CompletedRecord) {
    let _ = writeln!(out, "ids        {}..={}", r.min_id, r.max_id);
    let _ = writeln!(out, "worker     {}", shown(&r.worker));
    let _ = writeln!(out, "completed  {}", time(r.completed_at_ms));
    let _ = writeln!(out, "duration   {}", ms(r.duration_ms as f64));
}
