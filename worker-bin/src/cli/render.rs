//! What the commands print: readable tables for people, `--json` for scripts. Pure
//! functions of the answers, so their output is tested with snapshots.

use std::fmt::Write;

use anyhow::Result;
use hdrhistogram::Histogram;
use serde_json::{Value, json};
use tranche_active_store::{Piece, StatusCounts, WorkerState};
use tranche_archive_store::DeadLetter;
use tranche_codec::{CompletedRecord, Partition};
use tranche_router::{Fallback, Located, MergedStats, PartitionView};
use tranche_stats::{Difference, RangeStats, StatsSummary};

use crate::work::Report;

pub(crate) use crate::cli::alert::Rule;
pub(crate) use crate::cli::calendar::{rfc3339, time};
pub(crate) use crate::cli::cost::plan_cost;

mod checks;
mod control;
mod partition;
mod run;
mod stats;

pub(crate) use crate::check::{Damaged, DeadLetters};
pub(crate) use checks::{check, dead_letters, health, shards_named};
pub(crate) use control::{entry_json, log_text, record_json, register_metrics, status_lines};
pub(crate) use partition::{completed_fields, located, view, view_json};
pub(crate) use run::{ArchiveBytes, run_summary, run_summary_json};
use stats::range_lines;
pub(crate) use stats::stats;

/// Everything `status` shows.
#[derive(Debug, Clone)]
pub(crate) struct Status {
    pub(crate) namespace: String,
    pub(crate) location: String,
    pub(crate) shards: u32,
    pub(crate) total: u64,
    pub(crate) counts: StatusCounts,
    pub(crate) archived: u64,
    pub(crate) inbox: u64,
    pub(crate) workers: usize,
    pub(crate) decode_failures: u64,
    pub(crate) dead_letters: u64,
    pub(crate) paused: bool,
    /// The namespace's control record (Redis only).
    pub(crate) control: Option<tranche_control::ControlRecord>,
}

/// `status`.
pub(crate) fn status(s: &Status, json: bool) -> String {
    let c = &s.counts;
    // Completed: neither outstanding nor given up (failed or discarded).
    let finished = s
        .total
        .saturating_sub(c.outstanding() + c.failed + c.discarded);
    if json {
        let mut v = json!({
            "namespace": s.namespace, "location": s.location, "shards": s.shards,
            "partitions": s.total, "finished": finished, "archived": s.archived,
            "unissued": c.unissued, "pending": c.pending, "claimed": c.claimed,
            "running": c.running, "failed": c.failed, "discarded": c.discarded, "inbox": s.inbox,
            "active_workers": s.workers, "decode_failures": s.decode_failures,
            "dead_letters": s.dead_letters, "paused": s.paused,
        });
        if let Some(r) = &s.control {
            v["control"] = control::record_json(r, crate::duration::now_ms());
        }
        return line(v);
    }
    let pct = if s.total == 0 {
        0.0
    } else {
        finished as f64 * 100.0 / s.total as f64
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "namespace  {} on {} ({} shards){}",
        s.namespace,
        s.location,
        s.shards,
        if s.paused {
            ", PAUSED (`tranche resume`)"
        } else {
            ""
        }
    );
    let _ = writeln!(
        out,
        "progress   {finished} / {} partitions finished ({pct:.1}%)",
        s.total
    );
    let _ = writeln!(out);
    // Pending is one word for work waiting to be claimed, whether a worker ever held it
    // or not (`get` and `list pending` say the same; `--json` keeps the two counts).
    let _ = writeln!(
        out,
        "  pending   {:>12}  ({} never claimed)",
        c.unissued + c.pending,
        c.unissued
    );
    let _ = writeln!(out, "  claimed   {:>12}", c.claimed);
    let _ = writeln!(out, "  running   {:>12}", c.running);
    let _ = writeln!(out, "  failed    {:>12}", c.failed);
    let _ = writeln!(out, "  discarded {:>12}", c.discarded);
    let _ = writeln!(out, "  archived  {:>12}", s.archived);
    let _ = writeln!(out, "  inbox     {:>12}", s.inbox);
    let _ = writeln!(out);
    let _ = writeln!(out, "workers    {} active", s.workers);
    if let Some(r) = &s.control {
        out.push_str(&control::status_lines(r, crate::duration::now_ms()));
    }
    let _ = writeln!(out, "decode failures {}", s.decode_failures);
    let _ = writeln!(
        out,
        "dead letters    {}{}",
        s.dead_letters,
        if s.dead_letters > 0 {
            " (`tranche dead-letters` lists them)"
        } else {
            ""
        }
    );
    out
}

