//! `check --repair` for the control record: what replaces a record that broke the rules.

use serde_json::Value;

use crate::checked::{UNREADABLE_THROTTLE, valid_setting};
use crate::{ControlRecord, LogEntry, ManualThrottle};

/// The record that replaces `record` (as decoded, with its `rejected` values): its
/// valid values kept, each rejected setting set to its newest valid value in `log`
/// (newest first) or cleared, a bad manual throttle decided by the newest manual change
/// in the log (kept on when there is none), unreadable probe findings dropped (live
/// probers renew theirs). Returns the record and a note for the log.
pub(crate) fn rebuild(record: &ControlRecord, log: &[LogEntry]) -> (ControlRecord, String) {
    let whole = record.rejected.iter().any(|r| r.key == "record");
    let mut fixed = if whole {
        ControlRecord::default()
    } else {
        ControlRecord {
            rejected: Vec::new(),
            ..record.clone()
        }
    };
    let mut notes = Vec::new();
    let changes: Vec<(&LogEntry, serde_json::Map<String, Value>)> = log
        .iter()
        .filter_map(|e| match serde_json::from_str::<Value>(&e.change) {
            Ok(Value::Object(map)) => Some((e, map)),
            _ => None,
        })
        .collect();

    let mut names: Vec<&str> = record
        .rejected
        .iter()
        .filter_map(|r| r.key.strip_prefix("settings."))
        .collect();
    if whole {
        names = vec![
            "max_rate",
            "max_partitions_rate",
            "concurrency",
            "chunk",
            "parallel",
            "chunk_time_ms",
            "chunk_min",
            "chunk_max",
            "keep_below",
            "active_hours",
            "tz",
        ];
    }
    names.sort_unstable();
    names.dedup();
    let mut settings = serde_json::to_value(&fixed.settings).expect("settings serialize");
    for name in names {
        if valid_setting(name, &Value::Null).is_none() {
            continue;
        }
        let last = changes.iter().find_map(|(e, map)| {
            let v = map.get(name)?;
            (v.is_null() || valid_setting(name, v) == Some(true)).then_some((e.version, v))
        });
        match last {
            Some((version, v)) => {
                settings[name] = v.clone();
                if !whole || !v.is_null() {
                    notes.push(format!("{name} from the log (v{version})"));
                }
            }
            None => {
                settings[name] = Value::Null;
                if !whole {
                    notes.push(format!("{name} cleared (not in the log)"));
                }
            }
        }
    }
    fixed.settings = serde_json::from_value(settings).unwrap_or_default();
    if let (Some(lo), Some(hi)) = (fixed.settings.chunk_min, fixed.settings.chunk_max)
        && lo > hi
    {
        (fixed.settings.chunk_min, fixed.settings.chunk_max) = (None, None);
        notes.push("chunk_min and chunk_max cleared (min above max)".to_owned());
    }

    let manual_bad = whole || record.rejected.iter().any(|r| r.key.starts_with("manual"));
    if manual_bad {
        let last = changes.iter().find_map(|(e, map)| {
            let m = map.get("manual")?;
            let on = m.get("on")?.as_bool()?;
            let reason = m.get("reason").and_then(Value::as_str).unwrap_or("");
            Some((e, on, reason))
        });
        match last {
            Some((e, on, reason)) => {
                fixed.manual = on.then(|| ManualThrottle {
                    reason: reason.to_owned(),
                    since_ms: e.at_ms,
                    origin: e.origin.clone(),
                });
                notes.push(format!(
                    "manual throttle {} from the log (v{})",
                    if on { "on" } else { "off" },
                    e.version
                ));
            }
            None if whole => {}
            None => notes.push("manual throttle kept on (not in the log)".to_owned()),
        }
    }
    let unreadable = |p: &crate::ProbeState| {
        p.throttled
            .as_ref()
            .is_some_and(|t| t.reason == UNREADABLE_THROTTLE)
            && p.at_ms == 0
    };
    let before = fixed.probes.len();
    fixed.probes.retain(|_, p| !unreadable(p));
    if fixed.probe.as_ref().is_some_and(unreadable) {
        fixed.probe = None;
    }
    if fixed.probes.len() < before {
        notes.push(format!(
            "{} unreadable probe findings dropped",
            before - fixed.probes.len()
        ));
    }
    let newest = log.iter().map(|e| e.version).max().unwrap_or(0);
    fixed.version = crate::record::next_version(fixed.version.max(newest));
    if whole {
        notes.insert(
            0,
            "the record was not JSON; settings rebuilt from the log".to_owned(),
        );
    }
    let dropped: Vec<String> = record.rejected.iter().map(|r| r.key.clone()).collect();
    let mut note = format!("repair: dropped {}", dropped.join(", "));
    if !notes.is_empty() {
        note.push_str("; ");
        note.push_str(&notes.join("; "));
    }
    (fixed, crate::checked::truncate(&note, 4096))
}
