//! The seed's capacity planning (`plan --dry-run`): Redis memory per partition in each
//! layer and tier, as measured by the benchmarks, and what a plan will cost.

use std::fmt::Write;

use serde_json::json;

use crate::cli::render::{bytes, line};
use crate::layers::Tiers;

// Redis memory per partition on Redis 7.0 with seed-shaped records (set S of the
// benchmarks); the dry run multiplies by these.

/// A plan: its registry entry and one cursor per shard (`cargo xtask bench active`).
pub(crate) const PLAN: f64 = 352.0;
/// A claimed or running partition: its hash entry and lease zset member (an
/// estimate from the entry sizes; leases in flight are few, so it matters little).
pub(crate) const ACTIVE: f64 = 260.0;
/// One record in the simple tier, statistics included: 189 B measured as the
/// `used_memory` growth of a 30,000-partition `tranche run --simulate`.
pub(crate) const SIMPLE: f64 = 190.0;
/// One record in the compressed tier (joined segments), statistics included:
/// 3.61 B at 1M and 3.05 B at 5M in `cargo xtask bench archive`.
pub(crate) const COMPRESSED: f64 = 3.6;
/// One record of the summary tier once its batch expired: the statistics only
/// (0.45 B in the same bench's per-key breakdown) and their share of overhead.
pub(crate) const SUMMARY: f64 = 0.5;

/// `plan --dry-run`: the seed's capacity planning.
pub(crate) fn plan_cost(
    plan: &tranche_codec::PlanGeometry,
    shards: u32,
    tiers: &Tiers,
    json: bool,
) -> String {
    let n = plan.partitions();
    let simple = n.min(tiers.compressed_at);
    let compressed = n.min(tiers.summary_at).saturating_sub(tiers.compressed_at);
    let summary = n.saturating_sub(tiers.summary_at);
    let running = PLAN * shards as f64 + ACTIVE * 64.0;
    let archived_live = simple as f64 * SIMPLE + (compressed + summary) as f64 * COMPRESSED;
    let archived_later =
        simple as f64 * SIMPLE + compressed as f64 * COMPRESSED + summary as f64 * SUMMARY;
    if json {
        return line(json!({
            "partitions": n, "first_pid": plan.first_pid(), "last_pid": plan.last_pid(), "shards": shards,
            "tiers": {"simple": simple, "compressed": compressed, "summary": summary},
            "bytes": {"running": running.round(), "archived": archived_live.round(), "archived_after_ttl": archived_later.round()},
        }));
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "plan       {n} partitions of {} ids (ids {}..={}), {shards} shards",
        plan.size(),
        plan.min(),
        plan.max()
    );
    let _ = writeln!(
        out,
        "tiers      {simple} simple, {compressed} compressed, {summary} summary"
    );
    let _ = writeln!(
        out,
        "            (thresholds {} and {})",
        tiers.compressed_at, tiers.summary_at
    );
    let _ = writeln!(out, "Redis memory, estimated:");
    let _ = writeln!(
        out,
        "  while running   {} (plan cursors + 64 leases in flight; unissued partitions cost nothing)",
        bytes(running)
    );
    let _ = writeln!(out, "  once archived   {}", bytes(archived_live));
    if summary > 0 {
        let _ = writeln!(
            out,
            "  after the TTL   {} (summary batches expired; statistics answer)",
            bytes(archived_later)
        );
    }
    let _ = writeln!(out, "nothing written (--dry-run)");
    out
}