/// `workers`.
pub(crate) fn workers(ws: &[WorkerState], now_ms: u64, json: bool) -> String {
    if json {
        let list: Vec<Value> = ws
            .iter()
            .map(|w| {
                let i = &w.info;
                json!({
                    "id": i.id, "active": w.active, "host": i.host, "process_id": i.process_id,
                    "started_at": rfc3339(i.started_ms), "started_ms": i.started_ms,
                    "last_beat_at": rfc3339(i.last_beat_ms), "last_beat_ms": i.last_beat_ms,
                    "in_flight": i.in_flight,
                    "completed": i.completed, "rate_per_s": i.rate_per_s,
                    "update_p50_ms": i.latency_p50_ms, "update_p99_ms": i.latency_p99_ms, "version": i.version,
                })
            })
            .collect();
        return line(Value::Array(list));
    }
    if ws.is_empty() {
        return "no workers registered\n".to_owned();
    }
    let mut out = format!(
        "{:<28} {:<8} {:>9} {:>10} {:>9} {:>11} {:>10}\n",
        "worker", "state", "in flight", "completed", "rate/s", "update p99", "last beat"
    );
    for w in ws {
        let i = &w.info;
        let ago = now_ms.saturating_sub(i.last_beat_ms) as f64 / 1000.0;
        let _ = writeln!(
            out,
            "{:<28} {:<8} {:>9} {:>10} {:>9.1} {:>11} {:>9.0}s",
            shown(&i.id),
            if w.active { "active" } else { "gone" },
            i.in_flight,
            i.completed,
            i.rate_per_s,
            ms(i.latency_p99_ms),
            ago
        );
    }
    out
}

/// Text that came from Redis (worker ids, errors, records) as it may reach a terminal:
/// control characters escaped (`\u{1b}`), so stored text can never retitle, recolour
/// or clear the operator's screen. JSON output escapes them by itself.
pub(crate) fn shown(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return s.into();
    }
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect::<String>()
        .into()
}

pub(crate) fn line(v: Value) -> String {
    format!("{v}\n")
}

pub(super) fn number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        format!("{v:.4}")
    }
}

pub(crate) use crate::duration::ms;

