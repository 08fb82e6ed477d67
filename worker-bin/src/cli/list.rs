//! `tranche list`: partitions by state, a page at a time.
//!
//! Active states (pending, claimed, running, failed) come from the active layer's
//! snapshot (one read per shard; its size is the active set, which holds only
//! unfinished work), filtered, sorted by pid and cut after `--after`. Pending includes
//! the planned partitions no worker has claimed yet (the snapshot's unissued runs, which
//! the active set does not hold): the first page's worth above `--after` is generated
//! from the runs, each row what `get` says of such a pid. Archived partitions are paged through the archive's `range`, so
//! memory and time stay bounded by `--limit` whatever the namespace size.

use std::fmt::Write as _;

use anyhow::Result;
use serde_json::{Value, json};
use tranche_codec::{CompletedRecord, Partition, Status};

use crate::backend::Backend;
use crate::cli::admin::Admin;
use crate::cli::render::{completed_fields, shown, time, view_json};
use tranche_router::PartitionView;

/// What `list` may select.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ListState {
    /// Waiting: planned and never claimed yet, retries in back-off, released or reaped
    /// leases, explicit ranges.
    Pending,
    /// Claimed, no heartbeat yet.
    Claimed,
    /// Claimed and heartbeating.
    Running,
    /// Out of attempts, waiting for an operator.
    Failed,
    /// Given up by an operator.
    Discarded,
    /// Completed and archived.
    Archived,
}

impl ListState {
    fn status(self) -> Option<Status> {
        match self {
            ListState::Pending => Some(Status::Pending),
            ListState::Claimed => Some(Status::Claimed),
            ListState::Running => Some(Status::Running),
            ListState::Failed => Some(Status::Failed),
            ListState::Discarded => Some(Status::Discarded),
            ListState::Archived => None,
        }
    }
}

/// One page of `list`.
#[derive(Debug)]
pub(crate) struct Page {
    rows: Vec<Row>,
    /// The `--after` of the next page, if there may be one.
    next: Option<u64>,
}

#[derive(Debug)]
enum Row {
    Active(Partition),
    Archived(CompletedRecord),
    /// An archived value that does not decode: one record's (its pid) or a whole
    /// batch's (its first pid).
    Damaged(u64, tranche_archive_store::ArchiveDamage),
}

/// Reads one page: partitions in `state` (every active state when `None`), of `worker`
/// if given, with pids above `after`, at most `limit`.
pub(crate) async fn page(
    backend: &Backend,
    state: Option<ListState>,
    worker: Option<&str>,
    after: u64,
    limit: usize,
) -> Result<Page> {
    let limit = limit.max(1);
    if state == Some(ListState::Archived) {
        return archived(backend, worker, after, limit).await;
    }
    let want = state.and_then(ListState::status);
    let snapshot = backend.router.all_active().await?;
    let known: std::collections::HashSet<u64> = snapshot.partitions.iter().map(|p| p.pid).collect();
    let mut rows: Vec<Partition> = snapshot
        .partitions
        .into_iter()
        .filter(|p| p.pid > after)
        .filter(|p| want.is_none_or(|s| p.status == s))
        .filter(|p| worker.is_none_or(|w| p.worker.as_deref() == Some(w)))
        .collect();
    // Never claimed, so held by no worker: pending, unless a worker is asked for.
    if worker.is_none() && want.is_none_or(|s| s == Status::Pending) {
        let plans = backend.active.plans().await?;
        let schema = backend.schema()?;
        rows.extend(never_claimed(
            &schema,
            &plans,
            &snapshot.unissued,
            &known,
            after,
            limit + 1,
        ));
    }
    rows.sort_unstable_by_key(|p| p.pid);
    let next = (rows.len() > limit).then(|| rows[limit - 1].pid);
    rows.truncate(limit);
    Ok(Page {
        rows: rows.into_iter().map(Row::Active).collect(),
        next,
    })
}