pub(crate) fn bytes(b: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KB", "MB", "GB", "TB"];
    let mut v = b;
    let mut unit = 0;
    while v >= 1000.0 && unit + 1 < UNITS.len() {
        v /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{v:.0} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use std::time::Duration;
    use tranche_archive_store::Redrive;

    use tranche_active_store::WorkerInfo;
    use tranche_archive_store::Tier;
    use tranche_codec::Status as PartitionStatus;
    use tranche_stats::Stats;

    use super::*;

    #[test]
    fn dead_letters_as_a_table_or_a_json_array() {
        let dead = [tranche_archive_store::DeadLetter {
            shard: 3,
            id: "1719234405000-0".into(),
            record: r#"{"pid":7}"#.into(),
            reason: "stats: a delta counter reached 10^18\x1b]0;title\x07".into(),
        }];
        let table = dead_letters(&dead, false);
        assert!(table.contains("1719234405000-0"), "{table}");
        assert!(table.contains(r#"{"pid":7}"#), "{table}");
        assert!(
            !table.contains('\x1b') && !table.contains('\x07'),
            "escapes: {table:?}"
        );
        let json = dead_letters(&dead, true);
        let v: Value = serde_json::from_str(json.trim()).unwrap();
        assert_eq!(
            (v[0]["shard"].as_u64(), v[0]["record"].as_str()),
            (Some(3), Some(r#"{"pid":7}"#))
        );
        assert!(dead_letters(&[], false).starts_with("no dead letters"));
        assert_eq!(dead_letters(&[], true), "[]\n");
    }

    fn record(pid: u64, worker: &str, at_s: u64, dur_ms: u64) -> CompletedRecord {
        CompletedRecord {
            pid,
            min_id: (pid - 1) * 1000 + 1,
            max_id: pid * 1000,
            worker: Arc::from(worker),
            completed_at_ms: at_s * 1000,
            duration_ms: dur_ms,
        }
    }

    fn fixed_stats() -> Stats {
        let records: Vec<_> = (1..=12)
            .map(|pid| {
                record(
                    pid,
                    if pid % 3 == 0 { "worker2" } else { "worker1" },
                    1_719_234_405 + pid * 7,
                    250 + pid * 10,
                )
            })
            .collect();
        Stats::from_records(&records)
    }

    fn counts() -> StatusCounts {
        StatusCounts {
            unissued: 80,
            pending: 3,
            claimed: 2,
            running: 2,
            failed: 1,
            discarded: 0,
        }
    }

    #[test]
    fn times_are_utc() {
        assert_eq!(time(0), "1970-01-01 00:00:00.000 UTC");
        assert_eq!(time(1_719_234_405_123), "2024-06-24 13:06:45.123 UTC");
        assert_eq!(time(951_782_400_000), "2000-02-29 00:00:00.000 UTC");
    }

    #[test]
    fn status_table() {
        let s = Status {
            namespace: "reindex".into(),
            location: "redis://127.0.0.1:7001".into(),
            shards: 4,
            total: 100,
            counts: counts(),
            archived: 12,
            inbox: 0,
            workers: 2,
            decode_failures: 0,
            dead_letters: 0,
            paused: false,
            control: None,
        };
        insta::assert_snapshot!(status(&s, false));
        insta::assert_snapshot!(status(&s, true));
    }

    #[test]
    fn get_in_every_layer() {
        let mut p = Partition::pending(42, 41_001, 42_000, 1_719_234_400_000);
        p.status = PartitionStatus::Running;
        p.worker = Some("worker1".into());
        p.attempts = 2;
        p.progress = 41_301;
        p.deadline_ms = Some(1_719_234_430_000);
        p.last_error =
            Some("chunk 3 (41301..=41400) failed: exit status 1: connection refused".into());
        let mut out = view(42, &PartitionView::Active(p), &[], false);
        out.push_str("---\n");
        let (split, pieces) = split_partition();
        out.push_str(&view(43, &PartitionView::Active(split), &pieces, false));
        out.push_str("---\n");
        let r = record(7, "worker2", 1_719_234_405, 295_000);
        out.push_str(&view(
            7,
            &PartitionView::Archived {
                record: r.clone(),
                tier: Tier::Compressed,
            },
            &[],
            false,
        ));
        out.push_str("---\n");
        out.push_str(&view(
            8,
            &PartitionView::Archiving {
                pid: 8,
                range: 7001..=8000,
            },
            &[],
            false,
        ));
        out.push_str("---\n");
        let summary = fixed_stats().range_stats.into_values().next();
        out.push_str(&view(
            9,
            &PartitionView::Summarised {
                pid: 9,
                range: 8001..=9000,
                cause: Fallback::Expired,
                summary,
            },
            &[],
            false,
        ));
        out.push_str("---\n");
        out.push_str(&view(99_999, &PartitionView::Unknown, &[], false));
        insta::assert_snapshot!(out);
        insta::assert_snapshot!(view(
            7,
            &PartitionView::Archived {
                record: r,
                tier: Tier::Simple
            },
            &[],
            true
        ));
        let (split, pieces) = split_partition();
        insta::assert_snapshot!(view(43, &PartitionView::Active(split), &pieces, true));
    }

    /// Partition 43 (42001..=43000) split twice while it runs: its owner, worker1, holds
    /// 42001..=42500; worker2 runs 42501..=42750; 42751..=43000 waits for a claim after
    /// a failed attempt.
    fn split_partition() -> (Partition, Vec<Piece>) {
        let mut p = Partition::pending(43, 42_001, 42_500, 1_719_234_400_000);
        p.status = PartitionStatus::Running;
        p.worker = Some("worker1".into());
        p.attempts = 1;
        p.progress = 42_201;
        p.deadline_ms = Some(1_719_234_430_000);
        let piece = |start: u64, max_id: u64, status, worker: &str, attempts, progress| Piece {
            pid: 43,
            start,
            max_id,
            status,
            worker: Some(worker.into()),
            progress,
            attempts,
        };
        let pieces = vec![
            piece(
                42_501,
                42_750,
                PartitionStatus::Running,
                "worker2",
                1,
                42_601,
            ),
            piece(
                42_751,
                43_000,
                PartitionStatus::Pending,
                "worker-3",
                1,
                42_751,
            ),
        ];
        (p, pieces)
    }

    /// `get --json` has one shape: every layer's answer carries the same keys.
    #[test]
    fn get_json_has_one_shape_in_every_layer() {
        let r = record(7, "worker2", 1_719_234_405, 295_000);
        let views = [
            PartitionView::Active(Partition::pending(42, 41_001, 42_000, 1_719_234_400_000)),
            PartitionView::Archived {
                record: r,
                tier: Tier::Compressed,
            },
            PartitionView::Archiving {
                pid: 8,
                range: 7001..=8000,
            },
            PartitionView::Summarised {
                pid: 9,
                range: 8001..=9000,
                cause: Fallback::Expired,
                summary: None,
            },
            PartitionView::Unknown,
        ];
        let keys = |v: &Value| -> Vec<String> { v.as_object().unwrap().keys().cloned().collect() };
        let first = keys(&view_json(1, &views[0]));
        assert!(first.contains(&"completed_at".to_owned()) && first.contains(&"status".to_owned()));
        let mut statuses = Vec::new();
        for v in &views {
            let json = view_json(1, v);
            assert_eq!(keys(&json), first, "{json}");
            statuses.push(json["status"].as_str().unwrap().to_owned());
        }
        assert_eq!(
            statuses,
            ["pending", "completed", "archiving", "completed", "unknown"]
        );
        assert_eq!(rfc3339(1_719_234_405_123), "2024-06-24T13:06:45.123Z");
    }

    #[test]
    fn stats_table() {
        let merged = MergedStats {
            active: counts(),
            completed: Ok(fixed_stats().summary()),
            ranges: None,
        };
        insta::assert_snapshot!(stats(&merged, false).unwrap());
    }

    #[test]
    fn stats_with_ranges_lists_them_in_id_order() {
        let mut records: Vec<_> = (1..=12)
            .map(|pid| record(pid, "worker1", 1_719_234_405 + pid * 7, 250 + pid * 10))
            .collect();
        // Two more ranges, the second one's key sorting before the first's as text.
        records.push(record(900, "worker2", 1_719_234_500, 400));
        records.push(record(1_200, "worker2", 1_719_234_600, 500));
        let (summary, ranges) = Stats::from_records(&records).into_parts();
        let merged = MergedStats {
            active: counts(),
            completed: Ok(summary),
            ranges: Some(ranges),
        };
        insta::assert_snapshot!(stats(&merged, false).unwrap());
    }

    #[test]
    fn stats_json_says_whether_ranges_are_included() {
        let (summary, ranges) = fixed_stats().into_parts();
        let mut merged = MergedStats {
            active: counts(),
            completed: Ok(summary),
            ranges: None,
        };
        let without: Value = serde_json::from_str(&stats(&merged, true).unwrap()).unwrap();
        assert_eq!(without["ranges_included"], false);
        assert!(without["completed"].get("range_stats").is_none());
        assert_eq!(without["completed"]["global_stats"]["total_completed"], 12);
        merged.ranges = Some(ranges);
        let with: Value = serde_json::from_str(&stats(&merged, true).unwrap()).unwrap();
        assert_eq!(with["ranges_included"], true);
        // Then `completed` is the seed's full statistics.
        let full: Stats = serde_json::from_value(with["completed"].clone()).unwrap();
        assert_eq!(full, fixed_stats());
        merged.completed = Err(tranche_stats::Error::Corrupt {
            key: "k".into(),
            detail: "down".into(),
        });
        let failed: Value = serde_json::from_str(&stats(&merged, true).unwrap()).unwrap();
        assert_eq!(failed["ranges_included"], false);
        assert!(
            failed["completed"]["error"]
                .as_str()
                .unwrap()
                .contains("down")
        );
    }

    #[test]
    fn workers_table() {
        let info = |id: &str, beat: u64| WorkerInfo {
            id: id.into(),
            host: "host-a".into(),
            process_id: 4242,
            started_ms: 1_000,
            last_beat_ms: beat,
            in_flight: 2,
            completed: 1234,
            rate_per_s: 41.5,
            latency_p50_ms: 0.4,
            latency_p99_ms: 1.9,
            version: "0.1.0".into(),
        };
        let ws = vec![
            WorkerState {
                info: info("host-a-1", 95_000),
                active: true,
            },
            WorkerState {
                info: info("host-b-7", 20_000),
                active: false,
            },
        ];
        insta::assert_snapshot!(workers(&ws, 100_000, false));
    }

    #[test]
    fn text_from_redis_reaches_a_terminal_escaped() {
        let hostile = "w\x1b]0;pwned\x07\x1b[31m";
        let mut p = Partition::pending(42, 41_001, 42_000, 1_719_234_400_000);
        p.worker = Some(hostile.into());
        p.last_error = Some(format!("failed: {hostile}"));
        let piece = Piece {
            pid: 42,
            start: 41_501,
            max_id: 42_000,
            status: PartitionStatus::Running,
            worker: Some(hostile.into()),
            progress: 41_501,
            attempts: 1,
        };
        let out = view(42, &PartitionView::Active(p), &[piece], false);
        assert!(!out.contains('\x1b') && !out.contains('\x07'), "{out:?}");
        assert_eq!(out.matches("w\\u{1b}]0;pwned").count(), 3, "{out}");
        assert!(out.contains("w\\u{1b}]0;pwned\\u{7}"), "{out}");
        let mut info = WorkerInfo {
            id: hostile.into(),
            host: "h".into(),
            process_id: 1,
            started_ms: 0,
            last_beat_ms: 0,
            in_flight: 0,
            completed: 0,
            rate_per_s: 0.0,
            latency_p50_ms: 0.0,
            latency_p99_ms: 0.0,
            version: "0".into(),
        };
        let table = workers(
            &[WorkerState {
                info: info.clone(),
                active: true,
            }],
            0,
            false,
        );
        assert!(!table.contains('\x1b'), "{table:?}");
        // JSON keeps the id exact (its escaping is JSON's).
        info.id = hostile.into();
        let json = workers(&[WorkerState { info, active: true }], 0, true);
        let v: Value = serde_json::from_str(json.trim()).unwrap();
        assert_eq!(v[0]["id"], hostile);
        assert_eq!(shown("plain text"), "plain text");
    }

    /// The seed's thresholds: 100,000 and 500,000, batches kept 24 h.
    fn seed_tiers() -> crate::layers::Tiers {
        crate::layers::Tiers {
            compressed_at: 100_000,
            summary_at: 500_000,
            summary_ttl: Duration::from_secs(24 * 3600),
        }
    }

    #[test]
    fn plan_cost_follows_the_tiers() {
        let plan = tranche_codec::PlanGeometry::new(1, 1, 5_000_000_000, 1000).unwrap();
        let out = plan_cost(&plan, 4, &seed_tiers(), false);
        insta::assert_snapshot!(out);
        let small = tranche_codec::PlanGeometry::new(1, 1, 10_000, 1000).unwrap();
        let v: Value = serde_json::from_str(&plan_cost(&small, 1, &seed_tiers(), true)).unwrap();
        assert_eq!(v["tiers"]["simple"], 10);
        assert_eq!(v["tiers"]["summary"], 0);
    }

    #[test]
    fn check_reports_what_became_of_the_dead_letters() {
        let kept = tranche_archive_store::DeadLetter {
            shard: 1,
            id: "1719234405000-0".into(),
            record: "{\"pid\":999}".into(),
            reason: "pid 999 is in no plan\u{1b}]0;x".into(),
        };
        let repaired = DeadLetters {
            found: 4,
            redriven: Some(Redrive {
                found: 4,
                archived: 2,
                duplicates: 1,
                kept: vec![kept],
            }),
        };
        insta::assert_snapshot!(check(&[], 7, &repaired, &Damaged::default(), true, false));
        let json = check(&[], 7, &repaired, &Damaged::default(), true, true);
        let v: Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["dead_letters"]["archived"], 2, "{v}");
        assert_eq!(v["dead_letters"]["kept_letters"][0]["shard"], 1, "{v}");
        let found = DeadLetters {
            found: 3,
            redriven: None,
        };
        assert!(
            check(&[], 7, &found, &Damaged::default(), false, false)
                .starts_with("3 dead letter(s); `tranche check --repair`")
        );
        assert_eq!(
            serde_json::from_str::<Value>(&check(&[], 7, &found, &Damaged::default(), false, true))
                .unwrap()["dead_letters"],
            json!({"found": 3})
        );
    }

    #[test]
    fn health_names_what_fires() {
        let rules = [
            Rule::new("archive_queue", 1500.0, 1000.0),
            Rule::new("decode_failure_rate", 0.001, 0.01),
        ];
        assert!(rules[0].firing());
        assert!(!rules[1].firing());
        insta::assert_snapshot!(health(&rules, false));
    }

    #[test]
    fn summary_lines() {
        let mut h = Histogram::new_with_bounds(1, 3_600_000, 2).unwrap();
        for v in [120, 130, 150, 900] {
            h.record(v).unwrap();
        }
        let report = Report {
            completed: 4,
            failed_attempts: 1,
            released: 0,
            lost: 0,
            elapsed: Duration::from_secs(2),
            durations_ms: h,
            counts: StatusCounts::default(),
            interrupted: false,
            broken: None,
            failed_pids: Vec::new(),
            rows: None,
            stalls: Vec::new(),
        };
        insta::assert_snapshot!(run_summary(
            &report,
            Some(&fixed_stats().summary()),
            Some(&ArchiveBytes::Dump(3.25))
        ));
        // A handler that counts rows (`--sql`) adds one line, and two JSON fields.
        let counted = Report {
            rows: Some(30_000),
            ..report
        };
        let text = run_summary(&counted, None, None);
        assert!(
            text.contains("\n  rows        30000 affected here (15000/s)\n"),
            "{text}"
        );
        let json: serde_json::Value =
            serde_json::from_str(&run_summary_json(&counted, None, None)).unwrap();
        assert_eq!(
            (json["rows"].as_u64(), json["rows_per_s"].as_f64()),
            (Some(30_000), Some(15_000.0))
        );
    }
}