/// Up to `want` planned pids above `after` that no cursor has issued yet (nor any
/// record holds), in pid order, as `get` shows them: pending, attempt 0, created at 0.
///
/// A shard holds every `num_shards`-th batch of pids, so each unissued run walks its
/// own shard's batches only: at most `want` pids and a skip per batch, whatever the
/// plan's size or how far the other shards' cursors are.
fn never_claimed(
    schema: &tranche_codec::KeySchema,
    plans: &[tranche_codec::PlanEntry],
    runs: &[tranche_active_store::Unissued],
    known: &std::collections::HashSet<u64>,
    after: u64,
    want: usize,
) -> Vec<Partition> {
    let (shards, size) = (u64::from(schema.num_shards()), schema.batch_size());
    let mut pids = Vec::new();
    for run in runs.iter().filter(|r| r.count > 0) {
        let mut pid = run.next_pid.max(after.saturating_add(1));
        let mut taken = 0;
        while pid <= run.last_pid && taken < want {
            let batch = schema.batch_of(pid);
            let ahead = (u64::from(run.shard) + shards - batch % shards) % shards;
            if ahead > 0 {
                // The next batch of this run's shard.
                pid = (batch + ahead).saturating_mul(size);
                continue;
            }
            if !known.contains(&pid) {
                pids.push(pid);
                taken += 1;
            }
            pid += 1;
        }
    }
    pids.sort_unstable();
    pids.dedup();
    pids.into_iter()
        .filter_map(|pid| {
            let range = plans.iter().find_map(|e| e.plan.range_of(pid))?;
            Some(Partition::pending(pid, *range.start(), *range.end(), 0))
        })
        .take(want)
        .collect()
}

/// How many archived records one page may read while a `--worker` filter passes over
/// them: the time and memory of a page stay bounded whatever the archive holds.
const EXAMINE_PER_PAGE: usize = 20_000;

/// Archived partitions above `after`, through the archive's bounded range reads.
async fn archived(
    backend: &Backend,
    worker: Option<&str>,
    after: u64,
    limit: usize,
) -> Result<Page> {
    let last = backend
        .active
        .plans()
        .await?
        .iter()
        .map(|e| e.plan.last_pid())
        .max()
        .unwrap_or(0);
    let mut rows = Vec::new();
    let mut from = after.saturating_add(1);
    let mut examined = 0;
    while from <= last && rows.len() < limit {
        if examined >= EXAMINE_PER_PAGE {
            // A filter that matches little would otherwise walk the whole archive in
            // one call: the page ends short, and `next` goes on from here.
            return Ok(Page {
                rows,
                next: Some(from - 1),
            });
        }
        let page = backend.archive.range(from..=last, limit).await?;
        examined += page.records.len();
        let first = rows.len();
        rows.extend(
            page.records
                .into_iter()
                .filter(|r| worker.is_none_or(|w| &*r.worker == w))
                .map(Row::Archived),
        );
        // Damaged values answer for their pids (whose worker nobody can read).
        if worker.is_none() {
            let size = backend.schema()?.batch_size();
            for d in page.damaged {
                let pid = match d.field.as_deref().map(str::parse::<u64>) {
                    Some(Ok(pid)) => pid,
                    _ => (d.batch * size).max(from),
                };
                if pid >= from
                    && !rows
                        .iter()
                        .any(|r| matches!(r, Row::Damaged(p, _) if *p == pid))
                {
                    rows.push(Row::Damaged(pid, d));
                }
            }
            rows[first..].sort_by_key(Row::pid);
        }
        match page.next {
            Some(next) if next > from => from = next,
            _ => break,
        }
    }
    let next = (rows.len() >= limit).then(|| rows[limit - 1].pid());
    rows.truncate(limit);
    Ok(Page { rows, next })
}

impl Row {
    fn pid(&self) -> u64 {
        match self {
            Row::Active(p) => p.pid,
            Row::Archived(r) => r.pid,
            Row::Damaged(pid, _) => *pid,
        }
    }
}

/// The page as a table, or as one JSON object with `--json`.
pub(crate) fn render(page: &Page, json: bool) -> String {
    if json {
        let rows: Vec<Value> = page.rows.iter().map(row_json).collect();
        return format!("{}\n", json!({"partitions": rows, "next": page.next}));
    }
    if page.rows.is_empty() {
        return "no partitions\n".to_owned();
    }
    let mut out = format!(
        "{:>10}  {:<23} {:<9} {:<16} {:>7}  detail\n",
        "pid", "ids", "status", "worker", "attempt"
    );
    for row in &page.rows {
        let (pid, ids, status, worker, attempt, detail) = match row {
            Row::Active(p) => (
                p.pid,
                format!("{}..={}", p.min_id, p.max_id),
                p.status.as_str(),
                p.worker.as_deref().unwrap_or("-").to_owned(),
                p.attempts.to_string(),
                active_detail(p),
            ),
            Row::Archived(r) => (
                r.pid,
                format!("{}..={}", r.min_id, r.max_id),
                "archived",
                r.worker.to_string(),
                "-".to_owned(),
                format!(
                    "completed {} in {}ms",
                    time(r.completed_at_ms),
                    r.duration_ms
                ),
            ),
            Row::Damaged(pid, d) => (
                *pid,
                "-".to_owned(),
                "damaged",
                "-".to_owned(),
                "-".to_owned(),
                damaged_detail(d),
            ),
        };
        let _ = writeln!(
            out,
            "{pid:>10}  {ids:<23} {status:<9} {:<16} {attempt:>7}  {}",
            shown(&worker),
            shown(&detail)
        );
    }
    if let Some(next) = page.next {
        let _ = writeln!(out, "more: --after {next}");
    }
    out
}

fn active_detail(p: &Partition) -> String {
    match p.status {
        Status::Failed => format!("error: {}", p.last_error.as_deref().unwrap_or("-")),
        Status::Claimed | Status::Running => {
            let lease = p
                .deadline_ms
                .map_or_else(|| "-".to_owned(), |d| format!("lease until {}", time(d)));
            if p.progress > p.min_id {
                format!("checkpoint {}; {lease}", p.progress)
            } else {
                lease
            }
        }
        Status::Pending => match &p.last_error {
            Some(err) => format!("retry after: {err}"),
            None if p.progress > p.min_id => format!("resumes at {}", p.progress),
            None => String::new(),
        },
        Status::Discarded => format!("discarded {}", time(p.updated_at_ms)),
        Status::Completed => String::new(),
    }
}

/// What a damaged row says: the value, what is wrong, what to do.
fn damaged_detail(d: &tranche_archive_store::ArchiveDamage) -> String {
    format!(
        "{}{}: {} ({}); `tranche check --repair` sets it aside",
        tranche_archive_store::ARCHIVE_DAMAGED,
        if d.field.is_some() {
            String::new()
        } else {
            format!(" (all of batch {})", d.batch)
        },
        d.detail,
        d.location()
    )
}

/// A row in `get --json`'s one shape.
fn row_json(row: &Row) -> Value {
    match row {
        Row::Damaged(pid, d) => {
            let mut v = view_json(*pid, &PartitionView::Unknown);
            v["status"] = json!("completed");
            v["layer"] = json!("archive");
            v["damaged"] = json!(damaged_detail(d));
            v
        }
        Row::Active(p) => view_json(p.pid, &PartitionView::Active(p.clone())),
        Row::Archived(r) => {
            let mut v = view_json(r.pid, &PartitionView::Unknown);
            completed_fields(&mut v, r);
            v["layer"] = json!("archive");
            v
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tranche_active_store::Unissued;
    use tranche_codec::{KeySchema, PlanEntry, PlanGeometry};

    #[test]
    fn never_claimed_walks_each_shards_batches() {
        let schema = KeySchema::new("ns", 3).unwrap().with_batch_size(4).unwrap();
        let plans = [PlanEntry {
            plan: PlanGeometry::new(1, 1, 100, 1).unwrap(),
            explicit: false,
        }];
        // Each shard's cursor at its own place; pid 30 materialised (a record holds it).
        let runs: Vec<Unissued> = [(0, 25), (1, 6), (2, 99)]
            .into_iter()
            .map(|(shard, next_pid)| Unissued {
                shard,
                next_pid,
                last_pid: 100,
                count: 1,
            })
            .collect();
        let known = std::collections::HashSet::from([30]);
        let brute: Vec<u64> = (1..=100)
            .filter(|&pid| {
                runs.iter().any(|r| {
                    r.shard == schema.shard_of(pid) && (r.next_pid..=r.last_pid).contains(&pid)
                }) && !known.contains(&pid)
            })
            .collect();
        for after in [0, 5, 26, 60, 100] {
            for want in [1, 3, 10, 200] {
                let got: Vec<u64> = never_claimed(&schema, &plans, &runs, &known, after, want)
                    .iter()
                    .map(|p| p.pid)
                    .collect();
                let expected: Vec<u64> = brute
                    .iter()
                    .copied()
                    .filter(|&p| p > after)
                    .take(want)
                    .collect();
                assert_eq!(got, expected, "after {after}, want {want}");
            }
        }
        let p = &never_claimed(&schema, &plans, &runs, &known, 0, 1)[0];
        assert_eq!(
            (p.status, p.min_id, p.max_id),
            (Status::Pending, p.pid, p.pid)
        );
    }
}
